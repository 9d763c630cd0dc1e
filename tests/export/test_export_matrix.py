"""Every export of a model x engine x precision x ZeRO x schedule matrix, checked against the engine.

Megatron-LM: a parser rebuilt from the recorded facts of Megatron-LM's own parser
(autotune/engines/megatron/arg_facts.jsonl: action, type, nargs and choices of every option at the commit
facts.yaml cites, written by tests/data/extract_megatron_args.py --facts) parses every exported
argument list: unknown flags, a value of the wrong type (``--rotary-base 1e+06`` for an int) or outside
the choices fail here as they fail in ``pretrain_gpt.py``. torchtitan: the settings' fields against
torchtitan 0.3.0's recorded dataclass fields (tests/export/test_export.py runs torchtitan's own loader
where torchtitan is installed). Every model feature either reaches its flag or the export is refused
naming it; none is exported as a different architecture.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from autotune.errors import ConfigError
from autotune.engines.native.export import native_unsupported_features
from autotune.export import launch_command
from autotune.engines.megatron.export import ddp_bucket_size, megatron_args, unsupported_features
from autotune.engines.torchtitan.export import torchtitan_settings
from autotune.spec.hardware import make_cluster
from autotune.spec.hf_config import model_from_hf_config
from autotune.spec.models import get_model
from autotune.spec.plan import Plan, PlanDocument, Workload

DATA = Path(__file__).resolve().parents[1] / "data"
FACTS_FILE = Path(__file__).resolve().parents[2] / "autotune" / "engines" / "megatron" / "arg_facts.jsonl"
FACTS = [json.loads(ln) for ln in FACTS_FILE.read_text().splitlines()[1:]]
TYPES = {"int": int, "float": float, "str": str}


class ParseError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):           # argparse exits; the test wants the message
        raise ParseError(message)


def megatron_parser() -> argparse.ArgumentParser:
    """An argparse parser with Megatron-LM's option strings, actions, value types, nargs and choices
    (the recorded facts); options whose converter is Megatron's own function take a string."""
    p = _Parser(allow_abbrev=False, add_help=False)
    for f in FACTS:
        opt, action = f["option"], f["action"]
        if action in ("store_true", "store_false", "store_const", "count", "BooleanOptionalAction", "_HelpAction"):
            p.add_argument(opt, action="store_true", dest=opt)     # a flag without a value
            continue
        kw = {"dest": opt, "type": TYPES.get(f["type"], str)}
        if f["nargs"] is not None:
            kw["nargs"] = f["nargs"]
        if f["choices"] is not None:
            kw["choices"] = [kw["type"](c) if f["type"] in ("int", "float") else c for c in f["choices"]]
        p.add_argument(opt, action="append" if action == "append" else "store", **kw)
    return p


PARSER = megatron_parser()


def test_recorded_facts_are_megatrons_parser():
    # the facts and the option-name list come from the same parser build: same option strings
    names = {ln.strip() for ln in (DATA / "megatron_args.txt").read_text().splitlines() if ln.startswith("--")}
    assert {f["option"] for f in FACTS} == names
    facts = {f["option"]: f for f in FACTS}
    # spot checks against megatron/training/arguments.py at d98e8a64: "--rotary-base', type=int, default=10000",
    # "--rope-scaling-factor', type=float", "--fp8-recipe ... choices=['tensorwise', 'delayed', 'mxfp8',
    # 'blockwise', 'custom']", "--use-rope-scaling', action='store_true'"
    assert facts["--rotary-base"]["type"] == "int" and facts["--rope-scaling-factor"]["type"] == "float"
    assert facts["--use-rope-scaling"]["action"] == "store_true"
    assert facts["--fp8-recipe"]["choices"] == ["tensorwise", "delayed", "mxfp8", "blockwise", "custom"]
    # the parser rejects what Megatron rejects
    with pytest.raises(ParseError, match="rotary-base"):
        PARSER.parse_args(["--rotary-base", "1e+06"])
    with pytest.raises(ParseError, match="unrecognized"):
        PARSER.parse_args(["--tensor-parallel-size", "8"])


