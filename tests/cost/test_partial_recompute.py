"""Partial full recomputation: ``Plan.recompute_num_layers`` (Megatron-LM ``--recompute-granularity
full --recompute-method block --recompute-num-layers N``: the first N layers of each model chunk are
checkpointed, megatron/core/recompute.py ``checkpointed_forward``; the rest keep their activations).

Values derived by hand from the 8B numbers of tests/cost/test_memory.py (its module docstring):
one 8B layer at s = 8192, b = 1, t = 1 keeps LAYER8 = 1,141,899,264 bytes without recompute and its
input 2sbh = SBH = 67,108,864 bytes under full recompute.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.cost import memory as _memory
from autotune.spec.engines import check_plan_for_engine, get_engine
from autotune.errors import PlanError
from autotune.engines.megatron.export import megatron_args
from autotune.cost.graph import CostBuilder
from autotune.spec.hardware import get_gpu, make_cluster
from autotune.spec.models import get_model
from autotune.spec.plan import Plan, PlanDocument, Workload
from autotune.cost.schedule import schedule_order
from autotune.cost.simulator import SimulatedEvaluator

M8 = get_model("8b")
H200 = get_gpu("h200")
W = Workload(seq_len=8192, global_batch_size=8)
LAYER8 = 1_141_899_264
SBH = 67_108_864
#: the minimal saved set with gradients alive (as tests/cost/test_memory.py's MINIMAL): the hand numbers above
MINIMAL = replace(get_engine("native"), activation_accounting="minimal", frees_grads_between_steps=False)


def est(model=M8, workload=W, **plan):
    return _memory.estimate_memory(model, Plan(**plan), H200, workload, engine=MINIMAL,
                                   fragmentation={"none": 0.0})


# ------------------------------------------------------------------ plan field
def test_plan_field_validation():
    assert Plan().recompute_num_layers == 0
    assert Plan(recompute="full", recompute_num_layers=5).partial_recompute
    assert not Plan(recompute="full").partial_recompute
    # N >= 1 only with recompute=full (Megatron's block method is a full-recompute method)
    for mode in ("none", "selective"):
        with pytest.raises(PlanError, match=f"recompute_num_layers=5 needs recompute=full.*recompute={mode}"):
            Plan(recompute=mode, recompute_num_layers=5)
    for bad in (-1, True, 2.0, "5"):
        with pytest.raises(PlanError, match="recompute_num_layers must be an integer between 0"):
            Plan(recompute="full", recompute_num_layers=bad)
    # recomputed layers of a chunk: all (N = 0), min(N, L_c), none without full recompute
    p5 = Plan(recompute="full", recompute_num_layers=5)
    assert [p5.recomputed_layers(n) for n in (0, 3, 5, 8, 32)] == [0, 3, 5, 5, 5]
    assert Plan(recompute="full").recomputed_layers(8) == 8
    assert Plan(recompute="selective").recomputed_layers(8) == 0


def test_yaml_round_trip_and_old_files(tmp_path):
    c = make_cluster("h100", 8, "nvlink4+ib-ndr400")
    doc = PlanDocument(plan=Plan(dp_degree=8, num_micro_batches=16, recompute="full", recompute_num_layers=5),
                       model=M8, gpu="h100", num_gpus=8, fabric=c.fabric.to_dict(),
                       workload=Workload(seq_len=8192, global_batch_size=128), engine="megatron")
    f = tmp_path / "plan.yaml"
    doc.save(f)
    assert "recompute_num_layers: 5" in f.read_text()
    back = PlanDocument.load(f)
    assert back == doc and back.plan.recompute_num_layers == 5
    # a plan file written before the field existed still loads (every layer recomputes)
    d = doc.to_dict()
    del d["plan"]["recompute_num_layers"]
    assert PlanDocument.from_dict(d).plan.recompute_num_layers == 0
    d["plan"]["recompute_num_layers"] = 3
    d["plan"]["recompute"] = "none"
    with pytest.raises(PlanError, match="field plan: recompute_num_layers=3 needs recompute=full"):
        PlanDocument.from_dict(d)


# ------------------------------------------------------------------ engines
@pytest.mark.parametrize("engine,why", [("native", "runtime/model.py"),
                                        ("torchtitan", "activation_checkpoint.py")])
def test_engines_without_partial_recompute_refuse_it(engine, why):
    plan = Plan(recompute="full", recompute_num_layers=5)
    with pytest.raises(PlanError, match=f"recompute_num_layers=5 cannot run on engine {engine}: .*{why}"):
        check_plan_for_engine(plan, get_engine(engine))
    check_plan_for_engine(Plan(recompute="full"), get_engine(engine))      # every layer: fine
    # the evaluator refuses it too (one line naming the value)
    ev = SimulatedEvaluator(model=M8, cluster=make_cluster("h200", 1, "nvlink4+ib-ndr400"), workload=W,
                            engine=engine)
    with pytest.raises(PlanError, match=f"recompute_num_layers=5 cannot run on engine {engine}"):
        ev.evaluate(replace(plan, num_micro_batches=8))


def test_megatron_runs_partial_recompute():
    assert get_engine("megatron").partial_recompute
    check_plan_for_engine(Plan(recompute="full", recompute_num_layers=5), get_engine("megatron"))


# ------------------------------------------------------------------ memory
def test_memory_pp1_first_n_layers_keep_only_their_input():
    # pp = 1, one chunk of 32 layers, N = 5: 5 layers x SBH + 27 x LAYER8 + the embedding output SBH
    #   = 335,544,320 + 30,831,280,128 + 67,108,864 = 31,233,933,312 bytes
    a = {k: est(recompute="full", recompute_num_layers=k).stages[0] for k in (5, 32, 40)}
    none, full = est(recompute="none").stages[0], est(recompute="full").stages[0]
    assert a[5].activations_bytes == 5 * SBH + 27 * LAYER8 + SBH == 31_233_933_312
    # N >= the chunk's 32 layers: every layer, the same as recompute_num_layers = 0
    assert a[32].activations_bytes == a[40].activations_bytes == full.activations_bytes == 33 * SBH
    # the re-run's working set (one layer's no-recompute activations) exists as soon as a layer recomputes
    assert a[5].transient_bytes == full.transient_bytes == none.transient_bytes + LAYER8


def test_memory_1f1b_equal_chunks():
    # pp = 4, m = 8, 8 layers per stage, N = 3: a stage's micro-batch keeps 3 SBH + 5 LAYER8; stage r
    # holds min(4 - r, 8) micro-batches (1F1B); rank 0 also the embedding output per micro-batch.
    e = est(pp_degree=4, num_micro_batches=8, recompute="full", recompute_num_layers=3)
    per_mb = 3 * SBH + 5 * LAYER8
    assert [s.activations_bytes for s in e.stages] == [4 * (per_mb + SBH), 3 * per_mb, 2 * per_mb, per_mb]
    assert [s.num_inflight_microbatches for s in e.stages] == [4, 3, 2, 1]


def _walk_peak(plan: Plan, stage: int, chunk_bytes: list[int], first_bytes: int) -> int:
    """Exhaustive walk of the rank's schedule order: bytes alive after every forward, the maximum."""
    p = plan.pp_degree
    mine = chunk_bytes[stage::p]
    alive = [0] * len(mine)
    best = 0
    for phase, c, _ in schedule_order(plan, stage, plan.num_micro_batches):
        alive[c] += 1 if phase == "F" else -1
        if phase == "F":
            held = sum(a * b for a, b in zip(alive, mine)) + (alive[0] * first_bytes if stage == 0 else 0)
            best = max(best, held)
    return best


