"""The chart of ``autotune plan -o FILE``: training days against cost (or GPU-hours), one series per GPU type,
the Pareto front marked. matplotlib is imported here only (the ``plot`` / ``test`` extras)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from autotune.errors import ConfigError

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def write_plan_plot(path: str, rows: Sequence[Mapping[str, Any]], *, y_label: str, title: str) -> None:
    """Write the chart to ``path`` (.png, .svg or .pdf).

    ``rows``: one per option with ``gpu`` (series), ``num_gpus`` (the label of its point), ``days`` (x),
    ``y`` (USD or GPU-hours), ``pareto`` (bool), and optional ``days_range`` / ``y_range`` ((low, high), drawn as
    error bars: the prediction's error band). Both axes are logarithmic (counts double along a series).

    Raises:
        ConfigError: matplotlib is missing, no row to draw, or the file cannot be written.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("-o needs matplotlib: pip install -e '.[plot]' (in the autotune checkout)") from None
    if not rows:
        raise ConfigError("-o: no option has a plan that fits, nothing to draw")
    fig, ax = plt.subplots(figsize=(8, 5.5))
    markers = "osD^vP*X"
    for k, gpu in enumerate(dict.fromkeys(r["gpu"] for r in rows)):
        rs = sorted((r for r in rows if r["gpu"] == gpu), key=lambda r: r["days"])
        xs, ys = [r["days"] for r in rs], [r["y"] for r in rs]
        xerr = [[r["days"] - r["days_range"][0] for r in rs], [r["days_range"][1] - r["days"] for r in rs]] \
            if all(r.get("days_range") for r in rs) else None
        yerr = [[r["y"] - r["y_range"][0] for r in rs], [r["y_range"][1] - r["y"] for r in rs]] \
            if all(r.get("y_range") for r in rs) else None
        ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, marker=markers[k % len(markers)], linestyle="-", capsize=2,
                    label=gpu, alpha=0.85)
        for r in rs:
            ax.annotate(f"{r['num_gpus']:,}", (r["days"], r["y"]), textcoords="offset points", xytext=(4, 4),
                        fontsize=7)
    front = sorted((r for r in rows if r.get("pareto")), key=lambda r: r["days"])
    if front:
        ax.step([r["days"] for r in front], [r["y"] for r in front], where="post", color="black", linewidth=1,
                linestyle="--", label="Pareto front")
        ax.scatter([r["days"] for r in front], [r["y"] for r in front], s=140, facecolors="none",
                   edgecolors="black", zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training days (wall clock, goodput included)")
    ax.set_ylabel(y_label)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as e:
        raise ConfigError(f"-o {path}: cannot write: {e}") from None
    finally:
        plt.close(fig)
