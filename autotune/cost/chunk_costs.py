"""What one model chunk costs on one rank: GEMMs, attention, memory-bound kernels, the TP/SP, CP and ZeRO-3
collectives inside it and their exposed part (:class:`CostBuilder`, :class:`ChunkCost`), from an
:class:`~autotune.cost.op_costs.OpCosts`. The step graph (:mod:`autotune.cost.graph`) places these costs on
the pipeline schedule. Moved from ``graph.py``; every formula keeps its source there.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from autotune.cost import moe, moe_layer, offload, overlap
from autotune.cost.op_costs import InTrainingCosts, OpCosts
from autotune.cost.topology import place_group, place_pipeline_pair
from autotune.spec.engines import EngineProfile, engine_for_plan
from autotune.spec.hardware import ClusterSpec, LinkSpec
from autotune.spec.models import ModelSpec
from autotune.spec.plan import Plan, Workload, fp8_gemm_dims, loss_chunk_tokens

BF16 = 2  # bytes per element
FP8_PARAM_BYTES = 1  # an FP8 parameter's element (Megatron-LM --fp8-param-gather)
#: A compiled loss's forward + backward time over the eager loss's (``F.cross_entropy(logits.float())``, torchtitan's
#: and the runtime's), measured on H200 (bench/loss_memory.py, docs/results/loss-memory-timing-h200x1-2026-12-01.json;
#: [1 or 2, 8192, 128256] BF16 logits, torch 2.11): 2.805 / 13.627 ms and 5.334 / 26.934 ms, mean 0.202. Applied to the cross-entropy time of an
#: engine that compiles its loss (EngineProfile.compile_loss) under plan.compile; both kernels are
#: memory-bound, so the ratio is used as such on other GPUs (an assumption).
COMPILED_LOSS_TIME_RATIO = 0.202
#: Adam step traffic per parameter of the local shard, bytes: read fp32 master, m, v (12) and the
#: gradient (2 in BF16 or 4 in FP32); write master, m, v (12) and the BF16 parameter copy (2, or none
#: when the FP32 master is the parameter) = 28 either way.
ADAM_BYTES_PER_PARAM = 28
#: (DP reductions move EngineProfile.grad_reduce_bytes per gradient element: autotune/engines/*/facts.yaml.)
#: Mixed precision with FP32 master weights, per parameter and micro-batch (memory-bound, bytes
#: read + written): casting FP32 weights to BF16 for the forward or the BF16 weight gradient back to
#: FP32 moves 4 + 2 = 6 bytes; adding a micro-batch's FP32 gradient into the accumulated one moves
#: 4 + 4 + 4 = 12 (not for the first micro-batch, whose gradient is stored); FSDP2's all-gather
#: copy-out of a BF16 unsharded parameter moves 2 + 2 = 4. Measured on H200 (torch.profiler of the
#: runtime, 8B 4-layer proxy, 1 GPU): 13.7 ms of BF16 weight casts for 4 micro-batches x 1.92 B
#: parameters (46 GB at 3.4 TB/s) and 26.6 ms of FP32 adds (gradient accumulation, 3 x 23 GB).
CAST_BYTES_PER_PARAM = 6
ACCUMULATE_BYTES_PER_PARAM = moe_layer.ACCUMULATE_BYTES_PER_PARAM     # (defined there: its expert term uses it too)
GATHER_COPY_BYTES_PER_PARAM = 4
#: FP8 cast traffic, bytes per element (BF16 source, FP8 destination). Dynamic scaling (torchao
#: ``hp_tensor_to_float8_dynamic``, torchao/float8/float8_scaling_utils.py: amax of the BF16 tensor,
#: then scale + cast) reads the source twice and writes one byte: 2 + 2 + 1. Transformer Engine's
#: delayed scaling takes the scale from the amax history of earlier steps (TE docs, "Using FP8 with
#: Transformer Engine", DelayedScaling), so its cast has no amax pass; TE casts and transposes in one
#: kernel (``fp8_cast_transpose_fused``, transformer_engine/pytorch/module/linear.py), writing both
#: layouts: 2 + 1 + 1. MXFP8 (TE MXFP8BlockScaling) computes each 32-element block's scale inside the
#: cast kernel and writes rowwise and columnwise copies: counted as 2 + 1 + 1 too (1/32 byte of
#: E8M0 scales per copy neglected).
FP8_DYNAMIC_CAST_BYTES = 2 + 2 + 1
FP8_TE_CAST_TRANSPOSE_BYTES = 2 + 1 + 1
#: Transformer Engine's current (per-tensor dynamic) scaling, Megatron-LM's ``--fp8-recipe tensorwise``
#: (megatron/core/fp8_utils.py get_fp8_recipe -> Float8CurrentScaling): the quantizer first reduces the
#: amax of the BF16 tensor (one read), then casts and transposes in one kernel writing both FP8
#: layouts (TE docs/features/low_precision_training/fp8_current_scaling/fp8_current_scaling.rst,
#: "Performance analysis": quantization "requires reading the tensor twice"; the quantizer is
#: transformer_engine/pytorch/tensor/float8_tensor.py Float8CurrentScalingQuantizer): 2 + 2 + 1 + 1.
FP8_TE_CURRENT_SCALING_BYTES = 2 + 2 + 1 + 1
#: graph-size cap, not a hardware figure: DP buckets of a chunk are merged into at most this many nodes
#: (each keeps its buckets' summed time and readiness point), so a 405B step graph stays small
MAX_DP_GROUPS_PER_CHUNK = 8
STREAM_EDGE = {"kind": "stream", "delay_ms": 0.0}   # shared source dict; networkx copies it per edge


@dataclass
class ChunkCost:
    """Per-micro-batch cost of one model chunk on one rank, ms (``parts`` split by breakdown key)."""

    fwd_parts: dict[str, float] = field(default_factory=dict)
    bwd_parts: dict[str, float] = field(default_factory=dict)
    fwd_flops: float = 0.0
    params: int = 0             # parameters of the chunk on this rank (after TP)
    fp8_params: int = 0         # of which FP8 parameters (EngineProfile.fp8_param_gather), 1 byte each
    #: routed-expert parameters of the chunk on this rank (after EP x ETP), not in ``params``: their
    #: gradients are reduced and their optimizer states sharded over the expert-DP group
    expert_params: int = 0
    #: communication an overlap hides per micro-batch (forward + backward, TP, CP and per-layer FSDP
    #: gathers / reduce-scatters), ms: what exposing every overlap would add
    hidden_ms: float = 0.0

    @property
    def fwd_ms(self) -> float:
        return sum(self.fwd_parts.values())

    @property
    def bwd_ms(self) -> float:
        return sum(self.bwd_parts.values())


def _add(d: dict[str, float], key: str, v: float) -> None:
    if v:
        d[key] = d.get(key, 0.0) + v


def group_link(cluster: ClusterSpec, extent: int) -> LinkSpec:
    """The slowest link a process group spanning ``extent`` consecutive global ranks crosses: the
    intra-node tier if the extent fits in one NVLink domain, else one member's inter-node NIC path
    (bandwidth x the GPU's NIC share, :attr:`autotune.spec.hardware.FabricSpec.nics_per_gpu`).

    Kept for callers that want one link; the step graph costs collectives from the group's placement
    (:func:`autotune.cost.topology.place_group`, :meth:`autotune.cost.calibration.OpCosts.placed_collective_ms`).
    """
    if extent <= cluster.nvlink_domain_size or cluster.fabric.inter_node is None:
        return cluster.fabric.intra_node
    inter, share = cluster.fabric.inter_node, cluster.fabric.nics_per_gpu
    return inter if share == 1.0 else replace(inter, name=f"{inter.name}x{share:g}",
                                              bandwidth_gbs=inter.bandwidth_gbs * share)


#: the plan fields one dense layer's cost depends on (``CostBuilder.__init__`` / ``_layer_cost``: TP / CP groups, tokens
#: per micro-batch, micro-batch count, precision, SP, overlaps, compile, recomputation, the engine options a plan
#: can switch); an MoE layer's also on the expert layout (LAYER_FIELDS)
DENSE_LAYER_FIELDS = ("tp_degree", "cp_degree", "micro_batch_size", "num_micro_batches", "precision", "sp_active",
                      "async_collectives", "tp_comm_overlap", "compile", "recompute", "recompute_num_layers",
                      "grad_reduce_in_bf16", "fp8_param_gather", "recompute_modules")
LAYER_FIELDS = DENSE_LAYER_FIELDS + moe.MOE_LAYER_FIELDS


class CostBuilder:
    """Computes per-chunk costs of a plan from an :class:`OpCosts`. Pure arithmetic, cached per plan.

    ``memo`` (optional, keyword): a dict shared by the builders of one (model, cluster, workload, costs,
    engine), e.g. a search screening thousands of plans of one target. One layer's costs
    (:meth:`_layer_cost` and the attributes it sets) are kept there per :data:`LAYER_FIELDS` of the plan,
    and group placements per (size, stride): the same numbers, computed once
    (tests/search/test_lazy_ranking.py compares memoised builders with fresh ones).
    """

    def __init__(self, *, model: ModelSpec, plan: Plan, cluster: ClusterSpec, workload: Workload,
                 costs: OpCosts, engine: EngineProfile | str | None = "native",
                 memo: dict[Any, Any] | None = None) -> None:
        self.m, self.p, self.c, self.w = model, plan, cluster, workload
        self.engine = engine_for_plan(engine, plan)
        # kernel times as measured inside training steps (calibration ``in_training``): GEMM and attention
        # at the compiled-step rate under torch.compile or when the engine fuses the layers'
        # memory-bound kernels (a dense kernel stream either way), else at the eager-step rate
        dense = plan.compile or self.engine.fuses("rmsnorm")
        self.costs = costs if isinstance(costs, InTrainingCosts) else InTrainingCosts.of(costs, dense, memo)
        self.grad_reduce_bytes = self.engine.grad_reduce_bytes
        # torch.distributed.pipelining + FSDP: one reduce-scatter per step, after all backwards, synced
        # to the compute stream (stage.py perform_reduce_grad: _root_post_backward_final_callback)
        self.deferred_rs = (self.engine.pp_defers_fsdp_grad_reduce and plan.pp_degree > 1
                            and plan.zero_stage >= 2)
        self.fp8_params = (self.engine.fp8_param_gather and self.engine.fp8_library == "transformer_engine"
                           and getattr(plan, "precision", "bf16") != "bf16")
        t, cp = plan.tp_degree, plan.cp_degree
        self.tokens = plan.micro_batch_size * workload.seq_len // cp       # T: tokens per rank per mb
        # process groups in Megatron-LM rank order (TP, CP, DP, PP; autotune.cost.topology): TP stride 1,
        # CP stride tp, DP x CP (ZeRO shards and DP reductions) stride tp, the slowest PP stage pair
        def placed(kind: str, size: int, stride: int) -> Any:
            fn = place_group if kind == "group" else place_pipeline_pair
            if memo is None:
                return fn(cluster, size, stride)
            key = ("place", kind, size, stride)
            got = memo.get(key)
            if got is None:
                got = memo[key] = fn(cluster, size, stride)
            return got

        self.tp_place = placed("group", t, 1)
        self.cp_place = placed("group", cp, t)
        self.dp_group = plan.dp_degree * cp
        self.dp_place = placed("group", self.dp_group, t)
        self.pp_place = placed("pair", plan.pp_degree, t * cp * plan.dp_degree)
        # the slowest link of each group (kept for code that wants one link)
        self.tp_link = self.tp_place.bottleneck_link
        self.cp_link = self.cp_place.bottleneck_link
        self.dp_link = self.dp_place.bottleneck_link
        self.pp_link = self.pp_place.bottleneck_link
        self.slowdown = costs.overlap_slowdown()
        #: FP8 cast time per layer per micro-batch, (forward, backward) ms (in the ``compute`` parts)
        self.quantize_ms: tuple[float, float] = (0.0, 0.0)
        #: one layer's full-recompute backward additions per micro-batch, ms by part (recompute, its
        #: exposed TP / CP communication); empty unless ``recompute: full``
        self.full_recompute_parts: dict[str, float] = {}
        # a dense layer's costs per DENSE_LAYER_FIELDS, an MoE layer's per LAYER_FIELDS (memoised apart)
        lkey = ("layer",) + tuple(getattr(plan, f) for f in DENSE_LAYER_FIELDS) if memo is not None else None
        got = memo.get(lkey) if memo is not None else None
        if got is None:
            self._layer = self._layer_cost()
            got = (self._layer, self.quantize_ms, self.hidden_fwd, self.hidden_bwd, self.full_recompute_parts)
            if memo is not None:
                memo[lkey] = got
        # read only after this: chunk_cost copies what it adds up
        self._layer, self.quantize_ms, self.hidden_fwd, self.hidden_bwd, self.full_recompute_parts = got
        # an MoE layer's (parts, hidden fwd, hidden bwd, full-recompute parts), its expert groups; None when dense
        self._moe_state = moe_layer.moe_layer_state(self, memo, got, placed, lkey) if model.is_moe else None

    def fp8_cast_bytes(self, gemms: list[tuple[int, int, int]]) -> tuple[float, float]:
        """Bytes the FP8 casts of one layer's linears move per micro-batch, (forward, backward).

        Each linear computes Y = X W with X (T x K), W (K x N), per rank; dY is (T x N). What runs the
        casts is the engine's ``fp8_library`` (autotune/engines/<engine>/facts.yaml), not the recipe alone:

        * torchao's ``fp8_tensorwise`` / ``fp8_rowwise`` (torchao ``matmul_with_hp_or_float8_args``,
          torchao/float8/float8_linear.py: saves the BF16 X and W and re-casts in backward): forward
          casts X and W; backward casts dY twice (row-major for dgrad, transposed for wgrad), W^T (dgrad)
          and X^T (wgrad); each at :data:`FP8_DYNAMIC_CAST_BYTES` per element.
        * Transformer Engine (``_Linear``, transformer_engine/pytorch/module/linear.py), every recipe, and
          ``fp8_delayed`` / ``mxfp8`` on any engine (the TE-style cast is the model for both):
          forward cast-transposes X (saving X^T in FP8 for wgrad) and W, the weight only on the first
          micro-batch of a step (``is_first_microbatch`` caches the quantized weight workspace; Megatron-LM
          sets it per step: megatron/core/pipeline_parallel/schedules.py ``set_is_first_microbatch``,
          megatron/core/extensions/transformer_engine.py TELinear.forward): x 1/m; backward
          cast-transposes dY. Per element :data:`FP8_TE_CAST_TRANSPOSE_BYTES` for delayed scaling and
          MXFP8, :data:`FP8_TE_CURRENT_SCALING_BYTES` for tensorwise (current scaling: an amax pass first).
        """
        p = self.p
        x = sum(float(T) * K for T, N, K in gemms)
        w = sum(float(K) * N for T, N, K in gemms)
        dy = sum(float(T) * N for T, N, K in gemms)
        te = self.engine.fp8_library == "transformer_engine"
        if p.precision in ("fp8_tensorwise", "fp8_rowwise") and not te:
            b = FP8_DYNAMIC_CAST_BYTES
            return b * (x + w), b * (2 * dy + w + x)
        b = FP8_TE_CURRENT_SCALING_BYTES if p.precision == "fp8_tensorwise" else FP8_TE_CAST_TRANSPOSE_BYTES
        return b * (x + w / p.num_micro_batches), b * dy

    # ---- one transformer layer, one micro-batch, one rank
    def _layer_cost(self, kind: str = "dense") -> tuple[dict[str, float], dict[str, float], float]:
        """One layer's (forward parts, backward parts, forward FLOPs) per micro-batch: a ``dense`` layer, or
        an ``moe`` layer (its attention, shared experts and routed experts: :func:`autotune.cost.moe_layer.moe_parts`)."""
        m, p, costs = self.m, self.p, self.costs
        t, T, h = p.tp_degree, self.tokens, m.hidden_size
        q, kv = m.q_dim, m.kv_dim
        f = m.ffn_hidden_size if kind == "dense" else moe.shared_ffn(m)
        sp = p.sp_active
        gemms = moe.attention_gemms(m, t, T) + moe.mlp_gemms(m, t, T, kind)
        # FP8 (plan.precision): the layers' four linears run FP8 GEMMs forward and backward (torchao
        # Float8Linear and TE Linear quantize dgrad and wgrad too); the LM head stays BF16 (chunk_cost).
        gkw = {"precision": p.precision} if p.fp8 else {}
        gemm_fwd = sum(costs.gemm_ms(a, b, c, **gkw) for a, b, c in gemms)
        gemm_bwd = sum(costs.gemm_ms(a, c, b, backward=True, **gkw) + costs.gemm_ms(c, b, a, backward=True, **gkw)
                       for a, b, c in gemms)
        quant_fwd = quant_bwd = 0.0
        if p.fp8:
            qf, qb = self.fp8_cast_bytes(gemms)
            # the casts run fused under torch.compile or with an engine's fused cast kernels (Transformer
            # Engine's cast-transpose), else as eager PyTorch kernels (torchao without compile)
            fused = p.compile or self.engine.fuses("fp8_cast")
            quant_fwd = costs.quantize_ms(qf, p.precision, fused=fused)
            quant_bwd = costs.quantize_ms(qb, p.precision, fused=fused)
            self.quantize_ms = (quant_fwd, quant_bwd)
        flops = sum(2.0 * a * b * c for a, b, c in gemms)
        heads, kvh = m.num_heads // t, max(1, m.num_kv_heads // t)
        seq = self.w.seq_len
        head_dim, q, kv = moe.attention_widths(m)
        attn_kw = dict(batch=p.micro_batch_size, seq_len=seq, heads=heads, kv_heads=kvh, head_dim=head_dim)
        # the engine's attention kernel (facts.yaml attention_kernel: default dispatch or FlashAttention-2)
        kern = "flex" if m.is_mla and self.engine.mla_flex_attention else self.engine.attention_kernel
        if getattr(p, "attention_backend", "default") == "flash":
            kern = "flash2"     # SDPA's flash backend only (Plan.attention_backend): the profile's flash2 table
        aw = moe.attention_work_fraction(m, seq)     # sliding-window layers: the kernel's share of causal work
        attn_fwd, attn_bwd = (costs.attention_kernel_ms(kern, **attn_kw, backward=b) * aw / p.cp_degree for b in (0, 1))
        flops += 2.0 * p.micro_batch_size * seq * seq * head_dim * heads * aw / p.cp_degree
        # memory-bound bytes per token, forward: 2 RMSNorms (r/w h) 8h, 2 residual adds (r 2h, w h) 12h
        # -> 20h bytes (over T/t tokens with SP); RoPE on q, k: r/w 4(q+kv)/t; SwiGLU r 2f w f: 6f/t
        # (plain GeLU r f w f: 4f/t). Backward moves about twice the forward bytes.
        act_bytes = (6 if m.gated_mlp else 4) * f / t
        hdiv = t if sp else 1
        # torch.compile (plan.compile) or an engine's fused kernel: the same bytes at the profile's
        # compiled bandwidths, when measured (_memory_bound_ms)
        mb = self._memory_bound_ms
        mem_fwd = (mb(T * 8 * h / hdiv, "rmsnorm")                  # 2 RMSNorms
                   + mb(T * 12 * h / hdiv, None, "residual")        # 2 residual adds
                   + mb(T * 4 * (q + kv) / t, "rope")               # RoPE on q, k
                   + mb(T * act_bytes, "swiglu"))                   # SwiGLU / GeLU
        mem_bwd = 2 * mem_fwd
        mem_fwd += quant_fwd
        mem_bwd += quant_bwd

        fwd: dict[str, float] = {}
        bwd: dict[str, float] = {}
        _add(fwd, "compute", gemm_fwd + attn_fwd + mem_fwd)
        _add(bwd, "compute", gemm_bwd + attn_bwd + mem_bwd)
        #: communication an overlap hides per micro-batch, ms by kind (``tp``, ``cp``): what the step would
        #: add with every overlap exposed (StepResult.details['step_time_exposed_ms'])
        self.hidden_fwd: dict[str, float] = {}
        self.hidden_bwd: dict[str, float] = {}
        # TP / SP collectives (Megatron-LM, Shoeybi et al. 2019 Sec. 3; Korthikanti et al. 2022 Sec. 4.2.2):
        # 2 all-reduces of T x h per layer forward and 2 backward; with SP each is an all-gather plus a
        # reduce-scatter of the same total size.
        tp_fwd = tp_bwd = 0.0
        if t > 1:
            nbytes = T * h * BF16
            if sp:
                ag = costs.placed_collective_ms("all_gather", nbytes, self.tp_place)
                rs = costs.placed_collective_ms("reduce_scatter", nbytes, self.tp_place)
                # forward all-gathers in FP8 where the engine quantizes before gathering (fp8_tp_all_gather)
                ag8 = costs.placed_collective_ms("all_gather", T * h, self.tp_place)
                ag_fwd = ag8 if p.precision in self.engine.fp8_tp_all_gather else ag
                # and the backward all-gathers of dY where it quantizes dY first (fp8_tp_grad_all_gather)
                ag_bwd = ag8 if p.precision in self.engine.fp8_tp_grad_all_gather else ag
                one = ag + rs
            else:
                one = costs.placed_collective_ms("all_reduce", nbytes, self.tp_place)
            tp_fwd = tp_bwd = 2 * one
            if sp:
                tp_fwd = 2 * (ag_fwd + rs)
                tp_bwd = 2 * (ag_bwd + rs)
        # CP (ring attention; Liu et al. 2023; Megatron-LM context parallel): K and V of every other
        # CP rank pass through each rank in forward; backward passes K, V and dK, dV (2x).
        # The engine decides the exchange: an all-gather of every rank's K/V (torch context_parallel's
        # allgather rotation; the Llama 3 paper's CP, Sec. 3.3.2) or a ring of cp - 1 send/recv steps of
        # one K/V block each (Megatron-LM --cp-comm-type p2p, Transformer Engine's ring attention).
        cp_fwd = cp_bwd = 0.0
        cp_step = 0.0
        if p.cp_degree > 1:
            block = T * moe.cp_exchange_width(m, t, kv) * BF16
            if self.engine.cp_comm == "p2p":
                cp_step = costs.placed_collective_ms("send_recv", block, self.cp_place)
                cp_fwd = (p.cp_degree - 1) * cp_step
            else:
                cp_fwd = costs.placed_collective_ms("all_gather", p.cp_degree * block, self.cp_place)
            cp_bwd = 2 * cp_fwd
        # (the overlap mechanisms chunk the four GEMMs of a standard layer: QKV, proj, fc1, fc2)
        overlap_tp = bool(tp_fwd) and p.async_collectives and p.tp_comm_overlap and len(gemms) == 4
        if overlap_tp and sp:
            # the mechanism of the engine's overlap (autotune.cost.overlap): per-GEMM chunking and contention
            fx, fe, bx, be = overlap.tp_layer_overlap(self, gemms, gkw, ag_fwd, ag, rs, gemm_fwd, gemm_bwd, ag_bwd)
            _add(fwd, "compute", fx)
            _add(fwd, "exposed_tp_comm", fe)
            _add(bwd, "compute", bx)
            _add(bwd, "exposed_tp_comm", be)
            regather = 2 * ag if self.engine.sp_regathers_input_for_wgrad else 0.0
            self.hidden_fwd["tp"] = max(0.0, tp_fwd - fe)
            self.hidden_bwd["tp"] = max(0.0, tp_bwd + regather - be)
        elif overlap_tp:
            # TP overlap without SP (all-reduces): the chunked GEMM/collective pipelining hides the
            # all-reduce behind its GEMM, slowed by the measured collective contention
            for parts, hid, tp_ms, gemm_ms in ((fwd, self.hidden_fwd, tp_fwd, gemm_fwd), (bwd, self.hidden_bwd, tp_bwd, gemm_bwd)):
                hidden = min(tp_ms, gemm_ms)
                _add(parts, "exposed_tp_comm", tp_ms - hidden)
                _add(parts, "compute", self.slowdown * hidden)
                hid["tp"] = hidden
        else:
            _add(fwd, "exposed_tp_comm", tp_fwd)
            _add(bwd, "exposed_tp_comm", tp_bwd)
        if cp_fwd:
            if not p.async_collectives:
                _add(fwd, "exposed_cp_comm", cp_fwd)
                _add(bwd, "exposed_cp_comm", cp_bwd)
            elif self.engine.cp_comm == "p2p":
                # a K/V ring: each step's transfer beside the previous step's attention (load-balanced
                # causal chunks: every step does the same work), contention as for NCCL kernels
                n = p.cp_degree
                for parts, hid, attn_ms, step, handoff, total in (
                        (fwd, self.hidden_fwd, attn_fwd, cp_step, False, cp_fwd),
                        (bwd, self.hidden_bwd, attn_bwd, 2 * cp_step, True, cp_bwd)):
                    _, exposed = overlap.ring_attention(attn_ms / n, n, step, final_handoff=handoff)
                    _add(parts, "exposed_cp_comm", exposed)
                    hidden = max(0.0, total - exposed)
                    _add(parts, "compute", self.slowdown * hidden)
                    hid["cp"] = hidden
            else:
                # an all-gather of K/V hidden only behind the first (local) block's attention
                n = p.cp_degree
                for parts, hid, attn_ms, total in ((fwd, self.hidden_fwd, attn_fwd, cp_fwd),
                                                   (bwd, self.hidden_bwd, attn_bwd, cp_bwd)):
                    _, exposed = overlap.gathered_attention(attn_ms / n, total)
                    _add(parts, "exposed_cp_comm", exposed)
                    hidden = total - exposed
                    _add(parts, "compute", self.slowdown * hidden)
                    hid["cp"] = hidden
        moe_fwd_ms = 0.0
        if kind == "moe":
            moe_fwd_ms, moe_flops = moe_layer.moe_parts(self, fwd, bwd, gkw)
            flops += moe_flops
        # recomputation happens in the backward pass
        if p.recompute == "full":
            # one layer's forward re-run and its exposed TP / CP communication; with
            # recompute_num_layers N >= 1 only min(N, L_c) layers of a chunk pay it (chunk_cost)
            rc: dict[str, float] = {}
            _add(rc, "recompute", gemm_fwd + attn_fwd + mem_fwd + moe_fwd_ms)
            _add(rc, "exposed_tp_comm", fwd.get("exposed_tp_comm", 0.0))
            _add(rc, "exposed_cp_comm", fwd.get("exposed_cp_comm", 0.0))
            if fwd.get("exposed_ep_comm"):
                _add(rc, "exposed_ep_comm", fwd["exposed_ep_comm"])
            self.full_recompute_parts = rc
            if not p.partial_recompute:
                for k, v in rc.items():
                    _add(bwd, k, v)
        elif p.recompute == "selective" and p.recompute_modules is not None:
            _add(bwd, "recompute", moe_layer.module_recompute_ms(
                self, p.recompute_modules, gemms, gkw, attn_fwd, act_bytes, moe_fwd_ms, kind))
        elif p.recompute == "selective":
            mode = self.engine.selective_recompute
            if mode == "core_attention":
                # Megatron-LM --recompute-granularity selective, --recompute-modules [core_attn]
                _add(bwd, "recompute", attn_fwd)
            elif mode == "every_second_mm":
                # torchtitan's op-level SAC (distributed/activation_checkpoint.py): attention and the odd
                # mm of each block saved; the 2nd, 4th and 6th of wq, wk, wv, wo, w1, w3, w2 (wk, wo, w3)
                # and every elementwise op of the block are recomputed
                second = [(T, kv // t, h), (T, h, q // t), (T, f // t, h)]
                _add(bwd, "recompute", sum(costs.gemm_ms(a, b, c, precision=p.precision) for a, b, c in second)
                     + mem_fwd)
            else:
                _add(bwd, "recompute", attn_fwd + mb(T * act_bytes, "swiglu"))
        return fwd, bwd, flops

    def _memory_bound_ms(self, nbytes: float, op: str | None, compiled_op: str | None = None) -> float:
        """A memory-bound kernel of the layer moving ``nbytes``, ms.

        * ``plan.compile``: the profile's measured torch.compile bandwidth for the op
          (``memory_bound_ops_compiled[compiled_op or op]``, H200 2026-12-01), when it has one;
        * a kernel the engine fuses (Transformer Engine's fused RoPE / SwiGLU / RMSNorm,
          :attr:`EngineProfile.fused_kernels`): the same measured fused-kernel bandwidth (a fused kernel
          for that op, as torch.compile generates it; no TE on the measuring image), else at least the
          profile's generic elementwise bandwidth, never the eager kernel's own when that is slower (an
          eager RoPE reaches ~350 GB/s on H200);
        * else the eager kernel's measured bandwidth.
        """
        eager = self.costs.memory_bound_ms(nbytes, op)
        key = compiled_op or op
        fused = key is not None and self.engine.fuses(key)
        if (self.p.compile or fused) and key:
            v = self.costs.memory_bound_compiled_ms(nbytes, key)
            if v is not None:
                return v if self.p.compile else min(v, eager)
        if fused:                   # no measured fused bandwidth: the generic one, at the fused in-training rate
            generic = self.costs.inner.memory_bound_ms(nbytes) * self.costs.k_memory_compiled
            return min(eager, generic)
        return eager

    def chunk_cost(self, vstage: int, num_layers: int) -> ChunkCost:
        """Cost of virtual stage ``vstage`` holding ``num_layers`` layers, per micro-batch.

        With ``recompute: full`` and ``recompute_num_layers`` N >= 1 (Megatron-LM ``--recompute-method
        block``: the first N layers of each chunk, megatron/core/recompute.py ``checkpointed_forward``)
        only min(N, num_layers) layers add the forward re-run and its exposed communication to the
        backward (:attr:`full_recompute_parts`); the others' backward is the no-recompute one.
        """
        m, p, costs = self.m, self.p, self.costs
        t, T, h = p.tp_degree, self.tokens, m.hidden_size
        lf, lb, lflops = self._layer
        cc = ChunkCost()
        last = vstage == p.num_virtual_stages - 1 if p.pipeline_schedule == "interleaved_1f1b" \
            else vstage == p.pp_degree - 1
        # dense and MoE layers of this chunk, multi-token-prediction layers included (autotune.cost.moe_layer)
        n_dense, n_moe, n_mtp = (num_layers, 0, 0) if self._moe_state is None else \
            moe_layer.chunk_kinds(self, vstage, num_layers, last)
        for k, v in lf.items():
            _add(cc.fwd_parts, k, v * n_dense)
        for k, v in lb.items():
            _add(cc.bwd_parts, k, v * n_dense)
        hidden_per_layer = sum(self.hidden_fwd.values()) + sum(self.hidden_bwd.values())
        cc.hidden_ms = n_dense * hidden_per_layer
        if n_moe:
            moe_layer.add_moe_layers(self, cc, n_moe)
        n_rc = p.recomputed_layers(num_layers) if p.partial_recompute else (num_layers if p.recompute == "full" else 0)
        rc_dense = min(n_rc, n_dense)       # the first N layers recompute: a chunk's dense layers come first
        if p.partial_recompute:
            for k, v in self.full_recompute_parts.items():
                _add(cc.bwd_parts, k, v * rc_dense)
        if n_moe and n_rc > rc_dense:
            moe_layer.add_moe_recompute(self, cc, n_rc - rc_dense, partial=p.partial_recompute)
        if p.cpu_offload_layers:           # copies to / from the host beside the layers (pp 1: one chunk)
            offload.add_offload_costs(self, cc, n_dense, n_moe)
        # hidden TP / CP communication: each layer's forward and backward, and the forward re-run of the
        # fully recomputed layers
        cc.hidden_ms += rc_dense * sum(self.hidden_fwd.values())
        self._hidden = 0.0
        cc.fwd_flops += lflops * n_dense
        cc.params = num_layers * m.params_per_layer // t        # (an MoE model: moe_layer.chunk_params)
        if self._moe_state is not None:
            moe_layer.chunk_params(self, cc, n_dense, n_moe, n_mtp)
        if self.fp8_params:
            # the layers' linear weights are FP8 parameters (Megatron-LM --fp8-param-gather)
            cc.fp8_params = num_layers * sum(k * n for k, n in fp8_gemm_dims(m, t).values())
        if vstage == 0:                               # embedding lookup (vocab-parallel: + all-reduce)
            _add(cc.fwd_parts, "compute", costs.memory_bound_ms(2 * T * h * BF16))
            _add(cc.bwd_parts, "compute", costs.memory_bound_ms(3 * T * h * BF16))
            if t > 1:
                _add(cc.fwd_parts, "exposed_tp_comm",
                     costs.placed_collective_ms("all_reduce", T * h * BF16, self.tp_place))
            cc.params += m.embedding_params // t
        # the LM head stays BF16 under FP8: torchtitan's float8 converter skips the ``output`` linear and
        # Megatron-LM / TE keep the output layer in BF16 (it is not a TE Linear)
        if last:                                      # final norm, LM head, cross-entropy (vocab-parallel)
            V = m.vocab_size
            mb = self._memory_bound_ms
            ce = mb(T * V / t * 6, "cross_entropy")
            head_gemms = (costs.gemm_ms(T, V // t, h), costs.gemm_ms(T, h, V // t, backward=True)
                          + costs.gemm_ms(h, V // t, T, backward=True))
            if getattr(p, "loss_impl", "full") == "chunked":
                # chunked linear + cross-entropy (TP 1): all three head GEMMs in the forward, one soft-max +
                # gradient pass per chunk (compiled with plan.compile: the compiled loss's measured ratio
                # over the eager loss's forward + backward), the FP32 weight gradient read and written by
                # each chunk's accumulating GEMM after the first, and both stored gradients scaled in backward
                nchunks = -(-T // loss_chunk_tokens(V, T))
                ce2 = 2 * ce * (COMPILED_LOSS_TIME_RATIO if p.compile else 1.0)
                accum = costs.memory_bound_ms(max(nchunks - 1, 0) * V * h * 8)
                _add(cc.fwd_parts, "compute", sum(head_gemms) + ce2 + accum + mb(4 * T * h, "rmsnorm"))
                _add(cc.bwd_parts, "compute", costs.memory_bound_ms(V * h * 8 + T * h * 2 * BF16)
                     + mb(6 * T * h, "rmsnorm"))
            else:
                if p.compile and self.engine.compile_loss:
                    ce *= COMPILED_LOSS_TIME_RATIO         # the compiled loss's fused kernels (measured)
                heads = 1 + n_mtp                     # the main head, and the shared head once per MTP depth
                _add(cc.fwd_parts, "compute", heads * (head_gemms[0] + ce + mb(4 * T * h, "rmsnorm")))
                _add(cc.bwd_parts, "compute", heads * (head_gemms[1] + ce + mb(6 * T * h, "rmsnorm")))
            cc.fwd_flops += (1 + n_mtp) * 2.0 * T * V / t * h
            cc.params += (m.vocab_size * h if not m.tied_embeddings else 0) // t + h
        self._precision_costs(cc)
        # ZeRO-3 / FSDP: parameters all-gathered for each micro-batch's forward and backward, gradients
        # reduce-scattered after each backward (Rajbhandari et al. 2020, Sec. 5.3); ZeRO-2 only the latter.
        # Each FSDP unit (one layer; the chunk's embedding / LM head / norm form its root unit) is one
        # collective, and the chunk's edge units cannot hide behind anything: the forward cannot start
        # before the root and first layer are gathered, and the root's and last layer's gradients are
        # reduce-scattered after the chunk's last backward kernel, so neither has compute beside it. In
        # a backward that holds no LM head the first layer to run is re-gathered with nothing beside it.
        # Without PP only: in a pipeline other micro-batches' work follows on the same stream and hides
        # the edges (not measured here: the fidelity plans hold no PP x FSDP).
        # Measured on H200 (torch.profiler, 2026-11-30): 23 ms of exposed collectives per step of the
        # 8B 4-layer FSDP plan (simulated with this rule: 28 ms), 53 ms for the 70B 2-layer one (66 ms).
        if self.dp_group > 1 and p.zero_stage >= 2:
            layer_unit = m.params_per_layer // t
            edge = min(cc.params, (cc.params - num_layers * layer_unit) + layer_unit) if p.pp_degree == 1 else 0
            place = self.dp_place
            if not self.deferred_rs:           # deferred: end-of-step buckets (dp_bucket_ms)
                rs = costs.placed_collective_ms("reduce_scatter", cc.params * self.grad_reduce_bytes, place)
                rs_edge = costs.placed_collective_ms("reduce_scatter", edge * self.grad_reduce_bytes, place)
                self._overlap(cc.bwd_parts, rs, p.async_collectives and p.dp_grad_reduce_overlap, exposed_ms=rs_edge)
            if p.zero_stage == 3:
                ag = costs.placed_collective_ms("all_gather", cc.params * BF16, place)
                ag_edge = costs.placed_collective_ms("all_gather", edge * BF16, place)
                pre = p.async_collectives and p.param_gather_overlap
                self._overlap(cc.fwd_parts, ag, pre, exposed_ms=ag_edge)
                ag_first_bwd = 0.0 if last or p.pp_degree > 1 else \
                    costs.placed_collective_ms("all_gather", layer_unit * BF16, place)
                self._overlap(cc.bwd_parts, ag, pre, exposed_ms=min(ag, ag_first_bwd))
        cc.hidden_ms += self._hidden
        return cc

    def _precision_costs(self, cc: ChunkCost) -> None:
        """Per micro-batch mixed-precision bookkeeping of the chunk's P local parameters (constants above).

        Without FSDP (autocast over FP32 masters): forward casts P weights (6P bytes); backward casts P
        weight gradients to FP32 (6P) and accumulates them (12P, for all but the first micro-batch:
        x (m - 1) / m). With FSDP (ZeRO 2/3 over g = dp x cp ranks): forward casts the local shard
        before the all-gather (6P/g) and copies the gathered parameters out (4P); backward casts the
        unsharded gradients to FP32 for the reduce-scatter (6P), accumulates the shard (12P/g x (m-1)/m)
        and, ZeRO-3 only, copies the re-gathered parameters out again (4P).
        """
        p, costs, P, e = self.p, self.costs, float(cc.params), self.engine
        later = (p.num_micro_batches - 1) / p.num_micro_batches
        cast = 1.0 if e.cast_weights_per_microbatch else 0.0           # FP32 -> BF16 weight casts
        # fused main-grad accumulation (Megatron --gradient-accumulation-fusion): the wgrad GEMM writes
        # into the FP32 buffer, so neither the gradient cast nor the per-micro-batch add exists
        unfused = 0.0 if e.grad_accumulation == "fused_main_grad" else 1.0
        copy = 1.0 if e.fsdp_gather_copy_out else 0.0
        if self.dp_group > 1 and p.zero_stage >= 2:
            g = self.dp_group
            fwd = (costs.memory_bound_ms(cast * CAST_BYTES_PER_PARAM * P / g, "cast")
                   + costs.memory_bound_ms(copy * GATHER_COPY_BYTES_PER_PARAM * P, "copy"))
            # the reduce-scattered shard is added into the accumulated shard by every engine
            bwd = (costs.memory_bound_ms(unfused * CAST_BYTES_PER_PARAM * P, "cast")
                   + costs.memory_bound_ms(ACCUMULATE_BYTES_PER_PARAM * P / g * later, "accumulate"))
            if p.zero_stage == 3:
                bwd += costs.memory_bound_ms(copy * GATHER_COPY_BYTES_PER_PARAM * P, "copy")
        else:
            fwd = costs.memory_bound_ms(cast * CAST_BYTES_PER_PARAM * P, "cast")
            bwd = (costs.memory_bound_ms(unfused * CAST_BYTES_PER_PARAM * P, "cast")
                   + costs.memory_bound_ms(unfused * ACCUMULATE_BYTES_PER_PARAM * P * later, "accumulate"))
        _add(cc.fwd_parts, "compute", fwd)
        _add(cc.bwd_parts, "compute", bwd)

    def _overlap(self, parts: dict[str, float], comm_ms: float, overlapped: bool, exposed_ms: float = 0.0) -> None:
        """Add a DP collective beside a node: hidden behind its compute when overlapped (all but
        ``exposed_ms`` of it, the part that has nothing to overlap with), else exposed."""
        if overlapped:
            hidden = min(comm_ms - min(exposed_ms, comm_ms), parts.get("compute", 0.0))
            _add(parts, "exposed_dp_comm", comm_ms - hidden)
            _add(parts, "compute", self.slowdown * hidden)
            self._hidden = getattr(self, "_hidden", 0.0) + hidden
        else:
            _add(parts, "exposed_dp_comm", comm_ms)

    def p2p_ms(self) -> float:
        """Send/recv of one micro-batch's boundary activation (T x h bf16, /t with SP), ms."""
        if self.p.pp_degree == 1:
            return 0.0
        nbytes = self.tokens * self.m.hidden_size * BF16 / (self.p.tp_degree if self.p.sp_active else 1)
        return self.costs.placed_collective_ms("send_recv", nbytes, self.pp_place)

    def dp_bucket_bytes(self, chunk_params: int) -> list[int]:
        """Bytes of each end-of-step DP gradient bucket of one chunk, in order: the chunk's gradients
        (``chunk_params`` x ``grad_reduce_bytes``, the engine's reduction dtype) cut into buckets of
        ``bucket_size_mib`` x 2^20 bytes, the last one holding the remainder. An engine with
        ``one_bucket_without_overlap`` and no overlapped reduction: one bucket of the whole chunk. Empty when
        nothing is reduced at the end of the step (no DP, or FSDP reducing during the backward)."""
        if self.dp_group <= 1 or (self.p.zero_stage >= 2 and not self.deferred_rs):
            return []
        return self.bucket_sizes(chunk_params * self.grad_reduce_bytes)

    def bucket_sizes(self, total: int) -> list[int]:
        """``total`` gradient bytes in the plan's buckets (:meth:`dp_bucket_bytes`; also the expert-DP ones)."""
        p, bucket = self.p, self.p.bucket_size_mib * 2**20
        if self.engine.one_bucket_without_overlap and not (p.dp_grad_reduce_overlap and p.async_collectives):
            bucket = max(total, 1)      # Megatron-LM: bucket_size None without --overlap-grad-reduce (facts.yaml)
        n_full, rem = divmod(total, bucket)
        return [bucket] * int(n_full) + ([rem] if rem else [])

    def dp_bucket_ms(self, chunk_params: int) -> list[float]:
        """End-of-step DP gradient reduction of one chunk, per bucket of :meth:`dp_bucket_bytes`, ms (ZeRO 0:
        all-reduce; 1, and 2/3 when a pipeline defers FSDP's reduction to the last backward: reduce-scatter)."""
        kind = "all_reduce" if self.p.zero_stage == 0 else "reduce_scatter"
        memo: dict[int, float] = {}
        out = []
        for nbytes in self.dp_bucket_bytes(chunk_params):
            if nbytes not in memo:
                memo[nbytes] = self.costs.placed_collective_ms(kind, nbytes, self.dp_place)
            out.append(memo[nbytes])
        return out

    def param_gather_ms(self, stage_params: int, fp8_params: int = 0) -> float:
        """ZeRO-1/2 all-gather of the updated parameters after the optimizer step, ms: BF16, except
        ``fp8_params`` of them in FP8, 1 byte each (Megatron-LM --fp8-param-gather: "perform the param
        all-gather in fp8", megatron/training/arguments.py)."""
        if self.dp_group <= 1 or self.p.zero_stage not in (1, 2):
            return 0.0
        nbytes = (stage_params - fp8_params) * BF16 + fp8_params * FP8_PARAM_BYTES
        return self.costs.placed_collective_ms("all_gather", nbytes, self.dp_place)

    def optimizer_ms(self, stage_params: int, expert_params: int = 0) -> float:
        """Adam step over this rank's shard (sharded over DP x CP for ZeRO >= 1; routed-expert parameters over
        the expert-DP group), memory-bound."""
        shard = stage_params / (self.dp_group if self.p.zero_stage >= 1 else 1)
        if expert_params:
            shard += expert_params / (getattr(self, "edp_group", 1) if self.p.zero_stage >= 1 else 1)
        return self.costs.memory_bound_ms(shard * (ADAM_BYTES_PER_PARAM + moe_layer.grad_clip_bytes(self)), "adamw")


