"""The real evaluator: each plan runs for real on the local GPUs, one subprocess per trial.

Lifecycle: construct (keyword-only; nothing starts), :meth:`RealEvaluator.evaluate` per plan (a
``torchrun`` job through :func:`autotune.runtime.launch.run_plan` with a timeout), :meth:`close`.

Outcomes of ``evaluate``:

* the job ran: a feasible :class:`~autotune.cost.evaluator.StepResult` with the measured median step time,
  MFU by the same formula as the simulator (:mod:`autotune.cost.flops`), peak reserved memory per rank,
  and in ``details`` the simulator's prediction for the same plan with its error in percent;
* CUDA out of memory: ``feasible=False`` with the memory the job reached (so it becomes an
  infeasible trial, never the best);
* the runtime refuses a setting it cannot honor (``PlanError``): raised, so the tuner prunes the trial
  with the reason; checked in this process before anything is launched
  (:func:`autotune.runtime.parallelize.check_runtime_support`: e.g. ``fp8_delayed`` / ``mxfp8``, FP8
  without torchao, ``tp_comm_overlap`` without compile); FP8 (torchao float8) and compile plans run;
* a hang or crash: :class:`TrialFailed` with "timed out after N s in <phase>" or the rank's error; the
  launcher has already killed every process of the job, and the study goes on.

The fabric's interconnect tier is applied to the worker through NCCL's environment, so a study on
the ``h200-host`` or ``h200-sockets`` fabric (written by ``autotune profile``) measures that path:
``host``: ``NCCL_P2P_DISABLE=1``; ``sockets``: also ``NCCL_SHM_DISABLE=1`` and ``NCCL_IB_DISABLE=1``.
"""

from __future__ import annotations

from typing import Any, Mapping

from autotune.cost.evaluator import Evaluator, StepResult
from autotune.errors import AutotuneError, ConfigError, PlanError
from autotune.spec.hardware import NCCL_TIER_ENV, ClusterSpec
from autotune.spec.models import ModelSpec
from autotune.spec.plan import Plan, PlanDocument, Workload, validate_plan

#: NCCL environment per interconnect tier (see the module docstring; one table for the profiler and here).
TIER_ENV = NCCL_TIER_ENV


class TrialFailed(AutotuneError):
    """A real run crashed or hung; the message says where (the trial is recorded as failed)."""


def tier_env(cluster: ClusterSpec) -> dict[str, str]:
    """NCCL variables that make the local GPUs talk over the cluster's intra-node tier."""
    return dict(TIER_ENV.get(cluster.fabric.intra_node.calibration_tier, {}))


