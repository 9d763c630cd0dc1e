"""Issue 26, ``--workers N`` CPU: what a worker reads from the storage per trial, and what it takes over from
the process that ranked the layouts before forking it."""

from __future__ import annotations

import logging

import optuna
import pytest

from autotune.search import make_sampler, shared
from autotune.search.sampler import CLAIM_ATTR, plain_plan
from autotune.search.shared import trials_holding
from autotune.search.space import plan_params
from autotune.spec.plan import Workload
from autotune.tune.tuner import Tuner

from test_convergence import CLUSTER, MODEL, W


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def _sampler(t: Tuner, workload: Workload = W):
    return make_sampler(t.bound, model=MODEL, cluster=CLUSTER, workload=workload, engine=t.engine, seed=0)


def test_a_forked_worker_takes_over_the_rankers_caches(tmp_path, monkeypatch):
    t = Tuner(model=MODEL, cluster=CLUSTER, workload=W, space="default", storage=f"sqlite:///{tmp_path}/s.db")
    first = _sampler(t)
    first.rank(t.study)
    assert shared._RANKED_HERE[0][1] is first
    # in the process that ranked: a second sampler reads the stored ranking into its own, fresh screen
    same = _sampler(t)
    same.rank(t.study)
    assert same.ranking_source == "storage" and same.screen is not first.screen
    # in a process forked from it (another process id): the ranker's screen and plan cache are taken over
    monkeypatch.setattr(shared, "_RANKED_HERE", [(-1, first)])
    child = _sampler(t)
    child.rank(t.study)
    assert child.ranking_source == "storage"
    assert child.screen is first.screen and child._plan_cache is first._plan_cache
    # ... and give what a sampler that computed everything itself gives: layouts, neighbours and their order
    alone = _sampler(t)
    assert child.layouts() == alone.layouts()
    best = alone.layouts()[0]
    assert child._ranked_neighbours(best) == alone._ranked_neighbours(best)
    # another target (another workload) takes nothing over, even with the same ranking key
    other = _sampler(t, Workload.from_tokens(seq_len=4096, global_batch_tokens=2**20))
    assert other.ranking_key() == first.ranking_key()
    assert not other._adopt_warm() and other.screen is not first.screen


def test_claim_holders_are_read_from_the_tables(tmp_path):
    # the claim check's read: the trials whose claim system attribute or `plan` user attribute is the plan,
    # compared here with a full read of every trial (what the check read before)
    t = Tuner(model=MODEL, cluster=CLUSTER, workload=W, space="default", storage=f"sqlite:///{tmp_path}/s.db")
    plans = [plain_plan(q) for q in _sampler(t).layouts()[:3]]
    study = t.study
    st = study._storage
    for holder in [("claim", 0), ("plan", 0), ("claim", 1), ("none", 0), ("plan", 1), ("claim", 0)]:
        tid = st.create_new_trial(study._study_id)
        kind, i = holder
        if kind == "claim":
            st.set_trial_system_attr(tid, CLAIM_ATTR, plans[i])
        elif kind == "plan":
            st.set_trial_user_attr(tid, "plan", plans[i])
    every = st.get_all_trials(study._study_id, deepcopy=False)
    for d in plans:
        want = sorted(x.number for x in every if x.system_attrs.get(CLAIM_ATTR) == d or x.user_attrs.get("plan") == d)
        assert sorted(trials_holding(study, d, CLAIM_ATTR, "plan")) == want
    assert sorted(trials_holding(study, plans[0], CLAIM_ATTR, "plan")) == [0, 1, 5]
    assert trials_holding(study, plans[2], CLAIM_ATTR, "plan") == []
    # a storage that is not an RDB: None (the caller reads every trial)
    journal = optuna.create_study(storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "j.log"))))
    assert trials_holding(journal, plans[0], CLAIM_ATTR, "plan") is None


