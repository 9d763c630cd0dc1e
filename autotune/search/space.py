"""The tuner's search space: which values each knob of a :class:`~autotune.spec.plan.Plan` may take.

A search space is data (``search_spaces/<name>.yaml``)::

    schema_version: 1
    name: default
    description: free text
    layer_split: ends          # even | ends (see below)
    knobs:                     # Plan field -> list of values (or one value = fixed)
      tp_degree: [1, 2, 4, 8]
      pp_degree: [1, 2, 4, 8, 16]
      ...

Knob names are :class:`~autotune.spec.plan.Plan` field names and are also the Optuna parameter names. A
knob left out is fixed at the Plan default. ``dp_degree`` and ``num_micro_batches`` are *derived*,
never sampled: ``dp = num_gpus / (tp x pp x cp)`` and ``m = global_batch / (micro_batch_size x dp)``.
``stage_layers`` is derived from ``layer_split``: ``even`` needs pp x vpp to divide the layer count;
``ends`` also accepts a split that is short of an even one by one or two layers, taken from the last
(and first) virtual stage, as the Llama 3 paper did for 405B (126 layers on 16 stages: one layer fewer
on the first and the last stage; Llama 3 paper, Sec. 3.3.2).

Sampling is define-by-run and conditional, so knobs that have no effect in a plan are not sampled
(fewer wasted trials, and no "no effect" warnings):

* ``pipeline_schedule`` only when pp > 1 (else 1f1b); ``vpp_degree`` only for interleaved_1f1b;
* ``sequence_parallel`` only when tp > 1; ``tp_comm_overlap`` only when tp > 1 and collectives are async;
* ``precision`` and ``compile`` when the space lists more than one value (FP8 values the GPU cannot run are dropped at bind time when
  the GPU is given; per-rank GEMM dimensions FP8 cannot take are pruned);
* ``loss_impl`` when the space lists more than one value and tp = pp = 1 (else ``full``: the chunked
  linear + cross-entropy takes the whole LM head); values the engine does not run are dropped at bind time;
* ``zero_stage`` and ``bucket_size_mib`` only when dp x cp > 1; ``dp_grad_reduce_overlap`` only then and
  with async collectives; ``param_gather_overlap`` only with grad-reduce overlap and ZeRO >= 1.

Values that can never be valid for the model, GPU count and workload on their own (TP not dividing the
heads, PP larger than the layer count, CP not dividing the sequence ...) are removed from the choices
once per study (:meth:`SearchSpace.bind`; the removed values and why are in
:attr:`BoundSearchSpace.excluded`). Combinations that are invalid (tp x pp x cp not dividing the GPU
count, a non-integer micro-batch count, layers not splitting over pp x vpp) are pruned
(``optuna.TrialPruned``) with the reason in ``trial.user_attrs['pruned_reason']``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from autotune.errors import ConfigError, PlanError
from autotune.search import recompute_choice as rc
from autotune.search.params import plan_params  # noqa: F401 - re-exported (moved there)
from autotune.spec.models import ModelSpec
from autotune.spec.moe_plan import validate_moe
from autotune.spec.plan import (
    MEMORY_RECLAIM_POLICIES,
    MOE_DISPATCHERS,
    PIPELINE_SCHEDULES,
    PRECISIONS,
    LOSS_IMPLS,
    RECOMPUTE_MODES,
    ZERO_STAGES,
    Plan,
    Workload,
    validate_plan,
    validate_precision,
)

SEARCH_SPACE_SCHEMA_VERSION = 1
LAYER_SPLITS = ("even", "ends")
DERIVED_FIELDS = ("dp_degree", "num_micro_batches", "stage_layers")

_INT_KNOBS = ("tp_degree", "pp_degree", "cp_degree", "vpp_degree", "micro_batch_size", "bucket_size_mib",
              "ep_degree", "etp_degree", "cpu_offload_layers")
_BOOL_KNOBS = ("sequence_parallel", "async_collectives", "tp_comm_overlap", "dp_grad_reduce_overlap",
               "param_gather_overlap", "compile", "moe_a2a_overlap", "fp8_param_gather", "grad_reduce_in_bf16")
_ENUM_KNOBS = {"pipeline_schedule": PIPELINE_SCHEDULES, "recompute": RECOMPUTE_MODES,
               "memory_reclaim": MEMORY_RECLAIM_POLICIES, "zero_stage": ZERO_STAGES, "precision": PRECISIONS,
               "moe_dispatcher": MOE_DISPATCHERS, "loss_impl": LOSS_IMPLS}
#: Every knob a search space may list, in sampling order.
KNOBS = ("tp_degree", "pp_degree", "cp_degree", "pipeline_schedule", "vpp_degree", "micro_batch_size",
         "sequence_parallel", "recompute", "zero_stage", "async_collectives", "tp_comm_overlap",
         "dp_grad_reduce_overlap", "param_gather_overlap", "bucket_size_mib", "memory_reclaim", "precision",
         "compile", "loss_impl", "ep_degree", "etp_degree", "moe_dispatcher", "moe_a2a_overlap", "fp8_param_gather",
         "grad_reduce_in_bf16", "recompute_modules", "cpu_offload_layers")
#: the mixture-of-experts knobs: sampled only for an MoE model (a dense model's trials have none of them),
#: and left out of the space fingerprint (a dense study cannot use them, so stored dense studies resume
#: under a space that lists them; an MoE study's trials hold their own values)
MOE_KNOBS = ("ep_degree", "etp_degree", "moe_dispatcher", "moe_a2a_overlap", "recompute_modules")
#: knobs left out of the fingerprint: the MoE knobs, and ``loss_impl`` (sampled only for the native engine at
#: TP 1, PP 1; a stored study of another engine or layout never sampled it), so studies stored before these knobs
#: were listed in the default space still resume
_UNFINGERPRINTED = MOE_KNOBS + ("loss_impl", "cpu_offload_layers")
#: knobs added after studies were first stored: left out of the fingerprint while fixed at the Plan
#: default, so studies of a space that does not list them still resume
_LATE_KNOBS = ("precision", "compile", "loss_impl", "fp8_param_gather", "grad_reduce_in_bf16", "cpu_offload_layers")
_PLAN_DEFAULTS = {f.name: f.default for f in fields(Plan)}


def search_space_dirs() -> list[Path]:
    """Where named search spaces are looked up: the repo's ``search_spaces/``, then the package data."""
    package = Path(__file__).resolve().parents[1]       # autotune/
    return [package.parent / "search_spaces", package / "data" / "search_spaces"]


