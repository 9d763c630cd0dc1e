"""Study plots (autotune plot) and the attributes optuna-dashboard reads (metric name, constraints,
infeasible trials), checked through optuna-dashboard's own WSGI app when it is installed."""

from __future__ import annotations

import io
import json
import sys

import optuna
import pytest
from click.testing import CliRunner

from autotune.cli.app import main
from autotune.study.trials import MEMORY_CONSTRAINT
from autotune.study.identity import load_study


@pytest.fixture(scope="module")
def study_url(tmp_path_factory):
    # 8B on 2 H200s with a 256-sequence batch: the small space has plans that do not fit (ZeRO-0 with
    # large micro-batches) and plans that do, so both kinds of trial are in the study
    url = f"sqlite:///{tmp_path_factory.mktemp('plots')}/s.db"
    r = CliRunner().invoke(main, ["run", "--size", "8b", "--gpu", "h200", "--gpus", "2", "--space", "small",
                                  "--trials", "30", "--storage", url, "--global-batch", "2M"])
    assert r.exit_code == 0, r.output
    # `run`'s layout sampler proposes only plans that fit (issue 26: not even its random fallback draws one
    # the memory screen rejects), so the plans that do not fit come from TPE trials added to the same study
    from autotune.spec.hardware import make_cluster
    from autotune.spec.models import get_model
    from autotune.spec.plan import Workload
    from autotune.tune.tuner import Tuner

    t = Tuner(model=get_model("8b"), cluster=make_cluster("h200", 2), space="small", storage=url, sampler="tpe",
              workload=Workload.from_tokens(seq_len=8192, global_batch_tokens=2 * 2**20))
    t.optimize(30, show_progress_bar=False)
    assert len(optuna.get_all_study_names(url)) == 1        # the same study
    return url


def _study(url):
    (name,) = optuna.get_all_study_names(url)
    return load_study(name, url)[0]


def test_study_attributes_for_the_dashboard(study_url):
    st = _study(study_url)
    assert st.metric_names == ["MFU (causal)"]
    trials = [t for t in st.get_trials() if t.state == optuna.trial.TrialState.COMPLETE]
    oom = [t for t in trials if t.user_attrs["outcome"] == "out_of_memory"]
    ok = [t for t in trials if t.user_attrs["outcome"] == "feasible"]
    assert oom and ok, "the fixture should produce both kinds"
    for t in trials:
        # the list form optuna-dashboard 0.21 reads (system attr "constraints") carries the same value
        # as the named Optuna 5 constraint: > 0 exactly for the out-of-memory trials
        assert t.system_attrs["constraints"] == [t.constraints[MEMORY_CONSTRAINT]]
        assert (t.system_attrs["constraints"][0] > 0) == (t.user_attrs["outcome"] == "out_of_memory")
        assert (t.user_attrs["feasible"] is True) == (t.user_attrs["outcome"] == "feasible")


def _wsgi_get(app, path, query=""):
    from wsgiref.util import setup_testing_defaults
    env = {"PATH_INFO": path, "QUERY_STRING": query, "REQUEST_METHOD": "GET", "wsgi.input": io.BytesIO(b""),
           "wsgi.errors": sys.stderr}
    setup_testing_defaults(env)
    status = {}

    def start_response(s, headers, exc_info=None):
        status["s"] = s
    body = b"".join(app(env, start_response))
    assert status["s"].startswith("200"), (status, body[:300])
    return json.loads(body)


def test_dashboard_api_shows_metric_and_constraints(study_url):
    dash = pytest.importorskip("optuna_dashboard", reason="optuna-dashboard not installed")
    st = _study(study_url)
    app = dash.wsgi(optuna.storages.RDBStorage(study_url))
    detail = _wsgi_get(app, f"/api/studies/{st._study_id}", "after=0")
    assert detail["objective_names"] == ["MFU (causal)"]
    trials = {t["number"]: t for t in detail["trials"]}
    for t in st.get_trials():
        if t.state != optuna.trial.TrialState.COMPLETE:
            continue
        d = trials[t.number]
        assert d["constraints"] == [t.constraints[MEMORY_CONSTRAINT]]
        ua = {a["key"]: a["value"] for a in d["user_attrs"]}
        assert ua["outcome"] == t.user_attrs["outcome"]


