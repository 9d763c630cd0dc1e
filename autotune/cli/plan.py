"""``autotune plan``: which GPUs, how many, how long, what it costs; a training-budget planner on the tuner.

For every (GPU type, count) the best plan is tuned (:func:`autotune.tune.planner.sweep`: stored studies reused,
new ones warm-started from the neighbouring count), its tokens/s per GPU turned into days, GPU-hours, cost, energy
and CO2 (:mod:`autotune.cost.budget`), the prediction's error band carried into days and cost, the Pareto front of
days against cost (or GPU-hours) marked and the constraints applied. ``--plan FILE`` costs a given plan instead.
docs/planner.md has the formulas and a worked example.
"""

from __future__ import annotations

import math
import sys

import click

from autotune.cli.app import main
from autotune.cli.options import ASCII_FLOAT, ASCII_INT, DEFAULT_STORAGE, JSON_OPTION, make_say
from autotune.errors import ConfigError, redact

#: most GPUs of the default sweep (``--max-gpus``): the Llama 3 405B scale
DEFAULT_MAX_GPUS = 16384
#: trials a study of the sweep holds at most (the convergence stop usually ends it earlier)
DEFAULT_PLAN_TRIALS = 100


def _parse_counts(text: str) -> list[int]:
    from autotune.spec.validate import MAX_NUM_GPUS

    out = []
    for item in str(text).split(","):
        s = item.strip()
        if not s.isdigit() or not s.isascii() or len(s) > 12 or not 1 <= int(s) <= MAX_NUM_GPUS:   # not "٨"
            raise ConfigError(f"--gpus {item.strip()!r}: expected GPU counts from 1 to {MAX_NUM_GPUS:,}, comma-"
                              "separated, e.g. 1024,2048,4096")
        if int(s) not in out:
            out.append(int(s))
    return out


def _parse_gpus(text: str | None) -> list[str]:
    from autotune.spec.hardware import get_gpu, known_gpus

    if text is None:
        return known_gpus()
    out = []
    for item in str(text).split(","):
        if not item.strip():
            raise ConfigError(f"--gpu {text!r}: an empty name; expected e.g. h100,b200 (known: "
                              f"{', '.join(known_gpus())})")
        g = get_gpu(item.strip()).name
        if g not in out:
            out.append(g)
    return out


def _parse_interconnect(text: str | None, gpus: list[str]) -> dict[str, str | None]:
    """``--interconnect``: one fabric for every GPU type, or ``GPU=FABRIC,...`` per type (others: the
    catalogue default)."""
    if text is None:
        return {g: None for g in gpus}
    from autotune.spec.hardware import get_fabric, get_gpu

    if "=" not in text:
        get_fabric(text)
        return {g: text for g in gpus}
    out: dict[str, str | None] = {g: None for g in gpus}
    for item in text.split(","):
        name, _, fab = item.partition("=")
        g = get_gpu(name.strip()).name
        if g not in gpus:
            raise ConfigError(f"--interconnect {item.strip()!r}: GPU {g!r} is not in --gpu ({', '.join(gpus)})")
        get_fabric(fab.strip())
        out[g] = fab.strip()
    return out


def _read_prices(text: str | None) -> tuple[dict[str, float], str | None]:
    """--usd-per-gpu-hour: ``GPU=USD,...`` or a YAML file (``usd_per_gpu_hour: {GPU: USD}``, e.g.
    examples/gpu-prices.yaml); (prices, the file's ``source`` line or None)."""
    from autotune.cost.budget import parse_per_gpu
    from autotune.spec.hardware import known_gpus

    if text is None:
        return {}, None
    from pathlib import Path

    if "=" not in text and (Path(text).exists() or "/" in text):
        # a path that is not a regular YAML file: say what it is (files.py refuses FIFOs, devices, directories)
        if not (text.endswith((".yaml", ".yml")) or Path(text).is_file()):
            what = "a directory" if Path(text).is_dir() else "not a .yaml price file" if Path(text).exists() else \
                "no such file"
            raise ConfigError(f"--usd-per-gpu-hour {text[:100]!r}: {what}; give GPU=USD[,GPU=USD...] or a price "
                              "file (examples/gpu-prices.yaml)")
    if text.endswith((".yaml", ".yml")) or Path(text).is_file():
        from autotune.files import read_yaml_file

        d = read_yaml_file(text, what="price file")
        if not isinstance(d, dict) or not isinstance(d.get("usd_per_gpu_hour"), dict) or not d["usd_per_gpu_hour"]:
            raise ConfigError(f"price file {text}: expected a mapping usd_per_gpu_hour: {{GPU: USD per GPU-hour}}")
        items = ",".join(f"{k}={v}" for k, v in d["usd_per_gpu_hour"].items())
        src = d.get("source")
        return (parse_per_gpu(items, f"price file {text}: usd_per_gpu_hour", known_gpus(), allow_all=False,
                              lo=0, lo_open=True),
                str(src) if src is not None else None)
    return parse_per_gpu(text, "--usd-per-gpu-hour", known_gpus(), allow_all=False, lo=0, lo_open=True), None


