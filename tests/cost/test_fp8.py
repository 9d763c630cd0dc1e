"""FP8 precision and torch.compile as plan settings: validation, cost model, memory, export."""

import dataclasses
import logging
import math

import pytest
import yaml

from autotune.cost.op_costs import CalibratedCosts
from autotune.cost.calibration import default_calibration
from autotune.spec.engines import get_engine
from autotune.errors import PlanError
from autotune.cost.graph import CostBuilder
from autotune.spec.hardware import get_gpu, make_cluster
from autotune.cost.memory import activation_bytes_per_layer, estimate_memory
from autotune.spec.models import ModelSpec, get_model
from autotune.spec.plan import PRECISIONS, Plan, PlanDocument, Workload, validate_plan
from autotune.report.summary import format_best_plan, launch_hints
from autotune.search.space import SearchSpace
from autotune.cost.simulator import SimulatedEvaluator

M8 = get_model("8b")
W1 = Workload(seq_len=8192, global_batch_size=1)


def fixture_profile(**overrides):
    """The shipped profile with fixed GEMM tables, so the hand derivations below stay valid when the
    shipped profile is re-measured: the BF16 rows measured on 2x H200 on 2026-11-30 and design.md's FP8
    tensorwise rows of 2026-12-01 (1x H200), no rowwise table, no quantize or compiled-kernel tables, no
    in-training factors, and the 2026-11-30 generic memory-bound bandwidth."""
    from autotune.cost.calibration import CalibrationProfile

    d = dict(default_calibration().raw)
    d["gemm"] = [[512, 4096, 4096, 560.12], [2048, 4096, 4096, 711.32], [8192, 2304, 16384, 781.5],
                 [8192, 4096, 4096, 804.34], [8192, 4096, 14336, 768.92], [8192, 6144, 4096, 804.83],
                 [8192, 8192, 8192, 790.1], [8192, 13312, 16384, 821.26], [8192, 16384, 6656, 765.25],
                 [8192, 28672, 4096, 816.12], [8192, 128256, 4096, 693.3]]
    d["gemm_backward_factor"] = 1.0231
    d["gemm_fp8"] = {"tensorwise": [[8192, 14336, 4096, 1436.0], [8192, 4096, 14336, 1396.0],
                                    [8192, 6144, 4096, 1299.0], [8192, 8192, 8192, 1378.0]]}
    d["memory_bound_bandwidth_gbs"] = 2465.6
    d.pop("in_training", None)           # stand-alone kernel rates: the hand derivations below use them
    for k in ("quantize", "memory_bound_ops_compiled"):
        d.pop(k, None)
    d.update(overrides)
    return CalibrationProfile.from_dict(d, source="test fixture")


FIXTURE = fixture_profile()
H200 = CalibratedCosts(profile=FIXTURE, gpu=get_gpu("h200"))

# Which precision each GPU runs, from the datasheets (gpus.yaml arch): FP8 tensor cores from Hopper
# (H100/H200), MXFP8 only on Blackwell (B200/GB200); A100 (Ampere) neither.
EXPECTED_OK = {
    "a100-80gb": {"bf16"},
    "h100": {"bf16", "fp8_tensorwise", "fp8_rowwise", "fp8_delayed"},
    "h200": {"bf16", "fp8_tensorwise", "fp8_rowwise", "fp8_delayed"},
    "b200": set(PRECISIONS),
    "gb200": set(PRECISIONS),
}


@pytest.mark.parametrize("gpu", sorted(EXPECTED_OK))
@pytest.mark.parametrize("precision", PRECISIONS)
def test_precision_by_gpu(gpu, precision):
    plan = Plan(dp_degree=8, precision=precision)
    w = Workload(seq_len=8192, global_batch_size=8)
    if precision in EXPECTED_OK[gpu]:
        validate_plan(plan, M8, 8, w, gpu=get_gpu(gpu))
    else:
        with pytest.raises(PlanError, match=rf"^precision={precision} needs .*{gpu} is .*valid precision here: bf16"):
            validate_plan(plan, M8, 8, w, gpu=get_gpu(gpu))


