"""torchtitan (PyPI 0.3.0 and newer) config for a plan: a Python ``config_registry`` module.

torchtitan 0.3.0 replaced the TOML job files with Python config functions: ``torchtitan.train``
(``ConfigManager.parse_args``, torchtitan/config/manager.py) takes ``--module M --config F``, imports
``M.config_registry`` or ``M`` itself (a fully qualified module path) and calls ``F()``, which returns a
``Trainer.Config``; ``--section.field value`` arguments override it. The module written here starts from
the release's own Llama 3.1 function (``torchtitan/models/llama3/config_registry.py``: ``llama3_8b``,
``llama3_70b``, ``llama3_405b``) and sets, from the plan (field names: torchtitan/config/configs.py
``ParallelismConfig``, ``TrainingConfig``, ``CompileConfig``):

* degrees: ``tensor_parallel_degree``, ``pipeline_parallel_degree``, ``context_parallel_degree``, and
  DP as ``data_parallel_shard_degree`` (FSDP, ZeRO-2/3) or ``data_parallel_replicate_degree`` (DDP,
  ZeRO-0); ``enable_sequence_parallel``;
* FSDP resharding: ``fsdp_reshard_after_forward = "never"`` for ZeRO-2 (parameters stay gathered from
  forward to backward) and ``"always"`` for ZeRO-3;
* pipeline: ``pipeline_parallel_schedule`` (GPipe, 1F1B, Interleaved1F1B), the layers of every
  virtual stage as ``module_fqns_per_model_part`` (``tok_embeddings``, ``layers.<i>``, ``norm``,
  ``lm_head``: torchtitan/models/common/decoder.py), ``pipeline_parallel_microbatch_size``;
* batch: ``training.local_batch_size`` (per DP rank and accumulation step: micro-batch x micro-batches
  with PP, else the micro-batch, torchtitan accumulating ``global / (local x dp)`` steps),
  ``global_batch_size``, ``seq_len``;
* ``training.disable_cuda_graphs`` with PP (torchtitan/trainer.py refuses CUDA graphs with PP);
* activation checkpointing: ``None`` / ``SelectiveAC.Config()`` / ``FullAC.Config()``
  (torchtitan/distributed/activation_checkpoint.py);
* ``CompileConfig(enable, components=["model", "loss"], enable_async_tensor_parallel)``;
* FP8: ``Float8LinearConverter.Config(recipe_name="rowwise", filter_fqns=["lm_head"])`` (recipes in
  0.3.0: rowwise, rowwise_with_gw_hp; tensorwise is gone) or ``MXFP8LinearConverter.Config(fqns=
  ["layers."])`` (torchtitan/components/quantization/), passed to ``model_registry(flavor,
  converters=...)``; the LM head stays BF16;
* ``memory_reclaim`` ``empty_cache_per_step`` / ``empty_cache_per_microbatch``: torchtitan 0.3.0 has no
  setting for it (``TrainingConfig.gc_freq`` runs Python's ``gc``, torchtitan/tools/utils.py
  ``GarbageCollection``), so the module defines ``AutotuneTrainer``, a ``Trainer`` subclass (its
  ``Config`` is built by ``config.build()`` through ``Configurable``'s ``_owner``,
  torchtitan/config/configurable.py) that calls ``torch.cuda.empty_cache()`` after every
  ``train_step`` or, per micro-batch without PP, after every ``forward_backward_step``
  (torchtitan/trainer.py; with PP the schedule runs every micro-batch inside one call, so per step);
  ``expandable_segments`` is the launch script's ``PYTORCH_CUDA_ALLOC_CONF``, also set by the config
  function (``os.environ``; read by CUDA's caching allocator when CUDA starts, after the config loads), so
  the config module alone carries it and imports back the same;
* ``async_collectives: false`` cannot be launched (torchtitan's FSDP2 / TP collectives are always
  asynchronous on their own streams) and is refused;
* mixture-of-experts models (:data:`MOE_FLAVORS`: ``qwen3-30b-a3b``, ``deepseek-16b``): the module starts from
  ``qwen3_30b_a3b()`` / ``deepseek_v3_16b()`` of torchtitan/models/<model>/config_registry.py and keeps its
  model spec (BF16 only; its attention backend), sets ``ParallelismConfig.expert_parallel_degree`` (0.3.0 has
  no expert tensor parallel degree: ETP > 1 is refused), ``debug.moe_force_load_balance`` (balanced routing,
  as costed) and ``training.disable_cuda_graphs`` with EP > 1 (the trainer refuses CUDA graphs with the
  all-to-all dispatcher).
"""

