"""What one transformer layer saves for backward, per micro-batch and GPU (split from :mod:`autotune.cost.memory`,
which re-exports these names): the saved tensors of a dense layer (:func:`activation_bytes_per_layer`,
Korthikanti et al. 2022, arXiv 2205.05198, Sec. 4 and Table 2, re-derived for Llama), what selective, full and
compiled recomputation keep, Transformer Engine's FP8 copies, and a mixture-of-experts or multi-latent-attention
layer (:func:`moe_layer_bytes`). Pure arithmetic."""

from __future__ import annotations

import math
from typing import Mapping

from autotune.cost import moe
from autotune.errors import PlanError
from autotune.spec.engines import EngineProfile, engine_for_plan, get_engine
from autotune.spec.models import ModelSpec
from autotune.spec.plan import RECOMPUTE_MODES, Plan, Workload, fp8_gemm_dims

#: Bytes per element of BF16 activations and compute copies of the weights.
BF16_BYTES = 2
#: What an FP8 linear saves depends on the library the engine runs it with
#: (:attr:`autotune.spec.engines.EngineProfile.fp8_library`). Transformer Engine (Megatron-LM, every FP8
#: recipe: Float8CurrentScaling for ``fp8_tensorwise``, DelayedScaling, MXFP8BlockScaling):
#: ``_Linear.forward`` (transformer_engine/pytorch/module/linear.py) saves the quantized input (1 byte
#: per element) instead of the BF16 input, and the module caches its FP8 weight and FP8 transpose from
#: the first micro-batch of a step to the last: 1 + 1 bytes per linear weight. torchao (native,
#: torchtitan): ``ctx.save_for_backward(input_hp, weight_hp_t)`` in ``matmul_with_hp_or_float8_args``
#: (torchao/float8/float8_linear.py) and ``save_for_backward(input_hp, weight_hp)`` in ``mx_mm``
#: (torchao/prototype/mx_formats/mx_linear.py) keep the high-precision input and weight and re-cast them
#: in backward: no change to saved activations; their FP8 copies live for one GEMM only (not counted).
FP8_BYTES = 1
#: torch.compile's saved bytes over eager autograd's for autotune's runtime block (precision kind,
#: recompute), measured on 1x H200 with torch 2.11.0+cu130 / torchao 0.17.0 (bench/saved_activations.py,
#: docs/results/saved-activations-h200x1-2026-12-01.json; Llama 3.1 8B block, seq 8192): the
#: partitioner (AOTAutograd min-cut rematerialization) recomputes the norms and SwiGLU in backward, and
#: with torchao FP8 saves the FP8 casts of the linears' inputs. FP8 rowwise measured the same as
#: tensorwise. Full recompute keeps only the block input either way (1). tests/cost/test_memory.py
#: re-derives these from the JSON.
COMPILED_OVER_EAGER = {("bf16", "none"): 0.672, ("bf16", "selective"): 0.547,
                       ("fp8", "none"): 0.462, ("fp8", "selective"): 0.453}
TE_FP8_WEIGHT_COPY_BYTES = 2     # FP8 weight + its FP8 transpose
#: fp32 logsumexp that flash attention keeps per query row and head (Dao 2023, FlashAttention-2 Alg. 1).
LSE_BYTES = 4

def _torchtitan_block():
    """The measured torchtitan block table (``torchtitan_block`` accounting), through the engine registry:
    :mod:`autotune.engines.torchtitan.block_saved`."""
    from autotune.engines.registry import accounting_module

    return accounting_module("torchtitan_block")


