"""Benchmark (GPU host): a plain FSDP2 + torch.compile + torchao float8 training script, the yardstick
for tuned FP8 plans (issue 15; ``../shared/design.md``, measured 2026-12-01: 62.3% MFU).

What it runs, with nothing from :mod:`autotune.runtime.parallelize` (the model class is
:mod:`autotune.runtime.model`, torchtitan's Llama 3 structure):

* Llama 3.1 8B at ``--layers`` (default 16) of its 32 layers, true width, seq ``--seq-len`` (8192),
  ``--micro-batch`` sequences (2) per step, one micro-batch per step, no activation recomputation;
* torchao float8 training (``convert_to_float8_training``, ``Float8LinearConfig.from_recipe_name
  (--recipe)``, default ``tensorwise``) on every block linear, the LM head ``output`` left BF16
  (torchtitan ``float8.md``: ``filter_fqns=["output"]``); ``--recipe none`` keeps BF16;
* ``torch.compile`` per transformer block (torchtitan ``apply_compile``), ``--no-compile`` for eager;
* FSDP2 ``fully_shard`` per block and on the root over the job's ranks (one GPU: world size 1),
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` (torchtitan's default), FP32 master
  weights, fused AdamW (lr 3e-4, betas 0.9/0.95, wd 0.1: Llama 3 paper Sec. 3.4).

Output: one JSON line (``--json FILE`` too) with the step times (ms, CUDA-synchronized wall clock per
step), the median, tokens/s, MFU against the dense BF16 peak with causal attention FLOPs
(:mod:`autotune.cost.flops`, 989 TFLOP/s for H200 from :mod:`autotune.spec.hardware`), the PaLM-convention MFU and
peak memory (GiB).

Run: ``python bench/plain_fsdp2_fp8.py [--layers 16] [--micro-batch 2] [--recipe tensorwise]``
(single process; under torchrun it uses all ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="8b")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--recipe", choices=("tensorwise", "rowwise", "none"), default="tensorwise")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--gpu", default="h200", help="GPU name for the BF16 peak (autotune.spec.hardware)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from autotune.cost import flops
    from autotune.spec.hardware import get_gpu
    from autotune.spec.models import get_model
    from autotune.runtime.model import build_llama, cross_entropy_loss

    if not torch.cuda.is_available():
        print("error: bench/plain_fsdp2_fp8.py needs a CUDA GPU", file=sys.stderr)
        return 2
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533"), ("RANK", "0"), ("WORLD_SIZE", "1"),
                 ("LOCAL_RANK", "0")):
        os.environ.setdefault(k, v)
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    spec = get_model(a.size).truncated(a.layers)
    model = build_llama(spec, seq_len=a.seq_len, device="meta")
    converted = 0
    if a.recipe != "none":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        if a.recipe == "rowwise":
            import torch._inductor.config as ic
            ic.emulate_precision_casts = True   # torchtitan float8.py, pytorch/pytorch#150859
        convert_to_float8_training(
            model, config=Float8LinearConfig.from_recipe_name(a.recipe),
            module_filter_fn=lambda m, fqn: fqn != "output" and m.in_features % 16 == 0 and m.out_features % 16 == 0)
        converted = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
    if not a.no_compile:
        for blk in model.layers.values():
            blk.compile(fullgraph=True)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blk in model.layers.values():
        fully_shard(blk, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    model.to_empty(device=dev)
    with torch.no_grad():
        model.init_weights(buffer_device=dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8, fused=True)

    ws = dist.get_world_size()
    b = a.micro_batch
    g = torch.Generator(device=dev).manual_seed(0)
    times = []
    losses = []
    for i in range(a.warmup + a.steps):
        data = torch.randint(0, spec.vocab_size, (b, a.seq_len + 1), device=dev, generator=g)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = cross_entropy_loss(model(data[:, :-1]), data[:, 1:])
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if i >= a.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
            losses.append(float(loss))
    med = statistics.median(times)
    gbs = b * ws
    mf = flops.step_model_flops(spec, a.seq_len, gbs)
    peak = get_gpu(a.gpu).bf16_tflops
    res = {
        "script": "bench/plain_fsdp2_fp8.py", "model": spec.name, "num_layers": a.layers, "seq_len": a.seq_len,
        "micro_batch": b, "world_size": ws, "recipe": a.recipe, "compile": not a.no_compile,
        "float8_linears": converted, "step_times_ms": times, "step_time_ms": med,
        "tokens_per_s_per_gpu": gbs * a.seq_len / (med / 1e3) / ws,
        "mfu": flops.mfu(mf, med / 1e3, ws, peak),
        "mfu_palm": flops.mfu(flops.step_model_flops(spec, a.seq_len, gbs, causal=False), med / 1e3, ws, peak),
        "peak_bf16_tflops": peak, "mfu_convention": "6N + 6LHQTc, c=1 causal; mfu_palm c=2",
        "peak_allocated_gib": torch.cuda.max_memory_allocated(dev) / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved(dev) / 2**30,
        "losses": losses, "torch_version": torch.__version__, "device_name": torch.cuda.get_device_name(dev),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if dist.get_rank() == 0:
        line = json.dumps(res)
        print(line)
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
