"""Interrupts (SIGINT / SIGTERM) while tuning: noted at once, raised only where that is safe.

A signal handler calls :func:`note_interrupt`; :func:`safe_to_raise` says whether the interrupted frame may
take a KeyboardInterrupt (never inside SQLAlchemy or a ``__del__`` finalizer); the tuner raises a noted
interrupt at its next trial boundary (:meth:`autotune.tune.tuner.Tuner.optimize`). Moved from ``tune/tuner.py``.
"""

from __future__ import annotations

import os
from typing import Any

#: SQLite call surfaces there as ``sqlite3.OperationalError: interrupted`` (wrapped by SQLAlchemy and
#: Optuna), which a trial's ``catch=(Exception,)`` would record as a failed trial and tuning would go
#: on; the flag makes the next trial boundary (and the study opening) raise KeyboardInterrupt instead.
_INTERRUPT: dict[str, int] = {}


def note_interrupt(signum: int) -> None:
    """Record that ``signum`` arrived (the CLI's and :meth:`Tuner.optimize`'s signal handlers call it)."""
    _INTERRUPT["sig"] = int(signum)


def interrupted() -> int | None:
    """The signal number recorded by :func:`note_interrupt` since :func:`clear_interrupt`, or None."""
    return _INTERRUPT.get("sig")


def clear_interrupt() -> None:
    _INTERRUPT.clear()


#: path fragments of code a KeyboardInterrupt must not be raised into: SQLAlchemy's connection pool
#: returns and resets connections from garbage-collector finalizers (pool/base.py ``_finalize_fairy``),
#: catches what they raise and logs it as "Exception during reset or similar" with a traceback, so an
#: interrupt raised there is both printed and lost; its event registry runs weakref callbacks
#: (event/registry.py ``_collection_gced``, whose interrupt Python prints as "Exception ignored in"), and a
#: transaction cut in the middle leaves a trial half written: no SQLAlchemy code is interrupted.
_NO_RAISE_PATHS = (f"{os.sep}sqlalchemy{os.sep}",)

#: set while :meth:`Tuner.objective` evaluates a plan: only then does the tuning signal handler raise
#: (:func:`trial_interrupt_handler`); elsewhere (the sampler, Optuna's ask/tell storage writes) a signal is
#: only noted, and the next trial boundary raises it, so a trial is never left RUNNING in the storage.
IN_OBJECTIVE: dict[str, bool] = {}


def safe_to_raise(frame: Any) -> bool:
    """Whether a signal handler may raise KeyboardInterrupt into ``frame`` (the frame a signal
    interrupted): False when any frame on its stack runs code under :data:`_NO_RAISE_PATHS` or is a
    ``__del__`` finalizer. The interrupt is then only noted (:func:`note_interrupt`), and the next
    trial boundary (the ``count`` callback in :meth:`Tuner.optimize`) raises it."""
    f = frame
    while f is not None:
        code = f.f_code
        if code.co_name == "__del__" or any(m in code.co_filename for m in _NO_RAISE_PATHS):
            return False
        f = f.f_back
    return True


def interrupt_handler(signum: int, frame: Any) -> None:
    note_interrupt(signum)
    if safe_to_raise(frame):
        raise KeyboardInterrupt


def trial_interrupt_handler(signum: int, frame: Any) -> None:
    """SIGINT / SIGTERM while :meth:`Tuner.optimize` runs: noted; raised (KeyboardInterrupt) only inside a
    trial's objective (Optuna then tells the trial FAIL, optuna/study/_optimize.py ``_run_trial``) and
    where :func:`safe_to_raise` allows; otherwise the next trial boundary raises it."""
    note_interrupt(signum)
    if IN_OBJECTIVE.get("on") and safe_to_raise(frame):
        raise KeyboardInterrupt

