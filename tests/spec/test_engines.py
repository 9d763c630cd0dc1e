"""Engine profiles: the data file, what each engine refuses, and what each changes in the cost model."""

import re

import pytest
from click.testing import CliRunner

from autotune.cost.op_costs import CalibratedCosts
from autotune.cost.calibration import default_calibration
from autotune.cli.app import main
from autotune.spec.engines import (DEFAULT_ENGINE, check_plan_for_engine, engine_names, get_engine,
                              resolve_engine)
from autotune.errors import ConfigError, PlanError
from autotune.cost.graph import CostBuilder, ChunkCost
from autotune.spec.hardware import get_gpu, make_cluster
from autotune.cost.memory import activation_bytes_per_layer, estimate_memory
from autotune.spec.models import get_model
from autotune.spec.plan import Plan, PlanDocument, Workload

M8 = get_model("8b")
W = Workload(seq_len=8192, global_batch_size=8)
COSTS = CalibratedCosts(profile=default_calibration(), gpu=get_gpu("h200"))


def test_catalog_and_default():
    assert set(engine_names()) == {"native", "megatron", "torchtitan"}
    assert DEFAULT_ENGINE == "megatron" and get_engine().name == "megatron"
    with pytest.raises(ConfigError, match=r"unknown engine 'deepspeed'; known engines: native, megatron, torchtitan"):
        get_engine("deepspeed")
    # the real backend launches autotune's own runtime
    assert resolve_engine(None, "real").name == "native"
    assert resolve_engine(None, "simulated").name == "megatron"
    # torchtitan's trainer and Megatron-LM's pretrain_gpt.py are real engines too (issue 23)
    assert resolve_engine("megatron", "real") == resolve_engine("megatron", "simulated")
    tt_real, tt_sim = resolve_engine("torchtitan", "real"), resolve_engine("torchtitan", "simulated")
    # the runner launches torchtitan 0.2.2, which still has tensorwise FP8; the 0.3 profile does not
    assert "fp8_tensorwise" in tt_real.precisions and "fp8_tensorwise" not in tt_sim.precisions
    assert set(tt_sim.precisions) < set(tt_real.precisions)
    # 0.2.2 sets gradients to None between steps and its block's saved set was measured; the 0.3 profile
    # keeps gradients (zero_grad(set_to_none=disable_cuda_graphs), False by default)
    assert (tt_real.frees_grads_between_steps, tt_real.activation_accounting) == (True, "torchtitan_block")
    assert (tt_sim.frees_grads_between_steps, tt_sim.activation_accounting) == (False, "minimal")


def test_every_engine_fact_has_a_source_comment():
    # every field of an engine entry carries a comment on its line or directly above it (the source)
    from autotune.engines.registry import ENGINES, facts_file

    missing = []
    for engine in ENGINES:          # one facts.yaml per engine folder, its facts at the top level
        prev_comment = False
        for line in facts_file(engine).read_text().splitlines():
            m = re.match(r"^([a-z_]+):", line)
            if m and m.group(1) not in ("display_name", "source", "schema_version"):
                if "#" not in line and not prev_comment:
                    missing.append(f"{engine}.{m.group(1)}")
            prev_comment = line.strip().startswith("#")
    assert not missing, f"engine facts without a source comment: {missing}"
    # and every field the profile has is in the file for every engine
    for name in engine_names():
        assert get_engine(name).source


@pytest.mark.parametrize("engine,plan,msg", [
    ("torchtitan", Plan(dp_degree=8, zero_stage=1), "zero_stage=1 cannot run on engine torchtitan: torchtitan has no"),
    ("megatron", Plan(pp_degree=2, dp_degree=4, pipeline_schedule="gpipe"),
     "pipeline_schedule=gpipe cannot run on engine megatron; it has 1f1b, interleaved_1f1b"),
    ("native", Plan(tp_degree=2, dp_degree=4, sequence_parallel=True, tp_comm_overlap=True),
     "tp_comm_overlap=true on engine native needs compile=true"),
    ("megatron", Plan(tp_degree=2, dp_degree=4, sequence_parallel=False, tp_comm_overlap=True),
     "needs sequence_parallel=true"),
    ("megatron", Plan(dp_degree=8, precision="fp8_rowwise"), "precision=fp8_rowwise cannot run on engine megatron"),
    ("torchtitan", Plan(dp_degree=8, zero_stage=3, precision="fp8_delayed"), "precision=fp8_delayed cannot run on engine torchtitan"),
    ("megatron", Plan(dp_degree=8, compile=True), "compile=true cannot run on engine megatron"),
])
def test_engine_refuses_what_it_cannot_run(engine, plan, msg):
    with pytest.raises(PlanError, match=re.escape(msg)):
        check_plan_for_engine(plan, get_engine(engine))


