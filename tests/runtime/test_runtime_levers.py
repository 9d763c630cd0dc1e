"""The kernel-level levers of the native runtime (issue 43) on CPU: the chunked linear + cross-entropy
computes the same loss and gradients as the materialized LM head, the runtime refuses what it cannot
honor, and the FP8 filter keeps the named linears BF16."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from autotune.errors import PlanError  # noqa: E402
from autotune.runtime.converters import float8_module_filter  # noqa: E402
from autotune.runtime.model import (  # noqa: E402
    ChunkedLinearCrossEntropy,
    chunked_linear_cross_entropy,
    cross_entropy_loss,
)
from autotune.runtime.parallelize import check_runtime_support  # noqa: E402
from autotune.spec.plan import Plan, loss_chunk_tokens  # noqa: E402


@pytest.mark.parametrize("chunk", [64, 100, 1000, 4096])
def test_chunked_loss_matches_full_loss_and_gradients(chunk):
    # same function, summed chunk by chunk: loss and both gradients equal the materialized
    # F.cross_entropy(h W^T) up to the FP32 soft-max both use (float64 operands here)
    g = torch.Generator().manual_seed(chunk)
    n, hdim, vocab = 1000, 32, 301
    h = torch.randn(n, hdim, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(vocab, hdim, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.randint(0, vocab, (n,), generator=g)
    ref = cross_entropy_loss((h @ w.t())[None], y[None])
    ref.backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    loss = ChunkedLinearCrossEntropy.apply(h, w, y, chunk, False)
    (2.5 * loss).backward()             # grad_output 2.5 scales both stored gradients
    assert abs(float(loss) - float(ref)) < 1e-5
    assert float((h.grad - 2.5 * gh).norm() / gh.norm()) < 1e-5
    assert float((w.grad - 2.5 * gw).norm() / gw.norm()) < 1e-5


def test_chunked_loss_bf16_weight_gradient_dtype():
    # an FP32 master weight gets an FP32 gradient from BF16 hidden states (the autocast path)
    h = torch.randn(300, 16, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(50, 16, dtype=torch.float32, requires_grad=True)
    y = torch.randint(0, 50, (300,))
    chunked_linear_cross_entropy(h, w, y).backward()
    assert w.grad.dtype == torch.float32 and h.grad.dtype == torch.bfloat16


def test_loss_chunk_tokens():
    # 2 GiB of FP32 logits: 2^31 / (4 x 128256) = 4186.1 -> 4096 (multiple of 256); capped by the tokens
    assert loss_chunk_tokens(128256, 16384) == 4096
    assert loss_chunk_tokens(128256, 1000) == 1000
    # a huge vocabulary still gets 256 tokens: 2^31 / (4 x 2^24) = 32 -> at least 256
    assert loss_chunk_tokens(2**24, 16384) == 256


def test_runtime_refuses_what_it_cannot_honor():
    with pytest.raises(PlanError, match="loss_impl=chunked"):
        check_runtime_support(Plan(tp_degree=2, loss_impl="chunked"), device_type="cpu")
    with pytest.raises(PlanError, match="attention_backend=flash"):
        check_runtime_support(Plan(attention_backend="flash"), device_type="cpu")
    with pytest.raises(PlanError, match="compile_mode"):
        check_runtime_support(Plan(compile_mode="max-autotune-no-cudagraphs"), device_type="cpu")
    check_runtime_support(Plan(loss_impl="chunked", optimizer_impl="foreach"), device_type="cpu")


def test_float8_filter_keeps_named_linears_bf16():
    lin = torch.nn.Linear(64, 32, bias=False)
    assert float8_module_filter(lin, "layers.0.attention.wk")
    assert not float8_module_filter(lin, "layers.0.attention.wk", ("attention.wk", "attention.wv"))
    assert float8_module_filter(lin, "layers.0.attention.wq", ("attention.wk", "attention.wv"))
    assert not float8_module_filter(lin, "output")


def test_chunked_loss_plan_trains_like_full_loss():
    # one optimizer step of the tiny model with each loss: same loss, same updated weights
    import torch.distributed as dist

    from autotune.runtime.parallelize import parallelize
    from runtime_harness import TINY

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29611")
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        data = torch.randint(0, TINY.vocab_size, (2, 33), generator=torch.Generator().manual_seed(0))
        out = {}
        for impl in ("full", "chunked"):
            p = Plan(micro_batch_size=2, num_micro_batches=1, zero_stage=0, dp_grad_reduce_overlap=False,
                     loss_impl=impl)
            rt = parallelize(p, TINY, seq_len=32, device="cpu")
            out[impl] = (rt.train_step(data[:, :-1], data[:, 1:]), rt.named_parameters_full(), rt.honored)
        assert abs(out["full"][0] - out["chunked"][0]) < 1e-5
        a, b = out["full"][1], out["chunked"][1]
        assert a.keys() == b.keys()
        assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
        assert "chunked" in out["chunked"][2]["loss_impl"]
    finally:
        if started:
            dist.destroy_process_group()
