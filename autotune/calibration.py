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

import abc
import bisect
import math
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import yaml

from autotune.errors import ConfigError
from autotune.hardware import GPUSpec, LinkSpec

if TYPE_CHECKING:
    from autotune.topology import GroupPlacement

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
    """Collective curves measured on one interconnect tier (see module docstring)."""

    link_bandwidth_gbs: float
    group_size: int
    measured: bool
    curves: Mapping[str, CollectiveCurve]


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
            curves = {}
            for kind in COLLECTIVE_KINDS:
                rows = td.get(kind)
                if not rows:
                    continue
                rows = sorted((float(s), float(b)) for s, b in rows)
                if any(b <= 0 for _, b in rows):
                    raise ConfigError(f"{source}: collectives.{tier}.{kind} has a non-positive bandwidth")
                curves[kind] = CollectiveCurve(tuple(r[0] for r in rows), tuple(r[1] for r in rows))
            if "all_reduce" not in curves:
                raise ConfigError(f"{source}: collectives.{tier} needs at least an all_reduce curve")
            tiers[tier] = TierCalibration(link_bandwidth_gbs=float(td["link_bandwidth_gbs"]),
                                          group_size=int(td.get("group_size", 2)),
                                          measured=bool(td.get("measured", False)), curves=curves)
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
            memory_bound_ops_compiled=compiled, in_training=in_training, attention_flash2=attn_fa2, raw=dict(d),
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
    return CalibrationProfile.from_dict(yaml.safe_load(text), source=f"autotune/data/calibration/{name}")


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


