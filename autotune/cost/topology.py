"""How a process group of a plan lies on the cluster: members per node, nodes spanned, links used.

Rank order is Megatron-LM's (``megatron/core/parallel_state.py``, ``RankGenerator`` with the default
``order="tp-cp-ep-dp-pp"``): TP fastest, then CP, DP, PP. A group whose consecutive members are
``stride`` global ranks apart therefore is

* TP: ``size = tp``, ``stride = 1``;
* CP: ``size = cp``, ``stride = tp``;
* DP (with CP, the group ZeRO / FSDP shard over and DP gradients are reduced in): ``size = dp x cp``,
  ``stride = tp`` (CP and DP are adjacent in the order, so the dp x cp ranks form one strided run);
  the plain DP group: ``size = dp``, ``stride = tp x cp``;
* PP (one pair of adjacent stages, what a send/recv crosses): ``size = 2``, ``stride = tp x cp x dp``.

A "node" here is an NVLink domain as the cluster uses it (:attr:`autotune.spec.hardware.ClusterSpec.nvlink_domain_size`:
8 GPUs on HGX, 72 on NVL72, or an equal segment of NVL72 trays, e.g. 64 of 72 for 256 GPUs); members inside one domain talk over the intra-node tier, members in different
domains over the inter-node tier (the NICs).

NIC sharing (assumption, stated as the issue asks): every process group of one kind runs its collective
at the same time (SPMD: all DP groups reduce the same bucket together, all PP pairs send in the same
1F1B slot), so the ``gpus_per_node / k`` groups that have ``k`` members in a node use the node's NICs
together and each member gets the NIC share of one GPU, ``nics_per_node / gpus_per_node`` NICs (1 on
HGX with 8 NICs for 8 GPUs). NCCL drives each GPU's traffic through its PCIe-nearest NIC (NCCL
documentation, environment variables ``NCCL_CROSS_NIC`` / ``NCCL_IB_HCA``; rail-optimised fabrics put
GPU i of every node on rail i), so this share is what a member's NIC path carries.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from functools import lru_cache

from autotune.errors import ConfigError
from autotune.spec.hardware import ClusterSpec, LinkSpec


@dataclass(frozen=True)
class GroupPlacement:
    """One process group on the cluster.

    Attributes:
        size: members (ranks) of the group, n.
        stride: global-rank distance between consecutive members.
        members_per_node: k, members that share one NVLink domain (the most in any domain when the
            domains hold unequal counts; equal for power-of-two degrees).
        num_nodes: NVLink domains the group spans, N (n = k x N when counts are equal).
        intra_link: the intra-node tier (NVLink) the k local members talk over.
        inter_link: the inter-node tier (one NIC, bandwidth per NIC), or None when ``num_nodes == 1``.
        nics_per_member: NICs one member's traffic gets across nodes (module docstring: the NIC share
            of one GPU, ``nics_per_node / gpus_per_node``; 0 when the group is inside one node).
    """

    size: int
    stride: int
    members_per_node: int
    num_nodes: int
    intra_link: LinkSpec
    inter_link: LinkSpec | None
    nics_per_member: float

    @property
    def spans_nodes(self) -> bool:
        """True when the group crosses the inter-node tier."""
        return self.num_nodes > 1

    @property
    def member_inter_link(self) -> LinkSpec | None:
        """The inter-node path of one member: the NIC link with bandwidth x ``nics_per_member``
        (GB/s per member, per direction); None inside one node."""
        if self.inter_link is None:
            return None
        if self.nics_per_member == 1.0:
            return self.inter_link
        return replace(self.inter_link, name=f"{self.inter_link.name}x{self.nics_per_member:g}",
                       bandwidth_gbs=self.inter_link.bandwidth_gbs * self.nics_per_member)

    @property
    def bottleneck_link(self) -> LinkSpec:
        """The slowest tier a member crosses: the member's inter-node path when the group spans nodes,
        else the intra-node tier (what a single-link cost model, e.g. ``group_link``, would use)."""
        return self.member_inter_link or self.intra_link


@lru_cache(maxsize=4096)
def _node_counts(size: int, stride: int, domain: int, num_gpus: int) -> tuple[int, int]:
    """(members per domain, domains spanned) of the worst group of stride ``stride`` and ``size`` members.

    The groups are Megatron-LM's: members ``o + b s n + j s`` for offset o < s, block b and j < n. Each
    group is counted member by member (every rank once, so O(num_gpus)); the one spanning the most
    domains (then the most members in one domain) is returned. With power-of-two degrees all are alike.
    """
    best = (0, 0)
    span = stride * size
    for base in range(0, num_gpus - span + 1, span):
        for o in range(stride):
            counts = Counter((base + o + j * stride) // domain for j in range(size))
            best = max(best, (len(counts), max(counts.values())))
    return best[1], best[0]


def place_group(cluster: ClusterSpec, size: int, stride: int) -> GroupPlacement:
    """Placement of a group of ``size`` members ``stride`` global ranks apart (module docstring).

    Every group of the kind is counted (Megatron-LM layout: members ``o + b s n + j s``); the one that
    spans the most nodes stands for all (with power-of-two degrees every group lies the same way).

    Raises:
        ConfigError: ``size`` or ``stride`` not a positive integer, or the group needs more ranks than
            the cluster has (``(size - 1) x stride >= num_gpus``).
    """
    for name, v in (("size", size), ("stride", stride)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"process group {name} must be a positive integer, got {v!r}")
    if (size - 1) * stride >= cluster.num_gpus:
        raise ConfigError(f"process group of {size} ranks at stride {stride} needs {(size - 1) * stride + 1} "
                          f"ranks; the cluster has {cluster.num_gpus}")
    fabric = cluster.fabric
    domain = cluster.nvlink_domain_size          # GPUs used per domain (NVL72 segments: ClusterSpec)
    if size == 1:
        k, nodes = 1, 1
    else:
        k, nodes = _node_counts(size, stride, domain, cluster.num_gpus)
    inter = fabric.inter_node if nodes > 1 else None
    if nodes > 1 and inter is None:      # ClusterSpec forbids multi-node clusters without one
        raise ConfigError(f"process group spans {nodes} nodes but fabric {fabric.name!r} has no inter-node tier")
    return GroupPlacement(size=size, stride=stride, members_per_node=k, num_nodes=nodes,
                          intra_link=fabric.intra_node, inter_link=inter,
                          nics_per_member=fabric.nics_per_gpu if inter is not None else 0.0)


@dataclass(frozen=True)
class PlanPlacements:
    """The process groups of one plan (degrees tp, cp, dp, pp; see the module docstring for strides).

    Attributes:
        tp: the TP group (size tp, stride 1).
        cp: the CP group (size cp, stride tp).
        dp: the DP x CP group ZeRO shards over and DP gradients are reduced in (size dp x cp, stride tp).
        pp: the slowest pair of adjacent pipeline stages (what one send/recv crosses; size 1 without
            PP): stride tp x cp x dp; across two nodes (k = 1, N = 2) as soon as the pipeline spans nodes,
            since some stage boundary then falls on a node boundary (see :func:`place_pipeline_pair`).
    """

    tp: GroupPlacement
    cp: GroupPlacement
    dp: GroupPlacement
    pp: GroupPlacement


def plan_placements(cluster: ClusterSpec, *, tp_degree: int, cp_degree: int, dp_degree: int,
                    pp_degree: int) -> PlanPlacements:
    """Placements of a plan's TP, CP, DP x CP and PP groups in Megatron-LM rank order.

    Raises:
        ConfigError: a degree that is not a positive integer, or tp x cp x dp x pp != the GPU count.
    """
    degrees = {"tp_degree": tp_degree, "cp_degree": cp_degree, "dp_degree": dp_degree, "pp_degree": pp_degree}
    for name, v in degrees.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"{name} must be a positive integer, got {v!r}")
    total = tp_degree * cp_degree * dp_degree * pp_degree
    if total != cluster.num_gpus:
        raise ConfigError(f"tp x cp x dp x pp = {tp_degree} x {cp_degree} x {dp_degree} x {pp_degree} = {total}; "
                          f"must equal the cluster's {cluster.num_gpus} GPUs")
    return PlanPlacements(
        tp=place_group(cluster, tp_degree, 1),
        cp=place_group(cluster, cp_degree, tp_degree),
        dp=place_group(cluster, dp_degree * cp_degree, tp_degree),
        pp=place_pipeline_pair(cluster, pp_degree, tp_degree * cp_degree * dp_degree),
    )


def place_pipeline_pair(cluster: ClusterSpec, pp_degree: int, stride: int) -> GroupPlacement:
    """The slowest send/recv pair of a pipeline of ``pp_degree`` stages ``stride`` ranks apart.

    A pipeline inside one node: a pair inside the node (k = 2, N = 1). A pipeline spanning nodes: some
    adjacent pair sits on two nodes (stage i on the last rank row of a node, stage i + 1 on the next),
    and the slowest boundary paces the 1F1B steady state, so a pair across two nodes (k = 1, N = 2).
    Without PP: a group of one (no communication).

    Raises:
        ConfigError: as :func:`place_group`.
    """
    if pp_degree <= 1:
        return place_group(cluster, 1, max(1, stride))
    chain = place_group(cluster, pp_degree, stride)
    fabric = cluster.fabric
    if not chain.spans_nodes:
        return replace(chain, size=2, members_per_node=2)
    return GroupPlacement(size=2, stride=stride, members_per_node=1, num_nodes=2, intra_link=fabric.intra_node,
                          inter_link=fabric.inter_node, nics_per_member=fabric.nics_per_gpu)
