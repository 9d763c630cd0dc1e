"""EP token dispatch across nodes (autotune/cost/moe_layer.py ep_all_to_all_ms, remote_nodes_per_token): values
derived by hand in the comments, with a stand-in cost model of fixed bus bandwidths."""

from __future__ import annotations

import pytest

from autotune.cost.moe_layer import ep_all_to_all_ms, remote_nodes_per_token
from autotune.cost.topology import GroupPlacement
from autotune.spec.hardware import LinkSpec

NVL = LinkSpec(name="nvl", bandwidth_gbs=400.0, latency_us=0.0, gpus_per_node=8)
NIC = LinkSpec(name="nic", bandwidth_gbs=50.0, latency_us=0.0, gpus_per_node=8, calibration_tier="ib", nics_per_node=8)


class FixedCosts:
    """busbw = the link's bandwidth at every size; an intra-node all-to-all returns a marker."""

    def busbw_gbs(self, kind, nbytes, link):
        return link.bandwidth_gbs

    def placed_collective_ms(self, kind, nbytes, place):
        return -1.0


def _place(n: int, k: int, N: int) -> GroupPlacement:
    return GroupPlacement(size=n, stride=1, members_per_node=k, num_nodes=N, intra_link=NVL,
                          inter_link=NIC if N > 1 else None, nics_per_member=1.0 if N > 1 else 0.0)


def test_remote_nodes_per_token_by_hand():
    # one node: no remote node
    assert remote_nodes_per_token(128, 8, 1) == 0.0
    # E 4, k 2, N 2 (2 experts per node): P(a token's 2 experts both on one given node) = C(2,2)/C(4,2) = 1/6,
    # so the other node holds one of them with 5/6
    assert remote_nodes_per_token(4, 2, 2) == pytest.approx(5 / 6)
    # E 8, k 2, N 4 (2 experts per node): P(other node holds none) = C(6,2)/C(8,2) = 15/28; 3 (1 - 15/28) = 39/28
    assert remote_nodes_per_token(8, 2, 4) == pytest.approx(39 / 28)


def test_inside_one_node_the_collective_model_is_kept():
    assert ep_all_to_all_ms(FixedCosts(), _place(8, 8, 1), 1e9, 1e8, "alltoall", 128, 8) == -1.0


def test_alltoall_across_nodes_sends_the_off_node_share_through_its_own_nic():
    # n 16 = 2 nodes x 8, S = 1.6e9 bytes: on-node (k-1)/n S = 0.7e9 at 400 GB/s = 1.75 ms; off-node (n-k)/n S
    # = 0.8e9 at 50 GB/s = 16 ms; the larger (latency 0): 16 ms. (The ring model gave (15/16) S / min(400, 8 x 50)
    # = 3.75 ms: k NICs for one rank's traffic.)
    assert ep_all_to_all_ms(FixedCosts(), _place(16, 8, 2), 1.6e9, 2e8, "alltoall", 128, 8) == pytest.approx(16.0)


def test_flex_across_nodes_sends_each_token_once_per_remote_node():
    # E 4, k 2 over 2 nodes (n 4, k 2 members each): tokens 1e8 bytes, copies 2e8; off-node = 1e8 x 5/6 at 50 GB/s
    # = 1.6667 ms; NVLink: local (k-1)/n S = 0.5e8 plus forwarded (n-k)/n S (k-1)/k = 0.5e8 at 400 GB/s = 0.25 ms
    got = ep_all_to_all_ms(FixedCosts(), _place(4, 2, 2), 2e8, 1e8, "flex", 4, 2)
    assert got == pytest.approx(1e8 * 5 / 6 / 50e6)