def _builtin_space_file(name: str) -> Path | None:
    """``<dir>/<name>.yaml`` in the first of :func:`search_space_dirs` that has it, else None."""
    if not name or "/" in name or name.startswith("."):
        return None
    for d in search_space_dirs():
        if (d / f"{name}.yaml").is_file():
            return d / f"{name}.yaml"
    return None


def known_search_spaces() -> list[str]:
    names: set[str] = set()
    for d in search_space_dirs():
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


@dataclass(frozen=True)
class SearchSpace:
    """Choices per knob, as read from a YAML file (module docstring gives the schema).

    Attributes:
        name: the space's name (``default``); part of the study identity when not ``default``.
        choices: knob -> tuple of values, every knob of :data:`KNOBS` (left-out knobs hold the Plan default).
        layer_split: ``even`` or ``ends`` (how stage_layers is derived).
        source: the file it came from (for error messages).
        description: free text.
        listed: the knobs the file listed (others hold the Plan default); not compared.
    """

    name: str
    choices: Mapping[str, tuple[Any, ...]]
    layer_split: str = "even"
    source: str = "search space"
    description: str = ""
    #: knobs the file listed (the others hold the Plan default); only these are checked by
    #: :meth:`no_effect_warnings`; empty = all
    listed: tuple[str, ...] = field(default=(), compare=False)

    # ------------------------------------------------------------ loading
    @classmethod
    def load(cls, name_or_path: str | Path | None = None) -> "SearchSpace":
        """A named space (``default``, ``small``) from :func:`search_space_dirs`, or a YAML file path.

        Raises:
            ConfigError: unknown name (lists the known ones), unreadable file, or malformed content
                (names the file and the field).
        """
        spec = str(name_or_path or "default")
        p = Path(spec)
        by_name = not (spec.endswith((".yaml", ".yml")) or p.is_file() or "/" in spec)
        if by_name:
            found = _builtin_space_file(spec)
            if found is None:
                raise ConfigError(f"unknown search space {spec!r}; known: {', '.join(known_search_spaces())} "
                                  "(or give a path to a YAML file)")
            p = found
        from autotune.files import read_yaml_file

        d = read_yaml_file(p, what="search space file")
        space = cls.from_dict(d, source=str(p), default_name=p.stem)
        if not by_name:
            # the study name holds the space's name only: a file named like a built-in with other contents
            # would create (on a fresh storage) the built-in's study and get the real one refused there later
            builtin = _builtin_space_file(space.name)
            if builtin is not None and builtin.resolve() != p.resolve():
                other = cls.from_dict(read_yaml_file(builtin, what="search space file"), source=str(builtin),
                                      default_name=builtin.stem)
                if other.fingerprint != space.fingerprint:
                    raise ConfigError(f"search space file {p} is named like the built-in {space.name!r} "
                                      f"({builtin}) but its contents differ (fingerprint {other.fingerprint} vs "
                                      f"{space.fingerprint}); give it another name")
        return space

    @classmethod
    def from_dict(cls, d: Any, *, source: str = "search space", default_name: str = "custom") -> "SearchSpace":
        """Parse and check a search-space mapping.

        Raises:
            ConfigError: naming ``source`` and the offending field with the expected form.
        """
        if not isinstance(d, Mapping):
            raise ConfigError(f"{source}: expected a mapping with schema_version, name and knobs at the top "
                              f"level, got {type(d).__name__}")
        ver = d.get("schema_version", SEARCH_SPACE_SCHEMA_VERSION)
        if ver != SEARCH_SPACE_SCHEMA_VERSION:
            raise ConfigError(f"{source}: field schema_version is {ver!r}; expected {SEARCH_SPACE_SCHEMA_VERSION}")
        unknown_top = sorted(map(str, set(d) - {"schema_version", "name", "description", "layer_split", "knobs"}))
        if unknown_top:
            raise ConfigError(f"{source}: unknown top-level field(s) {unknown_top}; valid: schema_version, "
                              "name, description, layer_split, knobs")
        split = d.get("layer_split", "even")
        if not isinstance(split, str) or split not in LAYER_SPLITS:
            raise ConfigError(f"{source}: field layer_split is {split!r}; expected one of {', '.join(LAYER_SPLITS)}")
        knobs = d.get("knobs")
        if not isinstance(knobs, Mapping) or not knobs:
            raise ConfigError(f"{source}: field knobs must be a non-empty mapping of Plan field -> list of "
                              f"values; knobs: {', '.join(KNOBS)}")
        choices: dict[str, tuple[Any, ...]] = {}
        for k, v in knobs.items():
            where = f"{source}: field knobs.{k}"
            if k in DERIVED_FIELDS:
                raise ConfigError(f"{where}: {k} is derived (dp = gpus / (tp pp cp), num_micro_batches = "
                                  "global batch / (micro_batch_size dp), stage_layers from layer_split), "
                                  "not sampled; remove it")
            if k not in KNOBS:
                raise ConfigError(f"{where}: unknown knob; valid knobs: {', '.join(KNOBS)}")
            vals = list(v) if isinstance(v, (list, tuple)) else [v]
            if not vals:
                raise ConfigError(f"{where}: empty list; give at least one value")
            if len(vals) > MAX_KNOB_VALUES:
                raise ConfigError(f"{where}: {len(vals)} values; at most {MAX_KNOB_VALUES} per knob")
            for x in vals:
                _check_value(k, x, where)
            if len(set(vals)) != len(vals):
                raise ConfigError(f"{where}: duplicate values in {vals}")
            choices[k] = tuple(vals)
        for k in KNOBS:
            choices.setdefault(k, (_PLAN_DEFAULTS[k],))
        from autotune.spec.validate import require_name

        name = require_name(d.get("name", default_name), f"{source}: field name")
        desc = d.get("description", "")
        if not isinstance(desc, str):
            raise ConfigError(f"{source}: field description must be a string, got {type(desc).__name__}")
        return cls(name=name, choices=choices, layer_split=split, source=source,
                   description=desc, listed=tuple(map(str, knobs)))

    def no_effect_warnings(self) -> list[str]:
        """Listed values that can never reach a plan, because the conditional sampling (module
        docstring; :meth:`BoundSearchSpace.sample`) never samples their knob given the other knobs'
        values: the knob is then fixed (tp_comm_overlap, dp_grad_reduce_overlap, param_gather_overlap,
        sequence_parallel: false; vpp_degree 1; pipeline_schedule 1f1b; zero_stage 0). One line per
        knob that lists a value other than that fixed one, naming the knob, the values and why.
        """
        c = self.choices
        tp_gt1 = any(t > 1 for t in c["tp_degree"])
        pp_gt1 = any(x > 1 for x in c["pp_degree"])
        async_on = True in c["async_collectives"]
        grad_on = async_on and True in c["dp_grad_reduce_overlap"]
        zero_ge1 = any(z >= 1 for z in c["zero_stage"])
        never: list[tuple[str, Any, str]] = [
            ("tp_comm_overlap", False, "async_collectives lists only false (TP overlap is sampled only with "
             "async collectives)" if not async_on else "tp_degree lists only 1" if not tp_gt1 else ""),
            ("sequence_parallel", False, "" if tp_gt1 else "tp_degree lists only 1"),
            ("dp_grad_reduce_overlap", False, "" if async_on else "async_collectives lists only false (DP "
             "overlap is sampled only with async collectives)"),
            ("param_gather_overlap", False, "" if grad_on and zero_ge1 else
             "zero_stage lists only 0" if not zero_ge1 else
             "dp_grad_reduce_overlap can never be true here (it needs async collectives)"),
            ("pipeline_schedule", "1f1b", "" if pp_gt1 else "pp_degree lists only 1"),
            ("vpp_degree", 1, "" if pp_gt1 and "interleaved_1f1b" in c["pipeline_schedule"] else
             "pp_degree lists only 1" if not pp_gt1 else "pipeline_schedule does not list interleaved_1f1b"),
        ]
        out = []
        for knob, fixed, why in never:
            if self.listed and knob not in self.listed:
                continue
            extra = [v for v in c[knob] if v != fixed]
            if why and extra:
                vals = ", ".join(str(v).lower() if isinstance(v, bool) else str(v) for v in extra)
                fx = str(fixed).lower() if isinstance(fixed, bool) else str(fixed)
                out.append(f"search space {self.name!r}: {knob} value(s) {vals} have no effect: {why}, so "
                           f"{knob} stays {fx}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SEARCH_SPACE_SCHEMA_VERSION, "name": self.name, "description": self.description,
                "layer_split": self.layer_split, "knobs": {k: list(v) for k, v in self.choices.items()}}

    @property
    def fingerprint(self) -> str:
        """Short hash of the choices (12 hex digits): studies remember which space they were tuned on."""
        knobs = {k: list(v) for k, v in self.choices.items()
                 if not (k in _LATE_KNOBS and tuple(v) == (_PLAN_DEFAULTS[k],)) and k not in _UNFINGERPRINTED}
        blob = json.dumps({"layer_split": self.layer_split, "knobs": knobs}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def bind(self, *, model: ModelSpec, num_gpus: int, workload: Workload, gpu: Any = None,
             engine: Any = None) -> "BoundSearchSpace":
        """Restrict the choices to values that can be valid for this model, GPU count and workload (and,
        given ``gpu``, an :class:`autotune.spec.hardware.GPUSpec`, the precisions its architecture runs; given
        ``engine``, an :class:`autotune.spec.engines.EngineProfile`, the ZeRO stages, schedules, precisions,
        compile and TP communication overlap it can run).

        Raises:
            ConfigError: a knob has no valid value left (names the knob, its values and why each fails).
        """
        return BoundSearchSpace(space=self, model=model, num_gpus=num_gpus, workload=workload, gpu=gpu,
                                engine=engine)


#: Most values one knob may list (the default space lists <= 8; bounds the combinations enumerated).
MAX_KNOB_VALUES = 1024


def _check_value(k: str, x: Any, where: str) -> None:
    if k == "recompute_modules":
        rc.check_value(x, where)
    elif k in _INT_KNOBS:
        lo = 0 if k == "cpu_offload_layers" else 1          # (0 = no offloading)
        if not isinstance(x, int) or isinstance(x, bool) or not lo <= x <= 2**20:
            raise ConfigError(f"{where}: value {x!r} is not an integer >= {lo} and <= 1,048,576")
    elif k in _BOOL_KNOBS:
        if not isinstance(x, bool):
            raise ConfigError(f"{where}: value {x!r} is not true or false")
    else:
        valid = _ENUM_KNOBS[k]
        if x not in valid or isinstance(x, bool):
            raise ConfigError(f"{where}: value {x!r} is not one of {', '.join(map(str, valid))}")


def _divides_all(t: int, dims: Mapping[str, int]) -> list[str]:
    return [f"{k}={v}" for k, v in dims.items() if v % t]


def derive_stage_layers(num_layers: int, num_virtual_stages: int, layer_split: str, *,
                        wide_ends: bool = False) -> tuple[int, ...] | None:
    """Layers per virtual stage for ``layer_split``; None means the even split.

    ``wide_ends`` (mixture-of-experts models): a deficit 2 < d <= 2 (per - 1) is taken from the two end stages,
    ceil(d / 2) from the last and floor(d / 2) from the first.

    ``ends``: with ``per = ceil(L / n)`` and deficit ``d = n per - L``, d = 1 takes one layer from the
    last virtual stage (it also runs the LM head and loss), d = 2 one from the first and one from the
    last (Llama 3 paper Sec. 3.3.2: 405B's 126 layers on 16 stages hold 7 on the first and last). With
    one layer per virtual stage the end stages hold none: the first only the embedding, the last only
    the LM head and loss, as Megatron-LM builds them with ``--account-for-embedding-in-pipeline-split``
    and ``--account-for-loss-in-pipeline-split`` (megatron/core/transformer/transformer_block.py,
    ``get_num_layers_to_build``): 126 layers on pp 16 x vpp 8 = 128 virtual stages.

    Raises:
        PlanError: the layers cannot be split that way (names L, n and what would be valid).
    """
    n = num_virtual_stages
    if num_layers % n == 0:
        return None
    if layer_split == "even":
        raise PlanError(f"{num_layers} layers do not split evenly over pp x vpp = {n} stages "
                        f"({num_layers / n:g} per stage)")
    per = -(-num_layers // n)
    deficit = n * per - num_layers
    if wide_ends and 2 < deficit <= 2 * (per - 1):
        # a mixture-of-experts model: the first stage (embedding) and the last (loss, MTP layers) hold up to
        # per - 1 layers fewer each, the last the larger share (Megatron-LM --pipeline-model-parallel-layout,
        # e.g. DeepSeek-V3's 61 layers on 16 virtual stages as 3, 4 x 14, 2)
        out = [per] * n
        out[-1] -= -(-deficit // 2)
        out[0] -= deficit // 2
        return tuple(out)
    if deficit > 2:
        raise PlanError(f"{num_layers} layers over pp x vpp = {n} stages: an even split needs {n * per}, "
                        f"{deficit} more; layer_split=ends removes at most one layer from the first and one "
                        f"from the last stage")
    out = [per] * n
    out[-1] -= 1
    if deficit == 2:
        out[0] -= 1
    return tuple(out)


_UNCHECKED = object()


class Pruned(Exception):
    """A sampled combination is invalid; ``reason`` says why (the tuner turns it into TrialPruned)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class BoundSearchSpace:
    """A :class:`SearchSpace` restricted to one model, GPU count and workload (see :meth:`SearchSpace.bind`).

    Attributes:
        choices: knob -> the values that remain.
        excluded: knob -> {value: why it can never be valid here}.
    """

    space: SearchSpace
    model: ModelSpec
    num_gpus: int
    workload: Workload
    gpu: Any = None
    engine: Any = None
    choices: dict[str, tuple[Any, ...]] = field(init=False)
    excluded: dict[str, dict[str, str]] = field(init=False)
    #: warnings: a boolean knob the space asks to be on only, which the engine cannot run, searched off
    forced_off: list[str] = field(init=False)
    #: (precision, tp_degree) -> validate_precision's error, or None (:meth:`variant`)
    _precision_errors: dict[tuple[str, int], str | None] = field(init=False, default_factory=dict, repr=False,
                                                                 compare=False)

    def __post_init__(self) -> None:
        m, n, w = self.model, self.num_gpus, self.workload
        dims = {"heads": m.num_heads, "kv_heads": m.num_kv_heads, "hidden_size": m.hidden_size,
                "ffn_hidden_size": m.ffn_hidden_size}
        excluded: dict[str, dict[str, str]] = {}
        forced_off: list[str] = []

        def why_not(knob: str, v: Any) -> str | None:
            if knob == "tp_degree":
                bad = _divides_all(v, dims)
                if bad:
                    return f"tp_degree={v} does not divide {', '.join(bad)}"
            if knob in ("tp_degree", "pp_degree", "cp_degree") and n % v:
                return f"{knob}={v} does not divide the {n} GPUs"
            if knob == "pp_degree" and v > m.num_layers:
                return f"pp_degree={v} exceeds the {m.num_layers} layers"
            if knob == "cp_degree" and v > 1 and w.seq_len % (2 * v):
                return f"seq_len={w.seq_len} is not a multiple of 2 x cp_degree={2 * v}"
            if knob == "cpu_offload_layers" and v and (v >= m.num_layers or (self.engine and not self.engine.cpu_offload)):
                return (f"cpu_offload_layers={v} is not less than the {m.num_layers} layers" if v >= m.num_layers
                        else self.engine.cpu_offload_reason or f"engine {self.engine.name} has no CPU offloading")
            if knob == "micro_batch_size" and w.global_batch_size % v:
                return f"micro_batch_size={v} does not divide the global batch of {w.global_batch_size} sequences"
            if knob == "vpp_degree" and v == 1:
                return "vpp_degree=1 with interleaved_1f1b is plain 1F1B (already searched)"
            if knob == "precision" and v != "bf16" and self.gpu is not None:
                if v == "mxfp8" and not self.gpu.supports_mxfp8:
                    return f"precision=mxfp8 needs a Blackwell GPU; {self.gpu.name} is {self.gpu.arch}"
                if not self.gpu.supports_fp8:
                    return f"precision={v} needs FP8 tensor cores (Hopper or newer); {self.gpu.name} is {self.gpu.arch}"
            if knob == "recompute_modules":
                return rc.static_reason(v, m, self.engine)
            if knob in MOE_KNOBS and v != _PLAN_DEFAULTS[knob]:
                if not m.is_moe:
                    return f"{knob}={v} needs a mixture-of-experts model ({m.name} is dense)"
                if knob == "ep_degree" and (m.num_experts % v or n % v):
                    return f"ep_degree={v} does not divide the {m.num_experts} experts and the {n} GPUs"
            if knob == "ep_degree" and m.is_moe and self.gpu is not None and self.engine is not None:
                # a lower bound on any plan's memory at this EP: the routed experts' weights and gradients
                # of the fewest MoE layers a rank can hold (the space's largest PP, the largest ETP)
                pp_max = max(x for x in self.space.choices["pp_degree"] if x <= m.num_layers)
                etp_max = max(self.space.choices["etp_degree"])
                per_rank = (-(-m.num_moe_layers // pp_max)) * (m.num_experts // v) * m.expert_params // etp_max
                need = per_rank * (self.engine.param_bytes + self.engine.grad_buffer_bytes)
                if need > self.gpu.usable_hbm_bytes:
                    return (f"ep_degree={v}: the routed experts' weights and gradients alone need "
                            f"{need / 2**30:.0f} GiB per GPU at pp {pp_max}, more than {self.gpu.name}'s "
                            f"{self.gpu.usable_hbm_bytes / 2**30:.0f} GiB")
            if knob == "etp_degree" and (m.moe_ffn_hidden_size % v or n % v):
                return f"etp_degree={v} does not divide the expert FFN width {m.moe_ffn_hidden_size} and the {n} GPUs"
            if knob == "zero_stage" and m.is_moe and v >= 2:
                return f"zero_stage={v} (FSDP) with routed experts is not costed"
            e = self.engine
            if e is not None:
                if knob == "moe_dispatcher" and m.is_moe and v not in e.moe_dispatchers:
                    return f"engine {e.name} has no {v} dispatcher (it has {', '.join(e.moe_dispatchers) or 'none'})"
                if knob == "moe_a2a_overlap" and v is True and not e.moe_a2a_overlap:
                    return f"engine {e.name} has no expert-parallel all-to-all overlap"
                if knob == "zero_stage" and v not in e.zero_stages:
                    return e.zero_stage_reasons.get(v) or f"engine {e.name} has no zero_stage {v}"
                if knob == "pipeline_schedule" and v not in e.schedules:
                    return f"engine {e.name} has no {v} schedule"
                if knob == "tp_comm_overlap" and v is True and not e.tp_comm_overlap:
                    return e.tp_comm_overlap_reason or f"engine {e.name} has no TP communication overlap"
                if (knob == "tp_comm_overlap" and v is True and e.tp_comm_overlap_needs_compile
                        and True not in self.space.choices.get("compile", (False,))):
                    return (f"engine {e.name} overlaps TP communication only with compile=true (async TP), "
                            "which this space does not search")
                if knob == "precision" and v not in e.precisions:
                    return f"engine {e.name} has no {v} recipe (it runs {', '.join(e.precisions)})"
                if knob == "compile" and v is True and not e.compile:
                    return f"engine {e.name} has no torch.compile setting"
                if knob == "fp8_param_gather" and v is True and getattr(e, "fp8_library", None) != "transformer_engine":
                    return (f"engine {e.name} keeps no FP8 parameters (Megatron-LM --fp8-param-gather needs "
                            "Transformer Engine's FP8 weights)")
                if knob == "grad_reduce_in_bf16" and v is True and not getattr(e, "grad_reduce_bf16", False):
                    return f"engine {e.name} reduces gradients in FP32 only"
                if knob == "loss_impl" and v not in e.lever_values("loss_impl"):
                    return f"engine {e.name} has no loss_impl={v} (it runs {', '.join(e.lever_values('loss_impl'))})"
            return None

        choices: dict[str, tuple[Any, ...]] = {}
        for knob in KNOBS:
            keep = []
            for v in self.space.choices[knob]:
                r = why_not(knob, v)
                if r is None:
                    keep.append(v)
                else:
                    excluded.setdefault(knob, {})[str(v)] = r
            if not keep and knob in _BOOL_KNOBS and self.engine is not None and all(
                    v is True for v in self.space.choices[knob]):
                keep = [False]      # the engine cannot turn this setting on: search it switched off
                forced_off.append(f"{self.space.source}: {knob}: [true] cannot run on engine {self.engine.name} "
                                  f"({'; '.join(excluded.get(knob, {}).values())}); searched with {knob}=false")
            if not keep and knob != "vpp_degree":
                raise ConfigError(
                    f"{self.space.source}: no value of {knob} {list(self.space.choices[knob])} is valid for "
                    f"{m.name} on {n} GPUs with {w.label}: " + "; ".join(excluded.get(knob, {}).values()))
            choices[knob] = tuple(keep)
        if not choices["vpp_degree"] and "interleaved_1f1b" in choices["pipeline_schedule"]:
            choices["pipeline_schedule"] = tuple(s for s in choices["pipeline_schedule"] if s != "interleaved_1f1b")
            excluded.setdefault("pipeline_schedule", {})["interleaved_1f1b"] = "no vpp_degree > 1 in the space"
            if not choices["pipeline_schedule"]:
                raise ConfigError(f"{self.space.source}: pipeline_schedule lists only interleaved_1f1b but "
                                  "vpp_degree has no value > 1")
        if not choices["vpp_degree"]:
            choices["vpp_degree"] = (1,)
        self.choices = choices
        self.excluded = excluded
        self.forced_off = forced_off
        self._check_some_layout_divides()

    def _check_some_layout_divides(self) -> None:
        """Raise :class:`ConfigError` when no (tp, pp, cp, micro_batch_size) of the choices divides the GPUs
        and the global batch: dp = GPUs / (tp pp cp) and the global batch must be a multiple of
        micro_batch_size x dp (:meth:`suggest`'s rules); the message names the DP degrees the dividing
        layouts give and the nearest GPU counts that would work."""
        c, n, gbs = self.choices, self.num_gpus, self.workload.global_batch_size

        def ok(num_gpus: int) -> tuple[bool, set[int]]:
            dps: set[int] = set()
            for tp, pp, cp in itertools.product(c["tp_degree"], c["pp_degree"], c["cp_degree"]):
                if num_gpus % (tp * pp * cp):
                    continue
                dp = num_gpus // (tp * pp * cp)
                dps.add(dp)
                if any(gbs % (mbs * dp) == 0 for mbs in c["micro_batch_size"]):
                    return True, dps
            return False, dps

        good, dps = ok(n)
        if good:
            return
        near: list[int] = []
        for g in sorted(range(max(1, n // 2), 2 * n + 1), key=lambda g: (abs(g - n), g)):
            if g != n and ok(g)[0]:
                near.append(g)
                if len(near) == 2:
                    break
        raise ConfigError(
            f"{self.space.source}: no layout is valid for {self.model.name} on {n} GPUs with a global batch of "
            f"{gbs} sequences: the tp x pp x cp degrees that divide {n} leave dp = "
            f"{', '.join(map(str, sorted(dps))) or 'none'}, and {gbs} is not a multiple of micro_batch_size "
            f"{list(c['micro_batch_size'])} x dp; use a GPU count such as {' or '.join(map(str, sorted(near))) or '-'}, "
            f"or a global batch that dp divides")

    # ------------------------------------------------------------ sampling
    def suggest(self, trial: Any) -> Plan:
        """Sample one plan with ``trial`` (an Optuna Trial or FixedTrial), define-by-run.

        Returns:
            A plan that passed :func:`autotune.spec.plan.validate_plan`.

        Raises:
            Pruned: the sampled combination is invalid (``reason`` names the numbers).
        """
        c = self.choices
        m, n, w = self.model, self.num_gpus, self.workload

        def pick(knob: str) -> Any:
            return trial.suggest_categorical(knob, c[knob])

        tp, pp, cp = pick("tp_degree"), pick("pp_degree"), pick("cp_degree")
        if n % (tp * pp * cp):
            raise Pruned(f"tp x pp x cp = {tp} x {pp} x {cp} = {tp * pp * cp} does not divide the {n} GPUs")
        dp = n // (tp * pp * cp)
        schedule = pick("pipeline_schedule") if pp > 1 else "1f1b"
        vpp = pick("vpp_degree") if schedule == "interleaved_1f1b" else 1
        try:
            stage_layers = derive_stage_layers(m.num_layers, pp * vpp, self.space.layer_split, wide_ends=m.is_moe)
        except PlanError as e:
            raise Pruned(str(e)) from None
        mbs = pick("micro_batch_size")
        if w.global_batch_size % (mbs * dp):
            raise Pruned(f"global batch {w.global_batch_size} sequences / (micro_batch_size {mbs} x dp {dp}) = "
                         f"{w.global_batch_size / (mbs * dp):g} micro-batches, not a whole number")
        num_mb = w.global_batch_size // (mbs * dp)
        sp = pick("sequence_parallel") if tp > 1 else False
        recompute = pick("recompute")
        g = dp * cp
        zero = pick("zero_stage") if g > 1 else 0
        async_c = pick("async_collectives")
        tp_overlap = pick("tp_comm_overlap") if tp > 1 and async_c else False
        grad_overlap = pick("dp_grad_reduce_overlap") if g > 1 and async_c else False
        gather_overlap = pick("param_gather_overlap") if grad_overlap and zero >= 1 else False
        bucket = pick("bucket_size_mib") if g > 1 else c["bucket_size_mib"][0]
        reclaim = pick("memory_reclaim")
        # late knobs are sampled only when the space offers a choice, so spaces (and stored trials) that
        # do not list them sample exactly as before
        precision = pick("precision") if len(c["precision"]) > 1 else c["precision"][0]
        compiled = pick("compile") if len(c["compile"]) > 1 else c["compile"][0]
        # FP8 plans only (issue 40): FP8 parameters (Megatron-LM --fp8-param-gather, Transformer Engine's FP8
        # weights: the parameter all-gather moves 1 byte per element) and BF16 gradient reduction
        # (--grad-reduce-in-bf16), as Megatron-Bridge's FP8 recipes set both; with a DP group for the second
        fp8 = precision != "bf16"
        fp8_pg = pick("fp8_param_gather") if fp8 and len(c["fp8_param_gather"]) > 1 else \
            (c["fp8_param_gather"][0] and fp8)
        bf16_grads = pick("grad_reduce_in_bf16") if fp8 and g > 1 and len(c["grad_reduce_in_bf16"]) > 1 else \
            (c["grad_reduce_in_bf16"][0] and g > 1)
        # the chunked linear + cross-entropy takes the whole LM head (native runtime: TP 1, PP 1)
        if tp == 1 and pp == 1:
            loss_impl = pick("loss_impl") if len(c["loss_impl"]) > 1 else c["loss_impl"][0]
        else:
            loss_impl = "full"
        # CPU activation offloading: Megatron-Core's rules (Plan._check_cpu_offload): pp 1, no recompute
        off = c["cpu_offload_layers"]
        extra_kw: dict[str, Any] = {"cpu_offload_layers": (pick("cpu_offload_layers") if len(off) > 1 else off[0])
                                    if pp == 1 and recompute == "none" else 0}
        if m.is_moe:
            ep = pick("ep_degree")
            etp = pick("etp_degree") if len(c["etp_degree"]) > 1 else c["etp_degree"][0]
            if (tp * cp * dp) % (ep * etp):
                raise Pruned(f"ep x etp = {ep} x {etp} does not divide tp x cp x dp = {tp * cp * dp}")
            extra_kw |= {"ep_degree": ep, "etp_degree": etp,
                         "moe_dispatcher": pick("moe_dispatcher") if ep * etp > 1 else "alltoall",
                         "moe_a2a_overlap": pick("moe_a2a_overlap") if ep > 1 and async_c else False}
            if recompute == "selective":
                # Megatron-LM --recompute-modules (search/recompute_choice.py): MoE models only
                rms = c["recompute_modules"]
                extra_kw["recompute_modules"] = rc.decode(pick("recompute_modules") if len(rms) > 1 else rms[0])
        try:
            plan = Plan(tp_degree=tp, pp_degree=pp, dp_degree=dp, cp_degree=cp, vpp_degree=vpp,
                        micro_batch_size=mbs, num_micro_batches=num_mb, pipeline_schedule=schedule,
                        sequence_parallel=sp, recompute=recompute, zero_stage=zero, async_collectives=async_c,
                        tp_comm_overlap=tp_overlap, dp_grad_reduce_overlap=grad_overlap,
                        param_gather_overlap=gather_overlap, bucket_size_mib=bucket, memory_reclaim=reclaim,
                        stage_layers=stage_layers, precision=precision, compile=compiled,
                        loss_impl=loss_impl, fp8_param_gather=fp8_pg, grad_reduce_in_bf16=bf16_grads, **extra_kw)
            validate_plan(plan, m, n, w, gpu=self.gpu)
        except PlanError as e:
            raise Pruned(str(e)) from None
        return plan

    #: the knobs :meth:`variant` re-derives from a plan of the same layout and settings
    VARIANT_KNOBS = ("precision", "recompute", "zero_stage", "param_gather_overlap", "bucket_size_mib",
                     "fp8_param_gather", "grad_reduce_in_bf16", "cpu_offload_layers")

    def variant(self, base: Plan, params: Mapping[str, Any]) -> Plan:
        """``suggest`` of ``params`` (a value for every knob), derived from ``base``, the plan ``suggest``
        built from params that differ from ``params`` only in :data:`VARIANT_KNOBS` (a ranking of 405B x
        1,024 B200 built 17,495 plans through ``suggest`` before this existed, most of them one layout's
        precision x recompute x ZeRO combinations).

        The knobs take the values ``suggest`` gives them: the ZeRO stage only with a DP group (dp x cp > 1,
        else 0), the parameter-gather overlap only with the overlapped gradient reduction and ZeRO >= 1, the
        bucket size only with a DP group (else the first choice), the precision when the space has more than
        one. ``validate_plan`` reads these knobs only in its precision check (:func:`validate_precision`,
        run here when the precision changes; recompute_num_layers is 0 in every sampled plan), and Plan's own
        checks pass for choice values combined this way; so the plan is built without them, field for field
        ``base``'s but those eight. tests/search/test_search_space.py compares it with ``suggest`` over every
        combination of many layouts.

        Raises:
            Pruned: the precision is invalid for the GPU or the per-rank GEMM shapes (as ``suggest``).
        """
        c = self.choices
        g = base.dp_degree * base.cp_degree
        zero = params["zero_stage"] if g > 1 else 0
        changes = {
            "recompute": params["recompute"],
            "zero_stage": zero,
            "param_gather_overlap": params["param_gather_overlap"] if base.dp_grad_reduce_overlap and zero >= 1
            else False,
            "bucket_size_mib": params["bucket_size_mib"] if g > 1 else c["bucket_size_mib"][0],
            "precision": params["precision"] if len(c["precision"]) > 1 else c["precision"][0],
        }
        fp8 = changes["precision"] != "bf16"
        fpg = c["fp8_param_gather"]
        changes["fp8_param_gather"] = bool(params["fp8_param_gather"] if fp8 and len(fpg) > 1 else (fpg[0] and fp8))
        bg = c["grad_reduce_in_bf16"]
        changes["grad_reduce_in_bf16"] = bool(params["grad_reduce_in_bf16"] if fp8 and g > 1 and len(bg) > 1
                                              else (bg[0] and g > 1))
        off = c["cpu_offload_layers"]       # (pp 1 and no recompute only, as suggest)
        changes["cpu_offload_layers"] = (params["cpu_offload_layers"] if len(off) > 1 else off[0]) \
            if base.pp_degree == 1 and changes["recompute"] == "none" else 0
        if self.model.is_moe:
            rms = c["recompute_modules"]
            changes["recompute_modules"] = rc.decode(params["recompute_modules"] if len(rms) > 1 else rms[0]) \
                if changes["recompute"] == "selective" else None
        plan = object.__new__(Plan)
        plan.__dict__.update(base.__dict__)
        plan.__dict__.update(changes)
        if plan.recompute_modules is not None:
            try:            # the module rules that depend on the plan (precision, overlap): spec/moe_plan.py
                validate_moe(plan, self.model)
            except PlanError as e:
                raise Pruned(str(e)) from None
        if plan.precision != base.precision:
            key = (plan.precision, plan.tp_degree)
            err = self._precision_errors.get(key, _UNCHECKED)
            if err is _UNCHECKED:
                try:
                    validate_precision(plan, self.model, self.gpu) if self.gpu is not None else None
                    err = None
                except PlanError as e:
                    err = str(e)
                self._precision_errors[key] = err
            if err is not None:
                raise Pruned(err)
        return plan

    def plan_from_params(self, params: Mapping[str, Any]) -> Plan:
        """Rebuild the plan an Optuna trial with ``params`` sampled (the inverse of :meth:`suggest`).

        Raises:
            Pruned: the params describe an invalid combination.
            ConfigError: a parameter the conditional sampling needs is missing.
        """
        import optuna

        try:
            return self.suggest(optuna.trial.FixedTrial(dict(params)))
        except ValueError as e:
            if isinstance(e, PlanError):
                raise
            raise ConfigError(f"trial parameters {dict(params)} do not describe a plan of this space: {e}") from None

    def num_combinations(self) -> int:
        """Upper bound on distinct plans (product of the remaining choices; conditionals make it smaller)."""
        return math.prod(len(v) for v in self.choices.values())

    def enumerate_plans(self) -> list[Plan]:
        """Every valid plan of the space (exhaustive; for tests and small spaces)."""
        import warnings

        import optuna

        out: list[Plan] = []
        seen: set[Plan] = set()
        prev = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study = optuna.create_study(sampler=optuna.samplers.BruteForceSampler(seed=0))
            def obj(trial: Any) -> float:
                try:
                    plan = self.suggest(trial)
                except Pruned:
                    raise optuna.TrialPruned()
                if plan not in seen:
                    seen.add(plan)
                    out.append(plan)
                return 0.0

            study.optimize(obj, n_trials=self.num_combinations() * 2 + 10)
        finally:
            optuna.logging.set_verbosity(prev)
        return out


__all__ = ["SearchSpace", "BoundSearchSpace", "Pruned", "KNOBS", "DERIVED_FIELDS", "derive_stage_layers",
           "plan_params", "known_search_spaces", "search_space_dirs"]
