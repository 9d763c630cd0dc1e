"""Benchmark (one GPU): the kernel-level levers of the native runtime, each alone, on issue 43's workload.

Workload: Llama 3.1 8B at ``--layers`` (16) of its 32 layers, true width, seq 8192, global batch 2 sequences
(one micro-batch of 2), one GPU. In one call it measures, each in its own process:

* ``plain``: ``bench/plain_fsdp2_fp8.py`` (FSDP2 + torch.compile + torchao float8 tensorwise, no
  recomputation, fused AdamW): the yardstick of issue 15 / 43;
* ``issue-tuned``: the best plan of the default space in issue 43's study (FP8 tensorwise, compile,
  selective recomputation, micro-batch 2) run by the native runtime (``autotune.runtime.worker``);
* ``base``: that plan with ``recompute: none`` (it fits: 107 GiB in docs/results/fp8-1gpu-2026-12-01/);
* each lever alone on ``base`` (one Plan field changed, :data:`LEVERS`): ``attention_backend`` cudnn /
  flash, ``compile_mode`` max-autotune-no-cudagraphs (compile time reported apart), ``loss_impl``
  chunked, ``precision`` fp8_rowwise, ``fp8_bf16_linears`` kv / attention, ``optimizer_impl`` foreach;
* ``combined``: ``base`` with every lever value that beat ``base`` by more than twice the larger of the
  two runs' step-time spread (max - min over the timed steps), each lever's best value.

Per run: median step time (ms; CUDA-synchronized wall clock per step, the worker's timing), MFU (causal,
:mod:`autotune.cost.flops`, against the H200's dense BF16 peak of :mod:`autotune.spec.hardware`), peak
allocated / reserved GiB, compile time (s, first warm-up step minus the median step), the loss of the last
step. Output: a table on stdout (last), ``--out DIR/bench_one_gpu.json`` with every run's worker result.

Run on the GPU host from the repository root: ``python bench/bench_one_gpu.py --out DIR``
(``--only NAME,...`` to run some rows; ``--budget-s`` stops starting runs after that many seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: the study's best plan of the default space (issue 43: 67.7% MFU, 102.3 GiB)
ISSUE_TUNED = dict(tp_degree=1, pp_degree=1, dp_degree=1, cp_degree=1, micro_batch_size=2, num_micro_batches=1,
                   recompute="selective", zero_stage=0, dp_grad_reduce_overlap=False, precision="fp8_tensorwise",
                   compile=True)
BASE = dict(ISSUE_TUNED, recompute="none")
#: lever rows: name -> the Plan fields changed from BASE
LEVERS: dict[str, dict] = {
    "attn-cudnn": {"attention_backend": "cudnn"},
    "attn-flash": {"attention_backend": "flash"},
    "loss-chunked": {"loss_impl": "chunked"},
    "fp8-rowwise": {"precision": "fp8_rowwise"},
    "fp8-bf16-kv": {"fp8_bf16_linears": "kv"},
    "fp8-bf16-attn": {"fp8_bf16_linears": "attention"},
    "adamw-foreach": {"optimizer_impl": "foreach"},
    "max-autotune": {"compile_mode": "max-autotune-no-cudagraphs"},
}


def _doc(plan_fields: dict, layers: int):
    from autotune.spec.hardware import get_fabric
    from autotune.spec.models import get_model
    from autotune.spec.plan import Plan, PlanDocument, Workload
    return PlanDocument(plan=Plan(**plan_fields), model=get_model("8b"), gpu="h200", num_gpus=1,
                        fabric=get_fabric("nvlink4+ib-ndr400").to_dict(),
                        workload=Workload(seq_len=8192, global_batch_size=2))


def _env() -> dict:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29541", RANK="0", WORLD_SIZE="1",
               LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", PYTHONUNBUFFERED="1")
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/inductor-cache")
    return env


def run_native(name: str, fields: dict, a, out: Path) -> dict:
    plan_path = out / f"{name}.plan.yaml"
    plan_path.write_text(_doc(fields, a.layers).to_yaml())
    res_path = out / f"{name}.result.json"
    cmd = [sys.executable, "-m", "autotune.runtime.worker", "--plan", str(plan_path), "--layers", str(a.layers),
           "--steps", str(a.steps), "--warmup", str(a.warmup), "--out", str(res_path)]
    return _launch(name, cmd, res_path, a, out, fields)


def run_plain(a, out: Path) -> dict:
    res_path = out / "plain.result.json"
    cmd = [sys.executable, str(ROOT / "bench" / "plain_fsdp2_fp8.py"), "--layers", str(a.layers),
           "--steps", str(a.steps), "--warmup", str(a.warmup), "--json", str(res_path)]
    return _launch("plain", cmd, res_path, a, out, {"script": "bench/plain_fsdp2_fp8.py"})


def _launch(name, cmd, res_path, a, out, fields) -> dict:
    t0 = time.time()
    log = out / f"{name}.log"
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=_env(), cwd=ROOT,
                                timeout=a.run_timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    row = {"name": name, "fields": fields, "rc": rc, "wall_s": round(time.time() - t0, 1)}
    if res_path.exists():
        r = json.loads(res_path.read_text())
        row["result"] = r
        row["step_time_ms"] = r["step_time_ms"]
        row["spread_ms"] = max(r["step_times_ms"]) - min(r["step_times_ms"])
        row["mfu"] = r["mfu"]
        if "peak_allocated_gib" in r:          # plain script
            row["alloc_gib"], row["reserved_gib"] = r["peak_allocated_gib"], r["peak_reserved_gib"]
            row["loss"] = r["losses"][-1]
        else:
            row["alloc_gib"] = r["peak_allocated_bytes"][0] / 2**30
            row["reserved_gib"] = r["peak_reserved_bytes"][0] / 2**30
            row["compile_s"] = r.get("compile_s")
            row["loss"] = r["losses"][-1]
    else:
        row["error"] = log.read_text()[-1500:]
    print(f"[{time.strftime('%H:%M:%S')}] {name}: rc={rc} wall {row['wall_s']} s "
          f"{row.get('step_time_ms', float('nan')):.1f} ms", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--only", default=None, help="comma-separated row names")
    ap.add_argument("--budget-s", type=float, default=520.0, help="start no run after this many seconds")
    ap.add_argument("--run-timeout-s", type=float, default=240.0)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    only = set(a.only.split(",")) if a.only else None
    t_start = time.time()
    rows: list[dict] = []

    def want(n: str) -> bool:
        return (only is None or n in only) and time.time() - t_start < a.budget_s

    def save() -> None:
        import torch
        (a.out / "bench_one_gpu.json").write_text(json.dumps(
            {"bench": "bench/bench_one_gpu.py", "layers": a.layers, "seq_len": 8192, "global_batch_size": 2,
             "steps": a.steps, "warmup": a.warmup, "torch_version": torch.__version__,
             "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
             "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows}, indent=1))

    if want("plain"):
        rows.append(run_plain(a, a.out)); save()
    for name, fields in (("issue-tuned", ISSUE_TUNED), ("base", BASE)):
        if want(name):
            rows.append(run_native(name, fields, a, a.out)); save()
    base = next((r for r in rows if r["name"] == "base" and "step_time_ms" in r), None)
    # max-autotune last (its autotuning compile is the longest), after the combined row
    for name, change in LEVERS.items():
        if name != "max-autotune" and want(name):
            rows.append(run_native(name, dict(BASE, **change), a, a.out)); save()
    # combined: every lever value that beat base by more than twice the larger spread, best per field
    best: dict[str, tuple[float, object]] = {}
    if base is not None:
        for r in rows:
            if r["name"] in LEVERS and r["name"] != "max-autotune" and "step_time_ms" in r:
                gain = base["step_time_ms"] - r["step_time_ms"]
                if gain > 2 * max(base["spread_ms"], r["spread_ms"]):
                    for k, v in LEVERS[r["name"]].items():
                        if k not in best or gain > best[k][0]:
                            best[k] = (gain, v)
    combined = dict(BASE, **{k: v for k, (_, v) in best.items()})
    if best and want("combined"):
        rows.append(run_native("combined", combined, a, a.out)); save()
    if want("max-autotune"):
        rows.append(run_native("max-autotune", dict(BASE, **LEVERS["max-autotune"]), a, a.out)); save()
    save()

    ref = {r["name"]: r for r in rows}
    b = ref.get("base", {}).get("step_time_ms")
    p = ref.get("plain", {}).get("step_time_ms")
    print(f"\n{'row':14s} {'ms':>8s} {'spread':>7s} {'MFU':>6s} {'vs base':>8s} {'vs plain':>8s} "
          f"{'alloc GiB':>9s} {'resv GiB':>8s} {'compile s':>9s} {'loss':>6s}")
    for r in rows:
        if "step_time_ms" not in r:
            print(f"{r['name']:14s} FAILED rc={r['rc']}: {r.get('error', '')[-200:]!r}")
            continue
        ms = r["step_time_ms"]
        cs = r.get("compile_s")
        print(f"{r['name']:14s} {ms:8.1f} {r['spread_ms']:7.1f} {100 * r['mfu']:5.1f}% "
              f"{(b / ms if b else float('nan')):7.3f}x {(p / ms if p else float('nan')):7.3f}x "
              f"{r['alloc_gib']:9.1f} {r['reserved_gib']:8.1f} "
              f"{(f'{cs:9.1f}' if cs is not None else '        -')} {r['loss']:6.2f}")
    print(f"combined = base + {json.dumps({k: v for k, (_, v) in best.items()})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
