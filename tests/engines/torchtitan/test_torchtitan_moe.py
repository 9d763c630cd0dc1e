"""torchtitan MoE configs (issue 39 item 2, issue 38 item 5): the 0.2.2 job files of the qwen3 30B-A3B and
deepseek_v3 16B flavours, their truncated flavours, the refusals, and the >= 0.3 config module loaded by
torchtitan's own ConfigManager (skipped where torchtitan 0.3 does not import)."""

from __future__ import annotations

import dataclasses
import sys

import pytest
from torchtitan_loader import torchtitan_available

from autotune.errors import ConfigError
from autotune.engines.torchtitan import flavors as torchtitan_flavors
from autotune.engines.torchtitan.export import MOE_FLAVORS, model_refusal, torchtitan_settings
from autotune.engines.torchtitan.job import FLAVORS_MODULE, job_sections, job_toml, render_toml
from autotune.spec.models import get_builtin_model
from autotune.spec.plan import Plan, Workload

from test_torchtitan_job import JOB_CONFIG_0_2_2, _nested, tomllib

QWEN, DSV = get_builtin_model("qwen3-30b-a3b"), get_builtin_model("deepseek-16b")
W = Workload(seq_len=4096, global_batch_size=4)
# torchtitan v0.2.2 torchtitan/config/job_config.py Debug (the fields of the section the MoE jobs add)
FIELDS = {**JOB_CONFIG_0_2_2, "debug": {"seed", "deterministic", "deterministic_warn_only", "moe_force_load_balance"}}


def plan(**kw) -> Plan:
    base = dict(tp_degree=1, pp_degree=1, dp_degree=1, cp_degree=1, micro_batch_size=2, num_micro_batches=2,
                recompute="selective", zero_stage=0, compile=True)
    return Plan(**{**base, **kw})


def sections(p: Plan, model, **kw) -> dict:
    s = job_sections(p, model, W, steps=8, hf_assets_path="tok", **kw)
    if tomllib is not None:
        assert tomllib.loads(render_toml(s)) == _nested(s)
    for name, fields in s.items():
        assert set(fields) <= FIELDS[name], (name, set(fields) - FIELDS[name])
    return s


