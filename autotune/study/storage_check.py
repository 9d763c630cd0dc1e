"""Storage hygiene for the read-only commands (``show``, ``export``, ``plot``) and ``mode=ro`` URLs.

A read-only command must never create or alter a database. Before Optuna sees a SQLite URL (whose
``RDBStorage`` would create its tables in any file and autotune's WAL switch would rewrite the file
header, SQLite docs "Write-Ahead Logging" section 2: the WAL mode is persistent), :func:`readonly_url`
checks that the file exists, is an SQLite database (its 16-byte header ``SQLite format 3\\0``, SQLite
"Database File Format" section 1.3) and holds Optuna's ``studies`` and ``version_info`` tables
(optuna/storages/_rdb/models.py), reading it through ``sqlite3`` with URI ``mode=ro``; it then returns
an SQLAlchemy URL that opens the same file read-only (``sqlite:///file:<path>?mode=ro&uri=true``,
SQLAlchemy docs "URI Connections" for pysqlite). A ``journal:PATH`` storage must be an existing Optuna
journal (:func:`check_journal_file`); other URLs are returned unchanged.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import urllib.parse
from pathlib import Path
from typing import Iterator

from autotune.errors import StorageError, redact

SQLITE_HEADER = b"SQLite format 3\x00"
OPTUNA_TABLES = {"studies", "version_info", "trials"}


def sqlite_path(url: str) -> tuple[str, dict[str, str]] | None:
    """(file path, query parameters) of a ``sqlite:///`` URL; None for other URLs or ``:memory:``."""
    if not url.startswith("sqlite:///"):
        return None
    rest = url[len("sqlite:///"):]
    path, _, query = rest.partition("?")
    params = dict(urllib.parse.parse_qsl(query))
    if path.startswith("file:"):
        path = path[len("file:"):]
    if not path or path == ":memory:":
        return None
    return path, params


def check_storage_path(url: str) -> None:
    """Refuse the file path of a ``sqlite:///PATH`` or ``journal:PATH`` storage before anything opens it: a
    name longer than NAME_MAX (255 bytes) or a path longer than PATH_MAX (4096; a 5,000-character path
    crashed with ENAMETOOLONG), or a symbolic link loop (ELOOP; a journal path that was one crashed). Other
    URLs are not checked.

    Raises:
        StorageError: naming the storage (as :func:`user_url` shows it, cut to 100 characters) and the problem.
    """
    import errno

    from autotune.errors import ConfigError
    from autotune.files import check_path_names, excerpt

    sp = sqlite_path(url) if isinstance(url, str) else None
    path = journal_path(url) if sp is None else urllib.parse.unquote(sp[0])
    if not path or path == ":memory:":
        return
    shown = excerpt(user_url(url), 100)
    try:
        check_path_names(path, what="file")
    except ConfigError as e:
        raise StorageError(f"--storage {shown}: {str(e).removeprefix('file ')}") from None
    if os.path.islink(path):
        try:
            os.path.realpath(path, strict=True)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise StorageError(f"--storage {shown}: {excerpt(path)} is a symbolic link loop (a link that leads "
                                   "back to itself); give a file path") from None
            if not isinstance(e, FileNotFoundError):
                raise StorageError(f"--storage {shown}: {excerpt(path)} cannot be used: {e.strerror or e}") from None


def journal_path(url: str) -> str | None:
    """The file path of a ``journal:PATH`` URL (``""`` when PATH is empty); None for other URLs."""
    if not isinstance(url, str) or not url.startswith("journal:"):
        return None
    return url[len("journal:"):]


