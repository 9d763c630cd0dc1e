"""Launch files (autotune.export): Megatron-LM flags against the real parser's option names, the
torchtitan config module against torchtitan 0.3.0 (its own loader when importable, else its dataclass
fields), the scripts' --dry-run."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from torchtitan_loader import torchtitan_available

from autotune.errors import ConfigError
from autotune.export import launch_file_names, write_launch_files
from autotune.engines.megatron.export import megatron_args, megatron_env
from autotune.engines.torchtitan.export import module_fqns_per_model_part, torchtitan_settings
from autotune.spec.hardware import make_cluster
from autotune.spec.models import get_model
from autotune.spec.plan import Plan, PlanDocument, Workload

DATA = Path(__file__).resolve().parents[1] / "data"
#: option strings of Megatron-LM's parser at a pinned commit (tests/data/extract_megatron_args.py)
MEGATRON_OPTIONS = {ln.strip() for ln in (DATA / "megatron_args.txt").read_text().splitlines()
                    if ln.startswith("--")}
M405, M8 = get_model("405b"), get_model("8b")
W405 = Workload.from_tokens(seq_len=8192, global_batch_tokens=16 * 2**20)   # 2048 sequences
W8 = Workload(seq_len=8192, global_batch_size=128)

#: plans that reach every branch of megatron.plan_args (degrees multiply to the GPU count)
PLANS_405 = [
    Plan(tp_degree=8, pp_degree=2, dp_degree=64, vpp_degree=7, pipeline_schedule="interleaved_1f1b",
         sequence_parallel=True, recompute="selective", zero_stage=1, micro_batch_size=1, num_micro_batches=32,
         dp_grad_reduce_overlap=True, param_gather_overlap=True, tp_comm_overlap=True, precision="fp8_delayed"),
    Plan(tp_degree=2, pp_degree=16, cp_degree=2, dp_degree=16, vpp_degree=2, pipeline_schedule="interleaved_1f1b",
         stage_layers=(3,) + (4,) * 30 + (3,), recompute="full", zero_stage=1, micro_batch_size=2,
         num_micro_batches=64, memory_reclaim="empty_cache_per_step", precision="mxfp8"),
    Plan(tp_degree=8, pp_degree=2, dp_degree=64, pipeline_schedule="1f1b", zero_stage=3, micro_batch_size=1,
         num_micro_batches=32, memory_reclaim="expandable_segments", precision="fp8_tensorwise"),
    Plan(tp_degree=8, pp_degree=2, dp_degree=64, pipeline_schedule="gpipe", zero_stage=2, micro_batch_size=1,
         num_micro_batches=32),
]


def test_megatron_catalog_is_the_real_parser():
    # sanity of the data file: hundreds of options, including the classic ones
    assert len(MEGATRON_OPTIONS) > 500
    assert {"--tensor-model-parallel-size", "--num-layers", "--fp8-recipe"} <= MEGATRON_OPTIONS
    assert "--tensor-parallel-size" not in MEGATRON_OPTIONS      # a plausible name that is not Megatron's


@pytest.mark.parametrize("plan", PLANS_405, ids=range(len(PLANS_405)))
def test_every_megatron_flag_is_a_real_argument(plan):
    args = megatron_args(plan, M405, W405)
    flags = [a for a in args if a.startswith("--")]
    unknown = [f for f in flags if f not in MEGATRON_OPTIONS]
    assert not unknown, unknown
    assert len(flags) == len(set(flags)), "a flag given twice"


def test_megatron_values_by_hand():
    p = PLANS_405[1]
    a = megatron_args(p, M405, W405)
    val = {a[i]: a[i + 1] for i in range(len(a) - 1) if a[i].startswith("--") and not a[i + 1].startswith("--")}
    # Llama 3.1 405B (Meta's config.json): 126 layers, width 16384, FFN 53248, 128 heads, 8 KV heads
    assert (val["--num-layers"], val["--hidden-size"], val["--ffn-hidden-size"]) == ("126", "16384", "53248")
    assert (val["--num-attention-heads"], val["--num-query-groups"]) == ("128", "8")
    assert val["--global-batch-size"] == "2048"      # 16 Mi tokens / 8192
    # layout: 32 virtual stages, 3 + 30 x 4 + 3 = 126 layers, embedding first, loss last
    lay = val["--pipeline-model-parallel-layout"].split("|")
    assert len(lay) == 32 and lay[0] == "Ettt" and lay[-1] == "tttL" and sum(s.count("t") for s in lay) == 126
    # --ddp-bucket-size counts parameters, and with --bf16 Megatron's grad buffer is FP32 (4 bytes):
    # 64 MiB = 67,108,864 bytes / 4 = 16,777,216 parameters (test_megatron_bucket.py derives both sides)
    assert p.bucket_size_mib == 64 and val["--ddp-bucket-size"] == "16777216"
    assert "--use-distributed-optimizer" in a and val["--fp8-recipe"] == "mxfp8"
    z3 = megatron_args(PLANS_405[2], M405, W405)
    assert z3[z3.index("--data-parallel-sharding-strategy") + 1] == "optim_grads_params"
    # environment: TP > 1 on Hopper without FSDP -> CUDA_DEVICE_MAX_CONNECTIONS=1; FSDP forbids it
    assert megatron_env(PLANS_405[0], "hopper") == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert megatron_env(PLANS_405[0], "blackwell") == {}
    assert megatron_env(PLANS_405[2], "hopper") == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    with pytest.raises(ConfigError, match="rowwise"):
        megatron_args(Plan(dp_degree=8, precision="fp8_rowwise"), M8, W8)


def test_torchtitan_fqns_cover_every_layer_once():
    p = PLANS_405[1]
    parts = module_fqns_per_model_part(p, M405)
    layers = [f for part in parts for f in part if f.startswith("layers.")]
    assert layers == [f"layers.{i}" for i in range(126)]
    assert len(parts) == 32 and parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
    assert [len(x) for x in parts] == [4] + [4] * 30 + [5]   # 3 layers + embedding; 3 layers + norm + head


def test_torchtitan_settings_match_the_dataclass_fields():
    """Structural check (always runs): every field set exists in torchtitan 0.3.0's config dataclasses."""
    fields = {ln.strip() for ln in (DATA / "torchtitan_config_fields.txt").read_text().splitlines()
              if not ln.startswith("#")}
    for plan in [PLANS_405[3]] + [tp for tp, _ in TT_PLANS]:
        s = torchtitan_settings(plan, M405, W405)
        for k in s["parallelism"]:
            assert f"ParallelismConfig.{k}" in fields, k
        for k in s["training"]:
            assert f"TrainingConfig.{k}" in fields, k
        for k in s["compile"]:
            assert f"CompileConfig.{k}" in fields, k
    s = torchtitan_settings(PLANS_405[3], M405, W405)
    assert s["parallelism"]["fsdp_reshard_after_forward"] == "never"       # ZeRO-2
    assert s["parallelism"]["data_parallel_shard_degree"] == 64
    assert s["training"]["local_batch_size"] == 32                          # 1 x 32 micro-batches per DP rank
    with pytest.raises(ConfigError, match="tensorwise"):
        torchtitan_settings(PLANS_405[2], M405, W405)