def test_engine_accepts_what_it_runs():
    check_plan_for_engine(Plan(dp_degree=8, zero_stage=3, precision="fp8_rowwise", compile=True), get_engine("torchtitan"))
    check_plan_for_engine(Plan(tp_degree=2, dp_degree=4, sequence_parallel=True, tp_comm_overlap=True,
                               precision="fp8_delayed"), get_engine("megatron"))
    # torchtitan overlaps TP communication through async TP, which needs compile
    check_plan_for_engine(Plan(tp_degree=2, dp_degree=4, zero_stage=3, sequence_parallel=True,
                               tp_comm_overlap=True, compile=True), get_engine("torchtitan"))
    with pytest.raises(PlanError, match="tp_comm_overlap=true on engine torchtitan needs compile=true"):
        check_plan_for_engine(Plan(tp_degree=2, dp_degree=4, zero_stage=3, sequence_parallel=True,
                                   tp_comm_overlap=True), get_engine("torchtitan"))


def _builder(engine, plan, gpus=1):
    return CostBuilder(model=M8, plan=plan, cluster=make_cluster("h200", gpus, "nvlink4"),
                       workload=Workload(seq_len=8192, global_batch_size=plan.global_batch_size),
                       costs=COSTS, engine=engine)


def test_precision_bookkeeping_per_engine_by_hand():
    # P parameters, m = 4 micro-batches, no FSDP. native (autocast over FP32 masters): forward casts
    # 6 B/param; backward casts the gradient (6 B) and adds it into the FP32 .grad for 3 of 4
    # micro-batches (12 B x 3/4). Megatron: BF16 weights, the wgrad GEMM accumulates into FP32
    # main_grad (--gradient-accumulation-fusion): neither kernel exists.
    plan = Plan(num_micro_batches=4, zero_stage=0)
    P = 10**9
    cc_n, cc_m = ChunkCost(params=P), ChunkCost(params=P)
    _builder("native", plan)._precision_costs(cc_n)
    _builder("megatron", plan)._precision_costs(cc_m)
    # (eager kernels, at the profile's in-training rate for eager memory-bound work)
    k = COSTS.in_training_factor("memory_bound", compiled=False)
    assert cc_n.fwd_parts["compute"] == pytest.approx(k * COSTS.memory_bound_ms(6 * P, "cast"))
    assert cc_n.bwd_parts["compute"] == pytest.approx(k * (COSTS.memory_bound_ms(6 * P, "cast")
                                                           + COSTS.memory_bound_ms(12 * P * 3 / 4, "accumulate")))
    assert cc_m.fwd_parts.get("compute", 0.0) == 0.0 and cc_m.bwd_parts.get("compute", 0.0) == 0.0


def test_fused_kernels_use_the_measured_fused_bandwidth():
    # RoPE on q, k of one 8B layer, 8192 tokens: 4 T (q + kv) bytes. Eager (native): the profile's
    # eager RoPE bandwidth; Megatron (TE fused RoPE): the measured compiled-kernel bandwidth.
    T, q, kv = 8192, 4096, 1024
    nbytes = T * 4 * (q + kv)
    # Both at the profile's in-training rate of their kind (eager / compiled memory-bound kernels).
    plan = Plan()
    k_eager = COSTS.in_training_factor("memory_bound", compiled=False)
    k_fused = COSTS.in_training_factor("memory_bound", compiled=True)
    assert _builder("native", plan)._memory_bound_ms(nbytes, "rope") == pytest.approx(
        k_eager * COSTS.memory_bound_ms(nbytes, "rope"))
    fused = COSTS.memory_bound_compiled_ms(nbytes, "rope")
    assert fused is not None and fused < COSTS.memory_bound_ms(nbytes, "rope")
    assert _builder("megatron", plan)._memory_bound_ms(nbytes, "rope") == pytest.approx(k_fused * fused)


