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
"""

from __future__ import annotations

from autotune.spec.models import ModelSpec


def attention_flops_per_token(model: ModelSpec, seq_len: int, *, causal: bool = True) -> float:
    """6 L H Q T c: attention score and value FLOPs per token for training (FLOP)."""
    c = 1 if causal else 2
    return 6.0 * model.num_layers * model.num_heads * model.head_dim * seq_len * c


def model_flops_per_token(model: ModelSpec, seq_len: int, *, causal: bool = True) -> float:
    """Training model FLOPs per token (FLOP): 6 N + 6 L H Q T c (see module docstring)."""
    return 6.0 * model.num_params_without_embedding + attention_flops_per_token(model, seq_len, causal=causal)


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
