"""Benchmark (GPU): GEMM throughput in a burst vs under sustained load.

``autotune profile`` times each GEMM as the median of a few repeats after a short warm-up: a burst, at
the clocks a cool, lightly loaded GPU reaches. A training step keeps the tensor cores busy for seconds
to minutes, and a power- or thermally-limited GPU lowers its clocks under that load. This script runs
back-to-back GEMMs of one shape for ``--seconds`` and prints the throughput of every window beside the
burst figure (first window), with the SM clock and power that ``nvidia-smi`` reports, so the ratio
steady-state / burst can be stored in the calibration profile (``sustained_compute_factor``).

Run on a GPU host: ``python bench/sustained_gemm.py --seconds 60 --json out.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def smi() -> dict[str, str]:
    """SM clock (MHz), power (W), temperature (C) of GPU 0 from nvidia-smi, or {} if unavailable."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                              "--format=csv,noheader,nounits", "-i", "0"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        clk, pw, temp = [x.strip() for x in out.split(",")]
        return {"sm_mhz": clk, "power_w": pw, "temp_c": temp}
    except Exception:  # noqa: BLE001 - informational only
        return {}


def run(m: int, n: int, k: int, dtype: str, seconds: float, window_s: float) -> dict:
    import torch

    dev = torch.device("cuda")
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    if dtype == "fp8":
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        one = torch.ones((), device=dev)

        def op():
            return torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        bt = b.t()

        def op():
            return a @ bt
    for _ in range(10):
        op()
    torch.cuda.synchronize()
    flops = 2.0 * m * n * k
    windows = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        count = 0
        t0 = time.perf_counter()
        start.record()
        while time.perf_counter() - t0 < window_s:
            for _ in range(20):
                op()
            count += 20
            if count % 200 == 0:
                torch.cuda.synchronize()    # keep the queue short so the window is GPU time
        stop.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(stop)
        windows.append({"tflops": flops * count / (ms * 1e9), **smi()})
    burst = windows[0]["tflops"]
    tail = [w["tflops"] for w in windows[len(windows) // 2:]]
    steady = statistics.median(tail)
    return {"shape": [m, n, k], "dtype": dtype, "seconds": seconds, "burst_tflops": burst,
            "steady_tflops": steady, "steady_over_burst": steady / burst, "windows": windows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--window", type=float, default=2.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
           "date": time.strftime("%Y-%m-%d")}
    results = [run(8192, 8192, 8192, "bf16", args.seconds, args.window),
               run(8192, 8192, 8192, "fp8", args.seconds / 2, args.window)]
    print(f"{env['gpu']}, torch {env['torch']}, CUDA {env['cuda']}, {env['date']}")
    print(f"{'shape':18s} {'dtype':5s} {'burst TFLOP/s':>14s} {'steady TFLOP/s':>15s} {'ratio':>6s}  clocks/power")
    for r in results:
        w0, wl = r["windows"][0], r["windows"][-1]
        print(f"{'x'.join(map(str, r['shape'])):18s} {r['dtype']:5s} {r['burst_tflops']:14.0f} "
              f"{r['steady_tflops']:15.0f} {r['steady_over_burst']:6.3f}  first {w0.get('sm_mhz', '?')} MHz "
              f"{w0.get('power_w', '?')} W, last {wl.get('sm_mhz', '?')} MHz {wl.get('power_w', '?')} W "
              f"{wl.get('temp_c', '?')} C")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
