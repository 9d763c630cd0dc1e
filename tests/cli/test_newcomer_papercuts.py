"""Issue 42's papercuts, one test each (what a new user meets first)."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

from click.testing import CliRunner

from autotune.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_version():
    from importlib import metadata
    r = CliRunner().invoke(main, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"autotune {metadata.version('autotune')}"


def test_readme_outputs_are_git_ignored():
    # the files the README's commands write in the checkout (export -o plan.yaml / -o launch/, plot -o plots/,
    # simulate --trace t.json --gantt g.png, simulate --save-plan mine.yaml)
    for f in ("plan.yaml", "mine.yaml", "launch/launch_torchrun.sh", "plots/history.png", "t.json", "g.png"):
        r = subprocess.run(["git", "check-ignore", "-q", "--no-index", f], cwd=ROOT)
        assert r.returncode == 0, f


def test_einops_in_test_extra():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert any(x.startswith("einops") for x in extra)


def test_405b_on_8_gpus_no_plan_fits_at_once(tmp_path):
    # 405.85e9 parameters x (12 optimizer + 2 gradient + 1 weight) bytes = 6.09 TB > 8 x 84.4 GB (H100 80 GiB
    # less the CUDA context): no plan can fit, said before any trial
    r = CliRunner().invoke(main, ["run", "--size", "405b", "--gpus", "8", "--gpu", "h100",
                                  "--storage", f"sqlite:///{tmp_path}/s.db"])
    assert r.exit_code == 2, r.output
    assert "no plan fits: llama3.1-405b" in r.output and "6.1 TB" in r.output and "more than 8 x 84 GB" in r.output
    assert not (tmp_path / "s.db").exists()       # no study was created


def test_export_hint_bucket_and_plan_named_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for overlap in ("false", "true"):
        r = CliRunner().invoke(main, ["simulate", "--size", "8b", "--gpus", "8", "--set",
                                      f"dp_grad_reduce_overlap={overlap}", "--save-plan", f"p{overlap}.yaml"])
        assert r.exit_code == 0, r.output
        r = CliRunner().invoke(main, ["export", "--plan", f"p{overlap}.yaml", "--launcher", "torchrun",
                                      "-o", f"l{overlap}"])
        assert r.exit_code == 0, r.output
        in_file = "--ddp-bucket-size" in (tmp_path / f"l{overlap}" / "launch_torchrun.sh").read_text()
        hint = r.output[r.output.index("Megatron-LM:"):r.output.index("torchtitan (TOML")]
        # the printed flags and the launch file agree: the bucket only with --overlap-grad-reduce
        assert ("--ddp-bucket-size" in hint) == in_file == (overlap == "true"), (hint, in_file)
        assert r.output.count("plan.yaml") == 1, r.output


def test_show_rows_fit_120_columns():
    from autotune.report.summary import format_studies
    row = {"model": "llama3.1-405b", "gpus": "16384xb200", "fabric": "nvlink5+ib-ndr400", "engine": "torchtitan",
           "backend": "measured", "workload": "seq8192-gbs2048", "n_trials": 1000, "mfu": "45.1%", "step": "12,345",
           "plan": "tp8 pp16 dp128 cp1 interleaved_1f1bx4 mbs1 zero1 rc=selective fp8_tensorwise",
           "study": "llama3.1-405b/b200x16384/nvlink5+ib-ndr400/torchtitan/seq8192-gbs2048/measured/space-default"}
    out = format_studies([row, dict(row, model="llama3.1-8b")])
    assert max(map(len, out.splitlines())) <= 125, out
    assert f"  study {row['study']}" in out


def test_retune_changed_line_summarises_long_lists():
    from types import SimpleNamespace

    from autotune.spec.plan import Plan
    from autotune.tune.retune import explain_changes
    a = Plan(pp_degree=2, dp_degree=4)
    b = Plan(pp_degree=2, dp_degree=4, stage_layers=tuple([1] * 64 + [0] * 64), vpp_degree=64,
             pipeline_schedule="interleaved_1f1b")
    res = SimpleNamespace(breakdown_ms={})
    line = explain_changes(SimpleNamespace(plan=a, result=res), SimpleNamespace(plan=b, result=res), res)[0]
    assert "[128 entries, 0..1]" in line and len(line) < 300, line


def test_importances_name_a_knob_without_effect(tmp_path, monkeypatch):
    # Megatron-LM reduces each gradient buffer as one bucket without --overlap-grad-reduce (facts.yaml
    # one_bucket_without_overlap): with dp_grad_reduce_overlap fixed off, bucket_size_mib changes nothing,
    # so its effect re-simulated around the best plans is exactly 0 and the chart says so (fANOVA had
    # ranked such a knob first); precision (BF16 vs FP8 GEMMs) does change MFU
    import optuna
    import yaml

    from autotune.report.plots import _effects_head, knob_effects
    space = yaml.safe_load((ROOT / "search_spaces" / "small.yaml").read_text())
    space["name"] = "bucket-test"
    space["knobs"].update(bucket_size_mib=[16, 64, 256], dp_grad_reduce_overlap=[False], param_gather_overlap=[False],
                          precision=["bf16", "fp8_delayed"], tp_degree=[1, 2], pp_degree=[1], recompute=["full"])
    f = tmp_path / "bucket-test.yaml"
    f.write_text(yaml.safe_dump(space))
    # the study records its space by name: the plot finds it where named spaces live (here: tmp_path too)
    import autotune.search.space as sp
    dirs = sp.search_space_dirs()
    monkeypatch.setattr(sp, "search_space_dirs", lambda: [*dirs, tmp_path])
    url = f"sqlite:///{tmp_path}/s.db"
    r = CliRunner().invoke(main, ["run", "--size", "8b", "--gpus", "8", "--gpu", "h100", "--space", str(f),
                                  "--trials", "6", "--no-early-stop", "--storage", url])
    assert r.exit_code == 0, r.output
    name = optuna.get_all_study_summaries(url)[0].study_name
    effects = knob_effects(optuna.load_study(study_name=name, storage=url))
    assert effects["bucket_size_mib"] == 0.0 and effects["precision"] > 0, effects
    assert "no effect: bucket_size_mib" in _effects_head(effects)
