"""Plan validation rules (issue 2 item 4) and the YAML round trip."""

import pytest

from autotune.errors import ConfigError, PlanError
from autotune.spec.hardware import make_cluster
from autotune.spec.models import get_model
from autotune.spec.plan import Plan, PlanDocument, Workload, validate_plan

W1 = Workload(seq_len=8192, global_batch_size=1)


@pytest.mark.parametrize("tp", [3, 6])
def test_tp_not_dividing_heads_8b(tp):
    with pytest.raises(PlanError) as e:
        validate_plan(Plan(tp_degree=tp), get_model("8b"), tp, W1)
    msg = str(e.value)
    # every dimension that does not divide: 32 heads, 8 kv heads, 14336 ffn (= 2^11 * 7), 4096 hidden
    for dim in ("heads=32", "kv_heads=8", "ffn_hidden_size=14336", "hidden_size=4096"):
        assert dim in msg
    assert "valid tp_degree: [1, 2, 4, 8]" in msg


@pytest.mark.parametrize("size", ["8b", "70b", "405b"])
def test_tp16_refused_for_all_sizes(size):
    with pytest.raises(PlanError, match="kv_heads=8"):
        validate_plan(Plan(tp_degree=16), get_model(size), 16, W1)


def test_layers_over_pp_vpp():
    m70 = get_model("70b")
    w = Workload(seq_len=8192, global_batch_size=16)
    # 80 / 16 = 5 layers per stage cannot form 2 chunks
    with pytest.raises(PlanError, match="5 layers per stage"):
        validate_plan(Plan(pp_degree=16, vpp_degree=2, pipeline_schedule="interleaved_1f1b", num_micro_batches=16),
                      m70, 16, w)
    # 80 / 8 = 10 layers per stage = 2 chunks of 5
    validate_plan(Plan(pp_degree=8, vpp_degree=2, pipeline_schedule="interleaved_1f1b", num_micro_batches=16),
                  m70, 8, w)


def test_stage_layers_must_sum():
    with pytest.raises(PlanError, match="sum to 79"):
        validate_plan(Plan(pp_degree=2, stage_layers=(40, 39)), get_model("70b"), 2, W1)
    # Llama 3 style: one layer fewer on the first and last stage: 7 + 14*8 + 7 = 126
    validate_plan(Plan(pp_degree=16, stage_layers=(7,) + (8,) * 14 + (7,)), get_model("405b"), 16, W1)


def test_global_batch():
    m = get_model("8b")
    w = Workload(seq_len=8192, global_batch_size=64)
    # 16 GPUs, TP=2 -> DP=8; 64 / (8 * 8) = 1 micro-batch
    validate_plan(Plan(tp_degree=2, dp_degree=8, micro_batch_size=8, num_micro_batches=1), m, 16, w)
    # TP=1 -> DP=16; 64 / (8 * 16) = 0.5 micro-batches: refused naming the three numbers
    with pytest.raises(PlanError) as e:
        validate_plan(Plan(tp_degree=1, dp_degree=16, micro_batch_size=8, num_micro_batches=1), m, 16, w)
    msg = str(e.value)
    assert "global batch 64" in msg and "micro_batch_size 8" in msg and "dp_degree 16" in msg


def test_sequence_divisibility_cp_sp():
    m = get_model("8b")
    # seq 8192, CP=3: 8192 is not a multiple of 3 * 2 = 6
    with pytest.raises(PlanError, match="seq_len=8192"):
        validate_plan(Plan(cp_degree=3), m, 3, W1)
    # seq 8200, CP=2, TP=8, SP: needs a multiple of 2 * lcm(2, 8) = 16; 8200 = 16 * 512.5
    with pytest.raises(PlanError, match="multiple of 16"):
        validate_plan(Plan(tp_degree=8, cp_degree=2, sequence_parallel=True), m, 16,
                      Workload(seq_len=8200, global_batch_size=1))
    validate_plan(Plan(tp_degree=8, cp_degree=2, sequence_parallel=True), m, 16, W1)


def test_param_gather_overlap_needs_grad_reduce_overlap():
    with pytest.raises(PlanError, match="dp_grad_reduce_overlap"):
        Plan(param_gather_overlap=True, dp_grad_reduce_overlap=False)


