"""``autotune validate PLAN.yaml``: run a plan for real on the local GPUs and compare with the simulator.

No torch import at module level (the main CLI imports this module to register the command).
"""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("validate")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--layers", type=int, default=None, help="Run a depth-truncated proxy with N layers (true widths).")
@click.option("--steps", type=int, default=5, show_default=True, help="Timed optimizer steps.")
@click.option("--warmup", type=int, default=2, show_default=True, help="Untimed warm-up steps.")
@click.option("--timeout", "timeout_s", type=float, default=900.0, show_default=True, help="Wall-clock limit, s.")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
              help="cpu runs with gloo (tests); auto uses the local CUDA GPUs.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None,
              help="Also write the full result (per-rank memory, per-step times, versions) here.")
def validate(plan_file, layers, steps, warmup, timeout_s, device, json_out):
    """Launch PLAN_FILE with torchrun on the local GPUs and print measured step time, MFU and memory
    beside the simulator's prediction for the same plan."""
    from autotune.errors import AutotuneError
    from autotune.hardware import ClusterSpec, fabric_from_dict, get_gpu
    from autotune.plan import PlanDocument
    from autotune.runtime.evaluator import RealEvaluator, TrialFailed

    if steps < 1 or warmup < 0:
        raise AutotuneError(f"--steps must be >= 1 and --warmup >= 0, got {steps} and {warmup}")
    doc = PlanDocument.load(plan_file)
    cluster = ClusterSpec(gpu=get_gpu(doc.gpu), num_gpus=doc.num_gpus,
                          fabric=fabric_from_dict(doc.fabric, where=f"{plan_file}: cluster.fabric"))
    ev = RealEvaluator(model=doc.model, cluster=cluster, workload=doc.workload, layers=layers, steps=steps,
                       warmup=warmup, timeout_s=timeout_s, device=device)
    name = doc.model.name + (f" (proxy: {layers} of {doc.model.num_layers} layers)" if layers else "")
    click.echo(f"validating {plan_file}: {name} on {doc.num_gpus} x {doc.gpu}, seq {doc.workload.seq_len}, "
               f"global batch {doc.workload.global_batch_size}; {warmup} warm-up + {steps} timed steps")
    try:
        r = ev.evaluate(doc.plan)
    except TrialFailed as e:
        raise AutotuneError(f"the run failed: {e}") from None
    d = dict(r.details)
    if json_out:
        Path(json_out).write_text(json.dumps(r.to_dict(), indent=1, default=str))
    if not r.feasible:
        raise AutotuneError(f"{r.infeasible_reason} (simulator predicted "
                            f"{(d.get('simulated_peak_memory_bytes') or 0) / 2**30:.1f} GiB peak)")
    gib = 2**30
    steps_ms = d.get("step_times_ms") or []
    rows = [
        ("step time (median)", f"{r.step_time_ms:,.1f} ms" + (f"  (spread {max(steps_ms) - min(steps_ms):,.1f} ms "
                                                              f"over {len(steps_ms)} steps)" if steps_ms else "")),
        ("tokens/s per GPU", f"{r.tokens_per_s_per_gpu:,.0f}"),
        ("MFU", f"{r.mfu:.1%} (causal; PaLM convention {r.mfu_palm:.1%}), {r.tflops_per_gpu:.0f} TFLOP/s per GPU"),
        ("peak allocated / GPU", ", ".join(f"{(x or 0) / gib:.1f}" for x in d.get("peak_allocated_bytes") or []) + " GiB"),
        ("peak reserved / GPU", ", ".join(f"{(x or 0) / gib:.1f}" for x in d.get("peak_reserved_bytes") or []) + " GiB"),
    ]
    sim_ms = d.get("simulated_step_time_ms")
    if sim_ms:
        rows.append(("simulated step time", f"{sim_ms:,.1f} ms (error {d['simulated_error_pct']:+.1f}% vs measured)"))
    elif d.get("simulated_feasible") is False:
        rows.append(("simulated", "the memory model says this plan does not fit"))
    rows.append(("simulated peak memory", f"{(d.get('simulated_peak_memory_bytes') or 0) / gib:.1f} GiB"))
    for k, v in rows:
        click.echo(f"  {k:24s} {v}")
    click.echo(f"  measured on {d.get('device_name', '?')}, torch {d.get('torch_version', '?')}, CUDA "
               f"{d.get('cuda_version', '-')}, NCCL {d.get('nccl_version', '-')}, {d.get('date', '?')}")
