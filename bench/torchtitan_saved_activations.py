"""Bytes one torchtitan 0.2.x transformer block keeps for backward, eager vs torch.compile, measured.

torchtitan's trainer runs its own block (``torchtitan.models.llama3.model.model.TransformerBlock``: eager
``nn.RMSNorm``, complex-number RoPE, SDPA, SwiGLU), converted by torchao's ``convert_to_float8_training``
for FP8, wrapped by torchtitan's ``apply_ac`` (op-level selective AC, ``selective_ac_option = "op"``, as
``autotune.engines.torchtitan.job`` writes it) and compiled per block by torchtitan's ``apply_compile``
(``torch.compile(block, fullgraph=True)``). Which tensors autograd (eager) or AOTAutograd's min-cut
partitioner (compiled) keep differs, and with it the peak memory of a step. This script builds three such
blocks with Llama 3.1 8B widths exactly as torchtitan 0.2.2 does, runs them forward and backward, and
reads ``torch.cuda.memory_allocated()`` around the middle block's forward:

* ``kept``: bytes allocated after the middle block's forward minus before it: everything that block leaves
  alive for its backward plus its output (the next block's input). The block input is the previous
  block's output, so ``kept`` is one layer's share of the activations held at the end of a forward;
* each configuration runs at micro-batch 1 and 2 (seq ``--seq``) in fresh compilations:
  ``per_seq_bytes = kept(2) - kept(1)`` (activations grow linearly in the batch) and
  ``const_bytes = kept(1) - per_seq_bytes`` (weight-sized terms, e.g. autocast's BF16 weight copies that a
  matmul saves for its backward);
* two parameter modes: ``autocast`` (FP32 parameters, ``torch.autocast(bfloat16)``, FP32 block input:
  torchtitan's single-device / DDP path, ``maybe_enable_amp``; the embedding of FP32 weights gives an FP32
  residual stream) and ``bf16`` (BF16 parameters and input, no autocast: what the blocks compute on under
  FSDP2's ``MixedPrecisionPolicy(param_dtype=bfloat16)``).

Prints a table; ``--out FILE`` writes the rows as JSON with the environment (GPU, torch, torchao,
torchtitan, date). Run on a GPU host with torchtitan 0.2.x and torchao installed::

    python bench/torchtitan_saved_activations.py --out $OUT/torchtitan-saved-activations.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import time
from pathlib import Path

#: (mode, precision, compile, recompute), the most informative first (a --budget-s cut keeps these)
CONFIGS = [
    ("autocast", "bf16", True, "none"), ("autocast", "fp8_tensorwise", True, "none"),
    ("autocast", "fp8_tensorwise", False, "none"), ("autocast", "bf16", False, "none"),
    ("autocast", "fp8_tensorwise", True, "selective"), ("autocast", "fp8_rowwise", True, "none"),
    ("autocast", "bf16", True, "selective"), ("autocast", "bf16", False, "selective"),
    ("autocast", "fp8_tensorwise", False, "selective"),
    ("bf16", "bf16", False, "none"), ("bf16", "bf16", True, "none"),
    ("bf16", "fp8_tensorwise", True, "none"), ("bf16", "fp8_tensorwise", False, "none"),
]


def measure(mode: str, precision: str, compile_: bool, recompute: str, *, mb: int, seq: int) -> dict:
    """Bytes kept by the middle of three torchtitan 8B blocks after its forward (third iteration)."""
    import torch
    import torch._dynamo
    import torch._inductor.config
    import torch.nn as nn
    from torchtitan.config.job_config import ActivationCheckpoint, Compile
    from torchtitan.distributed.activation_checkpoint import apply_ac
    from torchtitan.models.llama3 import llama3_args
    from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list, apply_compile
    from torchtitan.models.llama3.model.model import TransformerBlock, precompute_freqs_cis

    torch._dynamo.reset()
    torch._dynamo.config.automatic_dynamic_shapes = False
    torch.manual_seed(0)
    dev = torch.device("cuda")
    args = dataclasses.replace(llama3_args["8B"], n_layers=3, max_seq_len=seq)
    holder = nn.Module()
    holder.layers = nn.ModuleDict({str(i): TransformerBlock(i, args) for i in range(3)})
    dtype = torch.float32 if mode == "autocast" else torch.bfloat16
    holder.to(device=dev, dtype=dtype)
    with torch.no_grad():
        for blk in holder.layers.values():
            blk.init_weights()
    if precision != "bf16":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        recipe = precision.split("_", 1)[1]
        if recipe == "rowwise":   # torchtitan/components/quantization/float8.py does the same
            torch._inductor.config.emulate_precision_casts = True
        convert_to_float8_training(holder, config=Float8LinearConfig.from_recipe_name(recipe))
    if recompute != "none":
        ac = ActivationCheckpoint(mode="selective" if recompute == "selective" else "full", selective_ac_option="op")
        apply_ac(holder, ac, model_compile_enabled=compile_, op_sac_save_list=_op_sac_save_list)
    if compile_:
        apply_compile(holder, Compile(enable=True))
    freqs = precompute_freqs_cis(args.dim // args.n_heads, seq, args.rope_theta, args.rope_scaling_args).to(dev)
    x = torch.randn(mb, seq, args.dim, device=dev, dtype=dtype, requires_grad=True)
    blocks = list(holder.layers.values())

    def step() -> tuple[list[int], int]:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        marks = []
        ctx = torch.autocast("cuda", dtype=torch.bfloat16) if mode == "autocast" else torch.autocast("cuda", enabled=False)
        with ctx:
            h = x
            for blk in blocks:
                before = torch.cuda.memory_allocated()
                h = blk(h, freqs, None)
                marks.append(torch.cuda.memory_allocated() - before)
        h.float().sum().backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        x.grad = None
        for p in holder.parameters():
            p.grad = None
        return marks, peak

    t0 = time.perf_counter()
    for _ in range(2):
        step()
    warm = time.perf_counter() - t0
    marks, peak = step()
    del holder, blocks
    torch.cuda.empty_cache()
    return {"kept_bytes": marks[1], "kept_by_block": marks, "fwd_bwd_peak_bytes": peak, "warmup_s": round(warm, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting configurations after this many s")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    import torch

    env = {"gpu_name": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "host": platform.node()}
    from importlib import metadata

    for pkg in ("torchao", "torchtitan"):
        try:
            env[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            env[pkg] = None
    t_start = time.perf_counter()
    rows = []
    for mode, precision, compile_, recompute in CONFIGS:
        if time.perf_counter() - t_start > a.budget_s:
            print(f"budget reached: skipping {mode} {precision} compile={compile_} {recompute}", flush=True)
            continue
        row = {"mode": mode, "precision": precision, "compile": compile_, "recompute": recompute, "seq": a.seq}
        try:
            one = measure(mode, precision, compile_, recompute, mb=1, seq=a.seq)
            two = measure(mode, precision, compile_, recompute, mb=2, seq=a.seq)
            per_seq = two["kept_bytes"] - one["kept_bytes"]
            row.update(per_seq_bytes=per_seq, const_bytes=one["kept_bytes"] - per_seq, mb1=one, mb2=two)
        except Exception as e:                 # keep the other rows
            row["error"] = f"{type(e).__name__}: {e}"[:400]
        rows.append(row)
        print(json.dumps(row), flush=True)
        if a.out:
            Path(a.out).write_text(json.dumps({"environment": env, "model": "llama3 8B (torchtitan 0.2.x flavour)",
                                               "rows": rows}, indent=1))
    print(f"\nbytes one torchtitan 8B block keeps for backward, seq {a.seq} ({env['gpu_name']}, torch {env['torch']}, "
          f"torchao {env['torchao']}, torchtitan {env['torchtitan']})")
    print(f"{'mode':<9} {'precision':<15} {'compile':<7} {'recompute':<9} {'MiB/seq':>9} {'const MiB':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['mode']:<9} {r['precision']:<15} {str(r['compile']):<7} {r['recompute']:<9} error: {r['error'][:80]}")
        else:
            print(f"{r['mode']:<9} {r['precision']:<15} {str(r['compile']):<7} {r['recompute']:<9} "
                  f"{r['per_seq_bytes'] / 2**20:>9.1f} {r['const_bytes'] / 2**20:>9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
