"""Benchmark: simulator speed and the Llama 3 paper's 405B plans, simulated (no GPU).

Prints the time per simulated step graph (graph build + simulation) for representative plans. The
Llama 3 paper's 405B rows and every other published run are predicted by ``bench/published.py``.

Run: ``python bench/bench_simulator.py`` (or ``make bench``).
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.spec.hardware import ClusterSpec, make_cluster  # noqa: E402
from autotune.cost.memory import estimate_memory  # noqa: E402
from autotune.spec.models import get_model  # noqa: E402
from autotune.spec.plan import Plan, Workload  # noqa: E402
from autotune.cost.simulator import SimulatedEvaluator  # noqa: E402

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
    print("Time per simulated step (graph build + longest-path simulation), 2-core CPU; engine megatron;")
    print("the memory verdict is printed but does not stop the simulation (capacity set out of the way)")
    print(f"{'plan':34s} {'graph nodes':>11s} {'ms/eval (median of 5)':>22s} {'fits':>9s} {'sim MFU':>8s}")
    for label, size, gpu, n, wl, plan in cases:
        cluster = make_cluster(gpu, n, "nvlink4+roce400" if gpu != "b200" else None)
        fits = estimate_memory(get_model(size), plan, cluster.gpu, wl, engine="megatron").fits
        roomy = ClusterSpec(gpu=dataclasses.replace(cluster.gpu, hbm_gib=1e6), num_gpus=n, fabric=cluster.fabric)
        ev = SimulatedEvaluator(model=get_model(size), cluster=roomy, workload=wl, engine="megatron")
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            r = ev.evaluate(plan)
            times.append((time.perf_counter() - t0) * 1e3)
        nodes = ev.build_graph(plan, min(plan.num_micro_batches, 3 * plan.pp_degree)).number_of_nodes()
        print(f"{label:34s} {nodes:11d} {statistics.median(times):22.1f} {str(fits):>9s} "
              f"{r.mfu:8.1%}")


if __name__ == "__main__":
    timing_table()