# ----------------------------------------------------------------------------- cost model
class OpCosts(abc.ABC):
    """Times of the operations a step graph contains, for one GPU type; what the simulator asks.

    All shapes are per rank (after TP/CP sharding); times are in ms. ``label`` names the source of the
    numbers (shown in reports); ``provenance`` counts how each op time was obtained.
    """

    label: str = ""

    @abc.abstractmethod
    def gemm_ms(self, m: int, n: int, k: int, *, backward: bool = False, precision: str = "bf16") -> float:
        """GEMM (m x k) @ (k x n), 2 m n k FLOPs; backward=True for one dgrad or wgrad GEMM.

        ``precision`` is a :data:`autotune.plan.PRECISIONS` value (``bf16`` or an FP8 recipe); callers
        pass it only when it is not ``bf16``, so BF16-only implementations stay valid.
        """

    @abc.abstractmethod
    def attention_ms(self, *, batch: int, seq_len: int, heads: int, kv_heads: int, head_dim: int,
                     backward: bool = False) -> float:
        """Causal flash attention over ``seq_len`` tokens, ``heads`` query heads on this rank."""

    @abc.abstractmethod
    def memory_bound_ms(self, nbytes: float, op: str | None = None) -> float:
        """An elementwise/memory-bound kernel moving ``nbytes`` (reads + writes); ``op`` names the
        kernel (``rmsnorm``, ``rope``, ``swiglu``, ``cross_entropy``, ``adamw``) when its own measured
        bandwidth should be used, None for a generic elementwise kernel."""

    @abc.abstractmethod
    def collective_ms(self, kind: str, nbytes: float, group_size: int, link: LinkSpec) -> float:
        """One collective of ``kind`` over ``group_size`` ranks that all talk over one ``link`` (one tier).
        The step graph asks :meth:`placed_collective_ms`, which calls this per tier."""

    def busbw_gbs(self, kind: str, nbytes: float, link: LinkSpec) -> float:
        """Bus bandwidth (GB/s, nccl-tests' definition) of ``kind`` at buffer size ``nbytes`` on one
        ``link``, as the 2-rank measurement on that tier gives it: ``f(2) S / collective_ms(kind, S, 2,
        link)`` (:func:`collective_factors`; at n = 2 no latency is added to the measured curve, so this
        is the curve's busbw, scaled to ``link``). ``inf`` when the collective is free."""
        t = self.collective_ms(kind, nbytes, 2, link)
        if t <= 0:
            return math.inf
        return collective_factors(kind, 2)[0] * nbytes / (t * 1e6)

    def placed_collective_ms(self, kind: str, nbytes: float, placement: "GroupPlacement") -> float:
        """One collective of ``kind`` over a process group placed by :mod:`autotune.topology`, ms.

        Inside one node (NVLink domain): ``collective_ms(kind, S, n, intra_link)``.
        Across N nodes with k members each (n = k N), NCCL's ring goes through the k local members over
        NVLink and crosses to the next node over the NICs, all links working at once on pipelined
        chunks, so the ring's bus bandwidth is that of its slowest link (nccl-tests
        ``doc/PERFORMANCE.md``: "the bus bandwidth should reflect the speed of the hardware bottleneck:
        NVLink, PCI, QPI, or network"):

        * intra-node phase (k > 1): ``B_intra = busbw(S)`` on the intra-node tier;
        * inter-node phase: the group's k members of a node send through k member NIC shares
          (:class:`autotune.topology.GroupPlacement`, ``nics_per_member`` NICs each; every group runs
          at once, so each member keeps one GPU's share), each carrying 1/k of the buffer:
          ``B_inter = k x busbw(S / k)`` on the member's NIC path;
        * ring: ``t = f(n) S / min(B_intra, B_inter) + latency``, with f from :func:`collective_factors`
          and latency ``(nsteps - nInter) intra_lat + nInter inter_lat`` (:func:`ring_steps`, NCCL
          ``tuning.cc``);
        * all-reduce may also run as NCCL's tree (intra-node chain + inter-node double binary tree):
          NCCL ``tuning.cc`` gives it algorithm bandwidth busbw / 2 (``ratio = .5``), so
          ``t = 2 S / min(B_intra, B_inter)``, and latency ``2 ((k - 1) intra_lat + log2(N) inter_lat)``;
          NCCL runs whichever its model predicts faster (``ncclTopoGetAlgoTime``), so the minimum.

        The latency of the 2-rank measurement is already inside the measured busbw curves, so only the
        latency beyond that of 2 ranks on the bottleneck tier (``g(2) x latency``) is added, as in
        :class:`CalibratedCosts`. The per-tier busbw curves (:meth:`busbw_gbs`) stay the measured input.

        Raises:
            ValueError: unknown ``kind``.
        """
        n = placement.size
        if n <= 1 or nbytes <= 0:
            return 0.0
        if not placement.spans_nodes:
            return self.collective_ms(kind, nbytes, n, placement.intra_link)
        return self._spanning_collective_ms(kind, nbytes, placement)

    def _spanning_collective_ms(self, kind: str, nbytes: float, placement: "GroupPlacement") -> float:
        """:meth:`placed_collective_ms` of a group spanning nodes (its docstring gives the model)."""
        n, k, N = placement.size, placement.members_per_node, placement.num_nodes
        intra, net = placement.intra_link, placement.member_inter_link
        b_inter = k * self.busbw_gbs(kind, nbytes / k, net)
        b_intra = self.busbw_gbs(kind, nbytes, intra) if k > 1 else math.inf
        bw = min(b_intra, b_inter)
        if math.isinf(bw):
            return 0.0
        bottleneck_lat = net.latency_us if b_inter <= b_intra else intra.latency_us
        measured_lat_us = collective_factors(kind, 2)[1] * bottleneck_lat
        f, _ = collective_factors(kind, n)
        steps, inter_steps = ring_steps(kind, n, N, k)
        ring_lat_us = (steps - inter_steps) * intra.latency_us + inter_steps * net.latency_us
        t = f * nbytes / (bw * 1e6) + max(0.0, ring_lat_us - measured_lat_us) / 1e3
        if kind == "all_reduce":
            tree_lat_us = 2.0 * ((k - 1) * intra.latency_us + math.ceil(math.log2(N)) * net.latency_us)
            t = min(t, 2.0 * nbytes / (bw * 1e6) + max(0.0, tree_lat_us - measured_lat_us) / 1e3)
        return t

    def quantize_ms(self, nbytes: float, precision: str, *, fused: bool = True) -> float:
        """FP8 cast kernels (amax + scale + cast) moving ``nbytes`` (reads + writes), ms: ``fused`` =
        compiled or an engine's fused cast kernels, else eager PyTorch kernels; default: a generic
        memory-bound kernel."""
        return self.memory_bound_ms(nbytes)

    def memory_bound_compiled_ms(self, nbytes: float, op: str) -> float | None:
        """A torch.compile'd memory-bound kernel ``op`` moving ``nbytes``, ms, or None when its compiled
        bandwidth was never measured (the caller then keeps the eager cost)."""
        return None

    def attention_kernel_ms(self, kernel: str, *, batch: int, seq_len: int, heads: int, kv_heads: int,
                            head_dim: int, backward: bool = False) -> float:
        """Causal attention with a named kernel (:data:`autotune.engines.ATTENTION_KERNELS`: ``default``
        = SDPA's default dispatch / the engine's fused attention, ``flash2`` = FlashAttention-2), ms.
        Here: :meth:`attention_ms` for every kernel (no kernel-specific table)."""
        return self.attention_ms(batch=batch, seq_len=seq_len, heads=heads, kv_heads=kv_heads,
                                 head_dim=head_dim, backward=backward)

    def in_training_factor(self, category: str, *, compiled: bool) -> float:
        """Kernel time inside a training step over this object's stand-alone figure for ``category``
        (``gemm``, ``attention``, ``memory_bound``) of eager or ``compiled`` kernels; 1.0 = none known."""
        return 1.0

    def overlap_slowdown(self) -> float:
        """Fractional slowdown of compute while a collective runs beside it (0 = none)."""
        return 0.0

    def empty_cache_ms(self, reserved_bytes: float) -> float:
        """``torch.cuda.empty_cache()`` plus re-allocating ``reserved_bytes`` afterwards, ms."""
        return 0.0

    def fragmentation(self) -> Mapping[str, float]:
        return DEFAULT_FRAGMENTATION

    def provenance(self) -> Mapping[str, Any]:
        return {"label": self.label}


