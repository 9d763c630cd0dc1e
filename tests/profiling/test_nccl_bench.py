"""Collective benchmark: bus bandwidth convention, tier environments, and a 2-process gloo run."""

from __future__ import annotations

import pytest

from autotune.profiling import nccl_bench as NB
from autotune.profiling.measure import cuda_available


def test_busbw_convention():
    # nccl-tests PERFORMANCE.md: algbw = S / t; busbw = algbw x 2(n-1)/n (all-reduce), x (n-1)/n
    # (all-gather, reduce-scatter, all-to-all), x 1 (send/recv). 1 GB in 10 ms = 100 GB/s algbw.
    assert NB.busbw_gbs("all_reduce", 1e9, 10.0, 8) == pytest.approx(100 * 2 * 7 / 8)
    assert NB.busbw_gbs("all_gather", 1e9, 10.0, 4) == pytest.approx(75.0)
    assert NB.busbw_gbs("reduce_scatter", 1e9, 10.0, 2) == pytest.approx(50.0)
    assert NB.busbw_gbs("all_to_all", 1e9, 10.0, 8) == pytest.approx(87.5)
    assert NB.busbw_gbs("send_recv", 1e9, 10.0, 2) == pytest.approx(100.0)
    with pytest.raises(ValueError):
        NB.busbw_gbs("broadcast", 1e9, 1.0, 2)


def test_tier_environments():
    base = {"NCCL_P2P_DISABLE": "1", "PATH": "/bin"}
    nv = NB.tier_env("nvlink", base)
    assert "NCCL_P2P_DISABLE" not in nv and nv["NCCL_NVLS_ENABLE"] == "0"
    assert nv["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and nv["PATH"] == "/bin"
    host = NB.tier_env("host", base)
    assert host["NCCL_P2P_DISABLE"] == "1" and "NCCL_SHM_DISABLE" not in host
    so = NB.tier_env("sockets", base)
    assert so["NCCL_P2P_DISABLE"] == so["NCCL_SHM_DISABLE"] == "1" and so["NCCL_NVLS_ENABLE"] == "0"
    with pytest.raises(ValueError, match="unknown tier"):
        NB.tier_env("infiniband", base)
    assert NB.QUICK_SIZES == (2**20, 2**24, 2**27, 2**30)
    assert NB.FULL_SIZES[0] == 64 * 1024 and NB.FULL_SIZES[-1] == 2**30


@pytest.mark.slow
def test_gloo_two_processes_tiny(tmp_path):
    seen = []
    rc, lines = NB.launch(tier="nvlink", nproc=2, out=tmp_path / "r.jsonl", sizes=[4096, 65536],
                          kinds=["all_reduce", "send_recv", "all_gather"], backend="gloo",
                          skip=[("all_gather", 2, 65536)], overlap=True, timeout_s=180, log=tmp_path / "log",
                          on_line=seen.append, poll_s=0.1,
                          extra_args=["--repeats", "2", "--round-seconds", "0.005", "--overlap-gemm", "32",
                                      "--overlap-loop", "2", "--overlap-bytes", "4096"])
    assert rc == 0, (tmp_path / "log").read_text()[-3000:]
    assert seen == lines
    got = {(d["kind"], d["group_size"], d["nbytes"]) for d in lines if d["type"] == "collective"}
    assert got == {("all_reduce", 2, 4096), ("all_reduce", 2, 65536), ("send_recv", 2, 4096),
                   ("send_recv", 2, 65536), ("all_gather", 2, 4096)}  # the skipped point is not re-measured
    for d in lines:
        if d["type"] == "collective":
            assert d["tier"] == "nvlink" and d["median_ms"] > 0
            assert d["busbw_gbs"] == pytest.approx(NB.busbw_gbs(d["kind"], d["actual_nbytes"], d["median_ms"], 2))
    ov = [d for d in lines if d["type"] == "overlap"]
    assert len(ov) == 1 and ov[0]["gemm_ms_alone"] > 0 and ov[0]["num_allreduces"] >= 2
    assert lines[-1]["type"] == "done" and lines[-1]["world_size"] == 2


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs 2 CUDA GPUs")
def test_nccl_two_gpus(tmp_path):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    rc, lines = NB.launch(tier="nvlink", nproc=2, out=tmp_path / "r.jsonl", sizes=[2**20, 2**27],
                          timeout_s=300, log=tmp_path / "log")
    assert rc == 0, (tmp_path / "log").read_text()[-3000:]
    ar = [d for d in lines if d["type"] == "collective" and d["kind"] == "all_reduce"]
    assert len(ar) == 2 and ar[-1]["busbw_gbs"] > 10
