"""Shared fixtures: a synthetic environment with hand-chosen timings in a temporary SQLite store."""

from __future__ import annotations

from autotune.profiling import store as S

ENV = S.EnvironmentInfo(gpu_name="NVIDIA H200", gpu_count=2, driver="580.159.04", torch="2.11.0+cu130",
                        cuda="13.0", nccl="2.28.9", hostname="testhost", date="2026-11-30")


def populate(session, env):
    """Hand-chosen rows. GEMM 1024^3 = 2^31 FLOPs: fwd 1.0 ms (2.147 TFLOP/s), dgrad 1.2, wgrad 1.4;
    GEMM (2048, 1024, 1024) fwd 1.5 ms, dgrad 1.5, wgrad 1.5."""
    for (m, n, k), ms in (((1024, 1024, 1024), {"fwd": 1.0, "dgrad": 1.2, "wgrad": 1.4}),
                          ((2048, 1024, 1024), {"fwd": 1.5, "dgrad": 1.5, "wgrad": 1.5})):
        for p, t in ms.items():
            S.record(session, env, "gemm", m=m, n=n, k=k, pass_=p, median_ms=t,
                     tflops=S.tflops_of(S.gemm_flops(m, n, k), t), repeats=10)
    for seq, fwd, bwd in ((4096, 1.0, 2.0), (8192, 3.0, 6.0)):
        ff = S.attention_flops(batch=1, seq_len=seq, heads=32, head_dim=128)
        S.record(session, env, "attention", batch=1, seq_len=seq, heads=32, kv_heads=8, head_dim=128,
                 fwd_ms=fwd, bwd_ms=bwd, fwd_tflops=S.tflops_of(ff, fwd), bwd_tflops=S.tflops_of(2.5 * ff, bwd),
                 repeats=10)
    # memory ops: GB/s 1000, 2000, 3000 for the Llama ops, copy 4000 (excluded from the median)
    for op, nb, gbs in (("rmsnorm", 2**26, 1000.0), ("swiglu", 2**28, 2000.0), ("adamw", 2**30, 3000.0),
                        ("copy", 2**30, 4000.0)):
        S.record(session, env, "memory_op", op=op, nbytes=nb, median_ms=nb / (gbs * 1e6), gbs=gbs, repeats=10)
    for tier, bws in (("nvlink", (16.0, 213.0, 284.0, 331.0)), ("host", (13.0, 28.0, 28.0, 29.0))):
        for kind in ("all_reduce", "send_recv"):
            for s, bb in zip((2**20, 2**24, 2**27, 2**30), bws):
                # ms from busbw: all-reduce on 2 ranks f = 2(1)/2 = 1; send/recv f = 1
                S.record(session, env, "collective", tier=tier, kind=kind, group_size=2, nbytes=s,
                         median_ms=s / (bb * 1e6), busbw_gbs=bb, repeats=5)
    S.record(session, env, "overlap", tier="nvlink", gemm_ms_alone=14.0, gemm_ms_overlapped=16.1, comm_ms=0.9,
             comm_nbytes=2**28, compute_slowdown=0.15)
    S.record(session, env, "reclaim", expandable_segments=False, empty_cache_ms=3.0, alloc_ms_per_gib=0.25,
             nbytes=2**31)
    S.record(session, env, "reclaim", expandable_segments=True, empty_cache_ms=1.0, alloc_ms_per_gib=0.5,
             nbytes=2**31)
