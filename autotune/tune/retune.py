"""Re-tuning for a slower fabric, warm-started from the fastest fabric's study (``autotune retune``).

Moved from ``tune/tuner.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import optuna

from autotune.cost.evaluator import StepResult
from autotune.errors import ConfigError, redact
from autotune.logs import quiet
from autotune.search.space import SearchSpace
from autotune.study.identity import StudyInfo, list_studies, load_study
from autotune.study.storage import DEFAULT_BACKEND, DEFAULT_STORAGE, check_heartbeat
from autotune.study.trials import (
    BestPlan,
    rank_basis,
    best_trial,
    outcome_counts,
    require_best_plan,
    top_feasible_trials,
)
from autotune.spec.hardware import ClusterSpec, fabric_speed, make_cluster
from autotune.spec.models import ModelSpec
from autotune.spec.plan import Workload
from autotune.tune.tuner import Tuner, TuneSummary


@dataclass(frozen=True)
class RetuneResult:
    """Outcome of :func:`retune`.

    Attributes:
        fast: the fast fabric's best plan (on the fast fabric).
        slow: the slow fabric's best plan after the warm-started search.
        fast_on_slow: the fast plan evaluated on the slow fabric.
        n_enqueued: warm-start plans enqueued; tuned_fast_first: the fast study had to be tuned first.
        summary: the slow study's :class:`TuneSummary`.
    """

    fast: BestPlan
    slow: BestPlan
    fast_on_slow: StepResult
    n_enqueued: int
    tuned_fast_first: bool
    summary: TuneSummary


def find_fastest_study(storage: str, target: StudyInfo) -> tuple[optuna.Study, StudyInfo] | None:
    """The study in ``storage`` for the same model, GPUs, workload, space and backend on the fastest
    other fabric (highest inter-node, then intra-node bandwidth) that has a feasible plan, or None."""
    cands = [i for i in list_studies(storage) if i.same_target(target) and i.fabric_name != target.fabric_name]
    cands.sort(key=lambda i: fabric_speed(i.fabric), reverse=True)
    for info in cands:
        study, info = load_study(info.name, storage)
        if best_trial(study) is not None:
            return study, info
    return None


def retune(*, model: ModelSpec, cluster: ClusterSpec, workload: Workload, space: SearchSpace | str | None = None,
           storage: str = DEFAULT_STORAGE, backend: str = DEFAULT_BACKEND, seed: int | None = 0,
           n_trials: int = 200, timeout: float | None = None, top_k: int = 5,
           show_progress_bar: bool | None = None, evaluator_options: Mapping[str, Any] | None = None,
           log_fn: Callable[[str], None] | None = None, engine: str | None = None, workers: int = 1,
           worker_id: int = 0, heartbeat_interval_s: int | None = None) -> RetuneResult:
    """Re-tune for the (slower) fabric of ``cluster``, warm-started from the fastest fabric's study.

    Steps: find the same target's study on the fastest other fabric in ``storage`` (if none, tune the
    GPU's default fabric first with ``n_trials``); enqueue its ``top_k`` feasible plans into the slow
    study; evaluate its best plan on the slow fabric; run ``n_trials`` trials on the slow study.
    Because the fast best plan is among the enqueued trials, the slow study's best MFU is at least the
    fast plan's MFU on the slow fabric.

    ``workers`` > 1: the slow study is tuned by that many local worker processes
    (:func:`autotune.tune.workers.run_workers`, ``n_trials`` each, ids from ``worker_id``), the warm starts
    enqueued in the storage before they start; the fast study (if it must be tuned first) by this process.

    Raises:
        ConfigError: no faster study and the requested fabric is the default one; ``workers`` < 1.
        NoFeasiblePlanError: a study ends with no feasible plan.
    """
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    check_heartbeat(heartbeat_interval_s, storage, backend)
    say = log_fn or (lambda s: None)
    space_obj = space if isinstance(space, SearchSpace) else SearchSpace.load(space)
    slow = Tuner(model=model, cluster=cluster, workload=workload, space=space_obj, storage=storage,
                 backend=backend, seed=seed, evaluator_options=evaluator_options, engine=engine)
    # the slow study, if it exists, must be this target (fabric links, space) before anything is tuned
    slow.check_existing_study()
    found = find_fastest_study(storage, slow.info)
    tuned_fast_first = False
    if found is None:
        fast_cluster = make_cluster(cluster.gpu.name, cluster.num_gpus, None)
        if fast_cluster.fabric.name == cluster.fabric.name:
            raise ConfigError(f"retune needs a study on a faster fabric than {cluster.fabric.name} for the same "
                              f"model, GPUs and workload in {redact(storage)}; run `autotune run --interconnect <fabric>` "
                              "first")
        say(f"no study on another fabric in {redact(storage)}; tuning {fast_cluster.fabric.name} first")
        fast_tuner = Tuner(model=model, cluster=fast_cluster, workload=workload, space=space_obj, storage=storage,
                           backend=backend, seed=seed, evaluator_options=evaluator_options, engine=engine)
        fast_tuner.optimize(n_trials, timeout=timeout, show_progress_bar=show_progress_bar, worker_id=worker_id,
                            heartbeat_interval_s=heartbeat_interval_s)
        fast_tuner.close()
        tuned_fast_first = True
        found = find_fastest_study(storage, slow.info)
        assert found is not None
    fast_study, fast_info = found
    if fabric_speed(fast_info.fabric) <= fabric_speed(cluster.fabric):
        say(f"note: {fast_info.fabric_name} is not faster than {cluster.fabric.name}; warm-starting from it anyway")
    fast_best = require_best_plan(fast_study, fast_info, storage)
    top = top_feasible_trials(fast_study, top_k, rank_basis(fast_info))
    n_enq = slow.enqueue(top, source=fast_study.study_name)
    say(f"warm start: {n_enq} best plan(s) of {fast_study.study_name} enqueued")
    try:
        fast_on_slow = slow.evaluate(fast_best.plan)
        if workers == 1:
            summary = slow.optimize(max(n_trials, n_enq), timeout=timeout, show_progress_bar=show_progress_bar,
                                    worker_id=worker_id, heartbeat_interval_s=heartbeat_interval_s)
        else:
            from autotune.tune.workers import run_workers

            with quiet():
                study = slow.study      # checked above and opened here, once, before the workers (study_checked)
                for params, attrs in slow._pending:
                    study.enqueue_trial(params, user_attrs=attrs, skip_if_exists=True)
            slow._pending.clear()
            outcomes = run_workers(dict(model=model, cluster=cluster, workload=workload, space=space_obj,
                                        storage=storage, backend=backend, seed=seed,
                                        evaluator_options=evaluator_options, engine=engine),
                                   workers, n_trials=max(n_trials, n_enq), timeout=timeout,
                                   first_worker_id=worker_id, heartbeat_interval_s=heartbeat_interval_s,
                                   study_checked=True)
            for o in outcomes:
                say(f"worker {o.worker_id}: {o.n_new_trials} trials" + (f"; stopped: {o.error}" if o.error else ""))
            trials = slow.study.get_trials(deepcopy=False)
            summary = TuneSummary(study=slow.name, storage=storage, n_new_trials=sum(o.n_new_trials for o in outcomes),
                                  n_trials=len(trials), states=outcome_counts(trials),
                                  best=require_best_plan(slow.study, slow.info, storage))
    finally:
        slow.close()
    return RetuneResult(fast=fast_best, slow=summary.best, fast_on_slow=fast_on_slow, n_enqueued=n_enq,
                        tuned_fast_first=tuned_fast_first, summary=summary)


def explain_changes(fast: BestPlan, slow: BestPlan, fast_on_slow: StepResult, *, top: int = 3) -> list[str]:
    """Which plan fields changed and why, from the breakdown differences (ms), as text lines.

    "why": the terms that grew most when the fast plan moved to the slow fabric (fast plan on fast ->
    fast plan on slow), and what the retuned plan brings them to.
    """
    lines = []
    a, b = fast.plan.to_dict(), slow.plan.to_dict()
    changed = [k for k in a if a[k] != b[k]]
    if changed:
        def show(v) -> str:
            # a long value (stage_layers of a 128-stage split) as its length and range, not every entry
            if isinstance(v, (list, tuple)) and len(v) > 8:
                return f"[{len(v)} entries, {min(v)}..{max(v)}]" if all(isinstance(x, (int, float)) for x in v) \
                    else f"[{len(v)} entries]"
            return str(v)
        lines.append("changed: " + ", ".join(f"{k} {show(a[k])} -> {show(b[k])}" for k in changed))
    else:
        lines.append("changed: nothing (the fast fabric's plan is also the best found on the slow fabric)")
    f0, f1, s1 = fast.result.breakdown_ms, fast_on_slow.breakdown_ms, slow.result.breakdown_ms
    keys = sorted(set(f0) | set(f1) | set(s1), key=lambda k: -(f1.get(k, 0.0) - f0.get(k, 0.0)))
    grew = [k for k in keys if f1.get(k, 0.0) - f0.get(k, 0.0) > 0.05][:top]
    for k in grew:
        lines.append(f"why: {k} {f0.get(k, 0.0):.1f} -> {f1.get(k, 0.0):.1f} ms with the fast plan on the slow "
                     f"fabric; the retuned plan: {s1.get(k, 0.0):.1f} ms")
    return lines


__all__ = ["storage_kind", "check_heartbeat", "worker_seed", "trial_seed", "TrialSeededSampler", "REAL_HEARTBEAT_INTERVAL_S",
           "DEFAULT_STORAGE", "DEFAULT_BACKEND", "BACKENDS", "make_evaluator", "open_storage", "study_name",
           "StudyInfo", "list_studies", "load_study", "best_trial", "feasible_trials", "top_feasible_trials",
           "failure_summary", "trial_result", "trial_plan", "BestPlan", "best_plan", "require_best_plan",
           "TuneSummary", "Tuner", "record_result", "RetuneResult", "find_fastest_study", "retune",
           "explain_changes", "fabric_speed", "fabric_fingerprint"]
