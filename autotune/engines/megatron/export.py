"""Megatron-LM ``pretrain_gpt.py`` arguments and environment for a plan.

Every option name is an argument of Megatron-LM's parser (``megatron/training/arguments.py``,
``add_megatron_arguments``; NVIDIA/Megatron-LM commit d98e8a64ddf34856e74b24714e3bedb2f5a39553, names
in tests/data/megatron_args.txt, checked by tests/export/test_export.py). Facts used, each from that file:

* ZeRO-1 = ``--use-distributed-optimizer`` (optimizer state sharded over DP); ZeRO-2 / ZeRO-3 =
  Megatron-FSDP: ``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads`` /
  ``optim_grads_params`` (choices no_shard, optim, optim_grads, optim_grads_params), which asserts
  ``--ckpt-format fsdp_dtensor`` and CUDA_DEVICE_MAX_CONNECTIONS unset or > 1;
* TP or CP > 1 without FSDP on GPUs before Blackwell wants CUDA_DEVICE_MAX_CONNECTIONS=1 (the
  warning in ``validate_args``: "sequence parallelism requires setting the environment variable
  CUDA_DEVICE_MAX_CONNECTIONS to 1"; no longer needed from Blackwell, arch >= 10);
* ``--empty-unused-memory-level 1``: ``torch.cuda.empty_cache()`` once per iteration
  (megatron/training/training.py; no per-micro-batch level exists);
* ``--ddp-bucket-size`` counts parameters ("Maximum number of parameters in each bucket",
  megatron/core/distributed/distributed_data_parallel_config.py ``bucket_size``; buckets are filled with
  params up to that many elements, param_and_grad_buffer.py ``_compute_default_per_buffer_param_layout``)
  and the bucket's grad buffer has dtype ``torch.float if grad_reduce_in_fp32 else param.dtype``
  (param_and_grad_buffer.py); with ``--bf16`` ``validate_args`` sets ``accumulate_allreduce_grads_in_fp32``
  (-> ``grad_reduce_in_fp32``, training.py) unless ``--grad-reduce-in-bf16``. So a bucket of B bytes
  reduced, as the simulator costs it (``bucket_size_mib`` MiB of the megatron profile's
  ``grad_reduce_bytes`` = 4 per element, facts.yaml), is ``B / 4`` parameters. Megatron uses the
  bucket size only with ``--overlap-grad-reduce`` (distributed_data_parallel.py: bucket_size None, one
  bucket per gradient buffer, otherwise; the simulator costs it so), so ``--ddp-bucket-size`` is written
  only with ``--overlap-grad-reduce``;
* ``--rotary-base`` is ``type=int``; RoPE scaling: ``--use-rope-scaling --rope-scaling-factor F``
  applies the llama3 scaling with low/high frequency factors 1 / 4 and an original context of 8192
  tokens (megatron/core/models/common/embeddings/rotary_pos_embedding.py ``_apply_scaling`` defaults;
  no flag sets them), so only that llama3 variant is exported; ``--add-qkv-bias`` (Qwen2's Q/K/V
  biases with ``--disable-bias-linear``); activations: ``--swiglu`` (gated SiLU), the default GeLU
  (F.gelu) or ``--openai-gelu`` (tanh approximation) for a plain MLP, and no GeGLU, logit soft-capping,
  post-norms or embedding scaling (no such flags): such models are refused (:func:`unsupported_features`);
* ``async_collectives: false``: Megatron has no switch that makes every collective blocking; the
  plan's meaning (no communication overlapped with compute) is launched by leaving out
  ``--overlap-grad-reduce``, ``--overlap-param-gather`` and ``--tp-comm-overlap`` and, with PP, adding
  ``--no-overlap-p2p-communication`` (dest ``overlap_p2p_comm``);
* uneven pipeline splits: ``--pipeline-model-parallel-layout`` (E = embedding, t = transformer layer,
  L = loss, ``|`` between virtual stages in model order); even interleaved splits:
  ``--num-layers-per-virtual-pipeline-stage``;
* recompute: ``--recompute-granularity selective`` or ``full --recompute-method uniform
  --recompute-num-layers 1`` (every layer); ``Plan.recompute_num_layers`` N >= 1: ``full
  --recompute-method block --recompute-num-layers N`` (the first N layers of each model chunk:
  megatron/core/recompute.py ``checkpointed_forward``, ``recompute_method == 'block'``);
* FP8 (``_add_transformer_engine_args``): ``--fp8-format {e4m3,hybrid}``, ``--fp8-recipe
  {tensorwise,delayed,mxfp8,blockwise}``; delayed scaling with ``--fp8-amax-history-len 1024
  --fp8-amax-compute-algo max`` (NeMo's FP8 recipes).
Architecture from the :class:`ModelSpec` (Llama 3.1: RMSNorm, SwiGLU, RoPE theta 500000 with llama3
scaling factor 8, GQA, no biases, untied embeddings), never from the model's name.
"""