def check_journal_file(url: str, *, must_exist: bool = False) -> None:
    """Refuse a ``journal:PATH`` storage that is not (or cannot become) an Optuna journal; reads only.

    Optuna's :class:`~optuna.storages.journal.JournalFileBackend` appends one JSON object per line to
    PATH, each with an ``op_code`` key (optuna/storages/journal/_file.py ``append_logs``,
    optuna/storages/journal/_storage.py ``JournalOperation``), and creates PATH when it is missing; it
    would append to any file. Accepted: a missing PATH (unless ``must_exist``), an empty file, or a file
    every line of which is a whole journal record (:func:`_journal_problem`). Other URLs are not checked.

    Raises:
        StorageError: PATH is empty, a directory or not a regular file, unreadable, or a non-empty file that is
            not a whole Optuna journal (a cut last line, a line that is not a record); or missing while ``must_exist`` (nothing is created or written).
    """
    path = journal_path(url)
    if path is None:
        return
    if not path:
        raise StorageError(f"--storage {url}: expected journal:PATH (a log file)")
    check_storage_path(url)         # a name too long, a symbolic link loop
    p = Path(path)
    if not p.exists():
        if must_exist:
            raise StorageError(f"--storage {url}: file {p} does not exist (nothing was created; check the path or "
                               "run `autotune run` first)")
        return
    if p.is_dir():
        raise StorageError(f"--storage {url}: {p} is a directory; give a journal file path, e.g. journal:{p}/autotune.log")
    if not p.is_file():
        raise StorageError(f"--storage {url}: {p} is not a regular file; give an Optuna journal file path")
    try:
        torn = journal_torn_tail(p)
        if torn is not None:
            # only the last record is torn (a full disk, a kill -9): read or repaired without it, once the
            # whole records before it are known to replay
            problem = _journal_problem(p, num_records=torn[0])
            if problem is None:
                return
            raise StorageError(f"--storage {url}: {p} is not an Optuna journal file or not a whole one ({problem}); "
                               "refused, left untouched (its torn last record too): restore it from a backup or "
                               "give a new journal file path")
        problem = _journal_problem(p)
        # another worker may be appending right now (Optuna writes and fsyncs a whole line under its lock,
        # optuna/storages/journal/_file.py append_logs): a cut last line is looked at again before refusing
        for _ in range(3):
            if problem is None or not problem.endswith(_CUT):
                break
            time.sleep(0.1)
            problem = _journal_problem(p)
    except OSError as e:
        raise StorageError(f"--storage {url}: {p} cannot be read: {e.strerror or e}") from None
    if problem is not None:
        raise StorageError(f"--storage {url}: {p} is not an Optuna journal file or not a whole one ({problem}); refused, left "
                           "untouched: give a new journal file path (or restore this one from a backup)")


#: keys each Optuna journal operation reads (optuna/storages/journal/_storage.py ``JournalOperation`` and
#: ``_apply_*``); a record without them makes Optuna's replay raise KeyError
_CUT = "is cut short: no newline at its end"
_JOURNAL_KEYS = {0: ("study_name", "directions"), 1: ("study_id",), 2: ("study_id", "user_attr"),
                 3: ("study_id", "system_attr"), 4: ("study_id",),
                 5: ("trial_id", "param_name", "param_value_internal", "distribution"), 6: ("trial_id", "state"),
                 7: ("trial_id", "step", "intermediate_value"), 8: ("trial_id", "user_attr"),
                 9: ("trial_id", "system_attr"), 10: ()}


