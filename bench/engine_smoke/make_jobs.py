"""Write the torchtitan 0.2.x job files of the one-H200 engine smoke run (issue 23).

One plan per variant, for Llama 3.1 8B cut to 16 of 32 layers (flavour ``8B_L16``: full widths), seq 8192,
a global batch of 2 sequences as 2 micro-batches of 1 on one GPU (16K tokens a step, torchtitan
accumulating gradients over the 2), no activation recomputation: the shape of
docs/results/fp8-1gpu-2026-12-01 (autotune's own runtime, same machine kind), at micro-batch 1 so that
eager BF16 fits. Each goes through :func:`autotune.engines.torchtitan.job.job_toml`, i.e. through
:func:`autotune.engines.torchtitan.export.torchtitan_settings`, the settings ``autotune export --engine
torchtitan`` writes.

    python bench/engine_smoke/make_jobs.py [OUT_DIR]     # default bench/engine_smoke/jobs
"""

from __future__ import annotations

import sys
from pathlib import Path

from autotune.engines.torchtitan.job import job_toml
from autotune.spec.models import get_model
from autotune.spec.plan import Plan, Workload

LAYERS = 16
STEPS = 12
VARIANTS = {  # name -> (precision, compile)
    "bf16-eager": ("bf16", False),
    "bf16-compile": ("bf16", True),
    "fp8rowwise-compile": ("fp8_rowwise", True),
    "fp8tensorwise-compile": ("fp8_tensorwise", True),
}


def plan_for(precision: str, compile_: bool) -> Plan:
    return Plan(tp_degree=1, pp_degree=1, dp_degree=1, cp_degree=1, micro_batch_size=1, num_micro_batches=2,
                recompute="none", zero_stage=3, precision=precision, compile=compile_)


def main(out_dir: str = "bench/engine_smoke/jobs") -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, workload = get_model("llama3.1-8b"), Workload(seq_len=8192, global_batch_size=2)
    for name, (precision, comp) in VARIANTS.items():
        text = job_toml(plan_for(precision, comp), model, workload, steps=STEPS, layers=LAYERS,
                        hf_assets_path="assets/tokenizer", dataset_path="assets/c4_local",
                        dump_folder=f"outputs/{name}")
        (out / f"{name}.toml").write_text(text)
        print(out / f"{name}.toml")


if __name__ == "__main__":
    main(*sys.argv[1:])
