"""Benchmark: which FP8 GEMM scaling rule for an estimated Blackwell GPU an outside measurement supports (no GPU).

``autotune.cost.op_costs.FP8_SCALE_RULE`` says how a B200's FP8 GEMM rate is scaled from the calibration GPU's
(H200): ``bf16_reference`` (FP8 gains as the published large-shape BF16 benchmark, times the datasheet FP8 / BF16
ratios) or ``fp8_reference`` (by the published FP8 benchmark, a 4096^3 rowwise-scaled GEMM). It was chosen while
looking at the Megatron-Bridge 25.11 B200 rows (docs/fidelity.md, "Constants chosen while looking at errors").
This check decides between the rules on a measurement that is not in the development set: the FP8 / BF16
training speedup torchao published for B200.

Source (figures copied, nothing measured here): pytorch/ao ``torchao/prototype/mx_formats/README.md`` (commit
09f13255), "Training e2e benchmarks on NVIDIA B200": single node, 8x power-limited B200, batch size 1, sequence
8192, ``torch.compile``, FSDP2, per-op SAC; torch 2.9.0.dev20250815+cu128, torchao 0.13.0+gite4e681be6,
torchtitan 6fc499f6. Llama3-8b median tokens/s: bf16 8307.5, float8 tensorwise (f8 all-gather) 10417.0
(+25.4%), float8 rowwise 8640.5 (+4.0%), mxfp8_cublas 9969.0 (+20.0%).

Only the ratios are compared (predicted FP8 / predicted BF16 against published FP8 / published BF16): the power
limit is not published, and the check ASSUMES it slows the BF16 and the FP8 step by the same factor. The
absolute throughput is printed too (the power-limited GPUs ran well below the catalog B200's prediction).
Attention: cuDNN (torchtitan's ScaledDotProductAttention picks cuDNN on B200, as ``bench/published.py`` notes).

Run: ``python bench/fp8_rule_check.py``. ``bench/published.py --cross-validate`` calls :func:`selected_rule`.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

#: the torchao B200 Llama3-8b rows (module docstring): precision -> published median tokens/s per GPU
TORCHAO_B200_8B = {"bf16": 8307.5, "fp8_tensorwise": 10417.0, "fp8_rowwise": 8640.5, "mxfp8": 9969.0}
TORCHAO_SOURCE = ("pytorch/ao torchao/prototype/mx_formats/README.md (commit 09f13255), Training e2e benchmarks on "
                  "NVIDIA B200, Llama3-8b")
#: the plan those rows describe, in bench/published.py's run format (batch size 1 per GPU, 8 GPUs, FSDP2)
TORCHAO_RUN = {"model": "llama3.1-8b", "gpus": 8, "seq": 8192, "mbs": 1, "gbs": 8, "dp_mode": "fsdp", "tp": 1,
               "pp": 1, "cp": 1, "recompute": "selective", "compile": True}


def predicted_speedups(rule: str) -> dict[str, float]:
    """Predicted tokens/s per GPU of :data:`TORCHAO_RUN` per precision under FP8 scaling ``rule``
    (torchtitan engine, catalog B200, ``nvlink5+ib-ndr400``, cuDNN attention)."""
    import published as pb
    import autotune.cost.op_costs as oc

    saved = oc.FP8_SCALE_RULE
    oc.FP8_SCALE_RULE = rule
    try:
        out = {}
        for prec in TORCHAO_B200_8B:
            _, r, _ = pb.predict(dict(TORCHAO_RUN, precision=prec), "torchtitan", "nvlink5+ib-ndr400", "b200",
                                 attention_kernel="default")
            out[prec] = r.tokens_per_s_per_gpu
        return out
    finally:
        oc.FP8_SCALE_RULE = saved


def selected_rule() -> tuple[str, str]:
    """(the rule whose predicted FP8 tensorwise / BF16 speedup is closest to torchao's published one, the
    printed comparison). Decided on the tensorwise rows only (the recipe of the B200 development rows); the
    rowwise figures are printed beside it."""
    from autotune.cost.op_costs import FP8_SCALE_RULES

    pub = {p: v / TORCHAO_B200_8B["bf16"] - 1 for p, v in TORCHAO_B200_8B.items()}
    lines = [f"FP8 scaling rule check against {TORCHAO_SOURCE} (FP8 / BF16 speedup, predicted vs published):",
             f"  published: tensorwise {100 * pub['fp8_tensorwise']:+.1f}%, rowwise {100 * pub['fp8_rowwise']:+.1f}%, "
             f"mxfp8 {100 * pub['mxfp8']:+.1f}% (BF16 {TORCHAO_B200_8B['bf16']:.0f} tok/s/GPU, power-limited)"]
    best, best_gap = None, None
    for rule in FP8_SCALE_RULES:
        p = predicted_speedups(rule)
        s = {k: v / p["bf16"] - 1 for k, v in p.items()}
        gap = abs(s["fp8_tensorwise"] - pub["fp8_tensorwise"])
        lines.append(f"  {rule:15s}: tensorwise {100 * s['fp8_tensorwise']:+.1f}%, rowwise {100 * s['fp8_rowwise']:+.1f}%, "
                     f"mxfp8 {100 * s['mxfp8']:+.1f}% (BF16 {p['bf16']:.0f} tok/s/GPU predicted for the catalog B200)")
        if best_gap is None or gap < best_gap:
            best, best_gap = rule, gap
    lines.append(f"  selected by the tensorwise speedup: {best}")
    return best, "\n".join(lines)


def main() -> int:
    _, text = selected_rule()
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
