"""The prediction interval of autotune/spec/trust.py for mixture-of-experts models: the ``moe`` regime of the MoE
development set joins a dense plan's regimes, never the dense table; the MoE frontier; the bench's
leave-one-source-out coverage. Values derived by hand in the comments."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from autotune.spec import trust
from autotune.spec.plan import Plan

ROOT = Path(__file__).resolve().parents[2]

# a dense table: pooled 10th / 90th -5% / +5%, largest |r| 8%; fp8 has its own -2% / +4% (>= 9 rows)
DENSE = {"pooled": {"num_runs": 18, "low": -0.05, "high": 0.05, "max_abs": 0.08},
         "regimes": {"gpu:b200": {"num_runs": 9, "low": -0.03, "high": 0.02},
                     "precision:fp8": {"num_runs": 13, "low": -0.02, "high": 0.04}},
         "coverage": {"covered": 13, "rows": 18}}
# the MoE table: 9 rows of one regime, 10th / 90th by the exclusive rule at n = 9 = the smallest and the largest
MOE_R = [-0.067, -0.003, 0.007, 0.061, 0.138, 0.171, 0.463, 0.475, 0.694]
MOE = {**trust.regime_table([(r, ["moe"]) for r in MOE_R]), "coverage": {"covered": 7, "rows": 9}}


@pytest.fixture
def tables(monkeypatch):
    monkeypatch.setattr(trust, "interval_data", lambda: DENSE)
    monkeypatch.setattr(trust, "moe_interval_data", lambda: MOE)
    trust.conservative_factor.cache_clear()
    trust.max_conservative_factor.cache_clear()
    yield
    trust.conservative_factor.cache_clear()
    trust.max_conservative_factor.cache_clear()


def test_the_moe_regime_of_nine_rows_spans_its_smallest_and_largest_residual():
    # rank p (n + 1) = 0.1 x 10 = 1 and 0.9 x 10 = 9: the 1st and the 9th of the 9 sorted residuals
    e = MOE["regimes"]["moe"]
    assert e["num_runs"] == 9
    assert e["low"] == pytest.approx(-0.067) and e["high"] == pytest.approx(0.694)


def test_an_moe_plan_takes_the_union_of_its_dense_regimes_and_the_moe_regime(tables):
    plan = Plan(precision="fp8_tensorwise", dp_degree=8)
    dense = trust.interval_for(plan, "b200", 7168)
    # b200 (-3..+2%) and fp8 (-2..+4%): union -3..+4%
    assert (dense.low, dense.high) == pytest.approx((-0.03, 0.04))
    moe = trust.interval_for(plan, "b200", 7168, moe=True)
    # with the moe regime (-6.7..+69.4%): -6.7..+69.4%
    assert (moe.low, moe.high) == pytest.approx((-0.067, 0.694))
    assert ("moe", 9, "own") in moe.regimes and "mixture-of-experts models: 9 runs" in moe.basis()
    # the ranking factor 1 / (1 + high) and the largest factor an MoE plan can get (its high end is at least
    # the moe regime's): 1 / 1.694 both
    assert trust.conservative_factor(plan, "b200", 7168, True) == pytest.approx(1 / 1.694)
    assert trust.max_conservative_factor(True) == pytest.approx(1 / 1.694)
    # dense: the lowest high end of the pooled and own regimes, +2% (b200)
    assert trust.max_conservative_factor() == pytest.approx(1 / 1.02)
    assert trust.RankBasis(gpu="b200", hidden_size=7168, moe=True).factor(plan) == pytest.approx(1 / 1.694)


def test_the_moe_interval_sentence_states_the_moe_coverage(tables):
    plan = Plan(precision="fp8_tensorwise", dp_degree=8)
    text = trust.interval_sentence(trust.interval_for(plan, "b200", 7168, moe=True), mfu=0.39, tokens_per_s=3000.0,
                                   step_ms=20000.0)
    # MFU 39% / 1.694 = 23.0% .. 39% / 0.933 = 41.8%
    assert text.startswith("MFU 23.0-41.8%")
    assert "held 13 of 18" in text and "the MoE regime held 7 of 9 published MoE runs" in text
    dense = trust.interval_sentence(trust.interval_for(plan, "b200", 7168), mfu=0.39, tokens_per_s=3000.0,
                                    step_ms=20000.0)
    assert "MoE" not in dense


def test_the_trust_rows_of_an_moe_model_use_the_moe_interval_and_the_moe_frontier(tables, monkeypatch):
    from autotune.cost.evaluator import StepResult
    from autotune.report.summary import trust_rows
    from autotune.spec.models import get_builtin_model

    seen = []
    monkeypatch.setattr(trust, "frontier_sentence", lambda tf, gpu, prec, cls: seen.append(cls))
    m = get_builtin_model("qwen3-30b-a3b")
    r = StepResult(backend="simulated", feasible=True, step_time_ms=1000.0, mfu=0.2, mfu_palm=0.2, hfu=0.2,
                   tokens_per_s_per_gpu=1000.0, tflops_per_gpu=400.0, peak_memory_bytes=1)
    rows = dict(trust_rows(Plan(precision="fp8_tensorwise"), r, "b200", m))
    assert "mixture-of-experts models" in rows["80% interval"] and seen == ["moe"]


def test_the_bench_covers_each_source_with_the_interval_of_the_others():
    spec = importlib.util.spec_from_file_location("published_moe", ROOT / "bench" / "published_moe.py")
    pm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pm)
    assert pm.release("MB archive 26.04.01") == "26.04.01" and pm.release("MB performance-summary.md 26.08") == "26.08"
    assert pm.release("NVIDIA/Megatron-LM README") == "NVIDIA/Megatron-LM"
    rows = [{"id": f"a{i}", "source": "MB 26.04.01", "err": e} for i, e in enumerate((0.0, 0.1, 0.2))] + \
           [{"id": "b", "source": "MB 26.08", "err": 0.5}]
    mi = pm.moe_interval(rows)
    # 26.04.01 held out: the interval of the one 26.08 row (pooled of n = 1: +50..+50%) covers none of 0, 10, 20%;
    # 26.08 held out: 3 rows 0, .1, .2 pooled: rank 0.4 -> below the 1st, extrapolated 0 + (0.4 - 1)(0.1) = -6%;
    # rank 3.6 -> 0.2 + 0.6 x 0.1 = +26%: 50% is outside. 0 of 4
    assert (mi["covered"], mi["rows"]) == (0, 4)
    assert mi["per_source"] == {"26.04.01": {"covered": 0, "rows": 3}, "26.08": {"covered": 0, "rows": 1}}
