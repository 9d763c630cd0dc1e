"""torchrun entry point: time one plan end to end and write the result as JSON.

Usage (normally through :func:`autotune.runtime.launch.run_plan`)::

    torchrun --standalone --nproc-per-node N -m autotune.runtime.worker \\
        --plan PLAN.yaml [--layers N] --steps 5 --warmup 2 --out result.json [--phase-dir DIR] \\
        [--profile-dir DIR]

Backend ``nccl`` on CUDA (device ``cuda:LOCAL_RANK``), ``gloo`` on CPU. Each rank writes its current
phase (``init``, ``build``, ``warmup 1/2``, ``step 3/5``, ``report``) to ``DIR/phase.rank<R>`` so the
launcher can say where a hung job was. Failures leave ``DIR/error.rank<R>.json``
(``{"kind": "oom" | "plan" | "error", "message", "phase", memory fields}``); an out-of-memory rank
exits with :data:`EXIT_OOM`.

Result JSON (rank 0), times in ms, memory in bytes:
``step_times_ms`` (timed steps; per step the max over ranks), ``step_time_ms`` (median),
``step_time_spread_ms`` (max - min) and ``step_time_iqr_ms``, ``warmup_times_ms`` and ``compile_s`` (first warm-up step minus the median, s:
compilation reported apart from the step time), ``tokens_per_s_per_gpu``, ``mfu``
(causal convention, :mod:`autotune.cost.flops`, FLOPs of the model as run, i.e. of the truncated depth for
a ``--layers`` proxy), ``mfu_palm``, ``hfu``, ``tflops_per_gpu``, ``peak_allocated_bytes`` /
``peak_reserved_bytes``, ``allocated_after_build_bytes`` (model as built) and
``allocated_after_step_bytes`` (with gradients and optimizer states) (per rank; CUDA) or ``peak_rss_bytes`` (per rank; CPU), ``losses`` (per
step, mean over DP ranks), ``honored`` (what each plan setting became), versions, device, date.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import resource
import statistics
import sys
import time
import traceback
from pathlib import Path

EXIT_OOM = 42
EXIT_PLAN = 43

#: Test hook (CI only): ``raise:<phase>`` or ``hang:<phase>`` makes every rank (or only rank R with
#: ``hang:<phase>@R``) raise / sleep forever when it enters a phase whose name starts with ``<phase>``.
FAULT_ENV = "AUTOTUNE_RUNTIME_FAULT"


class _Phase:
    def __init__(self, phase_dir: str | None, rank: int) -> None:
        self.rank = rank
        self.path = Path(phase_dir) / f"phase.rank{rank}" if phase_dir else None
        self.name = "init"
        self.fault = os.environ.get(FAULT_ENV, "")

    def __call__(self, name: str) -> None:
        self.name = name
        if self.path is not None:
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(name)
            os.replace(tmp, self.path)
        if self.fault:
            kind, _, where = self.fault.partition(":")
            where, _, only = where.partition("@")
            if name.startswith(where) and (not only or int(only) == self.rank):
                if kind == "raise":
                    raise RuntimeError(f"injected failure ({FAULT_ENV}={self.fault}) in phase {name!r}")
                if kind == "hang":
                    while True:
                        time.sleep(3600)


def _is_oom(e: BaseException) -> bool:
    import torch
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return True
    msg = str(e)
    return isinstance(e, RuntimeError) and ("out of memory" in msg or "can't allocate memory" in msg
                                            or "Cannot allocate memory" in msg)


def _mem_stats(device) -> dict:
    import torch
    out = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if device.type == "cuda":
        out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    return out


def _reserved_by_stream(device) -> dict[str, int]:
    """Reserved bytes of the caching allocator per CUDA stream (``torch.cuda.memory_snapshot`` segments;
    a freed block is reused only by its own stream, so collectives on side streams keep pools of
    their own). Keys are stream handles as strings; the default stream is ``"0"``."""
    import torch
    out: dict[str, int] = {}
    for seg in torch.cuda.memory_snapshot():
        if seg.get("device") == device.index:
            k = str(seg.get("stream", "?"))
            out[k] = out.get(k, 0) + int(seg.get("total_size", 0))
    return out


def _apply_memory_limit(limit_mib: float | None, device) -> str | None:
    """Cap this process's memory at ``limit_mib`` MiB more than it holds now (a real cap: allocations
    beyond it fail with the allocator's own out-of-memory error).

    CUDA: ``torch.cuda.set_per_process_memory_fraction``. CPU: ``RLIMIT_AS`` set to the current
    virtual size + the limit (Linux ``/proc/self/statm``)."""
    import torch
    if not limit_mib:
        return None
    lim = int(limit_mib * 2**20)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, (torch.cuda.memory_reserved(device) + lim) / total),
                                                   device)
        return f"cuda per-process fraction, {limit_mib} MiB above current"
    vsize = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (vsize + lim, resource.RLIM_INFINITY))
    return f"RLIMIT_AS = {vsize + lim} bytes ({limit_mib} MiB above current)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="autotune.runtime.worker", description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--phase-dir", default=None)
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--memory-limit-mib", type=float, default=None)
    ap.add_argument("--profile-dir", default=None,
                    help="after the timed steps, run one more step under torch.profiler and write its "
                         "summary (autotune.runtime.trace) to DIR/profile.rank<R>.json")
    a = ap.parse_args(argv)

    rank = int(os.environ.get("RANK", "0"))
    phase = _Phase(a.phase_dir, rank)
    err_path = Path(a.phase_dir) / f"error.rank{rank}.json" if a.phase_dir else None
    device = None
    try:
        phase("init")
        import torch
        import torch.distributed as dist
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        use_cuda = a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available())
        if use_cuda:
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        dist.init_process_group("nccl" if use_cuda else "gloo",
                                **({"device_id": device} if use_cuda else {}))
        code = _run(a, phase, device)
        dist.destroy_process_group()
        return code
    except BaseException as e:  # noqa: BLE001 - classified for the launcher, then re-raised as exit code
        from autotune.errors import PlanError
        kind = "oom" if _is_oom(e) else "plan" if isinstance(e, PlanError) else "error"
        rec = {"kind": kind, "message": f"{type(e).__name__}: {e}"[:4000], "phase": phase.name, "rank": rank}
        if device is not None:
            try:
                rec.update(_mem_stats(device))
            except Exception:  # noqa: BLE001
                pass
        if err_path is not None:
            err_path.write_text(json.dumps(rec))
        traceback.print_exc()
        sys.stderr.flush()
        # skip interpreter teardown: peers may be stuck in a collective with us
        os._exit(EXIT_OOM if kind == "oom" else EXIT_PLAN if kind == "plan" else 1)


def _run(a, phase: _Phase, device) -> int:
    import torch
    import torch.distributed as dist

    from autotune.cost import flops
    from autotune.runtime.parallelize import parallelize
    from autotune.spec.hardware import get_gpu
    from autotune.spec.plan import PlanDocument

    doc = PlanDocument.load(a.plan)
    plan, spec, wl = doc.plan, doc.model, doc.workload
    phase("build")
    rt = parallelize(plan, spec, seq_len=wl.seq_len, num_layers=a.layers, device=device, seed=a.seed)
    limit_note = _apply_memory_limit(a.memory_limit_mib, device)
    built_bytes = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        built_bytes = torch.cuda.memory_allocated(device)

    gbs = plan.global_batch_size
    times_ms: list[float] = []
    warmup_ms: list[float] = []
    losses: list[float | None] = []
    total = a.warmup + a.steps
    for i in range(total):
        name = f"warmup {i + 1}/{a.warmup}" if i < a.warmup else f"step {i - a.warmup + 1}/{a.steps}"
        phase(name)
        g = torch.Generator().manual_seed(a.seed * 100003 + i)
        data = torch.randint(0, spec.vocab_size, (gbs, wl.seq_len + 1), generator=g)
        x, y = rt.local_batch(data[:, :-1]), rt.local_batch(data[:, 1:])
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        loss = rt.train_step(x, y)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = (time.perf_counter() - t0) * 1e3
        if i >= a.warmup:
            times_ms.append(dt)
            losses.append(loss)
        else:
            warmup_ms.append(dt)

    phase("report")
    mem = _mem_stats(device)
    if device.type == "cuda":
        # after a step: parameters, gradients (kept until the next zero_grad) and optimizer states
        mem["allocated_after_build_bytes"] = built_bytes
        mem["allocated_after_step_bytes"] = torch.cuda.memory_allocated(device)
        mem["reserved_by_stream_bytes"] = _reserved_by_stream(device)
    if a.profile_dir:
        from autotune.runtime.trace import profile_step
        phase("profile")
        g = torch.Generator().manual_seed(a.seed * 100003 + total)
        data = torch.randint(0, spec.vocab_size, (gbs, wl.seq_len + 1), generator=g)
        x, y = rt.local_batch(data[:, :-1]), rt.local_batch(data[:, 1:])
        dist.barrier()
        sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        _, summary = profile_step(lambda: rt.train_step(x, y), sync=sync)
        summary["rank"] = dist.get_rank()
        Path(a.profile_dir).mkdir(parents=True, exist_ok=True)
        (Path(a.profile_dir) / f"profile.rank{dist.get_rank()}.json").write_text(json.dumps(summary, indent=1))
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"times": times_ms, "warmup": warmup_ms, "losses": losses, "mem": mem,
                                      "dp_rank": rt.dp_rank, "tp_rank": rt.mesh.get_local_rank("tp")})
    if dist.get_rank() != 0:
        return _leave_together(phase, dist)
    step_ms = [max(g["times"][k] for g in gathered) for k in range(a.steps)]
    # losses: ranks holding the last stage, one per (dp, cp) rank (tp ranks agree), averaged
    step_losses = []
    for k in range(a.steps):
        vals = [g["losses"][k] for g in gathered if g["losses"][k] is not None and g["tp_rank"] == 0]
        step_losses.append(sum(vals) / len(vals) if vals else None)
    med = statistics.median(step_ms)
    q = statistics.quantiles(step_ms, n=4) if len(step_ms) >= 2 else [med, med, med]
    tspec = rt.spec
    model_flops = flops.step_model_flops(tspec, wl.seq_len, gbs)
    palm_flops = flops.step_model_flops(tspec, wl.seq_len, gbs, causal=False)
    hw_flops = model_flops + flops.recompute_flops_per_token(tspec, wl.seq_len, plan.recompute) * wl.seq_len * gbs
    n = plan.num_gpus
    peak = get_gpu(doc.gpu).bf16_tflops
    s = med / 1e3
    res = {
        "status": "ok",
        "plan": plan.to_dict(), "model": tspec.name, "num_layers": tspec.num_layers,
        "full_num_layers": spec.num_layers, "seq_len": wl.seq_len, "global_batch_size": gbs,
        "num_gpus": n, "gpu": doc.gpu, "peak_bf16_tflops": peak,
        "warmup_steps": a.warmup, "timed_steps": a.steps,
        "step_times_ms": step_ms, "step_time_ms": med, "step_time_spread_ms": max(step_ms) - min(step_ms),
        "step_time_iqr_ms": q[2] - q[0],
        # warm-up steps (compilation, autotuning and allocator growth in the first): max over ranks;
        # compile_s = first warm-up step minus the median step, the compile time reported apart
        "warmup_times_ms": [max(g["warmup"][k] for g in gathered) for k in range(a.warmup)],
        "compile_s": ((max(g["warmup"][0] for g in gathered) - med) / 1e3 if a.warmup else None),
        "tokens_per_s_per_gpu": gbs * wl.seq_len / s / n,
        "model_flops_per_step": model_flops,
        "tflops_per_gpu": model_flops / s / n / 1e12,
        "mfu": flops.mfu(model_flops, s, n, peak), "mfu_palm": flops.mfu(palm_flops, s, n, peak),
        "hfu": flops.mfu(hw_flops, s, n, peak),
        "mfu_convention": "6N + 6LHQTc, c=1 causal (autotune.cost.flops); mfu_palm c=2",
        "peak_allocated_bytes": [g["mem"].get("peak_allocated_bytes") for g in gathered],
        "peak_reserved_bytes": [g["mem"].get("peak_reserved_bytes") for g in gathered],
        "peak_rss_bytes": [g["mem"]["peak_rss_bytes"] for g in gathered],
        "allocated_after_build_bytes": [g["mem"].get("allocated_after_build_bytes") for g in gathered],
        "allocated_after_step_bytes": [g["mem"].get("allocated_after_step_bytes") for g in gathered],
        "reserved_by_stream_bytes": [g["mem"].get("reserved_by_stream_bytes") for g in gathered],
        "losses": step_losses,
        "honored": rt.honored, "dp_mode": rt.dp_mode, "memory_limit": limit_note,
        "backend": dist.get_backend(),
        "torch_version": torch.__version__, "cuda_version": torch.version.cuda,
        "nccl_version": (".".join(map(str, torch.cuda.nccl.version())) if device.type == "cuda" else None),
        "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                        else f"cpu ({platform.processor() or platform.machine()})"),
        "env": {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "NCCL_NVLS_ENABLE",
                                                "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NCCL_P2P_DISABLE",
                                                "NCCL_SHM_DISABLE")},
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    tmp = Path(str(a.out) + ".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    os.replace(tmp, a.out)
    return _leave_together(phase, dist)


def _leave_together(phase: _Phase, dist) -> int:
    """Every rank waits until rank 0 has written the report, then tears down (phase ``teardown``).

    A rank that left while rank 0 was still writing and destroyed its process group could abort (gloo
    on CPU: rank 1 ended with SIGABRT in the report phase, twice in a day of test runs), and the
    launcher then stopped rank 0 before the result was on disk. After this barrier the result exists;
    the launcher accepts it if a rank dies in ``teardown`` (:func:`autotune.runtime.launch.run_plan`).
    """
    dist.barrier()
    phase("teardown")
    return 0


if __name__ == "__main__":
    sys.exit(main())
