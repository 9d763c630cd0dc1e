"""Search space: YAML parsing, per-study filtering, conditional sampling, derived dp / micro-batch count."""

from __future__ import annotations

import dataclasses

import optuna
import pytest

from autotune.errors import ConfigError, PlanError
from autotune.spec.models import get_model
from autotune.spec.plan import Plan, Workload, validate_plan
from autotune.search.space import (KNOBS, Pruned, SearchSpace, derive_stage_layers, known_search_spaces,
                                   plan_params)

W_8B = Workload.from_tokens(seq_len=8192, global_batch_tokens=2**20)  # 128 sequences


def test_shipped_spaces_load_and_knobs_are_plan_fields():
    assert {"default", "small"} <= set(known_search_spaces())
    plan_fields = {f.name for f in dataclasses.fields(Plan)}
    for name in ("default", "small"):
        s = SearchSpace.load(name)
        assert set(s.choices) == set(KNOBS) and set(KNOBS) <= plan_fields
        assert "dp_degree" not in s.choices and "num_micro_batches" not in s.choices


@pytest.mark.parametrize("size,gpus,tokens", [("8b", 8, 2**20), ("70b", 64, 4 * 2**20), ("405b", 1024, 16 * 2**20)])
def test_random_sampling_gives_valid_plans_or_pruned_with_reason(size, gpus, tokens):
    model, w = get_model(size), Workload.from_tokens(seq_len=8192, global_batch_tokens=tokens)
    bound = SearchSpace.load("default").bind(model=model, num_gpus=gpus, workload=w)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    n_ok = n_pruned = 0
    for _ in range(150):
        trial = study.ask()
        try:
            plan = bound.suggest(trial)
        except Pruned as e:
            assert len(e.reason) > 20 and any(ch.isdigit() for ch in e.reason)  # names the numbers
            n_pruned += 1
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        n_ok += 1
        validate_plan(plan, model, gpus, w)  # raises if invalid
        # derived, never sampled: dp = gpus / (tp pp cp), m = global batch / (mbs dp)
        assert plan.dp_degree == gpus // (plan.tp_degree * plan.pp_degree * plan.cp_degree)
        assert plan.micro_batch_size * plan.num_micro_batches * plan.dp_degree == w.global_batch_size
        assert "dp_degree" not in trial.params and "num_micro_batches" not in trial.params
        # conditionals: knobs with no effect are not sampled
        if plan.tp_degree == 1:
            assert "sequence_parallel" not in trial.params and "tp_comm_overlap" not in trial.params
        if plan.pipeline_schedule != "interleaved_1f1b":
            assert "vpp_degree" not in trial.params and plan.vpp_degree == 1
        if plan.pp_degree == 1:
            assert "pipeline_schedule" not in trial.params
        study.tell(trial, 0.0)
    assert n_ok > 30 and n_ok + n_pruned == 150


def test_derived_dp_and_micro_batch_count_by_hand():
    bound = SearchSpace.load("small").bind(model=get_model("8b"), num_gpus=8, workload=W_8B)
    # 8 GPUs, tp 2, pp 2 -> dp = 8 / 4 = 2; 128 sequences / (mbs 2 x dp 2) = 32 micro-batches
    plan = bound.plan_from_params({"tp_degree": 2, "pp_degree": 2, "cp_degree": 1, "pipeline_schedule": "1f1b",
                                   "micro_batch_size": 2, "sequence_parallel": True, "recompute": "none",
                                   "zero_stage": 1, "async_collectives": True, "tp_comm_overlap": True,
                                   "dp_grad_reduce_overlap": True, "param_gather_overlap": True,
                                   "bucket_size_mib": 64, "memory_reclaim": "expandable_segments"})
    assert (plan.dp_degree, plan.num_micro_batches) == (2, 32)


def test_plan_params_round_trip_over_whole_small_space():
    bound = SearchSpace.load("small").bind(model=get_model("8b"), num_gpus=8, workload=W_8B)
    plans = bound.enumerate_plans()
    assert len(plans) > 50
    for p in plans:
        assert bound.plan_from_params(plan_params(p)) == p


