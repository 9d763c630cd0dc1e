"""Model converters of the native runtime: float8 training through torchao, ``torch.compile`` per block, and
async tensor parallelism. Moved from ``parallelize.py``.
"""

from __future__ import annotations

import dataclasses

import torch.nn as nn

from autotune.errors import PlanError
from autotune.runtime.model import Llama

#: torchao ``Float8LinearConfig.from_recipe_name`` recipe per plan precision
#: (torchao 0.17.0 ``torchao/float8/config.py`` ``Float8LinearRecipeName``).
FLOAT8_RECIPES = {"fp8_tensorwise": "tensorwise", "fp8_rowwise": "rowwise"}

#: Precisions this runtime refuses, with the reason.
REFUSED_PRECISIONS = {
    "fp8_delayed": ("torchao float8 training has dynamic scaling only (torchao 0.17.0 ScalingType: DYNAMIC, "
                    "DISABLED; delayed scaling was removed), and delayed scaling is Transformer Engine's "
                    "recipe (engine megatron); use precision=fp8_tensorwise or fp8_rowwise"),
    "mxfp8": ("MXFP8 (torchao.prototype.mx_formats, Blackwell tensor cores) is not wired into this runtime; "
              "use precision=fp8_tensorwise or fp8_rowwise, or simulate it with --engine torchtitan"),
}

#: Linear modules kept in BF16 under FP8 (torchtitan ``float8.md``: ``filter_fqns=["output"]``).
FLOAT8_SKIP_FQNS = ("output",)
#: further block linears kept BF16 per ``Plan.fp8_bf16_linears`` (module names in runtime/model.py)
FLOAT8_BF16_LINEARS = {"none": (), "kv": ("attention.wk", "attention.wv"),
                       "attention": ("attention.wq", "attention.wk", "attention.wv", "attention.wo")}

#: torchao versions this runtime was run with (``../shared/device/fetch-wheels.sh``; design.md, 2026-12-01).
TORCHAO_TESTED = "0.17.0"


def torchao_available() -> bool:
    """True when ``torchao`` can be imported (looked up without importing it)."""
    import importlib.util
    return importlib.util.find_spec("torchao") is not None


def check_precision_support(precision: str, *, device_type: str) -> None:
    """Refuse a ``precision`` this runtime cannot honor on ``device_type`` (``cpu`` / ``cuda``).

    ``bf16`` always runs; ``fp8_tensorwise`` / ``fp8_rowwise`` need torchao (the ``gpu`` extra) and, on
    CUDA, compute capability >= 8.9 (checked in :func:`parallelize`, where the device is known);
    ``fp8_delayed`` and ``mxfp8`` are refused (:data:`REFUSED_PRECISIONS`).

    Raises:
        PlanError: naming the precision, why, and what is valid.
    """
    if precision == "bf16":
        return
    if precision in REFUSED_PRECISIONS:
        raise PlanError(f"precision={precision} cannot be honored by the native runtime: "
                        f"{REFUSED_PRECISIONS[precision]}")
    if precision not in FLOAT8_RECIPES:
        raise PlanError(f"precision={precision!r} is unknown; the native runtime runs bf16, "
                        f"{', '.join(FLOAT8_RECIPES)}")
    if not torchao_available():
        raise PlanError(f"precision={precision} needs torchao (float8 training), which is not installed: "
                        f"pip install -e '.[gpu]' (in the autotune checkout) (torchao=={TORCHAO_TESTED}); or use precision=bf16")


def float8_config(precision: str, *, emulate: bool = False):
    """The torchao ``Float8LinearConfig`` of a plan precision.

    Args:
        precision: ``fp8_tensorwise`` (one scale per tensor, dynamic) or ``fp8_rowwise`` (one scale per
            row, power-of-2 scales) -> ``Float8LinearConfig.from_recipe_name`` of :data:`FLOAT8_RECIPES`.
        emulate: torchao's emulation (high-precision matmuls on FP8-rounded operands; CPU tests).

    Raises:
        PlanError: any other precision (see :func:`check_precision_support`), or torchao missing.
    """
    check_precision_support(precision, device_type="cpu" if emulate else "cuda")
    from torchao.float8 import Float8LinearConfig
    cfg = Float8LinearConfig.from_recipe_name(FLOAT8_RECIPES[precision])
    return dataclasses.replace(cfg, emulate=True) if emulate else cfg


