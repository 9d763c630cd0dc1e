"""``autotune simulate`` with a plan from command-line degrees equals the same plan from a YAML file."""

from __future__ import annotations

import json

from click.testing import CliRunner

from autotune.cli.app import main
from autotune.spec.hardware import make_cluster
from autotune.spec.models import get_model
from autotune.spec.plan import Plan, PlanDocument, Workload


def test_command_line_plan_equals_the_yaml_plan(tmp_path):
    args = ["simulate", "--size", "70b", "--gpus", "64", "--tp", "8", "--pp", "4", "--vpp", "5", "--mbs", "1",
            "--recompute", "selective", "--sp", "--set", "memory_reclaim=expandable_segments", "--json"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)["results"][0]
    # by hand: 70b defaults (README): 64 GPUs, 4M tokens = 512 sequences of 8192; dp = 64 / (8 x 4) = 2;
    # micro-batches = 512 / (1 x 2) = 256; vpp given -> interleaved schedule; engine megatron (default)
    plan = Plan(tp_degree=8, pp_degree=4, dp_degree=2, vpp_degree=5, pipeline_schedule="interleaved_1f1b",
                micro_batch_size=1, num_micro_batches=256, recompute="selective", sequence_parallel=True,
                memory_reclaim="expandable_segments")
    cl = make_cluster("b200", 64, None)
    doc = PlanDocument(plan=plan, model=get_model("70b"), gpu="b200", num_gpus=64, fabric=cl.fabric.to_dict(),
                       workload=Workload(seq_len=8192, global_batch_size=512), engine="megatron")
    doc.save(tmp_path / "p.yaml")
    r2 = CliRunner().invoke(main, ["simulate", str(tmp_path / "p.yaml"), "--json"])
    assert r2.exit_code == 0, r2.output
    want = json.loads(r2.output)["results"][0]
    assert got["plan"] == want["plan"]
    assert got["prediction"]["step_time_ms"] == want["prediction"]["step_time_ms"]
    assert got["prediction"]["mfu"] == want["prediction"]["mfu"]
    assert got["memory_per_stage"] == want["memory_per_stage"] and got["breakdown_ms"] == want["breakdown_ms"]


def test_command_line_plan_errors_are_one_line():
    cases = [
        (["simulate", "--tp", "8"], "give the model"),
        (["simulate", "--size", "8b", "--tp", "3"], "= 3 must divide the 8 GPUs"),
        (["simulate", "--size", "8b", "--mbs", "3"], "not a multiple of --mbs 3"),
        (["simulate", "--size", "8b", "--set", "memory_reclaim"], "expected FIELD=VALUE"),
        (["simulate", "--size", "8b", "--set", "no_such_field=1"], "no_such_field"),
        (["simulate", "plan.yaml", "--tp", "2"], "give either PLAN_FILE or"),
        # QA 2026-12-02: these reached int() comparisons first ("unexpected TypeError", exit 1)
        (["simulate", "--size", "8b", "--set", "vpp_degree=abc"], "vpp_degree must be an integer >= 1, got 'abc'"),
        (["simulate", "--size", "8b", "--set", "tp_degree=[8]"], "tp_degree must be an integer >= 1, got [8]"),
        (["simulate", "--size", "8b", "--set", "vpp_degree=null"], "vpp_degree must be an integer >= 1, got None"),
        (["simulate", "--size", "8b", "--mbs", "0"], "micro_batch_size must be an integer >= 1, got 0"),
    ]
    for args, words in cases:
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2, (args, r.output)
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], (args, r.output)


