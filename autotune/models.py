"""Model catalog: dense decoder-only transformers (Llama 3.1 8B/70B/405B, or any HF ``config.json``).

A :class:`ModelSpec` holds the architecture numbers the planner needs. Parameter counts follow the
architecture exactly (no rounding); for Llama 3.1 they equal the published counts:

    parameters = 2 V h                                  (input embedding + untied LM head)
               + L (h (n_q d + 2 n_kv d) + n_q d h      (Q, K, V and output projections)
                    + 3 h f                             (SwiGLU gate, up, down; 2 h f for a plain MLP)
                    + 2 h)                              (two RMSNorm weights)
               + h                                      (final RMSNorm)

with V vocabulary, h hidden size, L layers, n_q query heads, n_kv KV heads, d head dim, f FFN size
(Llama 3 paper, Table 3; Hugging Face ``LlamaForCausalLM``). With tied embeddings the 2 V h term is V h.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from autotune.errors import ConfigError


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of a dense decoder-only transformer.

    Attributes:
        name: catalog name (``llama3.1-8b``) or a user label.
        hidden_size: h, model width.
        num_layers: L, transformer blocks.
        num_heads: query heads n_q.
        num_kv_heads: key/value heads n_kv (GQA when < n_q).
        ffn_hidden_size: f, the MLP's inner width.
        vocab_size: V.
        head_dim: d, per-head width (128 for Llama 3.1).
        tied_embeddings: whether the LM head shares the input embedding matrix.
        gated_mlp: SwiGLU (3 projections) when True, plain GeLU MLP (2 projections) when False.
        rope_theta, norm_eps, max_seq_len: carried for the real runtime; not used by the planner.

    Raises:
        ConfigError: on a non-positive size or heads that do not divide (n_q % n_kv != 0).
    """

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    head_dim: int = 128
    tied_embeddings: bool = False
    gated_mlp: bool = True
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    max_seq_len: int = 131072

    def __post_init__(self) -> None:
        for f in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "ffn_hidden_size",
                  "vocab_size", "head_dim"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"model {self.name!r}: {f} must be a positive integer, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model {self.name!r}: num_heads={self.num_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads} (grouped-query attention needs n_q % n_kv == 0)")

    # ---- parameter counts (elements) ----
    @property
    def q_dim(self) -> int:
        """n_q x d: width of the query projection output."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """n_kv x d: width of each of the K and V projection outputs."""
        return self.num_kv_heads * self.head_dim

    @property
    def attention_params_per_layer(self) -> int:
        """h (n_q d + 2 n_kv d) + n_q d h: Q, K, V and output projection weights (no biases)."""
        h = self.hidden_size
        return h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h

    @property
    def mlp_params_per_layer(self) -> int:
        """3 h f for SwiGLU (gate, up, down), 2 h f for a plain MLP."""
        return (3 if self.gated_mlp else 2) * self.hidden_size * self.ffn_hidden_size

    @property
    def params_per_layer(self) -> int:
        """Attention + MLP + two RMSNorm weight vectors (2 h)."""
        return self.attention_params_per_layer + self.mlp_params_per_layer + 2 * self.hidden_size

    @property
    def embedding_params(self) -> int:
        """V h: the input embedding table."""
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """V h for an untied LM head; 0 when tied (the weight is the embedding table)."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Total parameters (elements), exact; e.g. 8,030,261,248 for Llama 3.1 8B."""
        return (self.embedding_params + self.lm_head_params + self.num_layers * self.params_per_layer
                + self.hidden_size)

    @property
    def num_params_without_embedding(self) -> int:
        """Parameters excluding the input embedding table (the LM head counts): the N in 6N.

        For a tied model the shared matrix still does the LM-head matmul, so V h is kept.
        """
        lm_head = self.vocab_size * self.hidden_size
        return lm_head + self.num_layers * self.params_per_layer + self.hidden_size

    def truncated(self, num_layers: int) -> "ModelSpec":
        """The same widths with ``num_layers`` layers (a depth proxy), named ``<name>-<N>L``.

        Raises:
            ConfigError: num_layers outside 1..self.num_layers.
        """
        if not isinstance(num_layers, int) or not 1 <= num_layers <= self.num_layers:
            raise ConfigError(f"--layers {num_layers} must be between 1 and the model's {self.num_layers} layers")
        return replace(self, num_layers=num_layers, name=f"{self.name}-{num_layers}L")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "model") -> "ModelSpec":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown model field(s) {unknown}; valid fields: {sorted(known)}")
        try:
            return cls(**dict(d))
        except TypeError as e:
            raise ConfigError(f"{source}: {e}") from None


