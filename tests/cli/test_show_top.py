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
    # independently: feasible complete trials (user_attrs feasible true), distinct plans (knobs without effect
    # ignored: the DP bucket where Megatron-LM reduces one bucket per buffer, study/trials.py
    # effective_plan_key), best first by the conservative estimate: MFU / (1 + the high end of the plan's
    # interval) (autotune/spec/trust.py, shipped autotune/data/error_bands.yaml)
    from autotune.spec.plan import Plan
    from autotune.spec.trust import RankBasis, interval_for
    from autotune.study.trials import effective_plan_key

    basis = RankBasis("b200", 4096)             # Llama 3.1 8B: hidden size 4096
    seen, want = set(), []
    feas = [t for t in st.get_trials() if t.state == optuna.trial.TrialState.COMPLETE
            and t.user_attrs.get("feasible") is True]
    high = {t.number: interval_for(Plan.from_dict(t.user_attrs["plan"]), "b200", 4096).high for t in feas}
    for t in sorted(feas, key=lambda t: (-t.value / (1 + high[t.number]), -t.value, t.number)):
        key = effective_plan_key(t.user_attrs["plan"], "megatron")
        if key not in seen:
            seen.add(key)
            want.append(t)
    assert len(want) >= 3
    assert basis.factor(Plan.from_dict(want[0].user_attrs["plan"])) == 1 / (1 + high[want[0].number])
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
    # N distinct plans: no two tables list the same settings
    tables = r.output.split("\n#")[1:]
    settings = [tuple(ln for ln in tb.splitlines()[1:] if not ln.startswith(("step time", "tokens/s", "MFU", "HFU",
                                                                              "80% interval", "  ", "breakdown")))
                for tb in tables]
    assert len(set(settings)) == 3
    # each table carries its own 80% interval, one row, and no second band (the 'all exposed' row and the trust
    # row are gone); --json carries the same interval: MFU / (1 + high) .. MFU / (1 + low)
    assert r.output.count("80% interval") == 3 and "all exposed" not in r.output and "\ntrust " not in r.output
    for e, t in zip(doc["results"], want):
        iv = interval_for(Plan.from_dict(t.user_attrs["plan"]), "b200", 4096)
        lo, hi = e["interval"]["mfu"]
        assert lo == t.value / (1 + iv.high) and hi == min(t.value / (1 + iv.low), 1.0)
        assert e["interval"]["residual_low"] == iv.low and e["interval"]["residual_high"] == iv.high
        assert e["interval"]["text"] in r.output
    # bad N: one error line, exit 2
    r = CliRunner().invoke(main, ["show", name, "--storage", url, "--top", "0"])
    assert r.exit_code == 2 and r.output.strip().startswith("error: --top 0"), r.output
