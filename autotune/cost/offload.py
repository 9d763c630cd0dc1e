"""CPU activation offloading (``Plan.cpu_offload_layers``): the time its copies add to a micro-batch.

Megatron-LM ``--cpu-offloading-num-layers N`` wraps each layer's forward in Transformer Engine's CPU-offload
context (megatron/core/transformer/transformer_block.py, ``get_cpu_offload_context``). TE's schedule
(transformer_engine/pytorch/cpu_offload.py ``OffloadSynchronizer._default_offload_sync_init``, the default
path since TE 2.10; read at commit 00382b96):

* layers 0..N-1 are offloaded; after layer i's forward its saved tensors are copied to pinned host memory
  on one offload stream (``fwd_step``: the copy of layer i starts when layer i+1's forward begins);
* before the forward of layer L - N + i the compute stream waits for layer i's copy to finish (then frees
  the GPU copy): the saved activations on the GPU never exceed those of L - N layers
  (:func:`autotune.cost.memory.offload_kept_bytes`);
* in backward, the reload of layer i starts before the backward of layer L - 1 - N + i (on the same
  stream, after what the compute stream has issued), and the backward of layer i waits for it.

:func:`offload_exposed_ms` replays that schedule for one micro-batch with each layer's forward and
backward time and its bytes, and returns what the waits add to the compute stream, plus the slowdown of
the compute that runs beside a copy. Copies run at ``host_link_gbs`` x :data:`HOST_COPY_EFFICIENCY`
(:func:`host_copy_gbs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from autotune.errors import ConfigError
from autotune.spec.hardware import GPUSpec

#: what a pinned host <-> GPU copy reaches of the link's datasheet rate: 55 GB/s of PCIe Gen5 x16's
#: 63.0 GB/s per direction, host-to-device copies of 256 MiB from pinned memory on one H200, alone and beside
#: GEMMs (54-55 GB/s; docs/results/contention-h200x1-2026-12-01.md, bench/contention.py, torch 2.11.0,
#: 2026-12-01). Device-to-host copies were not measured (taken equal), and the NVLink-C2C parts (GB200,
#: GB300) and PCIe Gen6 parts (B300) take the same fraction: not measured (bench/host_link.py measures both
#: directions where a GPU is lent).
HOST_COPY_EFFICIENCY = 55.0 / 63.0
#: GEMMs run slower while a host copy moves data beside them: median over the eight GEMM shapes of the same
#: H200 measurement (slowdowns 1.02-1.09 and 1.21 for the smallest; median 1.055). Applied to the compute
#: that overlaps a copy.
COPY_COMPUTE_SLOWDOWN = 1.055


def host_copy_gbs(gpu: GPUSpec) -> float:
    """GB/s (1e9 bytes/s) one host <-> GPU copy reaches on ``gpu``: its datasheet ``host_link_gbs`` (per
    direction) x :data:`HOST_COPY_EFFICIENCY`.

    Raises:
        ConfigError: the GPU's ``host_link_gbs`` is not known (names the GPU and the field to set).
    """
    if not gpu.host_link_gbs:
        raise ConfigError(f"GPU {gpu.name}: host_link_gbs (GB/s per direction of its host link) is not known, so "
                          "CPU activation offloading cannot be priced; add host_link_gbs to its GPU entry or use "
                          "cpu_offload_layers=0")
    return gpu.host_link_gbs * HOST_COPY_EFFICIENCY


@dataclass(frozen=True)
class OffloadTiming:
    """What offloading adds to one micro-batch, ms: ``exposed_fwd_ms`` / ``exposed_bwd_ms`` (compute-stream
    waits for copies + the slowdown of compute beside them, by pass) and ``copy_ms`` (the copies' own time,
    both directions)."""

    exposed_fwd_ms: float
    exposed_bwd_ms: float
    copy_ms: float


def offload_exposed_ms(fwd_ms: Sequence[float], bwd_ms: Sequence[float], layer_bytes: Sequence[float],
                       num_offloaded: int, copy_gbs: float, *,
                       compute_slowdown: float = COPY_COMPUTE_SLOWDOWN) -> OffloadTiming:
    """Replay Transformer Engine's offload schedule (module docstring) for one micro-batch.

    Args:
        fwd_ms, bwd_ms: each layer's forward and backward time on the compute stream, ms, shape (L,).
        layer_bytes: each layer's saved-activation bytes, shape (L,) (only the first ``num_offloaded`` move).
        num_offloaded: N, 0 <= N < L.
        copy_gbs: rate of one copy, GB/s (:func:`host_copy_gbs`).
        compute_slowdown: factor on the compute that runs while a copy is in flight.

    Returns:
        :class:`OffloadTiming`. The waits are exact for the schedule given the times (one copy stream,
        copies in issue order); the slowdown is charged as (slowdown - 1) x the copy time that overlaps
        compute.

    Raises:
        ValueError: lengths differ, or N is outside 0..L-1.
    """
    L = len(fwd_ms)
    if len(bwd_ms) != L or len(layer_bytes) != L:
        raise ValueError(f"fwd_ms, bwd_ms and layer_bytes need one entry per layer, got {L}, {len(bwd_ms)}, "
                         f"{len(layer_bytes)}")
    n = num_offloaded
    if not 0 <= n < max(L, 1):
        raise ValueError(f"num_offloaded={n} must be in 0..{L - 1}")
    if n == 0:
        return OffloadTiming(0.0, 0.0, 0.0)
    xfer = [layer_bytes[i] / (copy_gbs * 1e6) for i in range(n)]        # ms: bytes / (GB/s x 1e9) x 1e3
    # forward: c = compute stream clock, s = offload stream clock
    c = s = 0.0
    done: dict[int, float] = {}
    for j in range(L):
        i = j - (L - n)                     # the layer whose copy must finish before layer j's forward
        if i >= 0:
            c = max(c, done[i])
        c += fwd_ms[j]
        if j < n:                           # layer j's copy starts after its forward and the copy before it
            s = max(s, c) + xfer[j]
            done[j] = s
    fwd_end = c
    wait_fwd = fwd_end - sum(fwd_ms)
    # backward, layers L-1 .. 0; the reload of layer i starts before the backward of layer L - 1 - N + i
    reloaded: dict[int, float] = {}
    for j in range(L - 1, -1, -1):
        i = j - (L - 1 - n)
        if 0 <= i < n:
            s = max(s, c) + xfer[i]
            reloaded[i] = s
        if j < n:
            c = max(c, reloaded[j])
        c += bwd_ms[j]
    wait_bwd = c - fwd_end - sum(bwd_ms)
    # every forward copy ends before layer L-1's forward and every reload before layer 0's backward; while
    # the compute stream waits, a copy runs alone, otherwise compute runs beside it (and slower)
    copy_one_way = sum(xfer)
    slow = compute_slowdown - 1.0
    return OffloadTiming(exposed_fwd_ms=wait_fwd + slow * max(copy_one_way - wait_fwd, 0.0),
                         exposed_bwd_ms=wait_bwd + slow * max(copy_one_way - wait_bwd, 0.0),
                         copy_ms=2 * copy_one_way)


__all__ = ["HOST_COPY_EFFICIENCY", "COPY_COMPUTE_SLOWDOWN", "OffloadTiming", "host_copy_gbs", "offload_exposed_ms"]


def add_offload_costs(cb, cc, n_dense: int, n_moe: int) -> None:
    """Add the offload waits of ``cb.p.cpu_offload_layers`` to the one-stage chunk ``cc`` (a
    :class:`autotune.cost.chunk_costs.ChunkCost` holding its layers' parts so far) of the
    :class:`~autotune.cost.chunk_costs.CostBuilder` ``cb``, under the ``exposed_offload`` breakdown key:
    :func:`offload_exposed_ms` over the layers in model order, a dense layer at its own forward / backward
    time, an MoE layer at the chunk's mean MoE-layer time, bytes from
    :func:`autotune.cost.memory.offload_layer_bytes`.

    Raises:
        ConfigError: the GPU's host link is not known (:func:`host_copy_gbs`).
    """
    from autotune.cost.memory import offload_layer_bytes
    from autotune.cost.moe import is_moe_layer

    m, p = cb.m, cb.p
    lf, lb, _ = cb._layer
    df, db = sum(lf.values()), sum(lb.values())
    mf = (cc.fwd_ms - n_dense * df) / n_moe if n_moe else 0.0
    mb = (cc.bwd_ms - n_dense * db) / n_moe if n_moe else 0.0
    kinds = [m.is_moe and is_moe_layer(m, i) for i in range(n_dense + n_moe)]
    t = offload_exposed_ms([mf if k else df for k in kinds], [mb if k else db for k in kinds],
                           offload_layer_bytes(m, p, cb.w, cb.engine)[:len(kinds)], p.cpu_offload_layers,
                           host_copy_gbs(cb.c.gpu))
    for parts, v in ((cc.fwd_parts, t.exposed_fwd_ms), (cc.bwd_parts, t.exposed_bwd_ms)):
        if v:
            parts["exposed_offload"] = parts.get("exposed_offload", 0.0) + v
