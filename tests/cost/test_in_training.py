"""In-training kernel factors (calibration ``in_training``; autotune.cost.calibration.InTrainingCosts)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from autotune.cost.op_costs import CalibratedCosts, InTrainingCosts
from autotune.cost.calibration import CalibrationProfile, default_calibration
from autotune.errors import ConfigError
from autotune.spec.hardware import get_gpu

ROOT = Path(__file__).resolve().parents[2]


def _costs(**in_training):
    d = dict(default_calibration().raw)
    d["in_training"] = in_training
    return CalibratedCosts(profile=CalibrationProfile.from_dict(d), gpu=get_gpu("h200"))


def test_unknown_or_nonpositive_factor_is_refused():
    d = dict(default_calibration().raw, in_training={"gemm_fast": 1.0})
    with pytest.raises(ConfigError, match="in_training.gemm_fast unknown; valid: gemm_eager"):
        CalibrationProfile.from_dict(d)
    with pytest.raises(ConfigError, match="in_training"):
        CalibrationProfile.from_dict(dict(default_calibration().raw, in_training={"gemm_eager": 0}))


def test_factors_scale_their_category_and_mode_only():
    base = _costs()
    c = _costs(gemm_eager=1.5, gemm_compiled=2.0, attention_eager=3.0, memory_bound_eager=4.0,
               memory_bound_compiled=5.0)
    eager, comp = InTrainingCosts(costs=c, compiled=False), InTrainingCosts(costs=c, compiled=True)
    assert eager.gemm_ms(8192, 4096, 4096) == pytest.approx(1.5 * base.gemm_ms(8192, 4096, 4096))
    assert comp.gemm_ms(8192, 4096, 4096) == pytest.approx(2.0 * base.gemm_ms(8192, 4096, 4096))
    kw = dict(batch=1, seq_len=8192, heads=32, kv_heads=8, head_dim=128)
    assert eager.attention_ms(**kw) == pytest.approx(3.0 * base.attention_ms(**kw))
    assert comp.attention_ms(**kw) == pytest.approx(base.attention_ms(**kw))     # absent key: 1.0
    # eager memory-bound kernels take the eager factor in both modes, compiled-table ones the compiled one
    assert comp.memory_bound_ms(1e9, "rmsnorm") == pytest.approx(4.0 * base.memory_bound_ms(1e9, "rmsnorm"))
    assert comp.memory_bound_compiled_ms(1e9, "rmsnorm") == pytest.approx(
        5.0 * base.memory_bound_compiled_ms(1e9, "rmsnorm"))
    # the optimizer step and FP8 casts are not scaled
    assert eager.memory_bound_ms(1e9, "adamw") == base.memory_bound_ms(1e9, "adamw")
    assert eager.quantize_ms(1e9, "fp8_tensorwise") == base.quantize_ms(1e9, "fp8_tensorwise")
    assert eager.in_training_factor("gemm", compiled=False) == 1.0                # not applied twice


def test_shipped_factors_are_the_derivation_of_the_committed_profiles(capsys, monkeypatch):
    # bench/derive_in_training.py over docs/results/profile-plans-h200x1-2026-12-01.json must give the
    # factors stored in the shipped profile (ratio of sums of measured over modelled kernel ms)
    spec = importlib.util.spec_from_file_location("derive_in_training", ROOT / "bench" / "derive_in_training.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr("sys.argv", ["derive_in_training.py"])
    assert mod.main() == 0
    out = capsys.readouterr().out
    shipped = default_calibration().in_training
    assert set(shipped) == {"gemm_eager", "gemm_compiled", "attention_eager", "attention_compiled",
                            "memory_bound_eager", "memory_bound_compiled"}
    for k, v in shipped.items():
        assert f"{k:24s} {v:.3f}" in out
    # the profiled steps: eager memory-bound kernels took > 1.5x their stand-alone time (by hand from the
    # JSON: bf16 eager none mbs2 cast_copy 124.1 + elementwise 71.3 + reduction 9.4 + other 9.8 +
    # cross_entropy 16.3 = 230.9 ms against 142.4 ms modelled)
    d = json.loads((ROOT / "docs" / "results" / "profile-plans-h200x1-2026-12-01.json").read_text())
    cats = d["plans"]["bf16_compile-false_rc-none_mbs-2"]["profile"]["by_category"]
    assert sum(cats[k] for k in mod.MEMORY_CATEGORIES) == pytest.approx(230.9, abs=0.2)
    assert shipped["memory_bound_eager"] > 1.5