@pytest.mark.parametrize("model,name,flavor", [(QWEN, "qwen3", "30B-A3B_L6"), (DSV, "deepseek_v3", "16B_L6")])
def test_moe_job_names_the_flavour_ep_and_balanced_routing(model, name, flavor):
    s = sections(plan(), model, layers=6)
    assert s["model"]["name"] == name and s["model"]["flavor"] == flavor
    assert s["experimental"] == {"custom_import": FLAVORS_MODULE}
    assert s["parallelism"]["expert_parallel_degree"] == 1 and s["parallelism"]["expert_tensor_parallel_degree"] == 1
    assert s["debug"] == {"moe_force_load_balance": True}          # balanced by default
    # local batch = micro-batch without PP: torchtitan accumulates 4 / (2 x 1) = 2 steps
    assert s["training"]["local_batch_size"] == 2 and s["training"]["global_batch_size"] == 4
    assert s["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    text = job_toml(plan(), model, W, steps=8, hf_assets_path="tok", layers=6)
    assert "# routing: balanced (debug.moe_force_load_balance)" in text and "ep 1 etp 1" in text


def test_router_as_trained_and_the_full_depth():
    s = sections(plan(), QWEN, force_load_balance=False)
    assert s["debug"] == {"moe_force_load_balance": False} and s["model"]["flavor"] == "30B-A3B"
    assert "experimental" not in s
    assert "the router as trained" in job_toml(plan(), QWEN, W, steps=8, hf_assets_path="t", force_load_balance=False)


def test_expert_degrees_reach_the_job():
    # 8 GPUs, DP 8 at ZeRO 0, experts over EP 4 x ETP 2 (folded over DP: 8 = 4 x 2)
    p = plan(dp_degree=8, ep_degree=4, etp_degree=2, micro_batch_size=1, num_micro_batches=1)
    s = job_sections(p, QWEN, Workload(seq_len=4096, global_batch_size=8), steps=2, hf_assets_path="t")
    assert (s["parallelism"]["expert_parallel_degree"], s["parallelism"]["expert_tensor_parallel_degree"]) == (4, 2)
    assert s["parallelism"]["data_parallel_replicate_degree"] == 8


@pytest.mark.parametrize("precision", ["fp8_rowwise", "fp8_tensorwise", "mxfp8"])
def test_fp8_is_refused_for_moe_naming_bf16(precision):
    with pytest.raises(ConfigError, match="valid for MoE models: bf16"):
        job_sections(plan(precision=precision), DSV, W, steps=2, hf_assets_path="t", layers=6)


def test_dispatcher_and_grouped_gemm_torchtitan_lacks_are_refused():
    with pytest.raises(ConfigError, match="valid: moe_grouped_gemm true"):
        torchtitan_settings(plan(moe_grouped_gemm=False), QWEN, W)
    with pytest.raises(ConfigError, match="valid: alltoall"):
        torchtitan_settings(plan(moe_dispatcher="allgather"), QWEN, W)


def test_deepseek_16b_is_torchtitans_16b_flavour_field_for_field():
    """torchtitan v0.2.2 torchtitan/models/deepseek_v3/__init__.py deepseekv3_args["16B"], transcribed:
    vocab 102400, dim 2048, inter_dim 10944, moe_inter_dim 1408, 27 layers, 1 dense, 16 heads, 64 experts,
    2 shared, top-6, softmax, q_lora_rank 0, kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128."""
    m = DSV
    assert (m.vocab_size, m.hidden_size, m.ffn_hidden_size, m.moe_ffn_hidden_size) == (102400, 2048, 10944, 1408)
    assert (m.num_layers, m.num_first_dense_layers, m.num_heads) == (27, 1, 16)
    assert (m.num_experts, m.num_shared_experts, m.moe_top_k, m.router_score_function) == (64, 2, 6, "softmax")
    # torchtitan's shared experts are one FeedForward of moe_inter_dim x num_shared_experts (models/moe/moe.py
    # MoE.__init__): 2 x 1408, the FLOPs and parameters of autotune's 2 experts of 1408
    assert m.shared_expert_ffn_hidden_size == 1408
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (0, 512, 128, 64, 128)
    # qwen3_args["30B-A3B"]: dim 2048, 48 layers, 32 / 4 heads of 128, 128 experts of 768, top-8, no shared
    q = QWEN
    assert (q.hidden_size, q.num_layers, q.num_heads, q.num_kv_heads, q.head_dim) == (2048, 48, 32, 4, 128)
    assert (q.num_experts, q.moe_ffn_hidden_size, q.moe_top_k, q.num_shared_experts, q.qk_norm) == (128, 768, 8, 0, True)
    assert set(MOE_FLAVORS) == {"qwen3-30b-a3b", "deepseek-16b"}
    assert model_refusal(DSV) is None and model_refusal(dataclasses.replace(DSV, num_layers=6), truncated=True) is None
    assert "differ" in model_refusal(dataclasses.replace(DSV, moe_top_k=8))
    assert "differ" in model_refusal(dataclasses.replace(DSV, num_layers=6))       # truncation only when asked
    assert "MoE flavours" in model_refusal(get_builtin_model("mixtral-8x7b"))


@dataclasses.dataclass
class _DSArgs:   # stands in for torchtitan's DeepSeekV3ModelArgs
    dim: int
    n_layers: int
    n_dense_layers: int


def test_moe_flavours_cut_depth_and_keep_the_dense_first_layer():
    args = {"16B": _DSArgs(2048, 27, 1), "debugmodel": _DSArgs(256, 6, 1)}
    added = torchtitan_flavors.register(args, ("16B",))
    assert len(added) == 27 and "debugmodel_L1" not in args
    assert args["16B_L6"] == _DSArgs(2048, 6, 1) and args["16B_L1"] == _DSArgs(2048, 1, 1)
    assert args["16B"] == _DSArgs(2048, 27, 1)
    assert [m for m, _, _ in torchtitan_flavors.MOE_BASES] == ["torchtitan.models.qwen3", "torchtitan.models.deepseek_v3"]


def _doc(model, p, gpus):
    from autotune.spec.hardware import make_cluster
    from autotune.spec.plan import PlanDocument

    cl = make_cluster("h200", gpus, None)
    return PlanDocument(plan=p, model=model, gpu="h200", num_gpus=gpus, fabric=cl.fabric.to_dict(),
                        workload=Workload(seq_len=4096, global_batch_size=64), study="s", trial_id=1,
                        engine="torchtitan")


def test_the_0_3_module_refuses_etp():
    from autotune.engines.torchtitan.export import torchtitan_config_module

    p = plan(dp_degree=8, ep_degree=4, etp_degree=2, micro_batch_size=2, num_micro_batches=4)
    with pytest.raises(ConfigError, match="no expert tensor parallel degree"):
        torchtitan_config_module(p, QWEN, Workload(seq_len=4096, global_batch_size=64))


@pytest.mark.parametrize("model,name,flavor", [(QWEN, "qwen3", "30B-A3B"), (DSV, "deepseek_v3", "16B")])
def test_moe_config_module_loads_with_torchtitans_loader(model, name, flavor, tmp_path, monkeypatch):
    if not torchtitan_available():
        pytest.skip("torchtitan >= 0.3.0 not importable; the job-file checks above ran instead")
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.activation_checkpoint import FullAC

    from autotune.export import write_launch_files

    # 8 GPUs: DP 8 at ZeRO 0 (DDP), experts over EP 8; 64 sequences = 8 ranks x local 2 x 4 accumulation steps
    p = plan(dp_degree=8, ep_degree=8, micro_batch_size=2, num_micro_batches=4, recompute="full")
    write_launch_files(_doc(model, p, 8), tmp_path, "torchrun")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("autotune_torchtitan", None)
    cfg = ConfigManager().parse_args(["--module", "autotune_torchtitan", "--config", "autotune_plan"])
    assert (cfg.model_spec.name, cfg.model_spec.flavor) == (name, flavor)
    assert cfg.parallelism.expert_parallel_degree == 8 and cfg.parallelism.data_parallel_replicate_degree == 8
    assert cfg.debug.moe_force_load_balance is True
    assert cfg.training.local_batch_size == 2 and cfg.training.global_batch_size == 64
    assert isinstance(cfg.activation_checkpoint, FullAC.Config) and cfg.compile.enable is True
    assert cfg.training.disable_cuda_graphs is True          # 0.3 refuses CUDA graphs with the all-to-all EP


# ---- the recorded MoE runs (1x H200, torchtitan 0.2.2, 2026-12-03: docs/results/engines/torchtitan-moe-h200x1-2026-12-03)
from pathlib import Path

RUNS = Path(__file__).resolve().parents[3] / "docs" / "results" / "engines" / "torchtitan-moe-h200x1-2026-12-03"
QWEN_LOG = RUNS / "qwen3-30b-a3b" / "ttlogs" / "trial01-tp1pp1dp1cp1-mb4-bf16-compile-rcnone.log"
DSV_SHIPPED_LOG = RUNS / "deepseek-16b" / "ttlogs" / "shipped" / "trial01-tp1pp1dp1cp1-mb4-bf16-eager-rcselective.log"


def test_recorded_moe_logs_parse_with_the_flavour_and_exact_parameters():
    from autotune.engines.torchtitan.log import parse_facts, parse_steps

    for log, model, flavour, params in ((QWEN_LOG, QWEN, "qwen3 30B-A3B_L6", 4_361_055_744),
                                        (DSV_SHIPPED_LOG, DSV, "deepseek_v3 16B_L6", 3_424_678_912)):
        text = log.read_text()
        f = parse_facts(text)
        assert f["model"] == flavour and f["torchtitan_version"] == "0.2.2" and not f["oom"]
        # torchtitan's own count of the truncated flavour is autotune's: qwen3 at 6 layers by hand =
        # 2 x 151936 x 2048 (embedding, untied output) + 2048 (norm) + 6 x (q 2048 x 4096 + k, v 2 x 2048 x 512
        # + o 4096 x 2048 + q/k norms 2 x 128 + 2 norms x 2048 + router 2048 x 128 + 128 experts x 3 x 2048 x 768)
        # = 622,331,904 + 6 x 623,120,640 = 4,361,055,744
        assert f["params"] == params == model.truncated(6).num_params
        recs = parse_steps(text)
        assert [r.step for r in recs] == list(range(1, 9)) and f["local_batch_size"] == 4
    # the first compiled Qwen3 trial: step 4 of the log, "tps: 47,555" -> 16,384 tokens / 47,555 = 344.5 ms
    assert parse_steps(QWEN_LOG.read_text())[3].step_time_s(16384) == pytest.approx(0.34453, abs=1e-5)


def test_triton_autotuning_out_of_resource_is_not_a_cuda_oom():
    """DeepSeek 16B's flex attention autotuning prints "OutOfMemoryError: out of resource: triton_flex_attention_backward
    Required: 248832 Hardware limit:232448" for candidates over the shared-memory limit (skipped by inductor); the
    run finished its 8 steps and is ok, while a real CUDA out-of-memory error still is an OOM."""
    from autotune.engines.torchtitan.runner import classify

    text = DSV_SHIPPED_LOG.read_text()
    assert "OutOfMemoryError: out of resource" in text
    c = classify(text, returncode=0, timed_out=False, timeout_s=200, total_steps=8)
    assert c["status"] == "ok" and not c["facts"]["oom"]
    oom = text + "\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    assert classify(oom, returncode=1, timed_out=False, timeout_s=200, total_steps=8)["status"] == "oom"


def test_cli_run_of_an_moe_model_states_the_routing_and_replays(tmp_path, monkeypatch):
    """`autotune run --backend real --engine torchtitan --model qwen3-30b-a3b --layers 6` with a fake trainer
    replaying the recorded Qwen3 log: the routing line, the MoE job, export, validate beside the prediction."""
    import functools
    import textwrap

    from click.testing import CliRunner

    from autotune.cli import main
    from autotune.engines.torchtitan import runner as tr

    fake = tmp_path / "fake_torchrun.py"
    fake.write_text(textwrap.dedent(f'''\
        import sys, pathlib
        argv = sys.argv[1:]
        job = pathlib.Path(argv[argv.index("--job.config_file") + 1])
        pathlib.Path(sys.argv[0]).with_name("seen.toml").write_text(job.read_text())
        print(open({str(QWEN_LOG)!r}).read())
    '''))
    monkeypatch.setattr(tr, "check_torchtitan", lambda: "0.2.2")
    monkeypatch.setattr(tr.TorchtitanEvaluator, "__init__",
                        functools.partialmethod(tr.TorchtitanEvaluator.__init__, command=[sys.executable, str(fake)]))
    db = f"sqlite:///{tmp_path / 's.db'}"
    res = CliRunner().invoke(main, ["run", "--backend", "real", "--engine", "torchtitan", "--model", "qwen3-30b-a3b",
                                    "--gpu", "h200", "--gpus", "1", "--layers", "6", "--seq-len", "4096",
                                    "--global-batch", "16K", "--trials", "2", "--real-steps", "5", "--storage", db])
    assert res.exit_code == 0, res.output
    assert "MoE routing: balanced: torchtitan's debug.moe_force_load_balance" in res.output
    assert "2 kept for real runs" in res.output and "simulated prediction" in res.output
    # each trial's measurement beside the prediction: the replayed log's median (344.5 ms) and peak (82.15 GiB, stored as whole bytes: 82.1)
    assert "measured vs predicted" in res.output
    assert "trial 0: mb 4 x 1, bf16, compile, recompute none: 344.5 ms, 82.1 GiB measured; predicted " in res.output
    seen = (tmp_path / "seen.toml").read_text()
    assert 'name = "qwen3"' in seen and 'flavor = "30B-A3B_L6"' in seen and "moe_force_load_balance = true" in seen
    study = res.output.split("export --study ")[1].split()[0].strip("'")
    res = CliRunner().invoke(main, ["export", "--study", study, "--storage", db, "-o", str(tmp_path / "plan.yaml")])
    assert res.exit_code == 0 and "expert_parallel_degree = 1" in res.output, res.output
    res = CliRunner().invoke(main, ["validate", "--engine", "torchtitan", "--layers", "6", "--steps", "5", "--warmup",
                                    "3", "--moe-routing", "trained", str(tmp_path / "plan.yaml")])
    assert res.exit_code == 0, res.output
    assert "the router as trained" in res.output and "344.5 ms" in res.output and "simulated step time" in res.output
    assert "moe_force_load_balance = false" in (tmp_path / "seen.toml").read_text()
    res = CliRunner().invoke(main, ["run", "--model", "qwen3-30b-a3b", "--gpus", "8", "--moe-routing", "trained"])
    assert res.exit_code == 2 and "--moe-routing trained applies to --backend real --engine torchtitan" in res.output


def test_screen_simulates_more_rounds_when_the_writer_refuses_most_plans():
    """The torchtitan writer refuses FP8 for MoE models, so 48 simulated trials of DeepSeek 16B at 6 layers hold
    fewer than 8 runnable jobs (7 with seed 0): the screen simulates another round (autotune/tune/screen.py
    MAX_ROUNDS) and keeps 8, every one BF16."""
    from autotune.cli.options import resolve_target
    from autotune.engines.torchtitan.runner import run_key
    from autotune.spec.engines import resolve_engine
    from autotune.tune.screen import screen_plans

    model, cluster, workload = resolve_target(size=None, model_path="deepseek-16b", gpu="h200", gpus=1,
                                              interconnect=None, seq_len=4096, global_batch="16K")
    s = screen_plans(model=model, cluster=cluster, workload=workload, engine=resolve_engine("torchtitan", "real"),
                     keep=8, seed=0, layers=6, run_key=run_key(model, workload, 6))
    assert len(s.kept) == 8 and s.simulated > 48
    assert {p.precision for p in s.plans} == {"bf16"} and s.unwritable > 0
