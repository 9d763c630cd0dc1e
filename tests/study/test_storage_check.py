"""storage_check: ``journal:PATH`` refused up front (directory, foreign file), the user's URL in messages."""

from __future__ import annotations

import hashlib
import json
import sqlite3

import pytest
from click.testing import CliRunner

from autotune.cli.app import main
from autotune.errors import StorageError
from autotune.study.storage_check import check_journal_file, readonly_url, user_url


def _digest(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _foreign_sqlite(p):
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE t (x INTEGER)")
    con.commit()
    con.close()
    return p


def test_journal_accepts_missing_empty_and_journal_files(tmp_path):
    check_journal_file(f"journal:{tmp_path}/new.log")                 # missing: Optuna creates it
    (tmp_path / "empty.log").write_bytes(b"")
    check_journal_file(f"journal:{tmp_path}/empty.log")
    # the first record Optuna's JournalStorage writes (op_code 0 = CREATE_STUDY, optuna/storages/journal/
    # _storage.py JournalOperation)
    (tmp_path / "j.log").write_text(json.dumps({"op_code": 0, "worker_id": "w", "study_name": "s",
                                                "directions": [1]}) + "\n")
    check_journal_file(f"journal:{tmp_path}/j.log")
    check_journal_file("sqlite:///whatever.db")                       # not a journal URL: not checked
    with pytest.raises(StorageError, match="does not exist"):
        check_journal_file(f"journal:{tmp_path}/new.log", must_exist=True)


@pytest.mark.parametrize("content", [b"hello\n", b'{"no_op_code": 1}\n', b"[1, 2]\n", b"\xff\xfe\x00binary"])
def test_journal_refuses_foreign_files(tmp_path, content):
    p = tmp_path / "f.log"
    p.write_bytes(content)
    with pytest.raises(StorageError, match="is not an Optuna journal file"):
        check_journal_file(f"journal:{p}")


@pytest.mark.parametrize("kind", ["text", "sqlite", "dir"])
def test_run_on_a_non_journal_path_exits_2_and_writes_nothing(tmp_path, kind):
    # before: a text or SQLite file got an Optuna record appended (exit 2, then exit 1 "unexpected
    # JSONDecodeError" on the next run); a directory gave exit 1 "unexpected IsADirectoryError"
    if kind == "text":
        p = tmp_path / "notes.txt"
        p.write_text("my notes\n")
    elif kind == "sqlite":
        p = _foreign_sqlite(tmp_path / "other.db")
    else:
        p = tmp_path / "d"
        p.mkdir()
    before = _digest(p) if p.is_file() else None
    for _ in range(2):          # the second run is refused the same way
        r = CliRunner().invoke(main, ["run", "--size", "8b", "--space", "small", "--trials", "2",
                                      "--storage", f"journal:{p}"])
        assert r.exit_code == 2, r.output
        lines = [x for x in r.output.splitlines() if x.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and f"journal:{p}" in lines[0], r.output
        assert ("is a directory" if kind == "dir" else "is not an Optuna journal file") in lines[0]
    if before is not None:
        assert _digest(p) == before
    assert sorted(x.name for x in tmp_path.iterdir()) == [p.name]     # no lock or other file left


def test_readonly_errors_name_the_users_storage(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    r = CliRunner().invoke(main, ["run", "--size", "8b", "--space", "small", "--trials", "2", "--storage", url])
    assert r.exit_code == 0, r.output
    ro = readonly_url(url)
    assert "mode=ro" in ro and user_url(ro) == url and user_url(url) == url
    for args in (["export", "--size", "70b", "--storage", url, "-o", str(tmp_path / "p.yaml")],
                 ["plot", "nope", "--storage", url, "-o", str(tmp_path / "plots")]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2, r.output
        assert f"in {url}" in r.output and "mode=ro" not in r.output and "file:" not in r.output, r.output


def test_show_on_a_missing_journal_creates_nothing(tmp_path):
    r = CliRunner().invoke(main, ["show", "--storage", f"journal:{tmp_path}/none.log"])
    assert r.exit_code == 2 and "does not exist" in r.output, r.output
    assert list(tmp_path.iterdir()) == []


def _empty_schema_sqlite(p):
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE t (x INTEGER)")
    con.execute("DROP TABLE t")        # an SQLite header and an empty schema
    con.commit()
    con.close()
    return p


@pytest.mark.parametrize("content", ["zero bytes", "no tables"])
def test_run_opens_a_file_that_holds_nothing_yet_as_a_new_storage(tmp_path, content):
    # a file another `autotune run` has just created on the same new storage: 0 bytes (SQLite creates the file
    # before its first page) or an SQLite database whose tables are not there yet; nothing in it can be lost, so
    # it is opened as a new storage (before: "not an SQLite database" for one of six runs started together)
    from autotune.study.storage_check import fresh_sqlite_file

    db = tmp_path / "s.db"
    if content == "zero bytes":
        db.write_bytes(b"")
    else:
        _empty_schema_sqlite(db)
        assert db.read_bytes()[:16] == b"SQLite format 3\x00"
    assert fresh_sqlite_file(db)
    r = CliRunner().invoke(main, ["run", "--size", "8b", "--space", "small", "--trials", "2", "--storage",
                                  f"sqlite:///{db}"])
    assert r.exit_code == 0, r.output
    assert "2 trials run by this worker" in r.output, r.output
    assert not fresh_sqlite_file(db)        # now an autotune storage


def test_run_still_refuses_an_sqlite_file_of_other_tables(tmp_path):
    from autotune.study.storage_check import fresh_sqlite_file

    db = _foreign_sqlite(tmp_path / "other.db")
    before = _digest(db)
    assert not fresh_sqlite_file(db)
    r = CliRunner().invoke(main, ["run", "--size", "8b", "--space", "small", "--trials", "2", "--storage",
                                  f"sqlite:///{db}"])
    assert r.exit_code == 2 and "holds no Optuna study tables" in r.output and "Traceback" not in r.output, r.output
    assert _digest(db) == before


def test_closing_connections_before_a_fork_keeps_an_in_memory_storage(tmp_path):
    # run_workers closes the cached storages' connections before forking; a cached sqlite:///:memory: storage
    # (the real backend's screen runs one in-process) lost its database with its connection, so the next run on
    # it in the same process failed with "no such table: studies" (seen in CI after a run_workers test)
    import optuna

    from autotune.study.storage import close_connections, open_storage

    import uuid

    name = f"kept-{uuid.uuid4().hex[:8]}"      # the cached in-memory storage is this process's, shared with others
    optuna.create_study(storage=open_storage("sqlite:///:memory:"), study_name=name)
    close_connections()
    assert name in optuna.get_all_study_names(storage=open_storage("sqlite:///:memory:"))


def test_show_on_an_empty_file_says_it_holds_no_study_yet(tmp_path):
    # `run` opens a 0-byte file as a new storage; `show` (read-only) says it is empty rather than "not an SQLite
    # database", and leaves it as it is
    db = tmp_path / "e.db"
    db.write_bytes(b"")
    r = CliRunner().invoke(main, ["show", "--storage", f"sqlite:///{db}"])
    assert r.exit_code == 2 and "is empty: no study is stored in it yet" in r.output, r.output
    assert db.read_bytes() == b""
