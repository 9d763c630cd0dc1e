"""The torchtitan runner without torchtitan: a fake torchrun replays a recorded H200 log, prints CUDA's
out-of-memory error, a torchtitan config refusal, a crash, or hangs; the runner's classification,
step time, MFU, clean-up and the CLI's missing-engine error are checked (issue 23)."""

from __future__ import annotations

import statistics
import sys
import textwrap
from pathlib import Path

import pytest

from autotune.cli.options import resolve_target
from autotune.errors import AutotuneError, PlanError
from autotune.engines.torchtitan import runner as tr
from autotune.engines.torchtitan.log import parse_steps
from autotune.runtime.evaluator import TrialFailed
from autotune.spec.plan import Plan

LOGS = Path(__file__).resolve().parents[3] / "docs" / "results" / "engines"
RECORDED = LOGS / "torchtitan-h200x1-2026-12-01-bf16-compile.log"   # 12 steps, 8B_L16, mb 1 x 2


def _target():
    model, cluster, workload = resolve_target(size="8b", model_path=None, gpu="h200", gpus=1, interconnect=None,
                                              seq_len=8192, global_batch="16K")
    return model, cluster, workload


PLAN = Plan(tp_degree=1, pp_degree=1, dp_degree=1, cp_degree=1, micro_batch_size=1, num_micro_batches=2,
            recompute="none", zero_stage=3, precision="bf16", compile=True)


def _fake(tmp_path: Path, body: str) -> list[str]:
    """A fake torchrun: a Python script that also records its argv and the job file it was given."""
    f = tmp_path / "fake_torchrun.py"
    f.write_text(textwrap.dedent('''\
        import sys, time, pathlib
        argv = sys.argv[1:]
        job = pathlib.Path(argv[argv.index("--job.config_file") + 1])
        pathlib.Path(sys.argv[0]).with_name("seen.toml").write_text(job.read_text())
        pathlib.Path(sys.argv[0]).with_name("seen.argv").write_text(" ".join(argv))
    ''') + textwrap.dedent(body))
    return [sys.executable, str(f)]


def _evaluator(tmp_path, body, **kw):
    model, cluster, workload = _target()
    kw.setdefault("steps", 9)
    kw.setdefault("warmup", 3)
    return tr.TorchtitanEvaluator(model=model, cluster=cluster, workload=workload, layers=16, timeout_s=30,
                                  command=_fake(tmp_path, body), **kw)


def test_recorded_log_becomes_a_step_result(tmp_path):
    ev = _evaluator(tmp_path, f"print(open({str(RECORDED)!r}).read())\n", log_dir=tmp_path / "logs")
    try:
        r = ev.evaluate(PLAN)
        work = ev._tmp
    finally:
        ev.close()
    # expected values from the log itself: median of 16384 / tps over steps 4..12, peak reserved
    recs = parse_steps(RECORDED.read_text())
    expect_ms = statistics.median(1e3 * 16384 / x.tps for x in recs[3:])
    assert r.feasible and r.backend == "real"
    assert r.step_time_ms == pytest.approx(expect_ms)
    assert r.peak_memory_bytes == int(max(x.memory_gib for x in recs) * 2**30)
    assert r.details["warmup_s"] == pytest.approx(sum(16384 / x.tps for x in recs[:3]))
    # autotune's MFU convention: causal model FLOPs of the 16-layer proxy over the H200's dense BF16 peak
    from autotune.cost.flops import model_flops_per_token
    model, cluster, workload = _target()
    flops = model_flops_per_token(model.truncated(16), 8192) * 16384
    assert r.mfu == pytest.approx(flops / (expect_ms / 1e3) / (cluster.gpu.bf16_tflops * 1e12))
    assert r.details["simulated_step_time_ms"] > 0 and "simulated_error_pct" in r.details
    # the job the fake trainer got: the 16-layer flavour, 3 + 9 steps, compile on, the synthetic assets
    seen = (tmp_path / "seen.toml").read_text()
    assert 'flavor = "8B_L16"' in seen and "steps = 12" in seen and "enable = true" in seen
    assert "--nproc-per-node=1" in (tmp_path / "seen.argv").read_text()
    kept = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert kept == ["trial01-tp1pp1dp1cp1-mb1-bf16-compile-rcnone.log", "trial01-tp1pp1dp1cp1-mb1-bf16-compile-rcnone.toml"]
    assert work is not None and not work.exists()          # temp folder (assets, trial dirs) removed


