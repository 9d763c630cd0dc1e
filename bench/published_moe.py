"""Benchmark: predictions against published mixture-of-experts training runs (no GPU needed; issue 38).

Reads ``../shared/reference/published-moe-runs.yaml`` (or ``--runs FILE``): 9 published MoE runs (Megatron-Bridge
on H100 / B200 / GB200, Megatron-LM's Mixtral figure) with their plans. Each run's plan becomes an autotune
:class:`~autotune.spec.plan.Plan` (:func:`plan_for`: the published degrees, and the settings of the
Megatron-Bridge performance recipe of that model, GPU and precision, :data:`RECIPES`, each with its source),
is simulated with the shipped calibration for the ``megatron`` engine, and is compared with the published
tokens/s per GPU and model TFLOP/s per GPU. With ``--tune N`` a tuned plan (``N`` trials of the default space
on the same target) is simulated beside the published one.

Nothing is fitted to these rows. The only MoE constants are the grouped-GEMM efficiencies measured on an H200
(autotune/data/grouped_gemm.yaml), not chosen on these rows, so a source's leave-one-source-out error is its error
under the shipped model: the table's held-out columns say so rather than repeat the figures.

TFLOP/s per GPU is Megatron-Bridge's model-FLOP count (causal attention, the active path, Megatron-LM
``num_floating_point_operations``), which ``autotune.cost.flops.model_flops_per_token`` follows; the published
TFLOP/s / tok/s ratio checks that count row by row (``flops`` column).

With ``--write-error-bands`` the rows' residuals become the ``interval_moe`` section of
``autotune/data/error_bands.yaml``: the ``moe`` regime every MoE prediction's 80% interval includes
(:func:`autotune.spec.trust.interval_for`), with its leave-one-source-out coverage (:func:`moe_interval`).

    python bench/published_moe.py [--runs FILE] [--tune 40] [--markdown docs/moe-fidelity.md] [--write-error-bands]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.cost.flops import model_flops_per_token  # noqa: E402
from autotune.cost.memory import estimate_memory  # noqa: E402
from autotune.cost.simulator import SimulatedEvaluator  # noqa: E402
from autotune.errors import AutotuneError  # noqa: E402
from autotune.search.space import derive_stage_layers  # noqa: E402
from autotune.spec.engines import get_engine  # noqa: E402
from autotune.spec.hardware import ClusterSpec, make_cluster  # noqa: E402
from autotune.spec.models import get_builtin_model  # noqa: E402
from autotune.spec.plan import Plan, Workload, validate_plan  # noqa: E402

DEFAULT_RUNS = ROOT.parent / "shared" / "reference" / "published-moe-runs.yaml"
#: the dev set's model keys -> autotune's built-in names
MODELS = {"deepseek_v3": "deepseek-v3", "qwen3_30b_a3b": "qwen3-30b-a3b", "qwen3_235b_a22b": "qwen3-235b-a22b",
          "gpt_oss_120b": "gpt-oss-120b", "mixtral_8x7b": "mixtral-8x7b"}
PRECISIONS = {"bf16": "bf16", "fp8_cs": "fp8_tensorwise", "mxfp8": "mxfp8"}
#: Megatron-Bridge performance recipes (NVIDIA-NeMo/Megatron-Bridge @ 067f987df,
#: src/megatron/bridge/perf_recipes/<family>/<gpu>/<model>.py, the config function named in each entry): the
#: settings beyond the degrees. The rows' containers (26.04-26.08) may differ from that commit in details.
#: dispatcher: ``flex`` for HybridEP / DeepEP (moe_token_dispatcher_type "flex"), else ``alltoall``;
#: overlap: overlap_moe_expert_parallel_comm; modules: recompute_modules (selective).
RECIPES: dict[str, dict[str, Any]] = {
    # qwen/h100/qwen3_moe.py qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs_config: hybridep flex, no a2a overlap,
    # recompute off
    "mb2606-qwen30-h100": {"dispatcher": "flex", "overlap": False},
    # qwen3_235b_a22b_pretrain_256gpu_h100_fp8cs_config: alltoall, overlap_moe_expert_parallel_comm=True
    "mb260401-qwen235-h100": {"dispatcher": "alltoall", "overlap": True},
    # at the row's container (26.04.01 summary, commit 21d102f5e): scripts/performance/configs/gpt_oss/
    # gpt_oss_workload_base_configs.py GPT_OSS_120B_PRETRAIN_CONFIG_H100_BF16_V2 (GBS 1280) = V1: PP 4, EP 8,
    # recompute [layernorm, moe_act], no moe_flex_dispatcher_backend override; gpt_oss_llm_pretrain.py keeps
    # src/megatron/bridge/recipes/gpt_oss/gpt_oss.py gpt_oss_120b_pretrain_config's
    # moe_token_dispatcher_type = "alltoall" (its "deepep" flex backend unused without the flex type), no a2a
    # overlap, no CUDA graphs. (The later perf_recipes gpt_oss/common.py at 067f987df uses flex / hybridep.)
    "mb260401-gptoss120-h100-bf16": {"dispatcher": "alltoall", "overlap": False, "modules": ("layernorm", "moe_act")},
    # deepseek/b200/deepseek_v3.py deepseek_v3_pretrain_256gpu_b200_fp8mx_config: recompute [mla_up_proj, mlp],
    # flex (deepep), overlap_moe_expert_parallel_comm=True
    "mb260401-dsv3-b200": {"dispatcher": "flex", "overlap": True, "modules": ("mla_up_proj", "mlp")},
    # at the row's container (26.04.01 summary, commit 21d102f5e): scripts/performance/configs/qwen/
    # qwen3_workload_base_configs.py QWEN3_30B_A3B_PRETRAIN_CONFIG_B200_FP8_MX_V1 = ..._B200_BF16_V1: hybridep flex,
    # CUDA graphs attn + moe_router + moe_preprocess, moe_a2a_overlap left at WorkloadBaseConfig's False (the
    # a2a overlap came later: perf_recipes/qwen/b200/qwen3_moe.py at 067f987df, "Under partial CG the MoE a2a
    # (~29% of kernel time here) is otherwise fully exposed")
    "mb260401-qwen30-b200": {"dispatcher": "flex", "overlap": False},
    # qwen3_235b_a22b_pretrain_64gpu_b200_fp8mx_config: alltoall, no a2a overlap, recompute off
    "mb260401-qwen235-b200": {"dispatcher": "alltoall", "overlap": False},
    # deepseek/gb200/deepseek_v3.py deepseek_v3_pretrain_256gpu_gb200_fp8mx_config: recompute [mla_up_proj],
    # hybridep flex with a2a overlap (_enable_deepseek_full_iteration_mxfp8)
    "mb2608-dsv3-gb200": {"dispatcher": "flex", "overlap": True, "modules": ("mla_up_proj",)},
    # qwen/gb200/qwen3_moe.py qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config: hybridep flex
    # (_enable_hybridep_full_iteration_mxfp8 sets the a2a overlap)
    "mb2608-qwen30-gb200": {"dispatcher": "flex", "overlap": True},
    # Megatron-LM megatron/core/transformer/moe/README.md: alltoall, dropless
    "mlm-readme-mixtral8x7b-h100": {"dispatcher": "alltoall", "overlap": False},
}


def plan_for(run: dict[str, Any], model) -> Plan:
    """The plan of a published run: its TP / PP / VP / CP / EP / DP, micro-batch and global batch, sequence
    parallelism with TP > 1, the distributed optimizer (ZeRO-1) with overlapped gradient reduction, BF16
    gradient reduction and FP8 parameters with an FP8 recipe (Megatron-Bridge ``_benchmark_common`` and
    ``_perf_precision``: ``grad_reduce_in_fp32 = False``; fp8_param_gather in its FP8 mixed-precision
    configs), grouped GEMM, and the recipe's dispatcher, a2a overlap and recompute modules (:data:`RECIPES`).
    Uneven layer splits take the layers off the end stages (``derive_stage_layers`` wide ends)."""
    tp, pp, cp = run.get("tp", 1), run.get("pp", 1), run.get("cp", 1)
    vp = run.get("vp") or 1
    dp = run["gpus"] // (tp * pp * cp)
    mbs = run.get("mbs", 1)
    rec = RECIPES.get(run["id"], {})
    precision = PRECISIONS[run["precision"]]
    sched = "interleaved_1f1b" if vp > 1 else "1f1b"
    modules = rec.get("modules")
    return Plan(tp_degree=tp, pp_degree=pp, cp_degree=cp, dp_degree=dp, vpp_degree=vp, micro_batch_size=mbs,
                num_micro_batches=run["gbs"] // (mbs * dp), pipeline_schedule=sched, sequence_parallel=tp > 1,
                zero_stage=1, recompute="selective" if modules else "none", recompute_modules=modules,
                precision=precision, grad_reduce_in_bf16=True, fp8_param_gather=precision != "bf16",
                ep_degree=run["ep"], etp_degree=run.get("etp", 1), moe_dispatcher=rec.get("dispatcher", "alltoall"),
                moe_a2a_overlap=bool(rec.get("overlap")) and run["ep"] > 1,
                stage_layers=derive_stage_layers(model.num_layers, pp * vp, "ends", wide_ends=True))


def predict(run: dict[str, Any]) -> dict[str, Any]:
    model = get_builtin_model(MODELS[run["model"]])
    cluster = make_cluster(run["gpu"], run["gpus"])
    plan = plan_for(run, model)
    w = Workload(seq_len=run["seq"], global_batch_size=run["gbs"])
    validate_plan(plan, model, run["gpus"], w, gpu=cluster.gpu)
    eng = get_engine("megatron")
    # the step time does not depend on capacity (as bench/published.py): time on a GPU with room, and give the
    # memory model's verdict for the real capacity beside it
    roomy = ClusterSpec(gpu=dataclasses.replace(cluster.gpu, hbm_gib=1e6), num_gpus=run["gpus"], fabric=cluster.fabric)
    ev = SimulatedEvaluator(model=model, cluster=roomy, workload=w, engine=eng)
    r = ev.evaluate(plan)
    mem = estimate_memory(model, plan, cluster.gpu, w, fragmentation=ev.costs.fragmentation(), engine=eng)
    tok = run["gbs"] * run["seq"] / (r.step_time_ms / 1e3) / run["gpus"]
    fpt = model_flops_per_token(model, run["seq"])
    out = {"id": run["id"], "source": run.get("source", ""), "model": MODELS[run["model"]], "gpu": run["gpu"],
           "gpus": run["gpus"], "precision": run["precision"], "plan": plan, "pred_tok": tok,
           "pred_tflops": tok * fpt / 1e12, "pub_tok": run.get("tokens_per_s_per_gpu"),
           "pub_tflops": run.get("tflops_per_gpu"), "fits": mem.fits, "peak_gib": mem.peak_bytes / 2**30,
           "usable_gib": cluster.gpu.usable_hbm_bytes / 2**30, "flops_per_token": fpt,
           "breakdown": {k: v for k, v in r.breakdown_ms.items() if v}, "model_obj": model, "cluster": cluster,
           "workload": w}
    if out["pub_tok"] and out["pub_tflops"]:
        out["pub_flops_per_token"] = out["pub_tflops"] * 1e12 / out["pub_tok"]
    ref_tok = out["pub_tok"] or (out["pub_tflops"] * 1e12 / fpt)
    out["ref_tok"] = ref_tok
    out["err"] = tok / ref_tok - 1
    return out


def tune(row: dict[str, Any], trials: int) -> tuple[Plan | None, float | None]:
    """The best plan of ``trials`` simulated trials of the default space on the run's target, and its tok/s/GPU."""
    import optuna

    from autotune.tune.tuner import Tuner

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    t = Tuner(model=row["model_obj"], cluster=row["cluster"], workload=row["workload"], backend="simulated",
              engine="megatron", storage="sqlite:///:memory:")
    t.run(n_trials=trials)
    best = t.best()
    if best is None:
        return None, None
    plan, result = best
    return plan, row["workload"].global_batch_tokens / (result.step_time_ms / 1e3) / row["gpus"]


