"""The ``autotune`` command line (click): :data:`main` is the entry point (``autotune = autotune.cli:main``).

Importing this package registers every command on :data:`autotune.cli.app.main`: one module per command
group, shared option sets in :mod:`autotune.cli.options`.
"""

import os as _os
import sys as _sys

if _os.path.basename(_sys.argv[0]) in ("autotune", "__main__.py"):
    # the ``autotune`` command (console script, ``python -m autotune``), not a library import: note SIGINT /
    # SIGTERM before the slow imports below (autotune.signals.install_startup_handlers)
    from autotune.signals import install_startup_handlers

    install_startup_handlers()

from autotune.cli import export, inspect, plan, repair, simulate, tune  # noqa: E402,F401 - registers the commands
from autotune.cli.app import main  # noqa: E402

__all__ = ["main"]
