"""Engine-scoped extra costs of an MoE layer's routed path where the engine runs it in FP32 (torchtitan 0.2.2
without FSDP: :attr:`autotune.spec.engines.EngineProfile.moe_fp32_path_without_fsdp`), its selective-recompute
re-run of the routed experts (``sac_recomputes_routed_experts``) and every-step gradient clipping
(``grad_clip_bytes_per_param``). Sources of the engine facts: autotune/engines/torchtitan/releases.yaml
(release 0.2 overrides). Every term is bytes derived from the layer's shapes over the existing H200 profile's
memory-bound rates (autotune/data/calibration/h200.yaml ``memory_bound_ops``: ``cast`` for dtype conversion,
the generic rate for the index copies, ``adamw`` for the foreach passes over the gradients); nothing is fitted
to the step times of docs/results/engines/torchtitan-moe-profile-h200x1-2026-12-03/."""

from __future__ import annotations

from typing import Any

FP32, BF16 = 4, 2  # bytes per element


def fp32_path(cb: Any) -> bool:
    """The engine runs the routed path in FP32: its fact is set and the plan has no FSDP (ZeRO < 2, or a
    sharding group of one rank: torchtitan applies fully_shard only when dp_shard x cp > 1)."""
    p = cb.p
    if not getattr(cb.engine, "moe_fp32_path_without_fsdp", False):
        return False
    return p.zero_stage < 2 or p.dp_degree * p.cp_degree <= 1


#: In-training bandwidths (GB/s) of the index and copy kernels of torchtitan 0.2.2's FP32 routed path on one H200,
#: measured: the kernel times of the 2026-12-03 step trace of Qwen3-30B-A3B L6 (mb 4 x 1, compile, no AC;
#: docs/results/engines/torchtitan-moe-profile-h200x1-2026-12-03/a_mb4_none_compile/profile.json, fast step,
#: ``top_kernels_25`` / ``by_aten_op_top40`` / ``by_autograd_node_top30``) over the bytes of the op inventory of
#: :func:`routed_index_ms` (C = 131,072 copies x h = 2,048, FP32: 8 C h = 2.147 GB a gather, scatter or copy):
#:
#: * ``gather``: ``vectorized_gather_kernel`` 5.779 ms fwd (13 calls) + 7.010 ms bwd (12): 24 C-row gathers of
#:   8 C h B in 12.789 ms -> 4,029 GB/s;
#: * ``index_put``: ``index_put_kernel`` (non-accumulating scatter) 15.492 ms for 12 calls -> 1,663 GB/s;
#: * ``index_put_accumulate``: the gathers' backward, aten ``_index_put_impl_`` with accumulate (sort +
#:   ``indexing_backward_kernel<float>``) 13.292 ms for 12 calls -> 1,938 GB/s;
#: * ``copy``: ``aten::vstack`` 3.226 ms (6 x 8 C h), ``aten::zeros`` 1.373 ms (6 x 4 C h), SliceBackward0 4.424 ms
#:   (6 x 12 C h: zeros + copy), the D2D copies of the vstack's backward 3.049 ms (6 x 8 C h): 192 C h B in
#:   12.072 ms -> 4,268 GB/s;
#: * ``bmm_combine``: the score-weighted combine ``torch.bmm(top_scores, routed_output_unsorted.float())``,
#:   memory-bound: fwd 2.979 ms (6 x (4 C h + 4 n h)), BmmBackward0 7.261 ms (6 x 2 (4 C h + 4 n h)):
#:   21.7 GB in 10.24 ms -> 2,122 GB/s.
#:
#: These are kernel rates, taken from one trace, not from any step time; the Qwen3 trials share the kernels (in
#: sample for the rates), DeepSeek 16B (64 experts, top-6, other shapes) does not. Other GPUs: scaled with the
#: profile's generic memory-bound bandwidth (:func:`h200_rate_ms`).
TRACE_GBS = {"gather": 4029.0, "index_put": 1663.0, "index_put_accumulate": 1938.0, "copy": 4268.0,
             "bmm_combine": 2122.0}


