"""A real trial as a Slurm batch job: ``sbatch`` a script whose ``srun`` starts one ``torchrun`` per node,
joined by a c10d rendezvous on the job's first node, and wait for it.

Flow of :func:`run_slurm_job` (what :func:`autotune.runtime.launch.run_plan` calls for
``launcher={"kind": "slurm", ...}``):

1. write ``job.sbatch`` into the trial's work directory (which must be on a file system the nodes share:
   the worker writes its phase, error and result files there, and Slurm the job's stdout/stderr logs);
2. ``sbatch --parsable job.sbatch`` with the worker environment (sbatch exports the submitting
   environment by default, ``--export=ALL``: the NCCL tier variables and ``PYTHONPATH`` reach the nodes);
3. poll ``scontrol show job -o ID`` every second: the trial timeout counts from when the job is RUNNING
   (time spent PENDING in the queue is limited separately, by the same number of seconds);
4. on timeout, Ctrl-C or SIGTERM: ``scancel ID`` (Slurm signals every step's processes on every node),
   wait for the job to leave the RUNNING state, report; the caller classifies the work directory's files
   exactly as for a local run (OOM / crash / hang), and Slurm's ``OUT_OF_MEMORY`` state counts as OOM;
5. if this process dies without step 4 (``kill -9``), a guard started right after ``sbatch``
   (:mod:`autotune.launchers.reaper`, ``--on-stop``) runs ``scancel ID``; a kill between ``sbatch``'s
   answer and the guard's start (milliseconds) leaves the job to its ``--time`` limit.

Sources: sbatch(1) ``--parsable``, ``--nodes``, ``--ntasks-per-node``, ``--gpus-per-node``, ``--time``,
``--chdir``, ``--output``/``--error``; srun(1) ``--kill-on-bad-exit``; scontrol(1) ``show job -o`` fields
``JobState`` and ``ExitCode=<code>:<signal>``; torchrun ``--rdzv-backend=c10d --rdzv-endpoint`` (PyTorch
docs, torch.distributed.elastic "torchrun").
"""

from __future__ import annotations

import math
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from autotune.errors import AutotuneError, ConfigError
from autotune.launchers.process import read_phases, sigterm_as_interrupt
from autotune.launchers.reaper import guarded

#: Job states after which a job does not run any more (scontrol(1) / squeue(1) "JOB STATE CODES").
TERMINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
                             "PREEMPTED", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"})
POLL_S = 1.0
#: rendezvous port on the first node: RDZV_PORT_BASE + job id mod RDZV_PORT_SPAN (distinct for
#: concurrent trial jobs that land on one node).
RDZV_PORT_BASE, RDZV_PORT_SPAN = 20000, 20000


@dataclass(frozen=True)
class SlurmJob:
    """The end of one trial job: ``job_id``; ``state`` (last JobState seen, e.g. COMPLETED); ``returncode``
    (the batch script's exit code, or -signal); ``timed_out`` (cancelled by the trial timeout);
    ``phases_at_kill`` (per-rank phases read just before scancel); ``command`` (the sbatch command)."""

    job_id: str
    state: str
    returncode: int | None
    timed_out: bool
    phases_at_kill: Mapping[int, str]
    command: list[str]


#: sbatch(1) ``--time`` formats: "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
#: "days-hours:minutes", "days-hours:minutes:seconds"; also "UNLIMITED" / "INFINITE".
_TIME_RE = re.compile(r"(?:\d{1,7}|\d{1,7}:\d{1,2}|\d{1,7}:\d{1,2}:\d{1,2}|\d{1,5}-\d{1,2}"
                      r"|\d{1,5}-\d{1,2}:\d{1,2}|\d{1,5}-\d{1,2}:\d{1,2}:\d{1,2}|UNLIMITED|INFINITE)", re.ASCII)
