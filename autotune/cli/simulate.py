"""``autotune simulate``: predict one plan file (step time, MFU, memory, breakdown; trace and Gantt)."""

from __future__ import annotations

import click

from autotune.cli.app import main
from autotune.cli.options import JSON_OPTION, json_entry, make_say, target_line
from autotune.errors import ConfigError


@main.command()
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--backend", default="simulated", show_default=True, help="simulated, measured or real.")
@click.option("--interconnect", default=None, help="Evaluate on another fabric than the file's.")
@click.option("--engine", default=None, help="Evaluate for another engine than the file's (megatron, torchtitan, "
                                             "native).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="Write the simulated step as a Chrome/Perfetto trace (JSON): a process per pipeline stage, a track "
                   "per stream.")
@click.option("--gantt", "gantt_path", type=click.Path(dir_okay=False), default=None,
              help="Write a Gantt chart of the simulated step (.png, .svg or .pdf; needs matplotlib: autotune[plot]).")
@JSON_OPTION
def simulate(plan_file, backend, interconnect, engine, trace_path, gantt_path, as_json):
    """Predict one plan file (model, cluster and workload from the file) and print its memory table.

    Example: autotune simulate plan.yaml
    """
    import os

    from autotune.cost.evaluator import make_evaluator
    from autotune.cost.memory import estimate_memory
    from autotune.report.summary import format_best_plan
    from autotune.target.engines import resolve_engine
    from autotune.target.hardware import (
        ClusterSpec,
        fabric_from_dict,
        get_fabric,
        get_gpu,
    )
    from autotune.target.plan import PlanDocument, validate_plan

    # output paths are checked before anything is written, so a bad one leaves no file behind
    for opt, path, suffixes in (("--trace", trace_path, (".json",)), ("--gantt", gantt_path, (".png", ".svg", ".pdf"))):
        if path is None:
            continue
        if not path.lower().endswith(suffixes):
            raise ConfigError(f"{opt} {path!r}: the file name must end in {' or '.join(suffixes)}")
        d = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(d) or not os.access(d, os.W_OK):
            raise ConfigError(f"{opt} {path!r}: directory {d} does not exist or is not writable")
    doc = PlanDocument.load(plan_file)
    fabric = get_fabric(interconnect) if interconnect else fabric_from_dict(doc.fabric, where=f"{plan_file}: cluster.fabric")
    cluster = ClusterSpec(gpu=get_gpu(doc.gpu), num_gpus=doc.num_gpus, fabric=fabric)
    # the "has no effect" notes are printed here once, as warning: lines on stderr: validate_plan also
    # logs them and the evaluator (and --trace's timeline) validate again, so the autotune.target.plan logger
    # is quiet until this command ends
    import logging

    plan_log = logging.getLogger("autotune.target.plan")
    prev_level = plan_log.level
    plan_log.setLevel(logging.ERROR)
    click.get_current_context().call_on_close(lambda: plan_log.setLevel(prev_level))
    for w in validate_plan(doc.plan, doc.model, cluster.num_gpus, doc.workload,
                           gpus_per_node=cluster.gpus_per_node, gpu=cluster.gpu):
        click.echo(f"warning: {w}", err=True)
    seq_note = doc.model.check_sequence(doc.workload.seq_len)     # as `run` does for --seq-len
    if seq_note:
        click.echo(seq_note.replace("--seq-len", "seq_len"), err=True)
    eng = resolve_engine(engine if engine is not None else (None if backend == "real" else doc.engine), backend)
    ev = make_evaluator(backend, model=doc.model, cluster=cluster, workload=doc.workload, engine=eng.name)
    try:
        result = ev.evaluate(doc.plan)
        if (trace_path or gantt_path) and result.feasible:
            if not hasattr(ev, "step_timeline"):
                raise ConfigError(f"--trace/--gantt draw the simulator's timeline; backend {backend!r} has none "
                                  "(use --backend simulated or measured)")
            from autotune.report.trace import write_chrome_trace, write_gantt
            g, tl = ev.step_timeline(doc.plan)
            title = f"{doc.model.name} {cluster.num_gpus}x{cluster.gpu.name} {eng.name}: step {tl.step_time_ms:,.1f} ms"
            if trace_path:
                write_chrome_trace(trace_path, g, tl, title=title)
                make_say(as_json)(f"wrote {trace_path} (Chrome trace: open in ui.perfetto.dev or chrome://tracing)")
            if gantt_path:
                write_gantt(gantt_path, g, tl, title=title)
                make_say(as_json)(f"wrote {gantt_path}")
        elif trace_path or gantt_path:
            make_say(as_json)("no trace: the plan does not fit in memory")
        frag = None
        costs = getattr(ev, "costs", None)
        if costs is not None and hasattr(costs, "fragmentation"):
            frag = costs.fragmentation()
    finally:
        ev.close()
    mem = estimate_memory(doc.model, doc.plan, cluster.gpu, doc.workload, fragmentation=frag, engine=eng)
    pred = doc.prediction or {}
    same = None
    if "mfu" in pred and "step_time_ms" in pred and not interconnect and eng.name == doc.engine:
        same = abs(float(pred["mfu"]) - result.mfu) <= 1e-9 * max(1.0, result.mfu) and \
            abs(float(pred["step_time_ms"]) - result.step_time_ms) <= 1e-6 * max(1.0, result.step_time_ms)
    if as_json:
        from autotune.report.summary import json_document
        click.echo(json_document("simulate", [json_entry(plan=doc.plan, result=result, model=doc.model, cluster=cluster,
                                                     workload=doc.workload, engine=eng.name, label=str(plan_file),
                                                     study=doc.study, trial=doc.trial_id, memory=mem,
                                                     extra={"stored_prediction_holds": same})]))
        return
    click.echo(format_best_plan(plan=doc.plan, result=result, title=f"plan {plan_file}",
                                target=target_line(doc.model, cluster, doc.workload), engine=eng.name,
                                gpu=cluster.gpu.name))
    click.echo("")
    click.echo(mem.describe())
    if same is not None:
        click.echo(f"\nprediction stored in the file ({pred.get('backend', '?')}): step {float(pred['step_time_ms']):,.1f} "
                   f"ms, MFU {100 * float(pred['mfu']):.1f}% -> " + ("same" if same else "DIFFERENT now"))


