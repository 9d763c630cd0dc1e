"""Fidelity benchmark (GPU host): plans run for real beside the simulator's predictions.

For each plan of a fixed list (1 and 2 GPUs; Llama 3.1 8B, 70B and 405B at true width, truncated to a
few layers so each run takes seconds; TP, PP with each schedule, FSDP/DDP, recomputation modes, async
on and off, each reclaim policy, each measured interconnect tier) it runs the plan with
:func:`autotune.runtime.launch.run_plan`, simulates the same (truncated) model with the simulated
evaluator, and prints per plan: measured step time and peak reserved memory, the predicted step time
and peak memory, and their errors; then the mean absolute percentage error (MAPE), the worst case and
Spearman's rank correlation of the plans by step time. ``--markdown FILE`` writes the table; a file
holding the ``fidelity-table`` markers (``docs/fidelity.md``) keeps its text and gets a new table.

Run on the GPU host: ``make fidelity`` (profile, measured-evaluator predictions, all runs, table), or
``python bench/fidelity.py [--only LABELS] [--markdown docs/fidelity.md]``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.spec.hardware import ClusterSpec, get_fabric, get_gpu  # noqa: E402
from autotune.spec.models import get_model  # noqa: E402
from autotune.spec.plan import Plan, PlanDocument, Workload  # noqa: E402
from autotune.runtime.evaluator import TIER_ENV  # noqa: E402
from autotune.cost.simulator import SimulatedEvaluator  # noqa: E402

W = Workload(seq_len=8192, global_batch_size=4)


def plans() -> list[tuple[str, str, int, int, str, Plan]]:
    """(label, size, layers, gpus, fabric, plan)."""
    P = Plan
    dp2 = dict(dp_degree=2, micro_batch_size=1, num_micro_batches=2)
    out = [
        ("1gpu rc=none", "8b", 4, 1, "h200-nvlink", P(micro_batch_size=1, num_micro_batches=4, zero_stage=0,
                                                      dp_grad_reduce_overlap=False)),
        ("1gpu rc=selective", "8b", 4, 1, "h200-nvlink", P(micro_batch_size=1, num_micro_batches=4, zero_stage=0,
                                                           dp_grad_reduce_overlap=False, recompute="selective")),
        ("1gpu rc=full mbs2", "8b", 4, 1, "h200-nvlink", P(micro_batch_size=2, num_micro_batches=2, zero_stage=0,
                                                           dp_grad_reduce_overlap=False, recompute="full")),
        ("fsdp z3 overlap", "8b", 4, 2, "h200-nvlink", P(zero_stage=3, param_gather_overlap=True, **dp2)),
        ("fsdp z3 blocking", "8b", 4, 2, "h200-nvlink", P(zero_stage=3, async_collectives=False,
                                                          dp_grad_reduce_overlap=False, **dp2)),
        ("fsdp z2", "8b", 4, 2, "h200-nvlink", P(zero_stage=2, **dp2)),
        ("ddp z0 overlap", "8b", 4, 2, "h200-nvlink", P(zero_stage=0, **dp2)),
        ("ddp z0 blocking", "8b", 4, 2, "h200-nvlink", P(zero_stage=0, dp_grad_reduce_overlap=False, **dp2)),
        ("zero1", "8b", 4, 2, "h200-nvlink", P(zero_stage=1, **dp2)),
        ("tp2 sp", "8b", 4, 2, "h200-nvlink", P(tp_degree=2, micro_batch_size=1, num_micro_batches=4, zero_stage=0,
                                                sequence_parallel=True, dp_grad_reduce_overlap=False)),
        ("tp2 no-sp", "8b", 4, 2, "h200-nvlink", P(tp_degree=2, micro_batch_size=1, num_micro_batches=4,
                                                   zero_stage=0, dp_grad_reduce_overlap=False)),
        ("pp2 gpipe", "8b", 4, 2, "h200-nvlink", P(pp_degree=2, micro_batch_size=1, num_micro_batches=4,
                                                   pipeline_schedule="gpipe", zero_stage=0,
                                                   dp_grad_reduce_overlap=False)),
        ("pp2 1f1b", "8b", 4, 2, "h200-nvlink", P(pp_degree=2, micro_batch_size=1, num_micro_batches=4,
                                                  zero_stage=0, dp_grad_reduce_overlap=False)),
        ("pp2 interleaved v2", "8b", 4, 2, "h200-nvlink", P(pp_degree=2, vpp_degree=2, micro_batch_size=1,
                                                            num_micro_batches=4, pipeline_schedule="interleaved_1f1b",
                                                            zero_stage=0, dp_grad_reduce_overlap=False)),
        ("cp2", "8b", 4, 2, "h200-nvlink", P(cp_degree=2, micro_batch_size=1, num_micro_batches=4, zero_stage=3,
                                             param_gather_overlap=True)),
        ("fsdp empty_cache/step", "8b", 4, 2, "h200-nvlink", P(zero_stage=3, memory_reclaim="empty_cache_per_step",
                                                               **dp2)),
        ("fsdp empty_cache/mb", "8b", 4, 2, "h200-nvlink", P(zero_stage=3,
                                                             memory_reclaim="empty_cache_per_microbatch", **dp2)),
        ("fsdp expandable", "8b", 4, 2, "h200-nvlink", P(zero_stage=3, memory_reclaim="expandable_segments", **dp2)),
        ("fsdp host tier", "8b", 4, 2, "h200-host", P(zero_stage=3, param_gather_overlap=True, **dp2)),
        ("fsdp sockets tier", "8b", 4, 2, "h200-sockets", P(zero_stage=3, param_gather_overlap=True, **dp2)),
        ("ddp host tier", "8b", 4, 2, "h200-host", P(zero_stage=0, **dp2)),
        ("tp2 sp host tier", "8b", 4, 2, "h200-host", P(tp_degree=2, micro_batch_size=1, num_micro_batches=4,
                                                         zero_stage=0, sequence_parallel=True,
                                                         dp_grad_reduce_overlap=False)),
        ("pp2 1f1b host tier", "8b", 4, 2, "h200-host", P(pp_degree=2, micro_batch_size=1, num_micro_batches=4,
                                                          zero_stage=0, dp_grad_reduce_overlap=False)),
        ("1gpu rc=selective mbs2", "8b", 4, 1, "h200-nvlink", P(micro_batch_size=2, num_micro_batches=2,
                                                                zero_stage=0, dp_grad_reduce_overlap=False,
                                                                recompute="selective")),
        ("1gpu empty_cache/mb", "8b", 4, 1, "h200-nvlink", P(micro_batch_size=1, num_micro_batches=4, zero_stage=0,
                                                             dp_grad_reduce_overlap=False,
                                                             memory_reclaim="empty_cache_per_microbatch")),
        ("tp2 sp rc=full", "8b", 4, 2, "h200-nvlink", P(tp_degree=2, micro_batch_size=1, num_micro_batches=4,
                                                        zero_stage=0, sequence_parallel=True, recompute="full",
                                                        dp_grad_reduce_overlap=False)),
        ("pp2 1f1b rc=full mbs2", "8b", 4, 2, "h200-nvlink", P(pp_degree=2, micro_batch_size=2, num_micro_batches=2,
                                                               zero_stage=0, recompute="full",
                                                               dp_grad_reduce_overlap=False)),
        ("cp2 blocking", "8b", 4, 2, "h200-nvlink", P(cp_degree=2, micro_batch_size=1, num_micro_batches=4,
                                                      zero_stage=3, async_collectives=False,
                                                      dp_grad_reduce_overlap=False)),
        ("ddp bucket 100MiB", "8b", 4, 2, "h200-nvlink", P(zero_stage=0, bucket_size_mib=100, **dp2)),
        ("8b-32L fsdp rc=full", "8b", 32, 2, "h200-nvlink", P(zero_stage=3, param_gather_overlap=True,
                                                              recompute="full", **dp2)),
        ("70b-2L fsdp", "70b", 2, 2, "h200-nvlink", P(zero_stage=3, param_gather_overlap=True, **dp2)),
        ("70b-2L pp2 1f1b", "70b", 2, 2, "h200-nvlink", P(pp_degree=2, micro_batch_size=1, num_micro_batches=4,
                                                          zero_stage=0, dp_grad_reduce_overlap=False,
                                                          recompute="selective")),
        ("70b-2L tp2 sp", "70b", 2, 2, "h200-nvlink", P(tp_degree=2, micro_batch_size=1, num_micro_batches=4,
                                                        zero_stage=0, sequence_parallel=True,
                                                        dp_grad_reduce_overlap=False, recompute="full")),
        ("405b-1L fsdp", "405b", 1, 2, "h200-nvlink", P(zero_stage=3, param_gather_overlap=True,
                                                        recompute="full", **dp2)),
    ]
    return out


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rho of two equal-length lists (average ranks for ties)."""
    def ranks(x):
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else float("nan")


