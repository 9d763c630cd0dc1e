"""``autotune profile``: time kernels and collectives on this GPU host and store them.

Also runnable on its own: ``python -m autotune.cli.profile --quick --export out.yaml``.

What it measures (each step skipped when already stored for this environment, unless ``--force``;
every measurement is committed as soon as it is taken, so an interrupted run keeps what it measured;
a measurement that fails is reported and skipped, never fatal):

1. BF16 GEMMs fwd/dgrad/wgrad over the Llama shapes (:func:`autotune.profiling.shapes.gemm_shapes`);
2. causal flash SDPA forward and backward (:func:`autotune.profiling.shapes.attention_shapes`);
3. memory-bound ops as GB/s (copy, RMSNorm, RoPE, SwiGLU, cross-entropy over 128256, AdamW);
4. ``empty_cache`` and re-allocation with and without ``expandable_segments`` (subprocesses);
5. with 2+ GPUs, per tier (nvlink, host, sockets): collectives for every group size 2..N via
   ``torch.distributed.run`` (:mod:`autotune.profiling.nccl_bench`), and overlap interference on
   the first tier; each measured tier is written as a fabric YAML (``--fabrics-dir``);
6. opt-in (``--sections``): ``gemm_fp8`` FP8 ``torch._scaled_mm`` tensorwise and rowwise over
   :func:`autotune.profiling.shapes.fp8_gemm_shapes` (the BF16 GEMM section then also times those
   shapes, for comparison); ``quantize`` FP8 dynamic quantization stages eager and compiled over
   :data:`autotune.profiling.shapes.QUANTIZE_SHAPES`; ``compiled`` the block ops of
   :data:`autotune.profiling.shapes.BLOCK_OPS` eager and under ``torch.compile``.
   ``--long-attention`` times attention at 4K..128K (:data:`autotune.profiling.shapes.LONG_SEQ_LENS`).

Sections: ``gemm, attention, memory, reclaim, collectives`` (the default) and ``gemm_fp8, quantize,
compiled``; leaving ``collectives`` out skips NCCL entirely (e.g. on a 1-GPU host). ``--merge-into``
merges the exported profile into a shipped one (:mod:`autotune.profiling.merge`).

Ends with a table of achieved GEMM / attention TFLOP/s, HBM GB/s and NCCL bus bandwidth per tier
against the datasheet (:func:`autotune.spec.hardware.get_gpu`; link presets for tiers) and against the
shipped calibration (the probe figures of shared/design.md).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import click
import yaml

from autotune.cli.options import ASCII_INT
from autotune.cost.calibration import default_calibration
from autotune.errors import AutotuneError, ConfigError, redact
from autotune.profiling.nccl_bench import FULL_SIZES, QUICK_SIZES, TIER_ENV, launch
from autotune.profiling.store import (
    COPY_OP,
    DEFAULT_STORAGE,
    ProfileEnvironment,
    attention_flops,
    catalog_gpu,
    dump_profile_yaml,
    export_profile,
    gemm_flops,
    get_or_create_environment,
    lookup,
    measured_tier_busbw,
    nominal_tier_bandwidth,
    open_store,
    record,
    rows,
    tflops_of,
)

DEFAULT_TIERS = ("nvlink", "host", "sockets")
DEFAULT_SECTIONS = ("gemm", "attention", "memory", "reclaim", "collectives")
ALL_SECTIONS = DEFAULT_SECTIONS + ("gemm_fp8", "quantize", "compiled")
DEFAULT_FABRICS_DIR = "studies/fabrics"
#: where fabric presets of measured tiers are written with ``--write-presets`` (shipped with the package)
FABRIC_PRESETS_DIR = Path(__file__).resolve().parents[1] / "profiling" / "fabrics"


def fabric_presets() -> dict[str, Path]:
    """Measured-tier fabric files shipped in ``autotune/profiling/fabrics/``: name -> path."""
    return {p.stem: p for p in sorted(FABRIC_PRESETS_DIR.glob("*.yaml"))}


@dataclass
class ProfileReport:
    """What a profile run did: counts, failures, the summary table rows and the files written."""

    env_id: int
    measured: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)
    summary: list[tuple[str, float | None, float | None, float | None]] = field(default_factory=list)
    export_path: str | None = None
    fabric_paths: list[str] = field(default_factory=list)
    seconds: float = 0.0


class _Bar:
    """tqdm when installed, else a line per step (flushed)."""

    def __init__(self, total: int, desc: str) -> None:
        try:
            from tqdm import tqdm

            self._t = tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True)
        except ImportError:
            self._t = None
            self.n, self.total, self.desc = 0, total, desc

    def update(self, k: int = 1, what: str = "") -> None:
        if self._t is not None:
            if what:
                self._t.set_postfix_str(what[:60], refresh=False)
            self._t.update(k)
        else:
            self.n += k
            print(f"{self.desc}: {self.n}/{self.total} {what}", file=sys.stderr, flush=True)

    def write(self, msg: str) -> None:
        if self._t is not None:
            self._t.write(msg, file=sys.stderr)
        else:
            print(msg, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._t is not None:
            self._t.close()


def _parse_tiers(tiers: str | Sequence[str]) -> list[str]:
    items = [t.strip() for t in (tiers.split(",") if isinstance(tiers, str) else tiers) if t.strip()]
    bad = [t for t in items if t not in TIER_ENV]
    if bad:
        raise ConfigError(f"--tiers: unknown tier(s) {', '.join(bad)}; valid: {', '.join(TIER_ENV)}")
    return items


def parse_sections(sections: str | Sequence[str]) -> tuple[str, ...]:
    """Section names from ``gemm,attention,...`` (or a sequence), checked against :data:`ALL_SECTIONS`.

    Raises:
        ConfigError: an unknown section (named, with the valid ones) or none at all.
    """
    items = [t.strip() for t in (sections.split(",") if isinstance(sections, str) else sections) if t.strip()]
    bad = [t for t in items if t not in ALL_SECTIONS]
    if bad or not items:
        raise ConfigError(f"--sections: unknown or empty section list {', '.join(bad) or repr(sections)}; "
                          f"valid: {', '.join(ALL_SECTIONS)}")
    return tuple(dict.fromkeys(items))


def run_profile(*, quick: bool = False, force: bool = False, storage: str = DEFAULT_STORAGE,
                export: str | None = None, tiers: str | Sequence[str] = DEFAULT_TIERS, gpus: int | None = None,
                fabrics_dir: str | None = DEFAULT_FABRICS_DIR, write_presets: bool = False,
                sections: str | Sequence[str] = DEFAULT_SECTIONS, long_attention: bool = False,
                merge_into: str | None = None, merge_output: str | None = None,
                echo: Callable[[str], None] = print) -> ProfileReport:
    """Profile this host (module docstring); returns a :class:`ProfileReport` and prints the summary.

    ``sections`` picks what is measured (:data:`ALL_SECTIONS`); ``long_attention`` the 4K..128K
    attention sweep; ``merge_into`` (with ``export``) merges the exported profile into that calibration
    file (:func:`autotune.profiling.merge.merge_profiles`), written to ``merge_output`` (default: in place).

    Raises:
        NoGPUError: no CUDA GPU (checked first, before anything is opened or written).
        ConfigError: an unknown tier or section, a ``gpus`` outside 1..(GPUs present), ``merge_into``
            without ``export``.
        StorageError: the storage URL cannot be opened.
    """
    from autotune.profiling.measure import detect_environment, require_cuda

    require_cuda()
    import torch

    tier_list = _parse_tiers(tiers)
    secs = parse_sections(sections)
    if merge_into and not export:
        raise ConfigError("--merge-into needs --export (the merged profile is the exported one)")
    from autotune.files import check_output_path
    for opt, path in (("--export", export), ("--merge-output" if merge_output else "--merge-into",
                                             merge_output or merge_into)):
        if path:
            check_output_path(path, what=opt)      # before the measurements: never through a symbolic link
    present = torch.cuda.device_count()
    if gpus is None:
        gpus = present
    if not 1 <= gpus <= present:
        raise ConfigError(f"--gpus {gpus}: this host has {present} CUDA GPU(s); use 1..{present}")
    t_start = time.monotonic()
    info = detect_environment(gpu_count=gpus)
    session = open_store(storage)()
    env = get_or_create_environment(session, info)
    report = ProfileReport(env_id=env.id)
    echo(f"autotune profile: {gpus}x {info.gpu_name} (driver {info.driver}, torch {info.torch}, CUDA {info.cuda}, "
         f"NCCL {info.nccl}) on {info.hostname}; storage {redact(storage)}; {'quick' if quick else 'full'} profile")
    sys.stdout.flush()
    try:
        _kernels(session, env, quick=quick, force=force, report=report, sections=secs,
                 long_attention=long_attention)
        if "collectives" not in secs:
            echo("collectives section not selected: NCCL collectives and overlap interference skipped")
        elif gpus >= 2:
            _collectives(session, env, tiers=tier_list, nproc=gpus, quick=quick, force=force, report=report)
        else:
            echo("one GPU: collectives, overlap interference and interconnect tiers need 2+ GPUs; skipped "
                 "(the shipped calibration's curves are used for them)")
        if fabrics_dir or write_presets:
            dirs = [Path(fabrics_dir)] if fabrics_dir else []
            if write_presets:
                dirs.append(FABRIC_PRESETS_DIR)
            report.fabric_paths = write_fabrics(session, env, dirs)
        export_error = None
        if export:
            try:
                d = export_profile(session, env)
                from autotune.profiling.measure import torchao_version

                d["environment"]["torchao"] = torchao_version()
                Path(export).parent.mkdir(parents=True, exist_ok=True)
                from autotune.files import write_output_text
                write_output_text(export, dump_profile_yaml(d), what="--export")
                report.export_path = str(export)
            except (ConfigError, OSError) as e:
                export_error = f"cannot export the profile to {export}: {e}"
        if merge_into and report.export_path:
            from autotune.profiling.merge import merge_files

            out_path = merge_files(report.export_path, merge_into, output=merge_output)
            echo(f"merged {report.export_path} into {merge_into} -> {out_path}")
        report.summary = summary_rows(session, env)
        report.seconds = time.monotonic() - t_start
        echo(format_summary(report.summary, gpu_name=info.gpu_name))
        echo(f"{report.measured} measured, {report.skipped} already stored (skipped; --force re-measures), "
             f"{len(report.failures)} failed, in {report.seconds:.0f} s")
        for f in report.failures:
            echo(f"  failed: {f}")
        for p in report.fabric_paths:
            echo(f"fabric written: {p} (pass it to --interconnect)")
        if report.export_path:
            echo(f"calibration profile written: {report.export_path}")
        if export_error:
            raise ConfigError(export_error)
    finally:
        session.close()
    return report


# ----------------------------------------------------------------------------- kernels
def _kernels(session: Any, env: ProfileEnvironment, *, quick: bool, force: bool, report: ProfileReport,
             sections: Sequence[str] = DEFAULT_SECTIONS, long_attention: bool = False) -> None:
    import torch

    from autotune.profiling import measure as M
    from autotune.profiling.shapes import (
        FP8_SCALINGS,
        QUANTIZE_SHAPES,
        attention_shapes,
        block_op_sizes,
        fp8_gemm_shapes,
        gemm_shapes,
        memory_op_sizes,
    )

    gemms = gemm_shapes(quick=quick) if "gemm" in sections else []
    if "gemm" in sections and "gemm_fp8" in sections:   # BF16 at the FP8 shapes too, for comparison
        seen = {g.key for g in gemms}
        gemms += [g for g in fp8_gemm_shapes() if g.key not in seen]
    attns = attention_shapes(quick=quick, long=long_attention) if "attention" in sections else []
    mems = memory_op_sizes(quick=quick) if "memory" in sections else {}
    tasks: list[tuple[str, Callable[[], None] | None]] = []

    for s in gemms:
        if not force and all(lookup(session, env, "gemm", m=s.m, n=s.n, k=s.k, pass_=p) for p in
                             ("fwd", "dgrad", "wgrad")):
            tasks.append((f"gemm {s.m}x{s.n}x{s.k}", None))
            continue

        def do_gemm(s=s) -> None:
            res = M.measure_gemm(s.m, s.n, s.k)
            for p, t in res.items():
                record(session, env, "gemm", m=s.m, n=s.n, k=s.k, pass_=p, median_ms=t.median_ms,
                       tflops=tflops_of(gemm_flops(s.m, s.n, s.k), t.median_ms), repeats=t.repeats)

        tasks.append((f"gemm {s.m}x{s.n}x{s.k} ({s.name})", do_gemm))
    for a in attns:
        if not force and lookup(session, env, "attention", batch=a.batch, seq_len=a.seq_len, heads=a.heads,
                                kv_heads=a.kv_heads, head_dim=a.head_dim):
            tasks.append((f"attention s={a.seq_len} h={a.heads}", None))
            continue

        def do_attn(a=a) -> None:
            f, b = M.measure_attention(a)
            ff = attention_flops(batch=a.batch, seq_len=a.seq_len, heads=a.heads, head_dim=a.head_dim)
            record(session, env, "attention", batch=a.batch, seq_len=a.seq_len, heads=a.heads,
                   kv_heads=a.kv_heads, head_dim=a.head_dim, fwd_ms=f.median_ms, bwd_ms=b.median_ms,
                   fwd_tflops=tflops_of(ff, f.median_ms), bwd_tflops=tflops_of(2.5 * ff, b.median_ms),
                   repeats=f.repeats)

        tasks.append((f"attention s={a.seq_len} h={a.heads} kv={a.kv_heads}", do_attn))
    for name, spec in mems.items():
        nb = M.memory_op_nbytes(spec, elem_size=4 if spec["op"] == "adamw" else 2)
        if not force and lookup(session, env, "memory_op", op=spec["op"], nbytes=nb):
            tasks.append((name, None))
            continue

        def do_mem(spec=spec) -> None:
            nbytes, t = M.measure_memory_op(spec)
            record(session, env, "memory_op", op=spec["op"], nbytes=nbytes, median_ms=t.median_ms,
                   gbs=nbytes / (t.median_ms * 1e6), repeats=t.repeats)

        tasks.append((f"memory {name}", do_mem))
    for s in (fp8_gemm_shapes() if "gemm_fp8" in sections else []):
        for sc in FP8_SCALINGS:
            if not force and all(lookup(session, env, "gemm_fp8", scaling=sc, m=s.m, n=s.n, k=s.k, pass_=p)
                                 for p in ("fwd", "dgrad", "wgrad")):
                tasks.append((f"gemm_fp8 {sc} {s.m}x{s.n}x{s.k}", None))
                continue

            def do_fp8(s=s, sc=sc) -> None:
                res = M.measure_gemm_fp8(s.m, s.n, s.k, scaling=sc)
                for p, t in res.items():
                    record(session, env, "gemm_fp8", scaling=sc, m=s.m, n=s.n, k=s.k, pass_=p, median_ms=t.median_ms,
                           tflops=tflops_of(gemm_flops(s.m, s.n, s.k), t.median_ms), repeats=t.repeats)

            tasks.append((f"gemm_fp8 {sc} {s.m}x{s.n}x{s.k} ({s.name})", do_fp8))
    if "quantize" in sections:
        for i, (r_, c_) in enumerate(QUANTIZE_SHAPES):
            for sc in FP8_SCALINGS:
                # compiled: the whole amax + scale + cast function on the first 3 tensors (one compile each)
                modes = (("eager", ("amax", "scale", "cast", "total")),) + ((("compiled", ("total",)),) if i < 3 else ())
                for mode, stages in modes:
                    if not force and all(lookup(session, env, "quantize", scaling=sc, mode=mode, stage=st, rows=r_,
                                                cols=c_) for st in stages):
                        tasks.append((f"quantize {sc} {mode} {r_}x{c_}", None))
                        continue

                    def do_q(r_=r_, c_=c_, sc=sc, mode=mode, stages=stages) -> None:
                        res = M.measure_quantize(r_, c_, scaling=sc, compiled=mode == "compiled", stages=stages)
                        for st, (nb, t) in res.items():
                            record(session, env, "quantize", scaling=sc, mode=mode, stage=st, rows=r_, cols=c_,
                                   nbytes=nb, median_ms=t.median_ms, gbs=nb / (t.median_ms * 1e6), repeats=t.repeats)

                    tasks.append((f"quantize {sc} {mode} {r_}x{c_}", do_q))
    for name, spec in (block_op_sizes().items() if "compiled" in sections else ()):
        nb = M.block_op_nbytes(spec)
        for mode in ("eager", "compiled"):
            if not force and lookup(session, env, "block_op", op=name, mode=mode, nbytes=nb):
                tasks.append((f"block {name} {mode}", None))
                continue

            def do_blk(spec=spec, name=name, mode=mode) -> None:
                nbytes, t = M.measure_block_op(spec, compiled=mode == "compiled")
                record(session, env, "block_op", op=name, mode=mode, nbytes=nbytes, median_ms=t.median_ms,
                       gbs=nbytes / (t.median_ms * 1e6), repeats=t.repeats)

            tasks.append((f"block {name} {mode}", do_blk))
    for ex in ((False, True) if "reclaim" in sections else ()):
        if not force and lookup(session, env, "reclaim", expandable_segments=ex):
            tasks.append((f"reclaim expandable={ex}", None))
            continue

        def do_reclaim(ex=ex) -> None:
            r = M.measure_reclaim(expandable_segments=ex, gib=2.0 if quick else 8.0, repeats=3 if quick else 5)
            record(session, env, "reclaim", expandable_segments=ex, empty_cache_ms=r["empty_cache_ms"],
                   alloc_ms_per_gib=r["alloc_ms_per_gib"], nbytes=int(r["nbytes"]))

        tasks.append((f"reclaim expandable_segments={ex}", do_reclaim))

    bar = _Bar(len(tasks), "kernels")
    try:
        for what, fn in tasks:
            if fn is None:
                report.skipped += 1
                bar.update(1, what + " (stored)")
                continue
            try:
                fn()
                report.measured += 1
            except Exception as e:  # noqa: BLE001 - skip with a warning, never abort the profile
                session.rollback()
                msg = f"{what}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                report.failures.append(msg)
                bar.write(f"warning: {msg}")
                try:  # free what the failed measurement left (a sticky CUDA error raises again here)
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
                except Exception as e2:  # noqa: BLE001
                    bar.write(f"warning: CUDA state after the failure: {type(e2).__name__}: {e2}")
            bar.update(1, what)
    finally:
        bar.close()
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- collectives
def _collectives(session: Any, env: ProfileEnvironment, *, tiers: Sequence[str], nproc: int, quick: bool,
                 force: bool, report: ProfileReport) -> None:
    from autotune.cost.calibration import COLLECTIVE_KINDS

    sizes = QUICK_SIZES if quick else FULL_SIZES
    groups = list(range(2, nproc + 1))
    for i, tier in enumerate(tiers):
        wanted = [(k, g, s) for g in groups for k in COLLECTIVE_KINDS if k != "send_recv" or g == 2 for s in sizes]
        stored = set()
        if not force:
            stored = {(c.kind, c.group_size, c.nbytes) for c in rows(session, env, "collective") if c.tier == tier}
        todo = [w for w in wanted if w not in stored]
        overlap = i == 0 and (force or lookup(session, env, "overlap", tier=tier) is None)
        report.skipped += len(wanted) - len(todo)
        if not todo and not overlap:
            print(f"{tier}: all {len(wanted)} collective points stored; skipped", file=sys.stderr, flush=True)
            continue
        bar = _Bar(len(todo) + int(overlap), f"collectives {tier}")

        def on_line(d: dict, tier=tier, bar=bar) -> None:
            t = d.get("type")
            if t == "collective":
                record(session, env, "collective", tier=tier, kind=d["kind"], group_size=d["group_size"],
                       nbytes=d["nbytes"], median_ms=d["median_ms"], busbw_gbs=d["busbw_gbs"],
                       repeats=d["repeats"])
                report.measured += 1
                bar.update(1, f"{d['kind']} g={d['group_size']} {d['nbytes'] >> 10} KiB "
                              f"{d['busbw_gbs']:.1f} GB/s")
            elif t == "overlap":
                record(session, env, "overlap", tier=tier, gemm_ms_alone=d["gemm_ms_alone"],
                       gemm_ms_overlapped=d["gemm_ms_overlapped"], comm_ms=d["comm_ms"],
                       comm_nbytes=d["comm_nbytes"], compute_slowdown=d["compute_slowdown"])
                report.measured += 1
                bar.update(1, f"overlap slowdown {d['compute_slowdown']:.3f}")
            elif t == "error":
                msg = f"{tier} {d.get('kind')} g={d.get('group_size')} S={d.get('nbytes')}: {d.get('error')}"
                report.failures.append(msg)
                bar.write(f"warning: {msg}")
                bar.update(1)

        with tempfile.TemporaryDirectory(prefix="autotune-nccl-") as tmp:
            out, log = Path(tmp) / f"{tier}.jsonl", Path(tmp) / f"{tier}.log"
            try:
                rc, lines = launch(tier=tier, nproc=nproc, out=out, sizes=sizes, skip=sorted(stored),
                                   overlap=overlap, timeout_s=240 if quick else 1800, log=log, on_line=on_line,
                                   extra_args=["--repeats", "3" if quick else "5"])
            finally:
                bar.close()
            if rc != 0 or not any(d.get("type") == "done" for d in lines):
                tail = log.read_text()[-1500:] if log.exists() else ""
                why = "timed out" if rc == 124 else f"exited {rc}"
                msg = f"{tier}: collective benchmark {why} after {len(lines)} results; log tail:\n{tail}"
                report.failures.append(msg.splitlines()[0])
                print(f"warning: {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- fabrics
def fabric_dict(session: Any, env: ProfileEnvironment, tier: str) -> dict[str, Any] | None:
    """The ``--interconnect`` file mapping of a measured tier, or None when the tier has no all-reduce.

    ``intra_node.bandwidth_gbs`` is the tier's nominal bandwidth (the same figure as the exported
    profile's ``link_bandwidth_gbs``, so the measured curve applies unscaled); the measured
    large-message bus bandwidth is ``measured_busbw_gbs``; ``latency_us`` is the measured time of the
    smallest send/recv (all-reduce / 2 when none), microseconds.
    """
    col = [c for c in rows(session, env, "collective") if c.tier == tier]
    busbw = measured_tier_busbw(col, tier)
    if busbw is None:
        return None
    gpu = catalog_gpu(env.gpu_name) or env.gpu_name.lower().replace(" ", "-")
    sr = sorted((c for c in col if c.kind == "send_recv"), key=lambda c: c.nbytes)
    ar = sorted((c for c in col if c.kind == "all_reduce"), key=lambda c: c.nbytes)
    lat_us = sr[0].median_ms * 1e3 if sr else ar[0].median_ms * 1e3 / 2
    return {
        "name": f"{gpu}-{tier}",
        "intra_node": {"bandwidth_gbs": nominal_tier_bandwidth(tier, gpu, round(busbw, 2)),
                       "latency_us": round(lat_us, 2), "gpus_per_node": env.gpu_count,
                       "calibration_tier": tier, "measured_busbw_gbs": round(busbw, 2)},
    }


def write_fabrics(session: Any, env: ProfileEnvironment, dirs: Sequence[Path]) -> list[str]:
    """Write ``<gpu>-<tier>.yaml`` for every measured tier into each of ``dirs``; the paths written."""
    paths = []
    tiers = sorted({c.tier for c in rows(session, env, "collective")})
    for tier in tiers:
        d = fabric_dict(session, env, tier)
        if d is None:
            continue
        from autotune.engines.quoting import comment_text    # names from the profile store: one comment line

        head = (f"# Interconnect tier '{comment_text(tier)}' measured by `autotune profile` on "
                f"{comment_text(env.hostname)} ({env.gpu_count}x {comment_text(env.gpu_name)}, "
                f"{comment_text(env.date)}; NCCL {comment_text(env.nccl)}).\n"
                f"# bandwidth_gbs: nominal link figure (scales the measured curves by 1); "
                f"measured_busbw_gbs: all-reduce bus bandwidth at the largest size.\n")
        for dr in dirs:
            dr.mkdir(parents=True, exist_ok=True)
            p = dr / f"{d['name']}.yaml"
            from autotune.files import write_output_text
            write_output_text(p, head + yaml.safe_dump(d, sort_keys=False), what="--fabrics-dir")
            paths.append(str(p))
    return paths


# ----------------------------------------------------------------------------- summary
def summary_rows(session: Any, env: ProfileEnvironment) -> list[tuple[str, float | None, float | None, float | None]]:
    """(label, achieved, datasheet, shipped-calibration figure) per summary line."""
    from autotune.spec.hardware import get_gpu

    gpu = catalog_gpu(env.gpu_name)
    spec = get_gpu(gpu) if gpu else None
    peak = spec.bf16_tflops if spec else None
    hbm = spec.hbm_bandwidth_gbs if spec else None
    ref = default_calibration("h200-probe.yaml")   # the design.md (probe) figures the acceptance compares to
    out: list[tuple[str, float | None, float | None, float | None]] = []
    gem = [g for g in rows(session, env, "gemm")]
    sq = [g for g in gem if (g.m, g.n, g.k) == (8192, 8192, 8192)]
    ref_sq = next((r[3] for r in ref.gemm if r[:3] == (8192, 8192, 8192)), None)
    for p in ("fwd", "dgrad", "wgrad"):
        x = [g for g in sq if g.pass_ == p]
        if x:
            out.append((f"GEMM 8192^3 {p} TFLOP/s", x[0].tflops, peak, ref_sq))
    fwd = [g.tflops for g in gem if g.pass_ == "fwd"]
    if fwd:
        out.append((f"GEMM median of {len(fwd)} Llama shapes fwd", statistics.median(fwd), peak,
                    statistics.median(r[3] for r in ref.gemm)))
    att = rows(session, env, "attention")
    if att:
        a = min(att, key=lambda a: (abs(a.seq_len - 8192), abs(a.heads - 32), a.batch))
        ff = attention_flops(batch=a.batch, seq_len=a.seq_len, heads=a.heads, head_dim=a.head_dim)
        tot = tflops_of(3.5 * ff, a.fwd_ms + a.bwd_ms)
        ref_a = next((r for r in ref.attention if r[1] == a.heads), None)
        ref_t = 3.5 / (1 / ref_a[4] + 2.5 / ref_a[5]) if ref_a else None
        out.append((f"attention fwd+bwd s={a.seq_len} h={a.heads}", tot, peak, ref_t))
        out.append((f"attention fwd s={a.seq_len} h={a.heads}", a.fwd_tflops, peak, ref_a[4] if ref_a else None))
        out.append((f"attention bwd s={a.seq_len} h={a.heads}", a.bwd_tflops, peak, ref_a[5] if ref_a else None))
    mem = rows(session, env, "memory_op")
    cp = [r for r in mem if r.op == COPY_OP]
    if cp:
        out.append(("HBM copy GB/s (read+write)", max(cp, key=lambda r: r.nbytes).gbs, hbm,
                    ref.memory_bound_bandwidth_gbs))
    for op in sorted({r.op for r in mem} - {COPY_OP}):
        r = max((r for r in mem if r.op == op), key=lambda r: r.nbytes)
        out.append((f"{op} GB/s", r.gbs, hbm, None))
    col = rows(session, env, "collective")
    for tier in sorted({c.tier for c in col}):
        for kind in ("all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all"):
            ck = [c for c in col if c.tier == tier and c.kind == kind]
            if not ck:
                continue
            g = max(c.group_size for c in ck)
            c = max((c for c in ck if c.group_size == g), key=lambda c: c.nbytes)
            rt = ref.collectives.get(tier)
            rv = rt.curves[kind].busbw(c.nbytes) if rt and kind in rt.curves and rt.measured else None
            nominal = nominal_tier_bandwidth(tier, gpu or "h200", 0.0) or None
            out.append((f"NCCL {tier} {kind} g={g} {c.nbytes / 2**20:.0f} MiB busbw GB/s", c.busbw_gbs,
                        nominal, rv))
    for o in rows(session, env, "overlap"):
        out.append((f"overlap compute slowdown ({o.tier})", o.compute_slowdown, None,
                    ref.overlap_compute_slowdown))
    bf = {(g.m, g.n, g.k): g.tflops for g in gem if g.pass_ == "fwd"}
    g8 = [r for r in rows(session, env, "gemm_fp8") if r.pass_ == "fwd"]
    for sc in ("tensorwise", "rowwise"):
        xs = [r for r in g8 if r.scaling == sc]
        if xs:
            out.append((f"GEMM FP8 {sc} median of {len(xs)} shapes fwd", statistics.median(r.tflops for r in xs),
                        spec.fp8_tflops if spec and getattr(spec, "fp8_tflops", None) else None, None))
        for r in xs:   # the design.md 2026-12-01 comparison shapes, with the BF16 figure of this run
            if (r.m, r.n, r.k) in ((8192, 14336, 4096), (8192, 4096, 14336), (8192, 6144, 4096), (8192, 8192, 8192)):
                out.append((f"GEMM FP8 {sc} {r.m}x{r.n}x{r.k} fwd (vs this run's BF16)", r.tflops, None,
                            bf.get((r.m, r.n, r.k))))
    for r in rows(session, env, "quantize"):
        if r.stage == "total" and (r.rows, r.cols) == (8192, 4096):
            out.append((f"quantize {r.scaling} {r.mode} 8192x4096 GB/s (5 B/elem)", r.gbs, hbm, None))
    blk = rows(session, env, "block_op")
    for op in sorted({b.op for b in blk}):
        e = next((b.gbs for b in blk if b.op == op and b.mode == "eager"), None)
        c = next((b.gbs for b in blk if b.op == op and b.mode == "compiled"), None)
        out.append((f"block {op} GB/s compiled (vs eager)", c, hbm, e))
    for r in rows(session, env, "reclaim"):
        tag = "expandable" if r.expandable_segments else "default"
        out.append((f"empty_cache ms ({tag})", r.empty_cache_ms, None, None))
        out.append((f"alloc after empty_cache ms/GiB ({tag})", r.alloc_ms_per_gib, None, None))
    return out


def format_summary(rows_: Sequence[tuple[str, float | None, float | None, float | None]], *,
                   gpu_name: str = "") -> str:
    """The summary table as text: achieved, datasheet and % of it, shipped calibration and % of it."""
    def num(x: float | None) -> str:
        if x is None:
            return "-"
        return f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}"

    def pct(a: float | None, b: float | None) -> str:
        return f"{100 * a / b:.0f}%" if a is not None and b else "-"

    w = max([len(r[0]) for r in rows_] + [10])
    lines = [f"summary ({gpu_name}): datasheet = GPU/link datasheet; design.md = shipped calibration (probe)",
             f"{'measurement':<{w}}  {'achieved':>10}  {'datasheet':>10}  {'%':>5}  {'design.md':>10}  {'%':>5}"]
    lines.append("-" * len(lines[-1]))
    for label, a, d, r in rows_:
        lines.append(f"{label:<{w}}  {num(a):>10}  {num(d):>10}  {pct(a, d):>5}  {num(r):>10}  {pct(a, r):>5}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- click
@click.command("profile")
@click.option("--quick", is_flag=True, help="A subset that finishes in under 2 minutes on 2x H200.")
@click.option("--force", is_flag=True, help="Re-measure entries already stored for this environment.")
@click.option("--storage", default=DEFAULT_STORAGE, show_default=True, help="SQLAlchemy URL of the store.")
@click.option("--export", "export", default=None, type=click.Path(dir_okay=False),
              help="Write the calibration profile (YAML, schema 1) here.")
@click.option("--tiers", default=",".join(DEFAULT_TIERS), show_default=True,
              help="Interconnect tiers to measure (comma-separated: nvlink, host, sockets).")
@click.option("--gpus", type=ASCII_INT, default=None, help="GPUs to use (default: all visible).")
@click.option("--fabrics-dir", default=DEFAULT_FABRICS_DIR, show_default=True,
              help="Where the measured tiers are written as --interconnect fabric files.")
@click.option("--write-presets", is_flag=True,
              help="Also write the fabric files into autotune/profiling/fabrics/ (to ship them).")
@click.option("--sections", default=",".join(DEFAULT_SECTIONS), show_default=True,
              help=f"What to measure (comma-separated): {', '.join(ALL_SECTIONS)}. Leave out 'collectives' "
                   "to skip NCCL.")
@click.option("--long-attention", is_flag=True, help="Attention at seq 4K..128K for heads/KV 32/8, 16/4, 16/1, 8/1, 4/1.")
@click.option("--merge-into", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Merge the exported profile into this calibration file (kernels from the new profile, "
                   "collectives/overlap/reclaim kept unless measured); needs --export.")
@click.option("--merge-output", default=None, type=click.Path(dir_okay=False),
              help="Where the merged profile goes (default: --merge-into, in place).")
def profile(quick: bool, force: bool, storage: str, export: str | None, tiers: str, gpus: int | None,
            fabrics_dir: str, write_presets: bool, sections: str, long_attention: bool, merge_into: str | None,
            merge_output: str | None) -> None:
    """Time kernels and collectives on this GPU host and store them (see ``autotune.cli.profile``)."""
    warnings.simplefilter("default")
    run_profile(quick=quick, force=force, storage=storage, export=export, tiers=tiers, gpus=gpus,
                fabrics_dir=fabrics_dir, write_presets=write_presets, sections=sections,
                long_attention=long_attention, merge_into=merge_into, merge_output=merge_output,
                echo=lambda s: click.echo(s))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m autotune.cli.profile``: the profile command with AutotuneError -> exit code 2."""
    try:
        profile.main(args=list(argv) if argv is not None else None, standalone_mode=False,
                     prog_name="autotune profile")
    except AutotuneError as e:
        click.echo(f"error: {e}", err=True)
        return 2
    except click.exceptions.Abort:
        click.echo("interrupted: measurements taken so far are stored", err=True)
        return 130
    except KeyboardInterrupt:
        click.echo("interrupted: measurements taken so far are stored", err=True)
        return 130
    except click.ClickException as e:
        e.show()
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