def test_fp8_gemm_dims_not_multiple_of_16_refused():
    # ffn 1040: tp=1 gives K=1040 = 65 x 16 (fine); tp=2 gives mlp_down K = 520 = 32.5 x 16 and
    # mlp_up N = 2 x 1040 / 2 = 1040 (fine), so only mlp_down is named
    m = ModelSpec(name="odd", hidden_size=256, num_layers=2, num_heads=8, num_kv_heads=4,
                  ffn_hidden_size=1040, vocab_size=1024, head_dim=32)
    w = Workload(seq_len=128, global_batch_size=1)
    validate_plan(Plan(tp_degree=1, precision="fp8_tensorwise"), m, 1, w, gpu=get_gpu("h100"))
    with pytest.raises(PlanError, match=r"precision=fp8_tensorwise with tp_degree=2: per-rank GEMM dimensions "
                                        r"mlp_down K=520 N=256 are not multiples of 16"):
        validate_plan(Plan(tp_degree=2, precision="fp8_tensorwise"), m, 2, w, gpu=get_gpu("h100"))
    validate_plan(Plan(tp_degree=2), m, 2, w, gpu=get_gpu("h100"))        # BF16 takes any shape


def test_bad_precision_value():
    with pytest.raises(PlanError, match=r"precision='fp4' is not valid; choose one of bf16, fp8_tensorwise"):
        Plan(precision="fp4")
    with pytest.raises(PlanError, match="compile must be true or false"):
        Plan(compile="yes")


def test_fp8_gemm_interpolation_by_hand():
    # design.md 2026-12-01 tensorwise rows, x = m n k: 8192x6144x4096 -> 1299; 8192x14336x4096 and
    # 8192x4096x14336 share x and average to (1436 + 1396) / 2 = 1416; 8192^3 -> 1378.
    # (8192, 10000, 4096) lies between the first two; interpolation is linear in log2(x):
    t = math.log2(10000 / 6144) / math.log2(14336 / 6144)
    assert H200.gemm_tflops(8192, 10000, 4096, precision="fp8_tensorwise") == pytest.approx(1299 + t * (1416 - 1299))
    # exactly on a row
    assert H200.gemm_tflops(8192, 6144, 4096, precision="fp8_tensorwise") == pytest.approx(1299.0)
    # delayed scaling runs the same per-tensor-scaled kernel; rowwise has no table -> tensorwise (flagged)
    assert H200.gemm_tflops(8192, 6144, 4096, precision="fp8_delayed") == pytest.approx(1299.0)
    assert H200.gemm_tflops(8192, 6144, 4096, precision="fp8_rowwise") == pytest.approx(1299.0)
    assert any("rowwise" in a for a in H200.provenance()["fp8"]["assumptions"])
    # below the smallest FP8 shape: x(8192, 1024, 4096) = x(2048, 4096, 4096), a BF16 row (711.32);
    # the FP8 rate falls as BF16's does from the 8192x6144x4096 row (804.83)
    assert H200.gemm_tflops(8192, 1024, 4096, precision="fp8_tensorwise") == pytest.approx(1299 * 711.32 / 804.83)
    # time = 2 m n k / rate
    assert H200.gemm_ms(8192, 6144, 4096, precision="fp8_tensorwise") == pytest.approx(
        2 * 8192 * 6144 * 4096 / 1299e9)


