"""Tuner: study naming, constraints (infeasible never best), failures, resume, seeding, exhaustive check."""

from __future__ import annotations

import json
import re
import warnings

import optuna
import pytest

from autotune import tuner as T
from autotune.errors import AutotuneError, ConfigError, NoFeasiblePlanError, StorageError
from autotune.hardware import make_cluster
from autotune.models import get_model
from autotune.plan import Workload
from autotune.search_space import Pruned, SearchSpace
from autotune.tuner import Tuner, best_trial, is_feasible, make_evaluator, study_name
from fake_evaluator import FakeEvaluator

MODEL = get_model("8b")
CLUSTER = make_cluster("b200", 8, "nvlink5+ib-ndr400")
W = Workload.from_tokens(seq_len=8192, global_batch_tokens=2**20)


def tuner(tmp_path, evaluator=None, **kw):
    kw.setdefault("space", "small")
    return Tuner(model=MODEL, cluster=CLUSTER, workload=W, storage=f"sqlite:///{tmp_path}/s.db",
                 evaluator=evaluator or FakeEvaluator(model=MODEL, cluster=CLUSTER, workload=W), **kw)


def test_study_name():
    assert study_name(MODEL, CLUSTER, W) == "llama3.1-8b/b200x8/nvlink5+ib-ndr400/megatron/seq8192-gbs128"
    assert study_name(MODEL, CLUSTER, W, space_name="small", backend="measured", engine="torchtitan") == \
        "llama3.1-8b/b200x8/nvlink5+ib-ndr400/torchtitan/seq8192-gbs128/space=small/backend=measured"


def test_trials_store_results_and_best_is_highest_feasible(tmp_path):
    t = tuner(tmp_path)
    s = t.optimize(12, show_progress_bar=False)
    study = t.study
    trials = study.get_trials()
    assert len(trials) == 12 and s.n_new_trials == 12
    done = [x for x in trials if x.state == optuna.trial.TrialState.COMPLETE]
    for x in done:
        for k in ("step_time_ms", "mfu", "mfu_palm", "hfu", "tokens_per_s_per_gpu", "peak_memory_bytes",
                  "memory_per_stage_bytes", "breakdown_ms", "backend", "details", "plan", "feasible"):
            assert k in x.user_attrs, k
        # the objective is the MFU of a plan that fits, 0 for one that does not (tuner.record_result)
        assert x.value == pytest.approx(x.user_attrs["mfu"] if x.user_attrs["feasible"] else 0.0)
    best = max((x for x in done if is_feasible(x)), key=lambda x: x.value)
    assert s.best.trial_number == best.number and best_trial(study).number == best.number


def test_infeasible_plans_never_best(tmp_path):
    # plans whose peak memory is above 40% of the GPU "do not fit"; the fake still reports their MFU
    ev = FakeEvaluator(model=MODEL, cluster=CLUSTER, workload=W, capacity_scale=0.4)
    t = tuner(tmp_path, evaluator=ev)
    t.optimize(30, show_progress_bar=False)
    trials = t.study.get_trials()
    infeasible = [x for x in trials if x.state.name == "COMPLETE" and not x.user_attrs["feasible"]]
    assert infeasible, "the test needs some infeasible trials"
    for x in infeasible:
        assert x.value == 0.0 and x.constraints[T.MEMORY_CONSTRAINT] > 0 and x.user_attrs["infeasible_reason"]
    b = best_trial(t.study)
    assert b.user_attrs["feasible"] and b.constraints[T.MEMORY_CONSTRAINT] <= 0
    assert t.study.best_trial.number == b.number  # Optuna's constrained best agrees


def test_all_failed_message_and_study_kept(tmp_path):
    ev = FakeEvaluator(model=MODEL, cluster=CLUSTER, workload=W, fail_on=lambda p: True)
    t = tuner(tmp_path, evaluator=ev)
    with pytest.raises(NoFeasiblePlanError) as ei:
        t.optimize(6, show_progress_bar=False)
    assert re.match(r"6/6 trials gave no feasible plan \(pruned, out of memory or failed\): error: RuntimeError: fake evaluator exploded", str(ei.value)), str(ei.value)
    st = optuna.load_study(study_name=t.name, storage=f"sqlite:///{tmp_path}/s.db")
    assert len(st.trials) == 6
    for x in st.trials:  # every trial is either pruned (invalid combination) or failed, with its reason
        assert x.user_attrs.get("fail_reason") or x.user_attrs.get("pruned_reason")
    # all infeasible (no combination of this space can be pruned): the memory reason is the commonest
    space = tmp_path / "nopr.yaml"
    space.write_text("schema_version: 1\nname: nopr\nknobs:\n  tp_degree: [1, 2, 4]\n  pp_degree: [1]\n"
                     "  cp_degree: [1]\n  micro_batch_size: [1, 2]\n")
    ev2 = FakeEvaluator(model=MODEL, cluster=CLUSTER, workload=W, capacity_scale=0.001)
    t2 = tuner(tmp_path, evaluator=ev2, space=str(space))
    with pytest.raises(NoFeasiblePlanError, match=r"^5/5 trials gave no feasible plan \(pruned, out of memory or failed\): does not fit in memory: stage 0 needs"):
        t2.optimize(5, show_progress_bar=False)


