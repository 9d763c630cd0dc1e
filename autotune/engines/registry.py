"""The one place that names every engine and where its parts live (:class:`autotune.engines.base.EngineParts`).

Every module outside ``autotune/engines/`` reaches an engine through the functions here, by engine name;
none imports ``autotune.engines.megatron`` or ``autotune.engines.torchtitan`` itself (an import-linter
contract in ``pyproject.toml`` and ``tests/test_architecture.py`` check it). Parts are imported when first
asked for (:func:`importlib.import_module`), so the CLI and the simulator load no runner and no torch.

Which layer may use which part is that part's layer in ``pyproject.toml``'s layers contract: the facts
(:func:`facts_file`) from ``autotune.spec`` up, :func:`accounting_module` from the cost model up, an export or
importer from ``autotune.export`` up, a runner from the runners' layer up (``autotune.tune``, the CLI). The
import-linter cannot see these imports (they are by name), so ``tests/test_architecture.py``
``test_registry_parts_are_reached_from_their_layer_or_above`` checks every call of these functions against
the layers.

Adding an engine: a folder ``autotune/engines/<name>/`` with its ``facts.yaml`` and modules, one entry in
:data:`ENGINES`, and its modules placed in the layers contract (docs/architecture.md, "Adding an engine").
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from autotune.engines.base import EngineParts
from autotune.errors import ConfigError

#: the engines, in catalogue order (``--engine`` choices, tables)
ENGINES: dict[str, EngineParts] = {
    "native": EngineParts(name="native", folder="native", export="autotune.engines.native.export"),
    "megatron": EngineParts(name="megatron", folder="megatron", export="autotune.engines.megatron.export",
                            importer="autotune.engines.megatron.importer",
                            runner=("autotune.engines.megatron.runner", "MegatronEvaluator"),
                            log="autotune.engines.megatron.log", import_format="megatron"),
    "torchtitan": EngineParts(name="torchtitan", folder="torchtitan", export="autotune.engines.torchtitan.export",
                              importer="autotune.engines.torchtitan.importer",
                              runner=("autotune.engines.torchtitan.runner", "TorchtitanEvaluator"),
                              log="autotune.engines.torchtitan.log", import_format="torchtitan"),
}

#: activation accountings measured on one engine's block (:attr:`autotune.spec.engines.EngineProfile.
#: activation_accounting`) -> the module holding the measured table (read by :mod:`autotune.cost.memory`)
ACCOUNTING_MODULES: dict[str, str] = {"torchtitan_block": "autotune.engines.torchtitan.block_saved"}

ENGINES_DIR = Path(__file__).resolve().parent


def engine_parts(name: str) -> EngineParts:
    """The parts of engine ``name``.

    Raises:
        ConfigError: unknown engine (lists the known ones).
    """
    parts = ENGINES.get(name) if isinstance(name, str) else None
    if parts is None:
        raise ConfigError(f"unknown engine {name!r}; known engines: {', '.join(ENGINES)}")
    return parts


def facts_file(name: str) -> Path:
    """Path of engine ``name``'s ``facts.yaml`` (raises ConfigError if the engine is unknown)."""
    return ENGINES_DIR / engine_parts(name).folder / "facts.yaml"


def releases_file(name: str) -> Path:
    """Path of engine ``name``'s ``releases.yaml`` (the facts of each engine release whose launch files autotune
    reads, where they differ from facts.yaml; it may not exist). Raises ConfigError if the engine is unknown."""
    return ENGINES_DIR / engine_parts(name).folder / "releases.yaml"


def _part(name: str, part: str) -> ModuleType:
    path = getattr(engine_parts(name), part)
    if path is None:
        raise ConfigError(f"engine {name} has no {part}; engines with one: "
                          f"{', '.join(n for n, p in ENGINES.items() if getattr(p, part))}")
    return importlib.import_module(path if isinstance(path, str) else path[0])


def export_module(name: str) -> ModuleType:
    """Engine ``name``'s export module (``launch_command``, ``model_refusal``, its launch files).

    Raises:
        ConfigError: unknown engine, or one without an export.
    """
    return _part(name, "export")


def importer_module(name: str) -> ModuleType:
    """Engine ``name``'s launch reader (``import_launch``). Raises ConfigError as :func:`export_module`."""
    return _part(name, "importer")


def runner_module(name: str) -> ModuleType:
    """Engine ``name``'s runner module (``check_engine``, ``run_key``, the evaluator class). Raises
    ConfigError as :func:`export_module`."""
    return _part(name, "runner")


def engine_runners() -> dict[str, tuple[str, str]]:
    """Engines with a runner of their own: name -> (module path, evaluator class name)."""
    return {n: p.runner for n, p in ENGINES.items() if p.runner is not None}


def import_formats() -> dict[str, str]:
    """``--from-*`` launch formats: format name -> engine name."""
    return {p.import_format: n for n, p in ENGINES.items() if p.import_format is not None}


@lru_cache(maxsize=None)
def accounting_module(accounting: str) -> ModuleType:
    """The module of a measured activation accounting (:data:`ACCOUNTING_MODULES`).

    Raises:
        ConfigError: an accounting with no measured table.
    """
    path = ACCOUNTING_MODULES.get(accounting)
    if path is None:
        raise ConfigError(f"activation accounting {accounting!r} has no measured table; those with one: "
                          f"{', '.join(ACCOUNTING_MODULES)}")
    return importlib.import_module(path)


__all__ = ["ACCOUNTING_MODULES", "ENGINES", "accounting_module", "engine_parts", "engine_runners",
           "export_module", "facts_file", "import_formats", "importer_module", "runner_module"]