def test_fp8_gemm_other_gpus():
    b200 = CalibratedCosts(profile=FIXTURE, gpu=get_gpu("b200"))
    # B200 has a published cuBLAS BF16 benchmark (gpus.yaml: 8192^3 at 1420 TFLOP/s); the fixture's BF16 row
    # at 8192^3 is 790.1, so B200 GEMMs are the fixture's x 1420 / 790.1 (not the datasheet 2250 / 989)
    scale = 1420 / 790.1
    assert b200.gemm_tflops(8192, 6144, 4096) == pytest.approx(804.83 * scale)
    # FP8 gains as BF16 does, the FP8/BF16 datasheet ratios being 4500/2250 (B200) and 1979/989 (H200)
    fp8_scale = scale * (4500 / 2250) / (1979 / 989)
    assert b200.gemm_tflops(8192, 6144, 4096, precision="fp8_tensorwise") == pytest.approx(1299 * fp8_scale)
    # mxfp8: no table: the BF16 rate (804.83 x scale) x the datasheet FP8/BF16 ratio 4500 / 2250
    assert b200.gemm_tflops(8192, 6144, 4096, precision="mxfp8") == pytest.approx(804.83 * scale * 2)
    # GB200 takes B200's reference scaled by the sustained clock at the two power limits, (1200 / 1000) ** (1/3)
    # (GPUSpec.sustained_clock_ratio), not by the datasheet peaks 2500 / 2250
    gb200 = CalibratedCosts(profile=FIXTURE, gpu=get_gpu("gb200"))
    assert gb200.gemm_tflops(8192, 6144, 4096) == pytest.approx(804.83 * 1420 * 1.2 ** (1 / 3) / 790.1)
    # H100 has no reference: the datasheet ratio (989 / 989 = 1)
    assert CalibratedCosts(profile=FIXTURE, gpu=get_gpu("h100")).gemm_tflops(8192, 6144, 4096) == pytest.approx(804.83)
    a100 = CalibratedCosts(profile=FIXTURE, gpu=get_gpu("a100-80gb"))
    with pytest.raises(ValueError, match="needs an FP8 GPU"):
        a100.gemm_ms(8192, 6144, 4096, precision="fp8_tensorwise")


# Llama 3.1 8B layer linears on one rank, T = 8192 tokens: (T, N, K) = QKV (T, 6144, 4096),
# output (T, 4096, 4096), gate+up (T, 28672, 4096), down (T, 4096, 14336).
X_ELEMS = 8192 * (4096 + 4096 + 4096 + 14336)         # inputs T x K
W_ELEMS = 4096 * 6144 + 4096 * 4096 + 4096 * 28672 + 14336 * 4096
DY_ELEMS = 8192 * (6144 + 4096 + 28672 + 4096)        # output gradients T x N
GENERIC_GBS = 2465.6                                  # h200.yaml memory_bound_bandwidth_gbs (no quantize key)


def _builder(precision, num_micro_batches=1, num_gpus=1, model=M8):
    plan = Plan(precision=precision, num_micro_batches=num_micro_batches, dp_degree=num_gpus)
    w = Workload(seq_len=8192, global_batch_size=num_micro_batches * num_gpus)
    return CostBuilder(model=model, plan=plan, cluster=make_cluster("h200", num_gpus, "nvlink4"), workload=w,
                       costs=H200)


def test_quantization_overhead_by_hand():
    # torchao dynamic scaling: forward casts X and W, backward dY twice, W^T and X^T; 2 + 2 + 1 bytes each
    fwd, bwd = _builder("fp8_tensorwise").quantize_ms
    assert fwd == pytest.approx(5 * (X_ELEMS + W_ELEMS) / (GENERIC_GBS * 1e6))
    assert bwd == pytest.approx(5 * (2 * DY_ELEMS + W_ELEMS + X_ELEMS) / (GENERIC_GBS * 1e6))
    # TE delayed: cast-transpose (2 + 1 + 1) of X and of W on the first of m = 4 micro-batches; dY backward
    fwd, bwd = _builder("fp8_delayed", num_micro_batches=4).quantize_ms
    assert fwd == pytest.approx(4 * (X_ELEMS + W_ELEMS / 4) / (GENERIC_GBS * 1e6))
    assert bwd == pytest.approx(4 * DY_ELEMS / (GENERIC_GBS * 1e6))
    assert _builder("bf16").quantize_ms == (0.0, 0.0)


