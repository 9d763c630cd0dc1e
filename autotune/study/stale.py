"""Trials of dead workers: who runs a trial (:func:`worker_stamp`, stored in ``user_attrs['worker']`` with the
trial's first write), finding RUNNING trials whose worker is gone (:func:`stale_reason`) and marking them FAIL
with the reason (:func:`reap_stale`), and waiting for other workers' trials (:func:`wait_for_others`).

A RUNNING trial is stale when its worker ran on this host and its process is gone (``os.kill(pid, 0)``
raises ``ProcessLookupError``; a pid reused by another process is told apart by the process start time,
``/proc/<pid>/stat`` field 22, proc(5)), or when it started more than ``stale_after_s`` ago (another host's
worker, which cannot be looked at: the bound is well above any trial's duration). Works on every storage
(SQLite, PostgreSQL, journal); Optuna's own heartbeat (RDB storages only) is used besides for real trials.

A trial stopped by a permanent storage fault (a full disk) often cannot be marked FAIL then: on a full disk
SQLite cannot insert its reason, nor a journal append a record. Its reason is then kept in a note outside the
storage (:func:`note_unwritten`, in :func:`notes_dir`, one small JSON file per process) and written by the next
run on that storage once it can (:func:`apply_notes`, before the stale trials are reaped); ``show`` reports a
note not written yet (:func:`pending_notes`). Where the note cannot be written either, the trial is failed as
a dead worker's (its worker is gone), so no trial stays RUNNING.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.search.seeding import TrialSeededSampler

#: a RUNNING trial older than this (s) is stale whatever its host: a simulated or measured trial takes
#: seconds; the real backend passes max(this, 3 x its trial timeout)
STALE_AFTER_S = 3600.0
#: a RUNNING trial that no worker stamped this long (s) after it started is an orphan: workers stamp a trial
#: as it is created (:class:`StampedSampler`, milliseconds later); one without a stamp was created by an
#: INSERT that committed while the connection broke (a server restart), and its worker, seeing an error,
#: went on with a new trial
UNSTAMPED_GRACE_S = 10.0
#: the ``fail_reason`` prefix of a trial failed because its worker died (``show`` counts them)
STALE_PREFIX = "stale: "
#: the ``fail_reason`` prefix of a trial stopped by a permanent storage fault (``show`` counts them)
FAULT_PREFIX = "storage fault: "

_STAMP: dict[str, Any] = {}
#: pid -> ids of the trials Optuna created in that process (a forked worker starts with none of its parent's)
_CREATED: dict[int, set[int]] = {}


def trials_created_here() -> set[int]:
    """Ids of the trials Optuna created in this process, recorded first thing in
    :meth:`StampedSampler.before_trial`: a signal raised inside Optuna's trial creation, after the trial was
    stored RUNNING but before the objective saw it (QA, session 8: 3 of 14 ``--workers 4`` runs stopped by
    SIGKILL of the parent left 1-4 such trials RUNNING), still lets the tuner fail it."""
    return set(_CREATED.get(os.getpid(), ()))


def _proc_start(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (proc(5) ``/proc/PID/stat`` field 22), or
    None where /proc is not readable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("ascii", "replace")
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def worker_stamp() -> dict[str, Any]:
    """This process as a trial's worker: ``host`` (hostname), ``pid``, ``proc_start`` (clock ticks since boot,
    or None) and ``started`` (Unix time, s, when this process first stamped a trial)."""
    pid = os.getpid()
    if _STAMP.get("pid") != pid:        # a forked child stamps as itself
        _STAMP.clear()
        _STAMP.update(host=socket.gethostname(), pid=pid, proc_start=_proc_start(pid), started=time.time())
    return dict(_STAMP)


class StampedSampler(TrialSeededSampler):
    """:class:`TrialSeededSampler` that records :func:`worker_stamp` in ``user_attrs['worker']`` of each trial
    as soon as Optuna has created it (``Study.ask`` calls ``before_trial`` right after ``create_new_trial``),
    before the sampler runs: a worker killed at any point of a trial leaves a trial that names it."""

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        _CREATED.setdefault(os.getpid(), set()).add(trial._trial_id)
        with contextlib.suppress(Exception):        # a failed stamp must not stop the trial (age bound instead)
            study._storage.set_trial_user_attr(trial._trial_id, "worker", worker_stamp())
        super().before_trial(study, trial)


def _pid_gone(pid: int, proc_start: Any) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OSError):
        return False                    # exists (another user's process)
    now = _proc_start(pid)
    return proc_start is not None and now is not None and now != proc_start     # the pid was reused


def _age_s(t: FrozenTrial, now: float | None = None) -> float | None:
    """Seconds since trial ``t`` started (at ``now``, Unix time, default the clock), or None if it has no start."""
    start = t.datetime_start
    if start is None:
        return None
    if start.tzinfo is None:
        start = start.astimezone()          # Optuna stores naive local times (datetime.now())
    return (now if now is not None else time.time()) - start.timestamp()


def stale_reason(t: FrozenTrial, *, stale_after_s: float = STALE_AFTER_S, now: float | None = None) -> str | None:
    """Why RUNNING trial ``t`` belongs to a dead worker, or None (not RUNNING, or its worker may be alive)."""
    if t.state != TrialState.RUNNING:
        return None
    w = t.user_attrs.get("worker")
    host = socket.gethostname()
    if isinstance(w, Mapping) and w.get("host") == host and isinstance(w.get("pid"), int):
        if w["pid"] == os.getpid():
            return None
        if _pid_gone(w["pid"], w.get("proc_start")):
            return f"{STALE_PREFIX}its worker (pid {w['pid']} on {host}) is gone; the trial never finished"
        return None
    age = _age_s(t, now)
    if age is None:
        return None
    if not isinstance(w, Mapping) and age > UNSTAMPED_GRACE_S:
        return (f"{STALE_PREFIX}no worker recorded itself on it in {age:.0f} s (> {UNSTAMPED_GRACE_S:g} s; workers "
                "stamp a trial as they create it): created while the storage failed, its worker went on without it")
    if age > stale_after_s:
        who = (f"pid {w.get('pid')} on {w.get('host')}" if isinstance(w, Mapping) else "a worker that left no record")
        return (f"{STALE_PREFIX}running for {age / 3600:.1f} h (> {stale_after_s / 3600:g} h, the bound for a live "
                f"trial) by {who}; its worker is taken as dead")
    return None


def _fail_one(storage: optuna.storages.BaseStorage, tid: int, reason: str) -> bool | None:
    """Mark trial ``tid`` FAIL with ``reason`` if it is RUNNING: True when marked, False when it was not
    RUNNING (finished meanwhile by a live worker), None when the storage refused the write."""
    try:
        if storage.get_trial(tid).state != TrialState.RUNNING:
            return False
        storage.set_trial_user_attr(tid, "fail_reason", reason)
        return bool(storage.set_trial_state_values(tid, TrialState.FAIL))
    except Exception:           # noqa: BLE001 - a storage that cannot take the write (the caller notes it)
        return None


def fail_trials(storage: optuna.storages.BaseStorage, reasons: Mapping[int, str], *,
                url: str | None = None) -> int:
    """Mark each trial id of ``reasons`` FAIL with ``user_attrs['fail_reason']`` = its reason, if it is still
    RUNNING (a trial finished meanwhile by a live worker is left alone); returns how many were marked.
    Storage errors are ignored per trial; with ``url``, the reasons the storage refused are kept in a note
    (:func:`note_unwritten`) that the next run on ``url`` writes."""
    done = {tid: _fail_one(storage, tid, reason) for tid, reason in reasons.items()}
    unwritten = {tid: reasons[tid] for tid, ok in done.items() if ok is None}
    if url is not None and unwritten:
        note_unwritten(storage, url, unwritten)
    return sum(1 for ok in done.values() if ok)


def notes_dir() -> Path:
    """Where reasons a storage could not take wait (:func:`note_unwritten`): ``$AUTOTUNE_STATE_DIR``, else
    ``$XDG_STATE_HOME/autotune``, else ``~/.local/state/autotune`` (XDG Base Directory Specification 0.8:
    "state data that should persist between (application) restarts")."""
    if os.environ.get("AUTOTUNE_STATE_DIR"):
        return Path(os.environ["AUTOTUNE_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "autotune"


def storage_key(url: str) -> str:
    """A storage's identity for its notes: SHA-256 (16 hex digits) of the resolved file of a SQLite or
    journal URL (any spelling of one file gives one key), else of the URL without its password."""
    from autotune.errors import redact
    from autotune.study.storage_check import journal_path, sqlite_path

    sp = sqlite_path(url)
    path = journal_path(url) if sp is None else sp[0]
    ident = f"file:{Path(path).expanduser().resolve()}" if path else redact(url)
    return hashlib.sha256(ident.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def note_unwritten(storage: optuna.storages.BaseStorage, url: str, reasons: Mapping[int, str]) -> Path | None:
    """Keep ``reasons`` (trial id -> reason) that ``storage`` could not take in a note of this process,
    ``<notes_dir>/unwritten-<storage_key>-<pid>.json``, with each trial's number and start (read when the
    storage still answers) so that a later run fails the same trial only; returns the note's path, or None
    where it could not be written (then the trials end as a dead worker's)."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    trials = []
    for tid, reason in reasons.items():
        entry: dict[str, Any] = {"trial_id": tid, "reason": reason}
        with contextlib.suppress(Exception):
            t = storage.get_trial(tid)
            entry.update(number=t.number, start=t.datetime_start.isoformat() if t.datetime_start else None)
        trials.append(entry)
    from autotune.errors import redact
    p = notes_dir() / f"unwritten-{storage_key(url)}-{os.getpid()}.json"
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps({"storage": redact(url), "recorded_at": now, "trials": trials}))
        tmp.replace(p)
    except OSError:
        return None
    return p


