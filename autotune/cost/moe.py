"""Mixture-of-experts layers in the cost model: which layers are MoE, the routed experts' GEMM shapes per
rank, the token dispatch and combine collectives, and the parameter and activation bytes of an MoE layer.

Conventions (balanced routing unless ``Workload.moe_imbalance`` says otherwise, as the published
Megatron-Bridge benchmarks force-balance: "we force-balance the token distribution among experts and all
benchmarks are token-dropless", Megatron-Bridge docs/performance-summary.md):

* a rank enters an MoE layer with ``n`` tokens per micro-batch: T = micro_batch x seq / cp, over TP with
  sequence parallelism (Megatron-LM requires SP for MoE with TP > 1: megatron/core/transformer/moe/
  moe_layer.py ``MoELayer.forward``), so n = T / tp;
* the expert group is EP x ETP ranks folded over the dense layers' TP x CP x DP ("MoE Parallel Folding",
  Liu et al. 2025, arXiv 2504.14960, Sec. 3); expert ranks are ordered ETP (stride 1), EP (stride ETP),
  expert-DP (Megatron-LM megatron/core/parallel_state.py ``initialize_model_parallel``, the
  ``expert_tensor_and_model_parallel`` rank generator ``order="tp-ep-dp-pp"``);
* each of the n tokens goes to k = ``moe_top_k`` of E experts; a rank holds E / EP experts (each split over
  ETP ranks) and, balanced, receives n x k x ETP token copies, m_e = n x k x EP x ETP / E per local expert;
* the dispatch (before the experts) and combine (after) move n x k token copies of h BF16 values per rank:
  an all-to-all over the EP group (``alltoall`` and ``flex`` dispatchers; ``flex`` = DeepEP / HybridEP, which
  fuse the permutation into the dispatch kernels: deepseek-ai/DeepEP README, "fused ... permute"), or an
  all-gather of the EP group's n x EP tokens and a reduce-scatter back (``allgather``: Megatron-LM
  megatron/core/transformer/moe/token_dispatcher.py ``MoEAllGatherTokenDispatcher``); the backward runs
  each collective once more (the gradients of dispatch and combine);
* with ETP > 1 the dispatched tokens are all-gathered over the ETP group before the experts and the outputs
  reduce-scattered after (token_dispatcher.py ``MoEAlltoAllTokenDispatcher``: ``gather_from_sequence_parallel_region``
  over the expert-TP group);
* the router is a GEMM n x h x E plus a softmax / top-k; the permutation copies the n x k token copies out and
  back (memory-bound); FLOPs follow Megatron-LM's ``num_floating_point_operations`` (megatron/training/
  training.py), which counts the routed and shared experts' GEMMs but not the router's
  (:func:`autotune.cost.flops.model_flops_per_token`).

All functions are pure arithmetic on the model and the plan.
"""

from __future__ import annotations

from functools import lru_cache

from autotune.spec.models import ModelSpec
from autotune.spec.plan import Plan

BF16 = 2
#: the plan fields an MoE layer's cost depends on beyond a dense layer's (the expert layout)
MOE_LAYER_FIELDS = ("ep_degree", "etp_degree", "moe_dispatcher", "moe_a2a_overlap", "moe_grouped_gemm")
#: router logits and probabilities are FP32 (Megatron-LM ``--moe-router-dtype`` fp32 in the published MoE
#: recipes; megatron/core/transformer/moe/router.py casts the logits to the router dtype)
ROUTER_BYTES = 4


@lru_cache(maxsize=None)
def _grouped_table() -> dict:
    from importlib import resources

    from autotune.files import load_shipped_yaml

    return load_shipped_yaml(resources.files("autotune").joinpath("data", "grouped_gemm.yaml").read_text())


