"""Derive in-training FP8 cast bandwidths from profiled training steps (no GPU needed).

``bench/profile_fp8_plans.sh`` profiles one training step of Llama 3.1 8B (16 layers, seq 8192, two
sequences, one H200) per FP8 recipe with and without torch.compile; ``autotune.runtime.trace`` sums the
GPU time per kernel category. The FP8 casts of a step (amax, scale, cast, transposes; what the cost model
counts as :meth:`autotune.cost.graph.CostBuilder.fp8_cast_bytes`) run as ``cast_copy``, ``elementwise`` and
``reduction`` kernels. This script takes, per profiled plan, that time minus the same categories' time
the cost model attributes to non-FP8 work of the step (the BF16 weight casts, and for eager plans the
memory-bound ops of the layers), and divides the modelled cast bytes by it: the cast bandwidth reached
inside training, which a stand-alone microbenchmark of the cast (``autotune profile --sections
quantize``) overstates (torchao's eager path runs more passes than amax + scale + cast; the row-wise
recipe re-quantizes along both axes from the high-precision tensors).

Run: ``python bench/derive_fp8_casts.py [docs/results/profile-fp8-plans-h200x1-2026-12-01.json]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.cost.op_costs import CalibratedCosts
from autotune.cost.calibration import default_calibration
from autotune.cost.graph import CostBuilder
from autotune.spec.hardware import get_gpu, make_cluster  # noqa: E402
from autotune.spec.models import get_model  # noqa: E402
from autotune.spec.plan import Plan, Workload  # noqa: E402

DEFAULT = Path(__file__).resolve().parents[1] / "docs" / "results" / "profile-fp8-plans-h200x1-2026-12-01.json"


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    data = json.loads(path.read_text())
    costs = CalibratedCosts(profile=default_calibration(), gpu=get_gpu("h200"))
    print(f"{'plan':30s} {'cast kernels ms':>15s} {'non-FP8 part ms':>15s} {'cast GB':>8s} {'GB/s in training':>17s}")
    for tag, d in sorted(data["plans"].items()):
        prof = d.get("profile") or {}
        cats = prof.get("by_category") or {}
        if not cats:
            continue
        prec, comp = tag.split("_compile-")
        comp = comp == "true"
        plan = Plan.from_dict(d["result"].get("plan") or {}) if d["result"].get("plan") else \
            Plan(micro_batch_size=2, num_micro_batches=1, zero_stage=0, precision=prec, compile=comp)
        m = get_model("8b").truncated(16)
        w = Workload(seq_len=8192, global_batch_size=plan.global_batch_size)
        cb = CostBuilder(model=m, plan=plan, cluster=make_cluster("h200", 1, "nvlink4"), workload=w, costs=costs,
                         engine="native")
        t, h = cb.tokens, m.hidden_size
        gemms = [(t, m.q_dim + 2 * m.kv_dim, h), (t, h, m.q_dim), (t, 2 * m.ffn_hidden_size, h),
                 (t, h, m.ffn_hidden_size)]
        fwd_b, bwd_b = cb.fp8_cast_bytes(gemms)
        cast_bytes = m.num_layers * (fwd_b + bwd_b)
        measured = sum(cats.get(k, 0.0) for k in ("cast_copy", "elementwise", "reduction"))
        # non-FP8 work the model puts in those categories: BF16 weight casts (6 B/param per micro-batch,
        # graph.CAST_BYTES_PER_PARAM), and, eager only, the layers' memory-bound ops (RMSNorm, residual
        # adds, RoPE, SwiGLU; compiled they run as fused Triton kernels, category "other")
        non_fp8 = costs.memory_bound_ms(6.0 * m.num_params, "cast")
        if not comp:
            eager = CostBuilder(model=m, plan=plan.replace(precision="bf16"), cluster=make_cluster("h200", 1, "nvlink4"),
                                workload=w, costs=costs, engine="native")
            T, q, kv, f = eager.tokens, m.q_dim, m.kv_dim, m.ffn_hidden_size
            mem_fwd = (costs.memory_bound_ms(T * 8 * h, "rmsnorm") + costs.memory_bound_ms(T * 12 * h)
                       + costs.memory_bound_ms(T * 4 * (q + kv), "rope") + costs.memory_bound_ms(T * 6 * f, "swiglu"))
            non_fp8 += m.num_layers * 3 * mem_fwd
        # the non-FP8 part as it runs in training (calibration in_training, bench/derive_in_training.py)
        non_fp8 *= costs.in_training_factor("memory_bound", compiled=comp)
        gbs = cast_bytes / ((measured - non_fp8) * 1e6)
        print(f"{tag:30s} {measured:15.1f} {non_fp8:15.1f} {cast_bytes / 1e9:8.1f} {gbs:17.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
