"""Causal attention on one GPU with PyTorch SDPA's flash backend (FlashAttention-2) and its default
dispatch (cuDNN on H200 with torch 2.11), over the shapes of the shipped profile's attention table.

Why: the published torchtitan runs (2024-12 on torch 1963fc8 of 2024-12-23; 2025-06) ran SDPA when
cuDNN attention was opt-in (pytorch/pytorch#138522, after the 2.5 bugs; #142132 shows the default
dispatch at 329 vs cuDNN 631 TFLOP/s on H100, nightly 2024-12-04), i.e. on the flash backend, while
the profile's table holds the default dispatch of today's torch (cuDNN). This measures both on the
same GPU for the calibration's ``attention_flash2`` table (``--write`` on the CPU host merges a result
file into ``autotune/data/calibration/h200.yaml``).

FLOPs as the calibration counts them: forward 2 s^2 d h b (causal half of 4 s^2 d h b), backward 2.5x.
GQA: K and V at the full query-head count (the repeat-KV formulation torchtitan used then).

Run on the GPU host: ``python bench/attention_backends.py --json OUT.json``; on the CPU host:
``python bench/attention_backends.py --write OUT.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROFILE = ROOT / "autotune" / "data" / "calibration" / "h200.yaml"


def measure(out: Path) -> int:
    import torch

    from autotune.cost.calibration import default_calibration
    from autotune.profiling.measure import measure_attention
    from autotune.profiling.shapes import AttentionShape

    rows = {"flash2": [], "default": []}
    for seq, heads, kv, hd, _, _ in default_calibration().attention:
        shape = AttentionShape(batch=1, seq_len=seq, heads=heads, kv_heads=kv, head_dim=hd)
        fwd_flops = 2.0 * seq * seq * hd * heads
        for name, force in (("flash2", True), ("default", False)):
            f, b = measure_attention(shape, force_flash=force, warmup=1, repeats=5, max_seconds=2.0)
            rows[name].append([seq, heads, kv, hd, round(fwd_flops / (f.median_ms * 1e9), 2),
                               round(2.5 * fwd_flops / (b.median_ms * 1e9), 2)])
            print(name, rows[name][-1], flush=True)
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "date": datetime.date.today().isoformat(), "rows": rows}
    out.write_text(json.dumps(doc, indent=1))
    print(f"{'seq':>7s} {'heads':>5s} {'kv':>3s} | {'flash2 fwd':>10s} {'bwd':>6s} | {'default fwd':>11s} {'bwd':>6s}")
    for a, c in zip(rows["flash2"], rows["default"]):
        print(f"{a[0]:7d} {a[1]:5d} {a[2]:3d} | {a[4]:10.1f} {a[5]:6.1f} | {c[4]:11.1f} {c[5]:6.1f}")
    return 0


def write(src: Path) -> int:
    doc = json.loads(src.read_text())
    rows = doc["rows"]["flash2"]
    text = PROFILE.read_text()
    text = re.sub(r"(?ms)^# attention_flash2:.*?\n(?=[a-z_]+:)", "", text)
    text = re.sub(r"(?ms)^attention_flash2:\n(- \[.*?\]\n)+", "", text)
    block = (f"# attention_flash2: SDPA's flash backend (FlashAttention-2), bench/attention_backends.py on "
             f"{doc['gpu']} {doc['date']} (torch {doc['torch']}, CUDA {doc['cuda']}); same columns as attention\n"
             "attention_flash2:\n" + "".join(f"- {json.dumps(r)}\n".replace('"', '') for r in rows))
    text = re.sub(r"(?m)^(memory_bound_bandwidth_gbs:)", lambda m: block + m.group(1), text, count=1)
    PROFILE.write_text(text)
    print(f"wrote {len(rows)} rows into {PROFILE.relative_to(ROOT)}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, help="measure on this GPU and write the result here")
    ap.add_argument("--write", type=Path, help="merge a result file's flash2 rows into the shipped profile")
    a = ap.parse_args()
    if a.json:
        return measure(a.json)
    if a.write:
        return write(a.write)
    ap.error("give --json OUT (GPU host) or --write FILE (CPU host)")
    return 2


if __name__ == "__main__":
    sys.exit(main())