def main() -> int:
    from autotune.runtime.launch import run_plan

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="run only the first N plans")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--predict-measured", default=None, metavar="FILE",
                    help="GPU host, no runs: write the measured evaluator's predictions of every plan here (JSON)")
    ap.add_argument("--storage", default="sqlite:///studies/autotune.db",
                    help="profile store for --predict-measured (fill it with `autotune profile` first)")
    ap.add_argument("--measured", default=None, metavar="FILE",
                    help="add the measured evaluator's predictions (a --predict-measured file) to the table")
    ap.add_argument("--measured-store", default=None, metavar="FILE",
                    help="with --from-json: re-predict with the measured evaluator over this profile store, a "
                         "SQLite file or a YAML profile written by `autotune profile --export` (a temporary copy "
                         "is used; ops it holds are looked up, others interpolated; no GPU needed)")
    ap.add_argument("--only", default=None, help="comma-separated plan labels to run (default: all)")
    ap.add_argument("--profile", action="store_true",
                    help="also profile one extra step per plan (torch.profiler; per-category GPU time in the JSON)")
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--from-json", default=None,
                    help="no GPU: re-predict the plans of a stored run (its measured figures stay as measured)")
    a = ap.parse_args()
    if a.predict_measured:
        return _predict_measured(a)
    if a.from_json:
        return _repredict(a)
    import signal

    def _stop(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)          # a time limit still prints the table of what ran
    rows = []
    try:
        _run_all(a, rows, run_plan)
    except KeyboardInterrupt:
        print(f"interrupted after {len(rows)} plans", flush=True)
    return _report(a, rows)


