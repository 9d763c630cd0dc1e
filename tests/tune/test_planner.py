"""The sweep of ``autotune plan`` (autotune/tune/planner.py): default counts, warm start, reuse."""

from __future__ import annotations

import optuna
import pytest

from autotune.errors import ConfigError
from autotune.spec.models import get_model
from autotune.spec.plan import Workload
from autotune.tune.planner import default_counts, prediction_band, sweep


def test_default_counts_by_hand():
    # 405B: 405.85e9 parameters x 16 bytes = 6.49e12 bytes; an H100 has 79.6 - 1.0 = 78.6 GiB usable
    # (gpus.yaml) = 8.44e10 bytes -> 76.9 GPUs -> the first power-of-two multiple of 8 at or above it: 128
    assert default_counts(get_model("405b"), "h100", 1024) == [128, 256, 512, 1024]
    # 8B: 8.03e9 x 16 = 1.28e11 bytes / 8.44e10 = 1.5 GPUs -> one node, 8
    assert default_counts(get_model("8b"), "h100", 64) == [8, 16, 32, 64]
    with pytest.raises(ConfigError, match="--max-gpus 64: llama3.1-405b needs at least 128"):
        default_counts(get_model("405b"), "h100", 64)


def test_prediction_band_from_error_bands_yaml():
    # megatron on H100: 9.4% mean absolute error of tokens/s (autotune/data/error_bands.yaml by_gpu h100)
    (lo, hi), text = prediction_band("megatron", "h100")
    assert (lo, hi) == pytest.approx((0.906, 1.094)) and "9.4%" in text
    # native: a step-time band of 5.8% -> (1 / 1.058, 1 / 0.942)
    (lo, hi), _ = prediction_band("native", "h200")
    assert (lo, hi) == pytest.approx((1 / 1.058, 1 / 0.942))


def test_sweep_warm_starts_the_next_count_and_reuses(tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    model, wl = get_model("8b"), Workload.from_tokens(seq_len=8192, global_batch_tokens=2**20)
    pts = sweep(model=model, workload=wl, counts={"h200": [16, 8]}, storage=storage, space="small", trials=6)
    assert [(p.gpu, p.num_gpus) for p in pts] == [("h200", 8), ("h200", 16)]     # smallest first
    assert all(p.plan is not None and p.error is None for p in pts)
    assert pts[0].warm_started == 0 and pts[1].warm_started >= 1
    st = optuna.load_study(study_name=pts[1].study, storage=storage)
    sources = {t.user_attrs.get("warm_start_from", "").split("#")[0] for t in st.get_trials(deepcopy=False)}
    assert pts[0].study in sources          # the 16-GPU study was seeded from the 8-GPU one
    again = sweep(model=model, workload=wl, counts={"h200": [8, 16]}, storage=storage, space="small", trials=6)
    assert all(p.reused and p.n_new_trials == 0 for p in again)
    assert [p.plan for p in again] == [p.plan for p in pts]


def test_invalid_count_is_a_point_not_an_error(tmp_path):
    model, wl = get_model("8b"), Workload.from_tokens(seq_len=8192, global_batch_tokens=2**20)
    pts = sweep(model=model, workload=wl, counts={"h200": [12]}, storage=f"sqlite:///{tmp_path}/s.db",
                space="small", trials=3)
    assert pts[0].plan is None and "not a whole number of 8-GPU nodes" in pts[0].error


def test_workers_give_the_serial_results(tmp_path):
    # two GPU types in two forked processes: the same studies, so the same plans and predictions as one process
    model, wl = get_model("8b"), Workload.from_tokens(seq_len=8192, global_batch_tokens=2**20)
    kw = dict(model=model, workload=wl, counts={"h200": [8, 16], "h100": [8]}, space="small", trials=5)
    serial = sweep(storage=f"sqlite:///{tmp_path}/a.db", **kw)
    seen = []
    par = sweep(storage=f"sqlite:///{tmp_path}/b.db", workers=2, progress=seen.append, **kw)
    assert [(p.gpu, p.num_gpus) for p in par] == [("h200", 8), ("h200", 16), ("h100", 8)]
    assert [(p.plan, p.result.step_time_ms, p.study) for p in par] == \
        [(p.plan, p.result.step_time_ms, p.study) for p in serial]
    assert len(seen) == 3