from __future__ import annotations

import re

from autotune.errors import ConfigError
from autotune.engines.base import LaunchCommand
from autotune.spec.models import ModelSpec
from autotune.spec.plan import Plan, PlanDocument, Workload

#: Blackwell and later (compute capability >= 10) no longer need CUDA_DEVICE_MAX_CONNECTIONS=1.
BLACKWELL_ARCHS = ("blackwell",)


#: llama3 RoPE scaling parameters Megatron-LM applies with --use-rope-scaling (rotary_pos_embedding.py
#: ``_apply_scaling`` defaults: low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192)
MEGATRON_LLAMA3_SCALING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
#: (gated, activation) -> the flags of that MLP (arguments.py: --swiglu; default F.gelu; --openai-gelu)
ACTIVATIONS = {(True, "silu"): ["--swiglu"], (True, "swish"): ["--swiglu"], (False, "gelu"): [],
               (False, "gelu_new"): ["--openai-gelu"], (False, "gelu_pytorch_tanh"): ["--openai-gelu"]}


#: the GPT-OSS feature autotune/spec/hf_config.py records for ``swiglu_limit``
GPT_OSS_CLAMP = re.compile(r"SwiGLU clamped at swiglu_limit ([0-9.eE+-]+) \(GPT-OSS\)")


def gpt_oss_clamp(model: ModelSpec) -> float | None:
    """The SwiGLU clamp of a GPT-OSS-style expert MLP (``features``), None for other models. GPT-OSS's MLP
    (HF ``GptOssExperts``: gate and up clamped at the limit, ``(up + 1) * gate * sigmoid(1.702 gate)``) is
    Megatron-Core's ``--quick-geglu`` (argument_utils.py: gated_linear_unit with ``quick_gelu``, x sigmoid(1.702
    x), megatron/core/activations.py) with ``--glu-linear-offset 1`` and ``--activation-func-clamp-value``
    (TransformerConfig ``glu_linear_offset``, ``activation_func_clamp_value``), as Megatron-Bridge's
    ``GPTOSSProvider`` sets them (src/megatron/bridge/models/gpt_oss/gpt_oss_provider.py: 1.0 and 7.0)."""
    for f in model.features:
        m = GPT_OSS_CLAMP.fullmatch(f)
        if m and model.gated_mlp:
            return float(m.group(1))
    return None


def _all_biases(model: ModelSpec) -> bool:
    """Every linear layer carries a bias (GPT-OSS): Megatron-LM's default ``add_bias_linear`` (biases on the
    Q/K/V, output, MLP / expert and router linears: megatron/core/transformer/moe/router.py ``add_bias_linear``)."""
    return model.qkv_bias and model.attention_output_bias and (not model.is_moe or (
        model.moe_expert_bias and model.router_bias))


