#!/usr/bin/env bash
# The issue-23 acceptance run on one H200: 8 real torchtitan trials chosen by the simulator's screen,
# export of the best, validate of the export through torchtitan. Run from the project root on the GPU
# host with ../.whl (optuna, torchao, ...) and ../.whl-tt (torchtitan 0.2.2 and its imports) beside it.
set -u
OUT=${OUT:-/tmp/tt-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  ../.whl/*.whl ../.whl-tt/*.whl 2>&1 | grep -v "^$" | tail -3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HOME=/tmp/hf TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
H="$OUT/header.txt"
{
  echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  # -W ignore: an import warning (torchao's) prints its source line too, which grep -v Warning kept in the header
  python3 -W ignore -c "import sys, torch, torchao, torchtitan, optuna; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda); [print(m.__name__, m.__version__) for m in (torchao, torchtitan, optuna)]" 2>&1
  echo "autotune: issue-23 worktree, commit ${AUTOTUNE_COMMIT:-unknown}"
} > "$H" 2>&1
cat "$H"
DB=sqlite:////tmp/tt.db
CMD=(python3 -m autotune run --backend real --engine torchtitan --size 8b --gpu h200 --layers 16 --gpus 1
     --global-batch 16K --trials 8 --real-steps 5 --trial-timeout 150 --storage $DB --engine-logs /tmp/ttlogs)
echo "\$ ${CMD[*]}" | tee "$OUT/run.txt"
s=$(date +%s); "${CMD[@]}" >> "$OUT/run.txt" 2>&1; echo "rc $? after $(( $(date +%s) - s )) s" >> "$OUT/run.txt"
tail -30 "$OUT/run.txt"
STUDY=$(grep -o "export --study [^ ]*" "$OUT/run.txt" | head -1 | cut -d' ' -f3 | tr -d "'")
python3 -m autotune export --study "$STUDY" --storage $DB -o /tmp/plan.yaml > "$OUT/export.txt" 2>&1; cp /tmp/plan.yaml "$OUT/plan.yaml"
VCMD=(python3 -m autotune validate --engine torchtitan --layers 16 --steps 5 --warmup 3 --timeout 150
      --engine-logs /tmp/ttlogs/validate --json "$OUT/validate.json" /tmp/plan.yaml)
echo "\$ ${VCMD[*]}" > "$OUT/validate.txt"
s=$(date +%s); "${VCMD[@]}" >> "$OUT/validate.txt" 2>&1; echo "rc $? after $(( $(date +%s) - s )) s" >> "$OUT/validate.txt"
cat "$OUT/validate.txt"
python3 bench/engine_smoke/dump_study.py $DB "$OUT/trials.json" | tee "$OUT/table.txt"
tar -czf "$OUT/logs.tgz" -C /tmp ttlogs
