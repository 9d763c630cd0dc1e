"""A user's torchtitan launch as autotune's model, plan and workload (``autotune simulate --from-torchtitan``);
the inverse of :mod:`autotune.engines.torchtitan.export` (0.3.0 config module) and
:mod:`autotune.engines.torchtitan.job` (0.2.x TOML job file).

Two formats:

* a 0.2.x TOML job file (``--job.config_file``), read with :mod:`tomllib`; fields and defaults of
  torchtitan 0.2.2's torchtitan/config/job_config.py (``[model] name = "llama3"``, ``flavor``;
  ``[parallelism]`` degrees with ``data_parallel_shard_degree = -1`` filling the rest, ``fsdp_reshard_after_
  forward = "default"`` (always without PP, never with it), ``pipeline_parallel_schedule = "1F1B"``,
  ``enable_async_tensor_parallel``; ``[training] local_batch_size = 8``, ``global_batch_size = -1`` (local x
  DP), ``seq_len = 2048``; ``[activation_checkpoint] mode = "selective"`` with ``selective_ac_option = "2"``
  (every 2nd layer fully recomputed; ``"op"`` is per-op selective); ``[compile]``; ``[model] converters``
  ``quantize.linear.float8`` (``recipe_name`` None = tensorwise, rowwise) and ``quantize.linear.mx``; TP
  always runs sequence-parallel (models/llama3/infra/parallelize.py ``apply_tp``);
* a 0.3.0 Python config module (``--module M --config F``), loaded with torchtitan's own ``ConfigManager``
  (torchtitan/config/manager.py) in a child process (:mod:`autotune.engines.torchtitan.config_child`): the
  module's code runs there, as it does under ``torchtitan.train``, never inside autotune's process; the child
  runs ``python -I`` in an empty temporary folder with stdin closed, under a time limit
  (:data:`CONFIG_MODULE_TIMEOUT_S`, environment variable ``AUTOTUNE_CONFIG_MODULE_TIMEOUT_S``) and an
  address-space limit (:data:`CONFIG_MODULE_MAX_GIB`, ``AUTOTUNE_CONFIG_MODULE_MAX_GIB``), the module's
  folder after the standard library on ``sys.path``, a module inside a package loaded as that package's
  module (relative imports work), and answers with the settings as JSON. It needs torchtitan installed
  (``pip install -e '.[torchtitan]'`` in the autotune checkout). ``FILE.py:FUNCTION`` names the config
  function (default: the module's ``autotune_plan``, or its only top-level function, found with :mod:`ast`,
  without running it). The converters passed to ``model_registry`` are recorded while it loads (their GPU
  checks are not run: the BF16 model is built), as tests/export/test_export.py does.

Without ``module_fqns_per_model_part`` the pipeline split is torchtitan's (distributed/pipeline_parallel.py,
both releases): ``pipeline_parallel_layers_per_stage`` or 1 stage per rank (single-stage schedules) / 2
(multi-stage), the embedding and the output counting as ``pipeline_parallel_first/last_stage_less_layers``
layers, the remainder to the first stages. The llama3 flavours of Llama 3.1 (8B, 70B, 405B) and the qwen3 /
deepseek_v3 mixture-of-experts flavours (:mod:`autotune.engines.torchtitan.moe_import`) are autotune models; schedules GPipe, 1F1B, Interleaved1F1B; HSDP (shard and replicate > 1) is refused.
"""

from __future__ import annotations

import ast
import math
import re
import sys
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError, PlanError
from autotune.engines.imported import ImportedLaunch, allocator_reclaim
from autotune.engines.torchtitan.toml_scan import MAX_TOML_TOKENS, _toml_depth_bound  # noqa: F401 (re-exported)
from autotune.engines.torchtitan.child_limits import _memory_error, _memory_limit_text  # noqa: F401 (re-exported)

SCHEDULES = {"GPipe": "gpipe", "1F1B": "1f1b", "Interleaved1F1B": "interleaved_1f1b"}
SINGLE_STAGE = ("GPipe", "1F1B")
RUN = "run settings: no effect on a step's time or memory"
NOT_MODELLED = "not modelled: may change step time or memory"
#: 0.2.x sections / fields that are run settings
RUN_SECTIONS = ("job", "metrics", "checkpoint", "optimizer", "lr_scheduler", "validation", "profiling", "comm",
                "fault_tolerance", "experimental", "memory_estimation", "float8", "debug")
RUN_FIELDS = ("model.hf_assets_path", "model.tokenizer_path", "model.print_after_conversion", "training.steps",
              "training.dataset", "training.dataset_path", "training.max_norm", "training.gc_freq",
              "training.gc_debug", "training.seed", "training.deterministic", "training.dtype",
              "quantize.linear.float8.filter_fqns", "quantize.linear.mx.filter_fqns",
              "activation_checkpoint.selective_ac_option", "compile.backend")