def h200_rate_ms(costs: Any, nbytes: float, h200_gbs: float) -> float:
    """``nbytes`` through a kernel measured in training on the H200 at ``h200_gbs`` GB/s, ms: the stand-alone
    costs' generic memory-bound time (no in-training factor: the rate is an in-training one) times the shipped
    H200 calibration's generic bandwidth over ``h200_gbs`` (so on another GPU or profile the rate scales with the
    generic bandwidth; on the H200 it is ``nbytes / h200_gbs``)."""
    from autotune.cost.calibration import default_calibration

    raw = getattr(costs, "inner", costs)
    return raw.memory_bound_ms(nbytes) * default_calibration("h200.yaml").memory_bound_bandwidth_gbs / h200_gbs


def _trace_ms(cb: Any, nbytes: float, op: str) -> float:
    """``nbytes`` through a routed-path kernel of class ``op`` (:data:`TRACE_GBS`), ms (:func:`h200_rate_ms`)."""
    return h200_rate_ms(cb.costs, nbytes, TRACE_GBS[op])


def routed_index_ms(cb: Any, n: float, copies: float, h: int) -> tuple[float, float]:
    """(forward, backward) ms of the FP32 routed path's index and copy kernels, one MoE layer per micro-batch.

    ``n``: the rank's tokens; ``copies``: its routed token copies C (n x top_k, balanced); ``h``: hidden size.
    Replaces the base cost model's BF16 permute / unpermute on this path. Inventory (torchtitan v0.2.2
    models/moe/moe.py ``MoE.forward``, models/moe/utils.py ``_permute`` / ``_unpermute``; FP32 rows of 4 h B):

    * forward: gather ``x[token_indices_experts_sorted // top_k]`` (8 C h B); ``torch.vstack`` with a zero row
      (8 C h); gather ``x[permuted_indices, :]`` (8 C h); scatter ``out_unpermuted[permuted_indices, :] = out``
      (8 C h); ``torch.zeros`` of the unsorted output (4 C h); scatter ``routed_output_unsorted[idx] = ...``
      (8 C h); the combine ``bmm`` (4 C h + 4 n h);
    * backward: the combine's backward (2 (4 C h + 4 n h)); each scatter's gradient is a gather (2 x 8 C h);
      the slice ``out_unpermuted[:-1]`` (zeros + copy, 12 C h); the vstack's (8 C h); each gather's gradient
      is an accumulating scatter (2 x 8 C h).

    The padding rows of ``generate_permute_indices`` (at most 8 per local expert) are left out (<1% of C).
    0 when the plan is not on the FP32 path (:func:`fp32_path`).
    """
    if not fp32_path(cb):
        return 0.0, 0.0
    rows, tok = FP32 * float(copies) * h, FP32 * float(n) * h
    t = _trace_ms
    fwd = (t(cb, 2 * 2 * rows, "gather") + t(cb, 2 * rows + rows, "copy") + t(cb, 2 * 2 * rows, "index_put")
           + t(cb, rows + tok, "bmm_combine"))
    bwd = (t(cb, 2 * (rows + tok), "bmm_combine") + t(cb, 2 * 2 * rows, "gather") + t(cb, 3 * rows + 2 * rows, "copy")
           + t(cb, 2 * 2 * rows, "index_put_accumulate"))
    return fwd, bwd


