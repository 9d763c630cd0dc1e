"""Activation bytes one transformer block keeps for backward, eager vs torch.compile, measured.

The memory model (:func:`autotune.cost.memory.activation_bytes_per_layer`) counts what an eager block saves.
torch.compile's partitioner (AOTAutograd min-cut rematerialization) chooses its own saved set, so a
compiled block can keep less. This script measures both on one GPU with autotune's own runtime block
(:class:`autotune.runtime.model.TransformerBlock`, the precision and compile paths of
:mod:`autotune.runtime.parallelize`), one micro-batch of ``--seq`` tokens, no parallelism:

* ``kept``: ``torch.cuda.memory_allocated()`` after the forward minus before it, less the block's
  output: every byte the forward left alive for backward (saved tensors and what they keep alive), the
  input excluded. It holds weight-sized terms too (autocast's BF16 weight copies, saved for the
  backward), so the block runs at ``seq`` and ``seq / 2`` tokens and the activation bytes at ``seq``
  are ``saved_bytes = 2 (kept(seq) - kept(seq / 2))`` (activations grow linearly in tokens with flash
  attention; weight-sized terms do not); ``const_bytes = kept(seq) - saved_bytes``;
* per configuration: precision (bf16 under autocast over FP32 weights, as the runtime runs it without
  FSDP; fp8_tensorwise / fp8_rowwise through torchao), compile (off / on), recompute (none / selective /
  full), and the memory model's count for the same layer beside it.

Prints a table; ``--out FILE`` writes the rows as JSON with the environment (GPU, torch, torchao, date).
Run on the device machine (GPU required)::

    python bench/saved_activations.py --out $OUT/saved-activations.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def measure(spec, *, seq: int, precision: str, compile_: bool, recompute: str) -> dict:
    import torch

    from autotune.runtime.model import TransformerBlock, rope_tables
    from autotune.runtime.parallelize import apply_float8

    import torch._dynamo

    torch._dynamo.reset()                            # a fresh compile per shape: no automatic dynamic shapes
    torch.manual_seed(0)
    dev = torch.device("cuda")
    blk = TransformerBlock(spec).to(dev)           # FP32 weights, as the runtime's masters
    blk.set_recompute(recompute)
    if precision != "bf16":
        apply_float8(blk, precision)
    if compile_:
        blk.compile(fullgraph=True)
    cos, sin = rope_tables(spec.head_dim, seq, spec.rope_theta, device=dev)
    x = torch.randn(1, seq, spec.hidden_size, device=dev, dtype=torch.bfloat16, requires_grad=True)

    def step() -> int:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = blk(x, cos, sin)
        torch.cuda.synchronize()
        kept = torch.cuda.memory_allocated() - before - out.numel() * out.element_size()
        out.float().sum().backward()
        x.grad = None
        for p in blk.parameters():
            p.grad = None
        return kept

    t0 = time.perf_counter()
    for _ in range(2):                               # compile / autotune, allocator warm-up
        step()
    warm_s = time.perf_counter() - t0
    kept = [step() for _ in range(2)]
    del blk
    torch.cuda.empty_cache()
    return {"kept_bytes": max(kept), "warmup_s": round(warm_s, 1)}


def measure_pair(spec, *, seq: int, precision: str, compile_: bool, recompute: str) -> dict:
    """:func:`measure` at ``seq`` and ``seq // 2``; activation bytes at ``seq`` from the difference."""
    full = measure(spec, seq=seq, precision=precision, compile_=compile_, recompute=recompute)
    half = measure(spec, seq=seq // 2, precision=precision, compile_=compile_, recompute=recompute)
    act = 2 * (full["kept_bytes"] - half["kept_bytes"])
    return {"precision": precision, "compile": compile_, "recompute": recompute, "seq": seq,
            "saved_bytes": act, "const_bytes": full["kept_bytes"] - act, "kept_bytes": full["kept_bytes"],
            "kept_half_bytes": half["kept_bytes"], "warmup_s": full["warmup_s"] + half["warmup_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="8b")
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--precisions", default="bf16,fp8_tensorwise,fp8_rowwise")
    ap.add_argument("--recompute", default="none,selective")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    import torch

    from autotune.cost.memory import activation_bytes_per_layer
    from autotune.spec.models import get_model
    from autotune.spec.plan import Plan, Workload

    spec = get_model(a.model)
    rows = []
    for precision in a.precisions.split(","):
        for recompute in a.recompute.split(","):
            for compile_ in (False, True):
                try:
                    r = measure_pair(spec, seq=a.seq, precision=precision, compile_=compile_, recompute=recompute)
                except Exception as e:                        # keep the other rows
                    r = {"precision": precision, "compile": compile_, "recompute": recompute, "seq": a.seq,
                         "error": f"{type(e).__name__}: {e}"[:300]}
                plan = Plan(precision=precision, recompute=recompute, compile=compile_)
                r["model_bytes"] = activation_bytes_per_layer(spec, plan, Workload(seq_len=a.seq, global_batch_size=1),
                                                              engine="native")
                rows.append(r)
                print(json.dumps(r), flush=True)
                if a.out:
                    Path(a.out).write_text(json.dumps({"model": spec.name, "rows": rows}, indent=1))
    env = {"gpu_name": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "date": datetime.date.today().isoformat(), "host": platform.node()}
    try:
        import torchao
        env["torchao"] = torchao.__version__
    except ImportError:
        pass
    print(f"\nsaved activation bytes per block, {spec.name}, seq {a.seq}, one sequence ({env['gpu_name']}, "
          f"torch {env['torch']})")
    print(f"{'precision':<15} {'recompute':<10} {'eager MiB':>10} {'compile MiB':>12} {'ratio':>6} {'model MiB':>10}")
    by = {(r["precision"], r["recompute"], r["compile"]): r for r in rows}
    for precision in a.precisions.split(","):
        for recompute in a.recompute.split(","):
            e, c = by[precision, recompute, False], by[precision, recompute, True]
            if "saved_bytes" not in e or "saved_bytes" not in c:
                print(f"{precision:<15} {recompute:<10} error: {e.get('error') or c.get('error')}")
                continue
            ratio = f"{c['saved_bytes'] / e['saved_bytes']:>6.3f}" if e["saved_bytes"] else f"{'n/a':>6}"
            print(f"{precision:<15} {recompute:<10} {e['saved_bytes'] / 2**20:>10.1f} {c['saved_bytes'] / 2**20:>12.1f} "
                  f"{ratio} {e['model_bytes'] / 2**20:>10.1f}")
    if a.out:
        Path(a.out).write_text(json.dumps({"environment": env, "model": spec.name, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
