"""The simulated step as a Chrome trace and a Gantt chart (autotune.report.trace, simulate --trace/--gantt)."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from click.testing import CliRunner

from autotune.cli.app import main
from autotune.spec.hardware import make_cluster
from autotune.spec.models import get_model
from autotune.spec.plan import Plan, PlanDocument, Workload
from autotune.cost.simulator import SimulatedEvaluator
from autotune.report.trace import chrome_trace, write_gantt


def _trace(model, cluster, workload, plan, engine="megatron"):
    ev = SimulatedEvaluator(model=model, cluster=cluster, workload=workload, engine=engine)
    result = ev.evaluate(plan)
    g, tl = ev.step_timeline(plan)
    return result, g, tl, chrome_trace(g, tl)


def _slices(doc):
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def test_small_pipeline_trace_layout():
    m8 = get_model("8b")
    plan = Plan(tp_degree=2, pp_degree=2, dp_degree=2, pipeline_schedule="1f1b", micro_batch_size=1,
                num_micro_batches=8, async_collectives=True, sequence_parallel=True)
    result, g, tl, doc = _trace(m8, make_cluster("h200", 8, None), Workload(seq_len=8192, global_batch_size=16), plan)
    xs = _slices(doc)
    # one process per pipeline stage, named; the four stream tracks named in every process
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert procs == {0: "pipeline stage 0", 1: "pipeline stage 1"}
    tracks = {(e["pid"], e["args"]["name"]) for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert {(s, n) for s in (0, 1) for n in ("compute", "TP/CP (exposed)", "DP", "P2P")} <= tracks
    # every micro-batch passes each stage forward once and backward once: 8 F and 8 B per stage (v = 1)
    per = defaultdict(int)
    for e in xs:
        if e["tid"] == 1 and e["name"][:2] in ("F ", "B "):
            per[(e["pid"], e["name"][0])] += 1
    assert dict(per) == {(s, k): 8 for s in (0, 1) for k in "FB"}
    # the span of the events is the predicted step time (us in the trace, ms in the result)
    span_ms = (max(e["ts"] + e["dur"] for e in xs) - min(e["ts"] for e in xs)) / 1e3
    assert min(e["ts"] for e in xs) == 0.0
    assert span_ms == pytest.approx(result.step_time_ms, rel=1e-9)
    # a stream runs one op at a time: compute slices of a stage never overlap
    for s in (0, 1):
        comp = sorted((e["ts"], e["ts"] + e["dur"]) for e in xs if e["pid"] == s and e["tid"] == 1)
        assert all(a[1] <= b[0] + 1e-6 for a, b in zip(comp, comp[1:]))
    # stage 1 waits for stage 0's first forward: its first slice starts after F mb0 c0 of stage 0 ends
    f0 = next(e for e in xs if e["pid"] == 0 and e["name"] == "F mb0 c0")
    first1 = min(e["ts"] for e in xs if e["pid"] == 1 and e["tid"] == 1)
    assert first1 >= f0["ts"] + f0["dur"] - 1e-6
    # async p2p: one send per forward of stage 0 and per backward of stage 1 (8 + 8)
    assert sum(1 for e in xs if e["tid"] == 4) == 16


def test_405b_trace_span_equals_the_extrapolated_prediction():
    # a 405B interleaved plan with 64 micro-batches on 16 stages: the evaluator extrapolates from 32 and
    # 48 micro-batches (steady state); the full timeline drawn for the trace must end at the same time
    m405 = get_model("405b")
    plan = Plan(tp_degree=8, pp_degree=16, dp_degree=8, vpp_degree=2, pipeline_schedule="interleaved_1f1b",
                stage_layers=(3,) + (4,) * 30 + (3,), micro_batch_size=1, num_micro_batches=64,
                sequence_parallel=True, recompute="selective", zero_stage=1, async_collectives=True,
                dp_grad_reduce_overlap=True)
    assert sum(plan.stage_layers) == 126
    w = Workload(seq_len=8192, global_batch_size=512)
    result, g, tl, doc = _trace(m405, make_cluster("h200", 1024, None), w, plan)
    assert result.details["extrapolated"] is True
    xs = _slices(doc)
    assert {e["pid"] for e in xs} == set(range(16))
    span_ms = (max(e["ts"] + e["dur"] for e in xs) - min(e["ts"] for e in xs)) / 1e3
    assert span_ms == pytest.approx(result.step_time_ms, rel=1e-6)
    # 64 micro-batches x 2 chunks forward per stage
    assert sum(1 for e in xs if e["pid"] == 3 and e["tid"] == 1 and e["name"].startswith("F ")) == 128


def test_cli_simulate_trace_and_gantt(tmp_path):
    m8 = get_model("8b")
    cl = make_cluster("h200", 8, None)
    plan = Plan(tp_degree=1, pp_degree=2, dp_degree=4, pipeline_schedule="1f1b", micro_batch_size=1,
                num_micro_batches=4)
    doc = PlanDocument(plan=plan, model=m8, gpu="h200", num_gpus=8, fabric=cl.fabric.to_dict(),
                       workload=Workload(seq_len=8192, global_batch_size=16), engine="megatron")
    pf = tmp_path / "p.yaml"
    doc.save(pf)
    t = tmp_path / "t.json"
    r = CliRunner().invoke(main, ["simulate", str(pf), "--trace", str(t), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    tr = json.loads(t.read_text())
    xs = _slices(tr)
    span_ms = (max(e["ts"] + e["dur"] for e in xs) - min(e["ts"] for e in xs)) / 1e3
    assert span_ms == pytest.approx(out["results"][0]["prediction"]["step_time_ms"], rel=1e-9)


def test_gantt_png(tmp_path):
    pytest.importorskip("matplotlib")
    m8 = get_model("8b")
    plan = Plan(pp_degree=2, dp_degree=4, pipeline_schedule="1f1b", micro_batch_size=1, num_micro_batches=4)
    _, g, tl, _ = _trace(m8, make_cluster("h200", 8, None), Workload(seq_len=8192, global_batch_size=16), plan)
    p = tmp_path / "g.png"
    write_gantt(p, g, tl)
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
