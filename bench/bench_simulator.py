"""Benchmark: simulator speed and the Llama 3 paper's 405B plans, simulated (no GPU).

Prints two tables:
1. time per simulated step graph (graph build + simulation) for representative plans;
2. the Llama 3 paper's 405B pretraining rows (Table 4: H100, TP 8, PP 16, CP 1, interleaved 1F1B,
   one layer fewer on the first and last stage, FSDP that keeps parameters after forward = ZeRO-2,
   no recomputation, 16M-token batches of 8192-token sequences, 8-GPU NVLink servers on 400 Gb/s RoCE)
   simulated with the shipped calibration beside the published TFLOP/s and MFU. The paper does not
   state the number of virtual stages, so each possible v is shown. Nothing is tuned to these rows.

Run: ``python bench/bench_simulator.py`` (or ``make bench``).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.hardware import make_cluster  # noqa: E402
from autotune.models import get_model  # noqa: E402
from autotune.plan import Plan, Workload  # noqa: E402
from autotune.simulator import SimulatedEvaluator  # noqa: E402

W16M = Workload.from_tokens(seq_len=8192, global_batch_tokens=16 * 2**20)


def llama3_plan(dp: int, v: int) -> Plan:
    n = 16 * v                      # virtual stages; 126 layers + 2 empty slots = 128 = 16 v chunks
    per = 128 // n
    return Plan(tp_degree=8, pp_degree=16, dp_degree=dp, cp_degree=1, vpp_degree=v, micro_batch_size=1,
                num_micro_batches=W16M.global_batch_size // dp, pipeline_schedule="interleaved_1f1b",
                sequence_parallel=True, recompute="none", zero_stage=2, async_collectives=True,
                tp_comm_overlap=True, dp_grad_reduce_overlap=True, param_gather_overlap=False,
                stage_layers=(per - 1,) + (per,) * (n - 2) + (per - 1,))


def timing_table() -> None:
    cases = [
        ("8b  8xH200 TP1 DP8 FSDP m=16", "8b", "h200", 8, Workload(seq_len=8192, global_batch_size=128),
         Plan(dp_degree=8, micro_batch_size=1, num_micro_batches=16, zero_stage=3)),
        ("70b 64xB200 TP8 PP4 1F1B m=256", "70b", "b200", 64, Workload(seq_len=8192, global_batch_size=512),
         Plan(tp_degree=8, pp_degree=4, dp_degree=2, micro_batch_size=1, num_micro_batches=256,
              sequence_parallel=True, zero_stage=1)),
        ("405b 8192xH100 Llama3 v=4 m=32", "405b", "h100", 8192, W16M, llama3_plan(64, 4)),
        ("405b 8192xH100 Llama3 v=8 m=32", "405b", "h100", 8192, W16M, llama3_plan(64, 8)),
    ]
    print("Time per simulated step (graph build + longest-path simulation), 2-core CPU")
    print(f"{'plan':34s} {'graph nodes':>11s} {'ms/eval (median of 5)':>22s} {'feasible':>9s} {'sim MFU':>8s}")
    for label, size, gpu, n, wl, plan in cases:
        ev = SimulatedEvaluator(model=get_model(size), cluster=make_cluster(gpu, n, "nvlink4+roce400"
                                                                            if gpu != "b200" else None),
                                workload=wl)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            r = ev.evaluate(plan)
            times.append((time.perf_counter() - t0) * 1e3)
        nodes = ev.build_graph(plan, min(plan.num_micro_batches, 3 * plan.pp_degree)).number_of_nodes()
        print(f"{label:34s} {nodes:11d} {statistics.median(times):22.1f} {str(r.feasible):>9s} "
              f"{r.mfu:8.1%}")


def llama3_table() -> None:
    model = get_model("405b")
    print()
    from autotune.calibration import CalibratedCosts, default_calibration
    from autotune.hardware import get_gpu
    label = CalibratedCosts(profile=default_calibration(), gpu=get_gpu("h100")).label
    print(f"Llama 3 405B (paper Table 4) vs simulated with {label}")
    print(f"{'GPUs':>6s} {'DP':>4s} {'v':>2s} {'published TFLOP/s':>18s} {'published MFU':>14s} "
          f"{'sim TFLOP/s':>12s} {'sim MFU':>8s} {'sim peak GiB':>13s}  note")
    for gpus, dp, pub_tflops, pub_mfu in ((8192, 64, 430, 0.43), (16384, 128, 400, 0.41)):
        cluster = make_cluster("h100", gpus, "nvlink4+roce400")
        ev = SimulatedEvaluator(model=model, cluster=cluster, workload=W16M)
        for v in (2, 4, 8):
            r = ev.evaluate(llama3_plan(dp, v))
            note = "" if r.feasible else "does not fit (memory model): " + r.infeasible_reason.split(":")[1][:40]
            mfu = f"{r.mfu:.1%}" if r.feasible else "-"
            tf = f"{r.tflops_per_gpu:.0f}" if r.feasible else "-"
            print(f"{gpus:6d} {dp:4d} {v:2d} {pub_tflops:18d} {pub_mfu:14.0%} {tf:>12s} {mfu:>8s} "
                  f"{r.peak_memory_bytes / 2**30:13.1f}  {note}")


if __name__ == "__main__":
    timing_table()
    llama3_table()
