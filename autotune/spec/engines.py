"""Engine profiles: the training engine that runs a plan is part of the target.

An :class:`EngineProfile` states, as data (``autotune/engines/<engine>/facts.yaml``, every fact with its source
file and flag), what an engine does in a training step beside the GEMMs: the bytes per parameter it
keeps (BF16 or FP32 parameters, FP32 main params in the optimizer), whether weights are cast to BF16
every micro-batch, how gradients accumulate (a fused FP32 main-grad or per-micro-batch FP32 adds),
which kernels it fuses, what selective recomputation recomputes, how CP exchanges K/V, and which plan
settings it can run at all. The cost model (:mod:`autotune.cost.graph`, :mod:`autotune.cost.memory`) reads
these fields; :func:`check_plan_for_engine` refuses a plan the engine cannot run, with the reason.

Engines: ``megatron`` (Megatron-LM / Megatron-Core with Transformer Engine), ``torchtitan`` and
``native`` (autotune's own runtime, the one ``--backend real`` launches). The default is
:data:`DEFAULT_ENGINE` (``megatron``, what large runs launch with and what ``autotune export``'s flags
target); ``--backend real`` runs the native runtime, or with ``--engine torchtitan`` torchtitan's own
trainer or ``--engine megatron`` Megatron-LM's ``pretrain_gpt.py`` (:data:`REAL_ENGINES`, :mod:`autotune.runners`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Mapping

from autotune.errors import ConfigError, PlanError

#: Engine used when none is named (simulated and measured backends).
DEFAULT_ENGINE = "megatron"
#: The engine the real backend runs when none is named (autotune's own runtime).
REAL_BACKEND_ENGINE = "native"
#: Engines the real backend can launch: the native runtime (autotune/runtime/), torchtitan's trainer
#: (autotune/engines/torchtitan/runner.py, torchtitan 0.2.x job files) and Megatron-LM's pretrain_gpt.py
#: (autotune/engines/megatron/runner.py).
REAL_ENGINES = ("native", "torchtitan", "megatron")
#: The facts of the release a real engine runner launches, where it differs from the profile's commit, are
#: in the engine's ``releases.yaml`` (``runner_release``; :func:`engine_release`): the torchtitan runner
#: launches torchtitan 0.2.2 (the last release that imports under torch 2.11, autotune/engines/torchtitan/
#: job.py), whose float8 converter still runs tensorwise scaling and whose ``train_step`` frees the gradients
#: between steps (autotune/engines/torchtitan/releases.yaml gives the sources).

GRAD_ACCUMULATION_MODES = ("fp32_add", "fused_main_grad")
SELECTIVE_RECOMPUTE_MODES = ("core_attention_and_mlp_act", "core_attention", "every_second_mm")
CP_COMM_MODES = ("all_gather", "p2p")
#: how TP communication overlap is implemented (EngineProfile.tp_overlap_mechanism)
TP_OVERLAP_MECHANISMS = ("userbuffers", "async_tp")
FUSABLE_KERNELS = ("rope", "swiglu", "rmsnorm", "residual", "cross_entropy", "fp8_cast")
#: attention kernels the calibration has tables for: ``default`` (PyTorch SDPA's default dispatch, cuDNN
#: on Hopper with torch >= 2.10, or an engine's cuDNN fused attention) and ``flash2`` (SDPA's flash
#: backend, FlashAttention-2)
ATTENTION_KERNELS = ("default", "flash2", "flex")
#: libraries that run an engine's FP8 linears: ``transformer_engine`` (saves the linears' inputs in FP8
#: and caches FP8 weights) and ``torchao`` (saves them in high precision, re-quantizes in backward)
FP8_LIBRARIES = ("transformer_engine", "torchao")
#: what a layer saves for backward: ``minimal`` (the tensors the backward needs, each once: fused
#: kernels, Korthikanti et al. 2022's count) or ``pytorch_eager`` (autograd's saved set of autotune's
#: eager block, measured: :mod:`autotune.cost.memory`)
ACTIVATION_ACCOUNTINGS = ("minimal", "pytorch_eager", "torchtitan_block")


@dataclass(frozen=True)
class EngineProfile:
    """What one training engine does per step (see ``autotune/engines/<engine>/facts.yaml`` for sources).

    Attributes:
        name: ``megatron``, ``torchtitan`` or ``native``.
        display_name, source: for reports; source names the repository and commit the facts are from.
        param_bytes: bytes per parameter of the module's weight at rest (4 = FP32 master is the
            parameter, 2 = BF16 parameter with an FP32 main copy in the optimizer).
        optimizer_bytes: optimizer bytes per parameter (8 = Adam moments; 12 = FP32 main param + moments).
        bf16_compute_copy: a transient BF16 copy of the FP32 weights exists during compute.
        cast_weights_per_microbatch: FP32 -> BF16 weight casts run every micro-batch (6 B/param).
        grad_accumulation: ``fp32_add`` (BF16 wgrad cast to FP32 and added per micro-batch) or
            ``fused_main_grad`` (the wgrad GEMM accumulates into an FP32 buffer, no extra kernel).
        fsdp_gather_copy_out: FSDP copies all-gathered parameters out of the gather buffer (4 B/param).
        shard_params_at_zero2: ZeRO-2 shards the parameters at rest as well (FSDP2 without resharding).
        fsdp_stream_pool: FSDP reduce-scatters on its own CUDA stream (an allocator pool of its own).
        grad_reduce_bytes: bytes per gradient element in DP reductions.
        zero_stages: ZeRO stages the engine can run; zero_stage_reasons: why not, per refused stage.
        schedules: pipeline schedules it implements.
        fused_kernels: memory-bound kernels it fuses (subset of :data:`FUSABLE_KERNELS`).
        selective_recompute: what ``recompute: selective`` recomputes (:data:`SELECTIVE_RECOMPUTE_MODES`).
        tp_comm_overlap: whether TP communication overlap exists; tp_comm_overlap_reason: why not;
        tp_comm_overlap_needs_sp: it needs sequence parallelism; tp_comm_overlap_needs_compile: it
        needs ``compile`` (async TP is an inductor pass).
        cp_comm: how context parallelism exchanges K/V (``all_gather`` or ``p2p`` ring).
        attention_kernel: the attention kernel it runs (:data:`ATTENTION_KERNELS`).
        fp8_library: what runs its FP8 linears (:data:`FP8_LIBRARIES`); decides what an FP8 linear saves
            for backward and whether FP8 weight copies are cached (:mod:`autotune.cost.memory`).
        activation_accounting: what a layer saves (:data:`ACTIVATION_ACCOUNTINGS`: ``minimal``, the derived
            set; ``pytorch_eager``, the native block under autograd; ``torchtitan_block``, torchtitan 0.2.x's
            block as measured, :mod:`autotune.engines.torchtitan.block_saved`).
        frees_grads_between_steps: gradients are set to None after the optimizer step (except under
            DDP, whose gradients are bucket views), so a step whose activations peak before any
            backward holds no gradients at that peak.
        pp_defers_fsdp_grad_reduce: with a pipeline (pp > 1) and FSDP (ZeRO 2/3), gradients are
            reduce-scattered once, after the step's last backward, and accumulate unsharded in the
            reduction dtype until then (torch.distributed.pipelining).
        loss_bytes_per_logit: bytes per logit of the engine's own eager cross-entropy at its peak on the last
            stage (0: PyTorch's ``F.cross_entropy(logits.float())``, :data:`autotune.cost.memory.
            LOGITS_BYTES_PER_ELEMENT`); loss_inflight_bytes_per_logit: what each other in-flight
            micro-batch keeps there until its backward (0: :data:`autotune.cost.memory.
            PP_INFLIGHT_LOGITS_BYTES`). With either set, the engine's pipeline keeps no BF16 stage output
            beside the loss (the last stage's output is the loss).
        compile_loss: with ``compile``, the loss is compiled too (inductor fuses the FP32 cast,
            log-softmax and NLL: :data:`autotune.cost.memory.COMPILED_LOSS_BYTES_PER_LOGIT`).
        fp8_param_gather: with an FP8 precision through Transformer Engine, the layers' linear weights
            are FP8 parameters (Megatron-LM ``--fp8-param-gather``): no BF16 weight beside TE's FP8
            copies, and the ZeRO-1/2 parameter all-gather moves 1 byte per linear weight.
        partial_recompute: it can fully recompute only the first N layers of each model chunk
            (``Plan.recompute_num_layers`` >= 1: Megatron-LM ``--recompute-method block``);
            partial_recompute_reason: why not, where it cannot.
        tp_overlap_mechanism: how ``tp_comm_overlap`` hides TP communication (:data:`TP_OVERLAP_MECHANISMS`):
            ``userbuffers`` (Transformer Engine: ring exchange for the all-gather side, a pipelined
            reduce-scatter on ``tp_overlap_pipeline_sms`` SMs in ``tp_overlap_pipeline_splits`` chunks,
            bulk overlap on ``tp_overlap_bulk_sms`` SMs in backward) or ``async_tp`` (torch's micro-pipeline
            TP: every all-gather / reduce-scatter decomposed into tp ring steps beside tp GEMM chunks);
            the timing rules are :mod:`autotune.cost.overlap`'s.
        sp_regathers_input_for_wgrad: with sequence parallelism a column-parallel linear saves its input
            sharded and all-gathers it again in backward for the weight gradient (one more all-gather per
            such linear in backward).
        grad_reduce_bf16: the engine can reduce gradients in BF16 (``Plan.grad_reduce_in_bf16``).
        one_bucket_without_overlap: without ``Plan.dp_grad_reduce_overlap`` the engine reduces each gradient
            buffer in one collective, in place, after the backward (the bucket size then has no effect).
        interleaved_chunk_sync: with an interleaved schedule the engine synchronises each model chunk on its
            own (Megatron-LM megatron/core/pipeline_parallel/schedules.py): with ``Plan.param_gather_overlap``
            it all-gathers a chunk's parameters ahead of that chunk's first forward (chunks 0 and 1 before the
            schedule, chunk c when chunk c - 1 starts; :func:`autotune.cost.graph.interleaved_param_gather_exposed_ms`),
            not the whole stage's before the first forward; and it launches a chunk's gradient buckets
            together after that chunk's last backward (``grad_sync_func``; grad sync stays disabled during
            the backward), not bucket by bucket during it.
        fp8_tp_all_gather: FP8 precisions under which the forward all-gathers of sequence parallelism move
            FP8 (1-byte) activations: the input is quantized before it is gathered.
        fp8_tp_grad_all_gather: FP8 precisions under which the backward all-gathers of sequence parallelism
            (the output gradient dY of the row-parallel proj and fc2, gathered before their data gradients)
            move FP8 (1-byte) gradients: dY is quantized before it is gathered.
        precisions: training precisions it runs; compile: whether torch.compile is a setting it has.
        levers: the kernel-level Plan fields (:data:`autotune.spec.levers.LEVER_FIELDS`: attention_backend,
            compile_mode, loss_impl, fp8_bf16_linears, optimizer_impl) -> the values it runs; a field not
            listed runs its Plan default only (issue 43; the native runtime's are measured by
            bench/bench_one_gpu.py).
        error_source: where its prediction error comes from (``real_runs`` or ``published_runs``).
        moe_dispatchers: the token dispatchers it runs for mixture-of-experts models (``Plan.moe_dispatcher``,
            :data:`autotune.spec.plan.MOE_DISPATCHERS`); empty: it cannot run an MoE model, ``moe_reason`` says why.
        moe_a2a_overlap: it overlaps expert-parallel all-to-alls with another micro-batch's compute
            (``Plan.moe_a2a_overlap``).
        recompute_modules: its selective recomputation takes a list of modules (``Plan.recompute_modules``).
        moe_fp32_path_without_fsdp: without FSDP (one GPU or DDP: FP32 parameters under autocast) its MoE
            layer moves the routed rows as FP32 and casts them and the expert weights to BF16 at every grouped
            GEMM call, per micro-batch (:mod:`autotune.cost.tt_moe`).
        sac_recomputes_routed_experts: its selective recompute saves no grouped GEMM or permutation, so the
            routed-expert forward runs again in backward.
        grad_clip_bytes_per_param: bytes per gradient element its every-step gradient clipping moves (0: none
            priced).
        mla_flex_attention: it runs multi-latent-attention models' core attention with FlexAttention (a Triton
            template kernel) instead of SDPA (:func:`autotune.cost.tt_moe.flex_attention_ms`).
        cpu_offload: it offloads the saved activations of the first N layers to host memory
            (``Plan.cpu_offload_layers``) on a side stream, on Transformer Engine's schedule
            (:func:`autotune.cost.offload.offload_exposed_ms`); cpu_offload_reason: why not, where it cannot.

    Raises:
        ConfigError: a field missing or outside its valid values (names the engine and the field).
    """

    name: str
    display_name: str
    source: str
    param_bytes: int
    optimizer_bytes: int
    bf16_compute_copy: bool
    cast_weights_per_microbatch: bool
    grad_accumulation: str
    fsdp_gather_copy_out: bool
    shard_params_at_zero2: bool
    fsdp_stream_pool: bool
    grad_reduce_bytes: int
    zero_stages: tuple[int, ...]
    schedules: tuple[str, ...]
    fused_kernels: tuple[str, ...]
    selective_recompute: str
    tp_comm_overlap: bool
    cp_comm: str
    precisions: tuple[str, ...]
    compile: bool
    error_source: str
    tp_comm_overlap_needs_sp: bool = False
    tp_comm_overlap_needs_compile: bool = False
    tp_comm_overlap_reason: str = ""
    zero_stage_reasons: Mapping[int, str] = field(default_factory=dict)
    attention_kernel: str = "default"
    fp8_library: str = "torchao"
    fp8_param_gather: bool = False
    activation_accounting: str = "minimal"
    frees_grads_between_steps: bool = False
    pp_defers_fsdp_grad_reduce: bool = False
    compile_loss: bool = False
    partial_recompute: bool = False
    partial_recompute_reason: str = ""
    tp_overlap_mechanism: str = "async_tp"
    tp_overlap_pipeline_sms: int = 16
    tp_overlap_pipeline_splits: int = 4
    tp_overlap_bulk_sms: int = 16
    sp_regathers_input_for_wgrad: bool = False
    fp8_tp_all_gather: tuple[str, ...] = ()
    fp8_tp_grad_all_gather: tuple[str, ...] = ()
    grad_reduce_bf16: bool = False
    one_bucket_without_overlap: bool = False
    interleaved_chunk_sync: bool = False
    loss_bytes_per_logit: int = 0
    loss_inflight_bytes_per_logit: int = 0
    moe_dispatchers: tuple[str, ...] = ()
    moe_reason: str = ""
    moe_a2a_overlap: bool = False
    recompute_modules: bool = False
    moe_fp32_path_without_fsdp: bool = False
    sac_recomputes_routed_experts: bool = False
    grad_clip_bytes_per_param: int = 0
    mla_flex_attention: bool = False
    cpu_offload: bool = False
    cpu_offload_reason: str = ""
    levers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        checks = (("grad_accumulation", GRAD_ACCUMULATION_MODES), ("selective_recompute", SELECTIVE_RECOMPUTE_MODES),
                  ("cp_comm", CP_COMM_MODES), ("attention_kernel", ATTENTION_KERNELS),
                  ("fp8_library", FP8_LIBRARIES), ("activation_accounting", ACTIVATION_ACCOUNTINGS),
                  ("tp_overlap_mechanism", TP_OVERLAP_MECHANISMS))
        for f, valid in checks:
            if getattr(self, f) not in valid:
                raise ConfigError(f"engine {self.name}: {f}={getattr(self, f)!r} is not valid; "
                                  f"choose one of {', '.join(valid)}")
        bad = [k for k in self.fused_kernels if k not in FUSABLE_KERNELS]
        if bad:
            raise ConfigError(f"engine {self.name}: fused_kernels {bad} unknown; valid: {', '.join(FUSABLE_KERNELS)}")
        for f in ("param_bytes", "optimizer_bytes", "grad_reduce_bytes"):
            if getattr(self, f) not in (2, 4, 8, 12):
                raise ConfigError(f"engine {self.name}: {f}={getattr(self, f)!r} is not a byte count of 2, 4, 8 or 12")
        from autotune.spec.levers import LEVER_FIELDS
        for f, vals in self.levers.items():
            if f not in LEVER_FIELDS or any(v not in LEVER_FIELDS[f] for v in vals):
                raise ConfigError(f"engine {self.name}: levers.{f}={list(vals)!r} is not valid; levers are "
                                  + "; ".join(f"{k}: {', '.join(v)}" for k, v in LEVER_FIELDS.items()))

    def lever_values(self, lever: str) -> tuple[str, ...]:
        """The values of Plan field ``lever`` (:data:`autotune.spec.levers.LEVER_FIELDS`) this engine runs:
        its ``levers`` entry, else the Plan default alone."""
        from autotune.spec.levers import LEVER_DEFAULTS
        return tuple(self.levers.get(lever, (LEVER_DEFAULTS[lever],)))

    @property
    def grad_buffer_bytes(self) -> int:
        """Bytes per element of the gradient the engine keeps between micro-batches: with a fused
        main-grad the buffer has the reduction dtype (Megatron-Core
        megatron/core/distributed/param_and_grad_buffer.py group_params_for_buffers: grad_dtype =
        float32 if grad_reduce_in_fp32 else the parameter's dtype), else the FP32 ``.grad`` of the FP32
        parameter (4)."""
        return self.grad_reduce_bytes if self.grad_accumulation == "fused_main_grad" else 4

    def fuses(self, kernel: str) -> bool:
        """True if the engine runs ``kernel`` (``rope``, ``swiglu``, ``rmsnorm``, ``residual``, ``cross_entropy``) fused."""
        return kernel in self.fused_kernels

    @classmethod
    def from_dict(cls, name: str, d: Mapping[str, Any]) -> "EngineProfile":
        """Build from one ``facts.yaml`` entry.

        Raises:
            ConfigError: missing or unknown fields (names them).
        """
        if not isinstance(d, Mapping):
            raise ConfigError(f"engine {name}: expected a mapping of fields")
        known = set(cls.__dataclass_fields__) - {"name"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"engine {name}: unknown field(s) {unknown}; valid: {sorted(known)}")
        kw = dict(d)
        for f in ("zero_stages", "schedules", "fused_kernels", "precisions", "fp8_tp_all_gather",
                  "fp8_tp_grad_all_gather", "moe_dispatchers"):
            if f in kw:
                kw[f] = tuple(kw[f])
        if "levers" in kw:
            if not isinstance(kw["levers"], Mapping):
                raise ConfigError(f"engine {name}: levers must be a mapping of Plan field -> list of values")
            kw["levers"] = {str(k): tuple(map(str, v)) for k, v in kw["levers"].items()}
        if "zero_stage_reasons" in kw:
            kw["zero_stage_reasons"] = {int(k): str(v) for k, v in kw["zero_stage_reasons"].items()}
        try:
            return cls(name=name, **kw)
        except TypeError as e:
            raise ConfigError(f"engine {name}: {e}") from None


@lru_cache(maxsize=None)
def _catalog() -> dict[str, EngineProfile]:
    from autotune.engines.registry import ENGINES, facts_file
    from autotune.files import load_shipped_yaml

    out = {}
    for name in ENGINES:
        data = load_shipped_yaml(facts_file(name).read_text())
        data.pop("schema_version", None)
        out[name] = EngineProfile.from_dict(name, data)
    return out


def engine_names() -> tuple[str, ...]:
    """Names of the known engines, catalog order."""
    return tuple(_catalog())


def get_engine(name: str | EngineProfile | None = None) -> EngineProfile:
    """The profile of engine ``name`` (None: :data:`DEFAULT_ENGINE`).

    Raises:
        ConfigError: unknown engine (lists the known ones).
    """
    if isinstance(name, EngineProfile):
        return name
    key = DEFAULT_ENGINE if name is None else name
    cat = _catalog()
    if not isinstance(key, str) or key not in cat:
        raise ConfigError(f"unknown engine {key!r}; known engines: {', '.join(cat)}")
    return cat[key]


def resolve_engine(name: str | EngineProfile | None, backend: str = "simulated") -> EngineProfile:
    """The engine a run uses: ``name``, or when None :data:`REAL_BACKEND_ENGINE` for the real backend
    (it launches autotune's own runtime) and :data:`DEFAULT_ENGINE` otherwise. With the real backend the
    profile is that of the release its runner launches (``runner_release`` of the engine's releases.yaml,
    :func:`engine_release`): its precisions and other facts.

    Raises:
        ConfigError: unknown engine, or with the real backend an engine not in :data:`REAL_ENGINES`.
    """
    if name is None:
        return get_engine(REAL_BACKEND_ENGINE if backend == "real" else DEFAULT_ENGINE)
    e = get_engine(name)
    if backend == "real" and e.name not in REAL_ENGINES:
        raise ConfigError(f"--backend real runs engines {', '.join(REAL_ENGINES)}; --engine {e.name} can only be "
                          "simulated (--backend simulated or measured)")
    if backend != "real":
        return e
    runner = (engine_releases(e.name) or {}).get("runner_release")
    return engine_release(e.name, runner) if runner else e


@lru_cache(maxsize=None)
def engine_releases(name: str) -> dict[str, Any] | None:
    """Engine ``name``'s ``releases.yaml`` (``profile_release``, ``runner_release``, ``releases``: release ->
    version, source, converters, precisions, overrides), or None when it has none."""
    from autotune.engines.registry import releases_file
    from autotune.files import load_shipped_yaml

    f = releases_file(name)
    if not f.is_file():
        return None
    data = load_shipped_yaml(f.read_text())
    data.pop("schema_version", None)
    return data


def engine_release(name: str, release: str | None) -> EngineProfile:
    """The profile of engine ``name`` as release ``release`` (``"0.2"``) runs: facts.yaml's profile with that
    release's precisions and other facts (``releases.yaml``); ``release`` None or the profile's own release:
    the profile unchanged.

    Raises:
        ConfigError: unknown engine, or a release its releases.yaml does not list (names the known ones).
    """
    from dataclasses import replace

    e = get_engine(name)
    rel = engine_releases(e.name)
    if release is None or rel is None or release == rel.get("profile_release"):
        return e
    entry = rel["releases"].get(release)
    if entry is None:
        raise ConfigError(f"engine {e.name} release {release!r}: known releases {', '.join(rel['releases'])}")
    kw = dict(entry.get("overrides") or {})
    kw["precisions"] = tuple(entry["precisions"])
    if all(getattr(e, k) == v for k, v in kw.items()):
        return e
    return replace(e, display_name=f"{e.display_name} {entry['version']}",
                   source=f"{entry['source']} (releases.yaml) over {e.source}", **kw)


def error_band(engine: str) -> dict[str, Any] | None:
    """The measured prediction error of ``engine`` from ``autotune/data/error_bands.yaml`` (written by
    ``bench/published.py --write-error-bands`` and, for ``native``, from ``docs/fidelity.md``'s real-run
    table), or None when none was measured. Keys: mean_abs_error_pct, worst_error_pct, num_runs,
    against, source, date."""
    return _error_bands().get(engine)


@lru_cache(maxsize=None)
def _error_bands() -> dict[str, dict[str, Any]]:
    from importlib import resources

    import yaml

    f = resources.files("autotune").joinpath("data", "error_bands.yaml")
    if not f.is_file():
        return {}
    return dict((yaml.safe_load(f.read_text()) or {}).get("engines") or {})


def engine_for_plan(engine: EngineProfile | str | None, plan: Any) -> EngineProfile:
    """``engine`` as the plan runs it: with ``plan.grad_reduce_in_bf16`` its gradients are reduced and
    buffered in BF16 (2 bytes), with ``plan.fp8_param_gather`` its FP8 linears keep FP8 parameters
    (:attr:`EngineProfile.fp8_param_gather`). Unchanged when the plan asks for neither (or the plan is None).
    Whether the engine can do it is :func:`check_plan_for_engine`'s question."""
    e = get_engine(engine)
    kw: dict[str, Any] = {}
    if getattr(plan, "grad_reduce_in_bf16", False) and e.grad_reduce_bytes != 2:
        kw["grad_reduce_bytes"] = 2
    if getattr(plan, "fp8_param_gather", False) and not e.fp8_param_gather:
        kw["fp8_param_gather"] = True
    if not kw:
        return e
    # one derived profile per (engine, levers), kept with the engine it came from (an id is reused only after
    # its object is gone): a search derives it for thousands of plans
    key = (id(e), *sorted(kw.items()))
    got = _FOR_PLAN.get(key)
    if got is None or got[0] is not e:
        import dataclasses

        got = _FOR_PLAN[key] = (e, dataclasses.replace(e, **kw))
    return got[1]


_FOR_PLAN: dict[tuple, tuple[EngineProfile, EngineProfile]] = {}


def check_model_for_engine(model: Any, engine: EngineProfile) -> None:
    """Refuse a model ``engine`` cannot run in autotune's cost model: a mixture-of-experts model on an engine
    with no expert parallelism facts (:attr:`EngineProfile.moe_dispatchers` empty).

    Raises:
        PlanError: naming the model, the engine, why, and the engines that can.
    """
    if getattr(model, "num_experts", 0) and not engine.moe_dispatchers:
        able = [n for n in engine_names() if get_engine(n).moe_dispatchers]
        raise PlanError(f"{model.name} is a mixture-of-experts model; engine {engine.name} cannot run it: "
                        f"{engine.moe_reason or 'no expert parallelism'}; engines that can: {', '.join(able)}")


def check_plan_for_engine(plan: Any, engine: EngineProfile) -> None:
    """Refuse a plan setting ``engine`` cannot run.

    Checks the ZeRO stage, the pipeline schedule (only when pp > 1), TP communication overlap (with
    TP > 1 and async collectives), partial full recomputation (``recompute_num_layers`` >= 1 needs
    :attr:`EngineProfile.partial_recompute`) and, where the plan has them, ``precision`` and ``compile``.

    Raises:
        PlanError: naming the setting, the engine and what it supports.
    """
    e = engine
    if plan.zero_stage not in e.zero_stages and plan.dp_degree * plan.cp_degree > 1:
        why = e.zero_stage_reasons.get(plan.zero_stage) or (
            f"{e.name} runs zero_stage {', '.join(map(str, e.zero_stages))}")
        raise PlanError(f"zero_stage={plan.zero_stage} cannot run on engine {e.name}: {why}")
    if plan.pp_degree > 1 and plan.pipeline_schedule not in e.schedules:
        raise PlanError(f"pipeline_schedule={plan.pipeline_schedule} cannot run on engine {e.name}; it has "
                        f"{', '.join(e.schedules)}")
    if plan.tp_comm_overlap and plan.tp_degree > 1 and plan.async_collectives:
        if not e.tp_comm_overlap:
            raise PlanError(f"tp_comm_overlap=true cannot run on engine {e.name}: "
                            f"{e.tp_comm_overlap_reason or 'it has no TP communication overlap'}")
        if e.tp_comm_overlap_needs_compile and not getattr(plan, "compile", False):
            raise PlanError(f"tp_comm_overlap=true on engine {e.name} needs compile=true (async TP is "
                            "torch.compile's micro-pipeline TP pass)")
        if e.tp_comm_overlap_needs_sp and not plan.sp_active:
            raise PlanError(f"tp_comm_overlap=true on engine {e.name} needs sequence_parallel=true "
                            "(Megatron-LM --tp-comm-overlap requires --sequence-parallel)")
    rn = getattr(plan, "recompute_num_layers", 0)
    if rn and getattr(plan, "recompute", "none") == "full" and not e.partial_recompute:
        raise PlanError(f"recompute_num_layers={rn} cannot run on engine {e.name}: "
                        f"{e.partial_recompute_reason or 'it recomputes every layer or none'}; "
                        f"use recompute_num_layers=0 (every layer)")
    n_off = getattr(plan, "cpu_offload_layers", 0)
    if n_off and not e.cpu_offload:
        raise PlanError(f"cpu_offload_layers={n_off} cannot run on engine {e.name}: "
                        f"{e.cpu_offload_reason or 'it has no layer-level CPU activation offloading'}; "
                        "use cpu_offload_layers=0 or --engine megatron")
    if getattr(plan, "ep_degree", 1) > 1 or getattr(plan, "etp_degree", 1) > 1:
        if not e.moe_dispatchers:
            raise PlanError(f"ep_degree={plan.ep_degree}, etp_degree={plan.etp_degree} cannot run on engine {e.name}: "
                            f"{e.moe_reason or 'it has no expert parallelism'}")
    disp = getattr(plan, "moe_dispatcher", "alltoall")
    if e.moe_dispatchers and disp not in e.moe_dispatchers:
        raise PlanError(f"moe_dispatcher={disp} cannot run on engine {e.name}; it has {', '.join(e.moe_dispatchers)}")
    if getattr(plan, "moe_a2a_overlap", False) and not e.moe_a2a_overlap:
        raise PlanError(f"moe_a2a_overlap=true cannot run on engine {e.name} (it has no expert-parallel "
                        "all-to-all overlap)")
    if getattr(plan, "recompute_modules", None) is not None and not e.recompute_modules:
        raise PlanError(f"recompute_modules cannot run on engine {e.name}: its selective recompute is "
                        f"{e.selective_recompute}; leave recompute_modules unset")
    precision = getattr(plan, "precision", "bf16")
    if precision not in e.precisions and precision != "bf16":
        raise PlanError(f"precision={precision} cannot run on engine {e.name}; it runs {', '.join(e.precisions)}")
    if getattr(plan, "compile", False) and not e.compile:
        raise PlanError(f"compile=true cannot run on engine {e.name} (it has no torch.compile setting)")
    from autotune.spec.levers import LEVER_FIELDS
    for lever in LEVER_FIELDS:
        v = getattr(plan, lever, None)
        if v is not None and v not in e.lever_values(lever):
            raise PlanError(f"{lever}={v} cannot run on engine {e.name}; it runs {lever} "
                            f"{', '.join(e.lever_values(lever))}")