def local_gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class RealEvaluator(Evaluator):
    """Runs each plan end to end on this host's GPUs (see the module docstring).

    Args (keyword-only):
        model, cluster, workload: as for every evaluator; ``cluster.num_gpus`` must not exceed the
            GPUs on this host.
        layers: run a depth-truncated proxy with this many layers (true widths), or None for all.
        steps / warmup: timed and untimed optimizer steps per trial.
        timeout_s: wall-clock limit per trial, s.
        device: ``auto`` (CUDA when present), ``cuda`` or ``cpu`` (gloo; for tests).
        predict: also simulate each plan and store the prediction and its error.
        launcher: where each trial runs (:func:`autotune.runtime.launch.run_plan` ``launcher``): None = the
            local GPUs; ``{"kind": "slurm", ...}`` = a Slurm job (then the local GPU count is not checked).

    Raises:
        AutotuneError: (at construction) the plan needs more GPUs than the host has.
    """

    backend = "real"

    def __init__(self, *, model: ModelSpec, cluster: ClusterSpec, workload: Workload, layers: int | None = None,
                 steps: int = 3, warmup: int = 2, timeout_s: float = 900.0, device: str = "auto",
                 predict: bool = True, env: Mapping[str, str] | None = None, engine: str | None = None,
                 launcher: Mapping[str, Any] | None = None) -> None:
        from autotune.spec.engines import REAL_BACKEND_ENGINE

        if engine not in (None, REAL_BACKEND_ENGINE):
            raise ConfigError(f"--backend real runs autotune's own runtime (engine {REAL_BACKEND_ENGINE}); "
                              f"--engine {engine} can only be simulated (--backend simulated or measured)")
        super().__init__(model=model, cluster=cluster, workload=workload, engine=REAL_BACKEND_ENGINE)
        self.layers, self.steps, self.warmup, self.timeout_s = layers, steps, warmup, timeout_s
        self.device = device
        self.env = dict(tier_env(cluster))
        self.env.update(env or {})
        self.predict = predict
        self.launcher = dict(launcher) if launcher else None  # see autotune.runtime.launch.run_plan
        if device != "cpu" and (self.launcher or {}).get("kind", "local") == "local":
            n = local_gpu_count()
            if device == "cuda" or n:
                if cluster.num_gpus > n:
                    raise AutotuneError(
                        f"the real backend runs plans on this host's GPUs: --gpus {cluster.num_gpus} but "
                        f"{n} CUDA GPU(s) are visible; use --gpus {max(n, 1)} or --backend simulated")
            elif device == "auto":
                raise AutotuneError("no CUDA GPU found: real runs need the local NVIDIA GPUs. Without one, "
                                    "`autotune simulate PLAN.yaml` or `--backend simulated` predicts the plan; "
                                    "`autotune validate --device cpu` runs a plan of a small model with gloo on the CPU (it "
                                    "must fit in host memory)")
        self._sim = None

    def _simulated(self, plan: Plan) -> StepResult | None:
        if not self.predict:
            return None
        from autotune.cost.simulator import SimulatedEvaluator

        model = self.model if self.layers is None else _truncated(self.model, self.layers)
        if self._sim is None:
            self._sim = SimulatedEvaluator(model=model, cluster=self.cluster, workload=self.workload,
                                           engine=self.engine)
        try:
            return self._sim.evaluate(plan)
        except PlanError:
            return None

    def evaluate(self, plan: Plan) -> StepResult:
        from autotune.cost.simulator import make_result
        from autotune.runtime.launch import run_plan
        from autotune.runtime.parallelize import check_runtime_support

        model = self.model if self.layers is None else _truncated(self.model, self.layers)
        warnings = validate_plan(plan, model, self.cluster.num_gpus, self.workload,
                                 gpus_per_node=self.cluster.gpus_per_node)
        device_type = "cpu" if self.device == "cpu" else "cuda"
        # PlanError -> pruned. The allocator setting is applied by the launcher in the worker's
        # environment, so it is not checked against this process's environment here.
        check_runtime_support(plan.replace(memory_reclaim="none") if plan.memory_reclaim == "expandable_segments"
                              else plan, device_type=device_type)
        doc = PlanDocument(plan=plan, model=self.model, gpu=self.cluster.gpu.name, num_gpus=self.cluster.num_gpus,
                           fabric=self.cluster.fabric.to_dict(), workload=self.workload)
        res = run_plan(doc, layers=self.layers, steps=self.steps, warmup=self.warmup, timeout_s=self.timeout_s,
                       env=self.env, nproc=self.cluster.num_gpus, device=self.device, launcher=self.launcher)
        status = res.get("status")
        sim = self._simulated(plan)
        details: dict[str, Any] = {"warnings": list(warnings), "nccl_env": dict(self.env),
                                   "layers": self.layers or self.model.num_layers,
                                   "wall_s": res.get("wall_s")}
        if sim is not None:
            details["simulated_step_time_ms"] = sim.step_time_ms if sim.feasible else None
            details["simulated_feasible"] = sim.feasible
            details["simulated_peak_memory_bytes"] = sim.peak_memory_bytes
        if status == "oom":
            reached = int(res.get("memory_reached_bytes") or 0)
            return StepResult(backend=self.backend, feasible=False, step_time_ms=0.0, mfu=0.0, mfu_palm=0.0,
                              hfu=0.0, tokens_per_s_per_gpu=0.0, tflops_per_gpu=0.0, peak_memory_bytes=reached,
                              infeasible_reason=f"out of memory on the GPU (real run): reached "
                                                f"{reached / 2**30:.1f} GiB; {res.get('reason') or ''}".strip(),
                              details=details)
        if status == "failed" and res.get("refused"):
            raise PlanError(res.get("reason") or "the runtime refused the plan")
        if status != "ok":
            raise TrialFailed(res.get("reason") or f"real run ended with status {status!r}")
        for k in ("step_times_ms", "step_time_spread_ms", "peak_allocated_bytes", "peak_reserved_bytes",
                  "losses", "device_name", "date", "torch_version", "cuda_version", "nccl_version",
                  "honored", "dp_mode", "step_time_iqr_ms", "launcher", "slurm_job_id"):
            if k in res:
                details[k] = res[k]
        peaks = [int(x) for x in (res.get("peak_reserved_bytes") or res.get("peak_rss_bytes") or []) if x]
        step_ms = float(res["step_time_ms"])
        if sim is not None and sim.feasible:
            details["simulated_error_pct"] = 100.0 * (sim.step_time_ms - step_ms) / step_ms
        return make_result(backend=self.backend, model=model, cluster=self.cluster, workload=self.workload,
                           plan=plan, step_time_ms=step_ms, breakdown_ms={},
                           peak_memory_bytes=max(peaks, default=0), memory_per_stage_bytes=tuple(peaks),
                           details=details)


def _truncated(model: ModelSpec, layers: int) -> ModelSpec:
    return model.truncated(layers)
