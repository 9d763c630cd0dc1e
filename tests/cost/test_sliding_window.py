"""Sliding-window attention layers in the cost model (autotune/cost/moe.py ``attention_work_fraction`` and its use
in autotune/cost/chunk_costs.py): values derived by hand in the comments."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.cost import moe
from autotune.cost.chunk_costs import CostBuilder
from autotune.cost.flops import model_flops_per_token
from autotune.cost.simulator import SimulatedEvaluator
from autotune.spec.hardware import make_cluster
from autotune.spec.models import get_builtin_model
from autotune.spec.plan import Plan, Workload

GPTOSS = get_builtin_model("gpt-oss-120b")


def test_window_blocks_by_hand_tiny_cases():
    # T = 512, block 128: n = 4 query blocks; causal reads 1 + 2 + 3 + 4 = 10 key blocks.
    # W = 128 (the query and 127 keys before it): block 0 reads block 0; block i >= 1 starts at key iB - 127,
    # inside block i - 1, so reads 2: 1 + 2 + 2 + 2 = 7. Every layer windowed (period 1): 7 / 10.
    every = dataclasses.replace(GPTOSS, sliding_window=128, sliding_window_period=1)
    assert moe.attention_work_fraction(every, 512) == pytest.approx(0.7, abs=1e-12)
    # W = 200: block 1 starts at key 128 - 199 < 0 -> 2 blocks; block 2 at 256 - 199 = 57 (block 0) -> 3;
    # block 3 at 384 - 199 = 185 (block 1) -> 3: 1 + 2 + 3 + 3 = 9 of 10
    assert moe.attention_work_fraction(dataclasses.replace(every, sliding_window=200), 512) == pytest.approx(0.9)
    # 3 layers, period 2: layers 0 and 2 windowed (7 blocks), layer 1 causal (10): (2 x 7 + 10) / (3 x 10) = 0.8
    three = dataclasses.replace(GPTOSS, num_layers=3, sliding_window=128, sliding_window_period=2)
    assert moe.attention_work_fraction(three, 512) == pytest.approx(0.8, abs=1e-12)


def test_no_window_or_a_sequence_inside_it_is_causal_work():
    assert moe.attention_work_fraction(get_builtin_model("qwen3-30b-a3b"), 4096) == 1.0
    assert moe.attention_work_fraction(GPTOSS, 128) == 1.0
    # one token past the window still reads whole blocks: T = 129 -> 2 blocks, 1 + 2 = causal's 3
    assert moe.attention_work_fraction(GPTOSS, 129) == 1.0


def test_gpt_oss_120b_at_4096_tokens():
    # n = 32 blocks: causal 32 x 33 / 2 = 528; windowed 1 + 31 x 2 = 63. 36 layers, 18 windowed (even):
    # (18 x 63 + 18 x 528) / (36 x 528) = 591 / 1056
    assert moe.attention_work_fraction(GPTOSS, 4096) == pytest.approx(591 / 1056, abs=1e-12)


def test_the_simulated_layer_pays_the_windowed_share_and_mfu_flops_stay_causal():
    c, w = make_cluster("h100", 8), Workload(seq_len=4096, global_batch_size=512)
    plan = Plan(ep_degree=8, dp_degree=8, num_micro_batches=64, precision="bf16")
    causal_model = dataclasses.replace(GPTOSS, sliding_window=None)
    costs = SimulatedEvaluator(model=GPTOSS, cluster=c, workload=w, engine="megatron").costs
    win = CostBuilder(model=GPTOSS, plan=plan, cluster=c, workload=w, costs=costs, engine="megatron")
    full = CostBuilder(model=causal_model, plan=plan, cluster=c, workload=w, costs=costs, engine="megatron")
    frac = 591 / 1056
    # forward: the attention kernel of 64 query heads, 8 KV heads, head dim 64, one 4096-token sequence
    attn = full.costs.attention_kernel_ms("default", batch=1, seq_len=4096, heads=64, kv_heads=8, head_dim=64)
    assert full._layer[0]["compute"] - win._layer[0]["compute"] == pytest.approx((1 - frac) * attn, rel=1e-9)
    # hardware FLOPs of the kernel, forward: 2 T^2 d H (causal half of 4 T^2 d H) = 2 x 4096^2 x 64 x 64
    assert full._layer[2] - win._layer[2] == pytest.approx((1 - frac) * 137_438_953_472, rel=1e-9)
    # the model FLOPs (MFU) do not read the window: Megatron-LM and Megatron-Bridge count causal attention
    assert model_flops_per_token(GPTOSS, 4096) == model_flops_per_token(causal_model, 4096)
