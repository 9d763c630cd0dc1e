"""--model NAME: the built-in models resolve and tune with an expert layout; an engine without expert parallelism
refuses a mixture of experts in one line; --help lists the names and GPUs."""


import pytest
from click.testing import CliRunner

from autotune.cli.app import main
from autotune.cli.options import BUILTIN_MODEL_NAMES, GPU_NAMES, resolve_target
from autotune.errors import ConfigError
from autotune.spec.hardware import _load_data
from autotune.spec.models import MOE_CATALOG, get_model


def test_help_lists_agree_with_the_catalogs():
    assert list(BUILTIN_MODEL_NAMES) == list(MOE_CATALOG)
    assert sorted(GPU_NAMES) == sorted(_load_data("gpus.yaml")["gpus"])


@pytest.mark.parametrize("cmd", [["run", "--help"], ["simulate", "--help"], ["retune", "--help"]])
def test_help_lists_builtin_models(cmd):
    out = CliRunner().invoke(main, cmd, terminal_width=400).output
    for name in ("deepseek-v3", "kimi-k2", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-20b", "gpt-oss-120b",
                 "mixtral-8x7b", "mixtral-8x22b", "deepseek-16b"):
        assert name in out, (cmd, name)


@pytest.mark.parametrize("name", list(MOE_CATALOG))
def test_moe_names_resolve(name):
    if name.startswith("gpt-oss"):
        # its alternating 128-token sliding windows are not costed (attention would be costed full causal):
        # refused past the window, as for any windowed model (ModelSpec.check_sequence; docs/moe.md)
        with pytest.raises(ConfigError, match="sliding-window attention .* is not modelled"):
            resolve_target(size=None, model_path=name, gpu="b200", gpus=256, interconnect=None, seq_len=4096,
                           global_batch=None)
        return
    model, cluster, _ = resolve_target(size=None, model_path=name, gpu="b200", gpus=256, interconnect=None,
                                       seq_len=4096, global_batch=None)
    assert model is MOE_CATALOG[name] and model.is_moe and cluster.num_gpus == 256


def test_an_moe_model_tunes_with_an_expert_layout(tmp_path):
    # Qwen3-30B-A3B on 8 B200 (one NVLink domain): the tuned plan names its expert layout and the breakdown its
    # expert GEMMs, router / permutation and dispatch
    r = CliRunner().invoke(main, ["run", "--model", "qwen3-30b-a3b", "--gpu", "b200", "--gpus", "8", "--seq-len",
                                  "4096", "--global-batch", "2M", "--trials", "6", "--no-early-stop",
                                  "--storage", f"sqlite:///{tmp_path}/s.db"])
    assert r.exit_code == 0, r.output
    for needle in ("expert parallel", "token dispatcher", "expert_compute", "router_permute", "exposed_ep_comm"):
        assert needle in r.output, needle


def test_the_native_engine_refuses_an_moe_model_in_one_line():
    r = CliRunner().invoke(main, ["simulate", "--model", "qwen3-30b-a3b", "--gpus", "8", "--engine", "native"])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "Traceback" not in r.output, r.output
    assert "qwen3-30b-a3b is a mixture-of-experts model; engine native cannot run it" in lines[0]


def test_dense_names_and_unknown_names():
    model, _, _ = resolve_target(size=None, model_path="llama3.1-8b", gpu=None, gpus=None, interconnect=None,
                                 seq_len=None, global_batch=None)
    assert model is get_model("8b")
    with pytest.raises(ConfigError, match="not a built-in model and no such file; built-in: llama3.1-8b"):
        resolve_target(size=None, model_path="deepseek-v9", gpu=None, gpus=None, interconnect=None, seq_len=None,
                       global_batch=None)


def test_evaluator_of_an_engine_without_experts_and_exports():
    # library paths that do not go through the CLI: the evaluator (engine native refuses, megatron takes it) and
    # the launch export (Megatron-LM's MoE flags; torchtitan's export knows Llama 3.1 and two MoE flavours)
    from autotune.cost.evaluator import make_evaluator
    from autotune.errors import PlanError
    from autotune.export import launch_command
    from autotune.spec.hardware import make_cluster
    from autotune.spec.plan import Plan, PlanDocument, Workload

    cluster = make_cluster("h100", 64, None)
    w = Workload.from_tokens(seq_len=4096, global_batch_tokens=4096 * 256)
    with pytest.raises(PlanError, match="engine native cannot run it"):
        make_evaluator("simulated", model=MOE_CATALOG["mixtral-8x7b"], cluster=cluster, workload=w, engine="native")
    make_evaluator("simulated", model=MOE_CATALOG["mixtral-8x7b"], cluster=cluster, workload=w, engine="megatron")
    doc = PlanDocument(plan=Plan(dp_degree=64, ep_degree=8, num_micro_batches=4), model=MOE_CATALOG["mixtral-8x7b"],
                       gpu="h100", num_gpus=64, fabric=cluster.fabric.to_dict(), workload=w, engine="megatron")
    again = PlanDocument.from_yaml(doc.to_yaml())
    assert again.model == MOE_CATALOG["mixtral-8x7b"] and again.plan.ep_degree == 8
    args = launch_command(again).args
    assert args[args.index("--num-experts") + 1] == "8" and args[args.index("--expert-model-parallel-size") + 1] == "8"
    from autotune.engines.registry import export_module
    assert "the torchtitan export knows the Llama 3.1 flavours" in \
        export_module("torchtitan").launch_refusal(again.model, 4096)
