"""The simulator's screen before real engine trials (issue 23): which plans are worth a real run.

A real torchtitan trial costs a minute of GPU time (start-up, compilation, steps), a simulated one a
fraction of a second. :func:`screen_plans` runs a simulated study of the same space, engine profile and
(proxy) model in memory, then keeps at most ``keep`` plans for the real runs:

1. plans the memory model says do not fit are dropped (``not_fitting``);
2. plans that launch the same job are merged (``duplicates``): the engine's run key (for torchtitan the
   job file and its environment: the engine runner's ``run_key``, autotune/engines/torchtitan/runner.py)
   decides, so settings the engine has no knob for do not cost a second run; a plan the job writer
   refuses is dropped (``unwritable``);
3. of the rest, ranked by predicted MFU, the best plan of each precision x compile family comes first
   (so the real runs test the simulator's ranking across BF16 / FP8 and eager / compiled, the
   families the engine profile's accuracy differs most between), then the next best by rank, up to
   ``keep``; the others are ``below_top``.

:func:`autotune.cli.tune.run` prints the counts, enqueues the kept plans as the real study's first
trials and makes the runner refuse any other plan (``only_plans``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from autotune.cost.evaluator import StepResult
from autotune.cost.simulator import SimulatedEvaluator
from autotune.errors import ConfigError
from autotune.spec.engines import EngineProfile
from autotune.spec.hardware import ClusterSpec
from autotune.spec.models import ModelSpec
from autotune.spec.plan import Plan, Workload


@dataclass
class Screen:
    """What :func:`screen_plans` kept and why the rest was left out.

    Attributes:
        kept: [(plan, simulated result, params of its simulated trial)], in run order.
        simulated: trials simulated; distinct: distinct plans among them; not_fitting, duplicates,
            unwritable, below_top: plans left out for each reason (see the module docstring).
    """

    kept: list[tuple[Plan, StepResult, dict[str, Any]]] = field(default_factory=list)
    simulated: int = 0
    distinct: int = 0
    not_fitting: int = 0
    duplicates: int = 0
    unwritable: int = 0
    below_top: int = 0

    @property
    def plans(self) -> list[Plan]:
        return [p for p, _, _ in self.kept]

    def summary(self) -> str:
        return (f"simulator screen: {self.simulated} trials simulated, {self.distinct} distinct plans; screened out "
                f"{self.not_fitting + self.duplicates + self.unwritable + self.below_top}: {self.not_fitting} predicted "
                f"not to fit, {self.duplicates} launch the same job as a better one, {self.unwritable} the engine's "
                f"job writer refuses, {self.below_top} below the top {len(self.kept)}; {len(self.kept)} kept for real runs")


#: without an explicit ``n_simulated``, the screen simulates up to this many rounds of trials while fewer than
#: ``keep`` runnable plans were found (a space where the job writer refuses most plans: an MoE model on
#: torchtitan, whose writer refuses FP8)
MAX_ROUNDS = 4


def _runnable(seen: dict, run_key) -> int:
    """How many distinct runnable jobs (feasible, writable, distinct run key) ``seen`` holds."""
    keys = set()
    for p, (r, _) in seen.items():
        if not r.feasible:
            continue
        try:
            keys.add((run_key or repr)(p))
        except ConfigError:
            continue
    return len(keys)


def screen_plans(*, model: ModelSpec, cluster: ClusterSpec, workload: Workload, engine: EngineProfile,
                 keep: int, space: Any = None, seed: int | None = 0, layers: int | None = None,
                 n_simulated: int | None = None, run_key: Callable[[Plan], str] | None = None) -> Screen:
    """Simulate ``n_simulated`` trials (default ``max(48, 6 x keep)``, repeated up to :data:`MAX_ROUNDS` times
    while fewer than ``keep`` runnable plans turned up) of ``space`` for ``model`` (cut to
    ``layers`` when given) with ``engine``'s profile in an in-memory study; keep at most ``keep`` plans
    (see the module docstring). ``run_key``: plans with equal keys launch the same job (default: the
    plan itself)."""
    from autotune.tune.tuner import Tuner

    if keep < 1:
        raise ConfigError(f"the screen keeps at least 1 plan, got {keep}")
    run_model = model if layers is None else model.truncated(layers)
    ev = SimulatedEvaluator(model=run_model, cluster=cluster, workload=workload, engine=engine)
    t = Tuner(model=run_model, cluster=cluster, workload=workload, space=space, storage="sqlite:///:memory:",
              backend="simulated", seed=seed, evaluator=ev)
    try:
        rounds = 1 if n_simulated else MAX_ROUNDS
        seen: dict[Plan, tuple[StepResult, dict]] = {}
        for _ in range(rounds):
            t.optimize(n_simulated or max(48, 6 * keep))
            trials = [tr for tr in t.study.get_trials(deepcopy=False) if tr.user_attrs.get("plan")]
            for tr in trials:
                plan = Plan.from_dict(tr.user_attrs["plan"])
                if plan not in seen:
                    seen[plan] = (t.evaluate(plan), dict(tr.params))
            if _runnable(seen, run_key) >= keep:
                break
        out = Screen(simulated=len(trials))
    finally:
        t.close()
    out.distinct = len(seen)
    fits = [(p, r, params) for p, (r, params) in seen.items() if r.feasible]
    out.not_fitting = len(seen) - len(fits)
    fits.sort(key=lambda x: -x[1].mfu)
    key = run_key or repr
    by_key: dict[str, tuple[Plan, StepResult, dict]] = {}
    for p, r, params in fits:
        try:
            k = key(p)
        except ConfigError:
            out.unwritable += 1
            continue
        if k in by_key:
            out.duplicates += 1
        else:
            by_key[k] = (p, r, params)
    ranked = list(by_key.values())
    families: dict[tuple[str, bool], tuple] = {}
    for item in ranked:
        families.setdefault((item[0].precision, bool(item[0].compile)), item)
    order = list(families.values()) + [x for x in ranked if x not in families.values()]
    out.kept = order[:keep]
    out.below_top = len(order) - len(out.kept)
    return out


__all__ = ["Screen", "screen_plans"]