def test_unexpected_exception_is_a_failed_trial_not_a_crash(tmp_path):
    ev = FakeEvaluator(model=MODEL, cluster=CLUSTER, workload=W, fail_on=lambda p: p.tp_degree == 2)
    t = tuner(tmp_path, evaluator=ev)
    s = t.optimize(25, show_progress_bar=False)
    failed = [x for x in t.study.trials if x.state.name == "FAIL"]
    assert failed and all("fake evaluator exploded" in x.user_attrs["fail_reason"] for x in failed)
    assert s.best.plan.tp_degree != 2 and s.states["failed"] == len(failed)


def test_resume_adds_to_the_same_study(tmp_path):
    tuner(tmp_path).optimize(4, show_progress_bar=False)
    s = tuner(tmp_path, seed=1).optimize(3, show_progress_bar=False)
    assert s.n_trials == 7 and s.n_new_trials == 3
    assert len(optuna.get_all_study_names(f"sqlite:///{tmp_path}/s.db")) == 1


def test_same_seed_same_trials(tmp_path):
    def params(sub, seed):
        (tmp_path / sub).mkdir()
        t = tuner(tmp_path / sub, seed=seed, space="default")
        try:
            t.optimize(15, show_progress_bar=False)
        except NoFeasiblePlanError:
            pass
        return [x.params for x in t.study.trials]

    a, b, c = params("a", 7), params("b", 7), params("c", 8)
    assert a == b and a != c


def test_backend_factory_errors():
    with pytest.raises(ConfigError, match="known backends: simulated, measured, real"):
        make_evaluator("magic", model=MODEL, cluster=CLUSTER, workload=W)
    T.BACKENDS["broken"] = ("autotune.no_such_module", "X")
    try:
        with pytest.raises(AutotuneError, match="backend 'broken' is not available: cannot import autotune.no_such"):
            make_evaluator("broken", model=MODEL, cluster=CLUSTER, workload=W)
    finally:
        del T.BACKENDS["broken"]


def test_unreachable_storage_names_url_and_cause(tmp_path):
    url = f"sqlite:///{tmp_path}/missing/dir/s.db"
    with pytest.raises(StorageError, match=re.escape(url) + ".*does not exist"):
        T.open_storage(url)


def test_tuner_finds_the_exhaustive_optimum_on_the_small_space(tmp_path):
    """Best plan within 1% of the exhaustive optimum (BruteForceSampler over the same space), seeds 0-4."""
    from autotune.simulator import SimulatedEvaluator

    ev = SimulatedEvaluator(model=MODEL, cluster=CLUSTER, workload=W, engine="native")
    # the same space the tuner searches: bound to the evaluator's engine (values it cannot run dropped)
    bound = SearchSpace.load("small").bind(model=MODEL, num_gpus=8, workload=W, engine=ev.engine)

    def objective(trial):
        try:
            plan = bound.suggest(trial)
        except Pruned:
            raise optuna.TrialPruned()
        r = ev.evaluate(plan)
        return r.mfu if r.feasible else 0.0

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        bf = optuna.create_study(direction="maximize", sampler=optuna.samplers.BruteForceSampler(seed=0))
    bf.optimize(objective)  # stops by itself once every combination was tried
    optimum = bf.best_value
    assert len(bf.trials) >= 100  # the whole space was enumerated
    for seed in range(5):
        t = Tuner(model=MODEL, cluster=CLUSTER, workload=W, space="small", storage=f"sqlite:///{tmp_path}/s{seed}.db",
                  evaluator=ev, seed=seed)
        s = t.optimize(40, show_progress_bar=False)
        assert s.best.result.mfu >= 0.99 * optimum, (seed, s.best.result.mfu / optimum)
        # the sampler never proposes a plan twice: 40 trials, 40 distinct plans
        plans = [json.dumps(x.user_attrs["plan"], sort_keys=True) for x in t.study.trials if "plan" in x.user_attrs]
        assert len(plans) == 40 and len(set(plans)) == 40, seed


def test_real_backend_trials_count_plans_run(tmp_path):
    # With the real backend, --trials N means N plans run: invalid combinations pruned before anything
    # runs do not use up the budget. The default space on 8 GPUs has many invalid tp x pp x cp combos.
    t = tuner(tmp_path, space="default", backend="real")
    summary = t.optimize(6)
    trials = t.study.get_trials(deepcopy=False)
    # a plan proposed again reuses its stored result: not run, not counted (tuner.optimize)
    run = [x for x in trials if x.state != optuna.trial.TrialState.PRUNED and not x.user_attrs.get("reused_result")]
    assert len(run) == 6
    assert summary.n_new_trials == len(trials) >= 6


def test_signal_handler_never_raises_into_sqlalchemy_pool_or_finalizers():
    # CI once printed "Exception during reset or similar ... KeyboardInterrupt" with a traceback: SIGINT
    # landed while SQLAlchemy's pool reset a connection from a GC finalizer (pool/base.py _finalize_fairy),
    # which catches and logs what is raised. safe_to_raise must say False for any frame below such code
    # (here code compiled under a path .../sqlalchemy/pool/..., and a __del__), True for plain code.
    import os
    import sys

    from autotune.tuner import safe_to_raise

    ns: dict = {}
    path = os.sep.join(["", "x", "site-packages", "sqlalchemy", "pool", "base.py"])
    exec(compile("def in_pool(cb):\n    return cb()\n", path, "exec"), ns)
    assert ns["in_pool"](lambda: safe_to_raise(sys._getframe())) is False

    class Finalized:
        def __del__(self):
            seen.append(safe_to_raise(sys._getframe()))

    seen: list = []
    Finalized.__del__(Finalized())
    assert seen[0] is False
    assert safe_to_raise(sys._getframe()) is True
