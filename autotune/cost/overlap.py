"""What an overlapped collective costs, from the mechanism that overlaps it.

Each function takes the GEMM (or attention) time the collective is paired with and the collective's own
time on its link (ms, from :meth:`autotune.cost.op_costs.OpCosts.placed_collective_ms`) and returns
``(compute_ms, exposed_ms)``: the paired compute as it runs beside the communication (slowed by contention,
and by being cut into chunks where the mechanism cuts it), and the communication time left on the critical
path. ``compute_ms + exposed_ms`` is the pair's time; ``compute_ms - gemm_ms`` is what the overlap costs the
compute. Nothing here is fitted to training runs: the chunking is the engines' (sources per function), the
contention factors are measured (:meth:`OpCosts.sm_contention`, :meth:`OpCosts.copy_engine_contention`:
``bench/contention.py`` on an H200, ``docs/results/contention-h200x1-2026-12-01.md``).
"""

from __future__ import annotations

from typing import Any


def ring_exchange(chunk_gemm_ms: float, num_chunks: int, comm_ms: float, *, slowdown: float = 1.0,
                  last_exposed: bool = False) -> tuple[float, float]:
    """A collective decomposed into ``n = num_chunks`` ring steps beside ``n`` GEMM chunks.

    All-gather side (``last_exposed=False``): the GEMM on the local chunk runs first while the next chunk
    arrives; each of the n - 1 ring steps moves ``comm_ms / (n - 1)`` (a ring all-gather's n - 1 steps,
    each 1/n of the data), and GEMM chunk i + 1 waits for step i. Reduce-scatter side
    (``last_exposed=True``): each GEMM chunk's partial result is sent on while the next chunk computes;
    the last send has nothing beside it. Sources: Transformer Engine
    transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp ``CommOverlapP2PBase::split_overlap_ag``
    and ``split_overlap_rs`` (userbuffers ``ring_exchange``); torch micro-pipeline TP,
    torch/distributed/_symmetric_memory/__init__.py ``_pipelined_all_gather_and_consume`` and
    ``_pipelined_produce_and_all2all``; Wang et al., ASPLOS 2023 (collective matmul decomposition).

    Args:
        chunk_gemm_ms: one GEMM chunk alone (the GEMM at 1/n of its rows), ms.
        num_chunks: n >= 2 (the TP degree).
        comm_ms: the whole collective alone, ms.
        slowdown: GEMM time factor while the transfers run (copy engine: :meth:`OpCosts.copy_engine_contention`).

    Returns:
        (compute_ms, exposed_ms): n slowed chunks, and the waits for transfers (plus the last send).
    """
    n = max(2, int(num_chunks))
    g = chunk_gemm_ms * slowdown
    step = comm_ms / (n - 1)
    total = g + (n - 1) * max(g, step) + (step if last_exposed else 0.0)
    compute = n * g
    return compute, max(0.0, total - compute)


def pipelined_reduce_scatter(gemm_ms: float, splits: int, comm_ms: float, *, slowdown: float) -> tuple[float, float]:
    """A GEMM cut into ``splits`` chunks along its output, each chunk reduce-scattered while the next one
    computes; the GEMM runs on the SMs the communication kernel leaves (``slowdown``, the measured factor
    for that many SMs taken: :meth:`OpCosts.sm_contention`) and the last chunk's reduce-scatter is exposed.

    Source: Transformer Engine comm_gemm_overlap.cpp ``CommOverlapBase::split_overlap_rs`` (userbuffers
    ``pipeline``: ``num_splits`` 4, ``num_sm`` 16, ``set_sm_margin``; the last chunk's reduce-scatter is
    launched after the last GEMM chunk), defaults in transformer_engine/pytorch/module/base.py ``initialize_ub``.

    Returns:
        (compute_ms, exposed_ms).
    """
    s = max(1, int(splits))
    g = gemm_ms * slowdown / s
    c = comm_ms / s
    total = g + (s - 1) * max(g, c) + c
    compute = s * g
    return compute, max(0.0, total - compute)


