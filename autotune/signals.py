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



#: SIGINT / SIGTERM that arrived while the ``autotune`` command was starting (imports, option parsing), before
#: the command's own handling: noted by :func:`install_startup_handlers`' handler
STARTUP_SIGNALS: list[int] = []
#: the handlers :func:`install_startup_handlers` replaced, by signal number
_STARTUP_OLD: dict[int, Any] = {}


def _note_startup(signum: int, frame: Any) -> None:
    STARTUP_SIGNALS.append(int(signum))


def install_startup_handlers() -> None:
    """Note SIGINT / SIGTERM from the first line of the ``autotune`` command on (before the imports of its
    commands, which take 0.05-0.5 s), so a signal in the first moments ends it with a message and exit 130
    / 143 instead of the default death (-15, no message). Only the handlers that are still the defaults are
    replaced (a signal the parent ignored stays ignored). The CLI then acts on a noted signal before the
    command starts and puts the defaults back (:func:`autotune.cli.app.AutotuneGroup.invoke`), or the
    command's own handlers take over (``run`` / ``retune``: :func:`autotune.cli.options.early_signals`)."""
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            cur = signal.getsignal(sig)
            if cur in (signal.SIG_DFL, signal.default_int_handler):
                _STARTUP_OLD[sig] = signal.signal(sig, _note_startup)
        except (ValueError, OSError):      # not the main thread
            continue


def startup_signal() -> int | None:
    """The first signal noted by :func:`install_startup_handlers`' handler, or None."""
    return STARTUP_SIGNALS[0] if STARTUP_SIGNALS else None


def restore_startup_handlers() -> None:
    """Put back the handlers :func:`install_startup_handlers` replaced (where its handler is still set)."""
    import signal

    for sig, old in list(_STARTUP_OLD.items()):
        try:
            if signal.getsignal(sig) is _note_startup:
                signal.signal(sig, old)
        except (ValueError, OSError):
            pass
        _STARTUP_OLD.pop(sig, None)


def take_startup_signals(replaced: dict[int, Any]) -> list[int]:
    """For a command that installs its own handlers (``run`` / ``retune``): the signals noted since startup
    (then forgotten here), and in ``replaced`` (signal -> the handler the command replaced) the startup
    handler swapped for the one it had replaced, so the command's clean-up restores the real previous one."""
    for sig, h in list(replaced.items()):
        if h is _note_startup:
            replaced[sig] = _STARTUP_OLD.pop(sig, h)
    noted = list(STARTUP_SIGNALS)
    STARTUP_SIGNALS.clear()
    return noted


class child_signals:
    """While a child process runs (the torchtitan config-module child, a ``--run-script`` bash): SIGINT and
    SIGTERM raise KeyboardInterrupt in the main thread, whatever their handling was (a SIGINT that the shell
    ignored for a ``cmd &`` job included, as ``run``'s :func:`autotune.cli.options.early_signals` does), so the
    caller's clean-up kills the child's process group at once; :attr:`signum` is the signal that arrived (None
    when none did). The previous handlers come back on exit. Elsewhere than the main thread it does nothing.

    Example::

        with child_signals() as sigs:
            try:
                proc.wait(timeout=...)
            except KeyboardInterrupt:
                kill_group(proc)
                raise Interrupted(sigs.signum or signal.SIGINT, "...")
    """

    def __enter__(self) -> "child_signals":
        import signal
        import threading

        self.signum: int | None = None
        self._old: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return self

        def _raise(signum: int, frame: Any) -> None:
            if self.signum is None:
                self.signum = int(signum)
            raise KeyboardInterrupt(f"signal {signum}")

        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, _raise)
            except (ValueError, OSError):
                continue
        return self

    def __exit__(self, *exc: Any) -> None:
        import signal

        for sig, old in self._old.items():
            try:
                signal.signal(sig, old)
            except (ValueError, OSError):
                pass


def signal_name(signum: int) -> str:
    """``"SIGTERM"`` for 15, ``"SIGINT"`` for 2 (:class:`signal.Signals`), ``"signal N"`` otherwise."""
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
