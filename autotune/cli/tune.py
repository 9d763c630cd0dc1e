"""``autotune run`` (tune a target) and ``autotune retune`` (re-tune for a slower fabric, warm-started)."""

from __future__ import annotations

import click

from autotune.cli.app import main
from autotune.cli.compare import compare_options, script_options, script_run
from autotune.cli.options import (
    ASCII_INT,
    DEFAULT_STORAGE,
    JSON_OPTION,
    check_tune_options,
    check_worker_id,
    check_workers,
    early_signals,
    interruptible,
    json_entry,
    make_evaluator_options,
    make_say,
    print_outcomes,
    prog_name,
    real_options,
    resolve_target,
    study_options,
    target_line,
    target_options,
    tune_options,
    warn_real_only_options,
)
from autotune.errors import ConfigError, NoFeasiblePlanError, redact
from autotune.files import withhold_private


@main.command()
@target_options
@study_options
@tune_options
@real_options
@click.option("--engine-logs", "engine_logs", type=click.Path(file_okay=False), default=None,
              help="--backend real --engine torchtitan|megatron: keep every trial's trainer log and job file in "
                   "this folder.")
@click.option("--no-early-stop", "no_early_stop", is_flag=True,
              help="Run all --trials trials (no convergence stop: docs/search.md).")
@click.option("--moe-routing", "moe_routing", type=click.Choice(["balanced", "trained"]), default=None,
              help="--backend real --engine torchtitan, MoE models: balanced (the default) forces every expert the "
                   "same tokens (torchtitan's debug.moe_force_load_balance, the routing the simulator assumes); "
                   "trained runs the router as it is.")
