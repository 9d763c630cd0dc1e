"""Overlap from its mechanism (issue 22): the timing rules of autotune.cost.overlap derived by hand, the
measured contention table, and what the chunk costs expose for Megatron-LM's userbuffers overlap."""

from __future__ import annotations

import pytest

from autotune.cost import overlap
from autotune.cost.calibration import default_calibration
from autotune.cost.op_costs import CalibratedCosts
from autotune.spec.hardware import get_gpu


def test_ring_exchange_by_hand():
    # n = 4 chunks of 1 ms, a 6 ms all-gather: 3 ring steps of 2 ms each. Timeline: chunk 0 (local, 1 ms),
    # then each of the 3 steps waits max(1, 2) = 2 ms -> 1 + 3 x 2 = 7 ms; compute 4 x 1 = 4; exposed 3
    assert overlap.ring_exchange(1.0, 4, 6.0) == pytest.approx((4.0, 3.0))
    # a short all-gather (3 ms: steps of 1 ms) hides entirely behind 1 ms chunks
    assert overlap.ring_exchange(1.0, 4, 3.0) == pytest.approx((4.0, 0.0))
    # reduce-scatter side: the last send (1 ms) has nothing beside it
    assert overlap.ring_exchange(1.0, 4, 3.0, last_exposed=True) == pytest.approx((4.0, 1.0))
    # copy-engine contention slows each chunk: 1.1 ms chunks, steps 1 ms: 1.1 + 3 x 1.1 = 4.4 = compute
    assert overlap.ring_exchange(1.0, 4, 3.0, slowdown=1.1) == pytest.approx((4.4, 0.0))


def test_pipelined_reduce_scatter_by_hand():
    # Transformer Engine's pipeline: a 8 ms GEMM in 4 splits on the SMs the 16-SM kernel leaves (x1.25):
    # chunks of 2.5 ms; reduce-scatter 4 ms in chunks of 1 ms, each beside the next GEMM chunk, the last
    # exposed: 2.5 + 3 x max(2.5, 1) + 1 = 11 ms; compute 10; exposed 1
    assert overlap.pipelined_reduce_scatter(8.0, 4, 4.0, slowdown=1.25) == pytest.approx((10.0, 1.0))
    # communication-bound: RS 16 ms (4 ms chunks) beside 2 ms chunks: 2 + 3 x 4 + 4 = 18; exposed 10
    assert overlap.pipelined_reduce_scatter(8.0, 4, 16.0, slowdown=1.0) == pytest.approx((8.0, 10.0))


def test_bulk_and_cp_rings_by_hand():
    # bulk: GEMM 4 ms at x1.25 = 5 ms beside a 3 ms collective: hidden; beside 7 ms: 2 ms exposed
    assert overlap.bulk(4.0, 3.0, slowdown=1.25) == pytest.approx((5.0, 0.0))
    assert overlap.bulk(4.0, 7.0, slowdown=1.25) == pytest.approx((5.0, 2.0))
    # K/V ring, cp 4: steps of 1 ms attention, 1.5 ms transfers: 1 + 3 x 1.5 = 5.5 -> exposed 1.5;
    # backward hands the last dK/dV on: + 1.5
    assert overlap.ring_attention(1.0, 4, 1.5) == pytest.approx((4.0, 1.5))
    assert overlap.ring_attention(1.0, 4, 1.5, final_handoff=True) == pytest.approx((4.0, 3.0))
    # an all-gather of K/V hides behind the first (local) step only
    assert overlap.gathered_attention(1.0, 2.5) == (0.0, 1.5)


def test_contention_table_is_the_measured_one():
    # autotune/data/calibration/h200.yaml overlap: medians of bench/derive_contention.py over the 7 GEMMs of
    # >= 0.7 ms in docs/results/contention-h200x1-2026-12-01.json
    costs = CalibratedCosts(profile=default_calibration(), gpu=get_gpu("h200"))
    assert costs.sm_contention(16) == pytest.approx(1.261)
    assert costs.sm_contention(0) == 1.0
    # linear between measured counts: 12 SMs lies half-way between 8 (1.142) and 16 (1.261)
    assert costs.sm_contention(12) == pytest.approx((1.142 + 1.261) / 2)
    assert costs.copy_engine_contention() == pytest.approx(1.055)
    # on B200 (148 SMs) 16 SMs are the share that 16 x 132 / 148 = 14.27 SMs are of an H200's 132
    b200 = CalibratedCosts(profile=default_calibration(), gpu=get_gpu("b200"))
    n = 16 * 132 / 148
    assert b200.sm_contention(16) == pytest.approx(1.142 + (n - 8) / 8 * (1.261 - 1.142))


def test_derive_contention_reproduces_the_shipped_factors():
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("derive_contention", root / "bench" / "derive_contention.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sm, ce, shapes = mod.derive(mod.DEFAULT)
    prof = default_calibration()
    assert sm == dict(prof.overlap_sm_slowdown)
    assert ce == prof.overlap_copy_engine_slowdown
    assert len(shapes) == 7


def test_megatron_tp_overlap_exposes_communication():
    # issue 22: with tp_comm_overlap every H100/B200/GB200 plan exposed 0 ms of TP communication. The
    # Megatron-Bridge 405B H100 FP8 recipe (TP 8, PP 8, CP 2, VPP 8, mbs 1) must now expose some, and its
    # bound with every overlap exposed must exceed the modelled step.
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("published", root / "bench" / "published.py")
    pub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pub)
    # the recipe's configuration (Megatron-Bridge 25.11 performance summary; no result is used here)
    run = {"model": "llama3.1-405b", "gpu": "h100", "gpus": 1024, "precision": "fp8_tensorwise", "seq": 8192,
           "gbs": 512, "mbs": 1, "dp_mode": "ddp", "tp": 8, "pp": 8, "cp": 2, "vp": 8, "recompute": None,
           "_group": "megatron_bridge_25_11"}
    plan, r, _ = pub.predict(run, "megatron", "nvlink4+ib-ndr400", "h100")
    assert plan.tp_comm_overlap and r.feasible
    assert r.breakdown_ms["exposed_tp_comm"] > 0
    assert r.breakdown_ms["exposed_cp_comm"] > 0
    assert r.step_time_exposed_ms > r.step_time_ms