def bulk(gemm_ms: float, comm_ms: float, *, slowdown: float) -> tuple[float, float]:
    """A whole collective beside an independent GEMM (Transformer Engine userbuffers ``bulk``: the
    all-gather of a sequence-parallel input for the weight gradient beside the data-gradient GEMM, the
    data gradient's reduce-scatter beside the weight-gradient GEMM; comm_gemm_overlap.cpp
    ``CommOverlapBase::bulk_overlap``, ``set_sm_margin``): the GEMM runs on the SMs the communication kernel
    leaves for its whole duration; what the collective takes beyond it is exposed.

    Returns:
        (compute_ms, exposed_ms) = (gemm x slowdown, max(0, comm - gemm x slowdown)).
    """
    g = gemm_ms * slowdown
    return g, max(0.0, comm_ms - g)


def ring_attention(step_attn_ms: float, cp: int, step_comm_ms: float, *, final_handoff: bool = False,
                   slowdown: float = 1.0) -> tuple[float, float]:
    """Context parallelism by a K/V ring (Megatron-LM ``--cp-comm-type p2p``; Transformer Engine
    transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py
    ``AttnFuncWithCPAndKVP2P``): ``cp`` attention steps; the K/V block for step i + 1 is sent while step i
    computes (step 0 uses the local block); a step whose transfer outlasts its attention waits. Backward
    sends K/V and dK/dV (the caller passes the doubled ``step_comm_ms``) and hands the last dK/dV on
    (``final_handoff``, exposed).

    Returns:
        (compute_ms, exposed_ms).
    """
    a = step_attn_ms * slowdown
    steps = max(1, int(cp))
    total = a + (steps - 1) * max(a, step_comm_ms) + (step_comm_ms if final_handoff else 0.0)
    compute = steps * a
    return compute, max(0.0, total - compute)


def gathered_attention(first_step_attn_ms: float, gather_ms: float) -> tuple[float, float]:
    """Context parallelism by an all-gather of K/V (torch ``context_parallel`` with the ``allgather``
    rotate method, torch/distributed/tensor/experimental/_context_parallel/_attention.py
    ``_AllGatherRotater``: the gather is issued before the local block's attention and waited for before
    the next block): only the first (local) step hides it.

    Returns:
        (0.0, exposed_ms): the attention itself is not changed; exposed = max(0, gather - first step).
    """
    return 0.0, max(0.0, gather_ms - first_step_attn_ms)