@compare_options
@script_options
@JSON_OPTION
def run(size, model_path, gpu, gpus, interconnect, seq_len, global_batch, storage, space, backend, engine, trials,
        timeout, seed, workers, worker_id, layers, real_steps, trial_timeout, heartbeat_interval, launcher, nodes,
        gpus_per_node, partition, account, time_limit, engine_logs, no_early_stop, moe_routing, compare_to,
        compare_format, as_json, run_script, script_args, script_env):
    """Tune a plan (adds trials to the study, resuming it if it exists) and print the best plan.

    With --backend real --engine torchtitan (or megatron) every trial runs that engine's own trainer; the
    simulator screens the space first and only plans predicted to fit, in the top of its ranking, are run.

    Example: autotune run --size 405b --trials 200
    """
    early_signals()
    from autotune.report.summary import format_best_plan
    from autotune.tune.tuner import Tuner

    imported = None
    if compare_to is None and (run_script or script_args or script_env):
        raise ConfigError("--run-script, --script-args and --script-env read the launch script of --compare-to; give it")
    if compare_to is not None:
        # the user's launch is read (and refused) before any trial runs; its target is the run's
        from autotune.cli.compare import imported_target, read_launch
        imported = read_launch(compare_to, compare_format, gpus, script_run(run_script, script_args, script_env))
        gpus = gpus if gpus is not None else imported.num_gpus    # a launch's --nnodes x --nproc-per-node
        model, cluster, workload = imported_target(imported, size=size, model_path=model_path, gpu=gpu, gpus=gpus,
                                                   interconnect=interconnect, seq_len=seq_len,
                                                   global_batch=global_batch)
        engine = engine if engine is not None else imported.engine
    elif compare_format is not None:
        raise ConfigError("--compare-format applies to --compare-to FILE")
    else:
        model, cluster, workload = resolve_target(size=size, model_path=model_path, gpu=gpu, gpus=gpus,
                                                  interconnect=interconnect, seq_len=seq_len,
                                                  global_batch=global_batch)
    # option checks before the memory check, so a misplaced option is named first
    if moe_routing is not None and not (backend == "real" and engine == "torchtitan" and model.is_moe):
        raise ConfigError(f"--moe-routing {moe_routing} applies to --backend real --engine torchtitan with an MoE "
                          "model only")
    check_tune_options(space=space, backend=backend, trials=trials, timeout=timeout, seed=seed, storage=storage,
                       real_steps=real_steps, trial_timeout=trial_timeout, layers=layers)
    evaluator_options = make_evaluator_options(backend, layers, real_steps, trial_timeout, launcher, nodes, gpus_per_node,
                                               partition, account, time_limit, num_gpus=cluster.num_gpus)
    _check_state_fits(model, cluster, engine, backend, layers)
    check_workers(workers, storage, backend=backend, launcher=launcher)
    wid = check_worker_id(worker_id, workers)
    from autotune.study.storage import check_heartbeat
    check_heartbeat(heartbeat_interval, storage, backend)   # before any study is created
    warn_real_only_options(backend)
    tuner_kwargs = dict(model=model, cluster=cluster, workload=workload, space=space, storage=storage, backend=backend,
                        seed=seed, engine=engine,
                        evaluator_options=evaluator_options)
    say = make_say(as_json)
    screen = None
    routing = {}
    if backend == "real" and engine == "torchtitan" and model.is_moe:
        routing = {"force_load_balance": moe_routing != "trained"}
        say("MoE routing: " + ("balanced: torchtitan's debug.moe_force_load_balance gives every expert the same "
                               "tokens (the simulator's assumption; --moe-routing trained runs the router as it is)"
                               if moe_routing != "trained" else
                               "the router as trained (--moe-routing trained); the simulator still assumes balanced "
                               "routing, so predictions are for balanced experts"))
    if backend == "real" and engine is not None and engine != "native":
        screen = _engine_screen(model, cluster, workload, space=space, engine=engine, seed=seed, trials=trials,
                                layers=layers, workers=workers, launcher=launcher, say=say, **routing)
        tuner_kwargs["evaluator_options"].update(only_plans=screen.plans, log_dir=engine_logs, **routing)
    elif engine_logs is not None:
        raise ConfigError("--engine-logs applies to --backend real with --engine torchtitan or megatron only")

    def _open() -> Tuner:
        t = Tuner(**tuner_kwargs)
        for line in t.bound.forced_off:
            click.echo(f"warning: {withhold_private(line)}", err=True)
        say(f"tuning {target_line(model, cluster, workload)}")
        say(f"study {t.name!r} in {redact(storage)}; search space {t.space.name!r}; backend {backend}; "
            f"engine {t.engine.name}; {trials} trials" + (f" x {workers} workers" if workers > 1 else "")
            + ("" if no_early_stop else " at most (stops early once converged)")
            + (f", timeout {timeout:g} s" if timeout else ""))
        refusal = _launch_refusal(t.engine.name, model, workload)
        if refusal:
            click.echo(f"warning: {refusal}; the tuned plan can be exported as YAML, not as {t.engine.name} launch "
                       "files", err=True)
        return t

    # a signal while the study is being opened (the storage file may already exist) ends the run the
    # same way as one during tuning, not with a traceback
    from autotune.search.space import SearchSpace
    from autotune.study.identity import study_name
    from autotune.spec.engines import resolve_engine
    loaded_space = SearchSpace.load(space)
    for line in loaded_space.no_effect_warnings():
        click.echo(f"warning: {withhold_private(line)}", err=True)
    name = study_name(model, cluster, workload, space_name=loaded_space.name, backend=backend,
                      engine=resolve_engine(engine, backend).name)
    from autotune.signals import clear_interrupt
    clear_interrupt()   # one command, one interrupt: from here on every step is under interruptible
    if workers > 1:
        from autotune.study.identity import load_study
        from autotune.study.trials import require_best_plan
        from autotune.tune.workers import prepare_workers, run_workers

        def _open_and_run():
            # opening the study, creating it and running the workers under one handler: a signal that
            # arrives between two of these steps is not lost (issue: Ctrl-C 0.8 s after start was ignored)
            t = _open()
            # the backend first (no GPU for --backend real): a run that cannot evaluate anything must not
            # leave an empty study behind, as Tuner.optimize checks for one worker
            t.evaluator  # noqa: B018
            t.close()
            prepare_workers(t, workers, trials)     # the study opened, the layouts ranked: once, here
            # the space the parent loaded and checked (forked workers then parse no YAML)
            return t, run_workers({**tuner_kwargs, "space": t.space}, workers, n_trials=trials, timeout=timeout,
                                  first_worker_id=wid, heartbeat_interval_s=heartbeat_interval,
                                  stop_when_converged=not no_early_stop, study_checked=True)

        tuner, outcomes = interruptible(_open_and_run, storage=storage, study=name)
        bad = print_outcomes(outcomes, say)
        stops = [o.stop_reason for o in outcomes if o.stop_reason]
        if stops:       # each worker stopped on its own view: the latest one's (most trials seen), once
            stops.sort(key=_trials_seen)
            say(f"stopped early, {stops[-1]}; --no-early-stop runs every trial")
        from autotune.study.faults import with_retries
        # a server restarted while the workers ran: the parent's read is retried on a fresh connection
        study, info = with_retries(lambda: load_study(tuner.name, storage), storage, what="reading the study")
        # every worker has exited: a trial they left RUNNING (an orphan of a storage error) is failed with why
        from autotune.study.stale import reap_after_run
        with_retries(lambda: reap_after_run(study, url=storage), storage, what="failing the trials left running")
        trials_all = with_retries(lambda: study.get_trials(deepcopy=False), storage, what="reading the study")
        n_new = sum(o.n_new_trials for o in outcomes)
        say(f"{n_new} trial{'s' if n_new != 1 else ''} run by {workers} workers, {len(trials_all)} in the study")
        if not trials_all and timeout is not None and bad < workers:
            raise NoFeasiblePlanError(_timeout_before_first_trial(timeout))
        best = with_retries(lambda: require_best_plan(study, info, storage), storage, what="reading the study")
        if bad == workers:
            raise ConfigError(f"all {workers} workers stopped on an error (see above)")
        from autotune.study.trials import outcome_counts
        n_total, st = len(trials_all), outcome_counts(trials_all)
        stop_why = stops[-1] if stops else None
    else:
        tuner = interruptible(_open, storage=storage, study=name)
        if screen is not None:
            tuner.enqueue([_Queued(params, i) for i, (_, _, params) in enumerate(screen.kept)], source="screen")
        try:
            summary = interruptible(lambda: tuner.optimize(trials, timeout=timeout, worker_id=wid,
                                                            heartbeat_interval_s=heartbeat_interval,
                                                            stop_when_converged=not no_early_stop),
                                     storage=storage, study=tuner.name)
        except NoFeasiblePlanError:
            if timeout is not None and not tuner.study.get_trials(deepcopy=False):
                raise NoFeasiblePlanError(_timeout_before_first_trial(timeout)) from None
            raise
        finally:
            tuner.close()
        # a trial left RUNNING by a worker killed before this run (between a trial's creation and its stamp)
        # is failed with why, as after --workers runs
        from autotune.study.faults import with_retries
        from autotune.study.stale import reap_after_run
        with_retries(lambda: reap_after_run(tuner.study, url=storage), storage,
                     what="failing the trials left running")
        st, own = summary.states, summary.own_states
        stop_why = summary.stop_reason
        plural = "s" if summary.n_new_trials != 1 else ""
        say(f"{summary.n_new_trials} trial{plural} run by this worker (worker {summary.worker_id}: "
            f"{own.get('feasible', 0)} feasible, {own.get('infeasible', 0)} do not fit in memory, "
            f"{own.get('pruned', 0)} pruned (invalid), {own.get('failed', 0)} failed); "
            f"{summary.n_trials} in the study: {st.get('feasible', 0)} "
            f"feasible, {st.get('infeasible', 0)} do not fit in memory, {st.get('pruned', 0)} pruned (invalid), "
            f"{st.get('failed', 0)} failed")
        if summary.stop_reason:
            say(f"stopped early, {summary.stop_reason}; --no-early-stop runs every trial")
        if screen is not None:
            for line in _real_trial_lines(tuner.study):
                say(line)
        best = summary.best
        n_new, n_total = summary.n_new_trials, summary.n_trials
    yours = _compare(imported, best, model=model, cluster=cluster, workload=workload, backend=backend,
                     engine=tuner.engine.name) if imported is not None else None
    from autotune.study.identity import load_study
    from autotune.study.trials import rank_basis, band_note, feasible_trials
    feas = feasible_trials(load_study(best.study, storage)[0])
    same = _same_precision(imported, best, feas, model=model, cluster=cluster, workload=workload, backend=backend,
                           engine=tuner.engine.name) if yours is not None and yours[0].feasible else None
    if as_json:
        from autotune.report.summary import json_document
        entries = [json_entry(plan=best.plan, result=best.result, model=model, cluster=cluster, workload=workload,
                              engine=tuner.engine.name, label="best", study=best.study, trial=best.trial_number)]
        extra = {}
        if yours is not None:
            entries.append(json_entry(plan=imported.plan, result=yours[0], model=model, cluster=cluster,
                                      workload=workload, engine=imported.engine, label="yours",
                                      extra={"imported": imported.to_json()}))
            extra["mfu_gain_points"] = (100 * (yours[2].mfu - yours[0].mfu)) if yours[0].feasible else None
            extra["precision_change"] = best.plan.precision != imported.plan.precision
            if same is not None:
                ok = same[1] is not None and same[1].feasible
                extra["same_precision"] = {"precision": imported.plan.precision, "trial": same[0],
                                           "mfu": same[1].mfu if ok else None,
                                           "mfu_gain_points": 100 * (same[1].mfu - yours[0].mfu) if ok else None}
        click.echo(json_document("run", entries, trials={"new": n_new, "total": n_total, "states": dict(st),
                                                          "stop_reason": stop_why}, **extra))
        return
    click.echo("")
    click.echo(format_best_plan(plan=best.plan, result=best.result,
                                title=f"best plan: trial {best.trial_number} of {best.study}",
                                target=target_line(model, cluster, workload), engine=tuner.engine.name, model=model,
                                gpu=cluster.gpu.name))
    note = band_note(feas, best.trial_number, rank_basis(best.info))
    if note:
        click.echo(note)
    if yours is not None:
        import os

        from autotune.cli.compare import print_import_report
        from autotune.report.summary import format_comparison
        click.echo("")
        print_import_report(imported, click.echo)
        for w in yours[1]:
            click.echo(f"warning: your plan: {withhold_private(w)}", err=True)
        notes = []
        if same is not None:
            p = imported.plan.precision
            if same[0] is None:
                head = (f"in your precision ({p}): the study holds no {p} plan that fits (the search screens "
                        f"precisions by predicted speed); the tuned layout in {p}, predicted:")
                notes.append(f"{head} MFU {100 * same[1].mfu:.1f}% vs yours {100 * yours[0].mfu:.1f}%: "
                             f"{100 * (same[1].mfu - yours[0].mfu):+.1f} percentage points from the layout alone"
                             if same[1].feasible else f"{head} does not fit "
                             f"({same[1].infeasible_reason or 'over the GPU memory'})")
            elif same[0] != best.trial_number:
                notes.append(f"in your precision ({p}): best tuned plan trial {same[0]}, MFU {100 * same[1].mfu:.1f}% "
                             f"vs yours {100 * yours[0].mfu:.1f}%: {100 * (same[1].mfu - yours[0].mfu):+.1f} percentage "
                             f"points from the layout alone; the rest ({100 * (yours[2].mfu - same[1].mfu):+.1f}) "
                             f"from {best.plan.precision}")
        click.echo(format_comparison(("tuned", best.plan, yours[2], tuner.engine.name),
                                     (f"yours: {os.path.basename(imported.source)}", imported.plan, yours[0],
                                      imported.engine), notes))
    _print_attribution(best, imported, yours, model=model, cluster=cluster, workload=workload, backend=backend,
                       engine=tuner.engine.name)
    # the study name carries every option that selected it (GPU, fabric, workload, space, backend)
    import shlex
    if ":memory:" in storage:       # nothing is kept once this process ends: no export command can read it
        click.echo(f"\n{storage} keeps nothing after this run; to export the plan, run with --storage sqlite:///PATH")
        return
    click.echo(f"\nexport it: {prog_name()} export --study {shlex.quote(tuner.name)}"
               + (f" --storage {shlex.quote(redact(storage))}" if storage != DEFAULT_STORAGE else "") + " -o plan.yaml")



