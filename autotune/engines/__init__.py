"""The training engines autotune predicts for, exports to, reads launches of and runs: one folder each.

* :mod:`autotune.engines.megatron`: Megatron-LM / Megatron-Core;
* :mod:`autotune.engines.torchtitan`: torchtitan;
* :mod:`autotune.engines.native`: autotune's own runtime (:mod:`autotune.runtime`).

Each folder holds what is specific to its engine: ``facts.yaml`` (what it does in a step, every fact with
its source), its export (plan -> launch files), its import (launch -> plan), its real-trial runner and its
log parser, as far as the engine has each (:class:`autotune.engines.base.EngineParts`). The other packages
reach an engine only through :mod:`autotune.engines.registry`, by name; adding an engine is one folder and
one entry there (docs/architecture.md, "Adding an engine").

This package and each engine's ``__init__`` import nothing, so reading an engine's facts or importing one
of its modules loads nothing else of the engine.
"""
