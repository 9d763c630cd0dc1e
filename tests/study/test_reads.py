"""autotune.study.reads: TrialReadingRDBStorage reads back exactly what Optuna's own RDBStorage reads, on
studies holding every kind of row Optuna stores for a trial."""

from __future__ import annotations

import os
import uuid

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from autotune.study.reads import TrialReadingRDBStorage

#: .ci/run starts a PostgreSQL (.ci/services.sh)
PG_URL = os.environ.get("AUTOTUNE_TEST_POSTGRES_URL")
KINDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.skipif(
    not PG_URL, reason="no PostgreSQL: set AUTOTUNE_TEST_POSTGRES_URL (.ci/run starts one with .ci/services.sh)"))]


def _view(t: optuna.trial.FrozenTrial) -> tuple:
    # repr: NaN intermediate values compare equal as text (nan != nan as floats); dict order is not compared
    return (t._trial_id, t.number, t.state, repr(t.values), t.datetime_start, t.datetime_complete,
            sorted((k, repr(v)) for k, v in t.params.items()), list(t.params),
            sorted((k, repr(v)) for k, v in t.distributions.items()),
            sorted((k, repr(v)) for k, v in t.user_attrs.items()),
            sorted((k, repr(v)) for k, v in t.system_attrs.items()),
            sorted((k, repr(v)) for k, v in t.intermediate_values.items()))


def _fill(url: str, name: str, directions: list[str]) -> int:
    """A study with complete (finite and infinite values), pruned (intermediate values, NaN among them),
    failed, running and waiting trials; float (log, step), int and categorical parameters (None, bool, str,
    float choices); nested and non-ASCII attributes. Returns its study id."""
    study = optuna.create_study(storage=url, study_name=name, directions=directions)
    n = len(directions)
    dists = {"lr": FloatDistribution(1e-5, 1e-1, log=True), "frac": FloatDistribution(0.0, 1.0, step=0.25),
             "tp_degree": IntDistribution(1, 8, log=True), "layers": IntDistribution(2, 10, step=2),
             "recompute": CategoricalDistribution([None, True, "full", 0.5])}
    for i in range(9):
        t = study.ask(dists)
        t.set_user_attr("plan", {"tp_degree": t.params["tp_degree"], "név": "ünïcode", "nested": [1, [2.5, None]]})
        t.set_user_attr("mfu", 0.4 + i / 100)
        study._storage.set_trial_system_attr(t._trial_id, "autotune:claimed_plan", {"i": i})
        if i % 4 == 0:
            study.tell(t, [float(i)] * n if i else [float("inf")] * n)
        elif i % 4 == 1:
            for step, v in enumerate([1.0, float("nan"), float("-inf")]):
                t.report(v, step) if n == 1 else None
            study.tell(t, state=TrialState.PRUNED)
        elif i % 4 == 2:
            study.tell(t, state=TrialState.FAIL)
        # i % 4 == 3: left RUNNING
    study.enqueue_trial({"tp_degree": 2}, user_attrs={"why": "enqueued"})
    return study._study_id


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("directions", [["maximize"], ["minimize", "maximize"]])
def test_reads_equal_optunas(tmp_path, kind, directions):
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    url = PG_URL if kind == "postgresql" else f"sqlite:///{tmp_path}/s.db"
    name = f"reads-{uuid.uuid4().hex[:12]}"
    study_id = _fill(url, name, directions)
    try:
        ours, theirs = TrialReadingRDBStorage(url), optuna.storages.RDBStorage(url)
        every = theirs.get_all_trials(study_id, deepcopy=False)
        # 9 asked + 1 enqueued; every state present
        assert len(every) == 10
        assert {t.state for t in every} == {TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL,
                                            TrialState.RUNNING, TrialState.WAITING}
        assert [_view(t) for t in ours.get_all_trials(study_id, deepcopy=False)] == [_view(t) for t in every]
        for t in every:
            assert _view(ours.get_trial(t._trial_id)) == _view(t)
        ids = [t._trial_id for t in every]
        # the cached storage's incremental reads: ids above a bound plus some below it, with and without states
        for states in (None, (TrialState.RUNNING, TrialState.WAITING), (TrialState.COMPLETE,)):
            for included, above in ((set(), -1), (set(), ids[4]), ({ids[1], ids[3], ids[8]}, ids[4]),
                                    ({ids[2]}, ids[-1])):
                got = ours._get_trials(study_id, states, included, above)
                want = theirs._get_trials(study_id, states, included, above)
                assert [_view(t) for t in got] == [_view(t) for t in want], (states, included, above)
        with pytest.raises(KeyError):
            ours.get_trial(max(ids) + 1000)
        with pytest.raises(KeyError):
            ours.get_all_trials(study_id + 1000)
        # through Optuna's cached storage, as a study opened by autotune reads it
        loaded = optuna.load_study(study_name=name, storage=ours)
        assert [_view(t) for t in loaded.get_trials(deepcopy=False)] == [_view(t) for t in every]
    finally:
        if kind == "postgresql":
            optuna.delete_study(study_name=name, storage=PG_URL)


def test_open_storage_reads_through_it(tmp_path):
    # autotune's storages are opened with this reader
    from autotune.study.storage import open_storage

    assert isinstance(open_storage(f"sqlite:///{tmp_path}/s.db"), TrialReadingRDBStorage)