def _print_attribution(best, imported, yours, *, model, cluster, workload, backend, engine) -> None:
    """Which knob brings how much (autotune/report/attribution.py): from the user's ``--compare-to`` plan when
    given (and it fits), else from the published plan for this model, GPU and precision class at this GPU
    count and batch (autotune/data/published_frontier.yaml ``published_plans``; none: nothing printed), one knob
    at a time, simulated (the simulator after real trials, as ``--compare-to``)."""
    from autotune.report.attribution import attribute, format_attribution
    from autotune.spec.trust import published_plan

    if best.plan is None or not best.result.feasible:
        return
    if imported is not None and yours is not None and yours[0].feasible:
        base, label = imported.plan, "your plan"
    else:
        got = published_plan(model.name, cluster.gpu.name, best.plan.precision, cluster.num_gpus,
                             workload.global_batch_size, model.num_layers, engine)
        if got is None:
            return
        base, e = got
        label = (f"the published plan ({e['model']} on {e['num_gpus']} {e['gpu']}, {e['source']}; at "
                 f"{cluster.num_gpus} GPUs: DP {base.dp_degree})")
    if base == best.plan:
        return
    from autotune.cost.evaluator import make_evaluator

    from autotune.errors import AutotuneError

    how = backend if backend in ("simulated", "measured") else "simulated"
    try:
        ev = make_evaluator(how, model=model, cluster=cluster, workload=workload, engine=engine)
        try:
            b = ev.evaluate(base)
            gains, rest = attribute(base, best.plan, ev.evaluate)
            t = ev.evaluate(best.plan)
        finally:
            ev.close()
    except AutotuneError as e:      # the baseline cannot run on this engine / target: said, the run stands
        click.echo(f"\nno knob attribution from {label}: {str(e).splitlines()[0]}")
        return
    if not b.feasible:
        click.echo(f"\n{label} does not fit on this target ({b.infeasible_reason or 'over the GPU memory'}): no "
                   "knob attribution")
        return
    click.echo("")
    click.echo(format_attribution(label, gains, rest, b.mfu, t.mfu))


