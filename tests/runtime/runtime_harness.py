"""Multi-process CPU/gloo harness: run plans with the real runtime and compare them with the
unparallelized model (imported by the spawned workers, so it lives in a plain module)."""

from __future__ import annotations

import json
import os
import socket
import traceback

from autotune.spec.models import ModelSpec

TINY = ModelSpec(name="tiny-llama", hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2,
                 ffn_hidden_size=128, vocab_size=256, head_dim=16, max_seq_len=32)
SEQ = 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def global_batch(n_seq: int, seed: int = 1234):
    import torch
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, TINY.vocab_size, (n_seq, SEQ + 1), generator=g)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def reference(n_seq: int, lr: float):
    """Loss, gradients (by name) of step 1 and the loss of step 2 of the unparallelized model on the
    whole global batch (mean token cross-entropy), FP32, one process."""
    import torch
    from autotune.runtime.model import build_llama, cross_entropy_loss
    x, y = global_batch(n_seq)
    m = build_llama(TINY, seq_len=SEQ, seed=0)
    opt = torch.optim.AdamW(m.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    loss1 = cross_entropy_loss(m(x), y)
    loss1.backward()
    grads = {n: p.grad.detach().clone() for n, p in m.named_parameters()}
    opt.step()
    opt.zero_grad()
    with torch.no_grad():
        loss2 = cross_entropy_loss(m(x), y)
    return float(loss1), grads, float(loss2)


def _worker(rank: int, world: int, port: int, plans: list[dict], out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    from autotune.spec.plan import Plan
    from autotune.runtime.parallelize import parallelize
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    results = []
    lr = 1e-3
    try:
        for pd in plans:
            pd = dict(pd)
            rec: dict = {"plan": dict(pd)}
            try:
                meta = pd.pop("_meta_init", None) if isinstance(pd, dict) else None
                plan = Plan.from_dict(pd)
                rt = parallelize(plan, TINY, seq_len=SEQ, device="cpu", seed=0, lr=lr, meta_init=meta)
                if meta:
                    # meta init: weights differ from the reference; check the step runs and is finite
                    x, y = global_batch(plan.global_batch_size)
                    l1 = rt.train_step(rt.local_batch(x), rt.local_batch(y))
                    l2 = rt.train_step(rt.local_batch(x), rt.local_batch(y))
                    rec.update(meta_losses=[l1, l2], honored=rt.honored)
                    results.append(rec)
                    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
                        json.dump(results, f)
                    dist.barrier()
                    continue
                x, y = global_batch(plan.global_batch_size)
                loss1 = rt.train_step(rt.local_batch(x), rt.local_batch(y))
                # grads are still there after the optimizer step (zero_grad happens at the next step)
                grads = rt.named_grads_full()
                loss2 = rt.train_step(rt.local_batch(x), rt.local_batch(y))
                ref_loss1, ref_grads, ref_loss2 = reference(plan.global_batch_size, lr)
                # the optimizer step of step 2 ran with step-2 gradients; loss2 is measured before it
                rec["loss1"], rec["ref_loss1"] = loss1, ref_loss1
                rec["loss2"], rec["ref_loss2"] = loss2, ref_loss2
                diffs = {}
                for n, g in grads.items():
                    r = ref_grads[n]
                    diffs[n] = float((g - r).abs().max() / (r.abs().max() + 1e-12))
                rec["grad_rel_err"] = diffs
                rec["num_grads"] = len(grads)
                rec["honored"] = rt.honored
                rec["dp_loss"] = None
            except Exception as e:  # noqa: BLE001 - reported to the parent test
                rec["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
            results.append(rec)
            with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
                json.dump(results, f)
            dist.barrier()
    finally:
        dist.destroy_process_group()


def run_plans(world: int, plans: list[dict], out_dir: str) -> list[list[dict]]:
    """Run ``plans`` one after another in ``world`` gloo processes; returns per-rank result lists."""
    import torch.multiprocessing as mp
    mp.start_processes(_worker, args=(world, free_port(), plans, out_dir), nprocs=world, join=True,
                       start_method="spawn")
    out = []
    for r in range(world):
        with open(os.path.join(out_dir, f"rank{r}.json")) as f:
            out.append(json.load(f))
    return out
