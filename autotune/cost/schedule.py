"""Pipeline schedules: the compute-stream order of each pipeline rank, and the activations it keeps alive.

:func:`schedule_order` is the order the step graph (:mod:`autotune.cost.graph`) puts a rank's forward and
backward chunk passes in: GPipe (all forwards, then all backwards; Huang et al. 2019), 1F1B
(PipeDream-Flush; Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", Sec. 2.2.1: stage r of p warms up with p - r - 1 forwards) and interleaved
1F1B (same paper, Sec. 2.2.2; Megatron-LM ``megatron/core/pipeline_parallel/schedules.py``,
``forward_backward_pipelining_with_interleaving``: warm-up (p - r - 1) x 2 + (v - 1) x p
chunk-forwards, chunk of the k-th forward (k // p) % v).

:func:`count_inflight` walks that same order and counts, after every op, the micro-batches whose
activations the rank still holds (forwards done minus backwards done, per chunk). The memory model
(:func:`autotune.cost.memory.inflight_microbatches`, :func:`autotune.cost.memory.estimate_memory`) takes its
in-flight counts from here, so memory and step time always describe the same schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from autotune.errors import PlanError
from autotune.spec.plan import PIPELINE_SCHEDULES, Plan


# ----------------------------------------------------------------------------- schedules
def schedule_order(plan: Plan, stage: int, num_micro_batches: int) -> list[tuple[str, int, int]]:
    """Compute-stream order of stage ``stage``: a list of (``"F"``|``"B"``, chunk, micro-batch).

    Chunk c of stage r is virtual stage c x p + r.
    """
    p, m = plan.pp_degree, num_micro_batches
    if plan.pipeline_schedule == "gpipe" or p == 1 and plan.pipeline_schedule == "gpipe":
        return [("F", 0, i) for i in range(m)] + [("B", 0, i) for i in range(m)]
    v = plan.effective_vpp
    if v == 1:
        warm = min(p - stage - 1, m)
        order = [("F", 0, i) for i in range(warm)]
        f, b = warm, 0
        while f < m:
            order.append(("F", 0, f)); f += 1
            order.append(("B", 0, b)); b += 1
        order += [("B", 0, i) for i in range(b, m)]
        return order
    # interleaved 1F1B (Megatron-LM): k-th chunk-forward runs chunk (k // p) % v of micro-batch
    # (k // (p v)) p + k % p; backwards visit chunks in reverse order.
    total = m * v

    def fwd_id(k: int) -> tuple[int, int]:
        return (k // p) % v, (k // (p * v)) * p + k % p

    def bwd_id(k: int) -> tuple[int, int]:
        c, i = fwd_id(k)
        return v - 1 - c, i

    warm = min((p - stage - 1) * 2 + (v - 1) * p, total)
    order = [("F",) + fwd_id(k) for k in range(warm)]
    f, b = warm, 0
    while f < total:
        order.append(("F",) + fwd_id(f)); f += 1
        order.append(("B",) + bwd_id(b)); b += 1
    order += [("B",) + bwd_id(k) for k in range(b, total)]
    return order


# ----------------------------------------------------------------------------- in-flight count
@dataclass(frozen=True)
class InflightCount:
    """Activations a pipeline rank keeps alive over one step of its schedule.

    Counted by :func:`count_inflight` from :func:`schedule_order`: after every op of the rank's
    compute stream, chunk c holds a_c = (forwards of c done) - (backwards of c done) micro-batches.

    Attributes:
        stage: pipeline rank, 0 = first.
        chunk_layers: transformer layers of each of the rank's chunks (chunk c = virtual stage
            c x p + stage), length = the schedule's chunks per rank (``plan.effective_vpp``).
        num_inflight_microbatches: peak over the step of sum_c a_c x layers_c / sum_c layers_c, in
            units of "the rank's whole set of layers for one micro-batch" (float: uneven or
            interleaved chunks give fractions). A rank without layers weighs its chunks equally.
        chunk_peaks: peak of a_c over the step, per chunk (micro-batches, int).
        peak_points: the Pareto-maximal (layers alive = sum_c a_c x layers_c, a_0, a_last) triples over
            the step, a_last = a_{v-1} (the last chunk; on rank p-1 it holds the LM head). The peak of
            any byte total that grows with each coordinate (layers' activations, rank 0's embedding
            output kept per chunk-0 micro-batch, rank p-1's in-flight logits) is reached at one of them.
    """

    stage: int
    chunk_layers: tuple[int, ...]
    num_inflight_microbatches: float
    chunk_peaks: tuple[int, ...]
    peak_points: tuple[tuple[int, int, int], ...]


def _grad_accumulation_order(v: int, m: int) -> list[tuple[str, int, int]]:
    """p = 1: each micro-batch's forward through all chunks, then its backward (no pipeline)."""
    order: list[tuple[str, int, int]] = []
    for i in range(m):
        order += [("F", c, i) for c in range(v)]
        order += [("B", c, i) for c in reversed(range(v))]
    return order


def _pareto(points: set[tuple[int, int, int]]) -> tuple[tuple[int, int, int], ...]:
    kept: list[tuple[int, int, int]] = []
    for pt in sorted(points, reverse=True):     # a dominating point sorts before what it dominates
        if not any(k[0] >= pt[0] and k[1] >= pt[1] and k[2] >= pt[2] for k in kept):
            kept.append(pt)
    return tuple(kept)


@lru_cache(maxsize=4096)
def _count(p: int, v: int, m: int, schedule: str, chunk_layers: tuple[int, ...], stage: int) -> InflightCount:
    if p == 1:
        order = _grad_accumulation_order(v, m)
    else:
        plan = Plan(pp_degree=p, vpp_degree=v, num_micro_batches=m, pipeline_schedule=schedule)
        order = schedule_order(plan, stage, m)
    weights = chunk_layers if sum(chunk_layers) > 0 else (1,) * v
    alive = [0] * v
    peaks = [0] * v
    held = 0                      # sum_c alive_c x weights_c
    last = v - 1
    points: set[tuple[int, int, int]] = set()
    for phase, c, _ in order:
        if phase == "F":
            a = alive[c] + 1
            alive[c] = a
            held += weights[c]
            if a > peaks[c]:
                peaks[c] = a
            points.add((held, alive[0], alive[last]))
        else:                     # a backward frees; every point after it is below the one before it
            alive[c] -= 1
            held -= weights[c]
    frontier = _pareto(points)
    if sum(chunk_layers) > 0:
        frontier_out = frontier
    else:                         # no layers: nothing is held per layer, keep the chunk counts
        frontier_out = _pareto({(0, a0, al) for _, a0, al in frontier})
    peak = max(h for h, _, _ in frontier) / sum(weights) if frontier else 0.0
    return InflightCount(stage=stage, chunk_layers=chunk_layers, num_inflight_microbatches=peak,
                         chunk_peaks=tuple(peaks), peak_points=frontier_out)


def count_inflight(plan: Plan, stage: int, *, chunk_layers: Sequence[int] | None = None,
                   num_micro_batches: int | None = None) -> InflightCount:
    """Count the activations pipeline rank ``stage`` keeps alive, from its :func:`schedule_order`.

    Walking the rank's compute-stream order, after each op chunk c holds a_c = forwards done -
    backwards done micro-batches; the rank holds sum_c a_c x layers_c / sum_c layers_c micro-batches'
    worth of its layers, and the peak over the step is the in-flight count. Exact for GPipe (m), 1F1B
    (min(p - r, m)) and interleaved 1F1B (min(w + 1, m v) chunk-forwards with w = (p - r - 1) x 2 +
    (v - 1) p before the first backward; with equal chunks that is p + (p - 2r - 1)/v when
    m v >= w + 1, Korthikanti et al. 2022, arXiv 2205.05198, Sec. 4.2.3 for r = 0; uneven chunks
    weigh their layers). p = 1 runs no pipeline schedule (the runtime builds one only when
    pp_degree > 1, ``autotune/runtime/parallelize.py``): gradient accumulation, each micro-batch's
    backward right after its forward, so 1 whatever the schedule. Where m = p under interleaving,
    :func:`schedule_order` still gives the later ranks their (p - r - 1) x 2 + (v - 1) p warm-up,
    while Megatron-LM core 0.7 (``schedules.py``: ``if num_microbatches == pipeline_parallel_size``
    -> ``all_warmup_microbatches``) runs every rank all-forward-then-backward (count m); the count
    follows the order the step graph simulates.

    Cost: O(2 m v) per rank (one pass over the order), cached per (p, v, m, schedule, chunk layers,
    stage); measured 23 ms for one rank at p = 16, v = 8, m = 2048 (32,768 ops; 2-core CPU of this
    project's dev machine), microseconds once cached.

    Args:
        plan: supplies pp_degree = p, effective_vpp = v, pipeline_schedule and num_micro_batches.
        stage: pipeline rank r in 0 .. p-1.
        chunk_layers: transformer layers of the rank's v chunks (chunk c = virtual stage c x p + r),
            or of all p x v virtual stages in model order (``plan.layers_per_virtual_stage(L)``);
            default: equal chunks.
        num_micro_batches: overrides ``plan.num_micro_batches`` (m).

    Returns:
        :class:`InflightCount` (peak in-flight count, per-chunk peaks, peak points).

    Raises:
        PlanError: stage outside 0 .. p-1, num_micro_batches < 1, chunk_layers of the wrong length
            or with negative entries.
    """
    p, v = plan.pp_degree, plan.effective_vpp
    m = plan.num_micro_batches if num_micro_batches is None else num_micro_batches
    if not isinstance(stage, int) or not 0 <= stage < p:
        raise PlanError(f"pipeline stage {stage!r} does not exist; valid stages are 0 .. {p - 1}")
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise PlanError(f"num_micro_batches must be an integer >= 1, got {m!r}")
    if plan.pipeline_schedule not in PIPELINE_SCHEDULES:     # Plan validates it; kept for safety
        raise PlanError(f"pipeline_schedule={plan.pipeline_schedule!r} is not valid; choose one of "
                        f"{', '.join(PIPELINE_SCHEDULES)}")
    if chunk_layers is None:
        layers = (1,) * v
    else:
        cl = tuple(chunk_layers)
        if len(cl) == p * v:
            cl = cl[stage::p]
        elif len(cl) != v:
            raise PlanError(f"chunk_layers has {len(cl)} entries; give the rank's {v} chunks or all "
                            f"{p * v} virtual stages (pp_degree={p} x {v} chunks per rank)")
        if any(not isinstance(x, int) or isinstance(x, bool) or x < 0 for x in cl):
            raise PlanError(f"chunk_layers must be integers >= 0, got {list(cl)}")
        layers = cl
    return _count(p, v, min(m, saturating_micro_batches(p, v, plan.pipeline_schedule, m)), plan.pipeline_schedule,
                  layers, stage)


def saturating_micro_batches(p: int, v: int, schedule: str, m: int) -> int:
    """A micro-batch count m0 such that :func:`count_inflight` is the same for every m >= m0 (``m`` itself
    where no such count exists: GPipe holds all m).

    Derivation (the walk of :func:`schedule_order`; in-flight points are taken after forwards only):

    * p = 1 (gradient accumulation): each micro-batch's chunks go 0 -> 1 -> 0; every micro-batch repeats
      the first one's states: m0 = 1.
    * 1F1B: rank r warms up with w = min(p - r - 1, m) forwards, then alternates F, B, so after any
      forward past the warm-up it holds w + 1; with m >= p - r every state is reached: m0 = p.
    * Interleaved 1F1B: the k-th chunk-forward runs chunk (k // p) % v and the k-th chunk-backward chunk
      v - 1 - (k // p) % v, both periodic in k with period p v, each chunk p times per period. After
      forward k >= w (the warm-up, w <= 2 (p - 1) + (v - 1) p) the rank has done k + 1 forwards and
      k - w backwards, so chunk c holds the same count after forward k + p v as after forward k. Every
      state is therefore reached within the first w + p v chunk-forwards, i.e. once m v >= w + p v:
      m0 = p + ceil((2 (p - 1) + (v - 1) p) / v).

    tests/cost/test_schedule.py checks count(m) = count(min(m, m0)) by the full walk for p <= 8, v <= 4
    and m up to m0 + 2 p v. A step of 405B at 1,024 GPUs has m up to 2,048: the walk is O(m v) per rank.
    """
    if schedule == "gpipe":
        return m
    if p == 1:
        return 1
    if v == 1:
        return p
    return p + -(-(2 * (p - 1) + (v - 1) * p) // v)
