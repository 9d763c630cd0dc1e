"""`autotune export` of plans an engine cannot launch, and of a user's own plan (`simulate --save-plan`,
`export --plan`): the plain export names why no flags are printed; an imported Megatron-LM launch
round-trips through the CLI with every modelled flag unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner

from autotune.cli.app import main

TESTS = Path(__file__).resolve().parents[1]
ARGS_70B = TESTS / "data" / "launches" / "llama3.1-70b_megatron_args.sh"


def _tests_module(rel):
    """A test module of tests/ by its path (its helpers and data, one copy)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_" + Path(rel).stem, TESTS / rel)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _matrix():
    """The HF configs of tests/export/test_export_matrix.py (one copy of the model families)."""
    return _tests_module("export/test_export_matrix.py")


def _study(tmp_path, name, cfg, engine):
    """A 5-trial study of ``cfg`` (an HF config dict) on 8 GPUs, seq 4096; returns (storage URL, study name)."""
    f = tmp_path / f"{name}.json"
    f.write_text(json.dumps(cfg))
    url = f"sqlite:///{tmp_path}/{name}.db"
    r = CliRunner().invoke(main, ["run", "--model", str(f), "--seq-len", "4096", "--gpus", "8", "--trials", "5",
                                  "--engine", engine, "--storage", url])
    assert r.exit_code == 0, r.output
    # the run says at its start that the engine's launch files will be refused (the export's own check)
    from autotune.cli.tune import _launch_refusal
    from autotune.spec.hf_config import model_from_hf_config
    refusal = _launch_refusal(engine, model_from_hf_config(f), _workload_4096())
    warned = [x for x in r.output.splitlines() if x.startswith("warning: ") and "launch files" in x]
    assert (warned == [f"warning: {refusal}; the tuned plan can be exported as YAML, not as {engine} launch files"]
            if refusal else warned == []), r.output
    (study,) = optuna.get_all_study_names(url)
    return url, study


def _workload_4096():
    from autotune.spec.plan import Workload
    return Workload(seq_len=4096, global_batch_size=1)


@pytest.mark.parametrize("family,engine", [("GEMMA2_9B", "megatron"), ("QWEN25_7B", "torchtitan")])
def test_plain_export_names_the_engines_that_cannot_launch_the_model(tmp_path, family, engine):
    from autotune.engines.megatron import export as megatron
    from autotune.engines.torchtitan import export as torchtitan
    from autotune.spec.plan import PlanDocument

    m = _matrix()
    url, study = _study(tmp_path, family.lower(), getattr(m, family), engine)
    out = tmp_path / "plan.yaml"
    r = CliRunner().invoke(main, ["export", "--study", study, "--storage", url, "-o", str(out)])
    # the plan YAML is engine-independent: written, exit 0
    assert r.exit_code == 0, r.output
    doc = PlanDocument.load(out)
    # the refusals `export --launcher` gives (the same functions), one line each, instead of the flags
    meg = megatron.model_refusal(doc.model, doc.workload.seq_len)
    tt = torchtitan.model_refusal(doc.model)
    lines = r.output.splitlines()
    # Gemma-2 (GeGLU, soft-capping, post-norms; seq 4096 = its window, so no sliding-window entry): Megatron
    # cannot; Qwen2.5 (Q/K/V biases, rope_theta 1e6 as an int): Megatron can; torchtitan has Llama 3.1 only
    if family == "GEMMA2_9B":
        assert meg and all(w in meg for w in ("GeGLU", "soft-capping 50", "soft-capping 30", "4 RMSNorms"))
        assert f"Megatron-LM: flags not printed: {meg}" in lines
        assert "--tensor-model-parallel-size" not in r.output
    else:
        assert meg is None
        assert "Megatron-LM:" in lines         # the plan's flags, as before
        assert any("--tensor-model-parallel-size" in ln for ln in lines)
    assert tt and "knows the Llama 3.1 flavours" in tt and "MoE flavours" in tt
    assert f"torchtitan: config not printed: {tt}" in lines
    assert "[parallelism]" not in r.output
    # --launcher for the study's engine refuses with the same words
    r = CliRunner().invoke(main, ["export", "--study", study, "--storage", url, "--launcher", "torchrun",
                                  "-o", str(tmp_path / "launch")])
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1].startswith(f"error: {meg if engine == 'megatron' else tt}")


