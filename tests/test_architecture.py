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