def _run_all(a, rows, run_plan) -> None:
    chosen = plans()
    if a.only:
        want = [x.strip() for x in a.only.split(",")]
        unknown = sorted(set(want) - {c[0] for c in chosen})
        if unknown:
            raise SystemExit(f"error: unknown plan label(s) {unknown}; known: {[c[0] for c in chosen]}")
        chosen = [c for c in chosen if c[0] in want]
    for label, size, layers, gpus, fabric_name, plan in chosen[: a.limit]:
        model = get_model(size)
        fabric = get_fabric(fabric_name)
        proxy = model.truncated(layers)
        sim, live = _simulate(size, layers, gpus, fabric_name, plan)
        doc = PlanDocument(plan=plan, model=model, gpu="h200", num_gpus=gpus, fabric=fabric.to_dict(), workload=W)
        t0 = time.time()
        r = run_plan(doc, layers=layers, steps=a.steps, warmup=a.warmup, timeout_s=150,
                     env=TIER_ENV.get(fabric.intra_node.calibration_tier, {}), nproc=gpus, profile=a.profile)
        row = {"plan": label, "model": proxy.name, "gpus": gpus, "fabric": fabric_name, "status": r["status"],
               "wall_s": round(time.time() - t0, 1), "sim_step_ms": sim.step_time_ms if sim.feasible else None,
               "sim_peak_gib": sim.peak_memory_bytes / 2**30, "sim_live_gib": live, "reason": r.get("reason")}
        if r["status"] == "ok":
            row["step_ms"] = r["step_time_ms"]
            row["peak_gib"] = max(x or 0 for x in r.get("peak_reserved_bytes") or [0]) / 2**30
            row["device"] = r.get("device_name")
            row["torch"] = r.get("torch_version")
            row["date"] = r.get("date")
            row["cuda"] = r.get("cuda_version")
            row["nccl"] = r.get("nccl_version")
            row["driver"] = _driver_version()
            for k in ("peak_allocated_bytes", "allocated_after_build_bytes", "allocated_after_step_bytes",
                      "reserved_by_stream_bytes", "step_times_ms", "profile"):
                if r.get(k) is not None:
                    row[k] = r[k]
        rows.append(row)
        print(json.dumps(row), flush=True)


def _driver_version() -> str | None:
    """NVIDIA driver version (``nvidia-smi``), None without one."""
    import subprocess
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.split()[0] if out.returncode == 0 and out.stdout.split() else None
    except (OSError, subprocess.SubprocessError):
        return None