def test_values_impossible_for_the_model_are_excluded_with_reason(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("schema_version: 1\nname: t\nknobs:\n  tp_degree: [1, 3, 16]\n")
    bound = SearchSpace.load(f).bind(model=get_model("8b"), num_gpus=16, workload=W_8B)
    assert bound.choices["tp_degree"] == (1,)
    assert "heads=32" in bound.excluded["tp_degree"]["3"] and "kv_heads=8" in bound.excluded["tp_degree"]["16"]
    f.write_text("schema_version: 1\nname: t\nknobs:\n  tp_degree: [3, 6]\n")
    with pytest.raises(ConfigError, match=r"no value of tp_degree \[3, 6\].*heads=32"):
        SearchSpace.load(f).bind(model=get_model("8b"), num_gpus=12, workload=W_8B)


def test_layers_not_splitting_are_pruned_or_split_at_the_ends():
    # 70B: 80 layers; pp 16 x vpp 2 = 32 virtual stages, 80/32 = 2.5 -> even split impossible,
    # and the nearest even split 32 x 3 = 96 is 16 layers short -> pruned in both modes.
    with pytest.raises(PlanError, match="80 layers"):
        derive_stage_layers(80, 32, "even")
    with pytest.raises(PlanError, match="16 more"):
        derive_stage_layers(80, 32, "ends")
    # 405B: 126 layers on 16 stages: 16 x 8 = 128, two short -> 7 on the first and last stage (Llama 3)
    sl = derive_stage_layers(126, 16, "ends")
    assert sl == (7,) + (8,) * 14 + (7,) and sum(sl) == 126
    assert derive_stage_layers(80, 16, "ends") is None  # 5 each


def test_pruned_reason_for_non_integer_micro_batches(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("schema_version: 1\nname: t\nknobs:\n  tp_degree: [1, 8]\n  pp_degree: [1]\n  micro_batch_size: [4]\n")
    # 24 sequences on 8 GPUs: tp 1 -> dp 8, mbs 4 -> 24 / 32 = 0.75 micro-batches (tp 8 -> dp 1 is valid)
    bound = SearchSpace.load(f).bind(model=get_model("8b"), num_gpus=8,
                                     workload=Workload(seq_len=8192, global_batch_size=24))
    with pytest.raises(Pruned, match=r"0.75 micro-batches"):
        bound.suggest(optuna.trial.FixedTrial({"tp_degree": 1, "pp_degree": 1, "cp_degree": 1,
                                               "micro_batch_size": 4}))


def test_no_dividing_layout_is_refused_before_any_trial(tmp_path):
    # 7 GPUs (prime): tp = pp = cp = 1 is the only dividing layout, dp = 7, and 128 sequences are not a
    # multiple of 7 x micro_batch_size for any micro_batch_size; 6 GPUs give dp 3 or 6 (neither divides
    # 128 either); 8 GPUs (dp 8) and 4 GPUs (dp 4) do, the two nearest counts that work
    f = tmp_path / "s.yaml"
    f.write_text("schema_version: 1\nname: t\nknobs:\n  tp_degree: [1, 2]\n  pp_degree: [1]\n  micro_batch_size: [1, 2]\n")
    with pytest.raises(ConfigError, match=r"no layout is valid for llama3.1-8b on 7 GPUs with a global batch of "
                                          r"128 sequences: .* leave dp = 7, .* use a GPU count such as 4 or 8"):
        SearchSpace.load(f).bind(model=get_model("8b"), num_gpus=7,
                                 workload=Workload(seq_len=8192, global_batch_size=128))


@pytest.mark.parametrize("text,match", [
    ("knobs:\n  tp_degree: [1, 2]\n  warp_speed: [1]\n", r"knobs\.warp_speed: unknown knob"),
    ("knobs:\n  dp_degree: [1, 2]\n", r"knobs\.dp_degree: dp_degree is derived"),
    ("knobs:\n  recompute: [none, sometimes]\n", r"knobs\.recompute: value 'sometimes' is not one of"),
    ("knobs:\n  tp_degree: [0]\n", r"knobs\.tp_degree: value 0 is not an integer >= 1"),
    ("knobs: [1, 2]\n", r"field knobs must be a non-empty mapping"),
    ("knobs:\n  tp_degree: [1, 2\n", r"not valid YAML"),
    ("layer_split: odd\nknobs:\n  tp_degree: [1]\n", r"field layer_split"),
])
def test_malformed_space_names_file_and_field(tmp_path, text, match):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match) as ei:
        SearchSpace.load(f)
    assert str(f) in str(ei.value)


def test_unknown_space_name_lists_known():
    with pytest.raises(ConfigError, match="known: .*default.*small"):
        SearchSpace.load("nope")


def test_ends_split_with_one_layer_per_virtual_stage():
    # 405B on pp 16 x vpp 8 (the Llama 3 paper's v): 128 virtual stages of ceil(126/128) = 1 layer, two
    # short -> the first holds only the embedding, the last only the LM head and loss (Megatron-LM's
    # --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split)
    sl = derive_stage_layers(126, 128, "ends")
    assert sl == (0,) + (1,) * 126 + (0,) and sum(sl) == 126
    # three short is more than the ends can give: 125 layers on 128 stages
    with pytest.raises(PlanError, match="3 more"):
        derive_stage_layers(125, 128, "ends")


def test_values_that_can_never_be_sampled_are_warned():
    # sample(): tp_comm_overlap is drawn only when tp > 1 and async_collectives is true, DP grad overlap
    # only with async collectives, param-gather overlap only with grad overlap and ZeRO >= 1; so
    # tp_comm_overlap [true] with async_collectives [false] can never reach a plan
    from autotune.search.space import SearchSpace
    sp = SearchSpace.from_dict({"name": "t", "knobs": {"tp_degree": [1, 2], "tp_comm_overlap": [True],
                                                       "async_collectives": [False]}})
    (w,) = sp.no_effect_warnings()
    assert w.startswith("search space 't': tp_comm_overlap value(s) true have no effect: async_collectives lists "
                        "only false"), w
    # listing false only (the value it is fixed to) or allowing async: nothing to warn
    assert SearchSpace.from_dict({"name": "t", "knobs": {"tp_degree": [2], "tp_comm_overlap": [False],
                                                         "async_collectives": [False]}}).no_effect_warnings() == []
    assert SearchSpace.from_dict({"name": "t", "knobs": {"tp_degree": [2], "tp_comm_overlap": [True],
                                                         "async_collectives": [True, False]}}).no_effect_warnings() == []
    # tp only 1: sequence parallel and TP overlap both unused; vpp without interleaved: unused
    ws = SearchSpace.from_dict({"name": "t", "knobs": {"tp_degree": [1], "sequence_parallel": [True, False],
                                                       "tp_comm_overlap": [True], "pp_degree": [2],
                                                       "pipeline_schedule": ["1f1b"], "vpp_degree": [2]}
                                }).no_effect_warnings()
    assert [w.split(" value(s)")[0].split(": ")[1] for w in ws] == ["tp_comm_overlap", "sequence_parallel",
                                                                   "vpp_degree"], ws
    # the shipped spaces list only values that can be sampled
    for name in ("default", "small"):
        assert SearchSpace.load(name).no_effect_warnings() == [], name


def test_cli_prints_the_no_effect_space_warning(tmp_path):
    import yaml
    from click.testing import CliRunner

    from autotune.cli.app import main
    f = tmp_path / "sp.yaml"
    f.write_text(yaml.safe_dump({"schema_version": 1, "name": "t", "knobs": {
        "tp_degree": [1, 2], "tp_comm_overlap": [True], "async_collectives": [False]}}))
    r = CliRunner().invoke(main, ["run", "--size", "8b", "--space", str(f), "--trials", "1", "--storage",
                                  f"sqlite:///{tmp_path}/s.db"])
    assert r.exit_code == 0, r.output
    assert "warning: search space 't': tp_comm_overlap value(s) true have no effect" in r.stderr, r.stderr


@pytest.mark.parametrize("gpu, gpus, size", [("b200", 64, "70b"), ("h100", 16, "8b"), ("h200", 8, "8b")])
def test_variant_is_what_suggest_builds(gpu, gpus, size):
    # BoundSearchSpace.variant derives a plan from another of the same layout and settings instead of
    # building it: for every layout of the default space (dp = 1 ones included, where the ZeRO stage and
    # the bucket are inactive) and every combination of the variant knobs' choices, the derived plan equals
    # what suggest builds from the same params, field by field (and so in == and hash), or both refuse it
    # with the same reason
    import itertools

    from autotune.search.sampler import _Assigned
    from autotune.spec.engines import get_engine
    from autotune.spec.hardware import make_cluster

    c = make_cluster(gpu, gpus, "nvlink4+ib-ndr400" if gpu != "b200" else "nvlink5+ib-ndr400")
    m = get_model(size)
    b = SearchSpace.load("default").bind(model=m, num_gpus=gpus, workload=Workload(seq_len=8192, global_batch_size=128),
                                         gpu=c.gpu, engine=get_engine("megatron"))
    ch = b.choices
    prefs = {k: v[0] for k, v in ch.items()}
    vk = b.VARIANT_KNOBS
    compared = refused = dp1 = 0
    for tp, pp, cp, mbs in itertools.product(ch["tp_degree"], ch["pp_degree"], ch["cp_degree"], ch["micro_batch_size"]):
        layout = {**prefs, "tp_degree": tp, "pp_degree": pp, "cp_degree": cp, "micro_batch_size": mbs,
                  "pipeline_schedule": "1f1b", "precision": "bf16"}
        try:
            base = b.suggest(_Assigned(layout))
        except Pruned:
            continue
        dp1 += base.dp_degree * base.cp_degree == 1
        # on Hopper the bound space drops mxfp8 from the choices; it is tried here too, as a value both must
        # refuse (validate_precision: MXFP8 needs Blackwell)
        extra = {"precision": ("mxfp8",)} if gpu != "b200" else {}
        for values in itertools.product(*(tuple(ch[k]) + extra.get(k, ()) for k in vk)):
            params = {**layout, **dict(zip(vk, values))}
            try:
                want = b.suggest(_Assigned(params))
            except Pruned as e:
                with pytest.raises(Pruned) as got:
                    b.variant(base, params)
                assert got.value.reason == e.reason
                refused += 1
                continue
            got = b.variant(base, params)
            assert dataclasses.asdict(got) == dataclasses.asdict(want) and got == want and hash(got) == hash(want)
            compared += 1
    # counted on 2026-12-02: per layout 4 precisions (3 + the refused mxfp8 on Hopper) x 3 recompute x 4 ZeRO
    # x 2 gather overlaps x 3 buckets = 288 combinations; B200 70B: 149 layouts (6 with dp x cp = 1), 42,912
    # compared; H100 8B: 90 layouts, 19,440 compared, 6,480 refused; H200 8B: 57 layouts, 12,312 and 4,104.
    # The floors only guard against the loops skipping most of them
    assert compared > 500 and dp1 > 0
    if gpu != "b200":
        assert refused > 0          # mxfp8 on Hopper
