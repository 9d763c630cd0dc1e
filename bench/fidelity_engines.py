"""Predict every recorded real engine run and print the error per engine (issue 23).

Reads the per-trial records that ``bench/engine_smoke/dump_study.py`` wrote for ``autotune run --backend
real --engine torchtitan|megatron`` (``docs/results/engines/*/trials.json``), re-simulates each plan now with
the engine profile the runner uses (:func:`autotune.spec.engines.resolve_engine` ``(engine, "real")``, the
depth the trials ran: the job file kept beside each log), and prints measured vs predicted step time and
peak memory (measured: the engine's peak *reserved* memory of rank 0), with the mean absolute and worst
error per engine (MoE models, issue 39, as their own group ``<engine> MoE``). Megatron-LM runs with ``--transformer-impl local`` (no Transformer Engine on the host)
are listed as their own group, ``megatron (local impl)``: the ``megatron`` profile describes Transformer
Engine with fused attention, so their error is reported, not used as the profile's fidelity. Trials that
ran out of memory or failed have no step time and are counted apart. Nothing is fitted: the prediction
is the shipped calibration's.

    python bench/fidelity_engines.py [RESULTS_DIR ...]     # default: docs/results/engines/*/
"""

from __future__ import annotations

import glob
import json
import re
import sys
from pathlib import Path

from autotune.cost.simulator import SimulatedEvaluator
from autotune.spec.engines import resolve_engine
from autotune.spec.hardware import make_cluster
from autotune.spec.models import get_builtin_model, get_model
from autotune.spec.plan import Plan, Workload

ROOT = Path(__file__).resolve().parents[1]


def runs(dirs: list[str], skipped: list[dict] | None = None, *, skip_marked: bool = False) -> list[dict]:
    """Trials with a measured step time from every ``trials.json`` under ``dirs``; the others (out of memory,
    failed) go to ``skipped`` when given. With ``skip_marked`` (the default folder set of :func:`main`), a folder
    holding ``NOT_FIDELITY.txt`` (runs whose measured time holds a cost of the test set-up, not of the plan; the
    file says which and why) is left out; folders named on the command line are always read."""
    out = []
    for d in dirs:
        f = Path(d) / "trials.json"
        if not f.exists() or (skip_marked and (Path(d) / "NOT_FIDELITY.txt").exists()):
            continue
        trials = json.loads(f.read_text())
        if study := next((t["study"] for t in trials), None):
            sf = Path(d) / "shipped.json"      # torchtitan's own config of an MoE run (bench/engine_smoke/moe_shipped.py)
            if sf.exists():
                s = json.loads(sf.read_text())
                trials.append({"study": study, "trial": "shipped", "state": "COMPLETE", "plan": s["plan"],
                               "step_time_ms": s["step_time_ms"], "peak_memory_bytes": s["peak_memory_bytes"],
                               "log": s["details"].get("log") or "shipped/x.log"})
        for t in trials:
            if t.get("state") == "WAITING":
                continue                        # enqueued, never started (the study's --timeout came first)
            if t.get("step_time_ms") and t.get("plan"):
                out.append({**t, "source": str(f)})
            elif skipped is not None:
                skipped.append({**t, "source": str(f)})
    return out


def predict(t: dict) -> tuple[float, float]:
    """(step ms, peak GiB) the simulator predicts now for a recorded trial (study name:
    ``<model>/<gpu>x<n>/<fabric>/<engine>/seq<S>-gbs<B>/...``; layers from the trial's job)."""
    model_name, gpus, _fabric, engine, wl = t["study"].split("/")[:5]
    gpu, n = gpus.rsplit("x", 1)
    seq, gbs = wl.split("-")
    workload = Workload(seq_len=int(seq[3:]), global_batch_size=int(gbs[3:]))
    stem, root = Path(t["log"]).stem, Path(t["source"]).parent
    sub = "shipped/" if t["trial"] == "shipped" else ""
    if sub:
        stem = next((root / "ttlogs" / "shipped").glob("*.log")).stem
    m = None
    for job in (root / "ttlogs" / f"{sub}{stem}.toml", root / "mglogs" / f"{stem}.args"):   # the job beside the log
        if job.exists():
            m = re.search(r'flavor = "[^"]*_L(\d+)"|--num-layers (\d+)', job.read_text())
            break
    layers = int(m.group(1) or m.group(2)) if m else None
    base = get_builtin_model(model_name) or get_model(model_name)     # an MoE built-in, or a Llama 3.1 size
    model = base if layers is None else base.truncated(layers)
    ev = SimulatedEvaluator(model=model, cluster=make_cluster(gpu, int(n), None), workload=workload,
                            engine=resolve_engine(engine, "real"))
    r = ev.evaluate(Plan.from_dict(t["plan"]))
    return r.step_time_ms, r.peak_memory_bytes / 2**30


def main(argv: list[str]) -> None:
    dirs = argv or sorted(glob.glob(str(ROOT / "docs/results/engines/*/")) + glob.glob(str(ROOT / "docs/results/engines/*/*/")))
    skip_marked = not argv
    per: dict[str, list[tuple[float, float]]] = {}
    print(f"{'engine':22} {'trial':>5} {'precision':14} {'compile':7} {'meas ms':>8} {'pred ms':>8} {'err':>6} "
          f"{'meas GiB':>8} {'pred GiB':>8} {'err':>6}")
    skipped: list[dict] = []
    for t in runs(dirs, skipped, skip_marked=skip_marked):
        engine = t["study"].split("/")[3] + (" (local impl)" if t.get("transformer_impl") == "local" else "")
        if (get_builtin_model(t["study"].split("/")[0]) or get_model(t["study"].split("/")[0])).is_moe:
            engine += " MoE"        # MoE runs (issue 39) reported apart from the dense ones
        pm, pg = predict(t)
        mm, mg = t["step_time_ms"], t["peak_memory_bytes"] / 2**30
        es, em = 100 * (pm - mm) / mm, 100 * (pg - mg) / mg
        per.setdefault(engine, []).append((es, em))
        p = t["plan"]
        print(f"{engine:22} {t['trial']:>5} {p['precision']:14} {str(p['compile']):7} {mm:8.1f} {pm:8.1f} {es:+5.1f}% "
              f"{mg:8.2f} {pg:8.2f} {em:+5.1f}%")
    for engine, errs in per.items():
        s = [abs(a) for a, _ in errs]
        m = [abs(b) for _, b in errs]
        print(f"{engine}: {len(errs)} runs; step time mean |error| {sum(s) / len(s):.1f}%, worst {max(s):.1f}%; "
              f"peak memory mean |error| {sum(m) / len(m):.1f}%, worst {max(m):.1f}%")
    for t in skipped:
        print(f"not timed: {t['study'].split('/')[3]} trial {t['trial']} ({Path(t['source']).parent.name}): "
              f"{str(t.get('reason'))[:120]}")


if __name__ == "__main__":
    main(sys.argv[1:])
