"""Benchmark (one GPU): compute slowdown under overlapped "communication", and the caching allocator's reserve.

Standalone: imports only torch, triton (part a) and the standard library, so it runs on a bare GPU host.

Part a -- GEMM contention (``contention`` in the JSON)
    BF16 GEMMs ``y[M,N] = x[M,K] @ w[N,K]^T`` of the tensor-parallel shards of Llama 3.1 70B / 405B
    (M = 8192 tokens per micro-batch; N, K from hidden 8192 / 16384, FFN 28672 / 53248, divided by TP),
    plus one FP8 (e4m3, per-tensor scale, ``torch._scaled_mm``) shape where that op works, are timed

    * alone, and
    * concurrently with a "background" kernel on a second CUDA stream (both streams default priority):
      - ``reduceN``: a Triton kernel launched with grid = N programs (one CTA per SM, so it holds N SMs,
        like an NCCL / userbuffers kernel with N channels), each program streaming ``c = a + b`` over
        64 MiB bf16 buffers in a grid-stride loop (a reduce-scatter's local reduction, without the
        link); N in {8, 16, 24, 32, 64}.
      - ``spinN``: a Triton kernel of N programs that only does register arithmetic (no memory
        traffic): the SM-occupancy part of the contention on its own; N in {16, 32}.
      - ``copy_all``: back-to-back ``dst.copy_(src)`` of 512 MiB (torch's copy kernel, all SMs).
      - ``h2d``: back-to-back host-to-device copies of 256 MiB pinned memory (copy engine, no SMs:
        the PCIe / host stream case, e.g. CPU offload or a transfer staged through host memory).

    Timing: CUDA events around every GEMM, 3 warm-ups, median of ``--reps`` (default 30) GEMMs.
    Phase A (GEMM under contention): the background work is enqueued first and sized (from its
    stand-alone rate) to last >= 2.5x the GEMM window; the row records ``covered`` = the background
    started before the first timed GEMM and ended after the last (re-tried with more work if not).
    Phase B (background bandwidth under contention): the background is enqueued first and sized to
    ~max(20 ms, 8 GEMMs); enough GEMMs follow on the other stream to outlast it (checked); bandwidth =
    bytes / background time. Bandwidth units: GB/s = 1e9 bytes/s; for ``reduceN`` bytes are HBM bytes
    read + written (3 x buffer bytes per pass), for ``copy_all`` read + written (2x), for ``h2d`` bytes
    moved over the host link.
    Reported per case: GEMM ms alone and under contention, slowdown = contended / alone, background
    GB/s alone and under contention, SMs the background holds (0 for the copy engine).

Part b -- allocator reserve (``allocator`` in the JSON)
    Each (pattern, policy) runs in its own subprocess (so the allocator settings and caches don't
    mix); policy ``expandable_segments`` sets ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``,
    the others leave it unset; ``empty_cache_per_step`` / ``_per_microbatch`` call
    ``torch.cuda.empty_cache()`` after each optimizer step / each micro-batch's backward.
    Patterns: ``llama``: a Llama-like stack in plain torch (RMSNorm in fp32, GQA attention through
    ``F.scaled_dot_product_attention`` with RoPE and repeated K/V, SwiGLU MLP, tied-off LM head with
    vocab 128256, fp32 cross-entropy) at hidden 4096, 32 heads / 8 KV heads, FFN 14336, seq 8192,
    micro-batch 1, bf16 params and grads with fp32 master weights and fp32 AdamW (foreach), 2
    micro-batches per step, 3 steps; ``llama_recompute``: the same with every block checkpointed;
    ``synthetic``: 3000 allocations of log-uniform sizes 64 KiB .. 1 GiB with random frees keeping
    <= 24 GiB live.
    Reported: reserve = max_memory_reserved - max_memory_allocated (GiB, and as a fraction of max
    allocated), also per step; the non-allocator device memory ``total - free - reserved`` (CUDA
    context, module images, cuBLAS / cuDNN handles) after CUDA init, after the first cuBLAS GEMM and
    after the run; the bytes the allocator holds for cuBLAS's workspace after the first GEMM
    (allocated - operands); nvidia-smi's memory.used before any process (baseline).
    Units: GiB = 2**30 bytes.

Run on the GPU host: ``python bench/contention.py --json OUT.json``. The table printed last summarises
both parts. ``--cpu-smoke`` (with ``TRITON_INTERPRET=1``) checks the Triton kernels and the model code
on the CPU at tiny sizes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time

GiB = 2 ** 30
TOKENS = 8192

# (name, M, N, K): tensor-parallel shards of Llama 3.1 at 8192 tokens per micro-batch.
# 70B: hidden 8192, 64 heads / 8 KV heads of 128, FFN 28672. 405B: hidden 16384, 128 / 8 heads, FFN 53248.
GEMM_SHAPES = [
    ("70b_tp8_qkv", TOKENS, (64 + 2 * 8) * 128 // 8, 8192),
    ("70b_tp8_fc1", TOKENS, 2 * 28672 // 8, 8192),        # gate + up fused
    ("70b_tp8_fc2", TOKENS, 8192, 28672 // 8),
    ("70b_tp4_fc1", TOKENS, 2 * 28672 // 4, 8192),
    ("405b_tp8_attn_out", TOKENS, 16384, 16384 // 8),
    ("405b_tp8_fc1", TOKENS, 2 * 53248 // 8, 16384),
    ("405b_tp8_fc2", TOKENS, 16384, 53248 // 8),
]
FP8_SHAPE = ("405b_tp8_fc1_fp8", TOKENS, 2 * 53248 // 8, 16384)
REDUCE_SMS = (8, 16, 24, 32, 64)
SPIN_SMS = (16, 32)

ALLOC_RUNS = [("llama", "none"), ("llama", "expandable_segments"), ("llama", "empty_cache_per_step"),
              ("llama", "empty_cache_per_microbatch"), ("llama_recompute", "none"),
              ("llama_recompute", "expandable_segments"), ("synthetic", "none"),
              ("synthetic", "expandable_segments")]


# ----------------------------------------------------------------------------------------------------
# Triton kernels (defined lazily so the allocator part and --help need no triton)
# ----------------------------------------------------------------------------------------------------

_KERNELS: dict = {}


def kernels():
    if _KERNELS:
        return _KERNELS
    import triton
    import triton.language as tl

    @triton.jit
    def reduce_kernel(a_ptr, b_ptr, c_ptr, n_blocks_buf, iters, BLOCK: tl.constexpr):
        """Grid-stride ``c = a + b``: each program does ``iters`` blocks, wrapping around the buffers."""
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        offs = tl.arange(0, BLOCK)
        for i in range(0, iters):
            blk = pid + i * nprog
            base = (blk % n_blocks_buf).to(tl.int64) * BLOCK
            x = tl.load(a_ptr + base + offs)
            y = tl.load(b_ptr + base + offs)
            tl.store(c_ptr + base + offs, x + y)

    @triton.jit
    def spin_kernel(out_ptr, iters, BLOCK: tl.constexpr):
        """Register arithmetic only: holds one SM per program for ~iters dependent FMAs."""
        pid = tl.program_id(0)
        x = tl.zeros((BLOCK,), dtype=tl.float32) + pid.to(tl.float32)
        for _ in range(iters):
            x = x * 0.999999 + 1.0e-6
        tl.store(out_ptr + pid * BLOCK + tl.arange(0, BLOCK), x)

    _KERNELS.update(reduce=reduce_kernel, spin=spin_kernel)
    return _KERNELS


# ----------------------------------------------------------------------------------------------------
# Part a: contention
# ----------------------------------------------------------------------------------------------------

def _ev():
    import torch
    return torch.cuda.Event(enable_timing=True)


class ReduceBG:
    """N-program Triton ``c = a + b`` (HBM bytes: 2 reads + 1 write per element)."""

    BLOCK = 16384
    ELEMS = 32 * 2 ** 20          # 64 MiB of bf16 per buffer, 192 MiB per pass (> 60 MB L2)

    def __init__(self, n_sms: int, device="cuda"):
        import torch
        self.name, self.sms, self.device = f"reduce{n_sms}", n_sms, device
        self.a = torch.randn(self.ELEMS, device=device, dtype=torch.bfloat16)
        self.b = torch.randn(self.ELEMS, device=device, dtype=torch.bfloat16)
        self.c = torch.empty_like(self.a)
        self.nbuf = self.ELEMS // self.BLOCK
        self.bytes_per_block = 3 * self.BLOCK * 2
        self.units_per_ms = None

    def enqueue(self, units: int):
        iters = max(1, int(math.ceil(units / self.sms)))      # units = blocks, rounded up to whole waves
        kernels()["reduce"][(self.sms,)](self.a, self.b, self.c, self.nbuf, iters, BLOCK=self.BLOCK,
                                         num_warps=8)
        return iters * self.sms * self.bytes_per_block

    def first_units(self):
        return self.sms * 64


class SpinBG:
    """N-program register-only spin (no memory traffic)."""

    BLOCK = 256

    def __init__(self, n_sms: int, device="cuda"):
        import torch
        self.name, self.sms = f"spin{n_sms}", n_sms
        self.out = torch.empty(n_sms * self.BLOCK, device=device, dtype=torch.float32)
        self.units_per_ms = None

    def enqueue(self, units: int):
        kernels()["spin"][(self.sms,)](self.out, int(units), BLOCK=self.BLOCK, num_warps=4)
        return 0

    def first_units(self):
        return 200_000


class CopyBG:
    """Back-to-back ``dst.copy_(src)`` of 512 MiB (all SMs); bytes = read + written."""

    NBYTES = 512 * 2 ** 20

    def __init__(self, sm_count: int):
        import torch
        self.name, self.sms = "copy_all", sm_count
        self.src = torch.empty(self.NBYTES, device="cuda", dtype=torch.uint8).random_(0, 255)
        self.dst = torch.empty_like(self.src)
        self.units_per_ms = None

    def enqueue(self, units: int):
        for _ in range(int(units)):
            self.dst.copy_(self.src)
        return int(units) * 2 * self.NBYTES

    def first_units(self):
        return 8


class H2DBG:
    """Back-to-back host-to-device copies from 256 MiB of pinned memory (copy engine)."""

    NBYTES = 256 * 2 ** 20

    def __init__(self):
        import torch
        self.name, self.sms = "h2d", 0
        self.host = torch.empty(self.NBYTES, dtype=torch.uint8, pin_memory=True)
        self.host.random_(0, 255)
        self.dst = torch.empty(self.NBYTES, device="cuda", dtype=torch.uint8)
        self.units_per_ms = None

    def enqueue(self, units: int):
        for _ in range(int(units)):
            self.dst.copy_(self.host, non_blocking=True)
        return int(units) * self.NBYTES

    def first_units(self):
        return 4


def bg_launch(bg, stream, target_ms: float):
    """Enqueue ~target_ms (at the stand-alone rate) of background work on ``stream``; events + bytes."""
    import torch
    units = max(1, int(math.ceil(target_ms * bg.units_per_ms)))
    s, e = _ev(), _ev()
    with torch.cuda.stream(stream):
        s.record()
        nbytes = bg.enqueue(units)
        e.record()
    return s, e, nbytes


def bg_calibrate(bg, stream, target_ms=40.0) -> dict:
    import torch
    torch.cuda.synchronize()
    units = bg.first_units()
    for _ in range(2):   # compile / warm, then a rough rate
        s, e = _ev(), _ev()
        with torch.cuda.stream(stream):
            s.record()
            bg.enqueue(units)
            e.record()
        torch.cuda.synchronize()
    bg.units_per_ms = units / max(s.elapsed_time(e), 1e-3)
    times, gbps = [], []
    for _ in range(3):
        s, e, nbytes = bg_launch(bg, stream, target_ms)
        torch.cuda.synchronize()
        ms = s.elapsed_time(e)
        times.append(ms)
        gbps.append(nbytes / (ms * 1e6))
    ms = statistics.median(times)
    units = max(1, int(math.ceil(target_ms * bg.units_per_ms)))
    bg.units_per_ms = units / ms
    return {"name": bg.name, "sms": bg.sms, "alone_gbps": statistics.median(gbps) if gbps[0] else None,
            "calib_ms": ms}


def make_gemm(name, m, n, k, fp8=False):
    import torch
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    if fp8:
        x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda", dtype=torch.float32)
        del x, w

        def op():
            return torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        op()
        torch.cuda.synchronize()
        return op, (x8, w8, one)
    wt = w.t()
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

    def op():
        return torch.mm(x, wt, out=out)
    return op, (x, w, out)


def time_gemms(op, stream, n_warm, n_rep):
    import torch
    evs = [(_ev(), _ev()) for _ in range(n_rep)]
    with torch.cuda.stream(stream):
        for _ in range(n_warm):
            op()
        for s, e in evs:
            s.record()
            op()
            e.record()
    return evs


def gemm_alone(op, stream, n_warm, n_rep):
    import torch
    torch.cuda.synchronize()
    evs = time_gemms(op, stream, n_warm, n_rep)
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in evs)


def gemm_contended(op, bg, s_gemm, s_bg, gemm_ms, n_warm, n_rep) -> dict:
    """Phase A: GEMM time with the background running over the whole timed window."""
    import torch
    target = 2.5 * (n_warm + n_rep) * gemm_ms + 10.0
    for attempt in range(3):
        torch.cuda.synchronize()
        b0, b1, _ = bg_launch(bg, s_bg, target)
        evs = time_gemms(op, s_gemm, n_warm, n_rep)
        torch.cuda.synchronize()
        covered = b0.elapsed_time(evs[0][0]) >= 0.0 and evs[-1][1].elapsed_time(b1) >= 0.0
        times = [s.elapsed_time(e) for s, e in evs]
        if covered:
            break
        target *= 3.0
    return {"gemm_ms": statistics.median(times), "gemm_ms_mean": statistics.fmean(times),
            "gemm_ms_max": max(times), "covered_a": covered, "attempts_a": attempt + 1}


def bg_contended(op, bg, s_gemm, s_bg, gemm_ms) -> dict:
    """Phase B: background bandwidth with GEMMs running over the whole background window."""
    import torch
    target = max(20.0, 8.0 * gemm_ms)
    n_g = int(math.ceil(2.5 * target / gemm_ms)) + 2
    for attempt in range(3):
        torch.cuda.synchronize()
        b0, b1, nbytes = bg_launch(bg, s_bg, target)
        g1 = _ev()
        with torch.cuda.stream(s_gemm):
            for _ in range(n_g):
                op()
            g1.record()
        torch.cuda.synchronize()
        covered = b1.elapsed_time(g1) >= 0.0
        ms = b0.elapsed_time(b1)
        if covered:
            break
        n_g *= 3
    return {"bg_ms": ms, "bg_gbps": (nbytes / (ms * 1e6)) if nbytes else None, "covered_b": covered,
            "attempts_b": attempt + 1}


def contention_child(args) -> dict:
    import torch

    t_start = time.perf_counter()
    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    res = {"gpu": torch.cuda.get_device_name(), "sm_count": props.multi_processor_count,
           "torch": torch.__version__, "cuda": torch.version.cuda, "reps": args.reps, "warmup": 3,
           "tokens": TOKENS, "backgrounds": [], "gemms": [], "errors": []}
    try:
        import triton
        res["triton"] = triton.__version__
    except Exception as exc:  # noqa: BLE001
        res["errors"].append(f"triton import: {exc!r}")
    s_gemm, s_bg = torch.cuda.Stream(), torch.cuda.Stream()

    # self-test of the reduce kernel
    try:
        t = ReduceBG(8)
        t.enqueue(t.nbuf)          # nbuf is a multiple of 8: each block exactly once
        torch.cuda.synchronize()
        ok = bool(torch.equal(t.c, t.a + t.b))
        res["reduce_selftest_ok"] = ok
        del t
    except Exception as exc:  # noqa: BLE001
        res["errors"].append(f"reduce selftest: {exc!r}")

    bgs = []
    makers = [(f"reduce{n}", lambda n=n: ReduceBG(n)) for n in REDUCE_SMS]
    makers += [(f"spin{n}", lambda n=n: SpinBG(n)) for n in SPIN_SMS]
    makers += [("copy_all", lambda: CopyBG(props.multi_processor_count)), ("h2d", H2DBG)]
    for name, mk in makers:
        try:
            bg = mk()
            info = bg_calibrate(bg, s_bg)
            res["backgrounds"].append(info)
            bgs.append(bg)
            print(f"[bg] {name}: {info}", flush=True)
        except Exception as exc:  # noqa: BLE001
            res["errors"].append(f"background {name}: {exc!r}")
            print(f"[bg] {name} FAILED: {exc!r}", flush=True)

    shapes = [(n, m, nn, k, False) for n, m, nn, k in GEMM_SHAPES] + [(*FP8_SHAPE, True)]
    for name, m, n, k, fp8 in shapes:
        if time.perf_counter() - t_start > args.contention_budget_s:
            res["errors"].append(f"time budget reached before {name}")
            break
        try:
            op, keep = make_gemm(name, m, n, k, fp8=fp8)
        except Exception as exc:  # noqa: BLE001
            res["errors"].append(f"gemm {name} skipped: {exc!r}")
            print(f"[gemm] {name} skipped: {exc!r}", flush=True)
            continue
        alone = gemm_alone(op, s_gemm, 5, args.reps)
        flops = 2.0 * m * n * k
        row = {"shape": name, "m": m, "n": n, "k": k, "dtype": "fp8_e4m3" if fp8 else "bf16",
               "alone_ms": alone, "alone_tflops": flops / (alone * 1e9), "cases": []}
        for bg in bgs:
            try:
                a = gemm_contended(op, bg, s_gemm, s_bg, alone, 3, args.reps)
                b = bg_contended(op, bg, s_gemm, s_bg, alone)
                bginfo = next(x for x in res["backgrounds"] if x["name"] == bg.name)
                case = {"bg": bg.name, "sms": bg.sms, **a, "slowdown": a["gemm_ms"] / alone,
                        "bg_alone_gbps": bginfo["alone_gbps"], **b}
                row["cases"].append(case)
            except Exception as exc:  # noqa: BLE001
                res["errors"].append(f"{name} x {bg.name}: {exc!r}")
        # the alone figure again, after the contended runs (drift check)
        row["alone_ms_after"] = gemm_alone(op, s_gemm, 3, args.reps)
        res["gemms"].append(row)
        print(f"[gemm] {name} {row['alone_ms']:.3f} ms ({row['alone_tflops']:.0f} TFLOP/s): "
              + ", ".join(f"{c['bg']} x{c['slowdown']:.2f}" for c in row["cases"]), flush=True)
        del op, keep
        torch.cuda.empty_cache()
    res["elapsed_s"] = time.perf_counter() - t_start
    return res


# ----------------------------------------------------------------------------------------------------
# Part b: allocator reserve
# ----------------------------------------------------------------------------------------------------

def build_llama(device, *, layers, hidden, heads, kv_heads, ffn, vocab, recompute):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    dt = torch.bfloat16
    hd = hidden // heads

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(hidden, device=device, dtype=dt))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dt) * self.weight

    def lin(i, o):
        return nn.Linear(i, o, bias=False, device=device, dtype=dt)

    def rope(x, cos, sin):
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.wq, self.wk, self.wv = lin(hidden, hidden), lin(hidden, kv_heads * hd), lin(hidden, kv_heads * hd)
            self.wo = lin(hidden, hidden)
            self.w1, self.w3, self.w2 = lin(hidden, ffn), lin(hidden, ffn), lin(ffn, hidden)

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            h = self.n1(x)
            q = rope(self.wq(h).view(b, s, heads, hd), cos, sin).transpose(1, 2)
            k = rope(self.wk(h).view(b, s, kv_heads, hd), cos, sin).transpose(1, 2)
            v = self.wv(h).view(b, s, kv_heads, hd).transpose(1, 2)
            rep = heads // kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.wo(o.transpose(1, 2).reshape(b, s, hidden))
            h = self.n2(x)
            return x + self.w2(F.silu(self.w1(h)) * self.w3(h))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, hidden, device=device, dtype=dt)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = RMSNorm()
            self.head = lin(hidden, vocab)

        def forward(self, tokens, targets):
            s = tokens.shape[1]
            pos = torch.arange(s, device=device, dtype=torch.float32)
            inv = 1.0 / (500000.0 ** (torch.arange(0, hd // 2, device=device, dtype=torch.float32) / (hd // 2)))
            ang = torch.outer(pos, inv)[:, None, :]
            cos, sin = ang.cos().to(dt), ang.sin().to(dt)
            x = self.emb(tokens)
            for blk in self.blocks:
                x = checkpoint(blk, x, cos, sin, use_reentrant=False) if recompute else blk(x, cos, sin)
            logits = self.head(self.norm(x))
            return F.cross_entropy(logits.float().view(-1, vocab), targets.view(-1))

    return Model()


def train_llama(device, cfg, policy, on_step=None):
    """bf16 model + fp32 master weights and fp32 AdamW (Megatron-style mixed precision)."""
    import torch

    model = build_llama(device, layers=cfg["layers"], hidden=cfg["hidden"], heads=cfg["heads"],
                        kv_heads=cfg["kv_heads"], ffn=cfg["ffn"], vocab=cfg["vocab"],
                        recompute=cfg["recompute"])
    params = [p for p in model.parameters()]
    master = [p.detach().float().clone().requires_grad_(True) for p in params]
    opt = torch.optim.AdamW(master, lr=1e-5, weight_decay=0.1, foreach=True)
    g = torch.Generator(device="cpu").manual_seed(0)
    for step in range(cfg["steps"]):
        t0 = time.perf_counter()
        for _ in range(cfg["micro"]):
            tok = torch.randint(0, cfg["vocab"], (1, cfg["seq"]), generator=g).to(device)
            tgt = torch.randint(0, cfg["vocab"], (1, cfg["seq"]), generator=g).to(device)
            loss = model(tok, tgt) / cfg["micro"]
            loss.backward()
            del loss, tok, tgt
            if policy == "empty_cache_per_microbatch" and device != "cpu":
                torch.cuda.empty_cache()
        for p, m in zip(params, master):
            m.grad = p.grad.float()
            p.grad = None
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, m in zip(params, master):
                p.copy_(m)
        if policy == "empty_cache_per_step" and device != "cpu":
            torch.cuda.empty_cache()
        if on_step:
            on_step(step, time.perf_counter() - t0)
    return model


def synthetic_pattern(device, n_iter=3000, live_cap=24 * GiB, seed=0):
    import torch
    rng = random.Random(seed)
    live, live_bytes = [], 0
    for _ in range(n_iter):
        size = int(2 ** rng.uniform(16, 30))
        live.append(torch.empty(size, dtype=torch.uint8, device=device))
        live_bytes += size
        while live_bytes > live_cap:
            live_bytes -= live.pop(rng.randrange(len(live))).numel()
    return len(live)


LLAMA_CFG = {"layers": 8, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336, "vocab": 128256,
             "seq": 8192, "micro": 2, "steps": 3, "recompute": False}


def alloc_child(args) -> dict:
    import torch

    res = {"pattern": args.pattern, "policy": args.policy,
           "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
    t0 = time.perf_counter()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    res["total_bytes"] = total
    res["non_allocator_after_init_bytes"] = total - free - torch.cuda.memory_reserved()
    al0 = torch.cuda.memory_allocated()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    c = a @ a
    torch.cuda.synchronize()
    res["cublas_workspace_allocator_bytes"] = torch.cuda.memory_allocated() - al0 - a.nbytes - c.nbytes
    free, _ = torch.cuda.mem_get_info()
    res["non_allocator_after_cublas_bytes"] = total - free - torch.cuda.memory_reserved()
    del a, c
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    steps = []

    def on_step(i, wall):
        torch.cuda.synchronize()
        ma, mr = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
        steps.append({"step": i, "wall_s": wall, "max_allocated_gib": ma / GiB, "max_reserved_gib": mr / GiB,
                      "reserve_gib": (mr - ma) / GiB, "reserve_frac": (mr - ma) / ma,
                      "reserved_end_gib": torch.cuda.memory_reserved() / GiB})
        torch.cuda.reset_peak_memory_stats()

    peak_a = peak_r = 0
    if args.pattern.startswith("llama"):
        cfg = dict(LLAMA_CFG, recompute=args.pattern == "llama_recompute")
        res["config"] = cfg

        def hook(i, wall):
            nonlocal peak_a, peak_r
            peak_a = max(peak_a, torch.cuda.max_memory_allocated())
            peak_r = max(peak_r, torch.cuda.max_memory_reserved())
            on_step(i, wall)
        train_llama("cuda", cfg, args.policy, on_step=hook)
    else:
        res["live_left"] = synthetic_pattern("cuda")
        torch.cuda.synchronize()
        peak_a, peak_r = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    torch.cuda.synchronize()
    st = torch.cuda.memory_stats()
    free, _ = torch.cuda.mem_get_info()
    res.update({
        "max_allocated_gib": peak_a / GiB, "max_reserved_gib": peak_r / GiB,
        "reserve_gib": (peak_r - peak_a) / GiB, "reserve_frac": (peak_r - peak_a) / peak_a,
        "steps": steps,
        "non_allocator_after_run_bytes": total - free - torch.cuda.memory_reserved(),
        "num_alloc_retries": st.get("num_alloc_retries"), "num_ooms": st.get("num_ooms"),
        "num_device_alloc": st.get("num_device_alloc"), "num_device_free": st.get("num_device_free"),
        "elapsed_s": time.perf_counter() - t0,
    })
    return res


# ----------------------------------------------------------------------------------------------------
# Orchestration
# ----------------------------------------------------------------------------------------------------

def smi(query: str) -> list[str]:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
        return [x.strip() for x in out[0].split(",")] if out else []
    except Exception:  # noqa: BLE001
        return []


def run_child(argv: list[str], env: dict, timeout: float) -> dict:
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), *argv, "--child-out", path], env=env,
                           timeout=timeout, capture_output=True, text=True)
        sys.stdout.write(p.stdout)
        try:
            with open(path) as f:
                doc = json.load(f)
        except Exception:  # noqa: BLE001
            doc = {"error": f"child rc={p.returncode}", "stderr_tail": p.stderr[-3000:]}
        if p.returncode != 0:
            doc.setdefault("stderr_tail", p.stderr[-3000:])
        return doc
    except subprocess.TimeoutExpired as exc:
        return {"error": f"timeout after {timeout} s", "stdout_tail": str(exc.stdout)[-2000:]}
    finally:
        os.unlink(path)


def fmt(x, spec=".2f"):
    width = spec.split(".")[0] if spec[:1].isdigit() else ""
    return format("-", f">{width}") if x is None else format(x, spec)


def tables(doc) -> str:
    lines = []
    con = doc.get("contention") or {}
    if con.get("gemms"):
        bgs = {b["name"]: b for b in con.get("backgrounds", [])}
        lines.append("GEMM slowdown under a concurrent kernel (median ms; bg GB/s alone -> contended)")
        lines.append(f"{'shape':20s} {'MxNxK':>18s} {'alone':>7s} {'TF/s':>5s} | {'bg':9s} {'SMs':>4s} "
                     f"{'ms':>7s} {'slow':>5s} {'bgGB/s':>7s} {'->':>7s} cov")
        for g in con["gemms"]:
            head = f"{g['shape']:20s} {g['m']}x{g['n']}x{g['k']:<7d} {g['alone_ms']:7.3f} {g['alone_tflops']:5.0f}"
            for i, c in enumerate(g["cases"]):
                pre = head if i == 0 else " " * len(head)
                cov = "y" if c["covered_a"] and c["covered_b"] else "N"
                lines.append(f"{pre} | {c['bg']:9s} {c['sms']:4d} {c['gemm_ms']:7.3f} {c['slowdown']:5.2f} "
                             f"{fmt(bgs.get(c['bg'], {}).get('alone_gbps'), '7.0f')} {fmt(c['bg_gbps'], '7.0f')} {cov}")
    if con.get("error"):
        lines.append(f"contention: ERROR {con['error']}")
    for e in con.get("errors", []):
        lines.append(f"contention note: {e}")
    al = doc.get("allocator") or {}
    if al.get("runs"):
        lines.append("")
        lines.append("Allocator reserve = max_reserved - max_allocated (GiB); non-allocator = total-free-reserved")
        lines.append(f"{'pattern':16s} {'policy':27s} {'maxAlloc':>8s} {'maxResv':>8s} {'reserve':>7s} "
                     f"{'frac':>6s} {'lastStepFrac':>12s} {'step_s':>6s} {'nonAlloc@end':>12s}")
        for r in al["runs"]:
            if "error" in r:
                lines.append(f"{r.get('pattern', '?'):16s} {r.get('policy', '?'):27s} ERROR {r['error']}")
                continue
            last = r["steps"][-1] if r.get("steps") else {}
            lines.append(f"{r['pattern']:16s} {r['policy']:27s} {r['max_allocated_gib']:8.2f} "
                         f"{r['max_reserved_gib']:8.2f} {r['reserve_gib']:7.2f} {r['reserve_frac']:6.3f} "
                         f"{fmt(last.get('reserve_frac'), '12.3f')} {fmt(last.get('wall_s'), '6.2f')} "
                         f"{r['non_allocator_after_run_bytes'] / GiB:12.3f}")
        r0 = next((r for r in al["runs"] if "error" not in r), None)
        if r0:
            lines.append(f"baseline nvidia-smi used (no process): {al.get('baseline_used_mib')} MiB; "
                         f"non-allocator after init {r0['non_allocator_after_init_bytes'] / 2**20:.0f} MiB, "
                         f"after first cuBLAS GEMM {r0['non_allocator_after_cublas_bytes'] / 2**20:.0f} MiB; "
                         f"cuBLAS workspace in allocator {r0['cublas_workspace_allocator_bytes'] / 2**20:.1f} MiB")
    return "\n".join(lines)


def cpu_smoke() -> int:
    """CPU checks at tiny sizes: the Triton kernels in interpreter mode, the model's fwd/bwd/step."""
    import torch
    ok = True
    if os.environ.get("TRITON_INTERPRET") == "1":
        k = kernels()
        a = torch.randn(8 * 64, dtype=torch.float32)
        b = torch.randn_like(a)
        c = torch.zeros_like(a)
        k["reduce"][(3,)](a, b, c, 8, 3, BLOCK=64)
        ok &= bool(torch.allclose(c, a + b))
        out = torch.zeros(2 * 16)
        k["spin"][(2,)](out, 5, BLOCK=16)
        ok &= bool(torch.isfinite(out).all())
        print("triton kernels (interpreter):", ok)
    cfg = dict(LLAMA_CFG, layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=97, seq=16, steps=2)
    for rc in (False, True):
        cfg["recompute"] = rc
        seen = []
        m = train_llama("cpu", cfg, "none", on_step=lambda i, w: seen.append(i))
        ok &= seen == [0, 1] and all(torch.isfinite(p).all() for p in m.parameters())
    print("llama fwd/bwd/step on cpu:", ok)
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--skip-contention", action="store_true")
    ap.add_argument("--skip-alloc", action="store_true")
    ap.add_argument("--contention-budget-s", type=float, default=120.0)
    ap.add_argument("--total-budget-s", type=float, default=270.0,
                    help="stop starting new measurements after this many seconds")
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--child", choices=["alloc", "contention"], help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--pattern", help=argparse.SUPPRESS)
    ap.add_argument("--policy", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.cpu_smoke:
        return cpu_smoke()
    if args.child:
        doc = alloc_child(args) if args.child == "alloc" else contention_child(args)
        with open(args.child_out, "w") as f:
            json.dump(doc, f)
        return 0

    doc = {"date": datetime.date.today().isoformat(), "argv": sys.argv, "host": platform.node(),
           "python": platform.python_version()}
    s = smi("name,driver_version,memory.total,memory.used,clocks.max.sm,power.limit")
    doc["nvidia_smi"] = dict(zip(["name", "driver", "memory_total_mib", "memory_used_mib", "sm_max_mhz",
                                  "power_limit_w"], s))
    try:
        import torch   # versions only: the parent never touches CUDA (children measure device memory)
        doc["torch"], doc["cuda"] = torch.__version__, torch.version.cuda
        import triton
        doc["triton"] = triton.__version__
    except Exception as exc:  # noqa: BLE001
        doc["version_error"] = repr(exc)

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)

    deadline = time.perf_counter() + args.total_budget_s
    if not args.skip_contention:      # first: a child, so its CUDA context is gone before part b
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        budget = min(args.contention_budget_s, max(30.0, args.total_budget_s * 0.45))
        doc["contention"] = run_child(["--child", "contention", "--reps", str(args.reps),
                                       "--contention-budget-s", str(budget)], env,
                                      timeout=max(30.0, min(budget + 90, deadline - time.perf_counter())))
        save()
    if not args.skip_alloc:
        doc["allocator"] = {"baseline_used_mib": doc["nvidia_smi"].get("memory_used_mib"), "runs": []}
        for pattern, policy in ALLOC_RUNS:
            left = deadline - time.perf_counter()
            if left < 25:
                doc["allocator"]["runs"].append({"pattern": pattern, "policy": policy,
                                                 "error": "skipped: total time budget reached"})
                continue
            env = dict(os.environ)
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            if policy == "expandable_segments":
                env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
            r = run_child(["--child", "alloc", "--pattern", pattern, "--policy", policy], env,
                          timeout=min(120.0, left - 5))
            r.setdefault("pattern", pattern)
            r.setdefault("policy", policy)
            doc["allocator"]["runs"].append(r)
            print(f"[alloc] {pattern}/{policy}: "
                  + (f"reserve {r['reserve_gib']:.2f} GiB ({r['reserve_frac']:.3f}) of {r['max_allocated_gib']:.1f}"
                     f" GiB allocated, {r['elapsed_s']:.1f} s" if "reserve_gib" in r else str(r)[:800]), flush=True)
            save()
    save()
    print(tables(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
