"""Depth-truncated Llama 3 flavours for torchtitan 0.2.x, registered when torchtitan imports this module.

torchtitan 0.2.x builds a model from ``train_spec.model_args[job_config.model.flavor]``
(torchtitan/train.py), and ``train_spec.model_args`` is the dict ``llama3_args`` of
torchtitan/models/llama3/__init__.py. ``--experimental.custom_import autotune.engines.torchtitan.flavors``
(``[experimental] custom_import`` in the job file) makes the trainer import this module first
(torchtitan/train.py, ``Trainer.__init__``), which adds ``<base>_L<n>`` for every release flavour
``8B``, ``70B``, ``405B`` and ``n`` from 1 to its depth: the same widths (dim, heads, KV heads, FFN
multiplier and rounding, vocabulary, RoPE), ``n_layers = n``. A proxy of the full model on fewer GPUs,
as ``autotune run --backend real --layers N`` runs one on autotune's own runtime.

Importing it anywhere but in a process that has torchtitan 0.2.x does nothing useful; autotune itself
never imports it.
"""

from __future__ import annotations

import dataclasses

BASES = ("8B", "70B", "405B")


def truncated_name(base: str, layers: int) -> str:
    """The flavour name this module registers for ``base`` cut to ``layers`` layers (``8B_L16``)."""
    return f"{base}_L{layers}"


def register(model_args: dict) -> list[str]:
    """Add the truncated flavours of :data:`BASES` to ``model_args`` (torchtitan's ``llama3_args``);
    returns the names added. Existing names are left as they are."""
    added = []
    for base in BASES:
        if base not in model_args:
            continue
        full = model_args[base]
        for n in range(1, full.n_layers + 1):
            name = truncated_name(base, n)
            if name not in model_args:
                model_args[name] = dataclasses.replace(full, n_layers=n)
                added.append(name)
    return added


try:  # the side effect torchtitan's custom_import asks for
    from torchtitan.models.llama3 import llama3_args as _LLAMA3_ARGS  # type: ignore[import-not-found]
except ImportError:  # torchtitan missing, or 0.3.x (Python config functions; no flavour dict)
    _LLAMA3_ARGS = None
if isinstance(_LLAMA3_ARGS, dict):
    register(_LLAMA3_ARGS)
