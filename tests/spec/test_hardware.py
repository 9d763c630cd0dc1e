"""GPU and fabric catalogs, custom fabric files, cluster checks."""

import pytest

from autotune.errors import ConfigError
from autotune.spec.hardware import get_fabric, get_gpu, make_cluster


def test_gpus():
    assert get_gpu("H100").bf16_tflops == 989
    assert get_gpu("b200").bf16_tflops == 2250
    with pytest.raises(ConfigError, match="a100-80gb, h100, h800, h200, b200, b300, gb200, gb300"):
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


def test_datasheet_gpus_b300_gb300_h800():
    # issue 38: datasheet entries, unmeasured. Dense peaks = the spec tables' sparse figures / 2 per GPU:
    # HGX B300 36 PF BF16 / 72 PF FP8 over 8 GPUs -> 2250 / 4500; GB300 NVL72 360 / 720 PF over 72 -> 2500 / 5000;
    # H800 SXM 1,979 / 3,958 TF sparse -> 989 / 1979. Memory bandwidth 8 TB/s (64 TB/s / 8, 576 TB/s / 72), 3.35 TB/s.
    from autotune.spec.hardware import get_gpu, make_cluster
    b300, gb300, h800 = get_gpu("b300"), get_gpu("gb300"), get_gpu("h800")
    assert (b300.bf16_tflops, b300.fp8_tflops, b300.hbm_bandwidth_gbs) == (2250, 4500, 8000)
    assert (gb300.bf16_tflops, gb300.fp8_tflops, gb300.hbm_bandwidth_gbs) == (2500, 5000, 8000)
    assert (h800.bf16_tflops, h800.fp8_tflops, h800.hbm_bandwidth_gbs) == (989, 1979, 3350)
    # 288 GB HBM3e: more than B200's 179 GiB, below 288 GiB (the driver keeps some; B200 reports 179.0 of 192)
    assert get_gpu("b200").hbm_gib < b300.hbm_gib < 288 and b300.supports_mxfp8 and h800.supports_fp8
    # NVLink domains: HGX B300 8 GPUs at 900 GB/s per direction, GB300 NVL72 72, H800 400 GB/s bidirectional
    assert make_cluster("b300", 16, None).fabric.intra_node.gpus_per_node == 8
    assert make_cluster("gb300", 144, None).fabric.intra_node.gpus_per_node == 72
    assert make_cluster("h800", 16, None).fabric.intra_node.bandwidth_gbs == 200
    # unmeasured Blackwell Ultra kernel rates: B200's published GEMM references scaled by the dense peaks
    # (1420 TFLOP/s x 2250 / 2250 for B300, x 2500 / 2250 for GB300, as for GB200)
    assert b300.gemm_reference("bf16") == (8192.0, 8192.0, 8192.0, 1420.0)
    assert gb300.gemm_reference("bf16")[3] == pytest.approx(1420 * 2500 / 2250)