def pending_notes(url: str) -> list[dict[str, Any]]:
    """The trials of ``url`` whose reason waits in a note (:func:`note_unwritten`): dicts with ``trial_id``,
    ``number``, ``reason`` and ``recorded_at``."""
    out = []
    for p in sorted(notes_dir().glob(f"unwritten-{storage_key(url)}-*.json")):
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            d = json.loads(p.read_text())
            out += [dict(t, recorded_at=d["recorded_at"], note=str(p)) for t in d["trials"]]
    return out


def apply_notes(storage: optuna.storages.BaseStorage, url: str) -> int:
    """Write the reasons that wait in notes for ``url`` (:func:`pending_notes`): each noted trial that is
    still RUNNING (same number and start) is marked FAIL with ``<reason> (recorded at <time>; written by a
    later run)``; a note is removed once none of its trials waits. Returns how many trials were marked."""
    n, keep, notes = 0, set(), pending_notes(url)
    for t in notes:
        try:
            ft = storage.get_trial(int(t["trial_id"]))
        except Exception:           # noqa: BLE001 - no such trial (another file now), or unreadable: dropped
            continue
        start = ft.datetime_start.isoformat() if ft.datetime_start else None
        if ft.state != TrialState.RUNNING or t.get("number", ft.number) != ft.number or \
                t.get("start", start) != start:
            continue
        ok = _fail_one(storage, ft._trial_id, f"{t['reason']} (recorded at {t['recorded_at']}; written by a later run)")
        n += bool(ok)
        if ok is None:
            keep.add(t["note"])
    for p in {t["note"] for t in notes} - keep:
        with contextlib.suppress(OSError):
            os.unlink(p)
    return n