@dataclass(frozen=True)
class StepWeights:
    """The numbers of one step graph, apart from its structure (:class:`StepStructure`), ms.

    Written by :func:`step_weights` from a :class:`CostBuilder`; :func:`build_step_graph` puts them on
    networkx nodes and edges, :func:`autotune.cost.simulator.simulate_structure` reads them directly.

    Attributes:
        num_micro_batches: m of the graph (may differ from the plan's when the simulator extrapolates).
        p2p_ms: one boundary send/recv (:meth:`CostBuilder.p2p_ms`), ms.
        p2p_delay_ms: ``delay_ms`` of the p2p edges: 0 with blocking send/recv (the time is in the
            sender's node, ``exposed_pp_comm``), else ``p2p_ms``.
        overlap_dp: DP buckets on their own ``dp`` stream (async collectives + dp_grad_reduce_overlap).
        compute: per (stage, ``"F"|"B"``, chunk): (parts, duration_ms, flops) of every micro-batch's node
            (the parts dict is shared by those nodes: read-only).
        dp_groups: per (stage, chunk): one (duration_ms, num_buckets, ready_delay_ms) per DP bucket group;
            ready_delay_ms (<= 0) is the ``delay_ms`` of the edge from the chunk's last backward (used
            when ``overlap_dp``).
        opt_ms: per stage, the optimizer step (:meth:`CostBuilder.optimizer_ms`).
        param_gather_ms: per stage, the exposed ZeRO-1/2 parameter all-gather; 0 = no node.
        reclaim_ms: per stage, the per-step ``empty_cache`` node's time; None = no such node.
    """

    num_micro_batches: int
    p2p_ms: float
    p2p_delay_ms: float
    overlap_dp: bool
    compute: dict[tuple[int, str, int], tuple[dict[str, float], float, float]]
    dp_groups: dict[tuple[int, int], tuple[tuple[float, int, float], ...]]
    opt_ms: tuple[float, ...]
    param_gather_ms: tuple[float, ...]
    reclaim_ms: tuple[float, ...] | None

    def structure_key(self, plan: Plan) -> tuple:
        """What the graph's structure (nodes, edges, streams) depends on: pp, effective vpp, schedule, m,
        where the DP buckets run, the bucket-group count per chunk, which stages have a parameter-gather
        node and whether there are reclaim nodes."""
        return (plan.pp_degree, plan.effective_vpp, plan.pipeline_schedule, self.num_micro_batches,
                self.overlap_dp, tuple(len(self.dp_groups.get((r, c), ())) for r in range(plan.pp_degree)
                                       for c in range(plan.effective_vpp)),
                tuple(bool(a) for a in self.param_gather_ms), self.reclaim_ms is not None)


