"""Timing harness on CPU (tiny shapes), shapes tables, and GPU-only checks (marked gpu)."""

from __future__ import annotations

import time

import pytest

from autotune.spec.models import get_model
from autotune.profiling import measure as M
from autotune.profiling.shapes import AttentionShape, attention_shapes, gemm_shapes, layer_gemms


def test_time_op_cpu_median_warmup_and_fresh_inputs():
    import torch

    calls, seen = [], []

    def setup():
        x = torch.randn(16)
        calls.append(x)
        return (x,)

    def fn(x):
        seen.append(x)
        time.sleep(0.002)

    t = M.time_op(fn, setup=setup, device="cpu", warmup=2, repeats=5)
    assert t.repeats == 5 and len(t.samples_ms) == 5
    assert len(calls) == 7  # 2 warm-up + 5 timed, each with its own inputs
    assert all(a is not b for a, b in zip(seen, seen[1:]))
    assert all(bool((x != 0).any()) for x in calls)  # random, never zeros
    assert 2.0 <= t.median_ms < 200.0  # slept 2 ms
    assert t.median_ms == sorted(t.samples_ms)[2]
    with pytest.raises(ValueError, match="repeats"):
        M.time_op(fn, device="cpu", repeats=0)


def test_time_op_max_seconds_caps_repeats():
    t = M.time_op(lambda: time.sleep(0.01), device="cpu", warmup=1, repeats=100, max_seconds=0.05)
    assert 3 <= t.repeats <= 5  # ~0.05 s / 0.01 s


def test_measure_gemm_attention_memory_on_cpu():
    g = M.measure_gemm(32, 16, 8, device="cpu", warmup=1, repeats=3)
    assert set(g) == {"fwd", "dgrad", "wgrad"} and all(t.median_ms > 0 for t in g.values())
    f, b = M.measure_attention(AttentionShape(1, 32, 4, 2, 16), device="cpu", warmup=1, repeats=2)
    assert f.median_ms > 0 and b.median_ms > 0
    for spec, nbytes in (({"op": "copy", "numel": 1000}, 2 * 1000 * 4),          # fp32 on CPU
                         ({"op": "rmsnorm", "tokens": 8, "hidden": 16}, 2 * 8 * 16 * 4),
                         ({"op": "rope", "tokens": 8, "heads": 2, "head_dim": 8}, (2 * 8 * 2 * 8 + 2 * 8 * 8) * 4),
                         ({"op": "swiglu", "tokens": 8, "ffn": 32}, 3 * 8 * 32 * 4),
                         ({"op": "cross_entropy", "tokens": 8, "vocab": 100}, 8 * 100 * 4 + 8 * 8),
                         ({"op": "adamw", "numel": 1000}, 28 * 1000)):
        nb, t = M.measure_memory_op(spec, device="cpu", warmup=1, repeats=2)
        assert nb == nbytes and t.median_ms > 0
    with pytest.raises(ValueError, match="unknown memory-bound op"):
        M.measure_memory_op({"op": "gelu"}, device="cpu")


def test_layer_gemm_shapes_llama():
    # 405B at TP 8, 8192 tokens: QKV n = (16384 + 2 x 1024) / 8 = 2304, gate+up 2 x 53248 / 8 = 13312,
    # down k = 53248 / 8 = 6656, LM head 128256 / 8 = 16032 (design.md probe shapes)
    s = {g.name: g.key for g in layer_gemms(get_model("405b"), tp_degree=8, tokens=8192)}
    assert s == {"qkv": (8192, 2304, 16384), "out_proj": (8192, 16384, 2048), "gate_up": (8192, 13312, 16384),
                 "down": (8192, 16384, 6656), "lm_head": (8192, 16032, 16384)}
    # 8B at TP 8: 8 KV heads -> 1 per rank: n = (4096 + 2 x 1024) / 8 = 768
    assert {g.name: g.key for g in layer_gemms(get_model("8b"), tp_degree=8, tokens=2048)}["qkv"] == (2048, 768, 4096)
    quick = {g.key for g in gemm_shapes(quick=True)}
    assert (8192, 8192, 8192) in quick and (8192, 6144, 4096) in quick and len(quick) <= 12
    full = gemm_shapes()
    assert len({g.key for g in full}) == len(full)
    assert (16384, 16032, 16384) in {g.key for g in full}


def test_attention_shapes():
    q = {(a.seq_len, a.heads, a.kv_heads) for a in attention_shapes(quick=True)}
    # 8B TP1 (32, 8), TP2 (16, 4), 405B TP8 (16, 1) at 4K and 8K
    assert q == {(s, h, kv) for s in (4096, 8192) for h, kv in ((32, 8), (16, 4), (16, 1))}
    full = attention_shapes()
    assert max(a.seq_len for a in full) == 131072 and min(a.seq_len for a in full) == 2048
    assert (1, 131072, 128, 8, 128) in {a.key for a in full}


# ----------------------------------------------------------------------------- GPU only
cuda = pytest.mark.skipif(not M.cuda_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@cuda
def test_gpu_gemm_and_flash_attention():
    g = M.measure_gemm(4096, 4096, 4096, repeats=5)
    tflops = 2 * 4096**3 / (g["fwd"].median_ms * 1e9)
    assert 50 < tflops < 2500, tflops
    f, b = M.measure_attention(AttentionShape(1, 4096, 32, 8, 128), repeats=3)
    assert 0 < f.median_ms < b.median_ms


@pytest.mark.gpu
@cuda
def test_gpu_reclaim_subprocess():
    for ex in (False, True):
        r = M.measure_reclaim(expandable_segments=ex, gib=1.0, repeats=2)
        assert r["empty_cache_ms"] >= 0 and r["alloc_ms_per_gib"] >= 0 and r["nbytes"] >= 2**30