def test_memory_uneven_chunks_per_chunk_bytes():
    # 16-layer 8B, pp = 2, v = 2, stage_layers [3, 5, 6, 2] (rank 0: chunks of 3 and 6 layers; rank 1:
    # 5 and 2), N = 4: per micro-batch chunk 3 -> 3 SBH; chunk 6 -> 4 SBH + 2 L; chunk 5 -> 4 SBH + 1 L;
    # chunk 2 -> 2 SBH. tests/cost/test_memory.py's hand count of this schedule: rank 0's candidate instants
    # are (chunk 0 x 3, chunk 1 x 2) and (chunk 0 x 4, chunk 1 x 1): 3 x 3 SBH + 2 (4 SBH + 2 L) + 3 SBH
    # = 20 SBH + 4 L > 4 x 3 SBH + (4 SBH + 2 L) + 4 SBH = 20 SBH + 2 L. Rank 1 peaks with chunk 0 x 3:
    # 3 (4 SBH + L) = 12 SBH + 3 L.
    m16 = replace(M8, name="16-layer", num_layers=16)
    kw = dict(pp_degree=2, vpp_degree=2, num_micro_batches=4, pipeline_schedule="interleaved_1f1b",
              stage_layers=(3, 5, 6, 2), recompute="full", recompute_num_layers=4)
    e = est(model=m16, **kw)
    assert e.stages[0].activations_bytes == 20 * SBH + 4 * LAYER8
    assert e.stages[1].activations_bytes == 12 * SBH + 3 * LAYER8
    # and by exhaustive enumeration of every instant of the schedule
    chunk_bytes = [3 * SBH, 4 * SBH + LAYER8, 4 * SBH + 2 * LAYER8, 2 * SBH]
    plan = Plan(**kw)
    assert [s.activations_bytes for s in e.stages] == [_walk_peak(plan, r, chunk_bytes, SBH) for r in (0, 1)]