def test_oom_is_an_infeasible_result(tmp_path):
    lines = [x for x in RECORDED.read_text().splitlines() if "step:" in x][:2]
    body = f"""
lines = {lines!r}
print("\\n".join(lines))
print("Traceback (most recent call last):")
print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 138.77 GiB memory in use.")
sys.exit(1)
"""
    ev = _evaluator(tmp_path, body)
    try:
        r = ev.evaluate(PLAN)
    finally:
        ev.close()
    assert not r.feasible and "out of memory" in r.infeasible_reason
    assert r.peak_memory_bytes == int(138.77 * 2**30)


def test_engine_refusal_is_a_plan_error(tmp_path):
    body = """
print("Traceback (most recent call last):")
print('  File "torchtitan/train.py", line 1, in <module>')
print("ValueError: Float8 rowwise requires compile")
sys.exit(1)
"""
    ev = _evaluator(tmp_path, body)
    with pytest.raises(PlanError, match="torchtitan refused the plan: ValueError: Float8 rowwise requires compile"):
        ev.evaluate(PLAN)
    ev.close()


def test_crash_and_hang_are_trial_failures(tmp_path):
    crash = """
print("Traceback (most recent call last):")
print("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp")
sys.exit(1)
"""
    ev = _evaluator(tmp_path, crash)
    with pytest.raises(TrialFailed, match="failed: RuntimeError: NCCL error"):
        ev.evaluate(PLAN)
    ev.close()
    hang = """
import os
pathlib.Path(sys.argv[0]).with_name("pid").write_text(str(os.getpid()))
time.sleep(600)
"""
    ev = _evaluator(tmp_path, hang)
    ev.timeout_s = 2.0
    with pytest.raises(TrialFailed, match="timed out after 2 s with 0 of 12 steps logged"):
        ev.evaluate(PLAN)
    ev.close()
    pid = int((tmp_path / "pid").read_text())
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]


def test_screened_out_plan_is_refused_before_launch(tmp_path):
    ev = _evaluator(tmp_path, "raise SystemExit('must not run')\n", only_plans=[PLAN])
    with pytest.raises(PlanError, match="screened out by the simulator"):
        ev.evaluate(PLAN.replace(precision="fp8_rowwise"))
    assert not (tmp_path / "seen.toml").exists()
    ev.close()


def test_classify_counts_a_teardown_exit_after_all_steps_as_ok():
    text = RECORDED.read_text() + "\nTraceback (most recent call last):\nRuntimeError: barrier timeout\n"
    c = tr.classify(text, returncode=1, timed_out=False, timeout_s=10, total_steps=12)
    assert c["status"] == "ok" and "exit code 1 after the last step" in c["reason"]
    c = tr.classify(text, returncode=1, timed_out=False, timeout_s=10, total_steps=13)
    assert c["status"] == "failed" and "after 12 of 13 steps" in c["reason"]


def test_missing_torchtitan_names_the_extra(monkeypatch):
    from importlib import util

    real = util.find_spec
    monkeypatch.setattr(util, "find_spec", lambda name, *a: None if name == "torchtitan" else real(name, *a))
    with pytest.raises(AutotuneError, match=r"pip install -e '\.\[torchtitan-runner\]'"):
        tr.check_torchtitan()


