#!/usr/bin/env bash
# Issue 23, item 2: `autotune run --backend real --engine megatron` on one H200 (a few trials chosen by the
# simulator's screen), export of the best, `validate --engine megatron` of the export. Run from the project
# root on the GPU host with ../.whl (optuna, ...) and ../.mg (megatron-src.tar.gz = NVIDIA/Megatron-LM
# d98e8a64, einops and pybind11 wheels) beside it. Transformer Engine is not installed there: the runner
# uses --transformer-impl local (BF16) and says so.
set -u
OUT=${OUT:-/tmp/mg-out}; mkdir -p "$OUT"
MG=/tmp/mgsrc; mkdir -p $MG && tar -xzf ../.mg/megatron-src.tar.gz -C $MG
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  ../.whl/*.whl ../.mg/*.whl 2>&1 | grep -v "^$" | tail -3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 AUTOTUNE_MEGATRON_LM=$MG NCCL_NVLS_ENABLE=0
H="$OUT/header.txt"
{
  echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "megatron-lm: NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22), megatron-core 0.20.0"
  python3 -W ignore -c "import sys, torch, optuna, einops; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version()); print('optuna', optuna.__version__, 'einops', einops.__version__)" 2>&1
  python3 -c "import transformer_engine" 2>&1 | tail -1
  echo "autotune: commit ${AUTOTUNE_COMMIT:-unknown} (set AUTOTUNE_COMMIT=\$(git rev-parse --short HEAD) when starting)"
} > "$H" 2>&1
cat "$H"
DB=sqlite:////tmp/mg.db
CMD=(python3 -m autotune run --backend real --engine megatron --size 8b --gpu h200 --layers 16 --gpus 1
     --global-batch 16K --trials ${TRIALS:-3} --real-steps 5 --trial-timeout 150 --storage $DB --engine-logs /tmp/mglogs)
echo "\$ ${CMD[*]}" | tee "$OUT/run.txt"
s=$(date +%s); "${CMD[@]}" >> "$OUT/run.txt" 2>&1; echo "rc $? after $(( $(date +%s) - s )) s" >> "$OUT/run.txt"
tail -40 "$OUT/run.txt"
STUDY=$(grep -o "export --study [^ ]*" "$OUT/run.txt" | head -1 | cut -d' ' -f3 | tr -d "'")
if [ -n "$STUDY" ]; then
  python3 -m autotune export --study "$STUDY" --storage $DB -o /tmp/plan.yaml > "$OUT/export.txt" 2>&1; cp /tmp/plan.yaml "$OUT/plan.yaml"
  VCMD=(python3 -m autotune validate --engine megatron --layers 16 --steps 5 --warmup 3 --timeout 150
        --engine-logs /tmp/mglogs/validate --json "$OUT/validate.json" /tmp/plan.yaml)
  echo "\$ ${VCMD[*]}" > "$OUT/validate.txt"
  s=$(date +%s); "${VCMD[@]}" >> "$OUT/validate.txt" 2>&1; echo "rc $? after $(( $(date +%s) - s )) s" >> "$OUT/validate.txt"
  cat "$OUT/validate.txt"
fi
python3 bench/engine_smoke/dump_study.py $DB "$OUT/trials.json" | tee "$OUT/table.txt"
tar -czf "$OUT/logs.tgz" -C /tmp mglogs