def _si(x: float | None, unit: str = "") -> str:
    if x is None or not math.isfinite(x):
        return "-"
    a = abs(x)
    for div, suf in ((1e12, "T"), (1e9, "G" if unit != "$" else "B"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            v = x / div
            return f"{unit}{v:.3g}{suf}" if v < 100 else f"{unit}{v:.0f}{suf}"
    return f"{unit}{x:.3g}" if a < 100 else f"{unit}{x:.0f}"


def _days_text(d: float, r) -> str:
    return f"{d:.1f} ({r[0]:.1f}-{r[1]:.1f})" if r else f"{d:.1f}"


@main.command(name="plan")
@click.option("--size", help="Llama 3.1 size: 8b, 70b or 405b.")
@click.option("--model", "model_path", type=click.Path(dir_okay=False),
              help="Hugging Face config.json of a dense decoder (instead of --size).")
@click.option("--tokens", required=True,
              help="Training tokens, decimal suffixes: 15.6T, 800B, 2e12 (K = 10^3, M = 10^6, B = G = 10^9, "
                   "T = 10^12).")
@click.option("--gpu", "gpu_list", default=None,
              help="GPU types, comma-separated, e.g. h100,b200,gb200 (default: every GPU in the catalogue).")
@click.option("--gpus", "gpus_list", default=None,
              help="GPU counts, comma-separated, e.g. 1024,2048,4096 (default: powers of two from the smallest "
                   "count that holds the model's training state up to --max-gpus).")
@click.option("--max-gpus", type=ASCII_INT, default=None,
              help=f"Largest count of the default sweep (default {DEFAULT_MAX_GPUS:,}).")
@click.option("--interconnect", default=None,
              help="Fabric for every GPU type, or per type: h100=nvlink4+ib-ndr400,b200=... (default: each GPU's "
                   "NVLink + ib-ndr400).")
@click.option("--seq-len", type=ASCII_INT, default=None, help="Sequence length in tokens (default 8192).")
@click.option("--global-batch", default=None,
              help="Global batch in tokens: 16M, 4M, 1M ... (binary M = 2^20; default: 16M for 405b, 4M for 70b, "
                   "1M for 8b).")
@click.option("--engine", default=None, help="Engine the plans are costed for: megatron (default), torchtitan, "
                                             "native.")
@click.option("--storage", default=DEFAULT_STORAGE, show_default=True, help="Optuna storage URL (studies reused).")
@click.option("--space", default="default", show_default=True, help="Search space: a name or a YAML file.")
@click.option("--trials", type=ASCII_INT, default=DEFAULT_PLAN_TRIALS, show_default=True,
              help="Most trials a study of the sweep holds (each ends earlier once converged).")
@click.option("--seed", type=ASCII_INT, default=0, show_default=True, help="Sampler seed.")
@click.option("--workers", type=ASCII_INT, default=1, show_default=True,
              help="Processes sweeping GPU types at once (each type's counts stay in one, in order); the results "
                   "are the same as with 1.")
@click.option("--plan", "plan_file", type=click.Path(dir_okay=False), default=None,
              help="Cost this plan YAML (target from the file) instead of tuning, e.g. "
                   "examples/llama3.1-405b-meta-h100x16384.yaml.")
@click.option("--days", type=ASCII_FLOAT, default=None, help="Constraint: at most this many wall-clock days.")
@click.option("--budget-usd", type=ASCII_FLOAT, default=None, help="Constraint: at most this cost, USD (needs prices).")
@click.option("--budget-gpu-hours", type=ASCII_FLOAT, default=None, help="Constraint: at most this many GPU-hours.")
@click.option("--usd-per-gpu-hour", "prices_text", default=None,
              help="Prices, GPU=USD per GPU-hour, e.g. h100=2.5,b200=5.9, or a YAML price file "
                   "(examples/gpu-prices.yaml). No built-in prices: without it there is no cost column.")
@click.option("--watts-per-gpu", "watts_text", default=None,
              help="Power per GPU, W: one number for all, or GPU=W,... (default: the datasheet TDP, "
                   "autotune/data/gpus.yaml tdp_watts).")
@click.option("--pue", type=ASCII_FLOAT, default=None,
              help="Power usage effectiveness, facility energy / IT energy (default 1.0: GPUs only).")
@click.option("--grid-kg-co2-per-kwh", "grid", type=ASCII_FLOAT, default=None,
              help="Grid carbon intensity, kg CO2 per kWh (no CO2 column without it).")
@click.option("--goodput", type=ASCII_FLOAT, default=None,
              help="Share of wall time spent in productive steps (default 0.90: Llama 3 paper, >90% effective "
                   "training time).")
@click.option("-o", "--output", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write a chart of days against cost (or GPU-hours): .png, .svg or .pdf (needs matplotlib).")
@JSON_OPTION
def plan_cmd(size, model_path, tokens, gpu_list, gpus_list, max_gpus, interconnect, seq_len, global_batch, engine,
             storage, space, trials, seed, workers, plan_file, days, budget_usd, budget_gpu_hours, prices_text, watts_text,
             pue, grid, goodput, plot_path, as_json):
    """Plan a training run: for each GPU type and count, the best tuned plan's days, GPU-hours, cost and energy.

    Each (GPU, count) point is an ordinary study (the one `autotune run` tunes for that target), reused when
    stored and warm-started from the neighbouring count, so a second `plan` takes seconds. Rows on the Pareto
    front of days against cost (GPU-hours without prices) are marked *; the interval after days and cost is the
    engine's prediction error band. docs/planner.md has the formulas.

    Example: autotune plan --size 405b --tokens 15.6T --gpu h100,b200,gb200 --usd-per-gpu-hour examples/gpu-prices.yaml
    """
    from autotune.cost.budget import (
        DEFAULT_GOODPUT,
        DEFAULT_PUE,
        GOODPUT_SOURCE,
        Constraints,
        check_fraction,
        check_limit,
        parse_per_gpu,
        parse_token_count,
    )
    from autotune.spec.hardware import get_gpu, known_gpus
    from autotune.spec.validate import MAX_TRIALS, require_int

    n_tokens = parse_token_count(tokens)
    goodput_v = check_fraction(goodput if goodput is not None else DEFAULT_GOODPUT, "--goodput")
    if goodput_v < MIN_GOODPUT:
        raise ConfigError(f"--goodput {goodput!r}: must be at least {MIN_GOODPUT:g} (the share of wall time in "
                          "productive steps; below 1% no budget is meaningful) and at most 1")
    pue_v = DEFAULT_PUE if pue is None else pue
    if not (isinstance(pue_v, float) and math.isfinite(pue_v) and 1.0 <= pue_v <= 5.0):
        raise ConfigError(f"--pue {pue!r}: must be a number from 1.0 (GPUs only) to 5.0 (facility energy / IT energy)")
    if grid is not None and not (math.isfinite(grid) and 0 <= grid <= 5):
        raise ConfigError(f"--grid-kg-co2-per-kwh {grid!r}: must be a number from 0 to 5 kg CO2 per kWh")
    cons = Constraints(days=check_limit(days, "--days"), usd=check_limit(budget_usd, "--budget-usd"),
                       gpu_hours=check_limit(budget_gpu_hours, "--budget-gpu-hours"))
    prices, price_source = _read_prices(prices_text)
    require_int(trials, "--trials", hi=MAX_TRIALS)
    from autotune.cli.options import check_workers
    check_workers(workers, storage)
    if plot_path is not None:
        from autotune.files import check_output_path
        from autotune.report.plan_plot import PLOT_SUFFIXES

        if not plot_path.lower().endswith(PLOT_SUFFIXES):
            raise ConfigError(f"-o {plot_path!r}: the file name must end in {', '.join(PLOT_SUFFIXES)}")
        check_output_path(plot_path, what="-o")
    say = make_say(as_json)
    watts_given = parse_per_gpu(watts_text, "--watts-per-gpu", known_gpus(), lo=0, lo_open=True, hi=1e5) \
        if watts_text is not None else {}

    def check_prices(gpus):
        if cons.usd is not None and not any(g in prices for g in gpus):
            raise ConfigError(f"--budget-usd {budget_usd:g}: no price for {', '.join(gpus)}; give --usd-per-gpu-hour "
                              "GPU=USD,... (autotune ships no prices; examples/gpu-prices.yaml is an example file)")

    from autotune.tune.planner import cost_plan_file, default_counts, fill_budgets, sweep

    if plan_file is not None:
        given = [o for o, v in (("--size", size), ("--model", model_path), ("--max-gpus", max_gpus),
                                ("--interconnect", interconnect), ("--seq-len", seq_len),
                                ("--global-batch", global_batch)) if v is not None]
        if given:
            raise ConfigError(f"{', '.join(given)}: with --plan {plan_file} the model, cluster and workload come "
                              "from the file; leave them out (--gpu and --gpus may repeat the file's)")
        from autotune.spec.plan import PlanDocument

        doc = PlanDocument.load(plan_file)
        if gpu_list is not None and _parse_gpus(gpu_list) != [get_gpu(doc.gpu).name]:
            raise ConfigError(f"--gpu {gpu_list}: {plan_file} is a plan for {doc.gpu}; give --gpu {doc.gpu} or "
                              "leave --gpu out")
        if gpus_list is not None and _parse_counts(gpus_list) != [doc.num_gpus]:
            raise ConfigError(f"--gpus {gpus_list}: {plan_file} is a plan for {doc.num_gpus} GPUs (its degrees fix "
                              f"the count); give --gpus {doc.num_gpus} or leave --gpus out")
        gpus = [get_gpu(doc.gpu).name]
        check_prices(gpus)
        model, workload = doc.model, doc.workload
        unused = [o for o, v, d in (("--space", space, "default"), ("--trials", trials, DEFAULT_PLAN_TRIALS),
                                    ("--seed", seed, 0), ("--workers", workers, 1),
                                    ("--storage", storage, DEFAULT_STORAGE)) if v != d]
        if unused:
            click.echo(f"warning: {', '.join(unused)} ha{'s' if len(unused) == 1 else 've'} no effect with --plan "
                       "(the file's plan is costed, nothing is tuned or stored)", err=True)
        points = [cost_plan_file(doc, engine=engine)]
        what = f"plan file {plan_file}"
    else:
        from autotune.cli.options import resolve_target

        gpus = _parse_gpus(gpu_list)
        ics = _parse_interconnect(interconnect, gpus)
        check_prices(gpus)
        model, _, workload = resolve_target(size=size, model_path=model_path, gpu=gpus[0], gpus=None,
                                            interconnect=None, seq_len=seq_len, global_batch=global_batch)
        if gpus_list is not None and max_gpus is not None:
            raise ConfigError("give --gpus (the counts) or --max-gpus (the largest default count), not both")
        if max_gpus is not None:
            require_int(max_gpus, "--max-gpus")
        counts = {g: (_parse_counts(gpus_list) if gpus_list is not None else
                      default_counts(model, g, max_gpus or DEFAULT_MAX_GPUS, interconnect=ics[g])) for g in gpus}
        total = sum(len(v) for v in counts.values())
        say(f"planning {model.name} on {', '.join(gpus)}: {total} (GPU, count) points, seq {workload.seq_len}, "
            f"global batch {workload.global_batch_tokens:,} tokens; studies in {redact(storage)}")
        show_bar = sys.stderr.isatty()
        bar = click.progressbar(length=total, label="tuning", file=sys.stderr, show_pos=True) if show_bar else None
        done = [0]

        def progress(pt):
            done[0] += 1
            if bar is not None:
                bar.label = f"{pt.gpu} x {pt.num_gpus}"
                bar.update(1)
        try:
            from autotune.signals import clear_interrupt
            clear_interrupt()
            points = sweep(model=model, workload=workload, counts=counts, interconnect=ics, storage=storage,
                           space=space, engine=engine, seed=seed, trials=trials, progress=progress,
                           workers=workers)
        except KeyboardInterrupt:
            # every finished trial is stored (Tuner.optimize); the same command resumes where this one stopped
            if bar is not None:
                bar.render_finish()
                bar = None
            from autotune.signals import interrupted
            sig = interrupted() or 2
            click.echo(f"\ninterrupted: {done[0]} of {total} (GPU, count) points done; their studies and every "
                       f"finished trial are stored in {redact(storage)}: run the same command again to go on", err=True)
            click.get_current_context().exit(128 + int(sig))
        finally:
            if bar is not None:
                bar.render_finish()
        what = f"{model.name}, {len(points)} option{'s' if len(points) != 1 else ''}"

    watts = {g: watts_given.get(g, get_gpu(g).tdp_watts) for g in gpus}
    front = fill_budgets(points, tokens=n_tokens, goodput=goodput_v, watts=watts, pue=pue_v, prices=prices,
                         kg_co2_per_kwh=grid, constraints=cons)
    ok = [p for p in points if p.ok]
    by_cost = bool(ok) and all(p.budget.cost_usd is not None for p in ok)
    notes = _constraint_notes(points, cons)
    extremes = {"fastest": min(ok, key=lambda p: p.budget.days) if ok else None,
                "cheapest": min(ok, key=lambda p: p.budget.cost_usd if by_cost else p.budget.gpu_hours) if ok else None}
    if plot_path is not None and not ok:
        warn_lines = [f"warning: -o {plot_path}: no option has a plan that fits, nothing drawn"]
    else:
        warn_lines = []
    if plot_path is not None and ok:
        from autotune.report.plan_plot import write_plan_plot

        rows = [{"gpu": p.gpu, "num_gpus": p.num_gpus, "days": p.budget.days,
                 "y": p.budget.cost_usd if by_cost else p.budget.gpu_hours, "pareto": p.pareto,
                 "days_range": p.budget.days_range,
                 "y_range": p.budget.cost_range if by_cost else p.budget.gpu_hours_range} for p in ok]
        write_plan_plot(plot_path, rows, y_label="cost, USD" if by_cost else "GPU-hours",
                        title=f"{model.name}, {n_tokens / 1e12:.3g}T tokens, goodput {goodput_v:g}")
        say(f"wrote {plot_path}")
    inputs = {"tokens": n_tokens, "goodput": goodput_v,
              "goodput_source": GOODPUT_SOURCE if goodput is None else "--goodput",
              "pue": pue_v, "pue_source": "default (GPUs only)" if pue is None else "--pue",
              "watts_per_gpu": watts, "watts_source": {g: ("--watts-per-gpu" if g in watts_given else
                                                           "datasheet TDP (autotune/data/gpus.yaml)") for g in gpus},
              "usd_per_gpu_hour": {g: prices.get(g) for g in gpus}, "price_source": price_source,
              "grid_kg_co2_per_kwh": grid, "pareto_axes": ["days", "cost_usd" if by_cost else "gpu_hours"]}
    if as_json:
        _print_json(points, model, workload, inputs, cons, notes,
                    {k: (f"{p.gpu}x{p.num_gpus}" if p else None) for k, p in extremes.items()})
        for w in warn_lines:
            click.echo(w, err=True)
        return
    click.echo(_table(points, by_cost=by_cost, any_cost=any(p.budget.cost_usd is not None for p in ok),
                      co2=grid is not None, cons=cons))
    click.echo("")
    click.echo(f"{what}; tokens {n_tokens:,} ({n_tokens / 1e12:.4g}T)")
    click.echo(f"goodput {goodput_v:g}" + (f" (default: {GOODPUT_SOURCE})" if goodput is None else " (--goodput)")
               + "; days = tokens / (tok/s/GPU x GPUs x goodput) / 86,400; GPU-hours = GPUs x days x 24")
    click.echo("power per GPU: " + ", ".join(f"{g} {watts[g]:g} W" if watts[g] else f"{g} unknown" for g in gpus)
               + ("" if watts_given else " (datasheet TDP, autotune/data/gpus.yaml)")
               + f"; PUE {pue_v:g}" + (" (default: GPUs only, no cooling or facility overhead)" if pue is None else "")
               + "; MWh = GPU-hours x W x PUE / 10^6")
    if prices:
        click.echo("prices, USD per GPU-hour: " + ", ".join(f"{g} {prices[g]:g}" for g in gpus if g in prices)
                   + (f" ({price_source})" if price_source else " (--usd-per-gpu-hour)"))
    else:
        click.echo("no cost column: give --usd-per-gpu-hour GPU=USD,... or a price file (autotune ships no prices)")
    if grid is not None:
        click.echo(f"grid {grid:g} kg CO2 per kWh: t CO2 = MWh x kg/kWh")
    for w in warn_lines:
        click.echo(w, err=True)
    bands = sorted({p.band_text for p in ok if p.band_text})
    for b in bands:
        click.echo(f"interval: the prediction's error band {b}")
    if ok:
        click.echo(f"* = Pareto front of days against {'cost' if by_cost else 'GPU-hours'}: no other option is both "
                   "faster and cheaper")
    if len(ok) > 1:
        f, c = extremes["fastest"], extremes["cheapest"]
        click.echo(f"fastest: {f.gpu} x {f.num_gpus:,} ({f.budget.days:.1f} days, {_money_or_hours(f)}); cheapest: "
                   f"{c.gpu} x {c.num_gpus:,} ({c.budget.days:.1f} days, {_money_or_hours(c)})")
    for line in notes["lines"]:
        click.echo(line)
    for p in points:
        if not p.ok:
            click.echo(f"no plan for {p.gpu} x {p.num_gpus:,}: {p.error or 'none fits'}")
    for p in points:
        for w in p.warnings:
            click.echo(f"warning: {p.gpu} x {p.num_gpus:,}: {w}", err=True)


def _table(points, *, by_cost: bool, any_cost: bool, co2: bool, cons) -> str:
    from autotune.report.summary import _table as table
    from autotune.tune.planner import short_plan_text

    head = ["", "GPU", "GPUs", "plan", "tok/s/GPU", "MFU", "days", "GPU-hours"] + (["cost"] if any_cost else []) \
        + ["MWh"] + (["t CO2"] if co2 else []) + (["meets"] if cons.given else [])
    rows = []
    for p in points:
        if not p.ok:
            rows.append(["", p.gpu, f"{p.num_gpus:,}", "no plan (below)"] + [""] * (len(head) - 4))
            continue
        b = p.budget
        cost = ""
        if b.cost_usd is not None:
            cost = _si(b.cost_usd, "$") + (f" ({_si(b.cost_range[0], '$')}-{_si(b.cost_range[1], '$')})"
                                           if b.cost_range else "")
        row = ["*" if p.pareto else "", p.gpu, f"{p.num_gpus:,}", short_plan_text(p.plan),
               f"{p.result.tokens_per_s_per_gpu:,.0f}", f"{100 * p.result.mfu:.1f}%", _days_text(b.days, b.days_range),
               _si(b.gpu_hours) + (f" ({_si(b.gpu_hours_range[0])}-{_si(b.gpu_hours_range[1])})"
                                   if b.gpu_hours_range else "")] + ([cost or "-"] if any_cost else []) + \
            [f"{b.energy_mwh:,.0f}" if b.energy_mwh is not None else "-"] + \
            ([f"{b.co2_t:,.0f}" if b.co2_t is not None else "-"] if co2 else []) + \
            (["yes" if p.meets else "no"] if cons.given else [])
        rows.append(row)
    return table(rows, head)


def _constraint_notes(points, cons) -> dict:
    """Lines and JSON for the constraints: the options meeting them, or, when none does, the fastest / cheapest /
    fewest-GPU-hours option and by how much it misses each limit it breaks."""
    out = {"lines": [], "met_by": [], "nearest": {}}
    if not cons.given:
        return out
    ok = [p for p in points if p.ok]
    limits = ", ".join(f"{k} {fmt(v)}" for k, v, fmt in (("--days", cons.days, lambda v: f"{v:g}"),
                                                        ("--budget-usd", cons.usd, lambda v: _si(v, "$")),
                                                        ("--budget-gpu-hours", cons.gpu_hours, _si))
                       if v is not None)
    met = [p for p in ok if p.meets]
    out["met_by"] = [f"{p.gpu}x{p.num_gpus}" for p in met]
    if not ok:
        out["lines"].append(f"constraints {limits}: no option has a plan that fits, none can be checked")
        return out
    if met:
        fastest = min(met, key=lambda p: p.budget.days)
        cheapest = min(met, key=lambda p: (p.budget.cost_usd if p.budget.cost_usd is not None else math.inf,
                                           p.budget.gpu_hours))
        out["lines"].append(f"constraints {limits}: met by {len(met)} of {len(ok)} options; fastest that meets them: "
                            f"{fastest.gpu} x {fastest.num_gpus:,} ({fastest.budget.days:.1f} days); cheapest: "
                            f"{cheapest.gpu} x {cheapest.num_gpus:,} ({_money_or_hours(cheapest)})")
        out["nearest"] = {"fastest": f"{fastest.gpu}x{fastest.num_gpus}", "cheapest": f"{cheapest.gpu}x{cheapest.num_gpus}"}
        return out
    parts = []
    axes = [("days", cons.days, lambda p: p.budget.days, "fastest", "days"),
            ("usd", cons.usd, lambda p: p.budget.cost_usd if p.budget.cost_usd is not None else math.inf,
             "cheapest", "USD"),
            ("gpu_hours", cons.gpu_hours, lambda p: p.budget.gpu_hours, "fewest GPU-hours", "GPU-hours")]
    for key, limit, val, word, unit in axes:
        if limit is None:
            continue
        best = min(ok, key=val)
        v = val(best)
        miss = best.misses
        broken = ", ".join(_miss_text(k, m, cons) for k, m in miss.items())
        parts.append(f"the {word}, {best.gpu} x {best.num_gpus:,} ({_fmt(v, unit)}), "
                     + (f"misses {broken}" if broken else "meets this limit but not the others"))
        out["nearest"][word] = {"option": f"{best.gpu}x{best.num_gpus}", "value": v if math.isfinite(v) else None,
                                "misses": {k: (m if math.isfinite(m) else None) for k, m in miss.items()}}
    out["lines"].append(f"no option meets {limits}: " + "; ".join(parts))
    return out


def _fmt(v: float, unit: str) -> str:
    if not math.isfinite(v):
        return f"no {unit} known"
    return f"{v:.1f} days" if unit == "days" else _si(v, "$") if unit == "USD" else f"{_si(v)} GPU-hours"


def _miss_text(key: str, miss: float, cons) -> str:
    limit = {"days": cons.days, "usd": cons.usd, "gpu_hours": cons.gpu_hours}[key]
    if not math.isfinite(miss):
        return "--budget-usd (no price for this GPU)"
    opt = {"days": "--days", "usd": "--budget-usd", "gpu_hours": "--budget-gpu-hours"}[key]
    amount = f"{miss:.1f} days" if key == "days" else _si(miss, "$") if key == "usd" else f"{_si(miss)} GPU-hours"
    return f"{opt} by {amount} ({100 * miss / limit:+.0f}%)"


def _money_or_hours(p) -> str:
    if p.budget.cost_usd is not None:
        return _si(p.budget.cost_usd, "$")
    return f"{_si(p.budget.gpu_hours)} GPU-hours"


#: the least --goodput accepted: 1% of wall time in productive steps (below it days and cost lose meaning and
#: overflow the chart's log axes)
MIN_GOODPUT = 0.01


def _print_json(points, model, workload, inputs, cons, notes, extremes) -> None:
    from autotune.report.summary import json_document, result_entry

    entries = []
    for p in points:
        extra = {"budget": p.budget.to_dict() if p.budget else None, "pareto": p.pareto, "meets_constraints": p.meets,
                 "misses": {k: (v if math.isfinite(v) else None) for k, v in p.misses.items()},
                 "error": p.error, "reused_study": p.reused, "new_trials": p.n_new_trials,
                 "warm_started": p.warm_started, "interval": p.band_text, "warnings": list(p.warnings),
                 "memory_refusal": p.memory_refusal}
        ok = p.ok
        entries.append(result_entry(plan=p.plan if ok else None, result=p.result if ok else None, model=model,
                                    gpu=p.gpu, num_gpus=p.num_gpus, fabric=p.fabric, workload=workload,
                                    engine=p.engine, label=f"{p.gpu}x{p.num_gpus}", study=p.study, trial=p.trial,
                                    extra=extra))
    click.echo(json_document("plan", entries, inputs=inputs, fastest=extremes["fastest"], cheapest=extremes["cheapest"],
                             constraints={**cons.to_dict(), "met_by": notes["met_by"], "nearest": notes["nearest"],
                                          "lines": notes["lines"]}))
