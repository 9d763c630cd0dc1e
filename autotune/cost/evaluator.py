"""Evaluators: what turns a :class:`~autotune.spec.plan.Plan` into a step time, MFU and memory.

Lifecycle (the same for every implementation):

1. construct with keyword arguments ``model``, ``cluster`` and ``workload`` (and backend options);
   the evaluator may load calibration data or open a database here;
2. call :meth:`Evaluator.evaluate` once per candidate plan; it returns a :class:`StepResult` and never
   raises for a plan that merely does not fit in memory (``feasible=False`` with the reason) and raises
   :class:`~autotune.errors.PlanError` for an invalid plan;
3. call :meth:`Evaluator.close` (or use it as a context manager) to release GPUs, processes or files.

Implementations: ``simulated`` (:class:`autotune.cost.simulator.SimulatedEvaluator`, op costs from the
shipped calibration, no GPU), ``measured`` (op costs timed on the local GPU and cached), ``real``
(the plan runs end to end on the local GPUs).
"""

from __future__ import annotations

import abc
import importlib
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

from autotune.engines.registry import engine_runners
from autotune.errors import AutotuneError, ConfigError
from autotune.spec.engines import EngineProfile, check_model_for_engine, get_engine
from autotune.spec.hardware import ClusterSpec
from autotune.spec.models import ModelSpec
from autotune.spec.plan import Plan, Workload

#: Keys of :attr:`StepResult.breakdown_ms`, in report order. ``expert_compute`` (routed experts' GEMMs and
#: activation), ``router_permute`` (router, token permutation) and ``exposed_ep_comm`` (token dispatch and
#: combine) are 0 for a dense model (autotune/cost/moe.py); :data:`MOE_BREAKDOWN_KEYS`.
BREAKDOWN_KEYS = ("compute", "expert_compute", "router_permute", "recompute", "exposed_tp_comm", "exposed_cp_comm",
                  "exposed_ep_comm", "exposed_pp_comm", "exposed_dp_comm", "exposed_offload", "bubble", "optimizer",
                  "reclaim")
#: the breakdown keys only a mixture-of-experts model has
MOE_BREAKDOWN_KEYS = ("expert_compute", "router_permute", "exposed_ep_comm")
#: groups of breakdown keys that reports show only when one of them is non-zero (an MoE model's; CPU activation
#: offloading's, ``exposed_offload``, 0 for a plan without ``cpu_offload_layers``)
OPTIONAL_BREAKDOWN_GROUPS = (MOE_BREAKDOWN_KEYS, ("exposed_offload",))


@dataclass(frozen=True)
class StepResult:
    """What an evaluator found for one plan.

    Attributes:
        backend: ``simulated``, ``measured`` or ``real``.
        feasible: False when the plan does not fit in GPU memory (then times may be 0).
        infeasible_reason: why not, naming the stage and GiB, or None.
        step_time_ms: one optimizer step, ms.
        mfu: model FLOPs utilization, causal convention, in [0, 1].
        mfu_palm: the same with the PaLM (non-causal) attention FLOPs.
        hfu: hardware FLOPs utilization (recomputation counted), causal convention.
        tokens_per_s_per_gpu: global batch tokens / step time / GPUs.
        tflops_per_gpu: achieved model TFLOP/s per GPU (causal).
        peak_memory_bytes: the highest per-GPU memory over pipeline stages, bytes.
        memory_per_stage_bytes: per pipeline stage, bytes.
        breakdown_ms: step time attributed to :data:`BREAKDOWN_KEYS` (critical path of the busiest
            stage: compute + recompute + exposed communication + bubble + optimizer + reclaim ~ step).
        details: evaluator-specific provenance (calibration label, measured/interpolated op counts).
        step_time_exposed_ms: the simulated step with every overlapped collective exposed, ms: an upper
            bound that the overlap model cannot make optimistic (0 = not computed: real runs, old trials).
    """

    backend: str
    feasible: bool
    step_time_ms: float
    mfu: float
    mfu_palm: float
    hfu: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    peak_memory_bytes: int
    memory_per_stage_bytes: tuple[int, ...] = ()
    breakdown_ms: Mapping[str, float] = field(default_factory=dict)
    infeasible_reason: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    step_time_exposed_ms: float = 0.0

    @property
    def mfu_exposed(self) -> float:
        """The MFU at :attr:`step_time_exposed_ms` (the pessimistic end of the range), or :attr:`mfu`."""
        if self.step_time_exposed_ms > 0 and self.step_time_ms > 0:
            return self.mfu * self.step_time_ms / self.step_time_exposed_ms
        return self.mfu

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["memory_per_stage_bytes"] = list(self.memory_per_stage_bytes)
        d["breakdown_ms"] = dict(self.breakdown_ms)
        d["details"] = dict(self.details)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StepResult":
        kw = dict(d)
        kw["memory_per_stage_bytes"] = tuple(kw.get("memory_per_stage_bytes", ()))
        return cls(**kw)