def routed_path_ms(cb: Any, n: float, copies: float, h: int, expert_weight_params: float) -> tuple[float, float]:
    """Extra (forward, backward) ms of one MoE layer per micro-batch on the FP32 routed path, 0 otherwise.

    ``n``: the rank's tokens; ``copies``: its routed token copies (n x top_k, balanced); ``h``: hidden size;
    ``expert_weight_params``: the rank's routed-expert weights of the layer (E/EP experts x 3 h f for a gated
    MLP). Terms (torchtitan v0.2.2 models/moe/moe.py ``_run_experts_grouped_mm``, models/moe/utils.py):

    * the index and copy kernels of the permutation in FP32 (:func:`routed_index_ms`; the caller drops the
      base model's BF16 permutation on this path);
    * routed-row casts: ``x.bfloat16()`` before the first grouped GEMM (read 4 B, write 2 B a copy element)
      and ``.type_as(x)`` after the last (read 2, write 4): 2 x 6 copies h B forward; their gradients the same
      backward; at the ``cast`` rate;
    * expert-weight casts: ``w.bfloat16()`` of each projection at every call, per micro-batch: 6 B per weight
      forward (read FP32, write BF16); backward casts the BF16 weight gradient back to FP32 (6 B); ``cast``.
    """
    if not fp32_path(cb):
        return 0.0, 0.0
    idx_f, idx_b = routed_index_ms(cb, n, copies, h)
    rows = cb._memory_bound_ms(2 * (FP32 + BF16) * copies * h, "cast")
    wcast = cb._memory_bound_ms((FP32 + BF16) * expert_weight_params, "cast")
    return idx_f + rows + wcast, idx_b + rows + wcast


def saved_weight_copy_bytes(engine: Any, plan: Any, expert_weight_params: float) -> float:
    """Bytes one MoE layer keeps per in-flight micro-batch for its backward on the FP32 routed path (no FSDP,
    no recompute): the BF16 copies ``w.bfloat16()`` makes of the rank's expert weights for each grouped GEMM
    (torchtitan v0.2.2 models/moe/moe.py ``_run_experts_grouped_mm``; autograd saves torch._grouped_mm's BF16
    weight operand for the data gradient), 2 B per weight (``expert_weight_params``: the rank's routed-expert
    weights of the layer). 0 for any other engine, with FSDP (the all-gathered weights are BF16 already) and
    under recompute (selective on an engine whose SAC re-runs the routed experts, or full: re-made in backward).
    Whether inductor's partitioner re-makes the casts in backward under torch.compile instead of saving them
    was not measured (no memory profile): the term is the eager graph's."""
    if not getattr(engine, "moe_fp32_path_without_fsdp", False):
        return 0.0
    if plan.zero_stage >= 2 and plan.dp_degree * plan.cp_degree > 1:
        return 0.0
    rc = plan.recompute
    if rc == "full" or (rc == "selective" and getattr(engine, "sac_recomputes_routed_experts", False)):
        return 0.0
    return BF16 * expert_weight_params


def fp32_saved_terms(engine: Any, plan: Any, copies: float, h: int, f: int) -> dict[str, int]:
    """Bytes one MoE layer saves for backward on the FP32 routed path beyond the Megatron-style expert terms of
    :func:`autotune.cost.moe.moe_activation_terms`, one micro-batch, without recompute (under the engine's SAC or
    full recompute the routed part is re-run: nothing here). ``copies``: the rank's routed token copies C;
    ``h``: hidden size; ``f``: the expert FFN width on the rank. torchtitan v0.2.2 models/moe/moe.py:

    * ``tt_combine_fp32``: the eager combine ``torch.bmm(top_scores, routed_output_unsorted.float())`` keeps its
      FP32 C x h operand for the scores' gradient (4 C h B); MoE.forward's dispatch and combine are not
      compiled (models/llama4/infra/parallelize.py ``apply_compile`` compiles the MoE's children, not its own
      forward), so in both modes;
    * eager only (``plan.compile`` off): ``_run_experts_grouped_mm`` calls ``x.bfloat16()`` once per gate and up
      projection, so autograd keeps two BF16 copies of the routed rows (one more than ``dispatched``: 2 C h),
      and ``silu(h1) * h3`` keeps both factors besides h1 (one more f-wide tensor than ``expert_fc1`` +
      ``expert_act``: 2 C f). torch.compile's graph computes the cast once (not measured apart: the compiled
      trials' memory is the check).

    Empty for any other engine or plan (:func:`saved_weight_copy_bytes`' conditions for the path)."""
    if not getattr(engine, "moe_fp32_path_without_fsdp", False) or plan.recompute != "none":
        return {}
    if plan.zero_stage >= 2 and plan.dp_degree * plan.cp_degree > 1:
        return {}
    out = {"tt_combine_fp32": int(FP32 * copies * h)}
    if not plan.compile:
        out["tt_eager_x_bf16"] = int(BF16 * copies * h)
        out["tt_eager_act"] = int(BF16 * copies * f)
    return out


