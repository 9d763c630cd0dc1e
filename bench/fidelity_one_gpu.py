"""Benchmark (CPU): simulated vs measured step time and memory of the one-GPU lever runs of issue 43.

Reads ``docs/results/one-gpu-levers-h200x1-2026-12-03/bench_one_gpu.json`` (call 1: every lever alone)
and ``call2/bench2.json`` + ``call2/trials.json`` (call 2: base, chunked loss, and the tuner's first trial
of the default space) and predicts each native-runtime row with the simulated evaluator (engine
``native``, Llama 3.1 8B at 16 layers, seq 8192, 2 sequences, 1x H200), printing measured and simulated
step time and peak reserved memory with their errors. Nothing is fitted to these rows.

Run: ``python bench/fidelity_one_gpu.py`` (no GPU needed).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.cost.memory import estimate_memory  # noqa: E402
from autotune.cost.simulator import SimulatedEvaluator  # noqa: E402
from autotune.spec.hardware import ClusterSpec, make_cluster  # noqa: E402
from autotune.spec.models import get_model  # noqa: E402
from autotune.spec.plan import Plan, Workload  # noqa: E402

RES = ROOT / "docs" / "results" / "one-gpu-levers-h200x1-2026-12-03"


def rows():
    for call, f in (("1", RES / "bench_one_gpu.json"), ("2", RES / "call2" / "bench2.json")):
        for r in json.loads(f.read_text())["rows"]:
            if "result" in r and r["name"] != "plain":
                yield call, r["name"], r["result"]["plan"], r["step_time_ms"], r["reserved_gib"]
    for t in json.loads((RES / "call2" / "trials.json").read_text()):
        if t.get("step_time_ms"):
            yield "2", f"tuner trial {t['number']}", t["plan"], t["step_time_ms"], t["peak_memory_bytes"] / 2**30


def main() -> int:
    model = get_model("8b").truncated(16)
    w = Workload(seq_len=8192, global_batch_size=2)
    cluster = make_cluster("h200", 1, "nvlink4")
    roomy = ClusterSpec(gpu=dataclasses.replace(cluster.gpu, hbm_gib=1e6), num_gpus=1, fabric=cluster.fabric)
    ev = SimulatedEvaluator(model=model, cluster=roomy, workload=w, engine="native")
    print("| call | row | measured ms | simulated ms | error | measured GiB | simulated GiB | error |")
    print("|---|---|---|---|---|---|---|---|")
    for call, name, pd, ms, gib in rows():
        plan = Plan.from_dict(pd)
        s = ev.evaluate(plan)
        mem = estimate_memory(model, plan, cluster.gpu, w, fragmentation=ev.costs.fragmentation(), engine="native")
        sg = mem.peak_bytes / 2**30
        print(f"| {call} | {name} | {ms:.1f} | {s.step_time_ms:.1f} | {100 * (s.step_time_ms / ms - 1):+.1f}% | "
              f"{gib:.1f} | {sg:.1f} | {100 * (sg / gib - 1):+.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
