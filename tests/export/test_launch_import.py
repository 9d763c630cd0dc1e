"""Importing a user's own launch (autotune/engines/megatron/importer.py, autotune/engines/torchtitan/importer.py): a Megatron-LM
argument list for Llama 3.1 70B round-trips through import -> predict -> export with every modelled flag
unchanged; torchtitan job files and config modules round-trip through their writers; errors name the flag."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest
from torchtitan_loader import torchtitan_available

from autotune.errors import ConfigError
from autotune.export import launch_command
from autotune.cli.launch_import import import_launch
from autotune.engines.megatron.importer import (
    NOT_MODELLED,
    RUN,
    import_megatron_args,
    parse_megatron_args,
    read_args_file,
)
from autotune.spec.hardware import make_cluster
from autotune.spec.models import get_model
from autotune.spec.plan import Plan, PlanDocument, Workload

DATA = Path(__file__).resolve().parents[1] / "data" / "launches"
ARGS_70B = DATA / "llama3.1-70b_megatron_args.sh"


def _export_args(imp, gpu="h100"):
    """The argv tokens `autotune export --launcher` writes for the imported plan (the Megatron code path)."""
    cl = make_cluster(gpu, imp.num_gpus, None)
    doc = PlanDocument(plan=imp.plan, model=imp.model, gpu=gpu, num_gpus=imp.num_gpus, fabric=cl.fabric.to_dict(),
                       workload=imp.workload, study="s", trial_id=0, engine="megatron")
    return list(launch_command(doc).args)


def test_llama31_70b_megatron_args_round_trip():
    imp = import_megatron_args(ARGS_70B, num_gpus=512)
    # the model: every field of meta-llama/Llama-3.1-70B's config.json as the file gives it -> the catalog model
    assert imp.model == get_model("70b")
    # by hand from the file: dp = 512 / (TP 8 x PP 4 x CP 2) = 8; micro-batches = 512 / (1 x 8) = 64;
    # VPP = 80 layers / PP 4 / 5 layers per virtual stage = 4; bucket 33,554,432 FP32 grads x 4 B = 128 MiB
    p = imp.plan
    assert (p.tp_degree, p.pp_degree, p.cp_degree, p.dp_degree, p.vpp_degree) == (8, 4, 2, 8, 4)
    assert (p.micro_batch_size, p.num_micro_batches, p.pipeline_schedule) == (1, 64, "interleaved_1f1b")
    assert (p.sequence_parallel, p.recompute, p.zero_stage, p.precision) == (True, "selective", 1, "fp8_tensorwise")
    assert (p.dp_grad_reduce_overlap, p.param_gather_overlap, p.tp_comm_overlap, p.async_collectives) == (True,) * 4
    assert p.bucket_size_mib == 33554432 * 4 // 2**20 == 128
    assert imp.workload == Workload(seq_len=8192, global_batch_size=512)
    # predict: the simulator takes it as it is
    from autotune.cost.evaluator import make_evaluator
    cl = make_cluster("h100", 512, None)
    ev = make_evaluator("simulated", model=imp.model, cluster=cl, workload=imp.workload, engine="megatron")
    r = ev.evaluate(imp.plan)
    ev.close()
    assert r.feasible and r.step_time_ms > 0 and 0 < r.mfu < 1
    # every option of the file is modelled, or ignored as a run setting (and the vocabulary padding); none
    # is dropped unseen
    tokens, _ = read_args_file(ARGS_70B)
    given = set(parse_megatron_args(tokens, "f"))
    ignored = {s.split()[0]: why for s, why in imp.ignored}
    assert given == set(imp.modelled) | set(ignored)
    assert not set(imp.modelled) & set(ignored)
    assert {o for o, why in ignored.items() if why != RUN} == {"--make-vocab-size-divisible-by"}
    assert not imp.approximated
    # export: the flags `autotune export` writes carry, for every modelled option (the set comes from the
    # mapping, imp.modelled), the value the user gave (both parsed by the same recorded parser facts)
    exported = parse_megatron_args(_export_args(imp), "export")
    assert len(imp.modelled) >= 35
    for opt, val in imp.modelled.items():
        assert opt in exported, opt
        assert exported[opt] == val, (opt, exported[opt], val)


def test_exported_args_import_back_to_the_same_target(tmp_path):
    imp = import_megatron_args(ARGS_70B, num_gpus=512)
    f = tmp_path / "exported.txt"
    f.write_text(" \\\n".join(_export_args(imp)) + "\n")
    again = import_megatron_args(f, num_gpus=512)
    assert (again.model, again.plan, again.workload) == (imp.model, imp.plan, imp.workload)


def _write(tmp_path, text, name="args.txt"):
    f = tmp_path / name
    f.write_text(text)
    return f


BASE = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
        "--group-query-attention --num-query-groups 8 --seq-length 8192 --max-position-embeddings 131072 "
        "--position-embedding-type rope --rotary-base 500000 --use-rope-scaling --normalization RMSNorm --swiglu "
        "--disable-bias-linear --untie-embeddings-and-output-weights --attention-dropout 0 --hidden-dropout 0 "
        "--vocab-size 128256 --bf16 --micro-batch-size 1 --global-batch-size 128 --cross-entropy-loss-fusion ")


def test_llama31_8b_fields_give_the_catalog_model_and_defaults_follow_megatron(tmp_path):
    imp = import_megatron_args(_write(tmp_path, BASE), num_gpus=8)
    assert imp.model == get_model("8b")          # kv-channels default 4096 / 32 = 128, rope factor default 8
    p = imp.plan
    # no degrees: TP = PP = CP = 1, DP 8; 128 / (1 x 8) = 16 micro-batches; no --use-distributed-optimizer: ZeRO 0
    assert (p.dp_degree, p.num_micro_batches, p.zero_stage, p.dp_grad_reduce_overlap) == (8, 16, 0, False)
    # no --overlap-grad-reduce: Megatron reduces each gradient buffer as one bucket (bucket_size None); the
    # plan keeps Plan's default bucket, which the megatron profile does not use then (nothing approximated)
    assert p.bucket_size_mib == Plan().bucket_size_mib
    assert not imp.approximated


@pytest.mark.parametrize("extra,bucket,note", [
    # Megatron's default bucket with --overlap-grad-reduce: max(4e7, 1e6 x DP x CP) = 4e7 parameters
    # = 4e7 x 4 B / 2^20 = 152.59 MiB -> 153 MiB, said so
    ("--use-distributed-optimizer --overlap-grad-reduce", 153, "default"),
    # BF16 reduction: 2 bytes per parameter; 33,554,432 x 2 / 2^20 = 64 MiB exactly, modelled
    ("--overlap-grad-reduce --grad-reduce-in-bf16 --ddp-bucket-size 33554432", 64, None),
])
def test_bucket_units(tmp_path, extra, bucket, note):
    imp = import_megatron_args(_write(tmp_path, BASE + extra), num_gpus=8)
    assert imp.plan.bucket_size_mib == bucket
    if note:
        assert any(note in a and "152.59" in a for a in imp.approximated)
    else:
        assert imp.modelled["--ddp-bucket-size"] == (33554432,) and not imp.approximated


def test_uneven_layout_and_embedding_accounting(tmp_path):
    # layout: E + 3 layers | 4 | (4 | 4)*... written with Megatron's repetition grammar; 32 layers over PP 4 x VPP 2
    lay = "Ettt|tttt|(tttt|)*5,ttttt L"
    imp = import_megatron_args(_write(tmp_path, BASE + "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 "
                                      f"--pipeline-model-parallel-layout '{lay.replace(' ', '')}'"), num_gpus=8)
    assert imp.plan.stage_layers == (3, 4, 4, 4, 4, 4, 4, 5) and imp.plan.vpp_degree == 2
    exported = parse_megatron_args(_export_args(imp), "export")
    assert exported["--pipeline-model-parallel-layout"] == ("Ettt|tttt|tttt|tttt|tttt|tttt|tttt|tttttL",)
    # --account-for-embedding/loss: (32 + 2) units over PP 2 = 17 each; the first and last lose one layer
    imp2 = import_megatron_args(_write(tmp_path, BASE + "--pipeline-model-parallel-size 2 "
                                       "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split"),
                                num_gpus=8)
    assert imp2.plan.stage_layers == (16, 16)


def test_approximations_are_listed(tmp_path):
    imp = import_megatron_args(_write(tmp_path, BASE + "--tensor-model-parallel-size 2 --recompute-granularity full "
                                      "--recompute-method uniform --recompute-num-layers 2 --fp8-format e4m3 "
                                      "--fp8-recipe tensorwise --manual-gc"), num_gpus=8)
    assert imp.plan.recompute == "full" and imp.plan.recompute_num_layers == 0
    assert imp.plan.precision == "fp8_tensorwise"
    text = "\n".join(imp.report_lines())
    assert "uniform --recompute-num-layers 2" in text and "--fp8-format e4m3" in text
    assert ("--manual-gc", NOT_MODELLED) in imp.ignored
    assert "--fp8-format" not in imp.modelled and "--recompute-num-layers" not in imp.modelled


@pytest.mark.parametrize("extra,words", [
    ("--tensor-parallel-size 8", ["--tensor-parallel-size", "did you mean --tensor-model-parallel-size"]),
    ("--rotary-base 1e+06", ["--rotary-base", "int"]),
    ("--normalization rmsnorm", ["--normalization", "LayerNorm, RMSNorm"]),
    ("--num-experts 8 --moe-use-upcycling", ["--moe-use-upcycling", "upcycling a dense checkpoint"]),
    ("--rotary-interleaved", ["--rotary-interleaved", "interleaved RoPE"]),
    ("--fp8-format hybrid --fp8-recipe blockwise", ["--fp8-recipe blockwise"]),
    ("--tensor-model-parallel-size 3", ["TP 3", "does not divide --gpus 8"]),
    ("--tensor-model-parallel-size $TP", ["shell variable"]),
    ("--bf16=yes", ["--bf16 is a switch"]),
    ("--recompute-granularity full", ["--recompute-method"]),
    ("--overlap-grad-reduce --overlap-param-gather", ["--overlap-param-gather needs --use-distributed-optimizer"]),
    ("--tensor-model-parallel-size 2 --tp-comm-overlap", ["--tp-comm-overlap needs --sequence-parallel"]),
    ("--use-distributed-optimizer --overlap-param-gather", ["--overlap-param-gather needs --overlap-grad-reduce"]),
    # validate_args: interleaving asserts pipeline_model_parallel_size > 1 (> 2 with P2P overlap off)
    ("--num-layers-per-virtual-pipeline-stage 5", ["--num-layers-per-virtual-pipeline-stage 5",
                                                   "--pipeline-model-parallel-size 1", "> 1"]),
    ("--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 --no-overlap-p2p-communication",
     ["--num-virtual-stages-per-pipeline-rank 2", "> 2 with --no-overlap-p2p-communication"]),
])
def test_bad_files_are_one_error_naming_the_flag(tmp_path, extra, words):
    with pytest.raises(ConfigError) as e:
        import_megatron_args(_write(tmp_path, BASE + extra), num_gpus=8)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


def test_megatron_defaults_are_refused_by_name(tmp_path):
    # Megatron-LM's own defaults without the Llama flags: LayerNorm, learned positions, linear biases, FP32
    for drop, word in (("--normalization RMSNorm", "LayerNorm"), ("--position-embedding-type rope", "learned_absolute"),
                       ("--disable-bias-linear", "biases"), ("--bf16", "--bf16")):
        with pytest.raises(ConfigError, match=word):
            import_megatron_args(_write(tmp_path, BASE.replace(drop, "")), num_gpus=8)
    with pytest.raises(ConfigError, match="--gpus"):
        import_launch(_write(tmp_path, BASE), None, num_gpus=None)


# ---- torchtitan ----
M70, W70 = get_model("70b"), Workload(seq_len=8192, global_batch_size=512)
TT_PLAN = Plan(tp_degree=8, pp_degree=4, dp_degree=16, vpp_degree=5, pipeline_schedule="interleaved_1f1b",
               sequence_parallel=True, zero_stage=3, micro_batch_size=1, num_micro_batches=32, recompute="selective",
               precision="fp8_rowwise", compile=True, tp_comm_overlap=True)


def test_torchtitan_toml_round_trip(tmp_path):
    from autotune.engines.torchtitan.export import torchtitan_settings
    from autotune.engines.torchtitan.job import job_toml
    f = _write(tmp_path, job_toml(TT_PLAN, M70, W70, steps=10, hf_assets_path="/tok"), "job.toml")
    imp = import_launch(f, None, num_gpus=512)
    assert imp.engine == "torchtitan" and imp.model == M70 and imp.workload == W70
    # the settings a torchtitan export of the imported plan writes are those of the plan that wrote the file
    assert torchtitan_settings(imp.plan, imp.model, imp.workload) == torchtitan_settings(TT_PLAN, M70, W70)
    assert any(s.startswith("training.steps") for s, _ in imp.ignored)


def test_torchtitan_toml_defaults_and_refusals(tmp_path):
    from autotune.engines.torchtitan.importer import import_toml
    base = '[model]\nname = "llama3"\nflavor = "8B"\n[activation_checkpoint]\nmode = "full"\n'
    imp = import_toml(_write(tmp_path, base, "a.toml"), num_gpus=8)
    # 0.2.x defaults: seq 2048, local batch 8, data_parallel_shard_degree -1 -> 8 (FSDP, reshard default =
    # always without PP -> ZeRO-3), global -1 -> 8 x 8 = 64 sequences
    assert imp.workload == Workload(seq_len=2048, global_batch_size=64)
    assert (imp.plan.dp_degree, imp.plan.zero_stage, imp.plan.micro_batch_size) == (8, 3, 8)
    for extra, word in (('[parallelism]\ndata_parallel_shard_degree = 2\ndata_parallel_replicate_degree = 4\n', "HSDP"),
                        ('[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = "ZBVZeroBubble"\n',
                         "ZBVZeroBubble")):
        with pytest.raises(ConfigError, match=word):
            import_toml(_write(tmp_path, base + extra, "b.toml"), num_gpus=8)
    # the default selective_ac_option "2" (every 2nd layer fully recomputed) is not a mode autotune models
    with pytest.raises(ConfigError, match="selective_ac_option '2'"):
        import_toml(_write(tmp_path, base.replace('"full"', '"selective"'), "c.toml"), num_gpus=8)
    with pytest.raises(ConfigError, match="flavour 'debugmodel'"):
        import_toml(_write(tmp_path, '[model]\nname = "llama3"\n', "d.toml"), num_gpus=8)


def test_torchtitan_default_split_is_torchtitans():
    from autotune.engines.torchtitan.importer import stage_split
    # by hand: 80 layers + 1 + 1 = 82 units over 8 stages: 10 each, the first 2 get 11; stage 0 gives one to
    # the embedding, stage 7 one to the output -> 10, 11, 10, 10, 10, 10, 10, 9
    assert stage_split(80, 8) == (10, 11, 10, 10, 10, 10, 10, 9)
    try:
        pp = importlib.import_module("torchtitan.distributed.pipeline_parallel")
    except Exception:      # noqa: BLE001 - torchtitan not importable: the hand derivation above stands
        return
    for layers, stages in ((80, 8), (126, 16), (32, 4), (80, 3)):
        parts = pp._generate_llm_fqn_per_model_part(stages, layers, 1, 1)
        assert stage_split(layers, stages) == tuple(sum(f.startswith("layers.") for f in part) for part in parts)




def test_torchtitan_config_module_round_trip(tmp_path):
    if not torchtitan_available():
        pytest.skip("torchtitan >= 0.3.0 not importable (pip install -e '.[torchtitan]' (in the autotune checkout))")
    from autotune.export import write_launch_files
    from autotune.engines.torchtitan.export import torchtitan_settings
    for plan in (TT_PLAN, dataclasses.replace(TT_PLAN, pp_degree=2, vpp_degree=1, dp_degree=32, pipeline_schedule="1f1b",
                                              num_micro_batches=16, zero_stage=2, precision="mxfp8",
                                              memory_reclaim="empty_cache_per_step"),
                 # the allocator setting: the config function sets PYTORCH_CUDA_ALLOC_CONF (as the launch script)
                 dataclasses.replace(TT_PLAN, memory_reclaim="expandable_segments")):
        cl = make_cluster("b200", 512, None)
        doc = PlanDocument(plan=plan, model=M70, gpu="b200", num_gpus=512, fabric=cl.fabric.to_dict(), workload=W70,
                           study="s", trial_id=0, engine="torchtitan")
        d = tmp_path / f"{plan.precision}-{plan.memory_reclaim}"
        write_launch_files(doc, d, "torchrun")
        imp = import_launch(d / "autotune_torchtitan.py", None, num_gpus=512)
        assert imp.fmt == "torchtitan 0.3 config" and imp.model == M70 and imp.workload == W70
        assert torchtitan_settings(imp.plan, imp.model, imp.workload) == torchtitan_settings(plan, M70, W70)
        assert imp.plan.memory_reclaim == plan.memory_reclaim


def test_torchtitan_config_module_needs_torchtitan(tmp_path, monkeypatch):
    import sys

    from autotune.engines.torchtitan import importer
    f = _write(tmp_path, "def autotune_plan():\n    raise SystemExit('must not run')\n", "cfg.py")
    # the module loads in a child process: its interpreter is this one with torchtitan made unimportable
    fake = tmp_path / "python-without-torchtitan"
    fake.write_text(f"#!/bin/sh\nshift\nexec {sys.executable} -I -c 'import runpy, sys; sys.modules[\"torchtitan\"] = None; "
                    f"sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name=\"__main__\")' \"$@\"\n")
    fake.chmod(0o755)
    monkeypatch.setattr(importer, "PYTHON", str(fake))
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[torchtitan\]'"):
        import_launch(f, None, num_gpus=8)


def test_every_megatron_export_of_the_matrix_imports_to_the_same_launch(tmp_path):
    """export -> import -> export is the identity on the argument list, for the export matrix's plans
    (ZeRO 0-3 incl. Megatron-FSDP, VPP, uneven layouts, recompute block N, BF16 / FP8 recipes, overlap on and
    off, reclaim policies) of a catalog and a Qwen2-style model (Q/K/V biases, no RoPE scaling)."""
    from test_export_matrix import QWEN25_7B, _hf, _plans

    from autotune.engines.megatron.export import megatron_args
    models = [(get_model("70b"), 8192), (_hf(tmp_path, "qwen", QWEN25_7B), 8192)]
    n = 0
    for model, seq in models:
        w = Workload(seq_len=seq, global_batch_size=256)
        for plan in _plans(model, seq):
            if plan.precision == "fp8_rowwise":        # refused by the Megatron export
                continue
            plan = dataclasses.replace(plan, num_micro_batches=256 // (plan.micro_batch_size * plan.dp_degree))
            args = megatron_args(plan, model, w)
            f = _write(tmp_path, " ".join(args), f"a{n}.txt")
            imp = import_megatron_args(f, num_gpus=plan.num_gpus)
            assert dataclasses.replace(imp.model, name=model.name) == model
            assert megatron_args(imp.plan, imp.model, imp.workload) == args, plan
            n += 1
    assert n == 2 * (16 + 2)


def test_uneven_interleaved_first_last_and_bad_torchtitan_values_are_named(tmp_path):
    with pytest.raises(ConfigError, match="--pipeline-model-parallel-layout"):
        import_megatron_args(_write(tmp_path, BASE + "--pipeline-model-parallel-size 2 "
                                    "--num-layers-per-virtual-pipeline-stage 4 --decoder-first-pipeline-num-layers 6"),
                             num_gpus=8)
    # first / last without VPP: 32 - 6 - 10 = 16 layers over the 2 middle stages of PP 4
    imp = import_megatron_args(_write(tmp_path, BASE + "--pipeline-model-parallel-size 4 "
                                      "--decoder-first-pipeline-num-layers 6 --decoder-last-pipeline-num-layers 10"),
                               num_gpus=8)
    assert imp.plan.stage_layers == (6, 8, 8, 10)
    from autotune.engines.torchtitan.importer import import_toml
    f = _write(tmp_path, '[model]\nname = "llama3"\nflavor = "8B"\n[activation_checkpoint]\nmode = "none"\n'
                         '[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_microbatch_size = 0\n', "z.toml")
    with pytest.raises(ConfigError, match="pipeline_parallel_microbatch_size 0"):
        import_toml(f, num_gpus=8)


def test_a_users_own_torchtitan_config_function(tmp_path):
    if not torchtitan_available():
        pytest.skip("torchtitan >= 0.3.0 not importable (pip install -e '.[torchtitan]' (in the autotune checkout))")
    f = _write(tmp_path, "from torchtitan.models.llama3.config_registry import llama3_70b\n\n\n"
                         "def helper():\n    return 1\n\n\n"
                         "def my_run():\n    c = llama3_70b()\n    c.parallelism.tensor_parallel_degree = 8\n"
                         "    c.parallelism.pipeline_parallel_degree = 4\n"
                         "    c.parallelism.pipeline_parallel_schedule = 'Interleaved1F1B'\n"
                         "    c.training.local_batch_size = 16\n    c.training.global_batch_size = 512\n"
                         "    c.training.seq_len = 8192\n    c.training.disable_cuda_graphs = True\n    return c\n",
               "my_tt.py")
    with pytest.raises(ConfigError, match="name the config function"):       # two functions: which one?
        import_launch(f, None, num_gpus=512)
    imp = import_launch(f"{f}:my_run", None, num_gpus=512)
    p = imp.plan
    # by hand: DP shard -1 -> 512 / (8 x 4) = 16 (FSDP; reshard "default" with PP = never -> ZeRO-2);
    # Interleaved1F1B without a split: 2 stages per rank = 8, torchtitan's default split of 80 layers;
    # pipeline micro-batch 1 -> 512 / (1 x 16) = 32 micro-batches; llama3_70b(): FullAC, BF16, no compile
    assert (p.dp_degree, p.zero_stage, p.vpp_degree, p.num_micro_batches) == (16, 2, 2, 32)
    assert p.layers_per_virtual_stage(80) == (10, 11, 10, 10, 10, 10, 10, 9)
    assert (p.recompute, p.precision, p.compile) == ("full", "bf16", False)
    # local batch 16 < 512 / 16: 2 accumulation steps of 16 micro-batches each, said so
    assert any("2 steps of 16 micro-batches" in a for a in imp.approximated)


def test_enum_options_take_the_member_names_megatron_converts():
    # Megatron's ArgumentGroupFactory._get_enum_kwargs: type=enum_type_handler = lambda s: config_type[s] (the
    # member NAME), choices=list(config_type); argparse checks the converted member against the choices. So
    # `--attention-backend fused` (Megatron-LM's own examples) and `--exit-signal SIGTERM` parse; the str() of a
    # member (`AttnBackend.fused`, and `15` for signal.Signals.SIGTERM, an IntEnum) is not a member name.
    assert parse_megatron_args(["--attention-backend", "fused"], "f") == {"--attention-backend": ("fused",)}
    assert parse_megatron_args(["--exit-signal", "SIGTERM"], "f") == {"--exit-signal": ("SIGTERM",)}
    # Enum["SIGIOT"] resolves the alias of SIGABRT (Python's signal module): accepted as Megatron accepts it
    assert parse_megatron_args(["--exit-signal", "SIGIOT"], "f")["--exit-signal"] == ("SIGIOT",)
    for opt, bad, listed in (("--attention-backend", "AttnBackend.fused", "flash, fused, unfused, local, auto"),
                             ("--exit-signal", "15", "SIGTERM")):
        with pytest.raises(ConfigError, match="valid values") as e:
            parse_megatron_args([opt, bad], "f")
        assert listed in str(e.value)


def _export_dir(imp, tmp_path, plan):
    from autotune.export import write_launch_files
    cl = make_cluster("h100", imp.num_gpus, None)
    doc = PlanDocument(plan=plan, model=imp.model, gpu="h100", num_gpus=imp.num_gpus, fabric=cl.fabric.to_dict(),
                       workload=imp.workload, study="s", trial_id=0, engine="megatron")
    write_launch_files(doc, tmp_path / "launch", "torchrun")
    return tmp_path / "launch" / "launch_torchrun.sh"


def test_exported_launch_script_imports_back_with_its_allocator_setting(tmp_path):
    import os
    import subprocess
    imp = import_megatron_args(ARGS_70B, num_gpus=512)
    plan = dataclasses.replace(imp.plan, memory_reclaim="expandable_segments")
    script = _export_dir(imp, tmp_path, plan)
    text = script.read_text()
    # one option with its values per line: every continued line of the command array starts with an option
    # (or is torchrun's / the script's word), never with a value left over from the line above
    body = text[text.index("CMD=("):text.index('"$@")')].splitlines()[1:]
    assert all(ln.strip().startswith(("--", '"$MEGATRON_LM')) for ln in body if ln.strip()), body
    assert "  --num-query-groups 8 \\" in text and "  --seq-length 8192 \\" in text
    # autotune's own script (shell variables in torchrun's words, $HERE, an array) imports: the same plan,
    # the allocator setting included (export writes `export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`)
    again = import_megatron_args(script, num_gpus=512)
    assert (again.model, again.plan, again.workload) == (imp.model, plan, imp.workload)
    assert not any("PYTORCH_CUDA_ALLOC_CONF" in s for s, _ in again.ignored)
    # the --dry-run output (env lines, then the expanded command) imports to the same plan too
    dry = subprocess.run(["bash", str(script), "--dry-run"], capture_output=True, text=True,
                         env={**os.environ, "MEGATRON_LM": "/opt/Megatron-LM"}, check=True).stdout
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in dry
    again2 = import_megatron_args(_write(tmp_path, dry, "dry.txt"), num_gpus=512)
    assert again2.plan == plan
    # without the setting: memory reclaim none, as the plan
    (tmp_path / "b").mkdir()
    script0 = _export_dir(imp, tmp_path / "b", imp.plan)
    assert import_megatron_args(script0, num_gpus=512).plan.memory_reclaim == "none" == imp.plan.memory_reclaim


def test_shell_variables_in_the_megatron_arguments_say_to_expand_them(tmp_path):
    for words in ('torchrun --node-rank "$NODE_RANK" pretrain_gpt.py ' + BASE + "--tensor-model-parallel-size $TP",
                  # an array appended to (its words depend on the script's run): still refused
                  'MODEL_ARGS=(--lr 1e-4)\nMODEL_ARGS+=(--seed 2)\ntorchrun pretrain_gpt.py ${MODEL_ARGS[@]} ' + BASE,
                  # a variable assigned twice, or from another variable
                  'MBS=1\nMBS=2\ntorchrun pretrain_gpt.py --micro-batch-size $MBS ' + BASE,
                  'TP=$1\ntorchrun pretrain_gpt.py --tensor-model-parallel-size $TP ' + BASE):
        with pytest.raises(ConfigError, match=r"in the Megatron-LM arguments holds a shell variable; expand it") as e:
            import_megatron_args(_write(tmp_path, words), num_gpus=8)
        assert "--dry-run" in str(e.value)
    # shell syntax in torchrun's words is the launcher's: listed as ignored
    imp = import_megatron_args(_write(tmp_path, 'torchrun --node-rank "$NODE_RANK" pretrain_gpt.py ' + BASE), num_gpus=8)
    assert imp.ignored[0] == ("torchrun --node-rank $NODE_RANK pretrain_gpt.py", "the launcher's words before the script")


def test_bucket_without_overlap_costs_the_same_from_the_plan_and_from_its_launch(tmp_path):
    from autotune.cost.evaluator import make_evaluator
    from autotune.cost.memory import estimate_memory
    imp = import_megatron_args(_write(tmp_path, BASE + "--tensor-model-parallel-size 2 --use-distributed-optimizer "
                                      "--ddp-bucket-size 33554432"), num_gpus=8)
    assert not imp.plan.dp_grad_reduce_overlap
    assert ("--ddp-bucket-size 33554432", "no effect without --overlap-grad-reduce (one bucket per gradient buffer)") \
        in imp.ignored
    plan128 = dataclasses.replace(imp.plan, bucket_size_mib=128)
    # export writes no --ddp-bucket-size without --overlap-grad-reduce (Megatron would not use it)
    assert "--ddp-bucket-size" not in _export_args(dataclasses.replace(imp, plan=plan128))
    cl = make_cluster("h100", 8, None)
    ev = make_evaluator("simulated", model=imp.model, cluster=cl, workload=imp.workload, engine="megatron")
    a, b = ev.evaluate(plan128), ev.evaluate(imp.plan)
    # Megatron: bucket_size None without overlap, one bucket per buffer reduced in place: the plan's bucket
    # changes nothing, so the plan (128 MiB) and the imported launch (default bucket) cost the same
    assert (a.step_time_ms, a.peak_memory_bytes) == (b.step_time_ms, b.peak_memory_bytes)
    # and the plan table says so for megatron, not "128 MiB" beside the import's "64 MiB" for the same launch
    from autotune.report.summary import plan_rows
    assert dict(plan_rows(plan128, "megatron"))["DP bucket"] == dict(plan_rows(imp.plan, "megatron"))["DP bucket"] \
        == "one per gradient buffer (no overlapped reduction)"
    assert dict(plan_rows(plan128, "native"))["DP bucket"] == "128 MiB"      # native DDP buckets regardless
    gpu = cl.gpu

    def peak(pl):
        return estimate_memory(imp.model, pl, gpu, imp.workload, engine="megatron").peak_bytes
    assert peak(plan128) == peak(dataclasses.replace(plan128, bucket_size_mib=1))
    # with --overlap-grad-reduce the bucket matters: two 128 MiB buckets staged vs two 1 MiB ones: >= 254 MiB
    # more (the allocator overhead fraction adds to it)
    ov = dataclasses.replace(plan128, dp_grad_reduce_overlap=True)
    assert peak(ov) - peak(dataclasses.replace(ov, bucket_size_mib=1)) >= 2 * 127 * 2**20


def test_torchtitan_toml_typo_in_a_known_section_is_an_error(tmp_path):
    from autotune.engines.torchtitan.importer import import_toml
    base = ('[model]\nname = "llama3"\nflavor = "8B"\n[activation_checkpoint]\nmode = "full"\n[parallelism]\n')
    # torchtitan's Parallelism has tensor_parallel_degree; "tensor_paralel_degree" is a typo torchtitan's parser
    # refuses, so it must not be costed as TP 1
    with pytest.raises(ConfigError, match=r"\[parallelism\] tensor_paralel_degree .*did you mean "
                                          r"tensor_parallel_degree\?"):
        import_toml(_write(tmp_path, base + "tensor_paralel_degree = 2\n", "t.toml"), num_gpus=8)
    # a known setting autotune does not model stays ignored; so does a section autotune has no field list for
    imp = import_toml(_write(tmp_path, base + "disable_loss_parallel = true\n[comm]\ntrace_buf_sizee = 1\n", "u.toml"),
                      num_gpus=8)
    assert ("parallelism.disable_loss_parallel = True", NOT_MODELLED) in imp.ignored
    assert any(s.startswith("comm.trace_buf_sizee") for s, _ in imp.ignored)


def test_a_torchtitan_launch_script_given_as_megatron_names_its_config(tmp_path):
    from autotune.export import write_launch_files
    cl = make_cluster("b200", 512, None)
    doc = PlanDocument(plan=TT_PLAN, model=M70, gpu="b200", num_gpus=512, fabric=cl.fabric.to_dict(), workload=W70,
                       study="s", trial_id=0, engine="torchtitan")
    write_launch_files(doc, tmp_path / "tt", "torchrun")
    with pytest.raises(ConfigError, match=r"a torchtitan launch .*--from-torchtitan .*autotune_torchtitan\.py"):
        import_megatron_args(tmp_path / "tt" / "launch_torchrun.sh", num_gpus=512)


# laid out as Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh: bash arrays (multi-line, comments,
# a \ continuation inside, a quoted reference), literal scalars (the script path too), torchrun's words from an
# array, a computed variable and a command substitution on other lines
MEGATRON_EXAMPLE = """#!/bin/bash
GPUS_PER_NODE=8
NUM_NODES=2
MASTER_ADDR=${MASTER_ADDR:-"localhost"}
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))
PRETRAIN_SCRIPT_PATH="examples/classes/pretrain_gpt.py"
mkdir -p "$(dirname "$CHECKPOINT_PATH")"
TP=2
CHECKPOINT_PATH=/ckpt/llama
DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --master_addr $MASTER_ADDR
)
GPT_MODEL_ARGS=(
    --num-layers 32   # Llama 3.1 8B
    --hidden-size 4096 --ffn-hidden-size 14336 \
    --num-attention-heads 32
    --group-query-attention --num-query-groups 8 --seq-length 8192 --max-position-embeddings 131072
    --position-embedding-type rope --rotary-base 500000 --use-rope-scaling --normalization RMSNorm --swiglu
    --disable-bias-linear --untie-embeddings-and-output-weights --attention-dropout 0 --hidden-dropout 0
)
TRAINING_ARGS=(--micro-batch-size 1 --global-batch-size 128 --bf16 --save ${CHECKPOINT_PATH}/run1)
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size $TP
	--pipeline-model-parallel-size 2 # tab-indented, a comment after the value
)
torchrun ${DISTRIBUTED_ARGS[@]} "$PRETRAIN_SCRIPT_PATH" \
    ${GPT_MODEL_ARGS[@]} \
    "${TRAINING_ARGS[@]}" \
    ${MODEL_PARALLEL_ARGS[@]} --vocab-size 128256