def test_no_effect_warnings():
    m = get_model("8b")
    w = validate_plan(Plan(tp_degree=1, dp_degree=2, sequence_parallel=True, num_micro_batches=1), m, 2,
                      Workload(seq_len=8192, global_batch_size=2))
    assert any("sequence_parallel" in x for x in w)
    w = validate_plan(Plan(pp_degree=2, vpp_degree=2, pipeline_schedule="1f1b"), m, 2, W1)
    assert any("vpp_degree=2 has no effect" in x for x in w)


def test_bad_field_values():
    with pytest.raises(PlanError, match="pipeline_schedule"):
        Plan(pipeline_schedule="zigzag")
    with pytest.raises(PlanError, match="tp_degree"):
        Plan(tp_degree=0)
    with pytest.raises(PlanError, match="zero_stage"):
        Plan(zero_stage=4)


def test_yaml_round_trip(tmp_path):
    c = make_cluster("b200", 1024, "nvlink5+ib-ndr400")
    doc = PlanDocument(plan=Plan(tp_degree=8, pp_degree=8, dp_degree=16, vpp_degree=2,
                                 pipeline_schedule="interleaved_1f1b", num_micro_batches=8,
                                 stage_layers=(7,) + (8,) * 14 + (7,)),
                       model=get_model("405b"), gpu="b200", num_gpus=1024, fabric=c.fabric.to_dict(),
                       workload=Workload(seq_len=8192, global_batch_size=128), study="s", trial_id=3,
                       prediction={"mfu": 0.4123456789, "step_time_ms": 1234.5})
    p = tmp_path / "plan.yaml"
    doc.save(p)
    back = PlanDocument.load(p)
    assert back == doc
    assert back.to_yaml() == doc.to_yaml()


def test_yaml_errors(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("schema_version: 1\nmodel: {}\ncluster: {gpu: h100, num_gpus: 8, fabric: {}}\n"
                 "workload: {seq_len: 8192, global_batch_size: 8}\nplan: {tp_degree: two}\n")
    with pytest.raises((ConfigError, PlanError), match="tp_degree"):
        PlanDocument.load(p)
    p.write_text("schema_version: 1\n")
    with pytest.raises(ConfigError, match="'model'"):
        PlanDocument.load(p)


def test_recompute_num_layers_above_the_chunk_is_refused():
    # 8B: 32 layers; pp 1 -> one chunk of 32 layers. Megatron's block method recomputes layer_idx < N of
    # the chunk, so N = 40 can only mean "every layer" (= N 32 or 0): refused, naming 40 and 1..32
    from autotune.errors import PlanError
    from autotune.spec.models import get_model
    from autotune.spec.plan import Plan, Workload, validate_plan
    m, w = get_model("8b"), Workload(seq_len=8192, global_batch_size=128)
    base = dict(dp_degree=8, num_micro_batches=16, recompute="full")
    with pytest.raises(PlanError, match=r"recompute_num_layers=40 exceeds the 32 layers per chunk.*1\.\.32"):
        validate_plan(Plan(**base, recompute_num_layers=40), m, 8, w)
    validate_plan(Plan(**base, recompute_num_layers=32), m, 8, w)      # the bound itself is valid
    # pp 2 x vpp 2 = 4 chunks of 8 layers: 9 is refused, 8 accepted
    pp = dict(pp_degree=2, dp_degree=4, vpp_degree=2, pipeline_schedule="interleaved_1f1b", num_micro_batches=32,
              recompute="full")
    with pytest.raises(PlanError, match=r"recompute_num_layers=9 exceeds the 8 layers per chunk"):
        validate_plan(Plan(**pp, recompute_num_layers=9), m, 8, w)
    validate_plan(Plan(**pp, recompute_num_layers=8), m, 8, w)
    # uneven stage_layers (14 + 18): the largest chunk (18) bounds N
    sl = dict(pp_degree=2, dp_degree=4, num_micro_batches=32, recompute="full", stage_layers=(14, 18))
    validate_plan(Plan(**sl, recompute_num_layers=18), m, 8, w)
    with pytest.raises(PlanError, match=r"at most 18 layers per chunk.*1\.\.18"):
        validate_plan(Plan(**sl, recompute_num_layers=19), m, 8, w)