def test_cli_run_without_torchtitan_is_one_error_line(monkeypatch):
    from click.testing import CliRunner
    from importlib import util

    from autotune.cli import main

    real = util.find_spec
    monkeypatch.setattr(util, "find_spec", lambda name, *a: None if name == "torchtitan" else real(name, *a))
    monkeypatch.setattr("autotune.runners.engine_runner.local_gpu_count", lambda: 1)    # a GPU host
    res = CliRunner().invoke(main, ["run", "--backend", "real", "--engine", "torchtitan", "--size", "8b", "--gpu",
                                    "h200", "--gpus", "1", "--layers", "16", "--global-batch", "16K", "--trials", "2",
                                    "--storage", "sqlite:///:memory:"])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == ["error: --engine torchtitan needs torchtitan, which is not installed: "
                                                "pip install -e '.[torchtitan-runner]' (in the autotune checkout)"]


@pytest.mark.parametrize("gpus", [0, 1])
def test_wrong_torchtitan_on_a_machine_without_gpu_says_both_in_one_line(monkeypatch, gpus):
    # issue 23 QA: torchtitan 0.3.0 installed (as `make` does) on a CPU machine said only that 0.2.x is needed
    from importlib import metadata, util

    from click.testing import CliRunner

    from autotune.cli import main

    real_spec, real_version = util.find_spec, metadata.version
    monkeypatch.setattr(util, "find_spec", lambda name, *a: object() if name == "torchtitan" else real_spec(name, *a))
    monkeypatch.setattr(metadata, "version", lambda d: "0.3.0" if d == "torchtitan" else real_version(d))
    monkeypatch.setattr("autotune.runners.engine_runner.local_gpu_count", lambda: gpus)
    res = CliRunner().invoke(main, ["run", "--backend", "real", "--engine", "torchtitan", "--size", "8b", "--gpu",
                                    "h200", "--gpus", "1", "--layers", "16", "--global-batch", "16K", "--trials", "2",
                                    "--storage", "sqlite:///:memory:"])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: torchtitan 0.3.0 is installed")
    assert "0.2.x" in lines[0]
    assert ("no CUDA GPU was found" in lines[0]) == (gpus == 0), lines[0]


def test_cli_run_screens_then_runs_and_validate_replays(tmp_path, monkeypatch):
    """`autotune run --backend real --engine torchtitan` end to end with the fake trainer replaying the
    recorded log: the screen's counts, only kept plans run, export, `validate --engine torchtitan`."""
    import functools

    from click.testing import CliRunner

    from autotune.cli import main

    fake = _fake(tmp_path, f"print(open({str(RECORDED)!r}).read())\n")
    monkeypatch.setattr(tr, "check_torchtitan", lambda: "0.2.2")
    monkeypatch.setattr(tr.TorchtitanEvaluator, "__init__",
                        functools.partialmethod(tr.TorchtitanEvaluator.__init__, command=fake))
    db = f"sqlite:///{tmp_path / 's.db'}"
    args = ["run", "--backend", "real", "--engine", "torchtitan", "--size", "8b", "--gpu", "h200", "--gpus", "1",
            "--layers", "16", "--global-batch", "16K", "--trials", "3", "--real-steps", "9", "--storage", db,
            "--engine-logs", str(tmp_path / "logs")]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "simulator screen:" in res.output and "3 kept for real runs" in res.output
    assert "3 trials run by this worker" in res.output
    assert len(list((tmp_path / "logs").glob("trial*.log"))) == 3
    study = res.output.split("export --study ")[1].split()[0].strip("'")
    res = CliRunner().invoke(main, ["export", "--study", study, "--storage", db, "-o", str(tmp_path / "plan.yaml")])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["validate", "--engine", "torchtitan", "--layers", "16", "--steps", "9",
                                    "--warmup", "3", str(tmp_path / "plan.yaml")])
    assert res.exit_code == 0, res.output
    assert "with engine torchtitan" in res.output and "simulated step time" in res.output