from __future__ import annotations

from autotune.errors import ConfigError
from autotune.engines.base import LaunchCommand
from autotune.engines.quoting import comment_text, python_docstring_text
from autotune.spec.models import ModelSpec
from autotune.spec.plan import Plan, PlanDocument, Workload

#: autotune catalog name -> (torchtitan llama3 flavour, config_registry function)
FLAVORS = {"llama3.1-8b": ("8B", "llama3_8b"), "llama3.1-70b": ("70B", "llama3_70b"),
           "llama3.1-405b": ("405B", "llama3_405b")}
#: mixture-of-experts models: autotune catalog name -> (torchtitan model, flavour, 0.3 config_registry function).
#: Checked field by field against torchtitan v0.2.2 (73a0e69) torchtitan/models/qwen3/__init__.py
#: ``qwen3_args["30B-A3B"]`` (dim 2048, 48 layers, 32 / 4 heads of 128, qk_norm, 128 experts of 768, top-8,
#: softmax, route_norm, no shared expert) and torchtitan/models/deepseek_v3/__init__.py
#: ``deepseekv3_args["16B"]`` (dim 2048, 27 layers, 1 dense of 10944, 16 MLA heads, q_lora_rank 0,
#: kv_lora_rank 512, qk 128 + 64 rope, v 128, 64 experts of 1408 top-6, 2 shared (one FFN of 2 x 1408),
#: softmax, vocab 102400; attn_type "flex", attn_mask_type "block_causal"); 0.3.0 keeps the names
#: (torchtitan/models/qwen3/config_registry.py ``qwen3_30b_a3b``, deepseek_v3/config_registry.py
#: ``deepseek_v3_16b``, which passes ``attn_backend="flex"``)
MOE_FLAVORS = {"qwen3-30b-a3b": ("qwen3", "30B-A3B", "qwen3_30b_a3b"),
               "deepseek-16b": ("deepseek_v3", "16B", "deepseek_v3_16b")}
SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B"}
MODULE_NAME = "autotune_torchtitan"
CONFIG_FUNCTION = "autotune_plan"


def module_fqns_per_model_part(plan: Plan, model: ModelSpec) -> list[list[str]]:
    """FQNs of every virtual pipeline stage in model order: the first holds ``tok_embeddings``, the
    last ``norm`` and ``lm_head``; shapes: pp x vpp lists."""
    parts, i = [], 0
    for n in plan.layers_per_virtual_stage(model.num_layers):
        parts.append([f"layers.{j}" for j in range(i, i + n)])
        i += n
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "lm_head"]
    return parts


def model_refusal(model: ModelSpec, *, truncated: bool = False) -> str | None:
    """Why the torchtitan export cannot launch ``model`` (it names one of torchtitan's Llama 3.1 flavours,
    and the model must be that flavour field for field; ``truncated``: as :func:`torchtitan_settings`), or
    None when it can. The one check behind :func:`torchtitan_settings`'s refusal and the torchtitan block
    ``autotune export`` prints (autotune/report/summary.py ``launch_hints``)."""
    if model.name not in FLAVORS and model.name not in MOE_FLAVORS:
        return (f"model {model.name!r}: the torchtitan export knows the Llama 3.1 flavours "
                f"({', '.join(FLAVORS)}) and the MoE flavours {', '.join(MOE_FLAVORS)} (torchtitan qwen3 30B-A3B, "
                "deepseek_v3 16B) only")
    from autotune.spec.models import get_builtin_model
    ref = get_builtin_model(model.name)
    if truncated and 1 <= model.num_layers <= ref.num_layers:
        import dataclasses

        ref = dataclasses.replace(ref, num_layers=model.num_layers,
                                  num_first_dense_layers=min(ref.num_first_dense_layers, model.num_layers))
    if model != ref:
        flavour = (f"Llama 3.1 {FLAVORS[model.name][0]}" if model.name in FLAVORS
                   else "{} {}".format(*MOE_FLAVORS[model.name][:2]))
        return (f"model {model.name!r}: its fields differ from {flavour} (the torchtitan flavour the export "
                "names); export for megatron")
    return None


def flavor_of(model: ModelSpec) -> tuple[str, str, str]:
    """(torchtitan model name, flavour, 0.3 config_registry function) of a model :func:`model_refusal` accepts:
    ``("llama3", "8B", "llama3_8b")``, ``("qwen3", "30B-A3B", "qwen3_30b_a3b")``, ..."""
    if model.name in MOE_FLAVORS:
        return MOE_FLAVORS[model.name]
    return ("llama3", *FLAVORS[model.name])


