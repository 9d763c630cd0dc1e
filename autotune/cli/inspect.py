"""``autotune show`` (best plan per study) and ``autotune plot`` (a study's plots)."""

from __future__ import annotations

import click

from autotune.cli.app import main
from autotune.cli.options import ASCII_INT, DEFAULT_STORAGE, JSON_OPTION, json_entry
from autotune.errors import ConfigError, redact


@main.command()
@click.argument("study", required=False)
@click.option("--storage", default=None, help="Optuna storage URL (default sqlite:///studies/autotune.db).")
@click.option("--engine", default=None, help="Only studies of this engine (megatron, torchtitan, native).")
@click.option("--top", "top", type=ASCII_INT, default=None,
              help="The best N feasible plans of one study (STUDY, or the only study in the storage), each with "
                   "its table and step-time breakdown.")
@JSON_OPTION
def show(study, storage, engine, top, as_json):
    """List the best plan per model size and interconnect found in the storage (one row per study);
    with STUDY --top N, the best N feasible plans of that study.

    Example: autotune show llama3.1-8b/b200x8/nvlink5+ib-ndr400/megatron/seq8192-gbs128 --top 5
    """
    from pathlib import Path

    from autotune.report.summary import format_studies, short_plan
    from autotune.study.identity import list_studies, load_study
    from autotune.study.storage_check import readonly_url, sqlite_path, storage_errors
    from autotune.study.stale import FAULT_PREFIX, count_stale_failed, pending_notes
    from autotune.study.trials import best_plan, failure_summary
    storage = storage if storage is not None else DEFAULT_STORAGE
    if storage == DEFAULT_STORAGE and not Path(sqlite_path(storage)[0]).exists():
        # the default storage before any `autotune run`: nothing to list, and nothing is created
        click.echo(f"no autotune studies in {redact(storage)}; run `autotune run --size 8b`")
        return
    ro_storage = readonly_url(storage)
    if engine is not None:
        from autotune.spec.engines import get_engine
        get_engine(engine)
    if top is not None or study is not None:
        _show_top(study, storage, ro_storage, 1 if top is None else top, as_json)
        return
    with storage_errors(ro_storage):
        rows = []
        entries = []
        others: set[str] = set()
        stale_notes: list[str] = []
        waiting = {t["trial_id"]: t for t in pending_notes(storage)}    # reasons a full disk could not take
        for info in list_studies(ro_storage):
            if engine is not None and info.engine != engine:
                others.add(info.engine)
                continue
            st, info = load_study(info.name, ro_storage)
            bp = best_plan(st, info)
            trials = st.get_trials(deepcopy=False)
            n_stale = count_stale_failed(trials)
            n_running = sum(1 for t in trials if t.state.name == "RUNNING")
            noted = [(t, waiting[t._trial_id]) for t in trials if t.state.name == "RUNNING" and t._trial_id in waiting]
            n_fault = count_stale_failed(trials, FAULT_PREFIX)
            if n_stale or n_running > len(noted):
                stale_notes.append(f"{info.name}: {n_stale} trial(s) of dead workers marked failed"
                                   + (f", {n_running - len(noted)} running now (or left by a worker killed since; "
                                      "the next `autotune run` on it fails those)" if n_running > len(noted) else ""))
            if n_fault:
                why = next(str(t.user_attrs["fail_reason"]) for t in trials if t.state.name == "FAIL"
                           and str(t.user_attrs.get("fail_reason", "")).startswith(FAULT_PREFIX))
                stale_notes.append(f"{info.name}: {n_fault} trial(s) stopped by a storage fault, e.g. "
                                   f"{why.removeprefix(FAULT_PREFIX)}")
            for t, n in noted:
                stale_notes.append(f"{info.name}: trial {t.number} stopped by a storage fault recorded at "
                                   f"{n['recorded_at']} ({n['reason'].removeprefix(FAULT_PREFIX)}); the next `autotune run` "
                                   "on this storage marks it failed with that reason")
            if as_json:
                entries.append(json_entry(plan=bp.plan if bp else None, result=bp.result if bp else None, info=info,
                                      engine=info.engine, label="best", study=info.name,
                                      trial=bp.trial_number if bp else None, extra={"n_trials": len(trials)}))
                continue
            row = {"model": info.model.name, "gpus": f"{info.num_gpus}x{info.gpu}", "fabric": info.fabric_name,
                   "engine": info.engine, "backend": info.backend, "workload": info.workload.label,
                   "n_trials": len(trials), "study": info.name}
            if bp is None:
                n_bad, n, _ = failure_summary(trials)
                row.update(mfu="none", step="-", plan=f"no feasible plan ({n_bad}/{n} trials pruned, OOM or failed)")
            else:
                row.update(mfu=f"{100 * bp.result.mfu:.1f}%", step=f"{bp.result.step_time_ms:,.0f}",
                           plan=short_plan(bp.plan))
            rows.append(row)
    if as_json:
        from autotune.report.summary import json_document
        entries.sort(key=lambda e: (e["target"]["model"], e["target"]["num_gpus"], e["study"]))
        click.echo(json_document("show", entries, storage=redact(storage)))
        return
    rows.sort(key=lambda r: (r["model"], r["gpus"], r["workload"], r["fabric"]))
    if not rows and others:
        click.echo(f"no {engine} studies in {redact(storage)}; it holds studies of engine {', '.join(sorted(others))} "
                   "(leave --engine out to list them)")
        return
    click.echo(format_studies(rows) if rows else f"no autotune studies in {redact(storage)}; run `autotune run --size 8b`")
    for note in stale_notes:
        click.echo(note)



