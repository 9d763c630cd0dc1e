"""A plan's expert-parallel settings against a mixture-of-experts model (part of
:func:`autotune.spec.plan.validate_plan`; split from :mod:`autotune.spec.plan`)."""

from __future__ import annotations

from typing import Any

from autotune.errors import PlanError


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _valid_eps(plan: Any, model: Any) -> list[int]:
    """EP degrees that divide the routed experts and, with the plan's ETP, fold over tp x cp x dp."""
    ranks = plan.tp_degree * plan.cp_degree * plan.dp_degree
    return [e for e in _divisors(max(1, model.num_experts))
            if ranks % (e * plan.etp_degree) == 0]


def validate_moe(plan: Any, model: Any) -> list[str]:
    """Check a plan's expert-parallel settings against the model (part of :func:`validate_plan`).

    Rules (Megatron-LM at d98e8a64: megatron/training/arguments.py ``validate_args``, TransformerConfig and
    ModelParallelConfig ``__post_init__``, megatron/core/transformer/moe/moe_layer.py):

    * a dense model takes no EP / ETP / all-to-all overlap;
    * EP divides the routed experts, and EP x ETP divides tp x cp x dp (the folding, arXiv 2504.14960);
    * ETP divides the expert FFN width;
    * TP > 1 needs sequence parallelism (``MoELayer.forward`` raises without it);
    * ``moe_a2a_overlap`` (``--overlap-moe-expert-parallel-comm``) needs EP > 1, the ``alltoall`` or ``flex``
      dispatcher, no full recompute and no ``moe`` in the recompute modules, at most one MTP layer and,
      with PP > 1, interleaved virtual stages;
    * ``recompute_modules`` with ``moe_act`` needs grouped GEMM, ``mla_up_proj`` needs multi-latent attention;
      ``moe_act`` / ``layernorm`` not with FP8 delayed scaling (TransformerConfig ``__post_init__``);
    * ZeRO-2/3 (FSDP) with experts is not costed by autotune (the published MoE runs use the distributed
      optimizer, ZeRO-1).

    Returns:
        Warnings for settings with no effect.

    Raises:
        PlanError: the first rule broken, naming the value and what would be valid.
    """
    warn: list[str] = []
    if plan.precision == "fp8_delayed" and plan.recompute_modules and {"moe_act", "layernorm"} & set(plan.recompute_modules):
        # megatron/core/transformer/transformer_config.py (d98e8a64) __post_init__: "Delayed scaling does not
        # support moe_act and layernorm recompute for fp8."
        raise PlanError(f"recompute_modules {list(plan.recompute_modules)} with precision fp8_delayed: Megatron-LM's "
                        "delayed scaling does not support moe_act and layernorm recompute; use fp8_tensorwise / "
                        "mxfp8 or other modules")
    moe_set = [f"{k}={getattr(plan, k)}" for k, d in (("ep_degree", 1), ("etp_degree", 1), ("moe_a2a_overlap", False))
               if getattr(plan, k) != d]
    if not getattr(model, "num_experts", 0):
        if moe_set:
            raise PlanError(f"{', '.join(moe_set)} needs a mixture-of-experts model; {model.name} is dense "
                            f"(no routed experts): use ep_degree=1, etp_degree=1, moe_a2a_overlap=false")
        if plan.recompute_modules and {"moe", "moe_act", "shared_experts"} & set(plan.recompute_modules):
            warn.append(f"recompute_modules {list(plan.recompute_modules)}: the MoE modules have no effect on "
                        f"the dense model {model.name}")
        if plan.recompute_modules and "mla_up_proj" in plan.recompute_modules:
            raise PlanError(f"recompute_modules mla_up_proj needs multi-latent attention; {model.name} has none "
                            "(Megatron-LM refuses it)")
        return warn
    E, ep, etp = model.num_experts, plan.ep_degree, plan.etp_degree
    ranks = plan.tp_degree * plan.cp_degree * plan.dp_degree
    if E % ep or ranks % (ep * etp):
        why = (f"does not divide the {E} routed experts of {model.name}" if E % ep else
               f"x etp_degree={etp} does not divide tp x cp x dp = {ranks} (experts are folded over those ranks)")
        raise PlanError(f"ep_degree={ep} {why}; valid ep_degree here: {_valid_eps(plan, model) or 'none'}")
    if model.moe_ffn_hidden_size % etp:
        raise PlanError(f"etp_degree={etp} does not divide the expert FFN width {model.moe_ffn_hidden_size}; "
                        f"valid etp_degree: {[d for d in _divisors(model.moe_ffn_hidden_size) if ranks % d == 0][:12]}")
    if plan.tp_degree > 1 and not plan.sequence_parallel:
        raise PlanError(f"tp_degree={plan.tp_degree} on the MoE model {model.name} needs sequence_parallel=true "
                        "(Megatron-LM's MoELayer.forward raises without sequence parallelism when TP > 1)")
    if plan.zero_stage >= 2 and plan.dp_degree * plan.cp_degree > 1:
        raise PlanError(f"zero_stage={plan.zero_stage} (FSDP) with routed experts is not costed; use zero_stage 0 "
                        "or 1 (the distributed optimizer, what the published MoE runs use)")
    if plan.moe_a2a_overlap:
        bad = []
        if ep == 1:
            bad.append("ep_degree > 1")
        if plan.moe_dispatcher not in ("alltoall", "flex"):
            bad.append(f"moe_dispatcher alltoall or flex (not {plan.moe_dispatcher})")
        if plan.recompute == "full" or (plan.recompute_modules and "moe" in plan.recompute_modules):
            bad.append("no full recompute and no 'moe' recompute module")
        if model.mtp_num_layers > 1:
            bad.append(f"at most 1 MTP layer (the model has {model.mtp_num_layers})")
        if plan.pp_degree > 1 and not (plan.pipeline_schedule == "interleaved_1f1b" and plan.vpp_degree > 1):
            bad.append("interleaved virtual stages (vpp_degree > 1) with pp_degree > 1")
        if bad:
            raise PlanError("moe_a2a_overlap=true (Megatron-LM --overlap-moe-expert-parallel-comm) needs "
                            + "; ".join(bad))
    if plan.recompute_modules:
        if "moe_act" in plan.recompute_modules and not plan.moe_grouped_gemm:
            raise PlanError("recompute_modules moe_act needs moe_grouped_gemm=true (Megatron-LM's rule)")
        if "mla_up_proj" in plan.recompute_modules and not model.is_mla:
            raise PlanError(f"recompute_modules mla_up_proj needs multi-latent attention; {model.name} has none")
    if ep == 1 and etp == 1 and plan.moe_dispatcher != "alltoall":
        warn.append(f"moe_dispatcher={plan.moe_dispatcher} has no effect with ep_degree=1 and etp_degree=1 "
                    "(no token leaves its rank)")
    if plan.tp_comm_overlap and plan.tp_degree > 1 and (model.is_mla or not model.num_shared_experts):
        warn.append("tp_comm_overlap has no effect in the cost model for this MoE model's layers (the overlap "
                    "mechanisms are modelled on a standard layer's QKV, proj, fc1 and fc2 GEMMs)")
    return warn


__all__ = ["validate_moe"]
