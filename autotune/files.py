"""Reading the user's files with errors that name the file and the problem (never a traceback).

Every user file (plan, fabric, search-space, calibration YAML; HF ``config.json``; Megatron-LM argument
files and launch scripts; torchtitan TOML and .py configs; a tokenizer's ``config.json``) goes through
:func:`read_bytes_file` / :func:`read_text_file`:

* one path check first (:func:`resolve_input`): symbolic links resolved with loop detection, a regular
  file only ("is not a regular file" for a FIFO, ``/dev/zero``, a device or a socket, which would block or
  never end), nothing under ``/proc``, ``/sys`` or ``/dev``, no private file reached through a link;
* size-limited: at most :func:`max_file_bytes` are read (:data:`MAX_FILE_BYTES`, 16 MiB; the environment
  variable ``AUTOTUNE_MAX_FILE_BYTES`` sets another limit, up to 1 GiB);
* error lines quote at most an :func:`excerpt` of an input (100 printable characters);
* text only: a NUL byte means a binary file, bytes that are not UTF-8 are refused with their offset;
* YAML is parsed with libyaml's safe loader (``yaml.CSafeLoader``; no Python objects). First its event
  stream is counted (:func:`_precount`) and refused at the cap, before any node is composed or built (a
  3 MiB file took 64 s and 963 MiB to compose in pure Python); then the node graph is measured
  *with aliases expanded* before anything is constructed: a document whose expansion exceeds
  :data:`MAX_YAML_NODES` nodes (an alias bomb, "billion laughs": 1 KB -> GiB once printed or
  copied), nests deeper than :data:`MAX_NESTING_DEPTH`, or refers to itself is refused. PyYAML
  itself does not stop aliases (``safe_load`` builds shared references; the blow-up happens in
  whoever walks the result: ``str()``, ``json.dumps``, ``dict(...)`` copies). A mapping that repeats
  a key is refused too, naming the key and both lines (PyYAML would keep the last value silently).
* JSON refuses ``NaN`` / ``Infinity`` (not JSON, RFC 8259 section 6, but accepted by Python's
  ``json`` module) and duplicate keys, and nests at most :data:`MAX_NESTING_DEPTH` deep.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Mapping

import yaml

from autotune.errors import ConfigError

#: Largest user file read, bytes (16 MiB; the biggest shipped file, a calibration profile, is < 100 KiB).
MAX_FILE_BYTES = 16 * 2**20
#: Most YAML nodes after alias expansion (a search space or plan has < 1,000).
MAX_YAML_NODES = 200_000
#: Deepest nesting of mappings/lists accepted (the shipped files nest <= 5 levels).
MAX_NESTING_DEPTH = 64


#: environment variable that overrides :data:`MAX_FILE_BYTES` (bytes, an integer between 1 and
#: :data:`MAX_FILE_BYTES_CEILING`; e.g. ``AUTOTUNE_MAX_FILE_BYTES=67108864`` for 64 MiB)
MAX_FILE_BYTES_ENV = "AUTOTUNE_MAX_FILE_BYTES"
#: the largest value :data:`MAX_FILE_BYTES_ENV` may set (256 MiB). A file is read into memory whole and its
#: bytes and decoded text are both held while it is decoded, so a reader peaks at about 2x the file: measured
#: (dev machine, 2026-12-04, Python 3.11, ``ru_maxrss`` of ``autotune simulate``): a 255 MiB file as a plan,
#: as ``--from-megatron`` and as ``--model`` peaked at 532-533 MiB each; the earlier 1 GiB ceiling gave
#: 2.1 GB (issue 37, QA F6), over the 1 GiB bound of the issue's acceptance
MAX_FILE_BYTES_CEILING = 2**28
#: directories of kernel and device files (procfs, sysfs, devtmpfs): never read as a user's input, so an
#: error line can never show their content (``/proc/self/environ`` holds the process's secrets)
KERNEL_DIRS = ("/proc", "/sys", "/dev")


#: locations whose files are secrets whatever their mode says (shadow password and sudo files, SSH, GnuPG and
#: cloud credentials); a file there is treated as private (:func:`is_private_file`)
PRIVATE_PLACES = ("/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/ssh/", "/.ssh/", "/.gnupg/", "/.aws/")
#: autotune's own data folders (real paths): the package and the checkout's ``search_spaces/`` beside it
#: (:func:`autotune.search.space.search_space_dirs`); the files shipped there are never private
_SHIPPED_DIRS = (os.path.dirname(os.path.realpath(__file__)),
                 os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "search_spaces"))
#: shown path -> text of every private file read by this process (:func:`withhold_private` hides its words)
_PRIVATE_TEXTS: dict[str, str] = {}


def is_private_file(real: str, st: os.stat_result) -> bool:
    """Whether the file at the real path ``real`` (its ``stat``) is private: others may not read it (mode
    without ``o+r``: ``mode & 0o004 == 0``, e.g. ``/etc/shadow``, a ``chmod 600`` key), it belongs to another
    user (``st_uid`` differs from the effective uid: a colleague's file read as root), or it lies in one of
    :data:`PRIVATE_PLACES`; a file shipped inside the autotune package (``search_spaces/default.yaml`` read by
    a user who does not own the installation) is not. Its contents are never quoted in a message (:func:`withhold_private`)."""
    in_place = any(real.startswith(x) if not x.startswith("/.") else x in real + "/" for x in PRIVATE_PLACES)
    if not in_place and any(real.startswith(d + os.sep) for d in _SHIPPED_DIRS):
        return False        # autotune's own shipped data (search spaces, catalogs): public, whoever owns it
    return bool(not st.st_mode & stat.S_IROTH or st.st_uid != os.geteuid() or in_place)


def forget_private_files() -> None:
    """Forget the private files read so far (the CLI calls it as each command starts)."""
    _PRIVATE_TEXTS.clear()


def withhold_private(msg: str) -> str:
    """``msg`` (an error line) with nothing of a private file in it (:func:`is_private_file`; each private
    file read by this process is remembered by :func:`read_bytes_file`): every quoted part (``'...'`` or
    ``"..."``) whose text occurs in such a file, and every other word of at least 6 characters that does
    (the file's own path excepted), is shown as ``<withheld>``, and the line says why. Messages quote
    inputs through :func:`excerpt`, which withholds such text too; this is the CLI's last guard."""
    import re

    if not _PRIVATE_TEXTS or not isinstance(msg, str):
        return msg
    texts = list(_PRIVATE_TEXTS.values())
    paths = set(_PRIVATE_TEXTS)

    def private(t: str) -> bool:
        t = t.strip()
        t = t[:-3] if t.endswith("...") else t       # an excerpt cut short (display_text)
        return len(t) >= 2 and t not in paths and any(t in x for x in texts)

    out = re.sub(r"'([^'\n]{2,})'|\"([^\"\n]{2,})\"",
                 lambda m: "<withheld>" if private(m.group(1) or m.group(2)) else m.group(0), msg)
    out = re.sub(r"[^\s'\"\[\](),;]{6,}",
                 lambda m: m.group(0) if m.group(0).rstrip(":.") in paths or not private(m.group(0))
                 else "<withheld>", out)
    if out != msg or "<withheld>" in out:
        out += (f" (text from {', '.join(sorted(excerpt(p, 100) for p in paths))} withheld: a file only its owner "
                "or group may read, or another user's, is never quoted)")
    return out


def max_file_bytes() -> int:
    """The size limit of a user file, bytes: ``$AUTOTUNE_MAX_FILE_BYTES`` if set, else :data:`MAX_FILE_BYTES`.

    Raises:
        ConfigError: the variable is not an integer between 1 and :data:`MAX_FILE_BYTES_CEILING`.
    """
    raw = os.environ.get(MAX_FILE_BYTES_ENV)
    if raw is None or raw == "":
        return MAX_FILE_BYTES
    s = raw.strip()
    if not s.isdigit() or not s.isascii() or len(s) > 12 or not 1 <= int(s) <= MAX_FILE_BYTES_CEILING:
        raise ConfigError(f"${MAX_FILE_BYTES_ENV}={excerpt(raw, 40)!r}: expected a size in bytes between 1 and "
                          f"{MAX_FILE_BYTES_CEILING:,}")
    return int(s)


_KIND = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KIND if test(mode)), "not a plain file")


