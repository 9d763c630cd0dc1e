"""Collective benchmark: a ``torchrun`` worker timing NCCL (or gloo) collectives, and its launcher.

Run by ``autotune profile`` once per interconnect tier::

    python -m torch.distributed.run --standalone --nproc-per-node N -m autotune.profiling.nccl_bench \\
        --tier nvlink --out results.jsonl [--sizes 1048576,16777216] [--overlap]

For every group size 2..N (ranks 0..g-1 of the world), every kind (all-reduce, all-gather,
reduce-scatter, all-to-all; send/recv on 2 ranks only) and every message size S, rank 0 appends one
JSON line ``{"type": "collective", tier, kind, group_size, nbytes, median_ms, busbw_gbs, repeats}``
and flushes, so an interrupted run keeps what it measured. Message size S and bus bandwidth follow
nccl-tests (``PERFORMANCE.md``; also :mod:`autotune.cost.calibration`): S is the all-reduce buffer, the
all-gather output, the reduce-scatter input, the all-to-all buffer, the send/recv message;
``busbw = S / t x 2(n-1)/n`` (all-reduce), ``x (n-1)/n`` (all-gather, reduce-scatter, all-to-all),
``x 1`` (send/recv). Send/recv is nccl-tests' ``sendrecv``: every rank sends S to the next rank and
receives S from the previous one at once (``batch_isend_irecv``).

Timing: two warm-up ops; then ``iters`` ops per round (agreed between ranks: MAX of the warm-up time
over the group, so every rank issues the same number of collectives) for ``repeats`` rounds, each
round bracketed by device synchronization and ``perf_counter``; the median round / iters.

Tiers (set by :func:`launch` in the worker's environment; ``NCCL_NVLS_ENABLE=0`` and
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` always): ``nvlink`` default NCCL transports; ``host``
``NCCL_P2P_DISABLE=1`` (through host shared memory); ``sockets`` ``NCCL_P2P_DISABLE=1
NCCL_SHM_DISABLE=1`` and ``NCCL_IB_DISABLE=1`` (so the NET transport is TCP sockets even on a host
with InfiniBand NICs).

``--overlap`` adds the overlap interference measurement (see :func:`measure_overlap`).
``--backend gloo`` (the default without CUDA) runs the same code on CPU tensors (unit tests).
"""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from autotune.cost.calibration import COLLECTIVE_KINDS
from autotune.spec.hardware import NCCL_TIER_ENV

ALWAYS_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
TIER_ENV: dict[str, dict[str, str]] = NCCL_TIER_ENV
QUICK_SIZES = (1 << 20, 16 << 20, 128 << 20, 1 << 30)
FULL_SIZES = tuple(1 << e for e in range(16, 31))  # 64 KiB .. 1 GiB


def busbw_gbs(kind: str, nbytes: float, ms: float, n: int) -> float:
    """nccl-tests bus bandwidth, GB/s, of a collective of size S=``nbytes`` taking ``ms`` on ``n`` ranks."""
    algbw = nbytes / (ms * 1e6)
    if kind == "all_reduce":
        return algbw * 2.0 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return algbw * (n - 1) / n
    if kind == "send_recv":
        return algbw
    raise ValueError(f"unknown collective {kind!r}; valid: {', '.join(COLLECTIVE_KINDS)}")


