"""Launch one plan with torchrun in its own process session, with a timeout, and classify the end.

:func:`run_plan` is what ``autotune validate`` and the real evaluator call. It never raises for a
plan that fails at run time: the returned dict's ``status`` says what happened:

* ``ok``: the worker's metrics (see :mod:`autotune.runtime.worker`) are in the dict;
* ``oom``: a rank ran out of memory (CUDA ``OutOfMemoryError``, or the CPU allocator under a memory
  cap); ``memory_reached_bytes`` is the highest peak any rank reported (reserved on CUDA, RSS on CPU);
* ``timeout``: the job ran past ``timeout_s``; the whole process tree (torchrun and its workers, found
  through ``/proc``) was killed; ``reason`` is ``timed out after N s in <phase>``;
* ``failed``: a rank raised (``reason`` has its message) or crashed (the last stderr lines), or the
  plan was refused (``refused=True``, the :class:`~autotune.errors.PlanError` message).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from autotune.errors import ConfigError
from autotune.launchers.process import read_phases, sigterm_as_interrupt
from autotune.launchers.reaper import descendants as _descendants, guarded
from autotune.spec.plan import PlanDocument

#: Always in the worker environment: NVLink SHARP multicast off (NCCL) and symmetric-memory multicast
#: off (torch), as the project's H200 hosts require.
FIXED_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}

STDERR_TAIL_LINES = 30


def worker_env(doc: PlanDocument, env: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """The worker's environment: this process's, then ``env``, then :data:`FIXED_ENV`, and
    ``PYTORCH_CUDA_ALLOC_CONF`` with ``expandable_segments:True`` exactly when the plan's
    ``memory_reclaim`` is ``expandable_segments`` (removed otherwise, so the setting cannot leak in)."""
    e = dict(os.environ)
    if env:
        e.update({k: str(v) for k, v in env.items()})
    e.update(FIXED_ENV)
    parts = [x for x in e.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",")
             if x and not x.startswith("expandable_segments")]
    if doc.plan.memory_reclaim == "expandable_segments":
        parts.append("expandable_segments:True")
    if parts:
        e["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(parts)
    else:
        e.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    root = str(Path(__file__).resolve().parents[2])
    e["PYTHONPATH"] = root + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return e


def _kill_tree(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM then SIGKILL the launcher's session and every descendant (workers may have started
    sessions of their own)."""
    pids = _descendants(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        for pid in pids + _descendants(proc.pid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=grace_s)
            if not any(os.path.exists(f"/proc/{p}") for p in pids):
                return
        except subprocess.TimeoutExpired:
            pass


def _phase_text(phases: dict[int, str]) -> str:
    if not phases:
        return "startup (no rank reported a phase)"
    vals = set(phases.values())
    if len(vals) == 1:
        return vals.pop()
    return "; ".join(f"rank {r}: {p}" for r, p in phases.items())


def _tail(path: Path, n: int = STDERR_TAIL_LINES) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def run_in_session(argv: Sequence[str], *, stdout: Any, stderr: Any, env: Mapping[str, str], cwd: str | Path,
                   timeout_s: float, on_timeout: Callable[[], None] | None = None) -> tuple[int | None, bool]:
    """Run ``argv`` under a guard (:mod:`autotune.launchers.reaper`: it ends ``argv`` and every descendant
    when this process dies, ``kill -9`` included) in a session of its own, and wait up to ``timeout_s``
    seconds. On a timeout ``on_timeout`` runs first (while the ranks are still alive), then the session and
    every descendant are killed; on Ctrl-C / SIGTERM of this process (SIGTERM raised as an interrupt
    meanwhile) they are killed and the interrupt is re-raised: torchrun runs in its own session, so the
    terminal's signal never reaches it.

    Returns:
        (return code of ``argv``, negative for a signal as in :mod:`subprocess`; timed out).
    """
    proc = subprocess.Popen(guarded(list(argv)), stdout=stdout, stderr=stderr, env=dict(env), cwd=str(cwd),
                            start_new_session=True)
    try:
        with sigterm_as_interrupt():
            return proc.wait(timeout=timeout_s), False
    except subprocess.TimeoutExpired:
        if on_timeout is not None:
            on_timeout()
        _kill_tree(proc)
        return proc.returncode, True
    except BaseException:
        _kill_tree(proc, grace_s=2.0)
        raise


def run_plan(doc: PlanDocument, *, layers: Optional[int] = None, steps: int = 5, warmup: int = 2,
             timeout_s: float = 900.0, env: Optional[Mapping[str, str]] = None, nproc: Optional[int] = None,
             device: str = "auto", memory_limit_mib: Optional[float] = None, seed: int = 0,
             workdir: Optional[str | Path] = None, profile: bool = False,
             launcher: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """Run ``doc``'s plan for real: ``python -m torch.distributed.run --standalone --nproc-per-node N
    -m autotune.runtime.worker ...`` in a new session, wait up to ``timeout_s`` seconds.

    Args:
        doc: the plan document (model, workload, GPU name for the MFU peak).
        layers: truncate the model to this many layers at true width (proxy); None = all.
        steps, warmup: timed and untimed steps.
        timeout_s: wall-clock limit for the whole job (s), including start-up.
        env: extra environment for the workers (e.g. ``NCCL_P2P_DISABLE=1`` for a slower fabric tier).
        nproc: processes (default ``plan.num_gpus``; the worker refuses a different world size).
        device: ``auto`` (CUDA if available), ``cuda`` or ``cpu`` (gloo).
        memory_limit_mib: cap each rank's memory this many MiB above what it holds after the model is
            built (see ``worker._apply_memory_limit``); None = no cap.
        workdir: where the plan, result, phase files and logs go (default: a new temp dir, removed when the
            run ends, whatever the outcome; ``workdir`` is then None in the result).
        profile: run one more step under ``torch.profiler`` after the timed ones; each rank's summary
            (:func:`autotune.runtime.trace.summarize`) is returned as ``profile`` (a list by rank).
        launcher: None or ``{"kind": "local"}``: torchrun here, in a new session (killed with its whole
            process group and descendants on timeout, Ctrl-C or SIGTERM of this process, and ended
            by its guard, :mod:`autotune.launchers.reaper`, if this process dies);
            ``{"kind": "slurm", "nodes": .., "gpus_per_node": .., "partition": .., "account": ..,
            "time": ..}``: a Slurm job (:func:`autotune.launchers.slurm.run_slurm_job`; ``workdir`` must
            be on a file system the nodes share); ``nproc`` is then the processes per node.

    Returns:
        dict with ``status`` (``ok``/``oom``/``timeout``/``failed``), ``reason`` (None when ok),
        ``returncode``, ``wall_s``, ``phase`` (per rank), ``workdir``, ``stderr_tail``, and for ``ok``
        the worker's metrics merged in; ``oom`` adds ``memory_reached_bytes``.

    Raises:
        ConfigError: ``steps``/``warmup``/``nproc``/``timeout_s`` out of range.
    """
    if steps < 1 or warmup < 0 or timeout_s <= 0:
        raise ConfigError(f"run_plan needs steps >= 1, warmup >= 0 and timeout_s > 0; got steps={steps}, "
                          f"warmup={warmup}, timeout_s={timeout_s}")
    n = doc.plan.num_gpus if nproc is None else nproc
    if n < 1:
        raise ConfigError(f"nproc must be >= 1, got {n}")
    if workdir is None:
        # a work directory of our own is removed when the run ends, whatever the outcome (issue 25: one
        # /tmp/autotune-run-* was left per trial); what the caller needs from it is in the returned dict
        tmp = Path(tempfile.mkdtemp(prefix="autotune-run-"))
        try:
            res = run_plan(doc, layers=layers, steps=steps, warmup=warmup, timeout_s=timeout_s, env=env, nproc=nproc,
                           device=device, memory_limit_mib=memory_limit_mib, workdir=tmp, profile=profile,
                           launcher=launcher, seed=seed)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        res["workdir"] = None
        return res
    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    plan_path, out_path = wd / "plan.yaml", wd / "result.json"
    doc.save(plan_path)
    for stale in [out_path, *wd.glob("phase.rank*"), *wd.glob("error.rank*.json"), *wd.glob("profile.rank*.json")]:
        stale.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
           "-m", "autotune.runtime.worker", "--plan", str(plan_path), "--steps", str(steps),
           "--warmup", str(warmup), "--out", str(out_path), "--phase-dir", str(wd), "--device", device,
           "--seed", str(seed)]
    if layers is not None:
        cmd += ["--layers", str(layers)]
    if memory_limit_mib is not None:
        cmd += ["--memory-limit-mib", str(memory_limit_mib)]
    if profile:
        cmd += ["--profile-dir", str(wd)]
    stdout_path, stderr_path = wd / "stdout.log", wd / "stderr.log"
    t0 = time.monotonic()
    phases_at_kill: dict[int, str] = {}
    extra: dict[str, Any] = {}
    if launcher is not None and launcher.get("kind", "local") == "slurm":
        from autotune.launchers.slurm import run_slurm_job

        worker_argv = cmd[cmd.index("autotune.runtime.worker") - 1:]
        job = run_slurm_job(worker_argv, nproc_per_node=n, wd=wd, env=worker_env(doc, env), timeout_s=timeout_s,
                            options=launcher, gpus=device != "cpu")
        rc, timed_out, phases_at_kill = job.returncode, job.timed_out, job.phases_at_kill
        extra = {"launcher": "slurm", "slurm_job_id": job.job_id, "slurm_state": job.state}
        cmd = job.command
    elif launcher is not None and launcher.get("kind", "local") != "local":
        raise ConfigError(f"unknown launcher {launcher.get('kind')!r}; known: local, slurm")
    else:
        at_kill: list[dict[int, str]] = []
        with open(stdout_path, "wb") as so, open(stderr_path, "wb") as se:
            rc, timed_out = run_in_session(cmd, stdout=so, stderr=se, env=worker_env(doc, env), cwd=wd,
                                           timeout_s=timeout_s, on_timeout=lambda: at_kill.append(read_phases(wd)))
        phases_at_kill = at_kill[0] if at_kill else {}
    wall = time.monotonic() - t0
    phases = phases_at_kill if timed_out else read_phases(wd)
    res: dict[str, Any] = {"status": "failed", "reason": None, "returncode": rc, "wall_s": wall,
                           "phase": phases, "workdir": str(wd), "command": cmd,
                           "stderr_tail": _tail(stderr_path), **extra}
    errors = []
    for f in sorted(wd.glob("error.rank*.json")):
        try:
            errors.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError):
            pass
    ooms = [e for e in errors if e.get("kind") == "oom"]
    if timed_out:
        res.update(status="timeout", reason=f"timed out after {timeout_s:g} s in {_phase_text(phases)}")
    elif ooms:
        reached = max((e.get("peak_reserved_bytes") or e.get("peak_rss_bytes") or 0) for e in ooms)
        res.update(status="oom", memory_reached_bytes=reached,
                   reason=f"out of memory on rank(s) {sorted(e['rank'] for e in ooms)} in "
                          f"{ooms[0]['phase']} after reaching {reached / 2**30:.2f} GiB: {ooms[0]['message']}")
    elif extra.get("slurm_state") == "OUT_OF_MEMORY":
        res.update(status="oom", memory_reached_bytes=0,
                   reason=f"out of memory: Slurm ended job {extra['slurm_job_id']} with state OUT_OF_MEMORY "
                          "(the node's memory limit)")
    elif out_path.exists() and (rc == 0 or (phases and set(phases.values()) == {"teardown"})):
        # rc != 0 with every rank in "teardown": the run and its report were complete (the workers
        # leave together after rank 0 wrote it, runtime/worker.py _leave_together) and a rank failed
        # while tearing its process group down; the measurement stands, and says so
        metrics = json.loads(out_path.read_text())
        res.update(metrics)
        res.update(status="ok", reason=None)
        if rc != 0:
            res["teardown_exit_code"] = rc
        if profile:
            res["profile"] = [json.loads(f.read_text()) for f in sorted(wd.glob("profile.rank*.json"))]
    elif errors:
        e = sorted(errors, key=lambda x: x.get("kind") != "plan")[0]
        res.update(refused=e.get("kind") == "plan",
                   reason=f"rank {e['rank']} failed in {e['phase']}: {e['message']}")
    else:
        res.update(reason=f"exit code {rc} in {_phase_text(phases)}; last stderr lines:\n{res['stderr_tail']}")
    return res