def _under(path: str, dirs: tuple[str, ...]) -> str | None:
    return next((d for d in dirs if path == d or path.startswith(d + "/")), None)


def resolve_input(path: str | Path, *, what: str) -> Path:
    """The real path of the user's input file ``path`` (symbolic links resolved), once it is known to be a
    regular file autotune may read and quote; ``what`` names the file's role in messages.

    Refused, each with one line naming the path: names longer than NAME_MAX / PATH_MAX; a missing file (or
    a link to one); a symbolic link loop (ELOOP, ``realpath(strict=True)``); a directory; anything that is
    not a regular file (FIFO, device such as ``/dev/zero``, socket: reading one blocks or never ends); a
    file under ``/proc``, ``/sys`` or ``/dev`` (:data:`KERNEL_DIRS`: kernel files such as
    ``/proc/self/environ`` hold secrets); a symbolic link to a file others may not read (mode without
    ``o+r``, such as ``/etc/shadow``): the link is not the file the user means to show autotune, and an
    error line could quote it.

    Raises:
        ConfigError: as above.
    """
    import errno

    p = check_path_names(path, what=what)
    shown = excerpt(str(p), 100)
    try:
        real = os.path.realpath(p, strict=True)
    except FileNotFoundError:
        if os.path.islink(p):
            raise ConfigError(f"{what} {shown} is a symbolic link to {excerpt(os.readlink(p), 100)}, which does "
                              "not exist") from None
        raise ConfigError(f"{what} {shown} does not exist") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ConfigError(f"{what} {shown} is a symbolic link loop (a link that leads back to itself); give "
                              "a file") from None
        raise ConfigError(f"{what} {shown} cannot be read: {e.strerror or e}") from None
    except ValueError as e:        # a NUL in the path
        raise ConfigError(f"{what} {shown} is not a valid path ({e})") from None
    try:
        st = os.stat(real)
    except OSError as e:
        raise ConfigError(f"{what} {shown} cannot be read: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{what} {shown} is a directory; give a file")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what} {shown} is not a regular file: it is {_kind(st.st_mode)}; give a file")
    kernel = _under(real, KERNEL_DIRS) or _under(os.path.abspath(p), KERNEL_DIRS)
    if kernel is not None:
        raise ConfigError(f"{what} {shown} is under {kernel} (a kernel file, not a user's file); refused, nothing "
                          "of it is read: give a regular file")
    if real != os.path.abspath(p) and not st.st_mode & stat.S_IROTH:
        raise ConfigError(f"{what} {shown} is a symbolic link to {excerpt(real, 100)}, a file only its owner or group "
                          "may read; refused (autotune never quotes a private file reached through a link): give "
                          "the file itself")
    return Path(real)


