"""Whether torchtitan's own config loader can be imported here (tests that load autotune's torchtitan exports
with it skip, saying so, where it cannot)."""

from __future__ import annotations

import importlib
import os
import sys


def torchtitan_available() -> bool:
    """True when ``torchtitan.config.manager`` and the llama3 config registry import (``TORCHTITAN_PYTHONPATH``,
    when set, is appended to ``sys.path`` first: a torchtitan checkout outside the environment)."""
    extra = os.environ.get("TORCHTITAN_PYTHONPATH")
    if extra and extra not in sys.path:
        sys.path.append(extra)
    try:
        importlib.import_module("torchtitan.models.llama3.config_registry")
        importlib.import_module("torchtitan.config.manager")
        return True
    except Exception:       # noqa: BLE001 - any import failure means: not installed here
        return False
