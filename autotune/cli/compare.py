"""A user's own launch (a Megatron-LM argument list or a torchtitan config) in the CLI: the target it implies
(``simulate --from-megatron`` / ``--from-torchtitan``, ``run --compare-to``), its prediction, and the tuned
plan beside it."""

from __future__ import annotations

import click

from autotune.errors import ConfigError
from autotune.cli.launch_import import FORMATS as IMPORT_FORMATS   # the registry's --from-* formats

COMPARE_OPTIONS = [
    click.option("--compare-to", "compare_to", type=click.Path(dir_okay=False), default=None,
                 help="After tuning, print the tuned plan beside your own launch: a Megatron-LM argument list or a "
                      "torchtitan config (.toml 0.2.x job file, .py[:FUNCTION] 0.3.0 module); without --size/--model "
                      "the run tunes that launch's model, sequence length and global batch."),
    click.option("--compare-format", "compare_format", type=click.Choice(IMPORT_FORMATS), default=None,
                 help="Format of --compare-to (default: .toml / .py are torchtitan, anything else Megatron-LM)."),
]


SCRIPT_OPTIONS = [
    click.option("--run-script", "run_script", is_flag=True, default=False,
                 help="Read a Megatron-LM launch script by running it: bash runs it in a child process (empty "
                      "temporary directory, no stdin, 20 s timeout, minimal environment) with torchrun, python, "
                      "python3, srun, deepspeed, uv, nsys and mpirun replaced by a recorder of their arguments; "
                      "nothing is trained and nothing runs inside autotune, but the script's other commands do run, "
                      "with your permissions (not a sandbox: give it only a script you would run). Without it "
                      "the script is read statically (arrays and variables assigned once).") ,
    click.option("--script-args", "script_args", default=None, metavar="'A B ...'",
                 help="With --run-script: the script's positional arguments ($1 $2 ...), as shell words."),
    click.option("--script-env", "script_env", multiple=True, metavar="NAME=VALUE",
                 help="With --run-script: an environment variable the script sees (repeatable), e.g. NNODES=4."),
]


def script_options(f):
    for o in reversed(SCRIPT_OPTIONS):
        f = o(f)
    return f


def script_run(run_script: bool, script_args, script_env):
    """The :class:`~autotune.export.script_run.ScriptRun` of ``--run-script`` (None without it).

    Raises:
        ConfigError: --script-args / --script-env without --run-script, or malformed.
    """
    if not run_script:
        given = [o for o, v in (("--script-args", script_args), ("--script-env", script_env)) if v]
        if given:
            raise ConfigError(f"{', '.join(given)}: only with --run-script (the script is read statically without it)")
        return None
    from autotune.export.script_run import ScriptRun
    return ScriptRun.from_options(script_args, tuple(script_env or ()))


def compare_options(f):
    for o in reversed(COMPARE_OPTIONS):
        f = o(f)
    return f


def read_launch(path: str, fmt: str | None, gpus: int | None, script=None):
    """The :class:`~autotune.cli.launch_import.ImportedLaunch` of ``path`` for ``--gpus`` (``script``: a
    :class:`~autotune.export.script_run.ScriptRun`, ``--run-script``).

    Raises:
        ConfigError: see :func:`autotune.cli.launch_import.import_launch`.
    """
    from autotune.cli.launch_import import import_launch
    from autotune.spec.validate import MAX_NUM_GPUS, require_int
    if gpus is not None:
        require_int(gpus, "--gpus", hi=MAX_NUM_GPUS)
    return import_launch(path, fmt, num_gpus=gpus, script=script)


def imported_target(imp, *, size, model_path, gpu, gpus, interconnect, seq_len, global_batch):
    """(model, cluster, workload) of a run compared with ``imp``: ``imp``'s model and workload, or the
    command line's where given, which must then be the same (a comparison on two targets would mislead).

    Raises:
        ConfigError: a --size/--model, --seq-len or --global-batch that differs from the launch's, naming both.
    """
    import dataclasses

    from autotune.cli.options import DEFAULT_GPU, resolve_target
    from autotune.spec.hardware import make_cluster

    if size or model_path:
        model, cluster, workload = resolve_target(size=size, model_path=model_path, gpu=gpu, gpus=gpus,
                                                  interconnect=interconnect, seq_len=seq_len or imp.workload.seq_len,
                                                  global_batch=global_batch or str(imp.workload.global_batch_tokens))
        if dataclasses.replace(model, name=imp.model.name) != imp.model:
            diff = [f.name for f in dataclasses.fields(model) if f.name != "name"
                    and getattr(model, f.name) != getattr(imp.model, f.name)]
            raise ConfigError(f"--compare-to {imp.source}: its model ({imp.model.name}) differs from the run's "
                              f"({model.name}) in {', '.join(diff)}; leave --size/--model out to tune the launch's model")
    else:
        model = imp.model
        cluster = make_cluster(gpu or DEFAULT_GPU, gpus, interconnect)
        from autotune.cli.options import parse_tokens
        from autotune.spec.plan import Workload
        workload = imp.workload
        if seq_len is not None or global_batch is not None:
            workload = Workload.from_tokens(seq_len=seq_len or imp.workload.seq_len,
                                            global_batch_tokens=parse_tokens(global_batch) if global_batch
                                            else imp.workload.global_batch_tokens)
    if (workload.seq_len, workload.global_batch_size) != (imp.workload.seq_len, imp.workload.global_batch_size):
        raise ConfigError(f"--compare-to {imp.source}: it trains seq {imp.workload.seq_len} x "
                          f"{imp.workload.global_batch_size} sequences per step, the run seq {workload.seq_len} x "
                          f"{workload.global_batch_size}; leave --seq-len/--global-batch out to use the launch's")
    return model, cluster, workload


def evaluate_imported(imp, *, model, cluster, workload, backend: str):
    """The user's plan on the run's target, with its own engine (the one it launches): its StepResult and the
    plan's warnings (settings with no effect)."""
    from autotune.cost.evaluator import make_evaluator
    from autotune.spec.plan import validate_plan

    warnings = validate_plan(imp.plan, model, cluster.num_gpus, workload, gpus_per_node=cluster.gpus_per_node,
                             gpu=cluster.gpu)
    ev = make_evaluator(backend, model=model, cluster=cluster, workload=workload, engine=imp.engine)
    try:
        return ev.evaluate(imp.plan), warnings
    finally:
        ev.close()


def print_import_report(imp, say) -> None:
    """``read FILE (...)`` then the ``ignored:`` and ``approximated:`` lines, through ``say``."""
    say(f"read {imp.source} ({imp.fmt}, engine {imp.engine}): {len(imp.modelled)} settings modelled, "
        f"{len(imp.ignored)} ignored, {len(imp.approximated)} approximated")
    for line in imp.report_lines():
        say(line)
