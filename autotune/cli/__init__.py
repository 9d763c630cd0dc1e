"""The ``autotune`` command line (click): :data:`main` is the entry point (``autotune = autotune.cli:main``).

Importing this package registers every command on :data:`autotune.cli.app.main`: one module per command
group, shared option sets in :mod:`autotune.cli.options`.
"""

from autotune.cli import export, inspect, plan, repair, simulate, tune  # noqa: F401 - registers the commands
from autotune.cli.app import main

__all__ = ["main"]
