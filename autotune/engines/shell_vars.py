"""The shell variables of a Megatron-LM launch script that autotune may expand without running the script,
and the world size its launcher words give.

Megatron-LM's own example scripts (``examples/gpt3/train_gpt3_175b_distributed.sh``,
``examples/llama/train_llama3_8b_h100_fp8.sh``) collect the arguments in bash arrays, ``GPT_MODEL_ARGS=(
--num-layers 96 ... )``, and launch ``torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py ${GPT_MODEL_ARGS[@]}
...``. An array defined once (``NAME=( ... )`` over one or several lines, ``#`` comments and ``\\``
continuations inside) and never appended to (``NAME+=(``) is expanded where ``${NAME[@]}`` or
``"${NAME[@]}"`` is a whole word (bash: each element becomes one word); its elements' own ``$NAME`` are
expanded as the scalars below. A scalar ``NAME=value`` assigned
exactly once in the script, to a value with no ``$`` or backquote, is expanded where ``$NAME`` or ``${NAME}``
appears. Anything else (a variable set twice, by ``for``/``read``, from the environment or from another
variable) is left as it is, and the caller refuses it. One exception: ``NAME=${NAME:-literal}`` (or
``${NAME-literal}``), assigned once, is read as its default ``literal`` (the environment a run starts from
does not set it; ``--run-script --script-env NAME=VALUE`` reads the script with another value).

Caps (a script is hostile input too): at most :data:`MAX_LAUNCH_CHARS` characters in the file,
:data:`MAX_WORDS` words and :data:`MAX_EXPANDED_CHARS`
characters after expansion, no word over :data:`MAX_WORD_CHARS` characters, an array definition over at most
:data:`MAX_ARRAY_LINES` lines; over any is one error naming the limit, before the work grows.
"""

from __future__ import annotations

import re
from pathlib import Path

from autotune.engines.shell_words import split_words, unmark
from autotune.errors import ConfigError

#: most words of a command after the arrays are spliced in (Megatron-LM's largest examples have < 500)
MAX_WORDS = 100_000
#: most lines of one array definition NAME=( ... ) (Megatron-LM's examples' longest has < 60)
MAX_ARRAY_LINES = 10_000
#: most characters of a command after expansion (16 MiB, the file cap of autotune/files.py)
MAX_EXPANDED_CHARS = 16 * 2**20
#: most characters shell-split while looking for the end of one array definition
MAX_SPLIT_CHARS = 20_000_000
#: longest word accepted, characters (256 KiB: a path is at most PATH_MAX 4096, a layout or data-path list far
#: less). A longer word is refused before any splitting. :mod:`shlex` grew a token one character at a time,
#: about quadratic (measured: 200,000 characters 3.0-5.2 s, 260,000 8.4 s, 1,000,000 31 s); the words are now
#: split by :func:`autotune.engines.shell_words.split_words`, linear (260,000 characters ~1 ms)
MAX_WORD_CHARS = 2**18

#: most characters of a launch script or argument file (1 MiB; Megatron-LM's example scripts are < 10 KB).
#: Checked after the word lengths, before any shell-word splitting: :mod:`shlex` reads about 1 us per character
#: here and each line is split twice, so a 16 MiB file (the general file cap) took 18-64 s and 2 MiB of comment
#: lines 7.7 s; 1 MiB stays under about 4 s (dev machine, 2026-12-03).
MAX_LAUNCH_CHARS = 2**20

