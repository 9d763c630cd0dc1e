"""How far a prediction can be trusted (issue 40): one central 80% interval from out-of-sample residuals, and
the published frontier a prediction is compared against.

**The interval.** ``bench/published.py --write-error-bands`` predicts every run of the development set
(``shared/reference/published-runs.yaml``) with each source left out (leave-one-source-out,
:func:`bench.published.cross_validate`) and stores the held-out residuals r = predicted / published tokens/s
per GPU - 1, with the regimes (:func:`plan_regimes`) of each run's plan, in ``autotune/data/error_bands.yaml``
(``interval``). A prediction's interval is built from the residuals of the regimes its plan falls in
(:func:`interval_for`):

* a regime with at least :data:`MIN_REGIME_ROWS` rows: its own 10th and 90th percentile
  (:func:`percentile`, the exclusive rule: a new row falls below the k-th of n sorted residuals with
  probability k / (n + 1));
* a regime with fewer rows: the pooled residuals' percentiles (all rows), said so;
* a regime no development row is in ("outside the development set"): the pooled percentiles widened by M on
  each side (``low - M .. high + M``), M the largest absolute residual pooled, said so: the regime's own, unseen
  error adds to the error seen everywhere (taken no smaller than the largest error seen); this is the explicit
  penalty the ranking reads (:func:`conservative_factor`). The additive form was chosen after seeing the 405B
  ranking prefer a plan outside every published run under ``max(high, M)`` (docs/fidelity.md names it);

and the plan's interval is the union (lowest low end, highest high end) over its regimes: the regime the model
is least sure of decides. Since r = predicted / measured throughput - 1 = measured / predicted step time - 1,
the measured step time lies in ``predicted x (1 + low) .. predicted x (1 + high)`` and the measured tokens/s
and MFU in ``predicted / (1 + high) .. predicted / (1 + low)``.

**The frontier.** ``autotune/data/published_frontier.yaml`` (also written by ``bench/published.py``, so the CLI
does not read ``shared/``) holds the best published run per (GPU family, precision class, model class) with its
source; :func:`frontier_for` returns it, and the report says when a prediction is above it.

Constants named here were chosen before looking at any residual (docs/fidelity.md, "Constants chosen while
looking at errors" lists those that were not).
"""

from __future__ import annotations

import dataclasses
import math
from functools import lru_cache
from typing import Any, Iterable, Mapping, Sequence

#: the central interval's quantiles: 10th and 90th percentile (a central 80% interval)
QUANTILES = (0.1, 0.9)
#: the fewest rows a regime needs for its own interval: with the exclusive rule the 10th percentile of n rows
#: sits at rank 0.1 (n + 1), inside the sample only for n >= 9 (fewer rows would extrapolate past the smallest)
MIN_REGIME_ROWS = 9
#: "small TP": TP <= this for a model with a hidden size >= :data:`SMALL_TP_MIN_HIDDEN`. Every published run
#: of such a model in the development set (70B, 405B) uses TP >= 4; chosen from the plans, not the residuals.
SMALL_TP_MAX_DEGREE = 2
SMALL_TP_MIN_HIDDEN = 8192


def precision_class(precision: str) -> str:
    """``bf16``; ``fp8`` (per-tensor / per-row scaled FP8: tensorwise, rowwise, delayed); ``mxfp8`` (1 x 32
    block-scaled, Blackwell). The interval's precision regime and the frontier's precision key."""
    if precision == "mxfp8":
        return "mxfp8"
    return "fp8" if str(precision).startswith("fp8") else "bf16"


#: regime name -> words for the printed sentence
REGIME_WORDS = {"gpu": "{} GPUs", "precision": "{} precision", "tp_overlap": "TP > 1 without TP comm overlap",
                "small_tp": "small TP (<= 2) on a large model", "cp": "CP > 1", "fsdp": "FSDP (ZeRO >= 2)",
                "cpu_offload": "CPU activation offloading", "moe": "mixture-of-experts models"}


