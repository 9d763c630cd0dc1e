"""The Llama 3.1 architecture in plain PyTorch, built from a :class:`~autotune.spec.models.ModelSpec`.

Structure follows torchtitan's ``models/llama3/model.py`` so that its parallelization recipe applies
unchanged: ``tok_embeddings`` -> ``layers`` (an ``nn.ModuleDict`` keyed ``"0" .. "L-1"``, each a
:class:`TransformerBlock` with ``attention_norm``, ``attention.{wq,wk,wv,wo}``, ``ffn_norm``,
``feed_forward.{w1,w2,w3}``) -> ``norm`` -> ``output`` (untied LM head). A pipeline stage is made by
deleting the layers it does not own and setting ``tok_embeddings`` / ``norm`` / ``output`` to None on
stages that do not hold them (:func:`prune_to_stage`); the forward passes hidden states through when
the embedding is missing and returns hidden states when the head is missing.

Architecture (Llama 3 paper, Grattafiori et al. 2024, Sec. 3.1 and Table 3; Hugging Face
``LlamaForCausalLM``):

* RMSNorm (Zhang & Sennrich 2019): ``x / sqrt(mean(x^2) + eps) * w``, computed in FP32, returned in
  the input's dtype (the residual stream stays in the compute dtype under autocast).
* RoPE (Su et al. 2021) in the rotate-half form, with Llama 3 frequency scaling (factor 8, low/high
  frequency factors 1 and 4, original context 8192; HF ``_compute_llama3_parameters``).
* GQA attention (Ainslie et al. 2023): K/V heads repeated to the query heads, then
  ``F.scaled_dot_product_attention(is_causal=True)``.
* SwiGLU MLP (Shazeer 2020): ``w2(silu(w1 x) * w3 x)``.

Weights are held in FP32 (the optimizer's master copy); BF16 compute comes from FSDP2's mixed
precision policy or ``torch.autocast`` (see :mod:`autotune.runtime.parallelize`).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from autotune.errors import ConfigError
from autotune.spec.models import ModelSpec
from autotune.spec.plan import loss_chunk_tokens

#: Llama 3 RoPE scaling (HF config.json ``rope_scaling`` of Llama-3.1-*: rope_type llama3).
LLAMA3_ROPE_SCALING = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           original_max_position_embeddings=8192)

RECOMPUTE_MODES = ("none", "selective", "full")
LOSS_IMPLS = ("full", "chunked")


def llama3_inv_freq(head_dim: int, theta: float, *, factor: float = 8.0, low_freq_factor: float = 1.0,
                    high_freq_factor: float = 4.0, original_context: int = 8192) -> torch.Tensor:
    """Inverse RoPE frequencies with Llama 3 scaling, shape ``[head_dim // 2]``, FP32 (rad/token).

    Base frequencies ``theta^(-2i/d)``; wavelengths ``2 pi / f`` longer than ``original_context /
    low_freq_factor`` are divided by ``factor``, shorter than ``original_context / high_freq_factor``
    kept, and those between interpolated with ``s = (original_context / wavelen - low) / (high - low)``
    as ``(1 - s) f / factor + s f`` (HF ``transformers.modeling_rope_utils._compute_llama3_parameters``).
    """
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    wavelen = 2 * math.pi / inv
    low_wavelen = original_context / low_freq_factor
    high_wavelen = original_context / high_freq_factor
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled).to(torch.float32)


def rope_tables(head_dim: int, seq_len: int, theta: float, *, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` tables, each ``[seq_len, head_dim]`` FP32 (frequencies repeated twice)."""
    inv = llama3_inv_freq(head_dim, theta).to(device)
    t = torch.arange(seq_len, dtype=torch.float32, device=device)
    ang = torch.outer(t, inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[b, s, heads, d]`` by positions ``0..s-1`` (``cos``/``sin`` ``[s, d]``)."""
    c = cos[None, :, None, :].to(x.dtype)
    s = sin[None, :, None, :].to(x.dtype)
    return x * c + _rotate_half(x) * s


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dim, computed in FP32, weight ``[dim]`` (init 1)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        # output in the input's dtype: an FP32 master weight must not promote a BF16 residual stream
        # to FP32 under autocast (that doubled the bytes of every norm and residual add; seen on H200)
        return y.type_as(x) * self.weight.to(x.dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def _attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal SDPA; q ``[b, hq, s, d]``, k/v ``[b, hkv, s, d]`` (KV heads repeated to hq)."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(nn.Module):
    """GQA self-attention. Head counts are read from the projection outputs at run time, so a
    column-parallel shard (TP) runs ``heads / tp`` query and ``kv_heads / tp`` KV heads locally."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        self.head_dim = d
        self.wq = nn.Linear(h, spec.num_heads * d, bias=False)
        self.wk = nn.Linear(h, spec.num_kv_heads * d, bias=False)
        self.wv = nn.Linear(h, spec.num_kv_heads * d, bias=False)
        self.wo = nn.Linear(spec.num_heads * d, h, bias=False)
        self.recompute_core = False

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q, k = apply_rope(q, cos[:s], sin[:s]), apply_rope(k, cos[:s], sin[:s])
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.recompute_core:
            o = checkpoint(_attention_core, q, k, v, use_reentrant=False)
        else:
            o = _attention_core(q, k, v)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


def _swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


class FeedForward(nn.Module):
    """SwiGLU MLP ``w2(silu(w1 x) * w3 x)``; w1/w3 ``h -> f``, w2 ``f -> h``."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.w1 = nn.Linear(spec.hidden_size, spec.ffn_hidden_size, bias=False)
        self.w2 = nn.Linear(spec.ffn_hidden_size, spec.hidden_size, bias=False)
        self.w3 = nn.Linear(spec.hidden_size, spec.ffn_hidden_size, bias=False)
        self.recompute_act = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.w1(x), self.w3(x)
        a = checkpoint(_swiglu, g, u, use_reentrant=False) if self.recompute_act else _swiglu(g, u)
        return self.w2(a)


class TransformerBlock(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``+ mlp(norm(.))``.

    ``recompute``: ``none``; ``selective`` (the attention core and the SwiGLU activation are
    recomputed in backward: Korthikanti et al. 2022, Sec. 5); ``full`` (the whole block is
    checkpointed; only its input is kept).
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.attention = Attention(spec)
        self.ffn_norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.feed_forward = FeedForward(spec)
        self.recompute = "none"

    def set_recompute(self, mode: str) -> None:
        if mode not in RECOMPUTE_MODES:
            raise ConfigError(f"recompute={mode!r}; valid: {', '.join(RECOMPUTE_MODES)}")
        self.recompute = mode
        self.attention.recompute_core = mode == "selective"
        self.feed_forward.recompute_act = mode == "selective"

    def _forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.recompute == "full":
            return checkpoint(self._forward, x, cos, sin, use_reentrant=False)
        return self._forward(x, cos, sin)


class Llama(nn.Module):
    """Llama 3.1 decoder (or a pipeline chunk of it).

    Args:
        spec: architecture (widths, heads, vocab, rope theta, eps).
        seq_len: training sequence length T (the RoPE tables are built for exactly T positions, as
            torchtitan does, so context parallelism can shard them with the inputs).
        num_layers: build this many layers at the spec's true width (a depth-truncated proxy);
            None = ``spec.num_layers``.

    Forward: ``tokens`` int64 ``[b, T]`` (or hidden ``[b, T, h]`` on a stage without the embedding)
    -> logits ``[b, T, V]`` FP32-or-compute-dtype (or hidden ``[b, T, h]`` on a stage without the head).

    Raises:
        ConfigError: non-positive ``num_layers`` or ``seq_len``.
    """

    def __init__(self, spec: ModelSpec, *, seq_len: int, num_layers: Optional[int] = None) -> None:
        super().__init__()
        n = spec.num_layers if num_layers is None else num_layers
        if not isinstance(n, int) or n < 1:
            raise ConfigError(f"num_layers must be a positive integer, got {num_layers!r}")
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ConfigError(f"seq_len must be a positive integer, got {seq_len!r}")
        self.spec = spec
        self.seq_len = seq_len
        self.num_layers = n
        self.tok_embeddings: Optional[nn.Embedding] = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(spec) for i in range(n)})
        self.norm: Optional[RMSNorm] = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.output: Optional[nn.Linear] = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        cos, sin = rope_tables(spec.head_dim, seq_len, spec.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.loss_impl = "full"
        self.loss_compiled = False
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, *, buffer_device: Optional[torch.device] = None) -> None:
        """Random init (torchtitan's scheme): embeddings N(0, 1), projections N(0, 0.02) with the
        output projections (wo, w2) scaled by ``1/sqrt(2 L)``, LM head N(0, h^-0.5), norms 1.
        Recomputes the RoPE tables (non-persistent buffers are garbage after ``to_empty``)."""
        std_out = 0.02 / math.sqrt(2 * self.num_layers)
        if self.tok_embeddings is not None:
            nn.init.normal_(self.tok_embeddings.weight)
        for blk in self.layers.values():
            for lin in (blk.attention.wq, blk.attention.wk, blk.attention.wv, blk.feed_forward.w1,
                        blk.feed_forward.w3):
                nn.init.trunc_normal_(lin.weight, std=0.02)
            for lin in (blk.attention.wo, blk.feed_forward.w2):
                nn.init.trunc_normal_(lin.weight, std=std_out)
            blk.attention_norm.reset_parameters()
            blk.ffn_norm.reset_parameters()
        if self.norm is not None:
            self.norm.reset_parameters()
        if self.output is not None:
            nn.init.trunc_normal_(self.output.weight, std=self.spec.hidden_size ** -0.5)
        dev = buffer_device if buffer_device is not None else self.rope_cos.device
        if dev.type != "meta":
            cos, sin = rope_tables(self.spec.head_dim, self.seq_len, self.spec.rope_theta, device=dev)
            self.rope_cos, self.rope_sin = cos, sin

    def set_loss_impl(self, impl: str, *, compiled: bool = False) -> None:
        """``full`` (the forward returns logits) or ``chunked`` (given labels, the forward returns the
        mean loss from :func:`chunked_linear_cross_entropy`; ``compiled``: its per-chunk soft-max and
        gradient run as one torch.compile'd kernel).

        Raises:
            ConfigError: an unknown ``impl``."""
        if impl not in LOSS_IMPLS:
            raise ConfigError(f"loss_impl={impl!r}; valid: {', '.join(LOSS_IMPLS)}")
        self.loss_impl = impl
        self.loss_compiled = compiled

    def set_recompute(self, mode: str) -> None:
        """Apply ``none`` / ``selective`` / ``full`` recomputation to every block."""
        for blk in self.layers.values():
            blk.set_recompute(mode)

    def forward(self, tokens: torch.Tensor, labels: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits ``[b, T, V]`` (or hidden states without the head); with ``labels`` (int64 ``[b, T]``)
        and ``loss_impl == "chunked"`` the mean token cross-entropy (FP32 scalar) instead."""
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(tokens)
            dev = h.device.type
            if torch.is_autocast_enabled(dev):
                # the embedding is not an autocast op: its FP32 output would make the whole residual
                # stream FP32; start it in the compute dtype, as with FSDP2's BF16 parameters
                h = h.to(torch.get_autocast_dtype(dev))
        else:
            h = tokens
        for blk in self.layers.values():
            h = blk(h, self.rope_cos, self.rope_sin)
        h = self.norm(h) if self.norm is not None else h
        if self.output is None:
            return h
        if labels is not None and self.loss_impl == "chunked":
            return chunked_linear_cross_entropy(h.flatten(0, 1), self.output.weight, labels.flatten(0, 1),
                                                compiled=self.loss_compiled)
        return self.output(h)


def build_llama(spec: ModelSpec, *, seq_len: int, num_layers: Optional[int] = None,
                device: torch.device | str | None = None, seed: int = 0) -> Llama:
    """A randomly initialized :class:`Llama` (FP32 weights) on ``device``.

    Initialization is seeded (``torch.manual_seed(seed)`` in a forked RNG) and done on CPU, so every
    rank and the unparallelized reference get bit-identical weights; ``device="meta"`` builds shapes
    only (call ``to_empty`` + :meth:`Llama.init_weights` after sharding).
    """
    if device is not None and torch.device(device).type == "meta":
        with torch.device("meta"):
            return Llama(spec, seq_len=seq_len, num_layers=num_layers)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        m = Llama(spec, seq_len=seq_len, num_layers=num_layers)
    return m.to(device) if device is not None else m


def prune_to_stage(model: Llama, layer_ids: list[int], *, is_first: bool, is_last: bool) -> Llama:
    """Keep only ``layer_ids`` (global indices) and the embedding / norm+head on the first / last
    stage (torchtitan's pipeline split: delete what the stage does not own). Modifies and returns
    ``model``; the kept layers keep their global names, so parameter names match the full model."""
    keep = {str(i) for i in layer_ids}
    for name in list(model.layers.keys()):
        if name not in keep:
            del model.layers[name]
    if not is_first:
        model.tok_embeddings = None
    if not is_last:
        model.norm = None
        model.output = None
    return model


def cross_entropy_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy in FP32; logits ``[b, T, V]``, labels int64 ``[b, T]`` -> scalar."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))



def _ce_chunk_grad(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy of one chunk and d(sum)/d(logits) = softmax - onehot, in the logits' dtype.

    logits ``[C, V]`` (compute dtype), labels int64 ``[C]`` -> (FP32 scalar, ``[C, V]``). The soft-max
    runs in FP32 (as :func:`cross_entropy_loss`)."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    tgt = x.gather(1, labels[:, None]).squeeze(1)
    p = torch.exp(x - lse[:, None])
    onehot = torch.arange(x.shape[1], device=x.device)[None, :] == labels[:, None]
    return (lse - tgt).sum(), (p - onehot.to(p.dtype)).to(logits.dtype)


_ce_chunk_grad_compiled = None


def _chunk_grad_fn(compiled: bool):
    global _ce_chunk_grad_compiled
    if not compiled:
        return _ce_chunk_grad
    if _ce_chunk_grad_compiled is None:
        _ce_chunk_grad_compiled = torch.compile(_ce_chunk_grad, fullgraph=True, dynamic=False)
    return _ce_chunk_grad_compiled


def _mm_accumulate(acc: Optional[torch.Tensor], a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``acc + a @ b`` in FP32 from compute-dtype ``a``, ``b`` (``acc`` None: ``a @ b``).

    On CUDA with BF16 operands: ``torch.mm`` / ``torch.addmm`` with ``out_dtype=float32`` (cuBLAS
    accumulates into the FP32 buffer, beta = 1), else a compute-dtype product added in FP32."""
    if a.is_cuda and a.dtype != torch.float32:
        try:
            if acc is None:
                return torch.mm(a, b, out_dtype=torch.float32)
            return torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
        except (RuntimeError, TypeError):
            pass
    prod = (a @ b).float()
    return prod if acc is None else acc.add_(prod)


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``h @ W^T`` over token chunks, gradients computed in the forward pass.

    Forward, per chunk of C tokens: logits ``[C, V]`` = ``h_c W^T`` (compute dtype), FP32 soft-max, the
    summed loss, ``g = softmax - onehot``; then ``dh_c = g W`` and ``dW += g^T h_c`` (FP32). Backward
    scales the stored ``dh`` and ``dW`` by ``grad_output / N``. The same FLOPs as the materialized LM head
    (three ``2 N h V`` GEMMs) with at most one chunk's logits alive: the approach of Liger-Kernel's
    ``LigerFusedLinearCrossEntropyFunction`` (Hsu et al. 2024, arXiv:2410.10989, Sec. 3.3), in torch ops.

    Args (forward): h ``[N, H]`` compute dtype; weight ``[V, H]`` (FP32 master or BF16 parameter);
    labels int64 ``[N]``; chunk tokens; compiled (per-chunk kernel through torch.compile).
    Returns: FP32 scalar, mean loss over N tokens.
    """

    @staticmethod
    def forward(ctx, h, weight, labels, chunk: int, compiled: bool):  # noqa: D401
        n = h.shape[0]
        w = weight.to(h.dtype)
        grad_h = torch.empty_like(h)
        grad_w = None
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        fn = _chunk_grad_fn(compiled)
        for s in range(0, n, chunk):
            hc, yc = h[s:s + chunk], labels[s:s + chunk]
            loss_c, g = fn(hc @ w.t(), yc)
            total += loss_c
            grad_h[s:s + chunk] = g @ w
            grad_w = _mm_accumulate(grad_w, g.t(), hc)
            del g
        ctx.save_for_backward(grad_h, grad_w)
        ctx.n = n
        ctx.weight_dtype = weight.dtype
        return total / n

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        scale = grad_out / ctx.n
        # in place: the stored gradients are used once (retain_graph is not supported)
        return grad_h.mul_(scale.to(grad_h.dtype)), grad_w.mul_(scale).to(ctx.weight_dtype), None, None, None


def chunked_linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                                 compiled: bool = False) -> torch.Tensor:
    """Mean token cross-entropy of the LM head without full-vocabulary logits
    (:class:`ChunkedLinearCrossEntropy`); h ``[N, H]``, weight ``[V, H]``, labels int64 ``[N]`` -> FP32 scalar."""
    chunk = loss_chunk_tokens(weight.shape[0], h.shape[0])
    return ChunkedLinearCrossEntropy.apply(h, weight, labels, chunk, compiled)
