"""Process-group placement on nodes and the cost of collectives that span nodes."""

import math

import pytest

from autotune.cost.op_costs import CalibratedCosts
from autotune.cost.calibration import CalibrationProfile, default_calibration
from autotune.errors import ConfigError
from autotune.cost.graph import CostBuilder
from autotune.cost.chunk_costs import group_link
from autotune.spec.hardware import get_fabric, get_gpu, make_cluster
from autotune.spec.models import get_model
from autotune.spec.plan import Plan, Workload
from autotune.cost.topology import place_group, plan_placements

GIB = 2**30


def _flat_profile(nvlink_busbw=360.0, network_busbw=45.0):
    """The shipped profile with flat bus-bandwidth curves: 360 GB/s on NVLink (nominal 450) and 45 GB/s
    on the network (nominal 50), for every collective and size, so times can be derived by hand."""
    d = dict(default_calibration().raw)
    flat = lambda b: [[1, b], [2**40, b]]  # noqa: E731
    kinds = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
    d["collectives"] = {
        "nvlink": {"link_bandwidth_gbs": 450, "group_size": 2, "measured": False,
                   **{k: flat(nvlink_busbw) for k in kinds}},
        "network": {"link_bandwidth_gbs": 50, "group_size": 2, "measured": False,
                    **{k: flat(network_busbw) for k in kinds}},
    }
    return CalibrationProfile.from_dict(d, source="test")


@pytest.fixture
def flat():
    return CalibratedCosts(profile=_flat_profile(), gpu=get_gpu("h100"))


# ----------------------------------------------------------------------------- placements
def test_placements_hand_worked():
    # 1024 GPUs on 8-GPU nodes, tp 8 cp 1 dp 128 pp 1: TP = one whole node; DP members are 8 ranks
    # apart, so each node holds exactly one member of a DP group and the group spans 1024 / 8 nodes
    c = make_cluster("b200", 1024, "nvlink5+ib-ndr400")
    pl = plan_placements(c, tp_degree=8, cp_degree=1, dp_degree=128, pp_degree=1)
    assert (pl.tp.members_per_node, pl.tp.num_nodes, pl.tp.inter_link) == (8, 1, None)
    assert (pl.dp.members_per_node, pl.dp.num_nodes, pl.dp.nics_per_member) == (1, 128, 1.0)
    assert pl.pp.size == 1 and not pl.pp.spans_nodes
    # tp 2 dp 4 on one 8-GPU node: everything inside the node (ranks 0, 2, 4, 6)
    one = make_cluster("h100", 8, "nvlink4+ib-ndr400")
    pl = plan_placements(one, tp_degree=2, cp_degree=1, dp_degree=4, pp_degree=1)
    assert (pl.dp.members_per_node, pl.dp.num_nodes, pl.dp.inter_link) == (4, 1, None)
    # tp 4 cp 1 dp 64 pp 4 on 1024 GPUs: DP members 0, 4, 8, ..., 252 -> ranks 0 and 4 share node 0,
    # so k = 2 per node over 64 / 2 = 32 nodes; a PP pair (ranks 0 and 256) lies on 2 nodes, 1 each
    pl = plan_placements(c, tp_degree=4, cp_degree=1, dp_degree=64, pp_degree=4)
    assert (pl.dp.members_per_node, pl.dp.num_nodes) == (2, 32)
    assert (pl.pp.size, pl.pp.members_per_node, pl.pp.num_nodes) == (2, 1, 2)
    # tp 4 cp 4 (16 GPUs): CP members 0, 4, 8, 12 -> 2 per node on 2 nodes; the DP x CP group
    # (dp 1: size 4, stride 4) the same
    c16 = make_cluster("h100", 16, "nvlink4+ib-ndr400")
    pl = plan_placements(c16, tp_degree=4, cp_degree=4, dp_degree=1, pp_degree=1)
    assert (pl.cp.members_per_node, pl.cp.num_nodes) == (2, 2)
    assert (pl.dp.size, pl.dp.members_per_node, pl.dp.num_nodes) == (4, 2, 2)
    # NVL72 (72-GPU NVLink domain), 144 GPUs, tp 8 dp 18: members 0, 8, ..., 136 -> 9 per domain, 2 domains
    nvl = make_cluster("gb200", 144, "nvlink5-nvl72+ib-ndr400")
    assert nvl.nvlink_domain_size == 72
    g = place_group(nvl, 18, 8)
    assert (g.members_per_node, g.num_nodes) == (9, 2)


