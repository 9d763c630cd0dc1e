"""The simulated step as a timeline: Chrome / Perfetto trace JSON and a Gantt chart (PNG).

Input: the full step graph of a plan and its :class:`autotune.cost.simulator.Timeline` (start and finish
of every node, ms; :meth:`SimulatedEvaluator.step_timeline`). Output layout:

* one process per pipeline stage (``pid`` = stage; one representative rank, as in the graph);
* one track (``tid``) per stream: ``compute`` (forward / backward chunks, blocking DP reduction, the
  optimizer step, parameter gather, memory reclaim), ``TP/CP`` (the exposed part of a chunk's
  TP/SP and CP collectives; the graph folds it into the chunk's duration without placing it, so it is
  drawn at the end of the chunk), ``DP`` (overlapped gradient buckets on the dp stream), ``P2P``
  (pipeline sends: with async collectives from the sender's finish for the edge's transfer time,
  blocking ones as the last ``p2p_ms`` of the sender's chunk, where the graph accounts them);
* events are named by op, micro-batch and chunk (``F mb3 c1``); ``args`` carry the node's parts (ms);
* idle time on the compute track is left empty: the pipeline bubbles are the gaps.

Times: Chrome trace ``ts``/``dur`` are microseconds (Trace Event Format, "X" complete events); the
span of all events equals the timeline's step time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from autotune.errors import ConfigError

TRACKS = {"compute": 1, "tp_cp": 2, "dp": 3, "p2p": 4}
TRACK_NAMES = {"compute": "compute", "tp_cp": "TP/CP (exposed)", "dp": "DP", "p2p": "P2P"}


def node_label(n: Any, d: dict) -> str:
    """``F mb3 c1`` for a compute chunk, ``dp c0 k2`` for a DP bucket group, else the node's kind."""
    kind = d.get("kind", "")
    if isinstance(n, tuple) and n and n[0] in ("F", "B"):
        return f"{n[0]} mb{d.get('microbatch', -1)} c{d.get('chunk', 0)}"
    if kind == "dp_reduce":
        return f"dp c{d.get('chunk', 0)} k{n[-1] if isinstance(n, tuple) else ''}"
    return str(kind or n)


def timeline_events(g, tl) -> Iterator[dict]:
    """Slices ``{"stage", "track", "name", "cat", "start_ms", "dur_ms", "args"}`` of the timeline."""
    nodes = g.nodes
    for n, d in nodes(data=True):
        s, f = tl.start_ms[n], tl.finish_ms[n]
        stream = "compute" if d.get("stream") == "compute" else "dp"
        parts = {k: float(v) for k, v in (d.get("parts") or {}).items() if v}
        yield {"stage": d["stage"], "track": stream, "name": node_label(n, d), "cat": d.get("kind", ""),
               "start_ms": s, "dur_ms": f - s, "args": parts}
        exposed = parts.get("exposed_tp_comm", 0.0) + parts.get("exposed_cp_comm", 0.0)
        if d.get("stream") == "compute" and exposed > 0:
            yield {"stage": d["stage"], "track": "tp_cp", "name": f"TP/CP {node_label(n, d)}", "cat": "tp_cp",
                   "start_ms": f - exposed, "dur_ms": exposed,
                   "args": {k: parts[k] for k in ("exposed_tp_comm", "exposed_cp_comm") if k in parts}}
    p2p_ms = float(g.graph.get("p2p_ms", 0.0))
    for u, v, e in g.edges(data=True):
        if e.get("kind") != "p2p" or p2p_ms <= 0:
            continue
        du, dv = nodes[u], nodes[v]
        if e.get("delay_ms", 0.0) > 0:      # async: the transfer delays the receiver after the send
            t0, dur, mode = tl.finish_ms[u], e["delay_ms"], "async"
        else:                               # blocking: the send is the last part of the sender's chunk
            t0, dur, mode = tl.finish_ms[u] - p2p_ms, p2p_ms, "blocking"
        yield {"stage": du["stage"], "track": "p2p", "name": f"send {node_label(u, du)} -> stage {dv['stage']}",
               "cat": "p2p", "start_ms": t0, "dur_ms": dur, "args": {"to_stage": dv["stage"], "mode": mode}}


