"""torchtitan's own shipped training config for an MoE model, run like the tuned trials (issue 39 acceptance:
"the best tuned trial >= 1.2x the tokens/s of torchtitan's own shipped config for that model, truncated to the
same layers, same sequence length and global batch, same GPU, same call").

    python bench/engine_smoke/moe_shipped.py --model qwen3-30b-a3b --layers 6 [--seq-len 4096 --global-batch 16K]
        [--steps 5 --warmup 3 --timeout 200 --engine-logs DIR --json OUT.json]

The shipped settings (what differs from torchtitan's defaults in the shipped file), each kept as shipped except
what one GPU forces (expert parallel degree 1, no FSDP across ranks) and the truncation; the data, steps,
routing (``debug.moe_force_load_balance``, as the tuned trials) and the batch are the tuned trials':

* ``qwen3-30b-a3b``: torchtitan 0.2.2 ships no Qwen3-30B-A3B job file (only ``qwen3_moe_debug.toml`` for its
  debug flavour); the config named for the model is 0.3.0's ``qwen3_30b_a3b()``
  (torchtitan/models/qwen3/config_registry.py): ``local_batch_size=2``, ``seq_len=4096``,
  ``activation_checkpoint=FullAC``, no compile. As a plan: micro-batch 2, full recompute, eager.
* ``deepseek-16b``: torchtitan v0.2.2 torchtitan/models/deepseek_v3/train_configs/deepseek_v3_16b.toml:
  ``local_batch_size = 4``, ``seq_len = 4096``, ``[activation_checkpoint] mode = "selective"``,
  ``selective_ac_option = 'op'``, ``[compile] enable = true``, ``components = ["loss"]`` (the model is not
  compiled), ``expert_parallel_degree = 8``. As a plan: micro-batch 4, selective recompute, eager; the job
  file's ``[compile]`` is then set to the shipped ``enable = true``, ``components = ["loss"]`` (no plan field
  compiles the loss alone; the prediction printed is the eager plan's).

Runs through :class:`autotune.engines.torchtitan.runner.TorchtitanEvaluator` (the same job writer, assets,
log parser and prediction as ``autotune run --backend real``); prints one line and writes ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys

from autotune.spec.plan import Plan

SHIPPED = {
    "qwen3-30b-a3b": {"local": 2, "recompute": "full", "compile_loss_only": False,
                      "source": "torchtitan 0.3.0 torchtitan/models/qwen3/config_registry.py qwen3_30b_a3b(): "
                                "local_batch_size 2, FullAC, no compile"},
    "deepseek-16b": {"local": 4, "recompute": "selective", "compile_loss_only": True,
                     "source": "torchtitan v0.2.2 torchtitan/models/deepseek_v3/train_configs/deepseek_v3_16b.toml: "
                               "local_batch_size 4, selective AC (op), compile components [\"loss\"]"},
}
EAGER_COMPILE = '[compile]\nenable = false\ncomponents = ["model", "loss"]'
LOSS_COMPILE = '[compile]\nenable = true\ncomponents = ["loss"]'


def shipped_plan(model: str, global_batch_sequences: int) -> Plan:
    """The shipped config of ``model`` as a one-GPU plan (module docstring)."""
    s = SHIPPED[model]
    if global_batch_sequences % s["local"]:
        raise SystemExit(f"--global-batch: {global_batch_sequences} sequences is not a multiple of the shipped "
                         f"local batch {s['local']}")
    return Plan(zero_stage=0, micro_batch_size=s["local"], num_micro_batches=global_batch_sequences // s["local"],
                recompute=s["recompute"], compile=False, precision="bf16", memory_reclaim="none")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, choices=sorted(SHIPPED))
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--global-batch", default="16K")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=200.0)
    ap.add_argument("--engine-logs", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from autotune.cli.options import resolve_target
    from autotune.engines.torchtitan.runner import TorchtitanEvaluator

    model, cluster, workload = resolve_target(size=None, model_path=a.model, gpu="h200", gpus=1, interconnect=None,
                                              seq_len=a.seq_len, global_batch=a.global_batch)
    plan = shipped_plan(a.model, workload.global_batch_size)
    loss_only = SHIPPED[a.model]["compile_loss_only"]

    class Shipped(TorchtitanEvaluator):
        def build(self, plan, workdir, total_steps):
            launch = super().build(plan, workdir, total_steps)
            if loss_only:
                assert EAGER_COMPILE in launch.job_text, launch.job_text
                launch.job_text = launch.job_text.replace(EAGER_COMPILE, LOSS_COMPILE)
            return launch

    ev = Shipped(model=model, cluster=cluster, workload=workload, layers=a.layers, steps=a.steps, warmup=a.warmup,
                 timeout_s=a.timeout, log_dir=a.engine_logs)
    try:
        r = ev.evaluate(plan)
    finally:
        ev.close()
    d = r.details
    out = {"model": a.model, "layers": a.layers, "shipped": SHIPPED[a.model]["source"], "plan": plan.to_dict(),
           "feasible": r.feasible, "step_time_ms": r.step_time_ms, "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu,
           "mfu": r.mfu, "peak_memory_bytes": r.peak_memory_bytes, "details": d}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    if not r.feasible:
        print(f"shipped {a.model}: {r.infeasible_reason}")
        return 1
    print(f"shipped {a.model} L{a.layers}: {r.step_time_ms:,.1f} ms, {r.tokens_per_s_per_gpu:,.0f} tok/s, MFU "
          f"{r.mfu:.1%}, {r.peak_memory_bytes / 2**30:.1f} GiB; predicted "
          f"{d.get('simulated_step_time_ms') or 0:,.1f} ms, {(d.get('simulated_peak_memory_bytes') or 0) / 2**30:.1f} GiB"
          f" ({SHIPPED[a.model]['source']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
