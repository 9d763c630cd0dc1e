"""Storage faults: which errors are passing (retried with back-off) and which are permanent (one ``error:``
line naming the storage, the cause and the fix, exit 2), and repairing a journal whose last record is torn.

Transient (:data:`TRANSIENT_MARKERS`): the database server closed or reset the connection (a restart:
PostgreSQL "terminating connection due to administrator command", "server closed the connection
unexpectedly", "the database system is starting up / shutting down"), the server refused a connection while
it restarts, a lock wait ran out (SQLite "database is locked", PostgreSQL "lock timeout"). They are retried
for at most :data:`RETRY_FOR_S` seconds, 0.2 s doubling to 5 s apart; pooled connections are re-made
(``pool_pre_ping``, :func:`autotune.study.storage.open_storage`).

Permanent (:data:`PERMANENT`): the disk or quota is full, the file system or database file is read-only,
permission is denied, the file is damaged (SQLite "database disk image is malformed", "file is not a
database", a torn journal). Trials finished before the failure are kept: Optuna writes each trial in its own
transactions (SQLite, PostgreSQL) or whole journal lines, so a failed write loses only that write.
"""

from __future__ import annotations

import errno
import logging
import random
import sqlite3
import time
from typing import Any, Callable, TypeVar

from autotune.errors import AutotuneError, StorageError
from autotune.study.storage_check import _root_cause, user_url

log = logging.getLogger(__name__)
T = TypeVar("T")

#: seconds a transient storage error is retried for before it is reported (a PostgreSQL restart takes 1-10 s)
RETRY_FOR_S = 120.0

#: lower-cased substrings of an error (its type name and message, and those of its causes) that mark a
#: passing condition (psycopg / libpq, SQLite and SQLAlchemy messages)
TRANSIENT_MARKERS = (
    "server closed the connection", "connection reset", "terminating connection", "connection refused",
    "adminshutdown", "the database system is starting up", "the database system is shutting down",
    "the database system is in recovery mode", "connection is closed", "consuming input failed",
    "ssl connection has been closed", "could not receive data", "could not send data", "broken pipe",
    "connection timed out", "database is locked", "lock timeout", "canceling statement due to lock timeout",
    "deadlock detected", "connection already closed", "no connection to the server", "connection to server",
    "cannot connect now", "operationalerror: (psycopg.operationalerror) the connection is lost",
)

#: (lower-cased markers, errno values, what is wrong, the fix) of permanent conditions
PERMANENT: tuple[tuple[tuple[str, ...], tuple[int, ...], str, str], ...] = (
    (("database or disk is full", "no space left", "disk full", "diskfull", "could not extend file"),
     (errno.ENOSPC, errno.EDQUOT), "the disk (or quota) is full",
     "free space on that file system (or use --storage on another one) and run again; finished trials are kept"),
    (("readonly database", "read-only file system", "read only file system", "readonly"),
     (errno.EROFS,), "the storage is read-only",
     "make the file and its directory writable (or use --storage on a writable file system)"),
    (("permission denied", "unable to open database file", "insufficient privilege", "access denied"),
     (errno.EACCES, errno.EPERM), "permission is denied",
     "give this user write permission on the file and its directory (or another --storage)"),
    (("malformed", "file is not a database", "not a database", "should not reach", "corrupt", "torn"),
     (), "the storage file is damaged",
     "restore it from a backup, or for a journal run `autotune repair STORAGE`; use another --storage meanwhile"),
)


def _texts(e: BaseException) -> list[str]:
    out, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        out.append(f"{type(e).__name__}: {e}".lower())
        e = e.__cause__ or e.__context__
    return out


def _errnos(e: BaseException) -> set[int]:
    out, seen = set(), set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno is not None:
            out.add(e.errno)
        e = e.__cause__ or e.__context__
    return out


def is_storage_exception(e: BaseException) -> bool:
    """Whether ``e`` (or one of its causes) comes from a storage: Optuna's ``StorageInternalError``,
    SQLAlchemy's and sqlite3's errors, an ``OSError`` of a storage file, Optuna's journal replay assertion."""
    import optuna
    import sqlalchemy.exc

    seen = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        if isinstance(x, (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError, sqlite3.Error)):
            return True
        if isinstance(x, OSError) and x.errno in {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
                                                  errno.EIO}:
            return True
        if isinstance(x, AssertionError) and "should not reach" in str(x).lower():
            return True         # optuna/storages/journal/_storage.py: a journal it cannot replay
        x = x.__cause__ or x.__context__
    return False


def classify(e: BaseException) -> str | None:
    """``transient``, ``permanent`` or None (not a storage condition autotune recognises)."""
    if _inner_storage_error(e) is not None:
        return "permanent"
    if isinstance(e, AutotuneError) or not is_storage_exception(e):
        return None
    if permanent_reason(e) is not None:
        return "permanent"
    texts = " | ".join(_texts(e))
    if any(m in texts for m in TRANSIENT_MARKERS):
        return "transient"
    return None


def permanent_reason(e: BaseException) -> tuple[str, str] | None:
    """(what is wrong, the fix) for a permanent storage condition, else None."""
    texts = " | ".join(_texts(e))
    nos = _errnos(e)
    from autotune.study.storage import LAST_URL
    from autotune.study.storage_check import disk_full, journal_path, sqlite_path
    where = journal_path(LAST_URL[0]) or (sqlite_path(LAST_URL[0]) or [None])[0]
    if where and ("disk i/o error" in texts or errno.EIO in nos) and disk_full(where):
        return PERMANENT[0][2], PERMANENT[0][3]      # SQLite reports a full disk as an I/O error at times
    for markers, errnos, what, fix in PERMANENT:
        if any(m in texts for m in markers) or nos & set(errnos):
            return what, fix
    return None


