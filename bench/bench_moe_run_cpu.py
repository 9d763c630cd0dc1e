"""CPU and wall seconds of `autotune run --model deepseek-v3 --gpu b200 --gpus 256` against the dense
`autotune run --size 405b` (issue 38 acceptance: the MoE run takes no longer than the dense one on the same
machine), each as a user runs it: a fresh process (imports included), a fresh SQLite study, the simulated backend
and the convergence stop. CPU is user + system of the child (``RUSAGE_CHILDREN``; what ``/usr/bin/time -v``
reports as User + System time).

With ``--before DIR`` (a source tree of another version, e.g. ``git archive <commit> | tar -x -C DIR``) every
command also runs from that tree, alternating run by run (CPU time on a shared machine moves with the load:
compare in the same minutes), and the script checks that both versions print the same output (the storage path
masked) and store the same trials (state, parameters, values and user attributes of every trial but the worker's pid).

    python bench/bench_moe_run_cpu.py                                  # 3 runs of each command, this tree
    python bench/bench_moe_run_cpu.py --before /tmp/before --runs 3    # and the other version, alternating

Prints one row per run and a markdown table of the medians (bench/moe_run_cpu-2026-12-03.md keeps one).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {"dense 405B": ["--size", "405b"],
            "DeepSeek-V3 x 256 B200": ["--model", "deepseek-v3", "--gpu", "b200", "--gpus", "256"]}


def _trials_digest(db: Path) -> str:
    """SHA-1 of every trial's number, state, parameters, values and user attributes (JSON, sorted), less the
    ``worker`` attribute (host, pid and start time of the process that ran it)."""
    c = sqlite3.connect(db)
    try:
        rows = []
        for tid, num, state in c.execute("SELECT trial_id, number, state FROM trials ORDER BY number"):
            params = c.execute("SELECT param_name, param_value FROM trial_params WHERE trial_id = ? "
                               "ORDER BY param_name", (tid,)).fetchall()
            values = c.execute("SELECT objective, value FROM trial_values WHERE trial_id = ? ORDER BY objective",
                               (tid,)).fetchall()
            attrs = c.execute("SELECT key, value_json FROM trial_user_attributes WHERE trial_id = ? AND "
                              "key != 'worker' ORDER BY key", (tid,)).fetchall()
            rows.append([num, state, params, values, attrs])
    finally:
        c.close()
    return hashlib.sha1(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:12]


def one_run(tree: Path, args: list[str]) -> dict:
    """One `autotune run ARGS` from source tree ``tree`` on a fresh SQLite file: CPU, wall, output, trials."""
    with tempfile.TemporaryDirectory() as d:
        db = Path(d) / "s.db"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "autotune", "run", *args, "--storage", f"sqlite:///{db}"],
                           cwd=tree, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if r.returncode != 0:
            raise SystemExit(f"autotune run {' '.join(args)} from {tree} failed ({r.returncode}): {r.stderr[-300:]}")
        out = r.stdout.replace(str(db), "DB")
        trials = _trials_digest(db)
    return {"user_s": after.ru_utime - before.ru_utime, "sys_s": after.ru_stime - before.ru_stime, "wall_s": wall,
            "stdout": hashlib.sha1(out.encode()).hexdigest()[:12], "trials": trials,
            "mfu": next((ln.split()[1] for ln in out.splitlines() if ln.startswith("MFU")), "?")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--before", type=Path, default=None, help="source tree of the version to compare with")
    a = ap.parse_args()
    if a.runs < 1:
        raise SystemExit(f"--runs must be >= 1, got {a.runs}")
    if a.before is not None and not (a.before / "autotune" / "__main__.py").is_file():
        raise SystemExit(f"--before {a.before}: not a source tree of autotune (no autotune/__main__.py there)")
    trees = {"before": a.before, "after": ROOT} if a.before is not None else {"this": ROOT}
    rows: dict[tuple[str, str], list[dict]] = {}
    load0 = os.getloadavg()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}, load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}")
    print(f"{'command':24s} {'tree':6s} {'run':>3s} {'user s':>7s} {'sys s':>6s} {'cpu s':>6s} {'wall s':>7s} "
          f"{'MFU':>6s} {'stdout':>12s} {'trials':>12s}")
    for i in range(1, a.runs + 1):
        for name, args in COMMANDS.items():
            for tag, tree in trees.items():
                r = one_run(tree, args)
                rows.setdefault((name, tag), []).append(r)
                print(f"{name:24s} {tag:6s} {i:3d} {r['user_s']:7.2f} {r['sys_s']:6.2f} "
                      f"{r['user_s'] + r['sys_s']:6.2f} {r['wall_s']:7.2f} {r['mfu']:>6s} {r['stdout']:>12s} "
                      f"{r['trials']:>12s}", flush=True)
    load1 = os.getloadavg()
    print(f"load average at the end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    print()
    print("| command | tree | runs | CPU s (user + sys), median [min-max] | wall s, median [min-max] | same output and trials |")
    print("|---|---|---|---|---|---|")
    for (name, tag), rs in rows.items():
        cpu = [r["user_s"] + r["sys_s"] for r in rs]
        wall = [r["wall_s"] for r in rs]
        ref = rows.get((name, "before"), rs)[0]
        same = all(r["stdout"] == ref["stdout"] and r["trials"] == ref["trials"] for r in rs)
        print(f"| {name} | {tag} | {len(rs)} | {statistics.median(cpu):.2f} [{min(cpu):.2f}-{max(cpu):.2f}] | "
              f"{statistics.median(wall):.2f} [{min(wall):.2f}-{max(wall):.2f}] | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
