"""FP8 GEMMs, FP8 quantization, block ops eager vs compiled, the long attention sweep, the new profile keys
and the merge step (CPU; GPU-only checks marked gpu)."""

from __future__ import annotations

import copy
import math

import pytest
import yaml

from autotune.cost.op_costs import CalibratedCosts
from autotune.cost.calibration import CalibrationProfile, default_calibration
from autotune.errors import ConfigError
from autotune.spec.hardware import get_gpu
from autotune.cli import profile as C
from autotune.profiling import measure as M
from autotune.profiling import store as S
from autotune.profiling.merge import merge_profiles
from autotune.profiling.shapes import attention_shapes, block_op_sizes, fp8_gemm_shapes


# ----------------------------------------------------------------------------- shapes
def test_long_attention_shapes():
    a = attention_shapes(long=True)
    # 5 head configs x 6 sequence lengths 4K..128K (2^12 .. 2^17)
    assert len(a) == 30
    assert {(x.heads, x.kv_heads) for x in a} == {(32, 8), (16, 4), (16, 1), (8, 1), (4, 1)}
    assert sorted({x.seq_len for x in a}) == [2**p for p in range(12, 18)]
    assert {x.batch for x in a} == {1} and {x.head_dim for x in a} == {128}


def test_fp8_gemm_shapes():
    s = {g.key for g in fp8_gemm_shapes()}
    assert all(m % 16 == 0 and n % 16 == 0 and k % 16 == 0 for m, n, k in s)
    # design.md 2026-12-01 comparison shapes: 8B TP2 gate_up n = 2 x 14336 / 2 = 14336 (k = h = 4096); 8B TP1
    # down (n = h = 4096, k = f = 14336); 8B TP1 QKV n = 4096 + 2 x 1024 = 6144; the 8192^3 reference
    assert {(8192, 14336, 4096), (8192, 4096, 14336), (8192, 6144, 4096), (8192, 8192, 8192)} <= s
    # 405B TP8 LM head: 128256 / 8 = 16032 = 16 x 1002, kept; 2048 / 512 token reference rows kept
    assert {(8192, 16032, 16384), (2048, 4096, 4096), (512, 4096, 4096)} <= s


def test_fp8_pass_dims():
    # x (m x k) W (n x k): fwd x W^T is (m, n, k); dgrad dY (m x n) @ W (n x k) -> M=m, N=k, K=n;
    # wgrad dY^T (n x m) @ x (m x k) -> M=n, N=k, K=m
    assert M.fp8_pass_dims(8, 32, 16) == {"fwd": (8, 32, 16), "dgrad": (8, 16, 32), "wgrad": (32, 16, 8)}


def test_block_op_bytes_are_the_cost_model_counts():
    sz = block_op_sizes()
    T, h, f, q, kv = 8192, 4096, 14336, 32 * 128, 8 * 128
    # autotune/cost/graph.py _layer_cost: 2 RMSNorms 8h/token -> 4 T h per norm; 2 residual adds 12h -> 6 T h
    # each; RoPE 4 (q + kv) per token; SwiGLU 6 f per token. cast: bf16->fp32 (2 + 4) + fp32->bf16 (4 + 2)
    # = 12 T h; norm_residual = residual + rmsnorm = 10 T h
    want = {"rmsnorm": 4 * T * h, "rope": 4 * T * (q + kv), "swiglu": 6 * T * f, "residual": 6 * T * h,
            "cast": 12 * T * h, "norm_residual": 10 * T * h}
    assert {op: M.block_op_nbytes(spec) for op, spec in sz.items()} == want
    assert want["rmsnorm"] == 134217728 and want["rope"] == 167772160
    with pytest.raises(ValueError, match="unknown block op"):
        M.block_op_nbytes({**sz["rmsnorm"], "op": "gelu"})


# ----------------------------------------------------------------------------- measurements on CPU
def test_measure_gemm_fp8_cpu_and_errors():
    for sc in ("tensorwise", "rowwise"):
        g = M.measure_gemm_fp8(32, 48, 64, scaling=sc, device="cpu", warmup=1, repeats=2)
        assert set(g) == {"fwd", "dgrad", "wgrad"} and all(t.median_ms > 0 for t in g.values())
    with pytest.raises(ValueError, match="divisible by 16"):
        M.measure_gemm_fp8(32, 40, 64, device="cpu")
    with pytest.raises(ValueError, match="unknown FP8 scaling"):
        M.measure_gemm_fp8(32, 48, 64, scaling="blockwise", device="cpu")


