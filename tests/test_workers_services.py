"""Workers and launchers against real services that .ci/run starts (.ci/services.sh): a PostgreSQL server
on 127.0.0.1 ($AUTOTUNE_TEST_POSTGRES_URL) and a single-node Slurm ($AUTOTUNE_TEST_SLURM=1 and SLURM_CONF).
Without those variables the tests skip and say which variable is missing; nothing here is mocked."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid

import optuna
import pytest

from autotune.study.storage import _STORAGES, open_storage
from workers_harness import ROOT, start_worker

PG_URL = os.environ.get("AUTOTUNE_TEST_POSTGRES_URL")
SLURM = os.environ.get("AUTOTUNE_TEST_SLURM") == "1" and bool(os.environ.get("SLURM_CONF"))
needs_pg = pytest.mark.skipif(not PG_URL, reason="no PostgreSQL: set AUTOTUNE_TEST_POSTGRES_URL (.ci/run starts "
                                                 "one with .ci/services.sh)")
needs_slurm = pytest.mark.skipif(not SLURM, reason="no Slurm: set AUTOTUNE_TEST_SLURM=1 and SLURM_CONF (.ci/run "
                                                   "starts a single-node Slurm with .ci/services.sh)")


def _env():
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return e


@pytest.fixture
def fresh_pg_url():
    """A new, empty database on the test server (dropped after the test)."""
    psycopg = pytest.importorskip("psycopg", reason="psycopg 3 (the autotune[postgres] extra) is not installed")
    name = f"autotune_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    yield PG_URL.rsplit("/", 1)[0] + "/" + name
    _STORAGES.clear()  # release this process's connections before the drop
    with psycopg.connect(PG_URL, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _trials(url):
    st = open_storage(url)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    (name,) = optuna.get_all_study_names(st)
    return optuna.load_study(study_name=name, storage=st).get_trials()


@needs_pg
@pytest.mark.slow
def test_four_workers_on_a_fresh_postgresql_database(fresh_pg_url, tmp_path):
    # issue 11: 4 workers x 20 trials -> 80 trials in one study, each worker reports its own 20; the
    # database is new, so the 4 processes race to create Optuna's tables and the study
    # --no-early-stop: every worker runs its 20 trials (issue 26's convergence stop would end them earlier)
    r = subprocess.run([sys.executable, "-m", "autotune", "run", "--size", "8b", "--trials", "20", "--workers", "4",
                        "--no-early-stop", "--storage", fresh_pg_url], cwd=tmp_path, env=_env(), capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for wid in range(4):
        assert re.search(rf"^worker {wid}: 20 trials run", r.stdout, re.M), r.stdout
    trials = _trials(fresh_pg_url)
    assert len(trials) == 80 and all(t.state.is_finished() for t in trials)
    distinct = len({json.dumps(t.params, sort_keys=True) for t in trials})
    print(f"postgresql 4 x 20: {distinct} distinct parameter sets of 80")
    assert distinct > 20   # the former private copies: 4 identical streams -> at most 20 distinct


@needs_pg
def test_postgresql_url_opens_with_the_extra_driver(fresh_pg_url):
    st = open_storage(fresh_pg_url)
    assert isinstance(st, optuna.storages.RDBStorage) and st.engine.dialect.driver == "psycopg"


@needs_pg
@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("AUTOTUNE_TEST_POSTGRES_RESTART"),
                    reason="no way to restart the server: set AUTOTUNE_TEST_POSTGRES_RESTART (.ci/services.sh does)")
def test_postgresql_restart_during_four_workers_ends_with_the_best_plan(fresh_pg_url, tmp_path):
    # issue 25: a server restart mid-run made the 4 in-flight trials FAIL without a reason and the parent exit 1
    # (a stale pooled connection); now: exit 0, the best plan printed, every FAIL with its reason
    import shlex
    import time
    p = subprocess.Popen([sys.executable, "-m", "autotune", "run", "--size", "8b", "--trials", "60", "--workers", "4",
                          "--no-early-stop", "--storage", fresh_pg_url], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    import psycopg
    for _ in range(1200):               # until the workers have finished some trials (polled)
        time.sleep(0.25)
        try:
            with psycopg.connect(fresh_pg_url.replace("+psycopg", ""), connect_timeout=2) as c:
                n = c.execute("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
            if n >= 20:
                break
        except Exception:  # noqa: BLE001 - tables not made yet
            pass
    r = subprocess.run(shlex.split(os.environ["AUTOTUNE_TEST_POSTGRES_RESTART"]), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out, err = p.communicate(timeout=900)
    assert p.returncode == 0, out[-2000:] + err[-2000:]
    assert "best plan: trial" in out and "unexpected" not in err and "(a bug" not in err, err[-2000:]
    _STORAGES.clear()
    trials = _trials(fresh_pg_url)
    fails = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    print(f"postgresql restart during 4 x 60: {len(trials)} trials, {len(fails)} failed: "
          f"{sorted({str(t.user_attrs.get('fail_reason'))[:80] for t in fails})}")
    assert [t.number for t in trials if not t.state.is_finished()] == []
    assert all(t.user_attrs.get("fail_reason") for t in fails)


@needs_slurm
@pytest.mark.slow
def test_real_trial_through_the_local_slurm(tmp_path):
    # a real CPU (gloo, 2 ranks) trial of the tiny Llama as a Slurm job; its result lands in the study like
    # a local one (COMPLETE, feasible, measured step time, backend real) and names its job
    # the trial's work directory (under $TMPDIR) is hostile: the job must get its paths verbatim (issue 25)
    tmp = tmp_path / f"t 'q' $(touch {tmp_path}/CANARY) `touch {tmp_path}/CANARY`; #%j \\ ü"
    tmp.mkdir(parents=True)
    url = f"sqlite:///{tmp_path}/s.db"
    w = start_worker(url, launcher="slurm", heartbeat_s=5, env={"TMPDIR": str(tmp)}, log=tmp_path / "w.log")
    assert w.wait(timeout=300) == 0, (tmp_path / "w.log").read_text()[-2000:]
    assert not (tmp_path / "CANARY").exists() and list(tmp.glob("autotune-run-*")) == []  # no injection ran;
    # the trial's work directory is removed (torch leaves torchelastic_* / torchinductor_* of its own there)
    (t,) = _trials(url)
    assert t.state.name == "COMPLETE" and t.user_attrs["feasible"] is True and t.user_attrs["backend"] == "real"
    assert t.user_attrs["step_time_ms"] > 0
    d = t.user_attrs["details"]
    assert d["launcher"] == "slurm" and str(d["slurm_job_id"]).isdigit()
    info = subprocess.run(["scontrol", "show", "job", "-o", str(d["slurm_job_id"])], capture_output=True, text=True)
    assert "JobState=COMPLETED" in info.stdout, info.stdout + info.stderr


@needs_slurm
@pytest.mark.slow
def test_slurm_trial_timeout_cancels_the_job(tmp_path):
    from autotune.spec.hardware import ClusterSpec, get_fabric, get_gpu
    from autotune.spec.plan import Plan, PlanDocument, Workload
    from autotune.runtime.launch import run_plan
    sys.path.insert(0, str(ROOT / "tests" / "runtime"))
    from runtime_harness import TINY

    doc = PlanDocument(plan=Plan(dp_degree=2, micro_batch_size=1, num_micro_batches=2, zero_stage=3,
                                 param_gather_overlap=True),
                       model=TINY, gpu="h200", num_gpus=2, fabric=get_fabric("nvlink4").to_dict(),
                       workload=Workload(seq_len=32, global_batch_size=4))
    # a loaded machine may still be starting the ranks when a short limit ends (reported as that phase):
    # retried with a 4x longer limit until the ranks hung in a step
    for limit in (25, 100, 400):
        res = run_plan(doc, steps=2, warmup=1, timeout_s=limit, device="cpu", workdir=tmp_path / f"run{limit}",
                       env={"AUTOTUNE_RUNTIME_FAULT": "hang:step"}, launcher={"kind": "slurm"})
        assert res["status"] == "timeout" and res["reason"].startswith(f"timed out after {limit} s in "), res
        assert res["slurm_state"] == "CANCELLED", res
        if f"timed out after {limit} s in step" in res["reason"]:
            break
    assert f"timed out after {limit} s in step" in res["reason"], res