def test_megatron_tensorwise_casts_through_transformer_engine():
    # Megatron-LM's --fp8-recipe tensorwise is TE Float8CurrentScaling (facts.yaml fp8_library:
    # transformer_engine): TE caches the FP8 weight on the first of m = 4 micro-batches like every TE
    # recipe (is_first_microbatch), and current scaling reads each tensor twice (amax, then cast) and writes
    # both FP8 layouts: 2 + 2 + 1 + 1 = 6 bytes per element of X and W/4 forward, of dY backward. The
    # torchao formula (re-casting W every micro-batch, dY twice) must not apply to this engine.
    plan = Plan(precision="fp8_tensorwise", num_micro_batches=4)
    b = CostBuilder(model=M8, plan=plan, cluster=make_cluster("h200", 1, "nvlink4"),
                    workload=Workload(seq_len=8192, global_batch_size=4), costs=H200, engine="megatron")
    fwd, bwd = b.quantize_ms
    assert fwd == pytest.approx(6 * (X_ELEMS + W_ELEMS / 4) / (GENERIC_GBS * 1e6))
    assert bwd == pytest.approx(6 * DY_ELEMS / (GENERIC_GBS * 1e6))


def test_fp8_step_faster_than_bf16_and_lm_head_bf16():
    logging.disable(logging.WARNING)
    try:
        m = dataclasses.replace(M8, num_layers=4)
        ev = SimulatedEvaluator(model=m, cluster=make_cluster("h200", 1, "nvlink4"), workload=W1)
        rb = ev.evaluate(Plan(zero_stage=0, dp_grad_reduce_overlap=False))
        r8 = ev.evaluate(Plan(zero_stage=0, dp_grad_reduce_overlap=False, precision="fp8_tensorwise"))
    finally:
        logging.disable(logging.NOTSET)
    assert r8.feasible and rb.feasible
    assert r8.step_time_ms < rb.step_time_ms
    # the per-layer forward difference is exactly GEMM savings minus the casts, 4 layers; the LM head
    # (chunk 0 is also the last here) is BF16 in both, so it cancels
    gemms = [(8192, 6144, 4096), (8192, 4096, 4096), (8192, 28672, 4096), (8192, 4096, 14336)]
    saved = sum(H200.gemm_ms(*g) - H200.gemm_ms(*g, precision="fp8_tensorwise") for g in gemms)
    fwd_q = 5 * (X_ELEMS + W_ELEMS) / (GENERIC_GBS * 1e6)
    cb_b, cb_8 = _builder("bf16", model=m), _builder("fp8_tensorwise", model=m)
    diff = cb_b.chunk_cost(0, 4).fwd_ms - cb_8.chunk_cost(0, 4).fwd_ms
    assert diff == pytest.approx(4 * (saved - fwd_q))


def test_compile_without_measurement_keeps_eager_costs():
    # h200.yaml has no memory_bound_ops_compiled: compile=true changes nothing and says so
    a = CostBuilder(model=M8, plan=Plan(), cluster=make_cluster("h200", 1, "nvlink4"), workload=W1, costs=H200)
    b = CostBuilder(model=M8, plan=Plan(compile=True), cluster=make_cluster("h200", 1, "nvlink4"), workload=W1,
                    costs=H200)
    assert a.chunk_cost(0, 2).fwd_ms == b.chunk_cost(0, 2).fwd_ms
    assert "keeps eager costs" in H200.provenance()["compile"]
    # with a measured compiled RMSNorm bandwidth, the RMSNorm bytes (2 norms x 4h per token = 8 T h) move faster
    d = dict(FIXTURE.raw, memory_bound_ops_compiled={"rmsnorm": 4000.0})
    from autotune.cost.calibration import CalibrationProfile
    costs = CalibratedCosts(profile=CalibrationProfile.from_dict(d), gpu=get_gpu("h200"))
    e = CostBuilder(model=M8, plan=Plan(), cluster=make_cluster("h200", 1, "nvlink4"), workload=W1, costs=costs)
    c = CostBuilder(model=M8, plan=Plan(compile=True), cluster=make_cluster("h200", 1, "nvlink4"), workload=W1,
                    costs=costs)
    nbytes = 8192 * 8 * 4096
    eager = nbytes / (costs.profile.memory_bound_ops["rmsnorm"] * 1e6)
    assert e.chunk_cost(1, 1).fwd_ms - c.chunk_cost(1, 1).fwd_ms == pytest.approx(eager - nbytes / 4000e6)


