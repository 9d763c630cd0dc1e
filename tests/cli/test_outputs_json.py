"""``--json`` on run, simulate, show, export and retune: one versioned schema (docs/json-schema.md)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from autotune.cli.app import main

ENTRY_KEYS = {"label", "study", "trial", "target", "engine", "plan", "prediction", "breakdown_ms",
              "memory_per_stage", "error_band", "provenance"}


def _json(args):
    r = CliRunner(mix_stderr=False).invoke(main, args) if "mix_stderr" in CliRunner.__init__.__code__.co_varnames \
        else CliRunner().invoke(main, args)
    assert r.exit_code == 0, (r.output, getattr(r, "stderr", ""))
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('json')}/s.db"


@pytest.fixture(scope="module")
def run_doc(storage):
    return _json(["run", "--size", "8b", "--space", "small", "--trials", "6", "--storage", storage, "--json"])


def _check_entry(e, *, feasible=True):
    assert set(e) >= ENTRY_KEYS
    assert e["target"]["model"] == "llama3.1-8b" and e["target"]["num_gpus"] == 8
    p = e["prediction"]
    if not feasible:
        return
    # MFU by hand: 51.47 GFLOP per token for Llama 3.1 8B at seq 8192 (causal; README "MFU convention"),
    # 2^20 tokens per step, 8 B200s at 2250 dense BF16 TFLOP/s (autotune/data/gpus.yaml, datasheet)
    mfu = 51.47e9 * 2**20 / (p["step_time_ms"] / 1e3 * 8 * 2250e12)
    assert p["mfu"] == pytest.approx(mfu, rel=2e-4)
    # the simulator's breakdown of a stage splits the step time: its parts add up to it
    assert sum(e["breakdown_ms"].values()) == pytest.approx(p["step_time_ms"], rel=1e-9)
    # each stage's total is the sum of its memory components (StageMemory.total_bytes)
    for st in e["memory_per_stage"]:
        parts = sum(v for k, v in st.items() if k not in ("stage", "total_bytes"))
        assert parts == st["total_bytes"]
    assert max(st["total_bytes"] for st in e["memory_per_stage"]) == p["peak_memory_bytes"]
    assert len(e["memory_per_stage"]) == e["plan"]["pp_degree"]
    assert e["provenance"]["label"].startswith("simulated with")


def test_run_json(run_doc):
    d = run_doc
    assert d["schema"] == "autotune.result" and d["schema_version"] == 1 and d["command"] == "run"
    assert d["trials"]["new"] == 6 and len(d["results"]) == 1
    _check_entry(d["results"][0])


def test_export_and_simulate_json_agree(run_doc, storage, tmp_path):
    out = tmp_path / "p.yaml"
    d = _json(["export", "--size", "8b", "--space", "small", "--storage", storage, "-o", str(out), "--json"])
    assert d["command"] == "export" and d["plan_file"] == str(out)
    e = d["results"][0]
    _check_entry(e)
    assert e["plan"] == run_doc["results"][0]["plan"]
    s = _json(["simulate", str(out), "--json"])
    es = s["results"][0]
    _check_entry(es)
    assert es["stored_prediction_holds"] is True
    assert es["prediction"]["step_time_ms"] == pytest.approx(e["prediction"]["step_time_ms"], rel=1e-9)
    assert es["memory_per_stage"] == e["memory_per_stage"]


def test_show_json(run_doc, storage):
    d = _json(["show", "--storage", storage, "--json"])
    assert d["command"] == "show" and d["storage"] == storage
    (e,) = d["results"]
    assert e["n_trials"] == 6 and e["study"] == run_doc["results"][0]["study"]
    _check_entry(e)


def test_retune_json(tmp_path):
    url = f"sqlite:///{tmp_path}/r.db"
    d = _json(["retune", "--size", "8b", "--space", "small", "--interconnect", "pcie5+eth100", "--trials", "4",
               "--storage", url, "--json"])
    labels = [e["label"] for e in d["results"]]
    assert labels == ["fast_best", "fast_plan_on_slow", "slow_best"]
    fast, same, slow = d["results"]
    assert same["plan"] == fast["plan"] and same["target"]["fabric"] == "pcie5+eth100"
    assert d["mfu_lost"] == pytest.approx(fast["prediction"]["mfu"] - slow["prediction"]["mfu"], rel=1e-12)
    for e in d["results"]:
        _check_entry(e)


def test_provenance_label_of_the_measured_backend_says_what_was_used():
    # MeasuredCosts with no stored environment (no GPU, empty store) costs every op by its fallback
    # profile (profiling/measured.py: label "no measurements for <gpu>; <fallback>"): the label must not
    # read as if something was measured
    from autotune.cost.evaluator import StepResult
    from autotune.report.summary import provenance_label

    base = dict(feasible=True, step_time_ms=1.0, mfu=0.5, mfu_palm=0.6, hfu=0.5, tokens_per_s_per_gpu=1.0,
                tflops_per_gpu=1.0, peak_memory_bytes=1, memory_per_stage_bytes=(1,), breakdown_ms={})
    nothing = StepResult(backend="measured", **base, details={
        "costs": {"label": "no measurements for h200; h200-2026-12-01", "measured": False,
                  "calibration_gpu": "h200", "fallback": "h200-2026-12-01"},
        "op_sources": {"measured": 0, "looked_up": 0, "interpolated": 0, "fallback": 12}})
    lab = provenance_label(nothing)
    assert lab == ("measured backend, but nothing was measured: no stored measurements for h200; every op from "
                   "h200-2026-12-01, as simulated"), lab
    some = StepResult(backend="measured", **base, details={
        "costs": {"label": "measured NVIDIA H200 x2 2026-11-30", "measured": True},
        "op_sources": {"measured": 0, "looked_up": 3, "interpolated": 1, "fallback": 0}})
    assert provenance_label(some) == ("measured backend: measured NVIDIA H200 x2 2026-11-30; this plan's ops: "
                                      "0 measured, 3 looked up, 1 interpolated, 0 fallback")