#: rows whose recipe captures the whole iteration in CUDA graphs (RECIPES comments:
#: _enable_deepseek_full_iteration_mxfp8, _enable_hybridep_full_iteration_mxfp8): no host time per layer
FULL_ITERATION_GRAPHS = frozenset({"mb2608-dsv3-gb200", "mb2608-qwen30-gb200"})


def host_constants(measured: dict[str, Any]) -> tuple[float, float]:
    """(H, S) in ms per MoE layer and micro-batch, forward + backward, from bench/moe_layer_host.py rows of the
    ``alltoall`` dispatcher: H = the median over shapes of the wall time at the smallest token count (the layer
    is host-bound there, so its wall time is the host's issue time), S = the median exposed host time
    (wall - GPU busy) over the rows whose GPU time exceeds H (the drain at the token-count sync)."""
    rows = [r for r in measured["rows"] if r.get("dispatcher") == "alltoall" and "wall_ms" in r]
    small = min(r["tokens"] for r in rows)
    h = statistics.median(r["wall_ms"] for r in rows if r["tokens"] == small)
    s = statistics.median(r["exposed_host_ms"] for r in rows if r["gpu_busy_ms"] > h)
    return h, s


def host_term_ms(r: dict[str, Any], h: float, s: float) -> float:
    """The step-time addition of an eager MoE layer's host time for row ``r`` (ms): on the busiest stage,
    per MoE layer and micro-batch, max(0, H - G) + S, G the predicted GPU time of one layer and micro-batch
    ((step - bubble - exposed DP / PP - optimizer) / (layers on the stage x micro-batches)). 0 for rows whose
    recipe graphs the whole iteration. Assumes the flex dispatcher (DeepEP / HybridEP) syncs its token counts
    to the host as alltoall does (DeepEP's normal-mode dispatch returns the per-expert counts on the host)."""
    if r["id"] in FULL_ITERATION_GRAPHS:
        return 0.0
    p, m, bd, step = r["plan"], r["model_obj"], r["breakdown"], _step_ms(r)
    other = sum(bd.get(k, 0.0) for k in ("bubble", "exposed_dp_comm", "exposed_pp_comm", "optimizer"))
    layers = max(p.stage_layers) * max(1, p.effective_vpp) if p.stage_layers else m.num_layers / p.pp_degree
    moe_layers = layers * m.num_moe_layers / m.num_layers
    g = (step - other) / (layers * p.num_micro_batches)
    return moe_layers * p.num_micro_batches * (max(0.0, h - g) + s)