# ---- the model matrix: config.json architecture fields of each family (HF hub), written here ----
LLAMA32_3B = {"model_type": "llama", "hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 24,
              "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192, "vocab_size": 128256,
              "hidden_act": "silu", "tie_word_embeddings": True, "max_position_embeddings": 131072,
              "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
              "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
QWEN25_7B = {"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
             "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064, "hidden_act": "silu",
             "tie_word_embeddings": False, "max_position_embeddings": 131072, "rope_theta": 1000000.0,
             "rms_norm_eps": 1e-6, "sliding_window": 131072, "use_sliding_window": False}
MISTRAL_7B = {"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000, "hidden_act": "silu",
              "tie_word_embeddings": False, "max_position_embeddings": 32768, "rope_theta": 10000.0,
              "sliding_window": 4096}
GEMMA_7B = {"model_type": "gemma", "hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
            "num_key_value_heads": 16, "head_dim": 256, "intermediate_size": 24576, "vocab_size": 256000,
            "hidden_act": "gelu", "max_position_embeddings": 8192, "rope_theta": 10000.0}
GEMMA2_9B = {"model_type": "gemma2", "hidden_size": 3584, "num_hidden_layers": 42, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 14336, "vocab_size": 256000,
             "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 8192, "sliding_window": 4096,
             "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 256}
PHI3_MINI_4K = {"model_type": "phi3", "hidden_size": 3072, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 32, "intermediate_size": 8192, "vocab_size": 32064, "hidden_act": "silu",
                "tie_word_embeddings": False, "max_position_embeddings": 4096, "sliding_window": 2047,
                "rope_theta": 10000.0}
PHI3_MINI_128K = dict(PHI3_MINI_4K, max_position_embeddings=131072, sliding_window=262144,
                      rope_scaling={"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [1.5] * 48,
                                    "original_max_position_embeddings": 4096})


def _hf(tmp_path, name, cfg):
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(cfg))
    return model_from_hf_config(p)


#: name -> (config or catalog size, seq_len, Megatron flags the architecture needs (flag -> value or
#: True for a switch, False for must be absent), None when Megatron must refuse: words the error names)
MATRIX = {
    # Llama 3.1 (Meta's config.json: rope_theta 500000, llama3 scaling factor 8, SwiGLU, untied)
    "llama3.1-8b": ("8b", 8192, {"--rotary-base": "500000", "--use-rope-scaling": True,
                                  "--rope-scaling-factor": "8", "--swiglu": True,
                                  "--untie-embeddings-and-output-weights": True, "--add-qkv-bias": False}),
    "llama3.1-70b": ("70b", 8192, {"--num-layers": "80", "--use-rope-scaling": True, "--rope-scaling-factor": "8"}),
    "llama3.1-405b": ("405b", 8192, {"--num-layers": "126", "--rope-scaling-factor": "8"}),
    # Llama 3.2 3B: llama3 scaling factor 32, tied embeddings -> no --untie flag (Megatron ties by default)
    "llama3.2-3b": (LLAMA32_3B, 8192, {"--use-rope-scaling": True, "--rope-scaling-factor": "32",
                                       "--untie-embeddings-and-output-weights": False, "--kv-channels": "128"}),
    # Qwen2.5: rope_theta 1e6 as an int, Q/K/V biases, no scaling
    "qwen2.5-7b": (QWEN25_7B, 8192, {"--rotary-base": "1000000", "--add-qkv-bias": True,
                                     "--use-rope-scaling": False, "--norm-epsilon": "1e-06"}),
    # Mistral 7B v0.1: window 4096 at seq 4096 is full causal attention; plain RoPE
    "mistral-7b": (MISTRAL_7B, 4096, {"--rotary-base": "10000", "--use-rope-scaling": False, "--swiglu": True}),
    "phi-3-mini-4k": (PHI3_MINI_4K, 2047, {"--rotary-base": "10000", "--num-query-groups": False}),
    # refused: features pretrain_gpt.py has no flag for
    "gemma-7b": (GEMMA_7B, 8192, None, ["GeGLU", "sqrt(hidden_size)"]),
    "gemma-2-9b": (GEMMA2_9B, 4096, None, ["GeGLU", "soft-capping 50", "soft-capping 30", "4 RMSNorms"]),
    "phi-3-mini-128k": (PHI3_MINI_128K, 8192, None, ["longrope"]),
}


def _model(tmp_path, name):
    src = MATRIX[name][0]
    return get_model(src) if isinstance(src, str) else _hf(tmp_path, name, src)


def _plans(model, seq_len):
    """Plans over 64 GPUs covering ZeRO 0-3, 1F1B / interleaved (VPP) / no PP, SP, recompute modes,
    BF16 / FP8 tensorwise / delayed / MXFP8, overlap on and off, each reclaim policy."""
    L = model.num_layers
    vpp = next(v for v in (4, 3, 2, 7) if L % (2 * v) == 0) if L % 2 == 0 else 1
    out = []
    for zero in (0, 1, 2, 3):
        for prec in ("bf16", "fp8_tensorwise", "fp8_delayed", "mxfp8", "fp8_rowwise"):
            out.append(Plan(tp_degree=2, pp_degree=2, dp_degree=16, micro_batch_size=1, num_micro_batches=8,
                            pipeline_schedule="interleaved_1f1b" if vpp > 1 else "1f1b", vpp_degree=vpp,
                            sequence_parallel=True, zero_stage=zero, precision=prec, recompute="selective",
                            dp_grad_reduce_overlap=True, param_gather_overlap=zero in (1, 2)))
    out += [Plan(tp_degree=8, pp_degree=1, dp_degree=8, num_micro_batches=16, recompute="full",
                 memory_reclaim="empty_cache_per_step", async_collectives=False, tp_comm_overlap=False),
            Plan(tp_degree=4, pp_degree=2, dp_degree=8, num_micro_batches=16, pipeline_schedule="1f1b",
                 stage_layers=(L // 2 - 1, L - L // 2 + 1), recompute="full", recompute_num_layers=2,
                 sequence_parallel=True, tp_comm_overlap=True, memory_reclaim="expandable_segments",
                 bucket_size_mib=25)]
    return out


def _values(args):
    """flag -> value (or True for a switch) of an argv list."""
    out = {}
    for i, a in enumerate(args):
        if a.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else None
            out[a] = nxt if nxt is not None and not nxt.startswith("--") else True
    return out


@pytest.mark.parametrize("name", sorted(MATRIX))
def test_megatron_export_matrix(tmp_path, name):
    model = _model(tmp_path, name)
    seq = MATRIX[name][1]
    wl = Workload(seq_len=seq, global_batch_size=256)
    expect = MATRIX[name][2]
    if expect is None:
        for words in MATRIX[name][3]:
            assert any(words in f for f in unsupported_features(model, seq)), (words, unsupported_features(model, seq))
        with pytest.raises(ConfigError, match="cannot express") as e:
            megatron_args(_plans(model, seq)[0], model, wl)
        for words in MATRIX[name][3]:
            assert words in str(e.value)
        return
    parsed_any = 0
    for plan in _plans(model, seq):
        try:
            args = megatron_args(plan, model, wl)
        except ConfigError as e:
            # the only plan Megatron refuses: the rowwise FP8 recipe it lacks
            assert plan.precision == "fp8_rowwise" and "rowwise" in str(e)
            continue
        ns = vars(PARSER.parse_args(args))          # Megatron's option names, value types and choices
        flags = [a for a in args if a.startswith("--")]
        assert len(flags) == len(set(flags)), "a flag given twice"
        v = _values(args)
        for flag, want in expect.items():
            if want is False:
                assert flag not in v, flag
            else:
                assert v.get(flag) == want, (flag, v.get(flag))
        # plan -> flags, independently of the export code
        assert int(v["--tensor-model-parallel-size"]) == plan.tp_degree
        assert int(v["--pipeline-model-parallel-size"]) == plan.pp_degree
        assert ns["--num-layers"] == model.num_layers and ns["--seq-length"] == seq
        assert ("--use-distributed-optimizer" in v) == (plan.zero_stage == 1)
        if plan.zero_stage >= 2:
            assert v["--data-parallel-sharding-strategy"] == {2: "optim_grads", 3: "optim_grads_params"}[plan.zero_stage]
        if plan.pp_degree > 1 and plan.vpp_degree > 1 and len(set(plan.layers_per_virtual_stage(model.num_layers))) == 1:
            assert ns["--num-layers-per-virtual-pipeline-stage"] * plan.pp_degree * plan.vpp_degree == model.num_layers
        if plan.stage_layers:
            layout = v["--pipeline-model-parallel-layout"].split("|")
            assert [s.count("t") for s in layout] == list(plan.stage_layers)
        # async_collectives false: nothing overlapped (the flags that overlap communication are absent)
        if not plan.async_collectives:
            assert not {"--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap"} & set(v)
        else:
            assert ("--overlap-grad-reduce" in v) == plan.dp_grad_reduce_overlap
        recipe = {"fp8_tensorwise": "tensorwise", "fp8_delayed": "delayed", "mxfp8": "mxfp8"}.get(plan.precision)
        assert v.get("--fp8-recipe") == recipe
        # the bucket is written with --overlap-grad-reduce only: Megatron-LM uses one bucket per buffer without
        # it (distributed_data_parallel.py bucket_size None)
        if "--overlap-grad-reduce" in v:
            assert ns["--ddp-bucket-size"] == plan.bucket_size_mib * 2**20 // 4
        else:
            assert "--ddp-bucket-size" not in v
        parsed_any += 1
    assert parsed_any >= 17        # 4 ZeRO stages x 4 Megatron precisions + the two extra plans (one more)


@pytest.mark.parametrize("name", sorted(MATRIX))
def test_torchtitan_and_native_exports_refuse_other_architectures(tmp_path, name):
    model = _model(tmp_path, name)
    seq = MATRIX[name][1]
    wl = Workload(seq_len=seq, global_batch_size=256)
    plan = Plan(dp_degree=64, zero_stage=2, num_micro_batches=4)
    catalog = isinstance(MATRIX[name][0], str)
    if catalog:
        s = torchtitan_settings(plan, model, wl)
        assert s["flavor"] == {"8b": "8B", "70b": "70B", "405b": "405B"}[MATRIX[name][0]]
        assert native_unsupported_features(model, seq) == []
    else:
        with pytest.raises(ConfigError, match="the torchtitan export knows the Llama 3.1 flavours"):
            torchtitan_settings(plan, model, wl)
        # the native runtime builds Llama 3.1's block (SwiGLU, llama3 scaling factor 8, untied, no bias):
        # every other family differs at least in its RoPE scaling
        assert native_unsupported_features(model, seq)
        cl = make_cluster("h100", 64, None)
        doc = PlanDocument(plan=plan, model=model, gpu="h100", num_gpus=64, fabric=cl.fabric.to_dict(),
                           workload=wl, study="s", trial_id=1, engine="native")
        with pytest.raises(ConfigError, match="cannot run"):
            launch_command(doc)


def test_torchtitan_matrix_precisions_and_zero(tmp_path):
    # torchtitan 0.3.0: ZeRO 0 / 2 / 3 (no ZeRO-1), rowwise FP8 and MXFP8 (no tensorwise / delayed)
    fields = {ln.strip() for ln in (DATA / "torchtitan_config_fields.txt").read_text().splitlines()
              if not ln.startswith("#")}
    model = get_model("70b")
    wl = Workload(seq_len=8192, global_batch_size=256)
    for plan in _plans(model, 8192):
        # the first setting torchtitan lacks is named (precision, then ZeRO stage, then async collectives)
        refused = ({"fp8_tensorwise": "tensorwise", "fp8_delayed": "fp8_delayed"}.get(plan.precision)
                   or ("zero_stage 1" if plan.zero_stage == 1 else None)
                   or (None if plan.async_collectives else "async_collectives"))
        if refused:
            with pytest.raises(ConfigError, match=refused):
                torchtitan_settings(plan, model, wl)
            continue
        s = torchtitan_settings(plan, model, wl)
        for k in s["parallelism"]:
            assert f"ParallelismConfig.{k}" in fields, k
        want = {"fp8_rowwise": "float8", "mxfp8": "mxfp8"}.get(plan.precision)
        assert (s["converter"] or {}).get("kind") == want


def test_torchtitan_empty_cache_is_in_the_config_module():
    # torchtitan has no empty_cache setting: the module subclasses Trainer and empties the cache after each
    # train_step (per step, or per micro-batch with PP where the schedule runs them all in one call) or
    # forward_backward_step (per micro-batch without PP)
    from autotune.engines.torchtitan.export import torchtitan_config_module
    m, wl = get_model("8b"), Workload(seq_len=8192, global_batch_size=128)
    cases = [(Plan(dp_degree=8, num_micro_batches=16, zero_stage=2, memory_reclaim="empty_cache_per_step"),
              "train_step"),
             (Plan(dp_degree=8, num_micro_batches=16, zero_stage=2, memory_reclaim="empty_cache_per_microbatch"),
              "forward_backward_step"),
             (Plan(pp_degree=2, dp_degree=4, num_micro_batches=32, zero_stage=2, pipeline_schedule="1f1b",
                   memory_reclaim="empty_cache_per_microbatch"), "train_step")]
    for plan, hook in cases:
        src = torchtitan_config_module(plan, m, wl)
        assert f"    def {hook}(" in src and "torch.cuda.empty_cache()" in src
        assert "config = AutotuneTrainer.Config(" in src
        compile(src, "autotune_torchtitan.py", "exec")
    plain = torchtitan_config_module(Plan(dp_degree=8, num_micro_batches=16, zero_stage=2), m, wl)
    assert "empty_cache" not in plain and "config = llama3_8b()" in plain


def test_megatron_rope_theta_must_be_an_integer(tmp_path):
    model = _hf(tmp_path, "x", dict(MISTRAL_7B, rope_theta=10000.5))
    with pytest.raises(ConfigError, match=r"rope_theta 10000\.5 \(--rotary-base is an integer\)"):
        megatron_args(Plan(dp_degree=8, num_micro_batches=16), model, Workload(seq_len=4096, global_batch_size=128))


def test_megatron_bucket_equals_the_simulated_bucket():
    """The DP bucket of a Megatron launch equals the simulated one: the simulated side is the simulator's
    own bucket (CostBuilder.dp_bucket_bytes, what dp_bucket_ms costs), the launched side is derived here.

    Launched (Megatron-LM at d98e8a64): --ddp-bucket-size is "Maximum number of parameters in each bucket"
    (distributed_data_parallel_config.py bucket_size) and the bucket's grad buffer dtype is torch.float when
    grad_reduce_in_fp32 (param_and_grad_buffer.py), which --bf16 sets (arguments.py validate_args:
    accumulate_allreduce_grads_in_fp32 = True unless --grad-reduce-in-bf16): 4 bytes per parameter with
    --bf16, 2 with --grad-reduce-in-bf16. So launched bucket bytes = --ddp-bucket-size x (4 or 2).
    """
    from autotune.cost.calibration import default_calibration
    from autotune.cost.chunk_costs import CostBuilder
    from autotune.cost.op_costs import CalibratedCosts

    model, wl = get_model("8b"), Workload(seq_len=8192, global_batch_size=128)
    cluster = make_cluster("h100", 8, "nvlink4")
    costs = CalibratedCosts(profile=default_calibration(), gpu=cluster.gpu)
    for bf16_grads in (False, True):
        for mib in (1, 25, 64, 100):
            plan = Plan(dp_degree=8, num_micro_batches=16, bucket_size_mib=mib, dp_grad_reduce_overlap=True,
                        grad_reduce_in_bf16=bf16_grads)
            cb = CostBuilder(model=model, plan=plan, cluster=cluster, workload=wl, costs=costs, engine="megatron")
            # the simulator's buckets of a chunk of 10^9 parameters: full buckets, then the remainder
            buckets = cb.dp_bucket_bytes(10**9)
            assert len(buckets) >= 2
            simulated_bytes = buckets[0]
            args = megatron_args(plan, model, wl)
            assert "--bf16" in args and ("--grad-reduce-in-bf16" in args) == bf16_grads
            params = int(args[args.index("--ddp-bucket-size") + 1])
            launched_bytes = params * (2 if "--grad-reduce-in-bf16" in args else 4)    # Megatron's grad buffer
            assert launched_bytes == simulated_bytes, (mib, bf16_grads, launched_bytes, simulated_bytes)
            assert params == ddp_bucket_size(plan)
            # and the simulator reduces the whole chunk: the buckets add up to its gradients
            assert sum(buckets) == 10**9 * (2 if bf16_grads else 4)
    # by hand: 64 MiB = 67,108,864 bytes = 16,777,216 FP32 gradients
    assert ddp_bucket_size(Plan(dp_degree=8, num_micro_batches=16, bucket_size_mib=64)) == 16_777_216
    # with TP, PP and VPP (70B on 64 H100: TP 8 x PP 4 x VPP 5 x DP 2): Megatron-LM keeps one grad buffer per
    # model chunk (distributed.py DistributedDataParallel per chunk), bucketed by the same parameter count;
    # the simulator buckets each chunk's local (TP-sharded) parameters: every full bucket of every chunk is
    # the launched bucket, and each chunk's buckets add up to its gradients
    from autotune.cost.graph import chunk_costs

    model, wl = get_model("70b"), Workload(seq_len=8192, global_batch_size=64)
    cluster = make_cluster("h100", 64, "nvlink4+ib-ndr400")
    costs = CalibratedCosts(profile=default_calibration(), gpu=cluster.gpu)
    for bf16_grads in (False, True):
        plan = Plan(tp_degree=8, pp_degree=4, dp_degree=2, vpp_degree=5, pipeline_schedule="interleaved_1f1b",
                    num_micro_batches=32, sequence_parallel=True, bucket_size_mib=40, dp_grad_reduce_overlap=True,
                    grad_reduce_in_bf16=bf16_grads)
        cb = CostBuilder(model=model, plan=plan, cluster=cluster, workload=wl, costs=costs, engine="megatron")
        args = megatron_args(plan, model, wl)
        launched = int(args[args.index("--ddp-bucket-size") + 1]) * (2 if bf16_grads else 4)
        chunks = chunk_costs(cb, plan, model)
        assert len(chunks) == 20
        for cc in chunks.values():
            buckets = cb.dp_bucket_bytes(cc.params)
            assert all(b == launched for b in buckets[:-1]) and 0 < buckets[-1] <= launched
            assert sum(buckets) == cc.params * (2 if bf16_grads else 4)


def test_export_study_with_another_engine_is_refused(tmp_path):
    # a megatron study's plan exported with --engine torchtitan used to write Megatron files with exit 0
    import optuna
    from click.testing import CliRunner

    from autotune.cli.app import main

    url = f"sqlite:///{tmp_path}/s.db"
    r = CliRunner().invoke(main, ["run", "--size", "8b", "--space", "small", "--trials", "3", "--storage", url])
    assert r.exit_code == 0, r.output
    (name,) = optuna.get_all_study_names(url)
    assert "/megatron/" in name
    out = tmp_path / "launch"
    r = CliRunner().invoke(main, ["export", "--study", name, "--storage", url, "--engine", "torchtitan",
                                  "--launcher", "torchrun", "-o", str(out)])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --engine torchtitan") and "megatron" in lines[0]
    assert not out.exists()
    # the study's own engine (named or left out) exports
    r = CliRunner().invoke(main, ["export", "--study", name, "--storage", url, "--engine", "megatron",
                                  "-o", str(tmp_path / "p.yaml")])
    assert r.exit_code == 0, r.output


def test_bf16_gradient_reduction_launches_twice_the_parameters_per_bucket():
    # Plan.grad_reduce_in_bf16 (Megatron-LM --grad-reduce-in-bf16): the main-grad buffer and its reductions
    # are BF16, 2 bytes per gradient, so the simulated 64 MiB bucket holds 64 x 2^20 / 2 = 33,554,432
    # gradients, and the launch says so; the flag itself is exported too
    from autotune.cost.chunk_costs import CostBuilder
    from autotune.spec.plan import Plan

    plan = Plan(tp_degree=1, dp_degree=8, bucket_size_mib=64, grad_reduce_in_bf16=True)
    assert ddp_bucket_size(plan) == 33_554_432
    assert ddp_bucket_size(plan.replace(grad_reduce_in_bf16=False)) == 16_777_216
    from autotune.cost.op_costs import CalibratedCosts
    from autotune.cost.calibration import default_calibration
    from autotune.spec.hardware import make_cluster
    from autotune.spec.models import get_model
    from autotune.spec.plan import Workload

    cluster = make_cluster("h100", 8, "nvlink4")
    cb = CostBuilder(model=get_model("8b"), plan=plan, cluster=cluster, workload=Workload(seq_len=8192, global_batch_size=8),
                     costs=CalibratedCosts(profile=default_calibration(), gpu=cluster.gpu), engine="megatron")
    assert cb.grad_reduce_bytes == 2


def test_printed_hints_say_how_the_bucket_is_counted():
    # the flags `autotune export` prints: with Plan.grad_reduce_in_bf16 the bucket counts BF16 gradients,
    # 64 MiB x 2^20 / 2 B = 33,554,432, and --grad-reduce-in-bf16 is printed with it (without it Megatron
    # would reduce FP32 main grads and the bucket would be 128 MiB); without it 64 x 2^20 / 4 = 16,777,216
    from autotune.report.summary import launch_hints

    m, wl = get_model("8b"), Workload(seq_len=8192, global_batch_size=128)
    bf16 = launch_hints(Plan(dp_degree=8, num_micro_batches=16, bucket_size_mib=64, grad_reduce_in_bf16=True), m, wl)
    assert "--ddp-bucket-size 33554432" in bf16 and "--grad-reduce-in-bf16" in bf16 and "BF16 main grads" in bf16
    fp32 = launch_hints(Plan(dp_degree=8, num_micro_batches=16, bucket_size_mib=64), m, wl)
    assert "--ddp-bucket-size 16777216" in fp32 and "--grad-reduce-in-bf16" not in fp32 and "FP32 main grads" in fp32