LLAMA31_COMMON = dict(vocab_size=128256, head_dim=128, tied_embeddings=False, gated_mlp=True,
                      rope_theta=500000.0, norm_eps=1e-5, max_seq_len=131072)

#: Llama 3.1 configurations (Llama 3 paper Table 3; Hugging Face config.json of meta-llama/Llama-3.1-*).
CATALOG: dict[str, ModelSpec] = {
    "8b": ModelSpec(name="llama3.1-8b", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                    ffn_hidden_size=14336, **LLAMA31_COMMON),
    "70b": ModelSpec(name="llama3.1-70b", hidden_size=8192, num_layers=80, num_heads=64, num_kv_heads=8,
                     ffn_hidden_size=28672, **LLAMA31_COMMON),
    "405b": ModelSpec(name="llama3.1-405b", hidden_size=16384, num_layers=126, num_heads=128,
                      num_kv_heads=8, ffn_hidden_size=53248, **LLAMA31_COMMON),
}


def get_model(size: str) -> ModelSpec:
    """The catalog model for ``size`` (``8b``, ``70b``, ``405b``; also accepts ``llama3.1-8b``).

    Raises:
        ConfigError: unknown size; the message lists the known ones.
    """
    key = size.strip().lower()
    for prefix in ("llama3.1-", "llama-3.1-", "llama3-"):
        if key.startswith(prefix):
            key = key[len(prefix):]
    if key not in CATALOG:
        raise ConfigError(f"unknown model size {size!r}; known sizes: {', '.join(CATALOG)} "
                          "(or pass --model path/to/config.json)")
    return CATALOG[key]


_GATED_ACTS = {"silu", "swiglu", "swish"}


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Read a Hugging Face ``config.json`` of a dense decoder (Llama, Mistral, Qwen2, GPT-NeoX-like).

    Reads ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``
    (defaults to the head count), ``intermediate_size``, ``vocab_size``, ``tie_word_embeddings``,
    ``head_dim`` (defaults to hidden/heads) and ``hidden_act``: ``silu`` means a gated (SwiGLU) MLP,
    anything else (``gelu``, ``gelu_new``, ...) a plain two-projection MLP unless ``mlp_type``/
    ``gated_mlp`` says otherwise.

    Raises:
        ConfigError: unreadable file, missing field (named), or a mixture-of-experts config.
    """
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"model config {p} does not exist") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"model config {p} is not readable JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"model config {p}: expected a JSON object, got {type(raw).__name__}")
    if any(k in raw for k in ("num_local_experts", "num_experts", "n_routed_experts")):
        raise ConfigError(f"model config {p}: mixture-of-experts models are not supported (dense only)")

    def need(*names: str) -> Any:
        for n in names:
            if n in raw and raw[n] is not None:
                return raw[n]
        raise ConfigError(f"model config {p}: missing field {names[0]!r} (expected a positive integer)")

    hidden = need("hidden_size", "n_embd", "d_model")
    heads = need("num_attention_heads", "n_head")
    kv = raw.get("num_key_value_heads") or heads
    act = str(raw.get("hidden_act", raw.get("activation_function", "silu"))).lower()
    gated = raw.get("gated_mlp")
    if gated is None:
        gated = act in _GATED_ACTS or raw.get("mlp_type") == "swiglu"
    head_dim = raw.get("head_dim") or (hidden // heads)
    ffn = raw.get("intermediate_size") or raw.get("n_inner") or 4 * hidden
    name = raw.get("_name_or_path") or raw.get("model_type") or p.parent.name or p.stem
    return ModelSpec(
        name=str(name), hidden_size=int(hidden), num_layers=int(need("num_hidden_layers", "n_layer")),
        num_heads=int(heads), num_kv_heads=int(kv), ffn_hidden_size=int(ffn),
        vocab_size=int(need("vocab_size")), head_dim=int(head_dim),
        tied_embeddings=bool(raw.get("tie_word_embeddings", False)), gated_mlp=bool(gated),
        rope_theta=float(raw.get("rope_theta", 10000.0)), norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        max_seq_len=int(raw.get("max_position_embeddings", 4096)),
    )
