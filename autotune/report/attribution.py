"""Which knob brings how much: a one-knob-at-a-time attribution from a named baseline plan to the tuned plan
(issue 40), simulated.

From the baseline B (the published plan for the target, or the user's ``--compare-to`` plan), each knob group
in which the tuned plan T differs is set to T's value alone, the rest kept at B's, and the plan predicted with
the same evaluator as T: the group's gain is MFU(B with it) - MFU(B), in percentage points. The groups are the
layout (TP, PP, CP, DP, schedule, virtual stages, micro-batch size and count, layer split: their values depend
on one another for a fixed GPU count and batch) and each setting on its own; a group whose change alone is
not a valid plan, or does not fit, says so. Gains do not add up in general (the knobs interact: TP comm
overlap is worth more at a larger TP); the remainder, MFU(T) - MFU(B) - the sum, is printed as "interaction".
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from autotune.cost.evaluator import StepResult
from autotune.spec.plan import Plan

#: the fields that form the layout (moved together)
LAYOUT_FIELDS = ("tp_degree", "pp_degree", "cp_degree", "dp_degree", "pipeline_schedule", "vpp_degree",
                 "micro_batch_size", "num_micro_batches", "stage_layers")
#: setting fields, each its own group (recompute_num_layers moves with recompute)
SETTING_FIELDS = ("sequence_parallel", "recompute", "zero_stage", "async_collectives", "tp_comm_overlap",
                  "dp_overlaps", "bucket_size_mib", "memory_reclaim", "precision", "fp8_param_gather",
                  "grad_reduce_in_bf16", "compile", "cpu_offload_layers")
#: groups of more than one field (the parameter-gather overlap needs the gradient-reduce overlap)
GROUPED = {"recompute": ("recompute", "recompute_num_layers"),
           "dp_overlaps": ("dp_grad_reduce_overlap", "param_gather_overlap")}


@dataclasses.dataclass(frozen=True)
class KnobGain:
    """One group's change: ``knob`` (name), ``change`` ("a -> b"), ``gain_points`` (MFU percentage points, None
    when the change alone is no valid or fitting plan), ``note`` (why not, or "")."""

    knob: str
    change: str
    gain_points: float | None
    note: str = ""


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, tuple):
        return "split " + ",".join(map(str, v[:3])) + ("..." if len(v) > 3 else "")
    return "default" if v is None else str(v)


def attribute(baseline: Plan, tuned: Plan, evaluate: Callable[[Plan], StepResult]) -> tuple[list[KnobGain], float | None]:
    """The one-knob-at-a-time gains from ``baseline`` to ``tuned`` (module docstring) and the interaction
    remainder (points; None when the baseline or the tuned plan does not fit).

    Args:
        baseline, tuned: plans for the same GPUs and batch.
        evaluate: the evaluator's ``evaluate`` (a plan -> StepResult; MFU as a fraction).
    """
    base_r = evaluate(baseline)
    tuned_r = evaluate(tuned)
    out: list[KnobGain] = []
    groups: list[tuple[str, tuple[str, ...]]] = [("layout", LAYOUT_FIELDS)]
    groups += [(f, GROUPED.get(f, (f,))) for f in SETTING_FIELDS]
    for name, fs in groups:
        if all(getattr(baseline, f) == getattr(tuned, f) for f in fs):
            continue
        if name == "layout":
            change = (f"TP {baseline.tp_degree} PP {baseline.pp_degree} CP {baseline.cp_degree} DP {baseline.dp_degree}"
                      f" v{baseline.effective_vpp} mbs {baseline.micro_batch_size} -> TP {tuned.tp_degree} PP "
                      f"{tuned.pp_degree} CP {tuned.cp_degree} DP {tuned.dp_degree} v{tuned.effective_vpp} mbs "
                      f"{tuned.micro_batch_size}")
        else:
            change = ", ".join(f"{f} {_fmt(getattr(baseline, f))} -> {_fmt(getattr(tuned, f))}" for f in fs
                               if getattr(baseline, f) != getattr(tuned, f))
        try:
            q = baseline.replace(**{f: getattr(tuned, f) for f in fs})
        except Exception as e:          # noqa: BLE001 - an invalid combination: said, not raised
            out.append(KnobGain(name, change, None, f"not a valid plan alone ({str(e).splitlines()[0][:80]})"))
            continue
        try:
            r = evaluate(q)
        except Exception as e:          # noqa: BLE001
            out.append(KnobGain(name, change, None, f"not a valid plan alone ({str(e).splitlines()[0][:80]})"))
            continue
        if not (r.feasible and base_r.feasible):
            out.append(KnobGain(name, change, None, "does not fit alone" if not r.feasible else
                                "the baseline does not fit"))
            continue
        out.append(KnobGain(name, change, 100 * (r.mfu - base_r.mfu)))
    rest = None
    if base_r.feasible and tuned_r.feasible:
        rest = 100 * (tuned_r.mfu - base_r.mfu) - sum(g.gain_points or 0.0 for g in out)
    return out, rest


def format_attribution(label: str, gains: Sequence[KnobGain], rest: float | None, base_mfu: float,
                       tuned_mfu: float) -> str:
    """The attribution as lines: a header naming the baseline (``label``) and both MFUs, one line per knob
    group (largest gain first), then the interaction remainder."""
    lines = [f"what each knob brings, from {label} (MFU {100 * base_mfu:.1f}%) to the tuned plan (MFU "
             f"{100 * tuned_mfu:.1f}%), one knob at a time (simulated):"]
    for g in sorted(gains, key=lambda g: -(g.gain_points if g.gain_points is not None else -1e9)):
        val = f"{g.gain_points:+6.1f} points" if g.gain_points is not None else f"{'-':>6s}       "
        lines.append(f"  {g.knob:24s} {val}  {g.change}" + (f" ({g.note})" if g.note else ""))
    if rest is not None:
        lines.append(f"  {'interaction':24s} {rest:+6.1f} points  (the knobs together minus the sum of each alone)")
    return "\n".join(lines)


__all__ = ["KnobGain", "attribute", "format_attribution"]