#: collective -> (bandwidth factor f(n) with t = f(n) S / busbw, latency steps g(n))
def collective_factors(kind: str, n: int) -> tuple[float, float]:
    """Ring bandwidth factor and latency step count of a collective over ``n`` ranks of one tier.

    Bandwidth term (nccl-tests ``doc/PERFORMANCE.md``, "Bus bandwidth"): with busbw as defined in the
    module docstring, ``t = f(n) S / busbw`` with f = 2(n-1)/n (all-reduce), (n-1)/n (all-gather,
    reduce-scatter, all-to-all), 1 (send/recv).
    Latency steps: NCCL's ring (``src/graph/tuning.cc``, ``ncclTopoTuneModel``: ``nsteps``) takes
    2(n-1) steps for all-reduce and n-1 for all-gather / reduce-scatter; all-to-all is n-1 pairwise
    exchanges; send/recv one. Inside one node NCCL's tree is a chain with the same 2(n-1) steps
    (tuning.cc: tree latency ``2 ((nRanks/nNodes - 1) intraLat + log2(nNodes) interLat)``), so the
    ring count holds for every algorithm there; across nodes see :meth:`OpCosts.placed_collective_ms`.

    Raises:
        ValueError: unknown ``kind``.
    """
    if kind not in COLLECTIVE_KINDS:
        raise ValueError(f"unknown collective {kind!r}; valid: {', '.join(COLLECTIVE_KINDS)}")
    if n <= 1:
        return 0.0, 0.0
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n, 2.0 * (n - 1)
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n, float(n - 1)
    return 1.0, 1.0                                   # send_recv