def torchtitan_settings(plan: Plan, model: ModelSpec, workload: Workload, *, truncated: bool = False,
                        force_load_balance: bool = True) -> dict:
    """The values the config module sets, as plain data (what tests compare the loaded config with).

    ``truncated``: ``model`` may be its flavour with fewer layers (a depth-truncated proxy that the
    torchtitan runner registers as a flavour of its own, autotune/engines/torchtitan/flavors.py).

    A mixture-of-experts model (:data:`MOE_FLAVORS`) adds ``moe``: ``expert_parallel_degree`` (the plan's
    ``ep_degree``), ``expert_tensor_parallel_degree`` (``etp_degree``; torchtitan 0.2.2
    torchtitan/config/job_config.py ``Parallelism``) and ``force_load_balance`` (``debug.moe_force_load_balance``,
    job_config.py ``Debug``: every expert gets the same number of tokens, round-robin, the balanced routing the
    cost model assumes by default; False runs the router as trained).

    Raises:
        ConfigError: a model torchtitan has no flavour for (only Llama 3.1 8B/70B/405B), or a
            precision torchtitan 0.3.0 cannot run (fp8_tensorwise, fp8_delayed).
    """
    p = plan
    refusal = model_refusal(model, truncated=truncated)
    if refusal:
        raise ConfigError(refusal)
    moe = model.name in MOE_FLAVORS
    if moe and p.precision != "bf16":
        # torchtitan v0.2.2 components/quantization/float8.py Float8GroupedMMConverter.convert imports
        # torchao.prototype.moe_training.conversion_utils.MoETrainingConfig (absent from torchao 0.17.0's wheel:
        # ImportError "torchao installation does not have MoE training support"); FP8 linears alone would
        # leave the routed experts in BF16, which is not the plan the cost model prices as FP8
        raise ConfigError(f"precision {p.precision}: torchtitan's FP8 grouped GEMM for the routed experts "
                          "(quantize.grouped_mm.float8) needs torchao's MoETrainingConfig, which torchao 0.17.0 lacks; "
                          "valid for MoE models: bf16")
    if moe and not p.moe_grouped_gemm:
        raise ConfigError("moe_grouped_gemm false: torchtitan's MoEArgs.use_grouped_mm is a model argument of the "
                          "flavour (True), not a job setting; valid: moe_grouped_gemm true")
    if moe and p.moe_dispatcher != "alltoall":
        raise ConfigError(f"moe_dispatcher {p.moe_dispatcher}: torchtitan's standard expert-parallel backend is "
                          "all-to-all; valid: alltoall")
    if p.precision == "fp8_tensorwise":
        raise ConfigError("precision fp8_tensorwise: torchtitan 0.3.0's Float8LinearConverter has the recipes "
                          "rowwise and rowwise_with_gw_hp only; re-tune with fp8_rowwise or export for megatron")
    if p.precision == "fp8_delayed":
        raise ConfigError("precision fp8_delayed: torchtitan has dynamic FP8 scaling only (delayed scaling is "
                          "Transformer Engine's); export for megatron")
    if p.zero_stage == 1:
        raise ConfigError("zero_stage 1: torchtitan has no optimizer-only sharding; valid: 0 (DDP), 2, 3 (FSDP)")
    if not p.async_collectives:
        raise ConfigError("async_collectives false: torchtitan has no setting that makes its FSDP2 / TP / PP "
                          "collectives blocking; export for megatron, or re-tune with async_collectives true")
    reclaim = None
    if p.memory_reclaim in ("empty_cache_per_step", "empty_cache_per_microbatch"):
        reclaim = "train_step" if p.memory_reclaim == "empty_cache_per_step" or p.pp_degree > 1 \
            else "forward_backward_step"
    par = {"tensor_parallel_degree": p.tp_degree, "pipeline_parallel_degree": p.pp_degree,
           "context_parallel_degree": p.cp_degree,
           "data_parallel_shard_degree": p.dp_degree if p.zero_stage >= 2 else 1,
           "data_parallel_replicate_degree": 1 if p.zero_stage >= 2 else p.dp_degree,
           "enable_sequence_parallel": bool(p.sp_active)}
    if p.zero_stage >= 2:
        par["fsdp_reshard_after_forward"] = "never" if p.zero_stage == 2 else "always"
    if p.pp_degree > 1:
        par["pipeline_parallel_schedule"] = SCHEDULES[p.pipeline_schedule]
        par["pipeline_parallel_microbatch_size"] = p.micro_batch_size
        par["module_fqns_per_model_part"] = module_fqns_per_model_part(p, model)
    local = p.micro_batch_size * p.num_micro_batches if p.pp_degree > 1 else p.micro_batch_size
    converter = None
    if p.precision == "fp8_rowwise":
        converter = {"kind": "float8", "recipe_name": "rowwise", "filter_fqns": ["lm_head"]}
    elif p.precision == "mxfp8":
        converter = {"kind": "mxfp8", "fqns": ["layers."]}
    tt_model, flavor, base = flavor_of(model)
    if moe:
        par["expert_parallel_degree"] = p.ep_degree
        par["expert_tensor_parallel_degree"] = p.etp_degree
    return {"model_name": tt_model, "flavor": flavor, "base_config": base, "parallelism": par,
            "moe": {"force_load_balance": bool(force_load_balance)} if moe else None,
            "training": {"local_batch_size": local, "global_batch_size": workload.global_batch_size,
                         "seq_len": workload.seq_len,
                         # Trainer.Config._validate_cuda_graphs (torchtitan/trainer.py): "CUDA graphs do
                         # not support pipeline parallelism yet"
                         "disable_cuda_graphs": p.pp_degree > 1},
            "activation_checkpoint": {"none": None, "selective": "selective", "full": "full"}[p.recompute],
            "compile": {"enable": bool(p.compile), "components": ["model", "loss"],
                        "enable_async_tensor_parallel": bool(p.tp_comm_overlap and p.tp_degree > 1 and p.compile)},
            "converter": converter, "empty_cache_after": reclaim}