#: known keys of the sections autotune reads (torchtitan's JobConfig dataclasses Parallelism, Training,
#: ActivationCheckpoint, Compile, Model: torchtitan/config/job_config.py of the 0.1/0.2 line, plus the
#: 0.3.0 fields of tests/data/torchtitan_config_fields.txt and the keys read here); an unknown key there is a
#: typo torchtitan's own parser would reject ("unrecognized arguments"), not a setting to ignore
KNOWN_KEYS = {
    "parallelism": ("data_parallel_replicate_degree", "enable_compiled_autograd", "data_parallel_shard_degree",
                    "fsdp_reshard_after_forward", "tensor_parallel_degree", "disable_loss_parallel",
                    "enable_async_tensor_parallel", "pipeline_parallel_degree", "pipeline_parallel_split_points",
                    "module_fqns_per_model_part", "pipeline_parallel_first_stage_less_layers",
                    "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_layers_per_stage",
                    "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv",
                    "pipeline_parallel_microbatch_size", "context_parallel_degree", "context_parallel_rotate_method",
                    "context_parallel_load_balancer", "context_parallel_ptrr_mask_key", "expert_parallel_degree",
                    "expert_tensor_parallel_degree", "enable_fsdp_symm_mem", "enable_sequence_parallel",
                    "spmd_backend", "pipeline_parallel_expert_parallel_overlap"),
    "training": ("dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps",
                 "enable_cpu_offload", "mixed_precision_param", "mixed_precision_reduce", "compile", "gc_freq",
                 "gc_debug", "seed", "deterministic", "dtype", "disable_cuda_graphs", "debug_moe_force_load_balance"),
    "activation_checkpoint": ("mode", "selective_ac_option", "per_op_sac_force_recompute_mm_shapes_by_fqns",
                              "early_stop", "memory_budget", "visualize_memory_budget_pareto", "preserve_rng_state",
                              "determinism_check", "debug"),
    "compile": ("enable", "components", "backend", "enable_async_tensor_parallel"),
    "model": ("name", "flavor", "hf_assets_path", "tokenizer_path", "converters", "print_after_conversion"),
}


def _q(v: object) -> str:
    """``repr(v)`` as an error line may quote it: at most 100 printable characters (files.excerpt)."""
    from autotune.files import excerpt
    return excerpt(repr(v))


def _e(v: object) -> str:
    """``v`` (a word read from the user's file) as an error line may quote it (files.excerpt)."""
    from autotune.files import excerpt
    return excerpt(v)


def _check_known_keys(flat: dict, source: str) -> None:
    """Raise on a key of a :data:`KNOWN_KEYS` section that the section does not have (with the nearest)."""
    import difflib
    for key in flat:
        sec, _, name = key.partition(".")
        known = KNOWN_KEYS.get(sec)
        if known is None or "." in name or name in known:
            continue
        near = difflib.get_close_matches(name, known, n=1) if len(name) <= 100 else []
        raise ConfigError(f"{source}: [{_e(sec)}] {_e(name)} is not a torchtitan setting of [{sec}]"
                          + (f"; did you mean {near[0]}?" if near else f" (known: {', '.join(known)})"))


def _flavor_model(flavor: Any, source: str, name: str = "llama3"):
    from autotune.engines.torchtitan.export import FLAVORS
    from autotune.spec.models import get_model
    if name in ("qwen3", "deepseek_v3"):
        from autotune.engines.torchtitan.moe_import import moe_flavor_model
        return moe_flavor_model(name, flavor, source)
    names = {f: name for name, (f, _) in FLAVORS.items()}
    if flavor not in names:
        raise ConfigError(f"{source}: llama3 flavour {_q(flavor)}: autotune simulates the Llama 3.1 flavours "
                          f"{', '.join(names)} only")
    return get_model(names[flavor])


def stage_split(num_layers: int, stages: int, first_less: int = 1, last_less: int = 1) -> tuple[int, ...]:
    """Layers per virtual stage of torchtitan's default split (see the module docstring): ``num_layers +
    first_less + last_less`` units over ``stages``, the remainder one each to the first stages, the first
    stage's share less the embedding's weight and the last's less the output's."""
    if stages == 1:
        return (num_layers,)
    units = num_layers + first_less + last_less
    per, extra = divmod(units, stages)
    out, left = [], num_layers
    for i in range(stages):
        n = per + (i < extra) - (first_less if i == 0 else 0) - (last_less if i == stages - 1 else 0)
        n = min(max(n, 0), left) if i < stages - 1 else left
        out.append(n)
        left -= n
    return tuple(out)


def _fqn_split(parts: list, num_layers: int, source: str, head: str) -> tuple[int, ...]:
    """Layers per part of ``module_fqns_per_model_part`` (``layers.<i>`` in order, the embedding first and
    ``norm`` / the LM head last)."""
    seen, out = [], []
    for i, part in enumerate(parts):
        layers = [int(f.split(".")[1]) for f in part if isinstance(f, str) and f.startswith("layers.")]
        for f in part:
            if f in ("tok_embeddings",) and i != 0 or f in ("norm", head) and i != len(parts) - 1:
                raise ConfigError(f"{source}: module_fqns_per_model_part puts {f} in part {i}; autotune's plans place "
                                  "the embedding in the first part and the norm and LM head in the last")
        seen += layers
        out.append(len(layers))
    if seen != list(range(num_layers)):
        raise ConfigError(f"{source}: module_fqns_per_model_part does not hold layers.0 .. layers.{num_layers - 1} "
                          "once each in order")
    return tuple(out)


