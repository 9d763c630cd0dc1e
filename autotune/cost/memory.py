"""Per-GPU memory of one training step, per pipeline stage (pure arithmetic, no graph).

For every pipeline rank the estimate adds, in bytes per GPU:

* **model states** (weights, gradients, optimizer): 16 bytes per parameter for mixed-precision Adam
  as PyTorch runs it (autocast or FSDP2 mixed precision): the FP32 master weight is the parameter
  (4), its FP32 gradient (4), Adam momentum and variance (8) -- the ZeRO paper's 2 + 2 + 12
  (Rajbhandari et al. 2020, "ZeRO", Sec. 3.1, K = 12) regrouped; the BF16 compute copy (2) is counted
  as transient. A stage holds its transformer layers' parameters split over TP, the
  vocabulary-parallel input embedding on the first stage and the LM head plus final RMSNorm on the
  last (Megatron-LM layout; a tied model keeps a copy of the shared matrix on both end stages). ZeRO
  shards over the data-parallel group, DP x CP, only, never over TP a second time: stage 1 shards the
  8 optimizer bytes (``ZeroRedundancyOptimizer`` keeps full FP32 parameters); stage 2 also the 4
  gradient bytes and the 4 FP32 weight bytes at rest (FSDP2 without resharding after forward, as the
  Llama 3 paper's FSDP, Sec. 3.3.2: the BF16 compute copy stays whole through the step); stage 3
  also re-shards the BF16 copy after each layer (ZeRO paper, Sec. 5.1-5.3).
* **activations** saved for backward by all in-flight micro-batches (:func:`activation_bytes_per_layer`,
  re-derived for Llama from Korthikanti et al. 2022, arXiv 2205.05198, Sec. 4 and Table 2) times
  the in-flight count of the pipeline schedule (:func:`inflight_microbatches`), counted from the
  order the step graph runs (:func:`autotune.cost.schedule.count_inflight`).
* **transient** buffers alive at the peak: the last stage's logits and loss buffers (FP32 loss), the
  BF16 compute copies of the FP32 master weights (autocast / FSDP2 mixed precision), one layer's
  backward working set under full recomputation, the DP gradient buckets, ZeRO-3's gathered layer
  parameters and the sequence-parallel all-gather buffer.
* **allocator overhead**: a fragmentation fraction of everything else, per ``memory_reclaim`` policy
  (:data:`DEFAULT_FRAGMENTATION`, assumptions until a calibration profile supplies measured values),
  plus, under FSDP (ZeRO 2/3 over g > 1), the reduce-scatter stream's own pool: 4 bytes x (largest
  FSDP unit + its 1/g shard). PyTorch's caching allocator reuses a freed block only on its own
  stream; measured per stream (``torch.cuda.memory_snapshot``) on H200, 2026-11-30: 8B 4-layer
  FSDP 6.0 GiB (formula: root unit 1.05 B params -> 5.9), 70B 2-layer 12.6 GiB (formula 11.7).

The OOM verdict uses the largest stage (never the average) against the GPU's usable HBM
(:attr:`autotune.spec.hardware.GPUSpec.usable_hbm_bytes`: HBM minus the CUDA context).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from autotune.cost import moe
from autotune.cost.activations import (  # noqa: F401 - re-exported: the per-layer activation model lives there
    COMPILED_OVER_EAGER,
    FP8_BYTES,
    LSE_BYTES,
    TE_FP8_WEIGHT_COPY_BYTES,
    _block_input_bytes,
    _check_tp,
    _compiled_layer_bytes,
    _compiled_no_recompute_bytes,
    _layer_activation_terms,
    _seq_per_rank,
    _selective_bytes,
    _torchtitan_block,
    activation_bytes_per_layer,
    moe_layer_bytes,
    te_fp8,
    te_fp8_weight_copy_bytes,
)
from autotune.cost.schedule import count_inflight
from autotune.errors import ConfigError
from autotune.spec.engines import EngineProfile, engine_for_plan
from autotune.spec.hardware import GIB, GPUSpec
from autotune.spec.models import ModelSpec
from autotune.spec.plan import MEMORY_RECLAIM_POLICIES, Plan, Workload

MIB = 1024**2

#: Bytes per element of BF16 activations and compute copies of the weights.
BF16_BYTES = 2
#: FP32 master weight, which is the module's parameter (PyTorch autocast / FSDP2 mixed precision).
WEIGHT_BYTES = 4
#: FP32 gradient of the master weight (accumulated over micro-batches and reduced in FP32).
GRAD_BYTES = 4
#: Adam momentum + variance, FP32.
ADAM_STATE_BYTES = 8
#: Bytes per parameter of mixed-precision Adam: 4 + 4 + 8 = 16, the ZeRO paper's 2 + 2 + 12
#: (Rajbhandari et al. 2020, Sec. 3.1, K = 12) regrouped for FP32 parameters and gradients; the BF16
#: compute copy (2) is transient (:func:`estimate_memory`).
MODEL_STATE_BYTES_PER_PARAM = WEIGHT_BYTES + GRAD_BYTES + ADAM_STATE_BYTES
#: Bytes per logit on the last stage at the loss's backward, with the cross-entropy computed in FP32
#: (``F.cross_entropy(logits.float())``, as torchtitan and this runtime do): the saved FP32
#: log-softmax output (4) + its incoming FP32 gradient (4) + the FP32 gradient it produces (4). The
#: BF16 logits (2) and their FP32 copy (4) live only inside the forward, beside the saved output (4):
#: 10 < 12. Checked on H200 (2026-11-30): an 8B 4-layer FSDP step peaked 18.5 GiB above its model
#: states, of which this term is 11.7 GiB.
LOGITS_BYTES_PER_ELEMENT = 4 + 4 + 4
#: Bytes per logit that each *other* in-flight micro-batch keeps on the last pipeline stage until its
#: backward: the saved FP32 log-softmax output (4) and the stage's BF16 output, which the pipeline
#: runtime keeps for the stage backward (2). The current micro-batch also keeps its BF16 output (2)
#: under pipelining (``torch.distributed.pipelining``; without PP the BF16 logits die after the FP32
#: copy). Seen on H200 (2026-11-30, 8B 4-layer proxy, PP=2, 4 micro-batches): peak allocated 58.2 GiB
#: with GPipe vs 33.7 GiB with 1F1B; this term's share of the gap is 3 x 6 x 8192 x 128256 bytes = 17.6 GiB.
PP_INFLIGHT_LOGITS_BYTES = 4 + 2
#: Bytes per logit of a compiled loss (engines whose ``compile_loss`` is set, under ``plan.compile``):
#: inductor fuses the FP32 cast, log-softmax and NLL, saves only the BF16 logits (and per-row
#: statistics) and writes their BF16 gradient: 2 + 2. Measured on H200 (bench/loss_memory.py,
#: docs/results/loss-memory-h200x1-2026-12-01.json; [1 or 2, 8192, 128256] BF16 logits, torch 2.11):
#: kept after the forward 0.0 bytes per logit beyond the logits, peak 2.0 (eager: 4.0 and 12.0, which
#: :data:`LOGITS_BYTES_PER_ELEMENT` counts). Other micro-batches in flight on the last stage keep their
#: BF16 logits only: :data:`COMPILED_LOSS_INFLIGHT_BYTES`.
COMPILED_LOSS_BYTES_PER_LOGIT = 2 + 2
COMPILED_LOSS_INFLIGHT_BYTES = 2
#: ``loss_impl: chunked`` (autotune/runtime/model.py ChunkedLinearCrossEntropy, TP 1 / PP 1): one chunk of
#: ``chunk_tokens`` logits alive at a time, per logit the BF16 logits (2) and their BF16 gradient (2) with
#: the per-chunk kernel compiled, + the FP32 soft-max (4) and its difference (4) eager; beside them, from
#: the forward to the backward, the LM head's FP32 weight gradient (4 per weight) and the BF16 gradient of
#: the hidden states (2 per element). Measured on H200 (bench/bench_one_gpu.py, 2026-12-03, 8B at 16
#: layers, 2 x 8192 tokens, FP8 + compile): peak allocated 101.9 -> 82.4 GiB (-19.5), this count -19.5 GiB.
CHUNKED_LOSS_BYTES_PER_LOGIT = {True: 2 + 2, False: 2 + 2 + 4 + 4}
CHUNKED_LOSS_WGRAD_BYTES = 4
#: Allocator overhead as a fraction of all other bytes, per ``memory_reclaim`` policy. ASSUMPTIONS
#: until measured: the calibration profile overrides them through ``estimate_memory(fragmentation=)``.
#: Ordering rationale: caching allocator without release keeps the most fragmented blocks (none);
#: emptying the cache returns more the more often it runs; expandable segments avoid most
#: fragmentation by growing segments in place (PyTorch CUDA allocator notes).
DEFAULT_FRAGMENTATION: Mapping[str, float] = {
    "none": 0.10,
    "empty_cache_per_step": 0.07,
    "empty_cache_per_microbatch": 0.04,
    "expandable_segments": 0.03,
}


def _gib(x: float) -> float:
    return x / GIB


@dataclass(frozen=True)
class StageMemory:
    """Memory of one pipeline rank (all its virtual chunks), bytes per GPU.

    Attributes:
        stage: pipeline rank, 0 = first.
        num_layers: transformer layers on this rank (summed over its virtual chunks).
        num_inflight_microbatches: micro-batches' worth of the rank's layer activations held at the
            peak, counted from the schedule's order (:func:`inflight_microbatches`; float: interleaved
            1F1B and uneven chunks give fractions, e.g. p + (p - 2r - 1)/v with equal chunks).
        weights_bytes: parameters held at the engine's parameter bytes (FP32 masters or BF16; after
            ZeRO-3 sharding if any).
        grads_bytes: gradients held at the stage's peak instant, at the engine's gradient-buffer bytes
            (after ZeRO-2/3 sharding if any; unsharded under a pipeline that defers FSDP's reduction);
            0 when none exist then (an engine that sets them to None after the step, peaking before
            its first backward).
        optimizer_bytes: optimizer states held (FP32 main params and / or Adam moments, per engine;
            after ZeRO-1/2/3 sharding if any).
        activations_bytes: saved activations of all in-flight micro-batches, including the
            embedding output on the first stage; 0 when the stage peaks at the end of its last
            backward (all gradients, no activations).
        transient_bytes: logits/CE buffer (last stage), one layer's backward working set under full
            recompute, DP gradient buckets, ZeRO-3 gathered layer parameters, SP all-gather buffer.
        allocator_overhead_bytes: fragmentation fraction x the sum of all other terms.
    """

    stage: int
    num_layers: int
    num_inflight_microbatches: float
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    transient_bytes: int
    allocator_overhead_bytes: int

    @property
    def model_state_bytes(self) -> int:
        """weights + grads + optimizer, bytes."""
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> int:
        """Every term summed, bytes: the stage's predicted peak allocation per GPU."""
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes
                + self.transient_bytes + self.allocator_overhead_bytes)