def torchtitan_config_module(plan: Plan, model: ModelSpec, workload: Workload, *, header: str = "") -> str:
    """Python source of the config module (``--module autotune_torchtitan --config autotune_plan``).

    ``header`` (names from the plan file) becomes one docstring line through
    :func:`autotune.engines.quoting.python_docstring_text`; every other value written is a number, a bool or
    autotune's own string, written with ``repr``.

    Raises:
        ConfigError: see :func:`torchtitan_settings`.
    """
    s = torchtitan_settings(plan, model, workload)
    moe = s["moe"] is not None
    if moe and plan.etp_degree > 1:
        raise ConfigError(f"etp_degree {plan.etp_degree}: torchtitan 0.3.0's ParallelismConfig has no expert tensor "
                          "parallel degree (torchtitan/config/configs.py); valid: etp_degree 1 (or the 0.2.2 job file, "
                          "which has parallelism.expert_tensor_parallel_degree)")
    s["parallelism"].pop("expert_tensor_parallel_degree", None)
    par = ",\n        ".join(f"{k}={v!r}" for k, v in s["parallelism"].items())
    t = s["training"]
    ac = {None: "None", "selective": "SelectiveAC.Config()", "full": "FullAC.Config()"}[s["activation_checkpoint"]]
    c = s["compile"]
    conv = s["converter"]
    compiled = "model" in c["components"] and c["enable"]
    if conv is None:
        conv_src = "None"
    elif conv["kind"] == "float8":
        conv_src = (f"[Float8LinearConverter.Config(recipe_name={conv['recipe_name']!r}, "
                    f"filter_fqns={conv['filter_fqns']!r}, model_compile_enabled={compiled!r})]")
    else:
        conv_src = f"[MXFP8LinearConverter.Config(fqns={conv['fqns']!r}, model_compile_enabled={compiled!r})]"
    doc = python_docstring_text(header, 1000)     # one printable line, backslashes and quotes escaped
    hook = s["empty_cache_after"]
    if hook is None:
        trainer_src, make_config = "", f'{s["base_config"]}()'
    else:
        sig = "self, data_iterator" if hook == "train_step" else "self, *args, **kwargs"
        call = "data_iterator" if hook == "train_step" else "*args, **kwargs"
        trainer_src = "\n".join([
            "", "",
            "class AutotuneTrainer(Trainer):",
            f"    # torchtitan's Trainer + torch.cuda.empty_cache() after every {hook} (memory_reclaim "
            f"{plan.memory_reclaim})",
            "    @dataclass(kw_only=True, slots=True)",
            "    class Config(Trainer.Config):",
            "        pass",
            "",
            f"    def {hook}({sig}):",
            f"        out = super().{hook}({call})",
            "        torch.cuda.empty_cache()",
            "        return out",
            ""])
        make_config = "AutotuneTrainer.Config(**{f.name: getattr(base, f.name) for f in fields(base) if f.init})"
    alloc = ("\n    # memory_reclaim expandable_segments: CUDA's caching allocator reads this when CUDA starts, after\n"
             "    # torchtitan loads this config (launch_torchrun.sh exports it too)\n"
             "    os.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = \"expandable_segments:True\""
             if plan.memory_reclaim == "expandable_segments" else "")
    tt = s["model_name"]
    if moe:
        # the release function's model spec is kept (BF16 only for MoE: torchtitan_settings); its attention
        # backend is the function's own (deepseek_v3_16b: model_registry("16B", attn_backend="flex"))
        spec_src = "config.model_spec = base.model_spec"
        moe_src = ("\n    # balanced routing (DebugConfig.moe_force_load_balance, torchtitan/config/configs.py): every "
                   "expert gets\n    # the same tokens, as the plan was costed; False runs the router as trained\n"
                   f"    config.debug.moe_force_load_balance = {s['moe']['force_load_balance']!r}")
        # Trainer.Config validation (torchtitan/trainer.py): "CUDA graphs support only expert parallel token
        # dispatcher configurations without CPU synchronization ... Unsupported token dispatcher:
        # AllToAllTokenDispatcher" with EP > 1; else the release function's own setting (or PP's)
        graphs = "True" if plan.ep_degree > 1 else f'{t["disable_cuda_graphs"]!r} or base.training.disable_cuda_graphs'
    else:
        spec_src = f'config.model_spec = model_registry({s["flavor"]!r}, converters=converters)'
        moe_src = ""
        graphs = f'{t["disable_cuda_graphs"]!r}'
    return f'''"""torchtitan >= 0.3.0 config written by autotune (``autotune export --launcher ...``).
{doc}
Run: PYTHONPATH=<this directory> torchrun ... -m torchtitan.train --module {MODULE_NAME} --config {CONFIG_FUNCTION}
Starts from torchtitan's own {s["base_config"]}() (dataset, optimizer, checkpointing, tokenizer path:
set hf_assets_path to your download) and sets the tuned plan.
"""

import os
from dataclasses import dataclass, fields

import torch
from torchtitan.components.quantization import Float8LinearConverter, MXFP8LinearConverter
from torchtitan.config import CompileConfig, ParallelismConfig
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.models.{tt} import model_registry
from torchtitan.models.{tt}.config_registry import {s["base_config"]}
from torchtitan.trainer import Trainer
{trainer_src}

def {CONFIG_FUNCTION}():
    base = {s["base_config"]}()
    config = {make_config}
    converters = {conv_src}
    {spec_src}
    config.parallelism = ParallelismConfig(
        {par},
    )
    config.training.local_batch_size = {t["local_batch_size"]}
    config.training.global_batch_size = {t["global_batch_size"]}
    config.training.seq_len = {t["seq_len"]}
    config.training.disable_cuda_graphs = {graphs}
    config.activation_checkpoint = {ac}
    config.compile = CompileConfig(enable={c["enable"]!r}, components={c["components"]!r},
                                   enable_async_tensor_parallel={c["enable_async_tensor_parallel"]!r}){alloc}{moe_src}
    return config
'''


