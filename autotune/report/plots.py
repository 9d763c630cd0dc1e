"""Study plots: ``autotune plot [STUDY] -o DIR``.

Four plots of an autotune study, each as HTML (Optuna's plotly visualization module,
``optuna.visualization``; needs plotly) and PNG (``optuna.visualization.matplotlib``; needs
matplotlib), both in the ``plot`` extra (``pip install -e '.[plot]' (in the autotune checkout)``):

* ``history``: MFU (causal, %) by trial with the best-so-far line over the feasible trials
  (:func:`history_points`; out-of-memory trials marked differently, as Optuna's
  ``plot_optimization_history`` greys constraint-violating trials, which plots the raw fraction);
* ``importances``: for a study of simulated numbers, each knob's effect as the simulator gives it
  (:func:`knob_effects`): the MFU range in percentage points when that knob alone takes each of its values
  around the study's best plans, re-simulated; a knob that changes nothing there is named as having no
  effect. Optuna's fANOVA importances (``plot_param_importances``, a random forest fitted to the trials)
  ranked a knob with no effect first in a study where it changed nothing (issue 42); they are still drawn
  for studies of measured or real numbers, which cannot be re-run here;
* ``mfu_vs_memory``: MFU against peak memory per GPU (GiB, ``user_attrs['peak_memory_bytes']``),
  feasible and out-of-memory trials marked differently, the usable capacity as a line (peak minus the
  ``memory_over_capacity_gib`` constraint);
* ``knobs``: the effect of each knob on MFU in % (``plot_slice`` with ``target`` = 100 x value).

Every MFU axis is in %, and every title names the study's backend (``simulated``: predicted by the
simulator; ``measured``: the simulator with stored op measurements; ``real``: run on GPUs), read from
the study's ``user_attrs['backend']`` (autotune.tune.tuner ``Tuner._study_attrs``).

Only COMPLETE trials are plotted (pruned ones have no MFU); an out-of-memory trial has MFU 0 and is
drawn as such, marked.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError
from autotune.files import open_output

PLOTS = ("history", "importances", "mfu_vs_memory", "knobs")
METRIC = "MFU (causal)"
GIB = 2**30


def _available() -> tuple[bool, bool]:
    try:
        import plotly  # noqa: F401
        html = True
    except ImportError:
        html = False
    try:
        import matplotlib
        matplotlib.use("Agg")
        png = True
    except ImportError:
        png = False
    return html, png


def plot_file_names() -> tuple[str, ...]:
    """The file names (``<plot>.html`` with plotly, ``<plot>.png`` with matplotlib) :func:`write_study_plots` may write with the plotting libraries installed here (so
    that every one can be checked before anything is written)."""
    html, png = _available()
    return tuple(f"{n}.{ext}" for ext, on in (("html", html), ("png", png)) if on for n in PLOTS)


def memory_points(study) -> list[dict[str, Any]]:
    """Per COMPLETE trial: number, MFU, peak memory (GiB), feasible, capacity (GiB: the stored
    ``capacity_bytes``, else from the constraint: peak - over), sorted by trial number."""
    from optuna.trial import TrialState

    from autotune.study.trials import MEMORY_CONSTRAINT, is_feasible

    pts = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        ua = t.user_attrs
        if "peak_memory_bytes" not in ua:
            continue
        peak = ua["peak_memory_bytes"] / GIB
        over = t.constraints.get(MEMORY_CONSTRAINT)
        cap = ua["capacity_bytes"] / GIB if isinstance(ua.get("capacity_bytes"), (int, float)) else \
            ((peak - over) if over is not None and over <= 0 else None)
        pts.append({"number": t.number, "mfu": float(ua.get("mfu", t.value or 0.0)), "peak_gib": peak,
                    "feasible": is_feasible(t), "capacity_gib": cap})
    return pts


def history_points(study) -> list[dict[str, Any]]:
    """Per COMPLETE trial, by trial number: number, ``mfu_pct`` (MFU in %, 100 x the trial value),
    feasible, ``best_pct`` (the best MFU in % over the feasible trials so far, None before the first)."""
    from optuna.trial import TrialState

    from autotune.study.trials import is_feasible

    out, best = [], None
    for t in sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda t: t.number):
        v = 100 * float(t.value or 0.0)
        feas = is_feasible(t)
        if feas:
            best = v if best is None else max(best, v)
        out.append({"number": t.number, "mfu_pct": v, "feasible": feas, "best_pct": best})
    return out


def backend_title(study) -> str:
    """``<study name> (<backend> numbers)`` for plot titles; the backend from ``user_attrs['backend']``
    (``simulated`` when the study predates that attribute, the default backend)."""
    b = str(study.user_attrs.get("backend", "simulated"))
    word = {"simulated": "simulated", "measured": "measured-op (simulator + stored op timings)",
            "real": "real runs"}.get(b, b)
    return f"{study.study_name} ({word} numbers)"


#: best complete trials around which :func:`knob_effects` varies each knob
EFFECT_TRIALS = 5


def knob_effects(study, *, top: int = EFFECT_TRIALS) -> dict[str, float] | None:
    """knob -> MFU range in percentage points when that knob alone takes each value of the study's search
    space (the others as sampled), averaged over the ``top`` best complete trials, each variant re-evaluated
    with the simulator (an out-of-memory variant counts as MFU 0, as its trial would; a combination the
    space's conditional rules refuse is skipped). 0.0: no effect around those plans. None when the study's
    numbers are not simulated (measured op timings or real runs cannot be re-run here) or its target or
    search space cannot be rebuilt from its attributes.

    Cost: ``top`` x knobs x values simulations (about 300 for the default space; milliseconds each for 8B)."""
    from optuna.trial import TrialState

    from autotune.errors import AutotuneError
    from autotune.study.identity import study_info

    info = study_info(study)
    if info is None or info.backend != "simulated":
        return None
    try:
        from autotune.cost.evaluator import make_evaluator
        from autotune.search.space import Pruned, SearchSpace
        from autotune.spec.engines import get_engine
        from autotune.spec.hardware import ClusterSpec, fabric_from_dict, get_gpu
        cluster = ClusterSpec(gpu=get_gpu(info.gpu), num_gpus=info.num_gpus,
                              fabric=fabric_from_dict(info.fabric, where=f"study {info.name}: fabric"))
        space = SearchSpace.load(info.space).bind(model=info.model, num_gpus=info.num_gpus, workload=info.workload,
                                                  gpu=cluster.gpu, engine=get_engine(info.engine))
        ev = make_evaluator("simulated", model=info.model, cluster=cluster, workload=info.workload,
                            engine=info.engine)
    except (AutotuneError, OSError, ValueError):
        return None
    trials = sorted((t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value),
                    key=lambda t: -float(t.value))[:top]
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    try:
        for t in trials:
            for knob, base in t.params.items():
                mfus = [100 * float(t.value)]
                for v in space.choices.get(knob, ()):
                    if v == base:
                        continue
                    try:
                        plan = space.plan_from_params(dict(t.params, **{knob: v}))
                    except (Pruned, AutotuneError, ValueError, KeyError):   # a combination the space refuses
                        continue
                    r = ev.evaluate(plan)
                    mfus.append(100 * r.mfu if r.feasible else 0.0)
                if len(mfus) > 1:
                    sums[knob] = sums.get(knob, 0.0) + max(mfus) - min(mfus)
                    counts[knob] = counts.get(knob, 0) + 1
    finally:
        ev.close()
    return {k: sums[k] / counts[k] for k in sorted(sums, key=lambda k: -sums[k] / counts[k])}


def _mpl_effects(effects: dict[str, float]):
    import matplotlib.pyplot as plt

    some = {k: v for k, v in effects.items() if v > 1e-9}
    fig, ax = plt.subplots(figsize=(7, 0.35 * max(len(some), 1) + 1.5))
    names = list(some)[::-1]
    ax.barh(names, [some[k] for k in names])
    ax.set_xlabel(f"MFU range when the knob alone changes (percentage points), {EFFECT_TRIALS} best plans")
    return ax


def _plotly_effects(effects: dict[str, float]):
    import plotly.graph_objects as go

    some = {k: v for k, v in effects.items() if v > 1e-9}
    names = list(some)[::-1]
    fig = go.Figure(go.Bar(x=[some[k] for k in names], y=names, orientation="h"))
    fig.update_layout(xaxis_title=f"MFU range when the knob alone changes (percentage points), {EFFECT_TRIALS} "
                                  "best plans")
    return fig


def _effects_head(effects: dict[str, float] | None) -> str:
    if effects is None:
        return "Parameter importances for MFU (Optuna fANOVA)"
    none = [k for k, v in effects.items() if v <= 1e-9]
    return ("Knob effects on MFU (re-simulated around the best plans)"
            + (f"; no effect: {', '.join(none)}" if none else ""))


def write_study_plots(study, out_dir: str | Path) -> list[Path]:
    """Write the four plots (see the module docstring) of ``study`` into ``out_dir``.

    Returns: the files written (``<plot>.html`` / ``<plot>.png``). Raises:
        ConfigError: neither plotly nor matplotlib is installed, the study has no complete trial,
            or ``out_dir`` cannot be written.
    """
    import optuna

    html, png = _available()
    if not (html or png):
        raise ConfigError("autotune plot needs plotly (HTML) or matplotlib (PNG): pip install -e '.[plot]' (in the autotune checkout)")
    from optuna.trial import TrialState
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        raise ConfigError(f"study {study.study_name!r} has no complete trial to plot; run `autotune run` first")
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create {out}: {e}") from None
    written: list[Path] = []
    pts = memory_points(study)
    hist = history_points(study)
    title = backend_title(study)
    pct = f"{METRIC} (%)"

    def in_pct(t):
        return 100 * float(t.value or 0.0)

    effects = knob_effects(study)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # Optuna's ExperimentalWarning for the matplotlib backend
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        if html:
            import optuna.visualization as vis
            figs = {"history": _plotly_history(hist, title),
                    "importances": (_plotly_effects(effects) if effects else
                                    _or_none(lambda: vis.plot_param_importances(study, target_name=METRIC))),
                    "mfu_vs_memory": _plotly_memory(pts, title),
                    "knobs": vis.plot_slice(study, target=in_pct, target_name=pct)}
            for name, fig in figs.items():
                if fig is not None:
                    if name in ("importances", "knobs"):
                        head = _effects_head(effects) if name == "importances" else "MFU by knob value"
                        fig.update_layout(title=f"{head}<br><sup>{title}</sup>")
                    p = out / f"{name}.html"
                    # plotly.js inline (~3.5 MB a file): the plots open offline (air-gapped clusters)
                    with open_output(p, what="-o") as fh:      # never through a symbolic link
                        fig.write_html(fh, include_plotlyjs=True)
                    written.append(p)
        if png:
            import matplotlib.pyplot as plt
            import optuna.visualization.matplotlib as mvis
            axes = {"history": lambda: _mpl_history(hist, title),
                    "importances": ((lambda: _mpl_effects(effects)) if effects else
                                    (lambda: mvis.plot_param_importances(study, target_name=METRIC))),
                    "mfu_vs_memory": lambda: _mpl_memory(pts, title),
                    "knobs": lambda: _mpl_knobs(study, pct)}
            for name, make in axes.items():
                ax = _or_none(make)
                if ax is None:
                    continue
                first = ax.flat[0] if hasattr(ax, "flat") else ax
                fig = first.get_figure()
                if name in ("importances", "knobs"):
                    head = _effects_head(effects) if name == "importances" else "MFU by knob value"
                    # one title: Optuna's own axes title ("Hyperparameter Importances") gives way to ours
                    if name == "importances":
                        first.set_title("")
                    fig.suptitle(f"{head}\n{title}", fontsize=8)
                p = out / f"{name}.png"
                try:
                    with open_output(p, what="-o", binary=True) as fh:     # never through a symbolic link
                        fig.savefig(fh, format="png", dpi=100, bbox_inches="tight")
                finally:
                    plt.close(fig)
                written.append(p)
    return written


#: columns of the knobs grid (PNG)
KNOB_COLUMNS = 4


def knob_points(study) -> dict[str, list[tuple[str, float]]]:
    """knob name -> (value as text, MFU in %) of every complete trial that sampled it; knobs in name order,
    each value list in trial order."""
    from optuna.trial import TrialState
    out: dict[str, list[tuple[str, float]]] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        for k, v in t.params.items():
            out.setdefault(k, []).append((str(v), 100 * float(t.value or 0.0)))
    return dict(sorted(out.items()))


def _mpl_knobs(study, pct: str):
    """MFU (%) by value of each knob: a grid of KNOB_COLUMNS columns, one panel per knob, values as
    categories in sorted order (numbers numerically) with the tick labels rotated 45 degrees."""
    import math

    import matplotlib.pyplot as plt

    pts = knob_points(study)
    if not pts:
        return None
    cols = min(KNOB_COLUMNS, len(pts))
    rows = math.ceil(len(pts) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False)

    def order(v: str):
        try:
            return (0, float(v), v)
        except ValueError:
            return (1, 0.0, v)

    for ax, (knob, vals) in zip(axes.flat, pts.items()):
        cats = sorted({v for v, _ in vals}, key=order)
        idx = {c: i for i, c in enumerate(cats)}
        ax.scatter([idx[v] for v, _ in vals], [m for _, m in vals], s=10, alpha=0.6)
        ax.set_xticks(range(len(cats)))
        ax.set_xticklabels(cats, rotation=45, ha="right", fontsize=7)
        ax.set_title(knob, fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_ylabel(pct, fontsize=7)
    for ax in list(axes.flat)[len(pts):]:
        ax.set_visible(False)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return axes


def _plotly_history(hist, title: str):
    import plotly.graph_objects as go

    fig = go.Figure()
    for feas, name, sym in ((True, "feasible", "circle"), (False, "out of memory", "x")):
        sel = [h for h in hist if h["feasible"] is feas]
        fig.add_trace(go.Scatter(x=[h["number"] for h in sel], y=[h["mfu_pct"] for h in sel], mode="markers",
                                 name=name, marker={"symbol": sym, "size": 7}))
    best = [h for h in hist if h["best_pct"] is not None]
    fig.add_trace(go.Scatter(x=[h["number"] for h in best], y=[h["best_pct"] for h in best], mode="lines",
                             name="best so far", line={"shape": "hv"}))
    fig.update_layout(title=f"MFU by trial<br><sup>{title}</sup>", xaxis_title="trial",
                      yaxis_title=f"{METRIC} (%)")
    return fig


def _mpl_history(hist, title: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for feas, name, mk in ((True, "feasible", "o"), (False, "out of memory", "x")):
        sel = [h for h in hist if h["feasible"] is feas]
        ax.scatter([h["number"] for h in sel], [h["mfu_pct"] for h in sel], marker=mk, label=name)
    best = [h for h in hist if h["best_pct"] is not None]
    ax.step([h["number"] for h in best], [h["best_pct"] for h in best], where="post", color="red",
            label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(f"{METRIC} (%)")
    ax.set_title(f"MFU by trial\n{title}", fontsize=8)
    ax.legend(fontsize=8)
    return ax


def _or_none(make):
    """The figure, or None when Optuna cannot draw it (e.g. importances of a single-valued space)."""
    try:
        return make()
    except (ValueError, RuntimeError, ZeroDivisionError):
        return None


def _plotly_memory(pts, title: str):
    import plotly.graph_objects as go

    fig = go.Figure()
    for feas, name, sym in ((True, "feasible", "circle"), (False, "out of memory", "x")):
        sel = [p for p in pts if p["feasible"] is feas]
        fig.add_trace(go.Scatter(x=[p["peak_gib"] for p in sel], y=[100 * p["mfu"] for p in sel], mode="markers",
                                 name=name, marker={"symbol": sym, "size": 8},
                                 text=[f"trial {p['number']}" for p in sel]))
    cap = next((p["capacity_gib"] for p in pts if p["capacity_gib"] is not None), None)
    if cap is not None:
        fig.add_vline(x=cap, line_dash="dash", annotation_text=f"usable {cap:.1f} GiB")
    fig.update_layout(title=f"MFU vs peak memory per GPU<br><sup>{title}</sup>",
                      xaxis_title="peak memory per GPU (GiB)", yaxis_title=f"{METRIC} (%)")
    return fig


def _mpl_memory(pts, title: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for feas, name, mk in ((True, "feasible", "o"), (False, "out of memory", "x")):
        sel = [p for p in pts if p["feasible"] is feas]
        ax.scatter([p["peak_gib"] for p in sel], [100 * p["mfu"] for p in sel], marker=mk, label=name)
    cap = next((p["capacity_gib"] for p in pts if p["capacity_gib"] is not None), None)
    if cap is not None:
        ax.axvline(cap, linestyle="--", color="grey", label=f"usable {cap:.1f} GiB")
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel(f"{METRIC} (%)")
    ax.set_title(f"MFU vs peak memory per GPU\n{title}", fontsize=8)
    ax.legend(fontsize=8)
    return ax


__all__ = ["PLOTS", "backend_title", "history_points", "memory_points", "write_study_plots"]