def _doc(plan, model, workload, engine, gpu="h200", gpus=1024):
    cl = make_cluster(gpu, gpus, None)
    return PlanDocument(plan=plan, model=model, gpu=gpu, num_gpus=gpus, fabric=cl.fabric.to_dict(),
                        workload=workload, study="s", trial_id=1, engine=engine)


TT_PLANS = [
    (Plan(tp_degree=2, pp_degree=16, cp_degree=2, dp_degree=16, vpp_degree=2, pipeline_schedule="interleaved_1f1b",
          stage_layers=(3,) + (4,) * 30 + (3,), recompute="full", zero_stage=3, micro_batch_size=2,
          num_micro_batches=64, precision="mxfp8", compile=True), "always"),
    (Plan(tp_degree=8, pp_degree=2, dp_degree=64, pipeline_schedule="1f1b", zero_stage=2, recompute="selective",
          micro_batch_size=1, num_micro_batches=32, precision="fp8_rowwise"), "never"),
    # torchtitan has no empty_cache setting: the module's AutotuneTrainer (a Trainer subclass) does it
    (Plan(tp_degree=8, pp_degree=2, dp_degree=64, pipeline_schedule="1f1b", zero_stage=2, recompute="selective",
          micro_batch_size=1, num_micro_batches=32, precision="fp8_rowwise", memory_reclaim="empty_cache_per_step"),
     "never"),
]


