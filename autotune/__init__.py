"""autotune: find the parallelism plan with the highest MFU for an LLM on a GPU cluster.

The package is layered; each layer imports only the layers below it (``pyproject.toml``
``[tool.importlinter]``, checked in CI; docs/architecture.md):

    cli -> retune -> workers -> tuner, report -> runtime, profiling -> launchers, export
        -> study -> search -> cost -> target -> signals, logs, files, errors

Old module paths (``autotune.plan``, ``autotune.simulator`` ...) keep working: :data:`MOVED` maps each to
its new place, and importing the old name gives the new module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

#: module paths before the layout of issue 21 -> where the module lives now
MOVED = {
    "autotune.models": "autotune.target.models",
    "autotune.hardware": "autotune.target.hardware",
    "autotune.plan": "autotune.target.plan",
    "autotune.engines": "autotune.target.engines",
    "autotune.validate": "autotune.target.validate",
    "autotune.flops": "autotune.cost.flops",
    "autotune.memory": "autotune.cost.memory",
    "autotune.schedule": "autotune.cost.schedule",
    "autotune.topology": "autotune.cost.topology",
    "autotune.calibration": "autotune.cost.calibration",
    "autotune.graph": "autotune.cost.graph",
    "autotune.simulator": "autotune.cost.simulator",
    "autotune.evaluator": "autotune.cost.evaluator",
    "autotune.search_space": "autotune.search.space",
    "autotune.storage_check": "autotune.study.storage_check",
    "autotune.report": None,        # now a package: autotune.report.summary holds the old module
    "autotune.plots": "autotune.report.plots",
    "autotune.trace": "autotune.report.trace",
    "autotune.profiling.cli": "autotune.cli.profile",
    "autotune.runtime.cli": "autotune.cli.validate",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path (:data:`MOVED`) as the module at its new path (the same module object)."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - importlib's signature
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):  # noqa: ANN001
        module = importlib.import_module(MOVED[spec.name])
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module):  # noqa: ANN001 - already executed under its new name
        # importlib has just set ``__spec__`` to the old name's spec (importlib._bootstrap._init_module_attrs);
        # the module keeps its own
        module.__spec__ = self._own_spec


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModuleFinder())
