"""Exceptions that carry a message meant for the user.

The CLI turns any :class:`AutotuneError` into a one-paragraph error and a non-zero exit code (never a
traceback). :class:`PlanError` is also a :class:`ValueError`, so library users can catch the standard
exception for invalid plans.
"""

from __future__ import annotations


class AutotuneError(Exception):
    """Base class for errors whose message is written for the user of the CLI."""


class PlanError(AutotuneError, ValueError):
    """A parallelism plan is invalid for the model, cluster or workload (names the numbers)."""


class ConfigError(AutotuneError, ValueError):
    """A YAML file, catalog name or option value is malformed or unknown."""


class StorageError(AutotuneError):
    """The study storage (an SQLAlchemy URL) cannot be opened."""


class NoFeasiblePlanError(AutotuneError):
    """Every trial of a study failed, was pruned or did not fit in memory."""


class NoGPUError(AutotuneError):
    """A command that needs an NVIDIA GPU ran on a machine without one."""