def unsupported_features(model: ModelSpec, seq_len: int) -> list[str]:
    """The features of ``model`` that ``pretrain_gpt.py``'s flags cannot express (see the module
    docstring), as readable names; empty when the model can be launched as it is."""
    out = []
    clamp = gpt_oss_clamp(model)
    if clamp is None and (model.gated_mlp, model.mlp_activation) not in ACTIVATIONS:
        out.append(f"{'gated ' if model.gated_mlp else ''}{model.mlp_activation} MLP"
                   + (" (GeGLU)" if model.gated_mlp and model.mlp_activation.startswith("gelu") else ""))
    rs = model.rope_scaling
    yarn_ok = rs is not None and rs.type == "yarn" and rs.original_max_position_embeddings is not None
    if rs is not None and not yarn_ok and not (rs.type == "llama3" and all(
            getattr(rs, k) == v for k, v in MEGATRON_LLAMA3_SCALING.items())):
        out.append(f"RoPE scaling {rs.describe()} (Megatron-LM has llama3 scaling with low/high frequency "
                   "factors 1/4 and original context 8192 only)")
    if float(model.rope_theta) != int(model.rope_theta):
        out.append(f"rope_theta {model.rope_theta!r} (--rotary-base is an integer)")
    if model.norms_per_layer != 2:
        out.append(f"{model.norms_per_layer} RMSNorms per layer (post-attention / post-feed-forward norms)")
    if model.sliding_window is not None and seq_len > model.sliding_window and model.sliding_window_period > 2:
        out.append(f"sliding-window attention on every {model.sliding_window_period}th layer (--window-attn-skip-freq "
                   "gives windows to all but every N-th layer)")
    partial = [n for n, on in (("output projection", model.attention_output_bias), ("expert", model.moe_expert_bias),
                               ("router", model.router_bias)) if on]
    if partial and not _all_biases(model):
        out.append(f"biases on the {', '.join(partial)} linear layers only (Megatron-LM has biases on every linear "
                   "layer, or on none but Q/K/V with --add-qkv-bias)")
    out += [f for f in model.features if clamp is None or not GPT_OSS_CLAMP.fullmatch(f)]
    return out


def model_refusal(model: ModelSpec, seq_len: int) -> str | None:
    """Why ``pretrain_gpt.py`` cannot launch ``model`` at ``seq_len`` (``model NAME: Megatron-LM's
    pretrain_gpt.py cannot express F1; F2``, the features of :func:`unsupported_features`), or None when
    it can. The one check behind both :func:`architecture_args`'s refusal and the flags ``autotune export``
    prints (autotune/report/summary.py ``launch_hints``)."""
    bad = unsupported_features(model, seq_len)
    return f"model {model.name}: Megatron-LM's pretrain_gpt.py cannot express {'; '.join(bad)}" if bad else None


