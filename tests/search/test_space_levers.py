"""loss_impl in the default space (issue 43): sampled only for the native engine at TP = PP = 1."""

from __future__ import annotations

import optuna

from autotune.search.space import SearchSpace, plan_params
from autotune.spec.engines import get_engine
from autotune.spec.hardware import get_gpu
from autotune.spec.models import get_model
from autotune.spec.plan import Workload

W = Workload(seq_len=8192, global_batch_size=2)


def _bound(engine, gpus=1):
    return SearchSpace.load("default").bind(model=get_model("8b"), num_gpus=gpus, workload=W,
                                            gpu=get_gpu("h200"), engine=get_engine(engine))


def test_default_space_offers_chunked_loss_to_native_only():
    assert _bound("native").choices["loss_impl"] == ("full", "chunked")
    for name in ("megatron", "torchtitan"):
        b = _bound(name)
        assert b.choices["loss_impl"] == ("full",)
        assert "loss_impl" in b.excluded and "chunked" in b.excluded["loss_impl"]


def test_chunked_loss_sampled_at_tp1_pp1_only():
    b = _bound("native", gpus=2)
    base = dict(tp_degree=1, pp_degree=1, cp_degree=1, micro_batch_size=1, recompute="none", zero_stage=1,
                async_collectives=True, dp_grad_reduce_overlap=True, param_gather_overlap=True,
                bucket_size_mib=64, memory_reclaim="none", precision="bf16", compile=True)
    p = b.suggest(optuna.trial.FixedTrial(dict(base, loss_impl="chunked")))
    assert p.loss_impl == "chunked" and plan_params(p)["loss_impl"] == "chunked"
    # TP 2: the knob is not read (the chunked loss takes the whole LM head), the plan keeps full
    tp2 = dict(base, tp_degree=2, sequence_parallel=True, tp_comm_overlap=False, loss_impl="chunked")
    q = b.suggest(optuna.trial.FixedTrial(tp2))
    assert q.loss_impl == "full" and "loss_impl" not in plan_params(q)


def test_fingerprint_of_spaces_without_the_knob_unchanged():
    # a space that does not list loss_impl holds the default, left out of the fingerprint (late knob)
    d = SearchSpace.load("default").to_dict()
    d["knobs"].pop("loss_impl")
    with_default = dict(d, knobs=dict(d["knobs"], loss_impl=["full"]))
    assert SearchSpace.from_dict(d).fingerprint == SearchSpace.from_dict(with_default).fingerprint


def test_real_backend_sampler_screens_the_layers_proxy():
    # --backend real --layers 16 runs the 16-layer proxy: the sampler's memory screen must judge it (the
    # full 32-layer model needs recomputation on one H200, the proxy does not: issue 43)
    from autotune.search import make_sampler
    from autotune.spec.hardware import make_cluster

    b = _bound("native")
    kw = dict(model=get_model("8b"), cluster=make_cluster("h200", 1, "nvlink4"), workload=W,
              engine=get_engine("native"))
    assert make_sampler(b, layers=16, **kw).screen.model.num_layers == 16
    assert make_sampler(b, **kw).screen.model.num_layers == 32
