"""``autotune export``: a study's best plan as a plan YAML, engine launch files and a launcher script."""

from __future__ import annotations

import click

from autotune.cli.app import main
from autotune.cli.options import (
    JSON_OPTION,
    json_entry,
    make_say,
    open_selected,
    study_options,
    target_options,
)
from autotune.errors import ConfigError


@main.command()
@click.option("--study", "study", help="Study name (instead of the target options).")
@click.option("--plan", "plan_file", type=click.Path(dir_okay=False), default=None,
              help="Export this plan YAML (e.g. written by `simulate --save-plan`) instead of a study's best; its "
                   "model, cluster and workload come from the file, --engine may name another engine.")
@target_options
@study_options
@click.option("-o", "--output", default="plan.yaml", show_default=True, type=click.Path(),
              help="Where to write the plan YAML (with --launcher: the directory for the launch files, created "
                   "or reused; only the files export writes are replaced).")
@click.option("--launcher", type=click.Choice(["torchrun", "slurm"]), default=None,
              help="Write launch files for the plan's engine into the -o directory: torchrun script, and with slurm "
                   "also an sbatch script.")
@click.option("--dry-run", "dry_run", is_flag=True, help="With --launcher: print the full command the script runs.")
@JSON_OPTION
def export(study, plan_file, size, model_path, gpu, gpus, interconnect, seq_len, global_batch, storage, space, backend,
           engine, output, launcher, dry_run, as_json):
    """Write the best plan of a study (or a plan YAML: --plan) as YAML and print launch flags for Megatron-LM /
    torchtitan.

    Examples: autotune export --size 405b -o plan.yaml;
    autotune export --plan my_plan.yaml --launcher torchrun -o launch
    """
    from autotune.report.summary import launch_hints

    if plan_file is not None:
        from click.core import ParameterSource

        ctx = click.get_current_context()
        study_opts = [f"--{n}" for n in ("storage", "space", "backend")
                      if ctx.get_parameter_source(n) not in (None, ParameterSource.DEFAULT)]
        if study_opts and study is None:
            raise ConfigError(f"{', '.join(study_opts)}: with --plan {plan_file} no study is read (the plan, model, "
                              "cluster and workload come from that file); leave them out")
        doc, result, origin = _plan_source(plan_file, study, engine, size=size, model=model_path, gpu=gpu, gpus=gpus,
                                           interconnect=interconnect, seq_len=seq_len, global_batch=global_batch)
    else:
        from autotune.study.storage_check import storage_errors
        from autotune.study.trials import require_best_plan

        with storage_errors(storage):
            st, info = open_selected(study, size, model_path, gpu, gpus, interconnect, seq_len, global_batch,
                                     storage, space, backend, engine)
            best = require_best_plan(st, info, storage)
        doc, result, origin = best.document(), best.result, f"trial {best.trial_number} of {best.study}"
    if dry_run and not launcher:
        raise click.UsageError("--dry-run needs --launcher torchrun|slurm")
    if launcher:
        from pathlib import Path

        from autotune.export import launch_file_names, write_launch_files

        out_dir = output if output != "plan.yaml" else "launch"
        from autotune.files import check_output_path
        check_output_path(out_dir, what="-o", directory=True, names=tuple(launch_file_names(doc, launcher)))
        if Path(out_dir).exists() and not Path(out_dir).is_dir():
            raise ConfigError(f"-o {out_dir}: with --launcher, -o names a directory (new or existing), not a file")
        existed = [p for p in launch_file_names(doc, launcher) if (Path(out_dir) / p).exists()]
        paths = write_launch_files(doc, out_dir, launcher)
        output = str(paths[0])
        say = make_say(as_json)
        say(f"wrote {', '.join(str(p) for p in paths)} (engine {doc.engine}, {launcher})")
        if existed:
            say(f"replaced in {out_dir}: {', '.join(existed)} (other files there are untouched)")
        if dry_run:
            _dry_run(paths[-1], say)
    else:
        from pathlib import Path

        from autotune.files import check_output_path, check_path_names
        check_path_names(output, what="-o")
        if not Path(output).is_dir():
            check_output_path(output, what="-o")
        if Path(output).is_dir():
            raise ConfigError(f"-o {output}: is a directory; without --launcher -o names the plan YAML file "
                              f"(e.g. {Path(output) / 'plan.yaml'}), with --launcher torchrun|slurm a directory")
        try:
            doc.save(output)
        except OSError as e:
            raise ConfigError(f"cannot write {output}: {e}") from None
    from autotune.report.summary import error_band_line

    if as_json:
        from autotune.report.summary import json_document
        click.echo(json_document("export", [json_entry(plan=doc.plan, result=result, model=doc.model,
                                                       cluster=_cluster(doc), workload=doc.workload,
                                                       engine=doc.engine, label="best" if plan_file is None else "plan",
                                                       study=doc.study, trial=doc.trial_id)],
                                 plan_file=output))
        return
    click.echo(f"model {doc.model.name}: {doc.model.num_params:,} parameters")
    # with --launcher the files were named on the "wrote ..." line above: the plan is not named twice
    click.echo(f"{'plan' if launcher else f'wrote {output}'}: {origin}, MFU {100 * result.mfu:.1f}%, step "
               f"{result.step_time_ms:,.1f} ms (engine {doc.engine})")
    click.echo(error_band_line(doc.engine, doc.gpu))
    click.echo(launch_hints(doc.plan, doc.model, doc.workload))


