"""What torchtitan 0.2.x's transformer block keeps for backward, measured (activation accounting
``torchtitan_block``, the torchtitan runner's profile: :func:`autotune.spec.engines.resolve_engine`).

torchtitan's block (``torchtitan/models/llama3/model/model.py`` ``TransformerBlock``: eager ``nn.RMSNorm``,
complex-number RoPE, SDPA, SwiGLU) is wrapped by its op-level selective AC and compiled per block with
``fullgraph=True`` (``models/llama3/infra/parallelize.py`` ``apply_ac`` / ``apply_compile``). What a block
keeps is not the minimal set of :func:`autotune.cost.memory.activation_bytes_per_layer`:

* eager autograd keeps more: the RoPE's FP32 / complex copies of Q and K, the norms' extra outputs;
* under ``torch.autocast`` (torchtitan's path without FSDP: ``distributed/utils.py`` ``maybe_enable_amp``)
  the parameters are FP32 and the residual stream is FP32 (the embedding of FP32 weights is FP32 and
  ``x + bf16`` stays FP32), and every matmul saves the BF16 cast of its weight for backward (a copy of
  the layer's weights, 2 bytes per parameter) unless it is recomputed;
* AOTAutograd's min-cut partitioner (compile) recomputes the element-wise ops in backward and with
  torchao FP8 saves the FP8 casts of the linears' inputs (1 byte) instead of their BF16 inputs; with
  the selective AC policy it also recomputes the weight casts.

:data:`TORCHTITAN_BLOCK_SAVED` holds, per (parameter mode, precision kind, compile, recompute), the block's
saved bytes over the minimal count of the same recompute mode and the fraction of the layer's BF16 weight
copies it keeps. Measured on 1x H200 (torch 2.11.0+cu130, torchao 0.17.0, torchtitan 0.2.2, 2026-12-02;
``bench/torchtitan_saved_activations.py``, ``docs/results/engines/torchtitan-saved-activations-h200x1-
2026-12-02/torchtitan-saved-activations.json``; Llama 3.1 8B widths, seq 8192, micro-batch 1 and 2: the
bytes grow exactly linearly in the batch and the weight-sized term is 0 or exactly 2 bytes per layer
parameter). Rowwise FP8 measured the same as tensorwise. ``tests/engines/torchtitan/test_torchtitan_block.py``
re-derives every entry from the JSON. The table was measured on single blocks, not fitted to any
training run.
"""

from __future__ import annotations

from autotune.spec.plan import Plan

#: (param mode, precision kind, compile, recompute) -> (saved bytes / minimal count, BF16 weight copies kept
#: as a fraction of the layer's 2 bytes per parameter); param mode ``autocast`` (FP32 parameters, no FSDP)
#: or ``bf16`` (FSDP2's BF16 compute parameters); precision kind ``bf16`` or ``fp8`` (torchao tensorwise /
#: rowwise). Minimal count: 1,141,899,264 bytes (recompute none) and 521,142,272 (selective, torchtitan's
#: every-second-mm policy) per 8,192-token sequence of the 8B block (autotune.cost.memory).
TORCHTITAN_BLOCK_SAVED: dict[tuple[str, str, bool, str], tuple[float, float]] = {
    ("autocast", "bf16", False, "none"): (1.4996, 1.0),
    ("autocast", "bf16", True, "none"): (1.0588, 1.0),
    ("autocast", "fp8", False, "none"): (1.4996, 0.0),
    ("autocast", "fp8", True, "none"): (0.7356, 0.0),
    ("autocast", "bf16", False, "selective"): (1.1288, 1.0),
    ("autocast", "bf16", True, "selective"): (1.0, 0.0),
    ("autocast", "fp8", False, "selective"): (1.1288, 0.0),
    ("autocast", "fp8", True, "selective"): (1.0, 0.0),
    ("bf16", "bf16", False, "none"): (1.2058, 0.0),
    ("bf16", "bf16", True, "none"): (1.0001, 0.0),
    ("bf16", "fp8", False, "none"): (1.2058, 0.0),
    ("bf16", "fp8", True, "none"): (0.6768, 0.0),
}


def param_mode(plan: Plan) -> str:
    """``bf16`` when torchtitan runs ``plan`` under FSDP2 (its data-parallel shard or context-parallel mesh
    has more than one rank: ``ParallelDims.fsdp_enabled``; the job writer maps ZeRO 2/3 to
    ``data_parallel_shard_degree``), else ``autocast`` (single device / DDP: ``maybe_enable_amp``). TP or
    PP without FSDP runs without mixed precision in torchtitan 0.2.x (FP32 compute); the autocast entries
    are used for it too (not measured)."""
    fsdp = (plan.zero_stage >= 2 and plan.dp_degree > 1) or plan.cp_degree > 1
    return "bf16" if fsdp else "autocast"


def block_factors(plan: Plan) -> tuple[float, float]:
    """(saved bytes over the minimal count, kept fraction of the layer's BF16 weight copies) for ``plan``
    (recompute none or selective). The ``bf16`` parameter mode with selective recompute was not measured:
    the ``autocast`` entry stands in (its selective compiled count equals the minimal one, as the ``bf16``
    mode's compiled count does without recompute), with no weight copies (FSDP's gathered parameters are
    the BF16 weights)."""
    kind = "bf16" if getattr(plan, "precision", "bf16") == "bf16" else "fp8"
    mode = param_mode(plan)
    key = (mode, kind, bool(getattr(plan, "compile", False)), plan.recompute)
    if key in TORCHTITAN_BLOCK_SAVED:
        return TORCHTITAN_BLOCK_SAVED[key]
    ratio, _ = TORCHTITAN_BLOCK_SAVED[("autocast",) + key[1:]]
    return ratio, 0.0


def residual_bytes(plan: Plan) -> int:
    """Bytes per element of the residual stream (block input / output, the embedding output): 4 under
    autocast (FP32 parameters: ``nn.Embedding`` is not an autocast op, and ``x + bf16`` promotes to FP32),
    2 under FSDP2's BF16 parameters."""
    return 4 if param_mode(plan) == "autocast" else 2


__all__ = ["TORCHTITAN_BLOCK_SAVED", "block_factors", "param_mode", "residual_bytes"]
