"""torchtitan 0.2.2 mixture-of-experts job files (part of :mod:`autotune.engines.torchtitan.importer`,
``simulate --from-torchtitan``): the qwen3 / deepseek_v3 flavours as autotune models and the MoE settings of a
TOML job file. Expert parallelism itself (``parallelism.expert_parallel_degree``,
``expert_tensor_parallel_degree``) is read with the other degrees in the importer."""

from __future__ import annotations

from typing import Any

from autotune.engines.torchtitan.export import MOE_FLAVORS
from autotune.errors import ConfigError


def _q(v: object) -> str:
    from autotune.files import excerpt
    return excerpt(repr(v))


#: torchtitan 0.2.2 mixture-of-experts flavours (torchtitan/models/qwen3/__init__.py ``qwen3_args``,
#: torchtitan/models/deepseek_v3/__init__.py ``deepseekv3_args`` at tag v0.2.2) -> the built-in model with the
#: same costed fields, and what differs in fields the cost model does not read. deepseek_v3 671B has no
#: multi-token prediction module in 0.2.2 (model/args.py has no MTP field), so it is DeepSeek-V3 without MTP.
#: The two flavours autotune also exports and runs take their (module, flavour) names from
#: :data:`autotune.engines.torchtitan.export.MOE_FLAVORS`, the one place they are written.
_EXPORTED = {name: (module, flavour) for name, (module, flavour, _) in MOE_FLAVORS.items()}
MOE_TOML_FLAVORS = {
    _EXPORTED["qwen3-30b-a3b"]: ("qwen3-30b-a3b", "qwen3 30B-A3B: torchtitan's flavour has max_seq_len 262144 where the HF "
                           "config has 40960 (not costed); costed as the built-in qwen3-30b-a3b"),
    ("qwen3", "235B-A22B"): ("qwen3-235b-a22b", "qwen3 235B-A22B: torchtitan's flavour has rope_theta 5e6 and "
                             "max_seq_len 4096 where the HF config has 1e6 and 40960 (neither is costed); costed as "
                             "the built-in qwen3-235b-a22b"),
    _EXPORTED["deepseek-16b"]: ("deepseek-16b", None),
    ("deepseek_v3", "671B"): ("deepseek-v3", "deepseek_v3 671B: no multi-token prediction module in torchtitan 0.2.2 "
                              "(costed without it); norm_eps 1e-5 (model/args.py default) where the HF config has "
                              "1e-6 (not costed)"),
}
#: qwen3 ``debugmodel_moe`` of torchtitan 0.2.2 (qwen3/__init__.py): vocab 2048, dim 256, 8 layers, 16/8 heads
#: of 128 with q/k norms, hidden_dim 3072, 64 experts of moe_inter_dim 768, top-8, no shared expert, rope 1e6
QWEN3_DEBUG_MOE = dict(hidden_size=256, num_layers=8, num_heads=16, num_kv_heads=8, ffn_hidden_size=3072,
                       vocab_size=2048, head_dim=128, rope_theta=1e6, norm_eps=1e-6, max_seq_len=4096, qk_norm=True,
                       num_experts=64, moe_top_k=8, moe_ffn_hidden_size=768)


def moe_flavor_model(name: str, flavor: Any, source: str):
    """The ModelSpec of torchtitan 0.2.2's ``[model] name`` / ``flavor`` for a mixture of experts (qwen3,
    deepseek_v3: :data:`MOE_TOML_FLAVORS`, ``debugmodel_moe``).

    Raises:
        ConfigError: a flavour autotune has no model for, naming the ones it has.
    """
    import dataclasses

    from autotune.spec.models import ModelSpec, get_builtin_model
    if (name, flavor) == ("qwen3", "debugmodel_moe"):
        return ModelSpec(name="torchtitan-qwen3-debugmodel_moe", **QWEN3_DEBUG_MOE)
    if (name, flavor) not in MOE_TOML_FLAVORS:
        known = [f for n, f in MOE_TOML_FLAVORS if n == name] + (["debugmodel_moe"] if name == "qwen3" else [])
        raise ConfigError(f"{source}: {name} flavour {_q(flavor)}: autotune simulates the {name} mixture-of-experts "
                          f"flavours {', '.join(known)} (dense {name} flavours are not autotune models)")
    m = get_builtin_model(MOE_TOML_FLAVORS[name, flavor][0])
    if m.mtp_num_layers:        # 0.2.2 builds no multi-token prediction module
        m = dataclasses.replace(m, name=f"{m.name}-no-mtp", mtp_num_layers=0)
    return m


def moe_flavor_note(name: str, flavor: Any) -> str | None:
    """What differs between torchtitan's flavour and the built-in model it is costed as (not costed), or None."""
    return MOE_TOML_FLAVORS.get((name, flavor), (None, None))[1]


def moe_toml_settings(flat: dict, get, ignored: list, approx: list) -> None:
    """The MoE settings of a 0.2.2 job file: ``[quantize.grouped_mm.float8]`` / ``mx`` take effect only with
    their converter in ``model.converters`` (model/converter.py registry); ``training.debug_moe_force_load_balance``
    (balanced routing, as the cost model routes) or its absence (the router as trained: listed as approximated)."""
    for key in [k for k in flat if k.startswith("quantize.grouped_mm.")]:
        sec = ".".join(key.split(".")[:3])      # a converter named here was refused with the converters
        get(key, None)
        ignored.append((f"{key} = {_q(flat[key])}", f"no effect without {sec} in model.converters"))
    if not get("training.debug_moe_force_load_balance", False):
        approx.append("routing as trained (no training.debug_moe_force_load_balance): costed balanced, each expert "
                      "the mean tokens")


__all__ = ["MOE_TOML_FLAVORS", "QWEN3_DEBUG_MOE", "moe_flavor_model", "moe_flavor_note", "moe_toml_settings"]