def _inner_storage_error(e: BaseException) -> StorageError | None:
    """The :class:`StorageError` among the causes of ``e`` (not ``e`` itself), if any: one that
    :mod:`autotune.study.reads` raised inside an Optuna storage call (a file made read-only, a lock held)."""
    seen = {id(e)}
    x = e.__cause__ or e.__context__
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        if isinstance(x, StorageError):
            return x
        x = x.__cause__ or x.__context__
    return None


def storage_fault(e: BaseException, url: str) -> StorageError | None:
    """The :class:`StorageError` line for a storage exception (permanent, or transient past its retries):
    "storage URL: <what> (<innermost cause>); <fix>", the password masked; None when ``e`` is not a storage
    exception."""
    inner = _inner_storage_error(e)
    if inner is not None:       # autotune's own storage check, wrapped by Optuna or SQLAlchemy: its line as is
        return inner
    if isinstance(e, AutotuneError) or not is_storage_exception(e):
        return None
    root = _root_cause(e)
    cause = (str(root).splitlines() or [type(root).__name__])[0].strip() or type(root).__name__
    pr = permanent_reason(e)
    if pr is None:
        from autotune.study.storage_check import sqlite_path
        sp = sqlite_path(url)
        if sp is not None and "database is locked" in " | ".join(_texts(e)):
            from autotune.files import excerpt
            return StorageError(f"storage {user_url(url)}: the SQLite file {excerpt(sp[0])} stayed locked by other "
                                f"processes ({cause}); SQLite lets one process write at a time: for many workers use "
                                "journal:PATH (a file with locks, no server) or postgresql:// (finished trials are kept)")
        if classify(e) == "transient":
            return StorageError(f"storage {user_url(url)}: the database server stayed unreachable for "
                                f"{RETRY_FOR_S:g} s ({cause}); check the server and run again (finished trials are kept)")
        return StorageError(f"storage {user_url(url)} failed: {cause}; check the storage (finished trials are kept)")
    what, fix = pr
    return StorageError(f"storage {user_url(url)}: {what} ({cause}); {fix}")


def with_retries(fn: Callable[[], T], url: str, *, what: str = "storage call", retry_for_s: float = RETRY_FOR_S,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """``fn()``, retried while it fails with a transient storage error (:func:`classify`), 0.2 s doubling to
    5 s apart (jittered), for at most ``retry_for_s`` seconds; a permanent storage error, or a transient one
    past that, becomes the :class:`StorageError` of :func:`storage_fault`; other errors propagate unchanged.

    Raises:
        StorageError: see above.
    """
    t0, delay = time.monotonic(), 0.2
    while True:
        try:
            return fn()
        except Exception as e:      # noqa: BLE001 - classified below
            kind = classify(e)
            if kind == "transient" and time.monotonic() - t0 < retry_for_s:
                log.warning("%s on %s: %s; retrying in %.1f s", what, user_url(url), _texts(e)[-1][:200], delay)
                sleep(delay * (0.75 + 0.5 * random.random()))
                delay = min(5.0, delay * 2)
                continue
            err = storage_fault(e, url)
            if err is None:
                raise
            raise err from None


class StorageFault(BaseException):
    """A permanent storage fault met inside a trial (:func:`storage_guarded`), raised past Optuna's ``catch``:
    Optuna would tell the trial FAIL, and on a full disk that in-place state update can succeed where the
    reason's insert cannot (a FAIL without a reason, which no later run may amend: Optuna refuses to update a
    finished trial). Left RUNNING, the trial is failed with its reason by the worker, or by the next run
    (:mod:`autotune.study.stale` notes). ``error``: the :class:`StorageError` line."""

    def __init__(self, error: StorageError) -> None:
        super().__init__(str(error))
        self.error = error


def storage_guarded(objective: Callable[[Any], T], url: str) -> Callable[[Any], T]:
    """``objective`` whose permanent storage errors become :class:`StorageFault` when the storage is at fault:
    the trial's ``fail_reason`` is written first, and only a storage that refuses that write too is blamed
    (a trial that met a full ``/tmp`` of its own, with a working storage, stays an ordinary failed trial)."""
    def run(trial: Any) -> T:
        try:
            return objective(trial)
        except Exception as e:
            if classify(e) != "permanent":
                raise
            try:
                trial.set_user_attr("fail_reason", f"{type(e).__name__}: {e}"[:2000])
            except Exception as e2:       # noqa: BLE001 - classified below
                err = storage_fault(e2, url) if classify(e2) == "permanent" else None
                if err is None:
                    raise
                raise StorageFault(err) from None
            raise
    return run


def stop_reason(e: BaseException, signal_no: int = 0) -> str:
    """The ``fail_reason`` of a trial stopped because its run ended on ``e``: ``interrupted`` (a signal),
    ``storage fault: <the StorageError line>`` (:data:`autotune.study.stale.FAULT_PREFIX`), else ``stopped on an
    error: <type>: <message>``."""
    from autotune.study.stale import FAULT_PREFIX
    if signal_no or isinstance(e, KeyboardInterrupt):
        return "interrupted"
    if isinstance(e, (StorageFault, StorageError)):
        return FAULT_PREFIX + str(e.error if isinstance(e, StorageFault) else e)
    return f"stopped on an error: {type(e).__name__}: {e}"[:2000]


__all__ = ["StorageFault", "storage_guarded", "stop_reason", "classify", "storage_fault", "with_retries", "is_storage_exception", "RETRY_FOR_S"]