def _trials_seen(stop_reason: str) -> int:
    """The trial count a worker's stop line names ("converged after N trials"), -1 if it names none: the worker
    whose view had the most trials stopped last (convergence.py ``ConvergenceStop.convergence`` writes it)."""
    import re

    m = re.search(r"after (\d+) trials?", stop_reason)
    return int(m.group(1)) if m else -1


def _timeout_before_first_trial(timeout: float) -> str:
    return (f"--timeout {timeout:g} s ran out before the first trial (opening the study and ranking the layouts "
            "come first); give a longer --timeout, or leave it out")


def _launch_refusal(engine: str, model, workload) -> str | None:
    """Why ``autotune export --launcher`` will refuse to write ``engine``'s launch files for ``model`` (the
    export modules' ``model_refusal``, the same check), or None; said when the run starts, not after it."""
    from autotune.engines.registry import ENGINES, export_module

    if engine not in ENGINES:
        return None
    return export_module(engine).launch_refusal(model, workload.seq_len)


def _compare(imported, best, *, model, cluster, workload, backend, engine):
    """(the user's StepResult, its plan warnings, the tuned plan's StepResult on the same footing): both
    predicted by the run's backend, or by the simulator after real trials (a user's plan is not launched)."""
    from autotune.cli.compare import evaluate_imported

    how = backend if backend in ("simulated", "measured") else "simulated"
    mine, warnings = evaluate_imported(imported, model=model, cluster=cluster, workload=workload, backend=how)
    tuned = best.result
    if how != backend:
        tuned = _predict(best.plan, how, model=model, cluster=cluster, workload=workload, engine=engine)
    return mine, warnings, tuned


