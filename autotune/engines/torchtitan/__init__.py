"""torchtitan: ``facts.yaml`` (the engine profile), :mod:`.export` (a plan as a torchtitan >= 0.3 config module),
:mod:`.importer` (a user's TOML or config module as a plan), :mod:`.job` (a plan as a 0.2.x job file),
:mod:`.runner` (real trials through torchtitan's trainer), :mod:`.log` (its training log), :mod:`.flavors`
(imported by torchtitan itself, never by autotune) and :mod:`.block_saved` (what its block keeps for backward,
measured; read by the memory model). Reached through :mod:`autotune.engines.registry`.
"""
