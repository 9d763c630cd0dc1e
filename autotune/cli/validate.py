"""``autotune validate PLAN.yaml``: run a plan for real on the local GPUs and compare with the simulator.

No torch import at module level (the main CLI imports this module to register the command).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from autotune.cli.options import ASCII_FLOAT, ASCII_INT

from autotune.engines.registry import ENGINES


@click.command("validate")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--layers", type=ASCII_INT, default=None, help="Run a depth-truncated proxy with N layers (true widths).")
@click.option("--steps", type=ASCII_INT, default=5, show_default=True, help="Timed optimizer steps.")
@click.option("--warmup", type=ASCII_INT, default=2, show_default=True, help="Untimed warm-up steps.")
@click.option("--timeout", "timeout_s", type=ASCII_FLOAT, default=900.0, show_default=True, help="Wall-clock limit, s.")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
              help="cpu runs with gloo (tests); auto uses the local CUDA GPUs.")
@click.option("--engine", type=click.Choice(list(ENGINES)), default="native", show_default=True,
              help="native: autotune's own runtime; torchtitan: torchtitan's trainer with the plan as its job "
                   "file (needs the torchtitan-runner extra); megatron: Megatron-LM's pretrain_gpt.py with the "
                   "plan's flags (needs the megatron-runner extra and AUTOTUNE_MEGATRON_LM).")
@click.option("--engine-logs", "engine_logs", type=click.Path(file_okay=False), default=None,
              help="--engine torchtitan|megatron: keep the trainer's log and job file in this folder.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None,
              help="Also write the full result (per-rank memory, per-step times, versions) here.")
@click.option("--moe-routing", "moe_routing", type=click.Choice(["balanced", "trained"]), default=None,
              help="--engine torchtitan, MoE models: balanced (the default; torchtitan's "
                   "debug.moe_force_load_balance, the routing the simulator assumes) or the router as trained.")
def validate(plan_file, layers, steps, warmup, timeout_s, device, engine, engine_logs, json_out, moe_routing):
    """Launch PLAN_FILE with torchrun on the local GPUs and print measured step time, MFU and memory
    beside the simulator's prediction for the same plan (with --engine torchtitan or megatron: that
    engine's trainer, predicted with its engine profile)."""
    from autotune.errors import AutotuneError
    from autotune.runtime.evaluator import RealEvaluator, TrialFailed
    from autotune.spec.hardware import ClusterSpec, fabric_from_dict, get_gpu
    from autotune.spec.plan import PlanDocument

    if steps < 1 or warmup < 0:
        raise AutotuneError(f"--steps must be >= 1 and --warmup >= 0, got {steps} and {warmup}")
    import math
    if not timeout_s > 0:       # also NaN
        raise AutotuneError(f"--timeout must be > 0 s, got {timeout_s:g}")
    if math.isinf(timeout_s):
        raise AutotuneError(f"--timeout must be a finite number of seconds > 0, got {timeout_s:g}")
    if json_out:
        _check_output_path(json_out)     # before the run, not after it (its result would be lost)
    doc = PlanDocument.load(plan_file)
    cluster = ClusterSpec(gpu=get_gpu(doc.gpu), num_gpus=doc.num_gpus,
                          fabric=fabric_from_dict(doc.fabric, where=f"{plan_file}: cluster.fabric"))
    # the plan's own errors first (before any question about the machine it would run on)
    from autotune.spec.plan import validate_plan

    validate_plan(doc.plan, doc.model, doc.num_gpus, doc.workload, gpu=cluster.gpu)
    if device == "cpu":
        _check_host_memory(doc, cluster, layers)
    if engine != "native":
        if device == "cpu":
            raise AutotuneError(f"--engine {engine} runs on CUDA GPUs only; --device cpu is for the native runtime")
        from autotune.cost.evaluator import make_evaluator

        routing = {}
        if engine == "torchtitan" and doc.model.is_moe:
            routing = {"force_load_balance": moe_routing != "trained"}
            click.echo("MoE routing: " + ("balanced (torchtitan's debug.moe_force_load_balance)" if moe_routing != "trained"
                                          else "the router as trained; the simulator assumes balanced experts"))
        elif moe_routing is not None:
            raise AutotuneError(f"--moe-routing {moe_routing} applies to --engine torchtitan with an MoE model only")
        ev = make_evaluator("real", model=doc.model, cluster=cluster, workload=doc.workload, engine=engine,
                            layers=layers, steps=steps, warmup=max(warmup, 1), timeout_s=timeout_s, log_dir=engine_logs,
                            **routing)
    else:
        if engine_logs is not None:
            raise AutotuneError("--engine-logs applies to --engine torchtitan or megatron only")
        ev = RealEvaluator(model=doc.model, cluster=cluster, workload=doc.workload, layers=layers, steps=steps,
                           warmup=warmup, timeout_s=timeout_s, device=device)
    name = doc.model.name + (f" (proxy: {layers} of {doc.model.num_layers} layers)" if layers else "")
    click.echo(f"validating {plan_file} with engine {engine}: {name} on {doc.num_gpus} x {doc.gpu}, seq {doc.workload.seq_len}, "
               f"global batch {doc.workload.global_batch_size}; {warmup} warm-up + {steps} timed steps")
    try:
        r = ev.evaluate(doc.plan)
    except TrialFailed as e:
        raise AutotuneError(f"the run failed: {_one_line(str(e))}") from None
    finally:
        ev.close()
    d = dict(r.details)
    if json_out:
        from autotune.files import write_output_text
        write_output_text(json_out, json.dumps(r.to_dict(), indent=1, default=str), what="--json")
    if not r.feasible:
        raise AutotuneError(f"{r.infeasible_reason} (simulator predicted "
                            f"{(d.get('simulated_peak_memory_bytes') or 0) / 2**30:.1f} GiB peak)")
    gib = 2**30
    on_cpu = device == "cpu" or str(d.get("device_name", "")).lower().startswith("cpu")
    steps_ms = d.get("step_times_ms") or []
    rows = [
        ("step time (median)", f"{r.step_time_ms:,.1f} ms" + (f"  (spread {max(steps_ms) - min(steps_ms):,.1f} ms "
                                                              f"over {len(steps_ms)} steps)" if steps_ms else "")),
        ("tokens/s per GPU", f"{r.tokens_per_s_per_gpu:,.0f}"),
        ("MFU", f"{r.mfu:.1%} (causal; PaLM convention {r.mfu_palm:.1%}), {r.tflops_per_gpu:.0f} TFLOP/s per GPU"
     if not on_cpu else f"not reported: a CPU run ({r.tflops_per_gpu:.3f} TFLOP/s per rank), MFU is against "
                        f"the {doc.gpu}'s peak"),
        ("peak allocated / GPU", ", ".join(f"{(x or 0) / gib:.1f}" for x in d.get("peak_allocated_bytes") or []) + " GiB"),
        ("peak reserved / GPU", ", ".join(f"{(x or 0) / gib:.1f}" for x in d.get("peak_reserved_bytes") or []) + " GiB"),
    ]
    rows = [(k, v) for k, v in rows if v != " GiB"]     # engine runs report reserved memory only
    sim_ms = d.get("simulated_step_time_ms")
    if on_cpu:
        rows.append(("simulated step time", f"{sim_ms or 0:,.1f} ms on {doc.num_gpus} x {doc.gpu}: not compared "
                                            "with a CPU run"))
    elif sim_ms:
        rows.append(("simulated step time", f"{sim_ms:,.1f} ms (error {d['simulated_error_pct']:+.1f}% vs measured)"))
    elif d.get("simulated_feasible") is False:
        rows.append(("simulated", "the memory model says this plan does not fit"))
    rows.append(("simulated peak memory", f"{(d.get('simulated_peak_memory_bytes') or 0) / gib:.1f} GiB"
                 + (f" (error {d['simulated_memory_error_pct']:+.1f}% vs measured reserved)"
                    if d.get("simulated_memory_error_pct") is not None else "")))
    if engine != "native":
        rows.append(("warm-up / start-up", f"{d.get('warmup_s', 0):.1f} s for {max(warmup, 1)} warm-up steps "
                                           f"(compilation included), {d.get('startup_s', 0):.1f} s before step 1"))
    if d.get("transformer_impl"):
        rows.append(("transformer impl", d["transformer_impl"]))
    for k, v in rows:
        click.echo(f"  {k:24s} {v}")
    if engine != "native":
        click.echo(f"  measured on {d.get('device_name') or '?'}, {engine} {d.get('engine_version') or '?'}, "
                   f"{d.get('date', '?')}")
        if d.get("fidelity_note"):
            click.echo(f"  note: {d['fidelity_note']}")
        return
    click.echo(f"  measured on {d.get('device_name', '?')}, torch {d.get('torch_version', '?')}, CUDA "
               f"{d.get('cuda_version', '-')}, NCCL {d.get('nccl_version', '-')}, {d.get('date', '?')}")


