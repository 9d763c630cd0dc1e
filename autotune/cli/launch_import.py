"""Read a user's own launch back as autotune's target and plan: ``autotune simulate --from-megatron FILE``,
``--from-torchtitan FILE`` and ``autotune run --compare-to FILE``.

The readers are the inverse of the exporters beside them (:mod:`autotune.engines.megatron.importer` for a
Megatron-LM ``pretrain_gpt.py`` argument list, :mod:`autotune.engines.torchtitan.importer` for a torchtitan
0.2.x TOML job file or a 0.3.0 Python config module). Every setting of the file is accounted for: it is
*modelled* (it sets a field of the model, the plan or the workload, and ``autotune export`` writes it back
with the same value), *ignored* (listed, with why: a run setting that changes no step time or memory, or
one the cost model does not have), *approximated* (costed as the nearest value autotune has, said so), or the
file is refused naming the setting (a different model or parallelism than autotune can simulate).
"""

from __future__ import annotations

from pathlib import Path

from autotune.errors import ConfigError
from autotune.engines.imported import ImportedLaunch

def _formats() -> dict[str, str]:
    from autotune.engines.registry import import_formats

    return import_formats()


#: the ``--from-*`` launch formats (:func:`autotune.engines.registry.import_formats`)
FORMATS = tuple(_formats())


def detect_format(path: str | Path) -> str:
    """The format of a launch file: the format whose importer lists the file's suffix (its ``FILE_SUFFIXES``:
    torchtitan's ``.toml`` job files and ``.py`` config modules), else the one that lists none (a Megatron-LM
    argument list or launch script).

    Raises:
        ConfigError: the file does not exist, or is not a regular file autotune reads
            (:func:`autotune.files.resolve_input`: a FIFO, a device, a symbolic link loop, a /proc file).
    """
    import os

    from autotune.files import excerpt, resolve_input

    p = Path(path)
    if not os.path.lexists(p) and str(path).partition(":")[0].lower().endswith(".py"):
        p = Path(str(path).partition(":")[0])     # FILE.py:FUNCTION (a torchtitan config function)
    if not os.path.lexists(p):
        raise ConfigError(f"{excerpt(str(path))}: no such file (a Megatron-LM argument list, a torchtitan .toml job "
                          "file or a torchtitan .py config module)")
    resolve_input(p, what="launch file")    # a regular file: not a FIFO, device, loop, /proc file (files.py)
    from autotune.engines.registry import importer_module

    by_suffix, default = {}, None
    for fmt, engine in _formats().items():
        suffixes = importer_module(engine).FILE_SUFFIXES
        by_suffix.update((s, fmt) for s in suffixes)
        if not suffixes:
            default = fmt
    return by_suffix.get(p.suffix.lower(), default)


def import_launch(path: str | Path, fmt: str | None, *, num_gpus: int | None, script=None) -> ImportedLaunch:
    """Read ``path`` in format ``fmt`` (None: :func:`detect_format`) for a world of ``num_gpus`` GPUs (None: a
    Megatron-LM launch's own ``--nnodes`` x ``--nproc-per-node``). ``script`` (a
    :class:`autotune.export.script_run.ScriptRun`, ``--run-script``): a Megatron-LM launch script is run under
    bash with its launchers recorded (:mod:`autotune.export.script_run`) instead of read statically.

    Raises:
        ConfigError: an unknown format, a missing GPU count, ``--run-script`` on a torchtitan file, or anything
            the format's reader refuses.
    """
    detected = detect_format(path)          # also: the file exists
    fmt = fmt or detected
    if fmt not in FORMATS:
        raise ConfigError(f"format {fmt!r}: valid formats are {', '.join(FORMATS)}")
    from autotune.engines.registry import import_formats, importer_module

    if script is not None:
        if fmt != "megatron":
            raise ConfigError(f"{path}: --run-script runs a Megatron-LM launch script; a {fmt} file is read as data "
                              "(leave --run-script out)")
        return importer_module(import_formats()[fmt]).import_launch(path, num_gpus=num_gpus, script=script)
    return importer_module(import_formats()[fmt]).import_launch(path, num_gpus=num_gpus)


__all__ = ["FORMATS", "ImportedLaunch", "detect_format", "import_launch"]
