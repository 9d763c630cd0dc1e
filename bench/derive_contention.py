"""Derive the calibration profile's overlap contention factors from the H200 contention measurement.

Input: ``docs/results/contention-h200x1-2026-12-01.json`` (``bench/contention.py`` on 1x H200, torch
2.11.0+cu130, 2026-12-01). Output: the ``overlap:`` keys of ``autotune/data/calibration/h200.yaml``:

* ``sm_gemm_slowdown``: {N: GEMM time under contention / alone} while a reduction kernel (``c = a + b``, the
  memory traffic of a reduce-scatter step) holds N SMs for the whole GEMM: the median over the measured
  GEMM shapes whose time alone is >= :data:`MIN_GEMM_MS` (the 0.21 ms 70B TP8 QKV GEMM is left out: its time
  alone drifted 14% within the run and it slows x1.9 with 8 SMs taken, a single-wave effect the larger
  shapes do not show);
* ``copy_engine_gemm_slowdown``: the same median with a pinned host-to-device copy (copy engine, no SMs)
  beside the GEMM: what a copy-engine transfer (Transformer Engine's ring exchange, ``use_ce``) costs a GEMM.

Run: ``python bench/derive_contention.py [JSON]``; prints the YAML lines and a table.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "docs" / "results" / "contention-h200x1-2026-12-01.json"
#: GEMMs shorter than this are left out (see the module docstring), ms
MIN_GEMM_MS = 0.7


def derive(path: Path) -> tuple[dict[int, float], float, list[str]]:
    """({SMs: median slowdown}, copy-engine median slowdown, the shapes used)."""
    d = json.loads(path.read_text())["contention"]
    used = [g for g in d["gemms"] if g["alone_ms"] >= MIN_GEMM_MS]
    by_sms: dict[int, list[float]] = {}
    h2d: list[float] = []
    for g in used:
        for c in g["cases"]:
            if c["bg"].startswith("reduce"):
                by_sms.setdefault(int(c["sms"]), []).append(float(c["slowdown"]))
            elif c["bg"] == "h2d":
                h2d.append(float(c["slowdown"]))
    sm = {n: round(statistics.median(v), 3) for n, v in sorted(by_sms.items())}
    return sm, round(statistics.median(h2d), 3), [f"{g['shape']} ({g['dtype']}, {g['alone_ms']:.2f} ms)" for g in used]


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    sm, ce, shapes = derive(path)
    print(f"# from {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: medians over {len(shapes)} shapes")
    for s in shapes:
        print(f"#   {s}")
    print("overlap:")
    print("  sm_gemm_slowdown: {" + ", ".join(f"{n}: {v}" for n, v in sm.items()) + "}")
    print(f"  copy_engine_gemm_slowdown: {ce}")


if __name__ == "__main__":
    main()