# ------------------------------------------------------------------ time
def _builder(plan: Plan, engine: str = "megatron") -> CostBuilder:
    ev = SimulatedEvaluator(model=get_model("70b"), cluster=make_cluster("h100", 64, "nvlink4+ib-ndr400"),
                            workload=Workload(seq_len=8192, global_batch_size=256), engine=engine)
    return CostBuilder(model=ev.model, plan=plan, cluster=ev.cluster, workload=ev.workload, costs=ev.costs,
                       engine=ev.engine)


def test_chunk_cost_scales_with_recomputed_layers():
    # per chunk of L equal layers: cost(N) = cost(none) + min(N, L)/L x (cost(full) - cost(none)), part by
    # part (the re-run's compute in ``recompute``, its TP all-reduces in ``exposed_tp_comm``); forward
    # unchanged. TP 8 (no SP: exposed TP comm re-run too), chunks of L = 10 layers (80 / (pp 4 x v 2)).
    base = dict(tp_degree=8, pp_degree=4, dp_degree=2, vpp_degree=2, micro_batch_size=1, num_micro_batches=128,
                pipeline_schedule="interleaved_1f1b")
    L = 10
    none = _builder(Plan(**base, recompute="none"))
    full = _builder(Plan(**base, recompute="full"))
    for vs in (0, 3, 7):                                   # embedding chunk, a middle one, the LM-head chunk
        cn, cf = none.chunk_cost(vs, L), full.chunk_cost(vs, L)
        assert cf.bwd_parts["recompute"] > 0 and cf.bwd_parts["exposed_tp_comm"] > cn.bwd_parts["exposed_tp_comm"]
        for n in (1, 3, 10, 15):
            cp = _builder(Plan(**base, recompute="full", recompute_num_layers=n)).chunk_cost(vs, L)
            k = min(n, L) / L
            assert cp.fwd_parts == pytest.approx(cn.fwd_parts)
            for part in set(cf.bwd_parts) | set(cn.bwd_parts):
                want = cn.bwd_parts.get(part, 0.0) + k * (cf.bwd_parts.get(part, 0.0) - cn.bwd_parts.get(part, 0.0))
                assert cp.bwd_parts.get(part, 0.0) == pytest.approx(want, rel=1e-12, abs=1e-12), (vs, n, part)


def test_step_time_between_none_and_full():
    # time does not depend on capacity: an H100 with room for the no-recompute plan
    c = make_cluster("h100", 8, "nvlink4+ib-ndr400")
    c = replace(c, gpu=replace(c.gpu, hbm_gib=1e6))
    ev = SimulatedEvaluator(model=M8, cluster=c, workload=Workload(seq_len=8192, global_batch_size=128),
                            engine="megatron")
    kw = dict(dp_degree=8, num_micro_batches=16, zero_stage=1)
    t = {n: ev.evaluate(Plan(**kw, recompute="full", recompute_num_layers=n)) for n in (5, 16)}
    t_none, t_full = ev.evaluate(Plan(**kw)), ev.evaluate(Plan(**kw, recompute="full"))
    assert all(r.feasible for r in (*t.values(), t_none, t_full))
    assert t_none.step_time_ms < t[5].step_time_ms < t[16].step_time_ms < t_full.step_time_ms
    # the recompute term alone: N / L of full recompute's (32 layers, one chunk)
    assert t[5].breakdown_ms["recompute"] == pytest.approx(5 / 32 * t_full.breakdown_ms["recompute"], rel=1e-9)


# ------------------------------------------------------------------ export
def test_megatron_export_flags():
    def flags(plan):
        a = megatron_args(plan, M8, Workload(seq_len=8192, global_batch_size=128))
        i = a.index("--recompute-granularity")
        return a[i:i + 6]
    kw = dict(dp_degree=8, num_micro_batches=16)
    assert flags(Plan(**kw, recompute="full", recompute_num_layers=5)) == [
        "--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "5"]
    # every layer: unchanged (uniform, 1 layer per checkpointed group)
    assert flags(Plan(**kw, recompute="full")) == [
        "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]


def test_hfu_counts_only_the_recomputed_layers():
    # HFU's recompute FLOPs (autotune.cost.flops.recompute_flops_per_token, full = every layer's forward):
    # with N = 5 of 32 layers, 5/32 of them. HFU - MFU is proportional to the recompute FLOPs at a
    # given step time, so (hfu - mfu) / mfu scales by 5/32 against full recompute.
    c = make_cluster("h100", 8, "nvlink4+ib-ndr400")
    ev = SimulatedEvaluator(model=M8, cluster=replace(c, gpu=replace(c.gpu, hbm_gib=1e6)),
                            workload=Workload(seq_len=8192, global_batch_size=128), engine="megatron")
    kw = dict(dp_degree=8, num_micro_batches=16, recompute="full")
    full, part = ev.evaluate(Plan(**kw)), ev.evaluate(Plan(**kw, recompute_num_layers=5))
    assert (part.hfu - part.mfu) / part.mfu == pytest.approx(5 / 32 * (full.hfu - full.mfu) / full.mfu, rel=1e-9)
