"""What an engine provides to autotune: :class:`EngineParts`, one per engine folder.

Lifecycle of an engine in autotune (each part is used only when a command needs it, imported by
:mod:`autotune.engines.registry` then, so a simulated run never imports a runner):

1. **facts** (``facts.yaml`` in the engine's folder): read once per process into an
   :class:`autotune.spec.engines.EngineProfile`, which the cost model, the memory model and the search space
   read (what the engine keeps per parameter, fuses, recomputes, which ZeRO stages, schedules and
   precisions it runs);
2. **export** (a module with ``launch_command(doc, *, plan_file) -> autotune.export.LaunchCommand``,
   ``model_refusal(model, seq_len) -> str | None`` and the engine's own launch files): ``autotune export``
   and the end of ``autotune run``;
3. **importer** (a module with ``import_launch(path, *, num_gpus) -> autotune.export.imported.ImportedLaunch``):
   ``simulate --from-<engine>`` and ``run --compare-to``, a user's launch read back as a plan;
4. **runner** (module, class): an :class:`autotune.cost.evaluator.Evaluator` that runs a trial for real
   (``--backend real --engine <name>``), with the module functions ``check_engine()`` (raises if the
   engine is not installed) and ``run_key(model, workload, layers)`` (plans with equal keys launch the
   same job);
5. **log**: the module that parses the engine's training log into step records (used by the runner and by
   ``autotune validate``).

An engine lacks a part by leaving it None (the native runtime has no importer and is run by the real
backend itself).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineParts:
    """Where one engine's parts live (module paths, imported on use).

    Attributes:
        name: the engine name (``--engine``, ``PlanDocument.engine``).
        folder: the engine's folder under ``autotune/engines/`` (its ``facts.yaml`` is there).
        export: module path of its export (plan -> launch files), or None.
        importer: module path of its launch reader (launch -> plan), or None.
        runner: (module path, class name) of its real-trial evaluator, or None when the real backend's
            own runtime runs it.
        log: module path of its training-log parser, or None.
        import_format: the ``--from-*`` format name its importer reads (``megatron``, ``torchtitan``), or None.
    """

    name: str
    folder: str
    export: str | None = None
    importer: str | None = None
    runner: tuple[str, str] | None = None
    log: str | None = None
    import_format: str | None = None


__all__ = ["EngineParts"]
