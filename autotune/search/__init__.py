"""Structured plan search: layout enumeration, cheap screens and the Optuna sampler the tuner uses.

* :mod:`autotune.search.estimate`: :class:`PlanScreen` (memory fit, closed-form step time).
* :mod:`autotune.search.sampler`: :class:`LayoutSampler` (an ``optuna.samplers.BaseSampler``).

See docs/search.md for the design and the measured results (bench/bench_search.py).
"""

from autotune.search.estimate import PlanScreen
from autotune.search.sampler import (
    LAYOUT_KNOBS,
    PREFERENCES,
    LayoutSampler,
    make_sampler,
)

__all__ = ["PlanScreen", "LayoutSampler", "make_sampler", "LAYOUT_KNOBS", "PREFERENCES"]
