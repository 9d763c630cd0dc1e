"""Op costs from a calibration profile: the :class:`OpCosts` interface (ms per GEMM, attention, memory-bound
op, collective), the collective algorithms' bandwidth factors, :class:`CalibratedCosts` (measured curves and a
roofline for unmeasured GPUs) and :class:`InTrainingCosts` (in-training slowdowns). Moved from
``calibration.py``, which keeps the profile format.
"""

from __future__ import annotations

import abc
import math
from typing import Any, Mapping, Sequence

from autotune.cost.calibration import (
    COLLECTIVE_KINDS,
    DEFAULT_FRAGMENTATION,
    PRECISION_GEMM_TABLE,
    CalibrationProfile,
    interp_log,
)
from autotune.cost.topology import GroupPlacement
from autotune.errors import ConfigError
from autotune.spec.hardware import GPUSpec, LinkSpec


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

        ``precision`` is a :data:`autotune.spec.plan.PRECISIONS` value (``bf16`` or an FP8 recipe); callers
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

    def busbw_gbs(self, kind: str, nbytes: float, link: LinkSpec, group_size: int = 2) -> float:
        """Bus bandwidth (GB/s, nccl-tests' definition) of ``kind`` at buffer size ``nbytes`` on one
        ``link``, as the 2-rank measurement on that tier gives it: ``f(2) S / collective_ms(kind, S, 2,
        link)`` (:func:`collective_factors`; at n = 2 no latency is added to the measured curve, so this
        is the curve's busbw, scaled to ``link``). ``inf`` when the collective is free. ``group_size``:
        the ranks of the group on that tier; an implementation with curves measured on larger groups
        (:class:`CalibratedCosts`) uses the largest measured group <= it, this default the 2-rank one."""
        t = self.collective_ms(kind, nbytes, 2, link)
        if t <= 0:
            return math.inf
        return collective_factors(kind, 2)[0] * nbytes / (t * 1e6)

    def placed_collective_ms(self, kind: str, nbytes: float, placement: "GroupPlacement") -> float:
        """One collective of ``kind`` over a process group placed by :mod:`autotune.cost.topology`, ms.

        Inside one node (NVLink domain): ``collective_ms(kind, S, n, intra_link)``.
        Across N nodes with k members each (n = k N), NCCL's ring goes through the k local members over
        NVLink and crosses to the next node over the NICs, all links working at once on pipelined
        chunks, so the ring's bus bandwidth is that of its slowest link (nccl-tests
        ``doc/PERFORMANCE.md``: "the bus bandwidth should reflect the speed of the hardware bottleneck:
        NVLink, PCI, QPI, or network"):

        * intra-node phase (k > 1): ``B_intra = busbw(S)`` on the intra-node tier, from the curve of its k
          members (:meth:`busbw_gbs` with ``group_size=k``);
        * inter-node phase: the group's k members of a node send through k member NIC shares
          (:class:`autotune.cost.topology.GroupPlacement`, ``nics_per_member`` NICs each; every group runs
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
        b_intra = self.busbw_gbs(kind, nbytes, intra, group_size=k) if k > 1 else math.inf
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
        """Causal attention with a named kernel (:data:`autotune.spec.engines.ATTENTION_KERNELS`: ``default``
        = SDPA's default dispatch / the engine's fused attention, ``flash2`` = FlashAttention-2, ``flex`` =
        FlexAttention), ms.
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

    def sm_contention(self, num_sms: int) -> float:
        """GEMM time factor while a communication kernel holds ``num_sms`` SMs for the GEMM's whole
        duration (1.0 = none known)."""
        return 1.0

    def copy_engine_contention(self) -> float:
        """GEMM time factor beside a copy-engine (DMA) transfer (1.0 = none known)."""
        return 1.0

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