#: FlexAttention in training on one H200, TFLOP/s by the cost model's causal convention (forward 2 S^2 d H B with
#: d the mean of the query-key and value head widths, backward 2.5x that), measured: the flex kernels
#: (``triton_tem_fused_*flex_attention*``) of the 2026-12-04 step traces of torchtitan 0.2.2's DeepSeek 16B
#: flavour at 6 layers (S 4096, H 16, d_qk 192, d_v 128 -> d 160, B 4; 343.6 GFLOP forward a layer):
#: forward 7.38 ms (compiled plan) and 6.90 ms (eager) for 6 layers, mean 1.190 ms a layer -> 288.8; backward
#: 38.47 ms in both, 6.41 ms a layer -> 134.0 (docs/results/engines/torchtitan-moe-profile-h200x1-2026-12-04/).
#: One shape: other sequence lengths and widths are ASSUMED to run at the same rates; other GPUs scale with the
#: profile's compute scale. Chosen after the DeepSeek trials of 2026-12-04b were predicted 8-14% too fast (the
#: trace was taken to find out why); the rates are kernel times, not step times.
FLEX_TFLOPS = {"fwd": 288.8, "bwd": 134.0}


def flex_attention_ms(costs: Any, *, batch: int, seq_len: int, heads: int, head_dim: int,
                      backward: bool = False) -> float:
    """Causal FlexAttention of one layer per micro-batch on the rank, ms (torchtitan's deepseek_v3 flavours:
    :attr:`~autotune.spec.engines.EngineProfile.mla_flex_attention`), at :data:`FLEX_TFLOPS` (in-training
    rates: no in-training factor on top). ``head_dim``: the mean of the query-key and value widths. Answers the
    ``flex`` kernel of :meth:`autotune.cost.op_costs.CalibratedCosts.attention_kernel_ms`."""
    raw = getattr(costs, "inner", costs)
    scale = float(getattr(raw, "compute_scale", 1.0))
    fwd_flops = 2.0 * seq_len * seq_len * head_dim * heads * batch
    flops = fwd_flops * (2.5 if backward else 1.0)
    return flops / (FLEX_TFLOPS["bwd" if backward else "fwd"] * scale * 1e9)


def sac_recompute_ms(cb: Any, routed_fwd_ms: float) -> float:
    """Backward re-run of the routed experts' forward under the engine's selective recompute, ms: the whole
    forward of the routed part (``routed_fwd_ms``: grouped GEMMs, activation, permutation, the FP32 path's
    casts) when the engine's SAC saves none of it (torchtitan v0.2.2 models/qwen3/infra/parallelize.py
    ``_op_sac_save_list`` has no aten._grouped_mm), else 0."""
    p = cb.p
    if p.recompute != "selective" or p.recompute_modules is not None:
        return 0.0
    return routed_fwd_ms if getattr(cb.engine, "sac_recomputes_routed_experts", False) else 0.0


def grad_clip_bytes_per_param(cb: Any) -> int:
    """Bytes per gradient element the engine's every-step gradient clipping moves
    (:attr:`~autotune.spec.engines.EngineProfile.grad_clip_bytes_per_param`), priced with the optimizer pass.
    Only for MoE models: the issue-39 brief keeps every dense prediction where it is (the engine clips
    dense models too; pricing that is left to a dense re-validation)."""
    if not getattr(cb.m, "num_experts", 0):
        return 0
    return int(getattr(cb.engine, "grad_clip_bytes_per_param", 0))


__all__ = ["fp32_path", "routed_index_ms", "routed_path_ms", "saved_weight_copy_bytes", "fp32_saved_terms", "flex_attention_ms", "h200_rate_ms", "sac_recompute_ms", "grad_clip_bytes_per_param"]
