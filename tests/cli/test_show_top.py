"""``autotune show STUDY --top N``: the best N feasible plans of one study, text and JSON."""

from __future__ import annotations

import json

import optuna
from click.testing import CliRunner

from autotune.cli.app import main


def test_show_top_lists_the_best_feasible_plans(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    r = CliRunner().invoke(main, ["run", "--size", "8b", "--space", "small", "--trials", "12", "--storage", url])
    assert r.exit_code == 0, r.output
    (name,) = optuna.get_all_study_names(url)
    st = optuna.load_study(study_name=name, storage=url)
    # independently: feasible complete trials (user_attrs feasible true), distinct plans, highest MFU first
    seen, want = set(), []
    for t in sorted((t for t in st.get_trials() if t.state == optuna.trial.TrialState.COMPLETE
                     and t.user_attrs.get("feasible") is True), key=lambda t: (-t.value, t.number)):
        key = json.dumps(t.user_attrs["plan"], sort_keys=True)
        if key not in seen:
            seen.add(key)
            want.append(t)
    assert len(want) >= 3
    r = CliRunner().invoke(main, ["show", name, "--storage", url, "--top", "3", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert [e["label"] for e in doc["results"]] == ["top1", "top2", "top3"]
    assert [e["trial"] for e in doc["results"]] == [t.number for t in want[:3]]
    assert [e["prediction"]["mfu"] for e in doc["results"]] == [t.value for t in want[:3]]
    # text: one table per plan, best first, each with its breakdown; the only study needs no name
    r = CliRunner().invoke(main, ["show", "--storage", url, "--top", "3"])
    assert r.exit_code == 0, r.output
    heads = [ln for ln in r.output.splitlines() if ln.startswith("#")]
    assert heads == [f"#{i}: trial {t.number}, MFU {100 * t.value:.1f}%" for i, t in enumerate(want[:3], 1)]
    assert r.output.count("compute") >= 3
    # each table's trust line is the study's GPU's error band, as `run` and `export` print it (before: the
    # all-GPU figure under a header quoting the B200 band)
    from autotune.report.summary import error_band_line

    trust = error_band_line("megatron", "b200").split(": ", 1)[1]
    assert r.output.count(trust) == 3, r.output
    # and --json carries the same figure as error_band.for_gpu (by_gpu's b200 entry of the shipped bands)
    from autotune.spec.engines import error_band

    for e in doc["results"]:
        fg = e["error_band"]["for_gpu"]
        assert fg["family"] == "b200" and fg["mean_abs_error_pct"] == error_band("megatron")["by_gpu"]["b200"][
            "mean_abs_error_pct"], fg
        assert f"{fg['mean_abs_error_pct']:.1f}%" in trust
    # bad N: one error line, exit 2
    r = CliRunner().invoke(main, ["show", name, "--storage", url, "--top", "0"])
    assert r.exit_code == 2 and r.output.strip().startswith("error: --top 0"), r.output
