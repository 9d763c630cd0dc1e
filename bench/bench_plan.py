"""Benchmark: ``autotune plan`` for Llama 3.1 405B over 3 GPU types x 6 counts, from empty storage and repeated.

Goal (issue 41): <= 2 minutes from empty storage on a 2-core CPU machine, <= 10 s when repeated (the repeat reads
the stored studies: every point must say it reused its study, which this script checks). Each run is a fresh
``python -m autotune plan`` process, so the times include start-up. Prints a table with the wall time and the
process's CPU time (user + system: the wall time on an idle machine, since the sweep runs in one process; on a
machine shared with other jobs the wall time is longer) and the load average.

Run: ``python bench/bench_plan.py`` (``--gpus``, ``--counts``, ``--trials`` to change the sweep; ``--keep DIR`` keeps
the storage).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_plan(storage: str, gpus: str, counts: str, trials: int | None, workers: int = 1) -> tuple[float, float, dict]:
    """(wall s, CPU s of the child: user + system, the JSON document) of one ``autotune plan`` process."""
    cmd = [sys.executable, "-m", "autotune", "plan", "--size", "405b", "--tokens", "15.6T", "--gpu", gpus,
           "--gpus", counts, "--storage", storage, "--json", "--workers", str(workers)]
    if trials is not None:
        cmd += ["--trials", str(trials)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    if p.returncode != 0:
        sys.exit(f"autotune plan failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return wall, cpu, json.loads(p.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="h100,b200,gb200")
    ap.add_argument("--counts", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--trials", type=int, default=None, help="--trials of autotune plan (default: its own)")
    ap.add_argument("--workers", type=int, default=1, help="--workers of autotune plan (processes over GPU types)")
    ap.add_argument("--keep", default=None, metavar="DIR", help="storage directory to keep (default: a temporary one)")
    args = ap.parse_args()
    tmp = args.keep or tempfile.mkdtemp(prefix="bench_plan-")
    Path(tmp).mkdir(parents=True, exist_ok=True)
    db = Path(tmp) / "plan.db"
    if db.exists():
        sys.exit(f"{db} exists: the first run must start from empty storage")
    storage = f"sqlite:///{db}"
    n_points = len(args.gpus.split(",")) * len(args.counts.split(","))
    cold, cold_cpu, doc = run_plan(storage, args.gpus, args.counts, args.trials, args.workers)
    trials = sum(r["new_trials"] for r in doc["results"])
    warm, warm_cpu, doc2 = run_plan(storage, args.gpus, args.counts, args.trials, args.workers)
    reused = sum(bool(r["reused_study"]) for r in doc2["results"])
    same = [r["plan"] for r in doc["results"]] == [r["plan"] for r in doc2["results"]]
    load = os.getloadavg()[0]
    print(f"autotune plan --size 405b --workers {args.workers}, {args.gpus} x {args.counts}: {n_points} points, "
          f"{os.cpu_count()} CPUs, "
          f"load average {load:.1f} at the end")
    print(f"{'run':<16s} {'wall s':>8s} {'CPU s':>7s} {'goal s':>7s} {'new trials':>11s} {'studies reused':>15s}")
    print(f"{'empty storage':<16s} {cold:8.1f} {cold_cpu:7.1f} {120:7d} {trials:11d} {0:>15d}")
    print(f"{'repeated':<16s} {warm:8.1f} {warm_cpu:7.1f} {10:7d} {sum(r['new_trials'] for r in doc2['results']):11d} "
          f"{reused:>12d}/{n_points}")
    print("(CPU s: user + system time of the autotune processes; with --workers 1 the sweep runs on one core, so "
          "on an idle machine its wall time is about its CPU time)")
    print(f"same plans on repeat: {same}; warm-started points: "
          f"{sum(1 for r in doc['results'] if r['warm_started'])}; points without a plan: "
          f"{sum(1 for r in doc['results'] if r['budget'] is None)}")
    if reused != n_points:
        print("FAIL: the repeat did not reuse every stored study")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
