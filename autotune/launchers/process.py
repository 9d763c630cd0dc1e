"""What the local and the Slurm launchers share: SIGTERM as an interrupt while a trial runs, and the
phase files its ranks write (moved from ``runtime/launch.py``, which the Slurm launcher imported while it
imported the Slurm launcher)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any


class sigterm_as_interrupt:
    """While active (main thread only), SIGTERM raises KeyboardInterrupt, so the launch cleanup runs."""

    def __enter__(self) -> "sigterm_as_interrupt":
        import threading

        self._prev = None
        if threading.current_thread() is threading.main_thread():
            def _raise(signum: int, frame: Any) -> None:
                raise KeyboardInterrupt(f"signal {signum}")
            self._prev = signal.signal(signal.SIGTERM, _raise)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._prev is not None:
            signal.signal(signal.SIGTERM, self._prev)


def read_phases(phase_dir: Path) -> dict[int, str]:
    """{rank: phase} from the ``phase.rank<N>`` files the ranks of a trial write in ``phase_dir`` (torn
    ``.tmp`` files and unreadable ones skipped), sorted by rank."""
    out = {}
    for f in phase_dir.glob("phase.rank*"):
        if f.name.endswith(".tmp"):
            continue
        try:
            out[int(f.name[len("phase.rank"):])] = f.read_text().strip()
        except (OSError, ValueError):
            pass
    return dict(sorted(out.items()))