#: a Slurm partition or account name (slurm.conf(5) PartitionName / sacctmgr account names are plain words);
#: a comma-separated list for --partition (sbatch(1): "a comma separated list of partitions")
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")


def check_slurm_options(options: Mapping[str, Any], nproc: int | None = None, *, need_sbatch: bool = True) -> None:
    """Refuse Slurm launcher options that would only fail inside a trial, before any study is written.

    Checks: ``nodes`` / ``gpus_per_node`` integers >= 1 whose product is the plan's ``nproc`` GPUs
    (:func:`job_geometry`); ``time`` in an sbatch(1) ``--time`` format (:data:`_TIME_RE`); ``partition``
    (a comma-separated list) and ``account`` plain names (:data:`_NAME_RE`: letters, digits, ``_ . -``; a
    newline, space, quote or ``$`` would change the job script); ``sbatch`` on PATH when ``need_sbatch``.

    Raises:
        ConfigError: naming the option, the value and what is valid.
    """
    import shutil

    from autotune.files import display_text

    for name, key in (("--nodes", "nodes"), ("--gpus-per-node", "gpus_per_node")):
        v = options.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1 or v > 2**20):
            raise ConfigError(f"{name} must be an integer between 1 and {2**20:,}, got {display_text(repr(v), 40)}")
    if nproc is not None:
        job_geometry(nproc, options)
    t = options.get("time")
    if t is not None and (not isinstance(t, str) or not _TIME_RE.fullmatch(t)):
        raise ConfigError(f"--time {display_text(repr(t), 40)}: not a Slurm time limit; valid: MINUTES, MM:SS, "
                          "HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED (sbatch --time), e.g. 00:20:00")
    for opt, key, many in (("--partition", "partition", True), ("--account", "account", False)):
        v = options.get(key)
        if v is None:
            continue
        parts = v.split(",") if isinstance(v, str) and many else [v]
        if not all(isinstance(x, str) and _NAME_RE.fullmatch(x) for x in parts):
            raise ConfigError(f"{opt} {display_text(repr(v), 60)}: not a plain Slurm name; valid: letters, digits, "
                              "'_', '.', '-'" + (" (several partitions: a,b)" if many else ""))
    if need_sbatch and shutil.which("sbatch") is None:
        raise ConfigError("--launcher slurm: sbatch is not on PATH (run on a Slurm login node, or use "
                          "--launcher local)")


def job_geometry(nproc: int, options: Mapping[str, Any]) -> tuple[int, int]:
    """(nodes, processes per node) for ``nproc`` ranks: ``--nodes`` and/or ``--gpus-per-node`` from
    ``options``; with neither, one node with every rank.

    Raises:
        ConfigError: a count < 1, or nodes x per-node != the plan's ranks (names all three numbers).
    """
    nodes, gpn = options.get("nodes"), options.get("gpus_per_node")
    for name, v in (("--nodes", nodes), ("--gpus-per-node", gpn)):
        if v is not None and int(v) < 1:
            raise ConfigError(f"{name} must be >= 1, got {v}")
    if nodes is None and gpn is None:
        nodes, gpn = 1, nproc
    elif nodes is None:
        nodes = math.ceil(nproc / int(gpn))
    elif gpn is None:
        gpn = nproc // int(nodes)
    nodes, gpn = int(nodes), int(gpn)
    if nodes * gpn != nproc or nodes < 1 or gpn < 1:
        raise ConfigError(f"--nodes {nodes} x --gpus-per-node {gpn} = {nodes * gpn} ranks, but the plan runs on "
                          f"{nproc} GPUs; pick nodes x GPUs per node = {nproc}")
    return nodes, gpn


def time_limit(timeout_s: float, given: str | None) -> str:
    """sbatch ``--time``: ``given`` as is, else the trial timeout rounded up to whole minutes plus one."""
    return given if given else str(int(math.ceil(timeout_s / 60.0)) + 1)