def _target(s: dict, num_gpus: int, source: str, fmt: str, modelled: dict, ignored: list, approx: list,
            release: str = "0.3"):
    """Model, plan and workload from the normalized settings ``s`` (keys below), judged by torchtitan
    ``release`` (its ``releases.yaml`` entry: the precisions it runs)."""
    from autotune.spec.plan import Plan, Workload

    model = _flavor_model(s["flavor"], source, s.get("name", "llama3"))
    p = s["par"]
    for k in ("tp", "pp", "cp", "replicate"):
        if not isinstance(p[k], int) or isinstance(p[k], bool) or p[k] < 1:
            raise ConfigError(f"{source}: {p['names'][k]} {_q(p[k])}: must be an integer >= 1")
    for k, lo in (("pp_mbs", 1), ("first_less", 0), ("last_less", 0), ("layers_per_stage", 1)):
        v = p[k]
        if (v is not None or k != "layers_per_stage") and (not isinstance(v, int) or isinstance(v, bool) or v < lo):
            name = {"pp_mbs": "pipeline_parallel_microbatch_size",
                    "first_less": "pipeline_parallel_first_stage_less_layers",
                    "last_less": "pipeline_parallel_last_stage_less_layers",
                    "layers_per_stage": "pipeline_parallel_layers_per_stage"}[k]
            raise ConfigError(f"{source}: {name} {_q(v)}: must be an integer >= {lo}")
    for k, what in (("ep", "expert_parallel_degree"), ("etp", "expert_tensor_parallel_degree")):
        if not isinstance(p.get(k, 1), int) or isinstance(p.get(k, 1), bool) or p.get(k, 1) < 1:
            raise ConfigError(f"{source}: {what} {_q(p.get(k))}: must be an integer >= 1")
    if not model.is_moe and (p["ep"] != 1 or p.get("etp", 1) != 1):
        raise ConfigError(f"{source}: expert_parallel_degree {p['ep']}: expert parallelism needs a mixture-of-experts "
                          f"model; {model.name} is dense")
    moe = {}
    if model.is_moe:
        # torchtitan 0.2.2 (distributed/parallel_dims.py): EP borrows ranks of dp_shard x cp (and TP when
        # expert_tensor_parallel_degree is 1); autotune's fold is EP x ETP dividing TP x CP x DP (spec/moe_plan.py).
        # ETP 1 at TP > 1 in torchtitan splits no expert over TP: autotune's etp_degree 1
        moe = {"ep_degree": p["ep"], "etp_degree": p.get("etp", 1)}
    tp, pp, cp, rep = p["tp"], p["pp"], p["cp"], p["replicate"]
    shard = p["shard"]
    if shard == -1:
        if num_gpus % (tp * pp * cp * rep):
            raise ConfigError(f"{source}: TP {tp} x PP {pp} x CP {cp} x replicate {rep} does not divide --gpus "
                              f"{num_gpus}")
        shard = num_gpus // (tp * pp * cp * rep)
    if not isinstance(shard, int) or shard < 1 or tp * pp * cp * rep * shard != num_gpus:
        raise ConfigError(f"{source}: TP {tp} x PP {pp} x CP {cp} x DP shard {shard} x DP replicate {rep} = "
                          f"{tp * pp * cp * rep * (shard if isinstance(shard, int) else 1)}, not --gpus {num_gpus}")
    if shard > 1 and rep > 1:
        raise ConfigError(f"{source}: HSDP (data_parallel_shard_degree {shard} x data_parallel_replicate_degree "
                          f"{rep}): autotune models FSDP (shard) or DDP (replicate), not both")
    dp = shard * rep
    reshard = p["reshard"]
    if reshard not in ("default", "always", "never"):
        raise ConfigError(f"{source}: fsdp_reshard_after_forward {_q(reshard)}: valid: default, always, never")
    fsdp = shard > 1 or cp > 1 or reshard != "default"
    zero = (3 if (reshard == "always" or (reshard == "default" and pp == 1)) else 2) if fsdp else 0
    sched = p["schedule"]
    if pp > 1 and sched not in SCHEDULES:
        raise ConfigError(f"{source}: pipeline_parallel_schedule {_q(sched)}: autotune simulates "
                          f"{', '.join(SCHEDULES)}")
    stage_layers, vpp = None, 1
    if pp > 1:
        if p["fqns"] is not None:
            stage_layers = _fqn_split(p["fqns"], model.num_layers, source, s["head"])
        else:
            if p["layers_per_stage"] is not None:
                stages = math.ceil((model.num_layers + p["first_less"] + p["last_less"]) / p["layers_per_stage"])
            else:
                stages = pp * (1 if sched in SINGLE_STAGE else 2)
            stage_layers = stage_split(model.num_layers, stages, p["first_less"], p["last_less"])
        if len(stage_layers) % pp:
            raise ConfigError(f"{source}: {len(stage_layers)} pipeline stages are not a multiple of PP {pp}")
        vpp = len(stage_layers) // pp
        if (vpp > 1) != (sched not in SINGLE_STAGE):
            raise ConfigError(f"{source}: schedule {sched} with {vpp} stage(s) per rank: single-stage schedules "
                              "(GPipe, 1F1B) take one, Interleaved1F1B more")
    t = s["training"]
    seq, local, glob = t["seq_len"], t["local"], t["global"]
    for k, v in (("seq_len", seq), ("local_batch_size", local)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"{source}: training.{k} {_q(v)}: must be an integer >= 1")
    if glob in (-1, None):
        glob = local * dp
    if glob % (local * dp):
        raise ConfigError(f"{source}: training.global_batch_size {glob} is not a multiple of local_batch_size {local} "
                          f"x DP {dp}")
    mbs = p["pp_mbs"] if pp > 1 else local
    if pp > 1 and local % mbs:
        raise ConfigError(f"{source}: local_batch_size {local} is not a multiple of pipeline_parallel_microbatch_size "
                          f"{mbs}")
    accum = glob // (local * dp)
    if pp > 1 and accum > 1:
        approx.append(f"PP with gradient accumulation ({accum} steps of {local // mbs} micro-batches): costed as one "
                      f"pipeline pass of {accum * local // mbs} micro-batches")
    try:
        workload = Workload(seq_len=seq, global_batch_size=glob)
        plan = Plan(tp_degree=tp, pp_degree=pp, cp_degree=cp, dp_degree=dp, vpp_degree=vpp, micro_batch_size=mbs,
                    num_micro_batches=glob // (mbs * dp),
                    pipeline_schedule=SCHEDULES.get(sched, "1f1b") if pp > 1 else "1f1b",
                    sequence_parallel=bool(p["sp"]) and tp > 1, recompute=s["ac"], zero_stage=zero,
                    tp_comm_overlap=bool(s["async_tp"]) and tp > 1, dp_grad_reduce_overlap=True,
                    param_gather_overlap=zero >= 2, memory_reclaim=s["reclaim"],
                    stage_layers=stage_layers if stage_layers and len(set(stage_layers)) > 1 else None,
                    precision=s["precision"], compile=s["compile"], **moe)
        plan.layers_per_virtual_stage(model.num_layers)
        if model.is_moe:
            from autotune.spec.moe_plan import validate_moe
            validate_moe(plan, model)
    except (ConfigError, PlanError) as e:
        raise ConfigError(f"{source}: {e}") from None
    return ImportedLaunch(source=source, engine="torchtitan", fmt=fmt, model=model, plan=plan, workload=workload,
                          num_gpus=num_gpus, modelled=modelled, ignored=tuple(ignored), approximated=tuple(approx),
                          engine_release=release, notes=(_release_note(release),))