def _simulate(size: str, layers: int, gpus: int, fabric_name: str, plan: Plan):
    """(simulated StepResult, simulated live GiB: the peak stage's bytes without allocator overhead)."""
    from autotune.cost.memory import estimate_memory

    model = get_model(size)
    cluster = ClusterSpec(gpu=get_gpu("h200"), num_gpus=gpus, fabric=get_fabric(fabric_name))
    proxy = model.truncated(layers)
    # the fidelity plans ran on autotune's own runtime: predict them for the native engine
    ev = SimulatedEvaluator(model=proxy, cluster=cluster, workload=W, engine="native")
    est = estimate_memory(proxy, plan, cluster.gpu, W, fragmentation=ev.costs.fragmentation(), engine="native")
    live = max(st.total_bytes - st.allocator_overhead_bytes for st in est.stages) / 2**30
    return ev.evaluate(plan), live


def _predict_measured(a) -> int:
    """The measured evaluator's step time and peak memory for every plan (GEMMs and attention of the
    exact shapes timed on this GPU when missing from the store), written as JSON keyed by plan label."""
    from autotune.profiling.measured import MeasuredEvaluator

    out = {}
    evaluators = {}
    for label, size, layers, gpus, fabric_name, plan in plans():
        key = (size, layers, gpus, fabric_name)
        if key not in evaluators:
            cluster = ClusterSpec(gpu=get_gpu("h200"), num_gpus=gpus, fabric=get_fabric(fabric_name))
            evaluators[key] = MeasuredEvaluator(model=get_model(size).truncated(layers), cluster=cluster,
                                                workload=W, storage=a.storage, engine="native")
        res = evaluators[key].evaluate(plan)
        out[label] = {"step_ms": res.step_time_ms if res.feasible else None,
                      "peak_gib": res.peak_memory_bytes / 2**30,
                      "op_sources": res.details.get("op_sources"), "costs": str(evaluators[key].costs.label)}
        print(label, out[label], flush=True, file=sys.stderr)
    Path(a.predict_measured).write_text(json.dumps(out, indent=1, default=str))
    return 0


def _measured_from_store(store: str) -> str:
    """Run :func:`_predict_measured` over a temporary copy of ``store`` (SQLite file, or a YAML profile
    imported losslessly by :func:`autotune.profiling.store.import_profile`); returns the JSON path."""
    import shutil
    import tempfile
    from types import SimpleNamespace

    tmp = Path(tempfile.mkdtemp(prefix="autotune-fidelity-"))
    if store.endswith((".yaml", ".yml")):
        from autotune.files import read_yaml_file
        from autotune.profiling.store import import_profile
        import_profile(read_yaml_file(store, what="profile"), f"sqlite:///{tmp / 'ops.db'}")
    else:
        shutil.copy(store, tmp / "ops.db")
    out = tmp / "measured.json"
    _predict_measured(SimpleNamespace(predict_measured=str(out), storage=f"sqlite:///{tmp / 'ops.db'}"))
    return str(out)


def _repredict(a) -> int:
    if a.measured_store:
        a.measured = _measured_from_store(a.measured_store)
    stored = {r["plan"]: r for r in json.loads(Path(a.from_json).read_text())}
    rows = []
    for label, size, layers, gpus, fabric_name, plan in plans():
        if label not in stored:
            continue
        r = dict(stored[label])
        sim, live = _simulate(size, layers, gpus, fabric_name, plan)
        r["sim_step_ms"] = sim.step_time_ms if sim.feasible else None
        r["sim_peak_gib"] = sim.peak_memory_bytes / 2**30
        r["sim_live_gib"] = live
        rows.append(r)
    return _report(a, rows)


def _pct(pred, meas):
    return 100 * (pred - meas) / meas if pred is not None and meas else None


def _fmt(x, spec=".1f", suffix=""):
    return "-" if x is None else f"{x:{spec}}{suffix}"


def _summary(name, rows, pred_key, meas_key):
    pairs = [(r[pred_key], r[meas_key], r["plan"]) for r in rows
             if r.get(pred_key) is not None and r.get(meas_key)]
    if not pairs:
        return None
    errs = [100 * (p - m) / m for p, m, _ in pairs]
    k = max(range(len(errs)), key=lambda i: abs(errs[i]))
    rho = spearman([m for _, m, _ in pairs], [p for p, _, _ in pairs])
    within = sum(abs(e) <= 10 for e in errs)
    return (f"{name}: MAPE {statistics.fmean(abs(e) for e in errs):.1f}% over {len(pairs)} plans, "
            f"worst {errs[k]:+.1f}% ({pairs[k][2]}), {within} within 10%, Spearman {rho:.2f}")


