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


def _matrix():
    """The HF configs of tests/export/test_export_matrix.py (one copy of the model families)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_export_matrix", TESTS / "export" / "test_export_matrix.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _study(tmp_path, name, cfg, engine):
    """A 5-trial study of ``cfg`` (an HF config dict) on 8 GPUs, seq 4096; returns (storage URL, study name)."""
    f = tmp_path / f"{name}.json"
    f.write_text(json.dumps(cfg))
    url = f"sqlite:///{tmp_path}/{name}.db"
    r = CliRunner().invoke(main, ["run", "--model", str(f), "--seq-len", "4096", "--gpus", "8", "--trials", "5",
                                  "--engine", engine, "--storage", url])
    assert r.exit_code == 0, r.output
    (study,) = optuna.get_all_study_names(url)
    return url, study


@pytest.mark.parametrize("family,engine", [("GEMMA2_9B", "megatron"), ("QWEN25_7B", "torchtitan")])
def test_plain_export_names_the_engines_that_cannot_launch_the_model(tmp_path, family, engine):
    from autotune.export import megatron, torchtitan
    from autotune.target.plan import PlanDocument

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
    assert tt and "Llama 3.1 flavours only" in tt
    assert f"torchtitan: config not printed: {tt}" in lines
    assert "[parallelism]" not in r.output
    # --launcher for the study's engine refuses with the same words
    r = CliRunner().invoke(main, ["export", "--study", study, "--storage", url, "--launcher", "torchrun",
                                  "-o", str(tmp_path / "launch")])
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1].startswith(f"error: {meg if engine == 'megatron' else tt}")
