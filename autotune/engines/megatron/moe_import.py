"""Mixture-of-experts, multi-latent-attention and multi-token-prediction options of a user's Megatron-LM
launch (part of :mod:`autotune.engines.megatron.importer`; the inverse of
:func:`autotune.engines.megatron.export.moe_architecture_args` and the MoE part of ``plan_args``).

Defaults and rules, from NVIDIA/Megatron-LM at d98e8a64ddf3 (megatron/training/arguments.py
``validate_args``, ``_add_mla_args``, ``moe_freq_type``; megatron/core/transformer/transformer_config.py
``TransformerConfig`` / ``MLATransformerConfig`` fields; megatron/training/argument_utils.py
``core_transformer_config_from_args``):

* ``--moe-ffn-hidden-size`` defaults to ``--ffn-hidden-size`` ("moe_ffn_hidden_size is not set, using
  ffn_hidden_size"); ``--moe-router-topk`` 2; ``--moe-token-dispatcher-type`` allgather;
  ``--moe-flex-dispatcher-backend`` deepep; ``--expert-model-parallel-size`` 1;
  ``--expert-tensor-parallel-size`` defaults to ``--tensor-model-parallel-size``; ``--moe-grouped-gemm`` off
  (one GEMM per local expert); ``--moe-router-score-function`` softmax;
* ``--moe-layer-freq``: an integer N (layer i is MoE when i % N == 0) or a Python list expression of 0/1
  per layer (``([0]*3+[1]*58)``); autotune's model has the first k layers dense, then i % N == 0;
* ``--moe-shared-expert-intermediate-size`` is the shared experts' total width (one MLP in Megatron-Core);
  read as ``width / --moe-ffn-hidden-size`` experts of the routed width when it divides (DeepSeek's shared
  experts have the routed width), else as one expert of that width: the same weights and FLOPs;
* MLA: ``--q-lora-rank`` None (= queries projected directly), ``--kv-lora-rank`` 32, ``--qk-head-dim`` 128,
  ``--qk-pos-emb-head-dim`` 64, ``--v-head-dim`` 128; its RoPE is YaRN unless ``--rope-type rope``
  (MLATransformerConfig ``rope_type`` "yarn"), with ``--rotary-scaling-factor`` (default 1.0: unscaled) and
  ``--yarn-original-max-position-embeddings`` (MLATransformerConfig ``original_max_position_embeddings``
  4096 when not given); ``--qk-layernorm`` with MLA = the latent norms (gpt_layer_specs.py);
* ``--recompute-modules`` default ``core_attn`` (TransformerConfig ``recompute_modules``).

The routing settings export writes for every MoE launch (``--moe-router-load-balancing-type aux_loss
--moe-aux-loss-coeff 1e-3 --moe-router-force-load-balancing --moe-router-dtype fp32 --moe-permute-fusion``)
are modelled when the file has them; otherwise listed as approximated (the cost model routes balanced).
"""

from __future__ import annotations

import ast
import re
from typing import Any

from autotune.errors import ConfigError

#: the routing options export writes (export.moe_architecture_args) -> their value tuple there
EXPORT_ROUTING = {"--moe-router-load-balancing-type": ("aux_loss",), "--moe-aux-loss-coeff": (1e-3,),
                  "--moe-router-force-load-balancing": (), "--moe-router-dtype": ("fp32",),
                  "--moe-permute-fusion": ()}
#: MoE / MLA options that mean a model or mechanism autotune does not simulate: option -> what it is
MOE_REFUSED = {
    "--moe-use-upcycling": "upcycling a dense checkpoint into experts",
    "--moe-latent-size": "a latent MoE (experts on a down-projected hidden state)",
    "--moe-shared-expert-gate": "a gated shared expert",
    "--moe-pad-expert-input-to-capacity": "expert inputs padded to capacity (the cost model is dropless)",
}


#: the longest --moe-layer-freq list read (layers); a longer one is refused before it is built
MAX_PATTERN = 100_000


