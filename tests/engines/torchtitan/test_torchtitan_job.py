"""torchtitan 0.2.x job files from plans (autotune/engines/torchtitan/job.py) and the truncated flavours
torchtitan imports (autotune/engines/torchtitan/flavors.py). torchtitan itself is not needed: the field
names are checked against a transcription of torchtitan 0.2.2's torchtitan/config/job_config.py; the
jobs in bench/engine_smoke/jobs ran on one H200 (docs/results/engines/)."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from autotune.errors import ConfigError
from autotune.engines.torchtitan import flavors as torchtitan_flavors
from autotune.engines.torchtitan.job import (
    FLAVORS_MODULE,
    job_sections,
    job_toml,
    render_toml,
    shell_command,
    train_command,
)
from autotune.spec.models import get_model
from autotune.spec.plan import Plan, Workload

try:
    import tomllib   # Python >= 3.11
except ImportError:  # 3.10: the TOML round trip is not checked
    tomllib = None

ROOT = Path(__file__).resolve().parents[3]
M8B = get_model("llama3.1-8b")
W = Workload(seq_len=8192, global_batch_size=2)

# torchtitan 0.2.2 torchtitan/config/job_config.py: the fields of every section the job files use
JOB_CONFIG_0_2_2 = {
    "job": {"config_file", "dump_folder", "description", "print_config", "save_config_file", "custom_config_module"},
    "model": {"name", "flavor", "hf_assets_path", "tokenizer_path", "converters", "print_after_conversion"},
    "training": {"dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps",
                 "enable_cpu_offload", "dtype", "mixed_precision_param", "mixed_precision_reduce", "gc_freq",
                 "gc_debug", "dataloader"},
    "lr_scheduler": {"warmup_steps", "total_steps", "decay_ratio", "decay_type", "min_lr_factor"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                    "tensor_parallel_degree", "disable_loss_parallel", "enable_async_tensor_parallel",
                    "pipeline_parallel_degree", "module_fqns_per_model_part",
                    "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers",
                    "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
                    "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
                    "pipeline_parallel_expert_parallel_overlap", "context_parallel_degree",
                    "context_parallel_load_balancer", "context_parallel_rotate_method", "expert_parallel_degree",
                    "expert_tensor_parallel_degree", "expert_parallel_comm_backend"},
    "activation_checkpoint": {"mode", "selective_ac_option", "per_op_sac_force_recompute_mm_shapes_by_fqns",
                              "early_stop", "memory_budget", "visualize_memory_budget_pareto",
                              "preserve_rng_state", "determinism_check", "debug"},
    "compile": {"enable", "components", "backend"},
    "metrics": {"log_freq", "enable_tensorboard", "disable_color_printing", "save_tb_folder", "save_for_all_ranks",
                "enable_wandb"},
    "checkpoint": {"enable", "folder", "interval"},
    "quantize.linear.float8": {"enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp",
                               "recipe_name", "filter_fqns", "emulate"},
    "quantize.linear.mx": {"mxfp8_dim1_cast_kernel_choice", "recipe_name", "filter_fqns"},
    "experimental": {"custom_import", "custom_args_module"},
}


def plan(**kw) -> Plan:
    base = dict(tp_degree=1, pp_degree=1, dp_degree=1, cp_degree=1, micro_batch_size=1, num_micro_batches=2,
                recompute="none", zero_stage=3)
    return Plan(**{**base, **kw})


def sections(p: Plan, model=M8B, workload=W, **kw) -> dict:
    kw = {"steps": 10, "hf_assets_path": "tok", **kw}
    s = job_sections(p, model, workload, **kw)
    if tomllib is not None:
        assert tomllib.loads(render_toml(s)) == _nested(s)   # the TOML says what the sections say
    for name, fields in s.items():
        assert set(fields) <= JOB_CONFIG_0_2_2[name], (name, set(fields) - JOB_CONFIG_0_2_2[name])
    return s


def _nested(s: dict) -> dict:
    out: dict = {}
    for name, fields in s.items():
        d = out
        for part in name.split("."):
            d = d.setdefault(part, {})
        d.update({k: v for k, v in fields.items() if v is not None})
    return out


def test_one_gpu_bf16_plan():
    s = sections(plan(), dataset_path="data", dump_folder="/tmp/o")
    assert s["model"] == {"name": "llama3", "flavor": "8B", "hf_assets_path": "tok"}
    assert s["training"] == {"local_batch_size": 1, "global_batch_size": 2, "seq_len": 8192, "steps": 10,
                             "dataset": "c4_test", "dataset_path": "data"}
    assert s["parallelism"]["data_parallel_shard_degree"] == 1 and "enable_sequence_parallel" not in s["parallelism"]
    assert s["activation_checkpoint"] == {"mode": "none"} and s["compile"]["enable"] is False
    assert s["metrics"] == {"log_freq": 1, "disable_color_printing": True}
    assert "experimental" not in s and "quantize.linear.float8" not in s


def test_fp8_recipes_and_the_lm_head_name_of_0_2():
    row = sections(plan(precision="fp8_rowwise", compile=True))
    assert row["model"]["converters"] == ["quantize.linear.float8"]
    assert row["quantize.linear.float8"] == {"recipe_name": "rowwise", "filter_fqns": ["output"]}
    assert row["compile"] == {"enable": True, "components": ["model", "loss"]}
    # tensorwise: refused by the 0.3.0 export, run by 0.2.x as its default Float8Linear config
    tw = sections(plan(precision="fp8_tensorwise", compile=True, dp_degree=8), workload=Workload(8192, 16))
    assert "recipe_name" not in tw["quantize.linear.float8"]
    assert tw["quantize.linear.float8"]["enable_fsdp_float8_all_gather"] is True   # FSDP over 8
    mx = sections(plan(precision="mxfp8"))
    assert mx["model"]["converters"] == ["quantize.linear.mx"] and mx["quantize.linear.mx"]["filter_fqns"] == ["output"]


def test_fp8_delayed_and_zero1_stay_refused():
    with pytest.raises(ConfigError, match="delayed"):
        sections(plan(precision="fp8_delayed"))
    with pytest.raises(ConfigError, match="zero_stage 1"):
        sections(plan(zero_stage=1))


def test_pipeline_fqns_use_output_and_recompute_modes():
    p = plan(pp_degree=4, vpp_degree=2, dp_degree=2, micro_batch_size=1, num_micro_batches=8,
             pipeline_schedule="interleaved_1f1b", zero_stage=2, recompute="selective")
    s = sections(p, workload=Workload(8192, 16))
    par = s["parallelism"]
    parts = par["module_fqns_per_model_part"]
    assert len(parts) == 8 and parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
    assert sum(len([f for f in part if f.startswith("layers.")]) for part in parts) == 32
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B" and par["fsdp_reshard_after_forward"] == "never"
    assert s["training"]["local_batch_size"] == 8
    assert s["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert sections(plan(recompute="full"))["activation_checkpoint"] == {"mode": "full"}


def test_tensor_parallel_needs_sequence_parallel_and_async_tp_moves_to_parallelism():
    with pytest.raises(ConfigError, match="sequence parallelism"):
        sections(plan(tp_degree=2))
    s = sections(plan(tp_degree=2, sequence_parallel=True, tp_comm_overlap=True, compile=True))
    assert s["parallelism"]["tensor_parallel_degree"] == 2 and s["parallelism"]["enable_async_tensor_parallel"]


def test_truncated_proxy_registers_its_flavour_through_custom_import():
    s = sections(plan(), layers=16)
    assert s["model"]["flavor"] == "8B_L16" and s["experimental"] == {"custom_import": FLAVORS_MODULE}
    for bad in (0, 33):
        with pytest.raises(ConfigError, match="layers"):
            sections(plan(), layers=bad)


def test_committed_smoke_jobs_are_what_make_jobs_writes(tmp_path):
    spec = importlib.util.spec_from_file_location("make_jobs", ROOT / "bench" / "engine_smoke" / "make_jobs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(str(tmp_path))
    committed = sorted(p.name for p in (ROOT / "bench" / "engine_smoke" / "jobs").glob("*.toml"))
    assert committed == sorted(f"{v}.toml" for v in mod.VARIANTS)
    for name in committed:
        assert (tmp_path / name).read_text() == (ROOT / "bench" / "engine_smoke" / "jobs" / name).read_text()
    head = job_toml(mod.plan_for("fp8_rowwise", True), M8B, W, steps=12, hf_assets_path="t", layers=16)
    assert head.startswith("# torchtitan 0.2.2 job written by autotune")


def test_command_lines():
    assert train_command("j.toml", nproc_per_node=8, extra=("--training.steps", "5")) == [
        "torchrun", "--standalone", "--nproc-per-node=8", "-m", "torchtitan.train", "--job.config_file", "j.toml",
        "--training.steps", "5"]
    line = shell_command("a b.toml", nproc_per_node=1, plan=plan(memory_reclaim="expandable_segments"))
    assert line.startswith("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True torchrun ") and "'a b.toml'" in line


@dataclasses.dataclass
class _Args:   # stands in for torchtitan's TransformerModelArgs
    dim: int
    n_layers: int


def test_flavours_keep_widths_and_cut_depth():
    args = {"8B": _Args(4096, 32), "70B": _Args(8192, 80), "debugmodel": _Args(256, 6)}
    added = torchtitan_flavors.register(args)
    assert len(added) == 32 + 80 and "405B_L1" not in args and "debugmodel_L1" not in args
    assert args["8B_L16"] == _Args(4096, 16) and args["70B_L80"] == _Args(8192, 80)
    assert args["8B"] == _Args(4096, 32)                       # the release flavour is untouched
    assert torchtitan_flavors.register(args) == []             # idempotent