def _check_output_path(path: str) -> None:
    """Refuse a ``--json`` path that cannot be written: its directory missing, not a directory or not
    writable, or the path itself a directory (nothing is created).

    Raises:
        AutotuneError: names the path and what is wrong.
    """
    import os

    from autotune.errors import AutotuneError

    from autotune.files import check_output_path

    p = Path(path)
    d = p.parent
    if p.is_dir():
        raise AutotuneError(f"--json {path}: is a directory; give a file path, e.g. {p / 'validate.json'}")
    if not d.exists():
        raise AutotuneError(f"--json {path}: directory {d} does not exist; create it or give another path")
    if not d.is_dir():
        raise AutotuneError(f"--json {path}: {d} is not a directory")
    if not os.access(d, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise AutotuneError(f"--json {path}: {p if p.exists() else d} is not writable")
    check_output_path(p, what="--json")      # never through a symbolic link


def _one_line(text: str) -> str:
    """The first non-empty line of a failed run's reason, plus its last line when they differ (torchrun
    prints a multi-line report; the user gets one line)."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    if not lines:
        return "no reason given"
    return lines[0] if len(lines) == 1 or lines[-1] == lines[0] else f"{lines[0]} ... {lines[-1]}"


def _check_host_memory(doc, cluster, layers: int | None, *, available_bytes: int | None = None) -> None:
    """Refuse a ``--device cpu`` run whose ranks would not fit in this host's available memory.

    The memory model's per-GPU peak (:func:`autotune.cost.memory.estimate_memory`, for the ``--layers``
    proxy when given) times the rank count is a lower bound of what the gloo ranks allocate (the CPU run
    keeps the same tensors). Available memory: ``available_bytes``, else ``MemAvailable`` of
    /proc/meminfo (Linux); nothing is checked where it cannot be read.

    Raises:
        AutotuneError: needed > available, naming both in GiB and what would fit.
    """
    from autotune.cost.memory import estimate_memory
    from autotune.errors import AutotuneError

    avail = available_bytes
    if avail is None:
        try:
            with open("/proc/meminfo") as f:
                avail = next(int(x.split()[1]) * 1024 for x in f if x.startswith("MemAvailable:"))
        except (OSError, StopIteration, ValueError, IndexError):
            return
    model = doc.model if layers is None else doc.model.truncated(layers)
    try:
        mem = estimate_memory(model, doc.plan, cluster.gpu, doc.workload)
    except Exception:  # noqa: BLE001 - the run itself reports a plan the memory model cannot take
        return
    need = mem.peak_bytes * doc.num_gpus
    if need > avail:
        gib = 2**30
        raise AutotuneError(
            f"--device cpu: {doc.num_gpus} ranks of this plan need at least {need / gib:.1f} GiB of host memory "
            f"({mem.peak_bytes / gib:.1f} GiB each, the memory model's peak"
            + (f" for the {layers}-layer proxy" if layers else "")
            + f"), this host has {avail / gib:.1f} GiB available; use a smaller model or a shorter seq_len "
            "in the plan" + ("" if layers else ", or --layers 1"))