# ----------------------------------------------------------------------------- worker
class _Worker:
    def __init__(self, backend: str) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.cuda = backend == "nccl"
        if self.cuda:
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            self.device = torch.device("cuda", local)
            self.dtype = torch.bfloat16
        else:
            self.device = torch.device("cpu")
            self.dtype = torch.float32
        dist.init_process_group(backend)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.es = torch.tensor([], dtype=self.dtype).element_size()

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def op(self, kind: str, nbytes: int, group: Any, g: int) -> tuple[Callable[[], None], int]:
        """The collective as a closure, and the actual S in bytes (rounded down to a multiple of g elements)."""
        torch, dist = self.torch, self.dist
        n = max(g, (nbytes // self.es) // g * g)
        rnd = lambda k: torch.randn(k, device=self.device, dtype=self.dtype)  # noqa: E731
        rank_in = self.rank
        if kind == "all_reduce":
            x = rnd(n)
            return (lambda: dist.all_reduce(x, group=group)), n * self.es
        if kind == "all_gather":
            inp, out = rnd(n // g), torch.empty(n, device=self.device, dtype=self.dtype)
            return (lambda: dist.all_gather_into_tensor(out, inp, group=group)), n * self.es
        if kind == "reduce_scatter":
            inp, out = rnd(n), torch.empty(n // g, device=self.device, dtype=self.dtype)
            return (lambda: dist.reduce_scatter_tensor(out, inp, group=group)), n * self.es
        if kind == "all_to_all":
            inp, out = rnd(n), torch.empty(n, device=self.device, dtype=self.dtype)
            return (lambda: dist.all_to_all_single(out, inp, group=group)), n * self.es
        if kind == "send_recv":
            x, y = rnd(n), torch.empty(n, device=self.device, dtype=self.dtype)
            nxt, prv = (rank_in + 1) % g, (rank_in - 1) % g

            def sendrecv() -> None:
                reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, nxt, group=group),
                                               dist.P2POp(dist.irecv, y, prv, group=group)])
                for r in reqs:
                    r.wait()

            return sendrecv, n * self.es
        raise ValueError(f"unknown collective {kind!r}")

    def agree_max(self, value: float, group: Any) -> float:
        t = self.torch.tensor([value], device=self.device, dtype=self.torch.float64 if not self.cuda
                              else self.torch.float32)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=group)
        return float(t.item())

    def time_collective(self, fn: Callable[[], None], group: Any, *, repeats: int,
                        target_round_s: float, max_iters: int) -> tuple[float, int]:
        """Median ms per op over ``repeats`` rounds (see module docstring); also the iterations per round."""
        for _ in range(2):
            fn()
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        one = self.agree_max(time.perf_counter() - t0, group)
        iters = int(max(1, min(max_iters, target_round_s / max(one, 1e-6))))
        samples = []
        for _ in range(repeats):
            self.dist.barrier(group=group)
            self.sync()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            self.sync()
            samples.append((time.perf_counter() - t0) * 1e3 / iters)
        return statistics.median(samples), iters * repeats