def test_quantize_fns_round_trip():
    import torch

    torch.manual_seed(0)
    x = torch.randn(64, 96, dtype=torch.float32) * torch.linspace(0.1, 10, 64)[:, None]
    for sc in ("tensorwise", "rowwise"):
        y, inv = M.quantize_fns(sc)["total"](x)
        assert y.dtype == torch.float8_e4m3fn
        back = y.float() * inv
        # the element of largest magnitude (per tensor / per row) maps to +-448 (E4M3 max) and back exactly
        amax = x.abs().amax() if sc == "tensorwise" else x.abs().amax(dim=-1, keepdim=True)
        peak = (y.float().abs().amax() if sc == "tensorwise" else y.float().abs().amax(dim=-1))
        assert torch.all(peak == 448.0)
        # E4M3 keeps 3 mantissa bits: relative rounding error <= 2^-4 for normal values; elements below the
        # smallest normal (2^-6 after scaling) have absolute error <= 2^-10 (subnormal spacing 2^-9, half)
        err = (back - x).abs()
        tol = torch.maximum(x.abs() * 2.0**-4, 2.0**-10 * amax / 448.0 * 1.0001)
        assert torch.all(err <= tol + 1e-12), (sc, float((err - tol).max()))
    # rowwise keeps small rows precise: row 0 (scale 0.1) relative error is E4M3's, not swamped by row 63's
    y, inv = M.quantize_fns("rowwise")["total"](x)
    assert inv.shape == (64, 1)


def test_measure_quantize_bytes_cpu():
    r = M.measure_quantize(64, 32, scaling="rowwise", device="cpu", warmup=1, repeats=2)
    # bytes charged: amax 2 B/elem, scale 0, cast 2 + 1, total 5 (the quantize convention)
    assert {k: v[0] for k, v in r.items()} == {"amax": 2 * 2048, "scale": 0, "cast": 3 * 2048, "total": 5 * 2048}
    with pytest.raises(ValueError, match="unknown quantize stage"):
        M.measure_quantize(64, 32, stages=("cast", "fuse"), device="cpu")


def test_block_ops_compute_the_same_eager_and_compiled_cpu():
    import torch
    import torch.nn.functional as F

    spec = {"op": "norm_residual", "tokens": 8, "hidden": 16, "ffn": 32, "heads": 4, "kv_heads": 2, "head_dim": 8}
    fn, setup = M.block_op_fn(spec, device="cpu")
    x, y = setup()
    r, n = fn(x, y)
    assert torch.equal(r, x + y)
    # RMSNorm by definition (Zhang & Sennrich 2019): r / sqrt(mean(r^2) + eps) * w; weight from the closure
    w = n[0] / (r[0] / torch.sqrt((r[0] ** 2).mean() + 1e-5))
    assert torch.allclose(n, r / torch.sqrt((r ** 2).mean(-1, keepdim=True) + 1e-5) * w, rtol=1e-4, atol=1e-5)
    fn, setup = M.block_op_fn({**spec, "op": "rope"}, device="cpu")
    q, k, cos, sin = setup()
    qo, ko = fn(q, k, cos, sin)
    # rotate_half: (x1, x2) -> (-x2, x1) on the two halves of the head dim
    assert torch.allclose(qo, q * cos + torch.cat((-q[..., 4:], q[..., :4]), -1) * sin)
    assert ko.shape == (8, 2, 8)
    fn, setup = M.block_op_fn({**spec, "op": "swiglu"}, device="cpu")
    g, u = setup()
    assert torch.allclose(fn(g, u), F.silu(g) * u)


def test_time_op_queue_ahead_is_accepted_on_cpu():
    t = M.time_op(lambda: None, device="cpu", warmup=0, repeats=3, queue_ahead=True)
    assert t.repeats == 3


# ----------------------------------------------------------------------------- store / export / import
def _populate_new(session, env):
    for sc, tf in (("tensorwise", 1400.0), ("rowwise", 1200.0)):
        for p in ("fwd", "dgrad", "wgrad"):
            ms = S.gemm_flops(1024, 1024, 1024) / (tf * 1e9)
            S.record(session, env, "gemm_fp8", scaling=sc, m=1024, n=1024, k=1024, pass_=p, median_ms=ms,
                     tflops=tf, repeats=10)
    # quantize totals: 5 B/elem x 2^20 elem = 5 MiB; tensorwise compiled at 1, 2, 3 ms -> median 2 ms
    for i, ms in enumerate((1.0, 2.0, 3.0)):
        nb = 5 * 2**20
        S.record(session, env, "quantize", scaling="tensorwise", mode="compiled", stage="total", rows=1024 * (i + 1),
                 cols=1024, nbytes=nb, median_ms=ms, gbs=nb / (ms * 1e6), repeats=10)
    for op, mode, gbs in (("rmsnorm", "eager", 2900.0), ("rmsnorm", "compiled", 3300.0), ("residual", "eager", 4000.0),
                          ("residual", "compiled", 3990.0)):
        S.record(session, env, "block_op", op=op, mode=mode, nbytes=2**27, median_ms=2**27 / (gbs * 1e6), gbs=gbs,
                 repeats=10)


