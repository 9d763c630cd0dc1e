"""What is tuned: the model, the hardware, the plan and the engine that runs it.

* :mod:`autotune.spec.models`: :class:`ModelSpec`, the Llama 3.x catalog and HF ``config.json`` import.
* :mod:`autotune.spec.hardware`: GPUs, fabrics (link tiers), clusters and fabric fingerprints
  (``data/gpus.yaml``, ``data/fabrics.yaml``).
* :mod:`autotune.spec.plan`: :class:`Plan`, :class:`Workload`, :class:`PlanDocument` and plan validation.
* :mod:`autotune.spec.engines`: engine profiles (``engines/<engine>/facts.yaml``: what Megatron-LM, torchtitan and
  the native runtime do, with sources) and error bands.
* :mod:`autotune.spec.validate`: checks of user-given numbers and names.

Imports only :mod:`autotune.errors` and :mod:`autotune.files` from autotune (the bottom layer).
"""