"""


def test_megatron_examples_array_layout_is_expanded(tmp_path):
    f = _write(tmp_path, MEGATRON_EXAMPLE, "train.sh")
    got = import_megatron_args(f, num_gpus=None)
    # by hand: torchrun --nproc_per_node 8 (GPUS_PER_NODE=8) x --nnodes 2 (NUM_NODES=2) = 16 GPUs;
    # TP 2 (TP=2 via the array), PP 2 -> DP 16 / 4 = 4; 128 sequences / (DP 4 x micro-batch 1) = 32 micro-batches
    assert got.num_gpus == 16
    assert (got.plan.tp_degree, got.plan.pp_degree, got.plan.dp_degree) == (2, 2, 4)
    assert got.plan.num_micro_batches == 32 and got.workload.global_batch_size == 128
    # the same arguments written out on one line import to the same launch
    flat = _write(tmp_path, "pretrain_gpt.py " + BASE + "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                  "--save /ckpt/llama/run1 --vocab-size 128256", "flat.txt")
    ref = import_megatron_args(flat, num_gpus=16)
    assert (got.model, got.plan, got.workload) == (ref.model, ref.plan, ref.workload)
    # the scalar inside an array element is expanded too (CHECKPOINT_PATH assigned once)
    assert ("--save /ckpt/llama/run1", RUN) in got.ignored
    # MASTER_ADDR=${MASTER_ADDR:-"localhost"}, assigned once: read as its default, localhost
    assert got.ignored[0] == ("torchrun --nproc_per_node 8 --nnodes 2 --master_addr localhost "
                              "examples/classes/pretrain_gpt.py",
                              "the launcher's words before the script")


@pytest.mark.parametrize("launcher, world", [
    ("torchrun --nnodes 16 --nproc-per-node 8", 128),                       # 16 x 8
    ("torchrun --nnodes=4 --nproc_per_node=8 --node-rank $R", 32),          # 4 x 8, torchrun's = and _ spellings
    ("python -m torch.distributed.run --nproc_per_node 4 --nnodes 2", 8),   # 2 x 4
    ("torchrun --nnodes 1:4 --nproc-per-node 8", None),                     # elastic range: not a count
    ("torchrun --nproc-per-node 8", None),                                  # nodes not given
    ('torchrun --nnodes "$NNODES" --nproc-per-node 8', None),               # a variable
])
def test_launcher_world_size_is_checked_against_gpus(tmp_path, launcher, world):
    f = _write(tmp_path, launcher + " pretrain_gpt.py " + BASE)
    if world is None:
        with pytest.raises(ConfigError, match=r"give --gpus N"):
            import_megatron_args(f, num_gpus=None)
        assert import_megatron_args(f, num_gpus=64).num_gpus == 64
        return
    assert import_megatron_args(f, num_gpus=None).num_gpus == world
    assert import_megatron_args(f, num_gpus=world).num_gpus == world
    with pytest.raises(ConfigError, match=rf"--gpus {world // 2} differs from the launch's {world} GPUs") as e:
        import_megatron_args(f, num_gpus=world // 2)
    assert len(str(e.value).splitlines()) == 1