def _journal_problem(p: Path, *, num_records: int | None = None) -> str | None:
    """Why the file at ``p`` is not a whole Optuna journal (None when it is, or is empty); reads only.

    Every line must be a JSON object with a known integer ``op_code`` and the keys that operation needs, and
    the last line must end with a newline (``append_logs`` writes whole lines; a missing newline means the
    file was cut, and Optuna would append after the partial line and then fail to replay it). Each record
    must also replay: it is applied, in order, to Optuna's own in-memory replay
    (optuna/storages/journal/_storage.py ``JournalStorageReplayResult.apply_logs``, what every open of the
    journal does), so a record Optuna would raise on (a direction, state or distribution it does not know, a
    date that does not parse) is found here, named by its line, instead of failing later in the middle of a
    command; and the fields Optuna stores without looking at them (ids, step, objective values) must have
    the types it reads back (:func:`_field_problem`). A record about a study or trial that does not exist is
    not a problem: Optuna skips it by design (another worker's deleted study).

    Args:
        num_records: check only the first this many lines (the whole records before a torn last one).

    Raises:
        OSError: the file cannot be read.
    """
    import json

    replay = _optuna_replay()
    with open(p, "rb") as fh:
        n = 0
        for raw in fh:
            if num_records is not None and n >= num_records:
                break
            n += 1
            if not raw.endswith(b"\n"):
                return f"line {n}, its last, {_CUT}"
            try:
                rec = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                return f"line {n} is not a JSON record"
            if not isinstance(rec, dict) or "op_code" not in rec:
                return f"line {n} is not a JSON record with an op_code"
            op = rec["op_code"]
            if isinstance(op, bool) or op not in _JOURNAL_KEYS:
                return f"line {n} has an unknown op_code {op!r}"
            missing = [k for k in _JOURNAL_KEYS[op] if k not in rec]
            if missing:
                return f"line {n} lacks {', '.join(missing)} (op_code {op})"
            bad = _field_problem(op, rec)
            if bad is not None:
                return f"line {n} (op_code {op}): {bad}"
            if replay is not None:
                try:
                    replay.apply_logs([rec])
                except Exception as e:     # noqa: BLE001 - any failure of Optuna's replay is this record's fault
                    return f"line {n} (op_code {op}) cannot be replayed by Optuna: {type(e).__name__}{_short(e)}"
    return None


def _optuna_replay():
    """A fresh ``JournalStorageReplayResult`` (Optuna's private replay class, optuna/storages/journal/_storage.py),
    or None when this Optuna has none (the structural checks of :func:`_journal_problem` still run)."""
    try:
        from optuna.storages.journal._storage import JournalStorageReplayResult
        # a worker-id prefix no record carries: replaying as this process never takes a record as its own
        return JournalStorageReplayResult("autotune-journal-check-")
    except (ImportError, TypeError):
        return None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _field_problem(op: int, rec: dict) -> str | None:
    """The first field of journal record ``rec`` (operation ``op``) whose type Optuna does not check on replay
    but relies on later (ids are ints, ``step`` an int, objective values numbers), or None. Optuna writes
    them so: optuna/storages/journal/_storage.py ``create_new_trial``, ``set_trial_state_values``,
    ``set_trial_intermediate_value``."""
    for key in ("study_id", "trial_id"):
        if key in rec and not _is_int(rec[key]):
            return f"{key} {_excerpt(rec[key])} is not an integer"
    if op == 7 and not _is_int(rec["step"]):
        return f"step {_excerpt(rec['step'])} is not an integer"
    if op == 7 and rec["intermediate_value"] is not None and not _is_number(rec["intermediate_value"]):
        return f"intermediate_value {_excerpt(rec['intermediate_value'])} is not a number"
    if op in (4, 6):
        values = rec.get("values")
        if values is not None and not (isinstance(values, list) and all(_is_number(v) for v in values)):
            return f"values {_excerpt(values)} is not a list of numbers"
        if rec.get("value") is not None and not _is_number(rec["value"]):
            return f"value {_excerpt(rec['value'])} is not a number"
    return None


def _excerpt(value) -> str:
    """``repr(value)`` as a short sanitised excerpt (:func:`autotune.files.excerpt`, 60 characters)."""
    from autotune.files import excerpt
    return excerpt(repr(value), 60)


def _short(e: BaseException) -> str:
    """``": <message>"`` of ``e`` as a short sanitised excerpt (80 characters), or ``""``."""
    from autotune.files import excerpt
    msg = " ".join(str(e).split())
    return f": {excerpt(msg, 80)}" if msg else ""


#: read-only URL made by :func:`readonly_url` -> the URL the user gave (what messages show)
_USER_URLS: dict[str, str] = {}


def user_url(url: str) -> str:
    """The ``--storage`` value the user gave for ``url``, as messages show it: the URL passed to
    :func:`readonly_url` when ``url`` is the internal read-only URL it returned
    (``sqlite:///file:...?mode=ro&uri=true``), else ``url``; a password in it is shown as ``***``
    (:func:`autotune.errors.redact`). For display only: never open a storage with it."""
    return redact(_USER_URLS.get(url, url))


