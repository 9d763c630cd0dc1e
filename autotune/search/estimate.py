"""Cheap screens of a plan, ~1 ms each, against ~100 ms for a simulated step graph (405B, 2-core host).

* :meth:`PlanScreen.fits`: the memory model the simulator itself applies
  (:func:`autotune.cost.memory.estimate_memory` with the evaluator's fragmentation and engine), so a plan
  this rejects would be recorded as infeasible by the simulated evaluator too.
* :meth:`PlanScreen.estimate_ms`: a closed-form step time from the same per-chunk costs the step graph
  is built from (:class:`autotune.cost.graph.CostBuilder`):

      T = (m + (p - 1) / v) x t_mb + 2 (p - 1) t_p2p + t_opt + t_gather + t_dp_tail

  with t_mb the busiest pipeline rank's forward + backward time of one micro-batch over its v chunks,
  (p - 1) / v the pipeline bubble in micro-batch times (Narayanan et al. 2021, "Efficient Large-Scale
  Language Model Training on GPU Clusters", Sec. 2.2.1-2.2.2: bubble fraction (p - 1) / m for 1F1B and
  GPipe, (p - 1) / (v m) interleaved), t_p2p one boundary send/recv (:meth:`CostBuilder.p2p_ms`), t_opt
  the optimizer step and t_gather the ZeRO-1/2 parameter all-gather of that rank
  (:meth:`CostBuilder.optimizer_ms`, :meth:`CostBuilder.param_gather_ms`), and t_dp_tail the DP
  gradient reduction left after the last backward (its last bucket when overlapped, all buckets
  otherwise; :meth:`CostBuilder.dp_bucket_ms`). It is an estimate for ordering candidates, not a bound:
  the graph simulation decides (docs/search.md gives its measured rank agreement).
"""

from __future__ import annotations

from typing import Any

from autotune.cost.calibration import default_calibration
from autotune.cost.graph import CostBuilder, chunk_costs
from autotune.cost.memory import estimate_memory
from autotune.cost.op_costs import CalibratedCosts, OpCosts
from autotune.errors import PlanError
from autotune.target.engines import EngineProfile, check_plan_for_engine, get_engine
from autotune.target.hardware import ClusterSpec
from autotune.target.models import ModelSpec
from autotune.target.plan import Plan, Workload


class PlanScreen:
    """Memory fit and closed-form step-time estimate of plans for one model, cluster and workload.

    Args (keyword-only):
        model, cluster, workload: the target.
        engine: the engine profile (or name) the plans run on.
        costs: op costs (an evaluator's ``costs``); default: the shipped calibration for the GPU.
        fragmentation: allocator fragmentation per reclaim policy (``OpCosts.fragmentation()``); default
            from ``costs``.

    Results are cached per plan.
    """

    def __init__(self, *, model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                 engine: EngineProfile | str | None = None, costs: OpCosts | None = None) -> None:
        self.model, self.cluster, self.workload = model, cluster, workload
        self.engine = get_engine(engine)
        self.costs = costs if costs is not None else CalibratedCosts(profile=default_calibration(), gpu=cluster.gpu)
        self._frag = self.costs.fragmentation()
        self._fits: dict[Plan, bool] = {}
        self._est: dict[Plan, float] = {}

    def fits(self, plan: Plan) -> bool:
        """True when the engine can run ``plan`` (:func:`autotune.target.engines.check_plan_for_engine`) and
        :func:`autotune.cost.memory.estimate_memory` puts every pipeline stage within the GPU's usable memory
        (False also for a plan the memory model rejects as invalid)."""
        r = self._fits.get(plan)
        if r is None:
            try:
                check_plan_for_engine(plan, self.engine)
                r = estimate_memory(self.model, plan, self.cluster.gpu, self.workload, fragmentation=self._frag,
                                    engine=self.engine).fits
            except PlanError:
                r = False
            self._fits[plan] = r
        return r

    def estimate_ms(self, plan: Plan) -> float:
        """Closed-form step time of ``plan``, ms (module docstring); ``inf`` for a plan the cost model
        rejects."""
        r = self._est.get(plan)
        if r is None:
            try:
                r = self._estimate(plan)
            except (PlanError, ValueError, ZeroDivisionError):
                r = float("inf")
            self._est[plan] = r
        return r

    def _estimate(self, plan: Plan) -> float:
        cb = CostBuilder(model=self.model, plan=plan, cluster=self.cluster, workload=self.workload,
                         costs=self.costs, engine=self.engine)
        p, v, m = plan.pp_degree, plan.effective_vpp, plan.num_micro_batches
        chunks = chunk_costs(cb, plan, self.model, cached=True)     # once per chunk class (graph.chunk_costs)
        busy = [0.0] * p
        params = [0] * p
        chunk_params: list[list[int]] = [[] for _ in range(p)]
        for vs in range(len(chunks)):
            cc = chunks[vs]
            r = vs % p
            busy[r] += cc.fwd_ms + cc.bwd_ms
            params[r] += cc.params
            chunk_params[r].append(cc.params)
        crit = max(range(p), key=lambda r: busy[r])
        t = (m + (p - 1) / v) * busy[crit] + 2 * (p - 1) * cb.p2p_ms()
        t += cb.optimizer_ms(params[crit]) + cb.param_gather_ms(params[crit])
        buckets = [b for cp_ in chunk_params[crit] for b in cb.dp_bucket_ms(cp_)]
        if buckets:
            overlapped = plan.async_collectives and plan.dp_grad_reduce_overlap
            t += buckets[-1] if overlapped else sum(buckets)
        return t

    def describe(self) -> dict[str, Any]:
        """How many plans were screened (for bench output)."""
        return {"memory_checks": len(self._fits), "estimates": len(self._est)}


__all__ = ["PlanScreen"]
