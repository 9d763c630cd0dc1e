"""Benchmark: ``autotune plan`` for Llama 3.1 405B over 3 GPU types x 6 counts, from empty storage and repeated.

Goal (issue 41): <= 2 minutes from empty storage on a 2-core CPU machine, <= 10 s when repeated (the repeat reads
the stored studies: every point must say it reused its study, which this script checks). Each run is a fresh
``python -m autotune plan`` process, so the wall times include start-up. Prints a table.

Run: ``python bench/bench_plan.py`` (``--gpus``, ``--counts``, ``--trials`` to change the sweep; ``--keep DIR`` keeps
the storage).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_plan(storage: str, gpus: str, counts: str, trials: int | None) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "autotune", "plan", "--size", "405b", "--tokens", "15.6T", "--gpu", gpus,
           "--gpus", counts, "--storage", storage, "--json"]
    if trials is not None:
        cmd += ["--trials", str(trials)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"autotune plan failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return wall, json.loads(p.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="h100,b200,gb200")
    ap.add_argument("--counts", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--trials", type=int, default=None, help="--trials of autotune plan (default: its own)")
    ap.add_argument("--keep", default=None, metavar="DIR", help="storage directory to keep (default: a temporary one)")
    args = ap.parse_args()
    tmp = args.keep or tempfile.mkdtemp(prefix="bench_plan-")
    Path(tmp).mkdir(parents=True, exist_ok=True)
    db = Path(tmp) / "plan.db"
    if db.exists():
        sys.exit(f"{db} exists: the first run must start from empty storage")
    storage = f"sqlite:///{db}"
    n_points = len(args.gpus.split(",")) * len(args.counts.split(","))
    cold, doc = run_plan(storage, args.gpus, args.counts, args.trials)
    trials = sum(r["new_trials"] for r in doc["results"])
    warm, doc2 = run_plan(storage, args.gpus, args.counts, args.trials)
    reused = sum(bool(r["reused_study"]) for r in doc2["results"])
    same = [r["plan"] for r in doc["results"]] == [r["plan"] for r in doc2["results"]]
    print(f"autotune plan --size 405b, {args.gpus} x {args.counts}: {n_points} points, {os.cpu_count()} CPUs")
    print(f"{'run':<22s} {'wall s':>8s} {'goal s':>7s} {'new trials':>11s} {'studies reused':>15s}")
    print(f"{'empty storage':<22s} {cold:8.1f} {120:7d} {trials:11d} {0:15d}")
    print(f"{'repeated':<22s} {warm:8.1f} {10:7d} {sum(r['new_trials'] for r in doc2['results']):11d} "
          f"{reused:>11d}/{n_points}")
    print(f"same plans on repeat: {same}; warm-started points: "
          f"{sum(1 for r in doc['results'] if r['warm_started'])}; points without a plan: "
          f"{sum(1 for r in doc['results'] if r['budget'] is None)}")
    if reused != n_points:
        print("FAIL: the repeat did not reuse every stored study")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
