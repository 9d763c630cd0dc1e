"""autotune.study.trials: a trial's parameters, plan and result written in one transaction (ParamBuffer,
write_trial, record_result) store what Optuna's per-item calls store."""

from __future__ import annotations

import os
import uuid

import optuna
import pytest

from autotune.cost.evaluator import StepResult
from autotune.study.trials import MEMORY_CONSTRAINT, ParamBuffer, record_result

CHOICES = {"tp_degree": (1, 2, 4), "recompute": ("none", "selective", "full"), "zero_stage": (0, 1, 2, 3),
           "precision": ("bf16", "mxfp8")}


def _result(feasible: bool) -> StepResult:
    return StepResult(backend="simulated", feasible=feasible, step_time_ms=812.5 if feasible else 0.0,
                      mfu=0.41 if feasible else 0.0, mfu_palm=0.43 if feasible else 0.0, hfu=0.45 if feasible else 0.0,
                      tokens_per_s_per_gpu=1.0e4, tflops_per_gpu=400.0, peak_memory_bytes=70 * 2**30,
                      memory_per_stage_bytes=(70 * 2**30,), breakdown_ms={"compute": 800.0},
                      infeasible_reason=None if feasible else "out of memory", details={"engine": "megatron"})


def _objective(buffered: bool):
    """Sample the knobs in a fixed order (as BoundSearchSpace.suggest does), store a plan and a result."""
    def objective(trial: optuna.Trial) -> float:
        def sample() -> dict:
            return {k: trial.suggest_categorical(k, v) for k, v in CHOICES.items()}
        if buffered:
            with ParamBuffer(trial) as written:
                params = sample()
                written.flush({"plan": params})
        else:
            params = sample()
            trial.set_user_attr("plan", params)
        # record_result writes in one transaction where it can; unbuffered runs force Optuna's calls
        return record_result(trial, _result(trial.number % 2 == 0), capacity_bytes=80 * 2**30)
    return objective


def _stored(study: optuna.Study) -> list[tuple]:
    return [(t.number, t.state, t.values, t.params, t.distributions, t.user_attrs,
             {k: v for k, v in t.system_attrs.items()}, t.constraints) for t in study.get_trials(deepcopy=False)]


#: .ci/run starts a PostgreSQL (.ci/services.sh): write_trial's multi-row upserts there are PostgreSQL's dialect
PG_URL = os.environ.get("AUTOTUNE_TEST_POSTGRES_URL")


@pytest.mark.parametrize("kind", ["sqlite", "journal", "memory", pytest.param("postgresql", marks=pytest.mark.skipif(
    not PG_URL, reason="no PostgreSQL: set AUTOTUNE_TEST_POSTGRES_URL (.ci/run starts one with .ci/services.sh)"))])
def test_batched_writes_store_what_per_item_writes_store(tmp_path, kind, monkeypatch):
    # the same objective, seed and sampler, once through ParamBuffer / write_trial (one transaction on the RDB
    # storage; the per-item fallback elsewhere) and once through Optuna's per-item calls (write_trial
    # disabled): every trial's params, distributions, user and system attributes and constraints are equal
    import autotune.study.trials as trials

    made = []

    def study(name: str) -> optuna.Study:
        if kind == "postgresql":
            made.append(f"{name}-{uuid.uuid4().hex[:12]}")
            return optuna.create_study(storage=PG_URL, study_name=made[-1], direction="maximize",
                                       sampler=optuna.samplers.RandomSampler(seed=3))
        if kind == "sqlite":
            storage = f"sqlite:///{tmp_path}/{name}.db"
        elif kind == "journal":
            from optuna.storages.journal import JournalFileBackend
            storage = optuna.storages.JournalStorage(JournalFileBackend(str(tmp_path / f"{name}.log")))
        else:
            storage = None
        return optuna.create_study(storage=storage, sampler=optuna.samplers.RandomSampler(seed=3), direction="maximize")

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    batched = study("batched")
    batched.optimize(_objective(True), n_trials=6)
    monkeypatch.setattr(trials, "write_trial", lambda *a, **k: False)
    plain = study("plain")
    plain.optimize(_objective(False), n_trials=6)
    assert _stored(batched) == _stored(plain)
    # the constraint reads back through Optuna's own accessor (Trial.set_constraint's key), the feasible
    # (even-numbered) trials <= 0 and the others > 0: 70 GiB peak against 80 GiB capacity = -10 GiB
    assert [t.constraints[MEMORY_CONSTRAINT] for t in batched.get_trials()] == [-10.0, 1e-3] * 3
    for name in made:
        optuna.delete_study(study_name=name, storage=PG_URL)


