"""Launch files for a tuned plan: ``autotune export --launcher torchrun|slurm -o DIR``.

What is written, for the plan's engine (:attr:`autotune.spec.plan.PlanDocument.engine`):

* ``megatron``: ``launch_torchrun.sh`` running Megatron-LM's ``pretrain_gpt.py`` (architecture, plan
  and run arguments, :mod:`autotune.engines.megatron.export`) under torchrun with the environment variables the
  settings need; Megatron-LM's checkout is ``$MEGATRON_LM``;
* ``torchtitan``: ``autotune_torchtitan.py`` (a torchtitan >= 0.3.0 config module,
  :mod:`autotune.engines.torchtitan.export`) and ``launch_torchrun.sh`` running ``-m torchtitan.train`` with it;
* ``native``: ``launch_torchrun.sh`` running ``autotune validate plan.yaml`` (autotune's runtime on the
  local GPUs);
* always ``plan.yaml`` (the :class:`~autotune.spec.plan.PlanDocument`); with ``slurm`` also
  ``launch_slurm.sbatch``, which starts ``launch_torchrun.sh`` on every node with ``srun`` (one task
  per node; torchrun spawns one process per GPU, c10d rendezvous on the first node).

Every script takes ``--dry-run`` (print the environment and the full command, run nothing); further
arguments are appended to the command. Node count = GPUs / GPUs per node of the cluster.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from autotune.engines.base import LaunchCommand
from autotune.errors import ConfigError
from autotune.engines.quoting import comment_text, shell_name, slurm_job_name
from autotune.files import write_output_text
from autotune.spec.plan import PlanDocument

LAUNCHERS = ("torchrun", "slurm")


def launch_command(doc: PlanDocument, *, plan_file: str = "plan.yaml") -> LaunchCommand:
    """The per-engine command of ``doc``: the engine's export ``launch_command``
    (:func:`autotune.engines.registry.export_module`).

    Raises:
        ConfigError: unknown engine, a plan the engine's launch format cannot express (see the engine's
            export module, ``autotune/engines/<engine>/export.py``; an engine without expert parallelism
            refuses a mixture-of-experts model there).
    """
    from autotune.engines.registry import ENGINES, export_module

    if doc.engine not in ENGINES:
        raise ConfigError(f"engine {doc.engine!r}: valid engines are {', '.join(ENGINES)}")
    return export_module(doc.engine).launch_command(doc, plan_file=plan_file)


def _q(x: str) -> str:
    return shlex.quote(x)


def _header(doc: PlanDocument) -> str:
    """The first comment line of a launch script (every input string through :func:`comment_text`)."""
    return (f"# {comment_text(doc.model.name)} on {doc.num_gpus} x {comment_text(doc.gpu)}, engine "
            f"{comment_text(doc.engine)}; written by autotune export")


def torchrun_script(doc: PlanDocument, cmd: LaunchCommand, gpus_per_node: int) -> str:
    """Bash source of ``launch_torchrun.sh`` (``--dry-run`` prints, else ``exec``s the command).

    Nothing from the plan is written as shell code: the names in the comment lines pass
    :func:`autotune.engines.quoting.comment_text` (one printable line), every argument and environment value
    is a :func:`shlex.quote`'d word, environment names must be shell names; the program words
    (``cmd.program``) are the engine's own (``"$MEGATRON_LM/pretrain_gpt.py"``).

    Raises:
        ConfigError: an environment variable name that is not a shell name.
    """
    nnodes = max(1, doc.num_gpus // gpus_per_node)
    lines = ["#!/usr/bin/env bash", _header(doc),
             f"# study {comment_text(doc.study)}, trial {comment_text(doc.trial_id)}"]
    lines += [f"# {comment_text(n)}" for n in cmd.notes]
    lines += ["# usage: bash launch_torchrun.sh [--dry-run] [extra arguments]",
              "# multi-node: run on every node with NODE_RANK=<0..NNODES-1> and MASTER_ADDR=<first node>",
              "set -euo pipefail",
              'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
              "DRY_RUN=0",
              'if [[ "${1:-}" == "--dry-run" ]]; then DRY_RUN=1; shift; fi',
              f"NNODES=${{NNODES:-{nnodes}}}",
              f"GPUS_PER_NODE=${{GPUS_PER_NODE:-{min(gpus_per_node, doc.num_gpus)}}}",
              "NODE_RANK=${NODE_RANK:-0}",
              "MASTER_ADDR=${MASTER_ADDR:-localhost}",
              "MASTER_PORT=${MASTER_PORT:-29500}"]
    lines += list(cmd.prelude)
    for k, v in cmd.env:
        lines.append(f"export {shell_name(k)}={_q(v)}")
    if cmd.use_torchrun:
        head = ['torchrun', '--nnodes "$NNODES"', '--nproc-per-node "$GPUS_PER_NODE"', '--node-rank "$NODE_RANK"',
                '--master-addr "$MASTER_ADDR"', '--master-port "$MASTER_PORT"'] + list(cmd.program)
    else:
        head = list(cmd.program)
    args = [(_q(a) if a != "plan.yaml" else '"$HERE/plan.yaml"') for a in cmd.args]
    # one option with its values per line (a word starting with "-" that is not a number opens a line)
    groups: list[list[str]] = []
    for a in args:
        if not groups or (a.startswith("-") and not re.fullmatch(r"-[0-9.]+([eE][-+]?[0-9]+)?", a)):
            groups.append([a])
        else:
            groups[-1].append(a)
    lines.append("CMD=(" + " \\\n  ".join(head + [" ".join(g) for g in groups]) + ' \\\n  "$@")')
    lines += ["if (( DRY_RUN )); then"]
    lines += [f'  echo "{k}=${{{k}}}"' for k, _ in cmd.env]
    if doc.engine == "torchtitan":
        lines.append('  echo "PYTHONPATH=$PYTHONPATH"')
    lines += ['  printf "%q " "${CMD[@]}"; echo', "  exit 0", "fi", 'exec "${CMD[@]}"', ""]
    return "\n".join(lines)


def slurm_script(doc: PlanDocument, gpus_per_node: int, here: str | os.PathLike | None = None,
                 segment_nodes: int | None = None) -> str:
    """Bash source of ``launch_slurm.sbatch``: one srun task per node running ``launch_torchrun.sh``
    from ``here`` (the launch directory, absolute: sbatch runs a spooled copy of the script, so its own
    location says nothing; None: the submit directory). ``segment_nodes``: hosts per NVLink domain the
    prediction assumed on a multi-host domain (NVL72), written as ``#SBATCH --segment`` (Slurm
    topology/block: each segment is allocated inside one block; sbatch documentation ``--segment``).
    The job name is the model name in :func:`autotune.engines.quoting.slurm_job_name`'s characters, the comment
    line passes :func:`~autotune.engines.quoting.comment_text`, ``here`` is a :func:`shlex.quote`'d word."""
    nnodes = max(1, doc.num_gpus // gpus_per_node)
    g = min(gpus_per_node, doc.num_gpus)
    seg = ([f"#SBATCH --segment={segment_nodes}   # hosts per NVLink domain, as the prediction assumed"]
           if segment_nodes and segment_nodes < nnodes else [])
    return "\n".join([
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name=autotune-{slurm_job_name(doc.model.name)}",
        f"#SBATCH --nodes={nnodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={g}",
        "#SBATCH --exclusive",
        *seg,
        _header(doc),
        "# usage: sbatch launch_slurm.sbatch   |   bash launch_slurm.sbatch --dry-run",
        "set -euo pipefail",
        (f'HERE={shlex.quote(str(Path(here).resolve()))}' if here is not None else
         'HERE="${SLURM_SUBMIT_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}"'),
        'DRY="" ; if [[ "${1:-}" == "--dry-run" ]]; then DRY="--dry-run"; shift; fi',
        'MASTER_ADDR=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-localhost}" 2>/dev/null | head -n1 || true)',
        'export MASTER_ADDR=${MASTER_ADDR:-localhost} MASTER_PORT=${MASTER_PORT:-29500}',
        f"export NNODES=${{SLURM_NNODES:-{nnodes}}} GPUS_PER_NODE={g}",
        "SRUN=(srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c "
        "'NODE_RANK=$SLURM_NODEID exec bash \"$0\" \"$@\"' \"$HERE/launch_torchrun.sh\")",
        'if [[ -n "$DRY" ]]; then',
        '  printf "%q " "${SRUN[@]}"; echo',
        '  NODE_RANK=0 bash "$HERE/launch_torchrun.sh" --dry-run "$@"',
        "  exit 0",
        "fi",
        'exec "${SRUN[@]}" "$@"',
        ""])


def host_gpus_per_node(gpu: str, nvlink_domain: int) -> int:
    """GPUs per host (torchrun's ``--nproc-per-node``): 4 on GB200 NVL72 (a compute tray holds 2 Grace
    CPUs and 4 Blackwell GPUs, NVIDIA GB200 NVL72 datasheet; the NVLink domain spans 72), else the
    NVLink domain of the intra-node tier (8 on HGX)."""
    return 4 if gpu.startswith("gb200") else nvlink_domain


def launch_file_names(doc: PlanDocument, launcher: str) -> list[str]:
    """File names (no directory) that :func:`write_launch_files` writes for ``doc`` and ``launcher``, in
    the order written: ``plan.yaml``, ``autotune_torchtitan.py`` (torchtitan only), ``launch_torchrun.sh``,
    ``launch_slurm.sbatch`` (slurm only). Other files of the directory are never touched."""
    from autotune.engines.registry import export_module

    names = ["plan.yaml", *export_module(doc.engine).EXTRA_FILES]
    names.append("launch_torchrun.sh")
    if launcher == "slurm":
        names.append("launch_slurm.sbatch")
    return names


def write_launch_files(doc: PlanDocument, out_dir: str | os.PathLike, launcher: str) -> list[Path]:
    """Write the launch files of ``doc`` (see the module docstring) into ``out_dir`` (created if missing;
    an existing directory is reused: the files of :func:`launch_file_names` are replaced, nothing else).

    Returns: the paths written. Raises:
        ConfigError: unknown launcher (valid: torchrun, slurm), an unwritable directory, or a plan the
            engine's format cannot express.
    """
    if launcher not in LAUNCHERS:
        raise ConfigError(f"--launcher {launcher!r}: valid launchers are {', '.join(LAUNCHERS)}")
    from autotune.spec.hardware import ClusterSpec, fabric_from_dict, get_gpu

    cluster = ClusterSpec(gpu=get_gpu(doc.gpu), num_gpus=doc.num_gpus,
                          fabric=fabric_from_dict(doc.fabric, where="plan: cluster.fabric"))
    gpn = host_gpus_per_node(doc.gpu, min(cluster.fabric.gpus_per_host, cluster.num_gpus))
    segment = cluster.nvlink_domain_size // gpn if cluster.fabric.gpus_per_host < cluster.fabric.nvlink_domain_size else None
    cmd = launch_command(doc)
    files: dict[str, tuple[str, bool]] = {"plan.yaml": (doc.to_yaml(), False)}
    from autotune.engines.registry import export_module

    files.update((name, (text, False)) for name, text in export_module(doc.engine).extra_files(doc).items())
    files["launch_torchrun.sh"] = (torchrun_script(doc, cmd, gpn), True)
    if launcher == "slurm":
        files["launch_slurm.sbatch"] = (slurm_script(doc, gpn, here=out_dir, segment_nodes=segment), True)
    out = Path(out_dir)
    written = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, (text, exe) in files.items():
            p = out / name
            write_output_text(p, text, what="-o")      # never through a symbolic link
            if exe:
                p.chmod(0o755)
            written.append(p)
    except OSError as e:
        raise ConfigError(f"cannot write launch files to {out}: {e}") from None
    return written


__all__ = ["LAUNCHERS", "LaunchCommand", "host_gpus_per_node", "launch_command", "launch_file_names", "slurm_script",
           "torchrun_script", "write_launch_files"]
