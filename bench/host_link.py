"""Benchmark (GPU): GPU <-> host copy bandwidth over the host link, the rate CPU activation offloading moves at.

Pinned host buffers, ``copy_(non_blocking=True)`` on a side stream (what Transformer Engine's CPU offload
does: transformer_engine/pytorch/cpu_offload.py ``OffloadSynchronizer``, its ``offload_stream``), device to
host (D2H, the forward's offload) and host to device (H2D, the backward's reload), 64 MiB to 2 GiB, CUDA
events around each copy, median of ``--reps``. Then the same copies while the compute stream runs BF16
8192^3 GEMMs back to back: the copy's rate beside compute, and how much the GEMMs slow down.

    python bench/host_link.py --json host_link.json      # prints a table; the JSON keeps every figure

Figures feed ``autotune/cost/offload.py`` (``HOST_COPY_EFFICIENCY``: measured rate / the datasheet link
rate ``host_link_gbs`` of autotune/data/gpus.yaml).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _copy_ms(torch, dst, src, stream, reps: int) -> float:
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            a.record(stream)
            dst.copy_(src, non_blocking=True)
            b.record(stream)
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import torch

    dev = torch.device("cuda")
    side = torch.cuda.Stream()
    rows = []
    for mib in (64, 256, 1024, 2048):
        n = mib << 20
        g = torch.empty(n, dtype=torch.uint8, device=dev)
        h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        d2h = _copy_ms(torch, h, g, side, a.reps)
        h2d = _copy_ms(torch, g, h, side, a.reps)
        rows.append({"mib": mib, "d2h_ms": d2h, "h2d_ms": h2d, "d2h_gbs": n / d2h / 1e6, "h2d_gbs": n / h2d / 1e6})
        del g, h
    # beside compute: BF16 GEMMs on the default stream while the side stream copies 1 GiB each way
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        x @ y
    torch.cuda.synchronize()
    k = 40
    t0 = time.perf_counter()
    for _ in range(k):
        x @ y
    torch.cuda.synchronize()
    gemm_alone_ms = (time.perf_counter() - t0) * 1e3 / k
    n = 1 << 30
    g = torch.empty(n, dtype=torch.uint8, device=dev)
    h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    ev = []
    t0 = time.perf_counter()
    for _ in range(k):
        x @ y
    with torch.cuda.stream(side):
        for direction in ("d2h", "h2d", "d2h", "h2d"):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(side)
            (h.copy_(g, non_blocking=True) if direction == "d2h" else g.copy_(h, non_blocking=True))
            e.record(side)
            ev.append((direction, s, e))
    torch.cuda.synchronize()
    gemm_beside_ms = (time.perf_counter() - t0) * 1e3 / k
    beside = {d: [] for d in ("d2h", "h2d")}
    for d, s, e in ev:
        beside[d].append(n / s.elapsed_time(e) / 1e6)
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows,
           "gemm_8192_bf16_ms_alone": gemm_alone_ms, "gemm_8192_bf16_ms_beside_copies": gemm_beside_ms,
           "beside_gemm_gbs": {d: statistics.median(v) for d, v in beside.items()}}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    print(f"{out['gpu']}, torch {out['torch']}, CUDA {out['cuda']}, {out['date_utc']}")
    print(f"{'MiB':>6} {'D2H ms':>8} {'D2H GB/s':>9} {'H2D ms':>8} {'H2D GB/s':>9}")
    for r in rows:
        print(f"{r['mib']:>6} {r['d2h_ms']:>8.2f} {r['d2h_gbs']:>9.1f} {r['h2d_ms']:>8.2f} {r['h2d_gbs']:>9.1f}")
    print(f"beside BF16 8192^3 GEMMs: D2H {out['beside_gemm_gbs']['d2h']:.1f} GB/s, H2D "
          f"{out['beside_gemm_gbs']['h2d']:.1f} GB/s; GEMM {gemm_alone_ms:.3f} ms alone, {gemm_beside_ms:.3f} ms "
          "with the copies")


if __name__ == "__main__":
    main()