def _show_top(study, storage, ro_storage, top, as_json) -> None:
    """``show [STUDY] --top N``: the N best distinct feasible plans of one study, best first, each as the
    best-plan table (degrees, settings, step time, MFU, memory, breakdown); ``--json``: one entry per plan,
    ``label`` ``top1`` .. ``topN`` (docs/json-schema.md).

    Raises:
        ConfigError: N < 1; no STUDY while the storage holds other than one study; a study with no
            feasible plan.
    """
    from autotune.report.summary import format_best_plan, json_document
    from autotune.study.identity import list_studies, load_study
    from autotune.study.storage_check import storage_errors
    from autotune.study.trials import (rank_basis, band_note, feasible_trials, require_best_plan,
                                       top_feasible_trials, trial_plan, trial_result)

    if top < 1:
        raise ConfigError(f"--top {top}: give a number of plans >= 1")
    with storage_errors(ro_storage):
        if study is None:
            names = [i.name for i in list_studies(ro_storage)]
            if len(names) != 1:
                raise ConfigError(f"--top needs a STUDY: {storage} holds {len(names)} studies; name one "
                                  f"(`autotune show` lists them in its last column)")
            study = names[0]
        st, info = load_study(study, ro_storage)
        require_best_plan(st, info, storage)          # no feasible plan: the reason, exit 2
        trials = top_feasible_trials(st, top, rank_basis(info), info.engine)
        note = band_note(feasible_trials(st), trials[0].number, rank_basis(info)) if trials else None
    if as_json:
        entries = [json_entry(plan=trial_plan(t), result=trial_result(t), info=info, engine=info.engine,
                              label=f"top{i}", study=info.name, trial=t.number) for i, t in enumerate(trials, 1)]
        click.echo(json_document("show", entries, storage=redact(storage)))
        return
    n = len(st.get_trials(deepcopy=False))
    click.echo(f"study {info.name}: the {len(trials)} best feasible plans of {n} trials"
               + (f" (only {len(trials)} distinct feasible plans)" if len(trials) < top else ""))
    if note:
        click.echo(note)
    for i, t in enumerate(trials, 1):
        click.echo("")
        click.echo(format_best_plan(plan=trial_plan(t), result=trial_result(t), model=info.model, engine=info.engine,
                                    gpu=info.gpu, title=f"#{i}: trial {t.number}, MFU {100 * t.value:.1f}%"))


@main.command()
@click.argument("study", required=False)
@click.option("--storage", default=DEFAULT_STORAGE, show_default=True, help="Optuna storage URL.")
@click.option("-o", "--output", "out_dir", default="plots", show_default=True, type=click.Path(file_okay=False),
              help="Directory for the plots.")
def plot(study, storage, out_dir):
    """Plot a study: MFU history with best-so-far, parameter importances, MFU vs peak memory, per-knob effects.

    HTML (plotly) and PNG (matplotlib), whichever is installed (pip install -e '.[plot]' (in the autotune checkout)). STUDY is a
    study name (see `autotune show`); without it, the storage must hold exactly one study.

    Example: autotune plot -o plots/
    """
    from autotune.report.plots import write_study_plots
    from autotune.study.identity import list_studies, load_study
    from autotune.study.storage_check import readonly_url, storage_errors

    given, storage = storage, readonly_url(storage)
    with storage_errors(storage):
        if study is None:
            names = [i.name for i in list_studies(storage)]
            if not names:
                raise ConfigError(f"no studies in {given} yet; run `autotune run --size 8b` first")
            if len(names) != 1:
                shown = ", ".join(names[:10]) + (f", ... ({len(names) - 10} more)" if len(names) > 10 else "")
                flag = "" if given == DEFAULT_STORAGE else f" --storage {given}"
                raise ConfigError(f"{len(names)} studies in {given}; name one as the STUDY argument, e.g. "
                                  f"`autotune plot {names[0]}{flag} -o {out_dir}` (`autotune show{flag}` lists "
                                  f"them): {shown}")
            study = names[0]
        st, _ = load_study(study, storage)
        from autotune.files import check_output_path
        from autotune.report.plots import plot_file_names
        check_output_path(out_dir, what="-o", directory=True, names=plot_file_names())
        paths = write_study_plots(st, out_dir)
    click.echo(f"wrote {len(paths)} files to {out_dir}: " + ", ".join(p.name for p in paths))