def test_memory_fp8_terms():
    # torchao (native, torchtitan) saves the BF16 input and weight: unchanged (1,141,899,264 bytes per 8B
    # layer, see test_memory), for its float8 and its MX linears alike
    assert activation_bytes_per_layer(M8, Plan(precision="fp8_tensorwise"), W1, engine="torchtitan") == 1_141_899_264
    assert activation_bytes_per_layer(M8, Plan(precision="mxfp8"), W1, engine="torchtitan") == 1_141_899_264
    # the native runtime's eager saved set is the same for BF16 and torchao FP8 (measured, test_memory)
    assert (activation_bytes_per_layer(M8, Plan(precision="fp8_tensorwise"), W1)
            == activation_bytes_per_layer(M8, Plan(), W1))
    # TE (Megatron, every FP8 recipe) saves FP8 linear inputs: norm outputs 2 x (2sbh -> sbh) =
    # -2 x 8192 x 4096; SwiGLU output 2sbf -> sbf = -8192 x 14336; attention output +1 byte (FP8 copy
    # beside the BF16 one) = +8192 x 4096
    te = 1_141_899_264 - 2 * 8192 * 4096 - 8192 * 14336 + 8192 * 4096
    for precision in ("fp8_tensorwise", "fp8_delayed", "mxfp8"):
        assert activation_bytes_per_layer(M8, Plan(precision=precision), W1, engine="megatron") == te
    # TE caches an FP8 weight + transpose: 2 bytes x the layer's linear weights (W_ELEMS) x 32 layers
    m_b = estimate_memory(M8, Plan(), get_gpu("h200"), W1, engine="megatron")
    m_d = estimate_memory(M8, Plan(precision="fp8_tensorwise"), get_gpu("h200"), W1, engine="megatron")
    dt = m_d.stages[0].transient_bytes - m_b.stages[0].transient_bytes
    assert dt == 2 * W_ELEMS * 32
    da = m_d.stages[0].activations_bytes - m_b.stages[0].activations_bytes
    assert da == 32 * (te - 1_141_899_264)
    # with FP8 parameters (--fp8-param-gather) the FP8 weight and transpose are the parameter: no copies
    fp8p = dataclasses.replace(get_engine("megatron"), fp8_param_gather=True)
    m_p = estimate_memory(M8, Plan(precision="fp8_tensorwise"), get_gpu("h200"), W1, engine=fp8p)
    assert m_p.stages[0].transient_bytes == m_b.stages[0].transient_bytes
    assert m_p.stages[0].weights_bytes == m_b.stages[0].weights_bytes


def test_grad_buffer_takes_the_reduction_dtype_on_megatron():
    # Megatron's main-grad buffer has the DP reduction's dtype (param_and_grad_buffer.py grad_dtype):
    # FP32 by default, BF16 with --grad-reduce-in-bf16; FSDP2 engines keep the FP32 param's FP32 grad.
    # Llama 3.1 8B on one GPU: N = 8,030,261,248 parameters -> 4N or 2N bytes of gradients.
    n = M8.num_params
    meg = get_engine("megatron")
    assert estimate_memory(M8, Plan(), get_gpu("h200"), W1, engine=meg).stages[0].grads_bytes == 4 * n
    bf16 = dataclasses.replace(meg, grad_reduce_bytes=2)
    assert estimate_memory(M8, Plan(), get_gpu("h200"), W1, engine=bf16).stages[0].grads_bytes == 2 * n
    tt = dataclasses.replace(get_engine("torchtitan"), grad_reduce_bytes=2)
    assert tt.grad_buffer_bytes == 4


