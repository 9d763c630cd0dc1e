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
