"""The FP8 scaling-rule check (bench/fp8_rule_check.py) and how the leave-one-source-out uses it."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def test_published_speedups_are_the_readme_figures():
    import fp8_rule_check as chk

    # torchao mx_formats README (commit 09f13255): 10417.0 / 8307.5 = 1.2539 (+25.4%), 8640.5 / 8307.5 = 1.0401
    # (+4.0%), 9969.0 / 8307.5 = 1.2000 (+20.0%), as the README's "Speedup over baseline" column says
    t = chk.TORCHAO_B200_8B
    assert t["fp8_tensorwise"] / t["bf16"] == pytest.approx(1.254, abs=5e-4)
    assert t["fp8_rowwise"] / t["bf16"] == pytest.approx(1.040, abs=5e-4)
    assert t["mxfp8"] / t["bf16"] == pytest.approx(1.200, abs=5e-4)


def test_rules_order_and_selection():
    import fp8_rule_check as chk
    from autotune.cost.calibration import default_calibration
    from autotune.cost.op_costs import CalibratedCosts
    from autotune.spec.hardware import get_gpu
    import autotune.cost.op_costs as oc

    # the alternative scales the B200's FP8 GEMMs by 1860 / (the H200 rowwise rate at 4096^3) = 1.38, the shipped
    # rule by the BF16 8192^3 ratio (1420 / the H200 BF16 rate there) x (4500/2250) / (1979/989) = 1.84: so the
    # alternative's FP8 GEMMs are slower and its FP8 speedup must be the smaller one; BF16 is rule-independent
    scales = {}
    for rule in oc.FP8_SCALE_RULES:
        saved = oc.FP8_SCALE_RULE
        oc.FP8_SCALE_RULE = rule
        try:
            scales[rule] = CalibratedCosts(profile=default_calibration(), gpu=get_gpu("b200")).fp8_scale
        finally:
            oc.FP8_SCALE_RULE = saved
    assert scales["fp8_reference"] < scales["bf16_reference"]
    a, b = chk.predicted_speedups("bf16_reference"), chk.predicted_speedups("fp8_reference")
    assert a["bf16"] == pytest.approx(b["bf16"], rel=1e-12)
    assert a["fp8_tensorwise"] > b["fp8_tensorwise"]
    assert oc.FP8_SCALE_RULE == "bf16_reference"          # predicted_speedups restores the shipped rule
    # the selection is the rule with the smaller |predicted - published| tensorwise speedup
    pub = chk.TORCHAO_B200_8B["fp8_tensorwise"] / chk.TORCHAO_B200_8B["bf16"]
    gaps = {r: abs(p["fp8_tensorwise"] / p["bf16"] - pub) for r, p in (("bf16_reference", a), ("fp8_reference", b))}
    rule, text = chk.selected_rule()
    assert rule == min(gaps, key=gaps.get) and f"selected by the tensorwise speedup: {rule}" in text
