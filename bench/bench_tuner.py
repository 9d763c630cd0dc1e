"""Benchmark: `autotune run --size 405b --trials 200` end to end on this machine (simulated backend).

Prints wall time, trials/s, evaluated graphs and the time per simulated step graph, and the best MFU
found. The acceptance goal is under 60 s on a 2-core machine. Run: ``python bench/bench_tuner.py``.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.cli.options import resolve_target
from autotune.tune.tuner import Tuner  # noqa: E402


def main(trials: int = 200) -> None:
    model, cluster, workload = resolve_target(size="405b", model_path=None, gpu=None, gpus=None, interconnect=None,
                                              seq_len=None, global_batch=None)
    with tempfile.TemporaryDirectory() as d:
        t = Tuner(model=model, cluster=cluster, workload=workload, storage=f"sqlite:///{d}/bench.db", seed=0)
        t0 = time.perf_counter()
        s = t.optimize(trials, show_progress_bar=False)
        wall = time.perf_counter() - t0
        ev = t.evaluator
        n_graphs = getattr(ev, "num_graphs", 0)
        n_sim = getattr(ev, "num_simulated_plans", 0)
        sim_ms = getattr(ev, "simulated_ms", 0.0)
        t.close()
    print(f"{'target':44s} {'trials':>6s} {'wall s':>7s} {'trials/s':>9s} {'plans simulated':>15s} "
          f"{'graphs':>7s} {'ms per simulated plan':>21s} {'best MFU (simulated)':>21s}")
    print(f"{model.name + ' ' + cluster.label:44s} {trials:6d} {wall:7.1f} {trials / wall:9.2f} {n_sim:15d} "
          f"{n_graphs:7d} {sim_ms / max(n_sim, 1):21.1f} {s.best.result.mfu:21.1%}")
    print("goal: < 60 s for 200 trials on a 2-core machine: " + ("met" if wall < 60 else "NOT met"))


if __name__ == "__main__":
    main()