#: files this engine writes beside ``plan.yaml`` and the launch scripts: the config module
EXTRA_FILES: tuple[str, ...] = (f"{MODULE_NAME}.py",)


def launch_command(doc: PlanDocument, *, plan_file: str = "plan.yaml") -> LaunchCommand:
    """``-m torchtitan.train --module autotune_torchtitan --config autotune_plan`` under torchrun."""
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} \
        if doc.plan.memory_reclaim == "expandable_segments" else {}
    return LaunchCommand(program=("-m", "torchtitan.train"),
                         args=("--module", MODULE_NAME, "--config", CONFIG_FUNCTION), env=tuple(env.items()),
                         notes=("torchtitan >= 0.3.0 (pip install torchtitan); config: autotune_torchtitan.py",),
                         prelude=('export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"',))


def extra_files(doc: PlanDocument) -> dict[str, str]:
    """``autotune_torchtitan.py``: the plan as a torchtitan >= 0.3.0 config module (:func:`torchtitan_config_module`).

    Raises:
        ConfigError: a plan or model the config cannot express.
    """
    hdr = (f"{comment_text(doc.model.name)} on {doc.num_gpus} x {comment_text(doc.gpu)}; study "
           f"{comment_text(doc.study)}, trial {doc.trial_id}.")
    return {f"{MODULE_NAME}.py": torchtitan_config_module(doc.plan, doc.model, doc.workload, header=hdr)}


def launch_refusal(model: ModelSpec, seq_len: int) -> str | None:
    """Why ``autotune export --launcher`` will refuse this model (:func:`model_refusal`), or None; what
    ``autotune run`` says at its start."""
    return model_refusal(model)
