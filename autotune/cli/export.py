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
def export(study, size, model_path, gpu, gpus, interconnect, seq_len, global_batch, storage, space, backend, engine,
           output, launcher, dry_run, as_json):
    """Write the best plan of a study as YAML and print launch flags for Megatron-LM / torchtitan.

    Example: autotune export --size 405b -o plan.yaml
    """
    from autotune.report.summary import launch_hints
    from autotune.study.storage_check import storage_errors
    from autotune.study.trials import require_best_plan

    with storage_errors(storage):
        st, info = open_selected(study, size, model_path, gpu, gpus, interconnect, seq_len, global_batch, storage,
                                  space, backend, engine)
        best = require_best_plan(st, info, storage)
    doc = best.document()
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
        click.echo(json_document("export", [json_entry(plan=best.plan, result=best.result, info=info, engine=info.engine,
                                                   label="best", study=best.study, trial=best.trial_number)],
                                 plan_file=output))
        return
    click.echo(f"model {info.model.name}: {info.model.num_params:,} parameters")
    click.echo(f"wrote {output}: trial {best.trial_number} of {best.study}, MFU {100 * best.result.mfu:.1f}%, "
               f"step {best.result.step_time_ms:,.1f} ms (engine {info.engine})")
    click.echo(error_band_line(info.engine, info.gpu))
    click.echo(launch_hints(best.plan, info.model, info.workload))


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


