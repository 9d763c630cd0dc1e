"""The parallelism plan: every tunable, validated, and its YAML form.

A :class:`Plan` is a frozen dataclass; its field names are also the Optuna parameter names. Plans are
checked in two steps:

* :class:`Plan` construction checks what a plan says on its own (types, enum values, positive
  degrees, ``param_gather_overlap`` needs ``dp_grad_reduce_overlap``);
* :func:`validate_plan` checks the plan against a model, a GPU count and a workload (TP divides the
  heads, layers split over PP x VPP, global batch = micro-batch x count x DP, sequence divisible for
  CP/SP ...) and returns warnings for settings that have no effect.

Both raise :class:`autotune.errors.PlanError` (a ``ValueError``) naming the numbers and what would be
valid.
"""

from __future__ import annotations

import logging
import math
import operator
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

import yaml

from autotune.errors import ConfigError, PlanError
from autotune.files import plain
from autotune.spec.models import ModelSpec
from autotune.spec.validate import MAX_NUM_GPUS, MAX_NUM_MICRO_BATCHES
# kernel-level levers (issue 43), re-exported here: a leaf module, so spec.engines reads it without a cycle
from autotune.spec.levers import (  # noqa: F401
    ATTENTION_BACKENDS,
    COMPILE_MODES,
    FP8_BF16_LINEARS,
    LEVER_DEFAULTS,
    LEVER_FIELDS,
    LOSS_CHUNK_BYTES,
    LOSS_IMPLS,
    OPTIMIZER_IMPLS,
    loss_chunk_tokens,
)

log = logging.getLogger(__name__)

PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
RECOMPUTE_MODES = ("none", "selective", "full")
MEMORY_RECLAIM_POLICIES = ("none", "empty_cache_per_step", "empty_cache_per_microbatch",
                           "expandable_segments")
ZERO_STAGES = (0, 1, 2, 3)
#: how routed tokens reach their experts (Megatron-LM ``--moe-token-dispatcher-type``, megatron/training/
#: arguments.py at d98e8a64: ``allgather``, ``alltoall``, ``flex``; ``flex`` runs DeepEP or HybridEP,
#: ``--moe-flex-dispatcher-backend``). Which an engine has: its ``moe_dispatchers`` fact.
MOE_DISPATCHERS = ("alltoall", "allgather", "flex")
#: Megatron-LM ``--recompute-modules`` choices with ``--recompute-granularity selective``
#: (megatron/core/transformer/transformer_config.py ``recompute_modules`` at d98e8a64): ``core_attn``,
#: ``moe_act`` (the routed experts' activation), ``layernorm``, ``mla_up_proj`` (MLA's Q/KV up projections),
#: ``mlp`` (the dense MLP), ``moe`` (the whole MoE layer) and ``shared_experts``.
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
#: GEMM precision of the transformer layers' linear layers (the LM head stays BF16, see graph.py):
#: ``bf16``; ``fp8_tensorwise``: dynamic (current) per-tensor scaling, torchao Float8LinearConfig
#: recipe "tensorwise" / Transformer Engine Float8CurrentScaling; ``fp8_rowwise``: torchao recipe
#: "rowwise" (per-row scales); ``fp8_delayed``: TE DelayedScaling (amax history; Megatron-LM
#: ``--fp8-recipe delayed``); ``mxfp8``: TE MXFP8BlockScaling (32-element blocks, Blackwell only).
PRECISIONS = ("bf16", "fp8_tensorwise", "fp8_rowwise", "fp8_delayed", "mxfp8")
FP8_PRECISIONS = PRECISIONS[1:]
#: ``torch._scaled_mm`` (the FP8 GEMM torchao calls) needs both GEMM dimensions of each operand
#: divisible by 16 (PyTorch aten/src/ATen/native/cuda/Blas.cpp, _scaled_mm_out_cuda checks; torchtitan's
#: float8 converter skips nn.Linear layers with a dimension not divisible by 16 for this reason).
FP8_GEMM_DIM_MULTIPLE = 16
#: input bounds of ``Plan.recompute_num_layers`` (a chunk's own layer count caps what recomputes,
#: :meth:`Plan.recomputed_layers`) and ``Plan.cpu_offload_layers`` (:func:`validate_plan`: < the model's layers)
MAX_RECOMPUTE_NUM_LAYERS = MAX_CPU_OFFLOAD_LAYERS = 2**20