def _seq_per_rank(plan: Plan, workload: Workload) -> int:
    if workload.seq_len % plan.cp_degree:
        lo = (workload.seq_len // plan.cp_degree) * plan.cp_degree
        raise PlanError(f"seq_len={workload.seq_len} does not split over cp_degree={plan.cp_degree}; "
                        f"use a multiple of {plan.cp_degree}, e.g. {lo or plan.cp_degree} or "
                        f"{lo + plan.cp_degree}")
    return workload.seq_len // plan.cp_degree


def _check_tp(model: ModelSpec, plan: Plan) -> None:
    t = plan.tp_degree
    dims = {"num_heads": model.num_heads, "num_kv_heads": model.num_kv_heads,
            "ffn_hidden_size": model.ffn_hidden_size, "hidden_size": model.hidden_size}
    bad = {k: v for k, v in dims.items() if v % t}
    if bad:
        g = math.gcd(*dims.values())
        raise PlanError(f"tp_degree={t} does not divide " + ", ".join(f"{k}={v}" for k, v in bad.items())
                        + f" of {model.name}; valid tp_degree: {[d for d in range(1, g + 1) if g % d == 0]}")


def te_fp8(plan: Plan, engine: EngineProfile | str | None) -> bool:
    """True when ``plan`` runs FP8 linears through Transformer Engine on ``engine`` (its
    ``fp8_library``): they save FP8 inputs and cache FP8 weights (see the note above ``FP8_BYTES``)."""
    return getattr(plan, "precision", "bf16") != "bf16" and get_engine(engine).fp8_library == "transformer_engine"


def _layer_activation_terms(model: ModelSpec, plan: Plan, workload: Workload,
                            engine: EngineProfile | str | None) -> dict[str, int]:
    """Bytes of each tensor one layer saves for backward, one micro-batch, one GPU, no recompute.

    Keys name the tensors; see :func:`activation_bytes_per_layer` for the derivation.
    """
    s = _seq_per_rank(plan, workload)
    b, h, t = plan.micro_batch_size, model.hidden_size, plan.tp_degree
    q, kv, f = model.q_dim, model.kv_dim, model.ffn_hidden_size
    sbh = BF16_BYTES * s * b * h // (t if plan.sp_active else 1)
    terms = {
        "attn_norm_input": sbh,
        "attn_norm_output": sbh,
        "qkv": BF16_BYTES * s * b * (q + 2 * kv) // t,
        "attn_output": BF16_BYTES * s * b * q // t,
        "attn_logsumexp": LSE_BYTES * s * b * model.num_heads // t,
        "mlp_norm_input": sbh,
        "mlp_norm_output": sbh,
    }
    if model.gated_mlp:
        terms["mlp_gate_up"] = 2 * BF16_BYTES * s * b * f // t
        terms["mlp_act_output"] = BF16_BYTES * s * b * f // t      # SwiGLU output, input of down proj
    else:
        terms["mlp_fc1"] = BF16_BYTES * s * b * f // t
        terms["mlp_act_output"] = BF16_BYTES * s * b * f // t      # GeLU output, input of fc2
    eng = engine_for_plan(engine, plan)
    if eng.activation_accounting == "pytorch_eager":
        # autograd's saved set of autotune's eager block (runtime/model.py), beyond the minimal one:
        # each RMSNorm keeps its FP32 input copy (4 bytes where the input term counts 2) and its
        # normalized BF16 output before the weight multiply (2); SDPA keeps K and V repeated to the
        # query heads (_attention_core's repeat_interleave); SwiGLU keeps silu(gate) for the multiply
        # besides its product. Derived 1,745,879,040 bytes for the 8B block at s = 8192; measured
        # 1,754,333,184 on H200 (bench/saved_activations.py; saved-tensor listing on H200: the same
        # tensors, 1664 MiB (exactly) of activation-sized ones, plus per-row statistics)
        terms["attn_norm_fp32"] = sbh
        terms["attn_norm_prescale"] = sbh
        terms["mlp_norm_fp32"] = sbh
        terms["mlp_norm_prescale"] = sbh
        terms["kv_repeat"] = 2 * BF16_BYTES * s * b * (q - kv) // t
        terms["mlp_silu"] = BF16_BYTES * s * b * f // t
    if te_fp8(plan, engine):
        # TE saves the linears' inputs in FP8: the norm outputs and the MLP
        # activation output are kept only for their linears -> 1 byte; the attention output is also
        # saved in BF16 by the attention kernel's backward -> 2 + 1 bytes
        for k in ("attn_norm_output", "mlp_norm_output", "mlp_act_output"):
            terms[k] = terms[k] * FP8_BYTES // BF16_BYTES
        terms["attn_output"] = terms["attn_output"] * (BF16_BYTES + FP8_BYTES) // BF16_BYTES
    return terms


def te_fp8_weight_copy_bytes(model: ModelSpec, plan: Plan, num_layers: int,
                             engine: EngineProfile | str | None = "native") -> int:
    """Bytes of Transformer Engine's cached FP8 weight + FP8 transpose copies on one GPU.

    2 bytes x the per-rank linear weights (:func:`autotune.spec.plan.fp8_gemm_dims`, K x N each) of
    ``num_layers`` layers when the plan's FP8 runs through TE on ``engine`` (:func:`te_fp8`); 0 otherwise,
    and 0 with FP8 parameters (``fp8_param_gather``, Megatron-LM --fp8-param-gather: "keep the compute
    param in fp8"): the FP8 weight and its transpose then are the parameter, 1 + 1 bytes in place of the
    BF16 weight's 2, which the weights term already counts.
    """
    if not te_fp8(plan, engine) or engine_for_plan(engine, plan).fp8_param_gather:
        return 0
    per_layer = sum(k * n for k, n in fp8_gemm_dims(model, plan.tp_degree).values())
    return TE_FP8_WEIGHT_COPY_BYTES * per_layer * num_layers


#: Tensors that selective recomputation (Megatron-LM ``--recompute-granularity selective`` extended to
#: the MLP activation) does not keep: the attention core's output and the MLP activation's output;
#: With eager autograd's saved set (native runtime) the checkpoints' outputs are still saved by the
#: projections after them (the attention output by wo, the SwiGLU product by w2), so what goes is what
#: lives inside them: the repeated K/V (the checkpointed core keeps its un-repeated Q, K, V), the
#: logsumexp and silu(gate): derived 1,409,286,144 bytes for the 8B block, measured 1,417,740,288
#: (bench/saved_activations.py; the H200 saved-tensor listing has the same activation-sized tensors).
_SELECTIVE_DROPPED = ("attn_output", "mlp_act_output")
_SELECTIVE_DROPPED_EAGER = ("attn_logsumexp", "kv_repeat", "mlp_silu")


def _selective_bytes(terms: Mapping[str, int], mode: str, model: ModelSpec, plan: Plan,
                     workload: Workload) -> int:
    """Bytes one layer keeps under ``recompute: selective`` as engine mode ``mode`` defines it
    (:attr:`autotune.spec.engines.EngineProfile.selective_recompute`):

    * ``core_attention_and_mlp_act`` (native runtime): all terms but the attention output and the MLP
      activation output (:data:`_SELECTIVE_DROPPED`);
    * ``core_attention`` (Megatron-LM ``--recompute-modules core_attn``): the checkpointed core
      attention's inputs (Q, K, V) and its output (the input the output projection saves) stay; only
      flash attention's own saved logsumexp is dropped;
    * ``every_second_mm`` (torchtitan op-level SAC, ``torchtitan/distributed/activation_checkpoint.py``):
      only the block's input and the outputs of the saved ops survive: wq 2sbq/t, wv 2sb kv/t, the
      attention output 2sbq/t and its logsumexp, w1 2sbf/t (gate) and w2 (the MLP output, 2sbh, /t
      with SP); wk, wo, w3 (the even mms) and every elementwise output are recomputed.
    """
    if mode == "core_attention":
        return sum(v for k, v in terms.items() if k != "attn_logsumexp")
    if mode == "every_second_mm":
        s, b, t = _seq_per_rank(plan, workload), plan.micro_batch_size, plan.tp_degree
        q, kv, f = model.q_dim, model.kv_dim, model.ffn_hidden_size
        return (terms["attn_norm_input"] + BF16_BYTES * s * b * (2 * q + kv + f) // t
                + terms["attn_logsumexp"] + terms["mlp_norm_input"])
    dropped = _SELECTIVE_DROPPED_EAGER if "mlp_silu" in terms else _SELECTIVE_DROPPED
    return sum(v for k, v in terms.items() if k not in dropped)


def _compiled_layer_bytes(eager_bytes: int, plan: Plan, engine: EngineProfile | str | None) -> int:
    """A layer's saved bytes under ``plan.compile`` for an engine with eager-autograd accounting: the
    eager count x :data:`COMPILED_OVER_EAGER` (measured); unchanged otherwise or with full recompute. For
    the ``torchtitan_block`` accounting (eager or compiled) the count x the measured factor of
    :data:`autotune.engines.torchtitan.block_saved.TORCHTITAN_BLOCK_SAVED`."""
    accounting = get_engine(engine).activation_accounting
    if accounting == "torchtitan_block" and plan.recompute != "full":
        return math.ceil(eager_bytes * _torchtitan_block().block_factors(plan)[0])
    if not getattr(plan, "compile", False) or accounting != "pytorch_eager":
        return eager_bytes
    if plan.recompute == "full":
        return eager_bytes
    kind = "bf16" if getattr(plan, "precision", "bf16") == "bf16" else "fp8"
    return math.ceil(eager_bytes * COMPILED_OVER_EAGER[kind, plan.recompute])


def _compiled_no_recompute_bytes(eager_bytes: int, plan: Plan, engine: EngineProfile | str | None) -> int:
    """:func:`_compiled_layer_bytes` of ``plan``'s no-recompute twin (``recompute: none``, no
    ``recompute_num_layers``): what a layer keeps when it is not recomputed. The twin is built only for the
    accountings whose factor reads the plan (``torchtitan_block``, ``pytorch_eager`` under compile): for the
    others the eager count is the answer whatever the plan (a search estimates the memory of thousands of
    plans; building the twin was a third of the cost of a fully recomputed plan's estimate)."""
    accounting = get_engine(engine).activation_accounting
    if accounting != "torchtitan_block" and (accounting != "pytorch_eager" or not getattr(plan, "compile", False)):
        return eager_bytes
    return _compiled_layer_bytes(eager_bytes, plan.replace(recompute="none", recompute_num_layers=0)
                                 if plan.recompute == "full" else plan, engine)


def activation_bytes_per_layer(model: ModelSpec, plan: Plan, workload: Workload, *,
                               recompute: str | None = None, engine: EngineProfile | str | None = "native") -> int:
    """Activation bytes one transformer layer keeps for backward: one micro-batch, one GPU.

    Re-derived for Llama from Korthikanti et al. 2022 (arXiv 2205.05198, Sec. 4.1 and Table 2), bf16
    (2 bytes), with s = seq_len / cp_degree, b = micro_batch_size, h hidden, t = tp_degree,
    q = heads x head_dim, kv = kv_heads x head_dim, f = ffn_hidden_size; no dropout (Llama has none,
    so the paper's dropout masks vanish) and flash attention (no s x s scores or softmax, only an
    fp32 logsumexp per query row and head)::

        attention: RMSNorm input 2sbh + norm output 2sbh + Q, K, V after RoPE 2sb(q + 2kv)/t
                   + attention output 2sbq/t + logsumexp 4sb heads/t
        MLP:       RMSNorm input 2sbh + norm output 2sbh
                   + SwiGLU: gate and up outputs 2 x 2sbf/t + SwiGLU output 2sbf/t
                   (plain GeLU MLP: fc1 output 2sbf/t + GeLU output 2sbf/t)

    The four h-sized terms are divided by t only with sequence parallelism active (sp and tp > 1;
    Korthikanti Sec. 4.2.2); without it every TP rank holds them whole.

    Recomputation (``recompute``, default ``plan.recompute``):

    * ``none``: all of the above.
    * ``selective``: what the engine's selective recomputation keeps (:func:`_selective_bytes`); for
      the native runtime it drops the attention output and the MLP activation output (recomputed from
      the kept Q/K/V and gate/up outputs; Korthikanti Sec. 4.3 recomputes the attention core). The
      logsumexp is kept (conservative; 4sb heads/t is < 0.5% of a layer).
    * ``full``: only the layer's input, 2sbh (/t with SP); the backward working set of one layer is
      accounted as transient by :func:`estimate_memory`.

    FP8 (``plan.precision``) through Transformer Engine (the engine's ``fp8_library``, :func:`te_fp8`)
    saves the linears' inputs in FP8: norm outputs and the MLP activation output 1 byte per element,
    the attention output 2 + 1; torchao saves BF16 as above. torch.compile changes nothing here
    (no measurement of its activation savings).

    Worked value (Llama 3.1 8B, s = 8192, b = 1, t = 1, none): 1,141,899,264 bytes (see tests).

    Raises:
        PlanError: seq_len not divisible by cp_degree, tp_degree not dividing the heads/widths, or an
            unknown recompute mode.
    """
    mode = plan.recompute if recompute is None else recompute
    if mode not in RECOMPUTE_MODES:
        raise PlanError(f"recompute={mode!r} is not valid; choose one of {', '.join(RECOMPUTE_MODES)}")
    _check_tp(model, plan)
    terms = _layer_activation_terms(model, plan, workload, engine)
    if mode == "none":
        return _compiled_layer_bytes(sum(terms.values()), plan, engine)
    if mode == "selective":
        return _compiled_layer_bytes(
            _selective_bytes(terms, get_engine(engine).selective_recompute, model, plan, workload), plan, engine)
    return _block_input_bytes(terms, plan, engine)


#: the dense-layer terms each Megatron-LM ``--recompute-modules`` entry drops (the module's saved tensors
#: are recomputed from its input; megatron/core/transformer/transformer_config.py ``recompute_modules``):
#: ``core_attn`` flash attention's logsumexp (its Q, K, V and output stay for the projections around it,
#: as :func:`_selective_bytes` ``core_attention``), ``layernorm`` the norms' outputs, ``mlp`` the dense
#: MLP's gate/up and activation outputs, ``mla_up_proj`` the up-projected Q / K / V (the latents stay)
_MODULE_DROPS = {"core_attn": ("attn_logsumexp",), "layernorm": ("attn_norm_output", "mlp_norm_output"),
                 "mlp": ("mlp_gate_up", "mlp_fc1", "mlp_act_output"), "mla_up_proj": ("qkv",)}


def _mla_terms(terms: dict[str, int], model: ModelSpec, plan: Plan, workload: Workload) -> None:
    """Replace the standard QKV term by multi-latent attention's saved tensors (DeepSeek-V2, arXiv 2405.04434,
    Sec. 2.1): the query and KV latents r_q + r_kv + d_rope (duplicated on every TP rank) and the up-projected
    Q (n (d_nope + d_rope)), K (n (d_nope + d_rope)) and V (n d_v) of the rank's heads, BF16."""
    s, b, t = _seq_per_rank(plan, workload), plan.micro_batch_size, plan.tp_degree
    n, dn, dr, dv = model.num_heads, model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
    terms["mla_latents"] = BF16_BYTES * s * b * (model.q_lora_rank + model.kv_lora_rank + dr)
    terms["qkv"] = BF16_BYTES * s * b * n * (2 * (dn + dr) + dv) // t
    terms["attn_output"] = BF16_BYTES * s * b * n * dv // t


class _AsRecompute:
    """``plan`` seen with another ``recompute`` mode (the partial-recompute callers' ``recompute="none"``)."""

    def __init__(self, plan: Plan, recompute: str) -> None:
        self._plan, self.recompute = plan, recompute

    def __getattr__(self, name: str):
        return getattr(self._plan, name)


def moe_layer_bytes(model: ModelSpec, plan: Plan, workload: Workload, engine: EngineProfile | str | None,
                    *, recompute: str | None = None) -> tuple[int, int]:
    """(a dense layer's, an MoE layer's) saved bytes for backward of a mixture-of-experts (or MLA) model, one
    micro-batch, one GPU, under ``recompute`` (default the plan's).

    Attention and norms as :func:`_layer_activation_terms` (multi-latent attention: :func:`_mla_terms`); a
    dense layer adds its MLP, an MoE layer its routed and shared experts (:func:`autotune.cost.moe.
    moe_activation_terms`, the busiest rank under ``Workload.moe_imbalance``). ``selective`` with
    ``plan.recompute_modules`` drops each module's tensors (:data:`_MODULE_DROPS`,
    :func:`autotune.cost.moe.recomputed_moe_terms`), without them the engine's selective mode
    (:func:`_selective_bytes`); ``full`` keeps the layer input.
    """
    rc = plan.recompute if recompute is None else recompute
    eng = engine_for_plan(engine, plan)
    terms = _layer_activation_terms(model, plan, workload, eng)
    if model.is_mla:
        _mla_terms(terms, model, plan, workload)
    if rc == "full":
        b = _block_input_bytes(terms, plan, eng)
        return b, b
    mlp_keys = ("mlp_gate_up", "mlp_fc1", "mlp_act_output")
    attn = {k: v for k, v in terms.items() if k not in mlp_keys}
    imb = float(getattr(workload, "moe_imbalance", 1.0))
    experts = moe.moe_activation_terms(model, plan, workload.seq_len, imbalance=imb, fp8_inputs=te_fp8(plan, eng))
    if rc == "none" and eng.moe_fp32_path_without_fsdp:     # torchtitan 0.2.2's FP32 routed path keeps more
        from autotune.cost.tt_moe import fp32_saved_terms
        sh = moe.expert_shapes(model, plan, workload.seq_len, imbalance=imb)
        experts.update(fp32_saved_terms(eng, plan if recompute is None else _AsRecompute(plan, rc),
                                        sh["token_copies"] * plan.etp_degree * imb, model.hidden_size,
                                        int(sh["ffn_per_rank"])))
    dense_t, moe_t = dict(terms), {**attn, **experts}
    if rc == "selective" and plan.recompute_modules is not None:
        drop = {k for mod in plan.recompute_modules for k in _MODULE_DROPS.get(mod, ())}
        drop |= set(moe.recomputed_moe_terms(plan.recompute_modules))
        return (sum(v for k, v in dense_t.items() if k not in drop),
                sum(v for k, v in moe_t.items() if k not in drop))
    if rc == "selective":
        mode = eng.selective_recompute
        dense_b = _selective_bytes(dense_t, mode, model, plan, workload)
        moe_b = _selective_bytes(attn, mode, model, plan, workload) if mode != "every_second_mm" else \
            sum(attn.values())
        # the engine's own selective set recomputes the experts' activation where it drops the MLP's
        if mode == "core_attention_and_mlp_act":
            experts = {k: v for k, v in experts.items() if k not in ("expert_act", "shared_act")}
        return dense_b, moe_b + sum(experts.values())
    # torchtitan 0.2.2 without FSDP: the BF16 expert-weight copies saved per grouped GEMM (autotune.cost.tt_moe)
    from autotune.cost.tt_moe import saved_weight_copy_bytes
    wcopy = saved_weight_copy_bytes(eng, plan if recompute is None else _AsRecompute(plan, rc),
                                    moe.expert_params_per_layer(model) / (plan.ep_degree * plan.etp_degree))
    return sum(dense_t.values()), int(sum(moe_t.values()) + wcopy)


def _block_input_bytes(terms: Mapping[str, int], plan: Plan, engine: EngineProfile | str | None) -> int:
    """The layer input's bytes (all a fully recomputed layer keeps; also the embedding output): the BF16
    count, x 2 for torchtitan under autocast, whose residual stream is FP32
    (:func:`autotune.engines.torchtitan.block_saved.residual_bytes`)."""
    if get_engine(engine).activation_accounting == "torchtitan_block":
        return terms["attn_norm_input"] * _torchtitan_block().residual_bytes(plan) // BF16_BYTES
    return terms["attn_norm_input"]