def _step_ms(r: dict[str, Any]) -> float:
    """The predicted step time of row ``r``, ms (from its predicted tokens/s per GPU)."""
    return r["workload"].global_batch_size * r["workload"].seq_len / (r["pred_tok"] * r["gpus"]) * 1e3


def host_term_lines(rows: list[dict[str, Any]], measured: dict[str, Any]) -> list[str]:
    h, s = host_constants(measured)
    meta = measured.get("meta", {})
    out = ["", f"with the measured eager MoE-layer host time (H {h:.2f} ms, S {s:.2f} ms per layer-micro-batch; "
           f"{meta.get('gpu', '?')}, {meta.get('cpu', '?')}, torch {meta.get('torch', '?')}, {meta.get('date_utc', '?')}):"]
    errs = []
    for r in rows:
        step, add = _step_ms(r), host_term_ms(r, h, s)
        tok = r["pred_tok"] * step / (step + add)
        e = tok / r["ref_tok"] - 1
        errs.append(e)
        out.append(f"  {r['id']:30s} step {step:9,.0f} + {add:8,.0f} ms  pred {tok:8,.0f} tok/s  err {e:+7.1%}"
                   + ("  (full-iteration CUDA graphs: none added)" if r["id"] in FULL_ITERATION_GRAPHS else ""))
    out.append(f"  all {len(errs)}: MAE {statistics.mean(abs(e) for e in errs):.1%}, mean signed "
               f"{statistics.mean(errs):+.1%}")
    return out


