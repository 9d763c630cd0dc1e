"""Kernel-level levers of the native runtime (issue 43): the values of their Plan fields.

A leaf module (no autotune imports) so that :mod:`autotune.spec.plan` and :mod:`autotune.spec.engines`
both read it without an import cycle. Measured by ``bench/bench_one_gpu.py``; engine facts in
``autotune/engines/native/facts.yaml`` (``levers``); results in docs/engines.md.
"""

from __future__ import annotations

#: The levers (autotune/runtime/, facts in
#: autotune/engines/native/facts.yaml, measured by bench/bench_one_gpu.py). ``default`` / ``full`` /
#: ``none`` / ``fused`` keep what the runtime did before the levers existed.
#: SDPA backend: ``default`` = PyTorch's own dispatch order (cuDNN first on Hopper in torch 2.11),
#: ``cudnn`` / ``flash`` = only that backend enabled (``torch.backends.cuda.enable_*_sdp``).
ATTENTION_BACKENDS = ("default", "cudnn", "flash")
#: ``torch.compile`` mode of the compiled blocks (``compile: true`` only): inductor's ``default`` or
#: ``max-autotune-no-cudagraphs`` (GEMM / Triton template autotuning, no CUDA graphs).
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
#: LM head + loss: ``full`` = logits [tokens, vocab] materialized, FP32 cross-entropy; ``chunked`` =
#: linear + cross-entropy over token chunks with the gradients computed in the forward pass, so no
#: full-vocabulary logits exist (autotune/runtime/model.py ChunkedLinearCrossEntropy).
LOSS_IMPLS = ("full", "chunked")
#: FP32 bytes of one chunk's logits under ``loss_impl: chunked`` (:func:`loss_chunk_tokens`)
LOSS_CHUNK_BYTES = 2 << 30


def loss_chunk_tokens(vocab_size: int, num_tokens: int) -> int:
    """Tokens per chunk of the chunked linear + cross-entropy (autotune/runtime/model.py
    ChunkedLinearCrossEntropy; the memory model counts one chunk's logits): :data:`LOSS_CHUNK_BYTES` of
    FP32 logits, rounded down to a multiple of 256, at least 256 and at most ``num_tokens``
    (Llama 3's vocabulary of 128,256: 4,096 tokens)."""
    c = max(256, (LOSS_CHUNK_BYTES // (4 * vocab_size)) // 256 * 256)
    return min(c, num_tokens)


#: which transformer-layer linears stay BF16 under an FP8 precision: ``none``; ``kv`` (wk, wv: the
#: two N = kv_dim projections); ``attention`` (wq, wk, wv, wo).
FP8_BF16_LINEARS = ("none", "kv", "attention")
#: AdamW implementation on CUDA: ``fused`` (one kernel per group) or ``foreach`` (multi-tensor ops).
OPTIMIZER_IMPLS = ("fused", "foreach")
#: the kernel-level lever fields and their valid values (checked in Plan.__post_init__)
LEVER_FIELDS = {"attention_backend": ATTENTION_BACKENDS, "compile_mode": COMPILE_MODES,
                "loss_impl": LOSS_IMPLS, "fp8_bf16_linears": FP8_BF16_LINEARS,
                "optimizer_impl": OPTIMIZER_IMPLS}
#: each lever field's default (the runtime before the levers existed)
LEVER_DEFAULTS = {k: v[0] for k, v in LEVER_FIELDS.items()}

__all__ = ["ATTENTION_BACKENDS", "COMPILE_MODES", "LOSS_IMPLS", "FP8_BF16_LINEARS", "OPTIMIZER_IMPLS",
           "LEVER_FIELDS", "LEVER_DEFAULTS", "LOSS_CHUNK_BYTES", "loss_chunk_tokens"]
