"""Study integrity: damaged journals/SQLite files refused with exit 2 and left untouched, foreign studies,
fabric/space files named like built-ins, export's fabric check, validate's up-front checks, export's
message after interrupted trials."""

from __future__ import annotations

import hashlib
import json

import pytest
from click.testing import CliRunner

from autotune.cli.app import main

RUN = ["run", "--size", "8b", "--space", "small", "--trials", "2"]


def _digest(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _one_error_line(r, code=2):
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert r.exit_code == code, r.output
    assert lines and lines[-1].startswith("error:") and "Traceback" not in r.output, r.output
    assert "unexpected" not in r.output, r.output
    return lines[-1]


@pytest.fixture(scope="module")
def journal(tmp_path_factory):
    """A journal with one small study (made once; tests copy it)."""
    p = tmp_path_factory.mktemp("j") / "j.log"
    r = CliRunner().invoke(main, RUN + ["--storage", f"journal:{p}"])
    assert r.exit_code == 0, r.output
    return p.read_bytes()


# ---- 4: a cut or malformed journal
@pytest.mark.parametrize("damage", ["no_study_name", "bad_middle_line"])
def test_damaged_journal_is_refused_before_anything_is_appended(tmp_path, journal, damage):
    # before: a cut last line was skipped by Optuna's reader, `run` appended after it and then failed to
    # replay the file (exit 1 "unexpected JSONDecodeError", file altered); `show` exited 1 the same way; a
    # first record without study_name gave exit 1 KeyError. Only the first line used to be checked.
    p = tmp_path / "j.log"
    lines = journal.splitlines(keepends=True)
    if damage == "truncated":
        p.write_bytes(journal[:-30])
    elif damage == "no_study_name":
        rec = json.loads(lines[0])
        del rec["study_name"]
        p.write_bytes(json.dumps(rec).encode() + b"\n" + b"".join(lines[1:]))
    else:
        p.write_bytes(b"".join(lines[:3]) + b'{"op_code": 4, "study_\n' + b"".join(lines[3:]))
    before = _digest(p)
    for args in (RUN + ["--storage", f"journal:{p}"], ["show", "--storage", f"journal:{p}"],
                 ["export", "--size", "8b", "--space", "small", "--storage", f"journal:{p}", "-o",
                  str(tmp_path / "pb.yaml")]):
        line = _one_error_line(CliRunner().invoke(main, args))
        assert f"journal:{p}" in line and "left untouched" in line, line
    assert _digest(p) == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["j.log"]


def test_whole_journal_is_accepted(tmp_path, journal):
    p = tmp_path / "j.log"
    p.write_bytes(journal)
    r = CliRunner().invoke(main, ["show", "--storage", f"journal:{p}"])
    assert r.exit_code == 0, r.output


# ---- 1: fabric / space files named like a built-in
def test_fabric_file_named_like_a_preset_with_other_links_is_refused(tmp_path):
    # before: on a fresh storage this created the study 'nvlink5+ib-ndr400' with 100 GB/s NVLink, and the
    # real preset was refused there afterwards ("tuned on fabric ... with different links")
    f = tmp_path / "b.yaml"
    f.write_text("name: nvlink5+ib-ndr400\nintra_node: {bandwidth_gbs: 100, latency_us: 3, gpus_per_node: 8}\n"
                 "inter_node: {bandwidth_gbs: 50, latency_us: 5}\n")
    db = tmp_path / "s.db"
    line = _one_error_line(CliRunner().invoke(main, RUN + ["--interconnect", str(f), "--storage", f"sqlite:///{db}"]))
    assert f"fabric file {f} is named like the built-in 'nvlink5+ib-ndr400'" in line
    assert "intra_node.bandwidth_gbs 900 vs 100" in line and "another name" in line
    assert not db.exists()


def test_fabric_file_with_a_presets_name_and_links_is_accepted(tmp_path):
    import yaml

    from autotune.spec.hardware import get_fabric

    f = tmp_path / "same.yaml"
    f.write_text(yaml.safe_dump(get_fabric("nvlink5+ib-ndr400").to_dict()))
    assert get_fabric(str(f)).name == "nvlink5+ib-ndr400"
    assert get_fabric("h200-nvlink").name == "h200-nvlink"        # the shipped measured tier itself


def test_space_file_named_like_a_builtin_with_other_contents_is_refused(tmp_path):
    # before: `--space s.yaml` (name: small, one knob narrower) used the built-in 'small' study name
    from autotune.search.space import search_space_dirs

    text = (search_space_dirs()[0] / "small.yaml").read_text()
    f = tmp_path / "s.yaml"
    f.write_text(text.replace("micro_batch_size: [1, 2]", "micro_batch_size: [1]"))
    assert f.read_text() != text
    db = tmp_path / "s.db"
    line = _one_error_line(CliRunner().invoke(main, ["run", "--size", "8b", "--space", str(f), "--trials", "1",
                                                     "--storage", f"sqlite:///{db}"]))
    assert f"search space file {f} is named like the built-in 'small'" in line and "another name" in line
    assert not db.exists()
    same = tmp_path / "same.yaml"          # a copy of the built-in is the built-in
    same.write_text(text)
    from autotune.search.space import SearchSpace
    assert SearchSpace.load(str(same)).fingerprint == SearchSpace.load("small").fingerprint


# ---- 2: export checks the fabric like run does
def test_export_refuses_a_fabric_file_with_the_stored_name_but_other_links(tmp_path):
    # before: export selected the study by name only and wrote the plan tuned on the other 'x'
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("name: x\nintra_node: {bandwidth_gbs: 900, latency_us: 4, gpus_per_node: 8}\n")
    b.write_text("name: x\nintra_node: {bandwidth_gbs: 100, latency_us: 4, gpus_per_node: 8}\n")
    url = f"sqlite:///{tmp_path}/s.db"
    r = CliRunner().invoke(main, RUN + ["--interconnect", str(a), "--storage", url])
    assert r.exit_code == 0, r.output
    out = tmp_path / "pb.yaml"
    line = _one_error_line(CliRunner().invoke(main, ["export", "--size", "8b", "--space", "small", "--interconnect",
                                                     str(b), "--storage", url, "-o", str(out)]))
    assert "tuned on fabric 'x' with different links" in line and "900 vs 100" in line and url in line, line
    assert not out.exists()
    r = CliRunner().invoke(main, ["export", "--size", "8b", "--space", "small", "--interconnect", str(a),
                                  "--storage", url, "-o", str(tmp_path / "pa.yaml")])
    assert r.exit_code == 0, r.output


# ---- 3: a study autotune did not make is not adopted
def test_run_refuses_a_plain_optuna_study_with_the_autotune_name(tmp_path):
    # before: run added autotune's user_attrs to the foreign study and reported its 3 trials as
    # "do not fit in memory"
    import optuna

    from autotune.cli.options import resolve_target
    from autotune.search.space import SearchSpace
    from autotune.study.identity import study_name

    model, cluster, workload = resolve_target(size="8b", model_path=None, gpu=None, gpus=None, interconnect=None,
                                              seq_len=None, global_batch=None)
    name = study_name(model, cluster, workload, space_name=SearchSpace.load("small").name)
    url = f"sqlite:///{tmp_path}/o.db"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    s = optuna.create_study(study_name=name, storage=url)
    s.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    line = _one_error_line(CliRunner().invoke(main, RUN + ["--storage", url]))
    assert f"study {name!r} in {url} was not made by autotune" in line, line
    s = optuna.load_study(study_name=name, storage=url)
    assert s.user_attrs == {} and len(s.trials) == 3 and s.metric_names is None
    # an empty study of that name (autotune creating it, or another worker's) is still taken
    url2 = f"sqlite:///{tmp_path}/e.db"
    optuna.create_study(study_name=name, storage=url2, direction="maximize")
    assert CliRunner().invoke(main, RUN + ["--storage", url2]).exit_code == 0


# ---- 5: a damaged SQLite page
def test_damaged_sqlite_gives_one_storage_error_line_on_read_commands(tmp_path):
    # before: show / export / plot exited 1 "unexpected StorageInternalError" (a bug report) while run
    # gave exit 2; the header and sqlite_master (page 1) are intact, so readonly_url let the file through
    import sqlite3

    db = tmp_path / "d.db"
    url = f"sqlite:///{db}"
    assert CliRunner().invoke(main, RUN + ["--storage", url]).exit_code == 0
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    assert db.stat().st_size > 12288
    with open(db, "r+b") as fh:
        fh.seek(8192)
        fh.write(b"\xff" * 4096)
    before = _digest(db)
    for args in (["show"], ["export", "--size", "8b", "--space", "small", "-o", str(tmp_path / "p.yaml")],
                 ["plot", "-o", str(tmp_path / "pl")]):
        line = _one_error_line(CliRunner().invoke(main, args + ["--storage", url]))
        assert line.startswith(f"error: storage {url} cannot be read: ") and "malformed" in line, line
    assert _digest(db) == before
    assert not (tmp_path / "p.yaml").exists()


# ---- 7: export after interrupted trials
def _study_with_failed_trials(tmp_path, reasons):
    import optuna

    from autotune.cli.options import resolve_target
    from autotune.tune.tuner import Tuner

    model, cluster, workload = resolve_target(size="8b", model_path=None, gpu=None, gpus=None, interconnect=None,
                                              seq_len=None, global_batch=None)
    url = f"sqlite:///{tmp_path}/s.db"
    t = Tuner(model=model, cluster=cluster, workload=workload, space="small", storage=url)
    for r in reasons:       # what Tuner.objective records when a signal stops a trial
        t.study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL,
                                                    user_attrs={"fail_reason": r}))
    return url


def test_export_after_only_interrupted_trials_says_run_again(tmp_path):
    # before: "error: 1/1 trials gave no feasible plan (...): error: interrupted (signal 2). ... widen the
    # search space (--space), add GPUs or shrink the batch": a doubled "error:" and the wrong advice
    url = _study_with_failed_trials(tmp_path, ["interrupted (signal 2)"])
    line = _one_error_line(CliRunner().invoke(main, ["export", "--size", "8b", "--space", "small", "--storage", url,
                                                     "-o", str(tmp_path / "p.yaml")]))
    assert line.count("error:") == 1 and "the only trial was interrupted (signal 2); run again" in line, line
    assert "the only trial was interrupted" in line and "run again" in line and "widen" not in line, line


def test_export_after_failed_trials_has_one_error_prefix(tmp_path):
    url = _study_with_failed_trials(tmp_path, ["interrupted (signal 15)", "RuntimeError: boom", "RuntimeError: boom"])
    line = _one_error_line(CliRunner().invoke(main, ["export", "--size", "8b", "--space", "small", "--storage", url,
                                                     "-o", str(tmp_path / "p.yaml")]))
    assert line.count("error:") == 1 and "3/3 trials gave no feasible plan" in line and "failed: RuntimeError: boom" in line