@dataclass(frozen=True)
class Workload:
    """What one optimizer step processes.

    Attributes:
        seq_len: tokens per sequence T.
        global_batch_size: sequences per optimizer step (global batch in tokens = this x seq_len).
        dtype: parameter/activation dtype; ``bf16`` (FP32 master weights and Adam moments).
    """

    seq_len: int
    global_batch_size: int
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        for f in ("seq_len", "global_batch_size"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"workload {f} must be a positive integer, got {v!r}")
        from autotune.spec.validate import (
            MAX_GLOBAL_BATCH_SEQUENCES,
            MAX_SEQ_LEN,
            require_int,
        )
        require_int(self.seq_len, "workload seq_len", hi=MAX_SEQ_LEN)
        require_int(self.global_batch_size, "workload global_batch_size (sequences)", hi=MAX_GLOBAL_BATCH_SEQUENCES)
        if self.dtype != "bf16":
            raise ConfigError(f"workload dtype {self.dtype!r} is not supported; valid: bf16")

    @property
    def global_batch_tokens(self) -> int:
        return self.seq_len * self.global_batch_size

    @property
    def label(self) -> str:
        return f"seq{self.seq_len}-gbs{self.global_batch_size}"

    @classmethod
    def from_tokens(cls, *, seq_len: int, global_batch_tokens: int) -> "Workload":
        """Workload from a global batch in tokens; it must be a whole number of sequences.

        Raises:
            ConfigError: tokens not a multiple of seq_len (names both and the nearest valid values).
        """
        if global_batch_tokens % seq_len:
            lo = (global_batch_tokens // seq_len) * seq_len
            raise ConfigError(
                f"global batch of {global_batch_tokens} tokens is not a whole number of {seq_len}-token "
                f"sequences; use a multiple of {seq_len}, e.g. "
                + (f"{lo} or {lo + seq_len}" if lo else f"{seq_len}"))
        return cls(seq_len=seq_len, global_batch_size=global_batch_tokens // seq_len)


#: Plan's integer fields (>= 1) and their upper bounds, which bound the simulated step graph (O(pp x vpp x m)
#: nodes, autotune/cost/graph.py); Plan's boolean fields
_INT_FIELDS = ("tp_degree", "pp_degree", "dp_degree", "cp_degree", "vpp_degree", "micro_batch_size",
               "num_micro_batches", "bucket_size_mib", "ep_degree", "etp_degree")
_INT_MAX = (MAX_NUM_GPUS, MAX_NUM_GPUS, MAX_NUM_GPUS, MAX_NUM_GPUS, 1024, 2**20, MAX_NUM_MICRO_BATCHES, 2**20,
            MAX_NUM_GPUS, MAX_NUM_GPUS)
_BOOL_FIELDS = ("sequence_parallel", "async_collectives", "tp_comm_overlap", "dp_grad_reduce_overlap",
                "param_gather_overlap", "compile", "grad_reduce_in_bf16", "fp8_param_gather", "moe_a2a_overlap",
                "moe_grouped_gemm")
_int_fields = operator.attrgetter(*_INT_FIELDS)
_bool_fields = operator.attrgetter(*_BOOL_FIELDS)


@dataclass(frozen=True)
class Plan:
    """Every tunable of a training step's parallelism, memory and communication.

    Degrees (``*_degree``) multiply to the GPU count: ``tp x pp x dp x cp = num_gpus``.

    Attributes:
        tp_degree: tensor-parallel degree (Megatron-LM column/row split of attention and MLP).
        pp_degree: pipeline stages (ranks along the pipeline).
        dp_degree: data-parallel replicas (derived by the tuner: num_gpus / (tp pp cp)).
        cp_degree: context-parallel degree (sequence split with ring attention over K/V).
        vpp_degree: virtual pipeline stages (model chunks) per pipeline rank; 1 = none.
        micro_batch_size: sequences per micro-batch.
        num_micro_batches: micro-batches per step per DP replica (gradient accumulation steps).
        pipeline_schedule: ``gpipe``, ``1f1b`` or ``interleaved_1f1b``.
        sequence_parallel: Megatron sequence parallelism (norm/dropout regions split over TP).
        recompute: activation recomputation, ``none``, ``selective`` (attention core) or ``full``.
        recompute_num_layers: with ``recompute: full``, how many layers of every model chunk (virtual
            pipeline stage) recompute: 0 = every layer; N >= 1 = the first N layers of each chunk, the
            rest keep their activations (all of them when a chunk has N or fewer layers). Megatron-LM
            ``--recompute-granularity full --recompute-method block --recompute-num-layers N``
            (megatron/core/recompute.py ``checkpointed_forward``, branch ``recompute_method == 'block'``:
            layer_idx < recompute_num_layers over ``num_layers_per_pipeline_rank = len(self.layers)``
            of the chunk's TransformerBlock, megatron/core/transformer/transformer_block.py). N >= 1
            needs ``recompute: full`` and an engine with ``partial_recompute``
            (:func:`autotune.spec.engines.check_plan_for_engine`).
        zero_stage: 0 DDP, 1 optimizer states, 2 + gradients, 3 + parameters sharded over DP x CP.
        async_collectives: collectives are issued on a communication stream (async handles) so
            independent compute runs beside them; off = every collective blocks the compute stream.
        tp_comm_overlap: overlap TP/SP collectives with the neighbouring GEMMs (chunked pipelining).
        dp_grad_reduce_overlap: reduce DP gradients bucket by bucket during backward.
        param_gather_overlap: prefetch ZeRO/distributed-optimizer parameter all-gathers during the
            previous layer's compute (needs ``dp_grad_reduce_overlap``).
        bucket_size_mib: DP gradient bucket size, MiB.
        memory_reclaim: allocator setting, ``none``, ``empty_cache_per_step``,
            ``empty_cache_per_microbatch`` or ``expandable_segments``.
        stage_layers: explicit transformer layers per virtual pipeline stage in model order (length
            pp x vpp; or length pp with each entry divisible by vpp); None = even split.
        precision: GEMM precision of the transformer layers' linear layers, one of :data:`PRECISIONS`
            (FP8 needs a Hopper or newer GPU, ``mxfp8`` a Blackwell one: :func:`validate_precision`).
        compile: torch.compile per transformer block (torchtitan ``[compile] enable``): fused
            memory-bound kernels where the calibration profile measured them.
        grad_reduce_in_bf16: reduce (and accumulate) DP gradients in BF16 instead of FP32 (Megatron-LM
            ``--grad-reduce-in-bf16``: the main-grad buffer then holds BF16, megatron/core/distributed/
            param_and_grad_buffer.py ``group_params_for_buffers``); half the reduction bytes and gradient
            buffer. Engines that reduce only in FP32 refuse it (:func:`autotune.spec.engines.check_plan_for_engine`).
        fp8_param_gather: with an FP8 precision, keep the layers' linear weights as FP8 parameters
            (Megatron-LM ``--fp8-param-gather``): no BF16 weight beside Transformer Engine's FP8 copies, and
            parameter all-gathers move 1 byte per such weight. Needs Transformer Engine (Megatron-LM).
        ep_degree: expert-parallel degree of a mixture-of-experts model: the routed experts of every MoE
            layer are split over EP ranks (Megatron-LM ``--expert-model-parallel-size``). The expert group
            EP x ETP is folded over the dense layers' TP x CP x DP ranks ("MoE Parallel Folding", Liu et al.
            2025, arXiv 2504.14960, Sec. 3): EP x ETP divides tp x cp x dp, and the expert data-parallel
            degree is tp x cp x dp / (EP x ETP). 1 for a dense model.
        etp_degree: expert tensor-parallel degree (Megatron-LM ``--expert-tensor-parallel-size``): each
            expert's FFN split over ETP ranks; 1 = whole experts (the published MoE recipes' choice).
        moe_dispatcher: token dispatcher, one of :data:`MOE_DISPATCHERS` (the engine's ``moe_dispatchers``).
        moe_a2a_overlap: overlap the dispatch / combine all-to-all of one micro-batch with another
            micro-batch's compute (Megatron-LM ``--overlap-moe-expert-parallel-comm``, which pairs the forward
            of one micro-batch with the backward of another in 1F1B).
        moe_grouped_gemm: the routed experts of a rank run as one grouped GEMM (Megatron-LM
            ``--moe-grouped-gemm``); off = one GEMM per local expert.
        recompute_modules: with ``recompute: selective`` on an engine that has them, the modules whose
            activations are recomputed (Megatron-LM ``--recompute-modules``, :data:`RECOMPUTE_MODULES`),
            as a sorted tuple; None = the engine's default selective set.
        attention_backend: SDPA backend, one of :data:`ATTENTION_BACKENDS` (native runtime only).
        compile_mode: torch.compile mode with ``compile: true``, one of :data:`COMPILE_MODES`.
        loss_impl: LM head + cross-entropy, one of :data:`LOSS_IMPLS` (``chunked``: native runtime,
            TP 1 and PP 1 only).
        fp8_bf16_linears: layer linears kept BF16 under FP8, one of :data:`FP8_BF16_LINEARS`.
        optimizer_impl: AdamW kernels, one of :data:`OPTIMIZER_IMPLS`.
        cpu_offload_layers: CPU offloading of the first N layers' activations (Megatron-LM ``--cpu-offloading-num-layers``;
            :mod:`autotune.cost.offload`); 0 = none. Megatron-Core (transformer_config.py): N < layers, pp 1, no recompute.
        (Engines without these levers refuse values other than the defaults:
        :func:`autotune.spec.engines.check_plan_for_engine`.)

    Raises:
        PlanError: wrong type or value for any field (names the field and the valid values).
    """

    tp_degree: int = 1
    pp_degree: int = 1
    dp_degree: int = 1
    cp_degree: int = 1
    vpp_degree: int = 1
    micro_batch_size: int = 1
    num_micro_batches: int = 1
    pipeline_schedule: str = "1f1b"
    sequence_parallel: bool = False
    recompute: str = "none"
    recompute_num_layers: int = 0
    zero_stage: int = 1
    async_collectives: bool = True
    tp_comm_overlap: bool = False
    dp_grad_reduce_overlap: bool = True
    param_gather_overlap: bool = False
    bucket_size_mib: int = 64
    memory_reclaim: str = "none"
    stage_layers: tuple[int, ...] | None = None
    precision: str = "bf16"
    compile: bool = False
    grad_reduce_in_bf16: bool = False
    fp8_param_gather: bool = False
    ep_degree: int = 1
    etp_degree: int = 1
    moe_dispatcher: str = "alltoall"
    moe_a2a_overlap: bool = False
    moe_grouped_gemm: bool = True
    recompute_modules: tuple[str, ...] | None = None
    attention_backend: str = "default"
    compile_mode: str = "default"
    loss_impl: str = "full"
    fp8_bf16_linears: str = "none"
    optimizer_impl: str = "fused"
    cpu_offload_layers: int = 0

    def __post_init__(self) -> None:
        # one C-level pass over the integer and boolean fields (a 405B x 1,024 B200 ranking built 17,495
        # plans through suggest); the field-by-field checks name the first offending value when it fails
        ints = _int_fields(self)
        if not (set(map(type, ints)) <= {int} and min(ints) >= 1 and all(map(operator.le, ints, _INT_MAX))) \
                or not set(map(type, _bool_fields(self))) <= {bool}:
            self._check_types()
        for f, valid in (("pipeline_schedule", PIPELINE_SCHEDULES), ("recompute", RECOMPUTE_MODES),
                         ("memory_reclaim", MEMORY_RECLAIM_POLICIES), ("precision", PRECISIONS),
                         ("moe_dispatcher", MOE_DISPATCHERS), *LEVER_FIELDS.items()):
            if getattr(self, f) not in valid:
                raise PlanError(f"{f}={getattr(self, f)!r} is not valid; choose one of {', '.join(valid)}")
        rn = self.recompute_num_layers
        if not isinstance(rn, int) or isinstance(rn, bool) or not 0 <= rn <= MAX_RECOMPUTE_NUM_LAYERS:
            raise PlanError(f"recompute_num_layers must be an integer between 0 (every layer) and "
                            f"{MAX_RECOMPUTE_NUM_LAYERS:,} (the first N layers of each chunk), got {rn!r}")
        if rn and self.recompute != "full":
            raise PlanError(f"recompute_num_layers={rn} needs recompute=full (Megatron-LM "
                            f"--recompute-method block is a full-recompute method), got "
                            f"recompute={self.recompute}; use recompute=full or recompute_num_layers=0")
        self._check_cpu_offload()
        if self.zero_stage not in ZERO_STAGES or isinstance(self.zero_stage, bool):
            raise PlanError(f"zero_stage={self.zero_stage!r} is not valid; choose one of 0, 1, 2, 3")
        if self.param_gather_overlap and not self.dp_grad_reduce_overlap:
            raise PlanError("param_gather_overlap=true needs dp_grad_reduce_overlap=true (parameter "
                            "all-gathers are overlapped only in the overlapped DP path, as in Megatron-LM's "
                            "--overlap-param-gather, which requires --overlap-grad-reduce)")
        if self.recompute_modules is not None:
            self._check_recompute_modules()
        if self.stage_layers is not None:
            sl = self.stage_layers
            if isinstance(sl, list):
                object.__setattr__(self, "stage_layers", tuple(sl))
                sl = self.stage_layers
            # (type(x) is int: ints, not bools; checked with C-level loops, a 405B plan has 128 stages and a
            # search builds ~20,000 plans)
            if not isinstance(sl, tuple) or not sl or not set(map(type, sl)) <= {int} or min(sl) < 0:
                raise PlanError(f"stage_layers must be a list of integers >= 0 (0 = a stage holding only "
                                f"the embedding or the LM head), got {sl!r}")

    def _check_cpu_offload(self) -> None:
        """``cpu_offload_layers``: an integer in 0..:data:`MAX_CPU_OFFLOAD_LAYERS`, with N >= 1 pp 1 and no
        recompute (megatron/core/transformer/transformer_config.py). Raises :class:`PlanError`."""
        n = self.cpu_offload_layers
        if type(n) is not int or not 0 <= n <= MAX_CPU_OFFLOAD_LAYERS:       # (type: no bool, no float)
            raise PlanError(f"cpu_offload_layers must be an integer between 0 (no offloading) and "
                            f"{MAX_CPU_OFFLOAD_LAYERS:,}, got {n!r}")
        if n and (self.pp_degree > 1 or self.recompute != "none"):
            why = (f"pp_degree=1 (Megatron-Core has no CPU offloading with pipeline parallelism), got pp_degree="
                   f"{self.pp_degree}" if self.pp_degree > 1 else f"recompute=none (Megatron-Core's CPU offloading "
                   f"does not work with recomputation), got recompute={self.recompute}")
            raise PlanError(f"cpu_offload_layers={n} needs {why}; or use cpu_offload_layers=0")

    def _check_recompute_modules(self) -> None:
        """Normalise ``recompute_modules`` to a sorted tuple of :data:`RECOMPUTE_MODULES` and check it goes
        with ``recompute: selective`` (raises :class:`PlanError` naming the value and the valid ones)."""
        rm = self.recompute_modules
        if isinstance(rm, str):
            rm = tuple(x.strip() for x in rm.split(",") if x.strip())
        if not isinstance(rm, (list, tuple)) or not rm or not all(isinstance(x, str) for x in rm):
            raise PlanError(f"recompute_modules must be a non-empty list of module names from "
                            f"{', '.join(RECOMPUTE_MODULES)}, got {rm!r}")
        bad = sorted(set(rm) - set(RECOMPUTE_MODULES))
        if bad:
            raise PlanError(f"recompute_modules {bad} are not valid; choose from {', '.join(RECOMPUTE_MODULES)}")
        if self.recompute != "selective":
            raise PlanError(f"recompute_modules={list(rm)} needs recompute=selective (Megatron-LM "
                            f"--recompute-modules goes with --recompute-granularity selective), got "
                            f"recompute={self.recompute}")
        object.__setattr__(self, "recompute_modules", tuple(sorted(set(rm))))

    def _check_types(self) -> None:
        """Raise :class:`PlanError` naming the first integer field that is not an integer in its range
        (:data:`_INT_MAX`) or boolean field that is not true / false."""
        for f in _INT_FIELDS:
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise PlanError(f"{f} must be an integer >= 1, got {v!r}")
        for f, hi in zip(_INT_FIELDS, _INT_MAX):
            if getattr(self, f) > hi:   # bounds the simulated step graph (O(pp x vpp x m) nodes, graph.py)
                raise PlanError(f"{f} must be an integer between 1 and {hi:,}, got {getattr(self, f)}")
        for f in _BOOL_FIELDS:
            if not isinstance(getattr(self, f), bool):
                raise PlanError(f"{f} must be true or false, got {getattr(self, f)!r}")

    # ---- derived ----
    @property
    def num_gpus(self) -> int:
        return self.tp_degree * self.pp_degree * self.dp_degree * self.cp_degree

    @property
    def num_virtual_stages(self) -> int:
        """pp x vpp model chunks."""
        return self.pp_degree * self.vpp_degree

    @property
    def global_batch_size(self) -> int:
        """micro_batch_size x num_micro_batches x dp_degree sequences."""
        return self.micro_batch_size * self.num_micro_batches * self.dp_degree

    @property
    def effective_vpp(self) -> int:
        """Chunks per rank the schedule really uses (1 unless interleaved 1F1B)."""
        return self.vpp_degree if self.pipeline_schedule == "interleaved_1f1b" else 1

    @property
    def sp_active(self) -> bool:
        return self.sequence_parallel and self.tp_degree > 1

    @property
    def partial_recompute(self) -> bool:
        """Only the first ``recompute_num_layers`` layers of each chunk recompute (full recompute, N >= 1)."""
        return self.recompute == "full" and self.recompute_num_layers >= 1

    def recomputed_layers(self, chunk_layers: int) -> int:
        """Layers of a chunk of ``chunk_layers`` layers that recompute in backward: all of them under
        ``recompute: full`` with ``recompute_num_layers`` 0, min(N, chunk_layers) with N >= 1
        (Megatron-LM block method, per chunk: see the class docstring), none otherwise."""
        if self.recompute != "full":
            return 0
        if self.recompute_num_layers == 0:
            return chunk_layers
        return min(self.recompute_num_layers, chunk_layers)

    @property
    def expert_dp_degree(self) -> int:
        """Expert data-parallel degree: tp x cp x dp / (ep x etp) ranks hold the same experts ("MoE
        Parallel Folding", arXiv 2504.14960; Megatron-LM's expert data-parallel group). Assumes the plan
        is valid (:func:`validate_plan` checks that ep x etp divides tp x cp x dp)."""
        return max(1, self.tp_degree * self.cp_degree * self.dp_degree // (self.ep_degree * self.etp_degree))

    @property
    def fp8(self) -> bool:
        """The layers' linear GEMMs run in an FP8 format (any precision but ``bf16``)."""
        return self.precision != "bf16"

    def layers_per_virtual_stage(self, num_layers: int) -> tuple[int, ...]:
        """Transformer layers of each virtual stage in model order (length pp x effective VPP).

        Raises:
            PlanError: layers do not split (see :func:`validate_plan`).
        """
        v = self.effective_vpp
        n = self.pp_degree * v
        if self.stage_layers is not None:
            sl = self.stage_layers
            if len(sl) == n:
                out = sl
            elif len(sl) == self.pp_degree and all(x % v == 0 for x in sl):
                # per-rank counts: rank r's chunks are virtual stages r, r+p, r+2p ...
                out = tuple(sl[i % self.pp_degree] // v for i in range(n))
            elif len(sl) == self.pp_degree:
                bad = [x for x in sl if x % v]
                raise PlanError(f"stage_layers {list(sl)} per pipeline rank cannot form {v} equal chunks "
                                f"(entries {bad} are not multiples of vpp_degree={v}); give {n} entries, "
                                f"one per virtual stage")
            else:
                raise PlanError(f"stage_layers has {len(sl)} entries; expected pp_degree={self.pp_degree} "
                                f"(per rank) or pp_degree x vpp_degree={n} (per virtual stage)")
            if sum(out) != num_layers:
                raise PlanError(f"stage_layers {list(sl)} sum to {sum(out)} layers but the model has "
                                f"{num_layers}")
            return tuple(out)
        if num_layers % n:
            per_stage = num_layers / self.pp_degree
            if v > 1 and num_layers % self.pp_degree == 0:
                raise PlanError(
                    f"{num_layers} layers over pp_degree={self.pp_degree} give {int(per_stage)} layers per "
                    f"stage, which cannot form vpp_degree={v} equal chunks ({num_layers} is not a multiple "
                    f"of pp x vpp = {n}); valid vpp_degree here: "
                    f"{_divisors(num_layers // self.pp_degree)}, or give stage_layers")
            raise PlanError(
                f"{num_layers} layers do not split evenly over pp_degree x vpp_degree = "
                f"{self.pp_degree} x {v} = {n} stages ({num_layers / n:g} per stage); pp x vpp must divide "
                f"{num_layers} (divisors: {_divisors(num_layers)}), or give stage_layers")
        return tuple([num_layers // n] * n)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stage_layers"] = list(self.stage_layers) if self.stage_layers is not None else None
        d["recompute_modules"] = list(self.recompute_modules) if self.recompute_modules is not None else None
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "plan") -> "Plan":
        """Build from a mapping (YAML); unknown keys and wrong types raise :class:`PlanError`."""
        if not isinstance(d, Mapping):
            raise PlanError(f"{source}: expected a mapping of plan fields, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(map(str, set(d) - known))
        if unknown:
            raise PlanError(f"{source}: unknown plan field(s) {unknown}; valid fields: {sorted(known)}")
        kw = dict(d)
        if kw.get("stage_layers") is not None:
            if not isinstance(kw["stage_layers"], (list, tuple)):
                raise PlanError(f"{source}: stage_layers must be a list of integers, got {kw['stage_layers']!r}")
            kw["stage_layers"] = tuple(kw["stage_layers"])
        if kw.get("recompute_modules") is not None and isinstance(kw["recompute_modules"], list):
            kw["recompute_modules"] = tuple(kw["recompute_modules"])
        try:
            return cls(**kw)
        except PlanError as e:
            raise PlanError(f"{source}: {e}") from None

    def replace(self, **changes: Any) -> "Plan":
        return replace(self, **changes)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def fp8_gemm_dims(model: ModelSpec, tp_degree: int) -> dict[str, tuple[int, int]]:
    """Per-rank (K, N) of each transformer-layer linear that runs in FP8, (m x K) @ (K x N).

    Column-parallel QKV and gate/up split N over TP, row-parallel output and down projections split K
    (Megatron-LM, Shoeybi et al. 2019, Sec. 3). Returns ``{name: (K, N)}``.
    """
    t, h, q, kv, f = tp_degree, model.hidden_size, model.q_dim, model.kv_dim, model.ffn_hidden_size
    up = 2 * f if model.gated_mlp else f
    return {"qkv": (h, (q + 2 * kv) // t), "attn_out": (q // t, h), "mlp_up": (h, up // t),
            "mlp_down": (f // t, h)}


def validate_precision(plan: Plan, model: ModelSpec, gpu: Any) -> list[str]:
    """Check ``plan.precision`` against the GPU and the per-rank GEMM shapes.

    Args:
        plan: the plan; model: its model; gpu: an :class:`autotune.spec.hardware.GPUSpec` (``arch``,
            ``fp8_tflops``).

    Returns:
        Warnings for settings that have no effect (none today; kept for the validate_plan mechanism).

    Raises:
        PlanError: FP8 on a GPU older than Hopper (H100 datasheet: FP8 tensor cores arrive with Hopper),
            ``mxfp8`` on a GPU that is not Blackwell (MXFP8 block scaling is a Blackwell tensor-core
            format; TE MXFP8BlockScaling), or a per-rank K or N not divisible by
            :data:`FP8_GEMM_DIM_MULTIPLE` (``torch._scaled_mm``'s requirement); names the field, the
            value and what is valid.
    """
    if not plan.fp8:
        return []
    arch = getattr(gpu, "arch", "unknown")
    name = getattr(gpu, "name", str(gpu))
    if plan.precision == "mxfp8" and not gpu.supports_mxfp8:
        ok = ["bf16"] + (list(FP8_PRECISIONS[:3]) if gpu.supports_fp8 else [])
        raise PlanError(f"precision=mxfp8 needs a Blackwell GPU (b200, gb200), but {name} is {arch}; "
                        f"valid precision here: {', '.join(ok)}")
    if not gpu.supports_fp8:
        raise PlanError(f"precision={plan.precision} needs FP8 tensor cores (Hopper or newer: h100, h200, "
                        f"b200, gb200), but {name} is {arch}; valid precision here: bf16")
    bad = [f"{k} K={kk} N={nn}" for k, (kk, nn) in fp8_gemm_dims(model, plan.tp_degree).items()
           if kk % FP8_GEMM_DIM_MULTIPLE or nn % FP8_GEMM_DIM_MULTIPLE]
    if bad:
        raise PlanError(f"precision={plan.precision} with tp_degree={plan.tp_degree}: per-rank GEMM "
                        f"dimensions {', '.join(bad)} are not multiples of {FP8_GEMM_DIM_MULTIPLE} "
                        f"(torch._scaled_mm requirement); use precision=bf16 or a tp_degree that keeps "
                        f"them multiples of {FP8_GEMM_DIM_MULTIPLE}")
    return []


def validate_plan(plan: Plan, model: ModelSpec, num_gpus: int, workload: Workload,
                  *, gpus_per_node: int | None = None, gpu: Any = None) -> list[str]:
    """Check ``plan`` against a model, a GPU count and a workload (and, given ``gpu``, an
    :class:`autotune.spec.hardware.GPUSpec`, its precision: :func:`validate_precision`).

    Returns:
        Warnings (strings) for settings that have no effect in this plan; each is also logged.

    Raises:
        PlanError: the first rule the plan breaks, naming the numbers and what would be valid.
    """
    p, m, w = plan, model, workload
    tp = p.tp_degree
    # 1. GPU count
    if p.num_gpus != num_gpus:
        raise PlanError(f"tp x pp x dp x cp = {tp} x {p.pp_degree} x {p.dp_degree} x {p.cp_degree} = "
                        f"{p.num_gpus} GPUs, but the cluster has {num_gpus}")
    # 2. TP divides heads, KV heads and the split widths (Megatron-LM column/row parallel layers)
    dims = {"heads": m.num_heads, "kv_heads": m.num_kv_heads, "ffn_hidden_size": m.ffn_hidden_size,
            "hidden_size": m.hidden_size}
    bad = {k: v for k, v in dims.items() if v % tp}
    if bad:
        ok = [d for d in _divisors(math.gcd(*dims.values()))]
        raise PlanError(f"tp_degree={tp} does not divide " + ", ".join(f"{k}={v}" for k, v in bad.items())
                        + f" of {m.name}; valid tp_degree: {ok}")
    # 3. layers over PP x VPP
    chunks = p.layers_per_virtual_stage(m.num_layers)
    # 3b. partial recompute: Megatron-LM --recompute-method block checkpoints layer_idx < N of each chunk
    # (megatron/core/transformer/transformer_block.py _checkpointed_forward, branch 'block'), so N above
    # the largest chunk is the same as N = that chunk's layer count (every layer): a typo, refused
    rn, most = p.recompute_num_layers, max(chunks)
    if p.recompute == "full" and rn > most:
        per = f"{most} layers per chunk" if min(chunks) == most else f"at most {most} layers per chunk"
        raise PlanError(f"recompute_num_layers={rn} exceeds the {per} ({m.num_layers} layers over pp x vpp = "
                        f"{len(chunks)} chunk{'s' if len(chunks) > 1 else ''}); valid: 0 (every layer) or 1..{most} (the first N layers "
                        f"of each chunk, Megatron-LM --recompute-method block)")
    if p.cpu_offload_layers >= m.num_layers:     # 3c. Megatron-Core refuses N >= num_layers (transformer_config.py)
        raise PlanError(f"cpu_offload_layers={p.cpu_offload_layers} must be less than the model's {m.num_layers} "
                        f"layers (Megatron-Core offloads layers 0..N-1 and keeps the last); valid: 0..{m.num_layers - 1}")
    # 4. global batch = micro-batch x count x DP
    if p.global_batch_size != w.global_batch_size:
        per = w.global_batch_size / (p.micro_batch_size * p.dp_degree)
        raise PlanError(
            f"global batch {w.global_batch_size} != micro_batch_size {p.micro_batch_size} x num_micro_batches "
            f"{p.num_micro_batches} x dp_degree {p.dp_degree} = {p.global_batch_size}"
            + (f"; with micro-batch {p.micro_batch_size} and DP {p.dp_degree} it would need "
               f"{per:g} micro-batches, which is not a whole number" if per != int(per) else
               f"; use num_micro_batches={int(per)}"))
    # 5. sequence divisibility for CP (2 x cp load-balanced chunks) and SP (tokens split over TP)
    seq_mult = p.cp_degree * math.lcm(2 if p.cp_degree > 1 else 1, tp if p.sp_active else 1)
    if w.seq_len % seq_mult:
        why = []
        if p.cp_degree > 1:
            why.append(f"cp_degree={p.cp_degree} (2 x cp chunks for load-balanced causal attention)")
        if p.sp_active:
            why.append(f"sequence parallel over tp_degree={tp}")
        raise PlanError(f"seq_len={w.seq_len} is not a multiple of {seq_mult} = cp x lcm(2, tp) needed by "
                        + " and ".join(why) + f"; e.g. seq_len {(w.seq_len // seq_mult + 1) * seq_mult}")
    # 6. interleaved 1F1B needs micro-batches in whole rounds of pp (Megatron-LM's rule)
    if p.pipeline_schedule == "interleaved_1f1b" and p.pp_degree > 1 and p.vpp_degree > 1 \
            and p.num_micro_batches % p.pp_degree:
        raise PlanError(f"interleaved_1f1b needs num_micro_batches ({p.num_micro_batches}) to be a multiple "
                        f"of pp_degree ({p.pp_degree})")
    # 7. precision against the GPU and the per-rank GEMM shapes
    from autotune.spec.moe_plan import validate_moe

    warn: list[str] = validate_moe(p, m)
    if gpu is not None:
        warn += validate_precision(p, m, gpu)
    # warnings: settings with no effect
    dp_group = p.dp_degree * p.cp_degree
    if p.sequence_parallel and tp == 1:
        warn.append("sequence_parallel has no effect with tp_degree=1")
    if p.vpp_degree > 1 and p.pipeline_schedule != "interleaved_1f1b":
        warn.append(f"vpp_degree={p.vpp_degree} has no effect with pipeline_schedule={p.pipeline_schedule} "
                    "(only interleaved_1f1b uses virtual stages)")
    if p.pipeline_schedule == "interleaved_1f1b" and p.vpp_degree == 1 and p.pp_degree > 1:
        warn.append("interleaved_1f1b with vpp_degree=1 is plain 1F1B")
    if p.pp_degree == 1 and p.pipeline_schedule != "1f1b":
        warn.append(f"pipeline_schedule={p.pipeline_schedule} has no effect with pp_degree=1")
    if p.tp_comm_overlap and tp == 1:
        warn.append("tp_comm_overlap has no effect with tp_degree=1")
    if p.fp8_param_gather and p.precision == "bf16":
        warn.append("fp8_param_gather has no effect with precision=bf16")
    if p.grad_reduce_in_bf16 and p.dp_degree * p.cp_degree == 1:
        warn.append("grad_reduce_in_bf16 has no effect without data parallelism (dp x cp = 1)")
    if p.tp_comm_overlap and not p.async_collectives:
        warn.append("tp_comm_overlap has no effect with async_collectives=false (collectives block)")
    if dp_group == 1 and (p.zero_stage > 0 or p.dp_grad_reduce_overlap or p.param_gather_overlap):
        warn.append("zero_stage and DP overlap settings have no effect with dp_degree x cp_degree = 1")
    elif p.dp_grad_reduce_overlap and not p.async_collectives:
        warn.append("dp_grad_reduce_overlap has no effect with async_collectives=false (collectives block)")
    if p.param_gather_overlap and p.zero_stage == 0:
        warn.append("param_gather_overlap has no effect with zero_stage=0 (parameters are not sharded)")
    if gpus_per_node and tp > gpus_per_node:
        warn.append(f"tp_degree={tp} spans nodes ({gpus_per_node} GPUs per node): TP traffic crosses the "
                    "inter-node network")
    elif gpus_per_node and num_gpus > gpus_per_node and gpus_per_node % tp:
        warn.append(f"tp_degree={tp} does not divide the {gpus_per_node} GPUs used per NVLink domain: some TP "
                    "groups cross domains and their traffic crosses the inter-node network")
    for msg in warn:
        log.warning(msg)
    return warn


# ---------------------------------------------------------------- YAML document
PLAN_SCHEMA_VERSION = 1
#: top-level keys of a plan file (:meth:`PlanDocument.to_dict`); others are refused
PLAN_DOCUMENT_KEYS = ("schema_version", "study", "trial_id", "engine", "model", "cluster", "workload", "plan",
                      "prediction")


def _check_document_text(d: Mapping[str, Any], source: str) -> None:
    """Refuse a plan file whose keys or string values (outside ``prediction``) are not short printable text
    (:func:`autotune.spec.validate.require_text`: at most :data:`~autotune.spec.validate.MAX_NAME_CHARS`
    characters, no newline or other control character), before any of them is echoed or written: the study,
    model, GPU and fabric names reach the comment lines and the ``#SBATCH --job-name`` of the launch files
    (autotune/export/__init__.py quotes them there too). ``prediction`` is left as it is (a real run's details
    may hold log lines); it is only ever written back through the YAML writer. Walks iteratively (the YAML
    reader caps the depth at :data:`autotune.files.MAX_NESTING_DEPTH`, a Python mapping may be deeper).

    Raises:
        ConfigError: ``<source>: field <path> <excerpt> contains a control character ...`` (one line).
    """
    from collections import deque

    from autotune.files import display_text
    from autotune.spec.validate import require_text, show

    todo: deque[tuple[str, Any, Any]] = deque(("", k, v) for k, v in d.items() if k != "prediction")
    while todo:                 # in file order: the first offending value is the one named
        parent, key, v = todo.popleft()
        where = display_text(parent, 100)
        if isinstance(key, str):
            require_text(key, f"{source}: a key of {'field ' + where if parent else 'the top level'}")
        path = (f"{parent}.{key}" if parent else key) if isinstance(key, str) else f"{parent}[{show(key)}]"
        if isinstance(v, str):
            require_text(v, f"{source}: field {display_text(path, 100)}")
        elif isinstance(v, Mapping):
            todo.extend((path, k, x) for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            todo.extend((path, i, x) for i, x in enumerate(v))


@dataclass(frozen=True)
class PlanDocument:
    """A plan with everything needed to re-evaluate or launch it; the YAML form of ``autotune export``.

    Attributes:
        plan: the plan.
        model: the model spec (written in full, so custom configs round-trip).
        gpu: GPU catalog name; num_gpus: GPU count; fabric: the fabric as a mapping (FabricSpec.to_dict()).
        workload: sequence length and global batch.
        study: Optuna study name it came from, or None; trial_id: its trial number, or None.
        prediction: what the evaluator predicted (step_time_ms, mfu, ...), or empty.
        engine: the training engine the prediction is for (:mod:`autotune.spec.engines`); files written
            before engines were modelled read as ``native`` (what their predictions costed).
    """

    plan: Plan
    model: ModelSpec
    gpu: str
    num_gpus: int
    fabric: Mapping[str, Any]
    workload: Workload
    study: str | None = None
    trial_id: int | None = None
    prediction: Mapping[str, Any] = field(default_factory=dict)
    schema_version: int = PLAN_SCHEMA_VERSION
    engine: str = "native"

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "study": self.study,
            "trial_id": self.trial_id,
            "model": self.model.to_dict(),
            "cluster": {"gpu": self.gpu, "num_gpus": self.num_gpus, "fabric": plain(self.fabric)},
            "engine": self.engine,
            "workload": asdict(self.workload),
            "plan": self.plan.to_dict(),
            "prediction": plain(self.prediction),
        }

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "plan file") -> "PlanDocument":
        if not isinstance(d, Mapping):
            raise ConfigError(f"{source}: expected a mapping at the top level")
        _check_document_text(d, source)
        from autotune.spec.hardware import check_keys
        check_keys(d, PLAN_DOCUMENT_KEYS, source)
        ver = d.get("schema_version")
        if ver != PLAN_SCHEMA_VERSION:
            raise ConfigError(f"{source}: schema_version is {ver!r}; this autotune reads version "
                              f"{PLAN_SCHEMA_VERSION}")
        for key in ("model", "cluster", "workload", "plan"):
            if not isinstance(d.get(key), Mapping):
                raise ConfigError(f"{source}: field {key!r} is missing or not a mapping")
        c = d["cluster"]
        check_keys(c, ("gpu", "num_gpus", "fabric"), f"{source}: field cluster")
        for key in ("gpu", "num_gpus", "fabric"):
            if key not in c:
                raise ConfigError(f"{source}: field cluster.{key} is missing (gpu: name, num_gpus: int, "
                                  "fabric: mapping)")
        from autotune.spec.validate import MAX_NUM_GPUS, require_int, require_name

        gpu = require_name(c["gpu"], f"{source}: field cluster.gpu")
        num_gpus = require_int(c["num_gpus"], f"{source}: field cluster.num_gpus", hi=MAX_NUM_GPUS)
        if not isinstance(c["fabric"], Mapping):
            raise ConfigError(f"{source}: field cluster.fabric must be a mapping (name, intra_node, inter_node), "
                              f"got {type(c['fabric']).__name__}")
        wl = d["workload"]
        unknown = sorted(set(map(str, wl)) - {"seq_len", "global_batch_size", "dtype"})
        if unknown:
            raise ConfigError(f"{source}: field workload: unknown field(s) {unknown}; valid: seq_len, "
                              "global_batch_size, dtype")
        try:
            workload = Workload(**wl)
        except TypeError as e:
            raise ConfigError(f"{source}: field workload: {e} (expected seq_len, global_batch_size)") from None
        except ConfigError as e:
            raise ConfigError(f"{source}: field {e}") from None
        engine = d.get("engine", "native")
        if not isinstance(engine, str):
            raise ConfigError(f"{source}: field engine must be an engine name, got {engine!r}")
        from autotune.spec.engines import get_engine

        try:
            get_engine(engine)
        except ConfigError as e:
            raise ConfigError(f"{source}: field engine: {e}") from None
        study = d.get("study")
        if study is not None and not isinstance(study, str):
            raise ConfigError(f"{source}: field study must be a study name or null, got {type(study).__name__}")
        trial_id = d.get("trial_id")
        if trial_id is not None:
            require_int(trial_id, f"{source}: field trial_id", lo=0)
        pred = d.get("prediction") or {}
        if not isinstance(pred, Mapping):
            raise ConfigError(f"{source}: field prediction must be a mapping (step_time_ms, mfu, ...), got "
                              f"{type(pred).__name__}")
        from autotune.spec.validate import require_number
        for k in ("step_time_ms", "mfu"):
            if k in pred:
                require_number(pred[k], f"{source}: field prediction.{k}", lo=0)
        return cls(
            engine=engine,
            plan=Plan.from_dict(d["plan"], source=f"{source}: field plan"),
            model=ModelSpec.from_dict(d["model"], source=f"{source}: field model"),
            gpu=gpu, num_gpus=num_gpus, fabric=dict(c["fabric"]),
            workload=workload, study=study, trial_id=trial_id,
            prediction=dict(pred), schema_version=ver,
        )

    @classmethod
    def from_yaml(cls, text: str, *, source: str = "plan file") -> "PlanDocument":
        from autotune.files import parse_yaml_text

        return cls.from_dict(parse_yaml_text(text, source=source), source=source)

    @classmethod
    def load(cls, path: str | Path) -> "PlanDocument":
        from autotune.files import read_text_file

        return cls.from_yaml(read_text_file(path, what="plan file"), source=str(path))

    def save(self, path: str | Path) -> None:
        """Write the document as YAML to ``path``, never through a symbolic link.

        Raises:
            ConfigError: ``path`` is a symbolic link or cannot be written.
        """
        from autotune.files import write_output_text
        write_output_text(path, self.to_yaml(), what="plan file")      # never through a symbolic link