def reap_stale(study: optuna.Study, *, stale_after_s: float = STALE_AFTER_S,
               trials: Iterable[FrozenTrial] | None = None, url: str | None = None) -> int:
    """Mark FAIL (with the reason of :func:`stale_reason`) every RUNNING trial of ``study`` whose worker is
    dead; returns how many. Safe to run from several workers at once (a trial already failed is skipped).
    With ``url``, the reasons waiting in notes for that storage are written first (:func:`apply_notes`).
    Nothing else is done on a storage with Optuna's heartbeat on (the real backend on RDB storages): Optuna
    fails those trials itself and runs them once more (``RetryHeartbeatStaleTrialCallback``)."""
    from optuna.storages._heartbeat import is_heartbeat_enabled

    if url is not None:
        apply_notes(study._storage, url)

    if is_heartbeat_enabled(study._storage):
        return 0
    ts = list(trials) if trials is not None else study._storage.get_all_trials(
        study._study_id, deepcopy=False, states=(TrialState.RUNNING,))
    now = time.time()
    reasons = {t._trial_id: r for t in ts if (r := stale_reason(t, stale_after_s=stale_after_s, now=now))}
    return fail_trials(study._storage, reasons) if reasons else 0


def reap_after_run(study: optuna.Study, *, url: str | None = None, grace_s: float = UNSTAMPED_GRACE_S,
                   poll_s: float = 0.25) -> int:
    """At the end of a run (every worker of this run has exited): :func:`reap_stale`, once no unstamped RUNNING
    trial is younger than ``grace_s`` (re-read every ``poll_s`` s, for at most ``grace_s`` s: a live worker's
    trial is stamped milliseconds after its creation, one whose worker was killed in between never is), so
    that no trial this run's workers, or a worker killed just before this run, left stays RUNNING; returns how
    many were marked FAIL. (A single run after a ``kill -9`` that landed between a trial's creation and its
    stamp ended before the orphan was ``grace_s`` old and left it RUNNING: tests/study/test_faults.py.)"""
    deadline = time.monotonic() + grace_s + poll_s
    while True:
        ts = study._storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.RUNNING,))
        young = [a for t in ts if not isinstance(t.user_attrs.get("worker"), Mapping)
                 and (a := _age_s(t)) is not None and a <= grace_s]
        left = deadline - time.monotonic()
        if not young or left <= 0:
            break
        time.sleep(min(poll_s, left))
    return reap_stale(study, url=url)


