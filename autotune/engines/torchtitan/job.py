"""A plan as a torchtitan 0.2.x job file (TOML), and the command that trains it (issue 23).

Why 0.2.x: ``autotune export`` writes a torchtitan >= 0.3.0 config module
(:mod:`autotune.engines.torchtitan.export`), but torchtitan 0.3.0 (PyPI, 2026-09) needs a newer torch than 2.11:
``import torchtitan.train`` fails under torch 2.11.0 with ``ImportError: cannot import name
'DataParallelMeshDims' from 'torch.distributed.fsdp'`` (torchtitan/distributed/full_dtensor.py). The
last release that imports and trains on torch 2.11 is 0.2.2 (PyPI; tag v0.2.2, 2026-02-20), whose
trainer reads TOML job files (torchtitan/config/manager.py ``ConfigManager``: ``--job.config_file F``,
then ``--section.field value`` overrides; fields: torchtitan/config/job_config.py). This module starts
from the same plain settings as the 0.3.0 export (:func:`autotune.engines.torchtitan.export.torchtitan_settings`)
and renames what 0.2.x names differently:

* model: ``[model] name = "llama3"`` (``qwen3``, ``deepseek_v3`` for the MoE flavours), ``flavor = "8B"``
  (or ``8B_L<n>``, registered by
  :mod:`autotune.engines.torchtitan.flavors` through ``[experimental] custom_import``); the LM head
  module is ``output`` in 0.2.x (``lm_head`` in 0.3.0), in pipeline FQNs and FP8 filters alike;
* FP8: ``[model] converters = ["quantize.linear.float8"]`` and ``[quantize.linear.float8]
  recipe_name`` (0.2.x still has ``tensorwise``, which 0.3.0 dropped: the default config with no recipe,
  FP8 all-gather when FSDP shards), MXFP8: ``quantize.linear.mx`` (Blackwell);
* activation checkpointing: ``[activation_checkpoint] mode = "none" | "selective" | "full"``, selective
  per op (``selective_ac_option = "op"``: save every matmul but every second one, as 0.3.0's
  ``SelectiveAC``);
* async TP: ``[parallelism] enable_async_tensor_parallel`` (``[compile]`` in 0.3.0); sequence parallelism
  is implied by TP in 0.2.x (torchtitan/models/llama3/infra/parallelize.py ``apply_tp``), so a TP plan
  without it is refused; 0.2.x has no CUDA graphs, so ``disable_cuda_graphs`` has nothing to set.

Data: ``training.dataset = "c4_test"`` with ``training.dataset_path`` a local folder of JSON lines (the
loader of that entry is ``datasets.load_dataset(path, split="train")``,
torchtitan/hf_datasets/text_datasets.py), and ``model.hf_assets_path`` a tokenizer folder
(bench/engine_smoke/make_assets.py writes both; nothing is downloaded).
"""

from __future__ import annotations

import dataclasses
import shlex

from autotune.errors import ConfigError
from autotune.engines.quoting import comment_text, toml_string
from autotune.engines.torchtitan.export import torchtitan_settings
from autotune.spec.models import ModelSpec
from autotune.spec.plan import Plan, Workload

#: the torchtitan release these job files are written for (the newest that runs on torch 2.11)
TORCHTITAN_VERSION = "0.2.2"
FLAVORS_MODULE = "autotune.engines.torchtitan.flavors"


def _v02_fqn(fqn: str) -> str:
    return "output" if fqn == "lm_head" else fqn


