"""Profile tables: schema, record/lookup, export/import round trip in the calibration schema."""

from __future__ import annotations

import pytest
import yaml
from sqlalchemy import create_engine, inspect

from autotune.cost.op_costs import CalibratedCosts
from autotune.cost.calibration import CalibrationProfile, default_calibration
from autotune.errors import ConfigError
from autotune.spec.hardware import get_gpu
from autotune.profiling import store as S

from profiling_fixtures import ENV


def test_tables_created_with_profile_prefix(url):
    S.open_store(url)
    names = set(inspect(create_engine(url)).get_table_names())
    assert names == {"profile_environment", "profile_gemm", "profile_attention", "profile_memory_op",
                     "profile_collective", "profile_overlap", "profile_reclaim", "profile_gemm_fp8",
                     "profile_quantize", "profile_block_op"}
    cols = {c["name"] for c in inspect(create_engine(url)).get_columns("profile_gemm")}
    assert {"env_id", "m", "n", "k", "pass", "median_ms", "tflops", "repeats"} <= cols


def test_environment_is_keyed_by_versions(url):
    s = S.open_store(url)()
    a = S.get_or_create_environment(s, ENV)
    b = S.get_or_create_environment(s, ENV)
    assert a.id == b.id
    c = S.get_or_create_environment(s, S.EnvironmentInfo(**{**ENV.to_dict(), "nccl": "2.29.0"}))
    assert c.id != a.id
    assert [e.id for e in S.environments(s, gpu="h200")] == [c.id, a.id]  # newest first
    assert S.environments(s, gpu="b200") == []


def test_record_lookup_and_replace(url):
    s = S.open_store(url)()
    env = S.get_or_create_environment(s, ENV)
    assert S.lookup(s, env, "gemm", m=1, n=2, k=3, pass_="fwd") is None
    S.record(s, env, "gemm", m=1, n=2, k=3, pass_="fwd", median_ms=1.0, tflops=1e-8, repeats=3)
    S.record(s, env, "gemm", m=1, n=2, k=3, pass_="fwd", median_ms=2.0, tflops=6e-9, repeats=5)
    got = S.lookup(s, env, "gemm", m=1, n=2, k=3, pass_="fwd")
    assert (got.median_ms, got.repeats) == (2.0, 5)
    assert len(S.rows(s, env, "gemm")) == 1
    # committed: visible from a new session
    s2 = S.open_store(url)()
    assert S.lookup(s2, env, "gemm", m=1, n=2, k=3, pass_="fwd").median_ms == 2.0
    with pytest.raises(ConfigError, match="missing key"):
        S.record(s, env, "gemm", m=1, n=2, median_ms=1.0, tflops=1.0)
    with pytest.raises(ConfigError, match="unknown profile table"):
        S.lookup(s, env, "gemms", m=1)


def test_catalog_gpu_names():
    assert S.catalog_gpu("NVIDIA H200") == "h200"
    assert S.catalog_gpu("NVIDIA H100 80GB HBM3") == "h100"
    assert S.catalog_gpu("NVIDIA A100-SXM4-80GB") == "a100-80gb"
    assert S.catalog_gpu("NVIDIA GB200") == "gb200"
    assert S.catalog_gpu("Tesla T4") is None


