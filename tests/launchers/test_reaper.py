"""The guard of autotune.launchers.reaper in its --on-stop form: a Slurm trial job is cancelled when the tuner
that submitted it is killed with SIGKILL (fake sbatch / scontrol / scancel on PATH; the job never ends by
itself). The guard of a local job is tested through run_in_session in tests/runtime/test_runtime_launch.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from workers_harness import repo_env, wait_for

_TUNER = """
import sys
from pathlib import Path
from autotune.launchers.slurm import run_slurm_job
wd = Path(sys.argv[1])
run_slurm_job(["-m", "autotune.runtime.worker"], nproc_per_node=1, wd=wd, env=dict(__import__("os").environ),
              timeout_s=600, options={"kind": "slurm", "time": "10"}, gpus=False)
"""


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def _fake_slurm(bin_dir: Path, state: Path) -> None:
    bin_dir.mkdir()
    _exe(bin_dir / "sbatch", f"#!/bin/bash\ntouch {state}/submitted\necho 4242\n")
    # the job runs until it is cancelled
    _exe(bin_dir / "scontrol", f"#!/bin/bash\nif [ -e {state}/cancelled ]; then echo 'JobId=4242 JobState=CANCELLED "
                               f"ExitCode=0:15'; else echo 'JobId=4242 JobState=RUNNING ExitCode=0:0'; fi\n")
    _exe(bin_dir / "scancel", f"#!/bin/bash\necho \"$@\" >> {state}/cancelled\n")


def _start(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    state = tmp_path / "state"
    state.mkdir()
    _fake_slurm(tmp_path / "bin", state)
    env = dict(repo_env(), PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "wd").mkdir()
    return subprocess.Popen([sys.executable, "-c", _TUNER, str(tmp_path / "wd")], env=env), state


def test_kill9_of_the_tuner_cancels_its_slurm_job(tmp_path):
    tuner, state = _start(tmp_path)
    try:
        wait_for(lambda: (state / "submitted").exists(), 60, "sbatch to be called")
        time.sleep(1.0)         # the guard starts right after sbatch's answer
        tuner.kill()
        tuner.wait(timeout=30)
        # the guard gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and runs `scancel 4242`
        wait_for(lambda: (state / "cancelled").exists(), 15, "scancel after the tuner was killed")
        assert (state / "cancelled").read_text().split() == ["4242"]
    finally:
        if tuner.poll() is None:
            tuner.kill()


def test_a_job_the_tuner_saw_end_is_not_cancelled_again(tmp_path):
    # the tuner's own Ctrl-C path cancels the job once; its guard is then SIGKILLed and cancels nothing
    tuner, state = _start(tmp_path)
    try:
        wait_for(lambda: (state / "submitted").exists(), 60, "sbatch to be called")
        time.sleep(1.0)
        tuner.terminate()       # SIGTERM: an interrupt inside run_slurm_job -> scancel, then the guard is killed
        tuner.wait(timeout=60)
        time.sleep(1.0)
        assert (state / "cancelled").read_text().split() == ["4242"]
    finally:
        if tuner.poll() is None:
            tuner.kill()


def test_the_guard_refuses_a_bad_command_line():
    from autotune.launchers.reaper import main
    assert main(["--parent", "x", "--", "true"]) == 2
    assert main(["--parent", str(os.getppid()), "--"]) == 2


def test_an_on_stop_guard_whose_tuner_is_already_gone_runs_its_command(tmp_path):
    # --parent names a process that is not the guard's parent (as when the tuner died between its fork and
    # the guard's prctl): the command runs at once
    from autotune.launchers.reaper import guarded
    out = tmp_path / "ran"
    argv = guarded(["bash", "-c", f"echo done > {out}"], on_stop=True)
    i = argv.index("--parent")
    argv[i + 1] = "1"
    assert subprocess.run(argv, timeout=60).returncode == 0
    assert out.read_text().strip() == "done"


def test_a_guard_started_with_sigchld_ignored_passes_the_status_on():
    # a tuner started with SIGCHLD ignored passes that disposition on through exec; the guard must still get
    # its job's status (QA, session 8: it spun at 100% CPU and the trial timed out)
    import signal

    from autotune.launchers.reaper import guarded
    p = subprocess.Popen(guarded([sys.executable, "-c", "import sys; sys.exit(3)"]),
                         preexec_fn=lambda: signal.signal(signal.SIGCHLD, signal.SIG_IGN))
    try:
        assert p.wait(timeout=20) == 3
    finally:
        if p.poll() is None:
            p.kill()
