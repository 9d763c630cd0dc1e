"""Grouped-GEMM, permutation and router timings of mixture-of-experts layers on the GPU this runs on (issue 39).

For the routed experts of the models in ``../shared/reference/published-moe-runs.yaml`` (hidden size h, expert FFN
f_e, gated: fc1 h -> 2 f_e, fc2 f_e -> h), for ``m`` token rows per expert from 64 to 16384, times on G local
experts at once:

* ``fwd``: ``torch._grouped_mm`` of [G m, K] x [G, K, N] with offsets (one launch for all experts), BF16;
* ``dgrad``: the same with the transposed weights (N and K swapped);
* ``wgrad``: the per-expert weight gradients [K, G m] x [G m, N] grouped along the token dimension (2-D x 2-D
  with offsets), where the installed torch has it, else one ``torch.mm`` per expert;
* ``dense``: one ``torch.mm`` of [G m, K] x [K, N] (the same FLOPs as one dense GEMM), for reference;
* FP8 rowwise grouped GEMM through torchao's ``_scaled_grouped_mm`` where the installed torchao has it;

plus the token permutation (gather of n k rows of h BF16 by index) and unpermutation (scatter-add back), and the
router GEMM n x E x h with its softmax and top-k. Writes JSON (``--json``) and prints a table. GPU only.

    python bench/grouped_gemm.py --json out.json [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

#: (model, h, f_e, E, k) of the development set's MoE models (published-moe-runs.yaml ``models``)
MODELS = [("qwen3-30b-a3b", 2048, 768, 128, 8), ("qwen3-235b-a22b", 4096, 1536, 128, 8),
          ("deepseek-v3", 7168, 2048, 256, 8), ("gpt-oss-120b", 2880, 2880, 128, 4),
          ("mixtral-8x7b", 4096, 14336, 8, 2), ("deepseek-16b", 2048, 1408, 64, 6)]
ROWS = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def _time_ms(fn, *, warmup: int = 3, iters: int = 10) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="fewer row counts")
    args = ap.parse_args()
    import torch

    dev = torch.device("cuda")
    rows = ROWS[::2] if args.quick else ROWS
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
           "torchao": None, "fp8_grouped": None, "gemm": [], "permute": [], "router": []}
    try:
        import torchao
        out["torchao"] = torchao.__version__
    except Exception:
        pass
    scaled_grouped = None
    try:
        from torchao.prototype.moe_training import _scaled_grouped_mm as scaled_grouped   # type: ignore
        out["fp8_grouped"] = "torchao.prototype.moe_training._scaled_grouped_mm (rowwise FP8)"
    except Exception as e:
        out["fp8_grouped"] = f"unavailable: {type(e).__name__}: {str(e)[:120]}"
    has_grouped = hasattr(torch, "_grouped_mm")
    out["grouped_mm"] = "torch._grouped_mm" if has_grouped else "unavailable (per-expert torch.mm loop)"
    G = 8
    for name, h, f, E, k in MODELS:
        for label, K, N in (("fc1", h, 2 * f), ("fc2", f, h)):
            W = torch.randn(G, K, N, device=dev, dtype=torch.bfloat16) / K ** 0.5
            Wt = W.transpose(1, 2).contiguous()             # [G, N, K] for dgrad
            Wn = W.transpose(1, 2).contiguous().transpose(1, 2)  # column-major B, what _grouped_mm wants
            for m in rows:
                if G * m * max(K, N) * 2 > 8 * 2**30:
                    continue
                X = torch.randn(G * m, K, device=dev, dtype=torch.bfloat16)
                dY = torch.randn(G * m, N, device=dev, dtype=torch.bfloat16)
                offs = torch.arange(m, G * m + 1, m, device=dev, dtype=torch.int32)
                flops = 2.0 * G * m * K * N
                rec = {"model": name, "gemm": label, "rows_per_expert": m, "experts": G, "K": K, "N": N}
                try:
                    if has_grouped:
                        rec["fwd_ms"] = _time_ms(lambda: torch._grouped_mm(X, Wn, offs=offs))
                        Wtn = Wt.transpose(1, 2).contiguous().transpose(1, 2)
                        rec["dgrad_ms"] = _time_ms(lambda: torch._grouped_mm(dY, Wtn, offs=offs))
                        try:
                            Xt = X.t().contiguous()
                            rec["wgrad_ms"] = _time_ms(lambda: torch._grouped_mm(Xt, dY, offs=offs))
                        except Exception as e:
                            rec["wgrad_note"] = f"2-D grouped mm: {type(e).__name__}: {str(e)[:80]}"
                            xs, ys = X.split(m), dY.split(m)
                            rec["wgrad_ms"] = _time_ms(lambda: [a.t() @ b for a, b in zip(xs, ys)])
                    else:
                        xs, ys = X.split(m), dY.split(m)
                        rec["fwd_ms"] = _time_ms(lambda: [a @ W[i] for i, a in enumerate(xs)])
                        rec["dgrad_ms"] = _time_ms(lambda: [b @ Wt[i] for i, b in enumerate(ys)])
                        rec["wgrad_ms"] = _time_ms(lambda: [a.t() @ b for a, b in zip(xs, ys)])
                    W0 = W[0]
                    rec["dense_ms"] = _time_ms(lambda: X @ W0)
                    for key in ("fwd", "dgrad", "wgrad", "dense"):
                        rec[f"{key}_tflops"] = flops / (rec[f"{key}_ms"] * 1e-3) / 1e12
                    if scaled_grouped is not None:
                        try:
                            rec["fp8_fwd_ms"] = _time_ms(lambda: scaled_grouped(X, Wn, offs=offs))
                            rec["fp8_fwd_tflops"] = flops / (rec["fp8_fwd_ms"] * 1e-3) / 1e12
                        except Exception as e:
                            rec["fp8_note"] = f"{type(e).__name__}: {str(e)[:100]}"
                except Exception as e:
                    rec["error"] = f"{type(e).__name__}: {str(e)[:160]}"
                out["gemm"].append(rec)
                del X, dY
            del W, Wt, Wn
            torch.cuda.empty_cache()
        # permutation: n tokens x k copies of h BF16 (n = 8192 tokens on the rank)
        n = 8192
        x = torch.randn(n, h, device=dev, dtype=torch.bfloat16)
        idx = torch.randint(0, n, (n * k,), device=dev)
        y = x.index_select(0, idx)
        perm_ms = _time_ms(lambda: x.index_select(0, idx))
        unperm_ms = _time_ms(lambda: torch.zeros_like(x).index_add_(0, idx, y))
        moved = 2 * (n + n * k) * h
        out["permute"].append({"model": name, "tokens": n, "top_k": k, "hidden": h, "permute_ms": perm_ms,
                               "unpermute_ms": unperm_ms, "permute_gbs": moved / (perm_ms * 1e-3) / 1e9,
                               "unpermute_gbs": (moved + 2 * n * h) / (unperm_ms * 1e-3) / 1e9})
        wr = torch.randn(E, h, device=dev, dtype=torch.bfloat16)

        def router():
            logits = (x @ wr.t()).float()
            return torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)

        r_ms = _time_ms(router)
        out["router"].append({"model": name, "tokens": n, "experts": E, "top_k": k, "router_ms": r_ms,
                              "router_gemm_tflops": 2.0 * n * E * h / (r_ms * 1e-3) / 1e12})
        del x, y, wr
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    print(f"{out['gpu']} torch {out['torch']} torchao {out['torchao']} {out['date']}; {out['grouped_mm']}; "
          f"FP8 grouped: {out['fp8_grouped']}")
    print(f"{'model':16s} {'gemm':4s} {'m':>6s} {'fwd':>7s} {'dgrad':>7s} {'wgrad':>7s} {'dense':>7s} {'fp8':>7s}  TFLOP/s")
    for r in out["gemm"]:
        if "error" in r:
            print(f"{r['model']:16s} {r['gemm']:4s} {r['rows_per_expert']:6d} ERROR {r['error']}")
            continue
        print(f"{r['model']:16s} {r['gemm']:4s} {r['rows_per_expert']:6d} {r['fwd_tflops']:7.0f} {r['dgrad_tflops']:7.0f} "
              f"{r['wgrad_tflops']:7.0f} {r['dense_tflops']:7.0f} {r.get('fp8_fwd_tflops', float('nan')):7.0f}")
    for r in out["permute"]:
        print(f"permute {r['model']:16s} {r['permute_gbs']:6.0f} GB/s  unpermute {r['unpermute_gbs']:6.0f} GB/s")
    for r in out["router"]:
        print(f"router  {r['model']:16s} {r['router_ms']:.3f} ms ({r['router_gemm_tflops']:.0f} TFLOP/s GEMM-equivalent)")


if __name__ == "__main__":
    main()
