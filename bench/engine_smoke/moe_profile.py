"""torch.profiler traces of torchtitan 0.2.2 MoE training steps (issue 39: what the routed-expert path costs).

    python bench/engine_smoke/moe_profile.py --model qwen3-30b-a3b --layers 6 --mb 4 --n 1 --recompute none \
        --compile --out DIR [--steps 8]

Runs one plan through :class:`autotune.engines.torchtitan.runner.TorchtitanEvaluator` (the trials' job writer,
assets, log parser and prediction) with torchtitan's own profiler on (v0.2.2 config/job_config.py ``Profiling``:
``enable_profiling``, ``profile_freq``, ``profiler_warmup``, ``profiler_active``; tools/profiling.py
``maybe_enable_profiling``: ``torch.profiler.schedule(wait=freq - warmup - active, warmup, active)``,
``record_shapes=True``, a Chrome trace at the last active step). With 8 steps, freq 8, warm-up 2 and active 2 the
trace holds steps 7 and 8 (one fast and one slow of the alternating MoE steps). The trace is reduced by
``bench/engine_smoke/reduce_trace.py`` into DIR/profile.json; the trace itself is deleted (too large to keep).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from autotune.spec.plan import Plan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--mb", type=int, default=4)
    ap.add_argument("--n", type=int, default=1)
    ap.add_argument("--recompute", default="none", choices=["none", "selective", "full"])
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=150.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    from autotune.cli.options import resolve_target
    from autotune.engines.torchtitan.runner import TorchtitanEvaluator

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    traces = Path("/tmp/moe-traces") / out.name
    shutil.rmtree(traces, ignore_errors=True)
    model, cluster, workload = resolve_target(size=None, model_path=a.model, gpu="h200", gpus=1, interconnect=None,
                                              seq_len=4096, global_batch=str(a.mb * a.n * 4096))
    plan = Plan(zero_stage=0, micro_batch_size=a.mb, num_micro_batches=a.n, recompute=a.recompute,
                compile=a.compile, precision="bf16", memory_reclaim="expandable_segments")
    prof = (f'\n[profiling]\nenable_profiling = true\nsave_traces_folder = "{traces}"\nprofile_freq = {a.steps}\n'
            f'profiler_warmup = 2\nprofiler_active = 2\n')

    class Profiled(TorchtitanEvaluator):
        def build(self, plan, workdir, total_steps):
            launch = super().build(plan, workdir, total_steps)
            launch.job_text = launch.job_text + prof
            return launch

    warm = 3
    ev = Profiled(model=model, cluster=cluster, workload=workload, layers=a.layers, steps=a.steps - warm,
                  warmup=warm, timeout_s=a.timeout, log_dir=str(out / "logs"))
    try:
        r = ev.evaluate(plan)
    except Exception as e:  # a failed run: record why, still reduce a trace if one was written
        r = None
        (out / "run.json").write_text(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        print(f"run failed: {type(e).__name__}: {e}")
    finally:
        ev.close()
    if r is not None:
        d = r.details
        res = {"model": a.model, "layers": a.layers, "plan": plan.to_dict(), "feasible": r.feasible,
               "infeasible_reason": r.infeasible_reason, "step_time_ms_median_steps4to8": r.step_time_ms,
               "step_times_ms": d.get("step_times_ms"), "peak_memory_gib": (r.peak_memory_bytes or 0) / 2**30,
               "simulated_step_time_ms": d.get("simulated_step_time_ms"),
               "simulated_peak_memory_gib": (d.get("simulated_peak_memory_bytes") or 0) / 2**30}
        (out / "run.json").write_text(json.dumps(res, indent=1, default=str))
        print(json.dumps({k: res[k] for k in ("feasible", "step_time_ms_median_steps4to8", "peak_memory_gib",
                                              "simulated_step_time_ms")}, default=str))
    found = sorted(traces.rglob("rank0_trace.json"))
    if not found:
        print(f"no trace under {traces}")
        return 1
    rc = subprocess.call([sys.executable, str(Path(__file__).with_name("reduce_trace.py")), str(found[-1]),
                          str(out / "profile.json")])
    shutil.rmtree(traces, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
