"""The per-rank GEMM and attention shapes Llama parallelism plans produce (what ``autotune profile`` times).

Per transformer layer with tensor parallelism ``tp_degree`` (Megatron-LM column/row split, Shoeybi et
al. 2019, Sec. 3) and ``T`` tokens per rank (micro-batch x sequence / CP), GEMM (m, n, k) meaning
``(m x k) @ (k x n)``:

=============  ===========  ========================  ===============
name           m            n                         k
=============  ===========  ========================  ===============
``qkv``        T            (n_q + 2 n_kv) d / tp     h
``out_proj``   T            h                         n_q d / tp
``gate_up``    T            2 f / tp                  h
``down``       T            h                         f / tp
``lm_head``    T            V / tp                    h
=============  ===========  ========================  ===============

Attention per TP shard has ``n_q / tp`` query heads and ``max(1, n_kv / tp)`` KV heads (KV heads are
replicated when tp > n_kv), sequence ``seq / cp`` per CP shard.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.spec.models import ModelSpec, get_model

TP_DEGREES = (1, 2, 4, 8)
FULL_TOKENS = (2048, 4096, 8192, 16384)
FULL_SEQ_LENS = (2048, 4096, 8192, 16384, 32768, 65536, 131072)
QUICK_SEQ_LENS = (4096, 8192)
#: long-context attention sweep (``--attention long``): 4K .. 128K per CP shard
LONG_SEQ_LENS = (4096, 8192, 16384, 32768, 65536, 131072)
#: (heads, kv_heads) per rank of the long sweep, with the plan each comes from: 8B TP1, 8B TP2, 405B TP8,
#: 70B TP8, 8B TP8 (``max(1, n_kv / tp)`` KV heads, module docstring)
LONG_HEAD_CONFIGS = ((("8b", 1), 32, 8), (("8b", 2), 16, 4), (("405b", 8), 16, 1), (("70b", 8), 8, 1),
                     (("8b", 8), 4, 1))
#: FP8 scaling recipes timed with ``torch._scaled_mm`` (tensorwise: one FP32 scale per operand; rowwise:
#: one per row of A and per column of B), the names of ``gemm_fp8`` in a calibration profile
FP8_SCALINGS = ("tensorwise", "rowwise")


@dataclass(frozen=True)
class GemmShape:
    """One GEMM (m x k) @ (k x n); ``name`` is the projection, ``source`` the plan it comes from."""

    m: int
    n: int
    k: int
    name: str = ""
    source: str = ""

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.m, self.n, self.k)


@dataclass(frozen=True)
class AttentionShape:
    """Causal attention of one rank: ``heads`` query and ``kv_heads`` KV heads over ``seq_len`` tokens."""

    batch: int
    seq_len: int
    heads: int
    kv_heads: int
    head_dim: int
    source: str = ""

    @property
    def key(self) -> tuple[int, int, int, int, int]:
        return (self.batch, self.seq_len, self.heads, self.kv_heads, self.head_dim)


def layer_gemms(model: ModelSpec, *, tp_degree: int, tokens: int) -> list[GemmShape]:
    """The five GEMMs of one layer (+ LM head) at ``tp_degree`` and ``tokens`` per rank (module table).

    Projections whose width does not divide by ``tp_degree`` are skipped (no plan produces them).
    """
    h, d, f, V = model.hidden_size, model.head_dim, model.ffn_hidden_size, model.vocab_size
    q, kv = model.num_heads * d, model.num_kv_heads * d
    kv_rank = max(kv, tp_degree * d)  # KV heads replicated when tp > n_kv
    src = f"{model.name} tp={tp_degree} tokens={tokens}"
    out = []
    for name, n, k, split in (("qkv", q + 2 * kv_rank, h, "n"), ("out_proj", h, q, "k"),
                              ("gate_up", 2 * f, h, "n"), ("down", h, f, "k"), ("lm_head", V, h, "n")):
        width = n if split == "n" else k
        if width % tp_degree:
            continue
        if split == "n":
            n //= tp_degree
        else:
            k //= tp_degree
        out.append(GemmShape(m=tokens, n=n, k=k, name=name, source=src))
    return out


def _dedupe(items):
    seen, out = set(), []
    for it in items:
        if it.key not in seen:
            seen.add(it.key)
            out.append(it)
    return out


def gemm_shapes(*, quick: bool = False) -> list[GemmShape]:
    """GEMM shapes to profile.

    quick: Llama 8B at TP 1 and 405B at TP 8 (8192 tokens) plus the probe's reference shapes
    (8192^3, 2048x4096x4096, 512x4096x4096). Full: 8B/70B/405B x TP 1, 2, 4, 8 x tokens 2048..16384.
    """
    if quick:
        shapes = layer_gemms(get_model("8b"), tp_degree=1, tokens=8192)
        shapes += [s for s in layer_gemms(get_model("405b"), tp_degree=8, tokens=8192)
                   if s.name in ("qkv", "gate_up", "down")]
        shapes += [GemmShape(8192, 8192, 8192, "square", "reference"),
                   GemmShape(2048, 4096, 4096, "small", "reference"),
                   GemmShape(512, 4096, 4096, "small", "reference")]
        return _dedupe(shapes)
    shapes = [GemmShape(8192, 8192, 8192, "square", "reference")]
    for size in ("8b", "70b", "405b"):
        for tp in TP_DEGREES:
            for t in FULL_TOKENS:
                shapes += layer_gemms(get_model(size), tp_degree=tp, tokens=t)
    return _dedupe(shapes)


def fp8_gemm_shapes() -> list[GemmShape]:
    """GEMM shapes for the FP8 (and the comparison BF16) sweep: 8B/70B/405B x TP 1, 2, 4, 8 at 8192 tokens
    (:func:`layer_gemms`, LM head included) plus the reference rows 8192^3, 2048x4096x4096 and
    512x4096x4096. Shapes with a dimension not divisible by 16 are dropped (``torch._scaled_mm`` needs
    every dim divisible by 16: aten/src/ATen/native/cuda/Blas.cpp, ``_scaled_mm_out_cuda`` checks).
    """
    shapes = [GemmShape(8192, 8192, 8192, "square", "reference"),
              GemmShape(2048, 4096, 4096, "small", "reference"),
              GemmShape(512, 4096, 4096, "small", "reference")]
    for size in ("8b", "70b", "405b"):
        for tp in TP_DEGREES:
            shapes += layer_gemms(get_model(size), tp_degree=tp, tokens=8192)
    return [s for s in _dedupe(shapes) if s.m % 16 == 0 and s.n % 16 == 0 and s.k % 16 == 0]


def attention_shapes(*, quick: bool = False, long: bool = False) -> list[AttentionShape]:
    """Attention shapes to profile (batch 1, head dim of the model).

    quick: 8B at TP 1 and 2, 405B at TP 8, seq 4096 and 8192. long: the heads/KV heads per rank of
    :data:`LONG_HEAD_CONFIGS` (32/8, 16/4, 16/1, 8/1, 4/1) x :data:`LONG_SEQ_LENS` (4K..128K), 30 shapes;
    takes precedence over ``quick``. Full: 8B/70B/405B x TP 1, 2, 4, 8 x seq 2K..128K (per CP shard).
    """
    if long:
        out = []
        for (size, tp), h, kv in LONG_HEAD_CONFIGS:
            m = get_model(size)
            for s in LONG_SEQ_LENS:
                out.append(AttentionShape(batch=1, seq_len=s, heads=h, kv_heads=kv, head_dim=m.head_dim,
                                          source=f"{m.name} tp={tp}"))
        return _dedupe(out)
    if quick:
        cfgs, seqs = (("8b", 1), ("8b", 2), ("405b", 8)), QUICK_SEQ_LENS
    else:
        cfgs, seqs = tuple((s, tp) for s in ("8b", "70b", "405b") for tp in TP_DEGREES), FULL_SEQ_LENS
    out = []
    for size, tp in cfgs:
        m = get_model(size)
        if m.num_heads % tp:
            continue
        for s in seqs:
            out.append(AttentionShape(batch=1, seq_len=s, heads=m.num_heads // tp,
                                      kv_heads=max(1, m.num_kv_heads // tp), head_dim=m.head_dim,
                                      source=f"{m.name} tp={tp}"))
    return _dedupe(out)


#: memory-bound ops profiled: name -> description of the bytes counted (reads + writes)
MEMORY_OPS = {
    "copy": "device-to-device copy: read N + write N bytes",
    "rmsnorm": "RMSNorm over (T, h) bf16: read x + write y (2 T h x 2 bytes; weight ignored)",
    "rope": "rotary embedding of (T, heads, d) bf16 with fp32 cos/sin of (T, d): read x, cos, sin, write y",
    "swiglu": "silu(gate) * up over (T, f) bf16: read 2 T f + write T f elements x 2 bytes",
    "cross_entropy": "cross-entropy over (T, V) bf16 logits: read T V x 2 bytes (+ targets)",
    "adamw": "AdamW step over N fp32 params: read p, g, m, v + write p, m, v = 28 N bytes",
}


#: transformer-block memory-bound ops timed eagerly and under ``torch.compile`` at Llama 3.1 8B shapes;
#: name -> the bytes counted, which are those :meth:`autotune.cost.graph.StepGraph._layer_cost` charges for the
#: op (its comments: 2 RMSNorms 8h per token, 2 residual adds 12h, RoPE 4(q+kv), SwiGLU 6f), so that
#: ``bytes / GB/s`` gives the op's time whichever table (eager or compiled) the cost model uses
BLOCK_OPS = {
    "rmsnorm": "one RMSNorm (T, h) bf16 with weight: read x + write y = 4 T h bytes (cost model: 8h/token for 2)",
    "rope": "RoPE on q (T, n_q, d) and k (T, n_kv, d) bf16 (fp32 cos/sin not counted): 4 T (q + kv) bytes",
    "swiglu": "silu(gate) * up over (T, f) bf16: read 2 T f + write T f = 6 T f bytes",
    "residual": "x + y over (T, h) bf16: read 2 T h + write T h = 6 T h bytes (cost model: 12h/token for 2)",
    "cast": "x16.float() and x32.bfloat16() of two (T, h) tensors: (2 + 4) + (4 + 2) = 12 T h bytes",
    "norm_residual": "residual add then RMSNorm of the sum (the fused pair): 6 T h + 4 T h = 10 T h bytes "
                     "(the two eager ops' counts added)",
}


def block_op_sizes() -> dict[str, dict[str, int]]:
    """Sizes of :data:`BLOCK_OPS`: Llama 3.1 8B, 8192 tokens, h 4096, f 14336, 32 / 8 heads of 128."""
    m = get_model("8b")
    base = {"tokens": 8192, "hidden": m.hidden_size, "ffn": m.ffn_hidden_size, "heads": m.num_heads,
            "kv_heads": m.num_kv_heads, "head_dim": m.head_dim}
    return {op: {"op": op, **base} for op in BLOCK_OPS}


#: tensors quantized to FP8 in the quantization sweep: (rows, cols) of Llama 3.1 8B / 70B activations
#: (8192 tokens x h, x f) and weights (gate+up 2f x h, down h x f), bf16
QUANTIZE_SHAPES = ((8192, 4096), (8192, 14336), (28672, 4096), (4096, 14336), (8192, 8192), (57344, 8192))


def memory_op_sizes(*, quick: bool = False) -> dict[str, dict[str, int]]:
    """Per memory-bound op, its size parameters (tokens, widths, element counts)."""
    toks = (8192,) if quick else (4096, 8192, 16384)
    out: dict[str, dict[str, int]] = {}
    for t in toks:
        out[f"copy/{t}"] = {"op": "copy", "numel": t * 4096 * 32}      # 1 GiB of bf16 at t=8192
        out[f"rmsnorm/{t}"] = {"op": "rmsnorm", "tokens": t, "hidden": 4096}
        out[f"rope/{t}"] = {"op": "rope", "tokens": t, "heads": 32, "head_dim": 128}
        out[f"swiglu/{t}"] = {"op": "swiglu", "tokens": t, "ffn": 14336}
        out[f"cross_entropy/{t}"] = {"op": "cross_entropy", "tokens": t, "vocab": 128256}
    for n in ((64 << 20,) if quick else (64 << 20, 256 << 20)):
        out[f"adamw/{n}"] = {"op": "adamw", "numel": n}
    return out
