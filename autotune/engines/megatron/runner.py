"""Real trials through Megatron-LM's ``pretrain_gpt.py``: ``--backend real --engine megatron`` (issue 23).

Lifecycle and failure isolation: :class:`autotune.runners.engine_runner.EngineRunner`. What is
Megatron-LM's here:

* **the installation**: Megatron-LM's training scripts are not in any wheel (megatron-core has the
  library, not ``pretrain_gpt.py``), so the runner takes a Megatron-LM checkout from
  :data:`CHECKOUT_ENV` (the folder with ``pretrain_gpt.py`` and ``megatron/``) and puts it first on the
  trainer's ``PYTHONPATH``; its imports (``einops``, ``pybind11`` for the dataset helpers, built with
  g++ at start-up) come with ``pip install -e '.[megatron-runner]' (in the autotune checkout)``;
* **the transformer implementation**: with Transformer Engine importable the plan runs as exported
  (``--transformer-impl transformer_engine``); without it (no binary wheel for torch 2.11 / CUDA 13,
  the GPU hosts here; building it from source was not tried: docs/results/engines/README.md) it runs
  ``--transformer-impl local``: BF16 only (FP8 recipes are Transformer Engine's), no context parallelism
  (Megatron-LM's CP runs inside TE's attention), no TP communication overlap (TE's userbuffers), unfused
  attention that materializes the score matrix, and none of the TE/apex fusions
  (:data:`LOCAL_IMPL_ARGS`). Such plans are refused with that reason (a pruned trial, never a launch);
  each trial's record says which implementation ran (``transformer_impl``) and, for ``local``, that its
  measurement is not fidelity data for the ``megatron`` profile (which describes TE and fused attention);
* **the launch**: :func:`pretrain_args`: the export's architecture and plan flags
  (:mod:`autotune.engines.megatron.export`) with synthetic data (``--mock-data``, ``NullTokenizer``: nothing
  downloaded) for ``warmup + steps`` iterations, logging every iteration with throughput and memory;
* **the log** (:mod:`autotune.engines.megatron.log`): the step time of an iteration is Megatron's
  ``elapsed time per iteration (ms)``; peak memory = the largest ``max reserved`` of its memory
  reports (rank 0); its own TFLOP/s and loss are kept per iteration.
"""

from __future__ import annotations

import os
import re
import shlex
from importlib import util
from pathlib import Path
from typing import Callable

from autotune.cost.evaluator import StepResult
from autotune.errors import AutotuneError, ConfigError
from autotune.runners.engine_runner import EngineRunner, Launch, ParsedRun, no_gpu_note
from autotune.engines.megatron.log import parse_facts, parse_iterations, parse_memory
from autotune.spec.models import ModelSpec
from autotune.spec.plan import Plan, Workload

ENGINE = "megatron"
#: environment variable naming the Megatron-LM checkout (the folder with ``pretrain_gpt.py``)
CHECKOUT_ENV = "AUTOTUNE_MEGATRON_LM"
INSTALL_HINT = (f"pip install -e '.[megatron-runner]' (in the autotune checkout) and set {CHECKOUT_ENV} to a Megatron-LM checkout "
                "(git clone https://github.com/NVIDIA/Megatron-LM; the folder with pretrain_gpt.py)")
#: flags of ``--transformer-impl local`` runs: the fusions that need Transformer Engine or apex kernels
#: off (megatron/training/arguments.py: --no-gradient-accumulation-fusion (the fused wgrad GEMM into
#: main_grad is an apex / TE kernel), --no-masked-softmax-fusion, --no-bias-swiglu-fusion,
#: --no-bias-dropout-fusion, --no-rope-fusion (apex / TE fused RoPE), --no-persist-layer-norm (apex))
LOCAL_IMPL_ARGS = ("--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion", "--no-bias-swiglu-fusion",
                   "--no-bias-dropout-fusion", "--no-rope-fusion", "--no-persist-layer-norm")
LOCAL_IMPL_NOTE = ("Megatron-LM ran with --transformer-impl local (BF16; Transformer Engine is not installed): "
                   "unfused attention and no TE kernels, so this run is not fidelity data for the megatron "
                   "engine profile, which describes Transformer Engine with fused attention")