def plan_regimes(plan: Any, gpu: str | None, hidden_size: int | None = None) -> list[str]:
    """The regimes of ``plan`` on ``gpu`` the model is least sure of (issue 40), as names
    ``gpu:<family>``, ``precision:<bf16|fp8|mxfp8>``, ``tp_overlap:off`` (TP > 1 without TP communication
    overlap, or without async collectives), ``small_tp`` (TP <= :data:`SMALL_TP_MAX_DEGREE` on a model of hidden
    size >= :data:`SMALL_TP_MIN_HIDDEN`), ``cp`` (CP > 1), ``fsdp`` (ZeRO stage >= 2: parameters or gradients
    sharded, FSDP), ``cpu_offload`` (``cpu_offload_layers`` >= 1: no development run has it, so its plans get the
    widest interval and rank last among equals). ``plan``: a :class:`autotune.spec.plan.Plan` (or anything with
    its fields)."""
    from autotune.spec.hardware import gpu_family

    out = [f"gpu:{gpu_family(gpu) or gpu}", f"precision:{precision_class(getattr(plan, 'precision', 'bf16'))}"]
    if plan.tp_degree > 1 and not (plan.tp_comm_overlap and plan.async_collectives):
        out.append("tp_overlap:off")
    if hidden_size is not None and hidden_size >= SMALL_TP_MIN_HIDDEN and plan.tp_degree <= SMALL_TP_MAX_DEGREE:
        out.append("small_tp")
    if plan.cp_degree > 1:
        out.append("cp")
    if plan.zero_stage >= 2 and plan.dp_degree * plan.cp_degree > 1:
        out.append("fsdp")
    if getattr(plan, "cpu_offload_layers", 0):
        out.append("cpu_offload")
    return out


def regime_words(name: str) -> str:
    """``gpu:b200`` -> "b200 GPUs", ``cp`` -> "CP > 1"."""
    kind, _, val = name.partition(":")
    w = REGIME_WORDS.get(kind, name)
    return w.format(val) if "{}" in w else w


def percentile(xs: Sequence[float], p: float) -> float:
    """The ``p`` quantile (0 < p < 1) of ``xs`` by the exclusive rule (Hyndman & Fan 1996 definition 6, the
    Weibull plotting position: rank p (n + 1), linear between ranks, extrapolated linearly past the ends):
    a new draw from the same distribution falls below the k-th of n sorted values with probability
    k / (n + 1), so the rule is unbiased for a predictive interval. Raises ValueError for an empty ``xs``."""
    s = sorted(float(x) for x in xs)
    n = len(s)
    if n == 0:
        raise ValueError("percentile of no values")
    if n == 1:
        return s[0]
    h = p * (n + 1)                 # 1-based rank
    j = min(max(int(math.floor(h)), 1), n - 1)
    return s[j - 1] + (h - j) * (s[j] - s[j - 1])


def regime_table(rows: Iterable[tuple[float, Sequence[str]]]) -> dict[str, Any]:
    """The interval data of residual rows ``(r, regimes)``: ``{"pooled": {num_runs, low, high, max_abs},
    "regimes": {name: {num_runs, low, high} (low/high only with >= MIN_REGIME_ROWS rows)}}``; residuals as
    fractions. Raises ValueError for no rows."""
    rows = [(float(r), list(g)) for r, g in rows]
    if not rows:
        raise ValueError("no residual rows")
    allr = [r for r, _ in rows]
    pooled = {"num_runs": len(allr), "low": percentile(allr, QUANTILES[0]), "high": percentile(allr, QUANTILES[1]),
              "max_abs": max(abs(r) for r in allr)}
    regimes: dict[str, Any] = {}
    for name in sorted({g for _, gs in rows for g in gs}):
        rs = [r for r, gs in rows if name in gs]
        e: dict[str, Any] = {"num_runs": len(rs)}
        if len(rs) >= MIN_REGIME_ROWS:
            e.update(low=percentile(rs, QUANTILES[0]), high=percentile(rs, QUANTILES[1]))
        regimes[name] = e
    return {"pooled": pooled, "regimes": regimes}


