"""The package's layering (issue 21): the import-linter layers contract in pyproject.toml holds, no module
of autotune sits in an import cycle (function-level imports included: grimp reads every import statement
of a module, wherever it is), and no module grows past the size the layout was split to."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (the test extra)")


def _import_graph() -> nx.DiGraph:
    g = grimp.build_graph("autotune")
    out = nx.DiGraph()
    for m in g.modules:
        out.add_node(m)
        for n in g.find_modules_directly_imported_by(m):
            out.add_edge(m, n)
    return out


def test_the_layers_contract_is_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "2 kept, 0 broken" in r.stdout


def test_no_import_cycle():
    g = _import_graph()
    cycles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    cycles += [[m] for m in g.nodes if g.has_edge(m, m)]
    assert cycles == [], f"modules in import cycles: {cycles}"


def test_function_level_imports_are_seen():
    # the cycle check would be blind to imports inside functions if grimp skipped them: `autotune run`
    # imports the tuner inside its function (keeping `autotune --help` fast), so that edge must be in the graph
    g = _import_graph()
    assert g.has_edge("autotune.cli.tune", "autotune.tune.tuner")


def test_module_sizes():
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in (ROOT / "autotune").rglob("*.py")}
    assert {k: v for k, v in sizes.items() if v > 800} == {}
    assert sizes["autotune/tune/tuner.py"] < 500


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_engines_contract_covers_every_module_outside_the_engines():
    # the forbidden contract's source list is written by hand: every top-level module and package of autotune
    # but autotune.engines (and the package's own __init__) must be in it, or a new one could import an
    # engine's folder unchecked
    contract = next(c for c in _pyproject()["tool"]["importlinter"]["contracts"] if c["type"] == "forbidden")
    top = {f"autotune.{p.stem if p.is_file() else p.name}" for p in (ROOT / "autotune").iterdir()
           if (p.suffix == ".py" and p.name != "__init__.py") or (p.is_dir() and (p / "__init__.py").exists())}
    assert top - {"autotune.engines"} == set(contract["source_modules"])


def _layer_index() -> list[tuple[int, str]]:
    """(layer number from the top, module) of every module the layers contract names."""
    contract = next(c for c in _pyproject()["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    out = []
    for i, layer in enumerate(contract["layers"]):
        for m in layer.replace(":", "|").split("|"):
            out.append((i, m.strip()))
    return out


def _layer_of(module: str, index: list[tuple[int, str]]) -> int:
    # the most specific layer entry that contains the module
    best = max((m for _, m in index if module == m or module.startswith(m + ".")), key=len)
    return next(i for i, m in index if m == best)


def test_registry_parts_are_reached_from_their_layer_or_above():
    # autotune.engines.registry imports an engine's parts by name (importlib), which the import-linter cannot
    # see: every call of export_module / importer_module / runner_module / accounting_module must come from a
    # module at the part's layer or above (a lower index in the layers list), else a low layer would run code
    # of a higher one
    import ast

    from autotune.engines import registry

    index = _layer_index()
    parts = {"export_module": lambda e: registry.engine_parts(e).export,
             "importer_module": lambda e: registry.engine_parts(e).importer,
             "runner_module": lambda e: registry.engine_parts(e).runner[0],
             "accounting_module": lambda a: registry.ACCOUNTING_MODULES[a]}
    worst: dict[str, int] = {}          # the lowest layer (highest index) any engine's part of each kind sits in
    for fn, path in parts.items():
        keys = registry.ACCOUNTING_MODULES if fn == "accounting_module" else \
            [e for e, p in registry.ENGINES.items() if getattr(p, fn.split("_")[0]) is not None]
        worst[fn] = min(_layer_of(path(k), index) for k in keys)
    bad, calls = [], 0
    for p in (ROOT / "autotune").rglob("*.py"):
        mod = ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if mod.startswith("autotune.engines"):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in parts:
                    calls += 1
                    if _layer_of(mod, index) > worst[name]:
                        bad.append(f"{mod} calls {name} (its layer is below the parts')")
    assert calls >= 5 and bad == []