def _release_note(release: str) -> str:
    """How the file is judged: torchtitan ``release``'s facts (and the installed torchtitan, if any)."""
    from importlib import metadata

    from autotune.spec.engines import engine_releases
    rel = engine_releases("torchtitan")["releases"][release]
    try:
        installed = metadata.version("torchtitan")
    except metadata.PackageNotFoundError:
        installed = None
    return (f"judged by torchtitan {rel['version']}, the release this format is written for (precisions "
            f"{', '.join(rel['precisions'])}; autotune/engines/torchtitan/releases.yaml)"
            + (f"; installed here: torchtitan {installed}" if installed else ""))


def _leaves(d: dict, prefix: str = ""):
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _leaves(v, key + ".")
        else:
            yield key, v


def parse_toml_text(text: str, *, source: str) -> dict:
    """``tomllib.loads(text)``, refusing nesting deeper than :data:`autotune.files.MAX_NESTING_DEPTH` levels
    (tables, dotted keys, arrays and inline tables each count one) before parsing: :mod:`tomllib` parses
    arrays and inline tables recursively (RecursionError at about a thousand levels) and a key of 20,000
    dotted parts takes it seconds (10 s for a 100,000-part table header on this project's 2-core machine).
    A torchtitan job file nests 3 levels (``[quantize.linear.float8]``, a list of lists).

    Raises:
        ConfigError: ``<source> nests deeper than 64 levels``; tomllib.TOMLDecodeError: not TOML.
    """
    import tomllib

    from autotune.files import MAX_NESTING_DEPTH

    too_deep = f"{source} nests deeper than {MAX_NESTING_DEPTH} levels (TOML tables, dotted keys, arrays " \
               "and inline tables counted)"
    if _toml_depth_bound(text, MAX_NESTING_DEPTH, source) > MAX_NESTING_DEPTH:
        raise ConfigError(too_deep)
    try:
        doc = tomllib.loads(text)
    except RecursionError:              # not reached within the bound above; kept as the last guard
        raise ConfigError(too_deep) from None
    todo = [(doc, 1)]
    while todo:
        x, d = todo.pop()
        if d > MAX_NESTING_DEPTH:
            raise ConfigError(too_deep)
        todo += [(v, d + 1) for v in (x.values() if isinstance(x, dict) else x) if isinstance(v, (dict, list))]
    return doc


