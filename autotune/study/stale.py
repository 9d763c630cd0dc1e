"""Trials of dead workers: who runs a trial (:func:`worker_stamp`, stored in ``user_attrs['worker']`` with the
trial's first write), finding RUNNING trials whose worker is gone (:func:`stale_reason`) and marking them FAIL
with the reason (:func:`reap_stale`), and waiting for other workers' trials (:func:`wait_for_others`).

A RUNNING trial is stale when its worker ran on this host and its process is gone (``os.kill(pid, 0)``
raises ``ProcessLookupError``; a pid reused by another process is told apart by the process start time,
``/proc/<pid>/stat`` field 22, proc(5)), or when it started more than ``stale_after_s`` ago (another host's
worker, which cannot be looked at: the bound is well above any trial's duration). Works on every storage
(SQLite, PostgreSQL, journal); Optuna's own heartbeat (RDB storages only) is used besides for real trials.
"""

from __future__ import annotations

import contextlib

import os
import socket
import time
from typing import Any, Iterable, Mapping

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.search.seeding import TrialSeededSampler

#: a RUNNING trial older than this (s) is stale whatever its host: a simulated or measured trial takes
#: seconds; the real backend passes max(this, 3 x its trial timeout)
STALE_AFTER_S = 3600.0
#: the ``fail_reason`` prefix of a trial failed because its worker died (``show`` counts them)
STALE_PREFIX = "stale: "

_STAMP: dict[str, Any] = {}


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
    start = t.datetime_start
    if start is None:
        return None
    if start.tzinfo is None:
        start = start.astimezone()          # Optuna stores naive local times (datetime.now())
    age = (now if now is not None else time.time()) - start.timestamp()
    if age > stale_after_s:
        who = (f"pid {w.get('pid')} on {w.get('host')}" if isinstance(w, Mapping) else "a worker that left no record")
        return (f"{STALE_PREFIX}running for {age / 3600:.1f} h (> {stale_after_s / 3600:g} h, the bound for a live "
                f"trial) by {who}; its worker is taken as dead")
    return None


def fail_trials(storage: optuna.storages.BaseStorage, reasons: Mapping[int, str]) -> int:
    """Mark each trial id of ``reasons`` FAIL with ``user_attrs['fail_reason']`` = its reason, if it is still
    RUNNING (a trial finished meanwhile by a live worker is left alone); returns how many were marked.
    Storage errors are ignored per trial."""
    n = 0
    for tid, reason in reasons.items():
        with contextlib.suppress(Exception):
            if storage.get_trial(tid).state != TrialState.RUNNING:
                continue
            storage.set_trial_user_attr(tid, "fail_reason", reason)
            if storage.set_trial_state_values(tid, TrialState.FAIL):
                n += 1
    return n


def reap_stale(study: optuna.Study, *, stale_after_s: float = STALE_AFTER_S,
               trials: Iterable[FrozenTrial] | None = None) -> int:
    """Mark FAIL (with the reason of :func:`stale_reason`) every RUNNING trial of ``study`` whose worker is
    dead; returns how many. Safe to run from several workers at once (a trial already failed is skipped).
    Nothing is done on a storage with Optuna's heartbeat on (the real backend on RDB storages): Optuna fails
    those trials itself and runs them once more (``RetryHeartbeatStaleTrialCallback``)."""
    from optuna.storages._heartbeat import is_heartbeat_enabled

    if is_heartbeat_enabled(study._storage):
        return 0
    ts = list(trials) if trials is not None else study._storage.get_all_trials(
        study._study_id, deepcopy=False, states=(TrialState.RUNNING,))
    now = time.time()
    reasons = {t._trial_id: r for t in ts if (r := stale_reason(t, stale_after_s=stale_after_s, now=now))}
    return fail_trials(study._storage, reasons) if reasons else 0


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


def count_stale_failed(trials: Iterable[FrozenTrial]) -> int:
    """How many FAIL trials were failed because their worker died (``fail_reason`` starts with "stale: ")."""
    return sum(1 for t in trials if t.state == TrialState.FAIL
               and str(t.user_attrs.get("fail_reason", "")).startswith(STALE_PREFIX))


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


