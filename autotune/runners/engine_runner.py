"""What every engine runner shares (issue 23): one trial of a plan through an engine's own training entry
point, in its own process session, and the engine's log turned into a :class:`StepResult`.

:class:`EngineRunner` is the lifecycle; an engine subclass (:mod:`autotune.engines.torchtitan.runner`,
:mod:`autotune.engines.megatron.runner`) supplies what differs: the check that the engine is installed
(:meth:`EngineRunner.check_engine`), the launch (:meth:`EngineRunner.build`: argv, environment and the job
text kept beside the log) and the log parser (:meth:`EngineRunner.parse`: per-step records and facts).

One trial (:meth:`EngineRunner.evaluate`):

1. the plan is checked in this process: :func:`autotune.spec.plan.validate_plan`,
   :func:`autotune.spec.engines.check_plan_for_engine`, the simulator's screen (``only_plans``) and the
   engine's own builder; a refusal raises ``PlanError`` (a pruned trial) before anything starts;
2. ``python -m torch.distributed.run --standalone --nproc-per-node N <entry point>`` runs ``warmup +
   steps`` steps in its own session (:func:`run_job`), stdout and stderr into one log, with a wall-clock
   limit; on timeout, Ctrl-C or SIGTERM its whole process group and every descendant are killed
   (:func:`autotune.runtime.launch.run_in_session`, as for native trials). With ``launcher={"kind":
   "slurm", ...}`` the same entry point runs as a Slurm batch job instead
   (:func:`autotune.launchers.slurm.run_slurm_job`, as native trials: ``srun`` starts one torchrun per
   node joined by a c10d rendezvous; the trial timeout counts from RUNNING; ``scancel`` on timeout or
   interrupt); its stdout and stderr logs are read as one. The trial folders then have to be on a file
   system the nodes share: they are made under ``$AUTOTUNE_WORKDIR`` when set, else the temp folder (a
   single-node cluster);
3. the log is classified (:func:`classify_run`): ``ok``: a feasible result whose step time is the
   median over the steps after ``warmup``, MFU by autotune's formula (:func:`autotune.cost.simulator.
   make_result`), peak memory = the engine's peak *reserved* bytes (rank 0); the warm-up steps' time
   (``warmup_s``, compilation included) and the start-up before step 1 (``startup_s``) are reported apart
   in ``details`` beside the simulator's prediction of the same plan; ``oom``: ``feasible=False`` with
   the memory reached; ``refused`` (the engine raised ValueError / NotImplementedError / AssertionError
   before its first step): ``PlanError`` with the engine's message; ``timeout`` / ``failed``:
   :class:`autotune.runtime.evaluator.TrialFailed` with the reason (the study goes on);
4. the trial's folder is removed; with ``log_dir`` its log and job text are kept there first.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from autotune.cost.evaluator import Evaluator, StepResult
from autotune.errors import AutotuneError, ConfigError, PlanError
from autotune.runtime.evaluator import TrialFailed, local_gpu_count, tier_env
from autotune.runtime.launch import FIXED_ENV, run_in_session
from autotune.spec.engines import check_plan_for_engine, resolve_engine
from autotune.spec.hardware import ClusterSpec
from autotune.spec.models import ModelSpec
from autotune.spec.plan import Plan, Workload, validate_plan

#: exceptions an engine raises for a configuration it does not run (torchtitan's config/manager.py,
#: train.py, parallelize.py and Megatron-LM's arguments.py ``validate_args`` check with ``ValueError`` /
#: ``NotImplementedError`` / ``assert``); raised before the first logged step they make the trial a
#: refusal (``PlanError``), anything else a failure
REFUSAL_EXCEPTIONS = ("ValueError", "NotImplementedError", "AssertionError")
_EXC = re.compile(r"^(?:\[rank\d+\]:)?\s*(?:[A-Za-z_][\w.]*\.)?(?P<name>[A-Za-z_]\w*(?:Error|Exception))"
                  r"(?::\s*(?P<msg>.*))?$")
_OOM_IN_USE = re.compile(r"this process has ([\d.]+) GiB memory in use")
# Triton's "OutOfMemoryError: out of resource: <kernel> Required: N Hardware limit: M" is a shared-memory limit of one
# autotuning candidate (torch/_inductor/select_algorithm.py skips it: "Ignoring this choice"), not CUDA memory
_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError(?!: out of resource)")


@dataclass
class ParsedRun:
    """What an engine's log says, engine-neutral.

    Attributes:
        steps: step numbers logged (1-based), in order.
        step_times_ms: wall time of each logged step, ms (same order).
        losses: training loss of each logged step (None where not printed).
        peak_reserved_bytes: the engine's peak reserved memory reports, bytes (rank 0).
        facts: the engine's own figures and settings (versions, its MFU or TFLOP/s, ...).
        per_step: the engine's extra per-step figures (lists, same order as ``steps``).
    """

    steps: list[int] = field(default_factory=list)
    step_times_ms: list[float] = field(default_factory=list)
    losses: list[float | None] = field(default_factory=list)
    peak_reserved_bytes: list[int] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    per_step: dict[str, list] = field(default_factory=dict)



def _installed(dist: str) -> str | None:
    """The installed version of ``dist`` from its package metadata (no import: the engine, not this process,
    runs torch), or None when it is not installed here."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def no_gpu_note() -> str:
    """What to add to an engine's install error when this machine has no CUDA GPU (torch sees none, or torch is
    missing): ``"; also, no CUDA GPU was found on this machine ..."``; ``""`` when one is there. A user on a CPU
    machine then learns both problems from one line, not the install one first and the GPU one after it."""
    try:
        n = local_gpu_count()
    except ImportError:
        n = 0
    except Exception:  # noqa: BLE001 - a broken CUDA set-up: say nothing here, the runner's own check says it
        return ""
    return "" if n > 0 else ("; also, no CUDA GPU was found on this machine (the engine trains on NVIDIA GPUs: run "
                             "on a GPU host, or with --launcher slurm)")