def import_toml(path: str | Path, *, num_gpus: int) -> ImportedLaunch:
    """Read a torchtitan 0.2.x job file (see the module docstring).

    Raises:
        ConfigError: not TOML, a model / schedule / setting autotune cannot simulate (named), bad degrees.
    """
    import tomllib
    source = str(path)
    from autotune.files import read_text_file
    text = read_text_file(path, what="torchtitan TOML job file")    # regular file, size cap, no NUL (files.py)
    try:
        doc = parse_toml_text(text, source=source)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{source}: not a readable TOML job file: {e}") from None
    flat = dict(_leaves(doc))
    _check_known_keys(flat, source)
    used: dict[str, Any] = {}

    def get(key: str, default: Any) -> Any:
        if key in flat:
            used[key] = flat[key]
            return flat[key]
        return default

    name = get("model.name", "llama3")
    if name not in ("llama3", "qwen3", "deepseek_v3"):
        raise ConfigError(f"{source}: model.name {_q(name)}: autotune simulates torchtitan's llama3 (Llama 3.1), "
                          "qwen3 and deepseek_v3 mixture-of-experts models")
    flavor = get("model.flavor", "debugmodel")
    _flavor_model(flavor, source, name)      # the model first: nothing else matters for another model
    ignored: list = []
    approx: list = []
    ac_mode = get("activation_checkpoint.mode", "selective")
    if ac_mode not in ("none", "selective", "full"):
        raise ConfigError(f"{source}: activation_checkpoint.mode {_q(ac_mode)}: autotune models none, selective (per "
                          "op) and full")
    if ac_mode == "selective":
        opt = str(flat.get("activation_checkpoint.selective_ac_option", "2"))
        if opt != "op":
            raise ConfigError(f"{source}: activation_checkpoint selective_ac_option {_q(opt)}"
                              + ("" if "activation_checkpoint.selective_ac_option" in flat else " (torchtitan's default)")
                              + ": full recomputation of every n-th layer; autotune models per-op selective ('op'), "
                              "full and none")
    converters = get("model.converters", [])
    precision = "bf16"
    from autotune.spec.engines import engine_releases
    rel = engine_releases("torchtitan")["releases"]["0.2"]
    for c in converters:
        if c not in rel["converters"]:
            raise ConfigError(f"{source}: model converter {_q(c)} is not one torchtitan {rel['version']} registers "
                              f"({', '.join(rel['converters'])}): its train.py stops at startup (KeyError {_q(c)} in "
                              "protocols/model_converter.py); the float8 linears are quantize.linear.float8")
        if c == "quantize.linear.float8":
            recipe = get("quantize.linear.float8.recipe_name", None)
            if recipe not in (None, "rowwise"):
                raise ConfigError(f"{source}: float8 recipe {recipe}: autotune costs tensorwise and rowwise")
            precision = "fp8_tensorwise" if recipe is None else "fp8_rowwise"
        elif c == "quantize.linear.mx":
            precision = "mxfp8"
            get("quantize.linear.mx.recipe_name", None)
        else:
            raise ConfigError(f"{source}: model converter {_q(c)}: FP8 / MX grouped GEMMs of the experts; autotune "
                              "costs the experts' grouped GEMMs in BF16")
    if get("training.mixed_precision_param", "bfloat16") != "bfloat16":
        raise ConfigError(f"{source}: training.mixed_precision_param float32: autotune simulates BF16 compute")
    get("training.mixed_precision_reduce", "float32")
    compile_on = bool(get("compile.enable", False))
    comps = get("compile.components", ["model", "loss"])
    if compile_on and "model" not in comps:
        approx.append("compile of the loss only: costed as eager (compile: false)")
        compile_on = False
    if name != "llama3":
        from autotune.engines.torchtitan.moe_import import moe_flavor_note, moe_toml_settings
        moe_toml_settings(flat, get, ignored, approx)
        if moe_flavor_note(name, flavor):
            approx.append(moe_flavor_note(name, flavor))
    s = {"flavor": flavor, "name": name, "head": "output",
         "par": {"tp": get("parallelism.tensor_parallel_degree", 1), "pp": get("parallelism.pipeline_parallel_degree", 1),
                 "cp": get("parallelism.context_parallel_degree", 1),
                 "replicate": get("parallelism.data_parallel_replicate_degree", 1),
                 "shard": get("parallelism.data_parallel_shard_degree", -1),
                 "reshard": get("parallelism.fsdp_reshard_after_forward", "default"),
                 "schedule": get("parallelism.pipeline_parallel_schedule", "1F1B"),
                 "pp_mbs": get("parallelism.pipeline_parallel_microbatch_size", 1),
                 "layers_per_stage": get("parallelism.pipeline_parallel_layers_per_stage", None),
                 "fqns": get("parallelism.module_fqns_per_model_part", None),
                 "first_less": get("parallelism.pipeline_parallel_first_stage_less_layers", 1),
                 "last_less": get("parallelism.pipeline_parallel_last_stage_less_layers", 1),
                 "ep": get("parallelism.expert_parallel_degree", 1),
                 "etp": get("parallelism.expert_tensor_parallel_degree", 1), "sp": True,
                 "names": {"tp": "tensor_parallel_degree", "pp": "pipeline_parallel_degree",
                           "cp": "context_parallel_degree", "replicate": "data_parallel_replicate_degree"}},
         "training": {"seq_len": get("training.seq_len", 2048), "local": get("training.local_batch_size", 8),
                      "global": get("training.global_batch_size", -1)},
         "ac": ac_mode, "async_tp": get("parallelism.enable_async_tensor_parallel", False),
         "compile": compile_on, "precision": precision, "reclaim": "none"}
    for key, v in flat.items():
        if key in used:
            continue
        sec = key.split(".")[0]
        ignored.append((f"{key} = {_q(v)}", RUN if sec in RUN_SECTIONS or key in RUN_FIELDS else NOT_MODELLED))
    return _target(s, num_gpus, source, "torchtitan 0.2 TOML", used, ignored, approx, release="0.2")


#: longest Python config module read, characters (256 KiB; torchtitan 0.3.0's largest source file, trainer.py,
#: is 46 KB). :func:`ast.parse` of a 16 MiB module of assignments took 154 s and 10 GB (issue 37 sweep); of
#: 256 KiB about 0.5 s and 160 MB (1 MiB: 4.3 s, 632 MiB; dev machine, 2026-12-03)
MAX_CONFIG_MODULE_CHARS = 2**18


def _config_function(path: Path, fn: str | None, source: str) -> str:
    """The config function of a module: ``fn``, else ``autotune_plan`` or the only top-level function (read with
    :mod:`ast`, nothing run)."""
    from autotune.files import read_text_file
    text = read_text_file(path, what="torchtitan config module")    # regular file, size cap, no NUL (files.py)
    if len(text) > MAX_CONFIG_MODULE_CHARS:
        raise ConfigError(f"{source}: a config module of {len(text):,} characters; at most {MAX_CONFIG_MODULE_CHARS:,} "
                          "(torchtitan's largest source file is 46 KB)")
    try:
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, SyntaxError) as e:
        raise ConfigError(f"{source}: not a readable Python config module: {e}") from None
    except (RecursionError, MemoryError):      # an expression nested past the parser's stack (1+1+... 200,000 times)
        raise ConfigError(f"{source}: not a readable Python config module: it nests too deeply for Python's "
                          "parser") from None
    funcs = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    if fn is not None:
        if fn not in funcs:
            raise ConfigError(f"{source}: no top-level function {_q(fn)}; its functions: {', '.join(funcs) or 'none'}")
        return fn
    from autotune.engines.torchtitan.export import CONFIG_FUNCTION
    if CONFIG_FUNCTION in funcs:
        return CONFIG_FUNCTION
    if len(funcs) == 1:
        return funcs[0]
    raise ConfigError(f"{source}: name the config function as {path}:FUNCTION (its functions: "
                      f"{', '.join(funcs) or 'none'})")


