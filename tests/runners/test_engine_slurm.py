"""Engine runners through ``--launcher slurm`` without a cluster: fake ``sbatch`` / ``scontrol`` / ``srun`` /
``scancel`` on PATH run the batch script here (one node), so the real torchrun of the job starts a fake
``pretrain_gpt.py`` that prints the recorded H200 log; the job script, the result and the timeout's scancel
are checked (issue 23)."""

from __future__ import annotations

import os
import stat
import statistics
import sys
import textwrap
from pathlib import Path

import pytest

from autotune.cli.options import resolve_target
from autotune.engines.megatron import runner as mr
from autotune.engines.megatron.log import parse_iterations
from autotune.runtime.evaluator import TrialFailed
from autotune.spec.plan import Plan

RECORDED = (Path(__file__).resolve().parents[2] / "docs" / "results" / "engines" / "megatron-h200x1-2026-12-02"
            / "megatron-8b-l16.log")
PLAN = Plan(micro_batch_size=1, num_micro_batches=2, recompute="selective", precision="bf16", zero_stage=0)


def _exe(path: Path, text: str) -> None:
    path.write_text(textwrap.dedent(text))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _fake_slurm(bin_dir: Path, state_dir: Path) -> None:
    """sbatch runs the script to its end (stdout / stderr to the #SBATCH paths) and records the job's end for
    scontrol; srun drops its options and runs the rest; scancel records the cancel."""
    bin_dir.mkdir()
    _exe(bin_dir / "sbatch", f'''\
        #!{sys.executable}
        import os, subprocess, sys
        script = sys.argv[-1]
        text = open(script).read()
        # the script names no log path (launchers/slurm.batch_script): it cd's to its folder and writes
        # stdout.log / stderr.log there; Slurm's own output goes to /dev/null, as it does here
        assert "#SBATCH --output=/dev/null" in text and "exec >stdout.log 2>stderr.log" in text, text
        open("{state_dir}/script", "w").write(text)
        env = dict(os.environ, SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="localhost")
        try:
            rc = subprocess.run(["bash", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                timeout=float(os.environ.get("FAKE_SLURM_LIMIT", "120"))).returncode
            state = "COMPLETED" if rc == 0 else "FAILED"
        except subprocess.TimeoutExpired:
            rc, state = 0, "RUNNING"
        open("{state_dir}/job", "w").write(f"JobId=4242 JobState={{state}} ExitCode={{rc}}:0")
        print("4242")
    ''')
    _exe(bin_dir / "scontrol", f'''\
        #!{sys.executable}
        import os, sys
        a = sys.argv[1:]
        if a[:2] == ["show", "hostnames"]:
            print("localhost")
        elif os.path.exists("{state_dir}/cancelled"):
            print("JobId=4242 JobState=CANCELLED ExitCode=0:15")
        else:
            print(open("{state_dir}/job").read())
    ''')
    _exe(bin_dir / "srun", '''\
        #!/bin/bash
        while [[ "$1" == --* ]]; do shift; done
        exec "$@"
    ''')
    _exe(bin_dir / "scancel", f'''\
        #!/bin/bash
        touch {state_dir}/cancelled
    ''')


def _evaluator(tmp_path, monkeypatch, trainer_body: str, **kw):
    ck = tmp_path / "Megatron-LM"
    (ck / "megatron" / "core").mkdir(parents=True)
    (ck / "pretrain_gpt.py").write_text(trainer_body)
    state = tmp_path / "state"
    state.mkdir()
    _fake_slurm(tmp_path / "bin", state)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(mr.CHECKOUT_ENV, str(ck))
    monkeypatch.setenv("AUTOTUNE_WORKDIR", str(tmp_path / "shared"))
    monkeypatch.setattr(mr, "has_transformer_engine", lambda: False)
    monkeypatch.setattr(mr, "check_megatron", lambda: "megatron-core 0.20.0")
    monkeypatch.setattr("autotune.runners.engine_runner.local_gpu_count", lambda: 0)   # no GPU here: not asked
    model, cluster, workload = resolve_target(size="8b", model_path=None, gpu="h200", gpus=1, interconnect=None,
                                              seq_len=8192, global_batch="16K")
    return mr.MegatronEvaluator(model=model, cluster=cluster, workload=workload, layers=16, steps=8, warmup=2,
                                launcher={"kind": "slurm", "partition": "gpu", "time": "10"}, **kw), state


def test_slurm_trial_runs_the_engine_through_sbatch(tmp_path, monkeypatch):
    ev, state = _evaluator(tmp_path, monkeypatch, f"print(open({str(RECORDED)!r}).read())\n", timeout_s=120)
    try:
        r = ev.evaluate(PLAN)
        assert str(ev._tmp).startswith(str(tmp_path / "shared"))      # the trial folders on the shared path
    finally:
        ev.close()
    # the recorded log's iterations 3..10 (2 warm-up): their median elapsed ms; its last max reserved
    its = parse_iterations(RECORDED.read_text())
    assert r.feasible and r.step_time_ms == pytest.approx(statistics.median(x.elapsed_ms for x in its[2:]))
    assert r.peak_memory_bytes == 128434 * 2**20
    assert (r.details["launcher"], r.details["slurm_job_id"], r.details["slurm_state"]) == ("slurm", "4242", "COMPLETED")
    script = (state / "script").read_text()
    # one node, one GPU, the partition and time asked, torchrun with a c10d rendezvous, then the engine's entry
    for line in ("#SBATCH --nodes=1", "#SBATCH --gpus-per-node=1", "#SBATCH --partition=gpu", "#SBATCH --time=10"):
        assert line in script.splitlines()
    run = script.splitlines()[-1]
    assert "-m torch.distributed.run --nnodes=1 --nproc-per-node=1 --rdzv-backend=c10d" in run
    assert f"{tmp_path / 'Megatron-LM' / 'pretrain_gpt.py'} --num-layers 16" in run
    assert "--transformer-impl local" in run


def test_slurm_trial_timeout_cancels_the_job(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_SLURM_LIMIT", "1")       # sbatch returns while the job still "runs"
    ev, state = _evaluator(tmp_path, monkeypatch, "import time\ntime.sleep(8)\n", timeout_s=2)
    with pytest.raises(TrialFailed, match="megatron run timeout: timed out after 2 s with 0 of 10"):
        ev.evaluate(PLAN)
    ev.close()
    assert (state / "cancelled").exists()