def run_job(argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float, cwd: str | Path,
            log_path: str | Path) -> dict[str, Any]:
    """Run ``argv`` in a new session with stdout and stderr into ``log_path``; wait up to ``timeout_s``
    seconds. Returns ``{"returncode", "timed_out", "wall_s"}``. On timeout, and on Ctrl-C / SIGTERM of
    this process (re-raised after the cleanup), the process group and every descendant are killed."""
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        rc, timed_out = run_in_session(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                       timeout_s=timeout_s)
    return {"returncode": rc, "timed_out": timed_out, "wall_s": time.monotonic() - t0}


def first_exception(text: str) -> tuple[str, str] | None:
    """(name, message) of the first ``XError: message`` line after a ``Traceback`` in ``text``."""
    seen_tb = False
    for line in text.splitlines():
        if "Traceback (most recent call last)" in line:
            seen_tb = True
            continue
        if seen_tb and (m := _EXC.match(line.strip())):
            return m.group("name"), (m.group("msg") or "").strip()
    return None


def classify_run(text: str, *, engine: str, steps_logged: Sequence[int], memory_gib: Sequence[float],
                 returncode: int | None, timed_out: bool, timeout_s: float, total_steps: int) -> dict:
    """What an engine run's log says happened.

    Args:
        text: the whole log; engine: its name (for the messages); steps_logged: the step numbers the
            parser found; memory_gib: every memory report of the log, GiB (for an out-of-memory result).

    Returns ``{"status": ok | oom | timeout | refused | failed, "reason": str | None}`` plus
    ``memory_reached_gib`` for ``oom``. ``ok``: every one of ``total_steps`` steps logged (a non-zero exit
    after that, e.g. in the process group's teardown, is noted in ``reason``); ``oom``: CUDA's
    out-of-memory error in the log (memory reached: "this process has X GiB memory in use" of the error,
    else the highest report); ``timeout``: killed after ``timeout_s``; ``refused``: one of
    :data:`REFUSAL_EXCEPTIONS` before any step; ``failed``: anything else.
    """
    n = len(set(steps_logged))
    out: dict[str, Any] = {"reason": None}
    if _OOM.search(text):
        m = _OOM_IN_USE.findall(text)
        reached = max([float(x) for x in m] + list(memory_gib) + [0.0])
        exc = first_exception(text)
        out.update(status="oom", memory_reached_gib=reached,
                   reason=f"CUDA out of memory after {n} logged steps" + (f": {exc[1][:200]}" if exc else ""))
    elif timed_out:
        out.update(status="timeout", reason=f"timed out after {timeout_s:g} s with {n} of {total_steps} "
                                            "steps logged" + ("" if n else " (start-up or compilation)"))
    elif n >= total_steps:
        out.update(status="ok", reason=None if returncode == 0 else f"exit code {returncode} after the last step")
    else:
        exc = first_exception(text)
        if exc and not n and exc[0] in REFUSAL_EXCEPTIONS:
            out.update(status="refused", reason=f"{engine} refused the plan: {exc[0]}: {exc[1]}")
        elif exc:
            out.update(status="failed", reason=f"{exc[0]}: {exc[1]} (after {n} of {total_steps} steps)")
        else:
            tail = " | ".join(x.strip() for x in text.strip().splitlines()[-3:])
            out.update(status="failed", reason=f"exit code {returncode} after {n} of {total_steps} "
                                                f"steps; last lines: {tail[:400]}")
    return out