class Evaluator(abc.ABC):
    """Base class of the simulated, measured and real evaluators (see the module docstring).

    Args (keyword-only):
        model: the model to train.
        cluster: the GPUs and fabric the plan runs on.
        workload: sequence length and global batch.
        engine: the training engine that runs the plan (:func:`autotune.spec.engines.get_engine` name or
            profile; None = :data:`autotune.spec.engines.DEFAULT_ENGINE`). Raises ConfigError if unknown.
    """

    backend: str = "abstract"

    def __init__(self, *, model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                 engine: EngineProfile | str | None = None) -> None:
        self.model = model
        self.cluster = cluster
        self.workload = workload
        self.engine = get_engine(engine)
        # a mixture of experts on an engine with no expert parallelism (the native runtime): one line
        check_model_for_engine(model, self.engine)

    @abc.abstractmethod
    def evaluate(self, plan: Plan) -> StepResult:
        """Evaluate one plan.

        Raises:
            PlanError: the plan is invalid for this model, cluster or workload.
        """

    def close(self) -> None:
        """Release resources (GPUs, subprocesses, files). Idempotent."""

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------ backends (moved from tune/tuner.py)
#: backend name -> (module, class) imported lazily, or a factory ``f(*, model, cluster, workload, **opts)``.
BACKENDS: dict[str, tuple[str, str] | Callable[..., Evaluator]] = {
    "simulated": ("autotune.cost.simulator", "SimulatedEvaluator"),
    "measured": ("autotune.profiling.measured", "MeasuredEvaluator"),
    "real": ("autotune.runtime.evaluator", "RealEvaluator"),
}
#: real-backend runners of engines other than the native runtime: engine name -> (module, class)
#: (autotune.engines.registry, each engine's ``runner`` part)
ENGINE_RUNNERS: dict[str, tuple[str, str]] = engine_runners()


# ------------------------------------------------------------------ evaluators
def make_evaluator(backend: str, *, model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                   **opts: Any) -> Evaluator:
    """Build the evaluator for ``backend`` (``simulated``, ``measured`` or ``real``); ``real`` with
    ``engine`` in :data:`ENGINE_RUNNERS` builds that engine's runner.

    The implementation module is imported only here, so the CLI starts without torch.

    Raises:
        ConfigError: unknown backend (lists the known ones).
        AutotuneError: the backend's module is not installed in this checkout (names the module).
    """
    entry = BACKENDS.get(backend)
    if backend == "real" and opts.get("engine") in ENGINE_RUNNERS:
        entry = ENGINE_RUNNERS[opts["engine"]]   # --engine torchtitan: its own trainer, not the native runtime
    if entry is None:
        raise ConfigError(f"unknown backend {backend!r}; known backends: {', '.join(BACKENDS)}")
    if callable(entry):
        return entry(model=model, cluster=cluster, workload=workload, **opts)
    mod_name, cls_name = entry
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise AutotuneError(f"backend {backend!r} is not available: cannot import {mod_name} ({e})") from None
    cls = getattr(mod, cls_name, None)
    if cls is None:
        raise AutotuneError(f"backend {backend!r} is not available: {mod_name} has no {cls_name}")
    return cls(model=model, cluster=cluster, workload=workload, **opts)


