"""Helpers of the worker tests: a real (CPU, gloo) tuning worker as a separate process, process trees."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ONE_PLAN = str(ROOT / "tests" / "data" / "one_plan.yaml")

#: A real-backend worker on the CPU: the tiny Llama of tests/runtime/runtime_harness.py, 2 gloo ranks,
#: the one-plan space; argv: storage URL, trials, heartbeat interval s, launcher (local|slurm), timeout s.
WORKER = r'''
import sys
sys.path.insert(0, {runtime_tests!r})
from runtime_harness import TINY
from autotune.spec.hardware import ClusterSpec, get_fabric, get_gpu
from autotune.spec.plan import Workload
from autotune.tune.tuner import Tuner
url, trials, hb, launcher, timeout_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
t = Tuner(model=TINY, cluster=ClusterSpec(gpu=get_gpu("h200"), num_gpus=2, fabric=get_fabric("nvlink4")),
          workload=Workload(seq_len=32, global_batch_size=4), space={space!r}, storage=url, backend="real",
          evaluator_options=dict(steps=2, warmup=1, timeout_s=timeout_s, device="cpu", launcher={{"kind": launcher}}))
s = t.optimize(trials, heartbeat_interval_s=hb, show_progress_bar=False)
print("OWN", s.n_new_trials, dict(s.own_states), flush=True)
'''.format(runtime_tests=str(ROOT / "tests" / "runtime"), space=ONE_PLAN)


def repo_env() -> dict[str, str]:
    """This environment with the repository root first on PYTHONPATH (a child process imports autotune)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return e


def start_worker(url: str, *, trials: int = 1, heartbeat_s: int = 1, launcher: str = "local",
                 timeout_s: float = 120.0, env: dict[str, str] | None = None, log: Path | None = None
                 ) -> subprocess.Popen:
    """The worker script above in its own session (signals reach only what the test sends)."""
    e = repo_env()
    e.update(env or {})
    out = open(log, "wb") if log else subprocess.DEVNULL
    # SIGINT as in a terminal's foreground process: a shell that starts a job in the background without
    # job control (a CI script's `... &`) leaves SIGINT ignored, and children inherit that
    return subprocess.Popen([sys.executable, "-c", WORKER, url, str(trials), str(heartbeat_s), launcher,
                             str(timeout_s)], env=e, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def descendants(pid: int) -> list[int]:
    from autotune.launchers.reaper import descendants as d

    return d(pid)


def alive(pids: list[int]) -> list[int]:
    """The pids of ``pids`` that still exist and are not zombies."""
    out = []
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(p)
        except OSError:
            pass
    return out


def wait_for(cond, timeout_s: float, what, poll_s: float = 0.2):
    """Poll ``cond`` until it is truthy; ``what`` (a string, or a callable read at the timeout so the
    message shows the state then) names what was awaited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        v = cond()
        if v:
            return v
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what() if callable(what) else what}")


def phase_files_say(root: Path, phase: str) -> bool:
    return any(p.read_text().startswith(phase) for p in root.glob("autotune-run-*/phase.rank*")
               if not p.name.endswith(".tmp"))
