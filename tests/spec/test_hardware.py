"""GPU and fabric catalogs, custom fabric files, cluster checks."""

import pytest

from autotune.errors import ConfigError
from autotune.spec.hardware import get_fabric, get_gpu, make_cluster


def test_gpus():
    assert get_gpu("H100").bf16_tflops == 989
    assert get_gpu("b200").bf16_tflops == 2250
    with pytest.raises(ConfigError, match="a100-80gb, h100, h200, b200, gb200"):
        get_gpu("mi300x")


def test_fabric_presets():
    f = get_fabric("nvlink4+ib-ndr400")
    assert f.intra_node.bandwidth_gbs == 450 and f.inter_node.bandwidth_gbs == 50 and f.gpus_per_node == 8
    with pytest.raises(ConfigError, match="known: nvlink5"):
        get_fabric("nvlink9+ib-ndr400")
    with pytest.raises(ConfigError, match="ib-xdr800"):
        get_fabric("nvlink4+ib-foo")


def test_fabric_file(tmp_path):
    p = tmp_path / "f.yaml"
    p.write_text("name: lab\nintra_node: {bandwidth_gbs: 100, latency_us: 3, gpus_per_node: 4}\n"
                 "inter_node: {bandwidth_gbs: 25}\n")
    f = get_fabric(str(p))
    assert f.name == "lab" and f.gpus_per_node == 4 and f.inter_node.bandwidth_gbs == 25
    p.write_text("name: lab\nintra_node: {latency_us: 3, gpus_per_node: 4}\n")
    with pytest.raises(ConfigError, match="bandwidth_gbs"):
        get_fabric(str(p))


def test_cluster_checks():
    assert make_cluster("b200", 1024, "nvlink5+ib-ndr400").num_nodes == 128
    with pytest.raises(ConfigError, match="whole number of 8-GPU nodes"):
        make_cluster("h100", 12, "nvlink4+ib-ndr400")
    with pytest.raises(ConfigError, match="no inter-node tier"):
        make_cluster("h100", 16, "nvlink4")


def test_shipped_measured_fabrics():
    # autotune profile measured these tiers on 2x H200 (autotune/profiling/fabrics/); usable by name
    f = get_fabric("h200-sockets")
    assert f.intra_node.calibration_tier == "sockets" and f.gpus_per_node == 2 and f.inter_node is None


def test_every_interconnect_suggestion_is_itself_accepted():
    # exhaustive over GPUs x single-tier fabrics (intra presets alone and the shipped measured tiers)
    # x GPU counts that need an inter-node tier or are not whole nodes: whatever the error suggests
    # ("e.g. A or B" interconnects / GPU counts) must build a cluster (the QA pass found h200-host
    # suggesting 'h200-host-intra+ib-ndr400', itself rejected as an unknown intra-node fabric)
    import re

    from autotune.errors import ConfigError
    from autotune.spec.hardware import get_fabric, known_fabrics, known_gpus, make_cluster, shipped_measured_fabrics

    intra, inter = known_fabrics()
    fabrics = intra + shipped_measured_fabrics() + [f"{a}+{inter[0]}" for a in intra]
    checked = 0
    for gpu in known_gpus():
        for fab in fabrics:
            for n in (7, 12, 16, 76, 100, 1024):
                try:
                    make_cluster(gpu, n, fab)
                    continue
                except ConfigError as e:
                    msg = str(e)
                m = re.search(r"e\.g\. ([\w.+-]+)\+([\w.-]+)", msg)
                if m and "inter-node tier" in msg:
                    sug = get_fabric(f"{m.group(1)}+{m.group(2)}")    # raises if the suggestion is bad
                    assert sug.inter_node is not None
                    if n % sug.gpus_per_node == 0:
                        make_cluster(gpu, n, sug.name)                  # whole nodes: the cluster builds
                    checked += 1
                m = re.search(r"\(e\.g\. (\d+) or (\d+)\)", msg)
                if m:
                    for k in map(int, m.groups()):
                        try:
                            make_cluster(gpu, k, fab)
                        except ConfigError as e2:
                            # a suggested count may still need an inter-node tier: that error must then
                            # suggest a valid fabric (checked above for the same shape), not a bad count
                            assert "inter-node tier" in str(e2), (gpu, fab, n, k, str(e2))
                        checked += 1
    assert checked > 50, checked