def test_plot_writes_the_four_plots(study_url, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib (autotune[plot]) not installed")
    r = CliRunner().invoke(main, ["plot", "--storage", study_url, "-o", str(tmp_path)])
    assert r.exit_code == 0, r.output
    for name in ("history", "importances", "mfu_vs_memory", "knobs"):
        p = tmp_path / f"{name}.png"
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    try:
        import plotly  # noqa: F401
    except ImportError:
        return
    for name in ("history", "importances", "mfu_vs_memory", "knobs"):
        assert "plotly" in (tmp_path / f"{name}.html").read_text()


def test_memory_points_mark_infeasible(study_url):
    from autotune.report.plots import memory_points
    from autotune.study.trials import is_feasible

    st = _study(study_url)
    pts = memory_points(st)
    complete = [t for t in st.get_trials() if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(pts) == len(complete)
    assert sum(not p["feasible"] for p in pts) == sum(not is_feasible(t) for t in complete) > 0
    # the line is the usable HBM: H200 139.8 GiB seen by the device minus 1.0 GiB of CUDA context
    # (autotune/data/gpus.yaml h200: hbm_gib, cuda_context_gib) = 138.8 GiB, the same for every trial
    caps = {round(p["capacity_gib"], 6) for p in pts if p["capacity_gib"] is not None}
    assert len(caps) == 1 and caps.pop() == pytest.approx(138.8, abs=1e-6)


def test_plot_without_a_study_name_needs_exactly_one(tmp_path):
    r = CliRunner().invoke(main, ["plot", "--storage", f"sqlite:///{tmp_path}/none.db", "-o", str(tmp_path)])
    # a missing storage is refused by name and not created (read-only command)
    assert r.exit_code == 2 and "does not exist" in r.output and not (tmp_path / "none.db").exists()


def test_history_is_in_percent_with_best_so_far_over_feasible_trials(study_url):
    # history_points: MFU x 100 per complete trial; best_pct = running max over feasible trials only,
    # recomputed here by a plain loop over the stored trials
    from autotune.report.plots import backend_title, history_points
    from autotune.study.trials import is_feasible

    st = _study(study_url)
    hist = history_points(st)
    complete = sorted((t for t in st.get_trials() if t.state == optuna.trial.TrialState.COMPLETE),
                      key=lambda t: t.number)
    best = None
    for h, t in zip(hist, complete, strict=True):
        assert h["number"] == t.number and h["mfu_pct"] == pytest.approx(100 * t.value)
        if is_feasible(t):
            best = 100 * t.value if best is None else max(best, 100 * t.value)
        assert h["best_pct"] == best
    assert any(h["mfu_pct"] > 1 for h in hist)     # a percentage, not a fraction (8B MFU is tens of %)
    assert backend_title(st).endswith("(simulated numbers)")


def test_plot_titles_name_the_backend_and_axes_use_percent(study_url, tmp_path):
    pytest.importorskip("plotly", reason="plotly (autotune[plot]) not installed")
    r = CliRunner().invoke(main, ["plot", "--storage", study_url, "-o", str(tmp_path)])
    assert r.exit_code == 0, r.output
    for name in ("history", "importances", "mfu_vs_memory", "knobs"):
        html = (tmp_path / f"{name}.html").read_text()
        assert "simulated numbers" in html, name
    assert "MFU (causal) (%)" in (tmp_path / "history.html").read_text()
    assert "MFU (causal) (%)" in (tmp_path / "knobs.html").read_text()


def test_plot_with_several_studies_says_how_to_name_one(tmp_path):
    url = f"sqlite:///{tmp_path}/two.db"
    for gpus in ("8", "16"):
        r = CliRunner().invoke(main, ["run", "--size", "8b", "--gpus", gpus, "--space", "small", "--trials", "1",
                                      "--storage", url])
        assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["plot", "--storage", url, "-o", str(tmp_path / "p")])
    assert r.exit_code == 2, r.output
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "2 studies" in err[0] and "as the STUDY argument" in err[0], r.stderr
    assert "autotune show" in err[0] and "llama3.1-8b/b200x8/" in err[0] and "llama3.1-8b/b200x16/" in err[0]
    # the suggested commands name the storage they were given (run as printed they open the same one)
    assert f"--storage {url} -o {tmp_path / 'p'}`" in err[0] and f"`autotune show --storage {url}`" in err[0]
    # the suggested command works
    name = err[0].split("`autotune plot ")[1].split()[0]
    r = CliRunner().invoke(main, ["plot", name, "--storage", url, "-o", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output


def test_knobs_png_is_a_grid_and_html_plots_are_self_contained(study_url, tmp_path):
    # knobs.png was one row of panels (3315 x 414 px) with overlapping tick labels; now a grid of
    # KNOB_COLUMNS columns: with k knobs, ceil(k / 4) rows of 3.2 x 2.8 in panels -> width/height
    # = 4 x 3.2 / (rows x 2.8) at most 4.6 (one row), and below 2.3 from two rows on
    pytest.importorskip("matplotlib", reason="matplotlib (autotune[plot]) not installed")
    import math
    import struct

    from autotune.report.plots import KNOB_COLUMNS, knob_points

    st = _study(study_url)
    pts = knob_points(st)
    complete = [t for t in st.get_trials() if t.state == optuna.trial.TrialState.COMPLETE]
    for k, vals in pts.items():       # one point per complete trial that sampled the knob, MFU in %
        assert len(vals) == sum(k in t.params for t in complete)
    r = CliRunner().invoke(main, ["plot", "--storage", study_url, "-o", str(tmp_path)])
    assert r.exit_code == 0, r.output
    w, h = struct.unpack(">II", (tmp_path / "knobs.png").read_bytes()[16:24])    # PNG IHDR width, height
    rows = math.ceil(len(pts) / KNOB_COLUMNS)
    assert rows >= 2 and w / h < 2.3, (w, h, len(pts))
    try:
        import plotly  # noqa: F401
    except ImportError:
        return
    for name in ("history", "importances", "mfu_vs_memory", "knobs"):
        html = (tmp_path / f"{name}.html").read_text()
        # plotly.js inline: no script loaded from a CDN, the library's own source is in the file
        import re
        assert not re.search(r"<script[^>]*\bsrc=", html), name
        assert len(html) > 1_000_000 and "Plotly" in html, name