def architecture_args(model: ModelSpec, seq_len: int) -> list[str]:
    """Model flags of ``pretrain_gpt.py`` for ``model`` (a dense decoder), from its fields.

    A sliding window at least ``seq_len`` long attends to every earlier token, so it is full causal
    attention and needs no flag (longer sequences are refused).

    Raises:
        ConfigError: a model feature Megatron-LM cannot express (:func:`unsupported_features`), named.
    """
    refusal = model_refusal(model, seq_len)
    if refusal:
        raise ConfigError(f"{refusal}; the export would launch a different model (`autotune export` without "
                          "--launcher still writes the plan YAML)")
    args = ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
            "--ffn-hidden-size", str(model.ffn_hidden_size), "--num-attention-heads", str(model.num_heads),
            "--kv-channels", str(model.head_dim)]
    biases = _all_biases(model)
    if model.num_kv_heads != model.num_heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.num_kv_heads)]
    args += ["--seq-length", str(seq_len), "--max-position-embeddings", str(max(seq_len, model.max_seq_len)),
             "--position-embedding-type", "rope", "--rotary-base", str(int(model.rope_theta)),
             "--normalization", "RMSNorm", "--norm-epsilon", f"{model.norm_eps:g}",
             *([] if biases else ["--disable-bias-linear"]), "--attention-dropout", "0", "--hidden-dropout", "0"]
    if model.qkv_bias and not biases:
        args.append("--add-qkv-bias")
    if model.attention_sinks:
        args += ["--softmax-type", "learnable"]     # a learned sink logit per head (TransformerConfig softmax_type)
    if model.sliding_window is not None and seq_len > model.sliding_window:
        # window (W - 1, 0) for HF sliding_window W: Transformer Engine's window bounds are inclusive (query i
        # sees keys i - left .. i; TE dot_product_attention/utils.py get_full_mask), as Megatron-Bridge's
        # GPT-OSS bridge sets since PR #2656; a layer is windowed unless its 1-based number is a multiple of
        # --window-attn-skip-freq (megatron/core/transformer/utils.py is_layer_window_attention), so period 2
        # (0-based even layers windowed) is skip-freq 2
        args += ["--window-size", f"{model.sliding_window - 1},0"]
        if model.sliding_window_period == 2:
            args += ["--window-attn-skip-freq", "2"]
    rs = model.rope_scaling
    if rs is not None and rs.type == "yarn":
        # YaRN (arguments.py: --rope-type yarn for multi-latent attention, --position-embedding-type yarn
        # otherwise; --rotary-scaling-factor, --yarn-original-max-position-embeddings)
        if model.is_mla:
            args += ["--rope-type", "yarn"]
        else:
            args[args.index("--position-embedding-type") + 1] = "yarn"
        args += ["--rotary-scaling-factor", f"{rs.factor:g}", "--yarn-original-max-position-embeddings",
                 str(rs.original_max_position_embeddings)]
        if gpt_oss_clamp(model) is not None:
            # GPT-OSS's YaRN does not round the correction range (HF rope_scaling truncate: false;
            # GPTOSSProvider yarn_correction_range_round_to_int False; Megatron's default rounds)
            args.append("--no-yarn-correction-range-round-to-int")
    elif rs is not None:
        args += ["--use-rope-scaling", "--rope-scaling-factor", f"{rs.factor:g}"]
    clamp = gpt_oss_clamp(model)
    if clamp is not None:
        args += ["--quick-geglu", "--glu-linear-offset", "1", "--activation-func-clamp-value", f"{clamp:g}"]
    else:
        args += ACTIVATIONS[model.gated_mlp, model.mlp_activation]
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    args += ["--vocab-size", str(model.vocab_size), "--tokenizer-type", "NullTokenizer",
             "--make-vocab-size-divisible-by", "128"]
    return args + moe_architecture_args(model)


