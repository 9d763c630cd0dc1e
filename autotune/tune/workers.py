"""Several tuning workers on one study: ``autotune run --workers N`` (N local processes).

Every worker is a separate process (``multiprocessing``: forked from this process where that is safe, else
from a fork server, else spawned; no SQLAlchemy connection, thread or CUDA state is inherited; :func:`_context`) that builds its own :class:`~autotune.tune.tuner.Tuner` on the same storage and calls
:meth:`~autotune.tune.tuner.Tuner.optimize` with ``worker_id = first_worker_id + i``; the workers cooperate
through the storage only (see ``Tuner.optimize``), exactly like ``autotune run`` processes started on
other hosts, so a cluster runs the same thing as a Slurm array (one ``autotune run --worker-id
$SLURM_ARRAY_TASK_ID`` per task) or as several jobs. ``--trials`` is per worker.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue as queue_mod
from dataclasses import dataclass, field
from typing import Any, Mapping

from autotune.errors import ConfigError
from autotune.files import excerpt


@dataclass(frozen=True)
class WorkerOutcome:
    """What one worker process did: its id, trials it ran, its own outcome counts
    (feasible/infeasible/pruned/failed), and an error line if it stopped on one (else None)."""

    worker_id: int
    n_new_trials: int = 0
    own_states: Mapping[str, int] = field(default_factory=dict)
    error: str | None = None
    exitcode: int | None = None
    stop_reason: str | None = None      #: why it ended before its --trials (the convergence stop), else None


#: the signals a worker handles; the parent blocks them while it starts the workers (a blocked signal stays
#: pending, and the mask is inherited through spawn's fork + exec), so a Ctrl-C that reaches a worker while
#: it is still importing modules is neither printed as a KeyboardInterrupt traceback nor lost: the worker
#: unblocks them once its handler is installed and the pending signal is then handled like any other
_SIGNALS = ("SIGINT", "SIGTERM")
#: exit status of a worker that could not send its outcome because the system refused to start a thread
#: (``multiprocessing.Queue.put`` starts a feeder thread: ``RuntimeError: can't start new thread`` under a
#: low ``ulimit -u``); EX_TEMPFAIL of BSD sysexits.h (75, "temporary failure"); the parent names the cause
NO_THREAD_EXIT = 75


def _worker_main(tuner_kwargs: dict[str, Any], optimize_kwargs: dict[str, Any], worker_id: int,
                 out: "mp.Queue[WorkerOutcome]", study_checked: bool = False) -> None:  # pragma: no cover - child
    import signal
    import sys

    from autotune.errors import AutotuneError, NoFeasiblePlanError
    from autotune.launchers.reaper import term_when_gone
    from autotune.signals import interrupted, note_interrupt, safe_to_raise
    from autotune.tune.tuner import Tuner

    sigs = [getattr(signal, n) for n in _SIGNALS]
    armed = [True]

    def on_signal(signum: int, frame: Any) -> None:
        # raised once (the first signal, where safe_to_raise allows): the parent forwards the signal that
        # stopped it, so after a Ctrl-C to the process group a worker gets SIGINT twice, and a second
        # KeyboardInterrupt must not land in the clean-up below; Tuner.optimize installs its own handler
        # while it tunes and puts this one back when it ends
        first = interrupted() is None
        note_interrupt(signum)
        if first and armed[0] and safe_to_raise(frame):
            raise KeyboardInterrupt

    # a KeyboardInterrupt raised into a garbage-collector callback cannot propagate and Python prints it
    # ("Exception ignored in ..."); once the signal is noted the worker stops at its next check anyway
    old_hook = sys.unraisablehook

    def unraisable(u: Any) -> None:
        if isinstance(u.exc_value, KeyboardInterrupt) and interrupted() is not None:
            return
        old_hook(u)

    sys.unraisablehook = unraisable
    tuner = None
    outcome = WorkerOutcome(worker_id, error="interrupted")
    try:
        try:
            for sig in sigs:
                if signal.getsignal(sig) is not signal.SIG_IGN:     # an ignored signal stays ignored
                    signal.signal(sig, on_signal)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)       # a pending signal is handled here
            parent = mp.parent_process()
            if parent is not None:      # the tuner killed with SIGKILL: SIGTERM here, handled as above
                term_when_gone(parent.pid)
            if interrupted():
                raise KeyboardInterrupt
            tuner = Tuner(**tuner_kwargs)
            tuner.study_checked = study_checked
            if interrupted():
                raise KeyboardInterrupt
            s = tuner.optimize(worker_id=worker_id, show_progress_bar=False, **optimize_kwargs)
            outcome = WorkerOutcome(worker_id, s.n_new_trials, dict(s.own_states), stop_reason=s.stop_reason)
        except KeyboardInterrupt:
            raise
        except NoFeasiblePlanError:     # the parent says why; this worker's own trials are still counted
            outcome = WorkerOutcome(worker_id, error=None, **_own_counts(tuner))
        except AutotuneError as e:
            outcome = WorkerOutcome(worker_id, error=str(e))
        except Exception as e:  # noqa: BLE001 - reported by the parent
            outcome = WorkerOutcome(worker_id, error=f"{type(e).__name__}: {e}")
    except KeyboardInterrupt:
        outcome = WorkerOutcome(worker_id, error="interrupted")
    finally:
        armed[0] = False        # from here on a signal is only noted: the worker is ending anyway
    try:
        out.put(outcome)        # starts the queue's feeder thread
    except (RuntimeError, OSError):     # no feeder thread (ulimit -u): no traceback; the parent says why
        sys.exit(NO_THREAD_EXIT)
    finally:
        if tuner is not None:
            tuner.close()


def _own_counts(tuner: Any) -> dict[str, Any]:
    """``n_new_trials`` and ``own_states`` of the trials ``tuner`` started (its ``_started`` trial ids), read
    from the study: for a worker whose run ended without a feasible plan in the study (``Tuner.optimize``
    raised before its summary), which reported 0 trials run before. Empty if they cannot be read."""
    from autotune.study.trials import outcome_counts

    try:
        started = getattr(tuner, "_started", set())
        mine = [t for t in tuner.study.get_trials(deepcopy=False) if t._trial_id in started]
        return {"n_new_trials": len(mine), "own_states": outcome_counts(mine)}
    except Exception:  # noqa: BLE001 - counts only; the parent reads the study itself
        return {}


#: what the fork server imports once for all workers (:func:`_context`): the tuner and the RDB storage
#: (SQLAlchemy, Alembic, Optuna's models), ~1.6 s CPU that each spawned worker paid for itself
_PRELOAD = ["autotune.tune.workers", "autotune.tune.tuner", "autotune.cost.simulator", "optuna.storages._rdb.storage",
            "optuna.storages._rdb.models", "alembic.migration", "sqlalchemy.dialects.sqlite"]


def _context() -> Any:
    """The multiprocessing context of the workers: ``fork`` where it is safe, else ``forkserver``, else
    ``spawn``.

    * ``fork`` (the simulated backend's case): the workers are forked from this process, which has
      imported the tuner, Optuna, SQLAlchemy and Alembic already and holds warm module-level caches (the
      shipped calibration, in-flight counts, step-graph structures). Used only where nothing unsafe
      crosses the fork: the platform has it, this process runs no other thread (a lock held by one would
      stay held in the child) and has not initialised CUDA (a forked child cannot use it). The storage's
      connections are closed before the fork (:func:`autotune.study.storage.close_connections`), standard streams flushed
      (a child would print their buffers again); a child leaves with ``os._exit`` (multiprocessing), so
      it never finalises what it inherited.
    * ``forkserver`` otherwise: a fresh server process (spawn's fork + exec) that imports
      :data:`_PRELOAD` once and forks each worker from itself; no SQLAlchemy connection, CUDA state or
      thread of the parent is inherited. :func:`_stop_forkserver` ends it (and counts its CPU).
    * ``spawn`` where neither exists (Windows): each worker a fresh interpreter that imports the tuner,
      Optuna, SQLAlchemy and Alembic itself (~1.6 s CPU per worker, issue 26).

    Every one starts inside :func:`run_workers`'s signal-blocked window, so the workers start with SIGINT /
    SIGTERM blocked. ``AUTOTUNE_WORKER_START=fork|forkserver|spawn`` in the environment chooses one (tests
    of a worker's own start-up use spawn). Measured (issue 26, ``bench/bench_search_workers.py``): the
    fork server's own imports were ~1.5 s CPU of a 12 s ``--workers 4`` run of 8B."""
    import sys
    import threading

    forced = os.environ.get("AUTOTUNE_WORKER_START")
    if forced in ("fork", "forkserver", "spawn"):
        if forced != "spawn" and forced not in mp.get_all_start_methods():
            raise ConfigError(f"AUTOTUNE_WORKER_START={forced} is not available on this platform; use one of "
                              f"{', '.join(mp.get_all_start_methods())}")
        ctx = mp.get_context(forced)
        if forced == "forkserver":
            ctx.set_forkserver_preload(_PRELOAD)
        return ctx
    if forced:
        raise ConfigError(f"AUTOTUNE_WORKER_START={forced!r} is not a start method; use fork, forkserver or spawn")
    methods = mp.get_all_start_methods()
    torch = sys.modules.get("torch")
    cuda = torch is not None and getattr(getattr(torch, "cuda", None), "is_initialized", lambda: False)()
    if "fork" in methods and threading.active_count() == 1 and not cuda:
        return mp.get_context("fork")
    if "forkserver" in methods:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        return ctx
    return mp.get_context("spawn")


def _stop_forkserver(ctx: Any) -> None:
    """End the fork server (if this context started one) and reap it, so it neither outlives the run nor
    leaves its CPU time and its workers' out of this process's children's (``RUSAGE_CHILDREN``).
    ``multiprocessing.forkserver``'s own ``_stop`` (CPython 3.8+); a Python without it keeps the server,
    which ends with this process."""
    if ctx.get_start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    stop = getattr(getattr(forkserver, "_forkserver", None), "_stop", None)
    if stop is not None:
        with contextlib.suppress(Exception):
            stop()


def prepare_workers(tuner: Any, num_workers: int, trials_per_worker: int | None) -> None:
    """What the parent of ``num_workers`` workers does once on ``tuner``'s study (an
    :class:`~autotune.tune.tuner.Tuner` for the same target and storage), before :func:`run_workers`:

    * opens the study (``Tuner.study``: checked, created), so the workers only load it (``study_checked``);
    * with the layout sampler, ranks the layouts once and stores the ranking in the study
      (:meth:`~autotune.search.LayoutSampler.rank_for_workers`): the workers read it;
    * when the workers will be forked from this process (:func:`_context`) and the backend is ``simulated``,
      evaluates the plans of the layouts the first trials take (the first
      :attr:`~autotune.search.LayoutSampler.num_initial` of the ranking, at most ``num_workers x
      trials_per_worker``; every run, with one worker or many, evaluates them first) with ``tuner``'s
      evaluator: the simulator's step structures of those plans (``autotune.cost.graph.step_structure``,
      ``autotune.cost.simulator.compile_structure``, module-level caches) are then inherited by every worker
      instead of being built by each worker that evaluates a plan of the same structure. Measured (issue 26,
      70B x 64 H100, 4 workers x 25 trials, 100 trials in all): 119 structure builds in the workers without
      this, 73 with it, for 63 distinct structures.
    """
    import itertools

    tuner.study  # noqa: B018 - created once here, before the workers race for it
    if tuner.sampler_name != "layout":
        return
    sampler = tuner._sampler()
    ranking = sampler.rank_for_workers(tuner.study, num_workers, trials_per_worker)
    if tuner.backend == "simulated" and _context().get_start_method() == "fork":
        n = sampler.num_initial if trials_per_worker is None else num_workers * trials_per_worker
        from autotune.errors import PlanError

        for plan in itertools.islice(ranking, min(sampler.num_initial, n)):
            with contextlib.suppress(PlanError):     # a worker's trial of it records why (pruned)
                tuner.evaluate(plan)


def run_workers(tuner_kwargs: Mapping[str, Any], num_workers: int, *, n_trials: int | None,
                timeout: float | None = None, first_worker_id: int = 0,
                heartbeat_interval_s: int | None = None, stop_when_converged: bool = False,
                study_checked: bool = False) -> list[WorkerOutcome]:
    """Start ``num_workers`` worker processes on one study, wait for all, return their outcomes by id.

    Args:
        tuner_kwargs: keyword arguments of :class:`~autotune.tune.tuner.Tuner` (picklable: specs, names, URLs;
            no ``evaluator`` object).
        num_workers: processes (>= 1); n_trials: trials per worker; timeout: s per worker.
        first_worker_id: ids are ``first_worker_id .. first_worker_id + num_workers - 1`` (seeds differ).
        stop_when_converged: each worker ends early on the layout sampler's convergence stop
            (:meth:`~autotune.tune.tuner.Tuner.optimize`).
        study_checked: the caller has opened the study in this process just now (``Tuner.study``: the
            read-only check of an existing study, then created or loaded), so the workers skip that check
            (:meth:`~autotune.tune.tuner.Tuner.check_existing_study` reads every trial; 0.018-0.025 s CPU per
            worker, 4 workers x 15 trials of 8B x 8 H200, process time around it) and only load the study.

    On KeyboardInterrupt (SIGINT or SIGTERM, to the process group or to this process alone) the signal is
    forwarded to the children at once (a worker marks its in-flight trial FAIL on SIGINT or SIGTERM,
    :meth:`~autotune.tune.tuner.Tuner.optimize`), they are given 30 s in all to end, then sent SIGTERM and 30 s
    more, then killed; the interrupt is re-raised.

    Raises:
        ConfigError: ``num_workers`` < 1.
    """
    if num_workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {num_workers}")
    import signal

    from autotune.signals import interrupted

    ctx = _context()
    if ctx.get_start_method() == "fork":
        import sys

        from autotune.study.storage import close_connections

        close_connections()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        # this process's objects are frozen (gc.freeze, Python docs: "call gc.freeze() right before fork()"), so
        # the workers' collections never walk them, garbage among them included (issue 26: ~1.5 s more CPU in 4
        # workers of 70B when the parent held a finished run's objects); this process collects its garbage once
        # the workers are done (gc.unfreeze below). A gc.collect() here first cost 0.065-0.086 s CPU a run
        # (8B x 8 H200, 70B x 64 H100: process time around it in bench_search_workers' parent)
        import gc

        gc.freeze()
    out: mp.Queue = ctx.Queue()
    opt = {"n_trials": n_trials, "timeout": timeout, "heartbeat_interval_s": heartbeat_interval_s,
           "stop_when_converged": stop_when_converged}
    procs = {first_worker_id + i: ctx.Process(target=_worker_main, args=(dict(tuner_kwargs), opt,
                                                                          first_worker_id + i, out, study_checked))
             for i in range(num_workers)}
    sigs = [getattr(signal, n) for n in _SIGNALS]
    results: dict[int, WorkerOutcome] = {}
    try:
        return _run(procs, out, sigs, results, interrupted)
    finally:
        _stop_forkserver(ctx)
        if ctx.get_start_method() == "fork":
            import gc

            gc.unfreeze()


def _died(exitcode: int) -> str:
    """The error line of a worker process that ended with ``exitcode`` before sending its outcome."""
    if exitcode == NO_THREAD_EXIT:
        return ("the system refused to start a thread in the worker process to send its result (the process or "
                "thread limit, ulimit -u); its trials are in the study: give fewer --workers")
    return f"worker process died (exit code {exitcode})"


def _stop_started(procs: dict[int, Any]) -> None:
    """Stop the worker processes of ``procs`` that were started (SIGTERM, then SIGKILL after 10 s)."""
    for p in procs.values():
        if p.pid is not None and p.is_alive():
            with contextlib.suppress(OSError):
                p.terminate()
    for p in procs.values():
        if p.pid is not None:
            p.join(timeout=10)
            if p.is_alive():
                with contextlib.suppress(OSError):
                    p.kill()
                p.join(timeout=10)


def _run(procs: dict[int, Any], out: Any, sigs: list[Any], results: dict[int, WorkerOutcome],
         interrupted: Any) -> list[WorkerOutcome]:
    """Start ``procs``, collect their outcomes (see :func:`run_workers`)."""
    import signal
    import time

    try:
        # the workers start with SIGINT and SIGTERM blocked (see _SIGNALS); here they are blocked only while
        # the processes are started, and one that arrives meanwhile is handled as the mask is restored
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
        try:
            for k, p in enumerate(procs.values()):
                try:
                    p.start()
                except (OSError, RuntimeError) as e:     # EAGAIN: the process or thread limit (ulimit -u)
                    _stop_started(procs)
                    err = ConfigError(f"--workers {len(procs)}: the system refused to start worker process {k + 1} "
                                      f"({type(e).__name__}: {excerpt(e.strerror if isinstance(e, OSError) and e.strerror else e)}; "
                                      "the process or thread limit, ulimit -u, or memory); the workers already "
                                      "started were stopped: give fewer --workers")
                    err.quotes_input = False        # autotune's words and the OS's: nothing from a file
                    raise err from None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        while len(results) < len(procs):
            if interrupted():       # noted where it could not be raised (see tuner.safe_to_raise)
                raise KeyboardInterrupt
            try:
                r = out.get(timeout=1.0)
                results[r.worker_id] = r
            except queue_mod.Empty:
                for wid, p in procs.items():
                    if wid not in results and not p.is_alive() and p.exitcode not in (None, 0):
                        results[wid] = WorkerOutcome(wid, error=_died(p.exitcode), exitcode=p.exitcode)
        for p in procs.values():
            p.join()
    except KeyboardInterrupt:
        # a signal sent to this process alone (kill PID, a batch system stopping the job step) must stop the
        # workers too: forward it at once (after a Ctrl-C to the process group they have it already and a
        # second one is only noted); each ends at its next trial boundary or inside its objective
        sig = interrupted() or signal.SIGINT
        for p in procs.values():
            if p.pid is not None and p.is_alive():
                with contextlib.suppress(OSError):
                    os.kill(p.pid, sig)
        deadline = time.monotonic() + 30
        for p in procs.values():
            if p.pid is None:
                continue
            p.join(timeout=max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
        raise
    return [WorkerOutcome(r.worker_id, r.n_new_trials, r.own_states, r.error, procs[r.worker_id].exitcode,
                          r.stop_reason)
            for r in sorted(results.values(), key=lambda r: r.worker_id)]


__all__ = ["WorkerOutcome", "prepare_workers", "run_workers"]