def float8_module_filter(module: nn.Module, fqn: str, skip: tuple[str, ...] = ()) -> bool:
    """Whether a module becomes a torchao ``Float8Linear``: an ``nn.Linear`` whose in and out features
    are multiples of 16 (``torch._scaled_mm``; torchtitan ``quantization/utils.py`` ``module_filter_fn``)
    and whose name is not in :data:`FLOAT8_SKIP_FQNS` (the LM head stays BF16)."""
    if not isinstance(module, nn.Linear):
        return False
    if any(fqn == s or fqn.endswith("." + s) for s in FLOAT8_SKIP_FQNS + tuple(skip)):
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def apply_float8(model: nn.Module, precision: str, *, emulate: bool = False, bf16_linears: str = "none") -> list[str]:
    """Swap the model's eligible linears for torchao ``Float8Linear`` (in place).

    Args:
        model: a :class:`Llama` (or chunk), before TP / FSDP (torchtitan converts at build time).
        precision: ``fp8_tensorwise`` or ``fp8_rowwise``; emulate: see :func:`float8_config`.
        bf16_linears: a key of :data:`FLOAT8_BF16_LINEARS` (block linears left BF16, ``Plan.fp8_bf16_linears``).

    Returns:
        Names of the converted modules (``layers.0.attention.wq`` ...).

    Raises:
        PlanError: precision not runnable here (:func:`check_precision_support`).
    """
    cfg = float8_config(precision, emulate=emulate)
    from torchao.float8 import convert_to_float8_training
    if FLOAT8_RECIPES[precision] == "rowwise":
        # torchtitan float8.py: "short-term solution for pytorch/pytorch#150859"
        import torch._inductor.config as inductor_config
        inductor_config.emulate_precision_casts = True
    if bf16_linears not in FLOAT8_BF16_LINEARS:
        raise PlanError(f"fp8_bf16_linears={bf16_linears!r}; valid: {', '.join(FLOAT8_BF16_LINEARS)}")
    skip = FLOAT8_BF16_LINEARS[bf16_linears]
    convert_to_float8_training(model, config=cfg,
                               module_filter_fn=lambda m, fqn: float8_module_filter(m, fqn, skip))
    from torchao.float8.float8_linear import Float8Linear
    return [n for n, m in model.named_modules() if isinstance(m, Float8Linear)]


def apply_compile(model: Llama, mode: str = "default") -> int:
    """``torch.compile`` each transformer block in place (``nn.Module.compile(fullgraph=True)``, default
    inductor backend: torchtitan ``apply_compile``), in inductor ``mode`` (``default`` or
    ``max-autotune-no-cudagraphs``: ``Plan.compile_mode``). Returns the number of blocks compiled."""
    n = 0
    kw = {} if mode == "default" else {"mode": mode}
    for blk in model.layers.values():
        blk.compile(fullgraph=True, **kw)
        n += 1
    return n


#: ``Plan.attention_backend`` -> the SDPA backends left enabled (``torch.backends.cuda.enable_*_sdp``);
#: ``default`` touches nothing (PyTorch's dispatch order: cuDNN, flash, efficient, math on Hopper with
#: torch 2.11, ``torch/csrc/.../sdp_utils.cpp`` ``priority_order``)
SDPA_BACKENDS = {"cudnn": ("cudnn",), "flash": ("flash",)}


def set_attention_backend(backend: str) -> str:
    """Restrict SDPA to ``backend`` for this process (global flags: the worker runs one plan per process;
    torch.compile reads them when it traces the blocks). Returns what was set, for ``honored``.

    Raises:
        PlanError: an unknown backend."""
    import torch
    if backend == "default":
        return "SDPA default dispatch"
    if backend not in SDPA_BACKENDS:
        raise PlanError(f"attention_backend={backend!r}; valid: default, {', '.join(SDPA_BACKENDS)}")
    on = SDPA_BACKENDS[backend]
    torch.backends.cuda.enable_cudnn_sdp("cudnn" in on)
    torch.backends.cuda.enable_flash_sdp("flash" in on)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_math_sdp(False)
    return f"SDPA {backend} only"


def enable_async_tp(tp_mesh) -> str:
    """Turn on inductor's async-TP pass for ``tp_mesh``'s group (torchtitan ``_maybe_enable_async_tp``):
    ``enable_symm_mem_for_group(group_name)`` and ``torch._inductor.config._micro_pipeline_tp = True``.
    Returns the group name."""
    import warnings

    import torch._inductor.config as inductor_config
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group
    name = tp_mesh.get_group().group_name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        enable_symm_mem_for_group(name)
    inductor_config._micro_pipeline_tp = True
    return name
