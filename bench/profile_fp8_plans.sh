#!/usr/bin/env bash
# One-H200 evidence for the FP8 / compile cost model (run on the GPU host from the project root, OUT =
# result dir): burst vs sustained GEMM throughput (bench/sustained_gemm.py), then one profiled step
# (torch.profiler, autotune.runtime.trace categories) of Llama 3.1 8B at 16 layers, seq 8192, two
# sequences, one GPU, for BF16 eager, FP8 tensorwise eager, FP8 tensorwise + compile and FP8 rowwise +
# compile; everything is gathered into $OUT/profile-fp8-plans.json.
set -u
OUT=${OUT:-docs/results/profile-fp8}
mkdir -p "$OUT" /tmp/pf
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
python3 bench/sustained_gemm.py --seconds ${SUSTAIN_S:-40} --json /tmp/pf/sustained.json
for v in bf16:false fp8_tensorwise:false fp8_tensorwise:true fp8_rowwise:true; do
  prec=${v%%:*}; comp=${v##*:}; tag=${prec}_compile-${comp}
  python3 - "$prec" "$comp" "/tmp/pf/$tag.yaml" <<'PY'
import sys
from autotune.spec.plan import PlanDocument
doc = PlanDocument.load("docs/results/fp8-1gpu-2026-12-01/best.yaml")
plan = doc.plan.replace(precision=sys.argv[1], compile=sys.argv[2] == "true", memory_reclaim="none")
PlanDocument(**{**doc.__dict__, "plan": plan}).save(sys.argv[3])
PY
  timeout 240 torchrun --standalone --nproc-per-node 1 -m autotune.runtime.worker --plan /tmp/pf/$tag.yaml \
    --layers 16 --steps 3 --warmup 2 --out /tmp/pf/$tag.result.json --profile-dir /tmp/pf/$tag > /tmp/pf/$tag.log 2>&1
  echo "$tag rc=$? $(python3 -c "import json; r=json.load(open('/tmp/pf/$tag.result.json')); print(round(r['step_time_ms'],1), 'ms', round(r['mfu']*100,1), '% MFU', round(max(r['peak_reserved_bytes'])/2**30,1), 'GiB reserved', round(max(r['peak_allocated_bytes'])/2**30,1), 'GiB allocated')" 2>&1 | tail -1)"
done
python3 - "$OUT/profile-fp8-plans.json" <<'PY'
import glob, json, os, sys
out = {"sustained": json.load(open("/tmp/pf/sustained.json")), "plans": {}}
for f in sorted(glob.glob("/tmp/pf/*.result.json")):
    tag = os.path.basename(f).split(".result")[0]
    prof = {}
    for p in glob.glob(f"/tmp/pf/{tag}/profile.rank*.json"):
        prof = json.load(open(p))
    out["plans"][tag] = {"result": json.load(open(f)), "profile": prof,
                         "log_tail": open(f"/tmp/pf/{tag}.log").read()[-3000:]}
json.dump(out, open(sys.argv[1], "w"), indent=1)
for tag, d in out["plans"].items():
    pr = d["profile"] or {}
    cats = dict(pr.get("by_category") or {}, wall=pr.get("wall_ms", 0), idle=pr.get("idle_ms", 0))
    print(tag, {k: round(v, 1) for k, v in cats.items()} if cats else list((d["profile"] or {}).keys())[:12])
PY
