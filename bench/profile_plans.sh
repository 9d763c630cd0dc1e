#!/usr/bin/env bash
# One-H200 evidence for the compute cost model: one profiled training step (torch.profiler,
# autotune.runtime.trace categories) of Llama 3.1 8B at 16 layers, seq 8192, one GPU, per variant
# "precision:compile:recompute:micro_batch_size" (VARIANTS, space-separated), derived from the 1-GPU FP8
# study's plan (docs/results/fp8-1gpu-2026-12-01/best.yaml) with expandable segments. Run on the GPU
# host from the project root; everything is gathered into $OUT/profile-plans.json.
set -u
OUT=${OUT:-docs/results/profile-plans}
VARIANTS=${VARIANTS:-"bf16:false:none:2 bf16:true:none:2 bf16:false:selective:2 bf16:true:selective:2"}
mkdir -p "$OUT" /tmp/pp
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
for v in $VARIANTS; do
  IFS=: read -r prec comp rc mbs <<<"$v"; tag=${prec}_compile-${comp}_rc-${rc}_mbs-${mbs}
  python3 - "$prec" "$comp" "$rc" "$mbs" "/tmp/pp/$tag.yaml" <<'PY'
import sys
from autotune.spec.plan import PlanDocument, Workload
doc = PlanDocument.load("docs/results/fp8-1gpu-2026-12-01/best.yaml")
mbs = int(sys.argv[4])
plan = doc.plan.replace(precision=sys.argv[1], compile=sys.argv[2] == "true", recompute=sys.argv[3],
                        micro_batch_size=mbs, memory_reclaim="expandable_segments")
PlanDocument(**{**doc.__dict__, "plan": plan,
                "workload": Workload(seq_len=doc.workload.seq_len, global_batch_size=mbs)}).save(sys.argv[5])
PY
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 200 torchrun --standalone --nproc-per-node 1 -m autotune.runtime.worker --plan /tmp/pp/$tag.yaml \
    --layers 16 --steps 3 --warmup 2 --out /tmp/pp/$tag.result.json --profile-dir /tmp/pp/$tag > /tmp/pp/$tag.log 2>&1
  rc=$?; mkdir -p "$OUT/raw/$tag"; cp /tmp/pp/$tag.result.json /tmp/pp/$tag.log "$OUT/raw/" 2>/dev/null
  cp /tmp/pp/$tag/profile.rank*.json "$OUT/raw/$tag/" 2>/dev/null
  echo "$tag rc=$rc $(python3 -c "import json; r=json.load(open('/tmp/pp/$tag.result.json')); print(round(r['step_time_ms'],1), 'ms', round(r['mfu']*100,1), '% MFU', round(max(r['peak_reserved_bytes'])/2**30,1), 'GiB reserved', round(max(r['peak_allocated_bytes'])/2**30,1), 'GiB allocated')" 2>&1 | tail -1)"
done
python3 - "$OUT/profile-plans.json" <<'PY'
import glob, json, os, sys
out = {"plans": {}}
for f in sorted(glob.glob("/tmp/pp/*.result.json")):
    tag = os.path.basename(f).split(".result")[0]
    prof = {}
    for p in glob.glob(f"/tmp/pp/{tag}/profile.rank*.json"):
        prof = json.load(open(p))
    out["plans"][tag] = {"result": json.load(open(f)), "profile": prof,
                         "log_tail": open(f"/tmp/pp/{tag}.log").read()[-3000:]}
json.dump(out, open(sys.argv[1], "w"), indent=1)
for tag, d in out["plans"].items():
    pr = d["profile"] or {}
    cats = dict(pr.get("by_category") or {}, wall=pr.get("wall_ms", 0), idle=pr.get("idle_ms", 0))
    print(tag, {k: round(v, 1) for k, v in cats.items()})
PY