#: seconds a config module may take to load in its child process (:data:`TIMEOUT_ENV` sets another limit):
#: importing torch and torchtitan there took 15.6 s (6.2 s CPU) on this project's shared 2-core machine, a whole
#: load about 20 s (docs/outputs.md); 45 s keeps a 2x margin under issue 37's 60 s bar (it was 120 s)
CONFIG_MODULE_TIMEOUT_S = 45.0
TIMEOUT_ENV = "AUTOTUNE_CONFIG_MODULE_TIMEOUT_S"
#: GiB of address space the child may use (RLIMIT_AS, setrlimit(2)); the environment variable
#: :data:`MAX_GIB_ENV` sets another limit. Importing torch 2.13 (CPU build) and torchtitan peaked at 0.94 GiB
#: of address space (VmPeak, dev machine, 2026-12-03); a CUDA build maps its larger libraries too, hence the margin.
CONFIG_MODULE_MAX_GIB = 8.0
from autotune.engines.torchtitan.child_limits import MAX_GIB_ENV  # noqa: E402 (one definition)
#: most bytes read of the child's answer (a config's settings are < 10 KiB of JSON)
MAX_ANSWER_BYTES = 4 * 2**20
#: largest file the child may write (RLIMIT_FSIZE: its stdout and stderr, anything the module writes)
CHILD_FSIZE_BYTES = 64 * 2**20
#: the interpreter of the child process (this one: it has torchtitan when autotune's extra installed it)
PYTHON = sys.executable
#: the child's own script (standard library and torchtitan only)
CHILD_SCRIPT = Path(__file__).with_name("config_child.py")


def _timeout_s() -> float:
    import os

    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return CONFIG_MODULE_TIMEOUT_S
    t = _env_number(raw)
    if not (math.isfinite(t) and 0 < t <= 86400):
        from autotune.files import display_text
        raise ConfigError(f"{TIMEOUT_ENV}={display_text(raw, 40)}: must be a number of seconds in (0, 86400]")
    return t


def _max_gib() -> float:
    """The child's address-space limit, GiB: ``$AUTOTUNE_CONFIG_MODULE_MAX_GIB`` (a number in [1, 4096]) or
    :data:`CONFIG_MODULE_MAX_GIB`.

    Raises:
        ConfigError: the variable is not such a number.
    """
    import os

    raw = os.environ.get(MAX_GIB_ENV)
    if raw is None or raw == "":
        return CONFIG_MODULE_MAX_GIB
    g = _env_number(raw)
    if not (math.isfinite(g) and 1 <= g <= 4096):
        from autotune.files import display_text
        raise ConfigError(f"{MAX_GIB_ENV}={display_text(raw, 40)}: must be a number of GiB between 1 and 4096")
    return g


def _env_number(raw: str) -> float:
    """An environment variable's value read as an ASCII decimal (:func:`autotune.spec.validate.parse_ascii_float`:
    not "٣٠", issue 37), NaN when it is not one (the callers name the variable and the valid range)."""
    from autotune.spec.validate import parse_ascii_float

    try:
        return parse_ascii_float(raw.strip(), "")
    except ConfigError:
        return math.nan


def _one_line(text: str, n: int = 200) -> str:
    from autotune.files import display_text

    lines = [ln for ln in str(text).splitlines() if ln.strip()]
    return display_text(lines[0] if lines else "", n)


#: this process's variables the config-module child gets (issue 37: it had them all; a module printed a secret):
#: ``PATH``, ``LANG`` / ``LC_ALL`` (encoding), ``LD_LIBRARY_PATH`` (a torch linked to CUDA or MKL outside its
#: wheel imports only with it). Not ``PYTHONPATH``: ``python -I`` ignores it; the import folders go in the request.
CHILD_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "LD_LIBRARY_PATH")


def child_env(cwd: str) -> dict[str, str]:
    """The environment of the config-module child: :data:`CHILD_ENV_KEEP` from this process's (where set),
    ``LANG=C.UTF-8`` when unset, ``HOME`` and ``TMPDIR`` the child's working directory ``cwd``; nothing else
    (``PYTORCH_CUDA_ALLOC_CONF`` in particular is the config function's to set, not the caller's)."""
    import os

    env = {k: os.environ[k] for k in CHILD_ENV_KEEP if k in os.environ}
    env.setdefault("PATH", os.defpath)
    env.setdefault("LANG", "C.UTF-8")
    env.update({"HOME": cwd, "TMPDIR": cwd})
    return env


