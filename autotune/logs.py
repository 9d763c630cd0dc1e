"""Logging switches shared by every layer: ``AUTOTUNE_DEBUG`` and the quiet context for Optuna's logs."""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from typing import Iterator

import optuna


def debug_enabled() -> bool:
    return os.environ.get("AUTOTUNE_DEBUG", "") not in ("", "0")



@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence Optuna's per-trial INFO logs, experimental warnings and plan "no effect" warnings.

    With ``AUTOTUNE_DEBUG=1`` Optuna keeps WARNING level (failed trials print their traceback).
    """
    prev = optuna.logging.get_verbosity()
    plan_log = logging.getLogger("autotune.target.plan")
    prev_plan = plan_log.level
    optuna.logging.set_verbosity(optuna.logging.WARNING if debug_enabled() else optuna.logging.ERROR)
    if not debug_enabled():
        plan_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            warnings.filterwarnings("ignore", message=".*[Ff]ixed parameter.*")
            warnings.filterwarnings("ignore", message=".*enqueue.*")
            yield
    finally:
        optuna.logging.set_verbosity(prev)
        plan_log.setLevel(prev_plan)


