"""Calibration profiles and the op cost model the simulator uses.

A *calibration profile* is a versioned YAML file of kernel and collective timings from one GPU host
(``autotune profile`` writes one; ``autotune/data/calibration/`` ships the default). Schema
(``schema_version: 1``)::

    label: h200-2026-11-30           # shown in reports
    measured: true|false             # false: derived from published/probe figures, not a full profile
    source: free text                # how the numbers were obtained
    environment: {gpu_name, gpu_count, driver, torch, cuda, nccl, date}
    gpu: h200                        # catalog GPU the timings belong to
    peak_bf16_tflops: 989
    hbm_bandwidth_gbs: 4800
    gemm:         [[m, n, k, tflops], ...]      # BF16 (m x k) @ (k x n), achieved TFLOP/s, forward
    gemm_backward_factor: 1.0                   # dgrad/wgrad time per FLOP relative to forward
    gemm_fp8:                                   # optional: FP8 e4m3 GEMMs (torch._scaled_mm, BF16 out)
      tensorwise: [[m, n, k, tflops], ...]      # per-tensor scales (also used for fp8_delayed)
      rowwise:    [[m, n, k, tflops], ...]      # per-row scales; absent -> tensorwise (flagged)
    peak_fp8_tflops: 1979                       # optional; else the catalog GPU's fp8_tflops
    quantize: {tensorwise_gbs: ..., rowwise_gbs: ...}   # optional: FP8 cast kernels, GB/s (r + w)
    memory_bound_ops_compiled: {rmsnorm: ..., ...}       # optional: torch.compile'd kernels, GB/s
    attention:    [[seq_len, heads, kv_heads, head_dim, fwd_tflops, bwd_tflops], ...]  # causal, batch 1
    attention_flash2: [[...same columns...], ...]   # optional: SDPA's flash backend (FlashAttention-2),
                                                # for engines whose attention kernel is flash2
    memory_bound_bandwidth_gbs: 4250            # achieved HBM bandwidth (read + write bytes / time)
    memory_bound_ops: {rmsnorm: 2851, rope: 360, ...}  # optional, GB/s per kernel; else taken from
                                                # measurements.memory_ops rows [op, bytes, ms, GB/s, n]
    memory_bound_ops_compiled: {rmsnorm: ..., rope: ..., swiglu: ..., residual: ..., cast: ...,
                                norm_residual: ...}  # optional: GB/s of the same ops under torch.compile,
                                                # bytes counted exactly as for the eager op (the cost
                                                # model's counts, autotune/profiling/shapes.py BLOCK_OPS),
                                                # so time = bytes / GB/s with either table
    gemm_fp8:                                   # optional: FP8 torch._scaled_mm, e4m3 in, BF16 out, fwd
      tensorwise: [[m, n, k, tflops], ...]      # one FP32 scale per operand
      rowwise:    [[m, n, k, tflops], ...]      # FP32 scale per row of A and per column of B
    quantize:                                   # optional: dynamic FP8 quantization (amax + scale + cast)
      tensorwise_gbs: 1800                      # effective GB/s, torch.compile'd; bytes charged per BF16
      rowwise_gbs: 1900                         # element: amax reads 2 B, cast reads 2 B + writes 1 B
      tensorwise_eager_gbs: 900                 # (5 B/element in all); *_eager_gbs: the same, eager
      rowwise_eager_gbs: 800
    collectives:                                # per interconnect tier
      <tier>:                                   # nvlink | host | network | sockets
        link_bandwidth_gbs: 450                 # nominal bandwidth of the measured path (per GPU/dir)
        group_size: 2                           # group the curves were measured on
        measured: true|false
        all_reduce|all_gather|reduce_scatter|send_recv|all_to_all: [[bytes, busbw_gbs], ...]
        group_curves:                           # optional: curves of the same tier measured on larger
          4:                                    # groups (key: the group's size, > group_size), with
            source: "..."                       # where they come from; a collective over n ranks uses
            all_gather: [[bytes, busbw_gbs], ...]   # the largest measured group <= n that has its kind
    overlap: {compute_slowdown: 0.15}           # fractional GEMM slowdown while a collective runs
    in_training: {gemm_eager: 1.0, gemm_compiled: 1.06, attention_eager: 1.13, attention_compiled: 1.17,
                  memory_bound_eager: 1.65, memory_bound_compiled: 1.0}
                                                # optional: kernel time inside profiled training steps
                                                # over what the tables above predict for the same ops
                                                # (bench/derive_in_training.py); absent keys: 1.0
    reclaim: {empty_cache_ms: 2.0, alloc_after_empty_cache_ms_per_gib: 0.5}
    fragmentation: {none: 0.10, ...}            # allocator overhead fraction per memory_reclaim policy

Bus bandwidth (busbw) follows nccl-tests' convention (``PERFORMANCE.md``): with S the collective's
full buffer size (all-reduce buffer, all-gather output, reduce-scatter input) and n ranks,
``busbw = S / t x 2(n-1)/n`` for all-reduce, ``S / t x (n-1)/n`` for all-gather, reduce-scatter and
all-to-all, and ``S / t`` for send/recv.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence


from autotune.errors import ConfigError
from autotune.files import load_shipped_yaml

if TYPE_CHECKING:
    pass

CALIBRATION_SCHEMA_VERSION = 1
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all")
TIERS = ("nvlink", "host", "network", "sockets")
#: recipes a profile's ``gemm_fp8`` table may hold, and the keys of its ``quantize`` mapping (the
#: compiled amax + scale + cast figures, and the same timed eagerly; autotune/profiling/measure.py)
FP8_GEMM_RECIPES = ("tensorwise", "rowwise")
QUANTIZE_KEYS = ("tensorwise_gbs", "rowwise_gbs", "tensorwise_eager_gbs", "rowwise_eager_gbs")
#: keys of a profile's ``in_training`` mapping: kernel category x execution mode (eager PyTorch kernels,
#: or torch.compile'd / an engine's fused kernels)
IN_TRAINING_KEYS = tuple(f"{cat}_{mode}" for cat in ("gemm", "attention", "memory_bound")
                         for mode in ("eager", "compiled"))
#: which measured FP8 GEMM table each FP8 plan precision uses: delayed scaling runs the same
#: per-tensor-scaled kernel as current scaling (only the scale's origin differs: TE DelayedScaling
#: takes it from the amax history), so it uses the tensorwise table; mxfp8 has no table (Blackwell).
PRECISION_GEMM_TABLE = {"fp8_tensorwise": "tensorwise", "fp8_delayed": "tensorwise", "fp8_rowwise": "rowwise"}
DEFAULT_FRAGMENTATION = {"none": 0.10, "empty_cache_per_step": 0.07, "empty_cache_per_microbatch": 0.04,
                         "expandable_segments": 0.03}


def _parse_curves(td: Mapping[str, Any], where: str) -> dict[str, CollectiveCurve]:
    """The ``[[bytes, busbw_gbs], ...]`` curves of ``td`` by collective kind (keys not a kind are left).

    Raises:
        ConfigError: a row that is not two numbers, or a bandwidth <= 0 (``where`` names the table)."""
    curves = {}
    for kind in COLLECTIVE_KINDS:
        rows = td.get(kind)
        if not rows:
            continue
        try:
            rows = sorted((float(s), float(b)) for s, b in rows)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}.{kind} rows must be [bytes, busbw_gbs] pairs of numbers") from None
        if any(b <= 0 for _, b in rows):
            raise ConfigError(f"{where}.{kind} has a non-positive bandwidth")
        curves[kind] = CollectiveCurve(tuple(r[0] for r in rows), tuple(r[1] for r in rows))
    return curves


@dataclass(frozen=True)
class CollectiveCurve:
    """Bus bandwidth of one collective on one tier as a function of message size.

    Attributes:
        sizes_bytes: ascending message sizes S (nccl-tests convention), bytes.
        busbw_gbs: bus bandwidth at each size, GB/s.
    """

    sizes_bytes: tuple[float, ...]
    busbw_gbs: tuple[float, ...]

    def busbw(self, nbytes: float) -> float:
        """Bus bandwidth at ``nbytes`` (GB/s): linear in log2(size) between points, flat outside."""
        return interp_log(self.sizes_bytes, self.busbw_gbs, nbytes)


@dataclass(frozen=True)
class TierCalibration:
    """Collective curves measured on one interconnect tier (see module docstring).

    ``curves`` were measured on ``group_size`` ranks; ``group_curves`` maps a larger group size to the curves
    measured on that many ranks of the same tier (on an NVSwitch node a ring's bus bandwidth rises from 2 to 4
    ranks and is flat beyond: waynehacking8/nccl-collectives-bench results/scaling_attributed/report.md,
    8x H100 80GB HBM3, NCCL 2.29.2, ring all-reduce 348 / 365 / 367 GB/s at 2 / 4 / 6 GPUs; docs/fidelity.md).
    """

    link_bandwidth_gbs: float
    group_size: int
    measured: bool
    curves: Mapping[str, CollectiveCurve]
    group_curves: Mapping[int, Mapping[str, CollectiveCurve]] = field(default_factory=dict)

    def curve_for(self, kind: str, group_size: int) -> tuple[CollectiveCurve, int]:
        """The curve a collective of ``kind`` over ``group_size`` ranks is costed with, and the group size
        it was measured on: the largest measured group <= ``group_size`` that has ``kind`` (``curves``
        when none does); a kind without a curve anywhere uses the all-reduce curve of the same choice.
        Assumption (named in docs/fidelity.md): a ring's bus bandwidth on groups larger than the largest
        measured one is that group's (flat beyond 4 ranks on NVSwitch, the source above)."""
        for want in (kind, "all_reduce"):
            best = max((g for g, cs in self.group_curves.items() if g <= group_size and want in cs), default=None)
            if best is not None:
                return self.group_curves[best][want], best
            if want in self.curves:
                return self.curves[want], self.group_size
        raise KeyError(kind)                         # unreachable: from_dict requires an all_reduce curve