def grouped_gemm_ratio(pass_: str, rows_per_expert: float) -> float:
    """A grouped GEMM's throughput over one dense GEMM of the same total shape, for ``pass_`` ``fwd``, ``dgrad``
    or ``wgrad`` at ``rows_per_expert`` token rows per expert (log-linear between the measured points, flat
    outside): ``autotune/data/grouped_gemm.yaml``, measured on H200 (bench/grouped_gemm.py, 2026-12-03), e.g.
    0.96 / 0.99 / 0.98 at 4096 rows, 0.37 / 0.36 / 0.30 at 64."""
    from autotune.cost.calibration import interp_log

    t = _grouped_table()
    return interp_log(t["rows_per_expert"], t[pass_], max(1.0, rows_per_expert))


def is_moe_layer(model: ModelSpec, i: int) -> bool:
    """Whether main-model layer ``i`` (0-based) has routed experts (:meth:`autotune.spec.models.ModelSpec.is_moe_layer`)."""
    return model.is_moe_layer(i)


@lru_cache(maxsize=4096)
def _moe_prefix(model: ModelSpec) -> tuple[int, ...]:
    """prefix[i] = MoE layers among layers 0..i-1 (length num_layers + 1)."""
    out = [0]
    for i in range(model.num_layers):
        out.append(out[-1] + is_moe_layer(model, i))
    return tuple(out)


def moe_layers_in(model: ModelSpec, first: int, count: int) -> int:
    """MoE layers among main-model layers ``first`` .. ``first + count - 1``."""
    if not model.num_experts or count <= 0:
        return 0
    pre = _moe_prefix(model)
    return pre[min(first + count, model.num_layers)] - pre[max(0, min(first, model.num_layers))]


def chunk_layer_kinds(model: ModelSpec, plan: Plan) -> tuple[tuple[int, int], ...]:
    """(dense layers, MoE layers) of every virtual stage in model order (the layers of
    ``plan.layers_per_virtual_stage``, counted from layer 0 of the first stage). Multi-token-prediction
    layers are not among them: they sit after the last stage (:func:`mtp_layer_is_moe`)."""
    return _kinds(model, tuple(plan.layers_per_virtual_stage(model.num_layers)))