def test_export_import_new_keys(populated, tmp_path):
    session, env = populated
    _populate_new(session, env)
    d = S.export_profile(session, env)
    assert d["gemm_fp8"] == {"rowwise": [[1024, 1024, 1024, 1200.0]], "tensorwise": [[1024, 1024, 1024, 1400.0]]}
    # median of 5 MiB / {1, 2, 3} ms = 5 x 2^20 / 2e6 GB/s = 2.62144 -> 2.6; no rowwise or eager rows stored
    assert d["quantize"] == {"tensorwise_gbs": round(5 * 2**20 / 2e6, 1)}
    assert d["memory_bound_ops_compiled"] == {"residual": 3990.0, "rmsnorm": 3300.0}
    # eager table: the fixture's memory_ops (adamw 3000, rmsnorm 1000, swiglu 2000) with the block op
    # figures over them (rmsnorm 2900) and new ones (residual 4000)
    assert d["memory_bound_ops"] == {"adamw": 3000.0, "rmsnorm": 2900.0, "swiglu": 2000.0, "residual": 4000.0}
    prof = CalibrationProfile.from_dict(d)
    assert prof.gemm_fp8["tensorwise"] == ((1024, 1024, 1024, 1400.0),)
    assert prof.memory_bound_ops["rmsnorm"] == 2900.0 and prof.memory_bound_ops_compiled["rmsnorm"] == 3300.0
    url2 = f"sqlite:///{tmp_path / 'copy.db'}"
    env2 = S.import_profile(yaml.safe_load(S.dump_profile_yaml(d)), url2)
    s2 = S.open_store(url2)()
    try:
        assert len(S.rows(s2, env2, "gemm_fp8")) == 6 and len(S.rows(s2, env2, "quantize")) == 3
        assert len(S.rows(s2, env2, "block_op")) == 4
        assert S.export_profile(s2, env2)["memory_bound_ops_compiled"] == d["memory_bound_ops_compiled"]
    finally:
        s2.close()


# ----------------------------------------------------------------------------- schema
def _shipped_raw() -> dict:
    return copy.deepcopy(dict(default_calibration().raw))


def test_old_profiles_still_load_and_new_keys_are_checked():
    old = default_calibration("h200-probe.yaml")
    assert old.gemm_fp8 == {} and old.quantize == {} and old.memory_bound_ops_compiled == {}
    d = _shipped_raw()
    for bad, msg in (({"gemm_fp8": {"blockwise": [[1, 1, 1, 1.0]]}}, "gemm_fp8.blockwise unknown"),
                     ({"gemm_fp8": {"tensorwise": [[1, 1, 1]]}}, r"\[m, n, k, tflops\]"),
                     ({"quantize": {"tensorwise_gbs": 0}}, "quantize values must be > 0"),
                     ({"memory_bound_ops_compiled": {"rope": "fast"}}, "must be numbers")):
        with pytest.raises(ConfigError, match=msg):
            CalibrationProfile.from_dict({**d, **bad})


def test_to_dict_round_trip():
    p = default_calibration()
    assert CalibrationProfile.from_dict(p.to_dict()) == p
    assert CalibrationProfile.from_dict(default_calibration("h200-probe.yaml").to_dict()) == \
        default_calibration("h200-probe.yaml")