def _predict(plan, how, *, model, cluster, workload, engine):
    """``plan``'s StepResult from a fresh ``how`` evaluator (simulated / measured), closed after."""
    from autotune.cost.evaluator import make_evaluator

    ev = make_evaluator(how, model=model, cluster=cluster, workload=workload, engine=engine)
    try:
        return ev.evaluate(plan)
    finally:
        ev.close()


def _same_precision(imported, best, feas, *, model, cluster, workload, backend, engine):
    """(trial number, StepResult) of the study's best feasible plan (error-band order, as the best plan) in the
    precision of the user's launch, on the footing of :func:`_compare` (the simulator after real trials); when
    the study holds no feasible plan in that precision (the search may never try it: it screens precisions
    by predicted speed), (None, the tuned plan's layout in that precision, predicted; it may not fit)."""
    from autotune.study.trials import rank_basis, robust_order, trial_plan, trial_result

    if best.plan.precision == imported.plan.precision:
        return best.trial_number, None if not best.result.feasible else best.result
    same = [t for t in feas if trial_plan(t).precision == imported.plan.precision]
    if not same:     # none tried or none fits: the tuned layout in the user's precision, predicted (trial None)
        p = imported.plan.precision
        plan = best.plan.replace(precision=p, **({"fp8_param_gather": False} if p == "bf16" else {}))
        how = backend if backend in ("simulated", "measured") else "simulated"
        return None, _predict(plan, how, model=model, cluster=cluster, workload=workload, engine=engine)
    t = robust_order(same, rank_basis(best.info), k=1)[0]
    if backend in ("simulated", "measured"):
        return t.number, trial_result(t)
    return t.number, _predict(trial_plan(t), "simulated", model=model, cluster=cluster, workload=workload,
                              engine=engine)