def _load_in_child(path: Path, fn: str, source: str) -> dict:
    """The settings of config function ``fn`` of the module ``path``, loaded by
    :mod:`autotune.engines.torchtitan.config_child` in a child process (never in this one): ``python -I``, an
    empty temporary working directory, stdin closed, a minimal environment (:func:`child_env`), a session of
    its own under the guard of :mod:`autotune.launchers.reaper` (it ends with this process, ``kill -9``
    included), at most :func:`_timeout_s` seconds; its answer is JSON data, checked here as any input. Of an
    exception the module raises only the built-in type and the file and line are shown, never its message,
    and the child's output is never shown (the module's code chooses both).

    Raises:
        ConfigError: torchtitan not importable in the child (names the extra), the module failing to import
            (its exception's type and line), torchtitan's ConfigManager refusing it, the time limit, a child
            that ends without an answer (``os._exit`` at import) or is killed.
        Interrupted: SIGINT or SIGTERM arrived while the child ran (its process group is killed first).
    """
    import json
    import os
    import signal
    import subprocess
    import tempfile

    from autotune.errors import Interrupted
    from autotune.launchers.reaper import guarded
    from autotune.signals import child_signals, signal_name

    timeout = _timeout_s()
    max_gib = _max_gib()
    req = json.dumps({"file": str(path), "function": fn, "cpu_s": int(timeout) + 10, "fsize_bytes": CHILD_FSIZE_BYTES,
                      "as_bytes": int(max_gib * 2**30),
                      # this process's import folders (a torchtitan checkout on PYTHONPATH), appended after the child's
                      "path": [p for p in sys.path if p and os.path.isabs(p) and os.path.isdir(p)]})
    with tempfile.TemporaryDirectory(prefix="autotune-config-") as cwd, tempfile.TemporaryFile() as out, \
            tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(guarded([PYTHON, "-I", str(CHILD_SCRIPT), req], grace_s=1.0), cwd=cwd,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=child_env(cwd),
                                start_new_session=True)

        def stop() -> None:
            for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    return
                try:
                    proc.wait(timeout=wait_s)
                    return
                except subprocess.TimeoutExpired:
                    pass

        with child_signals() as sigs:
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                stop()
                raise ConfigError(f"{source}: loading the config module took longer than {timeout:g} s and was "
                                  f"stopped (it runs in a child process; {TIMEOUT_ENV}=SECONDS sets the limit; a "
                                  "torchtitan 0.2 TOML job file is read without running anything)") from None
            except KeyboardInterrupt:
                stop()
                sig = sigs.signum or signal.SIGINT
                raise Interrupted(sig, f"{signal_name(sig)} arrived while the config module {source} was loading; "
                                       "its process was stopped, nothing was done") from None
            except BaseException:
                stop()
                raise
        out.seek(0)
        raw = out.read(MAX_ANSWER_BYTES + 1)
        err.seek(0, os.SEEK_END)
        err.seek(max(0, err.tell() - 4096))
        tail = [ln for ln in err.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    # the child's output is read for a memory error only, never shown: the module writes what it likes there
    if not raw and any(w in ln for ln in tail[-5:] for w in ("MemoryError", "bad_alloc", "Cannot allocate memory")):
        raise _memory_error(source, max_gib)
    if not raw:
        how = (f"was killed by signal {signal.Signals(-rc).name}" if rc < 0 and -rc in signal.valid_signals()
               else f"ended with exit status {rc}")
        raise ConfigError(f"{source}: the process loading the config module {how} without returning a config (does "
                          f"the module end the process at import, os._exit or a signal?; its output is not shown)")
    try:
        answer = json.loads(raw.decode("utf-8")) if len(raw) <= MAX_ANSWER_BYTES else None
    except (ValueError, RecursionError):
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("ok"), bool):
        raise ConfigError(f"{source}: the process loading the config module returned no readable answer")
    if answer["ok"]:
        if not isinstance(answer.get("config"), dict):
            raise ConfigError(f"{source}: the process loading the config module returned no readable answer")
        return answer["config"]
    kind, msg = answer.get("kind"), _one_line(answer.get("message", ""))
    if kind == "memory":
        raise _memory_error(source, max_gib)
    if kind == "torchtitan":
        raise ConfigError(f"{source}: a torchtitan 0.3 config module is loaded with torchtitan's own ConfigManager, "
                          f"and torchtitan does not import here ({msg[:120]}); install it: "
                          "pip install -e '.[torchtitan]' (in the autotune checkout), or give a torchtitan 0.2 TOML "
                          "job file")
    if kind == "import":
        raise ConfigError(f"{source}: importing the config module failed: {msg}")
    if kind == "exit":
        raise ConfigError(f"{source}: torchtitan's ConfigManager refused it ({msg})")
    raise ConfigError(f"{source}: torchtitan's ConfigManager could not load {fn}(): {msg}")


def import_python_config(spec: str, *, num_gpus: int) -> ImportedLaunch:
    """Read a torchtitan 0.3.0 config module ``FILE.py[:FUNCTION]``: torchtitan's ConfigManager loads it in a
    child process (:func:`_load_in_child`: the module's code runs there, never in autotune's process), which
    answers with the settings as data.

    Raises:
        ConfigError: torchtitan not installed (names the extra), a file torchtitan cannot load, a module that
            hangs past the time limit or ends its process, or a setting autotune cannot simulate (named).
    """
    path_s, _, fn = spec.partition(":") if not Path(spec).is_file() else (spec, "", "")
    path = Path(path_s)
    source = str(spec)
    if not path.is_file():
        raise ConfigError(f"{source}: no such file")
    fn = _config_function(path, fn or None, source)
    return _from_config(_load_in_child(path.resolve(), fn, source), source, num_gpus)


def _from_config(c: dict, source: str, num_gpus: int) -> ImportedLaunch:
    """An :class:`ImportedLaunch` from the child's answer ``c`` (:func:`autotune.engines.torchtitan.config_child.describe`).

    Raises:
        ConfigError: a setting autotune cannot simulate, or an answer without the expected fields.
    """
    try:
        return _from_settings(c, source, num_gpus)
    except (KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{source}: the config module's settings are not a torchtitan Trainer.Config "
                          f"({type(e).__name__}: {_one_line(e, 80)})") from None


