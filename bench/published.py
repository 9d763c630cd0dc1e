"""Benchmark: predictions against published training runs of Llama 3.x (no GPU needed).

Reads ``../shared/reference/published-runs.yaml`` (or ``--runs FILE``), turns every run the plan space
can express into a plan for the run's engine (Megatron-LM for the Llama 3 paper and Megatron-Bridge,
torchtitan for torchtitan's benchmarks), predicts it with the simulated evaluator and the shipped
calibration, and prints predicted vs published tokens/s per GPU (and peak memory where published),
the error per row, the mean absolute error and the worst row. Runs the plan space cannot express
yet (a precision or compile setting that is not a plan field) are listed with the reason.

Nothing is fitted to these rows: they are the check. How each published setting becomes a plan
setting is stated in :func:`plan_for` (the source's stated value, else the engine's default).

Run: ``python bench/published.py`` (``--write-error-bands`` stores the per-engine errors in
``autotune/data/error_bands.yaml``, which ``run``, ``simulate`` and ``export`` print).

``--cross-validate``: leave one source out (the Llama 3 paper, each torchtitan benchmark, each
Megatron-Bridge release) and report the held-out error per source and per hardware family, signed and
absolute. The model has no parameter fitted to these rows, so a source's held-out error is its error under
the shipped model, with one exception per choice the project made while looking at a source's errors
(:data:`CHOICES`): for such a source the held-out error is computed with the choice's alternative as well,
since without that source the choice would not have been made. It also prints, per source, the coverage of
the central 80% interval (autotune/spec/trust.py) built without that source, and the MAE / signed error per
hardware family against issue 40's targets.

``--write-error-bands`` stores these held-out figures in ``autotune/data/error_bands.yaml``: per engine, and
the interval data (``interval``: pooled and per-regime 10th / 90th percentiles, the rows, the coverage) that
every prediction prints; and the best published run per (GPU family, precision class, model class) with the
published plans in ``autotune/data/published_frontier.yaml`` (``--moe-runs`` adds the MoE runs' figures).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.spec.engines import get_engine  # noqa: E402
from autotune.errors import AutotuneError  # noqa: E402
from autotune.cost.flops import model_flops_per_token  # noqa: E402
from autotune.spec.hardware import ClusterSpec, GPUSpec, get_fabric, get_gpu  # noqa: E402
from autotune.cost.memory import estimate_memory  # noqa: E402
from autotune.spec.models import get_model  # noqa: E402
from autotune.spec.plan import Plan, Workload  # noqa: E402
from autotune.search.space import derive_stage_layers  # noqa: E402
from autotune.cost.simulator import SimulatedEvaluator  # noqa: E402

DEFAULT_RUNS = ROOT.parent / "shared" / "reference" / "published-runs.yaml"
DEFAULT_MOE_RUNS = ROOT.parent / "shared" / "reference" / "published-moe-runs.yaml"
#: Choices made while looking at a source's errors (docs/fidelity.md, "Constants chosen while looking at
#: errors"): (name, the source it was chosen on, module attribute, shipped value, alternative, independent
#: check). The check (a "module:function" under bench/, or None) decides the choice on a measurement outside the
#: development set and returns (value, printed text): when it selects the shipped value, the choice would have
#: been made without the source too, so the source's held-out error is its error under the shipped value (the
#: alternative's is still printed); otherwise, or without a check, the alternative's error is the held-out one.
CHOICES = [
    ("B200/GB200 FP8 GEMM scaling", "megatron_bridge_25_11", "autotune.cost.op_costs.FP8_SCALE_RULE",
     "bf16_reference", "fp8_reference", "fp8_rule_check:selected_rule"),
]
#: Llama 3 paper (Sec. 3.3.2, Table 4): 126 layers on 16 stages, one layer fewer on the first and the
#: last; the paper does not state v. v = 8 is the finest interleave that split allows (one layer per
#: virtual stage, the first and last virtual stages holding only the embedding / the LM head); the
#: other v are printed beside it.
LLAMA3_VPP = 8

# Group -> (engine, fabric, GPU). Fabrics from each group's `hardware` line: 8 GPUs per NVLink server,
# 400 Gb/s RoCE (Llama 3 paper) or 400 Gb/s InfiniBand/RDMA per GPU (the others).
GROUPS = {
    "llama3_paper_table4": ("megatron", "nvlink4+roce400", "h100"),
    "torchtitan_h100_2024_12": ("torchtitan", "nvlink4+ib-ndr400", "h100-96gb-500w"),
    "torchtitan_h200_2025_06": ("torchtitan", "nvlink4+ib-ndr400", "h200"),
    "megatron_bridge_25_11": ("megatron", None, None),
}
FABRIC_OF_GPU = {"h100": "nvlink4+ib-ndr400", "b200": "nvlink5+ib-ndr400", "gb200": "nvlink5-nvl72+ib-ndr400"}


def gpu_spec(name: str) -> GPUSpec:
    """Catalog GPU, or the torchtitan 2024-12 benchmark's H100 variant: 96 GB HBM2e at 2.4 TB/s, power
    capped at 500 W (its file says the real peak lies between H100 SXM and NVL). Its dense BF16 peak is
    an ASSUMPTION, interpolated linearly in power between the two datasheet points: H100 NVL 835
    TFLOP/s at 400 W and H100 SXM 989 TFLOP/s at 700 W -> 835 + 154 x 100/300 = 886.3 TFLOP/s."""
    if name != "h100-96gb-500w":
        return get_gpu(name)
    base = get_gpu("h100")
    peak = 835 + (989 - 835) * (500 - 400) / (700 - 400)
    return dataclasses.replace(base, name="h100-96gb-500w", display_name="H100 96GB HBM2e, 500 W cap",
                               bf16_tflops=peak, fp8_tflops=2 * peak, hbm_gib=96 * 1e9 / 2**30,
                               hbm_bandwidth_gbs=2400)


def plan_for(run: dict[str, Any], engine: str, num_gpus: int, num_layers: int, v: int | None = None) -> Plan:
    """The plan a published run describes, for ``engine``.

    * degrees tp, pp, cp as published; dp = GPUs / (tp pp cp); micro-batch ``mbs`` (1 if absent; for
      torchtitan with PP and a published local batch: local batch / pp, its release's default of pp
      micro-batches); micro-batches = global batch / (mbs x dp);
    * schedule: ``vp`` given -> interleaved 1F1B with that v; Llama 3 paper: interleaved with
      :data:`LLAMA3_VPP` (or ``v``) and one layer fewer on the first and last stage; else the
      ``schedule`` field, else 1F1B;
    * ``dp_mode`` ddp -> zero_stage 1 (Megatron distributed optimizer); fsdp -> torchtitan: zero 3
      without PP, 2 with PP (fsdp_reshard_after_forward "default"); Megatron-FSDP: 3; the Llama 3 paper's
      FSDP, which does not reshard after forward and accumulates gradients over the micro-batches in
      FP32 before its FP32 reduce-scatter (paper Sec. 3.3.2), costs as the distributed optimizer: 1;
    * recompute as published (null -> none); sequence parallel with TP > 1; async collectives, DP
      gradient-reduce overlap and parameter-gather overlap on (the sources' recipes overlap DP
      communication); TP communication overlap only where the source states it (``async_tp``) or
      Megatron-Bridge's recipes (on with TP > 1), else the engine's default (off: Megatron-LM's
      --tp-comm-overlap is opt-in);
    * layers that do not split evenly: one fewer on the first and the last virtual stage (the
      engines' own rules, see the code); torchtitan's interleaved schedule: 2 stages per rank.
    """
    tp, pp, cp = run.get("tp", 1), run.get("pp", 1), run.get("cp", 1)
    dp = num_gpus // (tp * pp * cp)
    mbs = run.get("mbs") or 1
    if engine == "torchtitan" and pp > 1 and not run.get("mbs") and run.get("local_batch"):
        # torchtitan 9dec370 (the 2024-12 runs): --experimental.pipeline_parallel_microbatches defaults
        # to the pipeline degree (torchtitan/parallelisms/pipelining_utils.py, pipeline_llama.py), so
        # the local batch is split into pp micro-batches
        mbs = run["local_batch"] // pp
    gbs = run.get("gbs") or mbs * dp           # torchtitan h200 rows: local batch 2, no accumulation
    stage_layers = None
    vp = run.get("vp")
    schedule = run.get("schedule") or "1f1b"
    if run.get("_group") == "llama3_paper_table4":
        vp = v or LLAMA3_VPP
    if schedule == "interleaved_1f1b" and not vp and engine == "torchtitan":
        vp = 2      # torchtitan/distributed/pipeline_parallel.py: stages_per_rank = 2 for multi-stage schedules
    if vp:
        schedule = "interleaved_1f1b"
    n = pp * (vp or 1)
    if pp > 1 and num_layers % n:
        # one layer fewer on the first and the last (virtual) stage: the Llama 3 paper (Sec. 3.3.2),
        # Megatron-LM --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split
        # (Megatron-Bridge's 405B recipes), torchtitan's pipeline_parallel_first/last_stage_less_layers = 1
        per = -(-num_layers // n)
        if n * per - num_layers == 2 and per == 1:      # Llama 3 at v = 8: empty first and last chunk
            stage_layers = (0,) + (1,) * (n - 2) + (0,)
        else:
            stage_layers = derive_stage_layers(num_layers, n, "ends")
    # Megatron-Bridge v0.2.0 scripts/performance/configs/llama3/llama3_llm_pretrain.py:
    # CommOverlapConfig(tp_comm_overlap=tp > 1) (userbuffers configs for the 70B / 405B recipes)
    tp_overlap = bool(run.get("async_tp", run.get("_group") == "megatron_bridge_25_11")) and tp > 1
    if run["dp_mode"] == "ddp":
        zero = 1
    elif run.get("_group") == "llama3_paper_table4":
        # Megatron: the distributed optimizer (1); torchtitan (the structure printed beside it): FSDP2
        # with PP, reshard_after_forward False = ZeRO-2, as the paper's "do not reshard after forward"
        zero = 1 if engine == "megatron" else 2
    elif engine == "torchtitan":
        zero = 3 if pp == 1 else 2
    else:
        zero = 3
    return Plan(tp_degree=tp, pp_degree=pp, dp_degree=dp, cp_degree=cp, vpp_degree=vp or 1,
                micro_batch_size=mbs, num_micro_batches=gbs // (mbs * dp),
                pipeline_schedule=schedule if pp > 1 else "1f1b", sequence_parallel=tp > 1,
                recompute=run.get("recompute") or "none", zero_stage=zero if dp * cp > 1 else 0,
                async_collectives=True, tp_comm_overlap=tp_overlap,
                dp_grad_reduce_overlap=True, param_gather_overlap=zero >= 1 and dp * cp > 1,
                stage_layers=stage_layers)


#: Megatron-Bridge v0.2.0 recipes that fully recompute only the first N layers of each model chunk, by
#: (model, gpu, precision): scripts/performance/configs/llama3/workload_base_configs.py
#: LLAMA3_8B_H100_FP8_CS_BASE_CONFIG recompute_num_layers=5, which utils/helpers.py
#: set_recompute_overrides turns into recompute_granularity "full", recompute_method "block",
#: recompute_num_layers 5 (Megatron-LM megatron/core/recompute.py checkpointed_forward: the first 5
#: layers of the chunk's 32): Plan(recompute="full", recompute_num_layers=5).
MB_RECIPE_RECOMPUTE_NUM_LAYERS = {
    ("llama3.1-8b", "h100", "fp8_tensorwise"): 5,
}
#: Megatron-Bridge v0.2.0 recipes (the 25.11 container's) that offload the activations of the first N layers
#: to the host, by (model, gpu, precision), all Megatron-FSDP at pp 1: scripts/performance/configs/llama3/
#: workload_base_configs.py LLAMA3_70B_GB200_BF16 (20), _GB200_FP8_CS (40), _GB300_BF16 (30), _GB300_FP8_CS
#: (20), _B200_FP8_CS (5); configs/llama31/workload_base_configs.py LLAMA31_405B_GB200_FP8_CS (92),
#: _GB300_BF16 (40), _GB300_FP8_CS (10) (cpu_offloading_num_layers; utils/helpers.py set_recompute_overrides
#: sets cpu_offloading and cpu_offloading_weights=False): Plan(cpu_offload_layers=N). A row's own
#: ``cpu_offload_layers`` (or ``cpu_offloading_num_layers``) comes first.
MB_RECIPE_CPU_OFFLOAD_LAYERS = {
    ("llama3.1-70b", "gb200", "bf16"): 20, ("llama3.1-70b", "gb200", "fp8_tensorwise"): 40,
    ("llama3.1-70b", "gb300", "bf16"): 30, ("llama3.1-70b", "gb300", "fp8_tensorwise"): 20,
    ("llama3.1-70b", "b200", "fp8_tensorwise"): 5, ("llama3.1-405b", "gb200", "fp8_tensorwise"): 92,
    ("llama3.1-405b", "gb300", "bf16"): 40, ("llama3.1-405b", "gb300", "fp8_tensorwise"): 10,
}
# The 25.11 GB200 405B row (256 GPUs, tp 4 pp 16 vp 4, gbs 1536) is not a v0.2.x preset (v0.2.0-v0.2.2
# have a 128-GPU, tp 2, Megatron-FSDP preset with cpu_offloading_num_layers=92); v0.3.0 has it:
# scripts/performance/configs/llama/llama31_workload_base_configs.py
# LLAMA31_405B_PRETRAIN_CONFIG_GB200_FP8_CS_V2 (256 GPUs, tp 4, pp 16, cp 1, vp 4, gbs 1536,
# use_megatron_fsdp=False, cpu_offloading_num_layers=None, no recompute setting). Placed as
# Megatron-Bridge launches GB200 jobs (4 NVLink domains of 64 GPUs: autotune.spec.hardware.ClusterSpec).


def inexpressible(run: dict[str, Any]) -> str | None:
    """Why the plan space cannot express ``run`` yet, or None."""
    fields = {f.name for f in dataclasses.fields(Plan)}
    if run.get("precision", "bf16") != "bf16" and "precision" not in fields:
        return f"precision {run['precision']} is not a plan setting yet"
    if run.get("compile") and "compile" not in fields:
        return "torch.compile is not a plan setting yet"
    return None


def predict(run: dict[str, Any], engine: str, fabric: str, gpu: str, v: int | None = None,
            attention_kernel: str | None = None):
    model = get_model(run["model"].split("-")[-1])
    g = gpu_spec(gpu)
    cluster = ClusterSpec(gpu=g, num_gpus=run["gpus"], fabric=get_fabric(fabric))
    plan = plan_for(run, engine, run["gpus"], model.num_layers, v)
    if "precision" in {f.name for f in dataclasses.fields(Plan)}:
        plan = plan.replace(precision=run.get("precision", "bf16"))
    if "compile" in {f.name for f in dataclasses.fields(Plan)}:
        plan = plan.replace(compile=bool(run.get("compile", False)))
    if run.get("_group") == "megatron_bridge_25_11":
        n_rc = MB_RECIPE_RECOMPUTE_NUM_LAYERS.get((run["model"], run.get("gpu"), run.get("precision", "bf16")))
        if n_rc:
            plan = plan.replace(recompute="full", recompute_num_layers=n_rc)
        n_off = MB_RECIPE_CPU_OFFLOAD_LAYERS.get((run["model"], run.get("gpu"), run.get("precision", "bf16"))) \
            if run.get("dp_mode") == "fsdp" and plan.pp_degree == 1 and plan.recompute == "none" else None
        if n_off:
            plan = plan.replace(cpu_offload_layers=n_off)
    n_own = run.get("cpu_offload_layers", run.get("cpu_offloading_num_layers"))
    if n_own:
        plan = plan.replace(cpu_offload_layers=n_own)       # (Plan refuses a value that is not an integer)
    if run["model"] == "llama3.1-405b" and run.get("gpu") == "gb200" and plan.precision != "bf16":
        # Megatron-Bridge scripts/performance/perf_plugins.py _set_model_specific_environment_variables
        # (v0.2.0 and v0.3.0): llama31 405b on gb200 with fp8_cs / fp8_mx sets
        # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        plan = plan.replace(memory_reclaim="expandable_segments")
    w = Workload(seq_len=run["seq"], global_batch_size=plan.global_batch_size)
    eng = get_engine(engine)
    if engine == "torchtitan" and plan.precision == "fp8_tensorwise":
        # the published torchtitan runs (2024-12, 2025-06) used its float8 "tensorwise" recipe, which the
        # pinned torchtitan of the engine profile no longer has: predict them for that older release
        eng = dataclasses.replace(eng, precisions=eng.precisions + ("fp8_tensorwise",),
                                  source=eng.source + "; tensorwise recipe as in its 2024-25 releases")
    if run.get("_group") == "megatron_bridge_25_11":
        # Megatron-Bridge's performance recipes reduce gradients in BF16, so Megatron-Core's main-grad
        # buffer is BF16 too: v0.2.0 scripts/performance/configs/llama3/llama3_llm_pretrain.py
        # set_llama3_common_configs and configs/llama31/llama31_llm_pretrain.py
        # set_llama31_common_configs: cfg.ddp.grad_reduce_in_fp32 = False (Megatron-LM's
        # --grad-reduce-in-bf16); and their FP8-CS recipe keeps FP8 parameters: get_precision_config
        # ("fp8_cs") = bf16_with_fp8_current_scaling_mixed and ("fp8_mx") = bf16_with_mxfp8_mixed
        # (src/megatron/bridge/training/mixed_precision.py: fp8_param_gather = True in both, Megatron-LM
        # --fp8-param-gather)
        plan = plan.replace(grad_reduce_in_bf16=True,
                            fp8_param_gather=plan.precision in ("fp8_tensorwise", "mxfp8"))
    if engine == "torchtitan" and run.get("_group") == "torchtitan_h100_2024_12":
        # the 2024-12 release did not compile the loss: torchtitan 9dec370 train.py ("compiling loss
        # function causes CUDA errors, turning off for now"); e7c0cae (2025-06) does
        # (torchtitan/components/loss.py build_cross_entropy_loss: torch.compile(loss_fn) with compile)
        eng = dataclasses.replace(eng, compile_loss=False)
    if engine == "torchtitan":
        # and their attention kernel: FlashAttention-2 (SDPA's flash backend), not the pinned release's
        # cuDNN-first list. 2024-12 (torchtitan 9dec370, torch 1963fc8): torchtitan/models/llama/model.py
        # calls F.scaled_dot_product_attention without a backend, and torch's default dispatch had
        # made cuDNN opt-in (pytorch/pytorch#138522; #142132: the default 329 vs cuDNN 631 TFLOP/s on
        # H100, nightly 2024-12-04). 2025-06 (torchtitan e7c0cae): torchtitan/models/attention.py
        # ScaledDotProductAttention._init_backend puts FLASH_ATTENTION first, cuDNN only on B200.
        eng = dataclasses.replace(eng, attention_kernel="flash2",
                                  source=eng.source + "; FlashAttention-2 as in its 2024-25 releases")
    if attention_kernel:
        eng = dataclasses.replace(eng, attention_kernel=attention_kernel)
    # the step time does not depend on capacity: time the plan on a GPU with room for it, and give the
    # memory model's verdict for the real capacity beside it (a published run that ran but is refused
    # as out of memory is a memory-model error, reported as such)
    roomy = ClusterSpec(gpu=dataclasses.replace(g, hbm_gib=1e6), num_gpus=run["gpus"], fabric=cluster.fabric)
    ev = SimulatedEvaluator(model=model, cluster=roomy, workload=w, engine=eng)
    mem = estimate_memory(model, plan, g, w, fragmentation=ev.costs.fragmentation(), engine=eng)
    return plan, ev.evaluate(plan), mem


def load_runs(path: Path) -> dict[str, Any]:
    """The published-runs YAML. A group-level field whose plain value holds ": " (the shared file's
    ``engine: ... closest: megatron``) is not valid YAML; such a value is quoted before parsing."""
    from autotune.files import read_text_file

    # the one reader of user files (a regular file, the size cap, no NUL; autotune/files.py)
    text = read_text_file(path, what="published-runs file")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        fixed = []
        for line in text.splitlines():
            m = re.match(r"^(  [a-z_]+): (.+)$", line)
            if m and ": " in m.group(2) and m.group(2)[0] not in "'\"{[":
                line = f"{m.group(1)}: '" + m.group(2).replace("'", "''") + "'"
            fixed.append(line)
        return yaml.safe_load("\n".join(fixed))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", default=str(DEFAULT_RUNS), help="published-runs YAML")
    ap.add_argument("--write-error-bands", action="store_true",
                    help="store per-engine errors in autotune/data/error_bands.yaml")
    ap.add_argument("--cross-validate", action="store_true",
                    help="leave one source out: held-out error per source and per hardware family")
    ap.add_argument("--moe-runs", default=str(DEFAULT_MOE_RUNS) if DEFAULT_MOE_RUNS.is_file() else None,
                    help="published MoE runs YAML (their best runs go into the frontier file only)")
    ap.add_argument("--markdown", default=None, metavar="FILE",
                    help="rewrite the published-runs table between its markers in FILE (docs/fidelity.md)")
    args = ap.parse_args()
    if not Path(args.runs).is_file():      # the shared file sits beside the checkout: ../shared/reference/
        print(f"error: no published-runs file {args.runs} (it is read from shared/reference/ beside the checkout); "
              "give one with --runs FILE", file=sys.stderr)
        return 2
    from autotune.errors import ConfigError
    try:
        data = load_runs(Path(args.runs))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows, skipped = [], []
    print("Published runs vs simulated predictions (shipped calibration; tokens/s per GPU; error = predicted / "
          "published - 1)")
    hdr = f"{'source':24s} {'model':6s} {'gpu':15s} {'GPUs':>5s} {'prec':15s} {'tp pp cp dp  v':>15s} " \
          f"{'rc':9s} {'engine':10s} {'published':>9s} {'predicted':>9s} {'error':>7s} {'mem pub/pred GiB':>17s}"
    print(hdr)
    for group, g in data.items():
        engine, fabric, gpu = GROUPS[group]
        for run in g["runs"]:
            run = dict(run, _group=group)
            rgpu = run.get("gpu") or gpu
            rfab = fabric or FABRIC_OF_GPU[rgpu]
            why = inexpressible(run)
            label = f"{group[:24]:24s} {run['model'].split('-')[-1]:6s} {rgpu:15s} {run['gpus']:5d} " \
                    f"{run.get('precision', 'bf16'):15s}"
            if why:
                skipped.append((label, why))
                continue
            try:
                plan, r, mem = predict(run, engine, rfab, rgpu)
            except AutotuneError as e:
                skipped.append((label, f"not predictable: {e}"))
                continue
            pub = run.get("tokens_per_s_per_gpu")
            if pub is None:          # Llama 3 paper: TFLOP/s per GPU, PaLM convention (c = 2) -> tokens/s
                model = get_model(run["model"].split("-")[-1])
                pub = run["tflops_per_gpu"] * 1e12 / model_flops_per_token(model, run["seq"], causal=False)
            pred = r.tokens_per_s_per_gpu if r.feasible else 0.0
            err = pred / pub - 1 if pub and r.feasible else None
            memcol = f"{run.get('memory_gib', float('nan')):.1f}/{mem.peak_bytes / 2**30:.1f}"
            degrees = f"{plan.tp_degree:2d} {plan.pp_degree:2d} {plan.cp_degree:2d} {plan.dp_degree:4d} " \
                      f"{plan.effective_vpp:2d}"
            note = "" if mem.fits else f"  memory model: does not fit ({mem.live_peak_bytes / 2**30:.1f} GiB " \
                f"without the allocator's reserve, {mem.peak_bytes / 2**30:.1f} with it > " \
                f"{mem.capacity_bytes / 2**30:.1f} GiB usable)"
            print(f"{label} {degrees:>15s} {plan.recompute:9s} {engine:10s} {pub:9.0f} {pred:9.0f} "
                  f"{(f'{100 * err:+.1f}%' if err is not None else '-'):>7s} {memcol:>17s}{note}")
            rows.append({"group": group, "engine": engine, "run": run, "err": err, "result": r, "mem": mem,
                         "published": pub, "gpu": rgpu, "plan": plan,
                         "hidden": get_model(run["model"].split("-")[-1]).hidden_size, "degrees": degrees.split() and " ".join(degrees.split()),
                         "recompute": plan.recompute + (f" ({plan.recompute_num_layers} layers)"
                                                        if plan.partial_recompute else "")})
            if group == "llama3_paper_table4":
                for v in (2, 4):
                    _, rv, _ = predict(run, engine, rfab, rgpu, v)
                    mfu_pub = run["mfu_pct"] / 100
                    print(f"{'':24s}   v={v}: predicted MFU {100 * rv.mfu_palm:.1f}% (PaLM) vs published "
                          f"{100 * mfu_pub:.0f}%" if rv.feasible else f"{'':24s}   v={v}: does not fit")
                mfu_pub = run["mfu_pct"] / 100
                print(f"{'':24s}   v={LLAMA3_VPP}: predicted MFU {100 * r.mfu_palm:.1f}% (PaLM convention, as the "
                      f"paper) vs published {100 * mfu_pub:.0f}%: {100 * (r.mfu_palm - mfu_pub):+.1f} points")
                alt = []
                for kernel in ("flash2", "default"):
                    _, ra, _ = predict(run, "torchtitan", rfab, rgpu, None, attention_kernel=kernel)
                    alt.append(f"{100 * ra.mfu_palm:.1f}% ({'FlashAttention-2' if kernel == 'flash2' else 'cuDNN'} "
                               f"attention, {100 * (ra.mfu_palm - mfu_pub):+.1f})")
                print(f"{'':24s}   v={LLAMA3_VPP}, torchtitan structure (FSDP ZeRO-2, FP32 reduce-scatter after the "
                      f"last backward, torch's interleaved 1F1B): {' / '.join(alt)}")
    if "llama3_paper_table4" in data:
        print()
        print(llama3_convention_table(data["llama3_paper_table4"]))
    errs = [x["err"] for x in rows if x["err"] is not None]
    print()
    if errs:
        worst = max(rows, key=lambda x: abs(x["err"]) if x["err"] is not None else -1)
        print(f"rows predicted: {len(errs)}; mean absolute error {100 * statistics.mean(map(abs, errs)):.1f}%; "
              f"worst {100 * worst['err']:+.1f}% ({worst['group']} {worst['run']['model']} x{worst['run']['gpus']})")
    mem_line = memory_summary(rows)
    if mem_line:
        print(mem_line)
    infeasible = [x for x in rows if not x["mem"].fits]
    if infeasible:
        print(f"published runs the memory model refuses although they ran: {len(infeasible)}")
    for label, why in skipped:
        print(f"not predicted: {label.split()[0]} {' '.join(label.split()[1:4])}: {why}")
    cv = None
    if args.cross_validate or args.write_error_bands:
        cv = cross_validate(data, rows)
        print()
        print(cv["text"])
    if args.write_error_bands:
        write_error_bands(rows, cv)
        write_frontier(Path(args.runs), Path(args.moe_runs) if args.moe_runs else None, rows)
    if args.markdown:
        write_markdown(Path(args.markdown), rows, skipped, errs)
    return 0


#: Llama 3 paper Table 4, row 3 (long-context pre-training): 16,384 H100, TP 8, CP 16, PP 16, DP 8, seq
#: 131,072, 16M tokens per batch (16 sequences per DP rank), 380 TFLOP/s per GPU, 38% MFU. Not in the
#: shared runs file, so outside the error statistics: printed as the 8K -> 128K trend check.
LLAMA3_ROW3 = {"model": "llama3.1-405b", "gpus": 16384, "precision": "bf16", "seq": 131072, "gbs": 128, "tp": 8,
               "cp": 16, "pp": 16, "dp": 8, "dp_mode": "fsdp", "vp": None, "recompute": "none", "tflops_per_gpu": 380,
               "mfu_pct": 38}


def llama3_convention_table(group: dict[str, Any]) -> str:
    """The Llama 3 rows (and row 3 at 128K) with the predicted MFU in both FLOP conventions.

    The paper cites PaLM (Chowdhery et al. 2023) for MFU but does not say whether its attention term
    counts the causal half (c = 1) or the full square (c = 2, PaLM Appendix B); the shared runs file
    reads it as c = 2 (the table above). Which reading holds is not published, so both are shown."""
    engine, fabric, gpu = GROUPS["llama3_paper_table4"]
    lines = ["Llama 3 Table 4 in both FLOP conventions (v = 8, Megatron-LM structure; the paper does not say "
             "whether its attention FLOPs are causal):",
             f"{'row':>4s} {'seq':>7s} {'cp':>3s} {'published':>9s} {'pred. c=2 (PaLM)':>17s} {'pred. c=1 (causal)':>19s}"]
    runs = [dict(r, _group="llama3_paper_table4") for r in group["runs"]] + \
        [dict(LLAMA3_ROW3, _group="llama3_paper_table4")]
    for i, run in enumerate(runs, 1):
        _, r, _ = predict(run, engine, fabric, gpu)
        pub = run["mfu_pct"]
        lines.append(f"{i:4d} {run['seq']:7d} {run.get('cp', 1):3d} {pub:8d}% {100 * r.mfu_palm:9.1f}% ({100 * r.mfu_palm - pub:+.1f})"
                     f" {100 * r.mfu:10.1f}% ({100 * r.mfu - pub:+.1f})" + ("   (row 3: outside the statistics)" if i == 3 else ""))
    return "\n".join(lines)


def memory_summary(rows: list[dict[str, Any]]) -> str:
    """One line: the peak-memory error (predicted / published - 1) over the rows that publish memory."""
    merrs = [(x["mem"].peak_bytes / 2**30 / x["run"]["memory_gib"] - 1, x) for x in rows
             if x["run"].get("memory_gib")]
    if not merrs:
        return ""
    e, w = max(merrs, key=lambda t: abs(t[0]))
    return (f"peak memory where published: mean absolute error {100 * statistics.mean(abs(v) for v, _ in merrs):.1f}% "
            f"over {len(merrs)} rows; worst {100 * e:+.1f}% ({w['group']} {w['run']['model']} x{w['run']['gpus']})")


MD_START, MD_END = "<!-- published-table:start -->", "<!-- published-table:end -->"


def write_markdown(path: Path, rows: list[dict[str, Any]], skipped: list, errs: list[float]) -> None:
    """The published-runs table (markdown) between :data:`MD_START` / :data:`MD_END` in ``path``."""
    lines = ["| source | model | GPUs | GPU | precision | tp pp cp dp v | recompute | engine | published tok/s/GPU | "
             "predicted | error | memory published / predicted GiB |", "|" + "---|" * 12]
    for x in rows:
        run, r, mem = x["run"], x["result"], x["mem"]
        plan_deg = x.get("degrees", "")
        pub = x.get("published")
        fits = "" if mem.fits else " (does not fit)"
        lines.append(f"| {x['group']} | {run['model'].split('-')[-1]} | {run['gpus']} | {x.get('gpu')} | "
                     f"{run.get('precision', 'bf16')} | {plan_deg} | {x.get('recompute')} | {x['engine']} | "
                     f"{pub:.0f} | {r.tokens_per_s_per_gpu:.0f} | {100 * x['err']:+.1f}% | "
                     f"{run.get('memory_gib', '-')} / {mem.peak_bytes / 2**30:.1f}{fits} |")
    worst = max(errs, key=abs) if errs else 0.0
    lines.append("")
    lines.append(f"{len(errs)} rows; mean absolute error {100 * statistics.mean(map(abs, errs)):.1f}%, worst "
                 f"{100 * worst:+.1f}% (simulated, shipped calibration, {datetime.date.today().isoformat()}; "
                 f"`python bench/published.py --markdown docs/fidelity.md`). "
                 + (memory_summary(rows).capitalize() + ". " if memory_summary(rows) else "") + "Not predicted: "
                 + ("; ".join(f"{' '.join(lab.split()[:4])}: {why}" for lab, why in skipped) or "none") + "\n")
    table = "\n".join(lines)
    text = path.read_text() if path.exists() else ""
    if MD_START in text and MD_END in text:
        head, rest = text.split(MD_START, 1)
        tail = rest.split(MD_END, 1)[1]
        path.write_text(f"{head}{MD_START}\n{table}{MD_END}{tail}")
    else:
        path.write_text(text + f"\n## Published runs (other engines and scales)\n\n{MD_START}\n{table}{MD_END}\n")


def family(gpu: str) -> str:
    """Hardware family of a row's GPU (:func:`autotune.spec.hardware.gpu_family`): the 500 W H100 variant is h100."""
    from autotune.spec.hardware import gpu_family

    return gpu_family(gpu) or gpu


def _stats(errs: list[float]) -> tuple[int, float, float, float]:
    """(rows, mean signed %, mean absolute %, worst %)."""
    worst = max(errs, key=abs)
    return len(errs), 100 * statistics.mean(errs), 100 * statistics.mean(map(abs, errs)), 100 * worst


def cross_validate(data: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Leave-one-source-out errors (module docstring). Returns {"held_out": [(row, held-out error)],
    "by_source": {...}, "by_family": {...}, "mae": %, "text": the printed table}.

    A row's held-out error is its error under the shipped model unless a :data:`CHOICES` entry was chosen on
    its source; then the row is predicted again with the choice's alternative (the model that source would
    have got had it been left out), and that error is the held-out one."""
    import importlib

    held: list[tuple[dict[str, Any], float]] = []
    alt_rows: dict[str, list[float]] = {}
    checks = {}
    for name, _, _, shipped, _, check in CHOICES:
        if check:
            mod_name, fn = check.split(":")
            sys.path.insert(0, str(ROOT / "bench"))
            checks[name] = getattr(importlib.import_module(mod_name), fn)()
    for x in rows:
        if x["err"] is None:
            continue
        err = x["err"]
        for name, source, attr, shipped, alternative, _ in CHOICES:
            if x["group"] != source:
                continue
            mod_name, var = attr.rsplit(".", 1)
            mod = importlib.import_module(mod_name)
            saved = getattr(mod, var)
            setattr(mod, var, alternative)
            try:
                run = x["run"]
                engine, fabric, gpu = GROUPS[x["group"]]
                rgpu = run.get("gpu") or gpu
                _, r2, _ = predict(run, engine, fabric or FABRIC_OF_GPU[rgpu], rgpu)
            finally:
                setattr(mod, var, saved)
            alt_err = r2.tokens_per_s_per_gpu / x["published"] - 1 if r2.feasible else err
            alt_rows.setdefault(name, []).append(alt_err)
            if name not in checks or checks[name][0] != shipped:
                err = alt_err
        held.append((x, err))
    by_source: dict[str, tuple] = {}
    by_family: dict[tuple[str, str], tuple] = {}
    for key_fn, out in ((lambda x: x["group"], by_source), (lambda x: (x["engine"], family(x["gpu"])), by_family)):
        groups: dict[Any, list[float]] = {}
        for x, e in held:
            groups.setdefault(key_fn(x), []).append(e)
        for k, es in sorted(groups.items()):
            out[k] = _stats(es)
    all_errs = [e for _, e in held]
    lines = ["Leave-one-source-out (held-out) error, tokens/s per GPU, predicted / published - 1:",
             f"{'held-out source':28s} {'rows':>4s} {'signed':>8s} {'MAE':>7s} {'worst':>8s}"]
    for k, (n, s, a, w) in by_source.items():
        lines.append(f"{k:28s} {n:4d} {s:+7.1f}% {a:6.1f}% {w:+7.1f}%")
    lines.append(f"{'engine / hardware family':28s} {'rows':>4s} {'signed':>8s} {'MAE':>7s} {'worst':>8s}")
    for (eng, fam), (n, s, a, w) in by_family.items():
        lines.append(f"{eng + ' / ' + fam:28s} {n:4d} {s:+7.1f}% {a:6.1f}% {w:+7.1f}%")
    lines.append(f"{'hardware family (all engines)':28s} {'rows':>4s} {'signed':>8s} {'MAE':>7s} {'worst':>8s}")
    fams: dict[str, list[float]] = {}
    for x, e in held:
        fams.setdefault(family(x["gpu"]), []).append(e)
    for fam, es in sorted(fams.items()):
        n, s_, a_, w_ = _stats(es)
        ok = "meets" if a_ <= 6 and abs(s_) <= 3 else "misses"
        lines.append(f"{fam:28s} {n:4d} {s_:+7.1f}% {a_:6.1f}% {w_:+7.1f}%   ({ok} MAE <= 6%, |signed| <= 3%)")
    mae = 100 * statistics.mean(map(abs, all_errs)) if all_errs else float("nan")
    lines.append(f"cross-validated MAE over {len(all_errs)} rows: {mae:.1f}% (in-sample: "
                 f"{100 * statistics.mean(abs(x['err']) for x, _ in held):.1f}%)")
    for name, source, attr, shipped, alternative, _ in CHOICES:
        es = alt_rows.get(name)
        if es:
            used = "the shipped value (the independent check selects it)" if checks.get(name, ("",))[0] == shipped \
                else f"{alternative!r}"
            lines.append(f"  chosen on {source}: {name} ({attr} = {shipped!r}); with {alternative!r} that source's "
                         f"MAE is {100 * statistics.mean(map(abs, es)):.1f}% over its {len(es)} rows; held-out errors "
                         f"above use {used}")
        if name in checks:
            lines.append("  " + checks[name][1].replace("\n", "\n  "))
    cov = interval_coverage(held)
    lines.append("")
    lines.append(cov["text"])
    return {"held_out": held, "by_source": by_source, "by_family": by_family, "mae": mae, "coverage": cov,
            "text": "\n".join(lines)}


def row_regimes(x: dict[str, Any]) -> list[str]:
    """The regimes (:func:`autotune.spec.trust.plan_regimes`) of a predicted row's plan."""
    from autotune.spec.trust import plan_regimes

    return plan_regimes(x["plan"], family(x["gpu"]), x["hidden"])


def interval_coverage(held: list[tuple[dict[str, Any], float]]) -> dict[str, Any]:
    """Leave-one-source-out coverage of the central 80% interval (autotune/spec/trust.py): for each source,
    the interval table is built from the held-out residuals of the OTHER sources only, and each of the
    source's rows is covered when its own held-out residual lies within its plan's interval. Also the two
    ranges printed before issue 40, on the same rows: "step time, all exposed" .. the prediction (measured
    throughput within predicted x step / exposed step .. predicted) and the engine's error band (|r| <= the
    engine / family mean absolute error shipped before). Returns {"covered", "rows", "median_width",
    "per_source", "text"}."""
    from autotune.spec.trust import interval_from_table, regime_table

    rows = [(x, e, row_regimes(x)) for x, e in held]
    out_rows, per_source = [], {}
    for src in sorted({x["group"] for x, _, _ in rows}):
        others = [(e, g) for x, e, g in rows if x["group"] != src]
        table = regime_table(others)
        for x, e, g in rows:
            if x["group"] != src:
                continue
            iv = interval_from_table(table, g)
            ok = iv.low <= e <= iv.high
            out_rows.append((x, e, iv, ok))
            c = per_source.setdefault(src, [0, 0])
            c[0] += ok
            c[1] += 1
    covered = sum(ok for *_, ok in out_rows)
    widths = [iv.width for _, _, iv, _ in out_rows]
    med = statistics.median(widths) if widths else float("nan")
    # before issue 40: the exposed-bound range and the error band as printed
    exp_in = 0
    for x, e in held:
        r = x["result"]
        lo = r.tokens_per_s_per_gpu * r.step_time_ms / max(r.step_time_exposed_ms, r.step_time_ms)
        exp_in += lo <= x["published"] * (1 + e) / (1 + x["err"]) <= r.tokens_per_s_per_gpu * (1 + 1e-9) \
            if x["err"] is not None else 0
    old = old_band_coverage(held)
    lines = ["Central 80% interval (autotune/spec/trust.py), leave-one-source-out: built without a source, tested on it:",
             f"{'held-out source':28s} {'covered':>8s}"]
    for src, (c, n) in per_source.items():
        lines.append(f"{src:28s} {c:4d}/{n:<3d}")
    for x, e, iv, ok in out_rows:
        lines.append(f"  {x['group'][:24]:24s} {x['run']['model'].split('-')[-1]:5s} {x['gpu']:15s} "
                     f"r {100 * e:+6.1f}%  interval {100 * iv.low:+6.1f}..{100 * iv.high:+6.1f}%  "
                     f"width {100 * iv.width:5.1f}%  {'in' if ok else 'OUT'}  [{', '.join(g + '=' + how for g, _, how in iv.regimes)}]")
    lines.append(f"coverage {covered}/{len(out_rows)} = {100 * covered / max(1, len(out_rows)):.0f}% (target 70-90%); "
                 f"median width {100 * med:.1f}% of the prediction (target <= 20%)")
    lines.append(f"before issue 40, same rows: 'step time, all exposed' .. prediction held {exp_in}/{len(held)}; "
                 f"the engine / family error band (|error| <= its mean absolute error) held {old[0]}/{old[1]}")
    return {"covered": covered, "rows": len(out_rows), "median_width": med,
            "per_source": {k: {"covered": c, "rows": n} for k, (c, n) in per_source.items()},
            "text": "\n".join(lines)}


#: the per-engine / per-family mean absolute errors shipped before issue 40 (autotune/data/error_bands.yaml of
#: 2026-12-01), for the "before" coverage figure only
OLD_BANDS = {("megatron", "b200"): 11.4, ("megatron", "gb200"): 21.2, ("megatron", "h100"): 4.3,
             ("torchtitan", "h100"): 7.6, ("torchtitan", "h200"): 0.9}


def old_band_coverage(held: list[tuple[dict[str, Any], float]]) -> tuple[int, int]:
    """(rows whose held-out |error| is within the error band printed before issue 40, rows)."""
    n = sum(1 for x, e in held if abs(100 * e) <= OLD_BANDS.get((x["engine"], family(x["gpu"])), 0.0))
    return n, len(held)


def write_error_bands(rows: list[dict[str, Any]], cv: dict[str, Any] | None = None) -> None:
    """Per-engine (and per engine x hardware family) held-out error of the predicted rows
    (:func:`cross_validate`) into autotune/data/error_bands.yaml."""
    path = ROOT / "autotune" / "data" / "error_bands.yaml"
    doc = yaml.safe_load(path.read_text())
    held = cv["held_out"] if cv else [(x, x["err"]) for x in rows if x["err"] is not None]
    for engine in sorted({x["engine"] for x, _ in held}):
        errs = [e for x, e in held if x["engine"] == engine]
        if not errs:
            continue
        n, signed, mae, worst = _stats(errs)
        fams = {}
        for fam in sorted({family(x["gpu"]) for x, _ in held if x["engine"] == engine}):
            fe = [e for x, e in held if x["engine"] == engine and family(x["gpu"]) == fam]
            k, s_, a_, w_ = _stats(fe)
            fams[fam] = {"mean_abs_error_pct": round(a_, 1), "mean_signed_error_pct": round(s_, 1),
                         "worst_error_pct": round(w_, 1), "num_runs": k}
        doc["engines"][engine] = {"mean_abs_error_pct": round(mae, 1), "mean_signed_error_pct": round(signed, 1),
                                  "worst_error_pct": round(worst, 1), "num_runs": n,
                                  "quantity": "tokens/s per GPU",
                                  "against": "published runs, leave-one-source-out",
                                  "source": "bench/published.py --cross-validate",
                                  "date": datetime.date.today().isoformat(), "by_gpu": fams}
    if cv:
        from autotune.spec.trust import MIN_REGIME_ROWS, QUANTILES, regime_table

        table = regime_table((e, row_regimes(x)) for x, e in held)
        rnd = lambda v: round(float(v), 4)  # noqa: E731
        doc["interval"] = {
            "quantity": "residual r = predicted / published tokens/s per GPU - 1 (fractions), leave-one-source-out",
            "quantiles": list(QUANTILES), "min_regime_rows": MIN_REGIME_ROWS,
            "pooled": {k: (rnd(v) if k != "num_runs" else v) for k, v in table["pooled"].items()},
            "regimes": {g: {k: (rnd(v) if k != "num_runs" else v) for k, v in e.items()}
                        for g, e in table["regimes"].items()},
            "coverage": {"covered": cv["coverage"]["covered"], "rows": cv["coverage"]["rows"],
                         "median_width": rnd(cv["coverage"]["median_width"]),
                         "how": "each source's rows tested against the interval built without that source"},
            "source": "bench/published.py --write-error-bands", "date": datetime.date.today().isoformat(),
            "rows": [{"source": x["group"], "model": x["run"]["model"], "gpu": x["gpu"], "gpus": x["run"]["gpus"],
                      "precision": x["run"].get("precision", "bf16"), "residual": rnd(e), "regimes": row_regimes(x)}
                     for x, e in held],
        }
    head = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
    path.write_text(head + yaml.safe_dump(doc, sort_keys=False))
    print(f"wrote {path.relative_to(ROOT)}")


def _plain_plan(plan: Plan) -> dict[str, Any]:
    """``plan.to_dict()`` with plain YAML types (tuples as lists)."""
    from autotune.files import plain

    return plain(plan.to_dict())


def write_frontier(runs_path: Path, moe_path: Path | None, rows: list[dict[str, Any]] | None = None) -> None:
    """The best published run per (GPU family, precision class, model class) into
    autotune/data/published_frontier.yaml, with its source, so that the CLI's frontier check
    (:func:`autotune.spec.trust.frontier_for`) does not read shared/. Dense: model TFLOP/s per GPU in the
    causal convention (tokens/s x :func:`model_flops_per_token` with causal attention; the Llama 3 paper's
    tokens/s from its PaLM-convention TFLOP/s as above); only catalog GPUs (not the 500 W H100 variant).
    MoE: the TFLOP/s the source publishes (Megatron-Bridge's count, causal attention)."""
    from autotune.spec.trust import precision_class

    best: dict[tuple[str, str, str], dict[str, Any]] = {}

    def offer(e: dict[str, Any]) -> None:
        k = (e["gpu"], e["precision_class"], e["model_class"])
        if k not in best or e["tflops_per_gpu"] > best[k]["tflops_per_gpu"]:
            best[k] = e

    data = load_runs(runs_path)
    for group, g in data.items():
        _, _, ggpu = GROUPS[group]
        for run in g["runs"]:
            rgpu = run.get("gpu") or ggpu
            if family(rgpu) != rgpu:
                continue
            model = get_model(run["model"].split("-")[-1])
            tps = run.get("tokens_per_s_per_gpu")
            if tps is None:
                tps = run["tflops_per_gpu"] * 1e12 / model_flops_per_token(model, run["seq"], causal=False)
            tfl = tps * model_flops_per_token(model, run["seq"], causal=True) / 1e12
            plan = f"tp {run.get('tp', 1)} pp {run.get('pp', 1)} cp {run.get('cp', 1)}" + \
                (f" vp {run['vp']}" if run.get("vp") else "") + f", seq {run['seq']}, {run['dp_mode']}"
            offer({"gpu": rgpu, "precision_class": precision_class(run.get("precision", "bf16")), "model_class": "dense",
                   "model": run["model"], "num_gpus": run["gpus"], "tokens_per_s_per_gpu": round(tps, 1),
                   "tflops_per_gpu": round(tfl, 1), "plan": plan, "source": g["source"]})
    if moe_path is not None and moe_path.is_file():
        moe = yaml.safe_load(moe_path.read_text())
        for run in moe.get("runs") or ():
            prec = {"fp8_cs": "fp8_tensorwise"}.get(run.get("precision"), run.get("precision", "bf16"))
            plan = f"tp {run.get('tp', 1)} pp {run.get('pp', 1)} ep {run.get('ep', 1)}" + \
                (f" vp {run['vp']}" if run.get("vp") else "") + f", seq {run['seq']}"
            offer({"gpu": run["gpu"], "precision_class": precision_class(prec), "model_class": "moe",
                   "model": run["model"], "num_gpus": run["gpus"],
                   "tokens_per_s_per_gpu": run.get("tokens_per_s_per_gpu"), "tflops_per_gpu": float(run["tflops_per_gpu"]),
                   "plan": plan, "source": f"{run['source']} ({run['id']})"})
    # the published plans, per (model, GPU family, precision class): the fastest published run's plan as this
    # bench predicts it (plan_for / predict), the baseline `autotune run` attributes its gains against
    plans: dict[tuple[str, str, str], dict[str, Any]] = {}
    for x in rows or ():
        if x["err"] is None or family(x["gpu"]) != x["gpu"]:
            continue
        k = (x["run"]["model"], x["gpu"], precision_class(x["run"].get("precision", "bf16")), x["engine"])
        if k not in plans or x["published"] > plans[k]["tokens_per_s_per_gpu"]:
            plans[k] = {"model": x["run"]["model"], "gpu": x["gpu"], "precision_class": k[2], "engine": x["engine"],
                        "num_gpus": x["run"]["gpus"], "tokens_per_s_per_gpu": round(x["published"], 1),
                        "source": data[x["group"]]["source"], "plan": _plain_plan(x["plan"])}
    path = ROOT / "autotune" / "data" / "published_frontier.yaml"
    head = ("# The best published training run per (GPU family, precision class, model class): the frontier a\n"
            "# prediction is checked against (autotune/spec/trust.py frontier_for). Written by\n"
            "# `python bench/published.py --write-error-bands` from shared/reference/published-runs.yaml and\n"
            "# published-moe-runs.yaml; figures are the sources', nothing here was measured by this project.\n"
            "# tflops_per_gpu: dense = tokens/s x model FLOPs per token, causal attention (autotune.cost.flops);\n"
            "# moe = as the source publishes it (Megatron-Bridge, causal attention). precision_class: bf16 | fp8\n"
            "# (tensorwise / rowwise / delayed scaling) | mxfp8.\n")
    doc = {"schema_version": 1, "date": datetime.date.today().isoformat(),
           "frontier": [best[k] for k in sorted(best)], "published_plans": [plans[k] for k in sorted(plans)]}
    path.write_text(head + yaml.safe_dump(doc, sort_keys=False))
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
