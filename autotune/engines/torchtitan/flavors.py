"""Depth-truncated Llama 3 flavours for torchtitan 0.2.x, registered when torchtitan imports this module.

torchtitan 0.2.x builds a model from ``train_spec.model_args[job_config.model.flavor]``
(torchtitan/train.py), and ``train_spec.model_args`` is the dict ``llama3_args`` of
torchtitan/models/llama3/__init__.py. ``--experimental.custom_import autotune.engines.torchtitan.flavors``
(``[experimental] custom_import`` in the job file) makes the trainer import this module first
(torchtitan/train.py, ``Trainer.__init__``), which adds ``<base>_L<n>`` for every release flavour
``8B``, ``70B``, ``405B`` and ``n`` from 1 to its depth: the same widths (dim, heads, KV heads, FFN
multiplier and rounding, vocabulary, RoPE), ``n_layers = n``. A proxy of the full model on fewer GPUs,
as ``autotune run --backend real --layers N`` runs one on autotune's own runtime.

The mixture-of-experts flavours get the same: ``30B-A3B_L<n>`` in ``qwen3_args``
(torchtitan/models/qwen3/__init__.py) and ``16B_L<n>`` in ``deepseekv3_args``
(torchtitan/models/deepseek_v3/__init__.py), ``n_layers = n`` and, for DeepSeek, ``n_dense_layers =
min(n_dense_layers, n)`` (the first layer stays dense); experts, router, MLA ranks and attention
(``flex`` with ``block_causal`` for 16B) are the release flavour's.

Importing it anywhere but in a process that has torchtitan 0.2.x does nothing useful; autotune itself
never imports it.
"""

from __future__ import annotations

import dataclasses

BASES = ("8B", "70B", "405B")
#: the MoE flavours truncated: (torchtitan module, its flavour dict, flavours)
MOE_BASES = (("torchtitan.models.qwen3", "qwen3_args", ("30B-A3B",)),
             ("torchtitan.models.deepseek_v3", "deepseekv3_args", ("16B",)))


def truncated_name(base: str, layers: int) -> str:
    """The flavour name this module registers for ``base`` cut to ``layers`` layers (``8B_L16``)."""
    return f"{base}_L{layers}"


def truncate_args(full, n: int):
    """``full`` (a torchtitan ModelArgs dataclass) with ``n_layers = n``; where it has ``n_dense_layers``
    (DeepSeek) that becomes ``min(n_dense_layers, n)``."""
    kw = {"n_layers": n}
    if hasattr(full, "n_dense_layers"):
        kw["n_dense_layers"] = min(full.n_dense_layers, n)
    return dataclasses.replace(full, **kw)


def register(model_args: dict, bases: tuple[str, ...] = BASES) -> list[str]:
    """Add the truncated flavours of ``bases`` to ``model_args`` (torchtitan's ``llama3_args``,
    ``qwen3_args`` or ``deepseekv3_args``); returns the names added. Existing names are left as they are."""
    added = []
    for base in bases:
        if base not in model_args:
            continue
        full = model_args[base]
        for n in range(1, full.n_layers + 1):
            name = truncated_name(base, n)
            if name not in model_args:
                model_args[name] = truncate_args(full, n)
                added.append(name)
    return added


def _register_installed() -> None:
    """The side effect torchtitan's custom_import asks for: every flavour dict of the installed torchtitan."""
    import importlib

    for module, attr, bases in (("torchtitan.models.llama3", "llama3_args", BASES), *MOE_BASES):
        try:
            args = getattr(importlib.import_module(module), attr, None)
        except ImportError:  # torchtitan missing, or 0.3.x (Python config functions; no flavour dict)
            continue
        if isinstance(args, dict):
            register(args, bases)


_register_installed()