def test_imported_megatron_launch_round_trips_through_the_cli(tmp_path):
    """simulate --from-megatron ... --save-plan, then export --plan ... --launcher torchrun --dry-run: the
    launched Megatron-LM flags carry every modelled setting of the user's file with the user's value."""
    import shlex

    from autotune.engines.megatron.importer import (
        import_megatron_args,
        parse_megatron_args,
    )
    from autotune.spec.plan import PlanDocument

    plan = tmp_path / "p.yaml"
    r = CliRunner().invoke(main, ["simulate", "--from-megatron", str(ARGS_70B), "--gpus", "512", "--gpu", "h100",
                                  "--save-plan", str(plan)])
    assert r.exit_code == 0, r.output
    assert f"wrote {plan}" in r.output
    imp = import_megatron_args(ARGS_70B, num_gpus=512)
    doc = PlanDocument.load(plan)
    # the saved plan is the imported one, on the simulated cluster, with the prediction simulate printed
    assert (doc.plan, doc.model, doc.workload, doc.num_gpus, doc.gpu, doc.engine) == \
        (imp.plan, imp.model, imp.workload, 512, "h100", "megatron")
    assert any(ln.startswith("MFU ") and f"{100 * doc.prediction['mfu']:.1f}%" in ln for ln in r.output.splitlines())
    # `simulate PLAN_FILE` reads it back and predicts the same
    r2 = CliRunner().invoke(main, ["simulate", str(plan)])
    assert r2.exit_code == 0 and "-> same" in r2.output, r2.output
    out = tmp_path / "launch"
    r = CliRunner().invoke(main, ["export", "--plan", str(plan), "--launcher", "torchrun", "--dry-run",
                                  "-o", str(out)])
    assert r.exit_code == 0, r.output
    (cmd,) = [ln for ln in r.output.splitlines() if ln.startswith("torchrun ")]
    words = shlex.split(cmd)
    launched = words[next(i for i, w in enumerate(words) if w.endswith("pretrain_gpt.py")) + 1:]
    # the library export of the imported plan (tests/export/test_launch_import.py's helper) writes the same
    assert launched == _tests_module("export/test_launch_import.py")._export_args(imp)
    exported = parse_megatron_args(launched, "export")
    assert len(imp.modelled) >= 35
    for opt, val in imp.modelled.items():
        assert exported.get(opt) == val, (opt, exported.get(opt), val)


@pytest.mark.parametrize("args,words", [
    (["--study", "s"], "--plan P and --study s: export one of them"),
    (["--gpus", "8"], "--gpus: with --plan P the model, cluster and workload come from that file"),
    (["--size", "8b", "--seq-len", "4096"], "--size, --seq-len: with --plan P"),
    (["--engine", "nope"], "nope"),
    (["--storage", "sqlite:///x.db"], "--storage: with --plan P no study is read"),
    (["--space", "small", "--backend", "measured"], "--space, --backend: with --plan P no study is read"),
])
def test_export_plan_refusals_are_one_line(tmp_path, monkeypatch, args, words):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["simulate", "--size", "8b", "--gpus", "8", "--save-plan", "P"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["export", "--plan", "P", *args, "-o", "out.yaml"])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], lines
    assert not (tmp_path / "out.yaml").exists()


def test_printed_megatron_flags_train_in_bf16(tmp_path, monkeypatch):
    # every plan is BF16 mixed precision (FP8 on top): without --bf16 Megatron-LM keeps FP32 parameters, and its
    # gradient buffer (what --ddp-bucket-size counts) follows them, so the printed flags carry --bf16 for a BF16
    # plan too (before: only for FP8 plans), once
    monkeypatch.chdir(tmp_path)
    for prec in ("bf16", "fp8_delayed"):
        r = CliRunner().invoke(main, ["simulate", "--size", "8b", "--gpus", "8", "--set", f"precision={prec}",
                                      "--save-plan", f"{prec}.yaml"])
        assert r.exit_code == 0, r.output
        r = CliRunner().invoke(main, ["export", "--plan", f"{prec}.yaml", "-o", f"{prec}-out.yaml"])
        assert r.exit_code == 0, r.output
        meg = r.output[r.output.index("Megatron-LM"):]
        assert meg.split().count("--bf16") == 1, meg