class _Queued:
    """A screened plan's Optuna params in the shape :meth:`autotune.tune.tuner.Tuner.enqueue` reads."""

    def __init__(self, params, number):
        self.params, self.number = params, number


def _real_trial_lines(study) -> list[str]:
    """Every real engine trial of ``study`` with the simulator's prediction of the same plan beside it (the
    runner's ``details``: ``simulated_step_time_ms``, ``simulated_peak_memory_bytes``), one line each."""
    lines = ["measured vs predicted (the simulator, this engine's profile, the same plan):"]
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        d, p = a.get("details") or {}, a.get("plan") or {}
        if not p:
            continue
        head = (f"  trial {t.number}: mb {p.get('micro_batch_size')} x {p.get('num_micro_batches')}, "
                f"{p.get('precision')}, {'compile' if p.get('compile') else 'eager'}, recompute {p.get('recompute')}")
        ms, peak = a.get("step_time_ms"), a.get("peak_memory_bytes")
        if not ms or not a.get("feasible"):
            lines.append(f"{head}: {a.get('infeasible_reason') or a.get('fail_reason') or t.state.name}"[:240])
            continue
        sim_ms, sim_b = d.get("simulated_step_time_ms"), d.get("simulated_peak_memory_bytes")
        line = f"{head}: {ms:,.1f} ms, {peak / 2**30:.1f} GiB measured"
        if sim_ms:
            line += f"; predicted {sim_ms:,.1f} ms ({100 * (sim_ms - ms) / ms:+.1f}%)"
        if sim_b and peak:
            line += f", {sim_b / 2**30:.1f} GiB ({100 * (sim_b - peak) / peak:+.1f}%)"
        lines.append(line)
    return lines if len(lines) > 1 else []


