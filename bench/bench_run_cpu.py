"""CPU seconds of the default `autotune run --size S` (issue 26: <= 10 s on an idle 2-core machine), as a user
runs it: a fresh process per run (imports included), a fresh SQLite study, the simulated backend and the
convergence stop. Prints one row per run: CPU (user + system of the child, ``RUSAGE_CHILDREN``), wall, trials,
the fastest trial (highest MFU) and the reported one (the plan `run` prints: ``best plan: trial N``, chosen
within the error band, docs/search.md) with their MFU and a hash of each stored plan (so runs of two code
versions can be compared plan for plan), then the median per size. ``--reference``: one more run per size with
``--no-early-stop --trials 200``, and whether the stopped runs found the same fastest and reported plans.

    python bench/bench_run_cpu.py                       # 405b, 70b, 8b; 3 runs each
    python bench/bench_run_cpu.py --sizes 405b --runs 5
    python bench/bench_run_cpu.py --runs 1 --reference  # and the same plans as 200 full trials?

CPU time on a shared or virtual machine moves with the host (docs/search.md: `main`'s 405B run took 11.8 s at
one hour and 16-17 s at another): compare versions in the same hour, alternating.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one_run(size: str, extra: list[str]) -> dict:
    """One `autotune run --size SIZE` in a subprocess on a fresh SQLite file; its CPU, wall, trials and best."""
    with tempfile.TemporaryDirectory() as d:
        db = Path(d) / "s.db"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "autotune", "run", "--size", size, "--storage", f"sqlite:///{db}",
                            *extra], cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if r.returncode != 0:
            raise SystemExit(f"autotune run --size {size} failed ({r.returncode}): {r.stderr.strip()[-300:]}")
        m = re.search(r"^best plan: trial (\d+) ", r.stdout, re.M)
        if m is None:
            raise SystemExit(f"autotune run --size {size}: no 'best plan: trial N' line in its output")
        c = sqlite3.connect(db)
        try:
            n, v = c.execute("SELECT t.number, v.value FROM trials t JOIN trial_values v ON v.trial_id = t.trial_id "
                             "WHERE t.state = 'COMPLETE' ORDER BY v.value DESC, t.number LIMIT 1").fetchone()
            rep = int(m.group(1))
            plans = {k: c.execute("SELECT a.value_json FROM trial_user_attributes a JOIN trials t ON "
                                  "t.trial_id = a.trial_id WHERE a.key = 'plan' AND t.number = ?", (k,)).fetchone()[0]
                     for k in (n, rep)}
            rep_v = c.execute("SELECT v.value FROM trials t JOIN trial_values v ON v.trial_id = t.trial_id "
                              "WHERE t.number = ?", (rep,)).fetchone()[0]
            num = c.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
        finally:
            c.close()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": cpu, "wall_s": wall, "trials": num, "best_trial": n, "mfu": v,
            "plan": hashlib.sha1(plans[n].encode()).hexdigest()[:10], "reported_trial": rep, "reported_mfu": rep_v,
            "reported_plan": hashlib.sha1(plans[rep].encode()).hexdigest()[:10]}


def _row(size: str, run: str, r: dict) -> str:
    return (f"{size:6s} {run:>4s} {r['cpu_s']:7.2f} {r['wall_s']:7.2f} {r['trials']:6d} {r['best_trial']:5d} "
            f"{100 * r['mfu']:7.2f} {r['plan']:>10s} {r['reported_trial']:5d} {100 * r['reported_mfu']:7.2f} "
            f"{r['reported_plan']:>10s}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["405b", "70b", "8b"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--reference", action="store_true",
                    help="also run 200 full trials per size and compare the fastest and reported plans")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[],
                    help="further `autotune run` options (last on the line)")
    a = ap.parse_args()
    if a.runs < 1:
        raise SystemExit(f"--runs must be >= 1, got {a.runs}")
    print(f"{'size':6s} {'run':>4s} {'cpu s':>7s} {'wall s':>7s} {'trials':>6s} {'fast':>5s} {'MFU %':>7s} "
          f"{'plan':>10s} {'rep.':>5s} {'MFU %':>7s} {'plan':>10s}")
    med, same = {}, {}
    for size in a.sizes:
        rows = [one_run(size, a.extra) for _ in range(a.runs)]
        for i, r in enumerate(rows, 1):
            print(_row(size, str(i), r))
        med[size] = statistics.median(r["cpu_s"] for r in rows)
        if a.reference:
            ref = one_run(size, [*a.extra, "--no-early-stop", "--trials", "200"])
            print(_row(size, "200", ref))
            same[size] = (all(r["plan"] == ref["plan"] for r in rows),
                          all(r["reported_plan"] == ref["reported_plan"] for r in rows))
    print("median CPU s: " + ", ".join(f"{s} {m:.2f}" for s, m in med.items()))
    for size, (fast, rep) in same.items():
        print(f"{size}: same fastest plan as 200 trials: {'yes' if fast else 'NO'}; "
              f"same reported plan: {'yes' if rep else 'NO'}")


if __name__ == "__main__":
    main()