@pytest.mark.parametrize("plan,reshard", TT_PLANS, ids=["zero3-interleaved-mxfp8", "zero2-1f1b-fp8",
                                                        "zero2-empty-cache-per-step"])
def test_torchtitan_config_loads_with_torchtitans_loader(plan, reshard, tmp_path, monkeypatch):
    if not torchtitan_available():
        pytest.skip("torchtitan >= 0.3.0 not importable (pip install 'torchtitan>=0.3.0' on a newer torch, or set "
                    "TORCHTITAN_PYTHONPATH); the structural check above ran instead")
    import torchtitan.models.llama3 as ll3
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    write_launch_files(_doc(plan, M405, W405, "torchtitan"), tmp_path, "torchrun")
    # float8 / MXFP8 converters check for a Hopper / Blackwell GPU and torchao when built (inside
    # model_registry); record the converters and build the BF16 model spec on this CPU machine
    seen = {}
    real = ll3.model_registry

    def registry(flavor, converters=None, **kw):
        seen["flavor"], seen["converters"] = flavor, converters
        return real(flavor, **kw)

    monkeypatch.setattr(ll3, "model_registry", registry)
    # torchtitan's own llama3_405b() (the base) builds a float8 converter too
    monkeypatch.setattr(importlib.import_module("torchtitan.models.llama3.config_registry"), "model_registry",
                        registry)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("autotune_torchtitan", None)
    cfg = ConfigManager().parse_args(["--module", "autotune_torchtitan", "--config", "autotune_plan"])
    par = cfg.parallelism
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.context_parallel_degree) == \
        (plan.tp_degree, plan.pp_degree, plan.cp_degree)
    assert par.data_parallel_shard_degree == plan.dp_degree and par.data_parallel_replicate_degree == 1
    assert par.fsdp_reshard_after_forward == reshard
    assert par.pipeline_parallel_schedule == {"interleaved_1f1b": "Interleaved1F1B", "1f1b": "1F1B"}[
        plan.pipeline_schedule]
    assert par.module_fqns_per_model_part == module_fqns_per_model_part(plan, M405)
    assert len(par.module_fqns_per_model_part) == plan.pp_degree * plan.vpp_degree
    assert cfg.training.global_batch_size == 2048 and cfg.training.seq_len == 8192
    assert cfg.training.local_batch_size == plan.micro_batch_size * plan.num_micro_batches
    assert isinstance(cfg.activation_checkpoint, FullAC.Config if plan.recompute == "full" else SelectiveAC.Config)
    assert cfg.compile.enable is plan.compile
    assert seen["flavor"] == "405B" and len(seen["converters"]) == 1
    conv = seen["converters"][0]
    if plan.precision == "fp8_rowwise":
        assert conv.recipe_name == "rowwise" and conv.filter_fqns == ["lm_head"]
    else:
        assert conv.fqns == ["layers."]
    # config.build() (torchtitan.train) builds the Config's _owner: the Trainer that empties the cache
    from torchtitan.trainer import Trainer
    owner = type(cfg)._owner
    assert issubclass(owner, Trainer)
    if plan.memory_reclaim == "empty_cache_per_step":
        assert owner.__name__ == "AutotuneTrainer" and "train_step" in vars(owner)
    else:
        assert owner is Trainer


