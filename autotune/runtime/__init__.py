"""The real runtime: a Llama 3.1 training step executed under a :class:`~autotune.spec.plan.Plan`.

Modules (all import torch; nothing here is imported by the CLI or the simulator at import time):

* :mod:`autotune.runtime.model`: the Llama 3.1 architecture (RMSNorm, RoPE with Llama 3 scaling,
  GQA attention through ``scaled_dot_product_attention``, SwiGLU, untied LM head), any width, depth
  truncatable.
* :mod:`autotune.runtime.parallelize`: device mesh and TP/SP (DTensor), PP
  (``torch.distributed.pipelining``), DP (FSDP2 ``fully_shard`` or DDP / ZeRO-1), CP
  (``context_parallel``, CUDA only), recomputation and the overlap / reclaim settings of a plan.
* :mod:`autotune.runtime.worker`: the torchrun entry point that times a plan and writes JSON.
* :mod:`autotune.runtime.launch`: :func:`run_plan`, the subprocess launcher with timeout, OOM and
  crash classification.
"""
