"""Reduce one torch.profiler Chrome trace (a torchtitan training run, ``bench/engine_smoke/moe_profile.py``) to a
small JSON: per profiled step the GPU kernel time by category and phase, busy/idle time, the largest GPU gaps and
what launched the kernel after each, kernel time by launching aten op, and the top kernels.

    python bench/engine_smoke/reduce_trace.py TRACE.json OUT.json

How a kernel is placed (Kineto's trace: every ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` event carries
``args.correlation``, the id of the ``cuda_runtime`` / ``cuda_driver`` launch call on the host): the launch call's
host thread and time give the enclosing CPU events (``cpu_op``, ``user_annotation``), found by a stack sweep.
Step: the host ``ProfilerStep#N`` span holding the launch call (on any thread). Phase: ``bwd`` if an enclosing event is ``autograd::engine::evaluate_function: ...`` (the autograd engine),
``optim`` inside ``Optimizer.step...`` or ``Optimizer.zero_grad``, else ``fwd`` (forward and loss, gradient
clipping). Category: from the kernel name and its innermost
aten op (:func:`category`).
"""

from __future__ import annotations

import bisect
import json
import re
import sys
from collections import defaultdict

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
HOST_CATS = ("cpu_op", "user_annotation")


def category(kernel: str, op: str, ops: tuple[str, ...]) -> str:
    """A kernel's category from its name, its innermost aten op ``op`` and the enclosing op names ``ops``."""
    k, o = kernel.lower(), op.lower()
    allops = " ".join(ops).lower()
    if "nccl" in k:
        return "nccl"
    if "grouped_mm" in allops or "grouped" in k:
        return "grouped_gemm"
    if any(s in k for s in ("flash", "fmha", "attention", "attn")) or any(
            s in allops for s in ("scaled_dot_product", "flash_attention", "efficient_attention", "flex_attention")):
        return "attention"
    if "optimizer.step" in allops or "_foreach" in o or "multi_tensor_apply" in k or "_foreach" in allops:
        return "optimizer_and_grad_norm"
    if any(s in k for s in ("gemm", "nvjet", "cutlass", "xmma", "cublas", "wgmma", "splitk")) or o in (
            "aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"):
        return "dense_gemm"
    if any(s in o for s in ("index", "gather", "scatter", "take", "masked_select", "nonzero", "put")) or any(
            s in k for s in ("index", "gather", "scatter")):
        return "permute_index_gather_scatter"
    if any(s in o for s in ("sort", "topk", "histc", "cumsum", "bincount")) or any(
            s in k for s in ("sort", "topk", "histogram", "cumsum", "scan")):
        return "routing_sort_topk_hist"
    if o in ("aten::_to_copy", "aten::to", "aten::type_as") or "_to_copy" in k and k.startswith("triton_poi"):
        return "dtype_conversion"
    if "memcpy" in k or "memset" in k or o in ("aten::copy_", "aten::clone", "aten::contiguous", "aten::cat",
                                                  "aten::stack", "aten::vstack", "aten::fill_", "aten::zero_",
                                                  "aten::zeros", "aten::new_zeros", "aten::empty"):
        return "copy_fill"
    return "other_elementwise_reduction"


def _ms(us: float) -> float:
    return round(us / 1e3, 3)


