"""Derive the calibration's ``in_training`` factors from profiled training steps (no GPU needed).

``bench/profile_plans.sh`` profiles one training step of Llama 3.1 8B (16 layers, seq 8192, one H200,
the native runtime) per plan variant (BF16 / FP8, eager / torch.compile, recompute none / selective /
full, one or two sequences); ``autotune.runtime.trace`` sums the GPU time per kernel category. For each
plan this script asks the simulated evaluator for the same step with only one category of op costs
left on (GEMM; attention; memory-bound kernels other than the optimizer and the FP8 casts; the
optimizer; FP8 casts), the stand-alone microbenchmark figures of the shipped profile, without any
``in_training`` factor, and prints measured vs modelled milliseconds per category. Memory-bound
kernels are the trace categories ``cast_copy``, ``elementwise``, ``reduction``, ``other`` and
``cross_entropy``.

The factor of a category and mode (eager / compiled) is the ratio of the sums over the BF16 plans of
that mode (FP8 plans have their own GEMM table and in-training cast bandwidths, so they are a check,
not an input): measured kernel ms / modelled ms. ``--write`` stores them in the shipped profile
(``autotune/data/calibration/h200.yaml``, key ``in_training``). These factors make the profiled plans
in-sample for the step time; the 34-plan 2-GPU table (2026-11-30) and the published runs are not.

Run: ``python bench/derive_in_training.py [--write] [FILE ...]``
(default ``docs/results/profile-plans-h200x1-2026-12-01.json`` and the FP8 profile of the same day).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.cost.op_costs import CalibratedCosts
from autotune.cost.calibration import default_calibration
from autotune.spec.hardware import ClusterSpec, make_cluster  # noqa: E402
from autotune.spec.models import get_model  # noqa: E402
from autotune.spec.plan import Plan, Workload  # noqa: E402
from autotune.cost.simulator import SimulatedEvaluator  # noqa: E402

DEFAULTS = [ROOT / "docs" / "results" / "profile-plans-h200x1-2026-12-01.json",
            ROOT / "docs" / "results" / "profile-fp8-plans-h200x1-2026-12-01.json"]
PROFILE = ROOT / "autotune" / "data" / "calibration" / "h200.yaml"
MEMORY_CATEGORIES = ("cast_copy", "elementwise", "reduction", "other", "cross_entropy")
KEEP = ("gemm", "attention", "memory_bound", "optimizer", "quantize")


class OneCategory(CalibratedCosts):
    """Stand-alone op costs with every category but ``keep`` set to zero, and no in-training factor."""

    def __init__(self, *, keep: str, **kw) -> None:
        super().__init__(**kw)
        self.keep = keep

    def gemm_ms(self, *a, **k) -> float:
        return super().gemm_ms(*a, **k) if self.keep == "gemm" else 0.0

    def attention_kernel_ms(self, kernel: str, **k) -> float:
        return super().attention_kernel_ms(kernel, **k) if self.keep == "attention" else 0.0

    def memory_bound_ms(self, nbytes: float, op: str | None = None) -> float:
        want = "optimizer" if op == "adamw" else "memory_bound"
        return super().memory_bound_ms(nbytes, op) if self.keep == want else 0.0

    def memory_bound_compiled_ms(self, nbytes: float, op: str) -> float | None:
        v = super().memory_bound_compiled_ms(nbytes, op)
        return None if v is None else (v if self.keep == "memory_bound" else 0.0)

    def quantize_ms(self, *a, **k) -> float:
        return super().quantize_ms(*a, **k) if self.keep == "quantize" else 0.0

    def in_training_factor(self, category: str, *, compiled: bool) -> float:
        return 1.0


def modelled(plan: Plan) -> dict[str, float]:
    """Modelled ms per category of the profiled step (8B at 16 layers, seq 8192, 1x H200)."""
    m = get_model("8b").truncated(16)
    cl = make_cluster("h200", 1, "nvlink4")
    roomy = ClusterSpec(gpu=dataclasses.replace(cl.gpu, hbm_gib=1e6), num_gpus=1, fabric=cl.fabric)
    w = Workload(seq_len=8192, global_batch_size=plan.global_batch_size)
    prof = default_calibration()
    out = {}
    for keep in KEEP:
        ev = SimulatedEvaluator(model=m, cluster=roomy, workload=w, engine="native",
                                costs=OneCategory(keep=keep, profile=prof, gpu=cl.gpu))
        try:
            out[keep] = ev.evaluate(plan).step_time_ms
        except ZeroDivisionError:        # nothing of that category in the plan (a zero-time step)
            out[keep] = 0.0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", default=[str(p) for p in DEFAULTS])
    ap.add_argument("--write", action="store_true", help=f"store the factors in {PROFILE.relative_to(ROOT)}")
    a = ap.parse_args()
    sums: dict[tuple[str, str], list[float]] = {}
    print(f"{'plan':46s} {'step ms':>7s} | {'GEMM meas/model':>15s} | {'attention':>13s} | "
          f"{'memory-bound':>13s} {'+FP8 casts':>10s} | {'optimizer':>11s}")
    for f in a.files:
        data = json.loads(Path(f).read_text())
        for tag, d in sorted(data["plans"].items()):
            cats = (d.get("profile") or {}).get("by_category") or {}
            if not cats:
                continue
            plan = Plan.from_dict(d["result"]["plan"])
            mod = modelled(plan)
            meas = {"gemm": cats.get("gemm", 0.0), "attention": cats.get("attention", 0.0),
                    "memory_bound": sum(cats.get(k, 0.0) for k in MEMORY_CATEGORIES),
                    "optimizer": cats.get("optimizer", 0.0)}
            print(f"{tag:46s} {d['result']['step_time_ms']:7.1f} | {meas['gemm']:6.1f} / {mod['gemm']:6.1f} | "
                  f"{meas['attention']:5.1f} / {mod['attention']:5.1f} | {meas['memory_bound']:5.1f} / "
                  f"{mod['memory_bound']:5.1f} {mod['quantize']:10.1f} | {meas['optimizer']:4.1f} / {mod['optimizer']:4.1f}")
            if plan.precision != "bf16":
                continue
            mode = "compiled" if plan.compile else "eager"
            for cat in ("gemm", "attention", "memory_bound"):
                s = sums.setdefault((cat, mode), [0.0, 0.0])
                s[0] += meas[cat]
                s[1] += mod[cat]
    factors = {f"{cat}_{mode}": round(s[0] / s[1], 3) for (cat, mode), s in sorted(sums.items()) if s[1] > 0}
    print("\nin_training factors (BF16 plans; measured / modelled kernel ms, ratio of sums):")
    for k, v in factors.items():
        print(f"  {k:24s} {v:.3f}")
    if a.write:
        text = PROFILE.read_text()
        line = "in_training: {" + ", ".join(f"{k}: {v}" for k, v in factors.items()) + "}"
        note = ("# in_training: bench/derive_in_training.py from docs/results/profile-plans-h200x1-2026-12-01.json "
                "(profiled steps, 1x H200, torch 2.11.0+cu130, 2026-12-01)")
        text = re.sub(r"(?m)^# in_training:.*\n", "", text)
        text = re.sub(r"(?m)^in_training:.*\n", "", text)
        text = re.sub(r"(?m)^(overlap:.*\n)", lambda mm: mm.group(1) + note + "\n" + line + "\n", text, count=1)
        PROFILE.write_text(text)
        print(f"wrote {PROFILE.relative_to(ROOT)}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
