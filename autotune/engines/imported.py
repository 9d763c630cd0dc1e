"""What a user's launch file means to autotune (:class:`ImportedLaunch`), shared by the readers
(:mod:`autotune.engines.megatron.importer`, :mod:`autotune.engines.torchtitan.importer`; the dispatcher is
:mod:`autotune.cli.launch_import`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from autotune.spec.models import ModelSpec
from autotune.spec.plan import Plan, Workload


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
        engine_release: the engine release the file is judged by (torchtitan ``0.2`` for a TOML job file,
            ``0.3`` for a config module; :func:`autotune.spec.engines.engine_release`), None: the profile's.
        notes: lines on how the file was read (``--run-script``: the command run) and which engine release
            it is judged by.
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
    notes: tuple[str, ...] = ()
    engine_release: str | None = None

    def report_lines(self) -> list[str]:
        """``note: ...``, ``ignored: ...`` lines (grouped by reason; each setting at most 100 printable
        characters, :func:`autotune.files.excerpt`) and ``approximated: ...`` lines, for the terminal."""
        from autotune.files import excerpt

        by_reason: dict[str, list[str]] = {}
        for setting, why in self.ignored:
            # each setting as a short sanitised excerpt: a value may come from anywhere a script read
            by_reason.setdefault(why, []).append(excerpt(setting))
        out = [f"ignored ({why}): {', '.join(s)}" for why, s in by_reason.items()]
        return [f"note: {n}" for n in self.notes] + out + [f"approximated: {a}" for a in self.approximated]

    def to_json(self) -> dict:
        """Plain data for ``--json`` (format, modelled settings, ignored and approximated ones)."""
        return {"source": self.source, "format": self.fmt, "engine": self.engine,
                "modelled": {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.modelled.items()},
                "ignored": [{"setting": s, "why": w} for s, w in self.ignored],
                "approximated": list(self.approximated), "notes": list(self.notes), "engine_release": self.engine_release}


def label_from_path(path: str | Path) -> str:
    """A model name for a non-catalog architecture read from ``path``: its file stem, reduced to
    ``[A-Za-z0-9._-]``."""
    import re
    out = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(path).stem).strip("-.")
    return out[:64] or "imported-model"


def catalog_name(model: ModelSpec) -> ModelSpec:
    """``model`` named as the catalog model whose every architecture field it has (Llama 3.1 8B/70B/405B, the
    built-in mixtures of experts),
    else unchanged: a launch of Llama 3.1 70B is tuned and exported as ``llama3.1-70b``."""
    import dataclasses

    from autotune.spec.models import CATALOG, MOE_CATALOG
    for m in [*CATALOG.values(), *MOE_CATALOG.values()]:
        if dataclasses.replace(model, name=m.name) == m:
            return m
    return model


def allocator_reclaim(env: dict[str, str]) -> str | None:
    """``expandable_segments`` when the launch's ``PYTORCH_CUDA_ALLOC_CONF`` turns expandable segments on
    (PyTorch CUDA semantics notes, "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF": comma-separated
    ``option:value``; ``expandable_segments:True``), else None."""
    for part in env.get("PYTORCH_CUDA_ALLOC_CONF", "").split(","):
        k, _, v = part.strip().partition(":")
        if k == "expandable_segments" and v.strip().lower() == "true":
            return "expandable_segments"
    return None


__all__ = ["allocator_reclaim", "ImportedLaunch", "catalog_name", "label_from_path"]
