"""Text reports of the CLI: the best-plan table, the retune side-by-side, the study list, launch hints.

All functions return strings (no printing). Units: ms, GiB (2^30 bytes), tokens/s per GPU, MFU in %.
MFU is the causal convention (attention score/value FLOPs counted once for a causal mask, as the
kernel does and Megatron-LM reports); the PaLM (Appendix B) figure, which counts the full square, is
shown beside it (see :mod:`autotune.cost.flops`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from autotune.cost.evaluator import BREAKDOWN_KEYS, OPTIONAL_BREAKDOWN_GROUPS, StepResult
from autotune.spec.models import ModelSpec
from autotune.spec.plan import Plan, Workload

GIB = 2**30


def _table(rows: Sequence[Sequence[str]], header: Sequence[str] | None = None, *, right: bool = False) -> str:
    allrows = ([list(header)] if header else []) + [list(r) for r in rows]
    widths = [max(len(r[i]) for r in allrows) for i in range(len(allrows[0]))]
    lines = []
    for j, r in enumerate(allrows):
        lines.append("  ".join(c.rjust(w) if (i > 0 and right) else c.ljust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip())
        if header and j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def provenance_label(result: StepResult) -> str:
    """What produced the numbers of ``result``, in words, starting with how they were obtained:

    * ``simulated with <calibration label>`` (simulated backend);
    * ``measured backend, but nothing was measured: no stored measurements for <gpu>; every op from
      <fallback label>, as simulated`` (measured backend without a profile store entry and no GPU:
      :class:`autotune.profiling.measured.MeasuredCosts` with ``env`` None costs everything by the
      fallback profile);
    * ``measured backend: <environment label>; this plan's ops: N measured, N looked up, ...``
      (``details['op_sources']``, distinct ops by source);
    * ``real run`` (+ label) for the real backend.
    """
    d = result.details or {}
    costs = d.get("costs") if isinstance(d.get("costs"), Mapping) else {}
    label = costs.get("label") or d.get("calibration_label") or d.get("calibration") or d.get("label")
    if result.backend == "simulated":
        measured = costs.get("measured", d.get("calibration_measured", d.get("measured")))
        extra = " (measured=false)" if measured is False and "measured" not in str(label) else ""
        return f"simulated with {label or 'the shipped calibration'}{extra}"
    if result.backend == "measured":
        if costs.get("measured") is False:
            gpu = costs.get("calibration_gpu", "this GPU")
            fb = costs.get("fallback") or "the shipped calibration"
            return (f"measured backend, but nothing was measured: no stored measurements for {gpu}; every op "
                    f"from {fb}, as simulated")
        src = d.get("op_sources") if isinstance(d.get("op_sources"), Mapping) else None
        ops = (f"; this plan's ops: " + ", ".join(f"{int(n)} {k.replace('_', ' ')}" for k, n in src.items())
               if src else "")
        return f"measured backend: {label or 'stored measurements'}{ops}"
    if result.backend == "real":
        return "real run" + (f" ({label})" if label else "")
    return f"{result.backend}" + (f" ({label})" if label else "")


def backend_word(backend: str) -> str:
    """How a result's numbers were obtained, one word for tables: ``simulated`` (simulated backend),
    ``measured-op`` (measured backend: the simulator with op times from the profile store), ``real``
    (a real run on GPUs); other names are returned unchanged."""
    return {"simulated": "simulated", "measured": "measured-op", "real": "real"}.get(backend, backend)


def _bucket_text(plan: Plan, engine: str | None) -> str:
    """The DP bucket row: ``N MiB``, or, for an engine that reduces each gradient buffer as one bucket without
    an overlapped reduction (facts.yaml ``one_bucket_without_overlap``: Megatron-LM), that it does."""
    if engine and not (plan.dp_grad_reduce_overlap and plan.async_collectives):
        from autotune.errors import ConfigError
        from autotune.spec.engines import get_engine
        try:
            one = get_engine(engine).one_bucket_without_overlap
        except ConfigError:
            one = False
        if one:
            return "one per gradient buffer (no overlapped reduction)"
    return f"{plan.bucket_size_mib} MiB"


def plan_rows(plan: Plan, engine: str | None = None, *, moe: bool = False) -> list[tuple[str, str]]:
    """(label, value) rows: degrees, schedule and settings (``engine``: how its DP bucket is read; ``moe``: the plan
    is of a mixture-of-experts model, so its expert layout is shown even at EP 1)."""
    sched = plan.pipeline_schedule if plan.pp_degree > 1 else "none (pp=1)"
    if plan.pipeline_schedule == "interleaved_1f1b" and plan.pp_degree > 1:
        sched += f", {plan.vpp_degree} chunks per rank"
    rows = [
        ("degrees", f"TP {plan.tp_degree} x PP {plan.pp_degree} x DP {plan.dp_degree} x CP {plan.cp_degree} "
                    f"= {plan.num_gpus} GPUs"),
        ("pipeline schedule", sched),
        ("micro-batches", f"{plan.num_micro_batches} x {plan.micro_batch_size} sequences per DP replica"),
    ]
    if plan.stage_layers is not None:
        # stage_layers holds pp entries (per pipeline rank) or pp x vpp (per chunk, model order):
        # Plan.layers_per_virtual_stage
        per_rank = len(plan.stage_layers) == plan.pp_degree
        rows.append(("layers per pipeline stage" if per_rank else
                     f"layers per chunk ({len(plan.stage_layers)} = pp x vpp, model order)",
                     _runs(plan.stage_layers)))
    rows += [
        ("sequence parallel", _onoff(plan.sequence_parallel)),
        ("recompute", plan.recompute + (f" (first {plan.recompute_num_layers} layers of each chunk)"
                       if getattr(plan, "partial_recompute", False) else "")),
        ("ZeRO stage", str(plan.zero_stage)),
    ]
    if getattr(plan, "cpu_offload_layers", 0):
        rows.append(("CPU offload", f"activations of the first {plan.cpu_offload_layers} layers to host memory"))
    rows += [
        ("async collectives", _onoff(plan.async_collectives)),
        ("TP comm overlap", _onoff(plan.tp_comm_overlap)),
        ("DP grad-reduce overlap", _onoff(plan.dp_grad_reduce_overlap)),
        ("param-gather overlap", _onoff(plan.param_gather_overlap)),
        ("DP bucket", _bucket_text(plan, engine)),
        ("memory reclaim", plan.memory_reclaim),
        ("precision", plan.precision + (" (layers' linears; LM head BF16)" if plan.fp8 else "")),
    ]
    if plan.fp8:
        rows.append(("FP8 parameters", _onoff(plan.fp8_param_gather) + (" (FP8 parameter all-gather)"
                                                                        if plan.fp8_param_gather else "")))
    if plan.dp_degree * plan.cp_degree > 1:
        rows.append(("gradient reduce", "BF16" if plan.grad_reduce_in_bf16 else "FP32"))
    rows += [
        ("torch.compile", _onoff(plan.compile)),
    ]
    if moe or plan.ep_degree * plan.etp_degree > 1 or plan.moe_a2a_overlap or plan.moe_dispatcher != "alltoall":
        # a mixture-of-experts plan: the expert layout (a dense plan has none of these rows)
        rows += [
            ("expert parallel", f"EP {plan.ep_degree} x ETP {plan.etp_degree} (folded over TP x CP x DP; "
                                f"expert DP {plan.expert_dp_degree})"),
            ("token dispatcher", plan.moe_dispatcher + (" (DeepEP / HybridEP)" if plan.moe_dispatcher == "flex" else "")),
            ("dispatch overlap", _onoff(plan.moe_a2a_overlap) + " (all-to-all beside another micro-batch's compute)"),
            ("grouped GEMM", _onoff(plan.moe_grouped_gemm)),
        ]
    if plan.recompute_modules is not None:
        rows.append(("recompute modules", ", ".join(plan.recompute_modules)))
    return rows


def _runs(xs: Sequence[int]) -> str:
    """[1, 2, 2, 2, 1] -> "1, 2 x 3, 1" (virtual stages in model order)."""
    out: list[list[int]] = []
    for x in xs:
        if out and out[-1][0] == x:
            out[-1][1] += 1
        else:
            out.append([x, 1])
    return ", ".join(f"{v} x {n}" if n > 1 else str(v) for v, n in out)


def _onoff(b: bool) -> str:
    return "on" if b else "off"


def fp8_peak_utilization(result: StepResult, fp8_tflops: float | None = None) -> float | None:
    """Achieved model TFLOP/s per GPU / the GPU's dense FP8 peak, in [0, 1], or None when the peak is
    unknown. ``fp8_tflops`` defaults to the ``gpu_fp8_tflops`` the simulated costs record in
    ``result.details['costs']`` (datasheet figure, autotune/data/gpus.yaml)."""
    if fp8_tflops is None:
        costs = (result.details or {}).get("costs")
        fp8_tflops = costs.get("gpu_fp8_tflops") if isinstance(costs, Mapping) else None
    if not fp8_tflops or not result.feasible:
        return None
    return result.tflops_per_gpu / fp8_tflops


def result_rows(result: StepResult, plan: Plan | None = None) -> list[tuple[str, str]]:
    """(label, value) rows of a result; for an FP8 ``plan`` also the utilisation of the FP8 peak."""
    if not result.feasible:             # no step time: say why instead of printing zeros
        rows = [("step time", "n/a: " + (result.infeasible_reason or "the plan does not fit in memory"))]
    else:
        rows = [
            ("step time", f"{result.step_time_ms:,.1f} ms"),
            ("tokens/s per GPU", f"{result.tokens_per_s_per_gpu:,.0f}"),
            ("MFU", f"{100 * result.mfu:.1f}% (causal; PaLM convention {100 * result.mfu_palm:.1f}%), "
                    f"{result.tflops_per_gpu:.0f} TFLOP/s per GPU"),
            ("HFU", f"{100 * result.hfu:.1f}%"),
        ]
    u8 = fp8_peak_utilization(result) if plan is not None and plan.fp8 and result.feasible else None
    if u8 is not None:
        rows.append(("FP8 peak utilisation", f"{100 * u8:.1f}% (model TFLOP/s / dense FP8 peak; MFU above "
                                             "stays against the dense BF16 peak)"))
    rows += [
        ("peak memory per GPU", f"{result.peak_memory_bytes / GIB:.1f} GiB"
         + (f" (stages: {', '.join(f'{b / GIB:.1f}' for b in result.memory_per_stage_bytes)})"
            if 1 < len(result.memory_per_stage_bytes) <= 8 else "")),
    ]
    live = (result.details or {}).get("memory_live_peak_bytes")
    if result.feasible and live is not None:
        rows.append(("fits in memory", f"yes: {live / GIB:.1f} GiB live of "
                     f"{(result.details or {}).get('memory_capacity_bytes', 0) / GIB:.1f} usable; the peak above "
                     "includes the caching allocator's reserve, which it releases before running out"))
    if not result.feasible:
        rows.append(("fits in memory", f"NO: {result.infeasible_reason}"))
    return rows


def _hidden_keys(results: list[StepResult]) -> set[str]:
    """The keys of :data:`OPTIONAL_BREAKDOWN_GROUPS` whose group is 0 in every one of ``results`` (a dense model's
    expert, router and dispatch time; offloading's waits without offloading): left out of the reports."""
    return {k for g in OPTIONAL_BREAKDOWN_GROUPS if not any(r.breakdown_ms.get(x) for r in results for x in g)
            for k in g}


def breakdown_rows(result: StepResult) -> list[tuple[str, str]]:
    total = result.step_time_ms or 1.0
    hidden = _hidden_keys([result])
    keys = [k for k in BREAKDOWN_KEYS if k in result.breakdown_ms and k not in hidden] + \
        [k for k in result.breakdown_ms if k not in BREAKDOWN_KEYS]
    return [(f"  {k}", f"{result.breakdown_ms[k]:,.1f} ms ({100 * result.breakdown_ms[k] / total:.1f}%)")
            for k in keys]


def _gpu_band(band: Mapping[str, Any], gpu: str | None) -> tuple[str | None, Mapping[str, Any] | None]:
    """(``gpu``'s hardware family, the ``by_gpu`` entry of ``band`` for it or None when none was measured)."""
    from autotune.spec.hardware import gpu_family

    fam = gpu_family(gpu)
    return fam, ((band.get("by_gpu") or {}).get(fam) if fam else None)


def error_band_line(engine: str, gpu: str | None = None) -> str:
    """How far to trust a prediction when no plan is at hand (tables of several plans, ``export``): the pooled
    central 80% interval of held-out errors on published runs (autotune/spec/trust.py; with ``gpu``, its
    family's interval where the development set has enough runs), or for the ``native`` engine its error
    against real runs (``docs/fidelity.md``); says so when nothing was measured. A single plan's table prints
    its own interval instead (:func:`trust_rows`)."""
    from autotune.spec.engines import error_band
    from autotune.spec.hardware import gpu_family
    from autotune.spec.trust import interval_data, interval_from_table

    b = error_band(engine)
    d = interval_data()
    if engine != "native" and d:
        iv = interval_from_table(d, [f"gpu:{gpu_family(gpu) or gpu}"] if gpu else [])
        cov = d.get("coverage") or {}
        return (f"80% interval ({engine}{', ' + str(gpu_family(gpu) or gpu) if gpu else ''}): measured throughput "
                f"within predicted / {1 + iv.high:.3f} .. predicted / {1 + iv.low:.3f} (held-out errors "
                f"{100 * iv.low:+.1f}..{100 * iv.high:+.1f}%, predicted / measured - 1, "
                f"{iv.basis() or 'all ' + str(iv.num_pooled) + ' published runs'}; leave-one-source-out coverage "
                f"{cov.get('covered', '?')}/{cov.get('rows', '?')}; {d.get('source', '?')}, {d.get('date', '?')})")
    if b is None:
        return f"error band: none measured yet for engine {engine}"
    q = b.get("quantity", "step time")
    return (f"error band ({engine}): predicted {q} off by {b['mean_abs_error_pct']:.1f}% on average, worst "
            f"{b['worst_error_pct']:+.1f}% (predicted / measured - 1), over {b['num_runs']} {b['against']} "
            f"({b['source']}, {b.get('date', '?')})")


def trust_rows(plan: Plan, result: StepResult, gpu: str | None, model: ModelSpec | None) -> list[tuple[str, str]]:
    """The rows that say how far a prediction can be trusted (autotune/spec/trust.py): ``80% interval`` (one
    sentence: the measured MFU, tokens/s and step time the central 80% interval of held-out errors on published
    runs allows, and the regimes it rests on) and, when the predicted TFLOP/s per GPU exceeds the best published
    run for the GPU, precision class and model class, ``frontier`` naming that run. Empty for an infeasible
    result; the interval row says so when no interval data is shipped."""
    from autotune.spec.trust import frontier_sentence, interval_for, interval_sentence

    if not result.feasible:
        return []
    moe = bool(getattr(model, "is_moe", False))
    iv = interval_for(plan, gpu, model.hidden_size if model is not None else None, moe)
    rows = [("80% interval", interval_sentence(iv, mfu=result.mfu, tokens_per_s=result.tokens_per_s_per_gpu,
                                               step_ms=result.step_time_ms) if iv is not None else
             "none: no interval data shipped (autotune/data/error_bands.yaml)")]
    f = frontier_sentence(result.tflops_per_gpu, gpu, plan.precision, "moe" if moe else "dense")
    if f:
        rows.append(("frontier", f"above the published frontier: {f}"))
    return rows


def format_best_plan(*, plan: Plan, result: StepResult, title: str, model: ModelSpec | None = None,
                     target: str | None = None, engine: str | None = None, gpu: str | None = None) -> str:
    """The best-plan table: degrees, schedule, settings, step time, tokens/s/GPU, MFU, memory, breakdown,
    and (given ``engine``) the engine and the error band of its predictions."""
    head = [title]
    if target:
        head.append(target)
    eng = engine or (result.details or {}).get("engine")
    rows = plan_rows(plan, eng, moe=bool(model is not None and getattr(model, "is_moe", False))) + \
        result_rows(result, plan)
    if eng:
        rows.append(("engine", str(eng)))
    if result.backend != "real" and result.feasible:
        rows += trust_rows(plan, result, gpu, model)
    d = result.details or {}
    if result.backend == "real":
        sim_ms = d.get("simulated_step_time_ms")
        if sim_ms:
            mfu_sim = result.mfu * result.step_time_ms / sim_ms
            rows.append(("simulated prediction", f"{sim_ms:,.1f} ms, MFU {mfu_sim:.1%} (error "
                                                 f"{d.get('simulated_error_pct', 0.0):+.1f}% vs measured)"))
        elif d.get("simulated_feasible") is False:
            rows.append(("simulated prediction", "the memory model said this plan does not fit"))
        if d.get("device_name"):
            rows.append(("measured on", f"{d['device_name']}, torch {d.get('torch_version', '?')}, "
                                        f"{str(d.get('date', '?'))[:19]}"))
    if result.breakdown_ms:
        rows += [("breakdown (critical path)", "")] + breakdown_rows(result)
    return "\n".join(head) + "\n" + _table(rows) + f"\n({provenance_label(result)}; MFU = model FLOPs / " \
        "(step time x GPUs x dense BF16 peak), causal attention FLOPs)"


def format_side_by_side(columns: Sequence[tuple[str, Plan, StepResult]], *, engine: str | None = None) -> str:
    """Plans and results in columns (retune: fast best | fast plan on slow fabric | slow best), a row
    saying how each column's numbers were obtained (:func:`backend_word`), and a footer with each
    distinct :func:`provenance_label` and, given ``engine`` and unless every column is a real run, the
    engine's error band (:func:`error_band_line`)."""
    header = [""] + [c[0] for c in columns]
    plan_labels = [r[0] for r in plan_rows(columns[0][1])]
    per_col = [dict(plan_rows(p)) for _, p, _ in columns]
    labels = list(dict.fromkeys(plan_labels + [k for d in per_col for k in d]))
    rows = [[lab] + [d.get(lab, "-") for d in per_col] for lab in labels]
    rows.append(["numbers"] + [backend_word(r.backend) for _, _, r in columns])
    rows.append(["step time"] + [f"{r.step_time_ms:,.1f} ms" for _, _, r in columns])
    rows.append(["tokens/s per GPU"] + [f"{r.tokens_per_s_per_gpu:,.0f}" for _, _, r in columns])
    rows.append(["MFU (causal)"] + [f"{100 * r.mfu:.1f}%" for _, _, r in columns])
    rows.append(["MFU (PaLM)"] + [f"{100 * r.mfu_palm:.1f}%" for _, _, r in columns])
    rows.append(["peak memory per GPU"] + [f"{r.peak_memory_bytes / GIB:.1f} GiB" for _, _, r in columns])
    keys = list(dict.fromkeys([k for k in BREAKDOWN_KEYS] + [k for _, _, r in columns for k in r.breakdown_ms]))
    hidden = _hidden_keys([r for _, _, r in columns])
    for k in keys:
        if any(k in r.breakdown_ms for _, _, r in columns) and k not in hidden:
            rows.append([f"  {k} ms"] + [f"{r.breakdown_ms.get(k, 0.0):,.1f}" for _, _, r in columns])
    foot = [f"({lab})" for lab in dict.fromkeys(provenance_label(r) for _, _, r in columns)]
    if engine and any(r.backend != "real" for _, _, r in columns):
        foot.append(error_band_line(engine))
    return _table(rows, header, right=True) + "\n" + "\n".join(foot)


def format_comparison(tuned: tuple[str, Plan, StepResult, str], yours: tuple[str, Plan, StepResult, str],
                      notes: Sequence[str] = ()) -> str:
    """A tuned plan beside the user's own (``autotune run --compare-to``): each ``(label, plan, result,
    engine)``; the plans' settings, how the numbers were obtained, step time, tokens/s, MFU and memory
    ("does not fit" where a plan does not), then the MFU difference in percentage points (tuned - yours),
    naming a precision change (the tuned plan trains with other numerics), or that the user's plan does not
    fit; ``notes`` (lines after it); and the engines' error bands."""
    cols = [(f"{t[0]} ({t[3]})", t[1], t[2]) for t in (tuned, yours)]
    per = [dict(plan_rows(t[1], t[3])) for t in (tuned, yours)]
    labels = list(dict.fromkeys([k for d in per for k in d]))
    rows = [[k] + [d.get(k, "-") for d in per] for k in labels]

    def num(r: StepResult, text: str) -> str:
        return text if r.feasible else "does not fit"

    rows.append(["numbers"] + [backend_word(r.backend) for _, _, r in cols])
    rows.append(["step time"] + [num(r, f"{r.step_time_ms:,.1f} ms") for _, _, r in cols])
    rows.append(["tokens/s per GPU"] + [num(r, f"{r.tokens_per_s_per_gpu:,.0f}") for _, _, r in cols])
    rows.append(["MFU (causal)"] + [num(r, f"{100 * r.mfu:.1f}%") for _, _, r in cols])
    rows.append(["peak memory per GPU"] + [f"{r.peak_memory_bytes / GIB:.1f} GiB" for _, _, r in cols])
    out = [_table(rows, [""] + [c[0] for c in cols], right=True)]
    mine, res = yours[2], tuned[2]
    if not mine.feasible:
        out.append(f"your plan does not fit in memory: {mine.infeasible_reason or 'over the GPU memory'}; the tuned "
                   f"plan runs at MFU {100 * res.mfu:.1f}%")
    else:
        pt, py = tuned[1].precision, yours[1].precision
        change = (f", with a precision change ({py} -> {pt}: different numerics, not only a different layout)"
                  if pt != py else "")
        out.append(f"MFU: tuned {100 * res.mfu:.1f}% vs yours {100 * mine.mfu:.1f}%: "
                   f"{100 * (res.mfu - mine.mfu):+.1f} percentage points{change} (step {res.step_time_ms:,.1f} ms vs "
                   f"{mine.step_time_ms:,.1f} ms)")
    out += list(notes)
    out += [error_band_line(e) for e in dict.fromkeys((tuned[3], yours[3]))]
    return "\n".join(out)


def format_studies(rows: Sequence[Mapping[str, Any]]) -> str:
    """One row per study: model, GPUs, fabric, engine, backend (how the best MFU was obtained,
    :func:`backend_word` of ``r['backend']``), workload, trials, best MFU, step time, degrees; then one
    error-band line (:func:`error_band_line`) per engine whose numbers are predictions (not real runs)."""
    if not rows:
        return "no studies"
    # the best plan and the study's name (model/gpus/fabric/engine/workload, ~60 characters) go on their own
    # lines under the row, so a row stays within ~120 columns (it was ~250 with both as columns)
    header = ["model", "gpus", "interconnect", "engine", "numbers", "workload", "trials", "best MFU", "step ms"]
    body = [[r["model"], r["gpus"], r["fabric"], r.get("engine", "-"), backend_word(r.get("backend", "simulated")),
             r["workload"], str(r["n_trials"]), r["mfu"], r["step"]] for r in rows]
    engines = dict.fromkeys(str(r["engine"]) for r in rows if r.get("backend", "simulated") != "real"
                            and r.get("engine"))
    foot = ["(best MFU and step time as the study's backend obtained them: simulated = predicted by the "
            "simulator, measured-op = simulator with stored op measurements, real = run on GPUs)"]
    foot += [error_band_line(e) for e in engines]
    import textwrap

    table = _table(body, header).splitlines()
    out = table[:2]
    for line, r in zip(table[2:], rows):
        out += [line, f"  plan {r['plan']}", f"  study {r['study']}"]
    return "\n".join(out) + "\n" + "\n".join(textwrap.fill(f, 120, subsequent_indent="  ") for f in foot)


def short_plan(plan: Plan) -> str:
    s = f"tp{plan.tp_degree} pp{plan.pp_degree} dp{plan.dp_degree} cp{plan.cp_degree}"
    if plan.pp_degree > 1:
        s += f" {plan.pipeline_schedule}" + (f"x{plan.vpp_degree}" if plan.pipeline_schedule == "interleaved_1f1b" else "")
    s += f" mbs{plan.micro_batch_size} zero{plan.zero_stage} rc={plan.recompute}"
    if plan.precision != "bf16":
        s += f" {plan.precision}"
    if plan.compile:
        s += " compile"
    return s


def launch_hints(plan: Plan, model: ModelSpec, workload: Workload) -> str:
    """Megatron-LM flags and a torchtitan TOML snippet equivalent to ``plan`` (hints, check your version).
    For an engine that cannot launch ``model`` (autotune/engines/megatron/export.py / torchtitan.py
    ``model_refusal``, the check ``export --launcher`` refuses with), one line naming why instead.

    Megatron-LM names: ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
    ``--context-parallel-size``, ``--num-layers-per-virtual-pipeline-stage``, ``--sequence-parallel``,
    ``--recompute-granularity``, ``--use-distributed-optimizer``, ``--overlap-grad-reduce``,
    ``--overlap-param-gather``, ``--tp-comm-overlap``, ``--pipeline-model-parallel-layout`` (uneven splits).
    torchtitan (``[parallelism]``): ``tensor_parallel_degree``, ``pipeline_parallel_degree``,
    ``context_parallel_degree``, ``data_parallel_shard_degree`` / ``data_parallel_replicate_degree``,
    ``pipeline_parallel_schedule``; ``[activation_checkpoint] mode``.
    Precision (megatron/training/arguments.py ``_add_transformer_engine_args``): ``--fp8-format
    {e4m3,hybrid}``, ``--fp8-recipe {tensorwise,delayed,mxfp8,blockwise}`` (no rowwise recipe),
    ``--fp8-amax-history-len`` / ``--fp8-amax-compute-algo {most_recent,max}`` for delayed scaling
    (1024 / max as NeMo's FP8 configs use; Megatron's defaults are 1 / most_recent). torchtitan
    0.2.x (torchtitan/config/job_config.py at v0.2.2): ``[model] converters = ["quantize.linear.float8"]`` with
    ``[quantize.linear.float8] recipe_name`` (rowwise; none for tensorwise, the default) and ``filter_fqns``, or
    ``converters = ["quantize.linear.mx"]`` with ``recipe_name = "mxfp8_cublas"``; ``[compile] enable``, ``components = ["model", "loss"]``. The LM
    head (``output``) is kept BF16 in every hint.
    """
    p = plan
    meg = [f"--tensor-model-parallel-size {p.tp_degree}", f"--pipeline-model-parallel-size {p.pp_degree}",
           f"--context-parallel-size {p.cp_degree}", f"--micro-batch-size {p.micro_batch_size}",
           f"--global-batch-size {workload.global_batch_size}", f"--seq-length {workload.seq_len}"]
    layers = p.layers_per_virtual_stage(model.num_layers)
    if p.pp_degree > 1 and len(set(layers)) > 1:
        # uneven split: Megatron-LM's explicit layout, one '|'-separated entry per virtual stage in model
        # order (E = embedding, t = transformer layer, L = loss/LM head); the first/last-stage flags
        # cannot describe chunks of different sizes on one rank
        stages = ["t" * n for n in layers]
        stages[0] = "E" + stages[0]
        stages[-1] = stages[-1] + "L"
        meg.append(f"--pipeline-model-parallel-layout '{'|'.join(stages)}'")
    elif p.pipeline_schedule == "interleaved_1f1b" and p.pp_degree > 1 and p.vpp_degree > 1:
        meg.append(f"--num-layers-per-virtual-pipeline-stage {layers[0]}")
    if p.sp_active:
        meg.append("--sequence-parallel")
    if p.recompute == "selective":
        meg.append("--recompute-granularity selective")
    elif p.recompute == "full" and p.partial_recompute:
        meg.append(f"--recompute-granularity full --recompute-method block --recompute-num-layers "
                   f"{p.recompute_num_layers}")
    elif p.recompute == "full":
        meg.append("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1")
    if getattr(p, "cpu_offload_layers", 0):
        meg.append(f"--cpu-offloading-num-layers {p.cpu_offload_layers}")
    meg_notes = []
    if p.zero_stage >= 1:
        meg.append("--use-distributed-optimizer")
        if p.zero_stage >= 2:
            meg_notes.append(f"# ZeRO-{p.zero_stage}: Megatron-FSDP (--use-megatron-fsdp) shards grads/params; "
                             "`autotune export --launcher torchrun -o DIR` writes its flags")
    from autotune.engines.registry import export_module

    ddp_bucket_size = export_module("megatron").ddp_bucket_size

    overlap_grads = p.dp_grad_reduce_overlap and p.async_collectives
    if overlap_grads:
        meg.append("--overlap-grad-reduce")
    if p.param_gather_overlap and p.async_collectives:
        meg.append("--overlap-param-gather")
    if p.tp_comm_overlap and p.async_collectives:
        meg.append("--tp-comm-overlap")
    if not p.async_collectives and p.pp_degree > 1:
        meg.append("--no-overlap-p2p-communication")
    # the bucket size has an effect only with --overlap-grad-reduce (one bucket per gradient buffer otherwise,
    # megatron facts.yaml one_bucket_without_overlap), so, as the launch file export writes, only then
    bucket = ddp_bucket_size(p)
    if overlap_grads:
        meg.append(f"--ddp-bucket-size {bucket}")
    if p.grad_reduce_in_bf16:
        meg.append("--grad-reduce-in-bf16")         # the bucket above counts BF16 gradients
    if overlap_grads:
        meg_notes.append(f"# --ddp-bucket-size counts parameters: {bucket} "
                         + ("BF16 main grads (--grad-reduce-in-bf16)" if p.grad_reduce_in_bf16 else
                            "FP32 main grads (--bf16 reduces them in FP32)") + f" = {p.bucket_size_mib} MiB")
    # every plan trains in BF16 mixed precision (FP8 recipes run on top of it): without --bf16 Megatron-LM keeps
    # FP32 parameters, and its gradient buffers, so the bucket above, follow that dtype
    meg.append("--bf16")
    if p.precision == "fp8_tensorwise":
        meg.append("--fp8-format hybrid --fp8-recipe tensorwise")
    elif p.precision == "fp8_delayed":
        meg.append("--fp8-format hybrid --fp8-recipe delayed --fp8-amax-history-len 1024 --fp8-amax-compute-algo max")
    elif p.precision == "mxfp8":
        meg.append("--fp8-format e4m3 --fp8-recipe mxfp8")
    elif p.precision == "fp8_rowwise":
        meg_notes.append("# fp8_rowwise: Megatron-LM has no rowwise recipe (--fp8-recipe: tensorwise, delayed, "
                         "mxfp8, blockwise); use torchtitan's, or --fp8-format hybrid --fp8-recipe tensorwise")
    if p.compile:
        meg_notes.append("# compile: Megatron-LM has no per-block torch.compile flag; TE's fused kernels take its place")
    sched = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B"}[p.pipeline_schedule]
    shard = p.dp_degree if p.zero_stage >= 2 else 1
    replicate = 1 if p.zero_stage >= 2 else p.dp_degree
    tt = ["[parallelism]", f"tensor_parallel_degree = {p.tp_degree}", f"pipeline_parallel_degree = {p.pp_degree}",
          f"context_parallel_degree = {p.cp_degree}", f"data_parallel_shard_degree = {shard}",
          f"data_parallel_replicate_degree = {replicate}"]
    if p.pp_degree > 1:
        tt += [f'pipeline_parallel_schedule = "{sched}"', f"pipeline_parallel_microbatch_size = {p.micro_batch_size}"]
    if model.is_moe:
        # torchtitan 0.2.2 job_config.py Parallelism / Debug (autotune/engines/torchtitan/job.py writes the same)
        tt += [f"expert_parallel_degree = {p.ep_degree}", f"expert_tensor_parallel_degree = {p.etp_degree}"]
    if p.tp_comm_overlap and p.tp_degree > 1:
        # torchtitan applies async TP through torch.compile's micro-pipeline TP pass: it refuses
        # enable_async_tensor_parallel without compile (torchtitan/models/llama3/infra/parallelize.py,
        # "Async TP requires torch.compile"), so it is emitted on only with compile on
        if p.compile:
            tt.append("enable_async_tensor_parallel = true  # async TP (torch.compile is on: [compile] below)")
        else:
            tt.append("enable_async_tensor_parallel = false  # tp_comm_overlap needs torch.compile in "
                      "torchtitan; compile is off in this plan")
    # torchtitan 0.2.x registers its converters as quantize.linear.float8 / quantize.linear.mx (the names the
    # job files of autotune/engines/torchtitan/job.py use; "float8" / "mx" were 0.1.0's and stop 0.2.2 at start)
    if p.precision in ("fp8_tensorwise", "fp8_rowwise"):
        tt += ["[model]", 'converters = ["quantize.linear.float8"]', "[quantize.linear.float8]"]
        tt += ([] if p.precision == "fp8_tensorwise" else ['recipe_name = "rowwise"'])
        tt += ['filter_fqns = ["output"]  # LM head stays BF16']
    elif p.precision == "mxfp8":
        tt += ["[model]", 'converters = ["quantize.linear.mx"]', "[quantize.linear.mx]", 'recipe_name = "mxfp8_cublas"',
               'filter_fqns = ["output"]  # LM head stays BF16']
    elif p.precision == "fp8_delayed":
        tt.append("# fp8_delayed: torchtitan's float8 has dynamic scaling only; delayed scaling is Megatron-LM / TE")
    if p.compile:
        tt += ["[compile]", "enable = true", 'components = ["model", "loss"]']
    # local_batch_size: sequences per DP rank per forward-backward; torchtitan accumulates gradients over
    # global_batch_size / (local_batch_size x DP) of them; with PP the local batch is split into
    # pipeline_parallel_microbatch_size micro-batches instead
    local = p.micro_batch_size * (p.num_micro_batches if p.pp_degree > 1 else 1)
    tt += ["[training]", f"seq_len = {workload.seq_len}", f"local_batch_size = {local}",
           f"global_batch_size = {workload.global_batch_size}",
           "[activation_checkpoint]", f'mode = "{p.recompute}"']
    if model.is_moe:
        tt += ["[debug]", "moe_force_load_balance = true  # balanced routing, as the plan was costed"]
    env = []
    if p.memory_reclaim == "expandable_segments":
        env.append("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    elif p.memory_reclaim != "none":
        env.append(f"# call torch.cuda.empty_cache() {p.memory_reclaim.replace('empty_cache_', '').replace('_', ' ')}")
    # an engine that cannot launch this model gets one line saying why instead of flags for another model
    # (the check `export --launcher` refuses with: each engine export's launch_refusal)
    from autotune.engines.registry import export_module

    meg_refusal = export_module("megatron").launch_refusal(model, workload.seq_len)
    tt_refusal = export_module("torchtitan").launch_refusal(model, workload.seq_len)
    if meg_refusal:
        out = [f"Megatron-LM: flags not printed: {meg_refusal}"]
    else:
        out = ["Megatron-LM:", "  " + " \\\n  ".join(meg)] + ["  " + x for x in meg_notes]
    if tt_refusal:
        out.append(f"torchtitan: config not printed: {tt_refusal}")
    else:
        out += ["torchtitan (TOML, torchtitan < 0.3; for >= 0.3 use `autotune export --launcher torchrun -o DIR`):"] + \
            ["  " + x for x in tt]
        if p.zero_stage == 1:
            out.append(f"  # torchtitan has no ZeRO-1: this is DDP (data_parallel_replicate_degree = {p.dp_degree}, "
                       "optimizer states not sharded, more memory than the plan); FSDP "
                       f"(data_parallel_shard_degree = {p.dp_degree}) shards them too")
    if env:
        out += ["environment:"] + ["  " + e for e in env]
    return "\n".join(out)


# ------------------------------------------------------------------ JSON (docs/json-schema.md)

#: Version of the JSON that ``--json`` prints (``"schema": "autotune.result"``); bumped when a field
#: is renamed or removed or its meaning changes (adding fields keeps the version). See docs/json-schema.md.
JSON_SCHEMA_VERSION = 1
JSON_SCHEMA_NAME = "autotune.result"
_PREDICTION_KEYS = ("backend", "feasible", "infeasible_reason", "step_time_ms", "step_time_exposed_ms", "mfu",
                    "mfu_palm", "hfu", "tokens_per_s_per_gpu", "tflops_per_gpu", "peak_memory_bytes")
_STAGE_KEYS = ("weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "transient_bytes",
               "allocator_overhead_bytes")


def _jsonable(x: Any) -> Any:
    """Plain JSON values: mappings -> dicts with str keys, tuples/sets -> lists, other objects -> str;
    non-finite floats -> None (JSON has no NaN/Infinity)."""
    import math

    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    try:                                            # numpy scalars
        return _jsonable(x.item())
    except AttributeError:
        return str(x)


def _band_for(band: Mapping[str, Any] | None, gpu: str) -> Mapping[str, Any] | None:
    """``band`` (an engine's error band, all GPUs) with ``for_gpu``: its entry for ``gpu``'s hardware family
    (:func:`_gpu_band`, the figure the text output quotes), or None when none was measured."""
    if band is None:
        return None
    fam, g = _gpu_band(band, gpu)
    return {**band, "for_gpu": {"family": fam, **g} if g else None}


def result_entry(*, plan: Plan | None, result: StepResult | None, model: ModelSpec, gpu: str, num_gpus: int,
                 fabric: str, workload: Workload, engine: str, label: str | None = None,
                 study: str | None = None, trial: int | None = None, memory: Any = None,
                 extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One entry of ``results`` in the ``--json`` document (schema: docs/json-schema.md).

    Args:
        plan / result: the plan and its evaluation (both None for a study without a feasible plan).
        model, gpu (catalog name), num_gpus, fabric (name), workload: the target.
        engine: engine name; its error band (:func:`autotune.spec.engines.error_band`) is attached.
        memory: an :class:`autotune.cost.memory.MemoryEstimate` for the per-stage components; when None
            (and a plan is given) it is estimated here with the default calibration's fragmentation.
        extra: more keys merged into the entry (e.g. ``n_trials`` for ``show``).
    Returns: a dict of plain JSON values (str keys; bytes as int, times in ms, MFU as a fraction).
    """
    from autotune.spec.engines import error_band

    e: dict[str, Any] = {
        "label": label, "study": study, "trial": trial,
        "target": {"model": model.name, "gpu": gpu, "num_gpus": num_gpus, "fabric": fabric,
                   "seq_len": workload.seq_len, "global_batch_size": workload.global_batch_size,
                   "global_batch_tokens": workload.global_batch_tokens},
        "engine": engine,
        "plan": plan.to_dict() if plan is not None else None,
        "prediction": None, "breakdown_ms": None, "memory_per_stage": None,
        "error_band": _jsonable(_band_for(error_band(engine), gpu)),
        "provenance": None, "interval": None, "frontier": None,
    }
    if result is not None:
        rd = result.to_dict()
        e["prediction"] = {k: rd[k] for k in _PREDICTION_KEYS}
        e["breakdown_ms"] = dict(result.breakdown_ms)
        if plan is not None and memory is None:
            memory = _estimate_memory_for(model, plan, gpu, workload, engine)
        stages = []
        for i, total in enumerate(result.memory_per_stage_bytes):
            st: dict[str, Any] = {"stage": i, "total_bytes": int(total)}
            if memory is not None and i < len(memory.stages):
                st.update({k: int(getattr(memory.stages[i], k)) for k in _STAGE_KEYS})
            stages.append(st)
        e["memory_per_stage"] = stages
        e["provenance"] = {"label": provenance_label(result), "details": _jsonable(result.details)}
        e["interval"], e["frontier"] = _interval_entry(plan, result, model, gpu)
    if extra:
        e.update(_jsonable(extra))
    return _jsonable(e)


def _interval_entry(plan: Plan | None, result: StepResult, model: ModelSpec, gpu: str) -> tuple[Any, Any]:
    """(``interval``, ``frontier``) of a ``--json`` entry (docs/json-schema.md): the prediction's central 80%
    interval (autotune/spec/trust.py :class:`Interval` ``to_dict`` plus the measured MFU, tokens/s per GPU and
    step time it allows, and the one sentence the text prints), and the best published run for the GPU,
    precision class and model class with ``above`` (whether the prediction exceeds it); None where there is
    no plan, the plan does not fit, the result is a real run or nothing is shipped."""
    from autotune.spec.trust import frontier_for, interval_for, interval_sentence

    if plan is None or not result.feasible or result.backend == "real":
        return None, None
    moe = bool(getattr(model, "is_moe", False))
    iv = interval_for(plan, gpu, model.hidden_size, moe)
    ivd = None
    if iv is not None:
        m0, m1 = iv.throughput(result.mfu)
        t0, t1 = iv.throughput(result.tokens_per_s_per_gpu)
        s0, s1 = iv.step_time(result.step_time_ms)
        if result.mfu > 0 and m1 > 1.0:     # capped at the dense peak, as the text (interval_sentence)
            t1, s0, m1 = result.tokens_per_s_per_gpu / result.mfu, result.step_time_ms * result.mfu, 1.0
        ivd = {**iv.to_dict(), "mfu": [m0, m1], "tokens_per_s_per_gpu": [t0, t1], "step_time_ms": [s0, s1],
               "text": interval_sentence(iv, mfu=result.mfu, tokens_per_s=result.tokens_per_s_per_gpu,
                                         step_ms=result.step_time_ms)}
    f = frontier_for(gpu, plan.precision, "moe" if moe else "dense")
    if f is not None:
        f = {**f, "above": result.tflops_per_gpu > float(f["tflops_per_gpu"])}
    return ivd, f


def _estimate_memory_for(model: ModelSpec, plan: Plan, gpu: str, workload: Workload, engine: str) -> Any:
    """Per-stage memory components of ``plan`` (autotune.cost.memory.estimate_memory with the shipped
    calibration's fragmentation, as the simulated evaluator uses); None if the GPU or engine is unknown."""
    from autotune.cost.calibration import default_calibration
    from autotune.cost.memory import estimate_memory
    from autotune.cost.op_costs import CalibratedCosts
    from autotune.errors import AutotuneError
    from autotune.spec.hardware import get_gpu

    try:
        g = get_gpu(gpu)
        frag = CalibratedCosts(profile=default_calibration(), gpu=g).fragmentation()
        return estimate_memory(model, plan, g, workload, fragmentation=frag, engine=engine)
    except AutotuneError:
        return None


def json_document(command: str, results: Sequence[Mapping[str, Any]], **extra: Any) -> str:
    """The ``--json`` output of ``command``: ``{"schema": "autotune.result", "schema_version": 1,
    "command": ..., "results": [...], ...extra}`` as indented JSON text (docs/json-schema.md)."""
    import json

    doc = {"schema": JSON_SCHEMA_NAME, "schema_version": JSON_SCHEMA_VERSION, "command": command,
           "results": list(results)}
    doc.update(_jsonable(extra))
    return json.dumps(_jsonable(doc), indent=2, allow_nan=False)


__all__ = ["JSON_SCHEMA_VERSION", "backend_word", "fp8_peak_utilization", "json_document", "result_entry", "format_best_plan", "format_side_by_side", "format_studies", "launch_hints", "plan_rows",
           "provenance_label", "short_plan"]
