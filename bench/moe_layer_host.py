"""Host-side time of Megatron-Core's MoE layer without CUDA graphs, on the GPU it runs on (issue 38 / 39).

What it measures, for each shape (hidden, experts on the rank, top-k, expert FFN width, tokens per micro-batch):
a stack of ``--layers`` Megatron-Core ``MoELayer`` modules (megatron/core/transformer/moe/moe_layer.py: its
``TopKRouter``, the ``MoEAlltoAllTokenDispatcher`` / ``MoEAllGatherTokenDispatcher`` with their permutation
and their device-to-host sync of the token counts, token_dispatcher.py ``_maybe_dtoh_and_synchronize``), run
forward + backward in eager mode, EP 1 (one GPU: the all-to-all itself is not issued). The routed experts are
one ``torch._grouped_mm`` per projection (Transformer Engine's ``GroupedLinear``, which the published runs use,
is not installed on the H200 host; its own host time is therefore NOT included: a lower bound).

Per layer and micro-batch it reports:

* ``wall_ms``: (wall time of forward + backward of the stack, after ``torch.cuda.synchronize``) / layers;
* ``gpu_busy_ms``: sum of the GPU kernel durations of one step (``torch.profiler``, one CUDA stream) / layers;
* ``exposed_host_ms = wall_ms - gpu_busy_ms``: the time the GPU waits for the host (launches after each sync);
* ``host_ms``: CPU time of the Python thread for one step / layers (process_time; includes the spin in syncs).

Run on the GPU host from the project root (the project and a Megatron-LM source tree on PYTHONPATH; torch
with CUDA)::

    python bench/moe_layer_host.py --json $OUT/moe_layer_host.json

Nothing is fitted here; the numbers are recorded with the GPU, CPU, driver, torch and Megatron-LM versions.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

#: (name, hidden, experts on the rank, top-k, expert FFN width): the routed-expert shapes of the development
#: set's models (../shared/reference/published-moe-runs.yaml model facts). One GPU runs EP 1, so a published EP
#: layout is kept by its rank's share. With balanced routing, a rank of EP e holds E/e of the E experts and each
#: expert receives e x T x k / E rows (T tokens per rank, top-k). Emulated with E' = E/e experts and top-k' over
#: T tokens, each expert receives T x k' / E' = T x k' x e / E rows: the same when k' = k (possible when
#: k <= E/e), else k' = E/e gives T rows against the published e x T x k / E.
#: Qwen3-30B EP 8: 16 experts top-8, T x 8 x 8 / 128 = T/2 rows each (as published); GPT-OSS-120B EP 8: 16 top-4,
#: T/4 (as published); DeepSeek-V3 EP 32: 8 top-8, T (published 32 x T x 8 / 256 = T); Qwen3-235B EP 32: 4 top-4,
#: T (published 32 x T x 8 / 128 = 2T); Mixtral EP 8: 1 top-1, T (published 8 x T x 2 / 8 = 2T).
SHAPES = [
    ("qwen3-30b-a3b", 2048, 128, 8, 768),
    ("qwen3-30b-a3b-ep8", 2048, 16, 8, 768),
    ("qwen3-235b-a22b-ep32", 4096, 4, 4, 1536),
    ("deepseek-v3-ep32", 7168, 8, 8, 2048),
    ("gpt-oss-120b-ep8", 2880, 16, 4, 2880),
    ("mixtral-8x7b-ep8", 4096, 1, 1, 14336),
]


def _versions() -> dict:
    """GPU, driver, torch, CUDA, NCCL and date (autotune.profiling.measure.detect_environment, as the profiles
    record them) plus the host CPU, whose speed the host-side times depend on."""
    import dataclasses

    from autotune.profiling.measure import detect_environment

    out = dataclasses.asdict(detect_environment(gpu_count=1))
    out.update(date_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), python=sys.version.split()[0],
               gpu=out["gpu_name"], cpu=platform.processor() or platform.machine())
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        if names:
            out.update(cpu=names[0], cpu_count=len(names))
    except OSError:
        pass
    return out


def _experts_class():
    import torch

    class GroupedMMExperts(torch.nn.Module):
        """The rank's experts as two ``torch._grouped_mm`` calls (gate+up fused, down), SwiGLU between,
        the routing probabilities applied to the activation as Megatron-Core does
        (experts.py ``weighted_bias_swiglu_impl``)."""

        def __init__(self, num_local_experts, config, pg_collection=None, name=None):
            super().__init__()
            e, h, f = num_local_experts, config.hidden_size, config.moe_ffn_hidden_size
            dev = torch.cuda.current_device()
            self.w1 = torch.nn.Parameter(torch.randn(e, h, 2 * f, device=dev, dtype=torch.bfloat16) * 0.02)
            self.w2 = torch.nn.Parameter(torch.randn(e, f, h, device=dev, dtype=torch.bfloat16) * 0.02)

        def forward(self, x, tokens_per_expert, probs):
            tpe = tokens_per_expert.to(x.device, non_blocking=True)
            offs = torch.cumsum(tpe, 0, dtype=torch.int32)
            h = torch._grouped_mm(x, self.w1, offs=offs)
            a, b = h.chunk(2, dim=-1)
            h = (torch.nn.functional.silu(a) * b * probs.unsqueeze(-1).to(h.dtype)).contiguous()
            return torch._grouped_mm(h, self.w2, offs=offs), None

        def sharded_state_dict(self, *a, **k):  # pragma: no cover - not checkpointed here
            return {}

    return GroupedMMExperts


def _build(shape, dispatcher: str, layers: int):
    import torch
    from megatron.core.transformer.moe.moe_layer import MoELayer, MoESubmodules
    from megatron.core.transformer.transformer_config import TransformerConfig

    name, hidden, experts, topk, ffn = shape
    cfg = TransformerConfig(
        num_layers=layers, hidden_size=hidden, num_attention_heads=16, ffn_hidden_size=ffn,
        num_moe_experts=experts, moe_router_topk=topk, moe_ffn_hidden_size=ffn,
        moe_token_dispatcher_type=dispatcher, moe_router_load_balancing_type="none",
        moe_router_force_load_balancing=True, moe_aux_loss_coeff=0.0, moe_grouped_gemm=False,
        add_bias_linear=False, gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, moe_router_dtype="fp32",
        use_cpu_initialization=False, perform_initialization=True)
    sub = MoESubmodules(experts=_experts_class())
    mods = torch.nn.ModuleList(MoELayer(cfg, submodules=sub, layer_number=i + 1) for i in range(layers))
    return mods.cuda()


def _step(mods, x):
    h = x
    for m in mods:
        out, _ = m(h)
        h = out + h
    h.float().pow(2).mean().backward()


def measure(shape, dispatcher: str, tokens: int, layers: int, steps: int) -> dict:
    """One row: wall, GPU busy, exposed host and CPU ms per MoE layer per micro-batch (forward + backward)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    mods = _build(shape, dispatcher, layers)
    x = torch.randn(tokens, 1, shape[1], device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for _ in range(3):
        _step(mods, x)
    torch.cuda.synchronize()
    walls, cpus = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        _step(mods, x)
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e3)
        cpus.append((time.process_time() - c0) * 1e3)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _step(mods, x)
        torch.cuda.synchronize()
    busy_us = sum(e.device_time for e in prof.events() if e.device_type.name == "CUDA")
    wall = statistics.median(walls) / layers
    busy = busy_us / 1e3 / layers
    row = {"shape": shape[0], "hidden": shape[1], "experts": shape[2], "topk": shape[3], "ffn": shape[4],
           "dispatcher": dispatcher, "tokens": tokens, "layers": layers, "wall_ms": round(wall, 4),
           "gpu_busy_ms": round(busy, 4), "exposed_host_ms": round(wall - busy, 4),
           "host_cpu_ms": round(statistics.median(cpus) / layers, 4)}
    del mods, x
    torch.cuda.empty_cache()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--tokens", default="256,4096,16384")
    ap.add_argument("--dispatchers", default="alltoall,allgather")
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES))
    a = ap.parse_args()
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(1234)
    rows, meta = [], _versions()
    try:
        import megatron.core.package_info as pi
        meta["megatron_core"] = pi.__version__
    except Exception:  # noqa: BLE001 - recorded, not fatal
        meta["megatron_core"] = "unknown"
    meta["megatron_lm_commit"] = os.environ.get("MEGATRON_LM_COMMIT", "unknown")
    wanted = set(a.shapes.split(","))
    for shape in (s for s in SHAPES if s[0] in wanted):
        for disp in a.dispatchers.split(","):
            for tokens in (int(t) for t in a.tokens.split(",")):
                try:
                    row = measure(shape, disp, tokens, a.layers, a.steps)
                except Exception as exc:  # noqa: BLE001 - one failed shape is recorded, the rest still run
                    row = {"shape": shape[0], "dispatcher": disp, "tokens": tokens,
                           "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                rows.append(row)
                print(json.dumps(row), flush=True)
    with open(a.json, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"\n{'shape':24} {'disp':9} {'tokens':>6} {'wall':>8} {'gpu':>8} {'exposed':>8} {'cpu':>8}  (ms per layer-microbatch)")
    for r in rows:
        if "error" in r:
            print(f"{r['shape']:24} {r['dispatcher']:9} {r['tokens']:>6}  {r['error'][:80]}")
        else:
            print(f"{r['shape']:24} {r['dispatcher']:9} {r['tokens']:>6} {r['wall_ms']:8.3f} {r['gpu_busy_ms']:8.3f} "
                  f"{r['exposed_host_ms']:8.3f} {r['host_cpu_ms']:8.3f}")
    print(json.dumps(meta))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