@dataclasses.dataclass(frozen=True)
class Interval:
    """A prediction's central 80% interval as residual bounds (predicted / measured throughput - 1):
    ``low`` <= r <= ``high``. ``regimes``: (regime, rows, how it was used: "own" | "pooled" | "outside").
    ``num_pooled``: the development rows pooled."""

    low: float
    high: float
    regimes: tuple[tuple[str, int, str], ...]
    num_pooled: int

    def throughput(self, predicted: float) -> tuple[float, float]:
        """(low, high) of the measured value of a throughput-like ``predicted`` (tokens/s, MFU, TFLOP/s)."""
        return predicted / (1 + self.high), predicted / (1 + self.low)

    def step_time(self, predicted_ms: float) -> tuple[float, float]:
        """(low, high) of the measured step time (ms)."""
        return predicted_ms * (1 + self.low), predicted_ms * (1 + self.high)

    @property
    def width(self) -> float:
        """(high - low) of the throughput interval as a fraction of the prediction."""
        return 1 / (1 + self.low) - 1 / (1 + self.high)

    @property
    def outside(self) -> list[str]:
        return [g for g, _, how in self.regimes if how == "outside"]

    def basis(self) -> str:
        """What the interval rests on, in words."""
        own = [f"{regime_words(g)}: {n} runs" for g, n, how in self.regimes if how == "own"]
        few = [f"{regime_words(g)} ({n})" for g, n, how in self.regimes if how == "pooled"]
        out = [regime_words(g) for g, _, how in self.regimes if how == "outside"]
        parts = []
        if own:
            parts.append("regimes " + "; ".join(own))
        if few:
            parts.append(f"too few runs for {', '.join(few)}: all {self.num_pooled} pooled")
        if out:
            parts.append(f"no published run with {', '.join(out)}: widened by the largest error seen")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"residual_low": self.low, "residual_high": self.high, "width_frac": self.width,
                "num_pooled_runs": self.num_pooled,
                "regimes": [{"regime": g, "num_runs": n, "used": how} for g, n, how in self.regimes]}


def interval_from_table(table: Mapping[str, Any], regimes: Sequence[str]) -> Interval:
    """The interval of a plan in ``regimes`` from ``table`` (:func:`regime_table`), by the module docstring's
    rules (own / pooled / outside, union over the regimes)."""
    pooled = table["pooled"]
    lows, highs, used = [], [], []
    for g in regimes:
        e = (table.get("regimes") or {}).get(g) or {"num_runs": 0}
        n = int(e.get("num_runs", 0))
        if n >= MIN_REGIME_ROWS and "low" in e:
            lows.append(float(e["low"]))
            highs.append(float(e["high"]))
            used.append((g, n, "own"))
        elif n > 0:
            lows.append(float(pooled["low"]))
            highs.append(float(pooled["high"]))
            used.append((g, n, "pooled"))
        else:
            m = float(pooled["max_abs"])
            lows.append(float(pooled["low"]) - m)
            highs.append(float(pooled["high"]) + m)
            used.append((g, 0, "outside"))
    if not lows:
        lows, highs = [float(pooled["low"])], [float(pooled["high"])]
    return Interval(low=min(lows), high=max(highs), regimes=tuple(used), num_pooled=int(pooled["num_runs"]))


@lru_cache(maxsize=None)
def _interval_data() -> dict[str, Any] | None:
    from importlib import resources

    import yaml

    f = resources.files("autotune").joinpath("data", "error_bands.yaml")
    if not f.is_file():
        return None
    return (yaml.safe_load(f.read_text()) or {}).get("interval")


def interval_data() -> dict[str, Any] | None:
    """The ``interval`` section of ``autotune/data/error_bands.yaml`` (None when absent): ``pooled``,
    ``regimes`` (:func:`regime_table`, fractions), ``coverage`` (leave-one-source-out coverage on the
    development set), ``rows`` (the residual rows it was built from), ``source``, ``date``."""
    return _interval_data()


@lru_cache(maxsize=None)
def moe_interval_data() -> dict[str, Any] | None:
    """The ``interval_moe`` section of ``autotune/data/error_bands.yaml`` (None when absent), written by
    ``python bench/published_moe.py --write-error-bands`` from the MoE development set
    (``shared/reference/published-moe-runs.yaml``): the same keys as :func:`interval_data`, one regime
    (``moe``) over every MoE run. Kept apart from the dense table, so MoE residuals never widen a dense plan's
    interval."""
    from importlib import resources

    import yaml

    f = resources.files("autotune").joinpath("data", "error_bands.yaml")
    if not f.is_file():
        return None
    return (yaml.safe_load(f.read_text()) or {}).get("interval_moe")


def interval_for(plan: Any, gpu: str | None, hidden_size: int | None = None, moe: bool = False) -> Interval | None:
    """The shipped central 80% interval of a prediction for ``plan`` on ``gpu`` (module docstring), or None
    when no interval data is shipped. ``moe``: the model is a mixture of experts; its interval is the union
    of the dense regimes' and the ``moe`` regime of :func:`moe_interval_data` (the MoE development set's
    residuals: the error of the MoE terms, which no dense run measures), and says which."""
    d = interval_data()
    if not d:
        return None
    iv = interval_from_table(d, plan_regimes(plan, gpu, hidden_size))
    md = moe_interval_data() if moe else None
    if not md:
        return iv
    mv = interval_from_table(md, ["moe"])
    return Interval(low=min(iv.low, mv.low), high=max(iv.high, mv.high), regimes=iv.regimes + mv.regimes,
                    num_pooled=iv.num_pooled)


