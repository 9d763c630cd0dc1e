"""MeasuredCosts: exact lookups, interpolation, collective cost model and fallback, hand-checked."""

from __future__ import annotations


import pytest

from autotune.cost.op_costs import CalibratedCosts
from autotune.cost.calibration import default_calibration
from autotune.spec.hardware import LinkSpec, get_fabric, get_gpu, make_cluster
from autotune.spec.models import get_model
from autotune.spec.plan import Plan, Workload
from autotune.profiling import store as S
from autotune.profiling.measured import (MeasuredCosts, collective_time_ms, interp_attention_tflops,
                                         interp_gemm_tflops, interp_log)
from profiling_fixtures import ENV

NVLINK4 = get_fabric("nvlink4").intra_node  # 450 GB/s, 4 us, tier nvlink
PCIE5 = get_fabric("pcie5").intra_node      # 63 GB/s, tier host


def test_interp_log_hand_values():
    # halfway in log2 between 2^10 and 2^12 is 2^11
    assert interp_log([2**10, 2**12], [100.0, 200.0], 2**11) == 150.0
    assert interp_log([2**10, 2**12], [100.0, 200.0], 2) == 100.0       # clamped below
    assert interp_log([2**10, 2**12], [100.0, 200.0], 2**20) == 200.0   # clamped above
    with pytest.raises(ValueError):
        interp_log([], [], 1.0)


def test_interp_gemm_log_volume():
    pts = [(1024, 1024, 1024, 500.0), (2048, 2048, 2048, 800.0)]  # volumes 2^30 and 2^33
    # (2048, 1024, 1024): volume 2^31, one third of the way in log2 -> 500 + 300/3 = 600
    assert interp_gemm_tflops(pts, 2048, 1024, 1024) == pytest.approx(600.0)
    # equal volumes are averaged: (4096, 256, 1024) and (1024, 1024, 1024) both 2^30
    assert interp_gemm_tflops(pts + [(4096, 256, 1024, 300.0)], 1024, 1024, 1024) == pytest.approx(400.0)


def test_interp_attention_log_seq_and_nearest_heads():
    rows = [(4096, 32, 128, 400.0), (16384, 32, 128, 600.0), (4096, 8, 128, 100.0)]
    # seq 8192 is halfway in log2 between 4096 and 16384 -> 500
    assert interp_attention_tflops(rows, seq_len=8192, heads=32, head_dim=128) == pytest.approx(500.0)
    # heads 24: |log2 24 - 5| = 0.415 < |log2 24 - 3| = 1.585 -> the 32-head rows
    assert interp_attention_tflops(rows, seq_len=4096, heads=24, head_dim=128) == pytest.approx(400.0)
    assert interp_attention_tflops(rows, seq_len=4096, heads=4, head_dim=128) == pytest.approx(100.0)


def test_collective_cost_model_hand_computed():
    curve = [(2**30, 331.0)]
    # all-reduce of 1 GiB over 8 ranks at busbw 331 GB/s: 2 x 7/8 x 2^30 / 331e9 s, plus the extra ring
    # latency steps (NCCL tuning.cc nsteps = 2(n-1)) 2 x 7 - 2 x 1 = 12 at 5 us.
    bw_s = 2 * 7 / 8 * 2**30 / 331e9
    assert collective_time_ms("all_reduce", 2**30, 8, curve=curve, measured_group=2, latency_us=0.0) == \
        pytest.approx(bw_s * 1e3)
    assert collective_time_ms("all_reduce", 2**30, 8, curve=curve, measured_group=2, latency_us=5.0) == \
        pytest.approx(bw_s * 1e3 + 12 * 5e-3)
    # all-gather over 4 ranks: (3/4) S / busbw, ring latency steps (n-1) - 1 = 2
    assert collective_time_ms("all_gather", 2**30, 4, curve=curve, measured_group=2, latency_us=5.0) == \
        pytest.approx(0.75 * 2**30 / 331e6 + 2 * 5e-3)
    # all-to-all over 8: (7/8) S / busbw + (7 - 1) pairwise steps
    assert collective_time_ms("all_to_all", 2**30, 8, curve=curve, measured_group=2, latency_us=5.0) == \
        pytest.approx(7 / 8 * 2**30 / 331e6 + 6 * 5e-3)
    # half the link bandwidth -> twice the bandwidth term
    assert collective_time_ms("send_recv", 2**30, 2, curve=curve, measured_group=2, latency_us=5.0,
                              bandwidth_scale=0.5) == pytest.approx(2 * 2**30 / 331e6)
    assert collective_time_ms("all_reduce", 2**30, 1, curve=curve, measured_group=2, latency_us=5.0) == 0.0


