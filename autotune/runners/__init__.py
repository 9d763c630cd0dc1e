"""What every engine runner shares (issue 23): a real trial through the trainer users launch, read back.

* :mod:`autotune.runners.engine_runner`: :class:`~autotune.runners.engine_runner.EngineRunner`, the lifecycle of
  one engine trial (one session per trial or a Slurm batch job, failure classification, the result), which each
  engine's runner (``autotune/engines/<engine>/runner.py``) subclasses;
* :mod:`autotune.runners.assets`: the synthetic tokenizer and dataset engine runs use (nothing downloaded).

The engines' own runners, log parsers, job files and torchtitan's flavours live in their folders
(``autotune/engines/megatron/``, ``autotune/engines/torchtitan/``). Nothing here imports torch or an engine at
module level.
"""
