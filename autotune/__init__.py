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