# ----------------------------------------------------------------------------- merge
def test_merge_takes_each_part_from_where_it_was_measured():
    base = _shipped_raw()
    new = _shipped_raw()
    new["label"] = "h200-new"
    new["environment"] = {**base["environment"]["parts"]["kernels"], "gpu_count": 1, "date": "2027-01-01"}
    new["gemm"] = [[4096, 4096, 4096, 700.0]]
    new["collectives"] = {"nvlink": {"link_bandwidth_gbs": 450.0, "group_size": 2, "measured": False,
                                     "all_reduce": [[1, 1.0]]}}
    new["measurements"] = {"gemm": [[4096, 4096, 4096, "fwd", 0.2, 700.0, 10]]}   # no collectives, no reclaim
    del new["gemm_fp8"]                                                            # this run had no FP8 section
    m = merge_profiles(new, base)
    assert m["gemm"] == [[4096, 4096, 4096, 700.0]] and m["measurements"]["gemm"] == new["measurements"]["gemm"]
    assert m["gemm_fp8"] == base["gemm_fp8"]                     # kernel key kept from the base
    assert m["collectives"] == base["collectives"] and m["reclaim"] == base["reclaim"]
    assert m["measurements"]["collectives"] == base["measurements"]["collectives"]
    assert m["environment"]["parts"]["kernels"]["date"] == "2027-01-01"
    assert m["environment"]["parts"]["collectives"] == base["environment"]["parts"]["collectives"]
    assert m["label"] == "h200-new" and "collectives measured on 2x NVIDIA H200 2026-11-30" in m["source"]
    # a new profile that measured collectives wins that part
    new["measurements"]["collectives"] = [["nvlink", "all_reduce", 2, 1, 1.0, 1.0, 1]]
    m2 = merge_profiles(new, base)
    # ... except the base tier's curves of larger groups (published 4-rank rows no 2-GPU profile re-measures)
    assert m2["collectives"] == {"nvlink": {**new["collectives"]["nvlink"],
                                            "group_curves": base["collectives"]["nvlink"]["group_curves"]}}
    new["collectives"]["nvlink"]["group_curves"] = {4: {"all_reduce": [[1, 2.0]]}}    # its own win
    assert merge_profiles(new, base)["collectives"] == new["collectives"]
    del new["collectives"]["nvlink"]["group_curves"]
    assert m2["environment"]["parts"]["collectives"]["date"] == "2027-01-01"
    with pytest.raises(ConfigError, match="new profile"):
        merge_profiles({"schema_version": 1}, base)


def test_parse_sections():
    assert C.parse_sections("gemm, gemm_fp8,gemm") == ("gemm", "gemm_fp8")
    with pytest.raises(ConfigError, match="valid: gemm, attention"):
        C.parse_sections("gemm,nccl")


# ----------------------------------------------------------------------------- the shipped profile
def test_shipped_profile_parts_and_keys():
    p = default_calibration()
    env = p.environment["parts"]
    # kernels re-measured on 1 GPU; collectives, overlap and reclaim kept from the 2-GPU run of 2026-11-30
    assert env["kernels"]["gpu_count"] == 1 and env["kernels"]["date"] == "2026-12-01"
    assert env["collectives"]["gpu_count"] == 2 and env["collectives"]["date"] == "2026-11-30"
    assert env["reclaim"]["date"] == "2026-11-30"
    assert p.collectives["nvlink"].measured and p.overlap_compute_slowdown == 0.0744
    assert set(p.gemm_fp8) == {"tensorwise", "rowwise"} and len(p.gemm_fp8["tensorwise"]) == 62
    assert set(p.quantize) == {"tensorwise_gbs", "rowwise_gbs", "tensorwise_eager_gbs", "rowwise_eager_gbs"}
    assert set(p.memory_bound_ops_compiled) == {"rmsnorm", "rope", "swiglu", "residual", "cast", "norm_residual"}
    cfgs = {(r[1], r[2]) for r in p.attention}
    assert {(32, 8), (16, 4), (16, 1), (8, 1), (4, 1)} <= cfgs
    assert all({r[0] for r in p.attention if (r[1], r[2]) == c} >= {4096, 131072} for c in cfgs)


def test_cost_model_reads_long_attention_rows():
    p = default_calibration()
    costs = CalibratedCosts(profile=p, gpu=get_gpu("h200"))
    row = {r[0]: r for r in p.attention if (r[1], r[2]) == (32, 8)}
    for s in (32768, 65536, 131072):
        # at a measured seq the time is the row's: forward FLOPs 2 s^2 d h (causal) / fwd TFLOP/s
        fl = 2.0 * s * s * 128 * 32
        got = costs.attention_ms(batch=1, seq_len=s, heads=32, kv_heads=8, head_dim=128)
        assert math.isclose(got, fl / (row[s][4] * 1e9), rel_tol=1e-9)
        got_b = costs.attention_ms(batch=1, seq_len=s, heads=32, kv_heads=8, head_dim=128, backward=True)
        assert math.isclose(got_b, 2.5 * fl / (row[s][5] * 1e9), rel_tol=1e-9)


# ----------------------------------------------------------------------------- GPU only
cuda = pytest.mark.skipif(not M.cuda_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@cuda
def test_gpu_fp8_gemm_quantize_and_compiled_block_op():
    g = M.measure_gemm_fp8(4096, 4096, 4096, repeats=5)
    assert 50 < 2 * 4096**3 / (g["fwd"].median_ms * 1e9) < 5000
    r = M.measure_quantize(4096, 4096, compiled=True, stages=("total",), repeats=3)
    assert r["total"][0] == 5 * 4096 * 4096 and r["total"][1].median_ms > 0
    nb, t = M.measure_block_op(block_op_sizes()["rmsnorm"], compiled=True, repeats=3)
    assert nb == 4 * 8192 * 4096 and t.median_ms > 0
