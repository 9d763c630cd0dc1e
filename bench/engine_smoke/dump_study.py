"""Per-trial table of a ``--backend real --engine torchtitan|megatron`` study: measured vs the engine
profile's prediction (step time, peak memory), as JSON and a short text table (issue 23).

    python bench/engine_smoke/dump_study.py STORAGE_URL OUT.json
"""

from __future__ import annotations

import json
import sys

import optuna


def rows(storage: str) -> list[dict]:
    out = []
    for s in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=s.study_name, storage=storage)
        for t in study.get_trials(deepcopy=False):
            a, d = t.user_attrs, t.user_attrs.get("details") or {}
            out.append({"study": s.study_name, "trial": t.number, "state": t.state.name, "plan": a.get("plan"),
                        "feasible": a.get("feasible"), "step_time_ms": a.get("step_time_ms"), "mfu": a.get("mfu"),
                        "peak_memory_bytes": a.get("peak_memory_bytes"),
                        "simulated_step_time_ms": d.get("simulated_step_time_ms"),
                        "simulated_peak_memory_bytes": d.get("simulated_peak_memory_bytes"),
                        "simulated_mfu": d.get("simulated_mfu"), "step_times_ms": d.get("step_times_ms"),
                        "warmup_s": d.get("warmup_s"), "startup_s": d.get("startup_s"), "wall_s": d.get("wall_s"),
                        "torchtitan_mfu_pct": d.get("torchtitan_mfu_pct"), "device_name": d.get("device_name"),
                        "torchtitan_version": d.get("torchtitan_version"), "engine_version": d.get("engine_version"),
                        "transformer_impl": d.get("transformer_impl"),
                        "megatron_tflops_per_gpu": d.get("megatron_tflops_per_gpu"), "losses": d.get("losses"),
                        "date": d.get("date"),
                        "log": d.get("log"), "reason": a.get("infeasible_reason") or a.get("fail_reason")
                        or a.get("pruned_reason")})
    return out


def main(storage: str, out: str) -> None:
    r = rows(storage)
    with open(out, "w") as f:
        json.dump(r, f, indent=1)
    print(f"{'#':>2} {'precision':14} {'cmp':4} {'mb x n':>6} {'rc':9} {'alloc':6} {'meas ms':>8} {'pred ms':>8} {'err%':>6} "
          f"{'meas GiB':>8} {'pred GiB':>8} {'err%':>6} {'MFU':>6} {'warm s':>6}")
    for x in r:
        p = x["plan"] or {}
        if not x["step_time_ms"]:
            print(f"{x['trial']:>2} {p.get('precision', '?'):14} {x['state']} {str(x['reason'])[:90]}")
            continue
        pm, mm = x["simulated_step_time_ms"] or 0, x["step_time_ms"]
        pg, mg = (x["simulated_peak_memory_bytes"] or 0) / 2**30, x["peak_memory_bytes"] / 2**30
        print(f"{x['trial']:>2} {p.get('precision', '?'):14} {'y' if p.get('compile') else 'n':4} "
              f"{str(p.get('micro_batch_size', 0)) + 'x' + str(p.get('num_micro_batches', 0)):>6} "
              f"{p.get('recompute', '?'):9} {str(p.get('memory_reclaim', '?'))[:6]:6} {mm:8.1f} {pm:8.1f} "
              f"{100 * (pm - mm) / mm:+6.1f} {mg:8.2f} {pg:8.2f} {100 * (pg - mg) / mg:+6.1f} "
              f"{100 * x['mfu']:5.1f}% {x['warmup_s'] or 0:6.1f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