def test_export_fields_hand_checked(populated):
    s, env = populated
    d = S.export_profile(s, env)
    assert d["schema_version"] == 1 and d["measured"] is True
    assert d["label"] == "h200-2026-11-30"
    assert d["environment"]["nccl"] == "2.28.9" and d["environment"]["hostname"] == "testhost"
    # 2^31 FLOPs in 1 ms = 2.147 TFLOP/s
    assert d["gemm"][0] == [1024, 1024, 1024, 2.15]
    # backward factor: mean over shapes of mean(dgrad, wgrad)/fwd = mean(1.3/1.0, 1.5/1.5) = 1.15
    assert d["gemm_backward_factor"] == pytest.approx(1.15)
    # median of the Llama ops' GB/s (1000, 2000, 3000), copy excluded
    assert d["memory_bound_bandwidth_gbs"] == 2000.0
    nv = d["collectives"]["nvlink"]
    assert nv["measured"] is True and nv["group_size"] == 2
    assert nv["link_bandwidth_gbs"] == 450.0  # nvlink4 preset of the H200
    assert nv["measured_busbw_gbs"] == 331.0
    assert nv["all_reduce"][-1] == [2**30, 331.0]
    assert d["collectives"]["host"]["link_bandwidth_gbs"] == 63.0  # pcie5 preset
    # tiers not measured come from the shipped calibration, flagged unmeasured
    assert d["collectives"]["network"]["measured"] is False
    assert d["overlap"] == {"compute_slowdown": 0.15}
    assert d["reclaim"]["empty_cache_ms"] == 3.0
    assert d["reclaim"]["expandable_segments"]["alloc_after_empty_cache_ms_per_gib"] == 0.5


def test_export_parses_as_calibration_profile(populated):
    s, env = populated
    text = S.dump_profile_yaml(S.export_profile(s, env))
    prof = CalibrationProfile.from_dict(yaml.safe_load(text))
    assert prof.measured and prof.gpu == "h200"
    c = CalibratedCosts(profile=prof, gpu=get_gpu("h200"))
    # attention fwd at seq 8192, 32 heads stored as 3.0 ms; CalibratedCosts reproduces it from TFLOP/s
    assert c.attention_ms(batch=1, seq_len=8192, heads=32, kv_heads=8, head_dim=128) == pytest.approx(3.0, rel=1e-3)


def test_export_import_round_trip(populated, tmp_path):
    s, env = populated
    d1 = S.export_profile(s, env)
    text = S.dump_profile_yaml(d1)
    url2 = f"sqlite:///{tmp_path / 'other.db'}"
    env2 = S.import_profile(yaml.safe_load(text), url2)
    d2 = S.export_profile(url2, env2)
    assert d2 == d1
    s2 = S.open_store(url2)()
    for t in S.TABLES:
        assert len(S.rows(s2, env2, t)) == len(S.rows(s, env, t))


def test_import_shipped_calibration_converts_rows(url):
    # the probe-derived profile (design.md figures; the measured one is now the default)
    shipped = default_calibration("h200-probe.yaml")
    env = S.import_profile(shipped.raw, url)
    s = S.open_store(url)()
    assert env.gpu_name == "NVIDIA H200"
    assert len(S.rows(s, env, "gemm")) == 3 * len(shipped.gemm)
    ar = S.lookup(s, env, "collective", tier="nvlink", kind="all_reduce", group_size=2, nbytes=2**30)
    # t = f(2) S / busbw = 1 x 2^30 B / 331 GB/s = 3.2439 ms
    assert ar.median_ms == pytest.approx(2**30 / 331e6)
    # only measured tiers become rows (network and sockets are assumptions in h200.yaml)
    assert {c.tier for c in S.rows(s, env, "collective")} == {"nvlink", "host"}
    # 8192^3 at 776 TFLOP/s: 2 x 8192^3 / 776e12 s = 1.4169 ms
    g = S.lookup(s, env, "gemm", m=8192, n=8192, k=8192, pass_="fwd")
    assert g.median_ms == pytest.approx(2 * 8192**3 / 776e9)


def test_export_needs_kernels_and_a_catalog_gpu(url):
    s = S.open_store(url)()
    env = S.get_or_create_environment(s, ENV)
    with pytest.raises(ConfigError, match="0 GEMM and 0 attention"):
        S.export_profile(s, env)
    t4 = S.get_or_create_environment(s, S.EnvironmentInfo(**{**ENV.to_dict(), "gpu_name": "Tesla T4"}))
    with pytest.raises(ConfigError, match="not in the GPU catalog"):
        S.export_profile(s, t4)


def test_import_rejects_bad_profile(url):
    with pytest.raises(ConfigError, match="schema_version"):
        S.import_profile({"schema_version": 7}, url)