def _megatron_groups(tp, cp, dp, pp):
    """All DP x CP groups and PP groups of Megatron-LM's rank order (rank = t + tp (c + cp (d + dp s))),
    enumerated rank by rank, independently of autotune.cost.topology."""
    rank = lambda t, c, d, s: t + tp * (c + cp * (d + dp * s))  # noqa: E731
    dpcp = [[rank(t, c, d, s) for d in range(dp) for c in range(cp)] for t in range(tp) for s in range(pp)]
    pp_pairs = [[rank(t, c, d, s), rank(t, c, d, s + 1)] for t in range(tp) for c in range(cp)
                for d in range(dp) for s in range(pp - 1)]
    return dpcp, pp_pairs


@pytest.mark.parametrize("tp,cp,dp,pp", [(2, 2, 4, 4), (4, 1, 8, 2), (1, 2, 16, 2), (8, 1, 4, 2), (2, 1, 2, 16)])
def test_placement_matches_megatron_groups(tp, cp, dp, pp):
    # counted member by member over every group of the kind: all DP x CP groups lie alike (power-of-two
    # degrees) and equal the placement; PP pairs differ (tp 2 dp 2 pp 16: stages 4 ranks apart, so pair
    # (0, 4) shares node 0 while (4, 8) crosses), and the placement is the slowest pair's (most nodes)
    c = make_cluster("h100", tp * cp * dp * pp, "nvlink4+ib-ndr400")
    pl = plan_placements(c, tp_degree=tp, cp_degree=cp, dp_degree=dp, pp_degree=pp)
    dpcp, pairs = _megatron_groups(tp, cp, dp, pp)

    def lie(grp):
        per_node = {}
        for r in grp:
            per_node[r // 8] = per_node.get(r // 8, 0) + 1
        return len(per_node), max(per_node.values())       # (nodes, members per node)

    assert {lie(g) for g in dpcp} == {(pl.dp.num_nodes, pl.dp.members_per_node)}
    assert max(lie(g) for g in pairs) == (pl.pp.num_nodes, pl.pp.members_per_node)
    if (tp, cp, dp, pp) == (2, 1, 2, 16):
        assert {lie(g) for g in pairs} == {(1, 2), (2, 1)} and (pl.pp.num_nodes, pl.pp.members_per_node) == (2, 1)


def test_placement_errors():
    c = make_cluster("h100", 16, "nvlink4+ib-ndr400")
    with pytest.raises(ConfigError, match="size must be a positive integer, got 0"):
        place_group(c, 0, 1)
    with pytest.raises(ConfigError, match="needs 17 ranks; the cluster has 16"):
        place_group(c, 2, 16)
    with pytest.raises(ConfigError, match="= 32; must equal the cluster's 16 GPUs"):
        plan_placements(c, tp_degree=8, cp_degree=1, dp_degree=4, pp_degree=1)


def test_nics_per_node_presets_and_validation(tmp_path):
    f = get_fabric("nvlink4+ib-ndr400")
    assert f.nics_per_node == 8 and f.inter_node.gpus_per_node == 8 and f.nics_per_gpu == 1.0
    p = tmp_path / "f.yaml"
    p.write_text("name: lab\nintra_node: {bandwidth_gbs: 450, latency_us: 4, gpus_per_node: 8}\n"
                 "inter_node: {bandwidth_gbs: 50, latency_us: 5, nics_per_node: 4}\n")
    assert get_fabric(str(p)).nics_per_gpu == 0.5          # 4 NICs for 8 GPUs
    p.write_text("name: lab\nintra_node: {bandwidth_gbs: 450, latency_us: 4, gpus_per_node: 8}\n"
                 "inter_node: {bandwidth_gbs: 50, nics_per_node: 0}\n")
    with pytest.raises(ConfigError, match="nics_per_node must be a positive integer.*got 0"):
        get_fabric(str(p))


# ----------------------------------------------------------------------------- collective costs
def test_inside_one_node_is_the_single_tier_cost(flat):
    c = make_cluster("h100", 8, "nvlink4+ib-ndr400")
    g = place_group(c, 8, 1)
    # ring over 8 at busbw 360: 2 x 7/8 x 2^30 / 360e9 s, + (14 - 2) NCCL ring steps x 4 us
    want = 2 * 7 / 8 * GIB / 360e6 + 12 * 4e-3
    assert flat.placed_collective_ms("all_reduce", GIB, g) == pytest.approx(want)
    assert flat.placed_collective_ms("all_reduce", GIB, g) == flat.collective_ms("all_reduce", GIB, 8, c.fabric.intra_node)


def test_larger_group_curves_cost_groups_of_their_size_and_above(tmp_path):
    # nvlink tier: 2-rank curves flat at 270 GB/s, a 4-rank all-gather curve flat at 330 GB/s (group_curves)
    d = dict(default_calibration().raw)
    flat = lambda b: [[1, b], [2**40, b]]  # noqa: E731
    d["collectives"] = {
        "nvlink": {"link_bandwidth_gbs": 450, "group_size": 2, "measured": False,
                   **{k: flat(270.0) for k in ("all_reduce", "all_gather", "reduce_scatter", "send_recv")},
                   "group_curves": {4: {"source": "test", "all_gather": flat(330.0)}}},
        "network": {"link_bandwidth_gbs": 50, "group_size": 2, "measured": False, "all_reduce": flat(100.0),
                    "all_gather": flat(100.0)},
    }
    prof = CalibrationProfile.from_dict(d, source="test")
    assert CalibrationProfile.from_dict(prof.to_dict()) == prof                  # round-trips
    costs = CalibratedCosts(profile=prof, gpu=get_gpu("h100"))
    nv = get_fabric("nvlink4").intra_node                                         # 450 GB/s, 4 us
    # 2 ranks: the 2-rank curve, (1/2) 2^30 / 270e9 s
    assert costs.collective_ms("all_gather", GIB, 2, nv) == pytest.approx(0.5 * GIB / 270e6)
    # 3 ranks: still the 2-rank curve (no measured group of 3 or 4 <= 3): (2/3) S / 270 + (2 - 1) x 4 us
    assert costs.collective_ms("all_gather", GIB, 3, nv) == pytest.approx(2 / 3 * GIB / 270e6 + 4e-3)
    # 4 ranks: the 4-rank curve, no latency beyond its own: (3/4) S / 330e9 s
    assert costs.collective_ms("all_gather", GIB, 4, nv) == pytest.approx(0.75 * GIB / 330e6)
    # 8 ranks: the 4-rank curve (largest measured <= 8) + (7 - 3) ring steps x 4 us
    assert costs.collective_ms("all_gather", GIB, 8, nv) == pytest.approx(7 / 8 * GIB / 330e6 + 4 * 4e-3)
    # a kind the 4-rank group did not measure keeps the 2-rank curve: all-reduce over 8,
    # 2 x 7/8 x S / 270e9 s + (14 - 2) x 4 us
    assert costs.collective_ms("all_reduce", GIB, 8, nv) == pytest.approx(1.75 * GIB / 270e6 + 12 * 4e-3)
    # across nodes the intra-node phase of k = 4 members uses the 4-rank busbw (330, not 270); the network
    # gives B_inter = k x busbw(S / k) = 4 x 100 = 400 GB/s, so NVLink bounds the ring at 330 GB/s:
    # (7/8) S / 330e9 s + latency: n - 1 = 7 steps, N - 1 = 1 of them inter-node: 6 x 4 + 5 = 29 us, less the
    # 2-rank measurement's 1 x 4 us on the bottleneck (NVLink) tier -> + 25 us
    c = make_cluster("h100", 16, "nvlink4+ib-ndr400")
    g = place_group(c, 8, 2)                  # stride 2: ranks 0, 2, 4, 6 | 8, ... -> k = 4, N = 2
    assert (g.members_per_node, g.num_nodes) == (4, 2)
    assert costs.placed_collective_ms("all_gather", GIB, g) == pytest.approx(7 / 8 * GIB / 330e6 + 25e-3)
    assert costs.busbw_gbs("all_gather", GIB, nv, group_size=4) == pytest.approx(330.0)
    assert costs.busbw_gbs("all_gather", GIB, nv) == pytest.approx(270.0)
    # bad group_curves keys are refused by name
    d["collectives"]["nvlink"]["group_curves"] = {2: {"all_gather": flat(1.0)}}
    with pytest.raises(ConfigError, match="group_curves key 2 must be an integer group size > the tier's group_size 2"):
        CalibrationProfile.from_dict(d, source="test")


def test_two_node_costs_by_hand(flat):
    c = make_cluster("h100", 16, "nvlink4+ib-ndr400")
    dp = place_group(c, 4, 4)            # tp 4 dp 4: ranks 0, 4 | 8, 12 -> k = 2, N = 2
    assert (dp.members_per_node, dp.num_nodes) == (2, 2)
    # ring: B_intra = 360 GB/s (NVLink curve), B_inter = k x 45 = 90 GB/s (two members' NICs, each
    # carrying half the buffer) -> the network bounds the ring: 2 x 3/4 x 2^30 / 90e9 s.
    # latency: 2(n-1) = 6 steps, 2(N-1) = 2 of them inter-node: 4 x 4 us + 2 x 5 us = 26 us, less the
    # 2-rank measurement's 2 x 5 us on the network tier -> + 16 us. Tree: 2 x 2^30 / 90e9 s, slower.
    ring = 1.5 * GIB / 90e6 + 16e-3
    assert flat.placed_collective_ms("all_reduce", GIB, dp) == pytest.approx(ring)
    # the old single-link model (each member on its own 45 GB/s NIC path for the whole buffer) is 2x slower
    assert flat.collective_ms("all_reduce", GIB, 4, group_link(c, 16)) == pytest.approx(1.5 * GIB / 45e6 + 4 * 5e-3)
    # all-gather: (3/4) 2^30 / 90e9 s; ring steps n-1 = 3 (N-1 = 1 inter): 2 x 4 + 5 = 13 us, less 1 x 5
    assert flat.placed_collective_ms("all_gather", GIB, dp) == pytest.approx(0.75 * GIB / 90e6 + 8e-3)
    # k = 1 (tp 8, dp 2): one member per node on its own NIC: 2 x 1/2 x 2^30 / 45e9 s, no extra steps
    dp1 = place_group(c, 2, 8)
    assert (dp1.members_per_node, dp1.num_nodes) == (1, 2)
    assert flat.placed_collective_ms("all_reduce", GIB, dp1) == pytest.approx(GIB / 45e6)
    # PP send/recv between nodes: S / 45 GB/s
    assert flat.placed_collective_ms("send_recv", GIB, dp1) == pytest.approx(GIB / 45e6)


def test_nic_sharing_halves_member_bandwidth(tmp_path):
    p = tmp_path / "f.yaml"
    p.write_text("name: halfnic\nintra_node: {bandwidth_gbs: 450, latency_us: 4, gpus_per_node: 8}\n"
                 "inter_node: {bandwidth_gbs: 50, latency_us: 5, nics_per_node: 4}\n")
    c = make_cluster("h100", 16, str(p))
    g = place_group(c, 2, 8)
    assert g.nics_per_member == 0.5 and g.member_inter_link.bandwidth_gbs == 25
    # busbw 45 x 25 / 50 = 22.5 GB/s: 2^30 / 22.5e9 s
    costs = CalibratedCosts(profile=_flat_profile(), gpu=get_gpu("h100"))
    assert costs.placed_collective_ms("all_reduce", GIB, g) == pytest.approx(GIB / 22.5e6)


def test_tree_wins_small_all_reduce_across_many_nodes(flat):
    c = make_cluster("h100", 512, "nvlink4+ib-ndr400")
    g = place_group(c, 64, 8)                      # k = 1, N = 64
    S = 2**20
    # ring: 2 x 63/64 x S / 45e9 s + (126 - 2) x 5 us; tree: 2 S / 45e9 s + (2 x log2 64 - 2) x 5 us
    ring = 2 * 63 / 64 * S / 45e6 + 124 * 5e-3
    tree = 2 * S / 45e6 + 10 * 5e-3
    assert tree < ring
    assert flat.placed_collective_ms("all_reduce", S, g) == pytest.approx(tree)
    # at 1 GiB the ring's smaller bandwidth factor wins
    assert flat.placed_collective_ms("all_reduce", GIB, g) == pytest.approx(2 * 63 / 64 * GIB / 45e6 + 124 * 5e-3)


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter"])
def test_latency_grows_with_group_size(flat, kind):
    # 1 KiB (latency-bound): the cost rises with every doubling of the nodes spanned, k = 1 and k = 2
    c = make_cluster("h100", 1024, "nvlink4+ib-ndr400")
    for stride in (8, 4):
        times = [flat.placed_collective_ms(kind, 1024, place_group(c, n, stride)) for n in (2, 4, 8, 16, 32, 64, 128)]
        assert all(b > a for a, b in zip(times, times[1:])), times


def test_cost_builder_uses_placements():
    # 70B on 16 H100 (2 nodes), tp 4 dp 4: the DP group has 2 members per node over 2 nodes, and the
    # end-of-step all-reduce of a 25 MiB bucket costs what placed_collective_ms says for that placement
    model = get_model("70b")
    c = make_cluster("h100", 16, "nvlink4+ib-ndr400")
    plan = Plan(tp_degree=4, dp_degree=4, pp_degree=1, micro_batch_size=1, num_micro_batches=1,
                zero_stage=0, bucket_size_mib=25)
    costs = CalibratedCosts(profile=default_calibration(), gpu=c.gpu)
    cb = CostBuilder(model=model, plan=plan, cluster=c, workload=Workload(seq_len=4096, global_batch_size=4),
                     costs=costs)
    assert (cb.dp_place.members_per_node, cb.dp_place.num_nodes) == (2, 2)
    assert (cb.tp_place.members_per_node, cb.tp_place.num_nodes) == (4, 1)
    buckets = cb.dp_bucket_ms(25 * 2**20 // 4 * 3)   # 3 buckets of 25 MiB of FP32 gradients
    one = costs.placed_collective_ms("all_reduce", 25 * 2**20, cb.dp_place)
    assert buckets == [pytest.approx(one)] * 3
    assert one < costs.collective_ms("all_reduce", 25 * 2**20, 4, cb.dp_link)   # NICs of 2 members
    assert math.isfinite(one) and one > 0
    # combinations of degrees never cross the node for a TP group that fits in it
    for t in (1, 2, 4, 8):
        assert not place_group(c, t, 1).spans_nodes


def test_nvl72_segments_follow_megatron_bridge_rule():
    # Megatron-Bridge scripts/performance/utils/executors.py: --segment = the largest divisor of the
    # 4-GPU host count that is <= 18 (hosts per NVL72 domain). By hand:
    #   256 GPUs = 64 trays; divisors of 64 <= 18: 1, 2, 4, 8, 16 -> 16 trays = 64 GPUs, 4 domains
    #   144 GPUs = 2 whole domains of 72;  100 GPUs = 25 trays -> 5 trays = 20 GPUs, 5 domains
    #   64 GPUs fit one domain (64 used)
    for n, used, domains in ((256, 64, 4), (144, 72, 2), (100, 20, 5), (64, 64, 1)):
        c = make_cluster("gb200", n, "nvlink5-nvl72+ib-ndr400")
        assert (c.nvlink_domain_size, c.num_nodes) == (used, domains), n
    # the Megatron-Bridge 25.11 GB200 405B run: tp 4 pp 16 dp 4 on 256 GPUs. DP members 0, 4, 8, 12
    # share domain 0 (ranks 0-63); the 16 stages are 16 ranks apart -> ranks 0, 16, ..., 240: 4 per
    # 64-GPU domain over 4 domains, so a PP pair crosses domains (k = 1, N = 2)
    c = make_cluster("gb200", 256, "nvlink5-nvl72+ib-ndr400")
    pl = plan_placements(c, tp_degree=4, cp_degree=1, dp_degree=4, pp_degree=16)
    assert (pl.tp.num_nodes, pl.dp.members_per_node, pl.dp.num_nodes) == (1, 4, 1)
    assert (pl.pp.members_per_node, pl.pp.num_nodes) == (1, 2)
    chain = place_group(c, 16, 16)
    assert (chain.members_per_node, chain.num_nodes) == (4, 4)


def test_nvl72_needs_whole_hosts_and_hgx_whole_nodes():
    with pytest.raises(ConfigError, match=r"--gpus 250 is not a whole number of 4-GPU hosts .* multiple of 4 "
                                          r"\(e\.g\. 248 or 252\)"):
        make_cluster("gb200", 250, "nvlink5-nvl72+ib-ndr400")
    with pytest.raises(ConfigError, match=r"--gpus 12 is not a whole number of 8-GPU nodes"):
        make_cluster("h100", 12, "nvlink4+ib-ndr400")


def test_fabric_file_gpus_per_host_is_validated(tmp_path):
    from autotune.spec.hardware import get_fabric

    f = tmp_path / "nvl.yaml"
    f.write_text("name: nvl\nintra_node: {bandwidth_gbs: 900, latency_us: 5, gpus_per_node: 72, gpus_per_host: 5}\n"
                 "inter_node: {bandwidth_gbs: 50, latency_us: 5}\n")
    with pytest.raises(ConfigError, match=r"gpus_per_host must be a positive integer dividing gpus_per_node \(72\), got 5"):
        get_fabric(str(f))
    f.write_text("name: nvl\nintra_node: {bandwidth_gbs: 900, latency_us: 5, gpus_per_node: 72, gpus_per_host: 4}\n"
                 "inter_node: {bandwidth_gbs: 50, latency_us: 5}\n")
    fab = get_fabric(str(f))
    assert fab.gpus_per_host == 4
    # the plan YAML's fabric mapping round-trips the host size
    from autotune.spec.hardware import fabric_from_dict

    assert fabric_from_dict(fab.to_dict()) == fab


def test_published_bench_predicts_every_shared_run():
    # bench/published.py over ../shared/reference/published-runs.yaml: every run the plan space
    # expresses is predicted (the GB200 256-GPU row needed the NVL72 segment rule above)
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    runs = root.parent / "shared" / "reference" / "published-runs.yaml"
    if not runs.is_file():
        pytest.skip(f"{runs} not present on this machine")
    r = subprocess.run([sys.executable, str(root / "bench" / "published.py")], capture_output=True, text=True,
                       cwd=root, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "not predicted:" not in r.stdout, r.stdout
    assert "megatron_bridge_25_11    405b   gb200" in r.stdout


def test_tp_that_does_not_divide_the_used_domain_warns():
    # 100 GB200 = 25 trays -> 5 domains of 20 GPUs (5 trays); tp 8 puts ranks 16-23 in one TP group
    # across domains 0 and 1, which the placement counts (2 domains) and validate_plan says
    from autotune.spec.plan import validate_plan

    c = make_cluster("gb200", 100, "nvlink5-nvl72+ib-ndr400")
    assert place_group(c, 8, 1).num_nodes == 2
    m = get_model("8b")
    plan = Plan(tp_degree=4, pp_degree=1, dp_degree=25, micro_batch_size=1, num_micro_batches=1)
    assert not any("does not divide" in w for w in validate_plan(plan, m, 100, Workload(seq_len=8192, global_batch_size=25),
                                                               gpus_per_node=c.gpus_per_node))
    plan = Plan(tp_degree=8, pp_degree=1, dp_degree=12, micro_batch_size=1, num_micro_batches=1)
    warns = validate_plan(plan, m, 96, Workload(seq_len=8192, global_batch_size=12), gpus_per_node=20)
    assert any("tp_degree=8 does not divide the 20 GPUs used per NVLink domain" in w for w in warns)


def test_cli_names_a_thin_nvl72_placement():
    # 76 GB200 = 19 trays (prime): the segment rule gives 19 domains of one 4-GPU tray; the target
    # line says so and warns; 256 GPUs (4 x 64) gets no warning
    from autotune.cli.options import segment_note as _segment_note

    thin = _segment_note(make_cluster("gb200", 76, "nvlink5-nvl72+ib-ndr400"))
    assert "19 NVLink domains of 4 of their 72 GPUs, 1 host each (Slurm --segment=1" in thin
    assert "warning: 19 hosts have no divisor between 10 and 18" in thin and "72 or 144 GPUs" in thin
    ok = _segment_note(make_cluster("gb200", 256, "nvlink5-nvl72+ib-ndr400"))
    assert "4 NVLink domains of 64" in ok and "16 hosts each" in ok and "warning" not in ok
    assert _segment_note(make_cluster("gb200", 144, "nvlink5-nvl72+ib-ndr400")) == ""
    assert _segment_note(make_cluster("h100", 64, "nvlink4+ib-ndr400")) == ""
