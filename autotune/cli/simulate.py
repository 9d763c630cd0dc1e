"""``autotune simulate``: predict one plan file (step time, MFU, memory, breakdown; trace and Gantt)."""

from __future__ import annotations

import click

from autotune.cli.app import main
from autotune.cli.compare import script_options, script_run
from autotune.cli.options import ASCII_INT, JSON_OPTION, MODEL_HELP, json_entry, make_say, target_line
from autotune.errors import ConfigError
from autotune.files import withhold_private


#: command-line plan options -> Plan fields (autotune.spec.plan.Plan); other fields: --set FIELD=VALUE
PLAN_FLAGS = {"tp": "tp_degree", "pp": "pp_degree", "cp": "cp_degree", "vpp": "vpp_degree",
              "mbs": "micro_batch_size", "schedule": "pipeline_schedule", "recompute": "recompute",
              "zero": "zero_stage", "precision": "precision", "sp": "sequence_parallel"}


def _plan_options(f):
    opts = [
        click.option("--size", help="Without PLAN_FILE: Llama 3.1 size (8b, 70b, 405b)."),
        click.option("--model", "model_path", type=click.Path(dir_okay=False), metavar="FILE|NAME",
                     help="Without PLAN_FILE: " + MODEL_HELP[0].lower() + MODEL_HELP[1:]),
        click.option("--gpu", help="Without PLAN_FILE: GPU (default b200)."),
        click.option("--gpus", type=ASCII_INT, help="Without PLAN_FILE: GPU count (default per size, as `run`)."),
        click.option("--seq-len", type=ASCII_INT, help="Without PLAN_FILE: sequence length (default 8192)."),
        click.option("--global-batch", help="Without PLAN_FILE: global batch in tokens (16M, 4M, ...)."),
        click.option("--tp", type=ASCII_INT, help="Tensor parallel degree (default 1)."),
        click.option("--pp", type=ASCII_INT, help="Pipeline parallel degree (default 1)."),
        click.option("--cp", type=ASCII_INT, help="Context parallel degree (default 1)."),
        click.option("--vpp", type=ASCII_INT, help="Virtual stages per pipeline rank; N > 1 without --schedule selects interleaved_1f1b."),
        click.option("--mbs", type=ASCII_INT, help="Micro-batch size in sequences (default 1)."),
        click.option("--schedule", help="Pipeline schedule: gpipe, 1f1b, interleaved_1f1b (default 1f1b)."),
        click.option("--recompute", help="Activation recomputation: none, selective, full (default none)."),
        click.option("--zero", type=ASCII_INT, help="ZeRO stage 0-3 (default: the engine's; 1, torchtitan FSDP: 3, 2 with --pp > 1)."),
        click.option("--precision", help="bf16, fp8_tensorwise, fp8_rowwise, fp8_delayed, mxfp8 (default bf16)."),
        click.option("--sp/--no-sp", "sp", default=None, help="Sequence parallelism (with --tp > 1)."),
        click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE",
                     help="Any other plan field, e.g. --set memory_reclaim=expandable_segments (YAML value)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def default_zero_stage(engine: str, pp: int) -> int:
    """The ZeRO stage a command-line plan gets without ``--zero``: the engine's own default. torchtitan:
    FSDP2 with ``fsdp_reshard_after_forward = "default"``, which reshards after forward without a pipeline
    (ZeRO-3) and keeps the parameters gathered with one (ZeRO-2) (torchtitan distributed/fsdp.py
    ``get_fsdp_reshard_after_forward_policy``; facts.yaml); other engines: Plan's default (ZeRO-1)."""
    from autotune.spec.plan import Plan
    if engine == "torchtitan":
        return 3 if pp == 1 else 2
    return Plan.__dataclass_fields__["zero_stage"].default


def plan_from_options(*, size, model_path, gpu, gpus, interconnect, seq_len, global_batch, engine, backend, sets,
                      **flags):
    """A :class:`~autotune.spec.plan.PlanDocument` from command-line degrees and target options: dp =
    GPUs / (tp pp cp), micro-batches = global batch / (micro-batch x dp), both whole numbers.

    Raises:
        ConfigError: degrees that do not divide the GPU count or the batch, a malformed ``--set``, or any
            plan field out of range (named, as a plan file's would be).
    """
    from autotune.cli.options import resolve_target
    from autotune.spec.engines import resolve_engine
    from autotune.spec.plan import Plan, PlanDocument

    if size is None and model_path is None:
        raise ConfigError("without PLAN_FILE, give the model: --size 8b|70b|405b or --model config.json|NAME "
                          "(and the plan: --tp, --pp, --cp, --mbs, ...)")
    model, cluster, workload = resolve_target(size=size, model_path=model_path, gpu=gpu, gpus=gpus,
                                              interconnect=interconnect, seq_len=seq_len, global_batch=global_batch)
    d = {PLAN_FLAGS[k]: v for k, v in flags.items() if v is not None}
    for s in sets:
        key, eq, text = s.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--set {s!r}: expected FIELD=VALUE, e.g. --set memory_reclaim=expandable_segments")
        from autotune.files import excerpt, parse_yaml_text
        try:        # the user files' YAML limits (node cap with aliases expanded, nesting depth)
            d[key.strip()] = parse_yaml_text(text, source=f"--set {excerpt(key.strip(), 60)}")
        except ConfigError as e:
            raise ConfigError(f"--set {excerpt(s, 100)!r}: the value is not a YAML scalar ({excerpt(e, 200)})") from None
    for k in ("tp_degree", "pp_degree", "cp_degree", "vpp_degree", "micro_batch_size"):
        v = d.get(k, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{k} must be an integer >= 1, got {v!r}")
    if d.get("pipeline_schedule") == "interleaved_1f1b" and "vpp_degree" not in d:
        raise ConfigError("--schedule interleaved_1f1b needs --vpp N (virtual stages per pipeline rank, >= 2)")
    if "vpp_degree" in d and d["vpp_degree"] > 1 and "pipeline_schedule" not in d:
        d["pipeline_schedule"] = "interleaved_1f1b"
    tp, pp, cp, mbs = (int(d.get(k, 1)) for k in ("tp_degree", "pp_degree", "cp_degree", "micro_batch_size"))
    n = cluster.num_gpus
    if n % (tp * pp * cp):
        raise ConfigError(f"--tp {tp} x --pp {pp} x --cp {cp} = {tp * pp * cp} must divide the "
                          f"{n} GPUs (dp = GPUs / (tp pp cp))")
    dp = n // (tp * pp * cp)
    if workload.global_batch_size % (mbs * dp):
        raise ConfigError(f"global batch {workload.global_batch_size} sequences is not a multiple of --mbs {mbs} x "
                          f"dp {dp}; change --mbs, the degrees or --global-batch")
    d.setdefault("dp_degree", dp)
    d.setdefault("num_micro_batches", workload.global_batch_size // (mbs * dp))
    eng = resolve_engine(engine, backend)
    if "zero_stage" not in d:
        d["zero_stage"] = default_zero_stage(eng.name, pp)
    plan = Plan.from_dict(d, source="command-line plan")
    return PlanDocument(plan=plan, model=model, gpu=cluster.gpu.name, num_gpus=n, fabric=cluster.fabric.to_dict(),
                        workload=workload, engine=eng.name)


@main.command()
@click.argument("plan_file", type=click.Path(dir_okay=False), required=False)
@click.option("--backend", default="simulated", show_default=True, help="simulated, measured or real.")
@click.option("--interconnect", default=None, help="Evaluate on another fabric than the file's.")
@click.option("--engine", default=None, help="Evaluate for another engine than the file's (megatron, torchtitan, "
                                             "native).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="Write the simulated step as a Chrome/Perfetto trace (JSON): a process per pipeline stage, a track "
                   "per stream.")
@click.option("--gantt", "gantt_path", type=click.Path(dir_okay=False), default=None,
              help="Write a Gantt chart of the simulated step (.png, .svg or .pdf; needs matplotlib: the plot extra).")
@click.option("--from-megatron", "from_megatron", type=click.Path(dir_okay=False), default=None,
              help="Predict your own Megatron-LM launch: a file of pretrain_gpt.py arguments (one per line or "
                   "shell-style lines; \\ continuations and # comments allowed) or a launch script (bash arrays "
                   "NAME=( ... ) and variables assigned once to a literal are expanded). --gpus: the world size (default: "
                   "the launcher's literal --nnodes x --nproc-per-node, which --gpus must then equal); "
                   "--gpu, --interconnect as usual.")
@click.option("--from-torchtitan", "from_torchtitan", default=None, metavar="CONFIG",
              help="Predict your own torchtitan launch: a 0.2.x TOML job file or a 0.3.0 config module "
                   "(FILE.py[:FUNCTION], loaded with torchtitan's ConfigManager). Needs --gpus.")
@click.option("--save-plan", "save_plan", type=click.Path(dir_okay=False), default=None,
              help="Write the plan being simulated (from PLAN_FILE, --from-megatron/--from-torchtitan or the "
                   "command-line degrees) with this prediction as a plan YAML, as `simulate PLAN_FILE` and "
                   "`export --plan` read it.")
@script_options
@_plan_options
@JSON_OPTION
def simulate(plan_file, backend, interconnect, engine, trace_path, gantt_path, from_megatron, from_torchtitan,
             save_plan, as_json, size, model_path, gpu, gpus, seq_len, global_batch, sets, run_script, script_args,
             script_env, **flags):
    """Predict one plan file (model, cluster and workload from the file) and print its memory table; or,
    without PLAN_FILE, a plan given by degrees with the target options (a quick memory and step-time check);
    or your own launch (--from-megatron ARGS_FILE, --from-torchtitan CONFIG): every setting it has is
    modelled, listed as ignored or approximated, or refused by name.

    Examples: autotune simulate plan.yaml;
    autotune simulate --size 70b --gpus 64 --tp 8 --pp 4 --vpp 5 --mbs 1 --recompute selective;
    autotune simulate --from-megatron my_args.sh --gpus 512 --gpu h100
    """
    import os

    from autotune.cost.evaluator import make_evaluator
    from autotune.cost.memory import estimate_memory
    from autotune.report.summary import format_best_plan
    from autotune.spec.engines import resolve_engine
    from autotune.spec.hardware import (
        ClusterSpec,
        fabric_from_dict,
        get_fabric,
        get_gpu,
    )
    from autotune.spec.plan import PlanDocument, validate_plan

    # output paths are checked before anything is written, so a bad one leaves no file behind
    for opt, path, suffixes in (("--trace", trace_path, (".json",)), ("--gantt", gantt_path, (".png", ".svg", ".pdf"))):
        if path is None:
            continue
        if not path.lower().endswith(suffixes):
            raise ConfigError(f"{opt} {path!r}: the file name must end in {' or '.join(suffixes)}")
        d = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(d) or not os.access(d, os.W_OK):
            raise ConfigError(f"{opt} {path!r}: directory {d} does not exist or is not writable")
        from autotune.files import check_output_path
        check_output_path(path, what=opt)     # never through a symbolic link, names within NAME_MAX
    if save_plan is not None:
        from pathlib import Path

        from autotune.files import check_output_path, check_path_names
        check_path_names(save_plan, what="--save-plan")
        if Path(save_plan).is_dir():
            raise ConfigError(f"--save-plan {save_plan}: is a directory; give the plan YAML file to write")
        check_output_path(save_plan, what="--save-plan")
    given = [f"--{k}" for k, v in flags.items() if v is not None] + [
        o for o, v in (("--size", size), ("--model", model_path), ("--gpu", gpu), ("--gpus", gpus),
                       ("--seq-len", seq_len), ("--global-batch", global_batch), ("--set", sets)) if v]
    if plan_file is not None and given:
        raise ConfigError(f"{', '.join(given)}: the plan and target come from {plan_file}; give either PLAN_FILE or "
                          "the command-line plan (--size/--model, --tp, --pp, ...), not both")
    imported = None
    script = script_run(run_script, script_args, script_env)
    if script is not None and not from_megatron:
        raise ConfigError("--run-script runs the Megatron-LM launch script of --from-megatron SCRIPT; give it")
    launch = [(o, v) for o, v in (("--from-megatron", from_megatron), ("--from-torchtitan", from_torchtitan)) if v]
    if launch:
        other = [o for o, _ in launch[1:]] + ([plan_file] if plan_file else []) + \
            [g for g in given if g not in ("--gpu", "--gpus")]
        if other:
            raise ConfigError(f"{launch[0][0]} {launch[0][1]}: the plan and model come from that file; leave out "
                              f"{', '.join(other)} (give --gpus, --gpu, --interconnect, --engine, --backend)")
        from autotune.cli.compare import print_import_report, read_launch
        imported = read_launch(launch[0][1], launch[0][0][len("--from-"):], gpus, script)
        from autotune.cli.options import DEFAULT_GPU
        from autotune.spec.hardware import make_cluster
        cl = make_cluster(gpu or DEFAULT_GPU, imported.num_gpus, interconnect)
        doc = PlanDocument(plan=imported.plan, model=imported.model, gpu=cl.gpu.name, num_gpus=cl.num_gpus,
                           fabric=cl.fabric.to_dict(), workload=imported.workload, engine=imported.engine)
        plan_file, interconnect = f"{imported.source} ({imported.fmt})", None
        if not as_json:
            print_import_report(imported, click.echo)
            click.echo("")
    elif plan_file is None:
        doc = plan_from_options(size=size, model_path=model_path, gpu=gpu, gpus=gpus, interconnect=interconnect,
                                seq_len=seq_len, global_batch=global_batch, engine=engine, backend=backend, sets=sets,
                                **flags)
        plan_file, interconnect = "(command line)", None     # the fabric is in doc already
    else:
        doc = PlanDocument.load(plan_file)
        doc = _at_measured_depth(doc, as_json)
    fabric = get_fabric(interconnect) if interconnect else fabric_from_dict(doc.fabric, where=f"{plan_file}: cluster.fabric")
    cluster = ClusterSpec(gpu=get_gpu(doc.gpu), num_gpus=doc.num_gpus, fabric=fabric)
    # the "has no effect" notes are printed here once, as warning: lines on stderr: validate_plan also
    # logs them and the evaluator (and --trace's timeline) validate again, so the autotune.spec.plan logger
    # is quiet until this command ends
    import logging

    plan_log = logging.getLogger("autotune.spec.plan")
    prev_level = plan_log.level
    plan_log.setLevel(logging.ERROR)
    click.get_current_context().call_on_close(lambda: plan_log.setLevel(prev_level))
    for w in validate_plan(doc.plan, doc.model, cluster.num_gpus, doc.workload,
                           gpus_per_node=cluster.gpus_per_node, gpu=cluster.gpu):
        click.echo(f"warning: {withhold_private(w)}", err=True)
    seq_note = doc.model.check_sequence(doc.workload.seq_len)     # as `run` does for --seq-len
    if seq_note:
        click.echo(seq_note.replace("--seq-len", "seq_len"), err=True)
    eng = resolve_engine(engine if engine is not None else (None if backend == "real" else doc.engine), backend)
    eng_arg = eng.name
    if imported is not None and imported.engine_release and engine is None and backend != "real":
        # a launch file is judged by the engine release it is written for (torchtitan 0.2 TOML, 0.3 module)
        from autotune.spec.engines import engine_release
        eng = eng_arg = engine_release(imported.engine, imported.engine_release)
    elif imported is None and engine is None and backend != "real" and _measured_release(doc) is not None:
        # a trial measured on an engine release other than the profile's (torchtitan 0.2.2 runs the real
        # trials): judged by that release's facts, as the trial's own prediction was
        from autotune.spec.engines import engine_release
        eng = eng_arg = engine_release(doc.engine, _measured_release(doc))
        if not as_json:
            click.echo(f"note: judged by the facts of {doc.engine} {details_version(doc)}, the release the stored trial ran", err=True)
    ev = make_evaluator(backend, model=doc.model, cluster=cluster, workload=doc.workload, engine=eng_arg)
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
    if save_plan is not None:
        _save_plan(save_plan, doc, cluster, eng.name, result, make_say(as_json))
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
                                                     extra={"stored_prediction_holds": same,
                                                            **({"imported": imported.to_json()} if imported
                                                               else {})})]))
        return
    click.echo(format_best_plan(plan=doc.plan, result=result, title=f"plan {plan_file}",
                                target=target_line(doc.model, cluster, doc.workload), engine=eng.name, model=doc.model,
                                gpu=cluster.gpu.name))
    click.echo("")
    click.echo(mem.describe())
    if same is not None and pred.get("backend") == "real":
        # a real trial's figures are measured; the simulator's own prediction of it is in details
        meas = float(pred["step_time_ms"])
        then = (pred.get("details") or {}).get("simulated_step_time_ms")
        then_txt = f"{float(then):,.1f} ms at the trial, " if isinstance(then, (int, float)) else ""
        click.echo(f"\nmeasured in the file (real): step {meas:,.1f} ms, MFU {100 * float(pred['mfu']):.1f}%; simulated: "
                   f"{then_txt}{result.step_time_ms:,.1f} ms now ({100 * (result.step_time_ms / meas - 1):+.1f}% vs measured)")
    elif same is not None and pred.get("feasible") is False:
        # a stored infeasible prediction has no step time (0): say what it said, and whether that still holds
        now = "still does not fit" if not result.feasible else f"fits now (step {result.step_time_ms:,.1f} ms)"
        click.echo(f"\nprediction stored in the file ({pred.get('backend', '?')}): did not fit "
                   f"({pred.get('infeasible_reason') or 'no reason stored'}) -> {now}")
    elif same is not None:
        click.echo(f"\nprediction stored in the file ({pred.get('backend', '?')}): step {float(pred['step_time_ms']):,.1f} "
                   f"ms, MFU {100 * float(pred['mfu']):.1f}% -> " + ("same" if same else "DIFFERENT now"))




