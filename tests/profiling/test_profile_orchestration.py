"""`run_profile` end to end on CPU with the GPU measurements replaced by fakes: storage, skip on re-run,
--force, per-measurement failures, collectives per tier, fabric files and the exported profile."""

from __future__ import annotations

import pytest
import yaml

from autotune.cost.calibration import CalibrationProfile
from autotune.spec.hardware import get_fabric
from autotune.cli import profile as C
from autotune.profiling import measure as M
from autotune.profiling import store as S
from autotune.profiling.measure import Timing
from profiling_fixtures import ENV


@pytest.fixture
def fake_gpu(monkeypatch):
    import torch

    calls = {"gemm": 0, "launch": []}
    monkeypatch.setattr(M, "require_cuda", lambda: None)
    monkeypatch.setattr(M, "detect_environment", lambda gpu_count=None: S.EnvironmentInfo(
        **{**ENV.to_dict(), "gpu_count": gpu_count or 2}))
    for name in ("synchronize", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)

    def gemm(m, n, k, **kw):
        calls["gemm"] += 1
        if (m, n, k) == (512, 4096, 4096):
            raise RuntimeError("CUDA out of memory (fake)")
        ms = 2 * m * n * k / 700e9  # 700 TFLOP/s fwd
        return {"fwd": Timing(ms, 10, (ms,)), "dgrad": Timing(1.1 * ms, 10, ()), "wgrad": Timing(1.2 * ms, 10, ())}

    def attn(a, **kw):
        ms = 2 * a.seq_len**2 * a.head_dim * a.heads / 500e9
        return Timing(ms, 10, ()), Timing(2.5 * ms * 1.25, 10, ())

    monkeypatch.setattr(M, "measure_gemm", gemm)
    monkeypatch.setattr(M, "measure_attention", attn)
    monkeypatch.setattr(M, "measure_memory_op", lambda spec, **kw: (
        M.memory_op_nbytes(spec), Timing(M.memory_op_nbytes(spec) / 3000e6, 10, ())))
    monkeypatch.setattr(M, "measure_reclaim", lambda expandable_segments, **kw: {
        "empty_cache_ms": 1.0 if expandable_segments else 4.0, "alloc_ms_per_gib": 0.3, "nbytes": 2**31})

    def launch(*, tier, nproc, out, sizes, skip, overlap, on_line, **kw):
        skip = {tuple(x) for x in skip}
        calls["launch"].append((tier, len(skip), overlap))
        lines = []
        bw = {"nvlink": 330.0, "host": 29.0, "sockets": 3.0}[tier]
        for kind in ("all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all"):
            for s in sizes:
                if (kind, 2, s) in skip:  # as the worker does
                    continue
                d = {"tier": tier, "type": "collective", "kind": kind, "group_size": 2, "nbytes": s,
                     "median_ms": s / (bw * 1e6), "busbw_gbs": bw * (1 if s >= 2**27 else 0.5), "repeats": 5}
                if kind == "all_to_all" and tier == "sockets":
                    d = {"tier": tier, "type": "error", "kind": kind, "group_size": 2, "nbytes": s, "error": "boom"}
                lines.append(d)
        if overlap:
            lines.append({"tier": tier, "type": "overlap", "gemm_ms_alone": 14.0, "gemm_ms_overlapped": 15.4,
                          "comm_ms": 0.8, "comm_nbytes": 2**28, "compute_slowdown": 0.1})
        lines.append({"tier": tier, "type": "done", "world_size": nproc})
        for d in lines:
            on_line(d)
        return 0, lines

    monkeypatch.setattr(C, "launch", launch)
    return calls


def test_run_profile_quick_then_rerun_then_force(fake_gpu, tmp_path):
    url = f"sqlite:///{tmp_path / 'p.db'}"
    out = tmp_path / "h200.yaml"
    echoed = []
    r = C.run_profile(quick=True, storage=url, export=str(out), fabrics_dir=str(tmp_path / "fab"),
                      echo=echoed.append)
    assert len(r.failures) == 1 + 4  # the fake OOM GEMM, and 4 sockets all-to-all sizes
    assert "512x4096x4096" in r.failures[0]
    n_gemm = fake_gpu["gemm"]
    assert [t for t, _, _ in fake_gpu["launch"]] == ["nvlink", "host", "sockets"]
    assert [o for _, _, o in fake_gpu["launch"]] == [True, False, False]  # overlap on the first tier only
    prof = CalibrationProfile.from_dict(yaml.safe_load(out.read_text()))
    assert prof.measured and prof.gpu == "h200" and prof.overlap_compute_slowdown == 0.1
    assert prof.collectives["nvlink"].curves["all_reduce"].busbw(2**30) == 330.0
    assert prof.gemm_backward_factor == pytest.approx(1.15)  # (1.1 + 1.2) / 2
    assert prof.empty_cache_ms == 4.0
    fab = get_fabric(str(tmp_path / "fab" / "h200-sockets.yaml"))
    assert fab.intra_node.calibration_tier == "sockets" and fab.intra_node.gpus_per_node == 2
    text = "\n".join(echoed)
    assert "GEMM 8192^3 fwd TFLOP/s" in text and "NCCL sockets all_reduce" in text

    # re-run: everything stored is skipped; only the failed GEMM and the failed points are retried
    fake_gpu["launch"].clear()
    r2 = C.run_profile(quick=True, storage=url, export=None, fabrics_dir=None, echo=lambda s: None)
    assert fake_gpu["gemm"] == n_gemm + 1
    assert r2.measured == 0 and len(r2.failures) == 5 and r2.skipped == 24 + 16 + 20 + 20
    assert [(t, o) for t, _, o in fake_gpu["launch"]] == [("sockets", False)]  # only sockets has gaps
    assert fake_gpu["launch"][0][1] == 4 * 4  # 4 kinds x 4 sizes stored for sockets

    # --force re-measures everything
    fake_gpu["launch"].clear()
    C.run_profile(quick=True, force=True, storage=url, fabrics_dir=None, echo=lambda s: None)
    assert fake_gpu["gemm"] == n_gemm + 1 + n_gemm
    assert [(t, n, o) for t, n, o in fake_gpu["launch"]] == [("nvlink", 0, True), ("host", 0, False),
                                                            ("sockets", 0, False)]


def test_run_profile_one_gpu_and_bad_options(fake_gpu, tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'p.db'}"
    msgs = []
    r = C.run_profile(quick=True, storage=url, gpus=1, fabrics_dir=None, echo=msgs.append)
    assert fake_gpu["launch"] == [] and r.measured > 0
    assert any("one GPU" in m for m in msgs)
    with pytest.raises(Exception, match="--gpus 3: this host has 2"):
        C.run_profile(quick=True, storage=url, gpus=3)
    with pytest.raises(Exception, match="unknown tier"):
        C.run_profile(quick=True, storage=url, tiers="nvlink,ib")
