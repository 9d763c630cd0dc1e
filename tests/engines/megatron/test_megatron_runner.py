"""The Megatron-LM runner without Megatron-LM: a fake torchrun replays the recorded H200 log (8B widths x 16
layers, --transformer-impl local), prints CUDA's out-of-memory error or an argument assertion; the arguments,
the local implementation's refusals, the result and the CLI's missing-checkout error are checked (issue 23)."""

from __future__ import annotations

import statistics
import sys
import textwrap
from pathlib import Path

import pytest

from autotune.cli.options import resolve_target
from autotune.errors import AutotuneError, PlanError
from autotune.engines.megatron import runner as mr
from autotune.engines.megatron.log import parse_iterations
from autotune.spec.plan import Plan

RECORDED = (Path(__file__).resolve().parents[3] / "docs" / "results" / "engines" / "megatron-h200x1-2026-12-02"
            / "megatron-8b-l16.log")      # 10 iterations, 8B widths x 16 layers, mb 1, global batch 2
PLAN = Plan(micro_batch_size=1, num_micro_batches=2, recompute="selective", precision="bf16", zero_stage=0)


def _target():
    return resolve_target(size="8b", model_path=None, gpu="h200", gpus=1, interconnect=None, seq_len=8192,
                          global_batch="16K")


def _fake(tmp_path: Path, body: str) -> list[str]:
    """A fake torchrun that records its argv and environment, then runs ``body``."""
    f = tmp_path / "fake_torchrun.py"
    f.write_text(textwrap.dedent('''\
        import os, sys, pathlib
        here = pathlib.Path(sys.argv[0])
        here.with_name("seen.argv").write_text("\\n".join(sys.argv[1:]))
        here.with_name("seen.env").write_text(os.environ.get("PYTHONPATH", ""))
    ''') + textwrap.dedent(body))
    return [sys.executable, str(f)]


def _evaluator(tmp_path, body, monkeypatch, **kw):
    ck = tmp_path / "Megatron-LM"
    (ck / "megatron" / "core").mkdir(parents=True, exist_ok=True)
    (ck / "pretrain_gpt.py").write_text("")
    monkeypatch.setenv(mr.CHECKOUT_ENV, str(ck))
    monkeypatch.setattr(mr, "has_transformer_engine", lambda: False)
    model, cluster, workload = _target()
    kw.setdefault("steps", 8)
    kw.setdefault("warmup", 2)
    return mr.MegatronEvaluator(model=model, cluster=cluster, workload=workload, layers=16, timeout_s=30,
                                command=_fake(tmp_path, body), **kw)


def test_recorded_log_becomes_a_step_result(tmp_path, monkeypatch):
    ev = _evaluator(tmp_path, f"print(open({str(RECORDED)!r}).read())\n", monkeypatch, log_dir=tmp_path / "logs")
    try:
        r = ev.evaluate(PLAN)
    finally:
        ev.close()
    its = parse_iterations(RECORDED.read_text())
    # expected from the log itself: median elapsed ms of iterations 3..10 (2 warm-up), the second memory
    # report's max reserved (128434.00 MB), the warm-up iterations' time apart
    assert r.feasible and r.step_time_ms == pytest.approx(statistics.median(x.elapsed_ms for x in its[2:]))
    assert r.peak_memory_bytes == 128434 * 2**20
    assert r.details["warmup_s"] == pytest.approx((4755.1 + 3827.3) / 1e3)
    assert r.details["transformer_impl"] == "local" and "not fidelity data" in r.details["fidelity_note"]
    assert r.details["megatron_tflops_per_gpu"][4] == 154.2
    assert r.details["simulated_step_time_ms"] > 0 and "simulated_error_pct" in r.details
    # autotune's MFU: causal FLOPs of the 16-layer proxy for 2 x 8192 tokens over the H200's dense BF16 peak
    from autotune.cost.flops import model_flops_per_token
    model, cluster, _ = _target()
    flops = model_flops_per_token(model.truncated(16), 8192) * 16384
    assert r.mfu == pytest.approx(flops / (r.step_time_ms / 1e3) / (cluster.gpu.bf16_tflops * 1e12))
    argv = (tmp_path / "seen.argv").read_text().splitlines()
    i = argv.index("--transformer-impl")
    assert argv[i + 1] == "local" and "--mock-data" in argv and "--no-gradient-accumulation-fusion" in argv
    assert argv[argv.index("--num-layers") + 1] == "16" and argv[argv.index("--train-iters") + 1] == "10"
    assert argv[argv.index("--recompute-granularity") + 1] == "selective"
    assert "--cross-entropy-loss-fusion" not in argv
    assert argv[:3] == ["--standalone", "--nproc-per-node=1", str(tmp_path / "Megatron-LM" / "pretrain_gpt.py")]
    assert (tmp_path / "seen.env").read_text().split(":")[0] == str(tmp_path / "Megatron-LM")
    kept = sorted(p.suffix for p in (tmp_path / "logs").iterdir())
    assert kept == [".args", ".log"]


def test_local_implementation_refuses_fp8_and_cp_before_launch(tmp_path, monkeypatch):
    ev = _evaluator(tmp_path, "raise SystemExit('must not run')\n", monkeypatch)
    with pytest.raises(PlanError, match="FP8 recipes run in Transformer Engine, which is not installed"):
        ev.evaluate(PLAN.replace(precision="fp8_tensorwise"))
    assert not (tmp_path / "seen.argv").exists()
    ev.close()
    assert "context parallelism" in mr.local_impl_refusal(Plan(cp_degree=2))
    assert mr.local_impl_refusal(PLAN) is None