def test_one_read_of_the_trials_per_trial_where_ask_made_two(tmp_path, monkeypatch):
    # 6 trials of one worker: Optuna's ask read every trial to find WAITING ones, then the sampler's snapshot
    # read them again; now the snapshot is the first read plus the trial ask created. An enqueued trial is
    # still popped first and run with its parameters.
    from autotune.search.seeding import TrialSeededSampler

    t = Tuner(model=MODEL, cluster=CLUSTER, workload=W, space="small", storage=f"sqlite:///{tmp_path}/s.db", seed=0)
    t.optimize(2, show_progress_bar=False)
    done = {tuple(sorted(x.params.items())) for x in t.study.get_trials(deepcopy=False)}
    queued = next(p for p in map(plan_params, _sampler(t).layouts()) if tuple(sorted(p.items())) not in done)
    t.study.enqueue_trial(queued, user_attrs={"warm_start_from": "queued"})
    reads, views = [], []
    real = optuna.storages._CachedStorage.get_all_trials

    def counting(self, *a, **kw):
        reads.append(1)
        return real(self, *a, **kw)

    real_before = TrialSeededSampler.before_trial

    def before(self, study, trial):
        real_before(self, study, trial)
        views.append((trial.number, [x.number for x in self._view._trials], self._view._trials[-1] is trial))

    monkeypatch.setattr(optuna.storages._CachedStorage, "get_all_trials", counting)
    monkeypatch.setattr(TrialSeededSampler, "before_trial", before)
    t.optimize(4, show_progress_bar=False)
    n_reads = len(reads)
    assert len(views) == 4
    for number, seen, last in views:
        assert seen == list(range(number + 1)) and last       # every earlier trial, then this one
    trials = t.study.get_trials(deepcopy=False)
    assert [x.number for x in trials if x.user_attrs.get("warm_start_from") == "queued"] == [2]    # popped first
    assert trials[2].state.is_finished() and trials[2].params.items() <= queued.items()     # with its parameters
    # 4 trials: one read of every trial each (the pop's; the claim check reads the matching attributes only),
    # + 3 outside trials (stale trials at the start; waiting for others and the best plan at the end); were
    # 3 each (the pop's, the snapshot's, the claim check's)
    assert n_reads <= 4 + 3


def test_a_worker_waits_for_the_neighbours_another_is_screening(tmp_path, monkeypatch):
    import threading
    import time

    t = Tuner(model=MODEL, cluster=CLUSTER, workload=W, space="default", storage=f"sqlite:///{tmp_path}/s.db")
    study = t.study
    a, b = _sampler(t), _sampler(t)
    a.rank(study)
    b.rank(study)
    a._study = b._study = study
    base = a.layouts()[0]
    key = a._neighbours_key(base)
    # nothing stored, no mark: None (screen here), and this worker's mark is left
    assert b._load_neighbours(base) is None
    mark = shared.study_attr(study, key + shared.BUSY_SUFFIX)
    assert mark["key"] == b.ranking_key() and mark["by"].endswith(f":{__import__('os').getpid()}")
    # another worker's fresh mark: wait for what it stores (a thread stores a's ranked neighbours 0.2 s later)
    ranked = a._ranked_neighbours(base)         # screened by a (its mark is this process's) and stored
    study._storage.set_study_system_attr(study._study_id, key, {"key": "another ranking", "plans": []})
    monkeypatch.setattr(shared, "NEIGHBOURS_WAIT_S", 60.0)
    study._storage.set_study_system_attr(study._study_id, key + shared.BUSY_SUFFIX,
                                         {"by": "elsewhere:1", "at": time.time(), "key": a.ranking_key()})
    store = threading.Timer(0.2, a._store_neighbours, (base, ranked))
    store.start()
    got = b._load_neighbours(base)
    store.join()
    assert got == ranked
    # a mark older than BUSY_STALE_S (its worker died): not waited for
    study._storage.set_study_system_attr(study._study_id, key, {"key": "another ranking", "plans": []})
    study._storage.set_study_system_attr(study._study_id, key + shared.BUSY_SUFFIX,
                                         {"by": "elsewhere:1", "at": time.time() - 2 * shared.BUSY_STALE_S,
                                          "key": a.ranking_key()})
    t0 = time.monotonic()
    assert b._load_neighbours(base) is None and time.monotonic() - t0 < shared.NEIGHBOURS_WAIT_S


