"""Model FLOPs, MFU and HFU.

Convention (stated in every report):

    model FLOPs per token (training) = 6 N + 6 L H Q T c

with N the parameters excluding the input embedding table (the LM head counts), L layers, H query
heads, Q head dim, T sequence length; c = 1 for causal attention (the work the kernel does; the
Megatron-LM convention, reported as MFU) and c = 2 for the PaLM convention (Chowdhery et al. 2022,
Appendix B; torchtitan), reported beside it. 6N is the forward (2N) plus backward (4N) matmul FLOPs
(Kaplan et al. 2020, Sec. 2.1); the attention term is QK^T and AV, 2 x 2 T Q per head per token
forward, times 3 for training, halved by the causal mask.

    MFU = model FLOPs of the step / (step time x num_gpus x dense BF16 peak)

Recomputation is not model FLOPs: it enters HFU (hardware FLOPs utilization) only.

Reference values at T = 8192 (GFLOP/token): causal 51.47 / 449.22 / 2523.96 and PaLM 57.91 / 481.44 /
2625.45 for Llama 3.1 8B / 70B / 405B.

Mixture-of-experts, multi-latent attention and multi-token prediction (issue 38): the FLOPs of the *active*
path, so MFU is on the active path,

    model FLOPs per token = 6 (N_active + D V h) + 3 T c H (Q_qk + Q_v) (L + D)

with N_active the parameters one token uses, the input embedding excluded (attention incl. MLA's low-rank
projections and their norms, the router, top-k routed experts, shared experts, dense-first layers, norms, the
D MTP depths' projection and decoder layer, the LM head), D V h the LM head applied again by each MTP depth,
and Q_qk / Q_v the query-key and value widths per head (MLA: qk_nope + qk_rope and v_head_dim; otherwise
both the head dim, which gives the dense 6 L H Q T c). This follows Megatron-LM's
``num_floating_point_operations`` (``megatron/training/training.py``, ``transformer_flops``; read at commit
d98e8a64): 6 = 3 (forward, wgrad, dgrad) x 2 (FMA) per weight; routed experts k x 3 h f_e per MoE layer,
shared experts once per MoE layer; an MTP depth counts as one more layer of the type of the last main layer
plus its norms and 2h -> h projection and one more LM head; the core attention has the causal /2 and
Q_qk + Q_v per head (MLA); no capacity / dropped tokens (dropless, balanced routing). It differs from
Megatron-LM in counting the router GEMM (6 E h per MoE layer: 0.25% of DeepSeek-V3's total) and the layer
norms and biases (< 0.01%), which Megatron leaves out, as the dense formula above counts them. Sliding-window
layers (GPT-OSS) are counted with full causal attention, as Megatron-LM does (the simulated kernel time reads the
window: :func:`autotune.cost.moe.attention_work_fraction`).
"""

from __future__ import annotations

from autotune.spec.models import ModelSpec


def _dense_only(model: ModelSpec) -> bool:
    """No experts, no MLA, no MTP: the dense formula applies as it always did."""
    return not (model.is_moe or model.is_mla or model.mtp_num_layers)


def attention_flops_per_token(model: ModelSpec, seq_len: int, *, causal: bool = True) -> float:
    """6 L H Q T c: attention score and value FLOPs per token for training (FLOP); with MLA and MTP
    3 T c H (Q_qk + Q_v) (L + D) (module docstring; Megatron-LM ``standard_self_attn_core_term``)."""
    c = 1 if causal else 2
    if _dense_only(model):
        return 6.0 * model.num_layers * model.num_heads * model.head_dim * seq_len * c
    q_v = model.v_head_dim if model.is_mla else model.head_dim
    return (3.0 * seq_len * c * model.num_heads * (model.head_dim + q_v)
            * (model.num_layers + model.mtp_num_layers))