def moe_architecture_args(model: ModelSpec) -> list[str]:
    """Mixture-of-experts, multi-latent-attention and multi-token-prediction flags of ``model`` (none for a
    dense model): ``--num-experts``, ``--moe-router-topk``, ``--moe-ffn-hidden-size``,
    ``--moe-shared-expert-intermediate-size`` (the shared experts' total width), ``--moe-layer-freq`` as a
    per-layer list when the first layers are dense or not every layer is MoE (megatron/training/arguments.py
    ``moe_freq_type``: a Python list expression), the router's score function, expert bias and device-limited
    groups, ``--moe-grouped-gemm``; ``--qk-layernorm`` for per-head Q/K norms or MLA's latent norms; MLA:
    ``--multi-latent-attention``, ``--q-lora-rank`` (when > 0), ``--kv-lora-rank``, ``--qk-head-dim``, ``--qk-pos-emb-head-dim``, ``--v-head-dim``; ``--mtp-num-layers``.
    Option names as in Megatron-LM at d98e8a64 (arguments.py ``_add_moe_args``, ``_add_mla_args``,
    TransformerConfig fields)."""
    a: list[str] = []
    if model.is_moe:
        a += ["--num-experts", str(model.num_experts), "--moe-router-topk", str(model.moe_top_k),
              "--moe-ffn-hidden-size", str(model.moe_ffn_hidden_size)]
        shared = model.num_shared_experts * model.shared_expert_ffn_hidden_size
        if shared:
            a += ["--moe-shared-expert-intermediate-size", str(shared)]
        pattern = model.moe_layer_pattern
        if not all(pattern):
            dense = model.num_first_dense_layers
            if model.moe_layer_freq == 1 and dense:
                expr = f"([0]*{dense}+[1]*{model.num_layers - dense})"
            else:
                expr = "[" + ",".join(map(str, pattern)) + "]"
            a += ["--moe-layer-freq", expr]
        if model.router_score_function != "softmax":
            a += ["--moe-router-score-function", model.router_score_function]
        if model.router_expert_bias:
            a.append("--moe-router-enable-expert-bias")
        if model.router_num_groups:
            a += ["--moe-router-num-groups", str(model.router_num_groups), "--moe-router-group-topk",
                  str(model.router_group_top_k)]
        if model.router_scaling_factor != 1.0:
            a += ["--moe-router-topk-scaling-factor", f"{model.router_scaling_factor:g}"]
        # published benchmarks force-balance routing, and so does the cost model (autotune/cost/moe.py)
        a += ["--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "1e-3",
              "--moe-router-force-load-balancing", "--moe-router-dtype", "fp32", "--moe-permute-fusion"]
    if model.qk_norm or model.is_mla:
        # --qk-layernorm: RMSNorm over each query / key head (Qwen3 q_norm, k_norm) or, with MLA, over the
        # query and key-value latents before their up projections (DeepSeek q_a_layernorm, kv_a_layernorm):
        # megatron/core/models/gpt/gpt_layer_specs.py, q_layernorm / kv_layernorm and the layer-norm-fused
        # linear_q_up_proj / linear_kv_up_proj only ``if qk_layernorm``
        a.append("--qk-layernorm")
    if model.is_mla:
        a.append("--multi-latent-attention")
        if model.q_lora_rank:
            a += ["--q-lora-rank", str(model.q_lora_rank)]
        a += ["--kv-lora-rank", str(model.kv_lora_rank), "--qk-head-dim", str(model.qk_nope_head_dim),
              "--qk-pos-emb-head-dim", str(model.qk_rope_head_dim), "--v-head-dim", str(model.v_head_dim)]
    if model.mtp_num_layers:
        a += ["--mtp-num-layers", str(model.mtp_num_layers)]
    return a


def ddp_bucket_size(plan: Plan) -> int:
    """``--ddp-bucket-size`` (parameters) for ``plan.bucket_size_mib``: the simulated bucket is
    ``bucket_size_mib`` MiB of gradients as the megatron engine reduces them (``grad_reduce_bytes`` bytes
    each, FP32 with --bf16: see the module docstring; BF16 with ``plan.grad_reduce_in_bf16``, Megatron-LM
    --grad-reduce-in-bf16), so parameters = MiB x 2^20 / grad_reduce_bytes (64 MiB -> 16,777,216
    parameters, or 33,554,432 with BF16 reduction).

    Raises:
        ConfigError: a bucket that is not a whole number of gradient elements.
    """
    from autotune.spec.engines import engine_for_plan

    nbytes, per = plan.bucket_size_mib * 2**20, engine_for_plan("megatron", plan).grad_reduce_bytes
    if nbytes % per:
        raise ConfigError(f"bucket_size_mib {plan.bucket_size_mib}: not a whole number of {per}-byte gradients")
    return nbytes // per