def test_cp_exchange_per_engine_by_hand():
    # CP = 4 on one 8-GPU node: one K/V block per rank is T x 2 kv x 2 bytes with T = 8192 / 4 tokens.
    # Megatron's ring (--cp-comm-type p2p): 3 send/recv steps of one block; torchtitan: an all-gather
    # of the 4 blocks. Backward moves twice the forward in both.
    plan = Plan(cp_degree=4, dp_degree=2, zero_stage=1)
    T, kv = 8192 // 4, 1024
    block = T * 2 * kv * 2
    mg = _builder("megatron", plan, gpus=8)
    tt = _builder("torchtitan", plan, gpus=8)
    ring = 3 * COSTS.placed_collective_ms("send_recv", block, mg.cp_place)
    ag = COSTS.placed_collective_ms("all_gather", 4 * block, tt.cp_place)
    # with async collectives the exchange hides behind attention; compare the blocking variant
    mgb = _builder("megatron", plan.replace(async_collectives=False), gpus=8)
    ttb = _builder("torchtitan", plan.replace(async_collectives=False), gpus=8)
    assert mgb._layer[0]["exposed_cp_comm"] == pytest.approx(ring)
    assert ttb._layer[0]["exposed_cp_comm"] == pytest.approx(ag)
    assert mgb._layer[1]["exposed_cp_comm"] == pytest.approx(2 * ring)


def test_selective_recompute_per_engine():
    plan = Plan(recompute="selective", micro_batch_size=1)
    s, h, q, kv, f, heads = 8192, 4096, 4096, 1024, 14336, 32
    # torchtitan's op-level SAC keeps the block input (2sh), wq (2sq), wv (2s kv), the attention output
    # (2sq) and logsumexp (4 s heads), w1 (2sf) and w2's output (2sh)
    tt = activation_bytes_per_layer(M8, plan, W, engine="torchtitan")
    assert tt == 2 * s * h + 2 * s * (2 * q + kv + f) + 4 * s * heads + 2 * s * h
    # Megatron's core_attn recompute drops only flash attention's own logsumexp from the full set
    full = activation_bytes_per_layer(M8, plan, W, recompute="none", engine="megatron")
    assert activation_bytes_per_layer(M8, plan, W, engine="megatron") == full - 4 * s * heads
    # recompute time: torchtitan re-runs wk, wo, w3 and the block's elementwise ops
    cb = _builder("torchtitan", plan)
    second = COSTS.gemm_ms(s, kv, h) + COSTS.gemm_ms(s, h, q) + COSTS.gemm_ms(s, f, h)
    assert cb._layer[1]["recompute"] > second


