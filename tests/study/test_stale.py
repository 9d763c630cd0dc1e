"""Orphan trials (issue 25): a RUNNING trial that no worker stamped is failed with its reason once it is
UNSTAMPED_GRACE_S old; a stamped trial of a live worker is left alone (autotune/study/stale.py)."""

from __future__ import annotations

import datetime

import optuna
from optuna.trial import TrialState

from autotune.study import stale


def _study(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 's.db'}")


def test_unstamped_running_trial_is_an_orphan_only_after_the_grace(tmp_path):
    st = _study(tmp_path)
    tid = st._storage.create_new_trial(st._study_id)           # RUNNING, no worker stamp (as after a lost INSERT)
    t = st._storage.get_trial(tid)
    start = t.datetime_start.astimezone().timestamp()        # Optuna stores naive local times
    # 5 s < 10 s grace: a worker may still be about to stamp it; 11 s > 10 s: an orphan
    assert stale.stale_reason(t, now=start + 5) is None
    reason = stale.stale_reason(t, now=start + 11)
    assert reason.startswith(stale.STALE_PREFIX) and "no worker recorded itself" in reason


def test_reap_after_run_fails_the_orphan_and_keeps_a_live_workers_trial(tmp_path, monkeypatch):
    monkeypatch.setattr(stale, "UNSTAMPED_GRACE_S", 0.2)
    st = _study(tmp_path)
    orphan = st._storage.create_new_trial(st._study_id)
    live = st._storage.create_new_trial(st._study_id)
    st._storage.set_trial_user_attr(live, "worker", stale.worker_stamp())    # this process: alive
    n = stale.reap_after_run(st, grace_s=0.2)                   # waits until the orphan is 0.2 s old
    assert n == 1
    a, b = st._storage.get_trial(orphan), st._storage.get_trial(live)
    assert a.state == TrialState.FAIL and "no worker recorded itself" in a.user_attrs["fail_reason"]
    assert b.state == TrialState.RUNNING
    assert isinstance(a.datetime_start, datetime.datetime)