def ring_steps(kind: str, n: int, num_nodes: int, members_per_node: int) -> tuple[float, float]:
    """(all steps, inter-node steps) of NCCL's ring over ``n`` ranks on ``num_nodes`` nodes.

    NCCL ``src/graph/tuning.cc`` (``ncclTopoTuneModel``): all-reduce ``nsteps = 2(nRanks-1)``,
    ``nInterSteps = 2(nNodes-1)``; all-gather / reduce-scatter ``nRanks-1`` and ``nNodes-1``; the ring
    latency is ``(nsteps - nInterSteps) intraLat + nInterSteps interLat``. All-to-all (pairwise, not in
    that model): n-1 exchanges, n-k of them with off-node peers; send/recv: one network step.
    """
    if kind == "all_reduce":
        return 2.0 * (n - 1), 2.0 * (num_nodes - 1)
    if kind in ("all_gather", "reduce_scatter"):
        return float(n - 1), float(num_nodes - 1)
    if kind == "all_to_all":
        return float(n - 1), float(n - members_per_node)
    if kind == "send_recv":
        return 1.0, 1.0 if num_nodes > 1 else 0.0
    raise ValueError(f"unknown collective {kind!r}; valid: {', '.join(COLLECTIVE_KINDS)}")


class CalibratedCosts(OpCosts):
    """Op costs from a :class:`CalibrationProfile`, scaled to ``gpu`` by roofline ratios.

    * GEMM: achieved TFLOP/s interpolated over log2(m n k) among the profile's points (nearest shape
      class), times ``gpu.bf16_tflops / profile.peak_bf16_tflops`` for another GPU.
    * attention: achieved TFLOP/s interpolated over log2(seq_len) among the profile's rows with the
      closest heads-per-rank, scaled by the same compute ratio. FLOPs: forward 2 x 2 s^2 d h / 2 (causal),
      backward 2.5x forward (FlashAttention-2, Dao 2023, Sec. 3.1: 5 vs 2 matmuls).
    * FP8 GEMM (``precision`` not bf16; only the transformer layers' linears ask, the LM head stays
      BF16): the profile's ``gemm_fp8`` table of the recipe (:data:`PRECISION_GEMM_TABLE`;
      ``fp8_rowwise`` without a rowwise table uses the tensorwise one, flagged in ``provenance()``),
      interpolated as the BF16 table (rows of equal m n k averaged), times ``gpu.fp8_tflops /
      profile FP8 peak``. Below the smallest measured FP8 shape the FP8 rate falls as the BF16 rate
      does between the two shapes (assumption: same small-GEMM efficiency loss; flagged). ``mxfp8``,
      and any FP8 precision on a profile without ``gemm_fp8``, is derived from datasheet ratios: the
      BF16 rate x ``gpu.fp8_tflops / gpu.bf16_tflops`` (B200: 4500 / 2250 = 2). Backward FP8 GEMMs use
      the profile's ``gemm_backward_factor`` (measured for BF16; FP8 dgrad/wgrad not measured).
    * FP8 casts: bytes / (``quantize.tensorwise_gbs`` or ``rowwise_gbs`` when the profile has them,
      else the generic memory-bound bandwidth), scaled like memory-bound kernels.
    * torch.compile: memory-bound kernels use ``memory_bound_ops_compiled[op]`` when measured, else
      the eager cost is kept (``provenance()['compile']`` says which).
    * memory-bound: bytes / (achieved bandwidth x gpu.hbm_bandwidth / profile.hbm_bandwidth), with the
      kernel's own measured bandwidth when the profile has one (an eager RoPE reaches ~360 GB/s on
      H200 while RMSNorm reaches ~2850 GB/s), else the profile's generic figure.
    * collectives on one tier: t = f(n) S / busbw(S) + (g(n) - g(n0)) x latency (see
      :func:`collective_factors`), busbw from the tier's curve measured on n0 ranks, scaled by
      link.bandwidth / measured link bandwidth (the same fraction of a faster or slower link is assumed
      reachable); groups spanning nodes: :meth:`OpCosts.placed_collective_ms`.
    """

    def __init__(self, *, profile: CalibrationProfile, gpu: GPUSpec) -> None:
        self.profile = profile
        self.gpu = gpu
        self.compute_scale = gpu.bf16_tflops / profile.peak_bf16_tflops
        self.memory_scale = gpu.hbm_bandwidth_gbs / profile.hbm_bandwidth_gbs
        self.estimated = gpu.name != profile.gpu
        self.label = profile.label + (f" (estimated for {gpu.name} from {profile.gpu} by roofline ratios)"
                                      if self.estimated else "")
        g = profile.gemm
        order = sorted(g, key=lambda r: r[0] * r[1] * r[2])
        self._gemm_x = tuple(float(r[0]) * r[1] * r[2] for r in order)
        self._gemm_y = tuple(r[3] for r in order)
        self._cache: dict[tuple, float] = {}
        # FP8: tables per recipe (x = m n k, rows of equal x averaged) and the compute scale
        self._fp8_tables = {rec: _merge_by_volume(rows) for rec, rows in profile.gemm_fp8.items()}
        self.fp8_assumptions: list[str] = []
        peak8 = profile.peak_fp8_tflops
        if peak8 is None:
            try:
                from autotune.hardware import get_gpu

                peak8 = get_gpu(profile.gpu).fp8_tflops
            except ConfigError:
                peak8 = None
        self.profile_fp8_tflops = peak8
        self.fp8_scale = (gpu.fp8_tflops / peak8) if gpu.fp8_tflops and peak8 else None
        if self._fp8_tables and "rowwise" not in self._fp8_tables and "tensorwise" in self._fp8_tables:
            self.fp8_assumptions.append("fp8_rowwise GEMM rate assumed equal to tensorwise (no rowwise table "
                                        "in the profile)")
        if not self._fp8_tables:
            self.fp8_assumptions.append("FP8 GEMM rates derived from datasheet ratios (BF16 rate x "
                                        "fp8_tflops / bf16_tflops): the profile has no gemm_fp8 table")

    def gemm_ms(self, m: int, n: int, k: int, *, backward: bool = False, precision: str = "bf16") -> float:
        """GEMM time, ms (class docstring gives the rule per precision).

        Raises:
            ValueError: an FP8 precision on a GPU without a datasheet FP8 peak (``fp8_tflops``), or an
                unknown precision (plans are validated first: :func:`autotune.plan.validate_precision`).
        """
        key = ("g", m, n, k, backward, precision)
        v = self._cache.get(key)
        if v is None:
            tflops = self.gemm_tflops(m, n, k, precision=precision)
            v = 2.0 * m * n * k / (tflops * 1e9)
            if backward:
                v *= self.profile.gemm_backward_factor
            self._cache[key] = v
        return v

    def gemm_tflops(self, m: int, n: int, k: int, *, precision: str = "bf16") -> float:
        """Achieved forward TFLOP/s of a GEMM (m x k) @ (k x n) on this GPU at ``precision``."""
        x = float(m) * n * k
        bf16 = interp_log(self._gemm_x, self._gemm_y, x) * self.compute_scale
        if precision == "bf16":
            return bf16
        if precision not in PRECISION_GEMM_TABLE and precision != "mxfp8":
            raise ValueError(f"precision={precision!r} is not valid; choose one of bf16, "
                             f"{', '.join(PRECISION_GEMM_TABLE)}, mxfp8")
        if not self.gpu.fp8_tflops:
            raise ValueError(f"precision={precision} needs an FP8 GPU; {self.gpu.name} has no FP8 peak "
                             "(fp8_tflops) in the catalog")
        rec = PRECISION_GEMM_TABLE.get(precision)
        tab = self._fp8_tables.get(rec) if rec else None
        if tab is None and rec == "rowwise":
            tab = self._fp8_tables.get("tensorwise")
        if tab is None or self.fp8_scale is None:
            # derived from datasheet ratios: BF16 achieved rate x FP8 / BF16 dense peak
            return bf16 * self.gpu.fp8_tflops / self.gpu.bf16_tflops
        xs, ys = tab
        fp8 = interp_log(xs, ys, x)
        if x < xs[0]:
            # below the smallest FP8 shape: fall off as the BF16 rate does (same-efficiency-loss assumption)
            fp8 *= interp_log(self._gemm_x, self._gemm_y, x) / interp_log(self._gemm_x, self._gemm_y, xs[0])
        return fp8 * self.fp8_scale

    def quantize_ms(self, nbytes: float, precision: str, *, fused: bool = True) -> float:
        # measured on H200 (autotune profile --sections quantize, 2026-12-01): eager amax + scale + cast
        # reach ~470 GB/s, compiled ~3500-4100 GB/s
        key = ("rowwise" if precision in ("fp8_rowwise", "mxfp8") else "tensorwise") + \
            ("_gbs" if fused else "_eager_gbs")
        gbs = self.profile.quantize.get(key, self.profile.memory_bound_bandwidth_gbs)
        return nbytes / (gbs * self.memory_scale * 1e6)

    def memory_bound_compiled_ms(self, nbytes: float, op: str) -> float | None:
        gbs = self.profile.memory_bound_ops_compiled.get(op)
        if gbs is None:
            return None
        return nbytes / (gbs * self.memory_scale * 1e6)

    def attention_ms(self, *, batch: int, seq_len: int, heads: int, kv_heads: int, head_dim: int,
                     backward: bool = False) -> float:
        return self.attention_kernel_ms("default", batch=batch, seq_len=seq_len, heads=heads,
                                        kv_heads=kv_heads, head_dim=head_dim, backward=backward)

    def attention_kernel_ms(self, kernel: str, *, batch: int, seq_len: int, heads: int, kv_heads: int,
                            head_dim: int, backward: bool = False) -> float:
        """``default``: the profile's ``attention`` table; ``flash2``: its ``attention_flash2`` table
        (SDPA's flash backend, measured), the default table when the profile has none."""
        rows = self.profile.attention_flash2 if kernel == "flash2" and self.profile.attention_flash2 \
            else self.profile.attention
        key = ("a", rows is self.profile.attention, batch, seq_len, heads, kv_heads, head_dim, backward)
        v = self._cache.get(key)
        if v is None:
            best_h = min({r[1] for r in rows}, key=lambda h: (abs(math.log2(h) - math.log2(heads)), -h))
            sel = sorted((r for r in rows if r[1] == best_h), key=lambda r: r[0])
            xs = tuple(float(r[0]) for r in sel)
            ys = tuple(r[5] if backward else r[4] for r in sel)
            tflops = interp_log(xs, ys, float(seq_len)) * self.compute_scale
            fwd_flops = 2.0 * seq_len * seq_len * head_dim * heads * batch  # causal: 4 s^2 d h / 2
            flops = fwd_flops * (2.5 if backward else 1.0)
            v = flops / (tflops * 1e9)
            self._cache[key] = v
        return v

    def memory_bound_ms(self, nbytes: float, op: str | None = None) -> float:
        gbs = self.profile.memory_bound_ops.get(op, self.profile.memory_bound_bandwidth_gbs) if op \
            else self.profile.memory_bound_bandwidth_gbs
        return nbytes / (gbs * self.memory_scale * 1e6)

    def collective_ms(self, kind: str, nbytes: float, group_size: int, link: LinkSpec) -> float:
        if group_size <= 1 or nbytes <= 0:
            return 0.0
        key = ("c", kind, nbytes, group_size, link)
        v = self._cache.get(key)
        if v is None:
            tier = self.profile.collectives.get(link.calibration_tier) or self.profile.collectives["nvlink"]
            curve = tier.curves.get(kind) or tier.curves["all_reduce"]
            busbw = curve.busbw(nbytes) * link.bandwidth_gbs / tier.link_bandwidth_gbs
            f, steps = collective_factors(kind, group_size)
            _, steps0 = collective_factors(kind, max(tier.group_size, 2))
            # busbw is independent of n for bandwidth-bound ring collectives (nccl-tests' definition),
            # so t(n) = f(n) S / busbw; extra latency steps beyond the measured group are added.
            v = nbytes * f / (busbw * 1e6) + max(0.0, steps - steps0) * link.latency_us / 1e3
            self._cache[key] = v
        return v

    def placed_collective_ms(self, kind: str, nbytes: float, placement: "GroupPlacement") -> float:
        """:meth:`OpCosts.placed_collective_ms`, cached per (kind, size, placement)."""
        key = ("p", kind, float(nbytes), placement)
        v = self._cache.get(key)
        if v is None:
            v = self._cache[key] = super().placed_collective_ms(kind, nbytes, placement)
        return v

    def overlap_slowdown(self) -> float:
        return self.profile.overlap_compute_slowdown

    def in_training_factor(self, category: str, *, compiled: bool) -> float:
        return float(self.profile.in_training.get(f"{category}_{'compiled' if compiled else 'eager'}", 1.0))

    def empty_cache_ms(self, reserved_bytes: float) -> float:
        return (self.profile.empty_cache_ms
                + self.profile.alloc_after_empty_cache_ms_per_gib * reserved_bytes / 2**30)

    def fragmentation(self) -> Mapping[str, float]:
        return self.profile.fragmentation

    def provenance(self) -> Mapping[str, Any]:
        q = self.profile.quantize
        return {"label": self.label, "measured": self.profile.measured, "estimated": self.estimated,
                "calibration_gpu": self.profile.gpu, "environment": dict(self.profile.environment),
                "gpu_bf16_tflops": self.gpu.bf16_tflops, "gpu_fp8_tflops": self.gpu.fp8_tflops,
                "fp8": {"gemm_tables": sorted(self._fp8_tables), "assumptions": list(self.fp8_assumptions),
                        "mxfp8": "derived from datasheet ratios (BF16 rate x fp8_tflops / bf16_tflops)",
                        "quantize_bandwidth": ("profile quantize " + ", ".join(sorted(q))) if q else
                        f"generic memory-bound bandwidth {self.profile.memory_bound_bandwidth_gbs:g} GB/s "
                        "(no quantize measurement in the profile)"},
                "compile": ("memory_bound_ops_compiled: " + ", ".join(sorted(self.profile.memory_bound_ops_compiled)))
                if self.profile.memory_bound_ops_compiled else
                "no memory_bound_ops_compiled in the profile: compile=true keeps eager costs"}