def plan_args(plan: Plan, model: ModelSpec, workload: Workload) -> list[str]:
    """Parallel, schedule, recompute, precision, optimizer-overlap and bucket flags of ``plan``.

    Raises:
        ConfigError: a precision Megatron-LM has no recipe for (fp8_rowwise).
    """
    p = plan
    a = ["--tensor-model-parallel-size", str(p.tp_degree), "--pipeline-model-parallel-size", str(p.pp_degree),
         "--context-parallel-size", str(p.cp_degree), "--micro-batch-size", str(p.micro_batch_size),
         "--global-batch-size", str(workload.global_batch_size)]
    layers = p.layers_per_virtual_stage(model.num_layers)
    if p.pp_degree > 1 and (len(set(layers)) > 1 or model.mtp_num_layers):
        stages = ["t" * n for n in layers]
        stages[0] = "E" + stages[0]
        # the multi-token-prediction layers (m) run on the last stage, before the loss (L)
        stages[-1] = stages[-1] + "m" * model.mtp_num_layers + "L"
        a += ["--pipeline-model-parallel-layout", "|".join(stages)]
    elif p.pp_degree > 1 and p.pipeline_schedule == "interleaved_1f1b" and p.vpp_degree > 1:
        a += ["--num-layers-per-virtual-pipeline-stage", str(layers[0])]
    if p.sp_active:
        a.append("--sequence-parallel")
    if model.is_moe:
        a += ["--expert-model-parallel-size", str(p.ep_degree), "--expert-tensor-parallel-size", str(p.etp_degree),
              "--moe-token-dispatcher-type", p.moe_dispatcher]
        if p.moe_dispatcher == "flex":
            a += ["--moe-flex-dispatcher-backend", "deepep"]
        if p.moe_grouped_gemm:
            a.append("--moe-grouped-gemm")
        if p.moe_a2a_overlap and p.async_collectives:
            a.append("--overlap-moe-expert-parallel-comm")
    if p.recompute == "selective":
        a += ["--recompute-granularity", "selective"]
        if p.recompute_modules is not None:
            a += ["--recompute-modules", *p.recompute_modules]
    elif p.recompute == "full" and p.recompute_num_layers >= 1:
        a += ["--recompute-granularity", "full", "--recompute-method", "block",
              "--recompute-num-layers", str(p.recompute_num_layers)]
    elif p.recompute == "full":
        a += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if p.cpu_offload_layers:
        # activations only (cpu_offloading_activations defaults on, weights off: model_parallel_config.py)
        a += ["--cpu-offloading-num-layers", str(p.cpu_offload_layers)]
    if p.zero_stage == 1:
        a.append("--use-distributed-optimizer")
    elif p.zero_stage in (2, 3):
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
              "optim_grads" if p.zero_stage == 2 else "optim_grads_params", "--ckpt-format", "fsdp_dtensor"]
    overlap = p.async_collectives
    if p.dp_grad_reduce_overlap and overlap:
        # the bucket size has an effect only with --overlap-grad-reduce (one bucket per buffer otherwise:
        # facts.yaml one_bucket_without_overlap), so it is written only then
        a += ["--overlap-grad-reduce", "--ddp-bucket-size", str(ddp_bucket_size(p))]
    if p.param_gather_overlap and p.zero_stage >= 1 and overlap:
        a.append("--overlap-param-gather")
    if p.tp_comm_overlap and p.tp_degree > 1 and overlap:
        a.append("--tp-comm-overlap")
    if not overlap and p.pp_degree > 1:
        a.append("--no-overlap-p2p-communication")
    if p.memory_reclaim in ("empty_cache_per_step", "empty_cache_per_microbatch"):
        # torch.cuda.empty_cache() once per iteration after forward-backward (training.py, level >= 1);
        # Megatron-LM has no per-micro-batch setting, so per-micro-batch plans get the per-step one
        a += ["--empty-unused-memory-level", "1"]
    a.append("--bf16")
    # the cost model counts the fused cross-entropy of the megatron engine profile (facts.yaml)
    a.append("--cross-entropy-loss-fusion")
    if p.precision == "fp8_tensorwise":
        a += ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"]
    elif p.precision == "fp8_delayed":
        a += ["--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "1024",
              "--fp8-amax-compute-algo", "max"]
    elif p.precision == "mxfp8":
        a += ["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"]
    elif p.precision == "fp8_rowwise":
        raise ConfigError("precision fp8_rowwise: Megatron-LM has no rowwise FP8 recipe (--fp8-recipe: tensorwise, "
                          "delayed, mxfp8, blockwise); export the plan for torchtitan or re-tune")
    if p.fp8_param_gather and p.precision != "bf16":
        a.append("--fp8-param-gather")              # arguments.py: keep the compute params in FP8
    if p.grad_reduce_in_bf16:
        a.append("--grad-reduce-in-bf16")           # arguments.py: BF16 main grads and gradient reductions
    return a


