"""Simulate a step graph and the simulated evaluator.

The simulation is an earliest-start schedule of the graph with each stream's order fixed (the stream
edges): a node starts when every predecessor has finished (plus the edge's ``delay_ms``) and runs for
``duration_ms``. On a DAG this is the longest path from the sources, computed in topological order.

Long pipelines are extrapolated, not approximated: once a (1F1B or interleaved) schedule is past its
warm-up, each further round of ``p`` micro-batches adds the same time (the steady state repeats), so
the step time for ``m`` micro-batches is ``T(m1) + (m - m1) / p x (T(m1 + p) - T(m1))`` with
``m1 = 2p``; both graphs are simulated in full, and tests check the result equals the full simulation. ``extrapolated`` in the
result's details says when this was used.

Fast path (what :class:`SimulatedEvaluator` uses; ``evaluator.fast = False`` builds the networkx graph
instead): the graph's numbers (:func:`autotune.cost.graph.step_weights`) are computed per plan, its structure
(:func:`autotune.cost.graph.step_structure`: nodes, edges, streams; a function of pp, vpp, schedule, m, the DP
bucket groups and which tail nodes exist) is built once and cached, then compiled once into the visit
order and predecessor lists :func:`simulate_graph` would use (:func:`compile_structure`), and
:func:`simulate_structure` runs the same recurrence over plain lists. Same floats, same order of sums:
tests/cost/test_fast_sim.py compares both paths; 267 plans of three 405B / 70B studies gave bit-identical
step times, MFU and breakdowns (2026-12-01). Measured on the project's 2-core dev machine: a 405B x 1,024
B200 trial's evaluation went from ~0.3 s to ~25 ms CPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    import networkx as nx

from autotune.cost.calibration import CalibrationProfile, default_calibration
from autotune.cost.evaluator import BREAKDOWN_KEYS, Evaluator, StepResult
from autotune.cost.flops import model_flops_per_token, recompute_flops_per_token
from autotune.cost.graph import (
    MAX_CACHED_NODES,
    MAX_CACHED_STRUCTURES,
    CostBuilder,
    StepStructure,
    StepWeights,
    build_step_graph,
    chunk_costs,
    delay_of,
    hidden_comm_ms,
    step_structure,
    step_weights,
    weight_of,
)
from autotune.cost.memory import estimate_memory
from autotune.cost.op_costs import CalibratedCosts, OpCosts
from autotune.spec.engines import EngineProfile, check_plan_for_engine
from autotune.spec.hardware import ClusterSpec
from autotune.spec.models import ModelSpec
from autotune.spec.plan import Plan, Workload, validate_plan


@dataclass(frozen=True)
class Timeline:
    """Result of simulating one step graph.

    Attributes:
        step_time_ms: when the last node finishes, ms.
        start_ms / finish_ms: per node, ms.
        breakdown_ms: per stage, the step time split into :data:`BREAKDOWN_KEYS`.
    """

    step_time_ms: float
    start_ms: Mapping[Any, float]
    finish_ms: Mapping[Any, float]
    breakdown_ms: tuple[Mapping[str, float], ...]


def _stage_breakdowns(busy, wait_pp, wait_dp, step: float, num_stages: int) -> list[dict[str, float]]:
    """Per stage: its busy parts (ms) plus the waits on P2P and DP, and the rest of the step as bubble."""
    breakdowns = []
    for st in range(num_stages):
        b = dict(busy[st])
        b["exposed_pp_comm"] += wait_pp[st]
        b["exposed_dp_comm"] += wait_dp[st]
        b["bubble"] = max(0.0, step - sum(v for k, v in b.items() if k != "bubble"))
        breakdowns.append(b)
    return breakdowns


def simulate_graph(g: nx.DiGraph) -> Timeline:
    """Earliest-start times of every node (see module docstring) and a per-stage breakdown.

    The breakdown of a stage attributes its compute-stream time to the parts each node carries;
    idle time on the compute stream is ``bubble``, except the part of a wait caused by a send/recv
    delay (``exposed_pp_comm``) or by DP buckets still in flight before the optimizer
    (``exposed_dp_comm``). The parts of a stage add up to the step time.
    """
    start: dict[Any, float] = {}
    finish: dict[Any, float] = {}
    nodes = g.nodes
    pred = g._pred      # the adjacency dict behind g.pred (read-only use; avoids view overhead)
    num_stages = 1 + max((d["stage"] for _, d in nodes(data=True)), default=0)
    wait_pp = [0.0] * num_stages
    wait_dp = [0.0] * num_stages
    busy = [dict.fromkeys(BREAKDOWN_KEYS, 0.0) for _ in range(num_stages)]
    part_counts: dict[tuple[int, int], int] = {}
    part_refs: dict[tuple[int, int], Mapping[str, float]] = {}
    ndata = g._node     # node attribute dicts (read-only use)
    import networkx as nx   # only the graph path (evaluator.fast = False) needs it

    for n in nx.topological_sort(g):
        d = ndata[n]
        s = 0.0
        s_local = 0.0       # ready time ignoring cross-stream waits (for wait attribution)
        cause = None
        for u, e in pred[n].items():
            fu = finish[u]
            t = fu + e["delay_ms"]
            du = ndata[u]
            if t > s:
                s = t
                cause = e["kind"], du["stream"]
            if fu > s_local and (e["kind"] == "stream" or (du["stream"] == d["stream"] and du["stage"] == d["stage"])):
                s_local = fu
        start[n] = s
        finish[n] = s + d["duration_ms"]
        if d["stream"] == "compute":
            st = d["stage"]
            parts = d["parts"]          # shared between nodes of one (phase, chunk): count, sum later
            key = (st, id(parts))
            if key in part_counts:
                part_counts[key] += 1
            else:
                part_counts[key] = 1
                part_refs[key] = parts
            gap = s - s_local
            if gap > 0 and cause is not None:
                if cause[0] == "p2p":
                    wait_pp[st] += min(gap, g.graph.get("p2p_ms", 0.0))
                elif cause[1] == "dp":
                    wait_dp[st] += gap
    step = max(finish.values(), default=0.0)
    for (st, _), cnt in part_counts.items():
        b = busy[st]
        for k, v in part_refs[(st, _)].items():
            b[k] += v * cnt
    breakdowns = _stage_breakdowns(busy, wait_pp, wait_dp, step, num_stages)
    return Timeline(step_time_ms=step, start_ms=start, finish_ms=finish, breakdown_ms=tuple(breakdowns))


@dataclass(frozen=True)
class CompiledStructure:
    """A :class:`autotune.cost.graph.StepStructure` prepared for :func:`simulate_structure`: nodes in the
    order :func:`simulate_graph` visits them (networkx ``topological_sort`` of the same graph:
    generation by generation, nodes and successors in insertion order), predecessors as index lists.

    Attributes:
        program: per node in that order, (node index, predecessors, weight-key index, compute-stream
            flag, stage); predecessors as (index, delay-key index, cause, local): cause 1 = a p2p edge,
            2 = another edge from a ``dp``-stream node, 0 = neither; local = a stream edge or one from
            the same stream and stage (:func:`simulate_graph`'s wait attribution).
        wkeys / dkeys: the distinct weight and delay keys (indexed by the program).
        part_counts: per (stage, weight-key index) of compute-stream nodes, in first-visit order: how
            many nodes carry those parts.
        num_stages: pipeline stages.
    """

    program: tuple[tuple[int, tuple[tuple[int, int, int, bool], ...], int, bool, int], ...]
    wkeys: tuple[tuple, ...]
    dkeys: tuple[Any, ...]
    part_counts: tuple[tuple[int, int, int], ...]
    num_stages: int


_COMPILED: dict[int, tuple[StepStructure, CompiledStructure]] = {}
_compiled_nodes = [0]


def compile_structure(s: StepStructure) -> CompiledStructure:
    """Prepare ``s`` for :func:`simulate_structure` (cached per structure object)."""
    got = _COMPILED.get(id(s))
    if got is not None and got[0] is s:
        return got[1]
    if len(_COMPILED) >= MAX_CACHED_STRUCTURES or _compiled_nodes[0] + len(s.nodes) > MAX_CACHED_NODES:
        _COMPILED.clear()           # the same bounds as autotune.cost.graph's structure cache
        _compiled_nodes[0] = 0
    _compiled_nodes[0] += len(s.nodes)
    nodes = s.nodes
    n = len(nodes)
    # DiGraph semantics: a repeated (u, v) edge keeps its first position and takes the later attributes
    pred: list[dict[int, tuple[str, Any]]] = [{} for _ in range(n)]
    succ: list[dict[int, None]] = [{} for _ in range(n)]
    for a, b, kind, dkey in s.edges:
        pred[b][a] = (kind, dkey)
        succ[a][b] = None
    wkey_idx: dict[tuple, int] = {}
    dkey_idx: dict[Any, int] = {0: 0, "p2p": 1}
    # networkx topological_sort (topological_generations): zero in-degree nodes in insertion order, then
    # each generation's children in successor order as their in-degree reaches zero
    indeg = [len(pr) for pr in pred]
    order: list[int] = []
    gen = [i for i in range(n) if indeg[i] == 0]
    while gen:
        order.extend(gen)
        nxt = []
        for u in gen:
            for c in succ[u]:
                indeg[c] -= 1
                if indeg[c] == 0:
                    nxt.append(c)
        gen = nxt
    if len(order) != n:
        raise ValueError("step graph has a cycle")       # never for graphs built by autotune.cost.graph
    program = []
    counts: dict[tuple[int, int], int] = {}
    for i in order:
        _, _, st, _, _, stream, wkey = nodes[i]
        wi = wkey_idx.setdefault(wkey, len(wkey_idx))
        preds = []
        for u, (kind, dkey) in pred[i].items():
            di = dkey_idx.setdefault(dkey, len(dkey_idx))
            ustream, ust = nodes[u][5], nodes[u][2]
            cause = 1 if kind == "p2p" else (2 if ustream == "dp" else 0)
            local = kind == "stream" or (ustream == stream and ust == st)
            preds.append((u, di, cause, local))
        compute = stream == "compute"
        if compute:
            counts[st, wi] = counts.get((st, wi), 0) + 1
        program.append((i, tuple(preds), wi, compute, st))
    num_stages = 1 + max((nd[2] for nd in nodes), default=0)
    cs = CompiledStructure(program=tuple(program), wkeys=tuple(wkey_idx), dkeys=tuple(dkey_idx),
                           part_counts=tuple((st, wi, c) for (st, wi), c in counts.items()),
                           num_stages=num_stages)
    _COMPILED[id(s)] = (s, cs)
    return cs


def simulate_structure(s: StepStructure, w: StepWeights) -> tuple[float, tuple[dict[str, float], ...]]:
    """The step time (ms) and per-stage breakdowns :func:`simulate_graph` gives for the graph
    :func:`autotune.cost.graph.build_step_graph` builds from ``s`` and ``w``, without building it: the same
    earliest-start recurrence, visit order and sums (so the same floats), over plain lists.
    tests/cost/test_fast_sim.py checks the two agree."""
    cs = compile_structure(s)
    wvals = [weight_of(w, k) for k in cs.wkeys]
    dur = [x[0] for x in wvals]
    delays = [delay_of(w, k) for k in cs.dkeys]
    p2p_ms = w.p2p_ms
    num_stages = cs.num_stages
    wait_pp = [0.0] * num_stages
    wait_dp = [0.0] * num_stages
    finish = [0.0] * len(s.nodes)
    for n, preds, wi, compute, st in cs.program:
        t_start = 0.0
        s_local = 0.0
        cause = 0
        for u, di, cc, local in preds:
            fu = finish[u]
            t = fu + delays[di]
            if t > t_start:
                t_start = t
                cause = cc
            if fu > s_local and local:
                s_local = fu
        finish[n] = t_start + dur[wi]
        if compute and cause:
            gap = t_start - s_local
            if gap > 0:
                if cause == 1:
                    wait_pp[st] += min(gap, p2p_ms)
                else:
                    wait_dp[st] += gap
    step = max(finish, default=0.0)
    busy = [dict.fromkeys(BREAKDOWN_KEYS, 0.0) for _ in range(num_stages)]
    for st, wi, cnt in cs.part_counts:
        b = busy[st]
        for k, v in wvals[wi][1].items():
            b[k] += v * cnt
    breakdowns = _stage_breakdowns(busy, wait_pp, wait_dp, step, num_stages)
    return step, tuple(breakdowns)


class SimulatedEvaluator(Evaluator):
    """Predicts a plan's step time by simulating its step graph with calibrated op costs (no GPU).

    Args (keyword-only):
        model, cluster, workload: see :class:`autotune.cost.evaluator.Evaluator`.
        calibration: a :class:`CalibrationProfile`; default: the shipped H200 profile.
        costs: an :class:`OpCosts` to use instead (the measured evaluator passes its own).

    ``evaluate`` validates the plan (``PlanError`` if invalid), estimates memory per stage
    (:func:`autotune.cost.memory.estimate_memory`; a plan that does not fit returns ``feasible=False``
    without simulating), builds the graph (:func:`autotune.cost.graph.build_step_graph`) and simulates it.
    """

    backend = "simulated"

    def __init__(self, *, model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                 calibration: CalibrationProfile | None = None, costs: OpCosts | None = None,
                 engine: EngineProfile | str | None = None) -> None:
        super().__init__(model=model, cluster=cluster, workload=workload, engine=engine)
        self.calibration = calibration or default_calibration()
        self.costs = costs or CalibratedCosts(profile=self.calibration, gpu=cluster.gpu)
        self.graph_build_ms = 0.0       # building graphs (all plans so far), ms
        self.num_graphs = 0
        self.simulated_ms = 0.0         # building + simulating the graphs of feasible plans, ms
        self.num_simulated_plans = 0
        #: simulate through :func:`simulate_structure` (structures cached, no networkx graph; the same
        #: results as building and simulating the graph, tests/cost/test_fast_sim.py); False = the graph
        self.fast = True

    def evaluate(self, plan: Plan) -> StepResult:
        model, cluster, w = self.model, self.cluster, self.workload
        warnings = validate_plan(plan, model, cluster.num_gpus, w, gpus_per_node=cluster.gpus_per_node,
                                 gpu=cluster.gpu)
        check_plan_for_engine(plan, self.engine)
        mem = estimate_memory(model, plan, cluster.gpu, w, fragmentation=self.costs.fragmentation(),
                              engine=self.engine)
        per_stage = tuple(int(s.total_bytes) for s in mem.stages)
        details: dict[str, Any] = {"costs": dict(self.costs.provenance()), "warnings": list(warnings),
                                   "engine": self.engine.name}
        if mem.peak_bytes > mem.capacity_bytes:
            # fits or not, the verdict compares the live bytes (MemoryEstimate.fits): say so where they differ
            details["memory_live_peak_bytes"] = int(mem.live_peak_bytes)
            details["memory_capacity_bytes"] = int(mem.capacity_bytes)
        if not mem.fits:
            st = max(mem.stages, key=lambda x: x.total_bytes - x.allocator_overhead_bytes)
            reason = (f"out of memory: pipeline stage {st.stage} needs {mem.live_peak_bytes / 2**30:.1f} GiB "
                      f"per GPU (weights {st.weights_bytes / 2**30:.1f}, grads {st.grads_bytes / 2**30:.1f}, "
                      f"optimizer {st.optimizer_bytes / 2**30:.1f}, activations "
                      f"{st.activations_bytes / 2**30:.1f}, other {st.transient_bytes / 2**30:.1f}; "
                      f"{st.total_bytes / 2**30:.1f} with the allocator's cached reserve) but "
                      f"{mem.capacity_bytes / 2**30:.1f} GiB are usable on {cluster.gpu.name}")
            return StepResult(backend=self.backend, feasible=False, step_time_ms=0.0, mfu=0.0, mfu_palm=0.0,
                              hfu=0.0, tokens_per_s_per_gpu=0.0, tflops_per_gpu=0.0,
                              peak_memory_bytes=int(mem.peak_bytes), memory_per_stage_bytes=per_stage,
                              infeasible_reason=reason, details=details)
        t0 = time.perf_counter()
        step_ms, breakdown, extra = self._simulate(plan, [float(s) for s in per_stage])
        self.simulated_ms += (time.perf_counter() - t0) * 1e3
        self.num_simulated_plans += 1
        details.update(extra)
        return make_result(backend=self.backend, model=model, cluster=cluster, workload=w, plan=plan,
                           step_time_ms=step_ms, breakdown_ms=breakdown, peak_memory_bytes=int(mem.peak_bytes),
                           memory_per_stage_bytes=per_stage, details=details)

    def build_graph(self, plan: Plan, num_micro_batches: int | None = None,
                    reserved_bytes_per_stage: list[float] | None = None,
                    builder: CostBuilder | None = None) -> nx.DiGraph:
        """The step graph of ``plan`` (see :mod:`autotune.cost.graph`)."""
        t0 = time.perf_counter()
        g = build_step_graph(model=self.model, plan=plan, cluster=self.cluster, workload=self.workload,
                             costs=self.costs, num_micro_batches=num_micro_batches,
                             reserved_bytes_per_stage=reserved_bytes_per_stage, builder=builder,
                             engine=self.engine)
        self.graph_build_ms += (time.perf_counter() - t0) * 1e3
        self.num_graphs += 1
        return g

    def step_timeline(self, plan: Plan) -> tuple[nx.DiGraph, Timeline]:
        """The full step graph of ``plan`` (every micro-batch, no extrapolation) and its simulated
        :class:`Timeline` (start/finish of every node, ms): what ``autotune simulate --trace`` draws.

        Raises:
            PlanError: an invalid plan. ConfigError: the plan does not fit in memory (nothing to draw).
        """
        from autotune.errors import ConfigError

        validate_plan(plan, self.model, self.cluster.num_gpus, self.workload,
                      gpus_per_node=self.cluster.gpus_per_node, gpu=self.cluster.gpu)
        check_plan_for_engine(plan, self.engine)
        mem = estimate_memory(self.model, plan, self.cluster.gpu, self.workload,
                              fragmentation=self.costs.fragmentation(), engine=self.engine)
        if not mem.fits:
            raise ConfigError(f"the plan does not fit in memory (it needs {mem.live_peak_bytes / 2**30:.1f} GiB "
                              f"per GPU without the allocator's reserve): no step to draw")
        g = self.build_graph(plan, plan.num_micro_batches, [float(s.total_bytes) for s in mem.stages])
        return g, simulate_graph(g)

    def _simulate(self, plan: Plan, reserved: list[float]) -> tuple[float, dict[str, float], dict[str, Any]]:
        p, m = plan.pp_degree, plan.num_micro_batches
        cb = CostBuilder(model=self.model, plan=plan, cluster=self.cluster, workload=self.workload,
                         costs=self.costs, engine=self.engine)
        # past 2p micro-batches every schedule here is in its steady state; from p it may not be yet
        # (an interleaved 405B plan on 8 stages added 872 ms per round of 8 from 8 to 16 micro-batches
        # and 890 ms from 16 on), so extrapolate from 2p and 3p
        m1 = 2 * p
        if self.fast:
            chunks = chunk_costs(cb, plan, self.model, cached=True)

            def run(mm: int) -> tuple[float, tuple[Mapping[str, float], ...]]:
                t0 = time.perf_counter()
                w = step_weights(cb, plan, self.model, mm, chunks, reserved)
                st = step_structure(plan, w)
                self.graph_build_ms += (time.perf_counter() - t0) * 1e3
                self.num_graphs += 1
                return simulate_structure(st, w)
        else:
            def run(mm: int) -> tuple[float, tuple[Mapping[str, float], ...]]:
                tl = simulate_graph(self.build_graph(plan, mm, reserved, cb))
                return tl.step_time_ms, tl.breakdown_ms
        if p == 1 or m <= m1 + p:
            step, bds = run(m)
            extrapolated = False
        else:
            step1, bds1 = run(m1)
            step2, bds2 = run(m1 + p)
            rounds = (m - m1) / p
            step = step1 + rounds * (step2 - step1)
            bds = []
            for b1, b2 in zip(bds1, bds2):
                b = {k: b1[k] + rounds * (b2[k] - b1[k]) for k in BREAKDOWN_KEYS if k != "bubble"}
                b["bubble"] = max(0.0, step - sum(b.values()))     # idle time is what the rest leaves
                bds.append(b)
            extrapolated = True
        # report the busiest stage (most non-idle time); ties -> the first stage
        crit = max(range(len(bds)), key=lambda i: (step - bds[i]["bubble"], -i))
        breakdown = {k: float(bds[crit][k]) for k in BREAKDOWN_KEYS}
        hidden = hidden_comm_ms(cb, plan, self.model)
        return step, breakdown, {"extrapolated": extrapolated, "breakdown_stage": crit,
                                 "hidden_comm_ms": hidden, "step_time_exposed_ms": step + hidden}


def make_result(*, backend: str, model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan: Plan,
                step_time_ms: float, breakdown_ms: Mapping[str, float], peak_memory_bytes: int,
                memory_per_stage_bytes: tuple[int, ...], details: Mapping[str, Any]) -> StepResult:
    """A feasible :class:`StepResult` with MFU/HFU/throughput derived from a step time (autotune.cost.flops)."""
    tokens = workload.global_batch_tokens
    n, peak = cluster.num_gpus, cluster.gpu.bf16_tflops
    step_s = step_time_ms / 1e3
    flops_causal = model_flops_per_token(model, workload.seq_len) * tokens
    flops_palm = model_flops_per_token(model, workload.seq_len, causal=False) * tokens
    flops_recompute = recompute_flops_per_token(model, workload.seq_len, plan.recompute) * tokens
    if getattr(plan, "partial_recompute", False):
        # recompute_num_layers N >= 1: only min(N, L_c) layers of each chunk re-run their forward
        layers = plan.layers_per_virtual_stage(model.num_layers)
        flops_recompute *= sum(plan.recomputed_layers(n) for n in layers) / model.num_layers
    denom = step_s * n * peak * 1e12
    return StepResult(backend=backend, feasible=True, step_time_ms=step_time_ms, mfu=flops_causal / denom,
                      mfu_palm=flops_palm / denom, hfu=(flops_causal + flops_recompute) / denom,
                      tokens_per_s_per_gpu=tokens / step_s / n, tflops_per_gpu=flops_causal / step_s / n / 1e12,
                      peak_memory_bytes=peak_memory_bytes, memory_per_stage_bytes=memory_per_stage_bytes,
                      breakdown_ms=dict(breakdown_ms), details=dict(details),
                      step_time_exposed_ms=float(details.get("step_time_exposed_ms", 0.0)))
