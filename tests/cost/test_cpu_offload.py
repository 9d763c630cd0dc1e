"""CPU activation offloading (Plan.cpu_offload_layers; issue 40, item 3): plan rules, Transformer Engine's
schedule replayed by autotune/cost/offload.py, the memory it frees, the Megatron-LM flag both ways, engines
that refuse it."""

from __future__ import annotations

import pytest

from autotune.cost.evaluator import make_evaluator
from autotune.cost.memory import estimate_memory, offload_kept_bytes, offload_layer_bytes
from autotune.cost.offload import HOST_COPY_EFFICIENCY, host_copy_gbs, offload_exposed_ms
from autotune.errors import ConfigError, PlanError
from autotune.spec.engines import check_plan_for_engine, get_engine
from autotune.spec.hardware import get_gpu, make_cluster
from autotune.spec.models import get_model
from autotune.spec.plan import Plan, Workload, validate_plan

M70 = get_model("70b")
W = Workload.from_tokens(seq_len=8192, global_batch_tokens=8192 * 256)
FSDP64 = dict(dp_degree=64, zero_stage=3, num_micro_batches=4, param_gather_overlap=True)


# ---- the schedule, by hand ------------------------------------------------------------------------------------
def test_schedule_hidden_when_each_copy_fits_behind_the_layers_before_its_deadline():
    # L=4, N=2, forward 10 ms, backward 20 ms per layer, copy 15 ms (15e6 B at 1 GB/s). Forward: copy 0 runs
    # 10-25, copy 1 25-40; layer 2 (deadline of copy 0) starts at max(20, 25) = 25, layer 3 (deadline of copy
    # 1) at max(35, 40) = 40, ends at 50: 10 ms of waits. Backward: reload 1 starts before layer 2's backward
    # (70), ends 85, needed at 90; reload 0 starts at 90, ends 105, needed at 110: no wait.
    t = offload_exposed_ms([10] * 4, [20] * 4, [15e6] * 4, 2, 1.0, compute_slowdown=1.0)
    assert t.exposed_fwd_ms == pytest.approx(10.0) and t.exposed_bwd_ms == pytest.approx(0.0)
    assert t.copy_ms == pytest.approx(60.0)
    # a copy of 5 ms hides entirely: 0 and 0
    t = offload_exposed_ms([10] * 4, [20] * 4, [5e6] * 4, 2, 1.0, compute_slowdown=1.0)
    assert (t.exposed_fwd_ms, t.exposed_bwd_ms) == (0.0, 0.0)


def test_schedule_exposes_the_copies_that_outrun_the_compute():
    # L=4, N=3, copy 25 ms. Forward: layer 0 ends 10, copy 0 10-35; layer 1 waits for copy 0 (its deadline,
    # layer L - N + 0 = 1): 35-45, copy 1 45-70; layer 2 waits: 70-80, copy 2 80-105; layer 3 waits: 105-115;
    # waits 115 - 40 = 75. Backward from 115: layer 3 115-135; reload 2 starts there (layer L - 1 - N + 2 = 2),
    # 135-160, layer 2 160-180; reload 1 180-205, layer 1 205-225; reload 0 225-250, layer 0 250-270;
    # waits 270 - 115 - 80 = 75.
    t = offload_exposed_ms([10] * 4, [20] * 4, [25e6] * 4, 3, 1.0, compute_slowdown=1.0)
    assert t.exposed_fwd_ms == pytest.approx(75.0) and t.exposed_bwd_ms == pytest.approx(75.0)


def test_compute_beside_a_copy_pays_the_measured_slowdown():
    # the hidden case above (5 ms copies, 2 of them each way): 10 ms of copy beside compute per pass, x 0.055
    t = offload_exposed_ms([10] * 4, [20] * 4, [5e6] * 4, 2, 1.0, compute_slowdown=1.055)
    assert t.exposed_fwd_ms == pytest.approx(0.55) and t.exposed_bwd_ms == pytest.approx(0.55)


