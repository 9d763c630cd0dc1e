"""autotune's own runtime as a launch: ``launch_torchrun.sh`` running ``autotune validate plan.yaml``, which
starts the runtime's own workers on the local GPUs (:mod:`autotune.runtime`). The export part of the
``native`` engine (:class:`autotune.engines.base.EngineParts`)."""

from __future__ import annotations

from autotune.errors import ConfigError
from autotune.engines.base import LaunchCommand
from autotune.spec.plan import PlanDocument

#: files this engine writes beside ``plan.yaml`` and the launch scripts
EXTRA_FILES: tuple[str, ...] = ()


def native_unsupported_features(model, seq_len: int) -> list[str]:
    """Features of ``model`` that autotune's runtime does not build (autotune/runtime/model.py: a Llama
    block with RMSNorm before attention and MLP, SwiGLU, no biases, an untied LM head and RoPE with the
    Llama 3 scaling of factor 8 always applied), as readable names; empty when ``autotune validate``
    runs this very model."""
    from autotune.spec.models import LLAMA31_ROPE_SCALING

    out = []
    if getattr(model, "num_experts", 0):
        out.append(f"mixture of experts ({model.num_experts} routed experts; the runtime builds dense blocks)")
    if not (model.gated_mlp and model.mlp_activation in ("silu", "swish")):
        out.append(f"{'gated ' if model.gated_mlp else ''}{model.mlp_activation} MLP (the runtime has SwiGLU)")
    if model.qkv_bias:
        out.append("Q/K/V biases")
    if model.tied_embeddings:
        out.append("tied embeddings")
    if model.rope_scaling != LLAMA31_ROPE_SCALING:
        rs = "no RoPE scaling" if model.rope_scaling is None else f"RoPE scaling {model.rope_scaling.describe()}"
        out.append(f"{rs} (the runtime applies Llama 3.1's llama3 scaling, factor 8)")
    if model.norms_per_layer != 2:
        out.append(f"{model.norms_per_layer} RMSNorms per layer")
    if model.sliding_window is not None and seq_len > model.sliding_window:
        out.append(f"sliding-window attention (window {model.sliding_window} < seq_len {seq_len})")
    return out + list(model.features)


def launch_refusal(model, seq_len: int) -> str | None:
    """What ``autotune run`` says at its start about this engine's launch files: nothing for the native
    runtime (``autotune export`` refuses an unsupported model itself, :func:`launch_command`)."""
    return None


def launch_command(doc: PlanDocument, *, plan_file: str = "plan.yaml") -> LaunchCommand:
    """``autotune validate plan_file`` (no torchrun: it starts its own workers).

    Raises:
        ConfigError: a model the runtime does not build (:func:`native_unsupported_features`).
    """
    bad = native_unsupported_features(doc.model, doc.workload.seq_len)
    if bad:
        raise ConfigError(f"model {doc.model.name}: autotune's runtime (engine native) cannot run {'; '.join(bad)}; "
                          "export the plan for megatron or torchtitan where they can")
    return LaunchCommand(program=("autotune",), args=("validate", plan_file), use_torchrun=False,
                         notes=("autotune's runtime on the local GPUs (autotune validate)",))


def extra_files(doc: PlanDocument) -> dict[str, str]:
    """Files beside the launch scripts: none for the native runtime."""
    return {}


__all__ = ["EXTRA_FILES", "extra_files", "launch_command", "launch_refusal", "native_unsupported_features"]
