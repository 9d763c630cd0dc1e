"""The real evaluator and `autotune validate` on CPU (gloo, 2 processes, tiny Llama)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from autotune.errors import PlanError
from autotune.spec.hardware import ClusterSpec, get_fabric, get_gpu
from autotune.spec.plan import Plan, PlanDocument, Workload
from autotune.runtime.evaluator import RealEvaluator, TrialFailed, tier_env

from runtime_harness import TINY

WL = Workload(seq_len=32, global_batch_size=4)


def _cluster(fabric="nvlink4"):
    return ClusterSpec(gpu=get_gpu("h200"), num_gpus=2, fabric=get_fabric(fabric))


def test_tier_env():
    assert tier_env(_cluster("nvlink4")) == {}
    assert tier_env(_cluster("pcie5")) == {"NCCL_P2P_DISABLE": "1"}


@pytest.mark.slow
def test_real_evaluator_ok_and_refused(monkeypatch):
    ev = RealEvaluator(model=TINY, cluster=_cluster(), workload=WL, steps=2, warmup=1, timeout_s=120,
                       device="cpu")
    plan = Plan(dp_degree=2, micro_batch_size=1, num_micro_batches=2, zero_stage=3, param_gather_overlap=True)
    r = ev.evaluate(plan)
    assert r.feasible and r.backend == "real" and r.step_time_ms > 0
    # MFU from the measured step: model FLOPs / (step x GPUs x peak), the simulator's formula
    from autotune.cost.flops import step_model_flops
    assert r.mfu == pytest.approx(step_model_flops(TINY, 32, 4) / (r.step_time_ms / 1e3 * 2 * 989e12))
    assert "simulated_step_time_ms" in r.details and len(r.details["step_times_ms"]) == 2
    # a setting the runtime cannot honor is refused before anything is launched
    with pytest.raises(PlanError):
        ev.evaluate(Plan(tp_degree=2, micro_batch_size=1, num_micro_batches=4, zero_stage=0,
                         tp_comm_overlap=True, dp_grad_reduce_overlap=False))
    # a crash is a TrialFailed with the rank's message
    monkeypatch.setenv("AUTOTUNE_RUNTIME_FAULT", "raise:step")
    with pytest.raises(TrialFailed):
        ev.evaluate(plan)


@pytest.mark.slow
def test_validate_command_cpu(tmp_path):
    from autotune.cli.app import main
    doc = PlanDocument(plan=Plan(tp_degree=2, micro_batch_size=1, num_micro_batches=4, zero_stage=0,
                                 sequence_parallel=True, dp_grad_reduce_overlap=False),
                       model=TINY, gpu="h200", num_gpus=2, fabric=get_fabric("nvlink4").to_dict(), workload=WL)
    p = tmp_path / "plan.yaml"
    doc.save(p)
    res = CliRunner().invoke(main, ["validate", str(p), "--device", "cpu", "--steps", "2", "--warmup", "1",
                                    "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    assert "MFU" in res.output and "simulated step time" in res.output
    # a CPU run has no meaningful MFU against the H200's peak, nor an error against the H200 prediction
    assert "not reported: a CPU run" in res.output and "not compared with a CPU run" in res.output
    assert "error" not in res.output.split("simulated step time")[1].splitlines()[0]
    assert (tmp_path / "r.json").exists()


def test_validate_reports_the_plan_error_before_the_machine(tmp_path):
    # tp 3 on 2 GPUs: the plan's own error (tp x pp x dp x cp = 3 x 1 x 2 x 1 = 6 != 2), not "no CUDA GPU"
    from autotune.cli.app import main
    doc = PlanDocument(plan=Plan(tp_degree=1, dp_degree=2, micro_batch_size=1, num_micro_batches=4),
                       model=TINY, gpu="h200", num_gpus=2, fabric=get_fabric("nvlink4").to_dict(), workload=WL)
    p = tmp_path / "plan.yaml"
    doc.save(p)
    p.write_text(p.read_text().replace("tp_degree: 1", "tp_degree: 3"))
    res = CliRunner().invoke(main, ["validate", str(p)])
    assert res.exit_code == 2, res.output
    assert "3 x 1 x 2 x 1 = 6 GPUs" in res.output and "CUDA" not in res.output


def test_cpu_validate_refuses_a_plan_larger_than_host_memory():
    # the memory model's per-rank peak x 2 ranks against a host with 1 GiB available: refused, naming both
    from autotune.errors import AutotuneError
    from autotune.cost.memory import estimate_memory
    from autotune.cli.validate import _check_host_memory, _one_line

    doc = PlanDocument(plan=Plan(dp_degree=2, micro_batch_size=1, num_micro_batches=4), model=TINY, gpu="h200",
                       num_gpus=2, fabric=get_fabric("nvlink4").to_dict(), workload=WL)
    from autotune.spec.hardware import ClusterSpec, get_gpu
    cluster = ClusterSpec(gpu=get_gpu("h200"), num_gpus=2, fabric=get_fabric("nvlink4"))
    need = 2 * estimate_memory(TINY, doc.plan, cluster.gpu, WL).peak_bytes
    _check_host_memory(doc, cluster, None, available_bytes=need)          # exactly enough: accepted
    with pytest.raises(AutotuneError, match=r"2 ranks of this plan need at least .* GiB of host memory"):
        _check_host_memory(doc, cluster, None, available_bytes=need - 1)
    # torchrun's multi-line failure report becomes one line: its first and last lines
    assert _one_line("ChildFailedError:\n  rank 0\n  exitcode -9 (SIGKILL)\n") == \
        "ChildFailedError: ... exitcode -9 (SIGKILL)"
