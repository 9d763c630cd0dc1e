"""QA-pass fixes: damaged journals/SQLite files refused with exit 2 and left untouched, foreign studies,
fabric/space files named like built-ins, export's fabric check, validate's up-front checks, export's
message after interrupted trials."""

from __future__ import annotations

import hashlib
import json

import pytest
from click.testing import CliRunner

from autotune.cli import main

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
@pytest.mark.parametrize("damage", ["truncated", "no_study_name", "bad_middle_line"])
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