def _engine_screen(model, cluster, workload, *, space, engine, seed, trials, layers, workers, launcher, say,
                   **key_options):
    """The simulator's screen before real engine trials (:func:`autotune.tune.screen.screen_plans`); prints
    its counts and the kept plans' predictions."""
    from autotune.engines.registry import runner_module
    from autotune.tune.screen import screen_plans
    from autotune.spec.engines import resolve_engine

    profile = resolve_engine(engine, "real")
    if workers > 1:
        raise ConfigError(f"--engine {profile.name} runs its screened trials one at a time; use --workers 1")
    # --launcher slurm: each trial is a batch job (autotune.runners.engine_runner); the engine must be
    # installed on the nodes as here (the same Python runs the job)
    # a missing engine is one error before any simulation (the runner checks again when it starts)
    runner = runner_module(profile.name)
    runner.check_engine()
    if (note := getattr(runner, "run_note", lambda: None)()):
        say(f"note: {note}")
    run_key = runner.run_key(model, workload, layers, **key_options)
    s = screen_plans(model=model, cluster=cluster, workload=workload, engine=profile, keep=trials, space=space,
                     seed=seed, layers=layers, run_key=run_key)
    say(s.summary())
    for plan, r, _ in s.kept:
        say(f"  kept: mb {plan.micro_batch_size} x {plan.num_micro_batches}, {plan.precision}, "
            f"{'compile' if plan.compile else 'eager'}, recompute {plan.recompute}: predicted {r.step_time_ms:,.0f} ms, "
            f"MFU {r.mfu:.1%}, {r.peak_memory_bytes / 2**30:.1f} GiB")
    if not s.kept:
        raise ConfigError("the simulator's screen kept no plan: none is predicted to fit (try --layers N or more GPUs)")
    return s


@main.command()
@target_options
@study_options
@tune_options
@real_options
@click.option("--top-k", type=ASCII_INT, default=5, show_default=True, help="Warm-start plans taken from the fast study.")
@JSON_OPTION
def retune(size, model_path, gpu, gpus, interconnect, seq_len, global_batch, storage, space, backend, engine, trials,
           timeout, seed, workers, worker_id, layers, real_steps, trial_timeout, heartbeat_interval, launcher, nodes,
           gpus_per_node, partition, account, time_limit, top_k, as_json):
    """Re-tune for a slower fabric, warm-started with the fastest fabric's best plans; compare both.

    Example: autotune retune --size 405b --interconnect pcie5+eth100
    """
    early_signals()
    from autotune.report.summary import format_side_by_side
    from autotune.tune.retune import explain_changes
    from autotune.tune.retune import retune as do_retune

    model, cluster, workload = resolve_target(size=size, model_path=model_path, gpu=gpu, gpus=gpus,
                                              interconnect=interconnect, seq_len=seq_len, global_batch=global_batch)
    check_tune_options(space=space, backend=backend, trials=trials, timeout=timeout, seed=seed, storage=storage,
                       top_k=top_k,
                       real_steps=real_steps, trial_timeout=trial_timeout, layers=layers)
    check_workers(workers, storage, backend=backend, launcher=launcher)
    retune_wid = check_worker_id(worker_id, workers)
    warn_real_only_options(backend)
    from autotune.search.space import SearchSpace
    from autotune.study.identity import study_name
    from autotune.spec.engines import resolve_engine
    loaded_space = SearchSpace.load(space)
    for line in loaded_space.no_effect_warnings():
        click.echo(f"warning: {withhold_private(line)}", err=True)
    slow_study = study_name(model, cluster, workload, space_name=loaded_space.name, backend=backend,
                            engine=resolve_engine(engine, backend).name)
    say = make_say(as_json)
    say(f"re-tuning {target_line(model, cluster, workload)}")
    from autotune.signals import clear_interrupt
    clear_interrupt()   # interruptible does not clear: a signal of an earlier command in this process is gone
    r = interruptible(lambda: do_retune(model=model, cluster=cluster, workload=workload, space=space, storage=storage, backend=backend,
                  seed=seed, n_trials=trials, timeout=timeout, top_k=top_k, log_fn=say,
                  evaluator_options=make_evaluator_options(backend, layers, real_steps, trial_timeout, launcher, nodes,
                                                       gpus_per_node, partition, account, time_limit,
                                                       num_gpus=cluster.num_gpus),
                  engine=engine, workers=workers, worker_id=retune_wid,
                  heartbeat_interval_s=heartbeat_interval),
                       storage=storage, study=slow_study)
    fast_name, slow_name = r.fast.info.fabric_name, cluster.fabric.name
    if as_json:
        from autotune.report.summary import json_document
        fi, si = r.fast.info, r.slow.info
        click.echo(json_document("retune", [
            json_entry(plan=r.fast.plan, result=r.fast.result, info=fi, engine=fi.engine, label="fast_best",
                   study=r.fast.study, trial=r.fast.trial_number),
            json_entry(plan=r.fast.plan, result=r.fast_on_slow, info=si, engine=si.engine, label="fast_plan_on_slow",
                   study=r.fast.study, trial=r.fast.trial_number),
            json_entry(plan=r.slow.plan, result=r.slow.result, info=si, engine=si.engine, label="slow_best",
                   study=r.slow.study, trial=r.slow.trial_number)],
            mfu_lost=r.fast.result.mfu - r.slow.result.mfu, mfu_recovered=r.slow.result.mfu - r.fast_on_slow.mfu,
            changes=list(explain_changes(r.fast, r.slow, r.fast_on_slow)), n_enqueued=r.n_enqueued))
        return
    click.echo("")
    click.echo(format_side_by_side([(f"{fast_name} best", r.fast.plan, r.fast.result),
                                    (f"same plan on {slow_name}", r.fast.plan, r.fast_on_slow),
                                    (f"{slow_name} best", r.slow.plan, r.slow.result)], engine=r.slow.info.engine))
    lost = r.fast.result.mfu - r.slow.result.mfu
    gained = r.slow.result.mfu - r.fast_on_slow.mfu
    click.echo(f"\nMFU lost moving {fast_name} -> {slow_name}: {100 * lost:.1f} points "
               f"({100 * r.fast.result.mfu:.1f}% -> {100 * r.slow.result.mfu:.1f}%); re-tuning recovers "
               f"{100 * gained:.1f} points over running the {fast_name} plan unchanged "
               f"({100 * r.fast_on_slow.mfu:.1f}%).")
    for line in explain_changes(r.fast, r.slow, r.fast_on_slow):
        click.echo(line)
    click.echo(f"studies: {r.fast.study} (fast) and {r.slow.study} (slow), {r.n_enqueued} warm-start plan(s)")




