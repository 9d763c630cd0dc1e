"""What an engine provides to autotune: :class:`EngineParts`, one per engine folder.

Lifecycle of an engine in autotune (each part is used only when a command needs it, imported by
:mod:`autotune.engines.registry` then, so a simulated run never imports a runner):

1. **facts** (``facts.yaml`` in the engine's folder): read once per process into an
   :class:`autotune.spec.engines.EngineProfile`, which the cost model, the memory model and the search space
   read (what the engine keeps per parameter, fuses, recomputes, which ZeRO stages, schedules and
   precisions it runs);
2. **export** (a module with ``launch_command(doc, *, plan_file) -> LaunchCommand`` (below),
   ``launch_refusal(model, seq_len) -> str | None`` (what ``autotune run`` says at its start about this
   engine's launch files), ``EXTRA_FILES`` (names of the files it writes beside ``plan.yaml`` and the launch
   scripts) and ``extra_files(doc) -> {name: text}``): ``autotune export`` and the end of ``autotune run``;
3. **importer** (a module with ``import_launch(path, *, num_gpus) -> autotune.engines.imported.ImportedLaunch``
   and ``FILE_SUFFIXES``, the launch-file suffixes it claims when ``--from-*`` detects a format; one importer
   claims none and reads everything else): ``simulate --from-<engine>`` and ``run --compare-to``, a user's
   launch read back as a plan;
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


@dataclass(frozen=True)
class LaunchCommand:
    """What a launch script runs on one node.

    Attributes:
        program: argv before the per-engine arguments (``$MEGATRON_LM/pretrain_gpt.py`` or
            ``-m torchtitan.train``), shell words (``$VAR`` expanded by the script).
        args: argv tokens after it (literal).
        env: environment variables to export (literal values).
        notes: comment lines for the script header.
        use_torchrun: False for ``native`` (``autotune validate`` starts its own workers).
        prelude: the engine's own shell lines before the command (fixed text, no input): where
            Megatron-LM's checkout is, torchtitan's config module on ``PYTHONPATH``.
    """

    program: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()
    use_torchrun: bool = True
    prelude: tuple[str, ...] = ()


__all__ = ["EngineParts", "LaunchCommand"]
