"""Mixture-of-experts cost, memory, plan checks and search (autotune/cost/moe.py and its callers): values derived
by hand in the comments."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autotune.cost import moe
from autotune.cost.chunk_costs import CostBuilder
from autotune.cost.memory import estimate_memory
from autotune.cost.simulator import SimulatedEvaluator
from autotune.errors import PlanError
from autotune.search.space import SearchSpace, derive_stage_layers, plan_params
from autotune.spec.engines import check_plan_for_engine, get_engine
from autotune.spec.hardware import make_cluster
from autotune.spec.models import get_builtin_model, get_model
from autotune.spec.plan import Plan, Workload, validate_plan

QWEN30 = get_builtin_model("qwen3-30b-a3b")
DSV3 = get_builtin_model("deepseek-v3")


def _qwen_plan(**kw) -> Plan:
    base = dict(ep_degree=8, dp_degree=8, num_micro_batches=64, precision="bf16")
    base.update(kw)
    return Plan(**base)


def test_expert_shapes_and_dispatch_bytes_by_hand():
    # Qwen3-30B-A3B: h 2048, f_e 768, 128 experts, top-8. TP 1, CP 1, micro-batch 1 x seq 4096: n = 4096 tokens
    # per rank; EP 8: 128 / 8 = 16 local experts, each receiving n k EP / E = 4096 x 8 x 8 / 128 = 2048 rows.
    s = moe.expert_shapes(QWEN30, _qwen_plan(), 4096)
    assert (s["tokens"], s["local_experts"], s["rows_per_expert"], s["ffn_per_rank"]) == (4096, 16, 2048, 768)
    # fc1 (gated: 2 f_e) and fc2 of one expert: (2048, 1536, 2048) and (2048, 2048, 768)
    assert moe.expert_gemms(QWEN30, _qwen_plan(), 4096) == [(2048, 1536, 2048), (2048, 2048, 768)]
    # dispatch: n k h BF16 = 4096 x 8 x 2048 x 2 = 134,217,728 bytes per rank per all-to-all
    assert moe.dispatch_bytes(QWEN30, _qwen_plan(), 4096) == 134_217_728
    # TP 2 with SP: n = 4096 / 2 = 2048 tokens enter the MoE layer per rank
    assert moe.tokens_per_rank(_qwen_plan(tp_degree=2, sequence_parallel=True, dp_degree=4), 4096) == 2048


def test_deepseek_v3_layer_kinds_and_expert_params_by_hand():
    # 61 layers, the first 3 dense; on pp 8 x vpp 2 = 16 chunks the wide-ends split is 3, 4 x 14, 2
    # (deficit 16 x 4 - 61 = 3: ceil(3/2) = 2 off the last chunk, 1 off the first)
    sl = derive_stage_layers(61, 16, "ends", wide_ends=True)
    assert sl == (3,) + (4,) * 14 + (2,)
    p = Plan(pp_degree=8, vpp_degree=2, pipeline_schedule="interleaved_1f1b", ep_degree=32, dp_degree=32,
             num_micro_batches=128, stage_layers=sl)
    kinds = moe.chunk_layer_kinds(DSV3, p)
    assert kinds[0] == (3, 0) and kinds[1] == (0, 4) and kinds[-1] == (0, 2) and sum(map(sum, kinds)) == 61
    # one routed expert: 3 x 7168 x 2048 = 44,040,192; 256 of them per layer = 11,274,289,152; on EP 32 a rank
    # holds 8 experts = 352,321,536 per MoE layer
    assert moe.expert_params_per_layer(DSV3) == 11_274_289_152
    cc = CostBuilder(model=DSV3, plan=p, cluster=make_cluster("b200", 256), workload=Workload(seq_len=4096,
                     global_batch_size=4096), costs=SimulatedEvaluator(model=DSV3, cluster=make_cluster("b200", 256),
                     workload=Workload(seq_len=4096, global_batch_size=4096), engine="megatron").costs,
                     engine="megatron").chunk_cost(1, 4)
    assert cc.expert_params == 4 * 352_321_536


def test_expert_optimizer_states_shard_over_the_expert_dp_group():
    # Megatron's distributed optimizer shards expert parameters over the expert-DP group, tp cp dp / (ep etp):
    # EP 8 on DP 8 leaves expert DP 1 (no sharding), EP 4 leaves 2. The rank's experts double from EP 8 to EP 4
    # (32 instead of 16 local experts), so the optimizer bytes of its experts are 2 x / 2 = the same: with
    # optimizer_bytes b per parameter, the difference between the two plans' optimizer terms is 0 and their
    # weight terms differ by param_bytes x the extra 16 experts x 48 layers x 3 h f_e.
    gpu, w = make_cluster("b200", 8).gpu, Workload(seq_len=4096, global_batch_size=512)
    e8 = estimate_memory(QWEN30, _qwen_plan(), gpu, w, engine="megatron").stages[0]
    e4 = estimate_memory(QWEN30, _qwen_plan(ep_degree=4), gpu, w, engine="megatron").stages[0]
    eng = get_engine("megatron")
    extra = 16 * 48 * 3 * 2048 * 768
    assert e4.weights_bytes - e8.weights_bytes == eng.param_bytes * extra
    assert e4.optimizer_bytes == e8.optimizer_bytes


def test_the_measured_grouped_gemm_table_changes_the_prediction(monkeypatch):
    # the experts' forward GEMMs are the dense GEMM of all local rows / the measured forward ratio at m_e rows
    # (autotune/data/grouped_gemm.yaml): halving the ratio doubles the forward expert time exactly (BF16: no
    # FP8 casts are added), and one GEMM per expert (moe_grouped_gemm=false) costs differently again
    c, w = make_cluster("h200", 8), Workload(seq_len=4096, global_batch_size=512)
    costs = SimulatedEvaluator(model=QWEN30, cluster=c, workload=w, engine="megatron").costs

    def fwd_expert(plan):
        cb = CostBuilder(model=QWEN30, plan=plan, cluster=c, workload=w, costs=costs, engine="megatron")
        return cb._moe_state[0][0]["expert_compute"] - cb._moe_act_ms

    base = fwd_expert(_qwen_plan())
    table = dict(moe._grouped_table())
    monkeypatch.setattr(moe, "_grouped_table", lambda: {**table, "fwd": [x / 2 for x in table["fwd"]]})
    assert fwd_expert(_qwen_plan()) == pytest.approx(2 * base, rel=1e-9)
    monkeypatch.undo()
    assert fwd_expert(_qwen_plan(moe_grouped_gemm=False)) != pytest.approx(base, rel=1e-3)


def test_moe_breakdown_shows_experts_dispatch_and_router():
    c, w = make_cluster("b200", 8), Workload(seq_len=4096, global_batch_size=512)
    r = SimulatedEvaluator(model=QWEN30, cluster=c, workload=w, engine="megatron").evaluate(_qwen_plan())
    assert r.feasible, r.infeasible_reason
    for k in ("expert_compute", "router_permute", "exposed_ep_comm"):
        assert r.breakdown_ms[k] > 0
    # a dense model's step has none of them
    d = SimulatedEvaluator(model=get_model("8b"), cluster=c, workload=Workload(seq_len=8192, global_batch_size=64),
                           engine="megatron").evaluate(Plan(dp_degree=8, num_micro_batches=8))
    assert all(d.breakdown_ms[k] == 0 for k in ("expert_compute", "router_permute", "exposed_ep_comm"))


@pytest.mark.parametrize("plan,model,msg", [
    (dict(ep_degree=3, dp_degree=8), QWEN30, r"ep_degree=3 does not divide the 128 routed experts .*valid ep_degree here: \[1, 2, 4, 8\]"),
    (dict(ep_degree=16, dp_degree=8), QWEN30, r"ep_degree=16 x etp_degree=1 does not divide tp x cp x dp = 8"),
    (dict(ep_degree=2, dp_degree=8), get_model("8b"), r"ep_degree=2 needs a mixture-of-experts model; llama3.1-8b is dense"),
    (dict(ep_degree=1, dp_degree=8, moe_a2a_overlap=True), QWEN30, r"moe_a2a_overlap=true .*needs ep_degree > 1"),
    (dict(tp_degree=2, dp_degree=4, ep_degree=2), QWEN30, r"tp_degree=2 on the MoE model .*needs sequence_parallel=true"),
])
def test_bad_expert_layouts_are_one_line_with_what_is_valid(plan, model, msg):
    seq = 4096
    p = Plan(num_micro_batches=512 // (plan.get("dp_degree", 1)), **plan)
    with pytest.raises(PlanError, match=msg):
        validate_plan(p, model, 8, Workload(seq_len=seq, global_batch_size=512))


def test_a_dispatcher_the_engine_lacks_names_the_ones_it_has():
    with pytest.raises(PlanError, match="moe_dispatcher=flex cannot run on engine torchtitan; it has alltoall"):
        check_plan_for_engine(_qwen_plan(moe_dispatcher="flex", zero_stage=0), get_engine("torchtitan"))
    with pytest.raises(PlanError, match="cannot run on engine native: autotune's runtime builds dense"):
        check_plan_for_engine(_qwen_plan(), get_engine("native"))


def test_dense_search_has_no_expert_knobs():
    # a dense model samples none of the MoE knobs, so its trials, layouts and fingerprint are as before
    space = SearchSpace.load("default")
    b = space.bind(model=get_model("8b"), num_gpus=8, workload=Workload(seq_len=8192, global_batch_size=64))
    assert b.choices["ep_degree"] == (1,) and b.choices["moe_a2a_overlap"] == (False,)
    assert "ep_degree" not in plan_params(Plan(dp_degree=8, num_micro_batches=8))
    bm = space.bind(model=QWEN30, num_gpus=8, workload=Workload(seq_len=4096, global_batch_size=512))
    assert bm.choices["ep_degree"] == (1, 2, 4, 8)       # the space's EPs that divide 128 experts and 8 GPUs
    assert plan_params(_qwen_plan(), moe=True)["ep_degree"] == 8


RUNS = Path(__file__).resolve().parents[3] / "shared" / "reference" / "published-moe-runs.yaml"


@pytest.mark.skipif(not RUNS.is_file(), reason="../shared/reference/published-moe-runs.yaml is not beside the checkout")
def test_every_published_moe_plan_lies_inside_the_default_space():
    # the development set's degrees and knobs (TP, PP, VP, CP, EP, ETP, micro-batch, precision) are values of the
    # default space's knobs, and the recipe dispatchers and overlaps too (bench/published_moe.py RECIPES)
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import published_moe as pm

    c = SearchSpace.load("default").choices
    for run in yaml.safe_load(RUNS.read_text())["runs"]:
        p = pm.plan_for(run, get_builtin_model(pm.MODELS[run["model"]]))
        assert p.tp_degree in c["tp_degree"] and p.pp_degree in c["pp_degree"] and p.cp_degree in c["cp_degree"]
        assert p.effective_vpp == 1 or p.vpp_degree in c["vpp_degree"], run["id"]
        assert p.ep_degree in c["ep_degree"] and p.etp_degree in c["etp_degree"], run["id"]
        assert p.micro_batch_size in c["micro_batch_size"] and p.precision in c["precision"], run["id"]
        assert p.moe_dispatcher in c["moe_dispatcher"] and p.moe_a2a_overlap in c["moe_a2a_overlap"], run["id"]
        # the recipes' recompute modules (GPT-OSS layernorm + moe_act, DeepSeek-V3 mla_up_proj (+ mlp))
        if p.recompute == "selective":
            from autotune.search.recompute_choice import encode
            assert encode(p.recompute_modules) in c["recompute_modules"], run["id"]