def test_write_trial_is_one_transaction_on_sqlite(tmp_path):
    # write_trial takes the RDB path on SQLite (returns True) and a failing item writes nothing of the batch:
    # a parameter whose distribution conflicts with the one the study stored (Optuna's compatibility check)
    # raises before the commit, so the attributes of the same call are not stored either
    from autotune.study.trials import write_trial
    from optuna.distributions import CategoricalDistribution

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db")
    t0 = study.ask()
    t0.suggest_categorical("tp_degree", (1, 2))
    study.tell(t0, 1.0)
    t = study.ask()
    assert write_trial(t, user_attrs={"a": 1}) is True
    with pytest.raises(ValueError):
        write_trial(t, params=[("tp_degree", 0, optuna.distributions.FloatDistribution(0, 1))], user_attrs={"b": 2})
    stored = study._storage.get_trial(t._trial_id)
    assert stored.user_attrs == {"a": 1} and stored.params == {}
    assert write_trial(t, params=[("tp_degree", 1, CategoricalDistribution((1, 2)))]) is True
    assert study._storage.get_trial(t._trial_id).params == {"tp_degree": 2}
    # an attribute written again is replaced (the upsert on (trial_id, key), as set_user_attr does)
    assert write_trial(t, user_attrs={"a": 5, "c": [1, 2]}, system_attrs={"s": "x"}) is True
    again = study._storage.get_trial(t._trial_id)
    assert again.user_attrs == {"a": 5, "c": [1, 2]} and again.system_attrs["s"] == "x"
    # a finished trial is not updatable (Optuna's check, once per batch): nothing is written
    study.tell(t, 0.5)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        write_trial(t, user_attrs={"late": 1})
    assert "late" not in study._storage.get_trial(t._trial_id).user_attrs


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.skipif(
    not PG_URL, reason="no PostgreSQL: set AUTOTUNE_TEST_POSTGRES_URL (.ci/run starts one with .ci/services.sh)"))])
def test_write_trial_checks_distributions_another_process_stored(tmp_path, kind, monkeypatch):
    # a second storage object on the same study (a worker's, or another host's) has no cached distributions:
    # write_trial checks each new parameter against the study's stored one in its single statement path,
    # as Optuna's per-item path does with one query per parameter, and never falls back to that path
    from autotune.study.trials import write_trial
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    url = PG_URL if kind == "postgresql" else f"sqlite:///{tmp_path}/s.db"
    name = f"other-{uuid.uuid4().hex[:12]}"
    first = optuna.create_study(storage=url, study_name=name)
    t0 = first.ask()
    t0.suggest_categorical("tp_degree", (1, 2))
    t0.suggest_int("pp_degree", 1, 8)
    first.tell(t0, 1.0)
    other = optuna.load_study(study_name=name, storage=url)      # a new storage object: nothing cached
    assert other._storage is not first._storage
    per_item = []
    rdb = other._storage._backend
    monkeypatch.setattr(rdb, "_set_trial_param_without_commit", lambda *a, **k: per_item.append(a))
    t = other.ask()
    # Float where the study stored a categorical: Optuna's check_distribution_compatibility raises, nothing
    # of the batch is written
    with pytest.raises(ValueError):
        write_trial(t, params=[("pp_degree", 2, IntDistribution(1, 8)), ("tp_degree", 0.5, FloatDistribution(0, 1))],
                    user_attrs={"b": 2})
    stored = other._storage.get_trial(t._trial_id)
    assert stored.params == {} and stored.user_attrs == {}
    # compatible (a wider int range is compatible: Optuna checks the class, and the choices of a categorical)
    # and a name the study never stored: written, and read back through a third storage object
    assert write_trial(t, params=[("tp_degree", 1, CategoricalDistribution((1, 2))),
                                  ("pp_degree", 3, IntDistribution(1, 16)), ("new", 0.25, FloatDistribution(0, 1))]) is True
    assert per_item == []
    back = optuna.load_study(study_name=name, storage=url)._storage.get_trial(t._trial_id)
    assert back.params == {"tp_degree": 2, "pp_degree": 3, "new": 0.25}
    if kind == "postgresql":
        optuna.delete_study(study_name=name, storage=PG_URL)