@pytest.fixture
def costs(populated, url):
    s, env = populated
    S.record(s, env, "gemm", m=512, n=256, k=128, pass_="fwd", median_ms=0.1, tflops=1.0, repeats=1)
    S.record(s, env, "gemm", m=512, n=256, k=128, pass_="dgrad", median_ms=0.2, tflops=1.0, repeats=1)
    S.record(s, env, "gemm", m=512, n=256, k=128, pass_="wgrad", median_ms=0.3, tflops=1.0, repeats=1)
    c = MeasuredCosts(gpu=get_gpu("h200"), storage=url, measure=False)
    yield c
    c.close()


def test_gemm_lookup_backward_mapping_and_interpolation(costs):
    assert costs.gemm_ms(1024, 1024, 1024) == 1.0
    # the simulator asks dgrad of forward (m, n, k) as (m, k, n) and wgrad as (k, n, m)
    assert costs.gemm_ms(512, 128, 256, backward=True) == 0.2
    assert costs.gemm_ms(128, 256, 512, backward=True) == 0.3
    # (4096, 1024, 1024): volume 2^32 beyond the largest stored fwd volume 2^31 (2048x1024x1024 in 1.5 ms):
    # clamped rate -> twice the FLOPs in twice the time = 3.0 ms
    assert costs.gemm_ms(4096, 1024, 1024) == pytest.approx(3.0)
    assert costs.provenance()["ops"] == {"measured": 0, "looked_up": 3, "interpolated": 1, "fallback": 0}


def test_attention_memory_overlap_reclaim(costs):
    assert costs.attention_ms(batch=1, seq_len=8192, heads=32, kv_heads=8, head_dim=128) == 3.0
    assert costs.attention_ms(batch=1, seq_len=8192, heads=32, kv_heads=8, head_dim=128, backward=True) == 6.0
    # seq 16384 beyond the stored 8192 (3 ms): same rate, 4x the FLOPs -> 12 ms; batch 2 -> 24 ms
    assert costs.attention_ms(batch=1, seq_len=16384, heads=32, kv_heads=8, head_dim=128) == pytest.approx(12.0)
    assert costs.attention_ms(batch=2, seq_len=16384, heads=32, kv_heads=8, head_dim=128) == pytest.approx(24.0)
    # memory-bound: 2^27 B halfway (log2) between 2^26 @ 1000 and 2^28 @ 2000 GB/s -> 1500 GB/s
    assert costs.memory_bound_ms(2**27) == pytest.approx(2**27 / 1.5e12 * 1e3)
    assert costs.memory_bound_ms(2**28) == pytest.approx(2**28 / 2e12 * 1e3)
    assert costs.overlap_slowdown() == 0.15
    assert costs.empty_cache_ms(2 * 2**30) == pytest.approx(3.0 + 0.25 * 2)
    ops = costs.provenance()["ops"]
    assert ops["looked_up"] == 3 and ops["interpolated"] == 3


def test_collectives_lookup_group_extrapolation_and_scaling(costs):
    assert costs.collective_ms("all_reduce", 2**30, 2, NVLINK4) == pytest.approx(2**30 / 331e6)
    # 8 ranks: the store measured 2, the shipped calibration's nvlink tier 4 (group_curves, published 4x H100
    # nccl-tests: all-reduce busbw 355.35 GB/s at 1 GiB), so the larger group's curve:
    # 2 x 7/8 x 2^30 / 355.35e9 s + (2 x 7 - 2 x 3 = 8) ring steps x 4 us
    assert costs.collective_ms("all_reduce", 2**30, 8, NVLINK4) == \
        pytest.approx(2 * 7 / 8 * 2**30 / 355.35e6 + 8 * 4e-3)
    # a tier without larger groups (host) extrapolates the store's 2-rank curve: 16 MiB at 28 GB/s,
    # 2 x 7/8 x 2^24 / 28e9 s + (14 - 2) ring steps x 10 us (pcie5)
    assert costs.collective_ms("all_reduce", 2**24, 8, PCIE5) == pytest.approx(2 * 7 / 8 * 2**24 / 28e6 + 12 * 10e-3)
    # all-gather was not measured: the all-reduce bus bandwidth curve with all-gather's factor 1/2
    assert costs.collective_ms("all_gather", 2**30, 2, NVLINK4) == pytest.approx(0.5 * 2**30 / 331e6)
    # a link at half the nominal 450 GB/s halves the bus bandwidth
    half = LinkSpec(name="half", bandwidth_gbs=225, latency_us=4, gpus_per_node=8, calibration_tier="nvlink")
    assert costs.collective_ms("all_reduce", 2**30, 2, half) == pytest.approx(2 * 2**30 / 331e6)
    # host tier (pcie5 = nominal 63 GB/s): 16 MiB all-reduce measured at 28 GB/s
    assert costs.collective_ms("all_reduce", 2**24, 2, PCIE5) == pytest.approx(2**24 / 28e6)
    # sockets never measured here -> the shipped calibration
    eth = get_fabric("nvlink4+eth100").inter_node
    ref = CalibratedCosts(profile=default_calibration(), gpu=get_gpu("h200"))
    assert costs.collective_ms("all_reduce", 2**24, 4, eth) == ref.collective_ms("all_reduce", 2**24, 4, eth)
    assert costs.collective_ms("all_reduce", 2**24, 1, NVLINK4) == 0.0
    assert costs.provenance()["ops"] == {"measured": 0, "looked_up": 2, "interpolated": 3, "fallback": 2}


