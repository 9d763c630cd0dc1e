"""Mixture-of-experts Megatron-LM launches (autotune/engines/megatron/moe_import.py, export.py): Megatron-LM's
Mixtral example script read as shipped, export -> import round trips of MoE plans (EP, ETP, dispatchers,
overlap, recompute modules, uneven layouts with MTP), one-line errors, and Megatron-LM's own parse_args +
validate_args + TransformerConfig run on the exported flags when MEGATRON_LM points at a checkout."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli.launch_import import import_launch
from autotune.engines.megatron.export import megatron_args, megatron_env
from autotune.engines.megatron.importer import import_megatron_args, parse_megatron_args
from autotune.errors import ConfigError, PlanError
from autotune.export.script_run import ScriptRun
from autotune.search.space import derive_stage_layers
from autotune.spec.models import get_builtin_model
from autotune.spec.moe_plan import validate_moe
from autotune.spec.plan import Plan, Workload

DATA = Path(__file__).resolve().parents[1] / "data"
MIXTRAL = DATA / "launches" / "megatron" / "examples" / "mixtral" / "train_mixtral_8x7b_distributed.sh"
CHECKER = DATA / "megatron_validate.py"
needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="--run-script needs bash")


def _ends(L: int, stages: int) -> tuple[int, ...]:
    return derive_stage_layers(L, stages, "ends", wide_ends=True)


#: (name, model, plan, seq, GPU arch, compute capability): the MoE plans whose exports are checked
CASES = [
    # Megatron-Bridge's DeepSeek-V3 B200 layout (published-moe-runs.yaml mb260401-dsv3-b200) with MLA and MoE
    # recompute modules: 61 layers over PP 8 x VP 2 = 16 stages, MTP on the last
    ("dsv3-pp8vp2-ep32-flex-ovl", "deepseek-v3",
     Plan(pp_degree=8, vpp_degree=2, pipeline_schedule="interleaved_1f1b", stage_layers=_ends(61, 16), dp_degree=32,
          ep_degree=32, moe_dispatcher="flex", moe_a2a_overlap=True, micro_batch_size=1, num_micro_batches=16,
          zero_stage=1, recompute="selective", recompute_modules=("layernorm", "mla_up_proj", "moe_act"),
          precision="mxfp8"), 4096, "blackwell", (10, 0)),
    ("dsv3-pp16-ep8-alltoall-full", "deepseek-v3",
     Plan(pp_degree=16, stage_layers=_ends(61, 16), dp_degree=16, ep_degree=8, micro_batch_size=1,
          num_micro_batches=32, zero_stage=1, recompute="full", precision="fp8_tensorwise"), 4096, "hopper", (9, 0)),
    # Qwen3-235B-A22B H100 (mb260401-qwen235-h100): TP 2 + SP, PP 8 x VP 4 uneven, EP 32, all-to-all overlap
    ("qwen235-tp2-pp8vp4-ep32-ovl", "qwen3-235b-a22b",
     Plan(tp_degree=2, sequence_parallel=True, pp_degree=8, vpp_degree=4, pipeline_schedule="interleaved_1f1b",
          stage_layers=_ends(94, 32), dp_degree=16, ep_degree=32, moe_a2a_overlap=True, micro_batch_size=1,
          num_micro_batches=128, zero_stage=1, precision="fp8_tensorwise"), 4096, "hopper", (9, 0)),
    ("qwen235-etp2-allgather-moe-recompute", "qwen3-235b-a22b",
     Plan(tp_degree=2, sequence_parallel=True, pp_degree=2, dp_degree=4, ep_degree=4, etp_degree=2,
          moe_dispatcher="allgather", micro_batch_size=1, num_micro_batches=8, zero_stage=1, recompute="selective",
          recompute_modules=("core_attn", "layernorm", "moe")), 4096, "hopper", (9, 0)),
    ("qwen30-ep8-flex-ovl-no-grouped", "qwen3-30b-a3b",
     Plan(dp_degree=8, ep_degree=8, moe_dispatcher="flex", moe_a2a_overlap=True, moe_grouped_gemm=False,
          micro_batch_size=4, num_micro_batches=2, zero_stage=1), 4096, "blackwell", (10, 0)),
    # Megatron-LM README's Mixtral 8x7B layout (mlm-readme-mixtral8x7b-h100): PP 4 x VP 8, EP 8
    ("mixtral-pp4vp8-ep8", "mixtral-8x7b",
     Plan(pp_degree=4, vpp_degree=8, pipeline_schedule="interleaved_1f1b", dp_degree=16, ep_degree=8,
          micro_batch_size=1, num_micro_batches=16, zero_stage=1, recompute="selective",
          recompute_modules=("layernorm", "moe_act")), 4096, "hopper", (9, 0)),
    ("deepseek16b-ep8-shared-experts", "deepseek-16b",
     Plan(dp_degree=8, ep_degree=8, micro_batch_size=2, num_micro_batches=2, zero_stage=1, recompute="selective",
          recompute_modules=("shared_experts",)), 4096, "hopper", (9, 0)),
    # GPT-OSS-120B H100 (mb260401-gptoss120-h100-bf16): PP 4, EP 8, flex, recompute layernorm + moe_act; its
    # sinks, alternating 128-token windows, clamped quick-GeGLU and biases as Megatron-LM flags (export.py)
    ("gptoss120-pp4-ep8-flex", "gpt-oss-120b",
     Plan(pp_degree=4, dp_degree=16, ep_degree=8, moe_dispatcher="flex", micro_batch_size=1, num_micro_batches=8,
          zero_stage=1, recompute="selective", recompute_modules=("layernorm", "moe_act")), 4096, "hopper", (9, 0)),
    ("gptoss20-ep8", "gpt-oss-20b",
     Plan(dp_degree=8, ep_degree=8, micro_batch_size=1, num_micro_batches=8, zero_stage=1), 4096, "blackwell", (10, 0)),
    ("kimi-k2-pp4-ep16", "kimi-k2",
     Plan(pp_degree=4, dp_degree=16, ep_degree=16, stage_layers=_ends(61, 4), micro_batch_size=1,
          num_micro_batches=8, zero_stage=1), 4096, "hopper", (9, 0)),
]


def _workload(plan: Plan, seq: int) -> Workload:
    return Workload(seq_len=seq, global_batch_size=plan.micro_batch_size * plan.dp_degree * plan.num_micro_batches)


@pytest.mark.parametrize("name,model,plan,seq,arch,cap", CASES, ids=[c[0] for c in CASES])
def test_moe_export_imports_back_to_the_same_plan(tmp_path, name, model, plan, seq, arch, cap):
    m, w = get_builtin_model(model), _workload(plan, seq)
    validate_moe(plan, m)
    args = megatron_args(plan, m, w)
    f = tmp_path / "args.txt"
    f.write_text(" \\\n".join(args) + "\n")
    imp = import_megatron_args(f, num_gpus=plan.num_gpus)
    # the same built-in model (named by catalog_name), plan and workload, and the same flags written again
    assert (imp.model, imp.plan, imp.workload) == (m, plan, w)
    assert megatron_args(imp.plan, imp.model, imp.workload) == args
    assert not imp.approximated
    # every modelled option carries the value export wrote
    exported = parse_megatron_args(args, "export")
    for opt, val in imp.modelled.items():
        assert exported[opt] == val, opt
    assert {"--num-experts", "--expert-model-parallel-size", "--moe-token-dispatcher-type"} <= set(imp.modelled)


@needs_bash
def test_mixtral_example_script_as_shipped(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    # the script's $2 is a Llama 2 tokenizer; a local folder with config.json gives the vocabulary (32000)
    (tok / "config.json").write_text(json.dumps({"vocab_size": 32000}))
    argv = ("ckpt", str(tok), "data")
    # one node (SLURM_NNODES unset: 8 GPUs): PP 4 leaves TP x CP x DP = 8 / 4 = 2 ranks for the experts, and
    # EP 8 does not fold over 2 (Megatron-LM: arguments.py validate_args / parallel_state refuse it too)
    with pytest.raises(ConfigError, match=r"ep_degree=8 x etp_degree=1 does not divide tp x cp x dp = 2.*"
                                          r"valid ep_degree here: \[1, 2\]") as e:
        import_launch(MIXTRAL, None, num_gpus=None, script=ScriptRun(args=argv))
    assert "\n" not in str(e.value)
    # four nodes: 32 GPUs, DP = 32 / PP 4 = 8, micro-batches 256 / (1 x 8) = 32
    got = import_launch(MIXTRAL, None, num_gpus=None, script=ScriptRun(args=argv, env=(("SLURM_NNODES", "4"),)))
    assert got.num_gpus == 32 and got.model == get_builtin_model("mixtral-8x7b")
    p = got.plan
    assert (p.tp_degree, p.pp_degree, p.dp_degree, p.ep_degree, p.etp_degree, p.num_micro_batches) == (1, 4, 8, 8, 1, 32)
    # MOE_ARGS: --moe-grouped-gemm --moe-token-dispatcher-type alltoall; distributed optimizer, both DP overlaps
    assert (p.moe_dispatcher, p.moe_grouped_gemm, p.moe_a2a_overlap, p.zero_stage) == ("alltoall", True, False, 1)
    assert p.dp_grad_reduce_overlap and p.param_gather_overlap
    # aux-loss coefficient 1e-2 and no forced balancing: routing is costed balanced, and said so
    assert any(a.startswith("routing costed balanced") for a in got.approximated)
    from autotune.cost.evaluator import make_evaluator
    from autotune.spec.hardware import make_cluster
    ev = make_evaluator("simulated", model=got.model, cluster=make_cluster("h100", 32, None), workload=got.workload,
                        engine="megatron")
    r = ev.evaluate(got.plan)
    ev.close()
    assert r.feasible and r.step_time_ms > 0


def _args(tmp_path, text):
    f = tmp_path / "a.txt"
    f.write_text(text)
    return f


MOE_BASE = ("--num-layers 4 --hidden-size 1024 --ffn-hidden-size 4096 --num-attention-heads 8 --seq-length 2048 "
            "--max-position-embeddings 4096 --position-embedding-type rope --normalization RMSNorm --swiglu "
            "--disable-bias-linear --vocab-size 32000 --bf16 --micro-batch-size 1 --global-batch-size 8 "
            "--num-experts 8 --moe-ffn-hidden-size 512 ")


@pytest.mark.parametrize("extra,words", [
    ("--moe-router-topk 9", "moe_top_k"),
    ("--expert-model-parallel-size 3", "ep_degree=3 does not divide the 8 routed experts"),
    ("--moe-token-dispatcher-type deepep", "valid values are allgather, alltoall, flex"),
    ("--moe-layer-freq [1,1,0,1]", "not of that form"),
    ("--moe-layer-freq [1,1]", "lists 2 layers; the model has --num-layers 4"),
    ("--moe-layer-freq __import__('os')", "give an integer or a list expression"),
    # a list of 10^10 entries is refused before it is built; a non-ASCII digit is not an integer
    ("--moe-layer-freq ([0]*100000)*100000", "give an integer or a list expression"),
    ("--moe-layer-freq \u00b2", "give an integer or a list expression"),
    ("--moe-layer-freq [0,0,0,0]", "no MoE layer"),
    ("--moe-router-score-function sqrtsoftplus", "router score function sqrtsoftplus"),
    ("--moe-expert-capacity-factor 0.5", "drops routed tokens"),
    ("--expert-model-parallel-size 8 --overlap-moe-expert-parallel-comm --moe-token-dispatcher-type allgather",
     "moe_dispatcher alltoall or flex"),
    ("--recompute-granularity selective --recompute-modules mla_up_proj", "mla_up_proj needs multi-latent attention"),
])
def test_moe_errors_are_one_line_naming_the_value(tmp_path, extra, words):
    with pytest.raises(ConfigError, match=words) as e:
        import_megatron_args(_args(tmp_path, MOE_BASE + extra), num_gpus=8)
    assert "\n" not in str(e.value)


def test_moe_defaults_follow_megatron(tmp_path):
    imp = import_megatron_args(_args(tmp_path, MOE_BASE.replace("--num-attention-heads 8", "--num-attention-heads 8 "
                                                                "--tensor-model-parallel-size 2 --sequence-parallel")),
                               num_gpus=8)
    m, p = imp.model, imp.plan
    # --moe-router-topk default 2 (TransformerConfig); dispatcher allgather; ETP = TP (validate_args); grouped
    # GEMM off; --moe-layer-freq 1: every layer MoE
    assert (m.num_experts, m.moe_top_k, m.moe_ffn_hidden_size, m.num_moe_layers) == (8, 2, 512, 4)
    assert (p.ep_degree, p.etp_degree, p.moe_dispatcher, p.moe_grouped_gemm) == (1, 2, "allgather", False)
    assert any("Megatron-LM uses TP 2 for the experts" in a for a in imp.approximated)
    # --moe-layer-freq as a list expression: the first layer dense, then every layer (DeepSeek's layout)
    imp = import_megatron_args(_args(tmp_path, MOE_BASE + "--moe-layer-freq ([0]*1+[1]*3)"), num_gpus=8)
    assert (imp.model.num_first_dense_layers, imp.model.moe_layer_freq) == (1, 1)
    # and every second layer MoE
    imp = import_megatron_args(_args(tmp_path, MOE_BASE + "--moe-layer-freq 2"), num_gpus=8)
    assert imp.model.moe_layer_pattern == (1, 0, 1, 0)
    # the same as a list, and a single MoE layer at index 2 of 4 (k = 2, freq 4: 2 % 4 != 0, so freq 2: 2, and
    # 4 is past the end)
    for expr, pattern in (("[1,0,1,0]", (1, 0, 1, 0)), ("[0,0,1,0]", (0, 0, 1, 0)), ("[0]*3+[1]", (0, 0, 0, 1))):
        imp = import_megatron_args(_args(tmp_path, MOE_BASE + f"--moe-layer-freq {expr}"), num_gpus=8)
        assert imp.model.moe_layer_pattern == pattern, expr


# ---- Megatron-LM's own checks -------------------------------------------------------------------------------

#: constraints Megatron-LM enforces that the checker showed (tests/data/megatron_validate.py at d98e8a64, 2026-12-03;
#: docs/moe.md "Megatron-LM's own checks"), each with where Megatron raises it; validate_moe (spec/moe_plan.py)
#: must refuse the same plans before an export is written
MEGATRON_REFUSES = [
    # megatron/core/transformer/transformer_config.py:3008 "If enabling EP A2A overlap,
    # virtual_pipeline_model_parallel_size must be specified when pipeline_model_parallel_size > 1"
    ("mixtral-8x7b", dict(pp_degree=4, dp_degree=16, ep_degree=8, moe_a2a_overlap=True), "interleaved virtual stages"),
    # megatron/training/arguments.py:1657 "Number of experts should be a multiple of expert model parallel_size."
    ("mixtral-8x7b", dict(pp_degree=4, dp_degree=32, ep_degree=32), "does not divide the 8 routed experts"),
    # megatron/core/transformer/transformer_config.py:1970 "mla_up_proj in recompute_modules is only supported
    # with multi_latent_attention."
    ("mixtral-8x7b", dict(pp_degree=4, dp_degree=16, ep_degree=8, recompute="selective",
                          recompute_modules=("mla_up_proj",)), "mla_up_proj needs multi-latent attention"),
    # transformer_config.py:3018 "overlap_moe_expert_parallel_comm is supported with alltoall/flex token
    # dispatcher"
    ("qwen3-30b-a3b", dict(dp_degree=8, ep_degree=8, moe_a2a_overlap=True, moe_dispatcher="allgather"),
     "alltoall or flex"),
    # transformer_config.py:1966 "moe_act in recompute_modules is only supported with moe_grouped_gemm."
    ("qwen3-30b-a3b", dict(dp_degree=8, ep_degree=8, moe_grouped_gemm=False, recompute="selective",
                           recompute_modules=("moe_act",)), "moe_act needs moe_grouped_gemm"),
    # transformer_config.py:2003 "Delayed scaling does not support moe_act and layernorm recompute for fp8."
    ("qwen3-30b-a3b", dict(dp_degree=8, ep_degree=8, precision="fp8_delayed", recompute="selective",
                           recompute_modules=("layernorm",)), "delayed scaling does not support"),
]


@pytest.mark.parametrize("model,kw,words", MEGATRON_REFUSES, ids=[w for _, _, w in MEGATRON_REFUSES])
def test_plans_megatron_refuses_are_refused_before_export(model, kw, words):
    plan = Plan(micro_batch_size=1, num_micro_batches=4, zero_stage=1, **kw)
    with pytest.raises(PlanError, match=words):
        validate_moe(plan, get_builtin_model(model))


def _checker_cases(extra=()):
    out = []
    for name, model, plan, seq, arch, cap in CASES:
        out.append({"name": name, "args": megatron_args(plan, get_builtin_model(model), _workload(plan, seq)),
                    "world_size": plan.num_gpus, "env": megatron_env(plan, arch), "capability": list(cap)})
    return out + list(extra)


@pytest.mark.skipif(not os.environ.get("MEGATRON_LM"), reason="set MEGATRON_LM to a Megatron-LM checkout (commit "
                    "d98e8a64ddf3) to run its parse_args + validate_args on the exported MoE flags")
def test_megatron_validate_args_accepts_the_moe_exports(tmp_path):
    # a negative case proves the checker can fail: EP 32 over 8 experts (arguments.py:1657)
    bad = dict(next(c for c in _checker_cases() if c["name"] == "mixtral-pp4vp8-ep8"), name="negative-ep32")
    bad["args"] = [("32" if a == "8" and bad["args"][i - 1] == "--expert-model-parallel-size" else a)
                   for i, a in enumerate(bad["args"])]
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps(_checker_cases([bad])))
    out = subprocess.run([sys.executable, str(CHECKER), os.environ["MEGATRON_LM"], str(cases)], capture_output=True,
                         text=True, timeout=600, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    results = {d["name"]: d for d in map(json.loads, [ln for ln in out.stdout.splitlines() if ln.startswith("{")])}
    assert len(results) == len(CASES) + 1, out.stderr[-2000:]
    for name, *_ in CASES:
        assert results[name]["ok"] and results[name]["stage"] == "done", results[name]
    assert not results["negative-ep32"]["ok"] and "multiple of expert model parallel" in results["negative-ep32"]["error"]



# ---- torchtitan 0.2.2 MoE job files (tests/data/launches/torchtitan-0.2.2, as shipped at v0.2.2) -------------
TT = DATA / "launches" / "torchtitan-0.2.2"


@pytest.mark.parametrize("name", ["deepseek_v3_16b", "deepseek_v3_671b", "qwen3_moe_debug"])
def test_torchtitan_moe_tomls_as_shipped_one_line_reason(name):
    # every shipped MoE TOML shards with FSDP (data_parallel_shard_degree -1 -> ZeRO-3), which autotune's MoE
    # cost model does not cost (spec/moe_plan.py): one line naming it
    with pytest.raises(ConfigError, match=r"zero_stage=3 \(FSDP\) with routed experts is not costed") as e:
        import_launch(TT / f"{name}.toml", None, num_gpus=64)
    assert "\n" not in str(e.value)


def test_torchtitan_moe_toml_with_ddp_degrees_is_predicted(tmp_path):
    text = (TT / "deepseek_v3_16b.toml").read_text()
    f = tmp_path / "ds16_ddp.toml"
    f.write_text(text.replace("data_parallel_replicate_degree = 1", "data_parallel_replicate_degree = 8")
                 .replace("data_parallel_shard_degree = -1", "data_parallel_shard_degree = 1"))
    got = import_launch(f, None, num_gpus=8)
    # flavour 16B -> deepseek-16b (torchtitan's deepseekv3_args["16B"] is that shape); expert_parallel_degree 8
    assert got.model == get_builtin_model("deepseek-16b")
    p = got.plan
    # DDP 8 (replicate), EP 8 over DP 8 (expert DP 1), local_batch_size 4 -> micro-batches 32 / (4 x 8) = 1
    assert (p.dp_degree, p.zero_stage, p.ep_degree, p.etp_degree, p.num_micro_batches) == (8, 0, 8, 1, 1)
    assert ("quantize.grouped_mm.float8.fqns = ['experts']",
            "no effect without quantize.grouped_mm.float8 in model.converters") in got.ignored
    assert any(a.startswith("routing as trained") for a in got.approximated)
    # forced balance: the approximation goes
    f.write_text(f.read_text().replace("[training]", "[training]\ndebug_moe_force_load_balance = true"))
    assert not any(a.startswith("routing") for a in import_launch(f, None, num_gpus=8).approximated)


def test_torchtitan_moe_flavours():
    from autotune.engines.torchtitan.moe_import import moe_flavor_model, moe_flavor_note
    # 671B: DeepSeek-V3 without the MTP module (torchtitan 0.2.2 has none), said so
    m = moe_flavor_model("deepseek_v3", "671B", "f")
    assert m.mtp_num_layers == 0 and m.num_experts == 256 and m.name == "deepseek-v3-no-mtp"
    assert "no multi-token prediction" in moe_flavor_note("deepseek_v3", "671B")
    # 235B-A22B: the built-in model, its uncosted differences (rope_theta 5e6, max_seq_len 4096) named
    assert moe_flavor_model("qwen3", "235B-A22B", "f") == get_builtin_model("qwen3-235b-a22b")
    assert "rope_theta 5e6" in moe_flavor_note("qwen3", "235B-A22B")
    # qwen3 debugmodel_moe: 8 layers, 64 experts of 768, top-8 (qwen3/__init__.py at v0.2.2)
    d = moe_flavor_model("qwen3", "debugmodel_moe", "f")
    assert (d.num_layers, d.num_experts, d.moe_top_k, d.moe_ffn_hidden_size, d.qk_norm) == (8, 64, 8, 768, True)
    with pytest.raises(ConfigError, match=r"qwen3 flavour '8B'.*30B-A3B, 235B-A22B, debugmodel_moe"):
        moe_flavor_model("qwen3", "8B", "f")


def test_gpt_oss_flags():
    from autotune.engines.megatron.export import architecture_args, unsupported_features
    m = get_builtin_model("gpt-oss-120b")
    a = " ".join(architecture_args(m, 4096))
    # HF config.json: sliding_window 128 on the even layers (layer_types), sinks, swiglu_limit 7, biases on every
    # linear layer; Megatron-LM: window (127, 0) (TE bounds inclusive: 128 tokens, Megatron-Bridge PR #2656),
    # windowed unless the 1-based layer number is a multiple of 2
    for flag in ("--window-size 127,0 --window-attn-skip-freq 2", "--softmax-type learnable",
                 "--quick-geglu --glu-linear-offset 1 --activation-func-clamp-value 7",
                 "--position-embedding-type yarn", "--no-yarn-correction-range-round-to-int"):
        assert flag in a, flag
    assert "--disable-bias-linear" not in a and "--swiglu" not in a and "--add-qkv-bias" not in a
    # within the window no window flag is needed (full causal attention)
    assert "--window-size" not in " ".join(architecture_args(m, 128))
    # biases on some linear layers only cannot be launched: named
    part = dataclasses.replace(get_builtin_model("qwen3-30b-a3b"), router_bias=True)
    assert any("biases on the router linear layers only" in f for f in unsupported_features(part, 4096))
