"""Table: the built-in mixture-of-experts models' exact parameter counts beside the published totals, and their
model FLOPs per token (active path, Megatron-LM convention: :mod:`autotune.cost.flops`) beside the ratio
"model TFLOP/s per GPU / tokens/s per GPU" of the published Megatron-Bridge runs (no GPU needed).

Reads ``../shared/reference/published-moe-runs.yaml`` (or ``--runs FILE``) for the runs; the published parameter
totals are the model cards' rounded figures, written below with their source. Nothing is fitted.

Run: ``python bench/moe_model_facts.py [--seq-len 4096]``.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

#: built-in name -> (published total, published active, source)
PUBLISHED_COUNTS = {
    "mixtral-8x7b": ("46.7B", "12.9B", "mistralai/Mixtral-8x7B-v0.1 card"),
    "mixtral-8x22b": ("141B", "39B", "Mistral AI's Mixtral 8x22B announcement"),
    "qwen3-30b-a3b": ("30.5B", "3.3B", "Qwen/Qwen3-30B-A3B card (30,532,122,624 in issue 38)"),
    "qwen3-235b-a22b": ("235B", "22B", "Qwen/Qwen3-235B-A22B card"),
    "deepseek-v3": ("671B main + 14B MTP (HF 685B)", "37B", "DeepSeek-V3 README / README_WEIGHTS.md"),
    "kimi-k2": ("1T", "32B", "MoonshotAI/Kimi-K2 README"),
    "deepseek-16b": ("15.7B", "2.4B", "DeepSeek-V2-Lite card (torchtitan 16B flavour's shape)"),
    "gpt-oss-20b": ("20.9B", "3.6B (no input embedding)", "openai/gpt-oss-20b card"),
    "gpt-oss-120b": ("116.8B", "5.1B (no input embedding)", "openai/gpt-oss-120b card"),
}
#: published-moe-runs.yaml model key -> built-in name
RUN_MODELS = {"deepseek_v3": "deepseek-v3", "qwen3_30b_a3b": "qwen3-30b-a3b", "qwen3_235b_a22b": "qwen3-235b-a22b",
              "gpt_oss_120b": "gpt-oss-120b", "mixtral_8x7b": "mixtral-8x7b"}


def main() -> None:
    from autotune.cost.flops import model_flops_per_token
    from autotune.files import load_shipped_yaml
    from autotune.spec.models import MOE_CATALOG

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(Path(__file__).resolve().parents[2] / "shared/reference/published-moe-runs.yaml"))
    ap.add_argument("--seq-len", type=int, default=4096)
    a = ap.parse_args()

    print(f"{'model':16} {'total params':>20} {'active params':>18} {'active w/o emb':>16}  published (total / active)")
    for name, m in MOE_CATALOG.items():
        tot, act, src = PUBLISHED_COUNTS[name]
        print(f"{name:16} {m.num_params:>20,} {m.num_active_params:>18,} {m.num_active_params_without_embedding:>16,}"
              f"  {tot} / {act} ({src})")
        if m.mtp_num_layers:
            no = replace(m, mtp_num_layers=0)
            print(f"{'  without MTP':16} {no.num_params:>20,} {no.num_active_params:>18,} "
                  f"{no.num_active_params_without_embedding:>16,}")

    path = Path(a.runs)
    if not path.is_file():
        print(f"\n(no runs file at {path}: FLOPs table skipped)")
        return
    runs = load_shipped_yaml(path.read_text())["runs"]
    print(f"\nFLOPs per token at the run's sequence length (GFLOP), ours vs published TFLOP/s / tokens/s per GPU")
    print(f"{'run':28} {'model':16} {'seq':>5} {'published':>10} {'ours':>9} {'error':>8}")
    for r in runs:
        name = RUN_MODELS.get(r["model"])
        if name is None or not r.get("tokens_per_s_per_gpu") or not r.get("tflops_per_gpu"):
            continue
        pub = r["tflops_per_gpu"] * 1e12 / r["tokens_per_s_per_gpu"]
        ours = model_flops_per_token(MOE_CATALOG[name], r["seq"])
        print(f"{r['id']:28} {name:16} {r['seq']:>5} {pub / 1e9:>10.2f} {ours / 1e9:>9.2f} {ours / pub - 1:>+8.2%}")


if __name__ == "__main__":
    main()
