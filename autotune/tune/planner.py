"""The sweep of ``autotune plan``: the best plan per (GPU type, GPU count), and its training budget.

Each point is one ordinary tuning study (:class:`autotune.tune.tuner.Tuner`, the name ``autotune run`` gives the
same target), so a stored study is reused: a study that already converged gets no new trial
(:meth:`autotune.search.convergence.ConvergenceStop.converged_already`), one that holds ``trials`` trials is read
as it is. A new study is warm-started with the best distinct plans of the next smaller count of the same GPU type
(their knob values are count-independent: dp follows from the count, :meth:`BoundSearchSpace.suggest`), only
those whose degrees divide the new count and its batch. The budget arithmetic is :mod:`autotune.cost.budget`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from autotune.cost.budget import Budget, band_multipliers, budget_for
from autotune.cost.evaluator import StepResult
from autotune.errors import ConfigError
from autotune.spec.hardware import ClusterSpec, get_gpu, make_cluster
from autotune.spec.models import ModelSpec
from autotune.spec.plan import Plan, Workload

#: distinct best plans of the neighbouring count enqueued into a new study
WARM_START_TOP_K = 5


@dataclass
class PlanPoint:
    """One (GPU type, count) of the sweep.

    Attributes:
        gpu, num_gpus, fabric: the cluster (catalogue GPU name, count, fabric name).
        plan, result: the best plan and its prediction (None when none fits or the count is invalid).
        study, trial: where the plan is stored (None for ``--plan FILE``).
        engine: the engine the plan was costed for.
        error: why there is no plan (one line), else None.
        reused: the study was complete before this sweep (no trial run); n_new_trials: trials run now.
        warm_started: plans enqueued from the neighbouring count.
        band: (low, high) duration factors of the engine's error band (:func:`band_multipliers`), and the
            band's figure and source as text; budget: the :class:`Budget` (None without a plan).
        pareto, meets: on the Pareto front; meets every constraint (None when none was given).
    """

    gpu: str
    num_gpus: int
    fabric: str
    engine: str
    plan: Plan | None = None
    result: StepResult | None = None
    study: str | None = None
    trial: int | None = None
    error: str | None = None
    reused: bool = False
    n_new_trials: int = 0
    warm_started: int = 0
    band: tuple[float, float] | None = None
    band_text: str | None = None
    budget: Budget | None = None
    pareto: bool = False
    meets: bool | None = None
    misses: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: a given plan (``--plan FILE``) the memory model refuses, timed as if it fit: the refusal, else None
    memory_refusal: str | None = None

    @property
    def ok(self) -> bool:
        return self.budget is not None


def prediction_band(engine: str, gpu: str) -> tuple[tuple[float, float] | None, str | None]:
    """((low, high) duration factors, a one-line description) from ``engine``'s error band on ``gpu``'s family
    (autotune/data/error_bands.yaml, :func:`autotune.spec.engines.error_band`: held-out mean absolute error), or
    (None, why) when none was measured."""
    from autotune.spec.engines import error_band
    from autotune.spec.hardware import gpu_family

    b = error_band(engine)
    if not b:
        return None, f"no error band measured for engine {engine}"
    fam = gpu_family(gpu)
    g = (b.get("by_gpu") or {}).get(fam) if fam else None
    e = float((g or b)["mean_abs_error_pct"]) / 100.0
    q = str(b.get("quantity", "step time"))
    where = f"{engine}, {fam}" if g else f"{engine}, all GPUs"
    n = int((g or b)["num_runs"])
    against = str(b["against"]).replace("runs", "run", 1) if n == 1 else str(b["against"])
    return band_multipliers(e, q), (f"+-{100 * e:.1f}% ({where}: mean absolute error of the predicted {q} over "
                                    f"{n} {against}, {b['source']})")


def default_counts(model: ModelSpec, gpu: str, max_gpus: int, *, interconnect: str | None = None) -> list[int]:
    """GPU counts of the default sweep: powers of two times one node (8 GPUs; NVL72 fabrics: 4-GPU hosts, so a
    power of two of at least 8 is valid too) up to ``max_gpus``, from the smallest that holds the model's
    weights, gradients and Adam state at 16 bytes per parameter (BF16 weights and gradients, FP32 master weights
    and two moments: Rajbhandari et al. 2020, ZeRO, Sec. 3.1) in the GPUs' usable memory.

    Raises:
        ConfigError: ``max_gpus`` below that smallest count (names it).
    """
    g = get_gpu(gpu)
    need = 16 * model.num_params / g.usable_hbm_bytes
    n = 8
    while n < need:
        n *= 2
    if n > max_gpus:
        raise ConfigError(f"--max-gpus {max_gpus}: {model.name} needs at least {n} x {g.name} to hold its weights, "
                          f"gradients and optimizer state (16 bytes per parameter); give --max-gpus {n} or more")
    out = []
    while n <= max_gpus:
        out.append(n)
        n *= 2
    if interconnect is None:        # check the counts against the GPU's default fabric here, once
        for c in out:
            make_cluster(gpu, c, None)
    return out


def _warm_params(prev_study: Any, info: Any, bound: Any, cluster: ClusterSpec, workload: Workload) -> list[Any]:
    """The previous count's best distinct trials whose knob values the new space offers and whose degrees fit
    the new count (tp x pp x cp divides it, the batch splits into micro-batches)."""
    from autotune.study.trials import rank_basis, top_feasible_trials

    out = []
    n, gbs = cluster.num_gpus, workload.global_batch_size
    for t in top_feasible_trials(prev_study, WARM_START_TOP_K, rank_basis(info), info.engine):
        p = t.params
        if any(k in bound.choices and v not in bound.choices[k] for k, v in p.items()):
            continue
        tp, pp, cp, mbs = (int(p.get(k, 1)) for k in ("tp_degree", "pp_degree", "cp_degree", "micro_batch_size"))
        if n % (tp * pp * cp) or gbs % (mbs * (n // (tp * pp * cp))):
            continue
        out.append(t)
    return out


def sweep(*, model: ModelSpec, workload: Workload, counts: Mapping[str, Sequence[int]],
          interconnect: Mapping[str, str | None] | None = None, storage: str, space: Any = None,
          engine: str | None = None, seed: int | None = 0, trials: int = 100,
          progress: Callable[[PlanPoint], None] | None = None, workers: int = 1) -> list[PlanPoint]:
    """Tune the best plan for every (GPU type, count) of ``counts`` (GPU name -> counts), simulated backend.

    Counts of one GPU type run smallest first; each new study is warm-started from the previous count's study
    (module docstring). A count the fabric refuses, or with no plan that fits, is a point with ``error`` set,
    not an exception. ``trials``: the most trials a study holds after this call (the convergence stop of
    ``autotune run`` usually ends it earlier). ``progress`` is called after each point (with ``workers`` > 1,
    after each GPU type's points, as they come back).

    ``workers`` > 1: the GPU types are swept in that many forked processes at once (each type's counts stay in
    one process, in order, for the warm start); the studies are the same as with one, and so is every point's
    result (each study's trials depend on its seed and history only). A signal in the parent ends the children
    (``Pool.terminate``: SIGTERM, which a Tuner turns into a failed running trial) and is raised here.

    Returns:
        one :class:`PlanPoint` per (GPU, count), in the order of ``counts``; budgets are not filled in here
        (:func:`fill_budgets`).

    Raises:
        ConfigError, StorageError: a bad space, engine or storage (before any point is tuned).
    """
    from autotune.errors import NoFeasiblePlanError
    from autotune.search.space import SearchSpace
    from autotune.spec.engines import resolve_engine
    from autotune.tune.tuner import Tuner

    sp = space if isinstance(space, SearchSpace) else SearchSpace.load(space)
    eng = resolve_engine(engine, "simulated")
    if workers > 1 and len(counts) > 1:
        import multiprocessing

        jobs = [dict(model=model, workload=workload, counts={g: list(ns)}, interconnect=interconnect,
                     storage=storage, space=space if not isinstance(space, SearchSpace) else sp, engine=engine,
                     seed=seed, trials=trials) for g, ns in counts.items()]
        import signal

        from autotune.signals import interrupt_handler

        out: list[PlanPoint] = []
        pool = multiprocessing.get_context("fork").Pool(min(workers, len(jobs)))
        # the parent only waits here: SIGINT / SIGTERM raise KeyboardInterrupt at once, and the pool is ended
        handlers = {sig: signal.signal(sig, interrupt_handler) for sig in (signal.SIGINT, signal.SIGTERM)
                    if signal.getsignal(sig) is not signal.SIG_IGN}
        try:
            for pts in pool.imap(_sweep_job, jobs):
                out.extend(pts)
                for pt in pts:
                    if progress:
                        progress(pt)
            pool.close()
        except BaseException:
            pool.terminate()
            raise
        finally:
            pool.join()
            for sig, h in handlers.items():
                signal.signal(sig, h)
        return out
    points: list[PlanPoint] = []
    for gpu, ns in counts.items():
        ic = (interconnect or {}).get(gpu)
        prev = None         # (study, info) of the previous count with a feasible plan
        for n in sorted(ns):
            try:
                cluster = make_cluster(gpu, n, ic)
            except ConfigError as e:
                pt = PlanPoint(gpu=gpu, num_gpus=n, fabric=ic or "-", engine=eng.name, error=str(e))
                points.append(pt)
                if progress:
                    progress(pt)
                continue
            pt = PlanPoint(gpu=gpu, num_gpus=n, fabric=cluster.fabric.name, engine=eng.name)
            tuner = Tuner(model=model, cluster=cluster, workload=workload, space=sp, storage=storage,
                          backend="simulated", seed=seed, engine=eng.name)
            try:
                have = len(tuner.study.get_trials(deepcopy=False))
                if have == 0 and prev is not None:
                    pt.warm_started = tuner.enqueue(_warm_params(prev[0], prev[1], tuner.bound, cluster, workload),
                                                    source=prev[0].study_name)
                try:
                    if have >= trials:
                        from autotune.study.trials import require_best_plan
                        best = require_best_plan(tuner.study, tuner.info, storage)
                        pt.reused = True
                    else:
                        s = tuner.optimize(max(trials - have, pt.warm_started), show_progress_bar=False,
                                           stop_when_converged=True)
                        best, pt.n_new_trials = s.best, s.n_new_trials
                        pt.reused = s.n_new_trials == 0
                    pt.plan, pt.result, pt.study, pt.trial = best.plan, best.result, best.study, best.trial_number
                    prev = (tuner.study, tuner.info)
                except NoFeasiblePlanError as e:
                    pt.error = f"no plan fits: {str(e).split(': ', 1)[-1]}"
            finally:
                tuner.close()
            points.append(pt)
            if progress:
                progress(pt)
    return points


def _sweep_job(kwargs: dict[str, Any]) -> list[PlanPoint]:
    """One GPU type's sweep in a pool process (:func:`sweep` with ``workers`` > 1). SIGINT is ignored here: the
    parent decides, and ends the pool with SIGTERM."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return sweep(**kwargs)
    except KeyboardInterrupt:
        # the pool's SIGTERM (the Tuner failed its running trial): end this process quietly, no traceback
        raise SystemExit(128 + int(signal.SIGTERM)) from None


def cost_plan_file(doc: Any, *, engine: str | None = None) -> PlanPoint:
    """A :class:`~autotune.spec.plan.PlanDocument`'s plan predicted on its own target (``--plan FILE``): the
    simulated backend with the file's engine (or ``engine``), no study.

    Raises:
        ConfigError / PlanError: the file's plan is invalid for its target.
    """
    from autotune.spec.engines import resolve_engine
    from autotune.spec.hardware import fabric_from_dict
    from autotune.spec.plan import validate_plan

    fabric = fabric_from_dict(doc.fabric, where="plan file: cluster.fabric")
    cluster = ClusterSpec(gpu=get_gpu(doc.gpu), num_gpus=doc.num_gpus, fabric=fabric)
    validate_plan(doc.plan, doc.model, cluster.num_gpus, doc.workload, gpus_per_node=cluster.gpus_per_node,
                  gpu=cluster.gpu)
    eng = resolve_engine(engine if engine is not None else doc.engine, "simulated")
    r = _evaluate(doc, cluster, eng.name)
    pt = PlanPoint(gpu=cluster.gpu.name, num_gpus=cluster.num_gpus, fabric=fabric.name, engine=eng.name,
                   plan=doc.plan, result=r)
    if not r.feasible:
        # a given plan (a published run that ran) the memory model refuses: its step time does not depend on
        # the capacity, so it is timed on the same GPU with room for it and the refusal said beside it, as
        # bench/published.py predicts published runs (a memory-model error, not a reason to cost nothing)
        import dataclasses

        roomy = dataclasses.replace(cluster, gpu=dataclasses.replace(cluster.gpu, hbm_gib=1e6))
        r2 = _evaluate(doc, roomy, eng.name)
        if r2.feasible:
            pt.result, pt.memory_refusal = r2, r.infeasible_reason
            pt.warnings.append(f"the memory model says this plan does not fit ({r.infeasible_reason}); costed "
                               "anyway, timed as if it fit: a plan that ran is a memory-model error")
        else:
            pt.error = f"the plan cannot be timed: {r2.infeasible_reason or r.infeasible_reason}"
    return pt


def _evaluate(doc: Any, cluster: ClusterSpec, engine: str) -> StepResult:
    from autotune.cost.evaluator import make_evaluator

    ev = make_evaluator("simulated", model=doc.model, cluster=cluster, workload=doc.workload, engine=engine)
    try:
        return ev.evaluate(doc.plan)
    finally:
        ev.close()


def fill_budgets(points: Sequence[PlanPoint], *, tokens: float, goodput: float, watts: Mapping[str, float | None],
                 pue: float, prices: Mapping[str, float], kg_co2_per_kwh: float | None,
                 constraints: Any = None) -> list[int]:
    """Set each feasible point's ``budget`` (with the engine's error band carried into days, GPU-hours and cost),
    ``pareto`` (days against cost when every point has a price, else against GPU-hours) and, with
    ``constraints`` (:class:`autotune.cost.budget.Constraints`) that limit something, ``meets`` / ``misses``.

    Returns:
        the indices (into ``points``) of the Pareto front.
    """
    from autotune.cost.budget import pareto_front

    for p in points:
        if p.result is None or not p.result.feasible or p.error:
            continue
        p.band, p.band_text = prediction_band(p.engine, p.gpu)
        p.budget = budget_for(tokens=tokens, tokens_per_s_per_gpu=p.result.tokens_per_s_per_gpu,
                              num_gpus=p.num_gpus, goodput=goodput, watts_per_gpu=watts.get(p.gpu), pue=pue,
                              usd_per_gpu_hour=prices.get(p.gpu), kg_co2_per_kwh=kg_co2_per_kwh, band=p.band)
    ok = [i for i, p in enumerate(points) if p.budget is not None]
    by_cost = bool(ok) and all(points[i].budget.cost_usd is not None for i in ok)
    xy = [(points[i].budget.days, points[i].budget.cost_usd if by_cost else points[i].budget.gpu_hours) for i in ok]
    front = [ok[j] for j in pareto_front(xy)]
    for i in front:
        points[i].pareto = True
    if constraints is not None and constraints.given:
        for i in ok:
            points[i].misses = constraints.misses(points[i].budget)
            points[i].meets = not points[i].misses
    return front


def short_plan_text(plan: Plan) -> str:
    """``TP8 PP16 DP128 CP1 v8 mb1 z1 bf16``: degrees, virtual stages, micro-batch, ZeRO stage (when > 0),
    precision, recompute."""
    s = f"TP{plan.tp_degree} PP{plan.pp_degree} DP{plan.dp_degree} CP{plan.cp_degree}"
    if plan.pp_degree > 1 and plan.pipeline_schedule == "interleaved_1f1b":
        s += f" v{plan.vpp_degree}"
    s += f" mb{plan.micro_batch_size}" + (f" z{plan.zero_stage}" if plan.zero_stage else "") + f" {plan.precision}"
    if plan.recompute != "none":
        s += f" rc-{plan.recompute}"
    return s


__all__ = ["PlanPoint", "sweep", "cost_plan_file", "fill_budgets", "default_counts", "prediction_band",
           "short_plan_text"]
