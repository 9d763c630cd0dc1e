"""`autotune profile` without a GPU, the fabric files and the summary table (CPU)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from autotune.errors import ConfigError, NoGPUError
from autotune.spec.hardware import get_fabric
from autotune.cli import profile as C
from autotune.profiling.measure import NO_GPU_MESSAGE, cuda_available

no_gpu_only = pytest.mark.skipif(cuda_available(), reason="checks the no-GPU path")


@no_gpu_only
def test_profile_without_gpu_exits_2_with_message(tmp_path):
    db = tmp_path / "sub" / "a.db"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run([sys.executable, "-m", "autotune.cli.profile", "--quick", "--export",
                        str(tmp_path / "out.yaml"), "--storage", f"sqlite:///{db}"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2
    assert NO_GPU_MESSAGE in p.stderr
    assert "Traceback" not in p.stderr
    assert not db.exists() and not (tmp_path / "out.yaml").exists()  # nothing opened or written


@no_gpu_only
def test_click_command_raises_no_gpu_error_for_the_main_cli():
    r = CliRunner().invoke(C.profile, ["--quick"])
    assert r.exit_code != 0
    assert isinstance(r.exception, NoGPUError) and str(r.exception) == NO_GPU_MESSAGE


def test_modules_do_not_import_torch_at_import_time():
    code = ("import sys; import autotune.cli.profile, autotune.profiling.measured, autotune.profiling.measure, "
            "autotune.profiling.nccl_bench, autotune.profiling.store, autotune.profiling.shapes; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_parse_tiers():
    assert C._parse_tiers("nvlink, sockets") == ["nvlink", "sockets"]
    with pytest.raises(ConfigError, match="unknown tier.*infiniband"):
        C._parse_tiers("nvlink,infiniband")


def test_fabric_files_parse_as_interconnect(populated, tmp_path):
    s, env = populated
    paths = C.write_fabrics(s, env, [tmp_path / "fabrics"])
    assert sorted(os.path.basename(p) for p in paths) == ["h200-host.yaml", "h200-nvlink.yaml"]
    nv = get_fabric(str(tmp_path / "fabrics" / "h200-nvlink.yaml"))
    assert nv.name == "h200-nvlink" and nv.inter_node is None
    assert nv.intra_node.bandwidth_gbs == 450 and nv.intra_node.gpus_per_node == 2
    assert nv.intra_node.calibration_tier == "nvlink"
    # latency: the smallest send/recv, 1 MiB at 16 GB/s = 65.536 us
    assert nv.intra_node.latency_us == pytest.approx(65.54)
    host = get_fabric(str(tmp_path / "fabrics" / "h200-host.yaml"))
    assert host.intra_node.calibration_tier == "host" and host.intra_node.bandwidth_gbs == 63
    assert C.fabric_dict(s, env, "sockets") is None


def test_summary_table_percentages(populated):
    s, env = populated
    rows = {r[0]: r[1:] for r in C.summary_rows(s, env)}
    # fwd TFLOP/s of the two stored shapes: 2^31/1e9 = 2.147 and 2^32/1.5e9 = 2.863; median 2.505
    med = rows["GEMM median of 2 Llama shapes fwd"]
    assert med[0] == pytest.approx((2**31 / 1e9 + 2**32 / 1.5e9) / 2) and med[1] == 989
    assert rows["HBM copy GB/s (read+write)"] == (4000.0, 4800, 4250)
    ar = rows["NCCL nvlink all_reduce g=2 1024 MiB busbw GB/s"]
    assert ar[0] == 331.0 and ar[1] == 450 and ar[2] == pytest.approx(331.0)
    text = C.format_summary(C.summary_rows(s, env), gpu_name="NVIDIA H200")
    line = next(ln for ln in text.splitlines() if ln.startswith("HBM copy"))
    assert "83%" in line and "94%" in line  # 4000/4800, 4000/4250
    line = next(ln for ln in text.splitlines() if ln.startswith("NCCL nvlink all_reduce"))
    assert "74%" in line and "100%" in line  # 331/450, 331/331
