"""autotune: find the parallelism plan with the highest MFU for an LLM on a GPU cluster.

The package is layered; each layer imports only the layers below it (``pyproject.toml``
``[tool.importlinter]``, checked in CI; docs/architecture.md):

    cli -> tune (retune, screen -> workers -> tuner), report -> engines' runners, runners
        -> runtime, profiling -> engines' importers -> launchers, export -> engines' exports
        -> engines' shared helpers -> study -> search -> cost -> engines.torchtitan.block_saved -> spec
        -> engines.registry -> engines.base -> signals, logs, files, errors

Each training engine's knowledge lives in one folder, ``autotune/engines/<engine>/``, reached through
:mod:`autotune.engines.registry`.
"""

import os as _os  # already imported by the interpreter's start-up (never from the working directory)
import sys as _sys  # built in


def _drop_working_directory() -> None:
    """Under ``python -m autotune`` take the working directory off the front of ``sys.path``, before autotune
    imports anything: ``-m`` puts it first (Python docs, "Command line and environment", ``-m``), so a
    ``json.py``, ``yaml.py``, ``typing.py`` or ``click.py`` in the folder the command runs from would be
    imported in place of the real module and run. ``sys.argv[0]`` is ``"-m"`` while the package is being
    imported this way (the same docs). Only the entry for the working directory is touched; autotune's own
    modules are found through the package's ``__path__``. When autotune itself was found there (``python -m
    autotune`` in an uninstalled source checkout) the entry moves to the end instead, so that the standard
    library and installed packages come first and worker processes (which get this ``sys.path``) still find
    autotune; a module in that folder whose name nothing installed has (an optional package that is not
    installed) can then still be imported from it. Modules the interpreter imported before this point (``os``,
    ``sys``, ``runpy``'s imports, ``site``'s) came from the standard library already. What remains is in the
    README ("Running from a folder of your files"): the ``autotune`` command or ``python -I -m autotune`` avoid
    the issue altogether; a library user's own script decides its ``sys.path`` itself."""
    if not _sys.argv or _sys.argv[0] != "-m" or not _sys.path:
        return
    first = _sys.path[0]
    try:
        cwd = _os.getcwd()
    except OSError:         # the working directory was removed: nothing can be imported from it anyway
        cwd = None
    if first in ("", ".") or (cwd is not None and _os.path.realpath(first) == _os.path.realpath(cwd)):
        del _sys.path[0]
        here = _os.path.dirname(_os.path.dirname(_os.path.realpath(__file__)))
        if _os.path.realpath(first or ".") == here:
            _sys.path.append(first)


_drop_working_directory()
