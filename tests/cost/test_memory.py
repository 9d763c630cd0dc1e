"""Tests of autotune.cost.memory against values worked out by hand.

Llama 3.1 8B numbers used throughout (models.py docstring; Llama 3 paper Table 3):
  h = 4096, V = 128256, L = 32, heads 32, kv heads 8, head dim 128, f = 14336
  params_per_layer = h(q + 2kv) + q h + 3 h f + 2h
                   = 4096*6144 + 4096*4096 + 3*4096*14336 + 8192
                   = 25,165,824 + 16,777,216 + 176,160,768 + 8,192 = 218,112,000
  V h = 128256 * 4096 = 525,336,576
  N = 2 V h + L ppl + h = 1,050,673,152 + 6,979,584,000 + 4,096 = 8,030,261,248
At s = 8192, b = 1 one h-sized bf16 tensor is 2 s b h = 2*8192*4096 = 67,108,864 bytes.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

import json
from pathlib import Path

from autotune.cost import memory as _memory
from autotune.spec.engines import get_engine
from autotune.errors import ConfigError, PlanError
from autotune.spec.hardware import get_gpu
from autotune.cost.memory import (COMPILED_OVER_EAGER, DEFAULT_FRAGMENTATION, MemoryEstimate, StageMemory,
                             inflight_microbatches)
from autotune.spec.models import get_model
from autotune.spec.plan import Plan, Workload

#: The hand derivations below are of the minimal saved set (Korthikanti et al. 2022's count, what an
#: engine with fused kernels keeps) with gradients alive at the peak, on the native engine's other
#: facts (FP32 masters, BF16 compute copies). The native runtime's own eager saved set and its freed
#: gradients are tested at the end of this file, against the same numbers.
MINIMAL = replace(get_engine("native"), activation_accounting="minimal", frees_grads_between_steps=False)


def activation_bytes_per_layer(*args, **kw):
    kw.setdefault("engine", MINIMAL)
    return _memory.activation_bytes_per_layer(*args, **kw)


def estimate_memory(*args, **kw):
    kw.setdefault("engine", MINIMAL)
    return _memory.estimate_memory(*args, **kw)

M8 = get_model("8b")
M405 = get_model("405b")
H200 = get_gpu("h200")
W = Workload(seq_len=8192, global_batch_size=8)

N8 = 8_030_261_248
PPL8 = 218_112_000
VH8 = 525_336_576
SBH = 67_108_864                 # 2 s b h bytes at s=8192, b=1, h=4096
# One 8B layer, s=8192, b=1, t=1, no recompute (Korthikanti 2022 Table 2 re-derived for Llama):
#   attention: norm input 2sbh           =  67,108,864
#              norm output 2sbh          =  67,108,864
#              Q,K,V 2sb(q+2kv) = 2*8192*(4096+2*1024)   = 100,663,296
#              attention output 2sbq = 2*8192*4096       =  67,108,864
#              logsumexp 4 s b heads = 4*8192*32         =   1,048,576
#              -> 303,038,464
#   MLP:       norm input + norm output 2 * 67,108,864   = 134,217,728
#              gate + up 2*2sbf = 4*8192*14336           = 469,762,048
#              SwiGLU output 2sbf = 2*8192*14336         = 234,881,024
#              -> 838,860,800
#   total 303,038,464 + 838,860,800 = 1,141,899,264 bytes (1.063 GiB)
LAYER8 = 1_141_899_264
LOGITS8 = 8192 * 128256 * 12     # s b V x 12 (FP32 loss: saved log-softmax, its gradient in and out) = 12,608,077,824
COPIES8 = 2 * N8                 # BF16 compute copies of all FP32 master weights = 16,060,522,496
ROOT8 = 2 * (2 * VH8 + 4096)     # ZeRO-3: BF16 copies of embedding + LM head + final norm only = 2,101,354,496
NO_FRAG = {"none": 0.0}          # isolate the terms from the allocator overhead


def est(model=M8, gpu=H200, workload=W, fragmentation=None, **plan):
    return estimate_memory(model, Plan(**plan), gpu, workload, fragmentation=fragmentation)


# ------------------------------------------------------------------ model states
def test_zero3_tp2_dp4_worked_check_shards_over_dp_only():
    # 8B on 8 GPUs, TP=2, DP=4, PP=1, ZeRO-3: all 16 bytes (FP32 weight 4 + FP32 grad 4 + Adam m, v 8)
    # sharded over DP (4), parameters over TP (2).
    # Per-GPU parameters: layers over TP, vocab-parallel embedding and LM head over TP, final norm whole:
    #   32*218,112,000/2 + 2*(128256/2)*4096 + 4096 = 3,489,792,000 + 525,336,576 + 4,096 = 4,015,132,672
    #   x 16 bytes / 4 = 16,060,530,688 bytes  (~ N x 16 / 2 / 4 = 16,060,522,496; the 8 KiB gap is the
    #   final RMSNorm replicated over TP). NOT 8.03 GB, which would shard over TP a second time.
    e = est(tp_degree=2, dp_degree=4, zero_stage=3)
    (s,) = e.stages
    assert s.model_state_bytes == 16_060_530_688
    assert s.weights_bytes == s.grads_bytes == 4 * 1_003_783_168
    assert s.optimizer_bytes == 8 * 1_003_783_168
    assert s.model_state_bytes == pytest.approx(N8 * 16 / 2 / 4, rel=1e-6)
    assert s.model_state_bytes == pytest.approx(16.06e9, rel=1e-3)


@pytest.mark.parametrize("zero, weights, grads, optim", [
    # 8B, TP=1, PP=1, DP=8: a GPU holds all N parameters; N/8 = 1,003,782,656. FP32 weights 4, FP32
    # grads 4, Adam m + v 8 bytes; ZeRO-1 shards the 8, ZeRO-2 also the grads and the FP32 weights at
    # rest (FSDP2 without resharding after forward), ZeRO-3 likewise (it differs in the BF16 copies).
    (0, 4 * N8, 4 * N8, 8 * N8),                           # 32,121,044,992 / same / 64,242,089,984
    (1, 4 * N8, 4 * N8, 8 * 1_003_782_656),                # optimizer 8,030,261,248
    (2, 4 * 1_003_782_656, 4 * 1_003_782_656, 8 * 1_003_782_656),  # FSDP2 shards FP32 weights at rest too
    (3, 4 * 1_003_782_656, 4 * 1_003_782_656, 8 * 1_003_782_656),  # 16N/8 = 16,060,522,496 total
])
def test_zero_stages_state_bytes(zero, weights, grads, optim):
    (s,) = est(dp_degree=8, zero_stage=zero).stages
    assert (s.weights_bytes, s.grads_bytes, s.optimizer_bytes) == (weights, grads, optim)
    # DP x CP is the sharding group: DP=2 x CP=4 shards exactly like DP=8.
    (s_cp,) = est(dp_degree=2, cp_degree=4, zero_stage=zero).stages
    assert (s_cp.weights_bytes, s_cp.grads_bytes, s_cp.optimizer_bytes) == (weights, grads, optim)


def test_zero_without_dp_group_shards_nothing():
    # DP x CP = 1: ZeRO-3 has nobody to shard with -> 16 N bytes = 128,484,179,968.
    (s,) = est(zero_stage=3).stages
    assert s.model_state_bytes == 16 * N8 == 128_484_179_968


def test_embedding_on_first_and_lm_head_on_last_stage():
    # PP=2, GPipe, m=1 (both stages hold one micro-batch), TP=DP=1, ZeRO-0, no allocator overhead.
    #   stage 0 params: 16 layers + embedding = 3,489,792,000 + 525,336,576        = 4,015,128,576
    #   stage 1 params: 16 layers + LM head + norm = 3,489,792,000 + 525,336,576 + 4,096 = 4,015,132,672
    #   (sum = 8,030,261,248 = N)
    #   activations: stage 0 = 16 x LAYER8 + embedding output 2sbh; stage 1 = 16 x LAYER8
    #   transient: BF16 copies of each stage's weights (2 x params) and, on stage 1, the logits
    #   8192 x 128256 x 12 = 12,608,077,824 + the BF16 stage output the pipeline keeps, 8192 x 128256 x 2
    #   = 2,101,346,304; no DP buckets (DP=1)
    #   total(1) - total(0) = model states 16 x 4,096 - embedding output 67,108,864 + logits
    #   14,709,424,128 + copies 2 x 4,096 = 65,536 - 67,108,864 + 14,709,424,128 + 8,192 = 14,642,388,992
    e = est(pp_degree=2, num_micro_batches=1, pipeline_schedule="gpipe", zero_stage=0,
            fragmentation=NO_FRAG)
    s0, s1 = e.stages
    assert s0.weights_bytes == 4 * 4_015_128_576
    assert s1.weights_bytes == 4 * 4_015_132_672
    assert (s0.weights_bytes + s1.weights_bytes) // 4 == N8
    assert s0.activations_bytes == 16 * LAYER8 + SBH
    assert s1.activations_bytes == 16 * LAYER8
    assert (s0.transient_bytes, s1.transient_bytes) == (2 * 4_015_128_576,
                                                        LOGITS8 + 2_101_346_304 + 2 * 4_015_132_672)
    assert s1.total_bytes - s0.total_bytes == 14_642_388_992
    assert e.peak_stage == 1
    # GPipe with m = 4: the last stage also keeps 3 other micro-batches' FP32 log-softmax output and BF16
    # stage output until their backward: 3 x 8192 x 128256 x (4 + 2) = 18,912,116,736 more.
    e4 = est(pp_degree=2, num_micro_batches=4, pipeline_schedule="gpipe", zero_stage=0, fragmentation=NO_FRAG)
    assert e4.stages[1].transient_bytes - s1.transient_bytes == 18_912_116_736


def test_tied_embeddings_held_on_both_end_stages_once_without_pp():
    tied = replace(M8, name="tied-8b", tied_embeddings=True)
    # PP=2: the last stage keeps its copy of the shared V h matrix -> same as untied: 4,015,132,672.
    s0, s1 = est(model=tied, pp_degree=2, zero_stage=0).stages
    assert s0.weights_bytes == 4 * 4_015_128_576
    assert s1.weights_bytes == 4 * 4_015_132_672
    # PP=1: one matrix only: N - V h = 8,030,261,248 - 525,336,576 = 7,504,924,672.
    (s,) = est(model=tied, zero_stage=0).stages
    assert s.weights_bytes == 4 * 7_504_924_672


# ------------------------------------------------------------------ activations
def test_activation_bytes_per_layer_8b_by_hand():
    assert activation_bytes_per_layer(M8, Plan(), W) == LAYER8


def test_sequence_parallel_divides_h_terms_by_t():
    # t = 8: the non-h terms at t=1 sum to 100,663,296 + 67,108,864 + 1,048,576 + 469,762,048
    #   + 234,881,024 = 873,463,808 -> /8 = 109,182,976.
    # Without SP: + 4 x 67,108,864 = 268,435,456 whole -> 377,618,432.
    # With SP:    + 268,435,456 / 8 = 33,554,432        -> 142,737,408.
    no_sp = activation_bytes_per_layer(M8, Plan(tp_degree=8), W)
    sp = activation_bytes_per_layer(M8, Plan(tp_degree=8, sequence_parallel=True), W)
    assert no_sp == 377_618_432
    assert sp == 142_737_408
    assert no_sp - sp == 4 * SBH * 7 // 8
    # SP with t = 1 is inactive: nothing changes.
    assert activation_bytes_per_layer(M8, Plan(sequence_parallel=True), W) == LAYER8


def test_context_parallel_halves_sequence_per_rank():
    # Every term is linear in s = seq_len / cp: cp=2 -> LAYER8 / 2 = 570,949,632.
    assert activation_bytes_per_layer(M8, Plan(cp_degree=2), W) == 570_949_632


def test_plain_gelu_mlp_terms():
    # Plain MLP: fc1 2sbf + GeLU output 2sbf = 2 x 234,881,024 instead of gate+up+SwiGLU 3 x 234,881,024.
    gelu = replace(M8, name="gelu-8b", gated_mlp=False)
    assert activation_bytes_per_layer(gelu, Plan(), W) == LAYER8 - 234_881_024
    # selective drops the GeLU output and the attention output.
    assert activation_bytes_per_layer(gelu, Plan(recompute="selective"), W) == \
        LAYER8 - 234_881_024 - 234_881_024 - SBH


def test_recompute_per_layer_and_ordering():
    # selective drops attention output (67,108,864) and SwiGLU output (234,881,024): 839,909,376.
    # full keeps only the layer input 2sbh = 67,108,864.
    assert activation_bytes_per_layer(M8, Plan(recompute="selective"), W) == 839_909_376
    assert activation_bytes_per_layer(M8, Plan(recompute="full"), W) == SBH
    # full + SP with t=4: the layer input is split too -> 16,777,216.
    assert activation_bytes_per_layer(M8, Plan(recompute="full", tp_degree=4, sequence_parallel=True),
                                      W) == SBH // 4
    a = {r: est(recompute=r).stages[0] for r in ("none", "selective", "full")}
    assert a["none"].activations_bytes > a["selective"].activations_bytes > a["full"].activations_bytes
    assert a["none"].total_bytes > a["selective"].total_bytes > a["full"].total_bytes
    # pp=1: 32 layers + embedding output, one micro-batch.
    assert a["none"].activations_bytes == 32 * LAYER8 + SBH            # 36,607,885,312
    assert a["full"].activations_bytes == 32 * SBH + SBH               # 2,214,592,512
    # full recompute's backward working set: one layer's no-recompute activations, as transient.
    assert a["full"].transient_bytes - a["none"].transient_bytes == LAYER8


# ------------------------------------------------------------------ pipeline schedules
def test_1f1b_first_stage_holds_p_last_holds_one():
    # PP=4, m=8, 8 layers per stage; stage i holds min(4 - i, 8) micro-batches.
    e = est(pp_degree=4, num_micro_batches=8)
    assert [s.num_inflight_microbatches for s in e.stages] == [4, 3, 2, 1]
    assert e.stages[3].activations_bytes == 8 * LAYER8 * 1               # 9,135,194,112
    assert e.stages[0].activations_bytes == 4 * (8 * LAYER8 + SBH)       # 36,809,211,904
    assert e.peak_stage == 0
    # fewer micro-batches than stages: min(p - i, m) with m = 2 -> [2, 2, 2, 1]
    e2 = est(pp_degree=4, num_micro_batches=2)
    assert [s.num_inflight_microbatches for s in e2.stages] == [2, 2, 2, 1]


def test_gpipe_holds_all_microbatches():
    e = est(pp_degree=4, num_micro_batches=8, pipeline_schedule="gpipe")
    assert [s.num_inflight_microbatches for s in e.stages] == [8, 8, 8, 8]
    assert e.stages[3].activations_bytes == 8 * 8 * LAYER8


def test_interleaved_counted_from_the_schedule_and_no_pipeline():
    # interleaved, p=4, v=2, m=8, 8B: 8 virtual stages of 4 layers, rank r holds chunks r and r+4.
    # Megatron-LM's order (autotune.cost.schedule.schedule_order): the k-th chunk-forward is chunk (k//4)%2
    # of micro-batch (k//8)*4 + k%4; rank r warms up with (4-r-1)*2 + (2-1)*4 chunk-forwards, then
    # alternates F, B. Rank 0: 10 warm-up passes + the first steady F = 11 alive chunk passes of half
    # its layers -> 5.5 (Korthikanti et al. 2022 Sec. 4.2.3: p (1 + (p-1)/(p v)) = 4 x 1.375 = 5.5;
    # the closed form this replaces, 1 + (p-1)/(p m), gave 4.375). Rank 3: 4 + 1 = 5 passes -> 2.5
    # (it held 1.09375 by the old closed form).
    p = Plan(pp_degree=4, vpp_degree=2, num_micro_batches=8, pipeline_schedule="interleaved_1f1b")
    assert inflight_microbatches(p, 0) == 5.5
    assert inflight_microbatches(p, 3) == 2.5
    e = estimate_memory(M8, p, H200, W)
    assert [s.num_layers for s in e.stages] == [8, 8, 8, 8]     # 2 chunks of 4 layers per rank
    assert [s.num_inflight_microbatches for s in e.stages] == [5.5, 4.5, 3.5, 2.5]   # p + (p-2r-1)/v
    assert e.stages[3].activations_bytes == 5 * 4 * LAYER8      # 5 chunk passes x 4 layers
    # Rank 0's embedding output lives with chunk 0's forwards. Its order: F c0 mb0-3, F c1 mb0-3,
    # F c0 mb4-5 (warm-up), F c0 mb6, B c1 mb0, F c0 mb7 -> chunk 0 holds 8 micro-batches while 11
    # chunk passes (44 layers) are alive, the most of both at once: 44 x LAYER8 + 8 x SBH.
    assert e.stages[0].activations_bytes == 44 * LAYER8 + 8 * SBH
    # Rank 3's in-flight logits live with its last chunk (virtual stage 7, the LM head), which never
    # holds more than 1 micro-batch (each F of chunk 1 is followed by its own B): the same logits
    # buffers as 1F1B's last stage, whose single chunk holds 1. Same parameters per rank (8 layers),
    # so the transient terms are equal.
    e1 = estimate_memory(M8, replace(p, pipeline_schedule="1f1b", vpp_degree=1), H200, W)
    assert e.stages[3].transient_bytes == e1.stages[3].transient_bytes
    # pp=1: one micro-batch whatever the schedule and count (gradient accumulation).
    assert inflight_microbatches(Plan(num_micro_batches=16, pipeline_schedule="gpipe"), 0) == 1
    with pytest.raises(PlanError, match="valid stages are 0 .. 3"):
        inflight_microbatches(p, 4)


def test_uneven_stage_layers_per_rank():
    # stage_layers per virtual stage (pp=2, v=2): [3, 5, 6, 2]; rank r owns virtual stages r, r+p:
    # rank 0 -> stages 0 and 2 -> 3 + 6 = 9 layers; rank 1 -> stages 1 and 3 -> 5 + 2 = 7 layers.
    m16 = replace(M8, name="16-layer", num_layers=16)
    p = Plan(pp_degree=2, vpp_degree=2, num_micro_batches=4, pipeline_schedule="interleaved_1f1b",
             stage_layers=(3, 5, 6, 2))
    e = estimate_memory(m16, p, H200, W)
    assert [s.num_layers for s in e.stages] == [3 + 6, 5 + 2]
    # In-flight, weighted by chunk layers (hand count in tests/cost/test_schedule.py, p=2 v=2 m=4): rank 0
    # peaks at 21 of its 9 layers alive (chunk 0 x 3 micro-batches x 3 layers + chunk 1 x 2 x 6), rank
    # 1 at 15 of 7 (chunk 0 x 3 x 5). Rank 0's other candidate instant, (18 layers, 4 chunk-0
    # micro-batches), holds less: 21 L + 3 SBH > 18 L + 4 SBH.
    assert [s.num_inflight_microbatches for s in e.stages] == pytest.approx([21 / 9, 15 / 7])
    assert e.stages[0].activations_bytes == 21 * LAYER8 + 3 * SBH
    assert e.stages[1].activations_bytes == 15 * LAYER8
    assert inflight_microbatches(p, 1, p.layers_per_virtual_stage(16)) == pytest.approx(15 / 7)


def test_llama3_405b_split_counts_its_empty_chunks():
    # Llama 3 405B (paper Table 4): TP 8, PP 16, v = 8, 126 layers in 128 virtual stages, the first and
    # last empty; m = 2048 sequences / DP 64 = 32. Hand count (tests/cost/test_schedule.py): rank 0 holds
    # 112 of its 7 layers' passes at the peak -> 16; rank 15, 113 of 7 -> 16.14 (the old closed form:
    # 16.47 and 1.03). Rank 15's last chunk is the empty virtual stage 127 with the LM head: its
    # F is always followed by its B, so 1 micro-batch of logits, no other in flight.
    p = Plan(tp_degree=8, pp_degree=16, dp_degree=64, vpp_degree=8, num_micro_batches=32,
             pipeline_schedule="interleaved_1f1b", sequence_parallel=True, zero_stage=2,
             stage_layers=(0,) + (1,) * 126 + (0,))
    wl = Workload(seq_len=8192, global_batch_size=2048)
    e = estimate_memory(M405, p, get_gpu("h100"), wl, fragmentation=NO_FRAG)
    assert e.stages[0].num_inflight_microbatches == 16.0
    assert e.stages[15].num_inflight_microbatches == pytest.approx(113 / 7)
    act = activation_bytes_per_layer(M405, p, wl)
    assert e.stages[15].activations_bytes == 113 * act
    # rank 0: 112 layers' passes with chunk 0 (embedding output 2sbh/t) at 31 micro-batches, or 111
    # with 32 (schedule_order: the first steady F is chunk 0's 31st, then B of chunk 7, F of chunk 0's
    # 32nd): 112 act + 31 e > 111 act + 32 e since act > e.
    emb = 2 * 8192 * M405.hidden_size // 8
    assert e.stages[0].activations_bytes == 112 * act + 31 * emb


# ------------------------------------------------------------------ transient buffers
def test_transient_buffers():
    base = est(fragmentation=NO_FRAG).stages[0].transient_bytes
    assert base == LOGITS8 + COPIES8           # pp=1: the only stage is the last; all weights copied
    # DP gradient buckets: 2 x 64 MiB = 134,217,728 when dp x cp > 1.
    assert est(dp_degree=8, zero_stage=0).stages[0].transient_bytes - base == 134_217_728
    # ZeRO-3: gathered layer (bf16) 2 x 218,112,000 = 436,224,000, prefetch doubles it; only the root
    # module's (embedding, head, norm) BF16 copies stay: ROOT8 instead of COPIES8.
    z3 = est(dp_degree=8, zero_stage=3).stages[0].transient_bytes
    z3p = est(dp_degree=8, zero_stage=3, param_gather_overlap=True).stages[0].transient_bytes
    assert z3 == LOGITS8 + ROOT8 + 134_217_728 + 436_224_000
    assert z3p - z3 == 436_224_000
    # SP (t=2): logits split over TP (V/2) + one full-sequence all-gathered h tensor 2sbh + BF16 copies
    # of the TP-sharded weights 2 x 4,015,132,672.
    sp = est(tp_degree=2, sequence_parallel=True).stages[0].transient_bytes
    assert sp == LOGITS8 // 2 + SBH + 2 * 4_015_132_672


# ------------------------------------------------------------------ verdicts
def test_405b_tp8_on_8_h200_does_not_fit():
    # 405B, TP=8, PP=DP=1: per GPU >= 405,853,388,800 / 8 = 50.7e9 parameters x 16 bytes = 811.7e9 bytes
    # of model states alone, against H200 usable (139.8 - 1.0) GiB
    # = floor(138.8 x 2^30) = 149,035,365,171 bytes.
    # (Any 8-GPU plan holds >= 16 N / 8 bytes per GPU, since each byte of state lives somewhere.)
    e = est(model=M405, tp_degree=8)
    assert e.capacity_bytes == 149_035_365_171
    assert e.stages[0].model_state_bytes >= 16 * 405_853_388_800 // 8
    assert e.peak_bytes > 5 * e.capacity_bytes
    assert not e.fits


def test_8b_dp8_zero1_fits_on_h200_only_without_the_allocator_reserve():
    # 8B, TP=1, DP=8, ZeRO-1, PP=1, micro-batch 1, seq 8192, no recompute, memory_reclaim none (10%):
    #   weights 4N = 32,121,044,992; grads 4N = 32,121,044,992; optimizer 8N/8 = 8,030,261,248
    #   activations 32 x 1,141,899,264 + 67,108,864 (embedding output) = 36,607,885,312
    #   transient: logits 12,608,077,824 + 2 buckets x 64 MiB 134,217,728 + BF16 copies 2N
    #   16,060,522,496 = 28,802,818,048
    #   subtotal 137,683,054,592; allocator 10% = ceil(13,768,305,459.2) = 13,768,305,460
    #   total 151,451,360,052 bytes = 141.05 GiB > 149,035,365,171 (138.80 GiB) with the reserve, but the
    #   verdict leaves the releasable reserve out (the caching allocator frees cached blocks and retries before
    #   an out-of-memory): 137,683,054,592 <= 149,035,365,171 -> fits, headroom 11,352,310,579
    #   (ZeroRedundancyOptimizer shards only Adam's m and v: FP32 weights and grads stay whole)
    e = est(dp_degree=8, zero_stage=1)
    (s,) = e.stages
    assert s.optimizer_bytes == 8_030_261_248
    assert s.activations_bytes == 36_607_885_312
    assert s.transient_bytes == 28_802_818_048
    assert s.allocator_overhead_bytes == 13_768_305_460
    assert s.total_bytes == 151_451_360_052
    assert e.peak_bytes == 151_451_360_052 and e.live_peak_bytes == 137_683_054_592
    assert e.fits and e.headroom_bytes == 149_035_365_171 - 137_683_054_592 == 11_352_310_579
    # micro-batch 2 doubles the activations and the logits (+36.6 + 12.6 GB): over even without the reserve
    over = est(dp_degree=8, zero_stage=1, micro_batch_size=2)
    assert not over.fits and over.live_peak_bytes > 149_035_365_171


def test_peak_is_max_over_stages_not_average():
    e = est(pp_degree=4, num_micro_batches=8)
    totals = [s.total_bytes for s in e.stages]
    assert e.peak_bytes == max(totals) == totals[0] > sum(totals) / 4
    # fits compares the maximum of the stages' live bytes (totals without the allocator's releasable
    # reserve): a capacity between their mean and their max does not fit.
    live = [s.total_bytes - s.allocator_overhead_bytes for s in e.stages]
    assert e.live_peak_bytes == max(live) == live[0]
    mid = MemoryEstimate(stages=e.stages, capacity_bytes=sum(live) // 4 + 1)
    assert not mid.fits
    assert MemoryEstimate(stages=e.stages, capacity_bytes=max(live)).fits
    assert not MemoryEstimate(stages=e.stages, capacity_bytes=max(live) - 1).fits


# ------------------------------------------------------------------ allocator overhead
@pytest.mark.parametrize("policy, frac", [("none", 0.10), ("empty_cache_per_step", 0.07),
                                          ("empty_cache_per_microbatch", 0.04),
                                          ("expandable_segments", 0.03)])
def test_default_fragmentation_fractions(policy, frac):
    assert DEFAULT_FRAGMENTATION[policy] == frac
    (s,) = est(memory_reclaim=policy).stages
    rest = s.total_bytes - s.allocator_overhead_bytes
    assert s.allocator_overhead_bytes == pytest.approx(frac * rest, abs=1)     # ceil(frac x rest)
    assert s.allocator_overhead_bytes >= frac * rest


def test_fragmentation_override_and_errors():
    (s,) = est(memory_reclaim="expandable_segments", fragmentation={"expandable_segments": 0.0}).stages
    assert s.allocator_overhead_bytes == 0
    # a partial mapping leaves the other policies at their defaults
    (d,) = est(fragmentation={"expandable_segments": 0.0}).stages
    assert d.allocator_overhead_bytes == est().stages[0].allocator_overhead_bytes
    with pytest.raises(ConfigError, match="unknown memory_reclaim policies.*'bogus'"):
        est(fragmentation={"bogus": 0.1})
    with pytest.raises(ConfigError, match=r"fragmentation\['none'\]=1.5"):
        est(fragmentation={"none": 1.5})


# ------------------------------------------------------------------ errors, describe, speed
def test_bad_inputs_raise_plan_errors():
    with pytest.raises(PlanError, match="seq_len=8191 does not split over cp_degree=2"):
        est(workload=Workload(seq_len=8191, global_batch_size=8), cp_degree=2)
    with pytest.raises(PlanError, match="tp_degree=3 does not divide"):
        est(tp_degree=3)
    with pytest.raises(PlanError, match="do not split evenly"):
        est(pp_degree=3)


def test_describe_names_every_term():
    e = est(pp_degree=2, num_micro_batches=4, dp_degree=2)
    text = e.describe()
    for word in ("stage", "layers", "in-flight", "weights", "grads", "optimizer", "activations",
                 "transient", "allocator", "total", "capacity", "GiB", "verdict: fits"):
        assert word in text, word
    # one row per stage, each with the stage's total in GiB
    for s in e.stages:
        assert f"{s.total_bytes / 2**30:.2f}" in text
    assert "does NOT fit" in est(model=M405, tp_degree=8).describe()


def test_estimate_is_fast():
    p = Plan(tp_degree=8, pp_degree=8, vpp_degree=2, num_micro_batches=16, dp_degree=16,
             pipeline_schedule="interleaved_1f1b", stage_layers=(7,) + (8,) * 14 + (7,), zero_stage=1)
    # CPU time of this process, not wall time: another process keeping the cores busy does not count
    t0 = time.process_time()
    for _ in range(2000):
        estimate_memory(M405, p, H200, W)
    # ~0.08 ms per call measured; the tuner calls it thousands of times per study (12x margin)
    assert time.process_time() - t0 < 2.0


def test_stage_memory_total_sums_terms():
    s = StageMemory(stage=0, num_layers=1, num_inflight_microbatches=1.0, weights_bytes=1, grads_bytes=2,
                    optimizer_bytes=4, activations_bytes=8, transient_bytes=16, allocator_overhead_bytes=32)
    assert s.total_bytes == 63 and s.model_state_bytes == 7


# ------------------------------------------------------------------ the native runtime's own saved set
def test_native_eager_saved_set_by_hand_and_as_measured():
    # autograd's saved set of runtime/model.py's block (listed tensor by tensor on H200, 2026-12-01),
    # 8B, s = 8192, b = 1, in units of 2sbh = 67,108,864 bytes (one h-sized BF16 tensor):
    #   each RMSNorm: FP32 input 2 + BF16 normalized 1 + BF16 output 1          = 4, x 2 norms = 8
    #   Q 1, K and V repeated to 32 heads 1 + 1 (kv_repeat: 2 x 2sb(q - kv) = 1.5 beyond the 0.5 of
    #   the un-repeated K, V), attention output 1 (the same storage feeds wo)    = 4
    #   gate, up, silu(gate), product: 4 x 2sbf = 4 x 3.5                       = 14
    #   -> 26 units = 1,744,830,464, + logsumexp 4 s heads = 1,048,576           = 1,745,879,040
    native = get_engine("native")
    assert _memory.activation_bytes_per_layer(M8, Plan(), W, engine=native) == 26 * SBH + 1_048_576
    # selective: the checkpointed core keeps un-repeated Q, K, V (1.5) and no logsumexp, the
    # checkpointed SwiGLU's product stays (w2 saves it), silu(gate) goes: 26 - 1.5 - 3.5 = 21 units
    assert _memory.activation_bytes_per_layer(M8, Plan(recompute="selective"), W, engine=native) == 21 * SBH
    # measured on H200 (bench/saved_activations.py): 1,754,333,184 and 1,417,740,288 bytes (the listing's
    # activation-sized tensors: 1,744,830,464 and 1,409,286,144; the rest are per-row statistics)
    rows = _saved_rows()
    assert rows["bf16", "none", False] == pytest.approx(26 * SBH, rel=0.01)
    assert rows["bf16", "selective", False] == pytest.approx(21 * SBH, rel=0.01)


def _saved_rows():
    d = json.loads((Path(__file__).resolve().parents[2] / "docs" / "results"
                    / "saved-activations-h200x1-2026-12-01.json").read_text())
    return {(r["precision"], r["recompute"], r["compile"]): r["saved_bytes"] for r in d["rows"] if "saved_bytes" in r}


def test_compiled_over_eager_ratios_come_from_the_measurement():
    rows = _saved_rows()
    for (kind, rc), ratio in COMPILED_OVER_EAGER.items():
        precisions = ("bf16",) if kind == "bf16" else ("fp8_tensorwise", "fp8_rowwise")
        for prec in precisions:
            assert rows[prec, rc, True] / rows[prec, rc, False] == pytest.approx(ratio, abs=0.0005)
    # applied to the native engine's eager count under compile; full recompute keeps only the input
    native = get_engine("native")
    eager = _memory.activation_bytes_per_layer(M8, Plan(precision="fp8_tensorwise"), W, engine=native)
    comp = _memory.activation_bytes_per_layer(M8, Plan(precision="fp8_tensorwise", compile=True), W, engine=native)
    assert comp == pytest.approx(eager * 0.462, abs=1)
    assert _memory.activation_bytes_per_layer(M8, Plan(recompute="full", compile=True), W, engine=native) == SBH
    # engines without eager accounting are not rescaled (torchtitan: not measured)
    tt = get_engine("torchtitan")
    assert (_memory.activation_bytes_per_layer(M8, Plan(compile=True), W, engine=tt)
            == _memory.activation_bytes_per_layer(M8, Plan(), W, engine=tt))


def test_native_gradients_absent_at_a_peak_before_any_backward():
    native = get_engine("native")
    one = _memory.estimate_memory(M8, Plan(), H200, W, engine=native).stages[0]
    assert one.grads_bytes == 0                       # one micro-batch, set_to_none after the last step
    two = _memory.estimate_memory(M8, Plan(num_micro_batches=2), H200, W, engine=native).stages[0]
    assert two.grads_bytes == 4 * N8                  # the first micro-batch's backward made them
    # DDP keeps them as bucket views (dp 2, overlapped reduction, tp = pp = 1)
    ddp = _memory.estimate_memory(M8, Plan(dp_degree=2, zero_stage=0, dp_grad_reduce_overlap=True,
                                           async_collectives=True), H200, W, engine=native).stages[0]
    assert ddp.grads_bytes == 4 * N8
    # GPipe runs every forward first: none on either rank; 1F1B with m = 4 > p: the first rank reaches its
    # peak again in the steady state, with gradients
    m16 = replace(M8, num_layers=16)
    gp = _memory.estimate_memory(m16, Plan(pp_degree=2, num_micro_batches=4, pipeline_schedule="gpipe"), H200, W,
                                 engine=native)
    assert [s.grads_bytes for s in gp.stages] == [0, 0]
    f1 = _memory.estimate_memory(m16, Plan(pp_degree=2, num_micro_batches=4, pipeline_schedule="1f1b"), H200, W,
                                 engine=native)
    assert all(s.grads_bytes > 0 for s in f1.stages)
    # Megatron's main-grad buffer is persistent
    assert _memory.estimate_memory(M8, Plan(), H200, W, engine="megatron").stages[0].grads_bytes == 4 * N8


def test_pipeline_with_fsdp_accumulates_unsharded_gradients():
    # torch.distributed.pipelining defers FSDP2's reduce-scatter to the step's last backward
    # (facts.yaml pp_defers_fsdp_grad_reduce): with m > 1 the rank's gradients are unsharded FP32
    # (reduce_dtype) until then. 8B at 16 layers, pp 2, dp 2, ZeRO-2, torchtitan: rank 0 holds 8 layers
    # and the embedding: 8 x 218,112,000 + 525,336,576 = 2,270,232,576 parameters -> 4 B each, not / 2.
    m16 = replace(M8, num_layers=16)
    rank0 = 8 * PPL8 + VH8
    plan = Plan(pp_degree=2, dp_degree=2, zero_stage=2, num_micro_batches=4, pipeline_schedule="1f1b")
    e = _memory.estimate_memory(m16, plan, H200, W, engine="torchtitan")
    assert e.stages[0].grads_bytes == 4 * rank0
    # one micro-batch too: the schedule reduce-scatters only after all backwards (perform_reduce_grad)
    one = _memory.estimate_memory(m16, plan.replace(num_micro_batches=1), H200, W, engine="torchtitan")
    assert one.stages[0].grads_bytes == 4 * rank0
    # without a pipeline FSDP reduce-scatters each backward: the FP32 shard
    nopp = _memory.estimate_memory(M8, Plan(dp_degree=2, zero_stage=2, num_micro_batches=4), H200, W,
                                   engine="torchtitan")
    assert nopp.stages[0].grads_bytes == 4 * (N8 // 2)
    # Megatron (no torch pipelining): sharded as before
    meg = _memory.estimate_memory(m16, plan.replace(zero_stage=3), H200, W, engine="megatron")
    assert meg.stages[0].grads_bytes == 4 * (rank0 // 2)


def test_compiled_loss_keeps_the_bf16_logits_and_their_gradient_only():
    # torchtitan compiles its loss with compile=true (facts.yaml compile_loss): 2 + 2 bytes per logit
    # at the loss's backward instead of the eager FP32 loss's 12 (measured: bench/loss_memory.py, peak
    # 2.0 bytes per logit beyond the BF16 logits, eager 12.0). 8B, one GPU, s = 8192, b = 1:
    # 8192 x 128256 x (12 - 4) = 8,405,385,216 bytes less; the native runtime compiles no loss.
    plan = Plan(compile=True)
    eager = _memory.estimate_memory(M8, Plan(), H200, W, engine="torchtitan").stages[0].transient_bytes
    comp = _memory.estimate_memory(M8, plan, H200, W, engine="torchtitan").stages[0].transient_bytes
    assert eager - comp == 8192 * 128256 * 8
    nat = get_engine("native")
    assert (_memory.estimate_memory(M8, plan, H200, W, engine=nat).stages[0].transient_bytes
            == _memory.estimate_memory(M8, Plan(), H200, W, engine=nat).stages[0].transient_bytes)
    d = json.loads((Path(__file__).resolve().parents[2] / "docs" / "results"
                    / "loss-memory-h200x1-2026-12-01.json").read_text())
    for r in d["rows"]:
        # the measured peak beyond the logits: the FP32 loss's 12 when eager, the BF16 gradient's 2 compiled
        assert r["peak_bytes_per_logit"] == (2.0 if r["compile"] else 12.0)


def test_native_end_of_backward_can_be_the_peak():
    # Gradients are absent at the forward peak (one micro-batch, set_to_none), but the end of the last
    # backward holds weights 4N + grads 4N + Adam 8N + BF16 copies 2N with no activations. 8B, one
    # GPU, seq 2048, full recompute: the forward instant holds 4N + 8N + 2N + 32 layer inputs (32 x 2 x
    # 2048 x 4096 = 536,870,912) + one layer's recompute set + logits (2048 x 128256 x 12 =
    # 3,152,019,456) + ... = 14N + ~4.1 GB, less than 18N = 14N + 32.1 GB: the end-of-backward instant
    # is the peak, grads 4N and no activations.
    w2k = Workload(seq_len=2048, global_batch_size=1)
    st = _memory.estimate_memory(M8, Plan(recompute="full"), H200, w2k, engine="native").stages[0]
    assert st.grads_bytes == 4 * N8 and st.activations_bytes == 0
    assert st.weights_bytes + st.grads_bytes + st.optimizer_bytes == 16 * N8
    # at seq 8192 without recompute the forward instant is larger: no gradients there
    big = _memory.estimate_memory(M8, Plan(), H200, W, engine="native").stages[0]
    assert big.grads_bytes == 0 and big.activations_bytes > 0


def test_native_pp_without_ddp_frees_gradients():
    # pp 2 x dp 2, ZeRO-0: the runtime's own reducer (not DDP: DDP only when tp = pp = 1), whose
    # gradients are set to None; GPipe runs every forward first, so none at the forward peak
    m16 = replace(M8, num_layers=16)
    plan = Plan(pp_degree=2, dp_degree=2, zero_stage=0, num_micro_batches=2, pipeline_schedule="gpipe",
                dp_grad_reduce_overlap=True, async_collectives=True)
    e = _memory.estimate_memory(m16, plan, H200, W, engine="native")
    assert e.stages[0].grads_bytes == 0


def test_compiled_loss_under_pp_counts_other_microbatches_bf16_logits():
    # torchtitan, compile, pp 2, 1F1B with 4 micro-batches: the last stage's peak holds the current
    # micro-batch's 2 + 2 bytes per logit; under 1F1B the last stage holds one micro-batch in flight,
    # so no other micro-batch's logits (COMPILED_LOSS_INFLIGHT_BYTES x 0) and no separate kept output:
    # its logits term is 8192 x 128256 x 4 bytes, 8192 x 128256 x (12 + 2) eager
    m16 = replace(M8, num_layers=16)
    plan = Plan(pp_degree=2, num_micro_batches=4, pipeline_schedule="1f1b")
    per = 8192 * 128256
    comp = _memory.estimate_memory(m16, plan.replace(compile=True), H200, W, engine="torchtitan").stages[1]
    eager = _memory.estimate_memory(m16, plan, H200, W, engine="torchtitan").stages[1]
    assert eager.transient_bytes - comp.transient_bytes == per * (12 + 2) - per * 4
    # GPipe: all 4 micro-batches in flight on the last stage, 3 others at 2 bytes (compiled) or 6 (eager)
    gp = plan.replace(pipeline_schedule="gpipe")
    comp_g = _memory.estimate_memory(m16, gp.replace(compile=True), H200, W, engine="torchtitan").stages[1]
    eager_g = _memory.estimate_memory(m16, gp, H200, W, engine="torchtitan").stages[1]
    assert eager_g.transient_bytes - comp_g.transient_bytes == per * (12 + 2 + 3 * 6) - per * (4 + 3 * 2)


def test_describe_says_why_a_term_is_zero():
    # the two instants of a native one-micro-batch step: the forward peak without gradients (8B, seq
    # 8192, no recompute) and the end-of-backward peak without activations (seq 2048, full recompute)
    native = get_engine("native")
    fwd = _memory.estimate_memory(M8, Plan(), H200, W, engine=native).describe()
    assert "grads 0.00: no gradients exist at that peak" in fwd and "activations 0.00" not in fwd
    end = _memory.estimate_memory(M8, Plan(recompute="full"), H200, Workload(seq_len=2048, global_batch_size=1),
                                  engine=native).describe()
    assert "activations 0.00: that stage peaks at the end of its last backward" in end
    assert "grads 0.00" not in _memory.estimate_memory(M8, Plan(), H200, W, engine="megatron").describe()


def test_native_saved_set_holds_at_the_70b_width():
    # The same measurement at another width (bench/saved_activations.py --model 70b --seq 4096, H200,
    # docs/results/saved-activations-70b-h200x1-2026-12-01.json; h 8192, kv/q = 1/8 instead of 1/4):
    # the eager count derived for the 8B block is within 1% of what the 70B block keeps, and the
    # compiled/eager ratios measured on the 8B block hold within 0.01.
    d = json.loads((Path(__file__).resolve().parents[2] / "docs" / "results"
                    / "saved-activations-70b-h200x1-2026-12-01.json").read_text())
    rows = {(r["precision"], r["recompute"], r["compile"]): r for r in d["rows"]}
    m70 = get_model("70b")
    w = Workload(seq_len=4096, global_batch_size=1)
    native = get_engine("native")
    for rc in ("none", "selective"):
        derived = _memory.activation_bytes_per_layer(m70, Plan(recompute=rc), w, engine=native)
        assert rows["bf16", rc, False]["saved_bytes"] == pytest.approx(derived, rel=0.01)
        for prec, kind in (("bf16", "bf16"), ("fp8_tensorwise", "fp8")):
            ratio = rows[prec, rc, True]["saved_bytes"] / rows[prec, rc, False]["saved_bytes"]
            assert ratio == pytest.approx(COMPILED_OVER_EAGER[kind, rc], abs=0.01)