@lru_cache(maxsize=65536)
def conservative_factor(plan: Any, gpu: str | None, hidden_size: int | None = None, moe: bool = False) -> float:
    """1 / (1 + high) of ``plan``'s interval (:func:`interval_for`; 1 without interval data): the factor that
    takes a predicted MFU to the low end of its interval, the conservative estimate candidates are ranked by
    (docs/search.md, "Ranking by the conservative estimate")."""
    iv = interval_for(plan, gpu, hidden_size, moe)
    return 1.0 / (1.0 + iv.high) if iv is not None else 1.0


def interval_sentence(iv: Interval, *, mfu: float, tokens_per_s: float, step_ms: float) -> str:
    """The one sentence the reports print for a prediction's interval (fractions in, % out)."""
    m0, m1 = iv.throughput(mfu)
    t0, t1 = iv.throughput(tokens_per_s)
    s0, s1 = iv.step_time(step_ms)
    cap = ""
    if mfu > 0 and m1 > 1.0:        # no run exceeds the dense peak: the high end stops there
        t1, s0, m1 = tokens_per_s / mfu, step_ms * mfu, 1.0
        cap = " (high end capped at the dense BF16 peak)"
    d = interval_data() or {}
    cov = d.get("coverage") or {}
    covtxt = (f"; it held {cov['covered']} of {cov['rows']} published runs with their source left out"
              if cov.get("rows") else "")
    mcov = (moe_interval_data() or {}).get("coverage") or {}
    if any(g == "moe" for g, _, _ in iv.regimes) and mcov.get("rows"):
        covtxt += (f"; the MoE regime held {mcov['covered']} of {mcov['rows']} published MoE runs with their "
                   "source left out")
    return (f"MFU {100 * m0:.1f}-{100 * m1:.1f}%, {t0:,.0f}-{t1:,.0f} tokens/s per GPU, step {s0:,.0f}-{s1:,.0f} ms{cap}: "
            f"80% of published runs measured within the model's held-out errors {100 * iv.low:+.1f}..{100 * iv.high:+.1f}% "
            f"(predicted / measured - 1; {iv.basis()}){covtxt}")


# ------------------------------------------------------------------ frontier

@lru_cache(maxsize=None)
def _frontier() -> dict[str, Any]:
    from importlib import resources

    import yaml

    f = resources.files("autotune").joinpath("data", "published_frontier.yaml")
    if not f.is_file():
        return {}
    return yaml.safe_load(f.read_text()) or {}


def frontier_for(gpu: str | None, precision: str, model_class: str = "dense") -> dict[str, Any] | None:
    """The best published run (highest model TFLOP/s per GPU, causal convention) for ``gpu``'s family,
    ``precision``'s class (:func:`precision_class`) and ``model_class`` (dense | moe), from
    ``autotune/data/published_frontier.yaml``, or None when none is published. Keys: gpu, precision_class,
    model_class, model, num_gpus, tokens_per_s_per_gpu, tflops_per_gpu, source, plan."""
    from autotune.spec.hardware import gpu_family

    fam = gpu_family(gpu) or gpu
    pc = precision_class(precision)
    for e in _frontier().get("frontier") or ():
        if e.get("gpu") == fam and e.get("precision_class") == pc and e.get("model_class") == model_class:
            return dict(e)
    return None


def frontier_sentence(tflops_per_gpu: float, gpu: str | None, precision: str,
                      model_class: str = "dense") -> str | None:
    """"above the published frontier: ..." when ``tflops_per_gpu`` (causal model TFLOP/s per GPU) exceeds the
    best published run of :func:`frontier_for`, naming that run; else None."""
    f = frontier_for(gpu, precision, model_class)
    if not f or tflops_per_gpu <= float(f["tflops_per_gpu"]):
        return None
    return (f"{tflops_per_gpu:,.0f} TFLOP/s per GPU is {100 * (tflops_per_gpu / f['tflops_per_gpu'] - 1):.0f}% above "
            f"the best published {f['gpu']} {f['precision_class']} {model_class} run: {f['model']} on {f['num_gpus']:,} "
            f"GPUs, {f['tflops_per_gpu']:,.0f} TFLOP/s ({f['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU; "
            f"{f['source']}); no published run confirms a figure this high")


