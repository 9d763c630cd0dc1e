"""autotune's own runtime as an engine: ``facts.yaml`` (the engine profile) and :mod:`.export` (its launch:
``autotune validate plan.yaml``). Its runner is the real backend itself (:mod:`autotune.runtime`, a layer of
its own because the measured backend shares its model code); it reads no user launches and writes no log
of its own format. Reached through :mod:`autotune.engines.registry`.
"""
