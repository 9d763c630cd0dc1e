"""Markdown tables of the issue-39 MoE runs (bench/engine_smoke/run_moe.sh output, unpacked): every real trial
with the simulator's prediction beside it, torchtitan's shipped config, and the validate run of the export.

    python bench/engine_smoke/moe_table.py DIR [DIR ...]     # each DIR holds trials.json, shipped.json, validate.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GIB = 2**30


def _err(pred, meas) -> str:
    return f"{100 * (pred - meas) / meas:+.1f}%" if pred and meas else "-"


def table(d: Path) -> str:
    trials = json.loads((d / "trials.json").read_text())
    lines = ["| # | compile | mb x n | recompute | alloc | measured ms | predicted ms | error | measured GiB | "
             "predicted GiB | error | tok/s | MFU |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    best = None
    for t in trials:
        p = t.get("plan") or {}
        if t["state"] == "WAITING":
            continue                    # enqueued by the screen, not started before the study's --timeout
        if not t.get("step_time_ms"):
            lines.append(f"| {t['trial']} | {p.get('compile')} | {p.get('micro_batch_size')} x {p.get('num_micro_batches')} "
                         f"| {p.get('recompute')} | {p.get('memory_reclaim')} | {t['state']}: {str(t.get('reason'))[:80]} "
                         "| | | | | | | |")
            continue
        mm, pm = t["step_time_ms"], t.get("simulated_step_time_ms")
        mg, pg = t["peak_memory_bytes"] / GIB, (t.get("simulated_peak_memory_bytes") or 0) / GIB
        tok = 16384 / (mm / 1e3)
        if best is None or mm < best[1]:
            best = (t["trial"], mm)
        lines.append(f"| {t['trial']} | {'yes' if p.get('compile') else 'no'} | {p.get('micro_batch_size')} x "
                     f"{p.get('num_micro_batches')} | {p.get('recompute')} | {p.get('memory_reclaim')} | {mm:.1f} | "
                     f"{pm or 0:.1f} | {_err(pm, mm)} | {mg:.2f} | {pg:.2f} | {_err(pg, mg)} | {tok:,.0f} | "
                     f"{100 * t['mfu']:.1f}% |")
    out = ["\n".join(lines)]
    sf = d / "shipped.json"
    if sf.exists():
        s = json.loads(sf.read_text())
        sd = s["details"]
        out.append(f"shipped ({s['shipped']}): {s['step_time_ms']:.1f} ms, {s['tokens_per_s_per_gpu']:,.0f} tok/s, "
                   f"{s['peak_memory_bytes'] / GIB:.2f} GiB, MFU {100 * s['mfu']:.1f}%; predicted "
                   f"{sd.get('simulated_step_time_ms') or 0:.1f} ms ({_err(sd.get('simulated_step_time_ms'), s['step_time_ms'])}), "
                   f"{(sd.get('simulated_peak_memory_bytes') or 0) / GIB:.2f} GiB "
                   f"({_err(sd.get('simulated_peak_memory_bytes'), s['peak_memory_bytes'])})")
        if best:
            out.append(f"best tuned trial {best[0]}: {best[1]:.1f} ms = {s['step_time_ms'] / best[1]:.2f}x the shipped "
                       "config's tokens/s")
    vf = d / "validate.json"
    if vf.exists():
        v = json.loads(vf.read_text())
        vd = v.get("details") or {}
        line = (f"validate of the export: {v['step_time_ms']:.1f} ms, {v['peak_memory_bytes'] / GIB:.2f} GiB; predicted "
                f"{vd.get('simulated_step_time_ms') or 0:.1f} ms")
        if best:
            line += f"; {_err(v['step_time_ms'], best[1])} vs the best trial"
        out.append(line)
    return "\n\n".join(out)


if __name__ == "__main__":
    for a in sys.argv[1:]:
        print(f"## {a}\n\n{table(Path(a))}\n")
