"""Benchmark (CPU): N separate ``autotune run`` processes x T trials on one SQLite file (issue 37's acceptance:
32 processes x 2 trials: 32 exit 0, 64 distinct plans).

Each process is started as a user would start one worker per shell or Slurm array task
(``autotune run --worker-id I --trials T --no-early-stop --storage sqlite:///FILE``), all at once, on a fresh
file. Printed: a table of processes, exit codes, trials stored COMPLETE, distinct plans (the trials'
parameter sets), the error lines of any process that failed, and the wall time.

    python bench/bench_sqlite_contention.py                  # 32 x 2, the acceptance run
    python bench/bench_sqlite_contention.py --procs 12       # what tests/study/test_sqlite_contention.py runs
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(procs: int, trials: int, size: str, space: str, workdir: Path) -> dict:
    """Start ``procs`` processes at once on one fresh SQLite file; wait for all; count what is stored."""
    db = workdir / "contention.db"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.monotonic()
    ps = []
    for i in range(procs):
        argv = [sys.executable, "-m", "autotune", "run", "--size", size, "--space", space, "--trials", str(trials),
                "--no-early-stop", "--worker-id", str(i), "--storage", f"sqlite:///{db}", "--json"]
        ps.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=workdir,
                                   text=True))
    codes, errors = [], {}
    for i, p in enumerate(ps):
        _, err = p.communicate()
        codes.append(p.returncode)
        if p.returncode != 0:
            errors[i] = [x for x in err.splitlines() if x.startswith("error")][:2] or err.splitlines()[-2:]
    wall = time.monotonic() - t0
    con = sqlite3.connect(db)
    rows = con.execute("SELECT t.trial_id, p.param_name, p.param_value FROM trials t JOIN trial_params p "
                       "ON p.trial_id = t.trial_id WHERE t.state = 'COMPLETE'").fetchall()
    con.close()
    params: dict[int, list] = collections.defaultdict(list)
    for tid, name, value in rows:
        params[tid].append((name, value))
    plans = {json.dumps(sorted(v)) for v in params.values()}
    return {"procs": procs, "trials_each": trials, "exit_codes": collections.Counter(codes),
            "complete": len(params), "distinct_plans": len(plans), "wall_s": wall, "errors": errors}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=32)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--size", default="8b")
    ap.add_argument("--space", default="default")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        r = run(a.procs, a.trials, a.size, a.space, Path(d))
    print(f"{'processes':>10} {'trials':>7} {'exit 0':>7} {'other exits':>12} {'COMPLETE':>9} {'distinct':>9} "
          f"{'wall s':>7}")
    other = {k: v for k, v in r["exit_codes"].items() if k != 0}
    print(f"{r['procs']:>10} {r['trials_each']:>7} {r['exit_codes'].get(0, 0):>7} {str(other or '-'):>12} "
          f"{r['complete']:>9} {r['distinct_plans']:>9} {r['wall_s']:>7.1f}")
    for i, lines in r["errors"].items():
        print(f"process {i}: " + " | ".join(lines))


if __name__ == "__main__":
    main()