def reduce(trace: dict) -> dict:
    ev = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    host = defaultdict(list)      # tid -> [(ts, end, name, cat)]
    launches = {}                 # correlation -> (tid, ts, name, dur)
    gpu = []
    for e in ev:
        c = e.get("cat", "")
        if c in HOST_CATS:
            host[(e.get("pid"), e.get("tid"))].append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)),
                                                       e.get("name", ""), c))
        elif c in LAUNCH_CATS:
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launches[corr] = ((e.get("pid"), e.get("tid")), float(e["ts"]), e.get("name", ""),
                                  float(e.get("dur", 0)))
        elif c in GPU_CATS:
            gpu.append(e)
    # enclosing host events of each launch: per thread, a sweep over host events sorted by start
    by_tid = defaultdict(list)
    for corr, (tid, ts, _n, _d) in launches.items():
        by_tid[tid].append((ts, corr))
    ctx = {}
    for tid, ls in by_tid.items():
        hs = sorted(host.get(tid, []), key=lambda h: (h[0], -h[1]))
        ls.sort()
        stack, i = [], 0
        for ts, corr in ls:
            while i < len(hs) and hs[i][0] <= ts:
                while stack and stack[-1][1] <= hs[i][0]:
                    stack.pop()
                stack.append(hs[i])
                i += 1
            while stack and stack[-1][1] < ts:
                stack.pop()
            # the stack may hold events that ended before ts under one that did not: filter
            ctx[corr] = tuple(h for h in stack if h[1] >= ts)
    # host ProfilerStep spans
    steps = sorted({(h[0], h[1], h[2]) for hs in host.values() for h in hs if h[2].startswith("ProfilerStep#")})
    kern = []
    for e in gpu:
        corr = (e.get("args") or {}).get("correlation")
        st = ctx.get(corr, ())
        names = tuple(h[2] for h in st)
        lts = launches[corr][1] if corr in launches else None
        # the step whose host span holds the launch call (any thread: backward runs on autograd's thread)
        step = next((n for a0, a1, n in steps if lts is not None and a0 <= lts <= a1), None)
        if any(n.startswith("autograd::engine::evaluate_function") for n in names):
            phase = "bwd"
        elif any(n.startswith("Optimizer.") for n in names):
            phase = "optim"
        else:
            phase = "fwd"
        aten = [h[2] for h in st if h[3] == "cpu_op"]
        op = aten[-1] if aten else ""
        top = next((n for n in names if n.startswith("autograd::engine::evaluate_function")), aten[0] if aten else "")
        name = e.get("name", "")
        kern.append({"ts": float(e["ts"]), "end": float(e["ts"]) + float(e.get("dur", 0)), "dur": float(e.get("dur", 0)),
                     "name": name, "op": op, "top": top, "phase": phase, "step": step,
                     "cat": category(name, op, tuple(aten))})
    out = {"steps": {}, "notes": "times in ms; per step: kernels launched inside that host ProfilerStep"}
    for s0, s1, sname in steps:
        ks = sorted((k for k in kern if k["step"] == sname), key=lambda k: k["ts"])
        if not ks:
            continue
        busy, cur0, cur1 = 0.0, None, None
        gaps = []
        prev_end = None
        for k in ks:
            if prev_end is not None and k["ts"] - prev_end > 500.0:
                gaps.append({"gap_ms": _ms(k["ts"] - prev_end), "at_ms": _ms(k["ts"] - ks[0]["ts"]),
                             "next_kernel": k["name"][:90], "next_op": k["op"], "next_top": k["top"][:90],
                             "next_phase": k["phase"]})
            if cur1 is None or k["ts"] > cur1:
                if cur1 is not None:
                    busy += cur1 - cur0
                cur0, cur1 = k["ts"], k["end"]
            else:
                cur1 = max(cur1, k["end"])
            prev_end = cur1
        busy += cur1 - cur0
        span = ks[-1]["end"] - ks[0]["ts"]
        bycat = defaultdict(float)
        bycatph = defaultdict(float)
        byop = defaultdict(lambda: [0.0, 0])
        bytop = defaultdict(float)
        byk = defaultdict(lambda: [0.0, 0])
        for k in ks:
            bycat[k["cat"]] += k["dur"]
            bycatph[f'{k["cat"]}/{k["phase"]}'] += k["dur"]
            key = f'{k["phase"]} {k["op"] or "(no aten op)"}'
            byop[key][0] += k["dur"]
            byop[key][1] += 1
            bytop[k["top"][:100] or "(none)"] += k["dur"]
            kn = re.sub(r"\s+", " ", k["name"])[:140]
            byk[(kn, k["cat"], k["phase"])][0] += k["dur"]
            byk[(kn, k["cat"], k["phase"])][1] += 1
        out["steps"][sname] = {
            "host_step_ms": _ms(s1 - s0), "gpu_span_ms": _ms(span), "kernel_busy_ms": _ms(busy),
            "kernel_sum_ms": _ms(sum(k["dur"] for k in ks)), "gpu_idle_in_host_step_ms": _ms((s1 - s0) - busy),
            "kernels": len(ks),
            "by_category_ms": {c: _ms(v) for c, v in sorted(bycat.items(), key=lambda x: -x[1])},
            "by_category_phase_ms": {c: _ms(v) for c, v in sorted(bycatph.items(), key=lambda x: -x[1])},
            "by_phase_ms": {p: _ms(sum(k["dur"] for k in ks if k["phase"] == p)) for p in ("fwd", "bwd", "optim")},
            "by_aten_op_top40": [{"op": o, "ms": _ms(v[0]), "kernels": v[1]}
                                 for o, v in sorted(byop.items(), key=lambda x: -x[1][0])[:40]],
            "by_autograd_node_top30": [{"node": o, "ms": _ms(v)}
                                       for o, v in sorted(bytop.items(), key=lambda x: -x[1])[:30]],
            "top_kernels_25": [{"kernel": kn, "cat": c, "phase": p, "ms": _ms(v[0]), "count": v[1]}
                               for (kn, c, p), v in sorted(byk.items(), key=lambda x: -x[1][0])[:25]],
            "gaps_over_0.5ms_top20": sorted(gaps, key=lambda g: -g["gap_ms"])[:20],
            "gaps_over_0.5ms_total_ms": round(sum(g["gap_ms"] for g in gaps), 3),
            "gaps_over_0.5ms_count": len(gaps),
        }
        hs = [h for hh in host.values() for h in hh if s0 <= h[0] <= s1]
        out["steps"][sname]["host_launch_calls"] = sum(1 for c, (tid, ts, n, d) in launches.items() if s0 <= ts <= s1)
        out["steps"][sname]["host_launch_call_ms"] = _ms(sum(d for c, (tid, ts, n, d) in launches.items()
                                                             if s0 <= ts <= s1))
        out["steps"][sname]["host_events"] = len(hs)
    out["unassigned_kernel_ms"] = _ms(sum(k["dur"] for k in kern if k["step"] is None))
    return out


def main(argv: list[str] | None = None) -> int:
    a = sys.argv[1:] if argv is None else argv
    if len(a) != 2:
        print("usage: reduce_trace.py TRACE.json OUT.json", file=sys.stderr)
        return 2
    with open(a[0]) as f:
        trace = json.load(f)
    out = reduce(trace)
    with open(a[1], "w") as f:
        json.dump(out, f, indent=1)
    for s, d in out["steps"].items():
        print(s, {k: d[k] for k in ("host_step_ms", "gpu_span_ms", "kernel_busy_ms", "gpu_idle_in_host_step_ms",
                                    "kernels", "by_phase_ms")})
        print("  ", d["by_category_ms"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