def test_schedule_rejects_bad_inputs():
    with pytest.raises(ValueError, match="0..3"):
        offload_exposed_ms([1] * 4, [1] * 4, [1] * 4, 4, 1.0)
    with pytest.raises(ValueError, match="one entry per layer"):
        offload_exposed_ms([1] * 4, [1] * 3, [1] * 4, 1, 1.0)


def test_copy_rate_is_the_datasheet_link_times_the_measured_fraction():
    # H200: PCIe Gen5 x16 63.0 GB/s per direction x 55 / 63 (the H200 measurement) = 55 GB/s
    assert host_copy_gbs(get_gpu("h200")) == pytest.approx(55.0)
    # GB200: NVLink-C2C 900 GB/s bidirectional = 450 per direction
    assert host_copy_gbs(get_gpu("gb200")) == pytest.approx(450 * HOST_COPY_EFFICIENCY)


# ---- plan rules ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,words", [
    (dict(cpu_offload_layers=-1), "between 0"),
    (dict(cpu_offload_layers=1.0), "between 0"),
    (dict(cpu_offload_layers=2, pp_degree=2), "pp_degree=1"),
    (dict(cpu_offload_layers=2, recompute="selective"), "recompute=none"),
])
def test_plan_refuses_what_megatron_refuses(kw, words):
    with pytest.raises(PlanError, match=words):
        Plan(**kw)


def test_plan_round_trips_and_offload_below_the_layer_count():
    p = Plan(cpu_offload_layers=20, **FSDP64)
    assert Plan.from_dict(p.to_dict()) == p
    validate_plan(p, M70, 64, W)
    with pytest.raises(PlanError, match="less than the model's 80 layers"):
        validate_plan(p.replace(cpu_offload_layers=80), M70, 64, W)


def test_engines_without_it_refuse_it():
    p = Plan(cpu_offload_layers=4)
    check_plan_for_engine(p, get_engine("megatron"))
    for name in ("native", "torchtitan"):
        with pytest.raises(PlanError, match=f"cannot run on engine {name}"):
            check_plan_for_engine(p, get_engine(name))


# ---- memory and time ------------------------------------------------------------------------------------------
def test_memory_keeps_the_last_layers_activations_only():
    # TE's schedule keeps the saved tensors of layers N..L-1: the peak falls by exactly N layers' bytes
    gpu = get_gpu("gb200")
    base = Plan(**FSDP64)
    per = offload_layer_bytes(M70, base, W, "megatron")
    assert len(per) == 80 and len(set(per)) == 1
    for n in (20, 40):
        p = base.replace(cpu_offload_layers=n)
        assert offload_kept_bytes(M70, p, W, "megatron") == (80 - n) * per[0]
        drop = estimate_memory(M70, base, gpu, W, engine="megatron").peak_bytes \
            - estimate_memory(M70, p, gpu, W, engine="megatron").peak_bytes
        # the allocator fraction scales every term: the drop is N layers' bytes x (1 + fraction)
        assert n * per[0] <= drop <= 1.2 * n * per[0]


def test_gb200_hides_the_copies_and_pcie_does_not():
    # Llama 3.1 70B, 64 GPUs, Megatron-FSDP (the Megatron-Bridge GB200 recipe's layout, BF16, offload 20 of 80
    # layers: llama3_70b_pretrain_64gpu_gb200_bf16_config, perf_recipes/llama/gb200/llama3.py): without
    # offloading it does not fit a GB200, with it it does; on GB200 (450 GB/s) the copies hide and cost only the
    # slowdown beside them, on H100 (PCIe Gen5) the same plan waits for them. By hand from the model's own terms
    # (offload_layer_bytes, the CostBuilder's layer times): a layer saves 2.25 GB. GB200: a copy takes 2.25e9 /
    # (450 x 55/63 GB/s) = 5.7 ms, less than one layer's 11.7 ms forward, so no copy waits and only the slowdown
    # is left: 0.055 x 20 x 5.7 ms x 2 passes x 4 micro-batches = 50 ms of a ~12.1 s step = 0.4% (< 1%).
    # H100 at 60 layers: a copy takes 2.25e9 / 55e9 = 40.9 ms against a 23.5 ms forward; the 60 copies (2,455 ms
    # after layer 0's 23.5 ms) must end before layer 79's forward, which starts at 79 x 23.5 = 1,856 ms at the
    # earliest: >= 622 ms of waits per micro-batch, >= 2.49 s of a step the simulator puts at 27.7 s (9% > 5%)
    res = {}
    for gpu in ("gb200", "h100"):
        ev = make_evaluator("simulated", model=M70, cluster=make_cluster(gpu, 64), workload=W, engine="megatron")
        res[gpu] = {n: ev.evaluate(Plan(cpu_offload_layers=n, **FSDP64)) for n in (0, 20, 60)}
    assert not res["gb200"][0].feasible and res["gb200"][20].feasible
    g = res["gb200"][20]
    exposed = g.breakdown_ms["exposed_offload"]
    assert 0 < exposed < 0.01 * g.step_time_ms
    h = res["h100"][60]
    assert h.feasible and h.breakdown_ms["exposed_offload"] > 0.05 * h.step_time_ms


