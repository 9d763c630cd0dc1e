"""Model catalog: decoder-only transformers, dense (Llama 3.1 8B/70B/405B) or mixtures of experts (DeepSeek-V3,
Kimi K2, Qwen3-MoE, GPT-OSS, Mixtral: :data:`MOE_CATALOG`), or any HF ``config.json``
(:mod:`autotune.spec.hf_config`).

A :class:`ModelSpec` holds the architecture numbers the planner needs. Parameter counts follow the
architecture exactly (no rounding); for Llama 3.1 they equal the published counts:

    parameters = 2 V h                                  (input embedding + untied LM head)
               + L (h (n_q d + 2 n_kv d) + n_q d h      (Q, K, V and output projections)
                    + b (n_q d + 2 n_kv d)              (Q/K/V biases, b = 1 for Qwen2/2.5, else 0)
                    + 3 h f                             (gated MLP gate, up, down; 2 h f for a plain MLP)
                    + r h)                              (r RMSNorm weights: 2; 4 in Gemma 2)
               + h                                      (final RMSNorm)

with V vocabulary, h hidden size, L layers, n_q query heads, n_kv KV heads, d head dim, f FFN size
(Llama 3 paper, Table 3; Hugging Face ``LlamaForCausalLM``). With tied embeddings the 2 V h term is V h.

A mixture of experts replaces the MLP of its MoE layers by E routed experts (3 h f_e each, gated), S shared
experts and a router (E h, + biases), attention may be multi-latent (DeepSeek-V2/V3) and multi-token prediction
adds D modules; :attr:`ModelSpec.num_params` counts them all exactly (unique parameters) and
:attr:`ModelSpec.num_active_params` what one token uses (top-k of the E). The per-component formulas are on the
properties (:attr:`ModelSpec.attention_params_per_layer`, :attr:`ModelSpec.expert_params`, ...).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping

from autotune.errors import ConfigError

#: HF ``rope_scaling`` / ``rope_parameters`` types (transformers ``modeling_rope_utils.ROPE_INIT_FUNCTIONS``)
ROPE_SCALING_TYPES = ("linear", "dynamic", "yarn", "longrope", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling of a model (HF ``config.json`` ``rope_scaling``; transformers
    ``modeling_rope_utils``). The cost model ignores it (it changes no FLOPs or bytes); launch files must
    reproduce it (:mod:`autotune.export`).

    Attributes:
        type: ``rope_type`` (or the older ``type``): one of :data:`ROPE_SCALING_TYPES`.
        factor: the scaling factor (dimensionless; Llama 3.1: 8, Llama 3.2: 32).
        low_freq_factor, high_freq_factor, original_max_position_embeddings: the llama3 type's parameters
            (Llama 3.1 / 3.2: 1, 4, 8192 tokens); None where the config has none.

    Raises:
        ConfigError: an unknown type, or a factor / parameter that is not a positive finite number.
    """

    type: str
    factor: float = 1.0
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        from autotune.spec.validate import require_int, require_number
        if self.type not in ROPE_SCALING_TYPES:
            raise ConfigError(f"rope_scaling type {str(self.type)[:40]!r} is not known; known: "
                              f"{', '.join(ROPE_SCALING_TYPES)}")
        object.__setattr__(self, "factor", require_number(self.factor, "rope_scaling factor", lo=0, lo_open=True))
        for f in ("low_freq_factor", "high_freq_factor"):
            if getattr(self, f) is not None:
                object.__setattr__(self, f, require_number(getattr(self, f), f"rope_scaling {f}", lo=0,
                                                           lo_open=True))
        if self.original_max_position_embeddings is not None:
            require_int(self.original_max_position_embeddings, "rope_scaling original_max_position_embeddings",
                        hi=2**30)

    def describe(self) -> str:
        """``llama3 (factor 8, low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192)``."""
        parts = [f"{k} {v:g}" for k, v in asdict(self).items() if k != "type" and v is not None]
        return f"{self.type} ({', '.join(parts)})"

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any], *, source: str) -> "RopeScaling | None":
        """From an HF ``rope_scaling`` / ``rope_parameters`` mapping or a plan file's ``rope_scaling``;
        None for ``rope_type: default`` (no scaling).

        Raises:
            ConfigError: not a mapping, or an unknown / malformed type or value (naming ``source``).
        """
        if not isinstance(d, Mapping):
            raise ConfigError(f"{source}: expected a mapping, got {type(d).__name__}")
        t = d.get("rope_type", d.get("type"))
        if t == "default":
            return None
        if not isinstance(t, str):
            raise ConfigError(f"{source}: rope_type must be a string ({', '.join(ROPE_SCALING_TYPES)}), got {t!r}")
        try:
            return cls(type=t, factor=d.get("factor", 1.0), low_freq_factor=d.get("low_freq_factor"),
                       high_freq_factor=d.get("high_freq_factor"),
                       original_max_position_embeddings=d.get("original_max_position_embeddings"))
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None


#: ModelSpec fields added after plan files and study names existed: left out of :meth:`ModelSpec.to_dict`
#: and :meth:`ModelSpec.fingerprint` at their defaults, so earlier files and study names are unchanged.
_LATER_FIELDS = {"mlp_activation": "silu", "rope_scaling": None, "features": (),
                 # mixture of experts, multi-latent attention, multi-token prediction, GPT-OSS attention
                 # (issue 38): a dense model leaves them at these defaults, so its file and study name stay
                 "num_experts": 0, "moe_top_k": 0, "moe_ffn_hidden_size": 0, "num_shared_experts": 0,
                 "shared_expert_ffn_hidden_size": 0, "num_first_dense_layers": 0, "moe_layer_freq": 1,
                 "moe_expert_bias": False, "router_bias": False, "router_expert_bias": False,
                 "router_score_function": "softmax", "router_num_groups": 0, "router_group_top_k": 0,
                 "router_scaling_factor": 1.0, "q_lora_rank": 0, "kv_lora_rank": 0, "qk_nope_head_dim": 0,
                 "qk_rope_head_dim": 0, "v_head_dim": 0, "mtp_num_layers": 0, "qk_norm": False,
                 "attention_output_bias": False, "attention_sinks": False, "sliding_window_period": 1}
