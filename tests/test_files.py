"""autotune/files.py: the shipped-YAML loader gives the same data with libyaml's C parser as with PyYAML's
pure-Python one, for every YAML file autotune ships (its data, each engine's facts, the search spaces)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autotune.files import load_shipped_yaml

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted([*(ROOT / "autotune").rglob("*.yaml"), *(ROOT / "search_spaces").glob("*.yaml")])


def test_there_are_shipped_files():
    # the engine facts (3), GPUs, fabrics, error bands and the default search space at least
    names = {p.name for p in SHIPPED}
    assert {"facts.yaml", "gpus.yaml", "fabrics.yaml", "default.yaml"} <= names and len(SHIPPED) >= 8


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_c_and_python_loaders_agree(path):
    text = path.read_text()
    assert load_shipped_yaml(text) == yaml.load(text, Loader=yaml.SafeLoader)  # noqa: S506 - safe loader