def checkout() -> Path:
    """The Megatron-LM checkout named by :data:`CHECKOUT_ENV`; raises AutotuneError when unset or wrong."""
    root = os.environ.get(CHECKOUT_ENV)
    if not root:
        raise AutotuneError(f"--engine megatron needs Megatron-LM's training scripts: {INSTALL_HINT}" + no_gpu_note())
    p = Path(root)
    if not (p / "pretrain_gpt.py").is_file() or not (p / "megatron" / "core").is_dir():
        raise AutotuneError(f"{CHECKOUT_ENV}={root}: not a Megatron-LM checkout (no pretrain_gpt.py and "
                            "megatron/core there)")
    return p


def megatron_core_version(root: Path) -> str:
    """``megatron-core X.Y.Z`` from the checkout's ``megatron/core/package_info.py`` (read, not imported)."""
    f = root / "megatron" / "core" / "package_info.py"
    text = f.read_text() if f.is_file() else ""
    parts = [re.search(rf"^{k}\s*=\s*['\"]?(\w+)", text, re.M) for k in ("MAJOR", "MINOR", "PATCH")]
    return "megatron-core " + (".".join(m.group(1) for m in parts) if all(parts) else "unknown")


def check_megatron() -> str:
    """The Megatron-LM checkout's version; raises AutotuneError naming what to install."""
    root = checkout()
    missing = [m for m in ("einops",) if util.find_spec(m) is None]
    if missing:
        raise AutotuneError(f"--engine megatron: {', '.join(missing)} not installed: {INSTALL_HINT}" + no_gpu_note())
    return megatron_core_version(root)


def check_engine() -> str:
    """The check the CLI runs before screening (:func:`check_megatron`)."""
    return check_megatron()


def gpu_name() -> str | None:
    """The first GPU's name from ``nvidia-smi`` (no CUDA context in this process), or None."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    names = out.stdout.strip().splitlines()
    return names[0].strip() if out.returncode == 0 and names else None


def has_transformer_engine() -> bool:
    """Whether Transformer Engine is importable here (the trainer runs with this Python)."""
    return util.find_spec("transformer_engine") is not None


def run_note() -> str | None:
    """What ``autotune run`` says before the trials: the local implementation's note when TE is missing."""
    return None if has_transformer_engine() else LOCAL_IMPL_NOTE


def local_impl_refusal(plan: Plan) -> str | None:
    """Why ``--transformer-impl local`` cannot run ``plan`` (see the module docstring), or None."""
    if plan.precision != "bf16":
        return (f"precision {plan.precision}: Megatron-LM's FP8 recipes run in Transformer Engine, which is not "
                "installed here; the local transformer implementation (--transformer-impl local) runs BF16 only")
    if plan.cp_degree > 1:
        return ("cp_degree > 1: Megatron-LM's context parallelism runs inside Transformer Engine's attention, "
                "which is not installed here (--transformer-impl local has none)")
    if plan.tp_comm_overlap and plan.tp_degree > 1 and plan.async_collectives:
        return ("tp_comm_overlap: Megatron-LM's --tp-comm-overlap is Transformer Engine's userbuffers, which is not "
                "installed here")
    if plan.cpu_offload_layers:
        return (f"cpu_offload_layers={plan.cpu_offload_layers}: Megatron-LM's CPU offloading is Transformer Engine's "
                "(get_cpu_offload_context; the local implementation asserts cpu_offloading is off), which is not "
                "installed here")
    return None


def pretrain_args(plan: Plan, model: ModelSpec, workload: Workload, *, iterations: int, impl: str) -> list[str]:
    """``pretrain_gpt.py`` arguments for ``iterations`` iterations of ``plan`` (``model`` already cut to the
    proxy's depth): :func:`autotune.engines.megatron.export.architecture_args` + ``plan_args``, synthetic data, a
    constant learning rate, logging of every iteration with throughput and memory, and ``impl``
    (``transformer_engine`` or ``local``; local: :data:`LOCAL_IMPL_ARGS`, and without
    ``--cross-entropy-loss-fusion``, whose kernel is compiled with TorchScript by default).

    Raises:
        ConfigError: what the export refuses, or a plan the local implementation cannot run.
    """
    from autotune.engines.megatron.export import architecture_args, plan_args

    if impl == "local" and (why := local_impl_refusal(plan)):
        raise ConfigError(why)
    args = architecture_args(model, workload.seq_len) + plan_args(plan, model, workload)
    if impl == "local":
        args = [a for a in args if a != "--cross-entropy-loss-fusion"] + list(LOCAL_IMPL_ARGS)
    args += ["--transformer-impl", impl, "--mock-data", "--train-iters", str(iterations), "--lr", "1e-4",
             "--min-lr", "1e-5", "--lr-decay-style", "constant", "--weight-decay", "0.1", "--clip-grad", "1.0",
             "--init-method-std", "0.02", "--seed", "1234", "--log-interval", "1", "--log-throughput",
             "--log-memory-interval", "1", "--eval-iters", "0", "--eval-interval", str(iterations + 1),
             "--distributed-timeout-minutes", "5"]
    return args


