"""A small analytic evaluator for the tuner and CLI tests (tests only; not a cost model anyone should use).

It is deterministic and cheap, and depends on the plan and the fabric the way a real one does in sign:
pipeline bubble from the closed forms ((p-1)/(m+p-1), interleaved (p-1)/(v m + p - 1)), TP/DP traffic
time = bytes / link bandwidth (so a slower fabric changes the best plan), recomputation costs compute,
and memory comes from :func:`autotune.cost.memory.estimate_memory` (so infeasible plans are real ones).
"""

from __future__ import annotations

from autotune.cost.evaluator import Evaluator, StepResult
from autotune.cost.flops import recompute_flops_per_token, step_model_flops
from autotune.cost.memory import estimate_memory
from autotune.spec.plan import Plan, validate_plan


class FakeEvaluator(Evaluator):
    backend = "fake"

    def __init__(self, *, model, cluster, workload, fail_on=None, capacity_scale: float = 1.0, **_):
        super().__init__(model=model, cluster=cluster, workload=workload)
        self.fail_on = fail_on            # callable(plan) -> bool: raise RuntimeError for those plans
        self.capacity_scale = capacity_scale
        self.calls = 0

    def evaluate(self, plan: Plan) -> StepResult:
        self.calls += 1
        m, c, w = self.model, self.cluster, self.workload
        validate_plan(plan, m, c.num_gpus, w)
        if self.fail_on is not None and self.fail_on(plan):
            raise RuntimeError("fake evaluator exploded")
        mem = estimate_memory(m, plan, c.gpu, w)
        cap = int(c.gpu.usable_hbm_bytes * self.capacity_scale)
        n = c.num_gpus
        flops = step_model_flops(m, w.seq_len, w.global_batch_size)
        rflops = recompute_flops_per_token(m, w.seq_len, plan.recompute) * w.seq_len * w.global_batch_size
        eff = 0.55 + 0.05 * min(plan.micro_batch_size, 2) - 0.02 * (plan.tp_degree.bit_length() - 1)
        compute_ms = flops / n / (c.gpu.bf16_tflops * 1e12 * eff) * 1e3
        recompute_ms = rflops / n / (c.gpu.bf16_tflops * 1e12 * eff) * 1e3
        p, mb, v = plan.pp_degree, plan.num_micro_batches, plan.effective_vpp
        bubble_frac = (p - 1) / (v * mb + p - 1)
        busy = compute_ms + recompute_ms
        bubble_ms = busy * bubble_frac / (1 - bubble_frac)
        intra = c.fabric.intra_node.bandwidth_gbs
        inter = c.fabric.inter_node.bandwidth_gbs if c.fabric.inter_node and n > c.fabric.gpus_per_node else intra
        tokens_per_gpu = w.global_batch_size * w.seq_len / (plan.dp_degree * plan.cp_degree)
        tp_bytes = 0 if plan.tp_degree == 1 else 4 * 2 * tokens_per_gpu * m.hidden_size * m.num_layers / p
        tp_ms = tp_bytes / (intra * 1e9) * 1e3 * (0.3 if plan.tp_comm_overlap else 1.0)
        g = plan.dp_degree * plan.cp_degree
        grad_bytes = 2 * m.num_params / (plan.tp_degree * p)
        dp_link = inter if plan.tp_degree * p < c.fabric.gpus_per_node and n > c.fabric.gpus_per_node else \
            (inter if n > c.fabric.gpus_per_node else intra)
        dp_ms = 0.0 if g == 1 else 2 * grad_bytes * (g - 1) / g / (dp_link * 1e9) * 1e3
        dp_ms *= (1.5 if plan.zero_stage == 3 else 1.0) * (0.25 if plan.dp_grad_reduce_overlap else 1.0)
        step = busy + bubble_ms + tp_ms + dp_ms + 5.0
        feasible = mem.peak_bytes <= cap
        mfu = flops / (step / 1e3 * n * c.gpu.bf16_tflops * 1e12)
        palm = step_model_flops(m, w.seq_len, w.global_batch_size, causal=False) / (
            step / 1e3 * n * c.gpu.bf16_tflops * 1e12)
        return StepResult(
            backend="fake", feasible=feasible, step_time_ms=step, mfu=mfu, mfu_palm=palm,
            hfu=(flops + rflops) / (step / 1e3 * n * c.gpu.bf16_tflops * 1e12),
            tokens_per_s_per_gpu=w.global_batch_tokens / (step / 1e3) / n,
            tflops_per_gpu=mfu * c.gpu.bf16_tflops, peak_memory_bytes=mem.peak_bytes,
            memory_per_stage_bytes=tuple(s.total_bytes for s in mem.stages),
            breakdown_ms={"compute": compute_ms, "recompute": recompute_ms, "exposed_tp_comm": tp_ms,
                          "exposed_cp_comm": 0.0, "exposed_pp_comm": 0.0, "exposed_dp_comm": dp_ms,
                          "bubble": bubble_ms, "optimizer": 5.0, "reclaim": 0.0},
            infeasible_reason=None if feasible else
            f"stage {mem.peak_stage} needs {mem.peak_bytes / 2**30:.1f} GiB > {cap / 2**30:.1f} GiB",
            details={"calibration": "fake"})
