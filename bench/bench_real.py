"""Benchmark (GPU host): the tuned plan against a hand-written baseline, both run for real, in one call.

Runs each plan file with :func:`autotune.runtime.launch.run_plan` on the local GPUs (same GPUs, same
model, sequence length and global batch) and prints measured step time, MFU and peak memory, and the
tuned/baseline MFU ratio. The baseline is FSDP (ZeRO-3) over all GPUs, full activation recomputation,
blocking collectives and no overlap settings (``examples/8b-2xh200-baseline-fsdp-fullrecompute.yaml``).

Run: ``python bench/bench_real.py --tuned plan.yaml [--baseline FILE] [--layers N] [--steps N]``
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.spec.plan import PlanDocument  # noqa: E402
from autotune.runtime.launch import run_plan  # noqa: E402

BASELINE = Path(__file__).resolve().parents[1] / "examples" / "8b-2xh200-baseline-fsdp-fullrecompute.yaml"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tuned", required=True)
    ap.add_argument("--baseline", default=str(BASELINE))
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", default=None, help="write both results here")
    a = ap.parse_args()
    docs = {"tuned": PlanDocument.load(a.tuned), "baseline": PlanDocument.load(a.baseline)}
    t, b = docs["tuned"], docs["baseline"]
    if (t.model, t.workload, t.num_gpus, t.gpu) != (b.model, b.workload, b.num_gpus, b.gpu):
        print("error: tuned and baseline plans must share model, workload, GPU and GPU count", file=sys.stderr)
        return 2
    res = {k: run_plan(d, layers=a.layers, steps=a.steps, warmup=a.warmup, timeout_s=600) for k, d in docs.items()}
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))
    print(f"{t.model.name}, {t.num_gpus} x {t.gpu}, seq {t.workload.seq_len}, global batch "
          f"{t.workload.global_batch_size} sequences" + (f", proxy of {a.layers} layers" if a.layers else ""))
    print(f"{'plan':9s} {'status':7s} {'step ms':>9s} {'MFU':>7s} {'peak reserved GiB':>18s}  settings")
    for k, r in res.items():
        p = docs[k].plan
        s = (f"TP{p.tp_degree} PP{p.pp_degree} DP{p.dp_degree} CP{p.cp_degree} mbs{p.micro_batch_size} "
             f"zero{p.zero_stage} rc={p.recompute} async={p.async_collectives} reclaim={p.memory_reclaim}")
        if r["status"] == "ok":
            peak = max(x or 0 for x in r.get("peak_reserved_bytes") or [0]) / 2**30
            print(f"{k:9s} {'ok':7s} {r['step_time_ms']:9.1f} {r['mfu']:7.1%} {peak:18.1f}  {s}")
        else:
            print(f"{k:9s} {r['status']:7s} {'-':>9s} {'-':>7s} {'-':>18s}  {s}: {r.get('reason')}")
    if all(r["status"] == "ok" for r in res.values()):
        print(f"tuned / baseline MFU: {res['tuned']['mfu'] / res['baseline']['mfu']:.2f}x  "
              f"(measured on {res['tuned'].get('device_name')}, torch {res['tuned'].get('torch_version')}, "
              f"{res['tuned'].get('date')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