def fail_own_running(study: optuna.Study, reason: str) -> int:
    """Mark FAIL with ``reason`` the RUNNING trials stamped by this process (:func:`worker_stamp`): called
    between trials (after a lost connection), when none of them can still be running; returns how many."""
    me = worker_stamp()
    with contextlib.suppress(Exception):
        ts = study._storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.RUNNING,))
        mine = {t._trial_id: reason for t in ts if isinstance(w := t.user_attrs.get("worker"), Mapping)
                and w.get("host") == me["host"] and w.get("pid") == me["pid"]}
        return fail_trials(study._storage, mine)
    return 0


def count_stale_failed(trials: Iterable[FrozenTrial], prefix: str = STALE_PREFIX) -> int:
    """How many FAIL trials were failed because their worker died (``fail_reason`` starts with "stale: "), or
    with ``prefix`` :data:`FAULT_PREFIX`, because a storage fault stopped their worker."""
    return sum(1 for t in trials if t.state == TrialState.FAIL
               and str(t.user_attrs.get("fail_reason", "")).startswith(prefix))


def wait_for_others(study: optuna.Study, *, is_done, interrupted, stale_after_s: float = STALE_AFTER_S,
                    poll_s: float = 0.5, quiet_s: float = 600.0) -> list[FrozenTrial]:
    """The study's trials, once ``is_done(trials)`` (it has a feasible trial) or no other worker's trial is
    still running.

    A worker whose own trials found nothing feasible does not declare the study hopeless while other
    workers' trials are still running (issue 11); it waits for them. Trials of dead workers are failed on the
    way (:func:`reap_stale`), so a trial left RUNNING by a killed run does not hold the wait; as a last resort
    the wait ends when the running set has not changed for ``quiet_s`` seconds.

    Raises:
        KeyboardInterrupt: ``interrupted()`` became true while waiting.
    """
    last, since = None, time.monotonic()
    while True:
        trials = study.get_trials(deepcopy=False)
        running = [t for t in trials if t.state == TrialState.RUNNING]
        if running and reap_stale(study, stale_after_s=stale_after_s, trials=running):
            continue
        if not running or is_done(trials):
            return trials
        key = frozenset(t.number for t in running)
        if key != last:
            last, since = key, time.monotonic()
        elif time.monotonic() - since > quiet_s:
            return trials
        if interrupted():
            raise KeyboardInterrupt
        time.sleep(poll_s)