def test_fp8_param_gather_halves_the_linear_part_of_the_parameter_all_gather():
    # ZeRO-1 over 8 GPUs, 8B, FP8-CS on Megatron: the all-gather moves the 32 layers' linear weights
    # (32 x W_ELEMS) in FP8 and the rest (embedding, LM head, norms) in BF16
    c = make_cluster("h200", 8, "nvlink4+ib-ndr400")
    plan = Plan(dp_degree=8, zero_stage=1, precision="fp8_tensorwise")
    costs = H200
    fp8p = dataclasses.replace(get_engine("megatron"), fp8_param_gather=True)
    kw = dict(model=M8, plan=plan, cluster=c, workload=W1, costs=costs)
    plain, with_fp8 = CostBuilder(**kw, engine="megatron"), CostBuilder(**kw, engine=fp8p)
    n, lin = M8.num_params, 32 * W_ELEMS
    assert with_fp8.chunk_cost(0, 32).fp8_params == lin and plain.chunk_cost(0, 32).fp8_params == 0
    ag = costs.placed_collective_ms("all_gather", 2 * (n - lin) + lin, with_fp8.dp_place)
    assert with_fp8.param_gather_ms(n, lin) == pytest.approx(ag)
    assert plain.param_gather_ms(n) == pytest.approx(costs.placed_collective_ms("all_gather", 2 * n, plain.dp_place))
    # BF16 plans have no FP8 parameters whatever the engine says
    bf = CostBuilder(**dict(kw, plan=plan.replace(precision="bf16")), engine=fp8p)
    assert bf.chunk_cost(0, 32).fp8_params == 0


def test_plan_yaml_round_trip_and_old_files():
    c = make_cluster("b200", 8, "nvlink5+ib-ndr400")
    doc = PlanDocument(plan=Plan(dp_degree=8, precision="mxfp8", compile=True), model=M8, gpu="b200", num_gpus=8,
                       fabric=c.fabric.to_dict(), workload=Workload(seq_len=8192, global_batch_size=8))
    back = PlanDocument.from_yaml(doc.to_yaml())
    assert back == doc and back.plan.precision == "mxfp8" and back.plan.compile is True
    d = doc.to_dict()
    del d["plan"]["precision"], d["plan"]["compile"]           # a plan file written before these fields
    old = PlanDocument.from_yaml(yaml.safe_dump(d))
    assert old.plan.precision == "bf16" and old.plan.compile is False


def test_export_hints():
    w = Workload(seq_len=8192, global_batch_size=8)
    h = launch_hints(Plan(dp_degree=8, precision="fp8_delayed"), M8, w)
    assert "--fp8-format hybrid --fp8-recipe delayed --fp8-amax-history-len 1024 --fp8-amax-compute-algo max" in h
    h = launch_hints(Plan(dp_degree=8, precision="fp8_tensorwise", compile=True), M8, w)
    assert "--fp8-recipe tensorwise" in h
    # torchtitan 0.2.x's converter names (quantize.linear.float8: 0.2.2 registers no "float8"); tensorwise is its
    # default recipe, so no recipe_name
    assert 'converters = ["quantize.linear.float8"]' in h and "[quantize.linear.float8]" in h
    assert 'filter_fqns = ["output"]' in h and "recipe_name" not in h.split("[quantize.linear.float8]")[1].split("[")[0]
    assert "[compile]\n  enable = true" in h
    h = launch_hints(Plan(dp_degree=8, precision="mxfp8"), M8, w)
    assert "--fp8-format e4m3 --fp8-recipe mxfp8" in h and 'converters = ["quantize.linear.mx"]' in h
    h = launch_hints(Plan(dp_degree=8), M8, w)
    assert "fp8" not in h and "[compile]" not in h