def plan_label(plan: Plan) -> str:
    """A short file-name label of a plan (``tp1pp1dp1cp1-mb2-bf16-compile-rcnone``)."""
    return (f"tp{plan.tp_degree}pp{plan.pp_degree}dp{plan.dp_degree}cp{plan.cp_degree}-mb{plan.micro_batch_size}-"
            f"{plan.precision}-{'compile' if plan.compile else 'eager'}-rc{plan.recompute}")


@dataclass
class Launch:
    """One trial's launch: ``entry`` (what follows torchrun's options: ``-m torchtitan.train ...`` or
    ``pretrain_gpt.py ...``), the environment added to this process's, the job text kept beside the log
    (``job_suffix`` its file extension) and facts for the trial's record."""

    entry: list[str]
    env: dict[str, str]
    job_text: str
    job_suffix: str
    facts: dict[str, Any] = field(default_factory=dict)


class EngineRunner(Evaluator):
    """Runs each plan with an engine's own trainer on this host's GPUs (see the module docstring).

    Args (keyword-only):
        model, cluster, workload: as for every evaluator.
        layers: run a depth-truncated proxy with this many layers (true widths); None = all layers.
        steps: timed training steps (after ``warmup``); warmup: untimed steps, at least 1.
        timeout_s: wall-clock limit per trial, s (start-up and compilation included).
        predict: also simulate each plan (the engine's profile) and store prediction and error.
        env: extra environment for the trainer.
        engine: must be the subclass's :attr:`ENGINE` (or None).
        launcher: None / ``{"kind": "local"}``: torchrun on this host; ``{"kind": "slurm", "nodes": ..,
            "gpus_per_node": .., "partition": .., "account": .., "time": ..}``: a Slurm batch job per trial
            (module docstring).
        only_plans: when given, plans not in it are refused (``PlanError``: "screened out").
        log_dir: keep every trial's log and job text here (``trial<N>-<plan>.log`` / ``.<suffix>``).
        command: the launcher argv prefix instead of ``python -m torch.distributed.run`` (tests pass a
            fake torchrun); the engine and the GPU count are then not checked.
        device: ``auto`` or ``cuda``.

    Raises:
        AutotuneError: the engine missing (names what to install); more GPUs asked than visible.
        ConfigError: another engine, a non-local launcher, steps / warmup / timeout out of range.
    """

    backend = "real"
    ENGINE = ""
    #: the step's unit in messages (torchtitan: "step", Megatron-LM: "iteration")
    STEP_WORD = "step"

    def __init__(self, *, model: ModelSpec, cluster: ClusterSpec, workload: Workload, layers: int | None = None,
                 steps: int = 3, warmup: int = 3, timeout_s: float = 900.0, predict: bool = True,
                 env: Mapping[str, str] | None = None, engine: str | None = None,
                 launcher: Mapping[str, Any] | None = None, only_plans: Sequence[Plan] | None = None,
                 log_dir: str | Path | None = None, command: Sequence[str] | None = None,
                 device: str = "auto") -> None:
        name = self.ENGINE
        if engine not in (None, name):
            raise ConfigError(f"{type(self).__name__} runs engine {name}, not {engine}")
        kind = (launcher or {}).get("kind", "local")
        if kind not in ("local", "slurm"):
            raise ConfigError(f"unknown launcher {kind!r}; known: local, slurm")
        if steps < 1 or warmup < 1 or not timeout_s > 0:
            raise ConfigError(f"{name} trials need steps >= 1, warmup >= 1 and timeout_s > 0; got steps={steps}, "
                              f"warmup={warmup}, timeout_s={timeout_s}")
        if device == "cpu":
            raise ConfigError(f"--device cpu: {name}'s trainer runs these models on CUDA GPUs only")
        super().__init__(model=model, cluster=cluster, workload=workload, engine=resolve_engine(name, "real"))
        self.layers, self.steps, self.warmup, self.timeout_s = layers, steps, warmup, timeout_s
        self.predict = predict
        self.env = {**tier_env(cluster), **(env or {})}
        self.only_plans = None if only_plans is None else frozenset(only_plans)
        self.log_dir = Path(log_dir) if log_dir else None
        if self.log_dir is not None:
            from autotune.files import check_output_path
            check_output_path(self.log_dir, what="--engine-logs", directory=True)   # not a symbolic link
            self.log_dir.mkdir(parents=True, exist_ok=True)
        self.launcher = dict(launcher) if kind == "slurm" else None
        if self.launcher is not None:
            from autotune.launchers.slurm import check_slurm_options

            check_slurm_options(self.launcher, cluster.num_gpus, need_sbatch=command is None)
        if command is None:
            self.engine_version: str | None = self.check_engine()
            n = local_gpu_count() if self.launcher is None else cluster.num_gpus   # Slurm: the nodes' GPUs
            if cluster.num_gpus > n:
                raise AutotuneError(f"--engine {name} runs plans on this host's GPUs: --gpus {cluster.num_gpus} "
                                    f"but {n} CUDA GPU(s) are visible")
            self.command = [sys.executable, "-m", "torch.distributed.run"]
        else:
            self.engine_version = None
            self.command = list(command)
        self._tmp: Path | None = None
        self._sim = None
        self._n = 0

    # ---- what an engine supplies
    def check_engine(self) -> str:
        """The installed engine's version; raises AutotuneError naming what to install."""
        raise NotImplementedError

    def build(self, plan: Plan, workdir: Path, total_steps: int) -> Launch:
        """The trial's launch; raises ConfigError for a plan the engine (as installed) cannot run."""
        raise NotImplementedError

    def parse(self, text: str, plan: Plan) -> ParsedRun:
        """The engine log's steps, times, memory reports and facts for a run of ``plan``."""
        raise NotImplementedError

    # ---- shared
    @property
    def run_model(self) -> ModelSpec:
        return self.model if self.layers is None else self.model.truncated(self.layers)

    def _tmpdir(self) -> Path:
        if self._tmp is None:
            base = os.environ.get("AUTOTUNE_WORKDIR") if self.launcher is not None else None
            if base:
                Path(base).mkdir(parents=True, exist_ok=True)
            self._tmp = Path(tempfile.mkdtemp(prefix=f"autotune-{self.ENGINE}-", dir=base or None))
        return self._tmp

    def simulate(self, plan: Plan) -> StepResult | None:
        """The simulator's prediction of ``plan`` with this engine's profile (None if it refuses the plan)."""
        if not self.predict:
            return None
        from autotune.cost.simulator import SimulatedEvaluator

        if self._sim is None:
            self._sim = SimulatedEvaluator(model=self.run_model, cluster=self.cluster, workload=self.workload,
                                           engine=self.engine)
        try:
            return self._sim.evaluate(plan)
        except PlanError:
            return None

    def base_env(self) -> dict[str, str]:
        """This process's environment, ``env`` and the multicast-off settings of
        :data:`autotune.runtime.launch.FIXED_ENV`, with no allocator setting (the plan sets its own)."""
        e = dict(os.environ)
        e.update(self.env)
        e.update(FIXED_ENV)
        e.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        e["PYTHONUNBUFFERED"] = "1"
        return e

    def evaluate(self, plan: Plan) -> StepResult:
        model = self.run_model
        warnings = validate_plan(plan, model, self.cluster.num_gpus, self.workload,
                                 gpus_per_node=self.cluster.gpus_per_node)
        check_plan_for_engine(plan, self.engine)
        if self.only_plans is not None and plan not in self.only_plans:
            raise PlanError(f"screened out by the simulator: not among the plans kept for real {self.ENGINE} runs")
        total = self.warmup + self.steps
        wd = Path(tempfile.mkdtemp(prefix="trial-", dir=self._tmpdir()))
        try:
            try:
                launch = self.build(plan, wd, total)
            except ConfigError as e:
                raise PlanError(f"{self.ENGINE} job: {e}") from None
            job, log = wd / f"job.{launch.job_suffix}", wd / "train.log"
            job.write_text(launch.job_text)
            env = self.base_env()
            env.update(launch.env)
            if self.launcher is not None:
                run = self._run_slurm(launch, env, wd, log)
            else:
                argv = [*self.command, "--standalone", f"--nproc-per-node={self.cluster.num_gpus}", *launch.entry]
                run = run_job(argv, env=env, timeout_s=self.timeout_s, cwd=wd, log_path=log)
            log_text = log.read_text(errors="replace")
            self._n += 1
            kept = None
            if self.log_dir is not None:
                stem = f"trial{self._n:02d}-{plan_label(plan)}"
                from autotune.files import copy_output_file   # never through a symbolic link
                copy_output_file(log, self.log_dir / f"{stem}.log", what="--engine-logs")
                copy_output_file(job, self.log_dir / f"{stem}.{launch.job_suffix}", what="--engine-logs")
                kept = str(self.log_dir / f"{stem}.log")
        finally:
            shutil.rmtree(wd, ignore_errors=True)
        parsed = self.parse(log_text, plan)
        c = classify_run(log_text, engine=self.ENGINE, steps_logged=parsed.steps,
                         memory_gib=[b / 2**30 for b in parsed.peak_reserved_bytes], returncode=run["returncode"],
                         timed_out=run["timed_out"], timeout_s=self.timeout_s, total_steps=total)
        return self.result(plan, model, c, parsed, run, warnings=warnings, kept_log=kept, launch=launch)

    def _run_slurm(self, launch: Launch, env: Mapping[str, str], wd: Path, log: Path) -> dict[str, Any]:
        """The trial as a Slurm batch job (:func:`autotune.launchers.slurm.run_slurm_job`); its stdout and
        stderr logs are written into ``log`` one after the other. Returns :func:`run_job`'s keys plus
        ``slurm_job_id`` and ``slurm_state``."""
        from autotune.launchers.slurm import run_slurm_job

        t0 = time.monotonic()
        job = run_slurm_job(launch.entry, nproc_per_node=self.cluster.num_gpus, wd=wd, env=env,
                            timeout_s=self.timeout_s, options=self.launcher, gpus=True)
        parts = [(wd / n).read_text(errors="replace") for n in ("stdout.log", "stderr.log") if (wd / n).exists()]
        log.write_text("\n".join(parts))
        return {"returncode": job.returncode, "timed_out": job.timed_out, "wall_s": time.monotonic() - t0,
                "slurm_job_id": job.job_id, "slurm_state": job.state}

    def result(self, plan: Plan, model: ModelSpec, c: dict, parsed: ParsedRun, run: dict, *, warnings: list[str],
               kept_log: str | None, launch: Launch) -> StepResult:
        """The trial's :class:`StepResult` from the classification ``c`` and the parsed log."""
        from autotune.cost.simulator import make_result

        sim = self.simulate(plan)
        details: dict[str, Any] = {"engine": self.ENGINE, "warnings": list(warnings), "wall_s": run["wall_s"],
                                   "returncode": run["returncode"], "layers": self.layers or self.model.num_layers,
                                   "engine_version": parsed.facts.get("engine_version", self.engine_version),
                                   "device_name": parsed.facts.get("device"), "log": kept_log,
                                   "torch_version": parsed.facts.get("torch_version", _installed("torch")),
                                   "job": launch.job_text, **launch.facts,
                                   "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if "slurm_job_id" in run:
            details.update(launcher="slurm", slurm_job_id=run["slurm_job_id"], slurm_state=run["slurm_state"])
        if c["reason"]:
            details["note"] = c["reason"]
        if sim is not None:
            details["simulated_step_time_ms"] = sim.step_time_ms if sim.feasible else None
            details["simulated_feasible"] = sim.feasible
            details["simulated_peak_memory_bytes"] = sim.peak_memory_bytes
            details["simulated_mfu"] = sim.mfu if sim.feasible else None
        status = c["status"]
        if status == "oom":
            reached = int(c["memory_reached_gib"] * 2**30)
            return StepResult(backend=self.backend, feasible=False, step_time_ms=0.0, mfu=0.0, mfu_palm=0.0, hfu=0.0,
                              tokens_per_s_per_gpu=0.0, tflops_per_gpu=0.0, peak_memory_bytes=reached,
                              infeasible_reason=f"out of memory on the GPU ({self.ENGINE} run): reached "
                                                f"{reached / 2**30:.1f} GiB; {c['reason']}", details=details)
        if status == "refused":
            raise PlanError(c["reason"])
        if status != "ok":
            raise TrialFailed(f"{self.ENGINE} run {status}: {c['reason']}")
        times_ms = parsed.step_times_ms
        timed = times_ms[self.warmup:]
        step_ms = statistics.median(timed)
        peak = max(parsed.peak_reserved_bytes) if parsed.peak_reserved_bytes else 0
        details.update(step_times_ms=timed, warmup_s=sum(times_ms[:self.warmup]) / 1e3,
                       startup_s=max(0.0, run["wall_s"] - sum(times_ms) / 1e3), losses=list(parsed.losses),
                       peak_reserved_bytes=[peak], engine_facts=dict(parsed.facts))
        for k, v in parsed.per_step.items():
            details[k] = v
        if sim is not None and sim.feasible:
            details["simulated_error_pct"] = 100.0 * (sim.step_time_ms - step_ms) / step_ms
            if peak:
                details["simulated_memory_error_pct"] = 100.0 * (sim.peak_memory_bytes - peak) / peak
        return make_result(backend=self.backend, model=model, cluster=self.cluster, workload=self.workload, plan=plan,
                           step_time_ms=step_ms, breakdown_ms={}, peak_memory_bytes=peak,
                           memory_per_stage_bytes=(peak,), details=details)

    def close(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


__all__ = ["EngineRunner", "Launch", "ParsedRun", "REFUSAL_EXCEPTIONS", "classify_run", "first_exception",
           "plan_label", "run_job"]