#: How an estimated GPU's FP8 GEMM rate is scaled from the calibration GPU's: ``bf16_reference`` (as its BF16
#: GEMMs, by the large-shape published BF16 benchmark, times the datasheet FP8/BF16 ratios) or
#: ``fp8_reference`` (by the published FP8 benchmark, GPUSpec.fp8_gemm_reference, a 4096^3 GEMM). Chosen
#: while looking at the Megatron-Bridge 25.11 B200 rows' errors: docs/fidelity.md names it, and
#: ``bench/published.py --cross-validate`` prints that source's error under both rules. ``bench/fp8_rule_check.py``
#: decides it on a run outside the development set (torchao's published B200 FP8 / BF16 training speedup,
#: tensorwise +25.4%: +14.4% predicted under this rule, +1.6% under the alternative) and selects this one.
FP8_SCALE_RULE = "bf16_reference"
FP8_SCALE_RULES = ("bf16_reference", "fp8_reference")


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
        #: attention and (without a GEMM reference) GEMM rates: the datasheet dense-peak ratio (for a GPU that
        #: takes another's references, that GPU's peak x the sustained clock ratio: GPUSpec.sustained_bf16_tflops)
        self.compute_scale = gpu.sustained_bf16_tflops / profile.peak_bf16_tflops
        self.memory_scale = gpu.hbm_bandwidth_gbs / profile.hbm_bandwidth_gbs
        self.estimated = gpu.name != profile.gpu
        g = profile.gemm
        order = sorted(g, key=lambda r: r[0] * r[1] * r[2])
        self._gemm_x = tuple(float(r[0]) * r[1] * r[2] for r in order)
        self._gemm_y = tuple(r[3] for r in order)
        self._cache: dict[tuple, float] = {}
        # FP8: tables per recipe (x = m n k, rows of equal x averaged) and the compute scale
        self._fp8_tables = {rec: _merge_by_volume(rows) for rec, rows in profile.gemm_fp8.items()}
        # another GPU with a published GEMM benchmark (GPUSpec.bf16_gemm_reference): its GEMMs are the
        # calibration GPU's scaled by the ratio of achieved rates at the reference shape, not of datasheet peaks
        self.gemm_scale = self.compute_scale
        self.gemm_scale_source = "datasheet dense-peak ratio"
        ref = gpu.gemm_reference("bf16") if self.estimated else None
        if ref is not None:
            self.gemm_scale = ref[3] / interp_log(self._gemm_x, self._gemm_y, ref[0] * ref[1] * ref[2])
            self.gemm_scale_source = (f"published {gpu.name} cuBLAS BF16 {ref[0]:.0f}x{ref[1]:.0f}x{ref[2]:.0f} "
                                      f"{ref[3]:.0f} TFLOP/s over this profile's rate there (autotune/data/gpus.yaml)")
        self.label = profile.label + (f" (estimated for {gpu.name} from {profile.gpu}: GEMMs by "
                                      f"{'published kernel rates' if ref is not None else 'roofline ratios'}, "
                                      "the rest by roofline ratios)" if self.estimated else "")
        self.fp8_assumptions: list[str] = []
        peak8 = profile.peak_fp8_tflops
        if peak8 is None:
            try:
                from autotune.spec.hardware import get_gpu

                peak8 = get_gpu(profile.gpu).fp8_tflops
            except ConfigError:
                peak8 = None
        self.profile_fp8_tflops = peak8
        self.fp8_scale = (gpu.fp8_tflops / peak8) if gpu.fp8_tflops and peak8 else None
        ref8 = gpu.gemm_reference("fp8") if self.estimated else None
        tab8 = self._fp8_tables.get("rowwise") or self._fp8_tables.get("tensorwise")
        if FP8_SCALE_RULE == "fp8_reference" and ref8 is not None and tab8 is not None:
            # the published FP8 benchmark is cuBLAS rowwise-scaled (torch._scaled_mm): the profile's rowwise
            # table (tensorwise when it has none) at the same shape
            self.fp8_scale = ref8[3] / interp_log(tab8[0], tab8[1], ref8[0] * ref8[1] * ref8[2])
        elif ref is not None and self.fp8_scale is not None and gpu.fp8_tflops:
            # FP8 GEMMs gain over the calibration GPU's as BF16 GEMMs do at the large reference shape (the same
            # tensor cores at twice the datasheet rate on both GPUs); the published FP8 benchmark
            # (GPUSpec.fp8_gemm_reference, 4096^3) is too small a shape to stand for training GEMMs, and is
            # kept as a cross-check (docs/fidelity.md)
            self.fp8_scale = self.gemm_scale * (gpu.fp8_tflops / gpu.bf16_tflops) / (peak8 / profile.peak_bf16_tflops)
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
                unknown precision (plans are validated first: :func:`autotune.spec.plan.validate_precision`).
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
        bf16 = interp_log(self._gemm_x, self._gemm_y, x) * self.gemm_scale
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
        (SDPA's flash backend, measured), the default table when the profile has none; ``flex``: FlexAttention at
        its in-training rates measured on the H200 (:func:`autotune.cost.tt_moe.flex_attention_ms`; heads as
        given, no KV-head grouping in MLA)."""
        if kernel == "flex":
            from autotune.cost.tt_moe import flex_attention_ms
            return flex_attention_ms(self, batch=batch, seq_len=seq_len, heads=heads, head_dim=head_dim,
                                     backward=backward)
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
            # the curve of the largest measured group <= n (TierCalibration.curve_for): on NVSwitch a
            # ring's busbw rises from 2 to 4 ranks and is flat beyond (nccl-tests' busbw is meant to be
            # independent of n; measured, it is so only from 4 ranks on), so t(n) = f(n) S / busbw(S)
            # with that group's busbw; latency steps beyond the measured group are added.
            curve, g0 = tier.curve_for(kind, group_size)
            busbw = curve.busbw(nbytes) * link.bandwidth_gbs / tier.link_bandwidth_gbs
            f, steps = collective_factors(kind, group_size)
            _, steps0 = collective_factors(kind, max(g0, 2))
            v = nbytes * f / (busbw * 1e6) + max(0.0, steps - steps0) * link.latency_us / 1e3
            self._cache[key] = v
        return v

    def busbw_gbs(self, kind: str, nbytes: float, link: LinkSpec, group_size: int = 2) -> float:
        """:meth:`OpCosts.busbw_gbs` from the curve of the largest measured group <= ``group_size``
        (:meth:`autotune.cost.calibration.TierCalibration.curve_for`), scaled to ``link``; no latency
        is added to the measured curve."""
        if nbytes <= 0:
            return math.inf
        tier = self.profile.collectives.get(link.calibration_tier) or self.profile.collectives["nvlink"]
        curve, _ = tier.curve_for(kind, max(2, group_size))
        return curve.busbw(nbytes) * link.bandwidth_gbs / tier.link_bandwidth_gbs

    def placed_collective_ms(self, kind: str, nbytes: float, placement: "GroupPlacement") -> float:
        """:meth:`OpCosts.placed_collective_ms`, cached per (kind, size, placement)."""
        key = ("p", kind, float(nbytes), placement)
        v = self._cache.get(key)
        if v is None:
            v = self._cache[key] = super().placed_collective_ms(kind, nbytes, placement)
        return v

    def overlap_slowdown(self) -> float:
        return self.profile.overlap_compute_slowdown

    def sm_contention(self, num_sms: int) -> float:
        """The profile's measured GEMM time factor while a communication kernel holds ``num_sms`` SMs
        (``overlap.sm_gemm_slowdown``, linear between the measured counts and from 1.0 at 0 SMs), at the
        same share of this GPU's SMs as of the calibration GPU's (GPUSpec.sm_count); without a measurement,
        the share of SMs lost: sm_count / (sm_count - num_sms)."""
        if num_sms <= 0:
            return 1.0
        v = self._cache.get(("sm", num_sms))      # asked once per CostBuilder, i.e. per evaluated plan
        if v is None:
            v = self._cache[("sm", num_sms)] = self._sm_contention(num_sms)
        return v

    def _sm_contention(self, num_sms: int) -> float:
        table = self.profile.overlap_sm_slowdown
        mine = self.gpu.sm_count
        try:
            from autotune.spec.hardware import get_gpu

            theirs = get_gpu(self.profile.gpu).sm_count
        except ConfigError:
            theirs = 0
        if not table:
            sms = mine or theirs or 132
            return sms / max(1, sms - num_sms)
        n = num_sms * (theirs / mine) if mine and theirs else float(num_sms)
        xs = (0.0,) + tuple(float(k) for k in sorted(table))
        ys = (1.0,) + tuple(float(table[k]) for k in sorted(table))
        if n >= xs[-1]:
            return ys[-1]
        i = next(j for j in range(1, len(xs)) if xs[j] >= n)
        t = (n - xs[i - 1]) / (xs[i] - xs[i - 1])
        return ys[i - 1] + t * (ys[i] - ys[i - 1])

    def copy_engine_contention(self) -> float:
        """The profile's measured GEMM time factor beside a copy-engine transfer
        (``overlap.copy_engine_gemm_slowdown``)."""
        return self.profile.overlap_copy_engine_slowdown

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
                "gemm_scale": round(self.gemm_scale, 4), "gemm_scale_source": self.gemm_scale_source,
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
        self._gemm: dict[tuple, float] = {}     # gemm_ms per (m, n, k, backward, precision): the same product

    def __getattr__(self, name: str) -> Any:          # attributes of the wrapped costs (tables, scales)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @classmethod
    def of(cls, costs: OpCosts, compiled: bool, memo: dict[Any, Any] | None = None) -> "InTrainingCosts":
        """``InTrainingCosts(costs=costs, compiled=compiled)``, one per (costs, mode) in ``memo`` when given (a
        :class:`autotune.cost.chunk_costs.CostBuilder` memo: its builders then share the GEMM times cached here)."""
        if memo is None:
            return cls(costs=costs, compiled=compiled)
        got = memo.get(("in_training", id(costs), compiled))
        if got is None or got[0] is not costs:
            got = memo[("in_training", id(costs), compiled)] = (costs, cls(costs=costs, compiled=compiled))
        return got[1]

    def gemm_ms(self, m: int, n: int, k: int, *, backward: bool = False, precision: str = "bf16") -> float:
        key = (m, n, k, backward, precision)
        v = self._gemm.get(key)
        if v is None:
            kw = {"precision": precision} if precision != "bf16" else {}
            v = self._gemm[key] = self.k_gemm * self.inner.gemm_ms(m, n, k, backward=backward, **kw)
        return v

    def attention_ms(self, *, batch: int, seq_len: int, heads: int, kv_heads: int, head_dim: int,
                     backward: bool = False) -> float:
        return self.k_attention * self.inner.attention_ms(batch=batch, seq_len=seq_len, heads=heads,
                                                          kv_heads=kv_heads, head_dim=head_dim, backward=backward)

    def attention_kernel_ms(self, kernel: str, *, batch: int, seq_len: int, heads: int, kv_heads: int,
                            head_dim: int, backward: bool = False) -> float:
        # the in-training attention factor was measured on the default kernel (cuDNN); applied to
        # flash2 as well (assumption: the same in-training slowdown); flex's rates are in-training ones already
        k = 1.0 if kernel == "flex" else self.k_attention
        return k * self.inner.attention_kernel_ms(
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

    def busbw_gbs(self, kind: str, nbytes: float, link: LinkSpec, group_size: int = 2) -> float:
        return self.inner.busbw_gbs(kind, nbytes, link, group_size=group_size)

    def placed_collective_ms(self, kind: str, nbytes: float, placement: "GroupPlacement") -> float:
        return self.inner.placed_collective_ms(kind, nbytes, placement)

    def quantize_ms(self, nbytes: float, precision: str, *, fused: bool = True) -> float:
        return self.inner.quantize_ms(nbytes, precision, fused=fused)

    def in_training_factor(self, category: str, *, compiled: bool) -> float:
        return 1.0                                     # already applied

    def overlap_slowdown(self) -> float:
        return self.inner.overlap_slowdown()

    def sm_contention(self, num_sms: int) -> float:
        return self.inner.sm_contention(num_sms)

    def copy_engine_contention(self) -> float:
        return self.inner.copy_engine_contention()

    def empty_cache_ms(self, reserved_bytes: float) -> float:
        return self.inner.empty_cache_ms(reserved_bytes)

    def fragmentation(self) -> Mapping[str, float]:
        return self.inner.fragmentation()

    def provenance(self) -> Mapping[str, Any]:
        return self.inner.provenance()
