"""Single-process checks of the Llama 3.1 model (tiny config, FP32, CPU)."""

import math

import pytest
import torch

from autotune.errors import ConfigError, PlanError
from autotune.spec.plan import Plan
from autotune.runtime.model import (Llama, build_llama, cross_entropy_loss, llama3_inv_freq, prune_to_stage)
from autotune.runtime.parallelize import check_runtime_support
from runtime_harness import SEQ, TINY


def test_param_count_tiny_by_hand():
    # h=64, V=256, L=4, heads 4, kv 2, d=16, f=128:
    # embedding 256*64 = 16384, untied head 16384;
    # per layer: wq 64*64 + wk 64*32 + wv 64*32 + wo 64*64 = 12288, SwiGLU 3*64*128 = 24576, norms 2*64
    #   = 36992; 4 layers = 147968; final norm 64.  Total 16384*2 + 147968 + 64 = 180800.
    m = build_llama(TINY, seq_len=SEQ)
    assert sum(p.numel() for p in m.parameters()) == 180800
    # truncated depth keeps widths: 2 layers -> 32768 + 2*36992 + 64 = 106816
    assert sum(p.numel() for p in build_llama(TINY, seq_len=SEQ, num_layers=2).parameters()) == 106816


def test_llama3_rope_scaling_values():
    # Llama 3.1: head_dim 128, theta 5e5, factor 8, low 1, high 4, original context 8192.
    inv = llama3_inv_freq(128, 500000.0).double()
    # i=0: f=1, wavelength 2*pi < 8192/4 = 2048 -> unchanged
    assert inv[0].item() == pytest.approx(1.0)
    # i=63: f = 5e5^(-126/128), wavelength ~ 2.6e6 > 8192 -> f / 8
    assert inv[63].item() == pytest.approx(500000.0 ** (-126 / 128) / 8, rel=1e-6)
    # i=34: f = 5e5^(-68/128) = 9.388e-4, wavelength 2*pi/f = 6693 in [2048, 8192] ->
    # s = (8192/6693 - 1)/(4 - 1), f' = (1 - s) f/8 + s f
    f = 500000.0 ** (-68 / 128)
    s = (8192 / (2 * math.pi / f) - 1) / 3
    assert inv[34].item() == pytest.approx((1 - s) * f / 8 + s * f, rel=1e-6)
    assert 2048 < 2 * math.pi / f < 8192


def test_gqa_attention_matches_explicit_causal_softmax():
    torch.manual_seed(0)
    m = build_llama(TINY, seq_len=SEQ)
    attn = m.layers["0"].attention
    x = torch.randn(2, SEQ, TINY.hidden_size)
    out = attn(x, m.rope_cos, m.rope_sin)
    # independent: explicit scores, mask, softmax; KV head j serves query heads 2j, 2j+1 (4 q / 2 kv)
    from autotune.runtime.model import apply_rope
    d = TINY.head_dim
    q = apply_rope(attn.wq(x).view(2, SEQ, 4, d), m.rope_cos, m.rope_sin)
    k = apply_rope(attn.wk(x).view(2, SEQ, 2, d), m.rope_cos, m.rope_sin)
    v = attn.wv(x).view(2, SEQ, 2, d)
    heads = []
    for hq in range(4):
        s = torch.einsum("bid,bjd->bij", q[:, :, hq], k[:, :, hq // 2]) / math.sqrt(d)
        s = s.masked_fill(torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1), float("-inf"))
        heads.append(torch.einsum("bij,bjd->bid", s.softmax(-1), v[:, :, hq // 2]))
    ref = attn.wo(torch.cat(heads, dim=-1))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recompute_gives_identical_gradients(mode):
    x = torch.randint(0, TINY.vocab_size, (2, SEQ + 1), generator=torch.Generator().manual_seed(3))
    grads = {}
    for m_ in ("none", mode):
        m = build_llama(TINY, seq_len=SEQ, seed=5)
        m.set_recompute(m_)
        cross_entropy_loss(m(x[:, :-1]), x[:, 1:]).backward()
        grads[m_] = {n: p.grad for n, p in m.named_parameters()}
    for n, g in grads["none"].items():
        torch.testing.assert_close(grads[mode][n], g, rtol=0, atol=0)  # same ops recomputed: bit-identical


def test_prune_to_stage_keeps_global_names_and_composes():
    x = torch.randint(0, TINY.vocab_size, (2, SEQ))
    full = build_llama(TINY, seq_len=SEQ, seed=1)
    a = prune_to_stage(build_llama(TINY, seq_len=SEQ, seed=1), [0], is_first=True, is_last=False)
    b = prune_to_stage(build_llama(TINY, seq_len=SEQ, seed=1), [1, 2, 3], is_first=False, is_last=True)
    assert list(b.layers.keys()) == ["1", "2", "3"] and a.output is None and b.tok_embeddings is None
    torch.testing.assert_close(b(a(x)), full(x), rtol=0, atol=0)


def test_bad_depth_is_config_error():
    with pytest.raises(ConfigError, match="num_layers"):
        Llama(TINY, seq_len=SEQ, num_layers=0)


@pytest.mark.parametrize("kw,match", [
    (dict(tp_degree=2, tp_comm_overlap=True), "tp_comm_overlap"),
    (dict(pp_degree=2, async_collectives=False), "async_collectives=false with pp_degree=2"),
    (dict(cp_degree=2), "cp_degree=2 cannot be honored on cpu"),
    (dict(tp_degree=2, dp_degree=2, zero_stage=1), "ZeroRedundancyOptimizer"),
])
def test_settings_the_runtime_cannot_honor_are_refused(kw, match):
    with pytest.raises(PlanError, match=match):
        check_runtime_support(Plan(**kw), device_type="cpu")
