"""In-flight activations counted from the pipeline schedule (autotune.cost.schedule) against hand counts,
Korthikanti et al. 2022 (arXiv 2205.05198) Sec. 4.2.3 and an independent interval recount."""

from __future__ import annotations

import time

import pytest

from autotune.cost import graph
from autotune.errors import PlanError
from autotune.spec.plan import Plan
from autotune.cost.schedule import _count, count_inflight, saturating_micro_batches, schedule_order


def _plan(p, m, schedule="1f1b", v=1):
    return Plan(pp_degree=p, vpp_degree=v, num_micro_batches=m, pipeline_schedule=schedule)


def _counts(plan, chunk_layers=None):
    return [count_inflight(plan, r, chunk_layers=chunk_layers).num_inflight_microbatches
            for r in range(plan.pp_degree)]


def test_graph_reexports_schedule_order():
    # the step graph builds its stream order with the very function the memory count walks
    assert graph.schedule_order is schedule_order


# Hand-counted table. Each row: plan, layers per virtual stage (None = equal chunks), in-flight per rank.
HAND_TABLE = [
    # 1F1B p=4 m=8: rank r runs p-r-1 warm-up forwards, then F (p-r alive), B (p-r-1), F, B, ...:
    # peak p - r.
    (_plan(4, 8), None, [4, 3, 2, 1]),
    # 1F1B p=4 m=2: warm-up min(p-r-1, m) = 2, 2, 1, 0 forwards. Ranks 0, 1: F0 F1 B0 B1 -> 2;
    # rank 2: F0 | F1 B0 | B1 -> 2; rank 3: F0 B0 F1 B1 -> 1.
    (_plan(4, 2), None, [2, 2, 2, 1]),
    # GPipe p=4 m=8: every rank runs all 8 forwards before any backward -> 8.
    (_plan(4, 8, "gpipe"), None, [8, 8, 8, 8]),
    # p = 1: gradient accumulation, F_i B_i per micro-batch -> 1, whatever the schedule says.
    (_plan(1, 16, "gpipe"), None, [1]),
    (_plan(1, 5), None, [1]),
    (_plan(1, 4, "interleaved_1f1b", 2), (3, 5), [1]),
    # Interleaved p=2 v=2 m=4, Megatron-LM's order (schedule_order): k-th forward = chunk (k//2)%2 of
    # micro-batch (k//4)*2 + k%2; backwards visit chunks reversed. Rank 0: warm-up (2-0-1)*2 + 1*2 = 4:
    #   F(c0,0) F(c0,1) F(c1,0) F(c1,1) | F(c0,2) B(c1,0) F(c0,3) B(c1,1) F(c1,2) B(c0,0) F(c1,3) B(c0,1)
    #   | B(c1,2) B(c1,3) B(c0,2) B(c0,3)
    #   alive (c0, c1): 1,0  2,0  2,1  2,2 | 3,2  3,1  4,1  4,0  4,1  3,1  3,2  2,2 | ... -> peak 5 chunk
    #   passes of half the rank's layers = 2.5 (Korthikanti: p (1 + (p-1)/(p v)) = 2 x 1.25 = 2.5).
    # Rank 1: warm-up 0 + 2 = 2: F(c0,0) F(c0,1) | F(c1,0) B(c1,0) F(c1,1) B(c1,1) F(c0,2) B(c0,0) ...
    #   alive 1,0  2,0 | 2,1  2,0  2,1  2,0  3,0  2,0 ... -> peak 3 -> 1.5 (= p + (p - 2r - 1)/v).
    (_plan(2, 4, "interleaved_1f1b", 2), None, [2.5, 1.5]),
    # Same order, uneven virtual stages (3, 5, 6, 2): rank 0 chunks (3, 6), 9 layers; layers alive
    # along the sequence above 3, 6, 12, 18 | 21, 15, 18, 12, 18, 15, 21, 18 ... -> 21/9.
    # Rank 1 chunks (5, 2), 7 layers: 5, 10 | 12, 10, 12, 10, 15, 10, 15, ... -> 15/7.
    (_plan(2, 4, "interleaved_1f1b", 2), (3, 5, 6, 2), [21 / 9, 15 / 7]),
    # Empty first and last virtual stages (0, 2, 2, 0), as Llama 3 405B's split: rank 0 holds layers
    # only in chunk 1, whose count peaks at 2 (sequence above) -> 2 x 2 / 2 = 2; rank 1 only in chunk
    # 0, whose count peaks at 3 (third F of chunk 0 before its second B) -> 3.
    (_plan(2, 4, "interleaved_1f1b", 2), (0, 2, 2, 0), [2.0, 3.0]),
    # Interleaved with m = p = 2, v = 2 (total 4 chunk passes): rank 0's warm-up min(4, 4) = 4 is the
    # whole step (all F, then all B) -> 4/2 = 2 = m, not Korthikanti's 2.5; rank 1: warm-up 2,
    #   F(c0,0) F(c0,1) | F(c1,0) B(c1,0) F(c1,1) B(c1,1) | B(c0,0) B(c0,1) -> peak 3 -> 1.5.
    (_plan(2, 2, "interleaved_1f1b", 2), None, [2.0, 1.5]),
]


