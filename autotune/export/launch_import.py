"""Read a user's own launch back as autotune's target and plan: ``autotune simulate --from-megatron FILE``,
``--from-torchtitan FILE`` and ``autotune run --compare-to FILE``.

The readers are the inverse of the exporters beside them (:mod:`autotune.export.megatron_import` for a
Megatron-LM ``pretrain_gpt.py`` argument list, :mod:`autotune.export.torchtitan_import` for a torchtitan
0.2.x TOML job file or a 0.3.0 Python config module). Every setting of the file is accounted for: it is
*modelled* (it sets a field of the model, the plan or the workload, and ``autotune export`` writes it back
with the same value), *ignored* (listed, with why: a run setting that changes no step time or memory, or
one the cost model does not have), *approximated* (costed as the nearest value autotune has, said so), or the
file is refused naming the setting (a different model or parallelism than autotune can simulate).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from autotune.errors import ConfigError
from autotune.target.models import ModelSpec
from autotune.target.plan import Plan, Workload

FORMATS = ("megatron", "torchtitan")


@dataclass(frozen=True)
class ImportedLaunch:
    """A user's launch as autotune sees it.

    Attributes:
        source: the file it was read from.
        engine: the engine it launches (``megatron`` or ``torchtitan``; the engine profile it is costed with).
        fmt: the file's format (``megatron args``, ``torchtitan 0.2 TOML``, ``torchtitan 0.3 config``).
        model, plan, workload: the target and plan (``plan.dp_degree`` = GPUs / (TP PP CP)).
        num_gpus: the world size it runs on (from the command line: a launch file does not hold it).
        modelled: the file's settings that set a model / plan / workload field, as the file gives them
            (Megatron: option -> value tokens, ``()`` for a switch; torchtitan: ``section.field`` -> value).
        ignored: ``(setting, why)`` for each setting that is not modelled.
        approximated: lines saying which settings are costed as a nearby value autotune has.
    """

    source: str
    engine: str
    fmt: str
    model: ModelSpec
    plan: Plan
    workload: Workload
    num_gpus: int
    modelled: dict = field(default_factory=dict)
    ignored: tuple[tuple[str, str], ...] = ()
    approximated: tuple[str, ...] = ()

    def report_lines(self) -> list[str]:
        """``ignored: ...`` lines (grouped by reason) and ``approximated: ...`` lines, for the terminal."""
        by_reason: dict[str, list[str]] = {}
        for setting, why in self.ignored:
            by_reason.setdefault(why, []).append(setting)
        out = [f"ignored ({why}): {', '.join(s)}" for why, s in by_reason.items()]
        return out + [f"approximated: {a}" for a in self.approximated]

    def to_json(self) -> dict:
        """Plain data for ``--json`` (format, modelled settings, ignored and approximated ones)."""
        return {"source": self.source, "format": self.fmt, "engine": self.engine,
                "modelled": {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.modelled.items()},
                "ignored": [{"setting": s, "why": w} for s, w in self.ignored],
                "approximated": list(self.approximated)}


def detect_format(path: str | Path) -> str:
    """``megatron`` or ``torchtitan`` for a launch file: ``.toml`` and ``.py`` files are torchtitan's
    (0.2.x job file, 0.3.0 config module), anything else a Megatron-LM argument list.

    Raises:
        ConfigError: the file does not exist.
    """
    p = Path(path)
    if not p.is_file() and str(path).partition(":")[0].lower().endswith(".py"):
        p = Path(str(path).partition(":")[0])     # FILE.py:FUNCTION (a torchtitan config function)
    if not p.is_file():
        raise ConfigError(f"{path}: no such file (a Megatron-LM argument list, a torchtitan .toml job file or "
                          "a torchtitan .py config module)")
    return "torchtitan" if p.suffix.lower() in (".toml", ".py") else "megatron"


def import_launch(path: str | Path, fmt: str | None, *, num_gpus: int | None, gpu_name: str | None = None) -> ImportedLaunch:
    """Read ``path`` in format ``fmt`` (None: :func:`detect_format`) for a world of ``num_gpus`` GPUs.

    Raises:
        ConfigError: an unknown format, a missing GPU count, or anything the format's reader refuses.
    """
    detected = detect_format(path)          # also: the file exists
    fmt = fmt or detected
    if fmt not in FORMATS:
        raise ConfigError(f"format {fmt!r}: valid formats are {', '.join(FORMATS)}")
    if num_gpus is None:
        raise ConfigError(f"{path}: give --gpus N, the world size the launch runs on (TP x PP x CP x DP; a "
                          "launch file does not hold it)")
    if fmt == "megatron":
        from autotune.export.megatron_import import import_megatron_args
        return import_megatron_args(path, num_gpus=num_gpus)
    from autotune.export.torchtitan_import import import_torchtitan
    return import_torchtitan(path, num_gpus=num_gpus)


def label_from_path(path: str | Path) -> str:
    """A model name for a non-catalog architecture read from ``path``: its file stem, reduced to
    ``[A-Za-z0-9._-]``."""
    import re
    out = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(path).stem).strip("-.")
    return out[:64] or "imported-model"


def catalog_name(model: ModelSpec) -> ModelSpec:
    """``model`` named as the catalog model whose every architecture field it has (Llama 3.1 8B/70B/405B),
    else unchanged: a launch of Llama 3.1 70B is tuned and exported as ``llama3.1-70b``."""
    import dataclasses

    from autotune.target.models import CATALOG
    for m in CATALOG.values():
        if dataclasses.replace(model, name=m.name) == m:
            return m
    return model


__all__ = ["FORMATS", "ImportedLaunch", "catalog_name", "detect_format", "import_launch", "label_from_path"]
