"""Engine-scoped extra costs of an MoE layer's routed path where the engine runs it in FP32 (torchtitan 0.2.2
without FSDP: :attr:`autotune.spec.engines.EngineProfile.moe_fp32_path_without_fsdp`), its selective-recompute
re-run of the routed experts (``sac_recomputes_routed_experts``) and every-step gradient clipping
(``grad_clip_bytes_per_param``). Sources of the engine facts: autotune/engines/torchtitan/releases.yaml
(release 0.2 overrides). Every term is bytes derived from the layer's shapes over the existing H200 profile's
memory-bound rates (autotune/data/calibration/h200.yaml ``memory_bound_ops``: ``cast`` for dtype conversion,
the generic rate for the index copies, ``adamw`` for the foreach passes over the gradients); nothing is fitted
to the step times of docs/results/engines/torchtitan-moe-profile-h200x1-2026-12-03/."""

from __future__ import annotations

from typing import Any

FP32, BF16 = 4, 2  # bytes per element


def fp32_path(cb: Any) -> bool:
    """The engine runs the routed path in FP32: its fact is set and the plan has no FSDP (ZeRO < 2, or a
    sharding group of one rank: torchtitan applies fully_shard only when dp_shard x cp > 1)."""
    p = cb.p
    if not getattr(cb.engine, "moe_fp32_path_without_fsdp", False):
        return False
    return p.zero_stage < 2 or p.dp_degree * p.cp_degree <= 1


def routed_path_ms(cb: Any, n: float, copies: float, h: int, expert_weight_params: float) -> tuple[float, float]:
    """Extra (forward, backward) ms of one MoE layer per micro-batch on the FP32 routed path, 0 otherwise.

    ``n``: the rank's tokens; ``copies``: its routed token copies (n x top_k, balanced); ``h``: hidden size;
    ``expert_weight_params``: the rank's routed-expert weights of the layer (E/EP experts x 3 h f for a gated
    MLP). Terms (torchtitan v0.2.2 models/moe/moe.py ``_run_experts_grouped_mm``, models/moe/utils.py):

    * permutation in FP32: the base cost model moves the rows as BF16 (2 (n + copies) h x 2 B each way); FP32
      doubles them: + 2 (n + copies) h x 2 B, forward and backward, at the generic memory-bound rate;
    * routed-row casts: ``x.bfloat16()`` before the first grouped GEMM (read 4 B, write 2 B a copy element)
      and ``.type_as(x)`` after the last (read 2, write 4): 2 x 6 copies h B forward; their gradients the same
      backward; at the ``cast`` rate;
    * expert-weight casts: ``w.bfloat16()`` of each projection at every call, per micro-batch: 6 B per weight
      forward (read FP32, write BF16); backward casts the BF16 weight gradient back to FP32 (6 B); ``cast``.
    """
    if not fp32_path(cb):
        return 0.0, 0.0
    costs = cb.costs
    perm = 2 * costs.memory_bound_ms(BF16 * (n + copies) * h)
    rows = cb._memory_bound_ms(2 * (FP32 + BF16) * copies * h, "cast")
    wcast = cb._memory_bound_ms((FP32 + BF16) * expert_weight_params, "cast")
    return perm + rows + wcast, perm + rows + wcast


def saved_weight_copy_bytes(engine: Any, plan: Any, expert_weight_params: float) -> float:
    """Bytes one MoE layer keeps per in-flight micro-batch for its backward on the FP32 routed path (no FSDP,
    no recompute): the BF16 copies ``w.bfloat16()`` makes of the rank's expert weights for each grouped GEMM
    (torchtitan v0.2.2 models/moe/moe.py ``_run_experts_grouped_mm``; autograd saves torch._grouped_mm's BF16
    weight operand for the data gradient), 2 B per weight (``expert_weight_params``: the rank's routed-expert
    weights of the layer). 0 for any other engine, with FSDP (the all-gathered weights are BF16 already) and
    under recompute (selective on an engine whose SAC re-runs the routed experts, or full: re-made in backward).
    Whether inductor's partitioner re-makes the casts in backward under torch.compile instead of saving them
    was not measured (no memory profile): the term is the eager graph's."""
    if not getattr(engine, "moe_fp32_path_without_fsdp", False):
        return 0.0
    if plan.zero_stage >= 2 and plan.dp_degree * plan.cp_degree > 1:
        return 0.0
    rc = plan.recompute
    if rc == "full" or (rc == "selective" and getattr(engine, "sac_recomputes_routed_experts", False)):
        return 0.0
    return BF16 * expert_weight_params


def sac_recompute_ms(cb: Any, routed_fwd_ms: float) -> float:
    """Backward re-run of the routed experts' forward under the engine's selective recompute, ms: the whole
    forward of the routed part (``routed_fwd_ms``: grouped GEMMs, activation, permutation, the FP32 path's
    casts) when the engine's SAC saves none of it (torchtitan v0.2.2 models/qwen3/infra/parallelize.py
    ``_op_sac_save_list`` has no aten._grouped_mm), else 0."""
    p = cb.p
    if p.recompute != "selective" or p.recompute_modules is not None:
        return 0.0
    return routed_fwd_ms if getattr(cb.engine, "sac_recomputes_routed_experts", False) else 0.0


def grad_clip_bytes_per_param(cb: Any) -> int:
    """Bytes per gradient element the engine's every-step gradient clipping moves
    (:attr:`~autotune.spec.engines.EngineProfile.grad_clip_bytes_per_param`), priced with the optimizer pass.
    Only for MoE models: the issue-39 brief keeps every dense prediction where it is (the engine clips
    dense models too; pricing that is left to a dense re-validation)."""
    if not getattr(cb.m, "num_experts", 0):
        return 0
    return int(getattr(cb.engine, "grad_clip_bytes_per_param", 0))


__all__ = ["fp32_path", "routed_path_ms", "saved_weight_copy_bytes", "sac_recompute_ms", "grad_clip_bytes_per_param"]