#: Terms of :class:`StageMemory` in the order :meth:`MemoryEstimate.describe` prints them.
_TERMS = (("weights", "weights_bytes"), ("grads", "grads_bytes"), ("optimizer", "optimizer_bytes"),
          ("activations", "activations_bytes"), ("transient", "transient_bytes"),
          ("allocator", "allocator_overhead_bytes"))


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-stage memory of a plan and the verdict against one GPU's capacity.

    Attributes:
        stages: one :class:`StageMemory` per pipeline rank, rank 0 first.
        capacity_bytes: usable HBM per GPU, bytes (HBM minus CUDA context).
    """

    stages: tuple[StageMemory, ...]
    capacity_bytes: int

    def __post_init__(self) -> None:
        if not self.stages:
            raise ConfigError("a memory estimate needs at least one pipeline stage, got none")

    @property
    def peak_bytes(self) -> int:
        """Largest stage total, bytes (the maximum over stages, never the average)."""
        return max(s.total_bytes for s in self.stages)

    @property
    def peak_stage(self) -> int:
        """Pipeline rank of the largest stage (the first one on ties)."""
        peak = self.peak_bytes
        return next(s.stage for s in self.stages if s.total_bytes == peak)

    @property
    def live_peak_bytes(self) -> int:
        """Largest stage total without the allocator's cached reserve (``allocator_overhead_bytes``), bytes:
        the bytes the plan needs at once."""
        return max(s.total_bytes - s.allocator_overhead_bytes for s in self.stages)

    @property
    def fits(self) -> bool:
        """live_peak_bytes <= capacity_bytes.

        The verdict leaves the allocator's reserve out: it is memory the caching allocator holds in unused
        cached blocks, and before it reports out-of-memory it frees them and retries (PyTorch
        c10/cuda/CUDACachingAllocator.cpp ``DeviceCachingAllocator::malloc``: "Free enough available
        cached blocks to satisfy alloc and retry alloc", then "Free all non-split cached blocks and retry
        alloc"; with expandable segments the unused pages are unmapped). So ``peak_bytes`` is what a run
        with room reserves (the measured reserve fractions: docs/results/contention-h200x1-2026-12-01.md,
        66.7 GiB of 139.8), while a run near capacity reserves little more than it allocates. ASSUMPTION:
        the free remainder of split blocks, which cannot be released, is negligible at capacity. Evidence:
        the four eager 1x H200 plans of docs/fidelity.md (8B at 16 layers) ran at 133.3-137.8 GiB reserved
        on 138.8 usable, predicted 134.8 GiB live and 139.8-142.0 GiB with the reserve."""
        return self.live_peak_bytes <= self.capacity_bytes

    @property
    def headroom_bytes(self) -> int:
        """capacity - live_peak_bytes, bytes (negative when the plan does not fit)."""
        return self.capacity_bytes - self.live_peak_bytes

    def to_dict(self) -> dict[str, Any]:
        """Plain mapping (for Optuna user_attrs / JSON): peak, capacity, fits and every stage's terms."""
        return {"peak_bytes": self.peak_bytes, "peak_stage": self.peak_stage, "live_peak_bytes": self.live_peak_bytes,
                "capacity_bytes": self.capacity_bytes, "fits": self.fits,
                "stages": [dict(asdict(s), total_bytes=s.total_bytes) for s in self.stages]}

    def describe(self) -> str:
        """A table of every term per stage in GiB (2^30 bytes), the capacity and the verdict."""
        head = ["stage", "layers", "in-flight"] + [name for name, _ in _TERMS] + ["total"]
        rows = []
        for s in self.stages:
            rows.append([str(s.stage), str(s.num_layers), f"{s.num_inflight_microbatches:.4g}"]
                        + [f"{_gib(getattr(s, attr)):.2f}" for _, attr in _TERMS]
                        + [f"{_gib(s.total_bytes):.2f}"])
        widths = [max(len(head[i]), *(len(r[i]) for r in rows)) for i in range(len(head))]
        fmt = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
        lines = ["memory per GPU by pipeline stage (GiB; in-flight = peak micro-batches of the stage's "
                 "layer activations held, counted from the schedule's order: forwards - backwards per "
                 "chunk, weighted by chunk layers)",
                 fmt(head), fmt(["-" * w for w in widths])]
        lines += [fmt(r) for r in rows]
        if any(s.grads_bytes == 0 and s.activations_bytes > 0 and s.weights_bytes > 0 for s in self.stages):
            lines.append("grads 0.00: no gradients exist at that peak (set to None after the last step; every "
                         "forward of the stage runs before its first backward)")
        if any(s.activations_bytes == 0 and s.grads_bytes > 0 and s.num_layers > 0 for s in self.stages):
            lines.append("activations 0.00: that stage peaks at the end of its last backward (all gradients, "
                         "no activations left)")
        peak = self.peak_bytes
        lines.append(f"peak: {_gib(peak):.2f} GiB on stage {self.peak_stage}; "
                     f"capacity (usable HBM): {_gib(self.capacity_bytes):.2f} GiB")
        if self.fits:
            lines.append(f"verdict: fits ({_gib(self.headroom_bytes):.2f} GiB headroom without the allocator's "
                         "cached reserve)")
            if peak > self.capacity_bytes:
                lines.append(f"the peak with the reserve ({_gib(peak):.2f} GiB) is above capacity: the caching "
                             "allocator frees its unused cached blocks and retries before it runs out, so the "
                             f"run reserves about {_gib(self.live_peak_bytes):.2f} GiB")
        else:
            lines.append(f"verdict: does NOT fit (over by {_gib(-self.headroom_bytes):.2f} GiB even without the "
                         "allocator's cached reserve)")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- activations
def inflight_microbatches(plan: Plan, stage: int,
                          layers_per_virtual_stage: Sequence[int] | None = None) -> float:
    """Micro-batches' worth of activations pipeline rank ``stage`` holds at its peak.

    Counted from the schedule the step graph runs (:func:`autotune.cost.schedule.count_inflight` over
    :func:`autotune.cost.schedule.schedule_order`): the peak over the step of sum over the rank's chunks of
    (forwards done - backwards done) x chunk layers / rank layers. With p = pp_degree, m =
    num_micro_batches, v = chunks per rank, rank r:

    * p = 1: 1 (gradient accumulation frees each micro-batch's activations after its backward);
    * GPipe (Huang et al. 2019): all m forwards run before any backward, so m;
    * 1F1B (Narayanan et al. 2021, Sec. 2.2.1): stage r warms up with p - r - 1 forwards, so
      min(p - r, m);
    * interleaved 1F1B (same paper, Sec. 2.2.2): (p - r - 1) x 2 + (v - 1) p warm-up chunk-forwards
      plus the first steady one; with equal chunks and m v >= that many, p + (p - 2r - 1)/v, which for
      r = 0 is Korthikanti et al. 2022 (arXiv 2205.05198, Sec. 4.2.3)'s p (1 + (p - 1)/(p v)); uneven
      chunks (``layers_per_virtual_stage``, e.g. Llama 3's empty first and last chunks) weigh their
      layers, so the count can grow in the steady phase.

    Args:
        plan: the parallelism plan; stage: pipeline rank 0 .. p-1.
        layers_per_virtual_stage: layers of every virtual stage in model order
            (``plan.layers_per_virtual_stage(model.num_layers)``); default equal chunks.

    Raises:
        PlanError: stage outside 0 .. p-1, or a layer split of the wrong length.
    """
    return count_inflight(plan, stage, chunk_layers=layers_per_virtual_stage).num_inflight_microbatches


# ----------------------------------------------------------------------------- estimate
#: suffix of a fragmentation key measured with full activation recomputation (``none+full_recompute``):
#: recomputation frees and re-allocates every layer's activations inside backward, which leaves the caching
#: allocator more cached blocks than plain training (docs/results/contention-h200x1-2026-12-01.md)
FULL_RECOMPUTE_SUFFIX = "+full_recompute"


#: the keys a fragmentation mapping may have: a policy, or a policy + :data:`FULL_RECOMPUTE_SUFFIX`
_FRAGMENTATION_KEYS = frozenset(MEMORY_RECLAIM_POLICIES) | {k + FULL_RECOMPUTE_SUFFIX for k in MEMORY_RECLAIM_POLICIES}


def _fragmentation_fraction(policy: str, fragmentation: Mapping[str, float] | None,
                            full_recompute: bool = False) -> float:
    """The allocator's fraction for ``policy``: ``<policy>+full_recompute`` when the plan fully recomputes
    and the mapping has that key, else ``<policy>``, else :data:`DEFAULT_FRAGMENTATION`."""
    if fragmentation is not None:
        unknown = sorted(set(fragmentation) - _FRAGMENTATION_KEYS)
        if unknown:
            raise ConfigError(f"fragmentation has unknown memory_reclaim policies {unknown}; valid: "
                              f"{', '.join(MEMORY_RECLAIM_POLICIES)} (each optionally with {FULL_RECOMPUTE_SUFFIX})")
        for key in ((policy + FULL_RECOMPUTE_SUFFIX, policy) if full_recompute else (policy,)):
            if key in fragmentation:
                v = fragmentation[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
                    raise ConfigError(f"fragmentation[{key!r}]={v!r} must be a fraction in [0, 1)")
                return float(v)
    return DEFAULT_FRAGMENTATION[policy]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@functools.lru_cache(maxsize=4096)
def _rank_counts(p: int, v: int, m: int, schedule: str, per_virtual: tuple[int, ...]) -> tuple[InflightCount, ...]:
    """:func:`count_inflight` of every rank of a plan with these pp, effective vpp, micro-batches, schedule
    and layer split (what it reads of the plan), cached: a search asks the same ones for every ZeRO stage,
    recomputation, precision and bucket of a layout."""
    plan = Plan(pp_degree=p, vpp_degree=v, num_micro_batches=m, pipeline_schedule=schedule)
    return tuple(count_inflight(plan, r, chunk_layers=per_virtual) for r in range(p))


#: :func:`_rank_counts` with each chunk weighed by its bytes per micro-batch (``chunk_layers`` = the plan's
#: ``chunk_act``: partial recompute, or a mixture of experts' dense and MoE layers), cached apart so the
#: many weighings of a search do not push the layer counts out of :func:`_rank_counts`' cache
_weighed_rank_counts = functools.lru_cache(maxsize=16384)(_rank_counts.__wrapped__)


@functools.lru_cache(maxsize=4096)
def _moe_kinds(model: ModelSpec, kinds: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """(dense, MoE) layers of every virtual stage (:func:`autotune.cost.moe.chunk_layer_kinds`) with the
    multi-token-prediction layers on the last one, of the last main layer's type; cached (a search asks the same
    split for every setting of a layout)."""
    out = list(kinds)
    if model.mtp_num_layers:
        nd, nm = out[-1]
        d = model.mtp_num_layers
        out[-1] = (nd, nm + d) if moe.mtp_layer_is_moe(model) else (nd + d, nm)
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _moe_rank_params(model: ModelSpec, kinds: tuple[tuple[int, int], ...], p: int, t: int,
                     ep_etp: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per pipeline rank of an MoE model with ``kinds`` (:func:`_moe_kinds`) over ``p`` ranks: (the dense layers'
    and the MoE layers' non-expert parameters over TP ``t``, with each MTP depth's norms and projection on the
    rank of the last stage; the routed experts' parameters over EP x ETP = ``ep_etp``); cached."""
    h = model.hidden_size
    dense_layer = moe.dense_layer_params(model)
    moe_dense = moe.dense_params_of_moe_layer(model)
    expert_layer = moe.expert_params_per_layer(model) // ep_etp
    mtp_extra = model.mtp_num_layers * (2 * h * h + 3 * h)
    rank_dense = [0] * p
    expert_per_rank = [0] * p
    for vs, (nd, nm) in enumerate(kinds):
        r = vs % p
        rank_dense[r] += _ceil_div(nd * dense_layer + nm * moe_dense, t)
        expert_per_rank[r] += nm * expert_layer
    rank_dense[(len(kinds) - 1) % p] += _ceil_div(mtp_extra, t)
    return tuple(rank_dense), tuple(expert_per_rank)


def offload_layer_bytes(model: ModelSpec, plan: Plan, workload: Workload, engine: EngineProfile | str | None,
                        dense_layer_bytes: int | None = None) -> tuple[int, ...]:
    """Saved-activation bytes per micro-batch of each transformer layer of a one-stage plan (pp 1), in
    model order: what CPU activation offloading (``Plan.cpu_offload_layers``) copies to the host for each
    of the first N layers. A dense layer holds its no-recompute bytes (``dense_layer_bytes`` if given,
    else :func:`_compiled_layer_bytes` of :func:`_layer_activation_terms`); an MoE model's dense and MoE
    layers (:func:`autotune.cost.moe.is_moe_layer`) their own (:func:`moe_layer_bytes`). Shape:
    (model.num_layers,), bytes."""
    eng = engine_for_plan(engine, plan)
    if dense_layer_bytes is None:
        dense_layer_bytes = _compiled_layer_bytes(sum(_layer_activation_terms(model, plan, workload, eng).values()),
                                                  plan, eng)
    if not model.is_moe:
        return (dense_layer_bytes,) * model.num_layers
    dense_b, moe_b = moe_layer_bytes(model, plan, workload, eng)
    return tuple(moe_b if moe.is_moe_layer(model, i) else dense_b for i in range(model.num_layers))


def offload_kept_bytes(model: ModelSpec, plan: Plan, workload: Workload, engine: EngineProfile | str | None,
                       dense_layer_bytes: int | None = None) -> int:
    """Saved-activation bytes per micro-batch a one-stage plan keeps on the GPU at its peak under
    ``Plan.cpu_offload_layers`` N: those of layers N..L-1 (:func:`offload_layer_bytes`; Transformer Engine's
    schedule, transformer_engine/pytorch/cpu_offload.py ``_default_offload_sync_init``: peak (L - N) x T for
    layers of T bytes each), bytes."""
    per = offload_layer_bytes(model, plan, workload, engine, dense_layer_bytes)
    return sum(per[plan.cpu_offload_layers:])


def estimate_memory(model: ModelSpec, plan: Plan, gpu: GPUSpec, workload: Workload, *,
                    fragmentation: Mapping[str, float] | None = None,
                    engine: EngineProfile | str | None = "native") -> MemoryEstimate:
    """Bytes per GPU on every pipeline rank of ``plan`` during one training step.

    Rank r of p holds the virtual stages r, r + p, r + 2p, ... of
    ``plan.layers_per_virtual_stage(model.num_layers)``. Per rank (module docstring for sources):

    * parameters N_r = layers_r x params_per_layer / t, + ceil(V / t) h on rank 0 (vocab-parallel input
      embedding), + ceil(V / t) h + h on rank p-1 (LM head + final RMSNorm; a tied model still holds
      the shared matrix on both end ranks, once when p = 1);
    * weights 4 N_r, grads 4 N_r, optimizer 8 N_r bytes; with g = dp x cp, ZeRO stage >= 1 divides the
      optimizer term by g, >= 2 also the grads and the (FP32, at rest) weights (ceil to whole elements);
    * activations at the rank's peak instant of the schedule (:func:`autotune.cost.schedule.count_inflight`
      over the order the step graph runs): sum over chunks c of a_c x layers_c x
      :func:`activation_bytes_per_layer`, + on rank 0 a_0 x the embedding output 2sbh (/t with SP),
      a_c = forwards - backwards of chunk c done; the instant maximises the rank's activations plus
      its in-flight logits (below). Every chunk holds min(p - r, m) under 1F1B, m under GPipe, 1 when p = 1;
    * transient = last rank: logits s b ceil(V/t) x 12 bytes (FP32 loss, :data:`LOGITS_BYTES_PER_ELEMENT`;
      an engine with its own loss: ``loss_bytes_per_logit`` of its facts, Megatron-LM 6, and
      ``loss_inflight_bytes_per_logit`` for the other in-flight micro-batches, Megatron-LM 4, no kept output;
      a compiled loss: 4 and no separate kept output, :data:`COMPILED_LOSS_BYTES_PER_LOGIT`),
      with PP (p > 1) + 2 bytes (the kept BF16 stage output) + (a_last - 1) x 6 bytes, a_last the
      micro-batches alive in the rank's last chunk (the last virtual stage) at that instant
      (:data:`PP_INFLIGHT_LOGITS_BYTES`);
      BF16 compute copies of the weights: 2 N_r bytes (ZeRO-3: 2 x the embedding / head parameters of
      the rank only); FP8 through Transformer Engine (:func:`te_fp8`) adds its cached FP8 weight +
      transpose, 2 bytes per linear weight (:func:`te_fp8_weight_copy_bytes`); full recompute: one layer's
      no-recompute activations (the backward working set of one micro-batch; also with
      ``recompute_num_layers`` N >= 1, where each chunk of L_c layers holds min(N, L_c) layers at the
      full-recompute bytes and L_c - min(N, L_c) at the no-recompute bytes, and the schedule walk
      weighs each chunk by those bytes: exact for equal and uneven chunks); g > 1: two DP gradient
      buckets 2 x bucket_size_mib MiB (none when the engine reduces the whole buffer in place without an
      overlapped reduction: ``one_bucket_without_overlap``); ZeRO-3 with g > 1: one layer's gathered bf16 parameters
      2 params_per_layer / t (x2 with param_gather_overlap for the prefetched next layer); SP: the
      all-gathered norm output of one layer, 2sbh. The terms are summed (conservative: not all peak
      at the same instant);
    * allocator overhead = fraction x (all the above), the fraction by ``plan.memory_reclaim`` from
      ``fragmentation`` or :data:`DEFAULT_FRAGMENTATION`; with ZeRO >= 2 and g > 1 plus the
      reduce-scatter stream pool 4 (U + ceil(U / g)) bytes, U = max(layer params / t, the rank's
      embedding + LM head + final norm params).

    Args:
        model: architecture; plan: the parallelism plan; gpu: supplies the capacity
            (``usable_hbm_bytes``); workload: sequence length (global batch is not needed here).
        fragmentation: overrides of the allocator fraction per ``memory_reclaim`` policy (a partial
            mapping is fine; the calibration profile supplies measured values).
        engine: the engine that runs the plan (:mod:`autotune.spec.engines`): its parameter and optimizer
            bytes replace the 4 + 8 above (Megatron-LM: BF16 parameters 2 B + FP32 main param and
            Adam moments 12 B in the (distributed) optimizer, no transient BF16 copy), its gradient
            buffer's bytes the grads' 4 (:attr:`EngineProfile.grad_buffer_bytes`: Megatron's main-grad
            buffer has the DP reduction's dtype), ZeRO-2 shards
            the parameters only where the engine does (FSDP2), and the reduce-scatter stream pool
            exists only for FSDP2 engines.

    Returns:
        :class:`MemoryEstimate` with one :class:`StageMemory` per pipeline rank.

    Raises:
        PlanError: layers do not split over pp x vpp, seq_len not divisible by cp_degree, tp_degree
            not dividing heads/widths.
        ConfigError: a fragmentation key that is not a memory_reclaim policy, or a value outside [0, 1).
    """
    _check_tp(model, plan)
    eng = engine_for_plan(engine, plan)
    frac = _fragmentation_fraction(plan.memory_reclaim, fragmentation, plan.recompute == "full")
    p, t = plan.pp_degree, plan.tp_degree
    g = plan.dp_degree * plan.cp_degree
    z = plan.zero_stage if g > 1 else 0
    h, V = model.hidden_size, model.vocab_size
    s = _seq_per_rank(plan, workload)
    b = plan.micro_batch_size
    sp = plan.sp_active

    # DDP keeps its gradients as bucket views between steps (runtime/parallelize.py: DDP with
    # gradient_as_bucket_view for tp = pp = 1 with an overlapped reduction; zero_grad(set_to_none=False))
    ddp_bucket_views = (z in (0, 1) and g > 1 and t == 1 and p == 1 and plan.dp_grad_reduce_overlap
                        and plan.async_collectives)
    per_virtual = plan.layers_per_virtual_stage(model.num_layers)
    layers_per_rank = [sum(per_virtual[r::p]) for r in range(p)]

    terms = _layer_activation_terms(model, plan, workload, eng)
    full_layer_act = sum(terms.values())
    if plan.recompute == "none":
        layer_act = _compiled_layer_bytes(full_layer_act, plan, eng)
    elif plan.recompute == "selective":
        layer_act = _compiled_layer_bytes(_selective_bytes(terms, eng.selective_recompute, model, plan, workload),
                                          plan, eng)
    else:
        layer_act = _block_input_bytes(terms, plan, eng)
    # partial recompute (Plan.recompute_num_layers = N >= 1, Megatron-LM --recompute-method block): a
    # chunk of L_c layers keeps min(N, L_c) layers at the layer input and the rest at the no-recompute
    # bytes; the schedule count below weighs each chunk by these bytes (exact for uneven chunks too)
    chunk_act: tuple[int, ...] | None = None
    if plan.partial_recompute:
        none_act = _compiled_no_recompute_bytes(full_layer_act, plan, eng)
        chunk_act = tuple(plan.recomputed_layers(lc) * layer_act + (lc - plan.recomputed_layers(lc)) * none_act
                          for lc in per_virtual)
    # a mixture-of-experts model: each chunk weighed by its dense and MoE layers' bytes (the same walk as
    # partial recompute), and its routed experts' parameters kept apart (sharded over EP x ETP, their
    # optimizer states over the expert-DP group)
    expert_per_rank = [0] * p
    if model.is_moe:
        kinds = _moe_kinds(model, moe.chunk_layer_kinds(model, plan))
        dense_b, moe_b = moe_layer_bytes(model, plan, workload, eng)
        if plan.partial_recompute:
            dense_n, moe_n = moe_layer_bytes(model, plan, workload, eng, recompute="none")
            acts = []
            for nd, nm in kinds:
                rc = plan.recomputed_layers(nd + nm)
                rd = min(rc, nd)
                acts.append(rc * layer_act + (nd - rd) * dense_n + (nm - (rc - rd)) * moe_n)
            chunk_act = tuple(acts)
        else:
            chunk_act = tuple(nd * dense_b + nm * moe_b for nd, nm in kinds)
        rank_dense, expert_per_rank = _moe_rank_params(model, kinds, p, t, plan.ep_degree * plan.etp_degree)
    if plan.cpu_offload_layers:
        # CPU activation offloading (Plan.cpu_offload_layers N, pp 1, recompute none): Transformer Engine's
        # schedule frees layer i's saved tensors once its copy to the host is done, at the latest before the
        # forward of layer L - N + i, and reloads it one layer's backward ahead, so the saved activations on
        # the GPU peak at those of L - N layers (transformer_engine/pytorch/cpu_offload.py
        # OffloadSynchronizer._default_offload_sync_init: "peak memory usage of saving activations is
        # (num_layers - num_offloaded_layers) * T"); the first N layers are the offloaded ones
        kept = offload_kept_bytes(model, plan, workload, eng, layer_act)
        chunk_act = (kept,)
    embed_out = _block_input_bytes({"attn_norm_input": BF16_BYTES * s * b * h // (t if sp else 1)}, plan, eng)
    vocab_shard = _ceil_div(V, t)
    layer_params = _ceil_div(model.params_per_layer, t)

    # transient terms common to every rank
    common_transient = 0
    if plan.recompute == "full":
        # one layer's forward re-run in backward keeps what that forward saves (compiled: the
        # compiled saved set, COMPILED_OVER_EAGER at recompute none)
        # (partial recompute too: every chunk with a layer recomputes at least one)
        common_transient += _compiled_no_recompute_bytes(full_layer_act, plan, eng)
    # DP buckets in flight; none staged when the engine reduces the whole gradient buffer in place without
    # an overlapped reduction (Megatron-LM: bucket_size None, facts.yaml one_bucket_without_overlap)
    if g > 1 and not (eng.one_bucket_without_overlap
                      and not (plan.dp_grad_reduce_overlap and plan.async_collectives)):
        common_transient += 2 * plan.bucket_size_mib * MIB
    if z == 3:
        common_transient += BF16_BYTES * layer_params * (2 if plan.param_gather_overlap else 1)
    if sp:
        common_transient += BF16_BYTES * s * b * h
    compiled_loss = bool(getattr(plan, "compile", False)) and eng.compile_loss
    # an engine's own eager loss (Megatron-Core's in-place cross-entropy, facts.yaml loss_bytes_per_logit)
    eager_logit = eng.loss_bytes_per_logit or LOGITS_BYTES_PER_ELEMENT
    eager_inflight = eng.loss_inflight_bytes_per_logit or PP_INFLIGHT_LOGITS_BYTES
    own_loss = bool(eng.loss_bytes_per_logit or eng.loss_inflight_bytes_per_logit)
    logits = s * b * vocab_shard * (COMPILED_LOSS_BYTES_PER_LOGIT if compiled_loss else eager_logit)
    if getattr(plan, "loss_impl", "full") == "chunked":
        from autotune.spec.plan import loss_chunk_tokens
        chunk = loss_chunk_tokens(V, s * b)
        logits = (chunk * V * CHUNKED_LOSS_BYTES_PER_LOGIT[bool(getattr(plan, "compile", False))]
                  + V * h * CHUNKED_LOSS_WGRAD_BYTES + s * b * h * BF16_BYTES)
    head_params = (0 if model.tied_embeddings and p == 1 else vocab_shard * h) + h

    counts = _rank_counts(p, plan.effective_vpp, plan.num_micro_batches, plan.pipeline_schedule,
                          tuple(per_virtual))
    # partial recompute or an MoE model: the same walk with each chunk weighed by its bytes (chunk_act)
    weighed_counts = _weighed_rank_counts(p, plan.effective_vpp, plan.num_micro_batches, plan.pipeline_schedule,
                                          chunk_act) if chunk_act is not None else None
    # TE FP8 recipes' cached weight copies: linear in the layers (te_fp8_weight_copy_bytes), once per call
    fp8_copy_per_layer = te_fp8_weight_copy_bytes(model, plan, 1, eng)
    stages = []
    for r in range(p):
        n = layers_per_rank[r]
        params = n * layer_params if not model.is_moe else rank_dense[r]
        experts = expert_per_rank[r]
        if r == 0:
            params += vocab_shard * h
        if r == p - 1:
            if not (model.tied_embeddings and p == 1):
                params += vocab_shard * h
            params += h
        shard_weights = z == 3 or (z == 2 and eng.shard_params_at_zero2)
        weights = eng.param_bytes * (_ceil_div(params, g) if shard_weights else params)
        grads = eng.grad_buffer_bytes * (_ceil_div(params, g) if z >= 2 else params)
        deferred = eng.pp_defers_fsdp_grad_reduce and p > 1 and z >= 2 and g > 1
        if deferred:
            # torch.distributed.pipelining turns FSDP's gradient sync off for every backward and
            # reduce-scatters after the last (facts.yaml): the rank's gradients accumulate unsharded
            # in the reduction dtype until then
            grads = eng.grad_reduce_bytes * params
        optim = eng.optimizer_bytes * (_ceil_div(params, g) if z >= 1 else params)
        if experts:
            # the routed experts: replicated over the expert-DP group, their optimizer states sharded over it
            # (Megatron-LM's distributed optimizer shards expert parameters over the expert data-parallel
            # group: megatron/core/optimizer/__init__.py ``get_megatron_optimizer``, expert-parallel params)
            edp = plan.expert_dp_degree
            weights += eng.param_bytes * experts
            grads += eng.grad_buffer_bytes * experts
            optim += eng.optimizer_bytes * (_ceil_div(experts, edp) if z >= 1 and edp > 1 else experts)

        # In-flight micro-batches from the schedule's own order (autotune.cost.schedule.count_inflight):
        # each chunk's layers hold their own count, rank 0's embedding output lives with chunk 0's
        # forwards and rank p-1's in-flight logits with its last chunk (the last virtual stage, which
        # holds the LM head); the stage's peak is taken at one instant of the step (peak_points).
        count = counts[r]
        held = count.num_inflight_microbatches
        first_chunk_bytes = embed_out if r == 0 else 0
        per_logit = s * b * vocab_shard
        other_logits_bytes = (per_logit * (COMPILED_LOSS_INFLIGHT_BYTES if compiled_loss else eager_inflight)
                              if r == p - 1 and p > 1 else 0)

        # partial recompute: the same walk with each chunk weighed by its bytes per micro-batch
        # (chunk_act), so the first element of a peak point is bytes, not layers
        weighed = weighed_counts[r] if weighed_counts is not None else count
        unit = 1 if chunk_act is not None else layer_act

        def _held_bytes(pt: tuple[int, int, int]) -> int:
            layers_alive, first_alive, last_alive = pt
            return (layers_alive * unit + first_alive * first_chunk_bytes
                    + max(last_alive - 1, 0) * other_logits_bytes)

        layers_alive, first_alive, last_alive = max(weighed.peak_points, key=_held_bytes)
        acts = layers_alive * unit + first_alive * first_chunk_bytes
        grads_end = grads               # the gradients at the end of the last backward
        if eng.frees_grads_between_steps and not ddp_bucket_views and held >= plan.num_micro_batches:
            # every forward of the step runs before the rank's first backward (one micro-batch, GPipe,
            # or no more micro-batches than the warm-up), and the last step's gradients were set to
            # None: none exist at this peak. Seen on H200 (profile-plans-h200x1-2026-12-01.json, 8B at
            # 16 layers, one micro-batch): peak allocated 144.35 GB = FP32 weights 18.17 + Adam 36.3 +
            # activations and logits, no gradients. The end of the last backward, with every gradient
            # and no activation, is the other candidate peak (below).
            grads = 0
        # BF16 compute copies of FP32 master weights, alive from a micro-batch's forward to its backward:
        # autocast (no FSDP) and ZeRO-2 (FSDP2 without resharding after forward) hold all the rank's
        # parameters; ZeRO-3 holds the root module's (embedding, final norm and LM head: FSDP2 does not
        # reshard the root after forward), the layers' being the gathered-layer term above.
        root = params - (n * layer_params if not model.is_moe else 0)   # embedding / LM head / final norm
        if not eng.bf16_compute_copy:
            copies = 0                            # BF16 parameters are what the kernels read
        elif z == 3 and not deferred:
            copies = BF16_BYTES * root
        else:
            # (ZeRO-3 under a deferring pipeline: set_reshard_after_backward(False) keeps each layer's
            # gathered BF16 parameters from its first backward on, torch/distributed/pipelining/stage.py)
            copies = BF16_BYTES * params
        if eng.activation_accounting == "torchtitan_block" and _torchtitan_block().param_mode(plan) == "autocast":
            # torchtitan under autocast: the BF16 weight casts its matmuls save (measured fraction per layer,
            # torchtitan_block.TORCHTITAN_BLOCK_SAVED; none under full recompute, whose forward keeps only the
            # block input) and the LM head's (a BF16 linear for every precision: filter_fqns ["output"]);
            # the embedding lookup casts nothing
            kept_copies = _torchtitan_block().block_factors(plan)[1] if plan.recompute != "full" else 0.0
            copies = BF16_BYTES * (math.ceil(kept_copies * n * layer_params) + (vocab_shard * h if r == p - 1 else 0))
        # TE FP8 recipes: cached FP8 weight + transpose (ZeRO-3: of the one gathered layer)
        if model.is_moe:
            # TE's FP8 weight + transpose of every linear the rank holds (attention, dense MLPs, experts)
            copies += (TE_FP8_WEIGHT_COPY_BYTES * (params + experts)
                       if te_fp8(plan, eng) and not eng.fp8_param_gather else 0)
        else:
            copies += fp8_copy_per_layer * (min(n, 1) if z == 3 else n)
        if r == p - 1:
            # the current micro-batch's logits buffers; with PP its kept BF16 output (2 bytes) and the
            # other micro-batches alive in the last chunk at the peak, PP_INFLIGHT_LOGITS_BYTES each
            # compiled: in COMPILED_LOSS_BYTES_PER_LOGIT; an engine's own loss: its pipeline keeps the loss
            kept_output = 0 if compiled_loss or own_loss else per_logit * 2
            transient_logits = logits + (kept_output + max(last_alive - 1, 0) * other_logits_bytes
                                         if p > 1 else 0)
        else:
            transient_logits = 0
        transient = common_transient + copies + transient_logits
        subtotal = weights + grads + optim + acts + transient
        if grads != grads_end:
            # the end of the last backward: every gradient exists, the activations and logits are gone,
            # the BF16 copies and buffers are still alive (autocast's cache lives to the end of the
            # autocast region); measured after a step on H200: 72.72 GB = 16 N for the 8B at 16 layers
            end_total = weights + grads_end + optim + common_transient + copies
            if end_total > subtotal:
                grads, acts, transient, subtotal = grads_end, 0, common_transient + copies, end_total
        # FSDP2 reduce-scatters on a stream of its own, and the caching allocator reuses a freed block
        # only on the stream it was allocated for: that stream's pool keeps its peak, the FP32
        # unsharded gradients of the largest FSDP unit plus their shard, while nothing of it is live at
        # the step's peak (start of backward).
        rs_pool = 0
        if z >= 2 and g > 1 and eng.fsdp_stream_pool:
            unit = max(layer_params, root)
            rs_pool = GRAD_BYTES * (unit + _ceil_div(unit, g))
        stages.append(StageMemory(
            stage=r, num_layers=n, num_inflight_microbatches=held, weights_bytes=weights,
            grads_bytes=grads, optimizer_bytes=optim, activations_bytes=acts, transient_bytes=transient,
            allocator_overhead_bytes=math.ceil(frac * subtotal) + rs_pool))
    return MemoryEstimate(stages=tuple(stages), capacity_bytes=gpu.usable_hbm_bytes)