def _from_settings(c: dict, source: str, num_gpus: int) -> ImportedLaunch:
    from autotune.spec.validate import show

    ms = c["model"]
    if ms["name"] != "llama3":
        raise ConfigError(f"{source}: model {show(ms['name'])}: autotune simulates torchtitan's llama3 "
                          "(Llama 3.1) models")
    ignored: list = []
    approx: list = []
    mode = c["activation_checkpoint"]
    if mode not in ("none", "selective", "full"):
        raise ConfigError(f"{source}: activation_checkpoint {show(mode.get('other') if isinstance(mode, dict) else mode)}: "
                          "autotune models none, SelectiveAC and FullAC")
    precision = "bf16"
    for conv in c["converters"]:
        kind = str(conv["kind"])
        if kind.startswith("Float8LinearConverter"):
            if conv["recipe_name"] != "rowwise":
                raise ConfigError(f"{source}: Float8LinearConverter recipe {show(conv['recipe_name'])}: autotune "
                                  "costs rowwise")
            precision = "fp8_rowwise"
        elif kind.startswith("MXFP8LinearConverter"):
            precision = "mxfp8"
        else:
            raise ConfigError(f"{source}: model converter {show(kind)}: autotune models Float8LinearConverter "
                              "(rowwise) and MXFP8LinearConverter")
    tr, par, comp = c["training"], c["parallelism"], c["compile"]
    if tr["mixed_precision_param"] != "bfloat16":
        raise ConfigError(f"{source}: training.mixed_precision_param {show(tr['mixed_precision_param'])}: autotune "
                          "simulates BF16 compute")
    components = comp["components"] if isinstance(comp["components"], list) else []
    compile_on = bool(comp["enable"]) and "model" in components
    if comp["enable"] and not compile_on:
        approx.append("compile of the loss only: costed as eager (compile: false)")
    owner = c["trainer"]
    reclaim = "none"
    if owner is not None and owner["name"] == "AutotuneTrainer":
        # autotune's own Trainer subclass (autotune/engines/torchtitan/export.py): empty_cache after the hooked method
        reclaim = "empty_cache_per_step" if owner["train_step"] is True else "empty_cache_per_microbatch"
    elif owner is not None and owner["name"] != "Trainer":
        ignored.append((f"trainer {_one_line(owner['qualname'], 100)}", NOT_MODELLED))
    alloc = c["alloc"]
    if isinstance(alloc, str) and allocator_reclaim({"PYTORCH_CUDA_ALLOC_CONF": alloc}):
        if reclaim == "none":
            reclaim = "expandable_segments"      # the config function sets the allocator (export writes it so)
        else:
            approx.append(f"PYTORCH_CUDA_ALLOC_CONF={_one_line(alloc, 100)} with an empty_cache trainer: autotune has "
                          f"one memory reclaim setting; costed as {reclaim}")
    for name, v in (("training.enable_cpu_offload", tr["enable_cpu_offload"]),
                    ("parallelism.enable_fsdp_symm_mem", par.get("enable_fsdp_symm_mem", False))):
        if v:
            ignored.append((f"{name} = {show(v)}", NOT_MODELLED))
    ignored.append(("the optimizer, data, checkpoint and logging sections", RUN))
    s = {"flavor": ms["flavor"], "head": "lm_head",
         "par": {"tp": par["tensor_parallel_degree"], "pp": par["pipeline_parallel_degree"],
                 "cp": par["context_parallel_degree"], "replicate": par["data_parallel_replicate_degree"],
                 "shard": par["data_parallel_shard_degree"], "reshard": par["fsdp_reshard_after_forward"],
                 "schedule": par["pipeline_parallel_schedule"], "pp_mbs": par["pipeline_parallel_microbatch_size"],
                 "layers_per_stage": par["pipeline_parallel_layers_per_stage"],
                 "fqns": par["module_fqns_per_model_part"],
                 "first_less": par["pipeline_parallel_first_stage_less_layers"],
                 "last_less": par["pipeline_parallel_last_stage_less_layers"],
                 "ep": par["expert_parallel_degree"], "sp": par["enable_sequence_parallel"],
                 "names": {"tp": "tensor_parallel_degree", "pp": "pipeline_parallel_degree",
                           "cp": "context_parallel_degree", "replicate": "data_parallel_replicate_degree"}},
         "training": {"seq_len": tr["seq_len"], "local": tr["local_batch_size"], "global": tr["global_batch_size"]},
         "ac": mode, "async_tp": bool(comp["enable_async_tensor_parallel"]) and compile_on, "compile": compile_on,
         "precision": precision, "reclaim": reclaim}
    modelled = {"flavor": ms["flavor"], "parallelism": {k: par[k] for k in (
        "tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree", "data_parallel_shard_degree",
        "data_parallel_replicate_degree", "fsdp_reshard_after_forward", "enable_sequence_parallel")},
        "training": {"local_batch_size": tr["local_batch_size"], "global_batch_size": tr["global_batch_size"],
                     "seq_len": tr["seq_len"]}, "activation_checkpoint": mode, "compile": compile_on,
        "precision": precision, "memory_reclaim": reclaim}
    return _target(s, num_gpus, source, "torchtitan 0.3 config", modelled, ignored, approx, release="0.3")


def import_torchtitan(path: str | Path, *, num_gpus: int) -> ImportedLaunch:
    """A torchtitan launch file: ``.toml`` (0.2.x job file) or ``.py[:FUNCTION]`` (0.3.0 config module).

    Raises:
        ConfigError: another suffix, or what the format's reader refuses.
    """
    p = str(path)
    base = p if Path(p).is_file() else p.partition(":")[0]
    if base.lower().endswith(".toml"):
        return import_toml(base, num_gpus=num_gpus)
    if base.lower().endswith(".py"):
        return import_python_config(p, num_gpus=num_gpus)
    raise ConfigError(f"{p}: a torchtitan launch is a .toml job file (0.2.x) or a .py config module (0.3.0)")


#: file suffixes this reader claims for ``--from-*`` autodetection: 0.2.x TOML job files, 0.3 config modules
FILE_SUFFIXES: tuple[str, ...] = (".toml", ".py")

__all__ = ["FILE_SUFFIXES", "import_launch", "import_python_config", "import_toml", "import_torchtitan", "stage_split"]


def import_launch(path: str | Path, *, num_gpus: int | None) -> ImportedLaunch:
    """The importer part of the engine (:class:`autotune.engines.base.EngineParts`): :func:`import_torchtitan`.

    Raises:
        ConfigError: ``num_gpus`` None (a torchtitan file does not hold the world size), or what
            :func:`import_torchtitan` refuses.
    """
    if num_gpus is None:
        raise ConfigError(f"{path}: give --gpus N, the world size the launch runs on (TP x PP x CP x DP; a "
                          "launch file does not hold it)")
    return import_torchtitan(path, num_gpus=num_gpus)
