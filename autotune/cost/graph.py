"""One training step of a plan as a dependency graph (networkx DiGraph).

What the graph holds (one representative rank per pipeline stage: TP, CP and DP ranks of a stage do
identical work, so one stands for all):

* compute nodes ``("F"|"B", stage, chunk, microbatch)``: forward / backward of one model chunk (a
  virtual pipeline stage: ``layers_per_virtual_stage`` transformer layers, plus the embedding on the
  first and the LM head + loss on the last) for one micro-batch on the ``compute`` stream. Their
  duration includes the GEMMs, attention, memory-bound kernels, recomputation (``B`` only) and the
  *exposed* part of the TP/SP, CP and ZeRO-3 collectives issued inside the chunk; each node's
  ``parts`` attribute splits its duration into breakdown keys (see :mod:`autotune.cost.evaluator`);
* communication nodes ``("dp", stage, chunk, k)``: the k-th group of DP gradient buckets of a chunk,
  on the ``dp`` stream when DP reduction overlaps backward (async collectives + dp_grad_reduce_overlap),
  else on the ``compute`` stream after the last backward;
* ``("opt", stage)``, ``("param_gather", stage)``, ``("reclaim", stage)`` at the end of the step;
* edges: data dependencies (``kind="data"``; pipeline send/recv between stages carries its transfer
  time as ``delay_ms``, ``kind="p2p"``), and the stream order of the pipeline schedule
  (``kind="stream"``). A DP bucket group may start once its gradients exist: an edge from the chunk's
  last backward with a negative ``delay_ms`` (gradients are produced evenly over the backward).

Pipeline schedules (order of compute nodes on each stage's compute stream; built by
:func:`autotune.cost.schedule.schedule_order`):
GPipe (all forwards, then all backwards; Huang et al. 2019), 1F1B (PipeDream-Flush; Narayanan et al.
2021, Sec. 2.2: stage r of p warms up with p - r - 1 forwards) and interleaved 1F1B (Narayanan et al.
2021, Sec. 2.2; Megatron-LM's ``forward_backward_pipelining_with_interleaving``: warm-up
(p - r - 1) x 2 + (v - 1) x p chunk-forwards, chunk of the k-th forward (k // p) % v).

Blocking PP send/recv occupies the sender's compute stream (added to its node, ``exposed_pp_comm``);
with async collectives it only delays the receiver (edge ``delay_ms``). p2p link contention is not
modelled.

Costs per op come from an :class:`autotune.cost.calibration.OpCosts`; FLOP and byte counts are written on
each node (``flops``, ``bytes``) so measured evaluators can look the same ops up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import networkx as nx

from autotune.cost.chunk_costs import (
    MAX_DP_GROUPS_PER_CHUNK,
    STREAM_EDGE,
    ChunkCost,
    CostBuilder,
    StepWeights,
    _add,
    chunk_costs,
    hidden_comm_ms,
)
from autotune.cost import moe_layer
from autotune.cost.op_costs import OpCosts
from autotune.cost.schedule import schedule_order  # noqa: F401  (moved there; re-exported here)
from autotune.spec.engines import EngineProfile
from autotune.spec.hardware import ClusterSpec
from autotune.spec.models import ModelSpec
from autotune.spec.plan import Plan, Workload


def step_weights(cb: CostBuilder, plan: Plan, model: ModelSpec, num_micro_batches: int,
                 chunks: dict[int, ChunkCost], reserved_bytes_per_stage: list[float] | None = None) -> StepWeights:
    """Durations, parts and edge delays of the step graph of ``plan`` with ``num_micro_batches``
    micro-batches (module docstring; the rules :func:`build_step_graph` documents), from per-chunk costs
    ``chunks`` (:func:`chunk_costs`)."""
    p = plan
    m = num_micro_batches
    P, v = p.pp_degree, p.effective_vpp
    n_virtual = P * v
    p2p = cb.p2p_ms()
    blocking_p2p = not p.async_collectives
    reclaim_mb = p.memory_reclaim == "empty_cache_per_microbatch"
    # a deferred FSDP reduce-scatter (CostBuilder.deferred_rs) runs after the schedule's last backward
    # and blocks: nothing overlaps it
    overlap_dp = p.async_collectives and p.dp_grad_reduce_overlap and not cb.deferred_rs
    reserved = reserved_bytes_per_stage or [0.0] * P
    compute: dict[tuple[int, str, int], tuple[dict[str, float], float, float]] = {}
    dp_groups: dict[tuple[int, int], tuple[tuple[float, int, float], ...]] = {}
    opt_ms, ag_ms, reclaim_ms = [], [], []
    # Virtual stages of one chunk class share one ChunkCost object (chunk_costs(cached=True)), so a node's
    # (parts, duration, flops) and a chunk's DP bucket groups are computed once per distinct input and
    # reused: the same arithmetic on the same numbers, so the same floats as computing every (stage,
    # chunk) afresh (tests/cost/test_fast_sim.py compares this with the graph built node by node).
    node_memo: dict[tuple, tuple[dict[str, float], float, float]] = {}
    dp_memo: dict[tuple, tuple[tuple[float, int, float], ...]] = {}
    bucket_memo: dict[int, list[float]] = {}
    stage_memo: dict[tuple[int, int, float], tuple[float, float]] = {}
    add_p2p = blocking_p2p and bool(p2p)
    emb_params = model.embedding_params // plan.tp_degree
    chunk_sync = v > 1 and cb.engine.interleaved_chunk_sync     # the engine's per-chunk grad / param sync
    for r in range(P):
        rc_ms = cb.costs.empty_cache_ms(reserved[r] / max(1, p.num_micro_batches)) if reclaim_mb else None
        b_after: dict[int, int] = {}
        if chunk_sync:
            # backward steps of this stage after each chunk's last one (Megatron-LM launches a chunk's grad sync
            # pp_rank backward steps after it, the remaining ones after the schedule's last backward)
            seen = 0
            for phase, c, _ in reversed(schedule_order(p, r, m)):
                if phase == "B":
                    b_after.setdefault(c, seen)
                    seen += 1
        for c in range(v):
            vs = c * P + r
            cc = chunks[vs]
            for phase in ("F", "B"):
                sends = (phase == "F" and vs < n_virtual - 1) or (phase == "B" and vs > 0)
                own = (sends and add_p2p) or (phase == "B" and reclaim_mb)
                key = (id(cc), phase)
                got = None if own else node_memo.get(key)
                if got is None:
                    parts = cc.fwd_parts if phase == "F" else cc.bwd_parts
                    if own:
                        parts = dict(parts)     # shared with the chunk class (read-only) unless something is added
                    if sends and add_p2p:
                        _add(parts, "exposed_pp_comm", p2p)
                    if phase == "B" and reclaim_mb:
                        _add(parts, "reclaim", rc_ms)
                    got = (parts, sum(parts.values()), cc.fwd_flops * (1 if phase == "F" else 2))
                    if not own:         # the chunk class's own dict: shared by its nodes, as before
                        node_memo[key] = got
                compute[r, phase, c] = got
        stage_params = stage_fp8 = stage_experts = 0
        for c in range(v):
            vs = c * P + r
            cc = chunks[vs]
            stage_params += cc.params
            stage_fp8 += cc.fp8_params
            stage_experts += cc.expert_params
            bkey = (cc.params, cc.expert_params)
            buckets = bucket_memo.get(bkey)
            if buckets is None:
                # the dense parameters' buckets over DP x CP, then the routed experts' over the expert-DP group
                buckets = bucket_memo[bkey] = cb.dp_bucket_ms(cc.params) + moe_layer.expert_bucket_ms(cb, cc.expert_params)
            if not buckets:
                continue
            lb_dur = compute[r, "B", c][1]
            launch = min(r, b_after.get(c, 0)) * lb_dur if chunk_sync else 0.0
            key = (id(cc), vs == 0, lb_dur, chunk_sync, launch)
            got = dp_memo.get(key)
            if got is None:
                ngroups = min(len(buckets), MAX_DP_GROUPS_PER_CHUNK)
                per = math.ceil(len(buckets) / ngroups)
                groups = [buckets[k:k + per] for k in range(0, len(buckets), per)]
                # the input embedding's gradient is the last one backward produces (a gather's backward
                # after every layer), so its buckets are ready only when the chunk's backward ends;
                # the layers' and the LM head's come evenly before it
                emb_share = emb_params / cc.params if vs == 0 else 0.0
                done = 0
                out = []
                for grp in groups:
                    done += len(grp)
                    # gradients of the first `done` buckets exist once that share of the backward ran
                    share = min(1.0, done / len(buckets) / (1.0 - emb_share)) if emb_share < 1 else 1.0
                    # Megatron-LM's interleaved schedule keeps grad sync disabled during every backward and
                    # launches a chunk's buckets together, pp_rank backward steps after its last micro-batch's
                    # backward (schedules.py grad_sync_func, grad_sync_microbatch_id = microbatch_id -
                    # pipeline_parallel_rank; those steps costed as this chunk's backward), or after the
                    # schedule's last backward when fewer remain
                    ready = launch if chunk_sync else -(1 - share) * lb_dur
                    out.append((sum(grp), len(grp), ready))
                got = dp_memo[key] = tuple(out)
            dp_groups[r, c] = got
        first_f = compute[r, "F", 0][1] if m else 0.0
        interleaved_ag = chunk_sync and p.param_gather_overlap and p.async_collectives
        if interleaved_ag:
            per_chunk = tuple((chunks[c * P + r].params, chunks[c * P + r].fp8_params, chunks[c * P + r].expert_params,
                               compute[r, "F", c][1] if m else 0.0) for c in range(v))
            skey = ("vpp", per_chunk, min(P, m))
        else:
            skey = (stage_params, stage_fp8, first_f, stage_experts)
        got_s = stage_memo.get(skey)
        if got_s is None:
            if interleaved_ag:
                gathers = [cb.param_gather_ms(n, n8) + moe_layer.expert_param_gather_ms(cb, ne)
                           for n, n8, ne, _ in per_chunk]
                ag = interleaved_param_gather_exposed_ms(gathers, [f for *_, f in per_chunk], min(P, m))
            else:
                ag = cb.param_gather_ms(stage_params, stage_fp8) + moe_layer.expert_param_gather_ms(cb, stage_experts)
                if ag and p.param_gather_overlap and p.async_collectives:
                    # overlapped with the next step's first forward (Megatron-LM --overlap-param-gather)
                    ag = max(0.0, ag - first_f)
            got_s = stage_memo[skey] = (cb.optimizer_ms(stage_params, stage_experts), ag)
        opt_ms.append(got_s[0])
        ag_ms.append(got_s[1])
        if p.memory_reclaim == "empty_cache_per_step":
            reclaim_ms.append(cb.costs.empty_cache_ms(reserved[r]))
    return StepWeights(num_micro_batches=m, p2p_ms=p2p, p2p_delay_ms=0.0 if blocking_p2p else p2p,
                       overlap_dp=overlap_dp, compute=compute, dp_groups=dp_groups, opt_ms=tuple(opt_ms),
                       param_gather_ms=tuple(ag_ms),
                       reclaim_ms=tuple(reclaim_ms) if p.memory_reclaim == "empty_cache_per_step" else None)


def interleaved_param_gather_exposed_ms(gathers: list[float], forwards: list[float], group: int) -> float:
    """Exposed time of the overlapped ZeRO-1/2 parameter all-gather of an interleaved (virtual-pipeline)
    stage, ms: how much later the stage's warm-up forwards end than without any gather.

    ``gathers[c]``: the all-gather of model chunk c's parameters (ms); ``forwards[c]``: one forward
    micro-batch of chunk c (ms); ``group``: the micro-batches of a chunk run back to back in the warm-up
    (Megatron-LM ``microbatch_group_size_per_vp_stage``, default the pipeline degree, at most m).

    The mechanism is Megatron-LM's ``--overlap-param-gather`` under
    ``forward_backward_pipelining_with_interleaving`` (megatron/core/pipeline_parallel/schedules.py):
    chunks 0 and 1 are synchronised before the schedule starts ("Synchronize params for first two model
    chunks": ``param_sync_func[0]`` and ``[1]``), and chunk c >= 2 is launched when the first micro-batch
    of chunk c - 1 starts its forward (``param_sync_chunk_id = get_model_chunk_id(...) + 1``, at the same
    time across the pipeline group). The gathers run in that order on one DP stream. Chunk 0's gather
    overlaps its first forward (bucket by bucket, the forward pre-hooks of
    megatron/core/distributed/distributed_data_parallel.py), as the single-chunk rule
    (``max(0, gather - forward)``); chunk c >= 1 starts when its gather has finished and the previous
    chunk's ``group`` forwards have run. With one chunk this is that single-chunk rule exactly.
    """
    v = len(gathers)
    dp_done = 0.0
    t = 0.0                 # compute clock of the warm-up forwards
    start_prev = 0.0        # when the previous chunk's first forward started
    ideal = 0.0
    for c in range(v):
        launch = 0.0 if c < 2 else start_prev
        dp_done = max(dp_done, launch) + gathers[c]
        if c == 0:
            start = 0.0
            t = max(forwards[0], dp_done) + (group - 1) * forwards[0]
        else:
            start = max(t, dp_done)
            t = start + group * forwards[c]
        start_prev = start
        ideal += group * forwards[c]
    return max(0.0, t - ideal)


@dataclass(frozen=True)
class StepStructure:
    """Nodes and edges of a step graph without its numbers (:class:`StepWeights` has those).

    Attributes:
        nodes: per node, (node id, kind, stage, chunk, microbatch, stream, weight key), in the order
            :func:`build_step_graph` adds them. Weight keys: ``("c", stage, phase, chunk)`` a compute
            node, ``("dp", stage, chunk, k)`` the k-th DP bucket group, ``("opt", stage)``,
            ``("ag", stage)`` the parameter gather, ``("rc", stage)`` the per-step reclaim.
        edges: per edge, (from index, to index, kind, delay key), in insertion order; delay keys: ``0``
            (0 ms), ``"p2p"`` (:attr:`StepWeights.p2p_delay_ms`), ``("dp", stage, chunk, k)`` (that
            group's ready delay).
    """

    nodes: tuple[tuple[Any, str, int, int, int, str, tuple], ...]
    edges: tuple[tuple[int, int, str, Any], ...]


_STRUCTURES: dict[tuple, StepStructure] = {}
#: bound on the cached structures, in nodes (each has ~2 x pp x vpp x m): the cache is emptied when a new
#: one would pass it. With its compiled form (autotune.cost.simulator.compile_structure) a cached node takes
#: ~0.8 KB (tracemalloc: 4.0 MiB for a 5,152-node 405B graph, pp 16, vpp 8, m 16), so ~250 MB at most.
MAX_CACHED_NODES = 300_000
#: structures kept, at most (also a bound for the compiled-structure cache)
MAX_CACHED_STRUCTURES = 256
_cached_nodes = 0


def step_structure(plan: Plan, weights: StepWeights) -> StepStructure:
    """The structure of the step graph of ``plan`` with ``weights`` (cached per
    :meth:`StepWeights.structure_key`, bounded by :data:`MAX_CACHED_NODES`)."""
    global _cached_nodes
    key = weights.structure_key(plan)
    s = _STRUCTURES.get(key)
    if s is None:
        s = _make_structure(plan, weights)
        if len(_STRUCTURES) >= MAX_CACHED_STRUCTURES or _cached_nodes + len(s.nodes) > MAX_CACHED_NODES:
            _STRUCTURES.clear()
            _cached_nodes = 0
        _STRUCTURES[key] = s
        _cached_nodes += len(s.nodes)
    return s


def _make_structure(plan: Plan, w: StepWeights) -> StepStructure:
    p = plan
    m = w.num_micro_batches
    P, v = p.pp_degree, p.effective_vpp
    n_virtual = P * v
    nodes: list[tuple[Any, str, int, int, int, str, tuple]] = []
    index: dict[Any, int] = {}
    edges: list[tuple[Any, Any, str, Any]] = []     # by node id, resolved to indices at the end
    overlap_dp = w.overlap_dp

    def add_node(n: Any, kind: str, r: int, c: int, i: int, stream: str, wkey: tuple) -> None:
        index[n] = len(nodes)
        nodes.append((n, kind, r, c, i, stream, wkey))

    for r in range(P):
        prev = None
        last_b: dict[int, tuple] = {}
        order = schedule_order(p, r, m)
        last_pos: dict[int, int] = {}
        for pos, (phase, c, i) in enumerate(order):
            node = (phase, r, c, i)
            add_node(node, "fwd" if phase == "F" else "bwd", r, c, i, "compute", ("c", r, phase, c))
            if prev is not None:
                edges.append((prev, node, "stream", 0))
            prev = node
            if phase == "B":
                last_b[c] = node
                last_pos[c] = pos
        # data dependencies across virtual stages (send/recv)
        for phase, c, i in order:
            vs = c * P + r
            node = (phase, r, c, i)
            if phase == "F":
                if vs > 0:
                    edges.append((("F", (vs - 1) % P, (vs - 1) // P, i), node, "p2p", "p2p"))
            elif vs < n_virtual - 1:
                edges.append((("B", (vs + 1) % P, (vs + 1) // P, i), node, "p2p", "p2p"))
            else:
                edges.append((("F", r, c, i), node, "data", 0))
        # end of step: DP gradient buckets, optimizer, parameter all-gather, reclaim
        tail = prev
        dp_nodes = []
        # the DP stream reduces the chunks in the order their last backward ends (Megatron-LM's interleaved
        # schedule launches a chunk's grad sync after its last micro-batch's backward, schedules.py
        # grad_sync_func; the backward runs the chunks from v - 1 down to 0), not in chunk-index order, which
        # would hold every chunk's reduction behind chunk 0's, the step's last backward
        for c in sorted(range(v), key=lambda c: last_pos.get(c, -1)):
            for k, _ in enumerate(w.dp_groups.get((r, c), ())):
                node = ("dp", r, c, k)
                add_node(node, "dp_reduce", r, c, m - 1, "dp" if overlap_dp else "compute", ("dp", r, c, k))
                if overlap_dp:
                    edges.append((last_b[c], node, "data", ("dp", r, c, k)))
                dp_nodes.append(node)
        chain = tail
        if overlap_dp:      # dp stream: buckets run in order, beside the compute stream
            for a, b in zip(dp_nodes, dp_nodes[1:]):
                edges.append((a, b, "stream", 0))
        else:               # blocking: after the last backward, on the compute stream
            for node in dp_nodes:
                edges.append((chain, node, "stream", 0))
                chain = node
        opt = ("opt", r)
        add_node(opt, "optimizer", r, -1, -1, "compute", ("opt", r))
        edges.append((chain, opt, "stream", 0))
        if overlap_dp and dp_nodes:
            edges.append((dp_nodes[-1], opt, "data", 0))
        last = opt
        if w.param_gather_ms[r]:
            node = ("param_gather", r)
            add_node(node, "param_gather", r, -1, -1, "compute", ("ag", r))
            edges.append((last, node, "stream", 0))
            last = node
        if w.reclaim_ms is not None:
            node = ("reclaim", r)
            add_node(node, "reclaim", r, -1, -1, "compute", ("rc", r))
            edges.append((last, node, "stream", 0))
    return StepStructure(nodes=tuple(nodes),
                         edges=tuple((index[a], index[b], kind, d) for a, b, kind, d in edges))


def weight_of(weights: StepWeights, wkey: tuple) -> tuple[float, dict[str, float], float]:
    """(duration_ms, parts, flops) of the node with weight key ``wkey`` (:class:`StepStructure`)."""
    tag = wkey[0]
    if tag == "c":
        parts, dur, flops = weights.compute[wkey[1], wkey[2], wkey[3]]
        return dur, parts, flops
    if tag == "dp":
        dur = weights.dp_groups[wkey[1], wkey[2]][wkey[3]][0]
        return dur, {"exposed_dp_comm": dur}, 0.0
    if tag == "opt":
        dur = weights.opt_ms[wkey[1]]
        return dur, {"optimizer": dur}, 0.0
    if tag == "ag":
        dur = weights.param_gather_ms[wkey[1]]
        return dur, {"exposed_dp_comm": dur}, 0.0
    dur = weights.reclaim_ms[wkey[1]]            # "rc"
    return dur, {"reclaim": dur}, 0.0


def delay_of(weights: StepWeights, dkey: Any) -> float:
    """``delay_ms`` of an edge with delay key ``dkey`` (:class:`StepStructure`)."""
    if dkey == 0:
        return 0.0
    if dkey == "p2p":
        return weights.p2p_delay_ms
    return weights.dp_groups[dkey[1], dkey[2]][dkey[3]][2]


def build_step_graph(*, model: ModelSpec, plan: Plan, cluster: ClusterSpec, workload: Workload,
                     costs: OpCosts, num_micro_batches: int | None = None,
                     reserved_bytes_per_stage: list[float] | None = None,
                     builder: CostBuilder | None = None,
                     engine: EngineProfile | str | None = "native") -> nx.DiGraph:
    """Build the step graph (module docstring). ``num_micro_batches`` overrides the plan's count
    (the simulator uses it to extrapolate long pipelines); ``reserved_bytes_per_stage`` sizes the
    cost of re-allocating after ``empty_cache``.

    The numbers come from :func:`step_weights` (every virtual stage's :meth:`CostBuilder.chunk_cost`
    computed on its own), the nodes and edges from :func:`step_structure`.

    Returns:
        A DiGraph with graph attributes ``plan``, ``num_micro_batches``, ``p2p_ms``; node attributes
        ``kind``, ``stage``, ``chunk``, ``microbatch``, ``stream``, ``duration_ms``, ``parts``,
        ``flops`` (DP groups also ``num_buckets``); edge attributes ``kind`` and ``delay_ms``.
    """
    cb = builder or CostBuilder(model=model, plan=plan, cluster=cluster, workload=workload, costs=costs,
                                engine=engine)
    m = num_micro_batches or plan.num_micro_batches
    w = step_weights(cb, plan, model, m, chunk_costs(cb, plan, model), reserved_bytes_per_stage)
    s = _make_structure(plan, w)
    import networkx as nx   # only the graph path (evaluator.fast = False) needs it

    g = nx.DiGraph(plan=plan, num_micro_batches=m, p2p_ms=w.p2p_ms)
    node_list = []
    for n, kind, r, c, i, stream, wkey in s.nodes:
        dur, parts, flops = weight_of(w, wkey)
        attrs = {"kind": kind, "stage": r, "chunk": c, "microbatch": i, "stream": stream, "duration_ms": dur,
                 "parts": parts, "flops": flops}
        if wkey[0] == "dp":
            attrs["num_buckets"] = w.dp_groups[wkey[1], wkey[2]][wkey[3]][1]
        node_list.append((n, attrs))
    g.add_nodes_from(node_list)
    ids = [n[0] for n in s.nodes]
    zero = {"stream": STREAM_EDGE, "data": {"kind": "data", "delay_ms": 0.0}}
    p2p_attr = {"kind": "p2p", "delay_ms": w.p2p_delay_ms}
    edge_list = []
    for a, b, kind, dkey in s.edges:
        if dkey == 0:
            attr = zero[kind]
        elif dkey == "p2p":
            attr = p2p_attr
        else:
            attr = {"kind": kind, "delay_ms": delay_of(w, dkey)}
        edge_list.append((ids[a], ids[b], attr))
    g.add_edges_from(edge_list)
    return g
