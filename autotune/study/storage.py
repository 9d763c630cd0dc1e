"""Study storages: open an Optuna storage URL (SQLite, PostgreSQL, journal file) with clear errors.

Moved from ``tune/tuner.py``; the checks on files and URLs are in :mod:`autotune.study.storage_check`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from pathlib import Path
from typing import Any, Callable

import optuna

from autotune.errors import ConfigError, StorageError, redact
from autotune.study.storage_check import user_url

log = logging.getLogger(__name__)

DEFAULT_STORAGE = "sqlite:///studies/autotune.db"
DEFAULT_BACKEND = "simulated"

_STORAGES: dict[tuple[str, int | None], optuna.storages.BaseStorage] = {}
#: SQLite files (device, inode) whose Optuna schema version this process, or the process it was forked from,
#: has checked (:func:`_schema_checked`)
_SCHEMA_CHECKED: set[tuple[int, int]] = set()
#: the storage URL this process opened last (what a storage fault the CLI catches is about)
LAST_URL: list[str] = [DEFAULT_STORAGE]

#: Errors of concurrent first use of one database (two processes creating Optuna's tables or the same
#: study at once): SQLite "table ... already exists" / "UNIQUE constraint failed: alembic_version",
#: PostgreSQL UniqueViolation / "duplicate key"; seen with 32 processes on a fresh file (issue 11).
_RACE_MARKERS = ("already exists", "unique constraint", "uniqueviolation", "duplicate key", "database is locked",
                 "integrityerror")
_RACE_RETRIES = 20

#: ``pip install`` hint per SQLAlchemy driver (the ``+driver`` of a URL's scheme, or the dialect's default:
#: psycopg for ``postgresql://`` since SQLAlchemy 2.1, psycopg2 before) whose module is missing. The PyPI
#: name ``autotune`` is another project, so the extra is named for an autotune checkout (``pip install -e``).
_DRIVER_HINTS = {
    "psycopg": "pip install 'psycopg[binary]>=3.1' (psycopg 3; in an autotune checkout: pip install -e '.[postgres]')",
    "psycopg2": "pip install psycopg2-binary (psycopg2, the driver postgresql+psycopg2:// names; or use "
                "postgresql+psycopg:// with psycopg 3: pip install -e '.[postgres]' in an autotune checkout)",
    "asyncpg": "use postgresql+psycopg:// (autotune's storages are synchronous; asyncpg is an asyncio driver)",
    "pg8000": "pip install pg8000 (the driver postgresql+pg8000:// names)",
    "mysqldb": "pip install mysqlclient (MySQLdb, the default driver of mysql://)",
    "pymysql": "pip install pymysql (the driver mysql+pymysql:// names)",
}


def driver_hint(url: str) -> str:
    """How to install the database driver ``url`` asks for (:data:`_DRIVER_HINTS`, by the driver SQLAlchemy
    would load for it: ``sqlalchemy.engine.make_url(url).get_driver_name()``, which reads the dialect's
    default without importing the driver)."""
    try:
        from sqlalchemy.engine import make_url

        driver = make_url(url).get_driver_name()
    except Exception:  # noqa: BLE001 - an unknown dialect: the generic hint
        return "install the SQLAlchemy driver for this dialect"
    return _DRIVER_HINTS.get(driver, f"install the Python package of the {driver} driver (the one SQLAlchemy "
                                     f"loads for this URL)")


def _is_race(e: BaseException) -> bool:
    text = f"{type(e).__name__} {e}".lower()
    return any(m in text for m in _RACE_MARKERS)


#: the signal (SIGINT / SIGTERM) received while tuning, once one arrived: a signal that lands inside an


def retry_races(fn: Callable[[], Any], what: str) -> Any:
    """Call ``fn`` again (up to :data:`_RACE_RETRIES` times, 0.05-1 s apart, jittered) while it fails with
    a concurrent-creation error (:data:`_RACE_MARKERS`); other errors and the last one propagate."""
    import random
    import time

    for attempt in range(_RACE_RETRIES):
        try:
            return fn()
        except optuna.exceptions.DuplicatedStudyError:
            raise
        except Exception as e:  # sqlalchemy IntegrityError / OperationalError / ProgrammingError
            if not _is_race(e) or attempt == _RACE_RETRIES - 1:
                raise
            log.debug("%s: concurrent creation (%s), retrying", what, e)
            time.sleep(min(1.0, 0.05 * 2 ** attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")


def storage_kind(url: str) -> str:
    """``sqlite``, ``postgresql``, ``journal`` or the URL's SQLAlchemy dialect (``mysql`` ...)."""
    if url.startswith("journal:"):
        return "journal"
    return url.split(":", 1)[0].split("+", 1)[0]