def _list_expression(text: str) -> list[int] | None:
    """The list of a ``moe_freq_type`` expression (list literals of integers, ``+``, ``*`` by an integer), or
    None for anything else; lengths are checked against :data:`MAX_PATTERN` before a list is built (Megatron-LM
    evaluates the string as Python; autotune runs no code of the file)."""
    def ev(n: ast.AST) -> list[int] | int:
        if isinstance(n, ast.Constant) and type(n.value) is int and 0 <= n.value <= MAX_PATTERN:
            return n.value
        if isinstance(n, ast.List) and len(n.elts) <= MAX_PATTERN:
            vals = [ev(e) for e in n.elts]
            if all(isinstance(v, int) for v in vals):
                return vals
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Mult)):
            a, b = ev(n.left), ev(n.right)
            if isinstance(n.op, ast.Add) and isinstance(a, list) and isinstance(b, list) and \
                    len(a) + len(b) <= MAX_PATTERN:
                return a + b
            if isinstance(n.op, ast.Mult):
                lst, k = (a, b) if isinstance(a, list) else (b, a)
                if isinstance(lst, list) and isinstance(k, int) and len(lst) * k <= MAX_PATTERN:
                    return lst * k
        raise ValueError(text)

    if len(text) > 10_000:
        return None
    try:
        out = ev(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return out if isinstance(out, list) else None


def _layer_pattern(r: Any, L: int) -> tuple[int, int]:
    """(num_first_dense_layers, moe_layer_freq) of ``--moe-layer-freq`` (``moe_freq_type``: an int or a list
    expression of 0/1 per layer).

    Raises:
        ConfigError: a list expression that is not literal 0/1 arithmetic, not ``L`` long, or a pattern other
            than k dense layers then every N-th layer MoE.
    """
    raw = r.value("--moe-layer-freq", 1)
    src = r.source
    if isinstance(raw, int) or re.fullmatch(r"[0-9]{1,9}", str(raw).strip()):
        n = int(raw)
        if n < 1:
            raise ConfigError(f"{src}: --moe-layer-freq {n}: must be >= 1")
        return 0, n
    pattern = _list_expression(str(raw))
    if pattern is None or any(v not in (0, 1) for v in pattern):
        raise ConfigError(f"{src}: --moe-layer-freq {str(raw)[:80]!r}: give an integer or a list expression of 0 "
                          "(dense) and 1 (MoE) per layer, such as ([0]*3+[1]*58)")
    if len(pattern) != L:
        raise ConfigError(f"{src}: --moe-layer-freq lists {len(pattern)} layers; the model has --num-layers {L}")
    ones = [i for i, v in enumerate(pattern) if v]
    if not ones:
        raise ConfigError(f"{src}: --moe-layer-freq {str(raw)[:80]!r}: no MoE layer; drop --num-experts for a dense "
                          "model")
    k = ones[0]
    for freq in ([ones[1] - k] if len(ones) > 1 else []) + [L, max(k, 1)]:
        if [int(i >= k and i % freq == 0) for i in range(L)] == pattern:
            return k, freq
    raise ConfigError(f"{src}: --moe-layer-freq {str(raw)[:80]!r}: autotune models the first k layers dense and "
                      "then every N-th layer MoE; this pattern is not of that form")


def read_attention_and_gpt_oss(r: Any) -> dict[str, Any]:
    """ModelSpec fields of sliding windows (``--window-size L,0``: the query and L keys before it, HF
    ``sliding_window`` L + 1, Transformer Engine's inclusive bounds; ``--window-attn-skip-freq 2``: the 0-based
    even layers windowed, as autotune's ``sliding_window_period`` 2), attention sinks (``--softmax-type
    learnable``) and GPT-OSS's MLP (``--quick-geglu --glu-linear-offset 1 --activation-func-clamp-value C``
    without ``--disable-bias-linear``: the SwiGLU-clamp feature and biases on every linear layer), the inverse
    of :func:`autotune.engines.megatron.export.architecture_args`'s GPT-OSS flags.

    Raises:
        ConfigError: a window with look-ahead, a skip pattern other than 2, ``off-by-one`` softmax, a quick
            GeGLU without GPT-OSS's offset and clamp (named).
    """
    kw: dict[str, Any] = {}
    win = r.value("--window-size", None)
    if win is not None:
        try:
            left, right = (int(x) for x in str(win).strip("()").split(","))
        except ValueError:
            raise ConfigError(f"{r.source}: --window-size {str(win)[:40]!r}: give LEFT,RIGHT (tuple_type)") from None
        if right != 0 or left < 0:
            r.refuse("--window-size", f"a window of ({left}, {right}) (autotune models causal windows (W, 0))")
        skip = r.value("--window-attn-skip-freq", None)
        if skip not in (None, 2, "2"):
            r.refuse("--window-attn-skip-freq", "a window pattern other than every layer or the even layers (GPT-OSS)")
        kw.update(sliding_window=left + 1, sliding_window_period=2 if skip is not None else 1)
    else:
        r.ignore("--window-attn-skip-freq", "no effect without --window-size")
    soft = r.value("--softmax-type", "vanilla")
    if soft == "off-by-one":
        r.refuse("--softmax-type", "off-by-one softmax (autotune models vanilla softmax and learnable sinks)")
    if soft == "learnable":
        kw["attention_sinks"] = True
    if r.switch("--quick-geglu"):
        off, clamp = r.value("--glu-linear-offset", 0.0), r.value("--activation-func-clamp-value", None)
        if off != 1.0 or clamp is None or r.has("--disable-bias-linear"):
            r.refuse("--quick-geglu", "a quick-GeGLU MLP other than GPT-OSS's (--glu-linear-offset 1, "
                     "--activation-func-clamp-value, biases on every linear layer)")
        kw.update(features=(f"SwiGLU clamped at swiglu_limit {clamp:g} (GPT-OSS)",), qkv_bias=True,
                  attention_output_bias=True)
        if r.has("--no-yarn-correction-range-round-to-int"):
            r.switch("--no-yarn-correction-range-round-to-int")
    return kw


def read_moe_model(r: Any, *, ffn: int, L: int, biases: bool = False) -> dict[str, Any]:
    """ModelSpec fields of the MoE, MLA, Q/K-norm and MTP options (empty for a dense standard-attention
    launch). ``ffn``: the dense MLP width (``--ffn-hidden-size``), ``L``: ``--num-layers``; ``biases``: every
    linear layer has a bias (GPT-OSS: the experts' and the router's too).

    Raises:
        ConfigError: an option of :data:`MOE_REFUSED`, a score function other than softmax / sigmoid, or a
            value out of range (named).
    """
    src, kw = r.source, {}
    for opt, what in MOE_REFUSED.items():
        if r.has(opt):
            r.refuse(opt, what)
    experts = r.value("--num-experts", None)
    if experts:
        if experts < 1:
            raise ConfigError(f"{src}: --num-experts {experts}: must be >= 1")
        fe = r.positive("--moe-ffn-hidden-size", ffn)
        kw.update(num_experts=experts, moe_top_k=r.positive("--moe-router-topk", 2), moe_ffn_hidden_size=fe,
                  moe_expert_bias=biases, router_bias=biases)
        shared = r.value("--moe-shared-expert-intermediate-size", 0)
        if shared:
            kw.update(num_shared_experts=shared // fe, shared_expert_ffn_hidden_size=fe) if shared % fe == 0 else \
                kw.update(num_shared_experts=1, shared_expert_ffn_hidden_size=shared)
        first, freq = _layer_pattern(r, L)
        kw.update(num_first_dense_layers=first, moe_layer_freq=freq)
        score = r.value("--moe-router-score-function", "softmax")
        if score not in ("softmax", "sigmoid"):
            r.refuse("--moe-router-score-function", f"router score function {score} (autotune models softmax and "
                     "sigmoid)")
        kw.update(router_score_function=score, router_expert_bias=r.switch("--moe-router-enable-expert-bias"))
        if r.has("--moe-router-num-groups"):
            kw.update(router_num_groups=r.positive("--moe-router-num-groups", None),
                      router_group_top_k=r.positive("--moe-router-group-topk", None, " with --moe-router-num-groups"))
        kw["router_scaling_factor"] = float(r.value("--moe-router-topk-scaling-factor", 1.0))
        missing = []
        for opt, want in EXPORT_ROUTING.items():
            if r.args.get(opt) == want:
                r.modelled[opt] = want
            else:
                missing.append(opt)
                if r.has(opt):
                    r.handled.add(opt)
        if missing:
            r.approx.append("routing costed balanced (each expert gets the mean tokens, as published benchmarks "
                            f"force it); export writes {' '.join(_show_routing())} (the file differs in "
                            f"{', '.join(missing)})")
        cap = r.value("--moe-expert-capacity-factor", None, modelled=False)
        if cap is not None:
            if cap < 1:
                r.refuse("--moe-expert-capacity-factor", f"capacity factor {cap:g} < 1 drops routed tokens even "
                         "when balanced (the cost model is dropless)")
            r.approx.append(f"--moe-expert-capacity-factor {cap:g}: balanced routing drops no token at a capacity "
                            ">= 1; costed dropless")
            r.ignore("--moe-token-drop-policy", "no token is dropped under balanced routing")
    else:
        for o in ("--moe-router-topk", "--moe-ffn-hidden-size", "--moe-layer-freq", "--moe-grouped-gemm",
                  "--moe-token-dispatcher-type", *EXPORT_ROUTING):
            r.ignore(o, "no effect without --num-experts")
    if r.switch("--multi-latent-attention"):
        q = r.value("--q-lora-rank", None) or 0
        kw.update(q_lora_rank=q, kv_lora_rank=r.positive("--kv-lora-rank", 32),
                  qk_nope_head_dim=r.positive("--qk-head-dim", 128),
                  qk_rope_head_dim=r.positive("--qk-pos-emb-head-dim", 64), v_head_dim=r.positive("--v-head-dim", 128))
        kw["head_dim"] = kw["qk_nope_head_dim"] + kw["qk_rope_head_dim"]
        r.ignore("--kv-channels", "no effect with --multi-latent-attention (the head widths are --qk-head-dim, "
                                  "--qk-pos-emb-head-dim, --v-head-dim)")
        if not r.switch("--qk-layernorm"):
            r.approx.append("MLA without --qk-layernorm: costed with the latent RMSNorms (DeepSeek's q_a_layernorm, "
                            "kv_a_layernorm), which export writes (--qk-layernorm)")
    elif r.switch("--qk-layernorm"):
        kw["qk_norm"] = True
    mtp = r.value("--mtp-num-layers", None)
    if mtp:
        kw["mtp_num_layers"] = mtp
    return kw


def _show_routing() -> list[str]:
    out = []
    for opt, v in EXPORT_ROUTING.items():
        out += [opt, *(f"{x:g}" if isinstance(x, float) else str(x) for x in v)]
    return out


def read_rope_scaling(r: Any, *, mla: bool, pe: str):
    """The YaRN RopeScaling of an MLA launch (``--rope-type``, default yarn) or of ``--position-embedding-type
    yarn``; None for plain RoPE (or YaRN with factor 1: unscaled)."""
    from autotune.spec.models import RopeScaling

    yarn = (r.value("--rope-type", "yarn") == "yarn") if mla else pe == "yarn"
    if not yarn:
        for o in ("--rotary-scaling-factor", "--yarn-original-max-position-embeddings"):
            r.ignore(o, "no effect without YaRN RoPE")
        return None
    factor = float(r.value("--rotary-scaling-factor", 1.0))
    orig = r.value("--yarn-original-max-position-embeddings", 4096)
    if factor == 1.0:
        r.ignore("--yarn-original-max-position-embeddings", "no effect: YaRN with --rotary-scaling-factor 1 "
                                                            "scales no frequency")
        return None
    return RopeScaling(type="yarn", factor=factor, original_max_position_embeddings=orig)


def read_moe_plan(r: Any, model: Any, *, tp: int, async_coll: bool) -> dict[str, Any]:
    """Plan fields of the expert-parallel options: ``ep_degree``, ``etp_degree`` (default TP), the dispatcher,
    grouped GEMM and all-to-all overlap (empty for a dense model, whose EP 1 is ignored)."""
    if not model.is_moe:
        return {}
    ep = r.positive("--expert-model-parallel-size", 1)
    etp = r.value("--expert-tensor-parallel-size", None)
    if etp is None:
        etp = tp
        if tp > 1:
            r.approx.append(f"no --expert-tensor-parallel-size: Megatron-LM uses TP {tp} for the experts "
                            "(validate_args), which export writes")
    elif etp < 1:
        raise ConfigError(f"{r.source}: --expert-tensor-parallel-size {etp}: must be an integer >= 1")
    disp = r.value("--moe-token-dispatcher-type", "allgather")
    if r.switch("--moe-enable-deepep", modelled=False):
        disp = "flex"
    if disp == "flex":
        backend = r.value("--moe-flex-dispatcher-backend", "deepep")
        if backend != "deepep" or not r.has("--moe-flex-dispatcher-backend"):
            r.demote("--moe-flex-dispatcher-backend")
            if backend != "deepep":
                r.approx.append(f"--moe-flex-dispatcher-backend {backend}: costed as the flex dispatcher autotune "
                                "has (DeepEP), which export writes")
    else:
        r.ignore("--moe-flex-dispatcher-backend", "no effect without --moe-token-dispatcher-type flex")
    overlap = r.switch("--overlap-moe-expert-parallel-comm")
    if overlap and not async_coll:
        # autotune's one switch for asynchronous collectives is off (--no-overlap-p2p-communication, no DP / TP
        # overlap): the plan overlaps nothing, so not the all-to-all either
        r.demote("--overlap-moe-expert-parallel-comm")
        r.approx.append("--overlap-moe-expert-parallel-comm with every other overlap off: costed without it "
                        "(autotune has one switch for asynchronous collectives)")
        overlap = False
    return {"ep_degree": ep, "etp_degree": etp, "moe_dispatcher": disp,
            "moe_grouped_gemm": r.switch("--moe-grouped-gemm"), "moe_a2a_overlap": overlap}


def read_recompute_modules(r: Any) -> tuple[str, ...] | None:
    """``--recompute-modules`` with selective recompute as the plan's ``recompute_modules`` (None for
    Megatron-LM's default, ``core_attn`` alone)."""
    mods = r.args.get("--recompute-modules")
    if mods is None:
        return None
    if tuple(mods) == ("core_attn",):
        r.handled.add("--recompute-modules")
        return None
    if list(mods) == sorted(set(mods)):
        r.modelled["--recompute-modules"] = mods      # export writes the plan's sorted tuple
    else:
        r.handled.add("--recompute-modules")
    return tuple(mods)


__all__ = ["EXPORT_ROUTING", "MOE_REFUSED", "read_attention_and_gpt_oss", "read_moe_model", "read_moe_plan", "read_recompute_modules",
           "read_rope_scaling"]
