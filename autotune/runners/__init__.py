"""Real trials through the engines users launch (issue 23): run a plan with the engine's own trainer
and read back what it measured.

* :mod:`autotune.engines.torchtitan.log`: per-step records from torchtitan's trainer log (step, loss,
  grad norm, peak reserved memory, tokens/s, TFLOP/s, MFU);
* :mod:`autotune.engines.torchtitan.job`: a plan as a torchtitan 0.2.x job file (TOML, the format of the
  releases that run on torch 2.11) from the settings of :mod:`autotune.engines.torchtitan.export`, and the
  command line that trains it;
* :mod:`autotune.engines.torchtitan.flavors`: imported by torchtitan itself
  (``--experimental.custom_import``), it registers depth-truncated Llama 3 flavours (``8B_L16``: the 8B
  widths, 16 layers) for proxy runs on few GPUs.

Nothing here imports torch or torchtitan at module level except ``torchtitan_flavors``, which only
torchtitan's trainer imports.
"""
