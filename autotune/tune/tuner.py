"""The tuning loop: one Optuna study per model, cluster, engine and workload, maximizing MFU.

The study's name and identity are :mod:`autotune.study.identity`'s (``<model>/<gpu>x<count>/<fabric>/<engine>/
<workload>``, user_attrs that re-open it from the storage alone); what a trial records is
:mod:`autotune.study.trials`'; the sampler comes from :mod:`autotune.search`. Per trial
(:meth:`Tuner.objective`): the plan is sampled from the :class:`~autotune.search.space.BoundSearchSpace`
(an invalid combination is pruned with ``user_attrs['pruned_reason']``); the evaluator (``simulated`` |
``measured`` | ``real``, :func:`~autotune.cost.evaluator.make_evaluator`) returns a
:class:`~autotune.cost.evaluator.StepResult`, recorded by :func:`~autotune.study.trials.record_result` (a plan
that does not fit is COMPLETE with value 0 and a positive memory constraint, so it is never the best); an
unexpected exception marks the trial FAIL with ``user_attrs['fail_reason']`` and the study goes on.

The best plan is :func:`~autotune.study.trials.best_plan`'s; with none, :meth:`Tuner.optimize` raises
:class:`~autotune.errors.NoFeasiblePlanError` (the most common reason); the study stays saved.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.cost.evaluator import BACKENDS, Evaluator, StepResult, make_evaluator
from autotune.errors import ConfigError, PlanError, StorageError
from autotune.files import plain
from autotune.logs import MfuProgressBar, quiet
from autotune.search.seeding import worker_seed
from autotune.search.space import BoundSearchSpace, Pruned, SearchSpace
from autotune.signals import IN_OBJECTIVE, interrupted, trial_interrupt_handler
from autotune.study.identity import StudyInfo, check_identity, check_own_trials, study_name
from autotune.study.storage_check import existing_readonly, user_url
from autotune.study.storage import (DEFAULT_BACKEND, DEFAULT_STORAGE, check_heartbeat, lost_enqueued_race, open_storage,
                                    retry_races, storage_kind)
from autotune.study.faults import StorageFault, classify, stop_reason, storage_fault, storage_guarded, with_retries
from autotune.study.stale import (STALE_AFTER_S, StampedSampler, fail_own_running, fail_trials, reap_stale, trials_created_here,
                                  wait_for_others)
from autotune.study.trials import BestPlan, ParamBuffer, is_feasible, outcome_counts, record_result, require_best_plan
from autotune.spec.engines import resolve_engine
from autotune.spec.hardware import ClusterSpec, fabric_fingerprint
from autotune.spec.models import ModelSpec
from autotune.spec.plan import Plan, Workload

log = logging.getLogger(__name__)

METRIC_NAMES = ["MFU (causal)"]
SAMPLERS = ("layout", "tpe")

# ------------------------------------------------------------------ the tuner
@dataclass(frozen=True)
class TuneSummary:
    """What one :meth:`Tuner.optimize` call did.

    Attributes:
        study: study name; storage: its URL.
        n_new_trials: trials run by this call; n_trials: trials in the study now.
        states: count per outcome over the whole study: feasible, infeasible, pruned, failed.
        best: the best plan of the whole study.
        own_states: the same counts over this call's trials only; worker_id: this worker's index.
        stop_reason: why the call ended before ``n_trials`` (the layout sampler's convergence stop), or None.
    """

    study: str
    storage: str
    n_new_trials: int
    n_trials: int
    states: Mapping[str, int]
    best: BestPlan
    own_states: Mapping[str, int] = field(default_factory=dict)
    worker_id: int = 0
    stop_reason: str | None = None


class Tuner:
    """Tunes one model on one cluster for one workload in one Optuna study (module docstring).

    Args (keyword-only):
        model, cluster, workload: what to tune for.
        space: a :class:`SearchSpace`, a space name or YAML path; default ``default``.
        storage: SQLAlchemy URL of the study storage.
        backend: ``simulated`` (default), ``measured`` or ``real``.
        seed: sampler seed (same seed and same study history -> the same trials).
        evaluator: an evaluator to use instead of building one for ``backend``.
        evaluator_options: extra keyword arguments for the backend's evaluator.
        engine: the engine that runs the plans (:mod:`autotune.spec.engines`); None = ``native`` for the
            real backend, else :data:`autotune.spec.engines.DEFAULT_ENGINE`.
        sampler: ``layout`` (default, :class:`autotune.search.LayoutSampler`) or ``tpe``.

    Raises:
        ConfigError: bad space or engine (the real backend runs only ``native``); StorageError: storage unreachable; AutotuneError: backend unavailable
            (when the first plan is evaluated).
    """

    def __init__(self, *, model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                 space: SearchSpace | str | None = None, storage: str = DEFAULT_STORAGE,
                 backend: str = DEFAULT_BACKEND, seed: int | None = 0, evaluator: Evaluator | None = None,
                 evaluator_options: Mapping[str, Any] | None = None, engine: str | None = None,
                 sampler: str = "layout") -> None:
        if sampler not in SAMPLERS:
            raise ConfigError(f"unknown sampler {sampler!r}; known samplers: {', '.join(SAMPLERS)}")
        self.sampler_name = sampler
        self.model, self.cluster, self.workload = model, cluster, workload
        # an evaluator given without an engine name brings its own
        given = getattr(evaluator, "engine", None) if engine is None else None
        self.engine = given if given is not None else resolve_engine(engine, backend)
        self.space = space if isinstance(space, SearchSpace) else SearchSpace.load(space)
        self.bound: BoundSearchSpace = self.space.bind(model=model, num_gpus=cluster.num_gpus, workload=workload,
                                                       gpu=cluster.gpu, engine=self.engine)
        self.storage = storage
        if backend not in BACKENDS:
            raise ConfigError(f"unknown backend {backend!r}; known backends: {', '.join(BACKENDS)}")
        self.backend = backend
        self.seed = seed
        self._evaluator = evaluator
        self._evaluator_options = dict(evaluator_options or {})
        self._cache: dict[Plan, StepResult] = {}
        self.name = study_name(model, cluster, workload, space_name=self.space.name, backend=backend,
                               engine=self.engine.name)
        self._study: optuna.Study | None = None
        self.study_checked = False      # True: check_existing_study was done (a worker's parent did it)
        self._started: set[int] = set()     # this tuner's trial ids (objective)
        self._pending: list[tuple[dict[str, Any], dict[str, Any]]] = []

    @property
    def info(self) -> StudyInfo:
        return StudyInfo(name=self.name, model=self.model, gpu=self.cluster.gpu.name, num_gpus=self.cluster.num_gpus,
                         fabric=self.cluster.fabric.to_dict(), workload=self.workload, space=self.space.name,
                         backend=self.backend, engine=self.engine.name)

    def _study_attrs(self) -> dict[str, Any]:
        return {"model": self.model.to_dict(), "gpu": self.cluster.gpu.name,
                "num_gpus": self.cluster.num_gpus, "fabric": plain(self.cluster.fabric.to_dict()),
                "workload": {"seq_len": self.workload.seq_len, "global_batch_size": self.workload.global_batch_size,
                             "dtype": self.workload.dtype},
                "fabric_fingerprint": fabric_fingerprint(self.cluster.fabric), "space": self.space.name,
                "space_fingerprint": self.space.fingerprint, "backend": self.backend, "engine": self.engine.name,
                "excluded_values": self.bound.excluded, "autotune_schema": 1}   # last: then the others are there

    @property
    def study(self) -> optuna.Study:
        """The Optuna study (created, or resumed if it exists)."""
        if self._study is None:
            if not self.study_checked:      # read-only first: a foreign study is refused untouched
                self.check_existing_study()
            st = open_storage(self.storage)
            with quiet():
                sampler = self._sampler()
                def create() -> optuna.Study:   # loaded where a worker's parent opened it (study_checked)
                    with contextlib.suppress(optuna.exceptions.DuplicatedStudyError):  # another worker made it
                        if not self.study_checked:
                            return optuna.create_study(study_name=self.name, storage=st, direction="maximize",
                                                       sampler=sampler, load_if_exists=True)
                    return optuna.load_study(study_name=self.name, storage=st, sampler=sampler)
                try:
                    study = retry_races(create, f"create study {self.name}")
                except Exception as e:
                    if interrupted():       # the interrupt landed inside SQLite (see _INTERRUPT)
                        raise KeyboardInterrupt from None
                    raise storage_fault(e, self.storage) or StorageError(
                        f"cannot open study {self.name!r} in {user_url(self.storage)}: {e}") from None
                # trials, then attrs: a worker writes the attrs (schema last) before its first trial (race, CI)
                trials = study.get_trials(deepcopy=False)
                attrs = study.user_attrs
                self._check_identity(attrs, lambda: len(trials))
                if study.metric_names is None:
                    study.set_metric_names(METRIC_NAMES)
                if "autotune_schema" not in attrs:
                    # several workers may do this at once: the same values, retried on a key race
                    for k, v in self._study_attrs().items():
                        retry_races(lambda k=k, v=v: study.set_user_attr(k, v), f"study {self.name} attrs")
                elif "fabric_fingerprint" not in attrs:
                    # a study written before fabrics were fingerprinted: accepted, and its fabric recorded now
                    fp = fabric_fingerprint(self.cluster.fabric)
                    retry_races(lambda: study.set_user_attr("fabric_fingerprint", fp), f"study {self.name} attrs")
            self._study = study
        return self._study

    def _check_identity(self, attrs: Mapping[str, Any], n_trials: Callable[[], int] | None = None) -> None:
        """:func:`check_identity` for this tuner's study, space and fabric.

        Raises:
            ConfigError: a fingerprint differs, or the study has trials but was not made by autotune.
        """
        check_identity(attrs, name=self.name, storage=self.storage, space=self.space, fabric=self.cluster.fabric,
                       n_trials=n_trials)

    def check_existing_study(self) -> None:
        """If this tuner's study already exists in the storage, check it is the same target
        (:meth:`_check_identity`); creates and writes nothing.

        Raises:
            ConfigError: a fingerprint differs; StorageError: the storage cannot be opened.
        """
        st = open_storage(existing_readonly(self.storage))
        with quiet():
            try:
                study_id = st.get_study_id_from_name(self.name)
            except KeyError:
                return
            trials = st.get_all_trials(study_id, deepcopy=False)
            self._check_identity(st.get_study_user_attrs(study_id), lambda: len(trials))
            check_own_trials(trials, name=self.name, storage=self.storage)

    def _sampler(self) -> optuna.samplers.BaseSampler:
        """The study's sampler (``self.sampler_name``):

        * ``layout`` (default): :class:`autotune.search.LayoutSampler`, seeded; it screens plans with the
          evaluator's op costs when it has them (``costs``), else the shipped calibration;
        * ``tpe``: seeded multivariate TPE with group decomposition (conditional knobs form groups).
        """
        with quiet():
            if self.sampler_name == "tpe":
                return optuna.samplers.TPESampler(seed=self.seed, multivariate=True, group=True)
            from autotune.search import make_sampler
            from autotune.study.trials import rank_basis

            costs = getattr(self._evaluator, "costs", None) if self._evaluator is not None else None
            return make_sampler(self.bound, model=self.model, cluster=self.cluster, workload=self.workload,
                                engine=self.engine, costs=costs, seed=self.seed, rank_basis=rank_basis(self.info),
                                layers=self._evaluator_options.get("layers") if self.backend == "real" else None)

    @property
    def evaluator(self) -> Evaluator:
        if self._evaluator is None:
            self._evaluator = make_evaluator(self.backend, model=self.model, cluster=self.cluster,
                                             workload=self.workload, engine=self.engine.name, **self._evaluator_options)
        return self._evaluator

    def close(self) -> None:
        if self._evaluator is not None:
            self._evaluator.close()

    # ---- evaluation
    def evaluate(self, plan: Plan) -> StepResult:
        """Evaluate ``plan`` on this tuner's cluster (cached per plan within this tuner).

        Raises:
            PlanError: invalid plan.
        """
        if plan not in self._cache:
            with quiet():
                self._cache[plan] = self.evaluator.evaluate(plan)
        return self._cache[plan]

    def objective(self, trial: optuna.Trial) -> float:
        """Sample, evaluate and record one plan; returns its MFU (0 when it does not fit).

        Inside :meth:`optimize` a SIGINT / SIGTERM raises KeyboardInterrupt only here
        (:func:`trial_interrupt_handler`): the trial is recorded FAIL with ``fail_reason`` "interrupted
        (signal N)"; one noted before the objective starts (or during a storage write) raises at its next check.
        """
        self._started.add(trial._trial_id)
        IN_OBJECTIVE["on"] = True
        try:
            if interrupted():
                raise KeyboardInterrupt
            return self._objective(trial)
        except KeyboardInterrupt:
            IN_OBJECTIVE.clear()
            with contextlib.suppress(Exception):
                trial.set_user_attr("fail_reason", f"interrupted (signal {interrupted() or int(signal.SIGINT)})")
            raise
        finally:
            IN_OBJECTIVE.clear()

    def _objective(self, trial: optuna.Trial) -> float:
        with ParamBuffer(trial) as written:     # the sampled parameters and the plan: one storage write
            try:
                plan = self.bound.suggest(trial)
            except Pruned as e:
                written.flush({"pruned_reason": e.reason})
                raise optuna.TrialPruned(e.reason) from None
            written.flush({"plan": plain(plan.to_dict())})
        if interrupted():       # noted while the storage write above ran (not raised into SQLAlchemy)
            raise KeyboardInterrupt
        if plan in self._cache:             # the sampler proposed a plan already evaluated in this run
            trial.set_user_attr("reused_result", True)
        try:
            result = self.evaluate(plan)
        except PlanError as e:
            trial.set_user_attr("pruned_reason", str(e))
            raise optuna.TrialPruned(str(e)) from None
        except Exception as e:
            trial.set_user_attr("fail_reason", f"{type(e).__name__}: {e}")
            raise
        return record_result(trial, result, capacity_bytes=self.cluster.gpu.usable_hbm_bytes)

    def enqueue(self, trials: Sequence[FrozenTrial], *, source: str) -> int:
        """Queue other trials' params as warm starts for the next :meth:`optimize` (run first, in order).

        Param sets already in the study are skipped when they run (``skip_if_exists``). Returns how many
        were queued.
        """
        self._pending.extend((dict(t.params), {"warm_start_from": f"{source}#{t.number}"}) for t in trials)
        return len(trials)

    def optimize(self, n_trials: int | None = 200, *, timeout: float | None = None,
                 show_progress_bar: bool | None = None, worker_id: int | None = None,
                 heartbeat_interval_s: int | None = None, stop_when_converged: bool = False) -> TuneSummary:
        """Run ``n_trials`` more trials in this process (or until ``timeout`` seconds) and return the study's
        best plan.

        Any number of workers (processes, here or on other hosts) may run this on the same storage at once:
        each samples straight against the shared storage (Optuna's ``_CachedStorage`` over the RDB, re-read
        before every suggestion), so it sees every other worker's finished and running trials. Each trial's
        sampler RNG is seeded from (``seed``, ``worker_id``, trial number) (:func:`trial_seed`): trial numbers
        are unique in a study, so concurrent workers never draw the same random stream, and one worker with
        the same seed on the same history proposes the same trials.

        Args:
            worker_id: this worker's index (``--worker-id``; ``--workers N`` gives 0..N-1); None = 0.
            heartbeat_interval_s: real backend: Optuna heartbeat interval (s) for this process's trials
                (RDB storages); None = :data:`REAL_HEARTBEAT_INTERVAL_S` for ``real``, off otherwise.
            stop_when_converged: layout sampler: end early once :meth:`ConvergenceStop.convergence`
                (search/convergence.py) says the search has converged (``TuneSummary.stop_reason`` says why;
                ``autotune run`` sets it); ``n_trials`` stays the bound.

        Returns:
            :class:`TuneSummary`: ``n_new_trials`` and ``own_states`` count this call's trials only;
            ``n_trials`` and ``states`` the whole study.

        Raises:
            NoFeasiblePlanError: the study has no feasible plan ("N/N trials failed: <reason>").
            StorageError, ConfigError, AutotuneError: storage, space or backend problems.
        """
        if n_trials is not None and n_trials < 1:
            raise ConfigError(f"--trials must be >= 1, got {n_trials}")
        if n_trials is None and timeout is None:
            raise ConfigError("give a number of trials or a timeout")
        if worker_id is not None and worker_id < 0:
            raise ConfigError(f"--worker-id must be >= 0, got {worker_id}")
        # every option and the backend first: a run that cannot evaluate anything (no GPU for --backend
        # real) or was given a bad option must not leave an empty study behind
        check_heartbeat(heartbeat_interval_s, self.storage, self.backend)
        self.evaluator  # noqa: B018 - fail fast on an unavailable backend, before any trial
        self.study  # noqa: B018 - created (or checked) before the workers' storage is opened
        if heartbeat_interval_s is None and self.backend == "real" and storage_kind(self.storage) != "journal":
            heartbeat_interval_s = REAL_HEARTBEAT_INTERVAL_S
        show_progress_bar = sys.stdout.isatty() if show_progress_bar is None else show_progress_bar
        self._worker_seed = worker_seed(self.seed, worker_id)
        self._layout_sampler = None     # built by the sampler below (_seeded_sampler)
        self.stop_reason: str | None = None
        # host + pid stamped in every trial (study/stale.py); no random redraws under the layout sampler
        sampler = StampedSampler(self._seeded_sampler, self._worker_seed, redraw=self.sampler_name != "layout")
        with quiet():
            st = open_storage(self.storage, heartbeat_interval_s=heartbeat_interval_s)
            worker_study = optuna.load_study(study_name=self.name, storage=st, sampler=sampler)
            sampler.share_reads(worker_study)   # one read of the trials per trial where ask made two
            reap_stale(worker_study, stale_after_s=self._stale_after_s(), url=self.storage)  # dead workers': FAIL
            for params, attrs in self._pending:
                worker_study.enqueue_trial(params, user_attrs=attrs, skip_if_exists=True)
            self._pending.clear()

            # With the real backend a trial costs minutes of GPU time while an invalid combination is
            # pruned before anything runs, so there --trials counts the plans that were run (at most
            # REAL_MAX_ATTEMPTS_FACTOR x trials attempts in all); a plan proposed again reuses its result
            # and does not count either.
            count_run = self.backend == "real" and n_trials is not None
            ran = [0]
            mine: list[FrozenTrial] = []

            def count(st_: optuna.Study, ft: FrozenTrial) -> None:
                mine.append(ft)
                if interrupted():           # a signal swallowed inside a trial's storage write
                    raise KeyboardInterrupt
                if count_run and ft.state != TrialState.PRUNED and not ft.user_attrs.get("reused_result"):
                    ran[0] += 1
                    if ran[0] >= n_trials:
                        st_.stop()
                ls = self._layout_sampler
                if stop_when_converged and ls is not None and (why := ls.convergence(st_)) is not None:
                    self.stop_reason = why
                    st_.stop()

            import threading
            handlers = {}
            if threading.current_thread() is threading.main_thread():
                # SIGINT (Ctrl-C) and SIGTERM (kill, scancel, run_workers stopping a worker) end the run at a
                # trial boundary or inside the objective, never inside Optuna's ask/tell (a trial created
                # there would stay RUNNING forever); an ignored signal stays ignored
                for sig in (signal.SIGINT, signal.SIGTERM):
                    if signal.getsignal(sig) is not signal.SIG_IGN:
                        handlers[sig] = signal.signal(sig, trial_interrupt_handler)
            import time as _time

            budget = n_trials * REAL_MAX_ATTEMPTS_FACTOR if count_run else n_trials
            started = _time.monotonic()
            bar = MfuProgressBar(n_trials) if show_progress_bar else None   # names MFU in %
            faults: list[float] = []      # when transient storage errors happened (retried, see below)
            try:
                if (ls := self._layout_sampler) is not None:    # rank (or read the ranking) before any trial
                    ls.rank(worker_study)  # a signal meanwhile: KeyboardInterrupt, no trial
                    self.stop_reason = ls.converged_already(worker_study) if stop_when_converged else None
                while self.stop_reason is None:
                    left = None if budget is None else budget - len(mine)
                    time_left = None if timeout is None else timeout - (_time.monotonic() - started)
                    if (left is not None and left <= 0) or (time_left is not None and time_left <= 0) \
                            or (count_run and ran[0] >= n_trials):
                        break
                    try:
                        # a permanent storage fault inside a trial ends the run with the trial RUNNING, not
                        # told FAIL without its reason (faults.StorageFault); it is failed just below
                        worker_study.optimize(storage_guarded(self.objective, self.storage), n_trials=left,
                                              timeout=time_left, catch=(Exception,),
                                              callbacks=[count] + ([bar] if bar else []))
                        break
                    except Exception as e:
                        if classify(e) is not None and not interrupted():
                            # a lost connection or a lock wait (server restart): this worker's trial in
                            # flight is failed with the cause, and tuning goes on after a back-off, for a
                            # bounded time; a permanent fault (disk full, read-only) is one clean line
                            err = storage_fault(e, self.storage)
                            if classify(e) != "transient" or (faults and _time.monotonic() - faults[0] > 120):
                                raise err from None
                            faults.append(_time.monotonic())
                            _time.sleep(min(5.0, 0.2 * 2 ** len(faults)))
                            fail_own_running(worker_study, f"storage error, retried: {str(err)[:300]}")
                            continue
                        if not isinstance(e, (ValueError, optuna.exceptions.UpdateFinishedTrialError)) \
                                or not lost_enqueued_race(e):
                            raise
                        # another worker finished the same enqueued trial first: on SQLite two workers can
                        # both pop one WAITING trial (Optuna's pop relies on SELECT ... FOR UPDATE, which
                        # SQLite ignores), and telling it again fails. That trial is recorded once, by
                        # the other worker; this one goes on with its remaining trials.
                        continue
            except BaseException as e:
                self._fail_running(worker_study, stop_reason(e, interrupted()))     # or noted for the next run
                if isinstance(e, StorageFault):
                    raise e.error from None
                raise
            finally:
                IN_OBJECTIVE.clear()
                if bar:
                    bar.close()
                for sig, h in handlers.items():
                    signal.signal(sig, h)
            if interrupted():
                self._fail_running(worker_study, "interrupted")
                raise KeyboardInterrupt
        trials = self._wait_for_others(worker_study)     # its storage has the heartbeat, if any
        # read through worker_study, whose storage cache holds the finished trials already (self.study's, a
        # second _CachedStorage, would read all of them again: ~0.3 s CPU per worker for 100 trials of 70B)
        best = require_best_plan(worker_study, self.info, self.storage)
        return TuneSummary(study=self.name, storage=self.storage, n_new_trials=len(mine),
                           n_trials=len(trials), states=outcome_counts(trials), best=best,
                           own_states=outcome_counts(mine), worker_id=worker_id or 0,
                           stop_reason=self.stop_reason)

    def _fail_running(self, study: optuna.Study, why: str) -> None:
        """Mark FAIL (``user_attrs['fail_reason']``) the still RUNNING trials this process created (its objective's,
        and any a signal stopped inside Optuna's trial creation: ``trials_created_here``), not other workers'. A
        reason the storage refuses (a full disk) is noted for the next run (:func:`~autotune.study.stale.note_unwritten`)."""
        sig = interrupted()
        reason = f"{why} (signal {sig})" if sig else why
        fail_trials(study._storage, {i: reason for i in self._started | trials_created_here()}, url=self.storage)

    def _stale_after_s(self) -> float:
        """A RUNNING trial older than this (s) is a dead worker's: :data:`STALE_AFTER_S`, for the real backend at
        least 3 x its trial timeout."""
        return max(STALE_AFTER_S, 3 * float(self._evaluator_options.get("timeout_s") or 0))

    def _wait_for_others(self, study: optuna.Study, poll_s: float = 0.5) -> list[FrozenTrial]:
        """The study's trials once it has a feasible one or no live worker's trial is running
        (:func:`autotune.study.stale.wait_for_others`: dead workers' trials are failed, not waited for)."""
        return with_retries(lambda: wait_for_others(study, is_done=lambda ts: any(is_feasible(t) for t in ts),
                                                    interrupted=interrupted, stale_after_s=self._stale_after_s(),
                                                    poll_s=poll_s), self.storage, what="reading the study")

    def _seeded_sampler(self, seed: int | None) -> optuna.samplers.BaseSampler:
        """:meth:`_sampler` built with ``seed`` instead of ``self.seed``.

        The layout sampler keeps what it computed once per study (the ranked layouts, screened plans,
        neighbours), so it is built once per :meth:`optimize` call, seeded per worker; only its random
        fallback takes the per-trial seed; its ranking uses the study's seed in every worker.
        """
        if self.sampler_name == "layout":
            inst = getattr(self, "_layout_sampler", None)
            if inst is None:
                inst = self._layout_sampler = self._sampler()
            inst._random = optuna.samplers.RandomSampler(seed=seed)
            return inst
        saved = self.seed
        self.seed = seed
        try:
            return self._sampler()
        finally:
            self.seed = saved


REAL_MAX_ATTEMPTS_FACTOR = 20

#: Heartbeat of real trials (s): a worker killed during a trial is noticed 2 x this later (Optuna's default
#: grace period) by another worker, which fails the trial and runs its parameters once more.
REAL_HEARTBEAT_INTERVAL_S = 30
