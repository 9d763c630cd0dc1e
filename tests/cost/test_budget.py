"""The training-budget arithmetic of ``autotune plan`` (autotune/cost/budget.py), every figure derived by hand."""

from __future__ import annotations

import math

import pytest

from autotune.cost.budget import (
    Budget,
    Constraints,
    band_multipliers,
    budget_for,
    check_fraction,
    co2_t_of,
    cost_usd_of,
    energy_mwh_of,
    gpu_hours_of,
    pareto_front,
    parse_per_gpu,
    parse_token_count,
    training_days,
)
from autotune.errors import ConfigError


def test_days_gpu_hours_energy_cost_by_hand():
    # 1e12 tokens at 1,000 tok/s/GPU on 100 GPUs with goodput 0.5: 1e12 / (1e3 x 100 x 0.5) = 2e7 s
    # = 2e7 / 86,400 = 231.481... days
    d = training_days(1e12, 1000.0, 100, 0.5)
    assert d == pytest.approx(2e7 / 86400, rel=1e-12)
    # GPU-hours = GPUs x days x 24 = 100 x 231.48 x 24 = 555,555.6 (= 2e7 s x 100 GPUs / 3,600)
    assert gpu_hours_of(100, d) == pytest.approx(2e9 / 3600, rel=1e-12)
    # energy = GPU-hours x W x PUE: 1,000 GPU-hours x 700 W x 1.2 = 840,000 Wh = 0.84 MWh
    assert energy_mwh_of(1000.0, 700.0, 1.2) == pytest.approx(0.84, rel=1e-12)
    # cost = GPU-hours x price: 1,000 x $2.50 = $2,500
    assert cost_usd_of(1000.0, 2.5) == pytest.approx(2500.0, rel=1e-12)
    # CO2 = 0.84 MWh = 840 kWh x 0.4 kg/kWh = 336 kg = 0.336 t
    assert co2_t_of(0.84, 0.4) == pytest.approx(0.336, rel=1e-12)


def test_budget_for_llama3_405b_figures():
    # 15.6e12 tokens at 160 tok/s/GPU on 16,384 H100 at goodput 0.9:
    # s = 15.6e12 / (160 x 16384 x 0.9) = 15.6e12 / 2,359,296 = 6,612,141.9 s = 76.529 days
    # GPU-hours = 16384 x 76.529 x 24; the GPUs cancel: 15.6e12 / (160 x 0.9 x 3,600) = 15.6e12 / 518,400
    # = 30,092,592.6; energy at 700 W, PUE 1: x 700 / 1e6 = 21,064.8 MWh; at $2/GPU-hour: $60,185,185;
    # CO2 at 0.5 kg/kWh: 21,064.8 MWh x 0.5 = 10,532.4 t
    b = budget_for(tokens=15.6e12, tokens_per_s_per_gpu=160.0, num_gpus=16384, goodput=0.9, watts_per_gpu=700.0,
                   pue=1.0, usd_per_gpu_hour=2.0, kg_co2_per_kwh=0.5, band=(0.9, 1.1))
    s = 15.6e12 / (160 * 16384 * 0.9)
    assert b.days == pytest.approx(s / 86400, rel=1e-12)
    assert b.gpu_hours == pytest.approx(16384 * b.days * 24, rel=1e-12)
    assert b.gpu_hours == pytest.approx(15.6e12 / 518_400, rel=1e-12)
    assert b.energy_mwh == pytest.approx(21_064.8, abs=0.05) and b.co2_t == pytest.approx(10_532.4, abs=0.05)
    assert b.cost_usd == pytest.approx(60_185_185, abs=1)
    assert b.energy_mwh == pytest.approx(b.gpu_hours * 700 * 1.0 / 1e6, rel=1e-12)
    assert b.cost_usd == pytest.approx(b.gpu_hours * 2.0, rel=1e-12)
    assert b.co2_t == pytest.approx(b.energy_mwh * 0.5, rel=1e-12)
    # the band's factors multiply days, GPU-hours and cost
    assert b.days_range == pytest.approx((0.9 * b.days, 1.1 * b.days))
    assert b.cost_range == pytest.approx((0.9 * b.cost_usd, 1.1 * b.cost_usd))


