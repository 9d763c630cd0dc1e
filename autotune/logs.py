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
    plan_log = logging.getLogger("autotune.spec.plan")
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




class MfuProgressBar:
    """Progress bar of a tuning run that names its number: ``best MFU 41.2% (trial 17)`` (Optuna's own bar
    says ``Best value: 0.412`` with no name). Call it as an Optuna callback after each trial; only complete,
    feasible trials (``user_attrs['feasible']`` not False) can be the best. ``close()`` when done.

    Args:
        total: trials expected (None: unknown); stream: where tqdm writes (stderr by default).
    """

    def __init__(self, total: int | None, stream=None) -> None:
        from tqdm.auto import tqdm
        self.best: tuple[float, int] | None = None
        self.bar = tqdm(total=total, file=stream, unit="trial", dynamic_ncols=True)

    @staticmethod
    def text(best: tuple[float, int] | None) -> str:
        """``best MFU 41.2% (trial 17)`` for (MFU as a fraction, trial number); ``no feasible plan yet``."""
        return "no feasible plan yet" if best is None else f"best MFU {100 * best[0]:.1f}% (trial {best[1]})"

    def __call__(self, study, trial) -> None:
        from optuna.trial import TrialState
        if trial.state == TrialState.COMPLETE and trial.value is not None and trial.user_attrs.get("feasible", True) \
                is not False and (self.best is None or trial.value > self.best[0]):
            self.best = (float(trial.value), trial.number)
        self.bar.set_postfix_str(self.text(self.best), refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