def check_heartbeat(heartbeat_interval_s: int | None, storage: str, backend: str = DEFAULT_BACKEND) -> None:
    """Refuse a ``--heartbeat-interval`` that cannot be used, before any study is created or written.

    Valid: None (off; the real backend then uses :data:`REAL_HEARTBEAT_INTERVAL_S` on RDB storages), or an
    integer >= 1 s on an RDB storage (Optuna's heartbeat is implemented by ``RDBStorage`` only,
    optuna/storages/_rdb/storage.py ``heartbeat_interval``; ``JournalStorage`` has none).

    Raises:
        ConfigError: ``heartbeat_interval_s`` < 1 or not an integer; given with a ``journal:`` storage.
    """
    if heartbeat_interval_s is None:
        return
    if isinstance(heartbeat_interval_s, bool) or not isinstance(heartbeat_interval_s, int) or heartbeat_interval_s < 1:
        raise ConfigError(f"--heartbeat-interval must be an integer >= 1 s, got {heartbeat_interval_s!r}")
    if storage_kind(storage) == "journal":
        why = (", so a killed worker's real trial would never be retried" if backend == "real" else "")
        raise ConfigError(f"--heartbeat-interval {heartbeat_interval_s}: Optuna's journal storage ({storage}) has no "
                          f"heartbeat{why}; leave --heartbeat-interval out, or use sqlite:///PATH or postgresql://")


