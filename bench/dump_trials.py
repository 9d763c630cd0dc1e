"""Print and save every trial of the studies in an autotune storage: plan settings that vary in the
one-GPU FP8 study, measured step time (ms) and MFU (causal, dense BF16 peak), the simulator's step time
for the same plan and its error (%), peak reserved memory (GiB), or the prune / failure reason.

Run: ``python bench/dump_trials.py [--storage URL] [--json FILE]``
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import optuna
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--storage", default="sqlite:///studies/autotune.db")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rows = []
    for s in optuna.get_all_study_summaries(a.storage):
        st = optuna.load_study(study_name=s.study_name, storage=a.storage)
        print(s.study_name)
        print(f"{'#':>3s} {'precision':15s} {'compile':7s} {'reclaim':20s} {'meas ms':>8s} {'sim ms':>8s} "
              f"{'err %':>6s} {'MFU':>6s} {'GiB':>6s}  note")
        for t in st.trials:
            u = t.user_attrs
            p = u.get("plan") or {}
            d = u.get("details") or {}
            row = {"study": s.study_name, "number": t.number, "state": t.state.name, "plan": p,
                   "step_time_ms": u.get("step_time_ms"), "mfu": u.get("mfu"),
                   "simulated_step_time_ms": d.get("simulated_step_time_ms"),
                   "simulated_error_pct": d.get("simulated_error_pct"),
                   "peak_memory_bytes": u.get("peak_memory_bytes"), "honored": d.get("honored"),
                   "reason": u.get("pruned_reason") or u.get("fail_reason") or u.get("infeasible_reason"),
                   "reused_result": u.get("reused_result", False)}
            rows.append(row)
            f = lambda v, fmt: format(v, fmt) if isinstance(v, (int, float)) else "-"
            gib = row["peak_memory_bytes"] / 2**30 if row["peak_memory_bytes"] else None
            print(f"{t.number:3d} {str(p.get('precision')):15s} {str(p.get('compile')):7s} "
                  f"{str(p.get('memory_reclaim')):20s} {f(row['step_time_ms'], '8.1f')} "
                  f"{f(row['simulated_step_time_ms'], '8.1f')} {f(row['simulated_error_pct'], '6.1f')} "
                  f"{f(row['mfu'], '6.1%')} {f(gib, '6.1f')}  {t.state.name}"
                  f"{' (reused)' if row['reused_result'] else ''} {(row['reason'] or '')[:160]}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
