"""Search quality and speed of `autotune run` (issues 10, 26): best MFU at 50 / 100 / 200 trials, seeds 0-4,
trials to the reference optimum, and the run with the convergence stop (`autotune run`'s default).

    python bench/bench_search.py                  # the table (7 targets x 5 seeds x (200 trials + a stopped run))
    python bench/bench_search.py --rank-correlation   # the screening estimate's rank correlation per target
    python bench/bench_search.py --no-stop-runs   # the 200-trial runs only
    python bench/bench_search.py --reference      # recompute the long reference searches -> bench/search_reference.json
    python bench/bench_search.py --reference --jobs 2   # the same, two targets at a time (one per core)
    python bench/bench_search.py --targets 8b-h200x8 --seeds 0 1 --trials 200

Each run is a fresh study (a temporary SQLite file) with the default space, engine and simulated
backend, exactly what `autotune run` does. The 50- and 100-trial columns are the best of the run's first
50 / 100 trials: the sampler does not read the budget, so these are the results of 50- and 100-trial runs.
'to opt' is the number of trials until the first one at the reference MFU. The stopped run ('stop') is a
second fresh study with ``Tuner.optimize(stop_when_converged=True)``: trials it ran, its best MFU, whether
that is the 200-trial run's best ('same'), wall and CPU seconds; then the conservative estimate (MFU at the
low end of its 80% interval, issue 40) of the plan each run reports ('rep.cons': the 200-trial run's, 'stop':
the stopped run's) and whether the stopped run reports one as good: what the convergence stop guarantees.
Wall and CPU seconds are for the whole 200-trial run (study setup included), on this machine, with the
1-minute load average at the run's start: wall well above CPU means other processes shared the cores
(the issue's budget, <= 30 s per run, is wall time on an otherwise idle 2-core machine).

The reference (``--reference``) is one long search per target (``--reference-trials``, default 3,000,
seed 1000, not among the table's seeds; at one layout per 4 trials it evaluates every layout that fits,
at most 739 per target, plus ~2,250 local-search steps), committed with its date and code version (``git describe``);
the gap is (reference - best) / reference in percent. The cost model may change after the reference
was computed: a negative gap, or a reference whose ``code_version`` is not the current commit, means
recompute it with ``--reference``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.spec.hardware import make_cluster  # noqa: E402
from autotune.spec.models import get_model  # noqa: E402
from autotune.spec.plan import Workload  # noqa: E402
from autotune.tune.tuner import Tuner  # noqa: E402
from autotune.study.trials import is_feasible  # noqa: E402

M = 2**20
#: name -> (model size, GPU, GPU count, fabric (None: the GPU's default), global batch tokens); issue 10
TARGETS = {
    "405b-h100x8192": ("405b", "h100", 8192, "nvlink4+roce400", 16 * M),
    "405b-b200x1024": ("405b", "b200", 1024, "nvlink5+ib-ndr400", 16 * M),
    "70b-h100x64": ("70b", "h100", 64, "nvlink4+ib-ndr400", 4 * M),
    # a fresh user's case (2026-12-01): the search never tried FP8 here (precision chosen once for all layouts)
    "70b-b200x64": ("70b", "b200", 64, "nvlink5+ib-ndr400", 4 * M),
    "8b-h200x8": ("8b", "h200", 8, None, 1 * M),
    # slow fabrics (issue 26): the case `retune` exists for; DP / PP traffic over Ethernet is exposed
    "70b-h100x256-eth10": ("70b", "h100", 256, "nvlink4+eth10", 4 * M),
    "70b-h200x512-eth100": ("70b", "h200", 512, "pcie5+eth100", 4 * M),
}
REFERENCE_FILE = ROOT / "bench" / "search_reference.json"
BUDGETS = (50, 100, 200)


def code_version() -> str:
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _target(target: str):
    size, gpu, n, fabric, tokens = TARGETS[target]
    return get_model(size), make_cluster(gpu, n, fabric), Workload.from_tokens(seq_len=8192,
                                                                              global_batch_tokens=tokens)


def run_one(target: str, seed: int, trials: int, sampler: str = "layout", stop: bool = False) -> dict:
    """One fresh study of ``trials`` trials; best MFU after each budget, wall and CPU time (s), the best
    plan, the first trial at the best MFU (``best_trial``). ``stop``: with the convergence stop (what
    ``autotune run`` does; ``trials`` is then an upper bound, ``ran`` says how many ran)."""
    model, cluster, w = _target(target)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    with tempfile.TemporaryDirectory() as d:
        t0, c0 = time.perf_counter(), time.process_time()
        tuner = Tuner(model=model, cluster=cluster, workload=w, storage=f"sqlite:///{d}/s.db", seed=seed,
                      sampler=sampler)
        summary = tuner.optimize(trials, show_progress_bar=False, stop_when_converged=stop)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        trials_ = tuner.study.get_trials(deepcopy=False)
        info = tuner.info
        tuner.close()
    best_at = {}
    for b in sorted(set(BUDGETS) | {trials}):
        if b > trials:
            continue
        vals = [t.value for t in trials_ if t.number < b and is_feasible(t)]
        best_at[b] = max(vals) if vals else 0.0
    feas = [t for t in trials_ if is_feasible(t)]
    best = max(feas, key=lambda t: (t.value, -t.number)) if feas else None
    distinct = len({json.dumps(t.user_attrs.get("plan"), sort_keys=True) for t in trials_})
    # the plan `autotune run` reports: the first by the conservative estimate (issue 40; study/trials.py
    # robust_order), and that estimate (MFU at the low end of its 80% interval)
    from autotune.study.trials import rank_basis, robust_order, trial_factor

    basis = rank_basis(info)
    rep = robust_order(feas, basis, k=1)[0] if feas else None
    rep_cons = rep.value * (trial_factor(rep, basis) if basis else 1.0) if rep else 0.0
    return {"target": target, "seed": seed, "trials": trials, "best_at": best_at, "wall_s": wall, "cpu_s": cpu,
            "load_1min": load, "ran": len(trials_), "stop_reason": summary.stop_reason,
            "best_trial": best.number if best else None, "best_mfu": best.value if best else 0.0,
            "distinct_plans": distinct, "best_plan": best.user_attrs.get("plan") if best else None,
            "reported_trial": rep.number if rep else None, "reported_mfu": rep.value if rep else 0.0,
            "reported_conservative": rep_cons,
            "values": [(t.number, t.value) for t in feas]}


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation of ``a`` and ``b`` (Pearson's on ranks; ties take their mean rank)."""
    def ranks(x: list[float]) -> list[float]:
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    return cov / (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5


def rank_correlation(target: str) -> dict:
    """The screening estimate against the simulation over every ranked layout of ``target`` (each layout's
    plan as the sampler ranks it, seed 0): Spearman's rank correlation of estimated and simulated step
    times, and where the simulated best layout stands in the estimate's order."""
    from autotune.cost.memory import estimate_memory
    from autotune.cost.simulator import SimulatedEvaluator
    from autotune.search import make_sampler

    model, cluster, w = _target(target)
    tuner = Tuner(model=model, cluster=cluster, workload=w, storage="sqlite:///:memory:")
    ev = SimulatedEvaluator(model=model, cluster=cluster, workload=w, engine=tuner.engine)
    s = make_sampler(tuner.bound, model=model, cluster=cluster, workload=w, engine=tuner.engine, costs=ev.costs,
                     seed=0)
    c0 = time.process_time()
    layouts = s.layouts()
    rank_cpu = time.process_time() - c0
    est, sim = [], []
    for p in layouts:
        mem = estimate_memory(model, p, cluster.gpu, w, fragmentation=ev.costs.fragmentation(), engine=ev.engine)
        sim.append(ev._simulate(p, [float(x.total_bytes) for x in mem.stages])[0])
        est.append(s.screen.estimate_ms(p))
    best = min(range(len(sim)), key=lambda i: sim[i])
    return {"target": target, "layouts": len(layouts), "spearman": spearman(est, sim),
            "best_sim_rank_by_estimate": sorted(est).index(est[best]) + 1, "rank_cpu_s": rank_cpu,
            "max_ratio": max(a / b for a, b in zip(sim, est)), "min_ratio": min(a / b for a, b in zip(sim, est))}


def paper_plan_mfu() -> float:
    """Simulated MFU of the Llama 3 paper's 8,192-GPU plan (bench/published.py's plan_for, megatron)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from published import DEFAULT_RUNS, load_runs, plan_for

    from autotune.cost.simulator import SimulatedEvaluator

    size, gpu, n, fabric, tokens = TARGETS["405b-h100x8192"]
    grp = load_runs(DEFAULT_RUNS)["llama3_paper_table4"]
    run = dict(next(r for r in grp["runs"] if r.get("gpus") == 8192), _group="llama3_paper_table4")
    model = get_model(size)
    plan = plan_for(run, "megatron", n, model.num_layers)
    ev = SimulatedEvaluator(model=model, cluster=make_cluster(gpu, n, fabric),
                            workload=Workload.from_tokens(seq_len=8192, global_batch_tokens=tokens), engine="megatron")
    res = ev.evaluate(plan)
    if res.feasible:
        return res.mfu
    # the memory model (schedule-counted activations) puts the paper's plan over the H100's 80 GB;
    # its step time is still simulated, as the paper ran it
    from autotune.cost.memory import estimate_memory
    from autotune.cost.simulator import make_result

    print(f"note: the Llama 3 paper's plan {res.infeasible_reason}; its MFU below is simulated regardless")
    mem = estimate_memory(model, plan, ev.cluster.gpu, ev.workload, fragmentation=ev.costs.fragmentation(),
                          engine=ev.engine)
    step, bd, _ = ev._simulate(plan, [float(x.total_bytes) for x in mem.stages])
    return make_result(backend="simulated", model=model, cluster=ev.cluster, workload=ev.workload, plan=plan,
                       step_time_ms=step, breakdown_ms=bd, peak_memory_bytes=int(mem.peak_bytes),
                       memory_per_stage_bytes=(), details={}).mfu


def _reference_run(args: tuple[str, int]) -> dict:
    return run_one(args[0], 1000, args[1])


def reference(targets: list[str], trials: int, jobs: int = 1) -> None:
    """One long search per target (seed 1000), written to :data:`REFERENCE_FILE` as each ends; ``jobs``
    targets at a time in separate processes (each run is single-threaded; the result does not depend on
    ``jobs``, its wall time does)."""
    version = code_version()
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor
        pool = ProcessPoolExecutor(max_workers=jobs)
        results = pool.map(_reference_run, [(t, trials) for t in targets])
    else:
        pool = None
        results = (run_one(t, 1000, trials) for t in targets)
    for t, r in zip(targets, results):
        r.pop("values", None)
        data = json.loads(REFERENCE_FILE.read_text()) if REFERENCE_FILE.exists() else {}
        data[t] = {"best_mfu": r["best_at"][trials], "trials": trials, "seed": 1000, "sampler": "layout",
                   "wall_s": round(r["wall_s"], 1), "best_plan": r["best_plan"],
                   "date": datetime.date.today().isoformat(), "code_version": version}
        REFERENCE_FILE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"{t}: reference best MFU {100 * r['best_at'][trials]:.2f}% in {trials} trials "
              f"({r['wall_s']:.0f} s wall, {r['cpu_s']:.0f} s CPU)", flush=True)
    if pool is not None:
        pool.shutdown()


def _to_optimum(trial_values: list[tuple[int, float]], ref: float | None) -> int | None:
    """Trials until the first one at the reference MFU (within 1e-9 relative), None if none got there."""
    if not ref:
        return None
    hit = [n for n, v in trial_values if v >= ref * (1 - 1e-9)]
    return min(hit) + 1 if hit else None


def table(targets: list[str], seeds: list[int], trials: int, sampler: str, out: Path | None,
          stop_runs: bool = True) -> list[dict]:
    """Per target and seed: a full ``trials``-trial run (the budget columns, trials to the reference
    optimum) and, with ``stop_runs``, a run with the convergence stop (``autotune run``'s default)."""
    rows = []
    version = code_version()            # the code the runs use (read once: the tree may change meanwhile)
    ref = json.loads(REFERENCE_FILE.read_text()) if REFERENCE_FILE.exists() else {}
    for t in targets:
        for s in seeds:
            r = run_one(t, s, trials, sampler)
            r["to_optimum"] = _to_optimum(r.pop("values"), ref.get(t, {}).get("best_mfu"))
            if stop_runs and sampler == "layout":
                st = run_one(t, s, trials, sampler, stop=True)
                st.pop("values")
                r["stop"] = {k: st[k] for k in ("ran", "best_mfu", "wall_s", "cpu_s", "stop_reason", "load_1min",
                                                "reported_trial", "reported_mfu", "reported_conservative")}
            rows.append(r)
            print(f"{t} seed {s}: {100 * r['best_at'][trials]:.2f}% ({r['wall_s']:.1f} s wall, "
                  f"{r['cpu_s']:.1f} s CPU); to optimum {r['to_optimum']}"
                  + (f"; with the stop: {r['stop']['ran']} trials, {100 * r['stop']['best_mfu']:.2f}%, "
                     f"{r['stop']['cpu_s']:.1f} s CPU" if "stop" in r else ""),
                  file=sys.stderr, flush=True)
            if out:
                out.write_text(json.dumps({"date": datetime.date.today().isoformat(), "code_version": version,
                                           "sampler": sampler, "trials": trials, "rows": rows}, indent=1,
                                          default=str) + "\n")
    print_table(rows, trials, sampler)
    return rows


def print_table(rows: list[dict], trials: int, sampler: str) -> None:
    """The table: best MFU per budget, the reference, the gap (%), trials to the reference optimum, wall and
    CPU seconds per run; then the convergence-stopped runs (trials run, best MFU, same best as the full run,
    wall and CPU seconds)."""
    ref = json.loads(REFERENCE_FILE.read_text()) if REFERENCE_FILE.exists() else {}
    for r in rows:                                  # JSON turns the budget keys into strings
        r["best_at"] = {int(k): v for k, v in r["best_at"].items()}
    marks = [k for k in (50, 100) if k < trials] + [trials]     # the budgets a run of `trials` trials reaches
    print(f"sampler {sampler}; code {code_version()}; best MFU (simulated, causal, %) at "
          f"{' / '.join(map(str, marks))} trials; "
          f"'to opt': trials until the reference MFU; wall and CPU seconds per {trials}-trial run (wall > CPU: the "
          f"machine was busy; load at each run's start in 'load'); 'stop': the run with the convergence stop")
    print(f"{'target':20} {'seed':>4} {' '.join(('@' + str(k)).rjust(7) for k in marks)} {'ref':>7} {'gap %':>6} "
          f"{'to opt':>6} {'wall s':>6} {'cpu s':>6} {'load':>5} {'plans':>5} | {'stop@':>5} {'best':>7} {'same':>4} "
          f"{'wall s':>6} {'cpu s':>6} | {'rep.cons':>8} {'stop':>7} {'same':>4}")
    for t in dict.fromkeys(r["target"] for r in rows):
        r_best = ref.get(t, {}).get("best_mfu")
        mine = [r for r in rows if r["target"] == t]
        for r in mine:
            b = r["best_at"]
            r["gap_pct"] = 100 * (r_best - b[trials]) / r_best if r_best else float("nan")
            cells = [f"{100 * b.get(k, float('nan')):7.2f}" for k in marks]
            st = r.get("stop")
            stop = (f"{st['ran']:>5} {100 * st['best_mfu']:7.2f} {'yes' if st['best_mfu'] >= b[trials] else 'NO':>4} "
                    f"{st['wall_s']:6.1f} {st['cpu_s']:6.1f}") if st else ""
            if st and "reported_conservative" in r and "reported_conservative" in st:
                # the reported plan's conservative estimate: the full run's, the stopped run's, the same?
                rc, sc = r["reported_conservative"], st["reported_conservative"]
                stop += f" | {100 * rc:8.2f} {100 * sc:7.2f} {'yes' if sc >= rc * (1 - 1e-9) else 'NO':>4}"
            print(f"{t:20} {r['seed']:>4} {' '.join(cells)} {100 * r_best if r_best else float('nan'):7.2f} "
                  f"{r['gap_pct']:6.2f} {str(r.get('to_optimum')):>6} {r['wall_s']:6.1f} {r['cpu_s']:6.1f} "
                  f"{r.get('load_1min', float('nan')):5.2f} {r['distinct_plans']:>5} | {stop}")
        print(f"{t:20} mean {100 * statistics.mean(r['best_at'][trials] for r in mine):.2f}%, "
              f"worst gap {max(r['gap_pct'] for r in mine):.2f}%, max wall {max(r['wall_s'] for r in mine):.1f} s "
              f"(cpu {max(r['cpu_s'] for r in mine):.1f} s)")
        if t == "405b-h100x8192":
            paper = paper_plan_mfu()
            ratios = [r["best_at"][trials] / paper for r in mine]
            print(f"{t:16} Llama 3 paper's plan (TP8 PP16 v8 DP64, BF16, megatron) simulated MFU "
                  f"{100 * paper:.2f}%; best / paper: {min(ratios):.2f}x .. {max(ratios):.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", nargs="*", default=list(TARGETS), choices=list(TARGETS))
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--sampler", default="layout", choices=("layout", "tpe"))
    ap.add_argument("--reference", action="store_true", help="recompute the reference searches")
    ap.add_argument("--reference-trials", type=int, default=3000)
    ap.add_argument("--jobs", type=int, default=1, help="reference only: targets searched at once (processes)")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON (after each run)")
    ap.add_argument("--summarize", type=Path, help="print the table of a --json file (with the current reference)")
    ap.add_argument("--no-stop-runs", action="store_true", help="skip the runs with the convergence stop")
    ap.add_argument("--rank-correlation", action="store_true",
                    help="the estimate's rank correlation with the simulation over every layout, per target")
    a = ap.parse_args()
    if a.summarize:
        d = json.loads(a.summarize.read_text())
        print(f"(runs of {d['date']}, code {d['code_version']})")
        print_table(d["rows"], d["trials"], d["sampler"])
    elif a.rank_correlation:
        print(f"{'target':20} {'layouts':>7} {'spearman':>8} {'best@':>5} {'sim/est':>13} {'rank cpu s':>10}")
        for t in a.targets:
            r = rank_correlation(t)
            print(f"{t:20} {r['layouts']:>7} {r['spearman']:8.4f} {r['best_sim_rank_by_estimate']:>5} "
                  f"{r['min_ratio']:6.2f}-{r['max_ratio']:<6.2f} {r['rank_cpu_s']:10.1f}", flush=True)
    elif a.reference:
        reference(a.targets, a.reference_trials, a.jobs)
    else:
        table(a.targets, a.seeds, a.trials, a.sampler, a.json, stop_runs=not a.no_stop_runs)


if __name__ == "__main__":
    main()