def test_absent_inputs_give_no_column():
    b = budget_for(tokens=1e9, tokens_per_s_per_gpu=1e4, num_gpus=8)
    assert b.cost_usd is None and b.energy_mwh is None and b.co2_t is None and b.days_range is None


def test_band_multipliers():
    # throughput band: predicted / measured - 1 = err, true days = predicted days x (1 + err): (1 - e, 1 + e)
    assert band_multipliers(0.1, "tokens/s per GPU") == pytest.approx((0.9, 1.1))
    # step-time band: true days = predicted / (1 + err): (1 / 1.1, 1 / 0.9)
    assert band_multipliers(0.1, "step time") == pytest.approx((1 / 1.1, 1 / 0.9))
    with pytest.raises(ConfigError):
        band_multipliers(1.0, "step time")


@pytest.mark.parametrize("text,tokens", [("15.6T", 15_600_000_000_000), ("800B", 800_000_000_000),
                                         ("2e12", 2_000_000_000_000), ("1000000", 1_000_000), ("1.5k", 1500),
                                         ("3G", 3_000_000_000), ("7M", 7_000_000)])
def test_parse_token_count(text, tokens):
    assert parse_token_count(text) == tokens


@pytest.mark.parametrize("text", ["0", "-5T", "abc", "0.0T", "1e30", "T", "nan", "inf", "0.4"])
def test_parse_token_count_refuses(text):
    with pytest.raises(ConfigError, match="--tokens"):
        parse_token_count(text)


def test_parse_per_gpu():
    known = ["h100", "b200", "gb200"]
    assert parse_per_gpu("h100=2.5,B200=6", "--usd-per-gpu-hour", known, allow_all=False) == {"h100": 2.5, "b200": 6.0}
    assert parse_per_gpu("700", "--watts-per-gpu", known) == {"h100": 700.0, "b200": 700.0, "gb200": 700.0}
    with pytest.raises(ConfigError, match="unknown GPU 'x9000'"):
        parse_per_gpu("x9000=3", "--usd-per-gpu-hour", known)
    with pytest.raises(ConfigError, match="must be a finite number >= 0"):
        parse_per_gpu("h100=-1", "--usd-per-gpu-hour", known)
    with pytest.raises(ConfigError, match="given twice"):
        parse_per_gpu("h100=1,h100=2", "--usd-per-gpu-hour", known)
    with pytest.raises(ConfigError, match="not a number"):
        parse_per_gpu("h100=cheap", "--usd-per-gpu-hour", known)
    with pytest.raises(ConfigError, match="expected GPU=VALUE"):
        parse_per_gpu("h100", "--usd-per-gpu-hour", known, allow_all=False)


def test_check_fraction():
    assert check_fraction(0.9, "--goodput") == 0.9
    for bad in (0.0, 1.5, -0.1, math.nan):
        with pytest.raises(ConfigError, match="--goodput"):
            check_fraction(bad, "--goodput")


def test_pareto_front():
    # (days, cost): (1, 10) and (2, 5) trade off; (3, 6) is beaten by (2, 5) in both; (1, 12) by (1, 10) in cost
    pts = [(1, 10), (2, 5), (3, 6), (1, 12), (4, 5)]
    # (4, 5) is dominated by (2, 5): equal cost, slower
    assert pareto_front(pts) == [0, 1]
    assert pareto_front([(1, 1), (1, 1)]) == [0, 1]      # ties both kept


def test_constraints_misses():
    b = Budget(days=50.0, gpu_hours=1e6, cost_usd=3e6)
    c = Constraints(days=40.0, usd=2e6, gpu_hours=2e6)
    # 50 - 40 = 10 days over; $3M - $2M = $1M over; GPU-hours within
    assert c.misses(b) == {"days": 10.0, "usd": 1e6}
    assert Constraints(usd=1.0).misses(Budget(days=1.0, gpu_hours=1.0)) == {"usd": math.inf}  # no price known
    assert not Constraints().given