def model_flops_per_token(model: ModelSpec, seq_len: int, *, causal: bool = True) -> float:
    """Training model FLOPs per token (FLOP): 6 N + 6 L H Q T c; for an MoE / MLA / MTP model the active
    path, 6 (N_active + D V h) + attention (see module docstring). DeepSeek-V3 at T = 4096: 261.1 GFLOP."""
    if _dense_only(model):
        return 6.0 * model.num_params_without_embedding + attention_flops_per_token(model, seq_len, causal=causal)
    extra_heads = model.mtp_num_layers * model.vocab_size * model.hidden_size
    return (6.0 * (model.num_active_params_without_embedding + extra_heads)
            + attention_flops_per_token(model, seq_len, causal=causal))


def flops_breakdown_per_token(model: ModelSpec, seq_len: int, *, causal: bool = True) -> dict[str, float]:
    """:func:`model_flops_per_token` by component (FLOP per token, training): ``attention_linear`` (Q/K/V/O or
    MLA projections with their norms, biases, sinks), ``attention_core`` (QK^T and AV), ``dense_mlp``,
    ``routed_experts`` (top-k), ``shared_experts``, ``router``, ``norms`` (layer, final and MTP norms),
    ``mtp_projection`` (eh_proj 2h -> h) and ``lm_head`` (1 + D passes). The values sum to
    :func:`model_flops_per_token`; MTP layers are in the attention and MLP entries."""
    m, h = model, model.hidden_size
    d = m.mtp_num_layers
    mtp_moe = d if (m.is_moe and m.mtp_layer_is_moe) else 0
    n_moe = m.num_moe_layers + mtp_moe
    n_dense = m.num_dense_layers + (d - mtp_moe)
    n_attn = m.num_layers + d
    return {
        "attention_linear": 6.0 * n_attn * m.attention_params_per_layer,
        "attention_core": attention_flops_per_token(m, seq_len, causal=causal),
        "dense_mlp": 6.0 * n_dense * m.mlp_params_per_layer,
        "routed_experts": 6.0 * n_moe * m.moe_top_k * m.expert_params,
        "shared_experts": 6.0 * n_moe * m.shared_expert_params,
        "router": 6.0 * n_moe * m.router_params,
        "norms": 6.0 * (n_attn * m.norms_per_layer * h + h + 3 * d * h),
        "mtp_projection": 6.0 * d * 2 * h * h,
        "lm_head": 6.0 * (1 + d) * m.vocab_size * h,
    }


def step_model_flops(model: ModelSpec, seq_len: int, global_batch_size: int, *, causal: bool = True) -> float:
    """Model FLOPs of one optimizer step over ``global_batch_size`` sequences (FLOP)."""
    return model_flops_per_token(model, seq_len, causal=causal) * seq_len * global_batch_size


def mfu(model_flops: float, step_time_s: float, num_gpus: int, peak_tflops: float) -> float:
    """Model FLOPs utilization in [0, 1]: model_flops / (step_time_s x num_gpus x peak_tflops x 1e12).

    Raises:
        ValueError: non-positive step time, GPU count or peak.
    """
    if step_time_s <= 0 or num_gpus <= 0 or peak_tflops <= 0:
        raise ValueError(f"mfu needs positive step time, GPUs and peak; got {step_time_s}, {num_gpus}, "
                         f"{peak_tflops}")
    return model_flops / (step_time_s * num_gpus * peak_tflops * 1e12)


def recompute_flops_per_token(model: ModelSpec, seq_len: int, recompute: str, *, causal: bool = True) -> float:
    """Extra FLOPs per token spent recomputing activations (FLOP), for HFU.

    ``full`` repeats each layer's forward: (2 N_layers + 2 L H Q T c) per token, where N_layers excludes
    embedding and LM head. ``selective`` repeats only the attention core (QK^T, softmax, AV):
    2 L H Q T c (Korthikanti et al. 2022, Sec. 5; the memory-heavy, FLOP-light part).
    """
    attn_fwd = 2.0 * model.num_layers * model.num_heads * model.head_dim * seq_len * (1 if causal else 2)
    if recompute == "full":
        return 2.0 * model.num_layers * model.params_per_layer + attn_fwd
    if recompute == "selective":
        return attn_fwd
    return 0.0