def is_readonly_url(url: str) -> bool:
    """Whether ``url`` asks for a read-only SQLite connection (``mode=ro`` in its query)."""
    sp = sqlite_path(url)
    return sp is not None and sp[1].get("mode") == "ro"


def read_only_fs(path: str | Path) -> bool:
    """Whether the file system holding ``path`` is mounted read-only (``os.statvfs`` ``ST_RDONLY``)."""
    try:
        return bool(os.statvfs(Path(path).parent if not Path(path).is_dir() else Path(path)).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def disk_full(path: str | Path, *, min_free_bytes: int = 64 * 1024) -> bool:
    """Whether the file system holding ``path`` has less than ``min_free_bytes`` (64 KiB: a few SQLite pages
    or journal records) available to this user (``os.statvfs`` ``f_bavail x f_frsize``); False if unknown."""
    try:
        st = os.statvfs(Path(path).parent if not Path(path).is_dir() else Path(path))
    except (OSError, AttributeError):
        return False
    return st.f_bavail * st.f_frsize < min_free_bytes


def fresh_sqlite_file(path: str | Path) -> bool:
    """Whether the SQLite file at ``path`` holds nothing yet: 0 bytes (SQLite creates the file before it writes
    its first page), or a database with no table, index or view (another ``autotune run`` starting on the same
    new storage is creating Optuna's tables: they come in one transaction). Such a file is opened as a new
    storage rather than refused as a foreign one: nothing in it can be lost. Six runs started together on a new
    file had one refuse it ("not an SQLite database") as it was being created (issue 26, session 5). False for
    anything else, or when the file cannot be read."""
    p = Path(path)
    try:
        if not p.is_file():
            return False
        if p.stat().st_size == 0:
            return True
        with open(p, "rb") as fh:
            if fh.read(16) != SQLITE_HEADER:
                return False
        return not _schema(p)
    except (OSError, sqlite3.Error):
        return False


def _schema(p: Path, extra: str = "") -> list[tuple[str, str]]:
    """(type, name) of every table, index, view and trigger of the SQLite file ``p``, opened read-only
    (``extra``: more URI parameters, e.g. ``&immutable=1``). Raises ``sqlite3.Error``."""
    con = sqlite3.connect(f"file:{urllib.parse.quote(os.path.abspath(p))}?mode=ro{extra}", uri=True)
    try:
        return [(r[0], r[1]) for r in con.execute("SELECT type, name FROM sqlite_master")]
    finally:
        con.close()


def existing_readonly(url: str) -> str:
    """``url`` opened read-only when it names an existing SQLite file (:func:`readonly_url`: no WAL switch, no
    -wal/-shm files, nothing created), else ``url`` unchanged (a journal is only read until written to; a file
    that holds nothing yet, :func:`fresh_sqlite_file`, is opened as a new storage).

    Raises:
        StorageError: as :func:`readonly_url`.
    """
    sp = sqlite_path(url)
    if sp is not None and not is_readonly_url(url) and Path(sp[0]).is_file() and not fresh_sqlite_file(sp[0]):
        return readonly_url(url)
    return url


def readonly_url(url: str) -> str:
    """A URL opening the existing autotune storage at ``url`` read-only; the file is left untouched.

    Raises:
        StorageError: the file does not exist, is not a regular file, is not an SQLite database, or
            holds no Optuna tables (it is not a study storage: refused, not modified).
    """
    if not isinstance(url, str) or not url.strip():
        raise StorageError("--storage must be a non-empty SQLAlchemy URL, e.g. sqlite:///studies/autotune.db")
    check_storage_path(url)         # a name too long, a symbolic link loop
    if journal_path(url) is not None:
        check_journal_file(url, must_exist=True)
        try:
            copy = readable_journal_copy(url)
        except OSError as e:
            raise StorageError(f"storage {user_url(url)}: cannot be read: {e.strerror or e}") from None
        if copy is None:
            if read_only_fs(journal_path(url)):
                # Optuna's journal backend wants a writable file even to read it: read a copy
                return readable_journal_copy(url, always=True)[0]
            return url
        import sys
        sys.stderr.write(f"warning: journal {journal_path(url)}: its last record is torn (a write cut short); read "
                         f"without it ({copy[1]} whole records); `autotune repair {redact(url)}` removes it for good\n")
        _USER_URLS[copy[0]] = _USER_URLS.get(url, url)
        return copy[0]
    sp = sqlite_path(url)
    if sp is None:
        return url
    path, _ = sp
    p = Path(path)
    if not p.exists():
        raise StorageError(f"storage {url}: file {p} does not exist (nothing was created; check the path or run "
                           "`autotune run` first)")
    if not p.is_file():
        raise StorageError(f"storage {url}: {p} is not a regular file")
    try:
        with open(p, "rb") as fh:
            head = fh.read(16)
    except OSError as e:
        raise StorageError(f"storage {url}: {p} cannot be read: {e.strerror or e}") from None
    if not head:
        raise StorageError(f"storage {url}: {p} is empty: no study is stored in it yet (`autotune run --storage "
                           f"{redact(url)}` stores one)")
    if head != SQLITE_HEADER:
        raise StorageError(f"storage {url}: {p} is not an SQLite database; refused (left untouched)")
    abspath = os.path.abspath(p)
    # on a read-only file system SQLite cannot make the -shm file a WAL database needs even to be read: the
    # file is then opened immutable (SQLite "URI filenames": immutable=1, no locks, no -shm; nobody can write it)
    extra = "&immutable=1" if read_only_fs(p) else ""
    try:
        tables = {name for kind, name in _schema(p, extra) if kind == "table"}
    except sqlite3.Error as e:
        if disk_full(p):
            raise StorageError(f"storage {user_url(url)}: the disk (or quota) holding {p} is full ({e}); free space on "
                               "that file system (or use --storage on another one) and run again; finished trials "
                               "are kept") from None
        raise StorageError(f"storage {user_url(url)}: {p} cannot be read as SQLite: {e}") from None
    if not OPTUNA_TABLES <= tables:
        raise StorageError(f"storage {url}: {p} holds no Optuna study tables (tables: "
                           f"{', '.join(sorted(tables)[:8]) or 'none'}); not an autotune storage, left untouched")
    ro = f"sqlite:///file:{urllib.parse.quote(abspath)}?mode=ro{extra}&uri=true"
    _USER_URLS.setdefault(ro, _USER_URLS.get(url, url))
    return ro


def _root_cause(e: BaseException) -> BaseException:
    """The innermost exception ``e`` was raised from (sqlite3's "database disk image is malformed" under
    SQLAlchemy's DatabaseError under Optuna's StorageInternalError)."""
    seen = set()
    while id(e) not in seen:
        seen.add(id(e))
        nxt = e.__cause__ or e.__context__
        if nxt is None:
            break
        e = nxt
    return e


@contextlib.contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """Turn a storage that fails while being read (a damaged SQLite page, a lost server: Optuna's
    ``StorageInternalError``, SQLAlchemy's or sqlite3's errors) into one :class:`StorageError` line naming
    the user's ``--storage`` and the innermost cause, as ``run`` reports it. Other exceptions pass through.
    """
    import optuna

    try:
        yield
    except StorageError:
        raise
    except Exception as e:
        import sqlalchemy.exc

        if not isinstance(e, (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError, sqlite3.Error)):
            raise
        root = _root_cause(e)
        cause = (str(root).splitlines() or [type(root).__name__])[0].strip() or type(root).__name__
        raise StorageError(f"storage {user_url(url)} cannot be read: {cause} (the database may be damaged; "
                           "nothing was changed)") from None


# ------------------------------------------------------------------ torn journal records
def journal_torn_tail(path: str | Path) -> tuple[int, int] | None:
    """(whole records, byte offset where the torn tail starts) when the file's only problem is its last
    line (no newline at its end, or not a JSON record: a write cut by a full disk or a kill -9), else None.

    Raises:
        OSError: the file cannot be read.
    """
    import json

    data = Path(path).read_bytes()
    if not data:
        return None
    lines = data.split(b"\n")
    tail = lines[-1]            # b"" when the file ends with a newline
    whole = lines[:-1]

    def good(raw: bytes) -> bool:
        try:
            rec = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return False
        op = rec.get("op_code") if isinstance(rec, dict) else None
        return (not isinstance(op, bool) and op in _JOURNAL_KEYS
                and all(k in rec for k in _JOURNAL_KEYS[op]))

    def parses(raw: bytes) -> bool:
        try:
            return isinstance(json.loads(raw.decode("utf-8")), dict)
        except (UnicodeDecodeError, ValueError, RecursionError):
            return False

    # at least one whole record before the torn one: a file of one cut line is not known to be a journal
    if tail == b"":
        # a newline-terminated last line is torn only when it does not parse (a garbled write); a complete JSON
        # record with an unknown op_code or missing keys is not torn: the file is refused and left untouched
        # (check_journal_file), never cut
        if (len(whole) >= 2 and whole[-1].startswith(b"{") and not parses(whole[-1])
                and all(good(x) for x in whole[:-1])):
            return len(whole) - 1, len(data) - len(whole[-1]) - 1   # a garbled last record with its newline
        return None
    if whole and all(good(x) for x in whole):
        return len(whole), len(data) - len(tail)
    return None


def repair_journal(url: str) -> tuple[int, Path] | None:
    """Cut a torn last record off the journal at ``url`` (``journal:PATH``); returns (records kept, backup
    path) or None when there is nothing to repair. The whole file is first copied to
    ``PATH.torn-<UTC time>.bak`` (kept), then the file is truncated to its whole records under Optuna's
    journal lock (``JournalFileOpenLock``, optuna/storages/journal/_file.py), so no writer appends meanwhile.

    Raises:
        StorageError: the file cannot be read, copied or truncated (the file is left as it was).
    """
    import shutil

    path = journal_path(url)
    if not path:
        return None
    p = Path(path)
    if not p.is_file():
        return None
    try:
        found = journal_torn_tail(p)
        if found is None:
            return None
        from optuna.storages.journal import JournalFileOpenLock

        lock = JournalFileOpenLock(str(p))
        lock.acquire()
        try:
            found = journal_torn_tail(p)        # again, under the lock
            if found is None:
                return None
            kept, offset = found
            backup = p.with_name(f"{p.name}.torn-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.bak")
            from autotune.files import copy_output_file
            copy_output_file(p, backup, what="journal backup")     # never through a symbolic link
            shutil.copystat(p, backup, follow_symlinks=False)
            with open(p, "r+b") as fh:
                fh.truncate(offset)
                fh.flush()
                import os
                os.fsync(fh.fileno())
        finally:
            lock.release()
    except OSError as e:
        raise StorageError(f"storage {user_url(url)}: cannot repair the torn journal {p}: {e.strerror or e}; "
                           "free space or fix permissions and run `autotune repair` again (the file is unchanged)") from None
    return kept, backup


def readable_journal_copy(url: str, *, always: bool = False) -> tuple[str, int] | None:
    """For a read-only command: a ``journal:`` URL of a temporary copy of the journal at ``url`` without its
    torn last record, and the number of records kept; None when the journal is whole (``always``: a copy of
    the whole file then, for a journal on a read-only file system). The original file is
    not touched. The copy lives until the process ends.

    Raises:
        OSError: the file cannot be read.
    """
    import atexit
    import os
    import tempfile

    path = journal_path(url)
    if not path or not Path(path).is_file():
        return None
    found = journal_torn_tail(path)
    if found is None:
        if not always:
            return None
        found = (Path(path).read_bytes().count(b"\n"), Path(path).stat().st_size)
    kept, offset = found
    with open(path, "rb") as fh:
        data = fh.read(offset)
    fd, tmp = tempfile.mkstemp(prefix="autotune-journal-", suffix=".log")
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    atexit.register(lambda: Path(tmp).unlink(missing_ok=True))
    return f"journal:{tmp}", kept