@pytest.mark.parametrize("engine", ["megatron", "torchtitan", "native"])
def test_scripts_dry_run_print_the_full_command(engine, tmp_path):
    plan = TT_PLANS[0][0] if engine != "megatron" else PLANS_405[1]
    doc = _doc(plan, M405, W405, engine, gpu="h200", gpus=1024)
    paths = write_launch_files(doc, tmp_path, "slurm")
    names = sorted(p.name for p in paths)
    assert "launch_torchrun.sh" in names and "launch_slurm.sbatch" in names and "plan.yaml" in names
    assert PlanDocument.load(tmp_path / "plan.yaml").plan == plan
    r = subprocess.run(["bash", str(tmp_path / "launch_torchrun.sh"), "--dry-run"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    if engine == "megatron":
        # 1024 H200 / 8 per HGX node = 128 nodes; every plan flag reaches the command line
        assert "torchrun --nnodes 128 --nproc-per-node 8" in out and "pretrain_gpt.py" in out
        for tok in megatron_args(plan, M405, W405):
            assert tok in out.replace("\\|", "|"), tok
        assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in out      # TP 2 on Hopper, ZeRO-1
    elif engine == "torchtitan":
        assert "-m torchtitan.train --module autotune_torchtitan --config autotune_plan" in out
        assert (tmp_path / "autotune_torchtitan.py").is_file()
    else:
        assert "autotune validate" in out and "plan.yaml" in out
    r = subprocess.run(["bash", str(tmp_path / "launch_slurm.sbatch"), "--dry-run"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "srun" in r.stdout and "launch_torchrun.sh" in r.stdout


def test_unknown_launcher_is_one_line_error(tmp_path):
    with pytest.raises(ConfigError, match="valid launchers are torchrun, slurm"):
        write_launch_files(_doc(PLANS_405[1], M405, W405, "megatron"), tmp_path, "mpirun")


def test_cli_export_launcher_dry_run(tmp_path):
    from click.testing import CliRunner

    from autotune.cli.app import main

    url = f"sqlite:///{tmp_path}/s.db"
    r = CliRunner().invoke(main, ["run", "--size", "8b", "--space", "small", "--trials", "4", "--storage", url])
    assert r.exit_code == 0, r.output
    out = tmp_path / "launch"
    r = CliRunner().invoke(main, ["export", "--size", "8b", "--space", "small", "--storage", url, "--launcher",
                                  "torchrun", "-o", str(out), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert (out / "launch_torchrun.sh").is_file() and (out / "plan.yaml").is_file()
    # 8 B200 = one HGX node; the plan's TP degree reaches the printed command
    doc = PlanDocument.load(out / "plan.yaml")
    assert "torchrun --nnodes 1 --nproc-per-node 8" in r.output
    assert f"--tensor-model-parallel-size {doc.plan.tp_degree}" in r.output


def test_slurm_script_asks_for_the_nvl72_segment_the_prediction_assumed(tmp_path):
    # 256 GB200 = 64 trays of 4 GPUs, placed as 4 NVLink domains of 16 trays (hardware.ClusterSpec):
    # the batch script asks Slurm for segments of 16 nodes, torchrun for 4 processes per node
    doc = _doc(PLANS_405[1], M405, W405, "megatron", gpu="gb200", gpus=256)
    doc = PlanDocument(plan=doc.plan, model=doc.model, gpu="gb200", num_gpus=256,
                       fabric=make_cluster("gb200", 256, "nvlink5-nvl72+ib-ndr400").fabric.to_dict(),
                       workload=doc.workload, study="s", trial_id=1, engine="megatron")
    write_launch_files(doc, tmp_path, "slurm")
    text = (tmp_path / "launch_slurm.sbatch").read_text()
    assert "#SBATCH --nodes=64" in text and "#SBATCH --gpus-per-node=4" in text
    assert "#SBATCH --segment=16" in text
    # HGX: no segment line
    write_launch_files(_doc(PLANS_405[1], M405, W405, "megatron", gpu="h200", gpus=1024), tmp_path / "h", "slurm")
    assert "--segment" not in (tmp_path / "h" / "launch_slurm.sbatch").read_text()


def test_cli_export_launcher_reuses_an_existing_directory(tmp_path):
    # the README's `export --launcher slurm -o launch/` run twice: the second run used to fail with click's
    # "File '.../launch/' is a directory"; now it replaces exactly the files export writes and says so
    from click.testing import CliRunner

    from autotune.cli.app import main
    from autotune.export import launch_file_names

    url = f"sqlite:///{tmp_path}/s.db"
    r = CliRunner().invoke(main, ["run", "--size", "8b", "--space", "small", "--trials", "3", "--storage", url])
    assert r.exit_code == 0, r.output
    out = tmp_path / "launch"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    args = ["export", "--size", "8b", "--space", "small", "--storage", url, "--launcher", "slurm", "-o", f"{out}/"]
    r1 = CliRunner().invoke(main, args)
    assert r1.exit_code == 0, r1.output
    assert "replaced in" not in r1.output          # nothing of ours was there yet
    r2 = CliRunner().invoke(main, args)
    assert r2.exit_code == 0, r2.output
    doc = PlanDocument.load(out / "plan.yaml")
    # megatron engine + slurm: plan.yaml, launch_torchrun.sh, launch_slurm.sbatch (module docstring)
    assert launch_file_names(doc, "slurm") == ["plan.yaml", "launch_torchrun.sh", "launch_slurm.sbatch"]
    assert "replaced in" in r2.output and "plan.yaml, launch_torchrun.sh, launch_slurm.sbatch" in r2.output
    assert (out / "mine.txt").read_text() == "keep"
    assert sorted(p.name for p in out.iterdir()) == ["launch_slurm.sbatch", "launch_torchrun.sh", "mine.txt",
                                                      "plan.yaml"]
    # without --launcher, -o naming a directory is one error line (exit 2), not a traceback
    r3 = CliRunner().invoke(main, ["export", "--size", "8b", "--space", "small", "--storage", url, "-o", str(out)])
    assert r3.exit_code == 2 and "is a directory" in r3.output and "--launcher" in r3.output, r3.output


def test_launch_file_names_are_what_is_written(tmp_path):
    for engine, plan in (("megatron", PLANS_405[1]), ("torchtitan", TT_PLANS[0][0]), ("native", TT_PLANS[0][0])):
        doc = _doc(plan, M405, W405, engine, gpu="h200", gpus=1024)
        for launcher in ("torchrun", "slurm"):
            d = tmp_path / f"{engine}-{launcher}"
            assert [p.name for p in write_launch_files(doc, d, launcher)] == launch_file_names(doc, launcher)


def test_launch_hints_torchtitan_async_tp_only_with_compile_and_dp_comment_matches():
    # torchtitan raises "Async TP requires torch.compile" when enable_async_tensor_parallel is set with
    # compile off (torchtitan/models/llama3/infra/parallelize.py): the hint emits it true only with compile
    from autotune.report.summary import launch_hints
    base = dict(tp_degree=8, pp_degree=1, dp_degree=1, sequence_parallel=True, micro_batch_size=1,
                num_micro_batches=128, tp_comm_overlap=True)
    off = launch_hints(Plan(**base), M8, W8)
    assert "enable_async_tensor_parallel = false" in off and "enable_async_tensor_parallel = true" not in off
    on = launch_hints(Plan(**base, compile=True), M8, W8)
    assert "enable_async_tensor_parallel = true" in on and "enable = true" in on
    # ZeRO-1 on 8 DP ranks: the snippet is DDP (replicate 8, shard 1) and the comment says DDP
    z1 = launch_hints(Plan(dp_degree=8, num_micro_batches=16, zero_stage=1), M8, W8)
    assert "data_parallel_shard_degree = 1" in z1 and "data_parallel_replicate_degree = 8" in z1
    note = next(ln for ln in z1.splitlines() if "ZeRO-1" in ln and "torchtitan" in ln)
    assert "this is DDP" in note and "nearest" not in note, note
    # partial recompute: Megatron's block method with N, not uniform 1 (engines/megatron/export.py emits the same)
    pr = launch_hints(Plan(dp_degree=8, num_micro_batches=16, recompute="full", recompute_num_layers=5), M8, W8)
    assert "--recompute-method block --recompute-num-layers 5" in pr


def test_layers_row_names_chunks_or_stages():
    # 405B (126 layers) on pp 16 x vpp 4 with stage_layers per chunk 1, 2 x 62, 1 (64 entries = pp x vpp):
    # a chunk row; with pp entries: a pipeline-stage row
    from autotune.report.summary import plan_rows
    chunks = Plan(tp_degree=8, pp_degree=16, dp_degree=8, vpp_degree=4, pipeline_schedule="interleaved_1f1b",
                  num_micro_batches=256, stage_layers=(1,) + (2,) * 62 + (1,))
    rows = dict(plan_rows(chunks))
    assert rows["layers per chunk (64 = pp x vpp, model order)"] == "1, 2 x 62, 1"
    stages = Plan(tp_degree=8, pp_degree=2, dp_degree=64, num_micro_batches=32, stage_layers=(62, 64))
    assert dict(plan_rows(stages))["layers per pipeline stage"] == "62, 64"
