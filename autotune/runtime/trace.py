"""Where a real step's GPU time goes: a torch.profiler trace of one step, summarized by category.

:func:`profile_step` runs one training step under ``torch.profiler`` (CPU + CUDA activities) and
returns :func:`summarize`'s dict. It is what ``worker --profile-dir`` writes per rank and what the
fidelity work compares the simulator's per-op costs against.

Categories are assigned to each CUDA *kernel* by its name, by the first matching rule of
:data:`CATEGORY_RULES` (profiler user annotations such as ``FSDP::all_gather`` or
``Optimizer.step#AdamW.step`` span kernels and are skipped, so nothing is counted twice).
"""

from __future__ import annotations

from typing import Any, Callable

#: (category, substrings of the lower-cased kernel name, or ATen operator name on CPU), first match wins.
CATEGORY_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("collective", ("nccl",)),
    ("attention", ("flash", "fmha", "sdpa", "attention")),
    ("gemm", ("nvjet", "gemm", "cutlass", "xmma", "aten::mm", "aten::addmm", "aten::bmm")),
    ("optimizer", ("multi_tensor_apply", "adam", "_foreach_")),
    ("cross_entropy", ("softmax", "nll_loss", "cross_entropy")),
    ("cast_copy", ("copy", "cast", "catarray", "chunk_cat", "split_with_sizes", "index", "embedding")),
    ("reduction", ("reduce_kernel", "reduce")),
    ("elementwise", ("elementwise", "aten::")),
)


def categorize(name: str) -> str:
    """Category of a kernel (or, on CPU, ATen operator) name (see :data:`CATEGORY_RULES`); ``other`` if none."""
    low = name.lower()
    for cat, keys in CATEGORY_RULES:
        if any(k in low for k in keys):
            return cat
    return "other"


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``[start, end)`` intervals (µs in, ms out)."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total / 1e3


def summarize(prof: Any, wall_ms: float, *, top: int = 40) -> dict[str, Any]:
    """Summarize a finished ``torch.profiler.profile`` of one step.

    Returns (times in ms): ``wall_ms``; ``kernel_ms`` (sum of all kernel durations);
    ``busy_ms`` (union of kernel intervals, all streams); ``compute_busy_ms`` (union of non-collective
    kernels); ``collective_busy_ms``; ``exposed_collective_ms`` (busy minus compute busy: collective
    time with no compute kernel beside it); ``idle_ms`` (wall minus busy: the GPU waited for the host);
    ``by_category`` (kernel ms per category); ``top_ops`` (``[kernel name (160 chars), category, ms, calls]``,
    the ``top`` largest kernels by total time); ``source``: ``cuda kernels``, or on a CPU
    run ``cpu operators (self time)`` (ATen operators' self CPU time laid end to end).
    """
    from torch.autograd import DeviceType

    kernels: list[tuple[str, float, float]] = []          # (category, start us, end us)
    by_op: dict[str, list[float]] = {}
    events = list(prof.events())
    for ev in events:
        if ev.device_type != DeviceType.CUDA or getattr(ev, "is_user_annotation", False):
            continue
        cat = categorize(ev.name)
        kernels.append((cat, ev.time_range.start, ev.time_range.end))
        rec = by_op.setdefault(ev.name[:160], [0.0, 0])
        rec[0] += (ev.time_range.end - ev.time_range.start) / 1e3
        rec[1] += 1
    source = "cuda kernels"
    if not kernels:
        # CPU run: no kernels; each ATen operator's self CPU time stands in (busy = their sum)
        source = "cpu operators (self time)"
        t = 0.0
        for ev in events:
            if ev.device_type != DeviceType.CPU or not ev.name.startswith("aten::"):
                continue
            d = ev.self_cpu_time_total
            kernels.append((categorize(ev.name), t, t + d))
            t += d
            rec = by_op.setdefault(ev.name, [0.0, 0])
            rec[0] += d / 1e3
            rec[1] += 1
    by_cat: dict[str, float] = {}
    for cat, s, e in kernels:
        by_cat[cat] = by_cat.get(cat, 0.0) + (e - s) / 1e3
    busy = _union_ms([(s, e) for _, s, e in kernels])
    comp = _union_ms([(s, e) for c, s, e in kernels if c != "collective"])
    coll = _union_ms([(s, e) for c, s, e in kernels if c == "collective"])
    ops = sorted(by_op.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "source": source, "wall_ms": wall_ms,
        "kernel_ms": sum((e - s) / 1e3 for _, s, e in kernels),
        "busy_ms": busy, "compute_busy_ms": comp, "collective_busy_ms": coll,
        "exposed_collective_ms": busy - comp, "idle_ms": max(0.0, wall_ms - busy),
        "by_category": dict(sorted(by_cat.items(), key=lambda kv: -kv[1])),
        "top_ops": [[name, categorize(name), round(v[0], 3), int(v[1])] for name, v in ops],
    }


def profile_step(step: Callable[[], Any], *, sync: Callable[[], None]) -> tuple[Any, dict[str, Any]]:
    """Run ``step()`` once under ``torch.profiler`` (CPU + CUDA) and summarize it.

    Args:
        step: one training step (returns the loss, passed through).
        sync: device synchronize (called before and after, so the wall time covers the kernels).

    Returns:
        ``(step's return value, summarize(...) dict)``.
    """
    import time

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        sync()
        t0 = time.perf_counter()
        out = step()
        sync()
        wall_ms = (time.perf_counter() - t0) * 1e3
    return out, summarize(prof, wall_ms)