def test_a_trial_seen_running_is_read_again_when_it_finishes(tmp_path):
    # another worker's trial that this sampler first saw RUNNING (its claimed plan, no value yet) gets its
    # value once it finishes: the convergence check and local search must see it (a fresh user's
    # `--workers 4` run of 8B said "no better plan since trial 16 (74.84%)" while trials 17 and 20, seen
    # running at first, had reached 75.00% and 74.97%)
    t = Tuner(model=MODEL, cluster=CLUSTER, workload=W, space="default", storage=f"sqlite:///{tmp_path}/s.db")
    s = _sampler(t)
    plan = s.rank(t.study).first()
    other = t.study.ask()                   # "another worker": claimed, parameters not yet written
    other.storage.set_trial_system_attr(other._trial_id, CLAIM_ATTR, plain_plan(plan))
    s._update_history(t.study)
    assert s._history[other.number] == (plan, None)
    other.set_user_attr("plan", plain_plan(plan))
    other.set_user_attr("feasible", True)
    other.set_user_attr("step_time_ms", 1234.5)
    t.study.tell(other, 0.75)
    s._update_history(t.study)
    # the stored value and step time, read now that the trial is COMPLETE
    assert s._history[other.number] == (plan, 0.75) and s._step_ms[other.number] == 1234.5


def test_a_slow_worker_picks_again_from_a_fresh_read(tmp_path):
    # A worker whose trial started from an old snapshot (it sampled slowly while other workers ran) finds its
    # pick claimed; it must pick again from what the others did since, not from the snapshot. Before, every
    # retry re-read the snapshot and took the next layout in rank order, each already another trial's, and
    # after CLAIM_RETRIES the last pick went unchecked: trial 1 evaluated trial 15's plan (--workers 4, 1 run
    # in ~40 under load).
    from autotune.search.sampler import CLAIM_RETRIES
    from autotune.search.seeding import _SnapshotStudy

    t = Tuner(model=MODEL, cluster=CLUSTER, workload=W, space="default", storage=f"sqlite:///{tmp_path}/s.db")
    s = _sampler(t)
    layouts = s.rank(t.study).all()
    study, st = t.study, t.study._storage
    mine = st.create_new_trial(study._study_id)          # trial 0: this worker's, sampled late
    # trials 1 .. CLAIM_RETRIES + 1: other workers', finished, holding the first CLAIM_RETRIES + 1 layouts
    taken = layouts[:CLAIM_RETRIES + 1]
    for q in taken:
        tid = st.create_new_trial(study._study_id)
        st.set_trial_user_attr(tid, "plan", plain_plan(q))
        st.set_trial_state_values(tid, optuna.trial.TrialState.COMPLETE, [0.5])
    current = st.get_trial(mine)
    stale = _SnapshotStudy(study, [], current)          # the snapshot from before the others' trials
    checks = []
    real = s._claimed_earlier

    def counting(study_, trial_, plan_):
        checks.append(plan_)
        return real(study_, trial_, plan_)

    s._claimed_earlier = counting
    s.before_trial(stale, current)
    chosen = s._plan({**s._prefs, **s._chosen[current.number]})
    # layout 0 (trial 0's by its number) was claimed by trial 1: one retry, from the fresh read, takes the
    # first layout nobody holds
    assert chosen not in taken and chosen == layouts[CLAIM_RETRIES + 1]
    assert checks == [layouts[0], chosen]