def open_storage(url: str = DEFAULT_STORAGE, *, heartbeat_interval_s: int | None = None
                 ) -> optuna.storages.BaseStorage:
    """Open (and cache per process) the Optuna storage at ``url``.

    ``url``: an SQLAlchemy URL (``sqlite:///PATH``, ``postgresql://user@host:port/db``: psycopg 3 from the
    ``postgres`` extra, ``postgresql+psycopg2://`` for psycopg2, ...) or ``journal:PATH``:
    Optuna's :class:`~optuna.storages.JournalStorage` on a :class:`~optuna.storages.journal.JournalFileBackend`
    file (append-only log with file locks; for clusters with a shared file system and no database server).
    For the default URL the ``studies/`` directory is created if missing; for any other SQLite or journal
    path the directory must exist and be writable. Creating the tables is retried when another process
    creates them at the same time.

    ``heartbeat_interval_s``: RDB storages only (Optuna's heartbeat is implemented by RDBStorage, not by
    JournalStorage): each running trial records a heartbeat every that many seconds; a trial whose last
    heartbeat is older than 2 x the interval is failed by the next worker that asks for a trial and
    re-enqueued once with the same parameters (``RetryHeartbeatStaleTrialCallback(max_retry=1)``;
    optuna/storages/_rdb/storage.py ``heartbeat_interval``, optuna/storages/_callbacks.py).

    Raises:
        StorageError: the URL and the cause (missing or read-only directory, bad URL, missing database driver:
            names the extra to install, server unreachable).
    """
    key = (url, heartbeat_interval_s)
    LAST_URL[0] = url
    if key in _STORAGES and not (url.startswith("journal:") and _torn(url)):
        return _STORAGES[key]
    from autotune.study.storage_check import check_storage_path, is_readonly_url
    check_storage_path(url)     # a name too long, a symbolic link loop: one line, before anything opens it
    shown = user_url(url)       # errors name the user's --storage, not the internal read-only URL
    readonly = is_readonly_url(url)   # mode=ro: opened as is (never created, never switched to WAL)
    kind = storage_kind(url)
    if (kind == "sqlite" and not readonly) or kind == "journal":
        path = url[len("sqlite:///"):] if kind == "sqlite" else url[len("journal:"):]
        if kind == "sqlite" and not url.startswith("sqlite:///"):
            raise StorageError(f"cannot open study storage {shown}: expected sqlite:///PATH")
        if kind == "journal" and not path:
            raise StorageError(f"cannot open study storage {shown}: expected journal:PATH (a log file)")
        if path and path != ":memory:":
            d = Path(path).parent if Path(path).parent != Path("") else Path(".")
            if url == DEFAULT_STORAGE:
                with contextlib.suppress(OSError):
                    d.mkdir(parents=True, exist_ok=True)
            if not d.is_dir():
                raise StorageError(f"cannot open study storage {shown}: directory {d} does not exist")
            if not os.access(d, os.W_OK) or (Path(path).exists() and not os.access(path, os.W_OK)):
                from autotune.study.storage_check import read_only_fs
                if read_only_fs(d):
                    raise StorageError(f"cannot open study storage {shown}: the file system holding {d} is read-only; "
                                       "remount it read-write or use --storage on a writable one (`autotune show` "
                                       "still reads it)")
                raise StorageError(f"cannot open study storage {shown}: {Path(path) if Path(path).exists() else d} "
                                   "is not writable; give this user write permission or use another --storage")
    if kind == "journal":
        from autotune.study.storage_check import check_journal_file, repair_journal
        check_journal_file(url)     # a directory or a foreign file is refused before Optuna appends to it
        repaired = repair_journal(url)      # a torn last record (full disk, kill -9) is cut off, backed up
        if repaired is not None:
            for k in [k for k in _STORAGES if k[0] == url]:
                del _STORAGES[k]            # replayed up to the torn record: read the repaired file afresh
            import sys
            sys.stderr.write(f"warning: journal {url[len('journal:'):]}: its last record was torn (a write cut "
                             f"short) and was removed; {repaired[0]} whole records kept, the file as it was is "
                             f"in {repaired[1]}\n")
        if heartbeat_interval_s is not None:
            raise StorageError(f"{shown}: Optuna's journal storage has no heartbeat, so a killed worker's real trial "
                               "would never be retried; use sqlite:///PATH or postgresql:// for --backend real")
        from optuna.storages.journal import JournalFileBackend

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            storage: optuna.storages.BaseStorage = optuna.storages.JournalStorage(
                JournalFileBackend(url[len("journal:"):]))
        _STORAGES[key] = storage
        return storage
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            engine_kwargs: dict[str, Any] | None = None
            if kind == "sqlite":
                engine_kwargs = {"connect_args": {"timeout": 60}}
            elif kind != "journal":
                # a pooled connection the server dropped (a restart) is tested and re-made before use
                # (SQLAlchemy docs, "Dealing with Disconnects": pool_pre_ping), not handed to Optuna dead
                engine_kwargs = {"pool_pre_ping": True}
            hb: dict[str, Any] = {}
            if heartbeat_interval_s is not None:
                hb = {"heartbeat_interval": int(heartbeat_interval_s),
                      "heartbeat_stale_trial_callback": optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1)}
            checked = _schema_checked(url)
            from autotune.study.reads import TrialReadingRDBStorage

            storage = retry_races(lambda: TrialReadingRDBStorage(url, engine_kwargs=engine_kwargs,
                                                                 skip_compatibility_check=checked, **hb),
                                   f"open {redact(url)}")      # logged with AUTOTUNE_DEBUG: no password
            _schema_checked(url, add=True)
            if kind == "sqlite" and ":memory:" not in url and not readonly:
                _fast_sqlite(storage)
    except ModuleNotFoundError as e:
        raise StorageError(_missing_driver(shown, kind, e)) from None
    except Exception as e:  # sqlalchemy ArgumentError/OperationalError, missing driver ...
        cause = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "import" in cause.lower() and ("dbapi" in cause.lower() or "db access module" in cause.lower()
                                          or "no module" in cause.lower()):
            raise StorageError(_missing_driver(shown, kind, e)) from None
        raise StorageError(f"cannot open study storage {shown}: {cause}") from None
    _STORAGES[key] = storage
    return storage


