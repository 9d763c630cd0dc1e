"""Timing harness and kernel measurements (torch imported lazily, inside functions).

Method (every measurement): ``warmup`` untimed runs, then ``repeats`` timed runs, each on fresh random
inputs made by ``torch.randn`` before the run (never zeros: zero operands let the GPU skip work and
lower its clocks' power draw, and reused inputs sit in L2); the result is the median. On CUDA each run
is bracketed by CUDA events on the current stream (``Event.elapsed_time``, ms); on CPU by
``time.perf_counter`` (so unit tests can run the harness with tiny shapes).

Shapes and FLOP conventions are those of :mod:`autotune.profiling.store`.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from autotune.errors import NoGPUError
from autotune.profiling.shapes import AttentionShape
from autotune.profiling.store import EnvironmentInfo

NO_GPU_MESSAGE = "no CUDA GPU found: autotune profile needs an NVIDIA GPU"


@dataclass(frozen=True)
class Timing:
    """Median of ``repeats`` timed runs, ms; ``samples_ms`` all of them in order."""

    median_ms: float
    repeats: int
    samples_ms: tuple[float, ...]


def require_cuda() -> None:
    """Raise :class:`NoGPUError` when torch or a CUDA GPU is missing."""
    try:
        import torch
    except ImportError:
        raise NoGPUError(NO_GPU_MESSAGE + " (and torch is not installed)") from None
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        raise NoGPUError(NO_GPU_MESSAGE)


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


#: GPU cycles of the ``torch.cuda._sleep`` kernel queued before the timed runs with ``queue_ahead``
#: (~50 ms at the H200's 1980 MHz boost clock, KINDS.md 2026-10-28 reading): time for the host to queue
#: every timed run, so each event pair measures GPU time only
QUEUE_AHEAD_CYCLES = 100_000_000


def time_op(fn: Callable[..., Any], *, setup: Callable[[], Sequence[Any]] | None = None,
            device: str = "cuda", warmup: int = 3, repeats: int = 10,
            max_seconds: float | None = None, queue_ahead: bool = False) -> Timing:
    """Time ``fn(*setup())``: ``warmup`` untimed runs then ``repeats`` timed runs; the median, ms.

    ``setup`` (untimed) is called before every run and returns fn's arguments (fresh random inputs).
    ``max_seconds`` caps the timed runs to about that much time (at least 3 runs) once the first
    warm-up run's duration is known. ``device`` ``cuda`` (CUDA events) or ``cpu`` (perf_counter).
    ``queue_ahead`` (CUDA only): a ``torch.cuda._sleep`` kernel of :data:`QUEUE_AHEAD_CYCLES` runs before
    the timed runs, so the host has queued them all before the first starts and host-side overhead
    (a ``torch.compile`` wrapper's guards, eager launches) stays out of the event pairs. Without it, an
    op whose host overhead exceeds its kernel time is timed at the host's rate (seen on H200,
    2026-12-01: compiled RMSNorm of 8192 x 4096 read 98 us against 46 us eager).

    Raises:
        ValueError: repeats < 1 or warmup < 0.
    """
    import torch

    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    cuda = str(device).startswith("cuda")

    def once() -> float:
        args = tuple(setup()) if setup is not None else ()
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args)
            end.record()
            end.synchronize()
            ms = float(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn(*args)
            ms = (time.perf_counter() - t0) * 1e3
        del args
        return ms

    first = None
    for i in range(warmup):
        t = once()
        first = t if first is None else first
    if max_seconds is not None:
        first = first if first is not None else once()
        repeats = max(min(3, repeats), min(repeats, int(max_seconds * 1e3 / max(first, 1e-6))))
    if not cuda:
        samples = tuple(once() for _ in range(repeats))
        return Timing(median_ms=statistics.median(samples), repeats=repeats, samples_ms=samples)
    # On the GPU the timed runs go back to back: every run's fresh inputs are made first, then the runs
    # are queued with an event pair around each and one synchronization at the end. A host sync between
    # runs leaves the GPU idle between kernels, its clocks drop, and isolated runs read up to 2x slower
    # than the same kernel inside a training step (seen on H200 for flash attention, 2026-11-30).
    arg_sets = [tuple(setup()) if setup is not None else () for _ in range(repeats)]
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in arg_sets]
    torch.cuda.synchronize()
    if queue_ahead:
        torch.cuda._sleep(QUEUE_AHEAD_CYCLES)
    for args, (start, end) in zip(arg_sets, events):
        start.record()
        fn(*args)
        end.record()
    torch.cuda.synchronize()
    samples = tuple(float(a.elapsed_time(b)) for a, b in events)
    del arg_sets
    return Timing(median_ms=statistics.median(samples), repeats=repeats, samples_ms=samples)


def _dtype(device: str, dtype: Any = None) -> Any:
    import torch

    if dtype is not None:
        return dtype
    return torch.bfloat16 if str(device).startswith("cuda") else torch.float32


def measure_gemm(m: int, n: int, k: int, *, device: str = "cuda", dtype: Any = None, warmup: int = 3,
                 repeats: int = 10, passes: Sequence[str] = ("fwd", "dgrad", "wgrad"),
                 max_seconds: float | None = 2.0) -> dict[str, Timing]:
    """Time the three GEMMs of ``nn.Linear`` with input x (m x k) and weight W (n x k), BF16 on CUDA.

    fwd ``F.linear(x, W)`` (m x n); dgrad ``dY @ W`` (m x k); wgrad ``dY^T @ x`` (n x k); each 2 m n k FLOPs.
    Returns pass -> :class:`Timing`.
    """
    import torch
    import torch.nn.functional as F

    dt = _dtype(device, dtype)

    def rnd(*shape: int) -> Any:
        return torch.randn(*shape, device=device, dtype=dt)

    plans = {
        "fwd": (lambda x, w: F.linear(x, w), lambda: (rnd(m, k), rnd(n, k))),
        "dgrad": (lambda dy, w: dy @ w, lambda: (rnd(m, n), rnd(n, k))),
        "wgrad": (lambda dy, x: dy.t() @ x, lambda: (rnd(m, n), rnd(m, k))),
    }
    out = {}
    with torch.no_grad():
        for p in passes:
            fn, setup = plans[p]
            out[p] = time_op(fn, setup=setup, device=device, warmup=warmup, repeats=repeats,
                             max_seconds=max_seconds)
    return out


def measure_attention(shape: AttentionShape, *, device: str = "cuda", dtype: Any = None,
                      force_flash: bool | None = None, warmup: int = 2, repeats: int = 10,
                      max_seconds: float | None = 3.0) -> tuple[Timing, Timing]:
    """Time causal ``scaled_dot_product_attention`` forward and backward; (fwd, bwd) timings.

    Layout (batch, heads, seq, head_dim). GQA: K and V are made with the full query-head count (the
    repeat-KV formulation; a flash kernel does the same work per query head either way). By default PyTorch's SDPA dispatch
    picks the kernel, as in training; ``force_flash=True`` forces the flash backend
    (``sdpa_kernel(SDPBackend.FLASH_ATTENTION)``; an unsupported shape raises
    rather than silently timing another kernel). Backward is ``o.backward(dO)`` after an untimed forward.
    """
    import contextlib

    import torch
    import torch.nn.functional as F

    dt = _dtype(device, dtype)
    b, s, h, d = shape.batch, shape.seq_len, shape.heads, shape.head_dim
    if force_flash is None:
        # Default: PyTorch's own SDPA dispatch, i.e. the kernel the runtime's Llama model gets in training
        # (forcing the flash backend measured ~290 TFLOP/s for causal fwd+bwd at seq 8192 on H200 with
        # torch 2.11, 2026-11-30, about half the probe's default-dispatch figure).
        force_flash = False
    ctx: Any = contextlib.nullcontext()
    if force_flash:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        ctx = sdpa_kernel(SDPBackend.FLASH_ATTENTION)

    def qkv(grad: bool) -> tuple[Any, Any, Any]:
        return tuple(torch.randn(b, h, s, d, device=device, dtype=dt, requires_grad=grad) for _ in range(3))

    def fwd_setup():
        return qkv(False)

    def bwd_setup():
        q, k, v = qkv(True)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return o, torch.randn_like(o)

    with ctx:
        with torch.no_grad():
            fwd = time_op(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                          setup=fwd_setup, device=device, warmup=warmup, repeats=repeats, max_seconds=max_seconds)
        bwd = time_op(lambda o, do: o.backward(do), setup=bwd_setup, device=device, warmup=warmup,
                      repeats=repeats, max_seconds=max_seconds)
    return fwd, bwd


def memory_op_nbytes(spec: Mapping[str, Any], *, elem_size: int = 2) -> int:
    """Bytes a memory-bound op moves (reads + writes; :data:`autotune.profiling.shapes.MEMORY_OPS`),
    activations of ``elem_size`` bytes (2 for BF16), AdamW states fp32.

    Raises:
        ValueError: unknown op.
    """
    op, es = spec["op"], elem_size
    if op == "copy":
        return 2 * int(spec["numel"]) * es
    if op == "rmsnorm":
        return 2 * int(spec["tokens"]) * int(spec["hidden"]) * es
    if op == "rope":
        T, H, d = int(spec["tokens"]), int(spec["heads"]), int(spec["head_dim"])
        return (2 * T * H * d + 2 * T * d) * es
    if op == "swiglu":
        return 3 * int(spec["tokens"]) * int(spec["ffn"]) * es
    if op == "cross_entropy":
        return int(spec["tokens"]) * int(spec["vocab"]) * es + 8 * int(spec["tokens"])
    if op == "adamw":
        return 28 * int(spec["numel"])
    raise ValueError(f"unknown memory-bound op {op!r}; valid: copy, rmsnorm, rope, swiglu, cross_entropy, adamw")


def measure_memory_op(spec: Mapping[str, Any], *, device: str = "cuda", dtype: Any = None, warmup: int = 3,
                      repeats: int = 10) -> tuple[int, Timing]:
    """Time one memory-bound op (see :data:`autotune.profiling.shapes.MEMORY_OPS`); (bytes moved, timing).

    ``spec`` has ``op`` and its sizes: copy ``numel``; rmsnorm ``tokens, hidden``; rope ``tokens, heads,
    head_dim``; swiglu ``tokens, ffn``; cross_entropy ``tokens, vocab``; adamw ``numel`` (fp32 params;
    ``torch.optim.AdamW`` fused on CUDA, foreach on CPU).

    Raises:
        ValueError: unknown op.
    """
    import torch
    import torch.nn.functional as F

    dt = _dtype(device, dtype)
    es = torch.tensor([], dtype=dt).element_size()
    op = spec["op"]

    def rnd(*shape: int, dtype: Any = dt) -> Any:
        return torch.randn(*shape, device=device, dtype=dtype)

    with torch.no_grad():
        if op == "copy":
            n = int(spec["numel"])
            out = torch.empty(n, device=device, dtype=dt)
            t = time_op(lambda x: out.copy_(x), setup=lambda: (rnd(n),), device=device, warmup=warmup,
                        repeats=repeats)
            return memory_op_nbytes(spec, elem_size=es), t
        if op == "rmsnorm":
            T, h = int(spec["tokens"]), int(spec["hidden"])
            w = rnd(h)
            t = time_op(lambda x: F.rms_norm(x, (h,), w, eps=1e-5), setup=lambda: (rnd(T, h),), device=device,
                        warmup=warmup, repeats=repeats)
            return memory_op_nbytes(spec, elem_size=es), t
        if op == "rope":
            T, H, d = int(spec["tokens"]), int(spec["heads"]), int(spec["head_dim"])

            def rope(x, cos, sin):
                x1, x2 = x.chunk(2, dim=-1)
                return x * cos + torch.cat((-x2, x1), dim=-1) * sin

            t = time_op(rope, setup=lambda: (rnd(T, H, d), rnd(T, 1, d), rnd(T, 1, d)), device=device,
                        warmup=warmup, repeats=repeats)
            return memory_op_nbytes(spec, elem_size=es), t
        if op == "swiglu":
            T, f = int(spec["tokens"]), int(spec["ffn"])
            t = time_op(lambda g, u: F.silu(g) * u, setup=lambda: (rnd(T, f), rnd(T, f)), device=device,
                        warmup=warmup, repeats=repeats)
            return memory_op_nbytes(spec, elem_size=es), t
        if op == "cross_entropy":
            T, V = int(spec["tokens"]), int(spec["vocab"])
            t = time_op(lambda x, y: F.cross_entropy(x, y),
                        setup=lambda: (rnd(T, V), torch.randint(0, V, (T,), device=device)), device=device,
                        warmup=warmup, repeats=repeats)
            return memory_op_nbytes(spec, elem_size=es), t
    if op == "adamw":
        n = int(spec["numel"])
        p = torch.nn.Parameter(torch.randn(n, device=device, dtype=torch.float32))
        cuda = str(device).startswith("cuda")
        opt = torch.optim.AdamW([p], lr=1e-4, fused=True) if cuda else torch.optim.AdamW([p], lr=1e-4, foreach=True)

        def setup():
            p.grad = torch.randn(n, device=device, dtype=torch.float32)
            return ()

        t = time_op(opt.step, setup=setup, device=device, warmup=warmup, repeats=repeats)
        return memory_op_nbytes(spec, elem_size=es), t
    raise ValueError(f"unknown memory-bound op {op!r}; valid: copy, rmsnorm, rope, swiglu, cross_entropy, adamw")


# ----------------------------------------------------------------------------- FP8 GEMMs
#: largest finite float8_e4m3fn value (OCP FP8 spec, E4M3: 448), the target of dynamic scaling
E4M3_MAX = 448.0


def fp8_pass_dims(m: int, n: int, k: int) -> dict[str, tuple[int, int, int]]:
    """(M, N, K) of the ``_scaled_mm`` each pass of ``nn.Linear`` (x: m x k, W: n x k) runs:
    fwd ``x @ W^T`` (m, n, k); dgrad ``dY @ W`` (m, k, n); wgrad ``dY^T @ x`` (n, k, m); 2 m n k FLOPs each."""
    return {"fwd": (m, n, k), "dgrad": (m, k, n), "wgrad": (n, k, m)}


def measure_gemm_fp8(m: int, n: int, k: int, *, scaling: str = "tensorwise", device: str = "cuda",
                     warmup: int = 3, repeats: int = 10, passes: Sequence[str] = ("fwd", "dgrad", "wgrad"),
                     max_seconds: float | None = 2.0) -> dict[str, Timing]:
    """Time the three GEMMs of an FP8 ``nn.Linear`` (forward shape (m, n, k)) with ``torch._scaled_mm``.

    Operands are float8_e4m3fn (cast from fresh ``randn`` BF16, untimed); A (M x K) row-major, B (K x N)
    column-major (made as the transpose of an N x K row-major tensor: cuBLASLt's FP8 GEMM takes only the
    "TN" layout, which ``_scaled_mm`` enforces); output BF16. Scales FP32: ``tensorwise`` one scalar per
    operand; ``rowwise`` A's per row (M x 1) and B's per column (1 x N). ``use_fast_accum`` as torchao's
    default ``Float8LinearConfig`` (torchao/float8/config.py: ``gemm_config_output`` fast accumulation on,
    ``gemm_config_grad_input`` / ``gemm_config_grad_weight`` off): True for fwd, False for dgrad and wgrad.
    Pass dims as :func:`fp8_pass_dims`. Returns pass -> :class:`Timing`.

    Raises:
        ValueError: unknown ``scaling`` or a dimension not divisible by 16 (``_scaled_mm``'s requirement).
    """
    import torch

    if scaling not in ("tensorwise", "rowwise"):
        raise ValueError(f"unknown FP8 scaling {scaling!r}; valid: tensorwise, rowwise")
    if m % 16 or n % 16 or k % 16:
        raise ValueError(f"FP8 GEMM {m}x{n}x{k}: torch._scaled_mm needs every dimension divisible by 16")
    f8 = torch.float8_e4m3fn
    hp = _dtype(device)

    def setup_for(M: int, N: int, K: int) -> Callable[[], tuple[Any, ...]]:
        def setup() -> tuple[Any, ...]:
            a = torch.randn(M, K, device=device, dtype=hp).to(f8)
            b = torch.randn(N, K, device=device, dtype=hp).to(f8).t()        # K x N, column-major
            if scaling == "tensorwise":
                sa = torch.rand((), device=device, dtype=torch.float32) + 0.5
                sb = torch.rand((), device=device, dtype=torch.float32) + 0.5
            else:
                sa = torch.rand(M, 1, device=device, dtype=torch.float32) + 0.5
                sb = torch.rand(1, N, device=device, dtype=torch.float32) + 0.5
            return a, b, sa, sb
        return setup

    out = {}
    dims = fp8_pass_dims(m, n, k)
    with torch.no_grad():
        for p in passes:
            fast = p == "fwd"

            def fn(a, b, sa, sb, fast=fast):
                return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                        use_fast_accum=fast)

            out[p] = time_op(fn, setup=setup_for(*dims[p]), device=device, warmup=warmup, repeats=repeats,
                             max_seconds=max_seconds)
    return out


# ----------------------------------------------------------------------------- FP8 quantization
#: stages of dynamic FP8 quantization and the bytes each is charged per element of the BF16 tensor
#: (the convention of ``quantize`` in a calibration profile): amax reads 2; scale is one scalar/row
#: (charged 0: its time is launch-bound); cast reads 2 and writes 1; total = amax + scale + cast = 5
QUANTIZE_STAGE_BYTES = {"amax": 2, "scale": 0, "cast": 3, "total": 5}


def quantize_fns(scaling: str) -> dict[str, Callable[..., Any]]:
    """The dynamic-scaling FP8 quantization of a BF16 tensor, by stage (torchao's recipe:
    torchao/float8/float8_utils.py ``tensor_to_amax``, ``amax_to_scale`` = ``float8_max / clamp(amax,
    EPS)`` and ``to_fp8_saturated`` = ``(x * scale).clamp(-max, max).to(e4m3)``; ``tensorwise`` one amax
    over the tensor, ``rowwise`` one per row (``keepdim``, torchao's axiswise granularity over dim -1)).

    Returns ``{"amax": f(x), "scale": f(amax), "cast": f(x, scale), "total": f(x)}``; ``total`` returns
    (e4m3 tensor, FP32 inverse scale) as torchao's Float8Tensor keeps them.

    Raises:
        ValueError: unknown ``scaling``.
    """
    import torch

    if scaling not in ("tensorwise", "rowwise"):
        raise ValueError(f"unknown FP8 scaling {scaling!r}; valid: tensorwise, rowwise")
    f8 = torch.float8_e4m3fn

    def amax(x):
        if scaling == "tensorwise":
            return torch.max(torch.abs(x)).to(torch.float32)
        return torch.amax(torch.abs(x), dim=-1, keepdim=True).to(torch.float32)

    def scale(a):
        return E4M3_MAX / torch.clamp(a, min=1e-12)

    def cast(x, sc):
        return (x.to(torch.float32) * sc).clamp(-E4M3_MAX, E4M3_MAX).to(f8)

    def total(x):
        sc = scale(amax(x))
        return cast(x, sc), sc.reciprocal()

    return {"amax": amax, "scale": scale, "cast": cast, "total": total}


def measure_quantize(rows: int, cols: int, *, scaling: str = "tensorwise", compiled: bool = False,
                     stages: Sequence[str] = ("amax", "scale", "cast", "total"), device: str = "cuda",
                     warmup: int = 3, repeats: int = 10) -> dict[str, tuple[int, Timing]]:
    """Time dynamic FP8 quantization (:func:`quantize_fns`) of a fresh ``rows x cols`` BF16 tensor.

    ``compiled``: each stage function wrapped in ``torch.compile(dynamic=False)`` and called once
    before timing (compile time excluded); timed with ``queue_ahead`` (:func:`time_op`: GPU time, host
    overhead hidden, as in a step where the host runs ahead). Returns stage -> (bytes charged, :class:`Timing`), bytes =
    :data:`QUANTIZE_STAGE_BYTES` x rows x cols.

    Raises:
        ValueError: unknown ``scaling`` or stage.
    """
    import torch

    bad = [s for s in stages if s not in QUANTIZE_STAGE_BYTES]
    if bad:
        raise ValueError(f"unknown quantize stage(s) {bad}; valid: {', '.join(QUANTIZE_STAGE_BYTES)}")
    fns = quantize_fns(scaling)
    hp = _dtype(device)
    numel = rows * cols

    def x_only():
        return (torch.randn(rows, cols, device=device, dtype=hp),)

    def amax_only():
        return (fns["amax"](torch.randn(rows, cols, device=device, dtype=hp)),)

    def x_and_scale():
        x = torch.randn(rows, cols, device=device, dtype=hp)
        return x, fns["scale"](fns["amax"](x))

    setups = {"amax": x_only, "scale": amax_only, "cast": x_and_scale, "total": x_only}
    out: dict[str, tuple[int, Timing]] = {}
    with torch.no_grad():
        for st in stages:
            fn = fns[st]
            if compiled:
                fn = torch.compile(fn, dynamic=False)
                fn(*setups[st]())                      # compile now, outside the timing
            t = time_op(fn, setup=setups[st], device=device, warmup=warmup, repeats=repeats, queue_ahead=True)
            out[st] = (QUANTIZE_STAGE_BYTES[st] * numel, t)
    return out


# ----------------------------------------------------------------------------- block ops, eager vs compiled
def block_op_nbytes(spec: Mapping[str, Any]) -> int:
    """Bytes charged to a transformer-block op (:data:`autotune.profiling.shapes.BLOCK_OPS`, the cost
    model's counts in :meth:`autotune.cost.graph.StepGraph._layer_cost`), BF16 activations.

    Raises:
        ValueError: unknown op.
    """
    op = spec["op"]
    T, h = int(spec["tokens"]), int(spec["hidden"])
    if op == "rmsnorm":
        return 4 * T * h
    if op == "rope":
        d = int(spec["head_dim"])
        return 4 * T * (int(spec["heads"]) + int(spec["kv_heads"])) * d
    if op == "swiglu":
        return 6 * T * int(spec["ffn"])
    if op == "residual":
        return 6 * T * h
    if op == "cast":
        return 12 * T * h
    if op == "norm_residual":
        return 10 * T * h
    raise ValueError(f"unknown block op {op!r}; valid: rmsnorm, rope, swiglu, residual, cast, norm_residual")


def block_op_fn(spec: Mapping[str, Any], *, device: str = "cuda",
                dtype: Any = None) -> tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]:
    """(function, setup making fresh random inputs) of a block op; the kernels are the eager ones of
    :func:`measure_memory_op` (``F.rms_norm`` with weight, eps 1e-5; RoPE ``x cos + rotate_half(x) sin``
    with cos/sin (T, 1, d) in the activation dtype as autotune/runtime/model.py ``apply_rope`` casts
    them; ``F.silu(g) * u``).

    Raises:
        ValueError: unknown op.
    """
    import torch
    import torch.nn.functional as F

    op = spec["op"]
    block_op_nbytes(spec)                               # validates the op name
    dt = _dtype(device, dtype)
    T, h, f = int(spec["tokens"]), int(spec["hidden"]), int(spec["ffn"])
    H, Hk, d = int(spec["heads"]), int(spec["kv_heads"]), int(spec["head_dim"])

    def rnd(*shape: int, dtype: Any = dt) -> Any:
        return torch.randn(*shape, device=device, dtype=dtype)

    w = rnd(h)

    def rope1(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    if op == "rmsnorm":
        return (lambda x: F.rms_norm(x, (h,), w, eps=1e-5)), (lambda: (rnd(T, h),))
    if op == "rope":
        return ((lambda q, k, cos, sin: (rope1(q, cos, sin), rope1(k, cos, sin))),
                (lambda: (rnd(T, H, d), rnd(T, Hk, d), rnd(T, 1, d), rnd(T, 1, d))))
    if op == "swiglu":
        return (lambda g, u: F.silu(g) * u), (lambda: (rnd(T, f), rnd(T, f)))
    if op == "residual":
        return (lambda x, y: x + y), (lambda: (rnd(T, h), rnd(T, h)))
    if op == "cast":
        low = torch.float32 if dt != torch.float32 else torch.float64
        return ((lambda x16, x32: (x16.to(low), x32.to(dt))),
                (lambda: (rnd(T, h), rnd(T, h, dtype=low))))

    def norm_residual(x, y):
        r = x + y
        return r, F.rms_norm(r, (h,), w, eps=1e-5)

    return norm_residual, (lambda: (rnd(T, h), rnd(T, h)))


def measure_block_op(spec: Mapping[str, Any], *, compiled: bool = False, device: str = "cuda",
                     dtype: Any = None, warmup: int = 3, repeats: int = 10) -> tuple[int, Timing]:
    """Time a block op (:func:`block_op_fn`) eagerly or under ``torch.compile(dynamic=False)`` (called
    once before timing, so compile time is excluded), with ``queue_ahead`` (:func:`time_op`) in both modes
    so the host-side cost of a compiled call's guards is not charged to its kernels; (bytes charged by
    :func:`block_op_nbytes`, timing).

    Raises:
        ValueError: unknown op.
    """
    import torch

    fn, setup = block_op_fn(spec, device=device, dtype=dtype)
    with torch.no_grad():
        if compiled:
            fn = torch.compile(fn, dynamic=False)
            fn(*setup())
        t = time_op(fn, setup=setup, device=device, warmup=warmup, repeats=repeats, queue_ahead=True)
    return block_op_nbytes(spec), t


# ----------------------------------------------------------------------------- reclaim (subprocess)
def _reclaim_worker(gib: float, repeats: int) -> dict[str, float]:
    """In this process: free ``gib`` GiB of cached blocks, time ``empty_cache()`` and the re-allocation."""
    import torch

    chunk_sizes = [64 << 20, 96 << 20, 128 << 20, 256 << 20, 512 << 20]  # mixed sizes, like activations
    total = int(gib * 2**30)
    sizes, acc, i = [], 0, 0
    while acc < total:
        sizes.append(chunk_sizes[i % len(chunk_sizes)])
        acc += sizes[-1]
        i += 1

    def alloc():
        return [torch.empty(s, dtype=torch.uint8, device="cuda") for s in sizes]

    ec, al = [], []
    for r in range(repeats + 1):
        bufs = alloc()
        torch.cuda.synchronize()
        del bufs
        t0 = time.perf_counter()
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        bufs = alloc()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        del bufs
        if r:  # the first round is warm-up (context, allocator init)
            ec.append((t1 - t0) * 1e3)
            al.append((t2 - t1) * 1e3 / (acc / 2**30))
    torch.cuda.empty_cache()
    return {"empty_cache_ms": statistics.median(ec), "alloc_ms_per_gib": statistics.median(al), "nbytes": acc}


def subprocess_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with the directory holding the ``autotune``
    package prepended to ``PYTHONPATH``, so ``python -m autotune...`` works from any working directory."""
    from pathlib import Path

    import autotune

    env = dict(os.environ if base is None else base)
    root = str(Path(autotune.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root] + [x for x in env.get("PYTHONPATH", "").split(os.pathsep) if x])
    return env


def measure_reclaim(*, expandable_segments: bool, gib: float = 4.0, repeats: int = 5,
                    timeout_s: float = 120.0) -> dict[str, float]:
    """``empty_cache()`` ms and re-allocation ms/GiB after it, in a subprocess whose
    ``PYTORCH_CUDA_ALLOC_CONF`` is ``expandable_segments:True`` or ``False`` (the allocator reads it once
    at start-up, hence the subprocess).

    Raises:
        RuntimeError: the subprocess failed (its stderr tail in the message).
    """
    env = subprocess_env()
    env["PYTORCH_CUDA_ALLOC_CONF"] = f"expandable_segments:{'True' if expandable_segments else 'False'}"
    cmd = [sys.executable, "-m", "autotune.profiling.measure", "reclaim", "--gib", str(gib),
           "--repeats", str(repeats)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    if p.returncode != 0:
        raise RuntimeError(f"reclaim subprocess exited {p.returncode}: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- environment
def _driver_version() -> str:
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        if p.returncode == 0 and p.stdout.strip():
            return p.stdout.strip().splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def torchao_version() -> str:
    """torchao's version, or ``none`` when it is not installed (recorded with a profile; the profiler's
    own FP8 measurements use ``torch._scaled_mm`` directly)."""
    try:
        from importlib.metadata import version

        return version("torchao")
    except Exception:  # noqa: BLE001 - not installed
        return "none"


def detect_environment(*, gpu_count: int | None = None) -> EnvironmentInfo:
    """The current CUDA environment (GPU 0's name; ``gpu_count`` defaults to all visible GPUs).

    Raises:
        NoGPUError: no CUDA GPU.
    """
    require_cuda()
    import datetime as dt

    import torch

    try:
        nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001 - builds without NCCL
        nccl = "none"
    return EnvironmentInfo(gpu_name=torch.cuda.get_device_name(0),
                           gpu_count=int(gpu_count or torch.cuda.device_count()), driver=_driver_version(),
                           torch=str(torch.__version__), cuda=str(torch.version.cuda), nccl=nccl,
                           hostname=socket.gethostname(), date=dt.date.today().isoformat())


def _main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m autotune.profiling.measure")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reclaim", help="time empty_cache and re-allocation (reads PYTORCH_CUDA_ALLOC_CONF)")
    r.add_argument("--gib", type=float, default=4.0)
    r.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    if a.cmd == "reclaim":
        require_cuda()
        print(json.dumps(_reclaim_worker(a.gib, a.repeats)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