def release(source: str) -> str:
    """The source a row is held out with: the container release in its ``source`` (``26.04.01``, ``26.08``: one
    performance table of one release, as ``megatron_bridge_25_11`` is for the dense set), else the source text's
    first word (``NVIDIA/Megatron-LM``)."""
    m = re.search(r"\b(\d\d\.\d\d(?:\.\d\d)?)\b", source or "")
    return m.group(1) if m else ((source or "?").split() or ["?"])[0]


def moe_interval(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``moe`` regime's interval data from the predicted rows (residual r = predicted / published tok/s - 1;
    no constant of the model was chosen on them, so r is each row's held-out residual), and its
    leave-one-source-out coverage: for each source (:func:`release`), the interval built from the other sources'
    rows only (:func:`autotune.spec.trust.regime_table` / ``interval_from_table``: with fewer than
    ``MIN_REGIME_ROWS`` rows the pooled percentiles of those rows), each of its rows covered when its residual
    lies inside. Returns {"table", "covered", "rows", "median_width", "per_source", "lines"}."""
    from autotune.spec.trust import interval_from_table, regime_table

    res = [(r, release(r["source"]), r["err"]) for r in rows]
    per_source: dict[str, list[int]] = {}
    out = []
    for src in sorted({s for _, s, _ in res}):
        others = [(e, ["moe"]) for _, s, e in res if s != src]
        if not others:
            continue
        iv = interval_from_table(regime_table(others), ["moe"])
        for r, s, e in res:
            if s == src:
                ok = iv.low <= e <= iv.high
                out.append((r, e, iv, ok))
                c = per_source.setdefault(src, [0, 0])
                c[0] += ok
                c[1] += 1
    covered = sum(ok for *_, ok in out)
    med = statistics.median(iv.width for _, _, iv, _ in out) if out else float("nan")
    lines = ["", "80% interval of MoE predictions (regime 'moe', autotune/spec/trust.py), leave-one-source-out:"]
    for r, e, iv, ok in out:
        lines.append(f"  {release(r['source']):10s} {r['id']:30s} r {100 * e:+6.1f}%  interval {100 * iv.low:+6.1f}.."
                     f"{100 * iv.high:+6.1f}%  {'in' if ok else 'OUT'}")
    lines.append(f"  coverage {covered}/{len(out)}; median width {100 * med:.1f}% of the prediction")
    full = regime_table([(e, ["moe"]) for _, _, e in res]) if res else None
    if full:
        iv = interval_from_table(full, ["moe"])
        lines.append(f"  shipped (all {len(res)} rows): {100 * iv.low:+.1f}..{100 * iv.high:+.1f}%, width "
                     f"{100 * iv.width:.1f}% of the prediction")
    return {"table": full, "covered": covered, "rows": len(out), "median_width": med,
            "per_source": {k: {"covered": c, "rows": n} for k, (c, n) in per_source.items()}, "lines": lines}


def write_error_bands(rows: list[dict[str, Any]], mi: dict[str, Any]) -> None:
    """:func:`moe_interval`'s data as ``interval_moe`` in autotune/data/error_bands.yaml (the rest of the file,
    written by bench/published.py, is kept)."""
    from autotune.spec.trust import MIN_REGIME_ROWS, QUANTILES

    path = ROOT / "autotune" / "data" / "error_bands.yaml"
    doc = yaml.safe_load(path.read_text())
    rnd = lambda v: round(float(v), 4)  # noqa: E731
    t = mi["table"]
    doc["interval_moe"] = {
        "quantity": "residual r = predicted / published tokens/s per GPU - 1 (fractions) of the MoE development "
                    "set; no model constant chosen on it, so each is held out",
        "quantiles": list(QUANTILES), "min_regime_rows": MIN_REGIME_ROWS,
        "pooled": {k: (rnd(v) if k != "num_runs" else v) for k, v in t["pooled"].items()},
        "regimes": {g: {k: (rnd(v) if k != "num_runs" else v) for k, v in e.items()} for g, e in t["regimes"].items()},
        "coverage": {"covered": mi["covered"], "rows": mi["rows"], "median_width": rnd(mi["median_width"]),
                     "how": "each source's rows tested against the interval built without that source",
                     "per_source": mi["per_source"]},
        "source": "bench/published_moe.py --write-error-bands", "date": datetime.date.today().isoformat(),
        "rows": [{"id": r["id"], "source": release(r["source"]), "gpu": r["gpu"], "gpus": r["gpus"],
                  "precision": r["precision"], "residual": rnd(r["err"]), "regimes": ["moe"]} for r in rows],
    }
    head = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
    path.write_text(head + yaml.safe_dump(doc, sort_keys=False))
    print(f"wrote {path.relative_to(ROOT)}")


def short(p: Plan) -> str:
    s = f"TP{p.tp_degree} PP{p.pp_degree}"
    if p.effective_vpp > 1:
        s += f" VP{p.vpp_degree}"
    if p.cp_degree > 1:
        s += f" CP{p.cp_degree}"
    s += f" EP{p.ep_degree} DP{p.dp_degree} mbs{p.micro_batch_size} {p.moe_dispatcher}"
    if p.moe_a2a_overlap:
        s += "+ovl"
    return s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    ap.add_argument("--tune", type=int, default=0, help="also tune each target with N simulated trials")
    ap.add_argument("--markdown", type=Path, default=None, help="write the table as Markdown")
    ap.add_argument("--host-term", type=Path, default=None,
                    help="bench/moe_layer_host.py JSON: also print each row with the measured host time of an "
                         "eager MoE layer added (an analysis, not the shipped model; see host_term_ms)")
    ap.add_argument("--write-error-bands", action="store_true",
                    help="store the rows' residuals as the 'moe' interval regime in autotune/data/error_bands.yaml")
    args = ap.parse_args()
    if not args.runs.is_file():
        print(f"error: published MoE runs file {args.runs} not found; give --runs FILE", file=sys.stderr)
        return 2
    data = yaml.safe_load(args.runs.read_text())
    rows, refused = [], []
    t0 = time.time()
    for run in data["runs"]:
        try:
            rows.append(predict(run))
        except AutotuneError as e:
            refused.append((run["id"], str(e)))
    lines = [f"{'run':30s} {'gpu':6s} {'N':>4s} {'prec':6s} {'plan':36s} {'pred tok/s':>10s} {'pub':>7s} {'err':>7s} "
             f"{'pred TF':>8s} {'pub TF':>7s} {'fits':>9s} {'flops/tok':>10s}"]
    for r in rows:
        fl = f"{r['flops_per_token'] / r['pub_flops_per_token'] - 1:+.1%}" if "pub_flops_per_token" in r else "-"
        fit = f"{r['peak_gib']:.0f}/{r['usable_gib']:.0f}" + ("" if r["fits"] else "!")
        lines.append(f"{r['id']:30s} {r['gpu']:6s} {r['gpus']:4d} {r['precision']:6s} {short(r['plan']):36s} "
                     f"{r['pred_tok']:10,.0f} {r['pub_tok'] or 0:7,.0f} {r['err']:+7.1%} {r['pred_tflops']:8.0f} "
                     f"{r['pub_tflops'] or 0:7.0f} {fit:>9s} {fl:>10s}")
        if args.tune:
            plan, tok = tune(r, args.tune)
            if plan is not None:
                lines.append(f"{'  tuned':30s} {'':6s} {'':4s} {'':6s} {short(plan):36s} {tok:10,.0f} "
                             f"{'':7s} {tok / r['pred_tok'] - 1:+7.1%} (vs the published plan's prediction)")
    errs = [r["err"] for r in rows]
    fams: dict[str, list[float]] = {}
    for r in rows:
        fams.setdefault(r["gpu"].rstrip("0123456789") if False else r["gpu"], []).append(r["err"])
    lines.append("")
    if errs:
        lines.append(f"all {len(errs)} runs: MAE {statistics.mean(abs(e) for e in errs):.1%}, mean signed "
                     f"{statistics.mean(errs):+.1%}, worst {max(errs, key=abs):+.1%}; refused {len(refused)}")
        for f, es in sorted(fams.items()):
            lines.append(f"  {f}: {len(es)} runs, MAE {statistics.mean(abs(e) for e in es):.1%}, mean signed "
                         f"{statistics.mean(es):+.1%}")
    if args.host_term:
        lines += host_term_lines(rows, json.loads(args.host_term.read_text()))
    lines.append("leave-one-source-out: no constant of the model was chosen on these rows, so each source's "
                 "held-out error is its error above")
    mi = moe_interval(rows) if rows else None
    if mi:
        lines += mi["lines"]
    for rid, why in refused:
        lines.append(f"refused {rid}: {why}")
    lines.append(f"(simulated, megatron engine, shipped calibration; {time.time() - t0:.1f} s)")
    print("\n".join(lines))
    if args.markdown:
        args.markdown.write_text("```\n" + "\n".join(lines) + "\n```\n")
    if args.write_error_bands:
        if refused or not mi:
            print("error: --write-error-bands needs every row predicted (refused: "
                  f"{', '.join(r for r, _ in refused) or 'no rows'})", file=sys.stderr)
            return 2
        write_error_bands(rows, mi)
    return 0


if __name__ == "__main__":
    sys.exit(main())
