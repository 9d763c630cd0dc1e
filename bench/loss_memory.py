"""Bytes per logit the loss keeps for backward and peaks at during it, eager vs torch.compile, measured.

The memory model charges the last pipeline stage ``LOGITS_BYTES_PER_ELEMENT`` bytes per logit
(:mod:`autotune.cost.memory`), measured for autotune's eager loss. torchtitan compiles its loss
(``compile.components = ["model", "loss"]``), and inductor fuses the FP32 cast, log-softmax and NLL.
This script measures, on one GPU, the loss both engines write the same way (autotune's
:func:`autotune.runtime.model.cross_entropy_loss` and torchtitan's ``cross_entropy_loss``,
torchtitan/components/loss.py: ``F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))``),
eager and under ``torch.compile``, for BF16 logits ``[b, s, V]`` that require grad (the LM head's output):

* ``kept_bytes_per_logit``: allocated after the forward minus before it (the logits themselves
  excluded: they exist before the loss), per logit;
* ``peak_bytes_per_logit``: the peak allocated during forward + backward minus the allocation before
  the forward, per logit (the logits' gradient included: the LM head's backward needs it);
* ``fwd_bwd_ms``: median time of one forward + backward (CUDA events, 20 calls after 3 warm-up).

Prints a table; ``--out FILE`` writes JSON with the environment. Run on the device machine::

    python bench/loss_memory.py --out $OUT/loss-memory.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def time_loss(loss_fn, *, b: int, s: int, vocab: int, compiled: bool, repeats: int = 20) -> float:
    """Median ms of one forward + backward of ``loss_fn`` on BF16 logits ``[b, s, vocab]`` (CUDA events,
    after 3 warm-up calls that also compile)."""
    import statistics

    import torch
    import torch._dynamo

    torch._dynamo.reset()
    fn = torch.compile(loss_fn) if compiled else loss_fn
    dev = torch.device("cuda")
    logits = torch.randn(b, s, vocab, device=dev, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (b, s), device=dev)
    times = []
    for it in range(3 + repeats):
        logits.grad = None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(logits, labels).backward()
        end.record()
        torch.cuda.synchronize()
        if it >= 3:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure(loss_fn, *, b: int, s: int, vocab: int, compiled: bool) -> dict:
    import torch
    import torch._dynamo

    torch._dynamo.reset()
    fn = torch.compile(loss_fn) if compiled else loss_fn
    dev = torch.device("cuda")
    logits = torch.randn(b, s, vocab, device=dev, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (b, s), device=dev)
    n = b * s * vocab
    out = {}
    for it in range(3):                               # compile and warm-up, then measure
        logits.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        loss = fn(logits, labels)
        torch.cuda.synchronize()
        kept = torch.cuda.memory_allocated() - before
        loss.backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        out = {"kept_bytes_per_logit": round(kept / n, 3), "peak_bytes_per_logit": round(peak / n, 3)}
        del loss
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    import torch

    from autotune.runtime.model import cross_entropy_loss

    rows = []
    for name, fn in (("cross_entropy_loss", cross_entropy_loss),):
        for compiled in (False, True):
            r = {"loss": name, "compile": compiled, "batch": a.batch, "seq": a.seq, "vocab": a.vocab}
            try:
                r.update(measure(fn, b=a.batch, s=a.seq, vocab=a.vocab, compiled=compiled))
                r["fwd_bwd_ms"] = round(time_loss(fn, b=a.batch, s=a.seq, vocab=a.vocab, compiled=compiled), 3)
            except Exception as e:                    # keep the other rows
                r["error"] = f"{type(e).__name__}: {e}"[:300]
            rows.append(r)
            print(json.dumps(r), flush=True)
    env = {"gpu_name": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "date": datetime.date.today().isoformat()}
    print(f"\nloss memory, bytes per logit, [{a.batch}, {a.seq}, {a.vocab}] BF16 logits ({env['gpu_name']}, "
          f"torch {env['torch']})")
    print(f"{'loss':<19} {'compile':<8} {'kept':>6} {'peak':>6} {'fwd+bwd ms':>11}")
    for r in rows:
        if "error" in r:
            print(f"{r['loss']:<19} {str(r['compile']):<8} error: {r['error']}")
        else:
            print(f"{r['loss']:<19} {str(r['compile']):<8} {r['kept_bytes_per_logit']:>6} {r['peak_bytes_per_logit']:>6} "
                  f"{r['fwd_bwd_ms']:>11}")
    if a.out:
        Path(a.out).write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