def test_command_line_plan_takes_the_engines_zero_stage():
    # torchtitan has no ZeRO-1 (facts.yaml zero_stages [0, 2, 3]); without --zero the plan takes torchtitan's
    # default FSDP: fsdp_reshard_after_forward "default" = reshard (ZeRO-3) without PP, keep gathered (ZeRO-2)
    # with PP (torchtitan distributed/fsdp.py get_fsdp_reshard_after_forward_policy)
    for pp, zero in (("4", 2), ("1", 3)):
        r = CliRunner().invoke(main, ["simulate", "--size", "70b", "--gpus", "64", "--tp", "8", "--pp", pp,
                                      "--engine", "torchtitan", "--json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["results"][0]["plan"]["zero_stage"] == zero
    # megatron keeps Plan's default (ZeRO-1, the distributed optimizer); --zero still wins
    r = CliRunner().invoke(main, ["simulate", "--size", "8b", "--gpus", "8", "--json"])
    assert json.loads(r.output)["results"][0]["plan"]["zero_stage"] == 1
    r = CliRunner().invoke(main, ["simulate", "--size", "70b", "--gpus", "64", "--tp", "8", "--pp", "4",
                                  "--engine", "torchtitan", "--zero", "0", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["results"][0]["plan"]["zero_stage"] == 0


def test_a_plan_measured_at_fewer_layers_is_simulated_at_that_depth():
    # a real torchtitan trial of `run --layers 6` (Qwen3-30B-A3B on one H200) stores layers: 6 in
    # prediction.details; the full 48-layer model needs ~544 GiB on one GPU (its simulate said "out of memory"),
    # the 6 layers that ran fit (82.1 GiB measured), so `simulate` must cost those 6
    from pathlib import Path

    from click.testing import CliRunner

    from autotune.cli import main
    f = Path(__file__).parents[2] / "docs/results/engines/torchtitan-moe-h200x1-2026-12-04/qwen3-30b-a3b-data-worker/plan.yaml"
    r = CliRunner().invoke(main, ["simulate", str(f)])
    assert r.exit_code == 0, r.output
    assert "cut to 6 of its 48 layers" in r.output and "out of memory" not in r.output, r.output
    # and by the release the trial ran (torchtitan 0.2.2, prediction.details.engine_version): the same figure as
    # the evaluator gives for the 6-layer model with the runner's (release 0.2) engine facts, built here apart
    # (the prediction stored beside the trial, 240.48 ms, is an older model's: issue 39's FP32 routed path terms)
    from autotune.cost.simulator import SimulatedEvaluator
    from autotune.spec.engines import resolve_engine
    from autotune.spec.hardware import make_cluster
    from autotune.spec.models import get_builtin_model
    from autotune.spec.plan import Plan, Workload
    import yaml

    doc = yaml.safe_load(f.read_text())
    plan = Plan.from_dict(doc["plan"])
    ev = SimulatedEvaluator(model=get_builtin_model("qwen3-30b-a3b").truncated(6),
                            cluster=make_cluster("h200", 1, None),
                            workload=Workload(seq_len=4096, global_batch_size=4), engine=resolve_engine("torchtitan", "real"))
    want = ev.evaluate(plan).step_time_ms
    assert "the facts of torchtitan 0.2.2" in r.output and f"step time                  {want:.1f} ms" in r.output, r.output
    # the 0.3 profile (no FP32-path facts) gives another figure, so the release is what is read
    other = SimulatedEvaluator(model=get_builtin_model("qwen3-30b-a3b").truncated(6),
                               cluster=make_cluster("h200", 1, None), workload=Workload(seq_len=4096, global_batch_size=4),
                               engine=resolve_engine("torchtitan", "simulated")).evaluate(plan).step_time_ms
    assert abs(other - want) > 1.0
    # a real trial's stored figures are measured: said so, with the simulator's figure then and now beside them
    assert "measured in the file (real): step 282.7 ms" in r.output and "240.5 ms at the trial" in r.output, r.output
    assert f"{want:,.1f} ms now" in r.output and "DIFFERENT" not in r.output, r.output


def test_a_stored_prediction_that_did_not_fit_is_reported_as_such(tmp_path):
    # a plan saved while it did not fit has step 0 / MFU 0 in its prediction: simulate said "step 0.0 ms, MFU 0.0%
    # -> DIFFERENT now" (QA of issue 40's CPU offloading); it now says it did not fit and whether it fits now.
    # 70B at TP 4 on 64 GB200 without recompute: 184.5 GiB > 183.0 usable; offloading 20 layers' activations fits
    f = tmp_path / "base.yaml"
    r = CliRunner().invoke(main, ["simulate", "--size", "70b", "--gpu", "gb200", "--gpus", "64", "--tp", "4", "--pp",
                                  "1", "--mbs", "1", "--recompute", "none", "--save-plan", str(f)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["simulate", str(f)])
    assert r.exit_code == 0, r.output
    assert "did not fit (out of memory" in r.output and "-> still does not fit" in r.output, r.output[-600:]
    assert "step 0.0 ms" not in r.output
    g = tmp_path / "off.yaml"
    g.write_text(f.read_text().replace("cpu_offload_layers: 0", "cpu_offload_layers: 20"))
    r = CliRunner().invoke(main, ["simulate", str(g)])
    assert r.exit_code == 0, r.output
    assert "-> fits now (step" in r.output and "CPU offload" in r.output, r.output[-600:]