def chrome_trace(g, tl, *, title: str = "") -> dict:
    """The Chrome trace (Trace Event Format JSON object): metadata naming every stage and track, then
    one "X" event per slice of :func:`timeline_events` (``ts``/``dur`` in µs)."""
    evs = list(timeline_events(g, tl))
    stages = sorted({e["stage"] for e in evs})
    out: list[dict] = []
    for st in stages:
        out.append({"ph": "M", "name": "process_name", "pid": st, "tid": 0, "args": {"name": f"pipeline stage {st}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": st, "tid": 0, "args": {"sort_index": st}})
        for key, tid in TRACKS.items():
            out.append({"ph": "M", "name": "thread_name", "pid": st, "tid": tid, "args": {"name": TRACK_NAMES[key]}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": st, "tid": tid, "args": {"sort_index": tid}})
    for e in sorted(evs, key=lambda e: (e["stage"], TRACKS[e["track"]], e["start_ms"])):
        out.append({"ph": "X", "name": e["name"], "cat": e["cat"], "pid": e["stage"], "tid": TRACKS[e["track"]],
                    "ts": e["start_ms"] * 1e3, "dur": e["dur_ms"] * 1e3, "args": e["args"]})
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"title": title, "step_time_ms": tl.step_time_ms, "source": "autotune simulator"}}


def write_chrome_trace(path: str | Path, g, tl, *, title: str = "") -> dict:
    """Write :func:`chrome_trace` as JSON to ``path``. Raises ConfigError if it cannot be written."""
    doc = chrome_trace(g, tl, title=title)
    from autotune.files import write_output_text
    write_output_text(path, json.dumps(doc), what="--trace")      # never through a symbolic link
    return doc


COLORS = {"F": "#4C72B0", "B": "#55A868", "dp_reduce": "#C44E52", "optimizer": "#8172B2", "param_gather": "#CCB974",
          "reclaim": "#64B5CD", "tp_cp": "#DD8452", "p2p": "#937860"}


def write_gantt(path: str | Path, g, tl, *, title: str = "") -> None:
    """A Gantt chart of the timeline (PNG via matplotlib, the ``plot`` extra): one row per stage and
    track, slices coloured by op; white gaps on the compute rows are the bubbles.

    Raises:
        ConfigError: matplotlib is not installed (``pip install -e '.[plot]' (in the autotune checkout)``) or ``path`` is
            not writable.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise ConfigError("--gantt needs matplotlib: pip install -e '.[plot]' (in the autotune checkout)") from None
    evs = list(timeline_events(g, tl))
    rows = sorted({(e["stage"], TRACKS[e["track"]]) for e in evs})
    y_of = {r: i for i, r in enumerate(rows)}
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for e in evs:
        key = e["name"].split(" ")[0] if e["track"] == "compute" and e["name"][:2] in ("F ", "B ") else \
            ("tp_cp" if e["track"] == "tp_cp" else "p2p" if e["track"] == "p2p" else e["cat"])
        bars.setdefault((y_of[(e["stage"], TRACKS[e["track"]])], key), []).append((e["start_ms"], e["dur_ms"]))
    fig, ax = plt.subplots(figsize=(14, max(3.0, 0.28 * len(rows) + 1.5)))
    for (y, key), xs in bars.items():
        ax.broken_barh(xs, (y - 0.4, 0.8), facecolors=COLORS.get(key, "#999999"), linewidth=0)
    names = {v: TRACK_NAMES[k] for k, v in TRACKS.items()}
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"stage {s} {names[t]}" for s, t in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, tl.step_time_ms)
    ax.set_xlabel("time in the step (ms)")
    ax.set_title(title or f"simulated step: {tl.step_time_ms:,.1f} ms (gaps on compute rows = bubbles)", fontsize=9)
    used = {k for _, k in bars}
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLORS.items() if k in used], fontsize=7,
              loc="upper right", ncol=4)
    fig.tight_layout()
    from autotune.files import open_output
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    try:
        with open_output(path, what="--gantt", binary=True) as fh:     # never through a symbolic link
            fig.savefig(fh, format=fmt, dpi=110)
    except OSError as e:
        raise ConfigError(f"cannot write {path}: {e}") from None
    finally:
        plt.close(fig)


__all__ = ["chrome_trace", "timeline_events", "write_chrome_trace", "write_gantt"]