def test_unknown_host_link_is_a_clear_error():
    import dataclasses

    gpu = dataclasses.replace(get_gpu("h100"), host_link_gbs=None)
    with pytest.raises(ConfigError, match="host_link_gbs"):
        host_copy_gbs(gpu)


# ---- Megatron-LM flag both ways -------------------------------------------------------------------------------
def test_megatron_export_writes_the_flag_and_import_reads_it(tmp_path):
    from autotune.engines.megatron.importer import import_megatron_args
    from autotune.export import launch_command
    from autotune.spec.plan import PlanDocument

    plan = Plan(cpu_offload_layers=20, **FSDP64)
    cl = make_cluster("gb200", 64)
    doc = PlanDocument(plan=plan, model=M70, gpu="gb200", num_gpus=64, fabric=cl.fabric.to_dict(), workload=W,
                       study="s", trial_id=0, engine="megatron")
    args = list(launch_command(doc).args)
    i = args.index("--cpu-offloading-num-layers")
    assert args[i + 1] == "20"
    f = tmp_path / "args.txt"
    f.write_text(" \\\n".join(args) + "\n")
    again = import_megatron_args(f, num_gpus=64)
    assert again.plan.cpu_offload_layers == 20 and again.plan == plan


@pytest.mark.parametrize("extra,words", [
    ("--cpu-offloading-num-layers -3", "must be an integer >= 0"),
    # Megatron-Core's local implementation asserts cpu_offloading is off (transformer_block.py)
    ("--cpu-offloading-num-layers 8 --transformer-impl local", "needs Transformer Engine"),
    ("--cpu-offloading-num-layers 40", "less than the model's 32 layers"),
])
def test_megatron_import_refuses_offloading_it_cannot_run(tmp_path, extra, words):
    from autotune.engines.megatron.importer import import_megatron_args

    base = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
            "--group-query-attention --num-query-groups 8 --seq-length 8192 --max-position-embeddings 131072 "
            "--position-embedding-type rope --rotary-base 500000 --use-rope-scaling --normalization RMSNorm --swiglu "
            "--disable-bias-linear --untie-embeddings-and-output-weights --attention-dropout 0 --hidden-dropout 0 "
            "--vocab-size 128256 --bf16 --micro-batch-size 1 --global-batch-size 128 --cross-entropy-loss-fusion ")
    f = tmp_path / "args.txt"
    f.write_text(base + extra + "\n")
    with pytest.raises((ConfigError, PlanError), match=words):
        imp = import_megatron_args(f, num_gpus=8)
        validate_plan(imp.plan, imp.model, 8, imp.workload)


def test_offloading_plans_are_a_regime_without_published_runs():
    # no development-set run offloads activations, so such a plan is in a regime the model has no held-out
    # error for: plan_regimes names it and the interval row says it was widened (issue 40, item 1)
    from autotune.spec.trust import plan_regimes, regime_words

    p = Plan(cpu_offload_layers=20, **FSDP64)
    assert "cpu_offload" in plan_regimes(p, "gb200", M70.hidden_size)
    assert "cpu_offload" not in plan_regimes(p.replace(cpu_offload_layers=0), "gb200", M70.hidden_size)
    assert regime_words("cpu_offload") == "CPU activation offloading"
