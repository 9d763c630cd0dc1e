"""Benchmark: simulated vs measured step time and memory of the FP8 / torch.compile plans run for real.

Reads the real-backend trials of the 1-GPU FP8 study (``docs/results/fp8-1gpu-2026-12-01/trials.json``:
Llama 3.1 8B at 16 layers, seq 8192, two sequences per step, one H200, the native runtime with torchao
float8 and torch.compile per block, measured 2026-12-01) and predicts each distinct plan with the
simulated evaluator (engine ``native``), printing measured and simulated step time and peak reserved
memory with their errors. The step time is predicted whatever the memory model says (its verdict is
shown beside). The FP8 cast bandwidths of the shipped profile were derived from profiled steps of three
of these plans (``bench/derive_fp8_casts.py``), so for those the step-time match is in-sample.

Run: ``python bench/fidelity_fp8.py [--markdown docs/fidelity.md]`` (no GPU needed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.spec.hardware import ClusterSpec, make_cluster  # noqa: E402
from autotune.cost.memory import estimate_memory  # noqa: E402
from autotune.spec.models import get_model  # noqa: E402
from autotune.spec.plan import Plan, Workload  # noqa: E402
from autotune.cost.simulator import SimulatedEvaluator  # noqa: E402

TRIALS = ROOT / "docs" / "results" / "fp8-1gpu-2026-12-01" / "trials.json"
MD_START, MD_END = "<!-- fp8-table:start -->", "<!-- fp8-table:end -->"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", default=str(TRIALS))
    ap.add_argument("--markdown", default=None, metavar="FILE")
    a = ap.parse_args()
    trials = [t for t in json.loads(Path(a.trials).read_text()) if not t.get("reused_result") and t.get("step_time_ms")]
    model = get_model("8b").truncated(16)
    w = Workload(seq_len=8192, global_batch_size=2)
    cluster = make_cluster("h200", 1, "nvlink4")
    roomy = ClusterSpec(gpu=dataclasses.replace(cluster.gpu, hbm_gib=1e6), num_gpus=1, fabric=cluster.fabric)
    ev = SimulatedEvaluator(model=model, cluster=roomy, workload=w, engine="native")
    lines = ["| precision | compile | reclaim | measured ms | simulated ms | error | measured GiB | simulated GiB | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    errs, merrs = [], []
    for t in trials:
        plan = Plan.from_dict(t["plan"])
        r = ev.evaluate(plan)
        mem = estimate_memory(model, plan, cluster.gpu, w, fragmentation=ev.costs.fragmentation(), engine="native")
        e = r.step_time_ms / t["step_time_ms"] - 1
        meas_gib = t["peak_memory_bytes"] / 2**30
        me = mem.peak_bytes / 2**30 / meas_gib - 1
        errs.append(e)
        merrs.append(me)
        lines.append(f"| {plan.precision} | {plan.compile} | {plan.memory_reclaim} | {t['step_time_ms']:.1f} | "
                     f"{r.step_time_ms:.1f} | {100 * e:+.1f}% | {meas_gib:.1f} | {mem.peak_bytes / 2**30:.1f}"
                     f"{'' if mem.fits else ' (does not fit)'} | {100 * me:+.1f}% |")
    summary = (f"{len(errs)} plans: step-time MAPE {100 * statistics.mean(map(abs, errs)):.1f}% (worst "
               f"{100 * max(errs, key=abs):+.1f}%), peak memory MAPE {100 * statistics.mean(map(abs, merrs)):.1f}% "
               f"(worst {100 * max(merrs, key=abs):+.1f}%); 1x H200, torch 2.11.0+cu130, torchao 0.17.0, measured "
               "2026-12-01; simulated by the current model (`python bench/fidelity_fp8.py`)")
    print("\n".join(lines))
    print(summary)
    if a.markdown:
        table = "\n".join(lines) + "\n\n" + summary + "\n"
        p = Path(a.markdown)
        text = p.read_text()
        if MD_START in text and MD_END in text:
            head, rest = text.split(MD_START, 1)
            text = f"{head}{MD_START}\n{table}{MD_END}{rest.split(MD_END, 1)[1]}"
        else:
            text += f"\n## FP8 and torch.compile plans (1x H200, native runtime)\n\n{MD_START}\n{table}{MD_END}\n"
        p.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
