"""`autotune validate`: --json and --timeout checked before anything is launched (exit 2, one line)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from autotune.cli.app import main
from autotune.spec.hardware import get_fabric
from autotune.spec.plan import Plan, PlanDocument, Workload

from runtime_harness import TINY


@pytest.fixture
def plan_file(tmp_path, monkeypatch):
    from autotune.runtime import evaluator

    def launched(*a, **k):
        raise AssertionError("the run was launched")
    # nothing may be launched for bad options; before the fix --json was only looked at after the run
    monkeypatch.setattr(evaluator.RealEvaluator, "evaluate", launched)
    doc = PlanDocument(plan=Plan(dp_degree=2, micro_batch_size=1, num_micro_batches=2), model=TINY, gpu="h200",
                       num_gpus=2, fabric=get_fabric("nvlink4").to_dict(), workload=Workload(seq_len=32,
                                                                                           global_batch_size=4))
    p = tmp_path / "plan.yaml"
    doc.save(p)
    return p


@pytest.mark.parametrize("args, expect", [
    # before: exit 1 FileNotFoundError after the whole run
    (["--json", "/nonexistent/x.json"], "error: --json /nonexistent/x.json: directory /nonexistent does not exist"),
    # before: "run_plan needs steps >= 1, warmup >= 0 and timeout_s > 0; ..." (an internal function's words)
    (["--timeout", "0"], "error: --timeout must be > 0 s, got 0"),
    (["--timeout", "-5"], "error: --timeout must be > 0 s, got -5"),
])
def test_bad_options_refused_before_the_run(plan_file, args, expect):
    r = CliRunner().invoke(main, ["validate", str(plan_file), "--device", "cpu"] + args)
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert lines == [lines[0]] and lines[0].startswith(expect), r.output