@lru_cache(maxsize=65536)
def _kinds(model: ModelSpec, layers: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    out, first = [], 0
    for n in layers:
        nm = moe_layers_in(model, first, n)
        out.append((n - nm, nm))
        first += n
    return tuple(out)


def mtp_layer_is_moe(model: ModelSpec) -> bool:
    """A multi-token-prediction layer is of the type of the last main layer (Megatron-LM
    ``num_floating_point_operations``: MTP layers are counted as the last layer's MLP type)."""
    return is_moe_layer(model, model.num_layers - 1)


def tokens_per_rank(plan: Plan, seq_len: int) -> int:
    """n: tokens a rank brings into an MoE layer per micro-batch, micro_batch x seq / cp / tp (SP over TP)."""
    return plan.micro_batch_size * seq_len // plan.cp_degree // plan.tp_degree


def expert_shapes(model: ModelSpec, plan: Plan, seq_len: int, *, imbalance: float = 1.0) -> dict[str, float]:
    """The routed experts' work on one rank per micro-batch (balanced, or the busiest rank under
    ``imbalance`` = max / mean tokens per expert).

    Returns ``{"local_experts": E / EP, "rows_per_expert": m_e, "ffn_per_rank": f_e / ETP,
    "token_copies": n x k, "tokens": n}`` (rows are token copies; m_e is a float under imbalance).
    """
    n = tokens_per_rank(plan, seq_len)
    k, E = model.moe_top_k, model.num_experts
    ep, etp = plan.ep_degree, plan.etp_degree
    return {"local_experts": E // ep, "rows_per_expert": n * k * ep * etp / E * imbalance,
            "ffn_per_rank": model.moe_ffn_hidden_size // etp, "token_copies": n * k, "tokens": n}


def expert_gemms(model: ModelSpec, plan: Plan, seq_len: int, *, imbalance: float = 1.0) -> list[tuple[int, int, int]]:
    """(m, n, k) of one local expert's forward GEMMs on one rank: fc1 (gate and up for a gated MLP) and fc2
    (``m`` rounded up to whole rows). Multiply by ``local_experts`` for the rank's grouped GEMM."""
    s = expert_shapes(model, plan, seq_len, imbalance=imbalance)
    m = max(1, int(-(-s["rows_per_expert"] // 1)))
    f, h = s["ffn_per_rank"], model.hidden_size
    up = 2 * f if model.gated_mlp else f
    return [(m, up, h), (m, h, f)]


def dispatch_bytes(model: ModelSpec, plan: Plan, seq_len: int, *, imbalance: float = 1.0) -> float:
    """Bytes one rank sends (and receives) in one dispatch all-to-all: n x k token copies of h BF16 values
    (x ``imbalance`` on the busiest rank's receiving side)."""
    return tokens_per_rank(plan, seq_len) * model.moe_top_k * model.hidden_size * BF16 * imbalance


def shared_ffn(model: ModelSpec) -> int:
    """Inner width of the shared experts together (Megatron-LM ``--moe-shared-expert-intermediate-size``
    = num_shared_experts x shared_expert_ffn_hidden_size)."""
    return model.num_shared_experts * model.shared_expert_ffn_hidden_size


def expert_params_per_layer(model: ModelSpec) -> int:
    """Parameters of the routed experts of one MoE layer: E x :attr:`autotune.spec.models.ModelSpec.expert_params`."""
    return model.num_experts * model.expert_params


def dense_layer_params(model: ModelSpec) -> int:
    """Parameters of one dense layer (the first dense layers of an MoE model): :attr:`ModelSpec.params_per_layer`."""
    return model.params_per_layer


def dense_params_of_moe_layer(model: ModelSpec) -> int:
    """Parameters of one MoE layer that are not routed experts (attention, norms, router, shared experts):
    :attr:`ModelSpec.moe_layer_params` less :func:`expert_params_per_layer`."""
    return model.moe_layer_params - expert_params_per_layer(model)


def moe_activation_terms(model: ModelSpec, plan: Plan, seq_len: int, *, imbalance: float = 1.0,
                         fp8_inputs: bool = False) -> dict[str, int]:
    """Bytes one MoE layer's expert part saves for backward on one rank, one micro-batch, no recompute
    (beside the attention and norm terms of :func:`autotune.cost.memory._layer_activation_terms`):

    * ``router_probs``: n x E FP32 router probabilities (for the router's backward);
    * ``dispatched``: the n x k x ETP permuted token copies, h each (fc1's input, kept for its weight
      gradient): BF16, or 1 byte when the linears run FP8 through Transformer Engine (``fp8_inputs``: TE keeps
      the quantized input);
    * ``expert_fc1``: fc1's output, 2 f_e / ETP (gated) BF16 per copy (the activation's backward input);
    * ``expert_act``: the activation output, f_e / ETP per copy (fc2's input; 1 byte with ``fp8_inputs``);
    * ``combine``: the n x k routing weights (FP32). The experts' outputs are not kept: Megatron-LM multiplies
      the routing weights inside the activation (megatron/core/transformer/moe/experts.py "Activation and
      post-multiply probs", ``weighted_bias_swiglu_impl``), so the unpermutation is a plain sum;
    * ``shared_*``: the shared experts' gate/up and activation outputs (n x TP tokens, f_s / TP), as a dense MLP.

    The busiest rank holds ``imbalance`` x the balanced token copies.
    """
    s = expert_shapes(model, plan, seq_len, imbalance=imbalance)
    n, h, etp = s["tokens"], model.hidden_size, plan.etp_degree
    copies = s["token_copies"] * etp * imbalance
    f = s["ffn_per_rank"]
    up = 2 * f if model.gated_mlp else f
    lin = 1 if fp8_inputs else BF16
    terms = {
        "router_probs": ROUTER_BYTES * n * model.num_experts,
        "dispatched": int(lin * copies * h),
        "expert_fc1": int(BF16 * copies * up),
        "expert_act": int(lin * copies * f),
        "combine": int(ROUTER_BYTES * s["token_copies"]),
    }
    fs = shared_ffn(model)
    if fs:
        t = plan.tp_degree
        tok = n * t                   # the shared experts see the whole sequence, their width split over TP
        terms["shared_gate_up"] = BF16 * tok * (2 * fs if model.gated_mlp else fs) // t
        terms["shared_act"] = lin * tok * fs // t
    return terms


def recomputed_moe_terms(recompute_modules: tuple[str, ...] | None) -> tuple[str, ...]:
    """The :func:`moe_activation_terms` a selective recompute of ``recompute_modules`` drops (Megatron-LM
    ``--recompute-modules``, megatron/core/transformer/transformer_config.py): ``moe_act`` recomputes the
    experts' activation from fc1's output (drops ``expert_act``); ``moe`` checkpoints the whole MoE layer
    (drops every expert term); ``shared_experts`` the shared experts' terms."""
    mods = set(recompute_modules or ())
    if "moe" in mods:
        return ("router_probs", "dispatched", "expert_fc1", "expert_act", "combine", "shared_gate_up", "shared_act")
    out = []
    if "moe_act" in mods:
        out.append("expert_act")
    if "shared_experts" in mods:
        out += ["shared_gate_up", "shared_act"]
    return tuple(out)


def attention_gemms(m: ModelSpec, t: int, T: int) -> list[tuple[int, int, int]]:
    """(rows, N, K) of one layer's attention GEMMs per rank, forward (N split over TP for column-parallel,
    K for row-parallel; Shoeybi et al. 2019, Sec. 3). Standard attention: the fused QKV projection and the
    output projection. Multi-latent attention (DeepSeek-V2, arXiv 2405.04434, Sec. 2.1; Megatron-LM
    megatron/core/transformer/multi_latent_attention.py): the query down-projection h -> r_q (when
    r_q > 0) and the KV down-projection h -> r_kv + d_rope are duplicated on every TP rank (not split),
    the up-projections r_q -> n (d_nope + d_rope) / t and r_kv -> n (d_nope + d_v) / t and the output
    projection n d_v / t -> h are split."""
    h = m.hidden_size
    if not m.is_mla:
        return [(T, (m.q_dim + 2 * m.kv_dim) // t, h), (T, h, m.q_dim // t)]
    n, dn, dr, dv = m.num_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
    out = []
    if m.q_lora_rank:
        out += [(T, m.q_lora_rank, h), (T, n * (dn + dr) // t, m.q_lora_rank)]
    else:
        out.append((T, n * (dn + dr) // t, h))
    out += [(T, m.kv_lora_rank + dr, h), (T, n * (dn + dv) // t, m.kv_lora_rank), (T, h, n * dv // t)]
    return out


def mlp_gemms(m: ModelSpec, t: int, T: int, kind: str) -> list[tuple[int, int, int]]:
    """(rows, N, K) of one layer's dense MLP GEMMs per rank, forward: the MLP of ``ffn_hidden_size`` in a
    ``dense`` layer, the shared experts (:func:`autotune.cost.moe.shared_ffn`, split over TP like a dense
    MLP) in an ``moe`` layer (none without shared experts). The routed experts are
    :func:`autotune.cost.moe.expert_gemms`."""
    f = m.ffn_hidden_size if kind == "dense" else shared_ffn(m)
    if not f:
        return []
    return [(T, (2 * f if m.gated_mlp else f) // t, m.hidden_size), (T, m.hidden_size, f // t)]



def attention_widths(m: ModelSpec) -> tuple[int, int, int]:
    """(head_dim the attention kernel is costed at, RoPE width of Q, RoPE width of K) of one layer: standard
    attention d, q_dim, kv_dim; multi-latent attention (QK^T over d_nope + d_rope, PV over d_v: the kernel's
    work is that of their mean) (d_nope + d_rope + d_v) / 2, n d_rope, d_rope (the decoupled RoPE key is
    shared by the heads; DeepSeek-V2, arXiv 2405.04434, Sec. 2.1.3)."""
    if not m.is_mla:
        return m.head_dim, m.q_dim, m.kv_dim
    return ((m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) // 2, m.num_heads * m.qk_rope_head_dim,
            m.qk_rope_head_dim)


#: query and key block of the attention kernel's tiling, tokens: FlashAttention-2 tiles Q and K/V in blocks of
#: 64 or 128 rows (Dao 2023, arXiv 2307.08691, Sec. 3.1) and skips the key blocks a query block's mask hides
#: entirely (flash-attn csrc/flash_attn/src/flash_fwd_kernel.h, ``n_block_min`` / ``n_block_max`` from
#: ``window_size_left`` for local attention); 128 assumed for cuDNN's fused attention too (its tiling is not
#: public)
ATTENTION_BLOCK = 128


def attention_work_fraction(m: ModelSpec, seq_len: int, block: int = ATTENTION_BLOCK) -> float:
    """Mean over the layers of the attention kernel's work relative to full causal attention at ``seq_len``
    (dimensionless, in (0, 1]): 1 without a sliding window or when ``seq_len`` fits in it.

    A windowed layer (``sliding_window`` W tokens, the query and the W - 1 keys before it: HF ``sliding_window``;
    Megatron-LM ``--window-size W-1,0``, Megatron-Bridge PR #2656) runs the kernel over the key blocks its
    query blocks can see: with n = ceil(T / B) blocks of B = ``block`` tokens, query block i (rows iB .. iB+B-1)
    reads key blocks max(0, floor((iB - W + 1) / B)) .. i; causal reads 0 .. i, n (n + 1) / 2 in all. Layer l is
    windowed when l % ``sliding_window_period`` == 0 (GPT-OSS: period 2, the even layers; HF ``layer_types``;
    Megatron-LM ``is_layer_window_attention`` windows 1-based layers not a multiple of
    ``--window-attn-skip-freq`` 2: the same layers). The per-block time is that of causal attention at T
    (the kernel's TFLOP/s is not re-read at the window's width). GPT-OSS-120B at T = 4096, W = 128: a windowed
    layer 63 / 528 blocks, the mean over 36 layers (18 windowed) 591 / 1056 = 0.560.

    Attention sinks (GPT-OSS's learned per-head logit, Megatron ``softmax_type`` ``learnable``) add no term:
    Transformer Engine runs them inside cuDNN's fused attention (transformer_engine/common/fused_attn/
    fused_attn.cpp: ``softmax_type`` learnable needs cuDNN >= 9.13.1; FlashAttention is disabled for it,
    pytorch/attention/dot_product_attention/utils.py "Filter: Softmax type"), with the window (the same
    file's "sliding window" cases, cuDNN >= 9.2); Megatron-Bridge 26.04 pins Transformer Engine 2.16 (uv.lock
    at 21d102f5e). The model FLOPs (MFU) keep full causal attention on every layer, as Megatron-LM's
    ``num_floating_point_operations`` and Megatron-Bridge's published TFLOP/s count them
    (:mod:`autotune.cost.flops`)."""
    w = m.sliding_window
    if w is None or seq_len <= w or m.num_layers <= 0:
        return 1.0
    n = -(-seq_len // block)
    causal = n * (n + 1) / 2
    windowed = sum(i - max(0, (i * block - w + 1) // block) + 1 for i in range(n))
    period = max(1, m.sliding_window_period)
    n_win = -(-m.num_layers // period)
    return (n_win * windowed + (m.num_layers - n_win) * causal) / (m.num_layers * causal)


def cp_exchange_width(m: ModelSpec, t: int, kv: int) -> int:
    """Elements per token of the K and V blocks a context-parallel rank exchanges: 2 kv / t (at least the kv
    width when TP exceeds the KV heads); with multi-latent attention the up-projected K (d_nope + d_rope) and V
    (d_v) of the rank's n / t heads."""
    if m.is_mla:
        return m.num_heads // t * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
    return 2 * (kv // t if kv >= t else kv)

__all__ = ["MOE_LAYER_FIELDS", "attention_widths", "cp_exchange_width", "attention_gemms", "mlp_gemms", "grouped_gemm_ratio", "chunk_layer_kinds", "dense_layer_params", "dense_params_of_moe_layer", "dispatch_bytes", "expert_gemms",
           "expert_params_per_layer", "expert_shapes", "is_moe_layer", "moe_activation_terms", "moe_layers_in",
           "mtp_layer_is_moe", "recomputed_moe_terms", "shared_ffn", "tokens_per_rank"]