def job_sections(plan: Plan, model: ModelSpec, workload: Workload, *, steps: int, hf_assets_path: str,
                 dataset_path: str | None = None, dataset: str = "c4_test", layers: int | None = None,
                 dump_folder: str = "./outputs", log_freq: int = 1, warmup_steps: int = 2,
                 color: bool = False, force_load_balance: bool = True, data_workers: int = 0) -> dict[str, dict]:
    """The job file's sections (``{"parallelism": {...}, "quantize.linear.float8": {...}, ...}``).

    Args:
        steps: training steps (``training.steps``).
        hf_assets_path: the tokenizer folder (``tokenizer.json`` + ``tokenizer_config.json``).
        dataset_path: a local folder for ``dataset`` (None: the dataset's registered path).
        layers: run a depth-truncated proxy of ``model`` with this many layers (flavour
            ``<flavour>_L<layers>``); None: the full model.
        log_freq: steps per metrics line; warmup_steps: LR warm-up (the releases' 200 outlasts a short
            run; it does not change the step's cost).
        color: ANSI colours in the log (off: plain lines for :mod:`autotune.engines.torchtitan.log`).
        force_load_balance: MoE models: ``[debug] moe_force_load_balance`` (torchtitan 0.2.2
            config/job_config.py ``Debug``; the router's top-k replaced by a round-robin assignment, every
            expert the same tokens: the balanced routing the cost model assumes); False: the router as trained
            (from its random initialisation here). Dense models: nothing is written.
        data_workers: ``[training.dataloader] num_workers`` (torchtitan 0.2.2 config/job_config.py
            ``DataLoader``, passed to torchdata's ``StatefulDataLoader`` by hf_datasets/text_datasets.py
            ``build_text_dataloader``): > 0 tokenises in that many worker processes, ahead of the train loop
            (2 batches each: ``prefetch_factor``'s default); 0 (torchtitan's default): nothing is written and
            the train loop tokenises each document itself when it starts one
            (``HuggingFaceTextDataset.__iter__``), inside the step.

    MoE models (``qwen3-30b-a3b``, ``deepseek-16b``: :data:`~autotune.engines.torchtitan.export.MOE_FLAVORS`):
    ``[model] name = "qwen3"`` / ``"deepseek_v3"``, flavour ``30B-A3B`` / ``16B`` (``<flavour>_L<n>`` when
    truncated; the first dense layer of DeepSeek stays), ``parallelism.expert_parallel_degree`` and
    ``expert_tensor_parallel_degree`` from the plan's ``ep_degree`` / ``etp_degree``.

    Raises:
        ConfigError: everything :func:`~autotune.engines.torchtitan.export.torchtitan_settings` refuses except
            ``fp8_tensorwise`` (which 0.2.x runs), ``layers`` outside 1..model depth, and TP without
            sequence parallelism (0.2.x always shards the norms sequence-parallel with TP).
    """
    if layers is not None:
        if not 1 <= layers <= model.num_layers:
            raise ConfigError(f"layers={layers}: choose 1..{model.num_layers} for {model.name}")
        model = dataclasses.replace(model, num_layers=layers,
                                    num_first_dense_layers=min(model.num_first_dense_layers, layers))
    tensorwise = plan.precision == "fp8_tensorwise" and not model.is_moe
    s = torchtitan_settings(dataclasses.replace(plan, precision="bf16") if tensorwise else plan, model, workload,
                            truncated=True, force_load_balance=force_load_balance)
    par = dict(s["parallelism"])
    sp = par.pop("enable_sequence_parallel")
    if par["tensor_parallel_degree"] > 1 and not sp:
        raise ConfigError("tp_degree > 1 without sequence_parallel: torchtitan 0.2.x always runs TP with sequence "
                          "parallelism (models/llama3/infra/parallelize.py apply_tp); re-tune with it on")
    if "module_fqns_per_model_part" in par:
        par["module_fqns_per_model_part"] = [[_v02_fqn(f) for f in part] for part in par["module_fqns_per_model_part"]]
    if s["compile"]["enable_async_tensor_parallel"]:
        par["enable_async_tensor_parallel"] = True
    flavor = s["flavor"] if layers is None else f"{s['flavor']}_L{layers}"
    out: dict[str, dict] = {
        "job": {"dump_folder": dump_folder, "description": f"autotune plan: {model.name}, {flavor}"},
        "model": {"name": s["model_name"], "flavor": flavor, "hf_assets_path": hf_assets_path},
        "training": {"local_batch_size": s["training"]["local_batch_size"],
                     "global_batch_size": s["training"]["global_batch_size"],
                     "seq_len": s["training"]["seq_len"], "steps": steps, "dataset": dataset},
        **({"training.dataloader": {"num_workers": int(data_workers)}} if data_workers > 0 else {}),
        "lr_scheduler": {"warmup_steps": warmup_steps},
        "parallelism": par,
        "activation_checkpoint": {"mode": s["activation_checkpoint"] or "none"},
        "compile": {"enable": s["compile"]["enable"], "components": s["compile"]["components"]},
        "metrics": {"log_freq": log_freq, "disable_color_printing": not color},
        "checkpoint": {"enable": False},
    }
    if s["moe"] is not None:
        out["debug"] = {"moe_force_load_balance": s["moe"]["force_load_balance"]}
    if dataset_path is not None:
        out["training"]["dataset_path"] = dataset_path
    if s["activation_checkpoint"] == "selective":
        out["activation_checkpoint"]["selective_ac_option"] = "op"
    conv = s["converter"]
    if tensorwise:
        fsdp = par["data_parallel_shard_degree"] > 1
        out["model"]["converters"] = ["quantize.linear.float8"]
        out["quantize.linear.float8"] = {"filter_fqns": ["output"], "enable_fsdp_float8_all_gather": fsdp,
                                         "precompute_float8_dynamic_scale_for_fsdp": fsdp}
    elif conv is not None and conv["kind"] == "float8":
        out["model"]["converters"] = ["quantize.linear.float8"]
        out["quantize.linear.float8"] = {"recipe_name": conv["recipe_name"],
                                         "filter_fqns": [_v02_fqn(f) for f in conv["filter_fqns"]]}
    elif conv is not None:
        out["model"]["converters"] = ["quantize.linear.mx"]
        out["quantize.linear.mx"] = {"recipe_name": "mxfp8_cublas", "filter_fqns": ["output"]}
    if layers is not None:
        out["experimental"] = {"custom_import": FLAVORS_MODULE}
    return out


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return toml_string(v)       # quotes, backslashes and control characters escaped (a path with a newline)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def render_toml(sections: dict[str, dict], *, header: str = "") -> str:
    """TOML text of ``sections`` (tables named by dotted keys; None values left out). Strings are TOML basic
    strings (:func:`autotune.engines.quoting.toml_string`), each ``header`` line one comment line
    (:func:`~autotune.engines.quoting.comment_text`); section and key names are autotune's own."""
    lines = [f"# {comment_text(h)}" for h in header.split("\n")]
    for name, fields in sections.items():
        lines += ["", f"[{name}]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in fields.items() if v is not None]
    return "\n".join(lines).lstrip("\n") + "\n"


def job_toml(plan: Plan, model: ModelSpec, workload: Workload, **kw) -> str:
    """The job file (see :func:`job_sections` for the keyword arguments)."""
    s = job_sections(plan, model, workload, **kw)
    return render_toml(s, header=f"torchtitan {TORCHTITAN_VERSION} job written by autotune "
                                 f"(autotune.engines.torchtitan.job)\nmodel {model.name}, flavour "
                                 f"{s['model']['flavor']}; plan: tp {plan.tp_degree} pp {plan.pp_degree} "
                                 f"dp {plan.dp_degree} cp {plan.cp_degree}"
                                 + (f" ep {plan.ep_degree} etp {plan.etp_degree}" if model.is_moe else "")
                                 + f", {plan.precision}, compile {plan.compile}, recompute {plan.recompute}"
                                 + ("" if s.get("debug") is None else
                                    "\nrouting: " + ("balanced (debug.moe_force_load_balance)"
                                                     if s["debug"]["moe_force_load_balance"]
                                                     else "the router as trained")))


def train_env(plan: Plan) -> dict[str, str]:
    """Environment variables the plan needs (the allocator setting of ``memory_reclaim``)."""
    return {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} \
        if plan.memory_reclaim == "expandable_segments" else {}


def train_command(job_file: str, *, nproc_per_node: int, extra: tuple[str, ...] = ()) -> list[str]:
    """argv of one node's launch: ``torchrun --standalone --nproc-per-node N -m torchtitan.train
    --job.config_file F`` (one node; several nodes need torchrun's rendezvous options instead of
    ``--standalone``), then ``extra`` overrides (``--training.steps 20`` ...)."""
    return ["torchrun", "--standalone", f"--nproc-per-node={nproc_per_node}", "-m", "torchtitan.train",
            "--job.config_file", job_file, *extra]


def shell_command(job_file: str, *, nproc_per_node: int, plan: Plan | None = None) -> str:
    """:func:`train_command` as one shell line, with :func:`train_env` in front."""
    env = train_env(plan) if plan is not None else {}
    return " ".join([f"{k}={shlex.quote(v)}" for k, v in env.items()]
                    + [shlex.quote(a) for a in train_command(job_file, nproc_per_node=nproc_per_node)])


__all__ = ["FLAVORS_MODULE", "TORCHTITAN_VERSION", "job_sections", "job_toml", "render_toml", "shell_command",
           "train_command", "train_env"]
