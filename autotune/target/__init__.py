"""What is tuned: the model, the hardware, the plan and the engine that runs it.

* :mod:`autotune.target.models`: :class:`ModelSpec`, the Llama 3.x catalog and HF ``config.json`` import.
* :mod:`autotune.target.hardware`: GPUs, fabrics (link tiers), clusters and fabric fingerprints
  (``data/gpus.yaml``, ``data/fabrics.yaml``).
* :mod:`autotune.target.plan`: :class:`Plan`, :class:`Workload`, :class:`PlanDocument` and plan validation.
* :mod:`autotune.target.engines`: engine profiles (``data/engines.yaml``: what Megatron-LM, torchtitan and
  the native runtime do, with sources) and error bands.
* :mod:`autotune.target.validate`: checks of user-given numbers and names.

Imports only :mod:`autotune.errors` and :mod:`autotune.files` from autotune (the bottom layer).
"""