def test_report_fp8_peak_utilisation():
    ev = SimulatedEvaluator(model=dataclasses.replace(M8, num_layers=4), cluster=make_cluster("h200", 1, "nvlink4"),
                            workload=W1)
    logging.disable(logging.WARNING)
    try:
        r = ev.evaluate(Plan(zero_stage=0, dp_grad_reduce_overlap=False, precision="fp8_tensorwise"))
    finally:
        logging.disable(logging.NOTSET)
    out = format_best_plan(plan=Plan(precision="fp8_tensorwise"), result=r, title="t")
    # utilisation of the FP8 peak = achieved TFLOP/s / 1979 (H200 datasheet)
    assert f"FP8 peak utilisation   {100 * r.tflops_per_gpu / 1979:.1f}%" in out or \
        f"{100 * r.tflops_per_gpu / 1979:.1f}% (model TFLOP/s / dense FP8 peak" in out
    assert "dense BF16 peak" in out


def test_search_space_drops_precisions_per_gpu():
    space = SearchSpace.load("default")
    w = Workload(seq_len=8192, global_batch_size=64)
    a100 = space.bind(model=M8, num_gpus=8, workload=w, gpu=get_gpu("a100-80gb"))
    assert a100.choices["precision"] == ("bf16",)
    # (the default space has no fp8_delayed since issue 40: search_spaces/default.yaml)
    assert set(a100.excluded["precision"]) == {"fp8_tensorwise", "fp8_rowwise", "mxfp8"}
    h100 = space.bind(model=M8, num_gpus=8, workload=w, gpu=get_gpu("h100"))
    assert h100.choices["precision"] == ("bf16", "fp8_tensorwise", "fp8_rowwise")
    b200 = space.bind(model=M8, num_gpus=8, workload=w, gpu=get_gpu("b200"))
    assert b200.choices["precision"] == tuple(p for p in PRECISIONS if p != "fp8_delayed")
    assert b200.choices["compile"] == (False, True)


def test_pipeline_fsdp_reduce_scatter_runs_once_at_the_end_of_the_step():
    # torch.distributed.pipelining + FSDP (torchtitan): no reduce-scatter beside each micro-batch's
    # backward; one per chunk after all backwards, in buckets of the chunk's FP32 gradients, blocking
    c = make_cluster("h200", 8, "nvlink4+ib-ndr400")
    m16 = dataclasses.replace(M8, num_layers=16)
    plan = Plan(pp_degree=2, dp_degree=4, zero_stage=2, num_micro_batches=4, pipeline_schedule="1f1b")
    kw = dict(model=m16, cluster=c, workload=W1, costs=H200, plan=plan)
    tt = CostBuilder(**kw, engine="torchtitan")
    per_mb = CostBuilder(**kw, engine=dataclasses.replace(get_engine("torchtitan"), pp_defers_fsdp_grad_reduce=False))
    assert tt.deferred_rs and not per_mb.deferred_rs
    cc, cc_mb = tt.chunk_cost(0, 8), per_mb.chunk_cost(0, 8)
    # the per-micro-batch reduce-scatter, overlapped, costs its compute slowdown; deferred it is gone
    rs = H200.placed_collective_ms("reduce_scatter", cc.params * 4, tt.dp_place)
    assert cc_mb.bwd_ms - cc.bwd_ms == pytest.approx(tt.slowdown * rs)
    buckets = tt.dp_bucket_ms(cc.params)
    assert len(buckets) == math.ceil(cc.params * 4 / (64 * 2**20)) and per_mb.dp_bucket_ms(cc.params) == []
    # in the step graph the buckets block (no DP stream) and run once per step
    from autotune.cost.graph import step_weights, chunk_costs
    w = step_weights(tt, plan, m16, 4, chunk_costs(tt, plan, m16))
    assert not w.overlap_dp and sum(n for g in w.dp_groups[0, 0] for n in [g[1]]) == len(buckets)