def training_args(workload: Workload) -> list[str]:
    """Run flags that are not part of the plan: synthetic data, a short run, the optimizer and logging
    (replace ``--mock-data`` with ``--data-path`` and the tokenizer with yours)."""
    return ["--mock-data", "--train-iters", "100", "--lr", "1e-4", "--min-lr", "1e-5", "--lr-decay-style",
            "cosine", "--lr-warmup-iters", "10", "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2",
            "0.95", "--clip-grad", "1.0", "--init-method-std", "0.02", "--log-interval", "1", "--eval-iters", "0",
            "--transformer-impl", "transformer_engine"]


def megatron_args(plan: Plan, model: ModelSpec, workload: Workload) -> list[str]:
    """All ``pretrain_gpt.py`` arguments (architecture + plan + run), as argv tokens."""
    return architecture_args(model, workload.seq_len) + plan_args(plan, model, workload) + training_args(workload)


def megatron_env(plan: Plan, gpu_arch: str) -> dict[str, str]:
    """Environment variables the plan's settings need under Megatron-LM (see the module docstring)."""
    env: dict[str, str] = {}
    if (plan.tp_degree > 1 or plan.cp_degree > 1) and plan.zero_stage < 2 and gpu_arch not in BLACKWELL_ARCHS:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    if plan.memory_reclaim == "expandable_segments":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return env


#: files this engine writes beside ``plan.yaml`` and the launch scripts
EXTRA_FILES: tuple[str, ...] = ()


def launch_command(doc: PlanDocument, *, plan_file: str = "plan.yaml") -> LaunchCommand:
    """``pretrain_gpt.py`` under torchrun with :func:`megatron_args` and :func:`megatron_env` (Megatron-LM's
    checkout is ``$MEGATRON_LM``).

    Raises:
        ConfigError: a plan or model these flags cannot express (:func:`plan_args`, :func:`model_refusal`).
    """
    from autotune.spec.hardware import get_gpu

    env = megatron_env(doc.plan, get_gpu(doc.gpu).arch)
    return LaunchCommand(program=('"$MEGATRON_LM/pretrain_gpt.py"',),
                         args=tuple(megatron_args(doc.plan, doc.model, doc.workload)),
                         env=tuple(env.items()),
                         notes=("Megatron-LM checkout: $MEGATRON_LM (option names checked against commit "
                                "d98e8a64ddf3 of NVIDIA/Megatron-LM)",
                                "synthetic data (--mock-data): use --data-path and your tokenizer for real runs"),
                         prelude=('MEGATRON_LM=${MEGATRON_LM:-"$HOME/Megatron-LM"}',))


def extra_files(doc: PlanDocument) -> dict[str, str]:
    """Files beside the launch scripts: none (the flags are in ``launch_torchrun.sh``)."""
    return {}


def launch_refusal(model: ModelSpec, seq_len: int) -> str | None:
    """Why ``autotune export --launcher`` will refuse this model (:func:`model_refusal`), or None; what
    ``autotune run`` says at its start."""
    return model_refusal(model, seq_len)