@dataclass(frozen=True)
class CalibrationProfile:
    """A parsed calibration profile (module docstring gives the YAML schema)."""

    label: str
    measured: bool
    source: str
    environment: Mapping[str, Any]
    gpu: str
    peak_bf16_tflops: float
    hbm_bandwidth_gbs: float
    gemm: tuple[tuple[int, int, int, float], ...]
    gemm_backward_factor: float
    attention: tuple[tuple[int, int, int, int, float, float], ...]
    memory_bound_bandwidth_gbs: float
    collectives: Mapping[str, TierCalibration]
    overlap_compute_slowdown: float
    empty_cache_ms: float
    alloc_after_empty_cache_ms_per_gib: float
    fragmentation: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_FRAGMENTATION))
    memory_bound_ops: Mapping[str, float] = field(default_factory=dict)
    gemm_fp8: Mapping[str, tuple[tuple[int, int, int, float], ...]] = field(default_factory=dict)
    peak_fp8_tflops: float | None = None
    quantize: Mapping[str, float] = field(default_factory=dict)
    memory_bound_ops_compiled: Mapping[str, float] = field(default_factory=dict)
    in_training: Mapping[str, float] = field(default_factory=dict)
    attention_flash2: tuple[tuple[int, int, int, int, float, float], ...] = ()
    #: {SMs held by a concurrent communication kernel: GEMM time factor} (``overlap.sm_gemm_slowdown``)
    overlap_sm_slowdown: Mapping[int, float] = field(default_factory=dict)
    #: GEMM time factor beside a copy-engine transfer (``overlap.copy_engine_gemm_slowdown``)
    overlap_copy_engine_slowdown: float = 1.0
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "calibration") -> "CalibrationProfile":
        """Parse and check a profile mapping.

        Raises:
            ConfigError: wrong schema version, a missing field (named) or a malformed table.
        """
        if not isinstance(d, Mapping):
            raise ConfigError(f"{source}: expected a mapping at the top level")
        if d.get("schema_version") != CALIBRATION_SCHEMA_VERSION:
            raise ConfigError(f"{source}: schema_version is {d.get('schema_version')!r}; expected "
                              f"{CALIBRATION_SCHEMA_VERSION}")
        _no_foreign_digits(d, source)

        def need(key: str) -> Any:
            if key not in d:
                raise ConfigError(f"{source}: missing field {key!r}")
            return d[key]

        try:
            gemm = tuple(sorted((int(m), int(n), int(k), float(t)) for m, n, k, t in need("gemm")))
            attn = tuple(sorted((int(s), int(h), int(kv), int(hd), float(f), float(b))
                                for s, h, kv, hd, f, b in need("attention")))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{source}: gemm rows must be [m, n, k, tflops] and attention rows "
                              f"[seq_len, heads, kv_heads, head_dim, fwd_tflops, bwd_tflops]: {e}") from None
        if not gemm or not attn:
            raise ConfigError(f"{source}: gemm and attention tables must not be empty")
        try:
            attn_fa2 = tuple(sorted((int(s_), int(h), int(kv), int(hd), float(f), float(b))
                                    for s_, h, kv, hd, f, b in (d.get("attention_flash2") or ())))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{source}: attention_flash2 rows must be [seq_len, heads, kv_heads, head_dim, "
                              f"fwd_tflops, bwd_tflops]: {e}") from None
        if any(r[4] <= 0 or r[5] <= 0 for r in attn + attn_fa2):
            raise ConfigError(f"{source}: attention TFLOP/s must be > 0")
        tiers: dict[str, TierCalibration] = {}
        for tier, td in (need("collectives") or {}).items():
            if tier not in TIERS:
                raise ConfigError(f"{source}: collectives tier {tier!r} unknown; valid: {', '.join(TIERS)}")
            curves = _parse_curves(td, f"{source}: collectives.{tier}")
            if "all_reduce" not in curves:
                raise ConfigError(f"{source}: collectives.{tier} needs at least an all_reduce curve")
            base_group = int(td.get("group_size", 2))
            group_curves: dict[int, dict[str, CollectiveCurve]] = {}
            gc = td.get("group_curves") or {}
            if not isinstance(gc, Mapping):
                raise ConfigError(f"{source}: collectives.{tier}.group_curves must map a group size to curves, "
                                  f"got {type(gc).__name__}")
            for g, gd in gc.items():
                if isinstance(g, bool) or not isinstance(g, int) or g <= base_group:
                    raise ConfigError(f"{source}: collectives.{tier}.group_curves key {g!r} must be an integer "
                                      f"group size > the tier's group_size {base_group}")
                if not isinstance(gd, Mapping):
                    raise ConfigError(f"{source}: collectives.{tier}.group_curves.{g} must be a mapping of curves")
                group_curves[g] = _parse_curves(gd, f"{source}: collectives.{tier}.group_curves.{g}")
            tiers[tier] = TierCalibration(link_bandwidth_gbs=float(td["link_bandwidth_gbs"]),
                                          group_size=base_group,
                                          measured=bool(td.get("measured", False)), curves=curves,
                                          group_curves=group_curves)
        if "nvlink" not in tiers:
            raise ConfigError(f"{source}: collectives must include the 'nvlink' tier")
        overlap = d.get("overlap") or {}
        reclaim = d.get("reclaim") or {}
        mops: dict[str, float] = {}
        for row in ((d.get("measurements") or {}).get("memory_ops") or []):
            try:                                      # [op, bytes, ms, GB/s, repeats]
                mops[str(row[0])] = float(row[3])
            except (TypeError, ValueError, IndexError):
                raise ConfigError(f"{source}: measurements.memory_ops rows must be [op, bytes, ms, GB/s, n], "
                                  f"got {row!r}") from None
        mops.update({str(k): float(v) for k, v in (d.get("memory_bound_ops") or {}).items()})
        if any(v <= 0 for v in mops.values()):
            raise ConfigError(f"{source}: memory_bound_ops bandwidths must be > 0, got {mops}")
        frag = dict(DEFAULT_FRAGMENTATION)
        frag.update({str(k): float(v) for k, v in (d.get("fragmentation") or {}).items()})
        gemm_fp8: dict[str, tuple[tuple[int, int, int, float], ...]] = {}
        g8 = d.get("gemm_fp8") or {}
        if not isinstance(g8, Mapping):
            raise ConfigError(f"{source}: gemm_fp8 must be a mapping {{tensorwise: rows, rowwise: rows}}, "
                              f"got {type(g8).__name__}")
        for recipe, rows in g8.items():
            if recipe not in FP8_GEMM_RECIPES:
                raise ConfigError(f"{source}: gemm_fp8.{recipe} unknown; valid: {', '.join(FP8_GEMM_RECIPES)}")
            try:
                tab = tuple(sorted((int(m), int(n), int(k), float(t)) for m, n, k, t in rows or ()))
            except (TypeError, ValueError) as e:
                raise ConfigError(f"{source}: gemm_fp8.{recipe} rows must be [m, n, k, tflops]: {e}") from None
            if not tab or any(r[3] <= 0 for r in tab):
                raise ConfigError(f"{source}: gemm_fp8.{recipe} must be a non-empty table with TFLOP/s > 0")
            gemm_fp8[str(recipe)] = tab
        quant = _positive_map(d.get("quantize"), f"{source}: quantize")
        unknown = sorted(set(quant) - set(QUANTIZE_KEYS))
        if unknown:
            raise ConfigError(f"{source}: quantize.{unknown[0]} unknown; valid: {', '.join(QUANTIZE_KEYS)}")
        compiled = _positive_map(d.get("memory_bound_ops_compiled"), f"{source}: memory_bound_ops_compiled")
        in_training = _positive_map(d.get("in_training"), f"{source}: in_training")
        unknown = sorted(set(in_training) - set(IN_TRAINING_KEYS))
        if unknown:
            raise ConfigError(f"{source}: in_training.{unknown[0]} unknown; valid: {', '.join(IN_TRAINING_KEYS)}")
        peak8 = d.get("peak_fp8_tflops")
        try:
            sm_slow = {int(k): float(v) for k, v in (overlap.get("sm_gemm_slowdown") or {}).items()}
            ce_slow = float(overlap.get("copy_engine_gemm_slowdown", 1.0))
        except (TypeError, ValueError, AttributeError):
            raise ConfigError(f"{source}: overlap.sm_gemm_slowdown must map SM counts to factors >= 1 and "
                              f"overlap.copy_engine_gemm_slowdown be a number >= 1, got {overlap!r}") from None
        if any(n < 1 or v < 1 for n, v in sm_slow.items()) or ce_slow < 1:
            raise ConfigError(f"{source}: overlap slowdown factors must be >= 1 (SM counts >= 1), got {overlap!r}")
        return cls(
            label=str(need("label")), measured=bool(d.get("measured", False)), source=str(d.get("source", "")),
            environment=dict(d.get("environment") or {}), gpu=str(need("gpu")),
            peak_bf16_tflops=float(need("peak_bf16_tflops")), hbm_bandwidth_gbs=float(need("hbm_bandwidth_gbs")),
            gemm=gemm, gemm_backward_factor=float(d.get("gemm_backward_factor", 1.0)), attention=attn,
            memory_bound_bandwidth_gbs=float(need("memory_bound_bandwidth_gbs")), collectives=tiers,
            overlap_compute_slowdown=float(overlap.get("compute_slowdown", 0.0)),
            empty_cache_ms=float(reclaim.get("empty_cache_ms", 0.0)),
            alloc_after_empty_cache_ms_per_gib=float(reclaim.get("alloc_after_empty_cache_ms_per_gib", 0.0)),
            fragmentation=frag, memory_bound_ops=mops, gemm_fp8=gemm_fp8,
            peak_fp8_tflops=float(peak8) if peak8 else None, quantize=quant,
            memory_bound_ops_compiled=compiled, in_training=in_training, attention_flash2=attn_fa2,
            overlap_sm_slowdown=sm_slow, overlap_copy_engine_slowdown=ce_slow, raw=dict(d),
        )

    def to_dict(self) -> dict[str, Any]:
        """The profile as a schema-1 mapping (module docstring), :meth:`from_dict`'s inverse on every
        parsed field; keys not parsed (``measurements``, a tier's ``measured_busbw_gbs``, reclaim's
        ``expandable_segments``) are carried over from ``raw``. Optional tables are written only when set."""
        d: dict[str, Any] = {k: v for k, v in self.raw.items()}
        d.update({
            "schema_version": CALIBRATION_SCHEMA_VERSION, "label": self.label, "measured": self.measured,
            "source": self.source, "environment": dict(self.environment), "gpu": self.gpu,
            "peak_bf16_tflops": self.peak_bf16_tflops, "hbm_bandwidth_gbs": self.hbm_bandwidth_gbs,
            "gemm": [list(r) for r in self.gemm], "gemm_backward_factor": self.gemm_backward_factor,
            "attention": [list(r) for r in self.attention],
            "memory_bound_bandwidth_gbs": self.memory_bound_bandwidth_gbs,
        })
        if self.peak_fp8_tflops:
            d["peak_fp8_tflops"] = self.peak_fp8_tflops
        for key, val in (("memory_bound_ops", dict(self.memory_bound_ops)),
                         ("memory_bound_ops_compiled", dict(self.memory_bound_ops_compiled)),
                         ("gemm_fp8", {sc: [list(r) for r in t] for sc, t in self.gemm_fp8.items()}),
                         ("quantize", dict(self.quantize)), ("in_training", dict(self.in_training)),
                         ("attention_flash2", [list(r) for r in self.attention_flash2])):
            if val:
                d[key] = val
            else:
                d.pop(key, None)
        cols: dict[str, Any] = {}
        for tier, tc in self.collectives.items():
            td = dict((self.raw.get("collectives") or {}).get(tier) or {})
            td.update({"link_bandwidth_gbs": tc.link_bandwidth_gbs, "group_size": tc.group_size,
                       "measured": tc.measured})
            for kind, c in tc.curves.items():
                td[kind] = [[s, b] for s, b in zip(c.sizes_bytes, c.busbw_gbs)]
            if tc.group_curves:
                raw_gc = td.get("group_curves") or {}
                td["group_curves"] = {g: {**{k: v for k, v in dict(raw_gc.get(g) or {}).items()
                                             if k not in COLLECTIVE_KINDS},
                                          **{k: [[s, b] for s, b in zip(c.sizes_bytes, c.busbw_gbs)]
                                             for k, c in cs.items()}}
                                      for g, cs in tc.group_curves.items()}
            cols[tier] = td
        d["collectives"] = cols
        d["overlap"] = {**dict(self.raw.get("overlap") or {}), "compute_slowdown": self.overlap_compute_slowdown}
        d["reclaim"] = {**dict(self.raw.get("reclaim") or {}), "empty_cache_ms": self.empty_cache_ms,
                        "alloc_after_empty_cache_ms_per_gib": self.alloc_after_empty_cache_ms_per_gib}
        d["fragmentation"] = dict(self.fragmentation)
        return d

    @classmethod
    def load(cls, path: str | Path) -> "CalibrationProfile":
        from autotune.files import read_yaml_file

        return cls.from_dict(read_yaml_file(path, what="calibration file"), source=str(path))


