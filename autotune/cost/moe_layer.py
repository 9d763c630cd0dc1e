"""The routed-expert part of an MoE layer's cost on one rank (split from :mod:`autotune.cost.chunk_costs`, whose
:class:`~autotune.cost.chunk_costs.CostBuilder` calls these with itself as ``cb``): expert GEMMs at the measured
grouped-GEMM efficiency, router and permutation, token dispatch and combine, their overlap, the recompute of
Megatron-LM's recompute modules, and the expert gradients' reduction over the expert-DP group. Conventions and
sources: :mod:`autotune.cost.moe`."""

from __future__ import annotations

from typing import Any

from autotune.cost import moe, tt_moe

BF16 = 2  # bytes per element
#: Transformer Engine's FP8 cast-transpose, bytes per element (BF16 read, two FP8 writes), as
#: :data:`autotune.cost.chunk_costs.FP8_TE_CAST_TRANSPOSE_BYTES`
FP8_TE_CAST_TRANSPOSE_BYTES = 2 + 1 + 1


def _add(d: dict[str, float], key: str, v: float) -> None:
    if v:
        d[key] = d.get(key, 0.0) + v


def remote_nodes_per_token(num_experts: int, top_k: int, num_nodes: int) -> float:
    """Expected number of other nodes of the EP group that hold at least one of a token's ``top_k`` experts,
    with the ``num_experts`` experts spread evenly over ``num_nodes`` nodes and the k distinct experts chosen
    uniformly (balanced routing): (N - 1) (1 - C(E - E/N, k) / C(E, k)) (the chance that a given other node
    holds none of them is hypergeometric). E.g. E = 128, k = 8, N = 2: 1 - C(64, 8) / C(128, 8) = 0.9966."""
    from math import comb

    if num_nodes <= 1:
        return 0.0
    e_node = num_experts // num_nodes
    miss = comb(num_experts - e_node, top_k) / comb(num_experts, top_k)
    return (num_nodes - 1) * (1.0 - miss)


def ep_all_to_all_ms(costs: Any, place: Any, copies_bytes: float, token_bytes: float, dispatcher: str,
                     num_experts: int, top_k: int) -> float:
    """One token dispatch (or combine) over the EP group ``place``, ms. ``copies_bytes`` = S, the bytes of
    the rank's n x k token copies; ``token_bytes`` = the rank's n tokens once.

    Inside one node: ``costs.placed_collective_ms("all_to_all", S, place)``, (n - 1) / n S at the NVLink
    all-to-all bus bandwidth. Across N nodes of k members (n = k N), an all-to-all is not a ring: every
    rank sends S / n to each peer (nccl-tests doc/PERFORMANCE.md, alltoall: busbw = algbw (n - 1) / n), so
    the S (n - k) / n bytes for off-node peers all leave through the rank's own NIC share
    (``place.member_inter_link``), beside the S (k - 1) / n bytes over NVLink:
    t = max(S (k - 1) / n / B_nvl, S_off / B_nic) + the latency of the n - 1 exchanges beyond the
    measured 2-rank one (:func:`autotune.cost.op_costs.ring_steps`). ``alltoall`` (NCCL): S_off =
    S (n - k) / n. ``flex`` (DeepEP / HybridEP): hierarchical, each token crosses once to every remote node
    holding one of its experts and is forwarded there over NVLink (DeepSeek-V3, arXiv 2412.19437,
    Sec. 3.2.2: "first transmitted via IB to the GPUs with the same in-node index on its target nodes ...
    then forwarded via NVLink"; deepseek-ai/DeepEP README, normal kernels' NVLink -> RDMA forwarding):
    S_off = n h 2 x :func:`remote_nodes_per_token`, and NVLink also carries the forwarded copies,
    S (n - k) / n (k - 1) / k. Node-limited routing (DeepSeek-V3's at most 4 nodes) is not modelled."""
    from autotune.cost.op_costs import collective_factors, ring_steps

    n, k, N = place.size, place.members_per_node, place.num_nodes
    if n <= 1 or copies_bytes <= 0:
        return 0.0
    if not place.spans_nodes:
        return costs.placed_collective_ms("all_to_all", copies_bytes, place)
    net, intra = place.member_inter_link, place.intra_link
    on_node = copies_bytes * (k - 1) / n
    if dispatcher == "flex":
        off_node = token_bytes * remote_nodes_per_token(num_experts, top_k, N)
        on_node += copies_bytes * (n - k) / n * (k - 1) / k
    else:
        off_node = copies_bytes * (n - k) / n
    t_intra = on_node / (costs.busbw_gbs("all_to_all", copies_bytes, intra) * 1e6) if on_node else 0.0
    t_inter = off_node / (costs.busbw_gbs("all_to_all", off_node, net) * 1e6) if off_node else 0.0
    steps, inter_steps = ring_steps("all_to_all", n, N, k)
    lat_us = (steps - inter_steps) * intra.latency_us + inter_steps * net.latency_us
    measured_us = collective_factors("all_to_all", 2)[1] * net.latency_us
    return max(t_intra, t_inter) + max(0.0, lat_us - measured_us) / 1e3