def _check_state_fits(model, cluster, engine, backend, layers=None) -> None:
    """Refuse, before any trial, a world whose HBM cannot hold the model's weights, gradients and optimizer
    state under any plan (sharding only divides that total). With ``--backend real --layers N`` the model
    that runs is the depth-truncated proxy (:meth:`ModelSpec.truncated`), so that is what must fit.

    Raises:
        NoFeasiblePlanError: "no plan fits", with the total and the world's usable HBM.
    """
    from autotune.spec.engines import resolve_engine

    eng = resolve_engine(engine, backend)
    if backend == "real" and isinstance(layers, int) and 1 <= layers <= model.num_layers:
        model = model.truncated(layers)
    # a lower bound for every plan: the engine's optimizer bytes per parameter (Adam's two FP32 moments, plus
    # the FP32 main weight where the engine keeps one: optimizer_bytes of its facts.yaml), at least a BF16
    # gradient (2 bytes, --grad-reduce-in-bf16) and at least an FP8 weight (1 byte, --fp8-param-gather) per
    # parameter; TP, PP and ZeRO-3 sharding only divide this total among the GPUs
    need = model.num_params * (eng.optimizer_bytes + 2 + 1)
    have = cluster.gpu.usable_hbm_bytes * cluster.num_gpus
    if need > have:
        per = need // model.num_params
        raise NoFeasiblePlanError(
            f"no plan fits: {model.name} ({model.num_params / 1e9:,.1f}B parameters) needs at least "
            f"{need / 1e12:,.1f} TB of weights, gradients and optimizer state ({per} bytes per parameter on engine "
            f"{eng.name}: {eng.optimizer_bytes} optimizer, 2 gradient, 1 weight at the least), more than "
            f"{cluster.num_gpus} x {cluster.gpu.usable_hbm_bytes / 1e9:,.0f} GB usable on {cluster.gpu.name}; "
            f"the state alone needs the HBM of {-(-need // cluster.gpu.usable_hbm_bytes)} GPUs")