def read_bytes_file(path: str | Path, *, what: str, max_bytes: int | None = None,
                    limit_note: str | None = None) -> bytes:
    """The bytes of the regular file ``path`` (at most ``max_bytes``, default :func:`max_file_bytes`: 16 MiB
    or ``$AUTOTUNE_MAX_FILE_BYTES``); ``what`` names its role. The path is checked by :func:`resolve_input`,
    then opened non-blocking and checked again on the open descriptor (a FIFO swapped in between is refused,
    never waited on). The size is checked on the descriptor (``fstat``) before anything is read, and at most
    ``max_bytes + 1`` bytes are read (a file that grows meanwhile). ``limit_note`` replaces the hint on a
    file over the limit (default: set ``$AUTOTUNE_MAX_FILE_BYTES`` to raise it), for a reader whose own cap
    is lower than :func:`max_file_bytes`.

    Raises:
        ConfigError: as :func:`resolve_input`; unreadable, or larger than max_bytes.
    """
    limit = max_file_bytes() if max_bytes is None else max_bytes
    note = limit_note or f"set ${MAX_FILE_BYTES_ENV} to raise it"
    real = resolve_input(path, what=what)
    shown = excerpt(str(path), 100)
    try:
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ConfigError(f"{what} {shown} cannot be read: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{what} {shown} is not a regular file: it is {_kind(st.st_mode)}; give a file")
        if st.st_size > limit:
            raise ConfigError(f"{what} {shown} is {st.st_size:,} bytes; the limit is {limit:,} bytes ({note})")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)
    except OSError as e:
        raise ConfigError(f"{what} {shown} cannot be read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ConfigError(f"{what} {shown} is larger than the limit of {limit:,} bytes ({note})")
    if is_private_file(str(real), st):
        _PRIVATE_TEXTS[str(path)] = data.decode("utf-8", "replace")
    return data


def read_text_file(path: str | Path, *, what: str, max_bytes: int | None = None,
                   limit_note: str | None = None) -> str:
    """The UTF-8 text of ``path`` (read by :func:`read_bytes_file`); ``what`` names the file's role in
    messages (``"plan file"``). A NUL byte anywhere means a binary file and is refused. ``max_bytes`` and
    ``limit_note`` as :func:`read_bytes_file`.

    Raises:
        ConfigError: the file does not exist, cannot be read, is too large, binary or not UTF-8.
    """
    data = read_bytes_file(path, what=what, max_bytes=max_bytes, limit_note=limit_note)
    if b"\x00" in data:
        raise ConfigError(f"{what} {excerpt(str(path), 100)} is a binary file (NUL byte at offset {data.index(0)}); "
                          "expected text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} {excerpt(str(path), 100)} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None
    return text[1:] if text.startswith("\ufeff") else text


def _yaml_loader_class() -> type:
    """The safe YAML loader for user files: libyaml's C parser and composer (``yaml.CSafeLoader``: the
    pure-Python ``SafeLoader`` took 64 s and 963 MiB to compose a 3 MiB space file) with PyYAML's safe
    constructor, or the pure-Python ``SafeLoader`` when PyYAML was built without libyaml."""
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _precount(text: str, source: str) -> None:
    """Refuse ``text`` from its YAML *event stream* (libyaml's parser, one event at a time; nothing is
    composed or constructed) as soon as its node graph, aliases expanded, passes :data:`MAX_YAML_NODES`,
    nests deeper than :data:`MAX_NESTING_DEPTH`, or an alias names a collection still open (a cycle).

    Each anchor's expanded size is recorded when its node ends, and an alias adds that size where it is
    used, so an alias bomb ("billion laughs") is refused after reading about :data:`MAX_YAML_NODES`
    expanded nodes' worth of events, whatever its nominal size. The work is bounded by the cap, not by
    the file: at most about 2 x MAX_YAML_NODES events are read before a refusal (each node is one event,
    a collection two). Undefined aliases and syntax errors are left to the composer, which names them.

    Raises:
        ConfigError: as above (the count, the cap or the depth in the message; no content quoted).
    """
    loader = _yaml_loader_class()(text)
    # frames of open collections: [anchor, expanded size so far]
    stack: list[list[Any]] = []
    anchors: dict[str, int] = {}
    total = 0
    try:
        while True:
            try:
                ev = loader.get_event()
            except yaml.YAMLError as e:
                if "maximum nesting depth" in str(e):   # libyaml's own flow-depth limit (1,000), met while scanning ahead
                    raise ConfigError(f"{source} nests deeper than {MAX_NESTING_DEPTH} levels") from None
                return          # the composer reports the error with its line
            except RecursionError:
                return
            if ev is None or isinstance(ev, yaml.StreamEndEvent):
                return
            if isinstance(ev, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                if len(stack) >= MAX_NESTING_DEPTH:
                    raise ConfigError(f"{source} nests deeper than {MAX_NESTING_DEPTH} levels")
                stack.append([ev.anchor, 1])
                total += 1
                size = 0
            elif isinstance(ev, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                anchor, size = stack.pop()
                if anchor is not None:
                    anchors[anchor] = size
                if stack:
                    stack[-1][1] += size
                continue
            elif isinstance(ev, yaml.ScalarEvent):
                size = 1
                total += 1
                if ev.anchor is not None:
                    anchors[ev.anchor] = 1
            elif isinstance(ev, yaml.AliasEvent):
                if any(f[0] == ev.anchor for f in stack):
                    raise ConfigError(f"{source}: a YAML alias refers to a node that contains it (a cycle)")
                size = anchors.get(ev.anchor, 1)
                total += size
            else:               # stream/document start and end
                continue
            if stack and size:
                stack[-1][1] += size
            if total > MAX_YAML_NODES:
                raise ConfigError(f"{source} expands to more than {MAX_YAML_NODES:,} YAML nodes (aliases "
                                  "counted where they are used); refused")
    finally:
        loader.dispose()


def _measure(node: yaml.Node, source: str) -> None:
    """Refuse a composed YAML graph that expands past MAX_YAML_NODES, nests past MAX_NESTING_DEPTH,
    or contains itself. Sizes are memoised per node, so an alias bomb is measured in linear time."""
    size: dict[int, int] = {}
    active: set[int] = set()

    def walk(n: yaml.Node, depth: int) -> int:
        if depth > MAX_NESTING_DEPTH:
            raise ConfigError(f"{source} nests deeper than {MAX_NESTING_DEPTH} levels")
        key = id(n)
        if key in size:
            return size[key]
        if key in active:
            raise ConfigError(f"{source}: a YAML alias refers to a node that contains it (a cycle)")
        if isinstance(n, yaml.SequenceNode):
            children = n.value
        elif isinstance(n, yaml.MappingNode):
            children = [x for kv in n.value for x in kv]
            _no_duplicate_keys(n, source)
        else:
            children = []
        active.add(key)
        total = 1
        for c in children:
            total += walk(c, depth + 1)
            if total > MAX_YAML_NODES:
                raise ConfigError(f"{source} expands to more than {MAX_YAML_NODES:,} YAML nodes (aliases "
                                  "counted where they are used); refused")
        active.discard(key)
        size[key] = total
        return total

    walk(node, 0)


def _no_duplicate_keys(n: yaml.MappingNode, source: str) -> None:
    """Refuse a mapping that repeats a scalar key (PyYAML keeps the last one silently). Keys are
    compared as written with their resolved tag (``1`` and ``"1"`` differ); ``<<`` merge keys are
    exempt. Lines are 1-based (``Mark.line`` is 0-based)."""
    seen: dict[tuple[str, str], int] = {}
    for k, _ in n.value:
        if not isinstance(k, yaml.ScalarNode) or k.tag == "tag:yaml.org,2002:merge":
            continue
        key = (k.tag, k.value)
        line = k.start_mark.line + 1
        if key in seen:
            raise ConfigError(f"{source}: duplicate key {display_text(k.value, 60)!r} at line {line} (first at "
                              f"line {seen[key]}); each key may appear once")
        seen[key] = line


def parse_yaml_text(text: str, *, source: str) -> Any:
    """``text`` parsed as YAML with the limits of this module; ``source`` names it in messages.

    Raises:
        ConfigError: not valid YAML, too deep, an alias bomb or cycle, a mapping with a duplicate key.
    """
    _precount(text, source)
    loader = _yaml_loader_class()(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.YAMLError as e:
            raise ConfigError(f"{source} is not valid YAML: {' '.join(str(e).split())[:300]}") from None
        except RecursionError:
            raise ConfigError(f"{source} nests deeper than {MAX_NESTING_DEPTH} levels") from None
        if node is None:
            return None
        _measure(node, source)
        try:
            return loader.construct_document(node)
        except yaml.YAMLError as e:
            raise ConfigError(f"{source} is not valid YAML: {' '.join(str(e).split())[:300]}") from None
        except (RecursionError, TypeError, ValueError, OverflowError) as e:
            # unhashable keys (a list as a mapping key), out-of-range timestamps ...
            raise ConfigError(f"{source} has a value YAML cannot construct: {str(e)[:200]}") from None
    finally:
        loader.dispose()


def load_shipped_yaml(text: str) -> Any:
    """Parse a YAML file shipped with autotune (``autotune/data``): ``yaml.safe_load`` semantics through
    libyaml's C parser when PyYAML has it (``yaml.CSafeLoader``, ~10x faster: the H200 calibration took
    ~0.4 s per process with the pure-Python parser), else the pure-Python ``SafeLoader``. Only for
    autotune's own files; user files go through :func:`parse_yaml_text`'s checks.
    tests/test_files.py checks both loaders give the same data for every shipped file."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - safe loader


def read_yaml_file(path: str | Path, *, what: str) -> Any:
    """``path`` parsed as YAML (any YAML value; callers check the shape), with this module's limits.

    Raises:
        ConfigError: missing, unreadable, too large, binary or non-UTF-8 file; not valid YAML; an alias
            bomb, a cycle or nesting deeper than MAX_NESTING_DEPTH.
    """
    return parse_yaml_text(read_text_file(path, what=what), source=f"{what} {path}")


class _NonFinite(str):
    """Placeholder for ``NaN`` / ``Infinity`` while parsing, so the refusal can name the field."""


def _no_constant(name: str) -> Any:
    return _NonFinite(name)


def _find_non_finite(x: Any, path: str) -> str | None:
    if isinstance(x, _NonFinite):
        return f"field {excerpt(path or '(top level)')}: {str(x)} is not a JSON number"
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
    for k, v in items:
        found = _find_non_finite(v, f"{path}.{k}" if path else str(k))
        if found:
            return found
    return None


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {excerpt(repr(k))}")
        out[k] = v
    return out


def parse_json_text(text: str, *, source: str) -> Any:
    """``text`` parsed as strict JSON (no NaN/Infinity, no duplicate keys, bounded nesting).

    Raises:
        ConfigError: not valid JSON, naming the line and column or the offending constant/key.
    """
    import re

    # nesting depth without recursing (json's C decoder recurses per level): strings taken out first
    # (possessive: linear), then only the brackets visited, so 16 MiB of numbers costs C time, not a Python loop
    outside = re.sub(r'"(?:[^"\\]++|\\.)*+"', "", text, flags=re.S)
    depth = cur = 0
    for m in re.finditer(r"[\[\]{}]", outside):
        if m.group() in "[{":
            cur += 1
            if cur > depth:
                depth = cur
                if depth > MAX_NESTING_DEPTH:
                    break
        else:
            cur -= 1
    if depth > MAX_NESTING_DEPTH:
        raise ConfigError(f"{source} nests deeper than {MAX_NESTING_DEPTH} levels")
    try:
        seen: list[str] = []

        def constant(name: str) -> Any:
            seen.append(name)
            return _no_constant(name)

        data = json.loads(text, parse_constant=constant, object_pairs_hook=_pairs)
        bad = _find_non_finite(data, "") if seen else None      # walked only when a NaN/Infinity was read
        if bad:
            raise ConfigError(f"{source}: {bad} (RFC 8259 section 6: NaN and Infinity are not JSON)")
        return data
    except json.JSONDecodeError as e:
        raise ConfigError(f"{source} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"{source} is not valid JSON: {excerpt(e, 200)}") from None


def read_json_file(path: str | Path, *, what: str) -> Any:
    """``path`` parsed as strict JSON with this module's file limits.

    Raises:
        ConfigError: as :func:`read_text_file` and :func:`parse_json_text`.
    """
    return parse_json_text(read_text_file(path, what=what), source=f"{what} {path}")


def display_text(s: Any, max_len: int = 120) -> str:
    """``s`` made safe to print on a terminal: control and escape characters shown as ``\\xNN``
    escapes (``repr`` style), cut to ``max_len`` characters."""
    text = str(s)
    out = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)
    return out if len(out) <= max_len else out[: max_len - 3] + "..."


#: longest excerpt of an input an error line quotes, characters
EXCERPT_CHARS = 100


def excerpt(s: Any, max_len: int = EXCERPT_CHARS) -> str:
    """The short, sanitised excerpt of an input that an error line may quote: :func:`display_text` (control
    characters and NULs as escapes) cut to ``max_len`` (100) characters, ``...`` marking the cut. Every
    message that quotes a word, line or value read from a user's file goes through here. Text that occurs
    in a private file read by this process (:func:`is_private_file`) is shown as ``<withheld>``."""
    text = str(s)
    if _PRIVATE_TEXTS and len(text.strip()) >= 2 and text not in _PRIVATE_TEXTS and \
            any(text.strip() in x for x in _PRIVATE_TEXTS.values()):
        return "<withheld>"
    return display_text(text, max_len)


def plain(x: Any) -> Any:
    """Mappings/sequences/numpy scalars to plain YAML-safe Python values."""
    if isinstance(x, Mapping):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        return x.item()
    return x


#: longest file name component and path autotune writes, bytes (Linux NAME_MAX 255 and PATH_MAX 4096,
#: limits.h; most file systems refuse longer names with ENAMETOOLONG)
NAME_MAX, PATH_MAX = 255, 4096


def check_path_names(path: str | Path, *, what: str) -> Path:
    """``path`` as a :class:`Path` if no name in it is longer than :data:`NAME_MAX` bytes and the whole is at
    most :data:`PATH_MAX` (before any ``stat``, which raises ENAMETOOLONG on such a path).

    Raises:
        ConfigError: naming the option and the length.
    """
    import os

    from autotune.errors import ConfigError

    p = Path(path)
    for part in p.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise ConfigError(f"{what} {display_text(str(p), 80)}: a name of {len(os.fsencode(part)):,} bytes; at most "
                              f"{NAME_MAX} per name")
    if len(os.fsencode(str(p))) > PATH_MAX:
        raise ConfigError(f"{what}: a path of {len(os.fsencode(str(p))):,} bytes; at most {PATH_MAX}")
    return p


def check_output_path(path: str | Path, *, what: str, directory: bool = False,
                      names: tuple[str, ...] = ()) -> Path:
    """Refuse an output path autotune would write through a symlink, into a place it cannot write, or
    whose names are too long; returns it as a :class:`Path`. Nothing is created or written.

    ``directory``: ``path`` is a directory to write ``names`` into (it may exist); else a file.
    Checks: no component longer than :data:`NAME_MAX` bytes and the whole at most :data:`PATH_MAX`; the file
    (or each ``directory/name``) and the directory are not symlinks (a link would write outside the target,
    e.g. into a file the link points at); the nearest existing directory is writable.

    Raises:
        ConfigError: naming the option, the path and what is wrong.
    """
    import os

    from autotune.errors import ConfigError

    p = check_path_names(path, what=what)
    shown = display_text(str(p), 120)
    targets = [p / n for n in names] if directory else [p]
    for t in ([p] if directory else []) + targets:
        if t.is_symlink():
            raise ConfigError(f"{what} {display_text(str(t), 120)} is a symbolic link (to "
                              f"{display_text(os.readlink(t), 120)}); refused, nothing written through it: give "
                              "a plain path")
    for t in targets:
        _refuse_special_output(t, what)
    d = p if directory else (p.parent if str(p.parent) else Path("."))
    while not d.exists() and d != d.parent:
        d = d.parent
    if d.exists() and (not d.is_dir() or not os.access(d, os.W_OK | os.X_OK)):
        raise ConfigError(f"{what} {shown}: {display_text(str(d), 120)} is not a writable directory; give a path "
                          "you can write")
    return p


def _refuse_special_output(t: Path, what: str) -> None:
    """Refuse an output name that exists and is not a regular file or a directory (a FIFO: writing one
    blocks until a reader comes, forever; a device such as /dev/full; a socket)."""
    try:
        st = os.lstat(t)
    except (OSError, ValueError):
        return
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise ConfigError(f"{what} {excerpt(str(t), 120)} is not a regular file: it is {_kind(st.st_mode)}; refused, "
                          "nothing written to it: give a file path")


def open_output(path: str | Path, *, what: str, binary: bool = False):
    """``path`` opened for writing (created or truncated) *without following a symbolic link* at its last
    name (``O_NOFOLLOW``, open(2): the open fails with ELOOP on a link), so a link planted after
    :func:`check_output_path` still writes nothing through it. ``what`` names the option in messages.

    Returns: a text (UTF-8) or binary file object. Raises:
        ConfigError: the path is a symbolic link, or cannot be opened (naming the OS reason).
    """
    import errno

    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    p = Path(path)
    if p.is_symlink():          # before open: O_TRUNC must not touch anything when it is a link
        raise ConfigError(f"{what} {display_text(str(p), 120)} is a symbolic link (to "
                          f"{display_text(os.readlink(p), 120)}); refused, nothing written through it: give a plain path")
    _refuse_special_output(p, what)   # before open: O_TRUNC / a blocking open must not touch a FIFO or device
    try:
        fd = os.open(p, flags | getattr(os, "O_NONBLOCK", 0), 0o666)
    except OSError as e:
        if e.errno == errno.ENXIO:     # a FIFO (swapped in after the check) with no reader
            raise ConfigError(f"{what} {display_text(str(p), 120)} is not a regular file (a FIFO); refused, "
                              "nothing written to it") from None
        if e.errno == errno.ELOOP:
            raise ConfigError(f"{what} {display_text(str(p), 120)} is a symbolic link; refused, nothing written "
                              "through it: give a plain path") from None
        raise ConfigError(f"{what} {display_text(str(p), 120)}: cannot write: {e.strerror or e}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ConfigError(f"{what} {display_text(str(p), 120)} is not a regular file: it is {_kind(st.st_mode)}; refused, "
                          "nothing written to it")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")


def write_output_text(path: str | Path, text: str, *, what: str) -> Path:
    """Write ``text`` to ``path`` through :func:`open_output` (never through a symbolic link).

    Raises:
        ConfigError: as :func:`open_output`, or the write fails (e.g. the disk is full).
    """
    try:
        with open_output(path, what=what) as fh:
            fh.write(text)
    except OSError as e:
        raise ConfigError(f"{what} {display_text(str(path), 120)}: cannot write: {e.strerror or e}") from None
    return Path(path)


def copy_output_file(src: str | Path, dst: str | Path, *, what: str) -> Path:
    """Copy the bytes of ``src`` to ``dst`` through :func:`open_output` (``shutil.copyfile`` would follow a
    symbolic link at ``dst``).

    Raises:
        ConfigError: as :func:`open_output`, or reading/writing fails.
    """
    import shutil

    try:
        with open(src, "rb") as fin, open_output(dst, what=what, binary=True) as fout:
            shutil.copyfileobj(fin, fout)
    except OSError as e:
        raise ConfigError(f"{what} {display_text(str(dst), 120)}: cannot write: {e.strerror or e}") from None
    return Path(dst)