def _schema_checked(url: str, *, add: bool = False) -> bool:
    """Whether the SQLite file of ``url`` had its Optuna schema version checked already in this process or
    the one it was forked from (``add``: record that it has been, now). Optuna's check
    (optuna/storages/_rdb/storage.py ``RDBStorage(skip_compatibility_check=False)``: Alembic loads its
    revision scripts and reads the file's version) cost each ``--workers`` process 0.045-0.065 s CPU (issue 26;
    ``RDBStorage.__init__`` in 4 forked workers of 8B x 8 H200, process time: 0.010-0.017 s with the check skipped)
    when it opened the study file a second time, read-only (:func:`~autotune.study.storage_check.existing_readonly`),
    after its parent had checked that file. Files are told apart by (device, inode), so a file replaced
    under the same path is checked again. False for anything but an existing SQLite file."""
    from autotune.study.storage_check import sqlite_path

    sp = sqlite_path(url)
    try:
        st = os.stat(sp[0]) if sp is not None else None
    except OSError:
        st = None
    if st is None:
        return False
    if add:
        _SCHEMA_CHECKED.add((st.st_dev, st.st_ino))
    return (st.st_dev, st.st_ino) in _SCHEMA_CHECKED


def close_connections() -> None:
    """Close the pooled connections of every storage :func:`open_storage` opened in this process, e.g. before
    forking worker processes (SQLite: a connection must not cross a fork,
    https://www.sqlite.org/howtocorrupt.html#fork; SQLAlchemy's pooling guide, "Using Connection Pools with
    Multiprocessing": ``engine.dispose()`` before the fork). The storages stay usable: the next use opens new
    connections, in this process and in a forked child (which inherits this cache)."""
    for storage in list(_STORAGES.values()):
        engine = getattr(storage, "engine", None)       # RDBStorage; a journal file holds no connection
        # an in-memory SQLite database lives in its connection: disposing it would leave the cached storage on
        # a new, empty database ("no such table: studies" for the next run in this process); no worker uses it
        if engine is not None and engine.url.database not in (None, "", ":memory:"):
            with contextlib.suppress(Exception):
                engine.dispose()


def _torn(url: str) -> bool:
    """Whether the journal file of ``url`` ends with a torn record (then a cached storage is not reused)."""
    from autotune.study.storage_check import journal_torn_tail
    try:
        return Path(url[len("journal:"):]).is_file() and journal_torn_tail(url[len("journal:"):]) is not None
    except OSError:
        return False


def _missing_driver(url: str, kind: str, e: BaseException) -> str:
    """The error line for a storage whose database driver is not installed; the hint fits the URL's driver."""
    return f"cannot open study storage {url}: the database driver is not installed ({e}); {driver_hint(url)}"


def _fast_sqlite(storage: optuna.storages.RDBStorage) -> None:
    """WAL journal + synchronous=NORMAL: a commit no longer waits for fsync (~8 ms each, ~40 per trial).

    Durable against a crash of this process (SQLite WAL guarantees); only a power loss may drop the last
    commits. Applies to every connection the engine opens from now on.
    """
    import sqlalchemy

    engine = storage.engine
    engine.dispose()

    @sqlalchemy.event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:  # pragma: no cover - trivial
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()


def lost_enqueued_race(e: BaseException) -> bool:
    """True if ``e`` is Optuna refusing to finish a trial that another worker already finished
    (``optuna/study/_tell.py``: "Cannot tell a COMPLETE trial."; the storage's
    ``UpdateFinishedTrialError``): the SQLite race on a shared enqueued trial, not a failure."""
    if isinstance(e, optuna.exceptions.UpdateFinishedTrialError):
        return True
    return isinstance(e, ValueError) and str(e).startswith("Cannot tell a ")