@pytest.mark.parametrize("plan, layers, expected", HAND_TABLE)
def test_hand_counted_table(plan, layers, expected):
    assert _counts(plan, layers) == pytest.approx(expected, abs=1e-12)


def test_chunk_peaks_and_peak_points_interleaved_p2_v2_m4():
    # From the hand count of rank 0 above: chunk 0 peaks at 4 (micro-batches 0..3 before B(c0,0)),
    # chunk 1 at 2. With one layer per chunk, layers alive = a0 + a1; the Pareto-maximal
    # (layers, a0, a1) points after a forward: (5, 3, 2), (5, 4, 1).
    c = count_inflight(_plan(2, 4, "interleaved_1f1b", 2), 0)
    assert c.chunk_peaks == (4, 2)
    assert set(c.peak_points) == {(5, 3, 2), (5, 4, 1)}
    # rank 1: chunk 0 peaks at 3, chunk 1 at 1; points (3, 3, 0) and (3, 2, 1).
    c1 = count_inflight(_plan(2, 4, "interleaved_1f1b", 2), 1)
    assert c1.chunk_peaks == (3, 1)
    assert set(c1.peak_points) == {(3, 3, 0), (3, 2, 1)}


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_korthikanti_1f1b_first_stage_holds_p(p):
    # Korthikanti et al. 2022 Sec. 4.2.3: under 1F1B the first stage holds p micro-batches' activations
    # (m >= p); with m < p it can hold only the m there are.
    for m in (p, 2 * p, 3 * p + 1):
        assert count_inflight(_plan(p, m), 0).num_inflight_microbatches == p
    assert count_inflight(_plan(p, p - 1), 0).num_inflight_microbatches == p - 1


@pytest.mark.parametrize("p, v", [(2, 2), (4, 2), (4, 4), (8, 2), (8, 4), (16, 8)])
def test_korthikanti_interleaved_first_stage(p, v):
    # Korthikanti et al. 2022 Sec. 4.2.3: with interleaving, the first stage's L/p layers hold
    # p (1 + (p-1)/(p v)) micro-batches' activations. The order gives (warm-up w + 1) chunk passes / v
    # with w = 2(p - 1) + (v - 1) p, i.e. (v p + p - 1)/v = p + (p-1)/v: the same, as long as the
    # warm-up is not the whole step, m v >= w + 1, i.e. (m a multiple of p, Megatron-LM's rule) m >= 2p.
    paper = p * (1 + (p - 1) / (p * v))
    for m in (2 * p, 3 * p, 8 * p):
        assert count_inflight(_plan(p, m, "interleaved_1f1b", v), 0).num_inflight_microbatches \
            == pytest.approx(paper, rel=1e-12)
    # m = p: the warm-up covers all m v chunk passes, so the rank holds all m = p micro-batches, below
    # the paper's figure by (p - 1)/v.
    held = count_inflight(_plan(p, p, "interleaved_1f1b", v), 0).num_inflight_microbatches
    assert held == pytest.approx(p) and paper - held == pytest.approx((p - 1) / v)


def _interval_recount(plan, stage, layers):
    """Independent recount: position of each (chunk, micro-batch)'s forward and backward in the order;
    it holds its chunk's layers from its forward up to (not including) its backward. Peak over ops."""
    order = schedule_order(plan, stage, plan.num_micro_batches)
    pos = {op: k for k, op in enumerate(order)}
    n = len(order)
    delta = [0] * (n + 1)
    for (ph, c, i), k in pos.items():
        if ph == "F":
            delta[k] += layers[c]
            delta[pos[("B", c, i)]] -= layers[c]
    best = run = 0
    for k in range(n):
        run += delta[k]
        best = max(best, run)
    return best / sum(layers)