def run_key(model: ModelSpec, workload: Workload, layers: int | None) -> Callable[[Plan], str]:
    """The run key of a Megatron-LM plan: its arguments and environment (ConfigError if not runnable here)."""
    from autotune.engines.megatron.export import megatron_env

    run_model = model if layers is None else model.truncated(layers)
    impl = "transformer_engine" if has_transformer_engine() else "local"

    def key(plan: Plan) -> str:
        return shlex.join(pretrain_args(plan, run_model, workload, iterations=1, impl=impl)) + repr(
            sorted(megatron_env(plan, "hopper").items()))

    return key


class MegatronEvaluator(EngineRunner):
    """Runs each plan with Megatron-LM's ``pretrain_gpt.py`` on this host's GPUs (arguments:
    :class:`EngineRunner`; ``transformer_impl``: None = ``transformer_engine`` when importable, else
    ``local``)."""

    ENGINE = ENGINE
    STEP_WORD = "iteration"

    def __init__(self, *, transformer_impl: str | None = None, **kw) -> None:
        if transformer_impl not in (None, "local", "transformer_engine"):
            raise ConfigError(f"transformer_impl={transformer_impl!r}: choose local or transformer_engine")
        super().__init__(**kw)
        self.transformer_impl = transformer_impl or ("transformer_engine" if has_transformer_engine() else "local")
        self.checkout = Path(os.environ.get(CHECKOUT_ENV, ".")) if kw.get("command") is not None else checkout()

    def check_engine(self) -> str:
        return check_megatron()

    def build(self, plan: Plan, workdir: Path, total_steps: int) -> Launch:
        from autotune.engines.megatron.export import megatron_env

        args = pretrain_args(plan, self.run_model, self.workload, iterations=total_steps, impl=self.transformer_impl)
        env = dict(megatron_env(plan, self.cluster.gpu.arch))
        cur = {**os.environ, **self.env}.get("PYTHONPATH")
        env["PYTHONPATH"] = str(self.checkout) + (os.pathsep + cur if cur else "")
        script = str(self.checkout / "pretrain_gpt.py")
        text = (f"# Megatron-LM pretrain_gpt.py run written by autotune (autotune.engines.megatron.runner)\n"
                f"# environment: {' '.join(f'{k}={v}' for k, v in sorted(env.items()) if k != 'PYTHONPATH')}\n"
                + shlex.join([script, *args]) + "\n")
        facts = {"transformer_impl": self.transformer_impl, "megatron_checkout": str(self.checkout)}
        if self.transformer_impl == "local":
            facts["fidelity_note"] = LOCAL_IMPL_NOTE
        return Launch(entry=[script, *args], env=env, job_text=text, job_suffix="args", facts=facts)

    def parse(self, text: str, plan: Plan) -> ParsedRun:
        its, mem = parse_iterations(text), parse_memory(text)
        facts = parse_facts(text)
        rank0 = [m for m in mem if m.rank == 0] or mem
        if rank0:
            facts["max_allocated_bytes"] = max(m.max_allocated_bytes for m in rank0)
        return ParsedRun(steps=[r.iteration for r in its], step_times_ms=[r.elapsed_ms for r in its],
                         losses=[r.loss for r in its],
                         peak_reserved_bytes=[max(m.max_reserved_bytes for m in rank0)] if rank0 else [],
                         facts=facts, per_step={"megatron_tflops_per_gpu": [r.tflops_per_gpu for r in its]})

    def result(self, plan, model, c, parsed, run, *, warnings, kept_log, launch) -> StepResult:
        r = super().result(plan, model, c, parsed, run, warnings=warnings, kept_log=kept_log, launch=launch)
        d = r.details
        if d.get("device_name") is None and self.engine_version is not None:
            d["device_name"] = gpu_name()       # Megatron-LM's log does not name the device
        if self.transformer_impl == "local":
            d.setdefault("warnings", []).append(LOCAL_IMPL_NOTE)
        return r


__all__ = ["CHECKOUT_ENV", "ENGINE", "INSTALL_HINT", "LOCAL_IMPL_ARGS", "LOCAL_IMPL_NOTE", "MegatronEvaluator",
           "check_engine", "check_megatron", "gpu_name", "has_transformer_engine", "local_impl_refusal", "pretrain_args",
           "run_key", "run_note"]