def _merge_by_volume(rows: Sequence[tuple[int, int, int, float]]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(x = m n k ascending, TFLOP/s) of a GEMM table; rows with the same m n k are averaged."""
    acc: dict[float, list[float]] = {}
    for m, n, k, t in rows:
        acc.setdefault(float(m) * n * k, []).append(t)
    xs = tuple(sorted(acc))
    return xs, tuple(sum(acc[x]) / len(acc[x]) for x in xs)


class InTrainingCosts(OpCosts):
    """``costs`` as its kernels run inside a training step: GEMM, attention and memory-bound times scaled
    by :meth:`OpCosts.in_training_factor` for the plan's execution mode; everything else unchanged.

    The stand-alone microbenchmarks behind a profile time one op at a time. Inside a profiled training
    step (Llama 3.1 8B at 16 layers, seq 8192, 1x H200, 2026-12-01; ``bench/profile_plans.sh`` ->
    ``docs/results/profile-plans-h200x1-2026-12-01.json`` -> ``bench/derive_in_training.py``) the same
    categories of kernels took longer: eager memory-bound work ~1.65x the modelled time (the eager layers
    run more kernels than the modelled byte counts: dtype casts around autocast and FP32 RMSNorm, RoPE's
    cat / neg copies, layout copies), attention ~1.13-1.17x, compiled GEMMs ~1.06x (the dense compiled
    step leaves the clocks no idle gaps). The optimizer step (op ``adamw``, profiled within 2% of its
    model) and FP8 casts (their bandwidths already derived in training, ``bench/derive_fp8_casts.py``) are
    not scaled.

    Args (keyword-only):
        costs: the stand-alone op costs.
        compiled: torch.compile'd kernels (``plan.compile``) for GEMM and attention; memory-bound kernels
            answered from the compiled table (:meth:`memory_bound_compiled_ms`, also an engine's fused
            kernels) take the compiled factor, eager ones the eager factor.
    """

    def __init__(self, *, costs: OpCosts, compiled: bool) -> None:
        self.inner = costs
        self.label = getattr(costs, "label", "")
        k = costs.in_training_factor
        self.k_gemm = k("gemm", compiled=compiled)
        self.k_attention = k("attention", compiled=compiled)
        self.k_memory_eager = k("memory_bound", compiled=False)
        self.k_memory_compiled = k("memory_bound", compiled=True)

    def __getattr__(self, name: str) -> Any:          # attributes of the wrapped costs (tables, scales)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def gemm_ms(self, m: int, n: int, k: int, *, backward: bool = False, precision: str = "bf16") -> float:
        kw = {"precision": precision} if precision != "bf16" else {}
        return self.k_gemm * self.inner.gemm_ms(m, n, k, backward=backward, **kw)

    def attention_ms(self, *, batch: int, seq_len: int, heads: int, kv_heads: int, head_dim: int,
                     backward: bool = False) -> float:
        return self.k_attention * self.inner.attention_ms(batch=batch, seq_len=seq_len, heads=heads,
                                                          kv_heads=kv_heads, head_dim=head_dim, backward=backward)

    def attention_kernel_ms(self, kernel: str, *, batch: int, seq_len: int, heads: int, kv_heads: int,
                            head_dim: int, backward: bool = False) -> float:
        # the in-training attention factor was measured on the default kernel (cuDNN); applied to
        # flash2 as well (assumption: the same in-training slowdown)
        return self.k_attention * self.inner.attention_kernel_ms(
            kernel, batch=batch, seq_len=seq_len, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
            backward=backward)

    def memory_bound_ms(self, nbytes: float, op: str | None = None) -> float:
        v = self.inner.memory_bound_ms(nbytes, op)
        return v if op == "adamw" else self.k_memory_eager * v

    def memory_bound_compiled_ms(self, nbytes: float, op: str) -> float | None:
        v = self.inner.memory_bound_compiled_ms(nbytes, op)
        return None if v is None else self.k_memory_compiled * v

    def collective_ms(self, kind: str, nbytes: float, group_size: int, link: LinkSpec) -> float:
        return self.inner.collective_ms(kind, nbytes, group_size, link)

    def busbw_gbs(self, kind: str, nbytes: float, link: LinkSpec) -> float:
        return self.inner.busbw_gbs(kind, nbytes, link)

    def placed_collective_ms(self, kind: str, nbytes: float, placement: "GroupPlacement") -> float:
        return self.inner.placed_collective_ms(kind, nbytes, placement)

    def quantize_ms(self, nbytes: float, precision: str, *, fused: bool = True) -> float:
        return self.inner.quantize_ms(nbytes, precision, fused=fused)

    def in_training_factor(self, category: str, *, compiled: bool) -> float:
        return 1.0                                     # already applied

    def overlap_slowdown(self) -> float:
        return self.inner.overlap_slowdown()

    def empty_cache_ms(self, reserved_bytes: float) -> float:
        return self.inner.empty_cache_ms(reserved_bytes)

    def fragmentation(self) -> Mapping[str, float]:
        return self.inner.fragmentation()

    def provenance(self) -> Mapping[str, Any]:
        return self.inner.provenance()