def measure_overlap(w: _Worker, *, gemm_size: int, gemm_loop: int, comm_bytes: int, repeats: int = 5) -> dict:
    """Overlap interference on the world group: a loop of ``gemm_loop`` (n x n) @ (n x n) GEMMs timed
    alone and while async all-reduces of ``comm_bytes`` run beside it (enough of them, issued before
    the loop, to cover it). Both are warmed up first (the probe's serial figure included a cold start).
    ``compute_slowdown = overlapped / alone - 1``."""
    torch, dist = w.torch, w.dist
    a = torch.randn(gemm_size, gemm_size, device=w.device, dtype=w.dtype)
    buf = torch.randn(max(1, comm_bytes // w.es), device=w.device, dtype=w.dtype)

    def loop() -> None:
        for _ in range(gemm_loop):
            torch.mm(a, a)

    def timed(fn: Callable[[], Any]) -> float:
        if w.cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            return float(s.elapsed_time(e))
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    for _ in range(2):  # warm-up: GEMM kernels, communicator, buffers
        loop()
        dist.all_reduce(buf)
    w.sync()
    alone = []
    for _ in range(repeats):
        dist.barrier()
        w.sync()
        alone.append(timed(loop))
    comm = []
    for _ in range(repeats):
        dist.barrier()
        w.sync()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        w.sync()
        comm.append((time.perf_counter() - t0) * 1e3)
    t_alone, t_comm = statistics.median(alone), statistics.median(comm)
    n_comm = int(w.agree_max(math.ceil(t_alone / max(t_comm, 1e-6)) + 1, None))
    over = []
    for _ in range(repeats):
        dist.barrier()
        w.sync()
        handles = [dist.all_reduce(buf, async_op=True) for _ in range(n_comm)]
        over.append(timed(loop))
        for h in handles:
            h.wait()
        w.sync()
    t_over = statistics.median(over)
    return {"type": "overlap", "gemm_ms_alone": t_alone, "gemm_ms_overlapped": t_over, "comm_ms": t_comm,
            "comm_nbytes": buf.numel() * w.es, "compute_slowdown": t_over / t_alone - 1.0,
            "num_allreduces": n_comm}


def worker_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of each torchrun process (see module docstring for the arguments)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m autotune.profiling.nccl_bench")
    ap.add_argument("--tier", default="nvlink")
    ap.add_argument("--out", required=True, help="JSON-lines file rank 0 appends results to")
    ap.add_argument("--sizes", default=None, help="comma-separated bytes (default: 64 KiB..1 GiB)")
    ap.add_argument("--quick", action="store_true", help="sizes 1 MiB, 16 MiB, 128 MiB, 1 GiB")
    ap.add_argument("--kinds", default=",".join(COLLECTIVE_KINDS))
    ap.add_argument("--group-sizes", default=None, help="comma-separated (default 2..world)")
    ap.add_argument("--backend", default=None, help="nccl (default with CUDA) or gloo")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--round-seconds", type=float, default=0.05)
    ap.add_argument("--max-iters", type=int, default=50)
    ap.add_argument("--skip", default=None, help="JSON file: [[kind, group_size, nbytes], ...] already stored")
    ap.add_argument("--overlap", action="store_true")
    ap.add_argument("--overlap-gemm", type=int, default=8192)
    ap.add_argument("--overlap-loop", type=int, default=10)
    ap.add_argument("--overlap-bytes", type=int, default=256 << 20)
    a = ap.parse_args(argv)

    os.environ.update(ALWAYS_ENV)
    import torch

    backend = a.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    w = _Worker(backend)
    sizes = ([int(s) for s in a.sizes.split(",")] if a.sizes else list(QUICK_SIZES if a.quick else FULL_SIZES))
    kinds = [k for k in a.kinds.split(",") if k]
    groups = ([int(g) for g in a.group_sizes.split(",")] if a.group_sizes else list(range(2, w.world + 1)))
    skip = set()
    if a.skip and Path(a.skip).exists():
        skip = {tuple(x) for x in json.loads(Path(a.skip).read_text())}
    out = open(a.out, "a") if w.rank == 0 else None

    def emit(d: dict) -> None:
        if out is not None:
            out.write(json.dumps({"tier": a.tier, **d}) + "\n")
            out.flush()
            print(json.dumps({"tier": a.tier, **d}), file=sys.stderr, flush=True)

    try:
        for g in groups:
            if g < 2 or g > w.world:
                continue
            group = None if g == w.world else w.dist.new_group(ranks=list(range(g)))  # every rank calls
            member = w.rank < g
            for kind in kinds:
                if kind == "send_recv" and g != 2:
                    continue
                for s in sizes:
                    if (kind, g, s) in skip:
                        continue
                    if member:
                        try:
                            fn, nb = w.op(kind, s, group, g)
                            ms, reps = w.time_collective(fn, group, repeats=a.repeats,
                                                         target_round_s=a.round_seconds, max_iters=a.max_iters)
                            emit({"type": "collective", "kind": kind, "group_size": g, "nbytes": s,
                                  "actual_nbytes": nb, "median_ms": ms, "busbw_gbs": busbw_gbs(kind, nb, ms, g),
                                  "repeats": reps})
                        except Exception as e:  # noqa: BLE001 - record and go on (e.g. gloo lacks an op)
                            emit({"type": "error", "kind": kind, "group_size": g, "nbytes": s,
                                  "error": f"{type(e).__name__}: {e}"[:500]})
                            del e
                    w.dist.barrier()
        if a.overlap:
            try:
                emit(measure_overlap(w, gemm_size=a.overlap_gemm, gemm_loop=a.overlap_loop,
                                     comm_bytes=a.overlap_bytes))
            except Exception as e:  # noqa: BLE001
                emit({"type": "error", "kind": "overlap", "error": f"{type(e).__name__}: {e}"[:500]})
        emit({"type": "done", "world_size": w.world})
    finally:
        if out is not None:
            out.close()
        w.dist.destroy_process_group()
    return 0


# ----------------------------------------------------------------------------- launcher
def tier_env(tier: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of the worker processes for ``tier`` (see module docstring).

    Raises:
        ValueError: unknown tier.
    """
    if tier not in TIER_ENV:
        raise ValueError(f"unknown tier {tier!r}; valid: {', '.join(TIER_ENV)}")
    from autotune.profiling.measure import subprocess_env

    env = subprocess_env(base)
    for k in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE"):
        env.pop(k, None)
    env.update(ALWAYS_ENV)
    env.update(TIER_ENV[tier])
    return env


def launch(*, tier: str, nproc: int, out: str | Path, sizes: Iterable[int] | None = None, quick: bool = False,
           kinds: Iterable[str] | None = None, group_sizes: Iterable[int] | None = None,
           backend: str | None = None, skip: Iterable[tuple[str, int, int]] = (), overlap: bool = False,
           extra_args: Sequence[str] = (), timeout_s: float = 600.0, log: str | Path | None = None,
           on_line: Callable[[dict], None] | None = None, poll_s: float = 0.5) -> tuple[int, list[dict]]:
    """Run the worker under ``torch.distributed.run --standalone`` for one tier; (exit code, JSON lines).

    ``on_line`` is called with each result line as it appears (progress). On timeout the process group
    is killed and the exit code is 124; on KeyboardInterrupt it is killed and the interrupt re-raised.
    Lines written before either are returned (read them from ``out`` after an interrupt).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "-m", "autotune.profiling.nccl_bench", "--tier", tier, "--out", str(out)]
    if sizes is not None:
        cmd += ["--sizes", ",".join(str(int(s)) for s in sizes)]
    elif quick:
        cmd += ["--quick"]
    if kinds is not None:
        cmd += ["--kinds", ",".join(kinds)]
    if group_sizes is not None:
        cmd += ["--group-sizes", ",".join(str(g) for g in group_sizes)]
    if backend:
        cmd += ["--backend", backend]
    skip = [list(x) for x in skip]
    if skip:
        sp = out.with_suffix(".skip.json")
        sp.write_text(json.dumps(skip))
        cmd += ["--skip", str(sp)]
    if overlap:
        cmd += ["--overlap"]
    cmd += list(extra_args)
    logf = open(log, "w") if log else subprocess.DEVNULL
    # under a guard (autotune.launchers.reaper): torchrun and its ranks end with this process, kill -9 included
    from autotune.launchers.reaper import guarded
    proc = subprocess.Popen(guarded(cmd), env=tier_env(tier), stdout=logf, stderr=subprocess.STDOUT,
                            start_new_session=True)
    seen = 0
    lines: list[dict] = []

    def drain() -> None:
        nonlocal seen
        text = out.read_text() if out.exists() else ""
        for ln in text.splitlines()[seen:]:
            if not ln.endswith("}"):
                break
            try:
                d = json.loads(ln)
            except json.JSONDecodeError:
                break
            seen += 1
            lines.append(d)
            if on_line:
                on_line(d)

    t0 = time.monotonic()
    rc: int | None = None
    try:
        while rc is None:
            rc = proc.poll()
            drain()
            if rc is None and time.monotonic() - t0 > timeout_s:
                _kill(proc)
                rc = 124
                break
            if rc is None:
                time.sleep(poll_s)
    except KeyboardInterrupt:
        _kill(proc)
        drain()
        raise
    finally:
        if log:
            logf.close()
    drain()
    return rc, lines


def _kill(proc: subprocess.Popen) -> None:
    """Terminate the guard's process group (the guard then ends torchrun and its ranks, which run in
    sessions of their own); if that takes over 10 s, SIGKILL the group and every descendant."""
    from autotune.launchers.reaper import descendants

    pids = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        for kill, pid in [(os.killpg, proc.pid)] + [(os.kill, p) for p in pids + descendants(proc.pid)]:
            try:
                kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()


if __name__ == "__main__":
    sys.exit(worker_main())
