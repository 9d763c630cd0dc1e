"""Real GPU timing: ``autotune profile`` and the measured op cost model (issue 3).

Modules:

* :mod:`~autotune.profiling.store`: SQLAlchemy tables ``profile_*`` (beside Optuna's) holding kernel,
  collective, overlap and reclaim timings per environment; export/import of calibration YAML.
* :mod:`~autotune.profiling.shapes`: the per-rank GEMM and attention shapes Llama plans produce.
* :mod:`~autotune.profiling.measure`: the timing harness (CUDA events or ``perf_counter``) and the
  kernel measurements.
* :mod:`~autotune.profiling.nccl_bench`: a ``torchrun`` worker timing collectives per tier.
* :mod:`~autotune.cli.profile`: the ``profile`` click command.
* :mod:`~autotune.profiling.measured`: :class:`MeasuredCosts` and ``MeasuredEvaluator``.

No module of this package imports torch at import time.
"""