def test_oom_and_argument_assertion(tmp_path, monkeypatch):
    oom = ('print("Traceback (most recent call last):")\n'
           'print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.83 GiB. GPU 0 has a total '
           'capacity of 139.80 GiB of which 1.2 GiB is free. Including non-PyTorch memory, this process has '
           '138.52 GiB memory in use.")\nraise SystemExit(1)\n')
    ev = _evaluator(tmp_path, oom, monkeypatch)
    r = ev.evaluate(PLAN)
    ev.close()
    assert not r.feasible and r.peak_memory_bytes == int(138.52 * 2**30) and "megatron run" in r.infeasible_reason
    refuse = ('print("Traceback (most recent call last):")\n'
              'print("AssertionError: --tp-comm-overlap requires --sequence-parallel")\nraise SystemExit(1)\n')
    ev = _evaluator(tmp_path, refuse, monkeypatch)
    with pytest.raises(PlanError, match="megatron refused the plan: AssertionError: --tp-comm-overlap"):
        ev.evaluate(PLAN)
    ev.close()


def test_missing_checkout_names_the_variable(monkeypatch, tmp_path):
    monkeypatch.delenv(mr.CHECKOUT_ENV, raising=False)
    with pytest.raises(AutotuneError, match=r"set AUTOTUNE_MEGATRON_LM to a Megatron-LM checkout"):
        mr.check_megatron()
    monkeypatch.setenv(mr.CHECKOUT_ENV, str(tmp_path))
    with pytest.raises(AutotuneError, match="not a Megatron-LM checkout"):
        mr.check_megatron()


def test_megatron_core_version_is_read_from_the_checkout(tmp_path):
    (tmp_path / "megatron" / "core").mkdir(parents=True)
    (tmp_path / "megatron" / "core" / "package_info.py").write_text("MAJOR = 0\nMINOR = 20\nPATCH = 0\n")
    assert mr.megatron_core_version(tmp_path) == "megatron-core 0.20.0"


def test_cli_run_without_checkout_is_one_error_line(monkeypatch):
    from click.testing import CliRunner

    from autotune.cli import main

    monkeypatch.delenv(mr.CHECKOUT_ENV, raising=False)
    monkeypatch.setattr("autotune.runners.engine_runner.local_gpu_count", lambda: 1)    # a GPU host
    res = CliRunner().invoke(main, ["run", "--backend", "real", "--engine", "megatron", "--size", "8b", "--gpu",
                                    "h200", "--gpus", "1", "--layers", "16", "--global-batch", "16K", "--trials", "2",
                                    "--storage", "sqlite:///:memory:"])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [f"error: --engine megatron needs Megatron-LM's training scripts: "
                                                f"{mr.INSTALL_HINT}"]
    monkeypatch.setattr("autotune.runners.engine_runner.local_gpu_count", lambda: 0)    # a CPU machine: both said
    res = CliRunner().invoke(main, ["run", "--backend", "real", "--engine", "megatron", "--size", "8b", "--gpu",
                                    "h200", "--gpus", "1", "--layers", "16", "--global-batch", "16K", "--trials", "2",
                                    "--storage", "sqlite:///:memory:"])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and mr.INSTALL_HINT in lines[0] and "no CUDA GPU" in lines[0]


def test_cli_run_screens_then_runs_and_validate_replays(tmp_path, monkeypatch):
    """`autotune run --backend real --engine megatron` end to end with the fake trainer replaying the recorded
    log: the local implementation's note, the screen (FP8 plans refused by the builder), export, validate."""
    import functools

    from click.testing import CliRunner

    from autotune.cli import main

    ck = tmp_path / "Megatron-LM"
    (ck / "megatron" / "core").mkdir(parents=True)
    (ck / "pretrain_gpt.py").write_text("")
    monkeypatch.setenv(mr.CHECKOUT_ENV, str(ck))
    monkeypatch.setattr(mr, "has_transformer_engine", lambda: False)
    fake = _fake(tmp_path, f"print(open({str(RECORDED)!r}).read())\n")
    monkeypatch.setattr(mr.MegatronEvaluator, "__init__",
                        functools.partialmethod(mr.MegatronEvaluator.__init__, command=fake))
    db = f"sqlite:///{tmp_path / 's.db'}"
    res = CliRunner().invoke(main, ["run", "--backend", "real", "--engine", "megatron", "--size", "8b", "--gpu", "h200",
                                    "--gpus", "1", "--layers", "16", "--global-batch", "16K", "--trials", "2",
                                    "--real-steps", "7", "--storage", db, "--engine-logs", str(tmp_path / "logs")])
    assert res.exit_code == 0, res.output
    assert "note: Megatron-LM ran with --transformer-impl local" in res.output
    assert "simulator screen:" in res.output and "2 kept for real runs" in res.output
    assert len(list((tmp_path / "logs").glob("trial*.log"))) == 2
    study = res.output.split("export --study ")[1].split()[0].strip("'")
    res = CliRunner().invoke(main, ["export", "--study", study, "--storage", db, "-o", str(tmp_path / "plan.yaml")])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["validate", "--engine", "megatron", "--layers", "16", "--steps", "8",
                                    "--warmup", "2", str(tmp_path / "plan.yaml")])
    assert res.exit_code == 0, res.output
    assert "transformer impl" in res.output and "note: Megatron-LM ran with --transformer-impl local" in res.output