def _positive_map(x: Any, where: str) -> dict[str, float]:
    """``{str: float > 0}`` from an optional mapping; ConfigError naming ``where`` otherwise."""
    if not x:
        return {}
    if not isinstance(x, Mapping):
        raise ConfigError(f"{where} must be a mapping of name -> positive number, got {type(x).__name__}")
    try:
        out = {str(k): float(v) for k, v in x.items()}
    except (TypeError, ValueError):
        raise ConfigError(f"{where} values must be numbers, got {dict(x)}") from None
    bad = {k: v for k, v in out.items() if v <= 0}
    if bad:
        raise ConfigError(f"{where} values must be > 0, got {bad}")
    return out


DEFAULT_CALIBRATION_FILE = "h200.yaml"


@lru_cache(maxsize=4)
def default_calibration(name: str = DEFAULT_CALIBRATION_FILE) -> CalibrationProfile:
    """The shipped calibration profile (``autotune/data/calibration/<name>``)."""
    text = resources.files("autotune").joinpath("data", "calibration", name).read_text()
    return CalibrationProfile.from_dict(load_shipped_yaml(text), source=f"autotune/data/calibration/{name}")


def interp_log(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear interpolation of ``ys`` over log2(``xs``) (ascending); flat outside the range.

    Raises:
        ValueError: empty or mismatched tables.
    """
    if not xs or len(xs) != len(ys):
        raise ValueError(f"interpolation table needs equal, non-empty xs and ys (got {len(xs)} and {len(ys)})")
    if x <= xs[0]:
        return float(ys[0])
    if x >= xs[-1]:
        return float(ys[-1])
    i = bisect.bisect_right(xs, x)
    x0, x1 = math.log2(xs[i - 1]), math.log2(xs[i])
    t = (math.log2(x) - x0) / (x1 - x0) if x1 > x0 else 0.0
    return float(ys[i - 1] + t * (ys[i] - ys[i - 1]))


def _no_foreign_digits(x: Any, source: str, where: str = "") -> None:
    """Refuse a string value that ``float()`` / ``int()`` would read as a number but that is not written in
    ASCII digits (``"٨"`` -> 8; issue 37): the profile's numbers are read with ``float(v)`` / ``int(v)``.

    Raises:
        ConfigError: naming the field and the value.
    """
    import re

    from autotune.files import excerpt
    from autotune.spec.validate import ASCII_FLOAT_PATTERN

    if isinstance(x, str):
        try:
            float(x)
        except ValueError:
            return
        if not re.fullmatch(ASCII_FLOAT_PATTERN, x.strip()):
            raise ConfigError(f"{source}: field {excerpt(where or '(top level)', 80)}: {excerpt(repr(x), 40)} is not a "
                              "number written in ASCII digits 0-9")
    elif isinstance(x, Mapping):
        for k, v in x.items():
            _no_foreign_digits(k, source, f"{where} (a key)")
            _no_foreign_digits(v, source, f"{where}.{k}" if where else str(k))
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            _no_foreign_digits(v, source, f"{where}[{i}]")
