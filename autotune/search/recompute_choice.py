"""Per-module selective recomputation (Megatron-LM ``--recompute-modules``) as the search knob
``recompute_modules`` (part of :mod:`autotune.search.space`), for mixture-of-experts models only.

A knob value is a string: ``default`` (the engine's default selective set: Megatron-LM's ``core_attn``,
TransformerConfig ``recompute_modules``; the plan's ``recompute_modules`` None) or module names of
:data:`autotune.spec.plan.RECOMPUTE_MODULES` joined by ``+`` (``layernorm+moe_act``), which the plan holds as
a sorted tuple. It is sampled only with ``recompute: selective`` on a mixture-of-experts model whose engine
takes a module list (engine fact ``recompute_modules``: megatron); a dense model's trials never sample it,
so dense studies, layouts and the space fingerprint are unchanged.

Which values can be valid for a model (Megatron-LM at d98e8a64, megatron/core/transformer/transformer_config.py
``__post_init__``: "mla_up_proj in recompute_modules is only supported with multi_latent_attention", and the
modules' meaning in the ``recompute_modules`` docstring): ``mla_up_proj`` needs multi-latent attention, ``mlp``
(the dense MLP) a dense layer, ``shared_experts`` shared experts. The rules that depend on the rest of the plan
(``moe_act`` needs grouped GEMM, not with FP8 delayed scaling; no ``moe`` with the all-to-all overlap) are
:func:`autotune.spec.moe_plan.validate_moe`'s, checked per plan.
"""

from __future__ import annotations

from typing import Any

from autotune.errors import ConfigError
from autotune.spec.plan import RECOMPUTE_MODULES

DEFAULT = "default"


def decode(v: Any) -> tuple[str, ...] | None:
    """The plan's ``recompute_modules`` of knob value ``v`` (a string, or already a tuple / None)."""
    if v is None or v == DEFAULT:
        return None
    if isinstance(v, str):
        return tuple(sorted(set(v.split("+"))))
    return tuple(v)


def encode(mods: tuple[str, ...] | None) -> str:
    """The knob value of a plan's ``recompute_modules``."""
    return DEFAULT if mods is None else "+".join(sorted(mods))


def check_value(x: Any, where: str) -> None:
    """Raise ConfigError unless ``x`` is ``default`` or ``+``-joined names of RECOMPUTE_MODULES, each once, sorted
    (the form :func:`encode` gives, so a plan's value is found among the choices)."""
    if not isinstance(x, str) or (x != DEFAULT and not set(x.split("+")) <= set(RECOMPUTE_MODULES)):
        raise ConfigError(f"{where}: value {x!r} is not 'default' or module names joined by '+' from "
                          f"{', '.join(RECOMPUTE_MODULES)} (Megatron-LM --recompute-modules)")
    if x != DEFAULT and x != encode(decode(x)):
        raise ConfigError(f"{where}: value {x!r}: give each module once, in sorted order ({encode(decode(x))!r})")


def static_reason(v: Any, model: Any, engine: Any) -> str | None:
    """Why knob value ``v`` can never be valid for ``model`` on ``engine`` (None: it can)."""
    mods = decode(v)
    if mods is None:
        return None
    if not model.is_moe:
        return f"recompute_modules={v} is searched for mixture-of-experts models only ({model.name} is dense)"
    if engine is not None and not getattr(engine, "recompute_modules", False):
        return f"engine {engine.name} takes no recompute module list"
    if "mla_up_proj" in mods and not model.is_mla:
        return f"recompute_modules={v}: mla_up_proj needs multi-latent attention ({model.name} has none)"
    if "mlp" in mods and not model.num_dense_layers:
        return f"recompute_modules={v}: mlp recomputes the dense MLP, and every layer of {model.name} is MoE"
    if "shared_experts" in mods and not model.num_shared_experts:
        return f"recompute_modules={v}: {model.name} has no shared experts"
    return None


__all__ = ["DEFAULT", "check_value", "decode", "encode", "static_reason"]
