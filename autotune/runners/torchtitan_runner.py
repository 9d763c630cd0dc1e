"""Real trials through torchtitan's own trainer: ``--backend real --engine torchtitan`` (issue 23).

Lifecycle: construct (keyword-only; checks that torchtitan 0.2.x is importable and the GPUs are there;
nothing starts), :meth:`TorchtitanEvaluator.evaluate` per plan, :meth:`close` (removes the temp folder).

One trial (:meth:`TorchtitanEvaluator.evaluate`):

1. the plan is checked in this process: :func:`autotune.target.plan.validate_plan`,
   :func:`autotune.target.engines.check_plan_for_engine` and the job writer
   (:func:`autotune.runners.torchtitan_job.job_toml`); a refusal raises ``PlanError`` (pruned trial);
2. the job file, and once per evaluator the synthetic tokenizer and dataset
   (:func:`autotune.runners.assets.write_assets`; nothing is downloaded), go into a temp folder;
3. ``python -m torch.distributed.run --standalone --nproc-per-node N -m torchtitan.train --job.config_file
   F`` runs ``warmup + steps`` training steps in its own session (:func:`run_job`), stdout and stderr
   into one log, with a wall-clock limit; on timeout, Ctrl-C or SIGTERM its whole process group and
   every descendant are killed (:func:`autotune.runtime.launch.run_in_session`, as for native trials);
4. the log is classified (:func:`classify`) and parsed (:mod:`autotune.runners.torchtitan_log`):
   ``ok``: a feasible :class:`~autotune.cost.evaluator.StepResult` whose step time is the median over
   the steps after ``warmup`` (from torchtitan's per-step ``tps``), MFU by autotune's formula
   (:func:`autotune.cost.simulator.make_result`: causal attention FLOPs, the GPU's dense BF16 peak from
   ``data/gpus.yaml``), peak memory = torchtitan's peak *reserved* bytes (rank 0); the warm-up steps'
   time (``warmup_s``, torch.compile's compilation included) and the start-up before step 1
   (``startup_s``) are reported apart in ``details``, beside the simulator's prediction of the same
   plan; ``oom``: ``feasible=False`` with the memory reached; ``refused`` (torchtitan raised
   ValueError / NotImplementedError / AssertionError before its first step): ``PlanError`` with the
   engine's message; ``timeout`` / ``failed``: :class:`autotune.runtime.evaluator.TrialFailed` with
   the reason (the study goes on);
5. the trial's folder is removed; with ``log_dir`` its log and job file are kept there first.

torchtitan version: the job files are torchtitan 0.2.x TOML (:mod:`autotune.runners.torchtitan_job`
says why: 0.3.0 does not import under torch 2.11). A missing torchtitan is one error naming
``pip install 'autotune[torchtitan-runner]'``.
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
from pathlib import Path
from typing import Any, Mapping, Sequence

from autotune.cost.evaluator import Evaluator, StepResult
from autotune.errors import AutotuneError, ConfigError, PlanError
from autotune.runners.torchtitan_job import TORCHTITAN_VERSION, job_toml
from autotune.runners.torchtitan_log import parse_facts, parse_steps
from autotune.runtime.evaluator import TrialFailed, local_gpu_count, tier_env
from autotune.runtime.launch import FIXED_ENV, run_in_session
from autotune.target.engines import check_plan_for_engine, resolve_engine
from autotune.target.hardware import ClusterSpec
from autotune.target.models import ModelSpec
from autotune.target.plan import Plan, Workload, validate_plan

ENGINE = "torchtitan"
INSTALL_HINT = "pip install 'autotune[torchtitan-runner]'"
#: exceptions torchtitan raises for a configuration it does not run (config/manager.py, train.py,
#: parallelize.py checks are ``ValueError`` / ``NotImplementedError`` / ``assert``); raised before the
#: first logged step they make the trial a refusal (``PlanError``), anything else a failure
REFUSAL_EXCEPTIONS = ("ValueError", "NotImplementedError", "AssertionError")
_EXC = re.compile(r"^(?:\[rank\d+\]:)?\s*(?:[A-Za-z_][\w.]*\.)?(?P<name>[A-Za-z_]\w*(?:Error|Exception))"
                  r"(?::\s*(?P<msg>.*))?$")
_OOM_IN_USE = re.compile(r"this process has ([\d.]+) GiB memory in use")
_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError")


def check_torchtitan() -> str:
    """The installed torchtitan version; raises AutotuneError when it is missing or not a 0.2.x release."""
    from importlib import metadata, util

    if util.find_spec("torchtitan") is None:
        raise AutotuneError(f"--engine torchtitan needs torchtitan, which is not installed: {INSTALL_HINT}")
    try:
        v = metadata.version("torchtitan")
    except metadata.PackageNotFoundError:
        v = "unknown"
    if not v.startswith("0.2."):
        raise AutotuneError(f"torchtitan {v} is installed; the torchtitan runner writes 0.2.x job files (the "
                            f"releases that run on torch 2.11): pip install 'torchtitan=={TORCHTITAN_VERSION}'")
    return v


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


def _first_exception(text: str) -> tuple[str, str] | None:
    """(name, message) of the first ``XError: message`` line after a ``Traceback`` in ``text``."""
    seen_tb = False
    for line in text.splitlines():
        if "Traceback (most recent call last)" in line:
            seen_tb = True
            continue
        if seen_tb and (m := _EXC.match(line.strip())):
            return m.group("name"), (m.group("msg") or "").strip()
    return None


def classify(text: str, *, returncode: int | None, timed_out: bool, timeout_s: float, total_steps: int) -> dict:
    """What a torchtitan run's log says happened.

    Returns ``{"status": ok | oom | timeout | refused | failed, "reason": str | None, "records": [...],
    "facts": {...}}`` plus ``memory_reached_gib`` for ``oom``. ``ok``: every one of ``total_steps`` steps
    logged (a non-zero exit after that, e.g. in the process group's teardown, is noted in ``reason``);
    ``oom``: CUDA's out-of-memory error in the log (memory reached: "this process has X GiB memory in use"
    of the error, else the highest logged peak); ``timeout``: killed after ``timeout_s``; ``refused``: one
    of :data:`REFUSAL_EXCEPTIONS` before any step; ``failed``: anything else.
    """
    records, facts = parse_steps(text), parse_facts(text)
    out: dict[str, Any] = {"records": records, "facts": facts, "reason": None}
    done = len({r.step for r in records}) >= total_steps
    if _OOM.search(text):
        m = _OOM_IN_USE.findall(text)
        reached = max([float(x) for x in m] + [r.memory_gib for r in records] + [0.0])
        exc = _first_exception(text)
        out.update(status="oom", memory_reached_gib=reached,
                   reason=f"CUDA out of memory after {len(records)} logged steps"
                          + (f": {exc[1][:200]}" if exc else ""))
    elif timed_out:
        out.update(status="timeout", reason=f"timed out after {timeout_s:g} s with {len(records)} of {total_steps} "
                                            "steps logged" + ("" if records else " (start-up or compilation)"))
    elif done:
        out.update(status="ok", reason=None if returncode == 0 else f"exit code {returncode} after the last step")
    else:
        exc = _first_exception(text)
        if exc and not records and exc[0] in REFUSAL_EXCEPTIONS:
            out.update(status="refused", reason=f"torchtitan refused the plan: {exc[0]}: {exc[1]}")
        elif exc:
            out.update(status="failed", reason=f"{exc[0]}: {exc[1]} (after {len(records)} of {total_steps} steps)")
        else:
            tail = " | ".join(x.strip() for x in text.strip().splitlines()[-3:])
            out.update(status="failed", reason=f"exit code {returncode} after {len(records)} of {total_steps} "
                                                f"steps; last lines: {tail[:400]}")
    return out


def _plan_label(plan: Plan) -> str:
    return (f"tp{plan.tp_degree}pp{plan.pp_degree}dp{plan.dp_degree}cp{plan.cp_degree}-mb{plan.micro_batch_size}-"
            f"{plan.precision}-{'compile' if plan.compile else 'eager'}-rc{plan.recompute}")


class TorchtitanEvaluator(Evaluator):
    """Runs each plan with torchtitan's trainer on this host's GPUs (see the module docstring).

    Args (keyword-only):
        model, cluster, workload: as for every evaluator.
        layers: run the depth-truncated flavour ``<flavour>_L<layers>`` (true widths); None = all layers.
        steps: timed training steps (after ``warmup``); warmup: untimed steps (compilation, allocator
            growth), at least 1.
        timeout_s: wall-clock limit per trial, s (start-up and compilation included).
        predict: also simulate each plan (engine profile ``torchtitan``) and store prediction and error.
        env: extra environment for the trainer.
        engine: must be ``torchtitan`` (or None).
        launcher: None / ``{"kind": "local"}`` only (Slurm is not wired for engine runs yet).
        only_plans: when given, plans not in it are refused (``PlanError``: "screened out"); the
            simulator's screen (:mod:`autotune.screen`) passes the plans it kept.
        log_dir: keep every trial's log and job file here (``trial<N>-<plan>.log`` / ``.toml``).
        command: the launcher argv prefix instead of ``python -m torch.distributed.run`` (tests pass a
            fake torchrun); torchtitan and the GPU count are then not checked.
        device: ``auto`` or ``cuda`` (torchtitan's trainer needs CUDA for the models here).

    Raises:
        AutotuneError: torchtitan missing (names the extra) or not 0.2.x; more GPUs asked than visible.
        ConfigError: another engine, a non-local launcher, steps / warmup / timeout out of range.
    """

    backend = "real"

    def __init__(self, *, model: ModelSpec, cluster: ClusterSpec, workload: Workload, layers: int | None = None,
                 steps: int = 3, warmup: int = 3, timeout_s: float = 900.0, predict: bool = True,
                 env: Mapping[str, str] | None = None, engine: str | None = None,
                 launcher: Mapping[str, Any] | None = None, only_plans: Sequence[Plan] | None = None,
                 log_dir: str | Path | None = None, command: Sequence[str] | None = None,
                 device: str = "auto") -> None:
        if engine not in (None, ENGINE):
            raise ConfigError(f"TorchtitanEvaluator runs engine {ENGINE}, not {engine}")
        if (launcher or {}).get("kind", "local") != "local":
            raise ConfigError("--engine torchtitan runs trials with torchrun on this host; --launcher slurm is "
                              "wired for the native runtime only (autotune/launchers/slurm.py)")
        if steps < 1 or warmup < 1 or not timeout_s > 0:
            raise ConfigError(f"torchtitan trials need steps >= 1, warmup >= 1 and timeout_s > 0; got steps={steps}, "
                              f"warmup={warmup}, timeout_s={timeout_s}")
        if device == "cpu":
            raise ConfigError("--device cpu: torchtitan's trainer runs these models on CUDA GPUs only")
        super().__init__(model=model, cluster=cluster, workload=workload, engine=resolve_engine(ENGINE, "real"))
        self.layers, self.steps, self.warmup, self.timeout_s = layers, steps, warmup, timeout_s
        self.predict = predict
        self.env = {**tier_env(cluster), **(env or {})}
        self.only_plans = None if only_plans is None else frozenset(only_plans)
        self.log_dir = Path(log_dir) if log_dir else None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        if command is None:
            self.torchtitan_version = check_torchtitan()
            n = local_gpu_count()
            if cluster.num_gpus > n:
                raise AutotuneError(f"--engine torchtitan runs plans on this host's GPUs: --gpus {cluster.num_gpus} "
                                    f"but {n} CUDA GPU(s) are visible")
            self.command = [sys.executable, "-m", "torch.distributed.run"]
        else:
            self.torchtitan_version = None
            self.command = list(command)
        self._tmp: Path | None = None
        self._assets: tuple[Path, Path] | None = None
        self._sim = None
        self._n = 0

    # ---- helpers
    @property
    def run_model(self) -> ModelSpec:
        return self.model if self.layers is None else self.model.truncated(self.layers)

    def _tmpdir(self) -> Path:
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="autotune-torchtitan-"))
        return self._tmp

    def assets(self) -> tuple[Path, Path]:
        """(tokenizer folder, dataset folder), written once into this evaluator's temp folder."""
        if self._assets is None:
            from autotune.runners.assets import write_assets

            self._assets = write_assets(self._tmpdir() / "assets")
        return self._assets

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

    def trainer_env(self, plan: Plan) -> dict[str, str]:
        """The trainer's environment: this process's, ``env``, the multicast-off settings of
        :data:`autotune.runtime.launch.FIXED_ENV`, the plan's allocator setting, offline Hugging Face
        libraries, and this checkout first on ``PYTHONPATH`` (for ``experimental.custom_import``)."""
        from autotune.runners.torchtitan_job import train_env

        e = dict(os.environ)
        e.update(self.env)
        e.update(FIXED_ENV)
        e.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        e.update(train_env(plan))
        e.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
        root = str(Path(__file__).resolve().parents[2])
        e["PYTHONPATH"] = root + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
        return e

    # ---- the trial
    def evaluate(self, plan: Plan) -> StepResult:
        model = self.run_model
        warnings = validate_plan(plan, model, self.cluster.num_gpus, self.workload,
                                 gpus_per_node=self.cluster.gpus_per_node)
        check_plan_for_engine(plan, self.engine)
        if self.only_plans is not None and plan not in self.only_plans:
            raise PlanError("screened out by the simulator: not among the plans kept for real torchtitan runs")
        total = self.warmup + self.steps
        wd = Path(tempfile.mkdtemp(prefix="trial-", dir=self._tmpdir()))
        try:
            tok, data = self.assets()
            try:
                text = job_toml(plan, self.model, self.workload, steps=total, layers=self.layers,
                                hf_assets_path=str(tok), dataset_path=str(data), dump_folder=str(wd / "outputs"),
                                warmup_steps=max(1, min(2, total - 1)))
            except ConfigError as e:
                raise PlanError(f"torchtitan job: {e}") from None
            job, log = wd / "job.toml", wd / "train.log"
            job.write_text(text)
            argv = [*self.command, "--standalone", f"--nproc-per-node={self.cluster.num_gpus}", "-m",
                    "torchtitan.train", "--job.config_file", str(job)]
            run = run_job(argv, env=self.trainer_env(plan), timeout_s=self.timeout_s, cwd=wd, log_path=log)
            log_text = log.read_text(errors="replace")
            self._n += 1
            kept = None
            if self.log_dir is not None:
                stem = f"trial{self._n:02d}-{_plan_label(plan)}"
                shutil.copyfile(log, self.log_dir / f"{stem}.log")
                shutil.copyfile(job, self.log_dir / f"{stem}.toml")
                kept = str(self.log_dir / f"{stem}.log")
        finally:
            shutil.rmtree(wd, ignore_errors=True)
        c = classify(log_text, returncode=run["returncode"], timed_out=run["timed_out"], timeout_s=self.timeout_s,
                     total_steps=total)
        return self._result(plan, model, c, run, warnings=warnings, kept_log=kept, job=text)

    def _result(self, plan: Plan, model: ModelSpec, c: dict, run: dict, *, warnings: list[str],
                kept_log: str | None, job: str) -> StepResult:
        from autotune.cost.simulator import make_result

        sim = self.simulate(plan)
        facts = c["facts"]
        details: dict[str, Any] = {"engine": ENGINE, "warnings": list(warnings), "wall_s": run["wall_s"],
                                   "returncode": run["returncode"], "layers": self.layers or self.model.num_layers,
                                   "torchtitan_version": facts.get("torchtitan_version", self.torchtitan_version),
                                   "device_name": facts.get("device"), "log": kept_log, "job_toml": job,
                                   "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
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
                              infeasible_reason=f"out of memory on the GPU (torchtitan run): reached "
                                                f"{reached / 2**30:.1f} GiB; {c['reason']}", details=details)
        if status == "refused":
            raise PlanError(c["reason"])
        if status != "ok":
            raise TrialFailed(f"torchtitan run {status}: {c['reason']}")
        # tokens one rank consumes per step, and torchtitan's tps divisor (train.py: non-data-parallel size)
        tokens = plan.micro_batch_size * plan.num_micro_batches * self.workload.seq_len
        non_dp = plan.tp_degree * plan.pp_degree * plan.cp_degree
        recs = c["records"]
        times_ms = [1e3 * r.step_time_s(tokens, non_dp) for r in recs]
        timed = times_ms[self.warmup:]
        step_ms = statistics.median(timed)
        peak = int(max(r.memory_gib for r in recs) * 2**30)
        details.update(step_times_ms=timed, warmup_s=sum(times_ms[:self.warmup]) / 1e3,
                       startup_s=max(0.0, run["wall_s"] - sum(times_ms) / 1e3),
                       losses=[r.loss for r in recs], peak_reserved_bytes=[peak],
                       torchtitan_mfu_pct=statistics.median(r.mfu_pct for r in recs[self.warmup:])
                       if all(r.mfu_pct is not None for r in recs[self.warmup:]) else None,
                       torchtitan_facts={k: v for k, v in facts.items() if k != "device"})
        if sim is not None and sim.feasible:
            details["simulated_error_pct"] = 100.0 * (sim.step_time_ms - step_ms) / step_ms
            details["simulated_memory_error_pct"] = 100.0 * (sim.peak_memory_bytes - peak) / peak
        return make_result(backend=self.backend, model=model, cluster=self.cluster, workload=self.workload, plan=plan,
                           step_time_ms=step_ms, breakdown_ms={}, peak_memory_bytes=peak,
                           memory_per_stage_bytes=(peak,), details=details)

    def close(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp, self._assets = None, None


__all__ = ["ENGINE", "INSTALL_HINT", "REFUSAL_EXCEPTIONS", "TorchtitanEvaluator", "check_torchtitan", "classify",
           "run_job"]
