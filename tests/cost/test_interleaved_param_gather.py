"""The overlapped parameter all-gather of an interleaved stage (Megatron-LM --overlap-param-gather with virtual
pipeline stages: chunks 0 and 1 gathered before the schedule, chunk c >= 2 launched when chunk c - 1 starts;
megatron/core/pipeline_parallel/schedules.py). Expected values are worked by hand below."""

from __future__ import annotations

import pytest

from autotune.cost.graph import interleaved_param_gather_exposed_ms
from autotune.spec.engines import get_engine


def test_one_chunk_is_the_single_chunk_rule():
    # one chunk: the gather overlaps the first forward only: exposed = 10 - 4 = 6
    assert interleaved_param_gather_exposed_ms([10.0], [4.0], 3) == pytest.approx(6.0)
    assert interleaved_param_gather_exposed_ms([3.0], [4.0], 3) == 0.0


def test_three_chunks_by_hand():
    # gathers 5 ms each, forwards 2 ms, 2 micro-batches per chunk group:
    # chunk 0: gathered by 5, its 2 forwards end at max(2, 5) + 2 = 7
    # chunk 1: gathered (launched at 0 after chunk 0) by 10, starts at max(7, 10) = 10, ends 14
    # chunk 2: launched when chunk 1 started (10), gathered by 15, starts at max(14, 15) = 15, ends 19
    # without gathers the warm-up forwards take 3 x 2 x 2 = 12: exposed 19 - 12 = 7
    # (the whole stage's gather behind the first forward only would expose 15 - 2 = 13)
    assert interleaved_param_gather_exposed_ms([5.0] * 3, [2.0] * 3, 2) == pytest.approx(7.0)


def test_short_gathers_are_hidden():
    # 1 ms gathers behind 4 x 2 ms forwards per chunk: chunk 2 is launched at 8 and done by 9, needed at 16
    assert interleaved_param_gather_exposed_ms([1.0] * 3, [2.0] * 3, 4) == 0.0


def test_only_megatron_states_the_mechanism():
    assert get_engine("megatron").interleaved_chunk_sync
    assert not get_engine("torchtitan").interleaved_chunk_sync


def _structure(engine: str, v: int):
    from autotune.cost.graph import CostBuilder, chunk_costs, step_structure, step_weights
    from autotune.cost.simulator import SimulatedEvaluator
    from autotune.spec.hardware import make_cluster
    from autotune.spec.models import get_model
    from autotune.spec.plan import Plan, Workload

    ev = SimulatedEvaluator(model=get_model("70b"), cluster=make_cluster("h100", 64, "nvlink4+ib-ndr400"),
                            workload=Workload.from_tokens(seq_len=8192, global_batch_tokens=4 * 2**20), engine=engine)
    plan = Plan(tp_degree=8, pp_degree=4, dp_degree=2, vpp_degree=v, micro_batch_size=1, num_micro_batches=8,
                pipeline_schedule="interleaved_1f1b", sequence_parallel=True, zero_stage=1,
                dp_grad_reduce_overlap=True, async_collectives=True)
    cb = CostBuilder(model=ev.model, plan=plan, cluster=ev.cluster, workload=ev.workload, costs=ev.costs,
                     engine=ev.engine)
    w = step_weights(cb, plan, ev.model, 8, chunk_costs(cb, plan, ev.model, cached=True))
    return step_structure(plan, w), w


def test_dp_stream_follows_the_order_the_chunks_backwards_end():
    # interleaved 1F1B runs the backward from the last chunk down (v - 1, ..., 0) in the cool-down, so the
    # DP stream of stage 0 reduces chunk 3's buckets first and chunk 0's last (Megatron-LM schedules.py:
    # grad_sync_func after each chunk's last backward)
    st, w = _structure("megatron", 4)
    chunks = [c for (n, kind, r, c, i, stream, wkey) in st.nodes if kind == "dp_reduce" and r == 0]
    assert chunks and chunks == sorted(chunks, reverse=True)
    assert chunks[0] == 3 and chunks[-1] == 0
    # the buckets of a chunk start together at the end of its last backward: no negative ready delay
    assert all(g[2] == 0.0 for c in range(4) for g in w.dp_groups[(0, c)])


def test_grad_sync_launches_pp_rank_backward_steps_later():
    # stage 2 launches a chunk's buckets 2 backward steps after the chunk's last backward (schedules.py
    # grad_sync_microbatch_id = microbatch_id - pipeline_parallel_rank), costed as 2 of that chunk's backwards;
    # chunk 0's last backward is the stage's last one, so its buckets go right after it
    st, w = _structure("megatron", 4)
    for c in (1, 2, 3):
        lb = w.compute[2, "B", c][1]
        assert all(g[2] == pytest.approx(2 * lb) for g in w.dp_groups[(2, c)])
    assert all(g[2] == 0.0 for g in w.dp_groups[(2, 0)])
