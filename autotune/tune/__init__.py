"""Tuning: the loop (:mod:`.tuner`, the :class:`~autotune.tune.tuner.Tuner`), N worker processes on one study
(:mod:`.workers`), warm-started re-tuning for a slower fabric (:mod:`.retune`) and the simulator's screen
before real engine trials (:mod:`.screen`). Each module is a layer of its own (docs/architecture.md); this
``__init__`` imports nothing, so importing one does not load the others.
"""