def tp_layer_overlap(cb: Any, gemms: list[tuple[int, int, int]], gkw: dict[str, Any], ag_fwd_ms: float,
                     ag_ms: float, rs_ms: float, gemm_fwd: float, gemm_bwd: float,
                     ag_bwd_ms: float | None = None) -> tuple[float, float, float, float]:
    """One layer's TP GEMMs with their sequence-parallel collectives overlapped by the engine's mechanism
    (:attr:`EngineProfile.tp_overlap_mechanism`; the rules and their sources above). ``cb``: the layer's
    :class:`autotune.cost.chunk_costs.CostBuilder` (its ``costs``, ``engine``, ``p``).

    ``gemms``: (T, N, K) of qkv, proj, fc1, fc2 per rank; ``ag_ms`` / ``rs_ms``: one all-gather /
    reduce-scatter of the layer's T x h activation on the TP group; ``ag_fwd_ms``: the forward
    all-gather (FP8 where :attr:`EngineProfile.fp8_tp_all_gather` says so); ``ag_bwd_ms``: the backward
    all-gather of dY (FP8 where :attr:`EngineProfile.fp8_tp_grad_all_gather` says so; None: ``ag_ms``).
    Forward: the all-gathers before qkv and fc1, the reduce-scatters after proj and fc2. Backward: the all-gathers of dY before the proj and
    fc2 data gradients (their weight gradients consume the same chunks: Transformer Engine's
    ``external`` wgrad overlap), the reduce-scatters of the qkv and fc1 data gradients and, where the
    engine re-gathers a sequence-parallel input for the weight gradient, two more all-gathers.

    * ``userbuffers`` (Transformer Engine): all-gather side ring exchange on the copy engine; forward
      reduce-scatters pipelined on ``tp_overlap_pipeline_sms`` SMs; backward qkv/fc1 bulk overlap on
      ``tp_overlap_bulk_sms`` SMs (re-gather beside the data-gradient GEMM, reduce-scatter beside the
      weight-gradient GEMM).
    * ``async_tp`` (torch micro-pipeline TP): every all-gather and reduce-scatter as ring steps beside
      the GEMM's chunks (peer copies on the copy engine), forward and backward.

    Returns:
        (forward compute delta, forward exposed, backward compute delta, backward exposed), ms: the
        compute deltas are added to the GEMM times already counted (chunking and contention).
    """
    costs, e, n = cb.costs, cb.engine, cb.p.tp_degree
    ce = costs.copy_engine_contention()
    ag_dy = ag_ms if ag_bwd_ms is None else ag_bwd_ms

    def mm(m: float, nn: int, k: int, backward: bool = False) -> float:
        return costs.gemm_ms(max(1, int(m)), nn, k, backward=backward, **gkw)

    def dgrad(T: int, N: int, K: int) -> float:
        return costs.gemm_ms(T, K, N, backward=True, **gkw)

    def wgrad(T: int, N: int, K: int) -> float:
        return costs.gemm_ms(K, N, T, backward=True, **gkw)

    qkv, proj, fc1, fc2 = gemms
    fx = fe = bx = be = 0.0
    if e.tp_overlap_mechanism == "userbuffers":
        sm_p = costs.sm_contention(e.tp_overlap_pipeline_sms)
        sm_b = costs.sm_contention(e.tp_overlap_bulk_sms)
        for T, N, K in (qkv, fc1):                      # forward all-gather: ring exchange
            c, x = ring_exchange(mm(T / n, N, K), n, ag_fwd_ms, slowdown=ce)
            fx, fe = fx + c, fe + x
        for T, N, K in (proj, fc2):                     # forward reduce-scatter: pipelined
            c, x = pipelined_reduce_scatter(mm(T, N, K), e.tp_overlap_pipeline_splits, rs_ms, slowdown=sm_p)
            fx, fe = fx + c, fe + x
        for T, N, K in (proj, fc2):                     # backward all-gather of dY: ring exchange
            chunk = costs.gemm_ms(max(1, T // n), K, N, backward=True, **gkw) + costs.gemm_ms(
                K, N, max(1, T // n), backward=True, **gkw)
            c, x = ring_exchange(chunk, n, ag_dy, slowdown=ce)
            bx, be = bx + c, be + x
        for T, N, K in (qkv, fc1):                      # backward bulk: re-gather | data grad, RS | weight grad
            if e.sp_regathers_input_for_wgrad:
                c, x = bulk(dgrad(T, N, K), ag_ms, slowdown=sm_b)
            else:
                c, x = dgrad(T, N, K), 0.0
            bx, be = bx + c, be + x
            c, x = bulk(wgrad(T, N, K), rs_ms, slowdown=sm_b)
            bx, be = bx + c, be + x
    else:                                               # async_tp: ring steps everywhere
        for T, N, K in (qkv, fc1):
            c, x = ring_exchange(mm(T / n, N, K), n, ag_fwd_ms, slowdown=ce)
            fx, fe = fx + c, fe + x
        for T, N, K in (proj, fc2):
            c, x = ring_exchange(mm(T / n, N, K), n, rs_ms, slowdown=ce, last_exposed=True)
            fx, fe = fx + c, fe + x
        for T, N, K in (proj, fc2):                     # dY all-gather beside the data gradient
            c, x = ring_exchange(costs.gemm_ms(max(1, T // n), K, N, backward=True, **gkw), n, ag_dy,
                                         slowdown=ce)
            bx, be = bx + c + wgrad(T, N, K), be + x
        for T, N, K in (qkv, fc1):                      # data gradient's reduce-scatter
            c, x = ring_exchange(costs.gemm_ms(max(1, T // n), K, N, backward=True, **gkw), n, rs_ms,
                                         slowdown=ce, last_exposed=True)
            bx, be = bx + c + wgrad(T, N, K), be + x
    return fx - gemm_fwd, fe, bx - gemm_bwd, be
