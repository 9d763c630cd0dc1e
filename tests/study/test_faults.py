"""Issue 25: faults lose nothing and lock no one out. Storage errors classified (transient retried, permanent
one clean line), a full disk and a read-only file system on a real 1 MiB tmpfs, a torn journal read / repaired,
trials of killed workers failed with the reason, foreign studies refused untouched, secrets masked, the Slurm
job script, temporary trial directories removed."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner

from autotune.cli.app import main
from autotune.errors import ConfigError, StorageError, redact

RUN = ["run", "--size", "8b", "--space", "small"]
ROOT = Path(__file__).resolve().parents[2]


def _env():
    return dict(os.environ, PYTHONPATH=str(ROOT))


def _lines(r):
    return [x for x in r.output.splitlines() if x.strip()]


def _clean_error(r, code=2):
    lines = _lines(r)
    assert r.exit_code == code, r.output
    assert lines[-1].startswith("error: ") and "Traceback" not in r.output and "(a bug" not in r.output, r.output
    return lines[-1]


# ---- secrets
@pytest.mark.parametrize("text,want", [
    ("postgresql://me:s3cret@h:5432/db", "postgresql://me:***@h:5432/db"),
    ("postgresql+psycopg://u:p@ss@h/db", "postgresql+psycopg://u:***@h/db"),    # an '@' in the password
    ("postgresql://me@h/db", "postgresql://me@h/db"),                           # no password: unchanged
    ("sqlite:///a:b@c.db", "sqlite:///a:b@c.db"),                               # a path, not a userinfo
    ("error: x in postgresql://a:b@c/d; y", "error: x in postgresql://a:***@c/d; y"),
])
def test_redact_masks_only_passwords(text, want):
    assert redact(text) == want


# issue 25 QA: every password form SQLAlchemy / libpq accept. libpq's URI query keywords include password and
# sslpassword (PostgreSQL docs 32.1.2); SQLAlchemy's password is userinfo up to the first "@", any character
@pytest.mark.parametrize("text,want", [
    ("postgresql://alice@h:5999/autotune?password=QueryPWzz", "postgresql://alice@h:5999/autotune?password=***"),
    ("postgresql://a@h/d?sslmode=require&PassWord=x1&sslpassword=x2", "postgresql://a@h/d?sslmode=require&PassWord=***&sslpassword=***"),
    ("postgresql://alice:pa ss@h:5999/db", "postgresql://alice:***@h:5999/db"),      # a space in the password
    ("error: cannot open study storage postgresql://alice:pa ss@h:5999/db: refused",
     "error: cannot open study storage postgresql://alice:***@h:5999/db: refused"),
    ("error: storage postgresql://a@h/d?password=QueryPWzz: refused", "error: storage postgresql://a@h/d?password=***: refused"),
    ("postgresql://u:p%40w@h/db", "postgresql://u:***@h/db"),                        # percent-encoded
    ("postgresql://u:p/w@h/db", "postgresql://u:***@h/db"),                          # a "/" in the password
    ("postgresql://h:5432/db?sslmode=require", "postgresql://h:5432/db?sslmode=require"),   # nothing secret
])
def test_redact_masks_every_password_form(text, want):
    assert redact(text) == want


def test_registered_url_secrets_are_masked_anywhere():
    # a password given on the command line is hidden wherever a message repeats it, in or out of its URL
    from autotune.errors import register_secrets
    register_secrets(["show", "--storage=postgresql://bob:hunter 22@h/db?sslpassword=KeyPWyy"])
    assert redact("driver said: password 'hunter 22' wrong; key KeyPWyy") == "driver said: password '***' wrong; key ***"
    assert redact("at postgresql://bob:hunter 22@h/db?sslpassword=KeyPWyy: no") == \
        "at postgresql://bob:***@h/db?sslpassword=***: no"


@pytest.mark.parametrize("url", [
    "postgresql+psycopg://alice@127.0.0.1:1/db?password=QueryPWs3cret",
    "postgresql+psycopg://alice@127.0.0.1:1/db?PASSWORD=s3cretQ",
    "postgresql+psycopg://alice:pa s3cret@127.0.0.1:1/db",
    "postgresql+psycopg://alice:pa s3cret@127.0.0.1:1/db?sslpassword=s3cretK",
])
def test_password_forms_never_printed_by_the_cli(url):
    pytest.importorskip("psycopg")
    for args in (RUN + ["--trials", "1", "--storage", url], ["show", "--storage", url], ["show", f"--storage={url}"]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2 and "s3cret" not in r.output and "***" in r.output, r.output


def test_missing_driver_advice_fits_the_scheme():
    from autotune.study.storage import driver_hint
    # psycopg2 named in the scheme: install psycopg2, not the psycopg 3 extra as the only advice
    assert driver_hint("postgresql+psycopg2://a@h/d").startswith("pip install psycopg2-binary")
    assert driver_hint("postgresql+psycopg://a@h/d").startswith("pip install 'psycopg[binary]")
    import sqlalchemy
    # plain postgresql://: SQLAlchemy's default driver, psycopg from 2.1 on, psycopg2 before (its changelog)
    major_minor = tuple(int(x) for x in sqlalchemy.__version__.split(".")[:2])
    want = "pip install 'psycopg[binary]" if major_minor >= (2, 1) else "pip install psycopg2-binary"
    assert driver_hint("postgresql://a@h/d").startswith(want)
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        r = CliRunner().invoke(main, ["show", "--storage", "postgresql+psycopg2://me:s3cret@127.0.0.1:1/db"])
        assert r.exit_code == 2 and "psycopg2-binary" in r.stderr and "autotune[postgres]" not in r.stderr, r.stderr
        assert "s3cret" not in r.output


def test_password_never_printed_by_run_or_show():
    url = "postgresql+psycopg://me:s3cret@127.0.0.1:1/db"   # port 1: nothing listens, refused at once
    for args in (RUN + ["--trials", "1", "--storage", url], ["show", "--storage", url]):
        r = CliRunner().invoke(main, args)
        assert "s3cret" not in r.output and "me:***@127.0.0.1" in r.output, r.output


# ---- classification
def _wrapped(msg: str) -> Exception:
    """An Optuna StorageInternalError caused by a SQLAlchemy OperationalError, as RDBStorage raises them."""
    import sqlalchemy.exc
    try:
        try:
            raise sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception(msg))
        except Exception as e:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from e
    except Exception as e:
        return e


@pytest.mark.parametrize("msg,kind", [
    ("server closed the connection unexpectedly", "transient"),
    ("terminating connection due to administrator command", "transient"),
    ("database is locked", "transient"),
    ("database or disk is full", "permanent"),
    ("attempt to write a readonly database", "permanent"),
    ("database disk image is malformed", "permanent"),
    ("unable to open database file", "permanent"),
])
def test_storage_errors_are_classified(msg, kind):
    from autotune.study.faults import classify
    assert classify(_wrapped(msg)) == kind
    assert classify(ValueError(msg)) is None        # not from a storage: not ours to classify


def test_transient_errors_are_retried_then_succeed_and_permanent_ones_are_one_line():
    from autotune.study.faults import with_retries
    calls, slept = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise _wrapped("server closed the connection unexpectedly")
        return "ok"
    # two failures, then success: three calls, two back-offs of 0.2 and 0.4 s (x 0.75-1.25 jitter)
    assert with_retries(flaky, "postgresql://u:pw@h/db", sleep=slept.append) == "ok"
    assert len(calls) == 3 and len(slept) == 2 and 0.15 <= slept[0] <= 0.25 and 0.3 <= slept[1] <= 0.5

    def full():
        raise _wrapped("database or disk is full")
    with pytest.raises(StorageError) as ei:
        with_retries(full, "postgresql://u:pw@h/db", sleep=slept.append)
    assert "disk (or quota) is full" in str(ei.value) and "u:***@h" in str(ei.value) and "pw" not in str(ei.value)


# ---- a real full disk and a read-only file system (a 1 MiB tmpfs; needs root to mount)
@pytest.fixture
def tiny_fs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a 1 MiB tmpfs needs root (CI runs as root)")
    d = tmp_path / "m"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield d
    subprocess.run(["umount", "-l", str(d)], capture_output=True)


def _fill(d: Path, leave_kib: int) -> Path:
    st = os.statvfs(d)
    free_kib = st.f_bavail * st.f_frsize // 1024
    f = d / "fill"
    f.write_bytes(b"\0" * max(0, (free_kib - leave_kib)) * 1024)
    return f


def _integrity(db: Path) -> tuple[str, dict[str, int]]:
    con = sqlite3.connect(db)
    try:
        ok = con.execute("PRAGMA integrity_check").fetchone()[0]
        states = dict(con.execute("SELECT state, COUNT(*) FROM trials GROUP BY state").fetchall())
    finally:
        con.close()
    return ok, states


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_full_disk_is_one_clean_line_and_loses_nothing(tiny_fs, tmp_path, kind):
    url = f"sqlite:///{tiny_fs / 'a.db'}" if kind == "sqlite" else f"journal:{tiny_fs / 'j.log'}"
    env = dict(_env(), AUTOTUNE_STATE_DIR=str(tmp_path / "state"))     # where unwritable reasons wait (not full)
    r = subprocess.run([sys.executable, "-m", "autotune", *RUN, "--trials", "3", "--storage", url], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # ~200 KiB left: the run below (seed 5, the same writes every time) fills it with a trial in flight, whose
    # FAIL reason the full disk cannot take (SQLite cannot insert it, the journal cannot append it)
    fill = _fill(tiny_fs, 200)
    # each command in its own process, as a user runs them (SQLite's locks and pooled connections are per process)
    r = subprocess.run([sys.executable, "-m", "autotune", "run", "--size", "8b", "--seed", "5", "--trials", "300",
                        "--storage", url], env=env, capture_output=True, text=True)
    line = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and "Traceback" not in r.stderr and "(a bug" not in r.stderr, r.stderr
    assert line.startswith("error: ") and "disk (or quota) is full" in line and url in line, line
    assert len(list((tmp_path / "state").glob("unwritten-*.json"))) == 1        # the reason waits in a note
    fill.unlink()
    r = subprocess.run([sys.executable, "-m", "autotune", "show", "--storage", url], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0 and "stopped by a storage fault recorded at" in r.stdout, r.stdout + r.stderr
    # afterwards: the next run (on another study of the storage) writes the reason, succeeds, leaves nothing
    # RUNNING, and every FAIL has its reason
    r = subprocess.run([sys.executable, "-m", "autotune", *RUN, "--trials", "2", "--storage", url], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    st = optuna.load_study(study_name=next(s.study_name for s in optuna.get_all_study_summaries(
        _storage(url)) if "space=small" in s.study_name), storage=_storage(url))
    states = [t.state for t in st.get_trials()]
    assert states.count(optuna.trial.TrialState.COMPLETE) >= 5
    reasons = []
    for s in optuna.get_all_study_summaries(_storage(url)):
        trials = optuna.load_study(study_name=s.study_name, storage=_storage(url)).get_trials()
        assert [t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING] == []
        fails = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
        assert all(t.user_attrs.get("fail_reason") for t in fails), [t.number for t in fails]
        reasons += [t.user_attrs["fail_reason"] for t in fails]
    assert [x for x in reasons if x.startswith("storage fault: ") and "disk (or quota) is full" in x
            and "(recorded at " in x], reasons
    assert list((tmp_path / "state").glob("unwritten-*.json")) == []           # written: the note is gone
    r = subprocess.run([sys.executable, "-m", "autotune", "show", "--storage", url], env=env, capture_output=True,
                       text=True)
    assert "1 trial(s) stopped by a storage fault, e.g. storage " in r.stdout, r.stdout
    if kind == "sqlite":
        assert _integrity(tiny_fs / "a.db")[0] == "ok"


def _storage(url):
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend
        return optuna.storages.JournalStorage(JournalFileBackend(url[len("journal:"):]))
    return url


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_read_only_file_system_is_one_clean_line(tiny_fs, kind):
    url = f"sqlite:///{tiny_fs / 'a.db'}" if kind == "sqlite" else f"journal:{tiny_fs / 'j.log'}"
    r = subprocess.run([sys.executable, "-m", "autotune", *RUN, "--trials", "2", "--storage", url], env=_env(),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["mount", "-o", "remount,ro", str(tiny_fs)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot remount read-only: {r.stderr.strip()}")
    try:
        r = subprocess.run([sys.executable, "-m", "autotune", *RUN, "--trials", "2", "--storage", url], env=_env(),
                           capture_output=True, text=True)
        line = r.stderr.strip().splitlines()[-1]
        assert r.returncode == 2 and line.startswith("error: ") and "Traceback" not in r.stderr, r.stderr
        assert "not writable" in line or "read-only" in line, line
        r = subprocess.run([sys.executable, "-m", "autotune", "show", "--storage", url], env=_env(),
                           capture_output=True, text=True)       # reading still works
        assert r.returncode == 0 and "space=small" in r.stdout, r.stderr
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(tiny_fs)], capture_output=True)


# ---- a torn journal record: read without it, repaired with a backup
@pytest.fixture
def journal(tmp_path):
    p = tmp_path / "j.log"
    assert CliRunner().invoke(main, RUN + ["--trials", "3", "--storage", f"journal:{p}"]).exit_code == 0
    return p


def test_torn_journal_is_read_without_its_last_record_and_repaired(journal):
    whole = journal.read_bytes()
    n_records = whole.count(b"\n")
    journal.write_bytes(whole + b'{"op_code": 6, "worker_id": "x", "trial_id": 3, "sta')    # a write cut short
    torn = journal.read_bytes()
    url = f"journal:{journal}"
    r = CliRunner().invoke(main, ["show", "--storage", url])
    assert r.exit_code == 0 and "space=small" in r.output, r.output
    assert f"({n_records} whole records)" in r.stderr
    assert journal.read_bytes() == torn                          # show reads a copy: the file is untouched
    r = CliRunner().invoke(main, ["repair", url])
    assert r.exit_code == 0 and f"{n_records} whole records kept" in r.output, r.output
    assert journal.read_bytes() == whole                         # exactly the whole records
    backups = list(journal.parent.glob("j.log.torn-*.bak"))
    assert len(backups) == 1 and backups[0].read_bytes() == torn
    r = CliRunner().invoke(main, ["repair", url])
    assert r.exit_code == 0 and "nothing to repair" in r.output
    # run on a torn journal repairs it itself and tunes on
    journal.write_bytes(whole + b'{"op_code": 6, "tri')
    r = CliRunner().invoke(main, RUN + ["--trials", "2", "--storage", url])
    assert r.exit_code == 0 and f"{n_records} whole records kept" in r.stderr, r.output


# ---- stale trials of dead workers
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_trial_of_a_dead_worker_is_failed_with_the_reason(tmp_path, kind):
    import socket
    url = f"sqlite:///{tmp_path / 'a.db'}" if kind == "sqlite" else f"journal:{tmp_path / 'j.log'}"
    assert CliRunner().invoke(main, RUN + ["--trials", "2", "--storage", url]).exit_code == 0
    name = optuna.get_all_study_summaries(_storage(url))[0].study_name
    st = optuna.load_study(study_name=name, storage=_storage(url))
    # a trial left RUNNING by a worker on this host whose process is gone (what kill -9 leaves)
    t = st.ask()
    pid = _dead_pid()
    t.set_user_attr("worker", {"host": socket.gethostname(), "pid": pid, "proc_start": None, "started": 0})
    r = CliRunner().invoke(main, ["show", "--storage", url])
    assert "1 running now" in r.output, r.output
    r = CliRunner().invoke(main, RUN + ["--trials", "1", "--storage", url])
    assert r.exit_code == 0, r.output
    ft = optuna.load_study(study_name=name, storage=_storage(url)).trials[t.number]
    assert ft.state == optuna.trial.TrialState.FAIL
    assert ft.user_attrs["fail_reason"].startswith(f"stale: its worker (pid {pid} on ")
    r = CliRunner().invoke(main, ["show", "--storage", url])
    assert "1 trial(s) of dead workers marked failed" in r.output, r.output


def test_kill_9_mid_run_leaves_nothing_running_after_the_next_run(tmp_path):
    url = f"sqlite:///{tmp_path / 'a.db'}"
    p = subprocess.Popen([sys.executable, "-m", "autotune", "run", "--size", "8b", "--trials", "100000",
                          "--storage", url], env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):            # until it has finished a few trials (polled, no time budget asserted)
            time.sleep(0.2)
            if (tmp_path / "a.db").exists():
                try:
                    con = sqlite3.connect(f"file:{tmp_path / 'a.db'}?mode=ro", uri=True)
                    n = con.execute("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
                    con.close()
                    if n >= 3:
                        break
                except sqlite3.Error:
                    pass
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    r = subprocess.run([sys.executable, "-m", "autotune", "run", "--size", "8b", "--trials", "1", "--storage", url],
                       env=_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ok, states = _integrity(tmp_path / "a.db")
    assert ok == "ok" and "RUNNING" not in states, states
    con = sqlite3.connect(tmp_path / "a.db")
    reasonless = con.execute("SELECT COUNT(*) FROM trials t WHERE state = 'FAIL' AND NOT EXISTS (SELECT 1 FROM "
                             "trial_user_attributes a WHERE a.trial_id = t.trial_id AND a.key = 'fail_reason')").fetchone()[0]
    con.close()
    assert reasonless == 0


def test_a_single_run_fails_an_orphan_left_just_before_it(tmp_path):
    # What test_kill_9_mid_run... hits when the kill lands between Optuna creating a trial and the worker
    # stamping it (one clean-clone CI run of 0e6bbe2, session 4; its rerun passed): the orphan has no worker
    # record, so it is failed only once it is UNSTAMPED_GRACE_S (10 s) old, and a 1-trial run ended sooner
    # and left it RUNNING. Made here on purpose:
    # an unstamped RUNNING trial created right before the run; the run waits it out and fails it with a reason.
    url = f"sqlite:///{tmp_path / 'a.db'}"
    args = [sys.executable, "-m", "autotune", "run", "--size", "8b", "--trials", "1", "--storage", url]
    assert subprocess.run(args, env=_env(), capture_output=True, text=True).returncode == 0
    (name,) = optuna.get_all_study_names(url)
    study = optuna.load_study(study_name=name, storage=url)
    orphan = study._storage.create_new_trial(study._study_id)          # RUNNING, no "worker" stamp
    r = subprocess.run(args, env=_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    t = optuna.load_study(study_name=name, storage=url)._storage.get_trial(orphan)
    assert t.state == optuna.trial.TrialState.FAIL
    assert "no worker recorded itself on it" in t.user_attrs["fail_reason"]


# ---- foreign studies: refused, every byte and side file as it was
def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_plain_optuna_study_with_autotunes_name_is_refused_untouched(tmp_path, kind):
    url = f"sqlite:///{tmp_path / 'a.db'}" if kind == "sqlite" else f"journal:{tmp_path / 'j.log'}"
    name = "llama3.1-8b/b200x8/nvlink5+ib-ndr400/megatron/seq8192-gbs128/space=small"
    st = optuna.create_study(study_name=name, storage=_storage(url), direction="maximize")
    st.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    del st
    files = {p.name: _sha(p) for p in tmp_path.iterdir()}
    line = _clean_error(CliRunner().invoke(main, RUN + ["--trials", "1", "--storage", url]))
    assert "not made by autotune" in line, line
    assert {p.name: _sha(p) for p in tmp_path.iterdir()} == files        # no -wal/-shm, no record appended


def test_autotune_study_holding_a_foreign_trial_is_refused_for_tuning_and_export(tmp_path):
    url = f"sqlite:///{tmp_path / 'a.db'}"
    assert CliRunner().invoke(main, RUN + ["--trials", "2", "--storage", url]).exit_code == 0
    name = optuna.get_all_study_summaries(url)[0].study_name
    st = optuna.load_study(study_name=name, storage=url)
    st.add_trial(optuna.trial.create_trial(value=0.99, params={}, distributions={}))    # plain Optuna's trial
    for args in (RUN + ["--trials", "1", "--storage", url],
                 ["export", "--size", "8b", "--space", "small", "--storage", url, "-o", str(tmp_path / "p.yaml")]):
        line = _clean_error(CliRunner().invoke(main, args))
        assert "not made by autotune" in line and "trial 2" in line, line
    assert not (tmp_path / "p.yaml").exists()


# ---- Slurm job script: no unquoted user text
def test_slurm_options_are_checked_and_the_script_holds_no_hostile_text(tmp_path):
    from autotune.launchers.slurm import batch_script, check_slurm_options
    hostile = ["gpu\n#SBATCH --wrap=reboot", "a b", "$(reboot)", "`id`", "a;b", "'", '"', "a\rb"]
    for v in hostile:
        for key in ("partition", "account"):
            with pytest.raises(ConfigError, match=f"--{key}"):
                batch_script(["-m", "w"], nodes=1, nproc_per_node=8, wd=tmp_path, timeout_s=60,
                             options={key: v}, gpus=True)
    with pytest.raises(ConfigError, match="--time"):
        batch_script(["-m", "w"], nodes=1, nproc_per_node=8, wd=tmp_path, timeout_s=60,
                     options={"time": "1\n#SBATCH --x"}, gpus=True)
    with pytest.raises(ConfigError, match="16 GPUs"):                   # 1 node x 8 != the plan's 16
        check_slurm_options({"nodes": 1, "gpus_per_node": 8}, 16, need_sbatch=False)
    check_slurm_options({"nodes": 2, "gpus_per_node": 8, "time": "1-00:30:00", "partition": "gpu,debug",
                         "account": "proj_1"}, 16, need_sbatch=False)
    text = batch_script(["-m", "autotune.runtime.worker", "--plan", str(tmp_path / "p q.yaml")], nodes=2,
                        nproc_per_node=8, wd=tmp_path, timeout_s=60,
                        options={"partition": "gpu,debug", "account": "proj_1", "time": "00:20:00"}, gpus=True)
    # every #SBATCH value is a checked plain word (no path: Slurm would expand %j and drop backslashes in
    # one); the work directory and the worker argv are shell-quoted in the script body
    assert "#SBATCH --partition=gpu,debug\n" in text and "#SBATCH --account=proj_1\n" in text
    assert not [ln for ln in text.splitlines() if ln.startswith("#SBATCH") and str(tmp_path) in ln]
    assert f"cd -- {tmp_path} || exit 1\n" in text and f"'{tmp_path / 'p q.yaml'}'" in text


# ---- temporary directories of a trial
def test_trial_temp_dir_is_removed_whatever_the_outcome(monkeypatch, tmp_path):
    import tempfile

    from autotune.runtime import launch
    from autotune.spec.models import get_model
    from autotune.spec.plan import Plan, PlanDocument, Workload

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made = []

    class Boom:
        def __init__(self, cmd, **kw):
            made.append(kw["cwd"])
            raise OSError("torchrun cannot start")
    monkeypatch.setattr(launch.subprocess, "Popen", Boom)
    doc = PlanDocument(plan=Plan(), model=get_model("8b"), gpu="h200", num_gpus=1,
                       fabric={"name": "x"}, workload=Workload(seq_len=8192, global_batch_size=8))
    with pytest.raises(OSError):
        launch.run_plan(doc, nproc=1, timeout_s=5)
    assert made and not Path(made[0]).exists() and not list(tmp_path.glob("autotune-run-*"))


def test_space_setting_the_engine_cannot_run_is_warned(tmp_path):
    sp = tmp_path / "s.yaml"
    sp.write_text("schema_version: 1\nname: mine\nknobs:\n  tp_degree: [1, 2]\n  tp_comm_overlap: [true]\n")
    r = CliRunner().invoke(main, ["run", "--size", "8b", "--space", str(sp), "--engine", "native", "--trials", "1",
                                  "--storage", f"sqlite:///{tmp_path / 'a.db'}"])
    assert r.exit_code == 0, r.output
    assert "warning:" in r.stderr and "tp_comm_overlap: [true] cannot run on engine native" in r.stderr, r.stderr


# ---- a reason the storage cannot take waits in a note, and the next run writes it
def test_unwritable_reason_is_noted_and_written_by_the_next_run(tmp_path, monkeypatch):
    from autotune.study.stale import apply_notes, fail_trials, pending_notes
    monkeypatch.setenv("AUTOTUNE_STATE_DIR", str(tmp_path / "state"))
    url = f"sqlite:///{tmp_path / 'a.db'}"
    st = optuna.create_study(storage=url)
    t1, t2 = st.ask(), st.ask()
    storage = st._storage

    class Full:     # the storage as a full disk leaves it: reads work, every write is refused
        def __getattr__(self, name):
            if name.startswith("set_"):
                def refuse(*a, **k):
                    raise sqlite3.OperationalError("database or disk is full")
                return refuse
            return getattr(storage, name)
    assert fail_trials(Full(), {t1._trial_id: "storage fault: disk full"}, url=url) == 0
    (note,) = pending_notes(url)
    assert (note["trial_id"], note["number"], note["reason"]) == (t1._trial_id, t1.number, "storage fault: disk full")
    assert pending_notes(f"sqlite:///{tmp_path}/../{tmp_path.name}/./a.db")     # one file, any spelling
    assert not pending_notes(f"sqlite:///{tmp_path / 'b.db'}")                   # not another file's
    assert apply_notes(Full(), url) == 0 and len(pending_notes(url)) == 1   # still full: the note is kept
    assert apply_notes(storage, url) == 1 and pending_notes(url) == []
    ft = storage.get_trial(t1._trial_id)
    assert ft.state == optuna.trial.TrialState.FAIL
    assert ft.user_attrs["fail_reason"] == f"storage fault: disk full (recorded at {note['recorded_at']}; " \
                                           "written by a later run)"
    assert storage.get_trial(t2._trial_id).state == optuna.trial.TrialState.RUNNING   # not noted: untouched


def test_a_full_tmp_of_the_trial_with_a_working_storage_is_an_ordinary_failed_trial(tmp_path):
    import errno

    from autotune.study.faults import storage_guarded
    st = optuna.create_study(storage=f"sqlite:///{tmp_path / 'a.db'}")

    def objective(trial):      # the evaluator met a full /tmp (not the storage's file system)
        raise OSError(errno.ENOSPC, "No space left on device", "/tmp/autotune-run-x/plan.yaml")
    st.optimize(storage_guarded(objective, "sqlite:///a.db"), n_trials=1, catch=(Exception,))
    (t,) = st.trials
    assert t.state == optuna.trial.TrialState.FAIL and "No space left on device" in t.user_attrs["fail_reason"]