def moe_parts(cb: Any, fwd: dict[str, float], bwd: dict[str, float], gkw: dict[str, Any]) -> tuple[float, float]:
    """Add one MoE layer's routed-expert work to its forward and backward parts (the conventions and
    sources: :mod:`autotune.cost.moe`): ``expert_compute`` (the rank's E / EP local experts' fc1 and
    fc2 GEMMs at m_e rows each, their activation), ``router_permute`` (the router GEMM n x E x h and its
    softmax / top-k, the permutation copies out and back unless the dispatcher fuses them), and
    ``exposed_ep_comm`` (dispatch and combine over the EP group, forward and backward; the ETP gathers).

    With ``moe_a2a_overlap`` (Megatron-LM ``--overlap-moe-expert-parallel-comm``: the forward of one
    micro-batch runs beside the backward of another, megatron/core/pipeline_parallel/
    combined_1f1b.py), a layer's forward communication hides behind a backward's compute of the same
    layer and vice versa, from the second micro-batch on (so only with async collectives and >= 2
    micro-batches); the hidden part slows the compute by the profile's overlap contention.

    Returns:
        (forward compute of the expert part in ms, recomputed under full recompute; its forward FLOPs,
        balanced routing).
    """
    m, p, costs, w = cb.m, cb.p, cb.costs, cb.w
    imb = float(getattr(w, "moe_imbalance", 1.0))
    sh = moe.expert_shapes(m, p, w.seq_len, imbalance=imb)
    n, el, h = sh["tokens"], sh["local_experts"], m.hidden_size
    gem = moe.expert_gemms(m, p, w.seq_len, imbalance=imb)
    if p.moe_grouped_gemm:
        # one grouped GEMM over the rank's experts: the dense GEMM of all their rows at the measured
        # grouping efficiency for m_e rows per expert (autotune/data/grouped_gemm.yaml)
        me = sh["rows_per_expert"]
        rf, rd, rw = (moe.grouped_gemm_ratio(x, me) for x in ("fwd", "dgrad", "wgrad"))
        ex_f = sum(costs.gemm_ms(el * a, b, c, **gkw) for a, b, c in gem) / rf
        ex_b = sum(costs.gemm_ms(el * a, c, b, backward=True, **gkw) / rd
                   + costs.gemm_ms(c, b, el * a, backward=True, **gkw) / rw for a, b, c in gem)
    else:
        # one GEMM per local expert (Megatron-LM SequentialMLP without --moe-grouped-gemm)
        ex_f = el * sum(costs.gemm_ms(a, b, c, **gkw) for a, b, c in gem)
        ex_b = el * sum(costs.gemm_ms(a, c, b, backward=True, **gkw) + costs.gemm_ms(c, b, a, backward=True, **gkw)
                        for a, b, c in gem)
    flops = 2.0 * el * sum(a * b * c for a, b, c in moe.expert_gemms(m, p, w.seq_len))
    if p.fp8:
        # the experts' FP8 casts, as a dense layer's (fp8_cast_bytes): the rank's token copies into fc1
        # and fc2, their weights (E / EP experts), the output gradients in backward
        qf, qb = cb.fp8_cast_bytes([(el * a, b, c) for a, b, c in gem])
        wq = sum(float(c) * b for a, b, c in gem)           # one expert's weights; el - 1 more of them
        te_cached = 1.0 / p.num_micro_batches if cb.engine.fp8_library == "transformer_engine" else 1.0
        qf += (el - 1) * wq * FP8_TE_CAST_TRANSPOSE_BYTES * te_cached
        fused = p.compile or cb.engine.fuses("fp8_cast")
        ex_f += costs.quantize_ms(qf, p.precision, fused=fused)
        ex_b += costs.quantize_ms(qb, p.precision, fused=fused)
    rows = el * gem[0][0]
    f = sh["ffn_per_rank"]
    act_f = cb._memory_bound_ms(rows * (6 if m.gated_mlp else 4) * f, "swiglu")
    E = m.num_experts
    router_f = costs.gemm_ms(n, E, h) + costs.memory_bound_ms(3 * moe.ROUTER_BYTES * n * E)
    router_b = (costs.gemm_ms(n, h, E, backward=True) + costs.gemm_ms(h, E, n, backward=True)
                + costs.memory_bound_ms(3 * moe.ROUTER_BYTES * n * E))
    copies = sh["token_copies"] * p.etp_degree * imb
    # permute: read n x h, write the copies (and unpermute back), BF16; DeepEP / HybridEP fuse both
    # (torchtitan 0.2.2's FP32 path prices its own index and copy kernels instead: autotune.cost.tt_moe)
    perm = 0.0 if p.moe_dispatcher == "flex" or tt_moe.fp32_path(cb) else \
        2 * costs.memory_bound_ms(BF16 * (n + copies) * h)
    comm = 0.0
    if p.ep_degree > 1:
        if p.moe_dispatcher == "allgather":
            gathered = n * h * BF16 * p.ep_degree
            comm += (costs.placed_collective_ms("all_gather", gathered, cb.ep_place)
                     + costs.placed_collective_ms("reduce_scatter", gathered, cb.ep_place))
        else:
            comm += 2 * ep_all_to_all_ms(costs, cb.ep_place, moe.dispatch_bytes(m, p, w.seq_len, imbalance=imb),
                                         n * h * BF16, p.moe_dispatcher, m.num_experts, m.moe_top_k)
    if p.etp_degree > 1:
        tok = BF16 * copies * h
        comm += (costs.placed_collective_ms("all_gather", tok, cb.etp_place)
                 + costs.placed_collective_ms("reduce_scatter", tok, cb.etp_place))
    # torchtitan 0.2.2 without FSDP: FP32 rows, per-call weight casts; its SAC re-runs the routed forward
    # (autotune.cost.tt_moe; 0 for every other engine and plan)
    wparams = el * sum(float(b) * c for _, b, c in gem)
    tt_f, tt_b = tt_moe.routed_path_ms(cb, n, copies, h, wparams)
    _add(fwd, "expert_compute", ex_f + act_f)
    _add(bwd, "expert_compute", ex_b + 2 * act_f)
    _add(fwd, "router_permute", router_f + perm + tt_f)
    _add(bwd, "router_permute", router_b + perm + tt_b)
    _add(bwd, "recompute", tt_moe.sac_recompute_ms(cb, ex_f + act_f + perm + tt_f))
    overlapped = p.moe_a2a_overlap and p.async_collectives and p.num_micro_batches >= 2
    exp_f = exp_b = comm
    if overlapped and comm:
        later = (p.num_micro_batches - 1) / p.num_micro_batches     # the first micro-batch has no partner
        bwd_compute = bwd.get("compute", 0.0) + ex_b
        fwd_compute = fwd.get("compute", 0.0) + ex_f
        hid_f = later * min(comm, bwd_compute)
        hid_b = later * min(comm, fwd_compute)
        exp_f, exp_b = comm - hid_f, comm - hid_b
        _add(fwd, "compute", cb.slowdown * hid_f)
        _add(bwd, "compute", cb.slowdown * hid_b)
        cb.hidden_fwd["ep"] = hid_f
        cb.hidden_bwd["ep"] = hid_b
    _add(fwd, "exposed_ep_comm", exp_f)
    _add(bwd, "exposed_ep_comm", exp_b)
    cb._moe_act_ms = act_f
    cb._moe_exposed_fwd = exp_f
    return ex_f + act_f + router_f + perm + tt_f, flops


