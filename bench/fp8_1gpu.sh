#!/usr/bin/env bash
# One-H200 FP8/compile session of issue 15 (run on the GPU host from the project root; OUT = result dir):
# the plain FSDP2 + compile + float8 script, then `autotune run --backend real` over
# bench/space-1gpu-fp8.yaml (8 plans), export of the best plan, `autotune validate` of it, the trial table.
set -u
OUT=${OUT:-docs/results/fp8-1gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor-cache}
T="--size 8b --gpu h200 --gpus 1 --seq-len 8192 --global-batch 16K --space bench/space-1gpu-fp8.yaml --backend real"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.txt" 2>&1
python3 -c "import torch, torchao; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'torchao', torchao.__version__)" >> "$OUT/nvidia-smi.txt" 2>&1
echo "== plain script"; timeout ${PLAIN_TIMEOUT:-170} python3 bench/plain_fsdp2_fp8.py --json "$OUT/plain.json" > "$OUT/plain.log" 2>&1; tail -2 "$OUT/plain.log"
echo "== autotune run"; timeout ${RUN_TIMEOUT:-560} python3 -m autotune run $T --layers 16 --trials ${TRIALS:-8} --seed 0 \
  --trial-timeout ${TRIAL_TIMEOUT:-110} > "$OUT/run.log" 2>&1; tail -40 "$OUT/run.log"
python3 bench/dump_trials.py --json "$OUT/trials.json" | tee "$OUT/trials.txt"
python3 -m autotune export $T -o "$OUT/best.yaml" > "$OUT/export.log" 2>&1 || tail -3 "$OUT/export.log"
echo "== validate"; timeout ${VALIDATE_TIMEOUT:-150} python3 -m autotune validate "$OUT/best.yaml" --layers 16 \
  --json "$OUT/validate.json" > "$OUT/validate.log" 2>&1; tail -30 "$OUT/validate.log"