_DEF = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)$", re.S)
_ARRAY_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]\}$")
_SCALAR_REF = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_DEFAULT = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*):?-([^${}`]*)\}$")
_LOOP = re.compile(r"\b(?:for|read(?:\s+-\w+)*)\s+([A-Za-z_][A-Za-z0-9_]*)")


def check_word_lengths(text: str) -> None:
    """Refuse ``text`` holding a run of more than :data:`MAX_WORD_CHARS` non-blank characters, in linear time,
    before any shell-word splitting.

    Raises:
        ConfigError: a word over the limit (its length and the limit; not its text).
    """
    for m in re.finditer(r"\S+", text):         # each match consumes its characters: linear
        if m.end() - m.start() > MAX_WORD_CHARS:
            raise ConfigError(f"a word of {m.end() - m.start():,} characters at offset {m.start():,}; the limit "
                              f"is {MAX_WORD_CHARS:,} characters")


def _split(text: str) -> list[str] | None:
    try:
        return split_words(text, mark_literal=True)
    except ValueError:
        return None


def script_values(lines: list[str]) -> tuple[dict[str, list[str]], dict[str, str], set[int]]:
    """(arrays, scalars, indices of the lines inside a multi-line array definition) of the logical shell
    ``lines`` (``\\`` continuations joined): only the names defined once, to literal words."""
    arrays: dict[str, list[str] | None] = {}
    scalars: dict[str, str | None] = {}
    inside: set[int] = set()

    def put(d: dict, name: str, value) -> None:
        d[name] = None if (name in arrays or name in scalars) else value

    i = 0
    while i < len(lines):
        line = lines[i]
        for m in _LOOP.finditer(line.split("#", 1)[0]):
            scalars[m.group(1)] = None
        m = _DEF.match(line)
        if m and m.group(3).startswith("("):
            parts, j, work = [m.group(3)[1:]], i, [0]

            def closed(last: str) -> bool:
                # the whole body is split only when its last line can close it (a ")" before any comment):
                # splitting it again at every line was quadratic (a 20,000-line array took minutes)
                if ")" not in last:
                    return False
                text = "\n".join(parts)
                work[0] += len(text)
                if work[0] > MAX_SPLIT_CHARS:
                    raise ConfigError(f"the array definition at line {i + 1} needs more than {MAX_SPLIT_CHARS:,} "
                                      "characters of shell-word splitting (a ')' on each of its lines); refused")
                w = _split(text)
                return bool(w) and w[-1].endswith(")")

            while not closed(parts[-1]):
                j += 1
                if j >= len(lines):
                    break
                if j - i > MAX_ARRAY_LINES:
                    raise ConfigError(f"an array definition (line {i + 1}) runs over more than {MAX_ARRAY_LINES:,} "
                                      "lines; refused")
                inside.add(j)
                parts.append(lines[j])
            body = "\n".join(parts)
            words = _split(body) or []
            if words and words[-1].endswith(")"):
                words[-1] = words[-1][:-1]
                if not words[-1]:
                    words.pop()
            literal = m.group(2) == "" and not any("$(" in w or "`" in w for w in words)
            put(arrays, m.group(1), words if literal else None)
            if m.group(2):
                arrays[m.group(1)] = None
            i = j + 1
            continue
        found, words = [], _split(line) or []
        for k, w in enumerate(words):
            d = _DEF.match(w)
            if w in ("export", "readonly"):
                continue
            if not d:
                if k and not words[k - 1].endswith(";"):
                    found = []          # NAME=value command ...: the command's environment, not a variable
                break
            found.append((d.group(1), d.group(2), d.group(3).rstrip(";")))
        for name, plus, value in found:
            dm = _DEFAULT.match(value)
            if dm and dm.group(1) == name and not plus:
                value = dm.group(2)         # NAME=${NAME:-16}: its default
            put(scalars, name, None if (plus or "$" in value or "`" in value) else value)
        i += 1
    return ({k: v for k, v in arrays.items() if v is not None},
            {k: v for k, v in scalars.items() if v is not None}, inside)


def expand(words: list[str], arrays: dict[str, list[str]], scalars: dict[str, str]) -> list[str]:
    """``words`` with the ``${NAME[@]}`` words of ``arrays`` spliced in and the ``$NAME`` / ``${NAME}`` of
    ``scalars`` replaced (where every reference in a word is known; else the word is kept as it is)."""
    out: list[str] = []
    total = 0
    for w in words:
        m = _ARRAY_REF.match(w)
        items = arrays[m.group(1)] if m and m.group(1) in arrays else [w]
        if len(out) + len(items) > MAX_WORDS:
            raise ConfigError(f"the command expands to more than {MAX_WORDS:,} words (arrays spliced in); refused")
        for x in items:
            refs = [a or b for a, b in _SCALAR_REF.findall(x)]
            if refs and all(r in scalars for r in refs):
                # the expanded length is bounded before anything is built (a word of 500,000 "$A" of a 1 MiB A)
                size = len(x) + sum(len(scalars[r]) for r in refs)
                if size > MAX_WORD_CHARS:
                    raise ConfigError(f"a word of the command expands to about {size:,} characters; the limit is "
                                      f"{MAX_WORD_CHARS:,}")
                x = _SCALAR_REF.sub(lambda r: scalars[r.group(1) or r.group(2)], x)
            total += len(x)
            if total > MAX_EXPANDED_CHARS:
                raise ConfigError(f"the command expands to more than {MAX_EXPANDED_CHARS:,} characters; refused")
            out.append(x)
    return out


def launcher_world(launcher: list[str]) -> tuple[int, str] | None:
    """(GPU count, how) when the launcher words give torchrun's ``--nnodes N`` and ``--nproc-per-node G``
    (or ``--nproc_per_node``; ``--opt=value`` too) as plain integers: N x G processes, one GPU each
    (torch.distributed.run: world size = nnodes x nproc_per_node); else None (an elastic ``1:4`` range, a
    variable, ``gpu``/``auto``, or one of the two missing).

    Raises:
        ConfigError: ``--nnodes 0`` or ``--nproc-per-node 0`` (torchrun starts no process: no world)."""
    got: dict[str, str] = {}
    for k, w in enumerate(launcher):
        opt, eq, val = w.partition("=")
        key = opt.replace("_", "-")
        if key in ("--nnodes", "--nproc-per-node"):
            got[key] = val if eq else (launcher[k + 1] if k + 1 < len(launcher) else "")
    n, g = got.get("--nnodes", ""), got.get("--nproc-per-node", "")
    # ASCII digits only: str.isdigit() also takes '²' or '٨', which int() refuses or reads as 8 (issue 37 QA)
    if not (n.isascii() and n.isdigit() and g.isascii() and g.isdigit()):
        return None
    for opt, v in (("--nnodes", n), ("--nproc-per-node", g)):
        if int(v) < 1:
            raise ConfigError(f"torchrun {opt} {v}: must be an integer >= 1 (world size = nnodes x nproc-per-node)")
    from autotune.spec.validate import MAX_NUM_GPUS

    if int(n) * int(g) > MAX_NUM_GPUS:
        raise ConfigError(f"torchrun --nnodes {n} x --nproc-per-node {g} = {int(n) * int(g):,} GPUs: more than the "
                          f"{MAX_NUM_GPUS:,} autotune plans for")
    return int(n) * int(g), f"--nnodes {n} x --nproc-per-node {g}"


_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)


def _logical_lines(text: str) -> list[str]:
    """Shell lines with ``\\`` continuations joined."""
    return re.sub(r"\\\r?\n", " ", text).splitlines()


def read_launch(path: str | Path) -> tuple[list[str], list[str], dict[str, str]]:
    """(argument tokens, launcher words before ``*.py``, environment assignments) of an argument file or a
    launch script.

    The line that holds the ``*.py`` word is the command; words before the script (``torchrun
    --node-rank "$NODE_RANK" ...``, ``CMD=(``) are the launcher's and may hold shell syntax. A trailing
    ``"$@"`` (and the ``)`` closing an array, as in autotune's own launch_torchrun.sh) ends the arguments.
    Environment: ``NAME=value`` words before the script on that line and ``[export] NAME=value`` on the lines
    before it (the ``--dry-run`` output prints them so); values holding ``$`` are skipped. Words are split as
    :func:`shlex.split` does (:func:`autotune.engines.shell_words.split_words`, linear); a ``$`` or backquote
    inside single quotes is literal text (bash(1), QUOTING), never taken for a variable or ``$(...)``.

    Raises:
        ConfigError: unreadable, a command line that is not shell-quoted text, a shell variable in the
            Megatron arguments, or no arguments.
    """
    from autotune.files import max_file_bytes, read_text_file

    # one reader for user files: regular file, size cap, no NUL, no /proc (autotune/files.py); its own cap
    # first: a file over MAX_LAUNCH_CHARS characters' worth of UTF-8 (4 bytes each, RFC 3629) is refused from
    # its size, before it is read (QA issue 37 F6: 1 GiB was read whole, then refused)
    own = 4 * MAX_LAUNCH_CHARS
    text = read_text_file(path, what="Megatron-LM argument file", max_bytes=min(own, max_file_bytes()),
                          limit_note=None if max_file_bytes() <= own else
                          f"a launch script or argument file is at most {MAX_LAUNCH_CHARS:,} characters; "
                          "Megatron-LM's own scripts are < 10 KB")
    try:
        check_word_lengths(text)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    if len(text) > MAX_LAUNCH_CHARS:
        raise ConfigError(f"{path}: {len(text):,} characters; a launch script or argument file is at most "
                          f"{MAX_LAUNCH_CHARS:,} (Megatron-LM's own scripts are < 10 KB)")
    lines = _logical_lines(text)
    try:
        arrays, scalars, inside = script_values(lines)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    env: dict[str, str] = {}
    cmd: list[str] | None = None
    for line in (ln for k, ln in enumerate(lines) if k not in inside):
        try:
            words = split_words(line, mark_literal=True)
        except ValueError as e:
            if re.search(r"\.py\b", line.split("#", 1)[0]):
                raise ConfigError(f"{path}: not a shell-style argument list ({e})") from None
            continue            # another shell line of a script (autotune reads the command line only)
        words = expand(words, {}, scalars)      # "$PRETRAIN_SCRIPT_PATH" assigned once: the script word
        script = next((i for i, w in enumerate(words) if w.endswith((".py", ".py)")) and not _ASSIGN.match(w)), None)
        if script is None:
            for w in words[1:] if words[:1] == ["export"] else words:
                m = _ASSIGN.match(w)
                if not m:
                    break
                if "$" not in m.group(2):
                    env[m.group(1)] = m.group(2).rstrip(";")
            continue
        for w in words[:script]:
            m = _ASSIGN.match(w)
            if not m:
                break
            if "$" not in m.group(2):
                env[m.group(1)] = m.group(2)
        cmd = words
        break
    joined = " ".join(lines)
    if cmd is None and re.search(r"-m\s+torchtitan\.train\b", joined):
        m = re.search(r"--module\s+([A-Za-z0-9_.]+)", joined)
        raise ConfigError(f"{path}: a torchtitan launch (-m torchtitan.train), not Megatron-LM's pretrain_gpt.py; "
                          "read its config instead: --from-torchtitan "
                          + (f"{Path(path).parent / (m.group(1) + '.py')}" if m else "CONFIG.py"))
    if cmd is None:
        # a plain argument list (no script word), possibly over several lines
        try:
            cmd = split_words("\n".join(lines), mark_literal=True)
        except ValueError as e:
            raise ConfigError(f"{path}: not a shell-style argument list ({e})") from None
        script = -1
    try:
        launcher, words = expand(cmd[:script + 1], arrays, scalars), expand(cmd[script + 1:], arrays, scalars)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    if words and words[-1] in ("$@", "$@)", ")", "$*"):
        words = words[:-1]
    if words and words[-1].endswith(")") and launcher and "=(" in launcher[0]:
        words[-1] = words[-1][:-1]          # NAME=(... last) : the array's closing parenthesis
    var = next((w for w in words if "$" in w), None)
    if var is not None:
        from autotune.files import excerpt
        raise ConfigError(f"{path}: {excerpt(repr(var))} in the Megatron-LM arguments holds a shell variable; expand it (write "
                          "its value, or pass the launch script's --dry-run output): autotune reads the arguments, "
                          "it runs no shell")
    if not words:
        raise ConfigError(f"{path}: no pretrain_gpt.py arguments found (expected --num-layers 80 --hidden-size "
                          "8192 ...)")
    # a single-quoted "$" or backquote was kept out of the checks above (literal in bash); now the text itself
    return [unmark(w) for w in words], [unmark(w) for w in launcher], {k: unmark(v) for k, v in env.items()}


__all__ = ["read_launch", "MAX_LAUNCH_CHARS", "MAX_WORDS", "MAX_WORD_CHARS", "check_word_lengths", "expand", "launcher_world", "script_values"]