def module_recompute_ms(cb: Any, modules: tuple[str, ...], gemms: list[tuple[int, int, int]], gkw: dict[str, Any],
                         attn_fwd: float, act_bytes: float, moe_fwd_ms: float, kind: str) -> float:
    """Backward re-run time of one layer's ``recompute_modules`` (Megatron-LM ``--recompute-modules``,
    megatron/core/transformer/transformer_config.py): ``core_attn`` the attention kernel, ``layernorm``
    the two RMSNorms, ``mla_up_proj`` MLA's two up-projection GEMMs, ``mlp`` a dense layer's MLP
    (GEMMs and activation), ``shared_experts`` an MoE layer's shared experts, ``moe_act`` the routed
    experts' activation, ``moe`` the whole routed part (with its exposed dispatch and combine)."""
    m, p, costs = cb.m, cb.p, cb.costs
    t, T, h = p.tp_degree, cb.tokens, m.hidden_size
    mods, ms = set(modules), 0.0
    hdiv = t if p.sp_active else 1
    if "core_attn" in mods:
        ms += attn_fwd
    if "layernorm" in mods:
        ms += cb._memory_bound_ms(T * 8 * h / hdiv, "rmsnorm")
    if "mla_up_proj" in mods and m.is_mla:
        n = m.num_heads
        ups = [(T, n * (m.qk_nope_head_dim + m.v_head_dim) // t, m.kv_lora_rank)]
        if m.q_lora_rank:
            ups.append((T, n * (m.qk_nope_head_dim + m.qk_rope_head_dim) // t, m.q_lora_rank))
        ms += sum(costs.gemm_ms(a, b, c, **gkw) for a, b, c in ups)
    if ("mlp" in mods and kind == "dense") or ("shared_experts" in mods and kind == "moe"):
        ms += sum(costs.gemm_ms(a, b, c, **gkw) for a, b, c in moe.mlp_gemms(m, t, T, kind))
        ms += cb._memory_bound_ms(T * act_bytes, "swiglu")
    if kind == "moe":
        if "moe" in mods:
            ms += moe_fwd_ms + getattr(cb, "_moe_exposed_fwd", 0.0)
        elif "moe_act" in mods:
            ms += getattr(cb, "_moe_act_ms", 0.0)
    return ms


#: the FP32 adds' in-training bandwidth of the profile named at
#: :data:`autotune.cost.chunk_costs.ACCUMULATE_BYTES_PER_PARAM` (3 x 23 GB in 26.6 ms), GB/s, on the H200.
#: Named: this rate (rather than the generic one with the eager in-training factor, which the dense term takes) was
#: chosen while looking at the 2026-12-03 Qwen3-30B-A3B 2 x 2 micro-batch trace (docs/results/engines/
#: torchtitan-moe-profile-h200x1-2026-12-03/: elementwise kernels +13 ms over 1 x 4, where the generic rate gives 29).
ACCUMULATE_GBS = 2594.0
#: adding a micro-batch's FP32 gradient into the accumulated one: read both (4 + 4), write one (4), bytes per
#: parameter (chunk_costs uses the same for the dense parameters)
ACCUMULATE_BYTES_PER_PARAM = 12


def expert_grad_accumulate_ms(cb: Any, expert_params: float, later: float) -> float:
    """Backward ms per micro-batch of adding the routed experts' FP32 gradients into the accumulated ones (autograd's
    AccumulateGrad for every micro-batch after the first: ``later`` = (m - 1) / m on average),
    :data:`ACCUMULATE_BYTES_PER_PARAM` per parameter of the rank
    (its expert-DP shard under FSDP), at :data:`ACCUMULATE_GBS` (:func:`autotune.cost.tt_moe.h200_rate_ms`; the dense
    term of chunk_costs keeps its own pricing, so no dense prediction moves). :func:`chunk_params` adds it for every
    engine whose gradients do not go straight into a main-grad buffer (Megatron-LM ``--gradient-accumulation-fusion``)."""
    if not expert_params or later <= 0:
        return 0.0
    edp = getattr(cb, "edp_group", 1)
    pe = float(expert_params) / (edp if cb.p.zero_stage >= 2 and edp > 1 else 1)
    return tt_moe.h200_rate_ms(cb.costs, ACCUMULATE_BYTES_PER_PARAM * pe * later, ACCUMULATE_GBS)


def expert_bucket_ms(cb: Any, expert_params: int) -> list[float]:
    """End-of-step reduction of one chunk's routed-expert gradients over the expert-DP group
    (tp x cp x dp / (ep x etp) ranks; Megatron-LM reduces expert gradients in their own buffer over
    that group: megatron/core/distributed/distributed_data_parallel.py ``expert_parallel_buffers``),
    bucketed as :meth:`dp_bucket_bytes`, ms."""
    if not expert_params or getattr(cb, "edp_group", 1) <= 1 or cb.p.zero_stage >= 2:
        return []
    kind = "all_reduce" if cb.p.zero_stage == 0 else "reduce_scatter"
    memo: dict[int, float] = {}           # (a chunk has at most two bucket sizes: one collective costed each)
    out = []
    for b in cb.bucket_sizes(expert_params * cb.grad_reduce_bytes):
        if b not in memo:
            memo[b] = cb.costs.placed_collective_ms(kind, b, cb.edp_place)
        out.append(memo[b])
    return out


def expert_param_gather_ms(cb: Any, expert_params: int) -> float:
    """ZeRO-1/2 all-gather of the updated routed-expert parameters over the expert-DP group, BF16, ms."""
    if not expert_params or getattr(cb, "edp_group", 1) <= 1 or cb.p.zero_stage not in (1, 2):
        return 0.0
    return cb.costs.placed_collective_ms("all_gather", expert_params * BF16, cb.edp_place)



def chunk_kinds(cb: Any, vstage: int, num_layers: int, last: bool) -> tuple[int, int, int]:
    """(dense layers, MoE layers, MTP layers) of virtual stage ``vstage``: the main layers by
    :func:`autotune.cost.moe.chunk_layer_kinds`, and on the last stage the multi-token-prediction layers, which
    run after the last main layer (Megatron-LM places them there: megatron/core/transformer/
    multi_token_prediction.py), counted with the last main layer's type (its dense or MoE count grows by them)."""
    kinds = getattr(cb, "_chunk_kinds", None)
    if kinds is None:
        kinds = cb._chunk_kinds = moe.chunk_layer_kinds(cb.m, cb.p)
    n_dense, n_moe = kinds[vstage]
    if n_dense + n_moe != num_layers:     # a caller's own layer count (the fast path's classes): MoE from the back
        n_moe = min(num_layers, n_moe)
        n_dense = num_layers - n_moe
    n_mtp = cb.m.mtp_num_layers if last else 0
    if n_mtp:
        n_moe, n_dense = (n_moe + n_mtp, n_dense) if moe.mtp_layer_is_moe(cb.m) else (n_moe, n_dense + n_mtp)
    return n_dense, n_moe, n_mtp


def add_moe_layers(cb: Any, cc: Any, n_moe: int) -> None:
    """Add ``n_moe`` MoE layers' forward and backward parts, hidden communication and FLOPs to chunk ``cc``."""
    (mf, mbw, mflops), mhf, mhb, _ = cb._moe_state
    for k, v in mf.items():
        _add(cc.fwd_parts, k, v * n_moe)
    for k, v in mbw.items():
        _add(cc.bwd_parts, k, v * n_moe)
    cc.hidden_ms += n_moe * (sum(mhf.values()) + sum(mhb.values()))
    cc.fwd_flops += mflops * n_moe


def add_moe_recompute(cb: Any, cc: Any, n_layers: int, *, partial: bool) -> None:
    """Add to chunk ``cc`` the forward re-run of ``n_layers`` fully recomputed MoE layers: their hidden
    communication, and with partial recompute (the first N layers of a chunk) their backward parts (without it
    every layer's backward already holds them)."""
    if partial:
        for k, v in cb._moe_state[3].items():
            _add(cc.bwd_parts, k, v * n_layers)
    cc.hidden_ms += n_layers * sum(cb._moe_state[1].values())


def chunk_params(cb: Any, cc: Any, n_dense: int, n_moe: int, n_mtp: int) -> None:
    """Set chunk ``cc``'s parameters on this rank: the dense layers' and the MoE layers' non-expert parameters over
    TP in ``params``, the routed experts (E / EP experts of 1 / ETP each, reduced over the expert-DP group) in
    ``expert_params``; and each MTP depth's two norms and 2h -> h projection (DeepSeek-V3, arXiv 2412.19437,
    Sec. 2.2) with their GEMM time and FLOPs (the shared LM head and loss run once more per depth:
    :meth:`autotune.cost.chunk_costs.CostBuilder.chunk_cost`)."""
    m, p, costs = cb.m, cb.p, cb.costs
    t, T, h = p.tp_degree, cb.tokens, m.hidden_size
    cc.params = (n_dense * moe.dense_layer_params(m) + n_moe * moe.dense_params_of_moe_layer(m)) // t
    cc.expert_params = n_moe * moe.expert_params_per_layer(m) // (p.ep_degree * p.etp_degree)
    if cb.engine.grad_accumulation != "fused_main_grad":
        _add(cc.bwd_parts, "compute", expert_grad_accumulate_ms(cb, cc.expert_params,
                                                                (p.num_micro_batches - 1) / p.num_micro_batches))
    if n_mtp:
        _add(cc.fwd_parts, "compute", n_mtp * costs.gemm_ms(T, h, 2 * h // t))
        _add(cc.bwd_parts, "compute", n_mtp * (costs.gemm_ms(T, 2 * h // t, h, backward=True)
                                               + costs.gemm_ms(2 * h // t, h, T, backward=True)))
        cc.fwd_flops += n_mtp * 2.0 * T * 2 * h * h / t
        cc.params += n_mtp * (2 * h * h // t + 3 * h)


def place_expert_groups(cb: Any, placed: Any) -> None:
    """The expert process groups of ``cb``'s plan on the cluster (``placed(kind, size, stride)``, the builder's
    memoised :func:`autotune.cost.topology.place_group`): ETP stride 1, EP stride ETP, expert DP stride EP x ETP
    (autotune.cost.moe), folded over TP x CP x DP."""
    ep, etp = cb.p.ep_degree, cb.p.etp_degree
    cb.etp_place = placed("group", etp, 1)
    cb.ep_place = placed("group", ep, etp)
    cb.edp_group = cb.p.expert_dp_degree
    cb.edp_place = placed("group", cb.edp_group, ep * etp)


def moe_layer_state(cb: Any, memo: dict | None, dense: tuple, placed: Any, lkey: tuple | None) -> tuple:
    """One MoE layer's (forward / backward parts and FLOPs, hidden forward, hidden backward, full-recompute parts)
    for ``cb``'s plan, memoised in ``memo`` per the dense layer's key ``lkey`` and the plan's
    :data:`autotune.cost.moe.MOE_LAYER_FIELDS`; ``dense`` is the dense layer's state (``_layer_cost`` overwrites the builder's attributes, which
    are restored from it). First places the expert groups (:func:`place_expert_groups`, with ``placed``)."""
    place_expert_groups(cb, placed)
    mkey = ("moe_layer",) + lkey + tuple(getattr(cb.p, f) for f in moe.MOE_LAYER_FIELDS) if memo is not None else None
    state = memo.get(mkey) if memo is not None else None
    if state is None:
        cb.full_recompute_parts = {}
        state = (cb._layer_cost("moe"), cb.hidden_fwd, cb.hidden_bwd, cb.full_recompute_parts)
        cb.quantize_ms, cb.hidden_fwd, cb.hidden_bwd, cb.full_recompute_parts = dense[1:]
        if memo is not None:
            memo[mkey] = state
    return state

__all__ = ["grad_clip_bytes", "ep_all_to_all_ms", "remote_nodes_per_token", "moe_layer_state", "place_expert_groups", "add_moe_layers", "add_moe_recompute", "chunk_kinds", "chunk_params", "expert_bucket_ms", "expert_grad_accumulate_ms", "expert_param_gather_ms", "module_recompute_ms", "moe_parts"]


def grad_clip_bytes(cb: Any) -> int:
    """Bytes per gradient element of the engine's every-step gradient clipping (:mod:`autotune.cost.tt_moe`)."""
    return tt_moe.grad_clip_bytes_per_param(cb)