def _save_plan(path, doc, cluster, engine: str, result, say) -> None:
    """Write ``doc`` as simulated (``cluster``'s fabric, ``engine``, ``result`` as its prediction) to ``path``:
    the :class:`~autotune.spec.plan.PlanDocument` YAML that ``simulate PLAN_FILE`` and ``export --plan`` read."""
    import dataclasses

    from autotune.study.trials import prediction_of
    out = dataclasses.replace(doc, fabric=cluster.fabric.to_dict(), engine=engine, prediction=prediction_of(result))
    try:
        out.save(path)
    except OSError as e:
        raise ConfigError(f"cannot write {path}: {e}") from None
    say(f"wrote {path} (plan YAML, engine {engine}; `autotune export --plan {path}` writes its launch files)")


def _at_measured_depth(doc, as_json: bool):
    """``doc`` with its model cut to the layers its stored prediction was measured with (a real trial of
    ``run --layers N`` stores N in ``prediction.details.layers``; the plan keeps the full model), so
    ``simulate`` predicts what ran instead of the full model; a note on stderr says so. Else ``doc``."""
    from dataclasses import replace

    details = (doc.prediction or {}).get("details") or {}
    layers = details.get("layers") if isinstance(details, dict) else None
    if not isinstance(layers, int) or isinstance(layers, bool) or not 1 <= layers < doc.model.num_layers:
        return doc
    if not as_json:
        click.echo(f"note: the stored prediction was measured with the model cut to {layers} of its "
                   f"{doc.model.num_layers} layers (run --layers {layers}); simulated at {layers} layers",
                   err=True)
    return replace(doc, model=doc.model.truncated(layers))


def details_version(doc) -> str:
    """``prediction.details.engine_version`` of ``doc`` (``"0.2.2"``), as the note prints it."""
    return str(((doc.prediction or {}).get("details") or {}).get("engine_version"))


def _measured_release(doc) -> str | None:
    """The release of ``releases.yaml`` whose version the stored prediction's trial ran
    (``prediction.details.engine_version``, e.g. torchtitan ``0.2.2`` -> ``"0.2"``) when it is not the engine
    profile's own release, else None."""
    from autotune.spec.engines import engine_releases

    details = (doc.prediction or {}).get("details") or {}
    version = details.get("engine_version") if isinstance(details, dict) else None
    rel = engine_releases(doc.engine) if isinstance(version, str) and doc.engine else None
    if not rel:
        return None
    for name, entry in (rel.get("releases") or {}).items():
        if isinstance(entry, dict) and entry.get("version") == version and name != rel.get("profile_release"):
            return name
    return None