def test_compiled_loss_time_ratio_comes_from_the_measurement():
    # COMPILED_LOSS_TIME_RATIO = mean over the measured batches of compiled / eager fwd + bwd ms
    import json
    from pathlib import Path

    from autotune.cost.chunk_costs import COMPILED_LOSS_TIME_RATIO

    d = json.loads((Path(__file__).resolve().parents[2] / "docs" / "results"
                    / "loss-memory-timing-h200x1-2026-12-01.json").read_text())
    by = {(r["batch"], r["compile"]): r["fwd_bwd_ms"] for r in d["rows"]}
    ratios = [by[b, True] / by[b, False] for b in (1, 2)]
    assert COMPILED_LOSS_TIME_RATIO == pytest.approx(sum(ratios) / 2, abs=0.001)
    # applied to torchtitan (compiles its loss) under compile, not to the native runtime (it does not)
    c = make_cluster("h200", 1, "nvlink4+ib-ndr400")
    kw = dict(model=M8, cluster=c, workload=W1, costs=H200)
    def head_ms(engine, compile_):
        cb = CostBuilder(**kw, plan=Plan(compile=compile_), engine=engine)
        return cb.chunk_cost(0, 0).fwd_ms       # one virtual stage: the embedding, no layer, the LM head
    # the two engines cost the compiled head alike (same GEMM / norm rates, neither fuses the loss
    # without compile) except the loss: native - torchtitan = ce x (1 - ratio), ce = the cross-entropy
    # term (T V x 6 bytes at the compiled plan's memory-bound rate)
    ce = CostBuilder(**kw, plan=Plan(compile=True), engine="native")._memory_bound_ms(8192 * 128256 * 6, "cross_entropy")
    assert head_ms("native", True) - head_ms("torchtitan", True) == pytest.approx(ce * (1 - COMPILED_LOSS_TIME_RATIO))
    # eager: no difference
    assert head_ms("native", False) == pytest.approx(head_ms("torchtitan", False))


def test_torchtitan_sequence_parallel_all_gathers_move_fp8_forward_and_backward():
    # torchao torchao/float8/float8_tensor_parallel.py (torchtitan's float8 TP plan, tensorwise): the input
    # is cast to float8 before the forward all-gather (Float8ColwiseParallel / PrepareFloat8ModuleInput) and
    # dY is cast before the reduce-scatter's backward all-gather (_NoopFwToFloat8BwDynamic after the
    # row-parallel output's redistribute). So without TP overlap one layer exposes, per micro-batch,
    # forward 2 x (AG of T x h at 1 B + RS of T x h at 2 B) and backward the same; BF16 gathers 2 B both ways.
    plan = Plan(tp_degree=8, sequence_parallel=True, precision="fp8_tensorwise", compile=True)
    w = Workload(seq_len=8192, global_batch_size=1)
    cb = CostBuilder(model=M8, plan=plan, cluster=make_cluster("h200", 8, "nvlink4"), workload=w, costs=H200,
                     engine=get_engine("torchtitan"))
    T, h = 8192, M8.hidden_size                      # SP: the whole sequence of the micro-batch per rank
    ag8 = H200.placed_collective_ms("all_gather", T * h, cb.tp_place)
    ag16 = H200.placed_collective_ms("all_gather", 2 * T * h, cb.tp_place)
    rs16 = H200.placed_collective_ms("reduce_scatter", 2 * T * h, cb.tp_place)
    fwd, bwd, _ = cb._layer
    assert fwd["exposed_tp_comm"] == pytest.approx(2 * (ag8 + rs16))
    assert bwd["exposed_tp_comm"] == pytest.approx(2 * (ag8 + rs16))
    assert ag8 < ag16
    # Megatron-LM (Transformer Engine) gathers FP8 forward only in this model: its backward dY gather stays BF16
    mg = CostBuilder(model=M8, plan=plan.replace(compile=False), cluster=make_cluster("h200", 8, "nvlink4"),
                     workload=w, costs=H200, engine=get_engine("megatron"))
    assert mg._layer[1]["exposed_tp_comm"] == pytest.approx(2 * (ag16 + rs16))