@pytest.mark.parametrize("m", [32, 64])
def test_p16_v8_matches_interval_recount(m):
    # Llama 3 405B's pipeline: p = 16, v = 8, 128 virtual stages of one layer each except the empty
    # first and last (126 layers), and the same with equal chunks.
    p, v = 16, 8
    plan = _plan(p, m, "interleaved_1f1b", v)
    llama3 = (0,) + (1,) * 126 + (0,)
    for split in (llama3, (1,) * 128):
        for r in range(p):
            rank_layers = split[r::p]
            assert count_inflight(plan, r, chunk_layers=split).num_inflight_microbatches \
                == pytest.approx(_interval_recount(plan, r, rank_layers), rel=1e-12)
    # equal chunks: p + (p - 2r - 1)/v (warm-up + 1 chunk passes over v; m >= 2p): rank 0 17.875,
    # rank 15 16 - 15/8 = 14.125 -- the closed form this replaces gave 1 x (1 + 15/(16 m)) = 1.03.
    eq = _counts(plan)
    assert eq == pytest.approx([p + (p - 2 * r - 1) / v for r in range(p)], rel=1e-12)
    # Llama 3 split, by hand. Rank 15 (chunks 0..6 one layer, chunk 7 empty): warm-up (v-1)p = 112
    # chunk passes = chunks 0..6 x 16 micro-batches = 112 layers; then pairs F(k), B(k - 112): F of
    # chunk 7 (empty) with B of chunk 7, then F of chunk 0 (+1 -> 113) with B of chunk 6 (-1), ...
    # so the peak is 113 layers of 7 = 16.14. Rank 0 (chunk 0 empty): after the warm-up of 142 passes
    # chunks 1..7 hold 16 micro-batches each = 112 of 7 layers -> 16.
    c = _counts(plan, llama3)
    assert c[15] == pytest.approx(113 / 7) and c[0] == 16.0


def test_large_m_is_fast_and_exact():
    # m = 2048, p = 16, v = 8: 32,768 chunk passes per rank; the count stays p + (p - 2r - 1)/v.
    plan = _plan(16, 2048, "interleaved_1f1b", 8)
    t0 = time.process_time()        # this process's CPU time: a concurrent load does not count
    got = count_inflight(plan, 3).num_inflight_microbatches
    assert time.process_time() - t0 < 2.0
    assert got == pytest.approx(16 + (16 - 7) / 8)


@pytest.mark.parametrize("sched", ["1f1b", "interleaved_1f1b", "gpipe"])
def test_counts_saturate_at_m0(sched):
    # count_inflight walks min(m, m0) micro-batches (saturating_micro_batches' derivation: the schedule's
    # states repeat with period p v chunk-forwards after the warm-up). Checked against the full walk
    # (_count at m itself) for every rank, p = 1..8, v = 1..4 and m = 1 .. m0 + 2 p v, with equal, uneven
    # and empty-end chunks; GPipe is never truncated (m0 = m).
    for p in range(1, 9):
        for v in (range(1, 5) if sched == "interleaved_1f1b" and p > 1 else (1,)):
            plan0 = _plan(p, 1, sched, v) if v > 1 else _plan(p, 1, sched)
            n = p * v
            splits = [(1,) * n, tuple(1 + (i % 3) for i in range(n)), (0,) + (2,) * (n - 2) + (0,) if n > 2 else (1,) * n]
            m0 = saturating_micro_batches(p, plan0.effective_vpp, sched, 10 ** 6)
            assert (m0 == 10 ** 6) == (sched == "gpipe")
            top = (m0 if sched != "gpipe" else p) + 2 * p * v
            for m in range(1, top + 1):
                plan = plan0.replace(num_micro_batches=m)
                for split in splits:
                    for r in range(p):
                        got = count_inflight(plan, r, chunk_layers=split)
                        full = _count(p, plan.effective_vpp, m, sched, split[r::p], r)
                        assert got == full, (p, v, m, split, r)


def test_errors_name_the_value():
    plan = _plan(4, 8, "interleaved_1f1b", 2)
    with pytest.raises(PlanError, match="valid stages are 0 .. 3"):
        count_inflight(plan, 4)
    with pytest.raises(PlanError, match="chunk_layers has 3 entries; give the rank's 2 chunks or all 8"):
        count_inflight(plan, 0, chunk_layers=(1, 2, 3))
    with pytest.raises(PlanError, match=r"integers >= 0, got \[1, -1\]"):
        count_inflight(plan, 0, chunk_layers=(1, -1))
    with pytest.raises(PlanError, match="num_micro_batches must be an integer >= 1, got 0"):
        count_inflight(plan, 0, num_micro_batches=0)
