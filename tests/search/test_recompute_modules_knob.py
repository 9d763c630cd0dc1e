"""recompute_modules in the default space (issue 38 item 4; autotune/search/recompute_choice.py): Megatron-LM
--recompute-modules sets sampled for mixture-of-experts models with selective recompute on the megatron engine
only, the values each model can use; dense spaces, trials and the fingerprint unchanged."""

from __future__ import annotations

import optuna
import pytest

from autotune.errors import ConfigError
from autotune.search.space import SearchSpace, plan_params
from autotune.spec.engines import get_engine
from autotune.spec.hardware import get_gpu
from autotune.spec.models import get_builtin_model, get_model
from autotune.spec.plan import Workload

W = Workload(seq_len=4096, global_batch_size=64)


def _bound(model, engine="megatron", gpus=8):
    return SearchSpace.load("default").bind(model=model, num_gpus=gpus, workload=W, gpu=get_gpu("h200"),
                                            engine=get_engine(engine))


def test_values_per_model():
    listed = SearchSpace.load("default").choices["recompute_modules"]
    # DeepSeek-V3: MLA, 3 dense layers, 1 shared expert -> every listed set is possible
    assert _bound(get_builtin_model("deepseek-v3"), gpus=64).choices["recompute_modules"] == listed
    # Qwen3-30B-A3B: no MLA, no dense layer, no shared expert -> the sets with mla_up_proj, mlp or
    # shared_experts go (each named): default, moe_act, layernorm+moe_act, core_attn+moe_act, moe are left
    b = _bound(get_builtin_model("qwen3-30b-a3b"))
    assert b.choices["recompute_modules"] == ("default", "moe_act", "layernorm+moe_act", "core_attn+moe_act", "moe")
    assert "multi-latent attention" in b.excluded["recompute_modules"]["mla_up_proj"]
    assert "multi-latent attention" in b.excluded["recompute_modules"]["mla_up_proj+mlp"]
    assert "no shared experts" in b.excluded["recompute_modules"]["moe_act+shared_experts"]
    from autotune.search.recompute_choice import static_reason
    assert "every layer of mixtral-8x7b is MoE" in static_reason("mlp", get_builtin_model("mixtral-8x7b"), None)
    assert static_reason("mlp", get_builtin_model("deepseek-v3"), None) is None       # 3 dense layers
    # torchtitan takes no module list (engine fact recompute_modules: false); a dense model none either
    assert _bound(get_builtin_model("qwen3-30b-a3b"), engine="torchtitan").choices["recompute_modules"] == ("default",)
    assert _bound(get_model("8b")).choices["recompute_modules"] == ("default",)


def _params(**kw):
    base = dict(tp_degree=1, pp_degree=1, cp_degree=1, micro_batch_size=1, recompute="selective", zero_stage=1,
                async_collectives=True, dp_grad_reduce_overlap=True, param_gather_overlap=True, bucket_size_mib=64,
                memory_reclaim="none", precision="bf16", compile=False, loss_impl="full", ep_degree=8,
                etp_degree=1, moe_dispatcher="alltoall", moe_a2a_overlap=False, recompute_modules="layernorm+moe_act")
    return {**base, **kw}


def test_sampled_with_selective_recompute_on_moe_only():
    b = _bound(get_builtin_model("qwen3-30b-a3b"))
    p = b.suggest(optuna.trial.FixedTrial(_params()))
    assert p.recompute_modules == ("layernorm", "moe_act")
    assert plan_params(p, moe=True)["recompute_modules"] == "layernorm+moe_act"
    # default = the engine's selective set (None in the plan)
    assert b.suggest(optuna.trial.FixedTrial(_params(recompute_modules="default"))).recompute_modules is None
    # not read without selective recompute
    q = b.suggest(optuna.trial.FixedTrial(_params(recompute="full")))
    assert q.recompute_modules is None and "recompute_modules" not in plan_params(q, moe=True)
    # Megatron-LM's rule: no 'moe' recompute with the all-to-all overlap (transformer_config.py) -> pruned
    from autotune.search.space import Pruned
    with pytest.raises(Pruned, match="no 'moe' recompute module"):
        b.suggest(optuna.trial.FixedTrial(_params(recompute_modules="moe", moe_a2a_overlap=True)))


def test_variant_carries_the_modules_as_suggest_does():
    b = _bound(get_builtin_model("qwen3-30b-a3b"))
    base = b.suggest(optuna.trial.FixedTrial(_params(recompute="none")))
    for rec in ("none", "selective", "full"):
        want = b.suggest(optuna.trial.FixedTrial(_params(recompute=rec)))
        assert b.variant(base, _params(recompute=rec)) == want, rec


def test_dense_space_and_fingerprint_unchanged():
    d = SearchSpace.load("default").to_dict()
    d["knobs"].pop("recompute_modules")
    assert SearchSpace.from_dict(d).fingerprint == SearchSpace.load("default").fingerprint
    # a dense plan's params hold no recompute_modules
    p = _bound(get_model("8b")).suggest(optuna.trial.FixedTrial({k: v for k, v in _params().items()
                                                                 if k not in ("ep_degree", "etp_degree")}))
    assert "recompute_modules" not in plan_params(p)


@pytest.mark.parametrize("value,words", [("mlp+mla_up_proj", "sorted order"), ("attn", "is not 'default'")])
def test_bad_values_are_named(value, words):
    d = SearchSpace.load("default").to_dict()
    d["knobs"]["recompute_modules"] = ["default", value]
    with pytest.raises(ConfigError, match=words):
        SearchSpace.from_dict(d)