TABLE_START, TABLE_END = "<!-- fidelity-table:start -->", "<!-- fidelity-table:end -->"


def _write_markdown(path: Path, table: str) -> None:
    """Write ``table`` to ``path``; a file holding the two markers keeps everything outside them
    (docs/fidelity.md: its text stays, its table is replaced)."""
    if path.exists():
        text = path.read_text()
        if TABLE_START in text and TABLE_END in text:
            head, rest = text.split(TABLE_START, 1)
            tail = rest.split(TABLE_END, 1)[1]
            path.write_text(f"{head}{TABLE_START}\n{table}{TABLE_END}{tail}")
            return
    path.write_text(table)


def _report(a, rows) -> int:
    measured_pred = json.loads(Path(a.measured).read_text()) if getattr(a, "measured", None) else {}
    ok = [r for r in rows if r["status"] == "ok" and r.get("step_ms")]
    for r in rows:
        mp = measured_pred.get(r["plan"]) or {}
        r["meas_eval_step_ms"] = mp.get("step_ms")
        r["meas_eval_peak_gib"] = mp.get("peak_gib")
        if r.get("peak_allocated_bytes"):
            r["alloc_gib"] = max(x or 0 for x in r["peak_allocated_bytes"]) / 2**30
    lines = ["| plan | model | GPUs | fabric | measured step ms | simulated ms | error | measured-evaluator ms | "
             "error | reserved GiB | simulated GiB | error | allocated GiB | simulated live GiB | error |",
             "|" + "---|" * 15]
    for r in rows:
        if r in ok:
            lines.append(
                f"| {r['plan']} | {r['model']} | {r['gpus']} | {r['fabric']} | {r['step_ms']:.1f} | "
                f"{_fmt(r['sim_step_ms'])} | {_fmt(_pct(r['sim_step_ms'], r['step_ms']), '+.1f', '%')} | "
                f"{_fmt(r['meas_eval_step_ms'])} | {_fmt(_pct(r['meas_eval_step_ms'], r['step_ms']), '+.1f', '%')} | "
                f"{r['peak_gib']:.1f} | {r['sim_peak_gib']:.1f} | {_fmt(_pct(r['sim_peak_gib'], r['peak_gib']), '+.1f', '%')} | "
                f"{_fmt(r.get('alloc_gib'))} | {_fmt(r.get('sim_live_gib'))} | "
                f"{_fmt(_pct(r.get('sim_live_gib'), r.get('alloc_gib')), '+.1f', '%')} |")
        else:
            lines.append(f"| {r['plan']} | {r['model']} | {r['gpus']} | {r['fabric']} | {r['status']} | "
                         f"{_fmt(r['sim_step_ms'])} | - | {_fmt(r['meas_eval_step_ms'])} | - | - | "
                         f"{r['sim_peak_gib']:.1f} | - | - | {_fmt(r.get('sim_live_gib'))} | - |")
    summary = [f"plans run: {len(rows)}, ok: {len(ok)}"]
    for name, pk, mk in (("step time, simulated evaluator", "sim_step_ms", "step_ms"),
                         ("step time, measured evaluator", "meas_eval_step_ms", "step_ms"),
                         ("peak reserved memory, simulated (with allocator overhead)", "sim_peak_gib", "peak_gib"),
                         ("peak allocated memory, simulated live bytes", "sim_live_gib", "alloc_gib")):
        line = _summary(name, ok, pk, mk)
        if line:
            summary.append(line)
    if ok:
        sw = ", ".join(f"{k} {ok[0][key]}" for k, key in (("torch", "torch"), ("CUDA", "cuda"), ("NCCL", "nccl"),
                                                             ("driver", "driver")) if ok[0].get(key))
        summary.append(f"hardware: {ok[0].get('device')} x{max(r['gpus'] for r in ok)}, {sw}, "
                       f"measured {str(ok[0].get('date') or '')[:10]}; simulated predictions by the current "
                       f"simulator with the shipped calibration, {_dt.date.today().isoformat()}")
    print("\n".join(lines + [""] + summary))
    if a.markdown:
        _write_markdown(Path(a.markdown), "\n".join(lines + [""] + [f"- {s}" for s in summary]) + "\n")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
