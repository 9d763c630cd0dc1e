"""`--workers N` against one worker for the same number of trials (issue 26): total CPU seconds (the parent
and its worker processes), repeated plans, plans that do not fit and invalid (pruned) plans.

    python bench/bench_search_workers.py                       # 70b-h100x64, 4 workers x 25 trials vs 1 x 100
    python bench/bench_search_workers.py --target 8b-h200x8 --workers 4 --trials 20

Both runs use fresh studies (temporary SQLite files), the default space and the simulated backend, as
`autotune run --workers N` does (autotune/tune/workers.py ``prepare_workers``): the parent ranks the layouts once,
placing those the workers' trials take, stores the ranking in the study and, when it forks the workers,
simulates the plans of the first layouts (their step structures are then inherited); the workers (forked from that process where it is safe, as here
with the simulated backend, else from a fork server: autotune/tune/workers.py ``_context``) read it and share base
plans' neighbours through the study. The convergence stop is off, so both runs evaluate the same number of
trials. CPU is this process's and its children's (run_workers reaps its workers, and a fork server when there
is one, so their CPU counts).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_search import TARGETS, _target  # noqa: E402

from autotune.study.trials import is_feasible  # noqa: E402
from autotune.tune.tuner import Tuner  # noqa: E402
from autotune.tune.workers import prepare_workers, run_workers  # noqa: E402


def usage() -> tuple[float, float, int]:
    """(user s, system s, minor page faults) of this process and its waited-for children so far."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + b.ru_utime, a.ru_stime + b.ru_stime, a.ru_minflt + b.ru_minflt


def cpu_s() -> float:
    """CPU seconds (user + system) of this process and its waited-for children so far."""
    u, s, _ = usage()
    return u + s


def run(target: str, workers: int, per_worker: int) -> dict:
    model, cluster, w = _target(target)
    with tempfile.TemporaryDirectory() as d:
        kw = dict(model=model, cluster=cluster, workload=w, storage=f"sqlite:///{d}/s.db", seed=0)
        u0, t0 = usage(), time.perf_counter()
        t = Tuner(**kw)
        if workers == 1:
            t.optimize(per_worker, show_progress_bar=False)
        else:
            prepare_workers(t, workers, per_worker)     # as `autotune run --workers N`, before the workers
            outs = run_workers({**kw, "space": t.space}, workers, n_trials=per_worker, study_checked=True)
            assert all(o.error is None for o in outs), outs
        u1, wall = usage(), time.perf_counter() - t0
        user, system, faults = (b - a for a, b in zip(u0, u1))
        trials = t.study.get_trials(deepcopy=False)
        plans = [json.dumps(x.user_attrs.get("plan"), sort_keys=True) for x in trials]
        best = max((x.value for x in trials if is_feasible(x)), default=0.0)
        return {"workers": workers, "trials": len(trials), "cpu_s": user + system, "wall_s": wall,
                "system_s": system, "minor_faults": faults,     # forked workers copy the parent's pages they touch
                "repeated": len(plans) - len(set(plans)),
                "unfit": sum(1 for x in trials if x.user_attrs.get("feasible") is False),
                "invalid": sum(1 for x in trials if x.state.name == "PRUNED"),
                "failed": sum(1 for x in trials if x.state.name == "FAIL"), "best_mfu": best}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="70b-h100x64", choices=list(TARGETS))
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--trials", type=int, default=25, help="per worker")
    a = ap.parse_args()
    rows = [run(a.target, 1, a.workers * a.trials), run(a.target, a.workers, a.trials)]
    print(f"{a.target}: {'workers':>7} {'trials':>6} {'cpu s':>6} {'wall s':>6} {'repeat':>6} {'unfit':>5} "
          f"{'invalid':>7} {'failed':>6} {'best %':>7} {'sys s':>6} {'faults':>7}")
    for r in rows:
        print(f"{'':{len(a.target) + 1}} {r['workers']:>7} {r['trials']:>6} {r['cpu_s']:6.1f} {r['wall_s']:6.1f} "
              f"{r['repeated']:>6} {r['unfit']:>5} {r['invalid']:>7} {r['failed']:>6} {100 * r['best_mfu']:7.2f} "
              f"{r['system_s']:6.2f} {r['minor_faults']:>7}")
    print(f"CPU ratio, {a.workers} workers / 1: {rows[1]['cpu_s'] / rows[0]['cpu_s']:.2f}")


if __name__ == "__main__":
    main()
