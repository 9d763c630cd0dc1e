"""The Optuna parameters of a plan: what :meth:`autotune.search.space.BoundSearchSpace.suggest` samples for it
(moved from ``search/space.py``, which re-exports :func:`plan_params`)."""

from __future__ import annotations

from typing import Any

from autotune.search import recompute_choice as rc
from autotune.spec.plan import Plan


def plan_params(plan: Plan, *, moe: bool = False) -> dict[str, Any]:
    """The Optuna params that :meth:`BoundSearchSpace.suggest` would sample for ``plan`` (``moe``: the plan is
    of a mixture-of-experts model, whose trials also sample :data:`autotune.search.space.MOE_KNOBS`).

    Only the knobs the conditional sampling reads for this plan are included (for ``enqueue_trial``).
    """
    g = plan.dp_degree * plan.cp_degree
    p: dict[str, Any] = {"tp_degree": plan.tp_degree, "pp_degree": plan.pp_degree, "cp_degree": plan.cp_degree}
    if plan.pp_degree > 1:
        p["pipeline_schedule"] = plan.pipeline_schedule
        if plan.pipeline_schedule == "interleaved_1f1b":
            p["vpp_degree"] = plan.vpp_degree
    p["micro_batch_size"] = plan.micro_batch_size
    if plan.tp_degree > 1:
        p["sequence_parallel"] = plan.sequence_parallel
    p["recompute"] = plan.recompute
    if g > 1:
        p["zero_stage"] = plan.zero_stage
    p["async_collectives"] = plan.async_collectives
    if plan.tp_degree > 1 and plan.async_collectives:
        p["tp_comm_overlap"] = plan.tp_comm_overlap
    if g > 1 and plan.async_collectives:
        p["dp_grad_reduce_overlap"] = plan.dp_grad_reduce_overlap
        if plan.dp_grad_reduce_overlap and plan.zero_stage >= 1:
            p["param_gather_overlap"] = plan.param_gather_overlap
    if g > 1:
        p["bucket_size_mib"] = plan.bucket_size_mib
    p["memory_reclaim"] = plan.memory_reclaim
    p["precision"] = plan.precision
    p["compile"] = plan.compile
    if plan.tp_degree == 1 and plan.pp_degree == 1:
        p["loss_impl"] = plan.loss_impl
    if plan.pp_degree == 1 and plan.recompute == "none":
        p["cpu_offload_layers"] = plan.cpu_offload_layers
    if plan.precision != "bf16":
        p["fp8_param_gather"] = plan.fp8_param_gather
        if g > 1:
            p["grad_reduce_in_bf16"] = plan.grad_reduce_in_bf16
    if moe:
        p["ep_degree"] = plan.ep_degree
        p["etp_degree"] = plan.etp_degree
        if plan.ep_degree * plan.etp_degree > 1:
            p["moe_dispatcher"] = plan.moe_dispatcher
        if plan.ep_degree > 1 and plan.async_collectives:
            p["moe_a2a_overlap"] = plan.moe_a2a_overlap
        if plan.recompute == "selective":
            p["recompute_modules"] = rc.encode(plan.recompute_modules)
    return p


__all__ = ["plan_params"]