def test_no_environment_for_gpu_falls_back_to_calibration(populated, url):
    c = MeasuredCosts(gpu=get_gpu("b200"), storage=url, measure=False)
    ref = CalibratedCosts(profile=default_calibration(), gpu=get_gpu("b200"))
    assert c.env is None
    assert c.gemm_ms(8192, 8192, 8192) == ref.gemm_ms(8192, 8192, 8192)
    assert c.attention_ms(batch=1, seq_len=8192, heads=32, kv_heads=8, head_dim=128) == \
        ref.attention_ms(batch=1, seq_len=8192, heads=32, kv_heads=8, head_dim=128)
    assert c.memory_bound_ms(2**30) == ref.memory_bound_ms(2**30)
    assert c.overlap_slowdown() == ref.overlap_slowdown()
    assert c.provenance()["ops"]["fallback"] == 3
    c.close()


def test_measured_evaluator_backend_and_provenance(url, populated):
    from autotune.profiling.measured import MeasuredEvaluator
    from autotune.cost.simulator import SimulatedEvaluator

    model, cluster = get_model("8b"), make_cluster("h200", 8)
    w = Workload(seq_len=8192, global_batch_size=32)
    plan = Plan(tp_degree=8, micro_batch_size=1, num_micro_batches=32)
    ev = MeasuredEvaluator(model=model, cluster=cluster, workload=w, storage=url, measure=False)
    r = ev.evaluate(plan)
    assert r.backend == "measured" and r.feasible and r.step_time_ms > 0
    src = r.details["op_sources"]
    assert set(src) == {"measured", "looked_up", "interpolated", "fallback"}
    assert src["measured"] == 0 and src["interpolated"] > 0
    assert r.details["costs"]["ops"] == src  # first plan: cumulative == this plan
    ev.close()
    # with nothing stored for the GPU, the measured evaluator must agree with the simulated one exactly
    empty = f"{url}.empty"
    ev2 = MeasuredEvaluator(model=model, cluster=make_cluster("b200", 8), workload=w, storage=empty, measure=False)
    # (the simulated evaluator without the calibration's in-training factors: the measured evaluator
    # does not apply them, its stored ops being timed on the GPU for the exact shapes)
    from autotune.cost.op_costs import CalibratedCosts
    from autotune.cost.calibration import CalibrationProfile, default_calibration
    raw = {k: v for k, v in default_calibration().raw.items() if k != "in_training"}
    plain = CalibratedCosts(profile=CalibrationProfile.from_dict(raw), gpu=make_cluster("b200", 8).gpu)
    sim = SimulatedEvaluator(model=model, cluster=make_cluster("b200", 8), workload=w, costs=plain)
    assert ev2.evaluate(plan).step_time_ms == pytest.approx(sim.evaluate(plan).step_time_ms)
    ev2.close()


def test_one_gpu_environment_borrows_collectives_of_the_same_gpu(populated, url):
    s, env2 = populated
    one = S.get_or_create_environment(s, S.EnvironmentInfo(**{**ENV.to_dict(), "gpu_count": 1}))
    S.record(s, one, "gemm", m=64, n=64, k=64, pass_="fwd", median_ms=0.5, tflops=1.0, repeats=1)
    # same versions, other count: find_environment prefers the exact count, else the largest count
    assert S.find_environment(s, S.EnvironmentInfo(**{**ENV.to_dict(), "gpu_count": 1})).id == one.id
    assert S.find_environment(s, S.EnvironmentInfo(**{**ENV.to_dict(), "gpu_count": 4})).id == env2.id
    assert S.find_environment(s, S.EnvironmentInfo(**{**ENV.to_dict(), "torch": "2.12"})) is None
    c = MeasuredCosts(gpu=get_gpu("h200"), storage=url, measure=False, environment_id=one.id)
    assert c.gemm_ms(64, 64, 64) == 0.5
    assert c.collective_ms("all_reduce", 2**30, 2, NVLINK4) == pytest.approx(2**30 / 331e6)
    assert c.overlap_slowdown() == 0.15
    assert c.provenance()["environment_ids"] == {"collective": env2.id, "overlap": env2.id, "reclaim": env2.id}
    c.close()
