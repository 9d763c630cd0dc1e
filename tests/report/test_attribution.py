"""The one-knob-at-a-time attribution from a baseline plan to the tuned plan (autotune/report/attribution.py)."""

from __future__ import annotations

import pytest

from autotune.cost.simulator import SimulatedEvaluator
from autotune.report.attribution import attribute, format_attribution
from autotune.spec.hardware import make_cluster
from autotune.spec.models import get_model
from autotune.spec.plan import Plan, Workload

MODEL = get_model("8b")
CLUSTER = make_cluster("h100", 16, "nvlink4+ib-ndr400")
W = Workload.from_tokens(seq_len=8192, global_batch_tokens=2**21)


@pytest.fixture(scope="module")
def ev():
    return SimulatedEvaluator(model=MODEL, cluster=CLUSTER, workload=W, engine="megatron")


def test_gains_are_each_knob_alone_and_the_rest_is_interaction(ev):
    # baseline: TP 2 x DP 8, BF16, selective recompute; tuned: TP 1 x DP 16 (the layout), FP8, no recompute; both
    # ZeRO-3 (TP 1 with ZeRO-1 does not fit 8B on an 80 GB H100: 101.6 GiB predicted).
    # By definition each group's gain is MFU(baseline with that group changed) - MFU(baseline), each simulated
    # here directly, and the interaction is the total change minus their sum.
    base = Plan(tp_degree=2, dp_degree=8, micro_batch_size=1, num_micro_batches=32, sequence_parallel=True,
                recompute="selective", zero_stage=3)
    tuned = Plan(tp_degree=1, dp_degree=16, micro_batch_size=1, num_micro_batches=16, recompute="none", zero_stage=3,
                 precision="fp8_tensorwise")
    gains, rest = attribute(base, tuned, ev.evaluate)
    by = {g.knob: g for g in gains}
    assert set(by) == {"layout", "sequence_parallel", "recompute", "precision"}
    m0 = ev.evaluate(base).mfu
    assert by["recompute"].gain_points == pytest.approx(100 * (ev.evaluate(base.replace(recompute="none")).mfu - m0))
    assert by["precision"].gain_points == pytest.approx(
        100 * (ev.evaluate(base.replace(precision="fp8_tensorwise")).mfu - m0))
    lay = base.replace(tp_degree=1, dp_degree=16, num_micro_batches=16)
    assert by["layout"].gain_points == pytest.approx(100 * (ev.evaluate(lay).mfu - m0))
    total = 100 * (ev.evaluate(tuned).mfu - m0)
    assert rest == pytest.approx(total - sum(g.gain_points or 0.0 for g in gains))
    text = format_attribution("the published plan", gains, rest, m0, ev.evaluate(tuned).mfu)
    assert text.startswith("what each knob brings, from the published plan") and "interaction" in text
    assert "precision bf16 -> fp8_tensorwise" in text


def test_one_knob_alone_is_the_whole_change(ev):
    base = Plan(tp_degree=1, dp_degree=16, micro_batch_size=1, num_micro_batches=16, zero_stage=3)
    tuned = base.replace(precision="fp8_tensorwise")
    gains, rest = attribute(base, tuned, ev.evaluate)
    assert [g.knob for g in gains] == ["precision"]
    assert gains[0].gain_points == pytest.approx(100 * (ev.evaluate(tuned).mfu - ev.evaluate(base).mfu))
    assert rest == pytest.approx(0.0, abs=1e-9)


def test_cpu_offloading_is_a_group_of_its_own(ev):
    # 8B on 16 H100 (PCIe Gen5 host link), ZeRO-3, no recompute: offloading 8 of 32 layers changes nothing but
    # the copies' waits and the slowdown beside them, so its group's gain is MFU(with it) - MFU(without) < 0,
    # simulated directly here
    base = Plan(dp_degree=16, micro_batch_size=1, num_micro_batches=16, recompute="none", zero_stage=3)
    tuned = base.replace(cpu_offload_layers=8)
    gains, _ = attribute(base, tuned, ev.evaluate)
    g = {k.knob: k for k in gains}["cpu_offload_layers"]
    assert g.change == "cpu_offload_layers 0 -> 8"
    want = 100 * (ev.evaluate(tuned).mfu - ev.evaluate(base).mfu)
    assert g.gain_points == pytest.approx(want) and want < 0