def test_megatron_model_states_by_hand():
    # one 8B rank without PP, DP 8, ZeRO-1 (distributed optimizer): BF16 params 2 B, FP32 main grads
    # 4 B, FP32 main params + Adam moments 12 B sharded over 8
    plan = Plan(dp_degree=8, zero_stage=1)
    st = estimate_memory(M8, plan, get_gpu("h200"), W, engine="megatron").stages[0]
    N = M8.num_params
    assert st.weights_bytes == 2 * N
    assert st.grads_bytes == 4 * N
    assert st.optimizer_bytes == 12 * -(-N // 8)
    nat = estimate_memory(M8, plan, get_gpu("h200"), W, engine="native").stages[0]
    assert nat.weights_bytes == 4 * N and nat.optimizer_bytes == 8 * -(-N // 8)


def test_plan_document_engine_round_trip_and_old_files(tmp_path):
    from autotune.spec.hardware import get_fabric
    doc = PlanDocument(plan=Plan(dp_degree=8), model=M8, gpu="h200", num_gpus=8,
                       fabric=get_fabric("nvlink4").to_dict(), workload=W, engine="torchtitan")
    again = PlanDocument.from_yaml(doc.to_yaml())
    assert again.engine == "torchtitan" and again == doc
    d = doc.to_dict()
    del d["engine"]                                   # written before engines existed
    assert PlanDocument.from_dict(d).engine == "native"
    d["engine"] = "deepspeed"
    with pytest.raises(ConfigError, match="field engine: unknown engine 'deepspeed'"):
        PlanDocument.from_dict(d)


def test_cli_engine_option(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    r = CliRunner().invoke(main, ["run", "--size", "8b", "--space", "small", "--trials", "3", "--storage", url,
                                  "--engine", "torchtitan"])
    assert r.exit_code == 0, r.output
    assert "/torchtitan/" in r.output and "engine                     torchtitan" in r.output
    assert "error band" not in r.output and "80% interval" in r.output    # the interval row
    r = CliRunner().invoke(main, ["run", "--size", "8b", "--trials", "3", "--storage", url, "--engine", "foo"])
    assert r.exit_code == 2 and "unknown engine 'foo'" in r.output
    r = CliRunner().invoke(main, ["show", "--storage", url, "--engine", "torchtitan"])
    assert r.exit_code == 0 and "torchtitan" in r.output


# Which precision each GPU architecture runs (datasheets: FP8 tensor cores from Hopper, MXFP8 only on
# Blackwell) and which recipes each engine has (autotune/engines/<engine>/facts.yaml, sources there).
GPU_PRECISIONS = {"a100-80gb": {"bf16"}, "h100": {"bf16", "fp8_tensorwise", "fp8_rowwise", "fp8_delayed"},
                  "h200": {"bf16", "fp8_tensorwise", "fp8_rowwise", "fp8_delayed"},
                  "b200": {"bf16", "fp8_tensorwise", "fp8_rowwise", "fp8_delayed", "mxfp8"},
                  "gb200": {"bf16", "fp8_tensorwise", "fp8_rowwise", "fp8_delayed", "mxfp8"}}
ENGINE_PRECISIONS = {"native": {"bf16", "fp8_tensorwise", "fp8_rowwise"},
                     "megatron": {"bf16", "fp8_tensorwise", "fp8_delayed", "mxfp8"},
                     "torchtitan": {"bf16", "fp8_rowwise", "mxfp8"}}


@pytest.mark.parametrize("engine", sorted(ENGINE_PRECISIONS))
@pytest.mark.parametrize("gpu", sorted(GPU_PRECISIONS))
@pytest.mark.parametrize("precision", ["bf16", "fp8_tensorwise", "fp8_rowwise", "fp8_delayed", "mxfp8"])
def test_precision_gpu_engine_combinations_and_export(engine, gpu, precision, tmp_path):
    from autotune.export import write_launch_files
    from autotune.spec.hardware import get_fabric
    from autotune.spec.plan import validate_plan

    plan = Plan(dp_degree=8, zero_stage=3, precision=precision)
    ok = precision in GPU_PRECISIONS[gpu] and precision in ENGINE_PRECISIONS[engine]
    try:
        validate_plan(plan, M8, 8, W, gpu=get_gpu(gpu))
        check_plan_for_engine(plan, get_engine(engine))
    except PlanError as e:
        assert not ok, f"{precision} on {gpu} with {engine} refused: {e}"
        assert precision in str(e)
        return
    assert ok, f"{precision} on {gpu} with {engine} accepted"
    doc = PlanDocument(plan=plan, model=M8, gpu=gpu, num_gpus=8, fabric=get_fabric("nvlink4").to_dict(),
                       workload=W, engine=engine)
    files = write_launch_files(doc, tmp_path / "out", "torchrun")
    text = "\n".join(p.read_text() for p in files if p.suffix in (".sh", ".py"))
    if precision != "bf16" and engine == "megatron":
        assert "--fp8-recipe" in text and "--fp8-format" in text
    if precision != "bf16" and engine == "torchtitan":
        assert "recipe_name" in text or "MXFP8" in text
    if engine == "native":
        assert "autotune validate" in text


def test_attention_kernel_flash2_uses_its_measured_table():
    # SDPA's flash backend measured on H200 (h200.yaml attention_flash2, 2026-12-01): seq 8192, 32 query /
    # 8 KV heads, head_dim 128: 318.4 TFLOP/s forward. Causal forward FLOPs 2 s^2 d h = 2 x 8192^2 x 128 x
    # 32 = 5.4976e11 -> 1.7266 ms; the default (cuDNN) table's row is 622.68 TFLOP/s -> 0.8829 ms.
    import dataclasses

    kw = dict(batch=1, seq_len=8192, heads=32, kv_heads=8, head_dim=128)
    assert COSTS.attention_kernel_ms("flash2", **kw) == pytest.approx(2 * 8192**2 * 128 * 32 / 318.4e9, rel=1e-4)
    assert COSTS.attention_kernel_ms("default", **kw) == pytest.approx(2 * 8192**2 * 128 * 32 / 622.68e9, rel=1e-4)
    # a torchtitan release running FlashAttention-2: the layer's attention costs the flash2 time, at the
    # in-training attention factor of its mode (eager here)
    plan = Plan(micro_batch_size=1, zero_stage=0)
    tt = get_engine("torchtitan")
    fa2 = dataclasses.replace(tt, attention_kernel="flash2")
    k = COSTS.in_training_factor("attention", compiled=False)
    d_fwd = _builder(fa2, plan)._layer[0]["compute"] - _builder(tt, plan)._layer[0]["compute"]
    assert d_fwd == pytest.approx(k * (COSTS.attention_kernel_ms("flash2", **kw) - COSTS.attention_kernel_ms("default", **kw)))
    with pytest.raises(ConfigError, match="attention_kernel='fa3' is not valid"):
        dataclasses.replace(tt, attention_kernel="fa3")
