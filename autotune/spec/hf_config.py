"""Reading Hugging Face ``config.json`` into a :class:`~autotune.spec.models.ModelSpec`: dense decoders (Llama,
Mistral, Qwen2, Gemma, Gemma 2, Phi-3) and the mixture-of-experts families (Mixtral, Qwen3-MoE, DeepSeek-V2/V3,
Kimi K2, GPT-OSS). Moved out of :mod:`autotune.spec.models` (issue 38); ``models.model_from_hf_config`` calls it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from autotune.errors import ConfigError
from autotune.spec.models import ROUTER_SCORE_FUNCTIONS, ModelSpec, RopeScaling
from autotune.spec.validate import MAX_FFN_HIDDEN_SIZE, MAX_HIDDEN_SIZE, MAX_NUM_HEADS, MAX_NUM_LAYERS

#: upper bounds of config.json fields, checked as each field is read, before any work (a 10**6-layer config ran
#: 200 s at 3.2 GB before; autotune/spec/validate.py); other integer fields at most 2**30
HF_FIELD_BOUNDS = {"vocab_size": 2**24, "num_hidden_layers": MAX_NUM_LAYERS, "hidden_size": MAX_HIDDEN_SIZE,
                   "intermediate_size": MAX_FFN_HIDDEN_SIZE, "moe_intermediate_size": MAX_FFN_HIDDEN_SIZE,
                   "num_attention_heads": MAX_NUM_HEADS, "num_key_value_heads": MAX_NUM_HEADS}

#: model_type -> the architecture's defaults where its HF config leaves a field out (HF transformers
#: ``models/<type>/configuration_<type>.py`` and ``modeling_<type>.py``):
#:   gated: the MLP is gated (gate, up, down) whatever ``hidden_act`` says (Gemma's GeGLU uses
#:     ``gelu``/``gelu_pytorch_tanh``, GemmaMLP; Llama/Mistral/Qwen2/Phi-3 SwiGLU with ``silu``);
#:   tied: ``tie_word_embeddings`` default (GemmaConfig / Gemma2Config: True; the others False,
#:     except where the config says so, e.g. Llama-3.2-1B);
#:   qkv_bias: Qwen2Attention builds q/k/v_proj with bias=True (o_proj without);
#:   norms: RMSNorm vectors per layer (Gemma2DecoderLayer: 4);
#:   window: how a sliding window is declared (``sliding_window`` always used for Mistral/Phi-3/Gemma 2;
#:     Qwen2 only with ``use_sliding_window: true``).
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": dict(gated=True, tied=False, qkv_bias=False, norms=2, window="never"),
    "mistral": dict(gated=True, tied=False, qkv_bias=False, norms=2, window="always"),
    "qwen2": dict(gated=True, tied=False, qkv_bias=True, norms=2, window="use_sliding_window"),
    "gemma": dict(gated=True, tied=True, qkv_bias=False, norms=2, window="never"),
    "gemma2": dict(gated=True, tied=True, qkv_bias=False, norms=4, window="always"),
    "phi3": dict(gated=True, tied=False, qkv_bias=False, norms=2, window="always"),
}
#: model_types that are mixture-of-experts; those in :data:`MOE_READERS` are read, the others refused by name.
MOE_TYPES = {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "dbrx", "jamba", "olmoe",
             "phimoe", "granitemoe", "jetmoe", "arctic", "grok-1", "llama4"}
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size", "num_experts_per_tok")


def _moe_key(raw: dict[str, Any]) -> str | None:
    """The first key of ``raw`` that declares mixture-of-experts layers with a set value (not null, 0, false
    or empty), or None. Families (HF transformers configuration_*.py of Mixtral, Qwen2-MoE, DeepSeek-V2/V3,
    DBRX, Jamba, OLMoE, Granite-MoE, Llama 4): :data:`_MOE_KEYS`; any key naming experts (``n_shared_experts``,
    ``num_experts_per_tok``, ``expert_interval``, ``shared_expert_intermediate_size``); ``moe_*``
    (``moe_layer_freq``, ``moe_intermediate_size``); ``router_*`` (``router_aux_loss_coef``, DBRX
    ``router_jitter_noise``: a router exists only in an MoE); ``first_k_dense_replace``, ``decoder_sparse_step``,
    ``mlp_only_layers`` (which layers are dense in an MoE); ``ffn_config`` (DBRX's expert settings)."""
    for k in _MOE_KEYS:
        if raw.get(k):
            return k
    for k, v in raw.items():
        if not v or not isinstance(k, str):
            continue
        low = k.lower()
        if ("expert" in low or low.startswith(("moe_", "router_")) or
                low in ("first_k_dense_replace", "decoder_sparse_step", "mlp_only_layers", "ffn_config")):
            return k
    return None


#: RoPE scaling types HF transformers implements (``modeling_rope_utils.py`` ROPE_INIT_FUNCTIONS); ``type``
#: is the older key of ``rope_type``. They change the rotary frequencies, not the FLOPs or memory, but a
#: config naming another type (or a factor < 1) is a config autotune would misread, so it is refused.
ROPE_SCALING_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
#: head dims the attention kernels run: FlashAttention-2 supports head dims up to 256 that are multiples of
#: 8 (flash-attention README "Head dim up to 256"; ``flash_api.cpp`` checks ``head_size % 8 == 0`` and
#: ``head_size <= 256``); cuDNN's fused attention (Transformer Engine) has the same limits for training.
MAX_HEAD_DIM, HEAD_DIM_MULTIPLE = 256, 8


def _check_rope_scaling(rs: Any, where: str) -> None:
    """Refuse a ``rope_scaling`` that is not null or a mapping of a known type with a factor >= 1
    (HF ``_validate_linear_scaling_rope_parameters`` and siblings: ``factor`` must be a float >= 1).

    Raises:
        ConfigError: naming the field, the value and what is valid.
    """
    from autotune.files import display_text
    from autotune.spec.validate import require_number

    if rs is None:
        return
    if not isinstance(rs, dict):
        raise ConfigError(f"{where}: field rope_scaling must be a JSON object or null, got {type(rs).__name__}")
    kind = rs.get("rope_type", rs.get("type", "default"))
    if not isinstance(kind, str) or kind not in ROPE_SCALING_TYPES:
        raise ConfigError(f"{where}: field rope_scaling type {display_text(repr(kind), 40)} is unknown; valid: "
                          f"{', '.join(ROPE_SCALING_TYPES)}")
    if kind != "default" or "factor" in rs:
        if "factor" not in rs and kind != "longrope":
            raise ConfigError(f"{where}: field rope_scaling factor is missing for type {kind!r} (a number >= 1)")
        if "factor" in rs:
            require_number(rs["factor"], f"{where}: field rope_scaling factor", lo=1.0, hi=2.0**20)
_GATED_ACTS = {"silu", "swiglu", "swish"}


def _safe_label(s: str) -> str:
    """``s`` reduced to ``[A-Za-z0-9._-]`` (no escape sequences reach a terminal or a study name)."""
    import re
    out = re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-.")
    return out[:64] or "model"


def _hf_features(raw: Mapping[str, Any], mtype: str | None, head_dim: int, p: Path) -> tuple[str, ...]:
    """Architecture features of an HF config beyond the Llama baseline that no ModelSpec field holds
    (see :attr:`ModelSpec.features`), from transformers' modeling files:

    * Gemma / Gemma 2 scale the input embedding by sqrt(hidden_size) (GemmaModel ``normalizer``) and
      keep RMSNorm weights as 1 + w (GemmaRMSNorm);
    * Gemma 2: ``attn_logit_softcapping``, ``final_logit_softcapping`` (tanh soft-capping,
      Gemma2Attention / Gemma2ForCausalLM) and ``query_pre_attn_scalar`` when it is not head_dim (the
      attention scale is query_pre_attn_scalar^-0.5);
    * ``partial_rotary_factor`` < 1 (RoPE on a fraction of each head).

    Raises:
        ConfigError: a soft-capping or scalar value that is not a positive number (named).
    """
    from autotune.spec.validate import require_number

    out: list[str] = []
    if mtype in ("gemma", "gemma2"):
        out += ["embedding scaled by sqrt(hidden_size) (Gemma)", "RMSNorm weight 1 + w (Gemma)"]
    for key, what in (("attn_logit_softcapping", "attention logit soft-capping"),
                      ("final_logit_softcapping", "final logit soft-capping")):
        if raw.get(key) is not None:
            out.append(f"{what} {require_number(raw[key], f'model config {p}: field {key}', lo=0, lo_open=True):g}")
    q = raw.get("query_pre_attn_scalar")
    if q is not None and require_number(q, f"model config {p}: field query_pre_attn_scalar", lo=0, lo_open=True) \
            != head_dim:
        out.append(f"attention scale query_pre_attn_scalar^-0.5 with query_pre_attn_scalar {q:g} (not head_dim "
                   f"{head_dim})")
    prf = raw.get("partial_rotary_factor")
    if prf is not None and require_number(prf, f"model config {p}: field partial_rotary_factor", lo=0, hi=1,
                                          lo_open=True) < 1:
        out.append(f"partial rotary embedding (partial_rotary_factor {prf:g})")
    return tuple(out)


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Read a Hugging Face ``config.json`` of a dense decoder, per ``model_type``.

    Supported ``model_type``: llama (Llama 2, 3, 3.1, 3.2, 3.3), mistral, qwen2 (Qwen2, Qwen2.5), gemma,
    gemma2, phi3, with each architecture's defaults (:data:`ARCHITECTURES`); a config without
    ``model_type`` is read as Llama-like with ``hidden_act`` deciding the MLP (``silu``: gated, else plain
    two-projection). Fields: ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
    ``num_key_value_heads`` (default: the head count; 0 refused), ``intermediate_size``, ``vocab_size``,
    ``head_dim`` (default hidden/heads, which must divide), ``tie_word_embeddings``,
    ``max_position_embeddings``, ``rope_theta``, ``rms_norm_eps``, ``sliding_window``, ``hidden_act`` /
    ``hidden_activation`` (kept as ``mlp_activation``), ``rope_scaling`` (or transformers 5's
    ``rope_parameters``, which also holds ``rope_theta``) and the features of :func:`_hf_features`
    (soft-capping, Gemma's embedding scale, ...), which launch files must reproduce. Integer fields must
    be JSON integers (4096.0, true, "4096", NaN refused). The name is ``<_name_or_path, else the config.json's folder or the
    file's stem>@<fingerprint>`` (:meth:`ModelSpec.fingerprint`), so different architectures never share a study.

    Mixture-of-experts configs (``model_type`` mixtral, qwen3_moe, deepseek_v2, deepseek_v3, kimi_k2, gpt_oss,
    or without model_type one of :data:`MOE_HF_ARCHITECTURES`) are read by :func:`_moe_model_from_hf`.

    Raises:
        ConfigError: unreadable/non-JSON/binary file; a missing or mistyped field (named); a
            mixture-of-experts model of another family or an unsupported model_type (named, with the supported ones).
    """
    from autotune.files import read_json_file
    from autotune.spec.validate import require_bool, require_int, require_number

    p = Path(path)
    raw = read_json_file(p, what="model config")
    if not isinstance(raw, dict):
        raise ConfigError(f"model config {p}: expected a JSON object, got {type(raw).__name__}")
    mtype = raw.get("model_type")
    if mtype is not None and not isinstance(mtype, str):
        raise ConfigError(f"model config {p}: model_type must be a string, got {type(mtype).__name__}")
    archs = raw.get("architectures")
    arch0 = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    moe_type = mtype if mtype in MOE_READERS else (MOE_HF_ARCHITECTURES.get(arch0) if mtype is None else None)
    if moe_type is not None:
        return _moe_model_from_hf(raw, moe_type, p)
    moe = _moe_key(raw)
    if mtype in MOE_TYPES or moe:
        what = f"model_type {mtype!r}" if mtype in MOE_TYPES else f"field {_safe_label(moe)!r}"
        raise ConfigError(f"model config {p}: {what}: this mixture-of-experts model is not supported; supported "
                          f"mixture-of-experts model_types: {', '.join(MOE_READERS)}; dense: {', '.join(ARCHITECTURES)}")
    if mtype is not None and mtype not in ARCHITECTURES:
        raise ConfigError(f"model config {p}: model_type {_safe_label(mtype)!r} is not supported; supported: "
                          f"{', '.join(ARCHITECTURES)} (or leave model_type out for a Llama-like decoder)")
    arch = ARCHITECTURES.get(mtype or "", {})

    def field(name: str, *alts: str, default: Any = None, required: bool = True) -> Any:
        for n in (name, *alts):
            if n in raw and raw[n] is not None:
                return raw[n]
        if required and default is None:
            raise ConfigError(f"model config {p}: missing field {name!r} (expected a positive integer)")
        return default

    def integer(name: str, *alts: str, default: Any = None, lo: int = 1) -> int:
        return require_int(field(name, *alts, default=default), f"model config {p}: field {name}", lo=lo,
                           hi=HF_FIELD_BOUNDS.get(name, 2**30))

    hidden = integer("hidden_size", "n_embd", "d_model")
    heads = integer("num_attention_heads", "n_head")
    kv = integer("num_key_value_heads", default=heads)
    if "head_dim" in raw and raw["head_dim"] is not None:
        head_dim = integer("head_dim")
    else:
        if hidden % heads:
            raise ConfigError(f"model config {p}: field num_attention_heads={heads} does not divide "
                              f"hidden_size={hidden} and there is no head_dim; give head_dim or a dividing head count")
        head_dim = hidden // heads
    if head_dim > MAX_HEAD_DIM or head_dim % HEAD_DIM_MULTIPLE:
        raise ConfigError(f"model config {p}: field head_dim={head_dim}"
                          + ("" if "head_dim" in raw and raw["head_dim"] is not None else
                             f" (hidden_size {hidden} / num_attention_heads {heads})")
                          + f": the attention kernels run head dims that are multiples of {HEAD_DIM_MULTIPLE} up to "
                          f"{MAX_HEAD_DIM} (FlashAttention-2, cuDNN)")
    _check_rope_scaling(raw.get("rope_scaling"), f"model config {p}")
    if heads % kv:
        raise ConfigError(f"model config {p}: field num_key_value_heads={kv} does not divide "
                          f"num_attention_heads={heads} (grouped-query attention needs n_q % n_kv == 0)")
    ffn = integer("intermediate_size", "n_inner", default=4 * hidden)
    act = field("hidden_activation", "hidden_act", "activation_function", default="silu")
    if not isinstance(act, str):
        raise ConfigError(f"model config {p}: field hidden_act must be a string, got {type(act).__name__}")
    gated = raw.get("gated_mlp")
    if gated is not None:
        gated = require_bool(gated, f"model config {p}: field gated_mlp")
    elif arch:
        gated = arch["gated"]
    else:
        gated = act.lower() in _GATED_ACTS or raw.get("mlp_type") == "swiglu"
    tied = raw.get("tie_word_embeddings")
    tied = arch.get("tied", False) if tied is None else require_bool(tied, f"model config {p}: field tie_word_embeddings")
    qkv_bias = arch.get("qkv_bias", False)
    for key in ("attention_bias", "mlp_bias"):
        if raw.get(key) is not None and require_bool(raw[key], f"model config {p}: field {key}") and not qkv_bias:
            raise ConfigError(f"model config {p}: field {key}: true is not modelled (only Qwen2's q/k/v biases are)")
    window = None
    sw = raw.get("sliding_window")
    uses_window = arch.get("window") == "always" or (arch.get("window") == "use_sliding_window"
                                                     and raw.get("use_sliding_window") is True)
    if sw is not None and uses_window:
        window = require_int(sw, f"model config {p}: field sliding_window", hi=2**30)
    max_pos = integer("max_position_embeddings", "n_positions", default=4096)
    # transformers >= 5 writes rope_theta and the scaling inside rope_parameters
    rope_params = raw.get("rope_parameters")
    if rope_params is not None and not isinstance(rope_params, dict):
        raise ConfigError(f"model config {p}: field rope_parameters must be a mapping, got {type(rope_params).__name__}")
    rope_params = rope_params or {}
    theta = rope_params.get("rope_theta") if rope_params.get("rope_theta") is not None else field("rope_theta",
                                                                                                   default=10000.0)
    rope = require_number(theta, f"model config {p}: field rope_theta", lo=0, lo_open=True)
    scaling_raw = raw.get("rope_scaling") if raw.get("rope_scaling") is not None else (rope_params or None)
    scaling = None if scaling_raw is None else RopeScaling.from_mapping(
        scaling_raw, source=f"model config {p}: field {'rope_scaling' if raw.get('rope_scaling') else 'rope_parameters'}")
    features = _hf_features(raw, mtype, head_dim, p)
    eps = require_number(field("rms_norm_eps", "layer_norm_eps", default=1e-5), f"model config {p}: field rms_norm_eps",
                         lo=0, hi=1)
    # the model's own name: _name_or_path (transformers writes the hub id or folder), else the folder of a
    # config.json (a downloaded model's folder is its name), else the file's stem; model_type ("llama") last
    folder = p.resolve().parent.name if p.name == "config.json" else p.stem
    base = raw.get("_name_or_path") if isinstance(raw.get("_name_or_path"), str) and raw.get("_name_or_path") else \
        (folder or mtype or "model")
    try:
        spec = ModelSpec(
            name="model", hidden_size=hidden, num_layers=integer("num_hidden_layers", "n_layer"),
            num_heads=heads, num_kv_heads=kv, ffn_hidden_size=ffn, vocab_size=integer("vocab_size"), head_dim=head_dim,
            tied_embeddings=tied, gated_mlp=bool(gated), rope_theta=rope, norm_eps=eps, max_seq_len=max_pos,
            qkv_bias=qkv_bias, norms_per_layer=arch.get("norms", 2), sliding_window=window,
            mlp_activation=_safe_label(act.lower()), rope_scaling=scaling, features=features)
    except ConfigError as e:       # named by the file (the spec's own name is a placeholder until here)
        msg = str(e).replace("model 'model': ", "")
        raise ConfigError(msg if msg.startswith(f"model config {p}") else f"model config {p}: {msg}") from None
    return replace(spec, name=f"{_safe_label(Path(str(base)).name)}@{spec.fingerprint()}")


#: mixture-of-experts model_types read from HF config.json -> the family's reader defaults (transformers
#: ``models/<type>/configuration_<type>.py``; Kimi K2's own ``configuration_deepseek.py`` is DeepSeek-V3's)
MOE_READERS: dict[str, dict[str, Any]] = {
    "mixtral": dict(family="mixtral"),
    "qwen3_moe": dict(family="qwen3_moe"),
    "deepseek_v2": dict(family="deepseek", first_k_dense=0, scoring="softmax"),
    "deepseek_v3": dict(family="deepseek", first_k_dense=3, scoring="sigmoid"),
    "kimi_k2": dict(family="deepseek", first_k_dense=1, scoring="sigmoid"),
    "gpt_oss": dict(family="gpt_oss"),
}
#: HF ``architectures`` -> model_type, for a config without ``model_type``
MOE_HF_ARCHITECTURES = {"MixtralForCausalLM": "mixtral", "Qwen3MoeForCausalLM": "qwen3_moe",
                        "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3",
                        "GptOssForCausalLM": "gpt_oss"}


def _moe_model_from_hf(raw: Mapping[str, Any], mtype: str, p: Path) -> ModelSpec:
    """A mixture-of-experts HF ``config.json`` (:data:`MOE_READERS`) as a :class:`ModelSpec`.

    Fields per family (HF transformers configuration and modeling files):

    * all: ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
      ``vocab_size``, ``head_dim`` (default hidden / heads), ``tie_word_embeddings``, ``max_position_embeddings``,
      ``rope_theta``, ``rope_scaling``, ``rms_norm_eps``, ``num_experts_per_tok`` (top-k);
    * mixtral (``MixtralForCausalLM``): ``num_local_experts``, ``intermediate_size`` (each expert),
      ``sliding_window`` (every layer when set);
    * qwen3_moe (``Qwen3MoeForCausalLM``): ``num_experts``, ``moe_intermediate_size``, per-head q/k RMSNorms,
      ``attention_bias`` (q, k, v and o); ``decoder_sparse_step`` other than 1, ``mlp_only_layers`` and
      ``use_sliding_window`` are refused (not modelled);
    * deepseek_v2 / deepseek_v3 / kimi_k2 (``DeepseekV3ForCausalLM``): ``n_routed_experts``, ``n_shared_experts``,
      ``moe_intermediate_size``, ``intermediate_size`` (the dense layers), ``first_k_dense_replace``,
      ``moe_layer_freq``, ``q_lora_rank`` (null = 0), ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``,
      ``v_head_dim``, ``n_group`` / ``topk_group`` (1 = no group limit), ``scoring_func``, ``topk_method``
      (``noaux_tc``: the e_score_correction_bias), ``routed_scaling_factor``, ``num_nextn_predict_layers`` (MTP);
    * gpt_oss (``GptOssForCausalLM``): ``num_local_experts``, ``intermediate_size`` (each expert, with biases),
      ``experts_per_token``, ``attention_bias`` (default true), sinks and router bias (always),
      ``sliding_window`` with ``layer_types`` (alternating sliding / full from layer 0), ``swiglu_limit``.

    Raises:
        ConfigError: a missing or mistyped field (named), or a layout that is not modelled (named).
    """
    from autotune.spec.validate import require_bool, require_int, require_number

    where = f"model config {p}"
    fam = MOE_READERS[mtype]

    def get(name: str, *alts: str, default: Any = None) -> Any:
        for n in (name, *alts):
            if raw.get(n) is not None:
                return raw[n]
        return default

    def integer(name: str, *alts: str, default: Any = None, lo: int = 1) -> int:
        v = get(name, *alts, default=default)
        if v is None:
            raise ConfigError(f"{where}: missing field {name!r} (expected a positive integer)")
        return require_int(v, f"{where}: field {name}", lo=lo, hi=HF_FIELD_BOUNDS.get(name, 2**30))

    def flag(name: str, default: bool) -> bool:
        v = raw.get(name)
        return default if v is None else require_bool(v, f"{where}: field {name}")

    hidden = integer("hidden_size")
    layers = integer("num_hidden_layers")
    heads = integer("num_attention_heads")
    kv = integer("num_key_value_heads", default=heads)
    top_k = integer("num_experts_per_tok", "experts_per_token")
    _check_rope_scaling(raw.get("rope_scaling"), where)
    scaling = None if raw.get("rope_scaling") is None else RopeScaling.from_mapping(
        raw["rope_scaling"], source=f"{where}: field rope_scaling")
    common: dict[str, Any] = dict(
        name="model", hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv,
        vocab_size=integer("vocab_size"), tied_embeddings=flag("tie_word_embeddings", False),
        rope_theta=require_number(get("rope_theta", default=10000.0), f"{where}: field rope_theta", lo=0, lo_open=True),
        norm_eps=require_number(get("rms_norm_eps", default=1e-6), f"{where}: field rms_norm_eps", lo=0, hi=1),
        max_seq_len=integer("max_position_embeddings", default=4096), rope_scaling=scaling, moe_top_k=top_k)
    if fam["family"] != "deepseek":
        if raw.get("head_dim") is not None:
            common["head_dim"] = integer("head_dim")
        elif hidden % heads:
            raise ConfigError(f"{where}: field num_attention_heads={heads} does not divide hidden_size={hidden} and "
                              "there is no head_dim")
        else:
            common["head_dim"] = hidden // heads
    features: list[str] = []
    if fam["family"] == "mixtral":
        ffn = integer("intermediate_size")
        spec = dict(common, num_experts=integer("num_local_experts"), ffn_hidden_size=ffn, moe_ffn_hidden_size=ffn)
        if raw.get("sliding_window") is not None:
            spec["sliding_window"] = require_int(raw["sliding_window"], f"{where}: field sliding_window", hi=2**30)
    elif fam["family"] == "qwen3_moe":
        step = integer("decoder_sparse_step", default=1)
        only = raw.get("mlp_only_layers") or []
        if step != 1 or only:
            raise ConfigError(f"{where}: decoder_sparse_step={step} / mlp_only_layers={str(only)[:40]}: dense layers "
                              "between MoE layers are not modelled for qwen3_moe (use decoder_sparse_step 1, no "
                              "mlp_only_layers)")
        if flag("use_sliding_window", False):
            raise ConfigError(f"{where}: field use_sliding_window: true is not modelled for qwen3_moe")
        bias = flag("attention_bias", False)
        spec = dict(common, num_experts=integer("num_experts"), ffn_hidden_size=integer("intermediate_size",
                    default=integer("moe_intermediate_size")), moe_ffn_hidden_size=integer("moe_intermediate_size"),
                    qk_norm=True, qkv_bias=bias, attention_output_bias=bias)
    elif fam["family"] == "deepseek":
        if flag("attention_bias", False):
            raise ConfigError(f"{where}: field attention_bias: true is not modelled for multi-latent attention")
        moe_ffn = integer("moe_intermediate_size")
        shared = integer("n_shared_experts", default=0, lo=0)
        nope, rope = integer("qk_nope_head_dim"), integer("qk_rope_head_dim")
        if kv != heads:
            raise ConfigError(f"{where}: field num_key_value_heads={kv}: multi-latent attention has one key/value "
                              f"head per query head (num_attention_heads={heads})")
        n_group = integer("n_group", default=1)
        topk_group = integer("topk_group", default=n_group)
        method = get("topk_method", default="noaux_tc" if mtype != "deepseek_v2" else "greedy")
        scoring = get("scoring_func", default=fam["scoring"])
        if not isinstance(scoring, str) or scoring not in ROUTER_SCORE_FUNCTIONS:
            raise ConfigError(f"{where}: field scoring_func {str(scoring)[:40]!r}: known "
                              f"{', '.join(ROUTER_SCORE_FUNCTIONS)}")
        spec = dict(common, head_dim=nope + rope, num_experts=integer("n_routed_experts"),
                    ffn_hidden_size=integer("intermediate_size"), moe_ffn_hidden_size=moe_ffn,
                    num_shared_experts=shared, shared_expert_ffn_hidden_size=moe_ffn if shared else 0,
                    num_first_dense_layers=integer("first_k_dense_replace", default=fam["first_k_dense"], lo=0),
                    moe_layer_freq=integer("moe_layer_freq", default=1),
                    router_expert_bias=method == "noaux_tc", router_score_function=scoring,
                    router_num_groups=n_group if n_group > 1 else 0, router_group_top_k=topk_group if n_group > 1 else 0,
                    router_scaling_factor=require_number(get("routed_scaling_factor", default=1.0),
                                                         f"{where}: field routed_scaling_factor", lo=0, lo_open=True),
                    q_lora_rank=integer("q_lora_rank", default=0, lo=0), kv_lora_rank=integer("kv_lora_rank"),
                    qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=integer("v_head_dim"),
                    mtp_num_layers=integer("num_nextn_predict_layers", default=0, lo=0))
    else:   # gpt_oss
        ffn = integer("intermediate_size")
        bias = flag("attention_bias", True)
        window = integer("sliding_window", default=128)
        types = raw.get("layer_types")
        if types is None:
            types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
        if not isinstance(types, list) or len(types) != layers or any(t not in ("sliding_attention", "full_attention")
                                                                      for t in types):
            raise ConfigError(f"{where}: field layer_types must list sliding_attention / full_attention for each of "
                              f"the {layers} layers")
        sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
        if sliding == list(range(0, layers, 2)):
            period = 2
        elif sliding == list(range(layers)):
            period = 1
        elif not sliding:
            period, window = 1, None
        else:
            raise ConfigError(f"{where}: field layer_types: only sliding windows on every layer or on the even layers "
                              "(GPT-OSS) are modelled")
        limit = raw.get("swiglu_limit")
        if limit is not None:
            features.append(f"SwiGLU clamped at swiglu_limit "
                            f"{require_number(limit, f'{where}: field swiglu_limit', lo=0, lo_open=True):g} (GPT-OSS)")
        spec = dict(common, num_experts=integer("num_local_experts"), ffn_hidden_size=ffn, moe_ffn_hidden_size=ffn,
                    qkv_bias=bias, attention_output_bias=bias, attention_sinks=True, router_bias=True,
                    moe_expert_bias=True, sliding_window=window, sliding_window_period=period)
    if fam["family"] != "deepseek":
        hd = spec["head_dim"]
        if hd > MAX_HEAD_DIM or hd % HEAD_DIM_MULTIPLE:
            raise ConfigError(f"{where}: field head_dim={hd}: the attention kernels run head dims that are multiples "
                              f"of {HEAD_DIM_MULTIPLE} up to {MAX_HEAD_DIM} (FlashAttention-2, cuDNN)")
        if heads % kv:
            raise ConfigError(f"{where}: field num_key_value_heads={kv} does not divide num_attention_heads={heads}")
    act = raw.get("hidden_act", "silu")
    if not isinstance(act, str):
        raise ConfigError(f"{where}: field hidden_act must be a string, got {type(act).__name__}")
    try:
        m = ModelSpec(**spec, mlp_activation=_safe_label(act.lower()), features=tuple(features))
    except ConfigError as e:
        raise ConfigError(f"{where}: " + str(e).replace("model 'model': ", "", 1)) from None   # a placeholder name
    # the model's own name: _name_or_path (transformers writes the hub id or folder), else the folder of a
    # config.json (a downloaded model's folder is its name), else the file's stem; model_type ("llama") last
    folder = p.resolve().parent.name if p.name == "config.json" else p.stem
    base = raw.get("_name_or_path") if isinstance(raw.get("_name_or_path"), str) and raw.get("_name_or_path") else \
        (folder or mtype or "model")
    return replace(m, name=f"{_safe_label(Path(str(base)).name)}@{m.fingerprint()}")
