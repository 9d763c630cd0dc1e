"""The fast simulation path (autotune.cost.simulator.simulate_structure over cached step structures, chunk
costs computed once per chunk class) against the plain path (networkx step graph built by
autotune.cost.graph.build_step_graph with every chunk costed on its own, then simulate_graph).

The expected values are derived independently here by the slow path itself: the fast path must give
the same floats (it visits nodes in networkx's topological order and sums in the same order), so the
comparison is exact, with a 1e-9 relative bound as the documented tolerance.
"""

from __future__ import annotations

import math

import pytest

from autotune.spec.hardware import make_cluster
from autotune.spec.models import get_model
from autotune.spec.plan import Plan, Workload
from autotune.cost.simulator import SimulatedEvaluator

M = 2**20


def _pair(size: str, gpu: str, n: int, fabric: str, tokens: int, engine: str = "megatron"):
    kw = dict(model=get_model(size), cluster=make_cluster(gpu, n, fabric),
              workload=Workload.from_tokens(seq_len=8192, global_batch_tokens=tokens), engine=engine)
    fast, slow = SimulatedEvaluator(**kw), SimulatedEvaluator(**kw)
    slow.fast = False
    return fast, slow


def _same(a: float, b: float, scale: float) -> bool:
    return a == b or abs(a - b) <= 1e-9 * max(abs(b), scale)


# (target, plan fields): PP 1F1B, interleaved, GPipe, CP, TP without SP, FSDP (ZeRO 3), ZeRO 2, recompute,
# FP8, blocking collectives, no DP overlap, reclaim per step / per micro-batch, uneven stage split,
# a long pipeline (extrapolated: m > 3p)
H100_70B = ("70b", "h100", 64, "nvlink4+ib-ndr400", 4 * M)
H100_70B_NATIVE = H100_70B + ("native",)
H200_8B_NATIVE = ("8b", "h200", 8, "nvlink4+ib-ndr400", M // 4, "native")
CASES = [
    (H100_70B, dict(tp_degree=8, pp_degree=4, dp_degree=2, micro_batch_size=1, num_micro_batches=256,
                    sequence_parallel=True, tp_comm_overlap=True)),
    (H100_70B, dict(tp_degree=8, pp_degree=4, dp_degree=2, vpp_degree=5, micro_batch_size=1, num_micro_batches=256,
                    pipeline_schedule="interleaved_1f1b", sequence_parallel=True, param_gather_overlap=True)),
    (H200_8B_NATIVE, dict(tp_degree=2, pp_degree=2, dp_degree=2, micro_batch_size=1, num_micro_batches=16,
                    pipeline_schedule="gpipe", sequence_parallel=True, recompute="full")),
    (H100_70B, dict(tp_degree=4, pp_degree=4, dp_degree=2, cp_degree=2, micro_batch_size=1, num_micro_batches=256,
                    sequence_parallel=True, recompute="selective")),
    (H100_70B, dict(tp_degree=2, pp_degree=8, dp_degree=4, micro_batch_size=1, num_micro_batches=128,
                    recompute="full", precision="fp8_delayed", async_collectives=False,
                    dp_grad_reduce_overlap=False)),
    (H100_70B, dict(tp_degree=8, pp_degree=1, dp_degree=8, micro_batch_size=1, num_micro_batches=64,
                    sequence_parallel=True, zero_stage=3, recompute="full", param_gather_overlap=True,
                    memory_reclaim="empty_cache_per_step")),
    (H100_70B, dict(tp_degree=4, pp_degree=4, dp_degree=4, micro_batch_size=1, num_micro_batches=128,
                    sequence_parallel=True, zero_stage=2, recompute="full", dp_grad_reduce_overlap=False,
                    memory_reclaim="empty_cache_per_microbatch", stage_layers=(18, 22, 22, 18))),
    # partial full recompute (recompute_num_layers = 20 of chunks of 18 and 22 layers: one chunk class
    # recomputes every layer, the other 20 of 22)
    (H100_70B, dict(tp_degree=4, pp_degree=4, dp_degree=4, micro_batch_size=1, num_micro_batches=128,
                    sequence_parallel=True, recompute="full", recompute_num_layers=20,
                    stage_layers=(18, 22, 22, 18))),
    (H100_70B_NATIVE, dict(tp_degree=8, pp_degree=8, dp_degree=1, micro_batch_size=1, num_micro_batches=512,
                    pipeline_schedule="interleaved_1f1b", vpp_degree=2, sequence_parallel=True,
                    zero_stage=0, precision="fp8_tensorwise", compile=True, bucket_size_mib=16)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_fast_path_matches_graph(case: int) -> None:
    target, fields = CASES[case]
    fast, slow = _pair(*target)
    plan = Plan(**fields)
    a, b = fast.evaluate(plan), slow.evaluate(plan)
    assert b.feasible and a.feasible, b.infeasible_reason      # the cases are chosen to fit
    assert slow.num_graphs > 0 and fast.num_graphs > 0
    assert _same(a.step_time_ms, b.step_time_ms, 0.0)
    assert _same(a.mfu, b.mfu, 0.0)
    assert a.peak_memory_bytes == b.peak_memory_bytes
    assert a.memory_per_stage_bytes == b.memory_per_stage_bytes
    assert a.details["extrapolated"] == b.details["extrapolated"]
    assert a.details["breakdown_stage"] == b.details["breakdown_stage"]
    for k, v in b.breakdown_ms.items():
        assert _same(a.breakdown_ms[k], v, b.step_time_ms), (k, a.breakdown_ms[k], v)
    assert math.isfinite(a.step_time_ms) and a.step_time_ms > 0


def test_cached_structure_is_reused_with_other_weights() -> None:
    """Two plans of one layout differing in settings that change only node weights (recompute, TP overlap)
    share one cached structure, and each still gives the slow path's numbers."""
    from autotune.cost.graph import CostBuilder, chunk_costs, step_structure, step_weights

    fast, slow = _pair(*H100_70B)
    base = dict(tp_degree=8, pp_degree=4, dp_degree=2, micro_batch_size=1, num_micro_batches=256,
                sequence_parallel=True)
    plans = [Plan(**base, recompute="full"), Plan(**base, recompute="selective", tp_comm_overlap=True)]
    structs = []
    for plan in plans:
        cb = CostBuilder(model=fast.model, plan=plan, cluster=fast.cluster, workload=fast.workload, costs=fast.costs,
                         engine=fast.engine)
        # m = 2p: the first of the two graphs the simulator extrapolates from (m = 256 > 3p)
        w = step_weights(cb, plan, fast.model, 8, chunk_costs(cb, plan, fast.model, cached=True))
        structs.append(step_structure(plan, w))
        a, b = fast.evaluate(plan), slow.evaluate(plan)
        assert a.feasible and b.feasible, b.infeasible_reason
        assert _same(a.step_time_ms, b.step_time_ms, 0.0)
        assert all(_same(a.breakdown_ms[k], v, b.step_time_ms) for k, v in b.breakdown_ms.items())
    assert structs[0] is structs[1]
    # recompute="full" adds the forward again to each backward: the two plans' step times must differ
    assert fast.evaluate(plans[0]).step_time_ms != fast.evaluate(plans[1]).step_time_ms