def _cluster(doc):
    """The :class:`~autotune.spec.hardware.ClusterSpec` of a plan document."""
    from autotune.spec.hardware import ClusterSpec, fabric_from_dict, get_gpu
    return ClusterSpec(gpu=get_gpu(doc.gpu), num_gpus=doc.num_gpus,
                       fabric=fabric_from_dict(doc.fabric, where="plan: cluster.fabric"))


def _plan_source(plan_file, study, engine, **target):
    """``export --plan FILE``: the plan document (``engine``, if given, replacing the file's), its simulated
    prediction for that engine and a phrase naming where it came from.

    Raises:
        ConfigError: ``--study`` or a target option given too (the plan and target come from the file), an
            unknown engine, or a plan file that does not load.
    """
    import dataclasses

    from autotune.cost.evaluator import make_evaluator
    from autotune.spec.engines import get_engine
    from autotune.spec.plan import PlanDocument

    if study is not None:
        raise ConfigError(f"--plan {plan_file} and --study {study}: export one of them (a plan YAML or a "
                          "study's best plan), not both")
    given = [f"--{k.replace('_', '-')}" for k, v in target.items() if v is not None]
    if given:
        raise ConfigError(f"{', '.join(given)}: with --plan {plan_file} the model, cluster and workload come from "
                          "that file; leave them out (--engine may name another engine)")
    doc = PlanDocument.load(plan_file)
    if engine is not None:
        doc = dataclasses.replace(doc, engine=get_engine(engine).name)
    ev = make_evaluator("simulated", model=doc.model, cluster=_cluster(doc), workload=doc.workload, engine=doc.engine)
    try:
        result = ev.evaluate(doc.plan)
    finally:
        ev.close()
    from autotune.study.trials import prediction_of
    doc = dataclasses.replace(doc, prediction=prediction_of(result))      # for the engine exported
    return doc, result, f"plan {plan_file} (simulated now)"


def _dry_run(script, say) -> None:
    """Print what ``bash SCRIPT --dry-run`` prints (the environment and the full command)."""
    import subprocess
    try:
        r = subprocess.run(["bash", str(script), "--dry-run"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise ConfigError(f"cannot run bash {script} --dry-run: {e}") from None
    if r.returncode != 0:
        raise ConfigError(f"bash {script} --dry-run failed: {r.stderr.strip()[:300]}")
    say(r.stdout.rstrip())