def chunk_costs(cb: CostBuilder, plan: Plan, model: ModelSpec, *, cached: bool = False) -> dict[int, ChunkCost]:
    """Cost of every virtual stage (model order), ``{vstage: ChunkCost}``.

    ``cached``: compute :meth:`CostBuilder.chunk_cost` once per (first stage, last stage, layer count)
    and share the result between the virtual stages of that class (``chunk_cost`` depends on the
    stage index only through "is it the first (embedding) / last (LM head) stage"; the fast path's
    equivalence test, tests/cost/test_fast_sim.py, checks this against the uncached costs).
    """
    layers = plan.layers_per_virtual_stage(model.num_layers)
    n = len(layers)
    if not cached:
        return {vs: cb.chunk_cost(vs, layers[vs]) for vs in range(n)}
    by_class: dict[tuple, ChunkCost] = {}
    out = {}
    kinds = moe.chunk_layer_kinds(model, plan) if model.is_moe else None
    for vs in range(n):
        key = (vs == 0, vs == n - 1, layers[vs]) if kinds is None else (vs == 0, vs == n - 1, kinds[vs])
        cc = by_class.get(key)
        if cc is None:
            cc = by_class[key] = cb.chunk_cost(vs, layers[vs])
        out[vs] = cc
    return out


def hidden_comm_ms(cb: CostBuilder, plan: Plan, model: ModelSpec) -> float:
    """An upper bound on what exposing every overlapped collective would add to ``plan``'s step, ms: on the
    stage where it is largest, the communication the overlaps hide in each micro-batch's chunks (TP, CP,
    per-layer FSDP gathers and reduce-scatters: :attr:`ChunkCost.hidden_ms`) x micro-batches, plus the
    stage's DP gradient buckets when they overlap backward and the part of the parameter gather that
    overlaps the next forward; all of it added serially, as if nothing overlapped. The simulator's
    ``step_time_exposed_ms`` is its step time plus this (autotune/cost/simulator.py); the layout sampler's
    convergence stop bounds an untried plan's exposed step time with it (autotune/search/estimate.py
    ``PlanScreen.hidden_ms``)."""
    chunks = chunk_costs(cb, plan, model, cached=True)
    P, v, m = plan.pp_degree, plan.effective_vpp, plan.num_micro_batches
    overlap_dp = plan.async_collectives and plan.dp_grad_reduce_overlap and not cb.deferred_rs
    worst = 0.0
    for r in range(P):
        vss = [c * P + r for c in range(v)]
        total = m * sum(chunks[vs].hidden_ms for vs in vss)
        params = sum(chunks[vs].params for vs in vss)
        if overlap_dp:
            total += sum(sum(cb.dp_bucket_ms(chunks[vs].params)) for vs in vss)
        if plan.param_gather_overlap and plan.async_collectives:
            total += cb.param_gather_ms(params, sum(chunks[vs].fp8_params for vs in vss))
        worst = max(worst, total)
    return float(worst)