def batch_script(worker_argv: Sequence[str], *, nodes: int, nproc_per_node: int, wd: Path, timeout_s: float,
                 options: Mapping[str, Any], gpus: bool, python: str = sys.executable) -> str:
    """The ``job.sbatch`` text (see the module docstring); ``worker_argv`` = ``-m autotune.runtime.worker ...``.

    No user text reaches the script unquoted: ``partition``, ``account`` and ``time`` must pass
    :func:`check_slurm_options` (plain names, a time format: nothing sbatch's ``#SBATCH`` parser or bash could
    read as more than one word). The work directory ``wd`` is in no ``#SBATCH`` line: Slurm would mangle it
    there (sbatch's ``#SBATCH`` parser drops backslashes and ends a value at an unquoted ``#``; slurmd expands
    ``%j``-style patterns and drops backslashes in the ``--output``/``--error`` path, its working directory
    included, sbatch(1) "filename pattern"; seen on slurm-wlm 22.05 with a directory holding ``%j`` and a backslash).
    sbatch is run in ``wd`` (its default ``--chdir`` is the submit directory), Slurm's own output goes to
    ``/dev/null``, and the script itself ``cd``s to ``wd`` and sends its output to ``stdout.log`` /
    ``stderr.log`` there. Every word of the script body (``wd``, the Python path, the worker's arguments with
    their paths) is quoted for bash with ``shlex.quote``, so spaces, quotes, ``$(...)``, backticks, ``;``,
    globs, ``%``, backslashes, newlines and non-ASCII text arrive verbatim (tests/test_slurm_services.py submits such
    a job to a real Slurm).

    Raises:
        ConfigError: a hostile or malformed option value.
    """
    check_slurm_options(options, need_sbatch=False)
    lines = ["#!/bin/bash", "#SBATCH --job-name=autotune-trial", f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1", "#SBATCH --output=/dev/null", "#SBATCH --error=/dev/null",
             f"#SBATCH --time={time_limit(timeout_s, options.get('time'))}"]
    if gpus:
        lines.append(f"#SBATCH --gpus-per-node={nproc_per_node}")
    for key in ("partition", "account"):
        if options.get(key):
            lines.append(f"#SBATCH --{key}={options[key]}")
    lines += ["set -u", f"cd -- {shlex.quote(str(wd))} || exit 1", "exec >stdout.log 2>stderr.log",
              'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              f"port=$(( {RDZV_PORT_BASE} + SLURM_JOB_ID % {RDZV_PORT_SPAN} ))",
              "exec srun --kill-on-bad-exit=1 --ntasks-per-node=1 "
              + " ".join(shlex.quote(x) for x in [python, "-m", "torch.distributed.run", f"--nnodes={nodes}",
                                                  f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d"])
              + ' --rdzv-endpoint="$head:$port" --rdzv-id="$SLURM_JOB_ID" '
              + " ".join(shlex.quote(x) for x in worker_argv)]
    return "\n".join(lines) + "\n"


def _scontrol_job(job_id: str, env: Mapping[str, str]) -> dict[str, str] | None:
    """``scontrol show job -o ID`` as key -> value, or None when Slurm no longer knows the job."""
    p = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, env=dict(env))
    if p.returncode != 0:
        return None
    out: dict[str, str] = {}
    for m in re.finditer(r"(\w+)=(\S*)", p.stdout):
        out.setdefault(*m.groups())     # the first: JobState and ExitCode come before WorkDir, Command, StdOut,
    return out                          # whose user text could hold " JobState=COMPLETED"


def _returncode(info: Mapping[str, str] | None) -> int | None:
    if not info or ":" not in info.get("ExitCode", ""):
        return None
    code, sig = info["ExitCode"].split(":", 1)
    return -int(sig) if sig.isdigit() and int(sig) else (int(code) if code.isdigit() else None)


def run_slurm_job(worker_argv: Sequence[str], *, nproc_per_node: int, wd: Path, env: Mapping[str, str],
                  timeout_s: float, options: Mapping[str, Any], gpus: bool) -> SlurmJob:
    """Submit the trial as a batch job, wait for it (module docstring), return how it ended.

    ``nproc_per_node``: here the plan's total ranks; split into nodes x per node by :func:`job_geometry`.

    Raises:
        ConfigError: bad geometry; AutotuneError: ``sbatch`` missing or refusing the job (its message).
        KeyboardInterrupt: re-raised after ``scancel`` when this process is interrupted (or gets SIGTERM).
    """

    nodes, gpn = job_geometry(nproc_per_node, options)
    script = wd / "job.sbatch"
    script.write_text(batch_script(worker_argv, nodes=nodes, nproc_per_node=gpn, wd=wd, timeout_s=timeout_s,
                                   options=options, gpus=gpus))
    cmd = ["sbatch", "--parsable", script.name]
    try:        # run in the work directory: the job's working directory and its log files' (batch_script)
        p = subprocess.run(cmd, capture_output=True, text=True, env=dict(env), timeout=120, cwd=wd)
    except FileNotFoundError:
        raise AutotuneError("--launcher slurm: sbatch is not on PATH (run on a Slurm login node, or use "
                            "--launcher local)") from None
    if p.returncode != 0:
        raise AutotuneError(f"--launcher slurm: sbatch refused the trial job: "
                            f"{(p.stderr or p.stdout).strip().splitlines()[-1] if (p.stderr or p.stdout).strip() else p.returncode}")
    job_id = p.stdout.strip().split(";")[0]
    state, info, started, t_submit = "PENDING", None, None, time.monotonic()
    timed_out, phases_at_kill, guard = False, {}, None
    try:
        # a guard cancels the job if this process dies without doing so itself (kill -9): reaper.py, --on-stop;
        # what its scancel says goes to guard.log in the work directory
        with open(wd / "guard.log", "ab") as log:
            guard = subprocess.Popen(guarded(["scancel", job_id], on_stop=True), env=dict(env), cwd=wd,
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        with sigterm_as_interrupt():
            while True:
                info = _scontrol_job(job_id, env)
                state = (info or {}).get("JobState", "UNKNOWN" if info is None else state)
                if info is None or state in TERMINAL_STATES:
                    break
                now = time.monotonic()
                if state == "RUNNING" and started is None:
                    started = now
                if (started is not None and now - started > timeout_s) or (started is None and
                                                                            now - t_submit > timeout_s):
                    timed_out = True
                    phases_at_kill = read_phases(wd)
                    _cancel(job_id, env)
                    info, state = _wait_gone(job_id, env)
                    break
                time.sleep(POLL_S)
    except BaseException:
        _cancel(job_id, env)
        raise
    finally:
        if guard is not None:
            guard.kill()    # SIGKILL: the guard cancels nothing; this process has dealt with the job
            guard.wait()
    return SlurmJob(job_id=job_id, state=state, returncode=_returncode(info), timed_out=timed_out,
                    phases_at_kill=phases_at_kill, command=cmd)


def _cancel(job_id: str, env: Mapping[str, str]) -> None:
    subprocess.run(["scancel", job_id], capture_output=True, env=dict(env))


def _wait_gone(job_id: str, env: Mapping[str, str], limit_s: float = 60.0) -> tuple[dict[str, str] | None, str]:
    t0 = time.monotonic()
    info = None
    while time.monotonic() - t0 < limit_s:
        info = _scontrol_job(job_id, env)
        state = (info or {}).get("JobState", "UNKNOWN")
        if info is None or state in TERMINAL_STATES:
            return info, state
        time.sleep(POLL_S)
    return info, (info or {}).get("JobState", "UNKNOWN")


__all__ = ["SlurmJob", "run_slurm_job", "check_slurm_options", "batch_script", "job_geometry", "time_limit", "TERMINAL_STATES"]