#: router score functions (Megatron-LM ``--moe-router-score-function``; HF DeepSeek-V3 ``scoring_func``)
ROUTER_SCORE_FUNCTIONS = ("softmax", "sigmoid")


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of a decoder-only transformer: dense, or a mixture of experts (MoE) with optional
    multi-latent attention (MLA) and multi-token prediction (MTP).

    Attributes:
        name: catalog name (``llama3.1-8b``) or a user label.
        hidden_size: h, model width.
        num_layers: L, transformer blocks.
        num_heads: query heads n_q.
        num_kv_heads: key/value heads n_kv (GQA when < n_q).
        ffn_hidden_size: f, the MLP's inner width.
        vocab_size: V.
        head_dim: d, per-head width (128 for Llama 3.1).
        tied_embeddings: whether the LM head shares the input embedding matrix.
        gated_mlp: SwiGLU (3 projections) when True, plain GeLU MLP (2 projections) when False.
        rope_theta, norm_eps, max_seq_len: carried for the real runtime; not used by the planner.
        qkv_bias: Q, K and V projections carry biases (Qwen2/2.5: HF ``Qwen2Attention``, bias=True).
        norms_per_layer: RMSNorm weight vectors per block (2; 4 in Gemma 2: pre/post attention and
            pre/post feed-forward, HF ``Gemma2DecoderLayer``).
        sliding_window: attention window in tokens where the architecture uses one (Mistral v0.1,
            Gemma 2, Phi-3), else None; the cost model computes full causal attention, so a sequence
            longer than the window is refused (:meth:`check_sequence`).
        mlp_activation: the MLP's activation as HF names it (``silu``: SwiGLU when gated; ``gelu``,
            ``gelu_pytorch_tanh``: GeGLU when gated, Gemma). Not costed differently; launch files use it.
        rope_scaling: RoPE frequency scaling (:class:`RopeScaling`), None for plain RoPE.
        features: other architecture features the cost model does not change for but a launch must
            reproduce, as readable names (``embedding scaled by sqrt(hidden_size)``, ``attention logit
            soft-capping 50``); an export for an engine that cannot express one is refused naming it.

    Mixture of experts (all 0 / False for a dense model; HF ``MixtralConfig``, ``Qwen3MoeConfig``,
    ``DeepseekV3Config``, ``GptOssConfig``; Megatron-LM ``--num-experts`` ... flags in brackets):
        num_experts: routed experts per MoE layer E (``--num-experts``); 0 = dense.
        moe_top_k: experts each token is routed to k (``--moe-router-topk``).
        moe_ffn_hidden_size: one routed expert's inner width f_e (``--moe-ffn-hidden-size``); the expert is
            a gated MLP when ``gated_mlp`` (3 h f_e weights), else 2 h f_e.
        num_shared_experts, shared_expert_ffn_hidden_size: experts every token passes through, and the
            inner width of each (DeepSeek: 1 x 2048); Megatron's ``--moe-shared-expert-intermediate-size``
            is their product.
        num_first_dense_layers: the first k layers keep a dense MLP of ``ffn_hidden_size`` (HF
            ``first_k_dense_replace``; DeepSeek-V3 3, Kimi K2 1).
        moe_layer_freq: after those, layer i (0-based) is MoE when i % moe_layer_freq == 0 (HF DeepSeek
            ``moe_layer_freq``; 1 = every layer).
        moe_expert_bias: expert projections carry biases (GPT-OSS ``gate_up_proj_bias``, ``down_proj_bias``).
        router_bias: the router linear carries a bias (GPT-OSS ``mlp.router.bias``).
        router_expert_bias: a per-expert score-correction bias for aux-loss-free balancing (DeepSeek-V3
            ``gate.e_score_correction_bias``, stored in the checkpoint; ``--moe-router-enable-expert-bias``).
        router_score_function: ``softmax`` or ``sigmoid`` (``scoring_func``).
        router_num_groups, router_group_top_k: device-limited routing (``n_group``, ``topk_group``; 0 = none).
        router_scaling_factor: the routed-output scale (``routed_scaling_factor``; 1 = none).
    Multi-latent attention (DeepSeek-V2 paper, arXiv 2405.04434, Sec. 2.1; 0 = standard attention):
        q_lora_rank: r_q, the query down-projection rank (0 = queries projected directly, DeepSeek-V2-Lite).
        kv_lora_rank: r_kv, the joint key/value latent width; > 0 makes the attention MLA.
        qk_nope_head_dim, qk_rope_head_dim, v_head_dim: per-head query/key widths without and with RoPE,
            and the value width (``head_dim`` is then qk_nope + qk_rope). MLA carries RMSNorms over the
            query latent (r_q, when r_q > 0) and the kv latent (r_kv): ``q_a_layernorm``, ``kv_a_layernorm``.
    Other:
        mtp_num_layers: multi-token prediction depth D (DeepSeek-V3 paper, arXiv 2412.19437, Sec. 2.2; HF
            ``num_nextn_predict_layers``; ``--mtp-num-layers``): each depth adds two RMSNorms (h each), a
            projection 2h -> h, one decoder layer (MoE when the last main layer is) and an output norm; the
            embedding and LM head are shared with the main model.
        qk_norm: RMSNorm over each query and key head (Qwen3 ``q_norm``, ``k_norm``: 2 d weights per layer).
        attention_output_bias: the output projection carries a bias (GPT-OSS ``attention_bias``).
        attention_sinks: one learned sink logit per query head per layer (GPT-OSS ``self_attn.sinks``).
        sliding_window_period: with ``sliding_window``, layer i uses the window when
            i % sliding_window_period == 0 (1: every layer; GPT-OSS 2: even layers, full attention on odd).

    Raises:
        ConfigError: on a non-positive size or heads that do not divide (n_q % n_kv != 0), or an MoE / MLA
            field out of range (top-k above the expert count, dense-first layers beyond the depth, ...).
    """

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    head_dim: int = 128
    tied_embeddings: bool = False
    gated_mlp: bool = True
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    max_seq_len: int = 131072
    qkv_bias: bool = False
    norms_per_layer: int = 2
    sliding_window: int | None = None
    mlp_activation: str = "silu"
    rope_scaling: RopeScaling | None = None
    features: tuple[str, ...] = ()
    num_experts: int = 0
    moe_top_k: int = 0
    moe_ffn_hidden_size: int = 0
    num_shared_experts: int = 0
    shared_expert_ffn_hidden_size: int = 0
    num_first_dense_layers: int = 0
    moe_layer_freq: int = 1
    moe_expert_bias: bool = False
    router_bias: bool = False
    router_expert_bias: bool = False
    router_score_function: str = "softmax"
    router_num_groups: int = 0
    router_group_top_k: int = 0
    router_scaling_factor: float = 1.0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    mtp_num_layers: int = 0
    qk_norm: bool = False
    attention_output_bias: bool = False
    attention_sinks: bool = False
    sliding_window_period: int = 1

    def __post_init__(self) -> None:
        from autotune.spec.validate import (
            MAX_FFN_HIDDEN_SIZE,
            MAX_HIDDEN_SIZE,
            MAX_NUM_HEADS,
            MAX_NUM_LAYERS,
            check_model_size,
            require_bool,
            require_int,
            require_name,
            require_number,
        )

        require_name(self.name, "model name")
        for f in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "ffn_hidden_size",
                  "vocab_size", "head_dim"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"model {self.name!r}: {f} must be a positive integer, got {v!r}")
            # bounds (autotune/spec/validate.py): 16x or more the largest published dense model's (405B: h 16384,
            # L 126, ffn 53248, 128 heads, V 128256)
            hi = {"vocab_size": 2**24, "num_layers": MAX_NUM_LAYERS, "hidden_size": MAX_HIDDEN_SIZE,
                  "ffn_hidden_size": MAX_FFN_HIDDEN_SIZE, "num_heads": MAX_NUM_HEADS,
                  "num_kv_heads": MAX_NUM_HEADS}.get(f, 2**20)
            require_int(v, f"model {self.name!r}: {f}", hi=hi)
        require_int(self.max_seq_len, f"model {self.name!r}: max_seq_len", hi=2**30)
        require_int(self.norms_per_layer, f"model {self.name!r}: norms_per_layer", lo=0, hi=8)
        if self.sliding_window is not None:
            require_int(self.sliding_window, f"model {self.name!r}: sliding_window")
        for f in ("tied_embeddings", "gated_mlp", "qkv_bias"):
            require_bool(getattr(self, f), f"model {self.name!r}: {f}")
        require_number(self.rope_theta, f"model {self.name!r}: rope_theta", lo=0, lo_open=True)
        require_number(self.norm_eps, f"model {self.name!r}: norm_eps", lo=0, hi=1)
        require_name(self.mlp_activation, f"model {self.name!r}: mlp_activation")
        if isinstance(self.rope_scaling, Mapping):
            object.__setattr__(self, "rope_scaling", RopeScaling.from_mapping(
                self.rope_scaling, source=f"model {self.name!r}: rope_scaling"))
        elif self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ConfigError(f"model {self.name!r}: rope_scaling must be a mapping (rope_type, factor, ...) or "
                              f"null, got {type(self.rope_scaling).__name__}")
        if isinstance(self.features, list):
            object.__setattr__(self, "features", tuple(self.features))
        if not isinstance(self.features, tuple) or not all(isinstance(f, str) and f for f in self.features):
            raise ConfigError(f"model {self.name!r}: features must be a list of names, got {self.features!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model {self.name!r}: num_heads={self.num_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads} (grouped-query attention needs n_q % n_kv == 0)")
        self._check_moe_fields()
        check_model_size(self)      # the fields' product: total parameters (validate.MAX_MODEL_PARAMS)

    def _check_moe_fields(self) -> None:
        """Bounds of the MoE / MLA / MTP / GPT-OSS fields (:meth:`__post_init__`).

        Raises:
            ConfigError: naming the field, its value and the valid range.
        """
        from autotune.spec.validate import require_bool, require_int, require_number

        where = f"model {self.name!r}"
        for f in ("num_experts", "moe_top_k", "moe_ffn_hidden_size", "num_shared_experts",
                  "shared_expert_ffn_hidden_size", "num_first_dense_layers", "router_num_groups",
                  "router_group_top_k", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                  "v_head_dim", "mtp_num_layers"):
            require_int(getattr(self, f), f"{where}: {f}", lo=0, hi=2**20)
        for f in ("moe_layer_freq", "sliding_window_period"):
            require_int(getattr(self, f), f"{where}: {f}", lo=1, hi=2**20)
        for f in ("moe_expert_bias", "router_bias", "router_expert_bias", "qk_norm", "attention_output_bias",
                  "attention_sinks"):
            require_bool(getattr(self, f), f"{where}: {f}")
        require_number(self.router_scaling_factor, f"{where}: router_scaling_factor", lo=0, lo_open=True, hi=1e6)
        if self.router_score_function not in ROUTER_SCORE_FUNCTIONS:
            raise ConfigError(f"{where}: router_score_function {str(self.router_score_function)[:40]!r} is not "
                              f"known; known: {', '.join(ROUTER_SCORE_FUNCTIONS)}")
        if self.num_experts:
            if not 1 <= self.moe_top_k <= self.num_experts:
                raise ConfigError(f"{where}: moe_top_k={self.moe_top_k} must be between 1 and num_experts="
                                  f"{self.num_experts} (each token goes to top-k of the routed experts)")
            if self.moe_ffn_hidden_size < 1:
                raise ConfigError(f"{where}: moe_ffn_hidden_size must be a positive integer for an MoE model, "
                                  f"got {self.moe_ffn_hidden_size}")
            if self.num_first_dense_layers > self.num_layers:
                raise ConfigError(f"{where}: num_first_dense_layers={self.num_first_dense_layers} exceeds "
                                  f"num_layers={self.num_layers}")
            if self.router_num_groups:
                if self.num_experts % self.router_num_groups or not 1 <= self.router_group_top_k <= \
                        self.router_num_groups:
                    raise ConfigError(f"{where}: router_num_groups={self.router_num_groups} must divide "
                                      f"num_experts={self.num_experts} and router_group_top_k="
                                      f"{self.router_group_top_k} lie in 1..{self.router_num_groups}")
            elif self.router_group_top_k:
                raise ConfigError(f"{where}: router_group_top_k={self.router_group_top_k} needs router_num_groups")
        else:
            moe_set = [f for f in ("moe_top_k", "moe_ffn_hidden_size", "num_shared_experts",
                                   "shared_expert_ffn_hidden_size", "num_first_dense_layers", "router_num_groups",
                                   "router_group_top_k", "moe_expert_bias", "router_bias", "router_expert_bias")
                       if getattr(self, f)]
            if moe_set:
                raise ConfigError(f"{where}: {', '.join(moe_set)} set on a model without experts (num_experts=0)")
        if bool(self.num_shared_experts) != bool(self.shared_expert_ffn_hidden_size):
            raise ConfigError(f"{where}: num_shared_experts={self.num_shared_experts} and "
                              f"shared_expert_ffn_hidden_size={self.shared_expert_ffn_hidden_size} must both be set "
                              "or both be 0")
        if self.kv_lora_rank:
            if not (self.qk_nope_head_dim and self.qk_rope_head_dim and self.v_head_dim):
                raise ConfigError(f"{where}: multi-latent attention (kv_lora_rank={self.kv_lora_rank}) needs "
                                  "qk_nope_head_dim, qk_rope_head_dim and v_head_dim")
            if self.head_dim != self.qk_nope_head_dim + self.qk_rope_head_dim or self.num_kv_heads != self.num_heads:
                raise ConfigError(f"{where}: with multi-latent attention head_dim must be qk_nope_head_dim + "
                                  f"qk_rope_head_dim = {self.qk_nope_head_dim + self.qk_rope_head_dim} (got "
                                  f"{self.head_dim}) and num_kv_heads = num_heads = {self.num_heads} (got "
                                  f"{self.num_kv_heads})")
            if self.qkv_bias or self.qk_norm or self.attention_sinks or self.attention_output_bias:
                raise ConfigError(f"{where}: qkv_bias, qk_norm, attention_sinks and attention_output_bias are not "
                                  "modelled with multi-latent attention")
        elif self.q_lora_rank or self.qk_nope_head_dim or self.qk_rope_head_dim or self.v_head_dim:
            raise ConfigError(f"{where}: q_lora_rank / qk_nope_head_dim / qk_rope_head_dim / v_head_dim need "
                              "multi-latent attention (kv_lora_rank > 0)")

    # ---- parameter counts (elements) ----
    @property
    def q_dim(self) -> int:
        """n_q x d: width of the query projection output."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """n_kv x d: width of each of the K and V projection outputs."""
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts model (``num_experts`` > 0)."""
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        """True for multi-latent attention (``kv_lora_rank`` > 0)."""
        return self.kv_lora_rank > 0

    @property
    def attention_params_per_layer(self) -> int:
        """Attention weights of one layer (elements).

        Standard (GQA) attention: h (n_q d + 2 n_kv d) + n_q d h (Q, K, V and output projections), + n_q d +
        2 n_kv d Q/K/V biases when ``qkv_bias`` (Qwen2, GPT-OSS), + h output bias when
        ``attention_output_bias`` (GPT-OSS), + n_q sinks (GPT-OSS), + 2 d for Qwen3's per-head q/k RMSNorms.

        Multi-latent attention (HF ``DeepseekV3Attention``; n heads, r_q, r_kv, d_n = qk_nope, d_r = qk_rope,
        d_v): q_a h r_q + q_a_layernorm r_q + q_b r_q n (d_n + d_r) (or h n (d_n + d_r) when r_q = 0), then
        kv_a_proj_with_mqa h (r_kv + d_r) + kv_a_layernorm r_kv + kv_b r_kv n (d_n + d_v), and o_proj n d_v h.
        DeepSeek-V3: 11,010,048 + 1,536 + 37,748,736 + 4,128,768 + 512 + 16,777,216 + 117,440,512 = 187,107,328.
        """
        h = self.hidden_size
        if self.is_mla:
            n, dq, dv = self.num_heads, self.qk_nope_head_dim + self.qk_rope_head_dim, self.v_head_dim
            rq, rkv = self.q_lora_rank, self.kv_lora_rank
            q = (h * rq + rq + rq * n * dq) if rq else h * n * dq
            kv = h * (rkv + self.qk_rope_head_dim) + rkv + rkv * n * (self.qk_nope_head_dim + dv)
            return q + kv + n * dv * h
        bias = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        extra = ((h if self.attention_output_bias else 0) + (self.num_heads if self.attention_sinks else 0)
                 + (2 * self.head_dim if self.qk_norm else 0))
        return h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h + bias + extra

    @property
    def mlp_params_per_layer(self) -> int:
        """Dense MLP: 3 h f for SwiGLU (gate, up, down), 2 h f for a plain MLP."""
        return (3 if self.gated_mlp else 2) * self.hidden_size * self.ffn_hidden_size

    @property
    def params_per_layer(self) -> int:
        """A dense layer: attention + MLP + ``norms_per_layer`` RMSNorm weight vectors (2 h; 4 h in Gemma 2).
        (An MoE layer: :attr:`moe_layer_params`.)"""
        return self.attention_params_per_layer + self.mlp_params_per_layer + self.norms_per_layer * self.hidden_size

    @property
    def expert_params(self) -> int:
        """One routed expert (elements): 3 h f_e gated (gate, up, down; 2 h f_e plain), + 2 f_e + h biases
        gated (f_e + h plain) when ``moe_expert_bias`` (GPT-OSS ``gate_up_proj_bias`` [2 f_e], ``down_proj_bias``
        [h]). Mixtral-8x7B: 3 x 4096 x 14336 = 176,160,768; GPT-OSS: 24,883,200 + 5,760 + 2,880 = 24,891,840."""
        h, f = self.hidden_size, self.moe_ffn_hidden_size
        w = (3 if self.gated_mlp else 2) * h * f
        b = ((2 * f if self.gated_mlp else f) + h) if self.moe_expert_bias else 0
        return w + b

    @property
    def shared_expert_params(self) -> int:
        """All shared experts of one MoE layer: num_shared x 3 h f_s (gated; 2 h f_s plain), no biases
        (HF ``DeepseekV3MoE.shared_experts`` is one MLP of width n_shared x moe_intermediate_size: the same count)."""
        return self.num_shared_experts * (3 if self.gated_mlp else 2) * self.hidden_size * \
            self.shared_expert_ffn_hidden_size

    @property
    def router_params(self) -> int:
        """The router of one MoE layer: E h gate weights, + E bias (GPT-OSS) + E score-correction bias
        (DeepSeek-V3 ``e_score_correction_bias``, a stored buffer)."""
        e = self.num_experts
        return e * self.hidden_size + (e if self.router_bias else 0) + (e if self.router_expert_bias else 0)

    @property
    def moe_layer_params(self) -> int:
        """One MoE layer, all experts (elements): attention + E experts + shared experts + router + norms.
        0 for a dense model."""
        if not self.is_moe:
            return 0
        return (self.attention_params_per_layer + self.num_experts * self.expert_params + self.shared_expert_params
                + self.router_params + self.norms_per_layer * self.hidden_size)

    @property
    def moe_layer_active_params(self) -> int:
        """One MoE layer as one token uses it: the same with top-k of the E routed experts. 0 for a dense model."""
        if not self.is_moe:
            return 0
        return self.moe_layer_params - (self.num_experts - self.moe_top_k) * self.expert_params

    def is_moe_layer(self, index: int) -> bool:
        """Whether main layer ``index`` (0-based) has routed experts: index >= num_first_dense_layers and
        index % moe_layer_freq == 0 (HF DeepSeek ``DeepseekV3DecoderLayer``; Megatron ``--moe-layer-freq``)."""
        return self.is_moe and index >= self.num_first_dense_layers and index % self.moe_layer_freq == 0

    @property
    def moe_layer_pattern(self) -> tuple[int, ...]:
        """1 for an MoE layer, 0 for a dense one, per main layer (Megatron ``--moe-layer-freq`` as a list)."""
        return tuple(int(self.is_moe_layer(i)) for i in range(self.num_layers))

    @property
    def num_moe_layers(self) -> int:
        """Main layers with routed experts (DeepSeek-V3: 58)."""
        return sum(self.moe_layer_pattern) if self.is_moe else 0

    @property
    def num_dense_layers(self) -> int:
        """Main layers with a dense MLP (DeepSeek-V3: 3; every layer of a dense model)."""
        return self.num_layers - self.num_moe_layers

    @property
    def mtp_layer_is_moe(self) -> bool:
        """An MTP depth's decoder layer has the type of the last main layer (DeepSeek-V3: MoE; Megatron-LM
        ``num_floating_point_operations`` counts it so)."""
        return self.is_moe_layer(self.num_layers - 1)

    @property
    def mtp_params_per_layer(self) -> int:
        """One MTP depth, its own weights (elements): enorm + hnorm (2 h), eh_proj 2h x h, one decoder layer and
        the output norm h (DeepSeek-V3 ``model.layers.61``: 11,610,068,224); the embedding and LM head are the
        main model's (the checkpoint stores copies, :attr:`mtp_stored_duplicate_params`)."""
        h = self.hidden_size
        layer = self.moe_layer_params if self.mtp_layer_is_moe else self.params_per_layer
        return 3 * h + 2 * h * h + layer

    @property
    def mtp_active_params_per_layer(self) -> int:
        """One MTP depth as one token uses it (top-k experts in its MoE layer)."""
        h = self.hidden_size
        layer = self.moe_layer_active_params if self.mtp_layer_is_moe else self.params_per_layer
        return 3 * h + 2 * h * h + layer

    @property
    def mtp_stored_duplicate_params(self) -> int:
        """Elements a DeepSeek-V3 checkpoint stores again per MTP depth (``embed_tokens`` and ``shared_head.head``,
        2 V h): counted in the HF "685B" but not unique parameters."""
        return self.mtp_num_layers * 2 * self.vocab_size * self.hidden_size

    @property
    def layer_params(self) -> int:
        """All main layers (elements): dense layers x :attr:`params_per_layer` + MoE layers x
        :attr:`moe_layer_params`."""
        return self.num_dense_layers * self.params_per_layer + self.num_moe_layers * self.moe_layer_params

    @property
    def active_layer_params(self) -> int:
        """All main layers as one token uses them (top-k experts per MoE layer)."""
        return self.num_dense_layers * self.params_per_layer + self.num_moe_layers * self.moe_layer_active_params

    @property
    def embedding_params(self) -> int:
        """V h: the input embedding table."""
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """V h for an untied LM head; 0 when tied (the weight is the embedding table)."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Total parameters (elements), exact, unique: embedding + LM head + layers + final norm + MTP depths;
        e.g. 8,030,261,248 for Llama 3.1 8B, 671,026,419,200 + 11,610,068,224 for DeepSeek-V3 with its MTP
        module."""
        return (self.embedding_params + self.lm_head_params + self.layer_params + self.hidden_size
                + self.mtp_num_layers * self.mtp_params_per_layer)

    @property
    def num_active_params(self) -> int:
        """Parameters one token uses (elements): :attr:`num_params` with top-k of the routed experts in each MoE
        layer (shared experts, router, attention, dense layers, embedding and LM head all count); equal to
        :attr:`num_params` for a dense model. Published "active" figures differ in what they include: OpenAI's
        GPT-OSS figure leaves out the input embedding (:attr:`num_active_params_without_embedding`), DeepSeek's
        "37B" the MTP module."""
        return (self.embedding_params + self.lm_head_params + self.active_layer_params + self.hidden_size
                + self.mtp_num_layers * self.mtp_active_params_per_layer)

    @property
    def num_params_without_embedding(self) -> int:
        """Parameters excluding the input embedding table (the LM head counts): the N in 6N.

        For a tied model the shared matrix still does the LM-head matmul, so V h is kept.
        """
        lm_head = self.vocab_size * self.hidden_size
        return lm_head + self.layer_params + self.hidden_size + self.mtp_num_layers * self.mtp_params_per_layer

    @property
    def num_active_params_without_embedding(self) -> int:
        """Active parameters excluding the input embedding (the LM head counts once): the N in 6N for an MoE."""
        lm_head = self.vocab_size * self.hidden_size
        return (lm_head + self.active_layer_params + self.hidden_size
                + self.mtp_num_layers * self.mtp_active_params_per_layer)

    def truncated(self, num_layers: int) -> "ModelSpec":
        """The same widths with ``num_layers`` layers (a depth proxy), named ``<name>-<N>L``.

        Raises:
            ConfigError: num_layers outside 1..self.num_layers.
        """
        if not isinstance(num_layers, int) or not 1 <= num_layers <= self.num_layers:
            raise ConfigError(f"--layers {num_layers} must be between 1 and the model's {self.num_layers} layers")
        return replace(self, num_layers=num_layers, name=f"{self.name}-{num_layers}L",
                       num_first_dense_layers=min(self.num_first_dense_layers, num_layers))

    def check_sequence(self, seq_len: int) -> str | None:
        """Refuse a sequence the cost model would cost wrongly; return a warning line or None.

        Raises:
            ConfigError: seq_len > sliding_window (attention is windowed there; the simulator costs
                full causal attention, so FLOPs and MFU would be wrong).
        Returns:
            A warning when seq_len > max_seq_len (HF ``max_position_embeddings``): RoPE was not trained
            that far, the cost is still computed.
        """
        if self.sliding_window is not None and seq_len > self.sliding_window:
            raise ConfigError(f"model {self.name}: sliding-window attention (window {self.sliding_window} tokens) "
                              f"is not modelled; --seq-len {seq_len} exceeds the window, use --seq-len <= "
                              f"{self.sliding_window}")
        if seq_len > self.max_seq_len:
            return (f"warning: --seq-len {seq_len} is longer than {self.name}'s max_position_embeddings "
                    f"{self.max_seq_len}")
        return None

    def fingerprint(self) -> str:
        """8 hex digits of SHA-256 over the architecture fields (every field but ``name``): two configs
        with the same name but different shapes get different study names."""
        import hashlib
        d = {k: v for k, v in self.to_dict().items() if k != "name"}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]

    def to_dict(self) -> dict[str, Any]:
        """Plain data (YAML/JSON safe); the fields of :data:`_LATER_FIELDS` only where not at their default."""
        d = asdict(self)
        for k, default in _LATER_FIELDS.items():
            if d[k] == default or (k == "features" and not d[k]):
                del d[k]
        if "features" in d:
            d["features"] = list(d["features"])
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "model") -> "ModelSpec":
        if not isinstance(d, Mapping):
            raise ConfigError(f"{source}: expected a mapping of model fields, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(map(str, set(d) - known))
        if unknown:
            raise ConfigError(f"{source}: unknown model field(s) {unknown}; valid fields: {sorted(known)}")
        d = dict(d)
        if "rope_scaling" not in d:
            # files and studies from before rope_scaling was recorded: a catalog Llama 3.1 (or its
            # --layers proxy, ``<name>-<N>L``) had its published scaling then too
            base = next((m for m in CATALOG.values() if d.get("name") == m.name
                         or str(d.get("name", "")).startswith(m.name + "-")), None)
            if base is not None:
                d["rope_scaling"] = base.rope_scaling
        try:
            return cls(**d)
        except TypeError as e:
            raise ConfigError(f"{source}: {e}") from None


#: Llama 3.1's RoPE scaling (config.json of meta-llama/Llama-3.1-*: rope_scaling {rope_type: llama3, factor 8,
#: low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192})
LLAMA31_ROPE_SCALING = RopeScaling(type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                   original_max_position_embeddings=8192)
LLAMA31_COMMON = dict(vocab_size=128256, head_dim=128, tied_embeddings=False, gated_mlp=True,
                      rope_theta=500000.0, norm_eps=1e-5, max_seq_len=131072, rope_scaling=LLAMA31_ROPE_SCALING)

#: Llama 3.1 configurations (Llama 3 paper Table 3; Hugging Face config.json of meta-llama/Llama-3.1-*).
CATALOG: dict[str, ModelSpec] = {
    "8b": ModelSpec(name="llama3.1-8b", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                    ffn_hidden_size=14336, **LLAMA31_COMMON),
    "70b": ModelSpec(name="llama3.1-70b", hidden_size=8192, num_layers=80, num_heads=64, num_kv_heads=8,
                     ffn_hidden_size=28672, **LLAMA31_COMMON),
    "405b": ModelSpec(name="llama3.1-405b", hidden_size=16384, num_layers=126, num_heads=128,
                      num_kv_heads=8, ffn_hidden_size=53248, **LLAMA31_COMMON),
}


#: Mixture-of-experts models by name (``--model deepseek-v3``). Each field from the model's HF config.json
#: (field names in :func:`autotune.spec.hf_config.model_from_hf_config`), cross-checked with torchtitan v0.2.2's flavours
#: (``torchtitan/models/{deepseek_v3,qwen3,gpt_oss}/__init__.py``) and shared/reference/published-moe-runs.yaml;
#: the parameter counts each gives are in tests/spec/test_models.py with their hand derivations.
MOE_CATALOG: dict[str, ModelSpec] = {
    # mistralai/Mixtral-8x7B-v0.1 config.json: 32 layers, h 4096, 32/8 heads, 8 experts (num_local_experts) of
    # intermediate_size 14336, top-2, vocab 32000, rope_theta 1e6, 32768 positions, no sliding window
    "mixtral-8x7b": ModelSpec(
        name="mixtral-8x7b", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336,
        vocab_size=32000, head_dim=128, rope_theta=1e6, norm_eps=1e-5, max_seq_len=32768,
        num_experts=8, moe_top_k=2, moe_ffn_hidden_size=14336),
    # mistralai/Mixtral-8x22B-v0.1 config.json, read from a copy (a test fixture of scaleapi/llm-engine,
    # transformers 4.40.0.dev0; the Hub file was not reachable): 56 layers, h 6144, 48/8 heads, 8 experts of
    # 16384, top-2, vocab 32000 (the Instruct-v0.1 tokenizer has 32768), rope_theta 1e6, 65536 positions
    "mixtral-8x22b": ModelSpec(
        name="mixtral-8x22b", hidden_size=6144, num_layers=56, num_heads=48, num_kv_heads=8, ffn_hidden_size=16384,
        vocab_size=32000, head_dim=128, rope_theta=1e6, norm_eps=1e-5, max_seq_len=65536,
        num_experts=8, moe_top_k=2, moe_ffn_hidden_size=16384),
    # Qwen/Qwen3-30B-A3B config.json (Qwen3MoeForCausalLM): 48 layers, h 2048, 32/4 heads of 128 with q/k
    # RMSNorms, 128 experts of moe_intermediate_size 768, top-8 (norm_topk_prob), vocab 151936, untied,
    # rope_theta 1e6, 40960 positions, rms_norm_eps 1e-6 (intermediate_size 6144 unused: no dense layer)
    "qwen3-30b-a3b": ModelSpec(
        name="qwen3-30b-a3b", hidden_size=2048, num_layers=48, num_heads=32, num_kv_heads=4, ffn_hidden_size=6144,
        vocab_size=151936, head_dim=128, rope_theta=1e6, norm_eps=1e-6, max_seq_len=40960, qk_norm=True,
        num_experts=128, moe_top_k=8, moe_ffn_hidden_size=768),
    # Qwen/Qwen3-235B-A22B config.json: 94 layers, h 4096, 64/4 heads of 128, 128 experts of 1536, top-8
    "qwen3-235b-a22b": ModelSpec(
        name="qwen3-235b-a22b", hidden_size=4096, num_layers=94, num_heads=64, num_kv_heads=4, ffn_hidden_size=12288,
        vocab_size=151936, head_dim=128, rope_theta=1e6, norm_eps=1e-6, max_seq_len=40960, qk_norm=True,
        num_experts=128, moe_top_k=8, moe_ffn_hidden_size=1536),
    # deepseek-ai/DeepSeek-V3 config.json (also inference/configs/config_671B.json): 61 layers (first 3 dense,
    # intermediate_size 18432), h 7168, 128 MLA heads (q_lora_rank 1536, kv_lora_rank 512, qk 128 + 64 rope,
    # v 128), 256 routed experts of 2048 + 1 shared, top-8 of 8 groups limited to 4, sigmoid scores with
    # e_score_correction_bias (noaux_tc), routed_scaling_factor 2.5, vocab 129280, 1 MTP layer
    # (num_nextn_predict_layers), yarn RoPE x40 over 4096, 163840 positions
    "deepseek-v3": ModelSpec(
        name="deepseek-v3", hidden_size=7168, num_layers=61, num_heads=128, num_kv_heads=128, ffn_hidden_size=18432,
        vocab_size=129280, head_dim=192, rope_theta=10000.0, norm_eps=1e-6, max_seq_len=163840,
        rope_scaling=RopeScaling(type="yarn", factor=40.0, original_max_position_embeddings=4096),
        num_experts=256, moe_top_k=8, moe_ffn_hidden_size=2048, num_shared_experts=1,
        shared_expert_ffn_hidden_size=2048, num_first_dense_layers=3, router_expert_bias=True,
        router_score_function="sigmoid", router_num_groups=8, router_group_top_k=4, router_scaling_factor=2.5,
        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        mtp_num_layers=1),
    # moonshotai/Kimi-K2-Instruct config.json (DeepseekV3ForCausalLM): DeepSeek-V3's shape with 64 heads,
    # 384 experts, 1 dense layer, one expert group, routed_scaling_factor 2.827, vocab 163840, rope_theta 5e4,
    # yarn x32 over 4096 (131072 positions), no MTP layer (the README lists none)
    "kimi-k2": ModelSpec(
        name="kimi-k2", hidden_size=7168, num_layers=61, num_heads=64, num_kv_heads=64, ffn_hidden_size=18432,
        vocab_size=163840, head_dim=192, rope_theta=50000.0, norm_eps=1e-6, max_seq_len=131072,
        rope_scaling=RopeScaling(type="yarn", factor=32.0, original_max_position_embeddings=4096),
        num_experts=384, moe_top_k=8, moe_ffn_hidden_size=2048, num_shared_experts=1,
        shared_expert_ffn_hidden_size=2048, num_first_dense_layers=1, router_expert_bias=True,
        router_score_function="sigmoid", router_scaling_factor=2.827,
        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
    # torchtitan v0.2.2 deepseek_v3 flavour "16B" (the shape of DeepSeek-V2-Lite / Moonlight-16B-A3B): 27 layers
    # (first dense, inter_dim 10944), h 2048, 16 MLA heads without q compression (q_lora_rank 0, kv_lora_rank 512),
    # 64 experts of 1408 + 2 shared, top-6, softmax, vocab 102400
    "deepseek-16b": ModelSpec(
        name="deepseek-16b", hidden_size=2048, num_layers=27, num_heads=16, num_kv_heads=16, ffn_hidden_size=10944,
        vocab_size=102400, head_dim=192, rope_theta=10000.0, norm_eps=1e-5, max_seq_len=163840,
        rope_scaling=RopeScaling(type="yarn", factor=40.0, original_max_position_embeddings=4096),
        num_experts=64, moe_top_k=6, moe_ffn_hidden_size=1408, num_shared_experts=2,
        shared_expert_ffn_hidden_size=1408, num_first_dense_layers=1,
        kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
    # openai/gpt-oss-20b config.json (GptOssForCausalLM): 24 layers, h 2880, 64/8 heads of 64 with q/k/v/o
    # biases (attention_bias) and sinks, sliding window 128 on even layers (layer_types), 32 experts of 2880
    # with biases, top-4, router bias, vocab 201088, rope_theta 150000, yarn x32 over 4096, 131072 positions
    "gpt-oss-20b": ModelSpec(
        name="gpt-oss-20b", hidden_size=2880, num_layers=24, num_heads=64, num_kv_heads=8, ffn_hidden_size=2880,
        vocab_size=201088, head_dim=64, rope_theta=150000.0, norm_eps=1e-5, max_seq_len=131072,
        rope_scaling=RopeScaling(type="yarn", factor=32.0, original_max_position_embeddings=4096),
        qkv_bias=True, attention_output_bias=True, attention_sinks=True, sliding_window=128,
        sliding_window_period=2, features=("SwiGLU clamped at swiglu_limit 7 (GPT-OSS)",),
        num_experts=32, moe_top_k=4, moe_ffn_hidden_size=2880, moe_expert_bias=True, router_bias=True),
    # openai/gpt-oss-120b config.json: the same with 36 layers and 128 experts
    "gpt-oss-120b": ModelSpec(
        name="gpt-oss-120b", hidden_size=2880, num_layers=36, num_heads=64, num_kv_heads=8, ffn_hidden_size=2880,
        vocab_size=201088, head_dim=64, rope_theta=150000.0, norm_eps=1e-5, max_seq_len=131072,
        rope_scaling=RopeScaling(type="yarn", factor=32.0, original_max_position_embeddings=4096),
        qkv_bias=True, attention_output_bias=True, attention_sinks=True, sliding_window=128,
        sliding_window_period=2, features=("SwiGLU clamped at swiglu_limit 7 (GPT-OSS)",),
        num_experts=128, moe_top_k=4, moe_ffn_hidden_size=2880, moe_expert_bias=True, router_bias=True),
}


def get_builtin_model(name: str) -> ModelSpec | None:
    """The built-in model called ``name`` (a Llama 3.1 size or ``llama3.1-8b``, or a :data:`MOE_CATALOG` name
    such as ``deepseek-v3``; case-insensitive), or None when no built-in has that name."""
    key = str(name).strip().lower()
    if key in MOE_CATALOG:
        return MOE_CATALOG[key]
    try:
        return get_model(key)
    except ConfigError:
        return None


def builtin_model_names() -> list[str]:
    """Names ``--model`` accepts besides a config.json path: the Llama 3.1 catalog and :data:`MOE_CATALOG`."""
    return [m.name for m in CATALOG.values()] + list(MOE_CATALOG)


def get_model(size: str) -> ModelSpec:
    """The catalog model for ``size`` (``8b``, ``70b``, ``405b``; also accepts ``llama3.1-8b``).

    Raises:
        ConfigError: unknown size; the message lists the known ones.
    """
    key = size.strip().lower()
    for prefix in ("llama3.1-", "llama-3.1-", "llama3-"):
        if key.startswith(prefix):
            key = key[len(prefix):]
    if key not in CATALOG:
        raise ConfigError(f"unknown model size {size!r}; known sizes: {', '.join(CATALOG)} "
                          "(or pass --model path/to/config.json)")
    return CATALOG[key]