def published_plan(model: str, gpu: str | None, precision: str, num_gpus: int, global_batch_size: int,
                   num_layers: int, engine: str | None = None) -> tuple[Any, dict[str, Any]] | None:
    """The plan of the fastest published run of ``model`` on ``gpu``'s family in ``precision``'s class (else in
    any precision class) from ``autotune/data/published_frontier.yaml`` (``published_plans``, as
    ``bench/published.py`` predicts it), at ``num_gpus`` and ``global_batch_size`` (sequences): the same TP,
    PP, CP, schedule, virtual stages, micro-batch size and settings, DP = GPUs / (TP PP CP), micro-batches =
    batch / (micro-batch size x DP); with ``engine``, only a run of that engine (a torchtitan plan compiles, a
    Megatron-LM one does not). Returns (Plan, the stored entry) or None when there is none or it does not
    divide this target."""
    from autotune.errors import AutotuneError
    from autotune.spec.hardware import gpu_family
    from autotune.spec.plan import Plan

    fam = gpu_family(gpu) or gpu
    cands = [e for e in _frontier().get("published_plans") or () if e.get("model") == model and e.get("gpu") == fam
             and (engine is None or e.get("engine") == engine)]
    cands.sort(key=lambda e: e.get("precision_class") != precision_class(precision))
    for e in cands:
        d = dict(e["plan"])
        tp, pp, cp, mbs = int(d["tp_degree"]), int(d["pp_degree"]), int(d["cp_degree"]), int(d["micro_batch_size"])
        if num_gpus % (tp * pp * cp):
            continue
        dp = num_gpus // (tp * pp * cp)
        if global_batch_size % (mbs * dp):
            continue
        d.update(dp_degree=dp, num_micro_batches=global_batch_size // (mbs * dp))
        if dp * cp == 1:
            d.update(zero_stage=0, param_gather_overlap=False, dp_grad_reduce_overlap=False)
        try:
            plan = Plan.from_dict(d, source="published_frontier.yaml")
        except AutotuneError:
            continue
        if sum(plan.layers_per_virtual_stage(num_layers)) != num_layers:
            continue
        return plan, e
    return None


__all__ = ["Interval", "MIN_REGIME_ROWS", "QUANTILES", "RankBasis", "conservative_factor", "frontier_for",
           "frontier_sentence", "interval_data", "interval_for", "interval_from_table", "interval_sentence",
           "max_conservative_factor", "moe_interval_data", "percentile", "plan_regimes", "precision_class",
           "published_plan", "regime_table"]


@lru_cache(maxsize=None)
def max_conservative_factor(moe: bool = False) -> float:
    """The largest :func:`conservative_factor` any plan can get: 1 / (1 + the lowest high end a plan's interval
    can have), the pooled or any regime's own 90th percentile (for ``moe``, no lower than the ``moe`` regime's
    high end, which every MoE plan's interval includes); 1 without interval data. The convergence stop's
    bound on what an untried plan could reach (:mod:`autotune.search.convergence`)."""
    d = interval_data()
    if not d:
        return 1.0
    highs = [float(d["pooled"]["high"])] + [float(e["high"]) for e in (d.get("regimes") or {}).values()
                                            if "high" in e and int(e.get("num_runs", 0)) >= MIN_REGIME_ROWS]
    lowest = min(highs)
    md = moe_interval_data() if moe else None
    if md:
        lowest = max(lowest, interval_from_table(md, ["moe"]).high)
    return 1.0 / (1.0 + lowest)


@dataclasses.dataclass(frozen=True)
class RankBasis:
    """What the conservative ranking of one target needs: its GPU, the model's hidden size
    (:func:`plan_regimes`) and whether it is a mixture of experts (:func:`interval_for`). ``factor(plan)`` =
    :func:`conservative_factor`; ``factor_max`` = :func:`max_conservative_factor`."""

    gpu: str | None
    hidden_size: int | None = None
    moe: bool = False

    def factor(self, plan: Any) -> float:
        return conservative_factor(plan, self.gpu, self.hidden_size, self.moe)

    @property
    def factor_max(self) -> float:
        return max_conservative_factor(self.moe)
