"""Cheap screens of a plan, ~1 ms each, against ~100 ms for a simulated step graph (405B, 2-core host).

* :meth:`PlanScreen.fits`: the memory model the simulator itself applies
  (:func:`autotune.cost.memory.estimate_memory` with the evaluator's fragmentation and engine), so a plan
  this rejects would be recorded as infeasible by the simulated evaluator too.
* :meth:`PlanScreen.estimate_ms`: a closed-form step time from the step graph's own numbers
  (:func:`autotune.cost.graph.step_weights` over :class:`autotune.cost.graph.CostBuilder`'s per-chunk costs:
  node durations with their exposed TP / CP / ZeRO-3 communication, blocking p2p, the DP bucket groups
  with their ready delays, optimizer, exposed parameter gather), combined by
  :func:`step_time_from_weights`: the pipeline's compute time with its bubble (Narayanan et al. 2021,
  Sec. 2.2), the p2p round trip that bounds the steady state on slow links, and per pipeline rank the DP
  bucket stream after that rank's last backwards. No formula of the cost model is re-derived here, so the
  estimate follows cost-model changes. It is an estimate for ordering candidates, not a bound: the graph
  simulation decides; its rank agreement per target is ``python bench/bench_search.py --rank-correlation``
  (docs/search.md).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any

from autotune.cost import moe
from autotune.cost.calibration import default_calibration
from autotune.cost.graph import CostBuilder, chunk_costs, hidden_comm_ms, step_weights
from autotune.cost.chunk_costs import LAYER_FIELDS, StepWeights
from autotune.cost.memory import estimate_memory
from autotune.cost.op_costs import CalibratedCosts, OpCosts
from autotune.errors import PlanError
from autotune.spec.engines import EngineProfile, check_plan_for_engine, get_engine
from autotune.spec.hardware import ClusterSpec
from autotune.spec.models import ModelSpec
from autotune.spec.plan import Plan, Workload


def step_time_from_weights(plan: Plan, w: StepWeights) -> float:
    """Closed-form step time (ms) of ``plan`` from its step graph's numbers ``w``
    (:func:`autotune.cost.graph.step_weights`), without building or simulating the graph.

    * Compute: ``F_0 = (m + (p - 1) / v) t_mb + 2 (p - 1) d_p2p``, t_mb the busiest rank's forward +
      backward node durations over its v chunks, (p - 1) / v the pipeline bubble in micro-batch times
      (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters", Sec.
      2.2.1-2.2.2), d_p2p the p2p edge delay. Rank 0 ends last (1F1B, interleaved and GPipe all drain
      toward stage 0); rank r ends ``sum_{j<r} (b_j + d_p2p)`` earlier, b_j rank j's last backward node.
    * Slow p2p links (1F1B and interleaved): past the first W / v micro-batches a micro-batch takes at least
      ``(p t_mb + 2 (p - 1) v d_p2p) / W`` (W = p for 1F1B, 2 p - 1 interleaved: the chunk slots rank 0
      runs between a chunk's forward and backward of one micro-batch, from the schedule's warm-up; the
      chain between them is p forwards, p backwards and 2 (p - 1) hops); the excess over t_mb is added.
    * The end of each chunk's last backward on rank r, packing the schedule's final backwards from its end
      (:func:`autotune.cost.schedule.schedule_order`: interleaved 1F1B drains chunk v-1 .. 0 in groups of p
      micro-batches, so chunk c's last backward ends ``c p b_0..`` before the rank's end).
    * DP: the step graph's bucket groups (``w.dp_groups``, in the order their chunk's last backward ends: chunk v-1 first, as the step graph)
      run one after the other on the DP stream, each from max(the previous group's end, its chunk's last
      backward end + its ready delay) when ``w.overlap_dp``, else after the last backward on the compute
      stream; then the optimizer step, the exposed parameter gather and the per-step reclaim
      (:func:`autotune.cost.graph._make_structure`'s end of step).

    The step is the latest rank's end: the step graph's recurrence with the waits inside the steady state
    replaced by the bubble and round-trip terms. tests/search/test_search.py compares it with the
    simulation on single plans; ``bench/bench_search.py --rank-correlation`` over every layout per target.
    """
    p, v, m = plan.pp_degree, plan.effective_vpp, w.num_micro_batches
    comp = w.compute
    busy = [sum(comp[r, "F", c][1] + comp[r, "B", c][1] for c in range(v)) for r in range(p)]
    d = w.p2p_delay_ms
    t_mb = max(busy)
    extra = 0.0
    if p > 1 and d > 0 and plan.pipeline_schedule != "gpipe":
        # steady state: rank 0 runs a chunk's forward of a micro-batch W chunk slots (forward + backward)
        # before that chunk's backward of it (1F1B: W = p, the warm-up p - 1 plus one; interleaved: the
        # warm-up's 2 (p - 1) extra plus one, W = 2 p - 1), while the dependency chain between the two
        # goes through p forwards, p backwards and 2 (p - 1) p2p hops: a slot is at least
        # (p (c_f + c_b) + 2 (p - 1) d) / W (Narayanan et al. 2021 Sec. 2.2's in-flight counts; the loop
        # the step graph's p2p edges close). Only micro-batches past the first W / v run in that state.
        inflight = p if v == 1 else 2 * p - 1
        loop = (p * t_mb + 2 * (p - 1) * v * d) / inflight
        steady = m - inflight / v
        if loop > t_mb and steady > 0:
            extra = steady * (loop - t_mb)
    end0 = (m + (p - 1) / v) * t_mb + 2 * (p - 1) * d + extra
    step = 0.0
    lag = 0.0
    interleaved = v > 1 and plan.pipeline_schedule == "interleaved_1f1b"
    for r in range(p):
        f_end = end0 - lag
        lag += comp[r, "B", 0][1] + d
        if w.overlap_dp:
            # chunk c's last backward ends back[c] before the rank's end (chunk 0's last: the drain runs
            # chunks v-1 .. 0); the DP stream takes the chunks in the order their last backward ends, as
            # the step graph does (graph.py: sorted by last position, Megatron-LM schedules.py
            # grad_sync_func), so chunk v-1 first: in chunk-index order every chunk's reduction waited
            # behind chunk 0's and overlap looked no better than blocking (issue 40 item 6)
            back, acc = [0.0] * v, 0.0
            for c in range(v):
                back[c] = acc
                if interleaved:
                    acc += p * comp[r, "B", c][1]
            t = 0.0
            for c in sorted(range(v), key=lambda c: -back[c]):
                for dur, _, delay in w.dp_groups.get((r, c), ()):
                    t = max(t, f_end - back[c] + delay) + dur
            tail = max(f_end, t)
        else:
            tail = f_end + sum(g[0] for c in range(v) for g in w.dp_groups.get((r, c), ()))
        tail += w.opt_ms[r] + w.param_gather_ms[r] + (w.reclaim_ms[r] if w.reclaim_ms is not None else 0.0)
        step = max(step, tail)
    return step


#: the plan fields :func:`autotune.cost.memory.estimate_memory` can depend on besides the precision: all but
#: tp_comm_overlap and the MoE token dispatcher, dispatch overlap and grouped GEMM (no term of
#: autotune/cost/memory.py, activations.py or moe.py reads them: the experts' bytes follow EP x ETP alone;
#: tests/search/test_lazy_ranking.py compares estimate_memory across them)
_MEMORY_FIELDS = tuple(f.name for f in dataclasses.fields(Plan) if f.name not in (
    "tp_comm_overlap", "precision", "moe_dispatcher", "moe_a2a_overlap", "moe_grouped_gemm"))
_memory_fields = operator.attrgetter(*_MEMORY_FIELDS)     # plan -> the tuple of those fields


def _memory_key(plan: Plan) -> tuple:
    """What :func:`autotune.cost.memory.estimate_memory` of ``plan`` depends on: :data:`_MEMORY_FIELDS` and
    whether the precision is FP8. memory.py reads the precision only as ``precision != "bf16"`` (``te_fp8``:
    Transformer Engine saves FP8 inputs and caches FP8 weights for every FP8 recipe; the compiled saved-bytes
    ratio by precision kind), so the FP8 recipes share one memory estimate (tests/search/test_lazy_ranking.py
    compares estimate_memory across them)."""
    return _memory_fields(plan) + (plan.precision != "bf16",)


def _states_key(plan: Plan, num_layers: int) -> tuple:
    """What the weights and optimizer bytes of every stage of ``plan`` (:func:`autotune.cost.memory.estimate_memory`:
    the stage's parameters from the layer split, TP, EP x ETP and the end stages' embedding / head, sharded by the
    ZeRO stage over DP x CP and the experts' over the expert-DP group, at the engine's parameter and optimizer
    bytes) depend on: tp, pp, cp, dp, ep, etp, the ZeRO stage, FP8 parameters (the engine's profile for the
    plan) and the layer split; not the precision, recomputation, micro-batch, buckets or overlaps
    (tests/search/test_lazy_ranking.py checks the bytes over those)."""
    return (plan.tp_degree, plan.pp_degree, plan.cp_degree, plan.dp_degree, plan.ep_degree, plan.etp_degree,
            plan.zero_stage, plan.fp8_param_gather, tuple(plan.layers_per_virtual_stage(num_layers)))


#: the plan fields :meth:`CostBuilder.chunk_cost` reads at every ZeRO stage (autotune/cost/chunk_costs.py): all
#: but the bucket size (read only by ``dp_bucket_bytes``, the DP bucket groups), the memory reclaim policy
#: (the step graph's reclaim nodes), the ZeRO stage and the DP overlaps (:func:`_chunk_key`)
_CHUNK_FIELDS = tuple(f.name for f in dataclasses.fields(Plan) if f.name not in (
    "bucket_size_mib", "memory_reclaim", "zero_stage", "dp_grad_reduce_overlap", "param_gather_overlap"))
_chunk_fields = operator.attrgetter(*_CHUNK_FIELDS)
_layer_fields = operator.attrgetter(*LAYER_FIELDS)


def _chunk_key(plan: Plan) -> tuple:
    """What ``plan``'s chunk costs (:func:`autotune.cost.graph.chunk_costs`) depend on: :data:`_CHUNK_FIELDS`,
    and the ZeRO stage with both DP overlaps from ZeRO 2 on; below ZeRO 2 neither the stage (``chunk_cost`` and
    ``CostBuilder.__init__`` test ``zero_stage >= 2`` and ``== 3`` only) nor the overlaps (read only in the
    ZeRO-2/3 gather and reduce-scatter terms) enter them. tests/search/test_lazy_ranking.py checks that plans
    with one key have equal chunk costs."""
    z = plan.zero_stage
    head = (z, plan.dp_grad_reduce_overlap, plan.param_gather_overlap) if z >= 2 else (1, None, None)
    return head + _chunk_fields(plan)


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
        self._hidden: dict[Plan, float] = {}
        self._layer: dict[tuple, float] = {}
        self._kinds_ms: dict[tuple, tuple[float, float | None]] = {}   # per LAYER_FIELDS: (dense, MoE) layer ms
        self._factor: dict[tuple, float] = {}     # layout_bound_ms: (m + (p - 1) / v) x the busiest rank's layers
        self._cbound: dict[tuple, float] = {}     # per _chunk_key
        self._mem: dict[tuple, bool] = {}          # per _memory_key
        self._states: dict[tuple, int] = {}        # per _states_key: the largest stage's weights + optimizer bytes
        self._built: dict[Plan, tuple[CostBuilder, dict[int, Any]]] = {}
        self._memo: dict[Any, Any] = {}     # CostBuilder's per-layer costs and placements, shared
        # ModelSpec.num_dense_layers walks every layer (moe_layer_pattern): once per screen, not per layer_ms
        self._num_dense_layers = model.num_dense_layers

    def fits(self, plan: Plan) -> bool:
        """True when the engine can run ``plan`` (:func:`autotune.spec.engines.check_plan_for_engine`) and
        :func:`autotune.cost.memory.estimate_memory` puts every pipeline stage within the GPU's usable memory
        (False also for a plan the memory model rejects as invalid)."""
        r = self._fits.get(plan)
        if r is None:
            try:
                check_plan_for_engine(plan, self.engine)
                # plans that differ only where estimate_memory does not look share one estimate
                key = _memory_key(plan)
                r = self._mem.get(key)
                if r is None:
                    r = self._mem[key] = self._fits_memory(plan)
            except PlanError:
                r = False
            self._fits[plan] = r
        return r

    def _fits_memory(self, plan: Plan) -> bool:
        """``estimate_memory(plan).fits``, answered False without the estimate when a plan with the same
        :func:`_states_key` had a stage whose weights + optimizer states alone exceed the GPU's capacity: a
        stage's total is those two plus gradients, activations, transient buffers and allocator overhead, each
        >= 0 (:class:`autotune.cost.memory.StageMemory`), so that stage cannot fit either (most plans of an MoE
        model's low-EP layouts: the experts' states do not fit at any recomputation or precision)."""
        skey = _states_key(plan, self.model.num_layers)
        cap = self.cluster.gpu.usable_hbm_bytes
        if self._states.get(skey, 0) > cap:
            return False
        est = estimate_memory(self.model, plan, self.cluster.gpu, self.workload, fragmentation=self._frag,
                              engine=self.engine)
        self._states[skey] = max(st.weights_bytes + st.optimizer_bytes for st in est.stages)
        return est.fits

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

    def _build(self, plan: Plan) -> tuple[CostBuilder, dict[int, Any]]:
        """The plan's :class:`CostBuilder` and per-chunk costs (once per chunk class, graph.chunk_costs)."""
        got = self._built.pop(plan, None)
        if got is not None:
            return got
        cb = CostBuilder(model=self.model, plan=plan, cluster=self.cluster, workload=self.workload,
                         costs=self.costs, engine=self.engine, memo=self._memo)
        return cb, chunk_costs(cb, plan, self.model, cached=True)

    def chunk_bound_ms(self, plan: Plan) -> float:
        """A lower bound (ms) on :meth:`estimate_ms` of ``plan`` and of every plan that differs from it only
        in the DP bucket size or by more recomputation: ``(m + (p - 1) / v)`` x the busiest rank's chunk
        forward + backward costs per micro-batch. ``step_time_from_weights`` is at least its ``F_0 >= (m + (p -
        1) / v) t_mb``; t_mb sums the rank's node durations, which are the chunk costs plus blocking p2p and
        reclaim (>= 0); the bucket size enters only the DP bucket groups, and recomputation only adds to a
        chunk's backward (:meth:`CostBuilder.chunk_cost`). Less a relative 1e-9 for rounding; 0 for a plan
        the cost model rejects. Cached per :func:`_chunk_key` (one bound for every plan with those chunk
        costs)."""
        key = _chunk_key(plan)
        r = self._cbound.get(key)
        if r is None:
            try:
                cb, chunks = self._build(plan)
                self._built[plan] = (cb, chunks)        # its estimate, if asked next, reuses them
                P, v = plan.pp_degree, plan.effective_vpp
                per: dict[int, float] = {}      # chunk_costs shares one ChunkCost per chunk class
                for cc in chunks.values():
                    if id(cc) not in per:
                        per[id(cc)] = cc.fwd_ms + cc.bwd_ms
                busiest = max(sum(per[id(chunks[c * P + k])] for c in range(v)) for k in range(P))
                r = (plan.num_micro_batches + (P - 1) / v) * busiest * (1 - 1e-9)
            except (PlanError, ValueError, ZeroDivisionError):
                r = 0.0
            self._cbound[key] = r
        return r

    def _estimate(self, plan: Plan) -> float:
        cb, chunks = self._build(plan)
        m = plan.num_micro_batches
        # a chunk's DP buckets depend on its parameter count alone: once per chunk class, as chunk_costs does
        # for the chunks (an instance-level memo of CostBuilder.dp_bucket_ms, the same numbers)
        cb.dp_bucket_ms = functools.lru_cache(maxsize=None)(cb.dp_bucket_ms)    # type: ignore[method-assign]
        # the step graph's own numbers (autotune.cost.graph.step_weights): node durations with their exposed
        # TP / CP / ZeRO-3 communication and blocking p2p, DP bucket groups with their ready delays, the
        # optimizer step and the exposed parameter gather; no memory-dependent reclaim here (reserved = 0)
        return step_time_from_weights(plan, step_weights(cb, plan, self.model, m, chunks))

    def hidden_ms(self, plan: Plan) -> float:
        """What exposing every overlapped collective adds to ``plan``'s step, ms: the simulator's own term
        (:func:`autotune.cost.chunk_costs.hidden_comm_ms`; the simulated ``step_time_exposed_ms`` is the step
        time plus it) with this screen's op costs; 0 for a plan the cost model rejects. Cached per plan."""
        r = self._hidden.get(plan)
        if r is None:
            try:
                cb = CostBuilder(model=self.model, plan=plan, cluster=self.cluster, workload=self.workload,
                                 costs=self.costs, engine=self.engine, memo=self._memo)
                r = hidden_comm_ms(cb, plan, self.model)
            except (PlanError, ValueError, ZeroDivisionError):
                r = 0.0
            self._hidden[plan] = r
        return r

    def layer_ms(self, plan: Plan) -> float:
        """One transformer layer's forward + backward time per micro-batch on one rank, ms (a mixture of experts:
        the lesser of a dense and an MoE layer's, a lower bound on either): the sum of
        :class:`CostBuilder`'s per-layer parts (GEMMs, attention, memory-bound kernels, FP8 casts, the
        exposed part of TP / CP communication, recomputation). Cached per the plan fields that
        ``CostBuilder.__init__`` / ``_layer_cost`` read (:data:`LAYER_FIELDS`; tests/search/test_lazy_ranking.py
        checks a cached value against a fresh CostBuilder)."""
        key = _layer_fields(plan)
        r = self._layer.get(key)
        if r is None:
            d, mo = self._layer_kinds_at(key, plan)
            # a mixture of experts: every layer is dense or MoE, so the lesser of the two bounds both
            # (layout_bound_ms multiplies it by a layer count)
            r = d if mo is None else (min(d, mo) if self._num_dense_layers else mo)
            self._layer[key] = r
        return r

    def _layer_kinds_at(self, key: tuple, plan: Plan) -> tuple[float, float | None]:
        """(a dense layer's, an MoE layer's or None for a dense model) forward + backward time per micro-batch of
        ``plan`` (:data:`LAYER_FIELDS` ``key``), ms: :meth:`layer_ms`'s two sums, cached; (0, 0) for a plan the cost
        model rejects."""
        got = self._kinds_ms.get(key)
        if got is None:
            try:
                cb = CostBuilder(model=self.model, plan=plan, cluster=self.cluster, workload=self.workload,
                                 costs=self.costs, engine=self.engine, memo=self._memo)
                lf, lb, _ = cb._layer
                got = (sum(lf.values()) + sum(lb.values()), None)
                if cb._moe_state is not None:
                    mf, mb, _ = cb._moe_state[0]
                    got = (got[0], sum(mf.values()) + sum(mb.values()))
            except (PlanError, ValueError, ZeroDivisionError):
                got = (0.0, 0.0)
            self._kinds_ms[key] = got
        return got

    def kinds_bound_ms(self, plans: list[Plan]) -> float:
        """A mixture-of-experts model's :meth:`layout_bound_ms` with each chunk's dense and MoE layers weighed by
        their own time (:meth:`_layer_kinds_at`) instead of the lesser of the two for every layer: ``(m + (p - 1)
        / v)`` x the busiest rank's sum over its chunks of dense layers x a dense layer's time + MoE layers x an
        MoE layer's (:func:`autotune.cost.moe.chunk_layer_kinds`; the multi-token-prediction layers, the
        embedding and the LM head add to a chunk, >= 0: :meth:`CostBuilder.chunk_cost`), the least over
        ``plans``, less a relative 1e-9. A dense model: :meth:`layout_bound_ms`."""
        if not self.model.is_moe or not plans:
            return self.layout_bound_ms(plans)
        out = float("inf")
        for q in plans:
            d, mo = self._layer_kinds_at(_layer_fields(q), q)
            P, v = q.pp_degree, q.effective_vpp
            kinds = moe.chunk_layer_kinds(self.model, q)
            busiest = max(sum(kinds[c * P + r][0] * d + kinds[c * P + r][1] * (mo or 0.0) for c in range(v))
                          for r in range(P))
            out = min(out, (q.num_micro_batches + (P - 1) / v) * busiest * (1 - 1e-9))
        return out

    def layout_bound_ms(self, plans: list[Plan]) -> float:
        """A lower bound (ms) on :meth:`estimate_ms` of every plan of one layout (same tp, pp, cp, schedule,
        vpp, micro-batch size and so the same dp, micro-batch count and layer split) whose per-layer time
        is at least that of one of ``plans`` (in the layout sampler: one plan per precision, without
        recomputation; recomputation and ZeRO-2/3 only add to a layer or chunk, and the DP, p2p, optimizer
        and parameter-gather terms are >= 0).

        ``step_time_from_weights`` is at least its ``F_0 >= (m + (p - 1) / v) t_mb``, and t_mb (the busiest
        rank's chunk forward + backward node durations) is at least that rank's layers x the layer time:
        chunk costs are the layers' parts x their count plus the embedding / LM head / mixed-precision /
        ZeRO-2/3 terms, all >= 0 (:meth:`CostBuilder.chunk_cost`). Less a relative 1e-9 for rounding."""
        if not plans:
            return 0.0
        p0 = plans[0]
        P, v, m = p0.pp_degree, p0.effective_vpp, p0.num_micro_batches
        key = (p0.stage_layers, P, v, m)        # what the layer split and the bubble factor read
        factor = self._factor.get(key)
        if factor is None:
            layers = p0.layers_per_virtual_stage(self.model.num_layers)
            busiest = max(sum(layers[c * P + r] for c in range(v)) for r in range(P))
            factor = self._factor[key] = (m + (P - 1) / v) * busiest
        layer = min(self.layer_ms(q) for q in plans) if len(plans) > 1 else self.layer_ms(p0)
        return factor * layer * (1 - 1e-9)

    def remember(self, plan: Plan, *, fits: bool, estimate_ms: float) -> None:
        """Record a screen result computed elsewhere (a layout ranking another worker stored), so
        :meth:`fits` / :meth:`estimate_ms` return it without computing."""
        self._fits[plan] = fits
        self._est[plan] = estimate_ms

    def describe(self) -> dict[str, Any]:
        """How many plans were screened (for bench output)."""
        return {"memory_checks": len(self._fits), "estimates": len(self._est)}


__all__ = ["PlanScreen"]
