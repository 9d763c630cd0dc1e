"""GB200 kernel rates from B200's at the power limit (GPUSpec.sustained_clock_ratio). Expected values are
computed by hand from the datasheet TDPs and peaks in autotune/data/gpus.yaml."""

from __future__ import annotations

import pytest

from autotune.cost.calibration import default_calibration
from autotune.cost.op_costs import CalibratedCosts
from autotune.spec.hardware import get_gpu


def test_gb200_over_b200_is_the_cube_root_of_the_power_ratio():
    gb200, b200 = get_gpu("gb200"), get_gpu("b200")
    # 1200 W / 1000 W: 1.2 ** (1/3) = 1.06266, below the datasheet peak ratio 2500 / 2250 = 1.1111
    assert gb200.sustained_clock_ratio(b200) == pytest.approx(1.062659, rel=1e-6)
    assert gb200.sustained_bf16_tflops == pytest.approx(2250 * 1.062659, rel=1e-6)
    # the MFU denominator stays the datasheet peak
    assert gb200.bf16_tflops == 2500
    # the B200 reference (8192^3 BF16, 1420 TFLOP/s) carried over at that ratio: 1508.98
    assert gb200.gemm_reference("bf16")[3] == pytest.approx(1420 * 1.062659, rel=1e-6)


def test_without_tdp_or_other_silicon_the_peak_ratio_holds():
    # B300 states no TDP in the catalog: its peak ratio to B200 (2250 / 2250 = 1)
    b300, b200, h100 = get_gpu("b300"), get_gpu("b200"), get_gpu("h100")
    assert b300.sustained_clock_ratio(b200) == pytest.approx(1.0)
    # another architecture and SM count: the datasheet ratio 2250 / 989
    assert b200.sustained_clock_ratio(h100) == pytest.approx(2250 / 989)
    # a GPU that takes no other GPU's references keeps its datasheet peak
    assert h100.sustained_bf16_tflops == 989


def test_attention_scales_by_the_sustained_rate():
    prof = default_calibration()
    gb, b = CalibratedCosts(profile=prof, gpu=get_gpu("gb200")), CalibratedCosts(profile=prof, gpu=get_gpu("b200"))
    kw = dict(batch=1, seq_len=8192, heads=32, kv_heads=8, head_dim=128)
    # the same profile row, a rate 1.062659 times B200's (not 2500 / 2250)
    assert b.attention_ms(**kw) / gb.attention_ms(**kw) == pytest.approx(1.062659, rel=1e-5)
    assert b.gemm_ms(8192, 8192, 8192) / gb.gemm_ms(8192, 8192, 8192) == pytest.approx(1.062659, rel=1e-5)
