#!/usr/bin/env bash
# Issue 39 on one H200: for one MoE model (qwen3-30b-a3b or deepseek-16b) truncated to 6 layers at seq 4096 and
# 16K tokens a step: torchtitan's shipped config (bench/engine_smoke/moe_shipped.py, first: it also checks that
# the job files launch), 8 real torchtitan trials chosen by the simulator's screen, export of the best and
# `validate --engine torchtitan` of that export. Run from the project root on the GPU host with .whl/ (optuna,
# torchao, torchtitan 0.2.2 and its imports). Everything lands in $OUT/<model>.tgz; the table is printed last.
set -u
M=${1:?model}; LAYERS=${LAYERS:-6}; BUDGET_S=${BUDGET_S:-540}
T0=$(date +%s)
left() { local l=$(( BUDGET_S - ($(date +%s) - T0) )); echo $(( l > 1 ? l : 1 )); }
TRIAL_TIMEOUT=${TRIAL_TIMEOUT:-150}; TRIALS=${TRIALS:-8}; SHIPPED=${SHIPPED:-1}; RUN_SLACK=${RUN_SLACK:-100}
W=/tmp/moe-$M; mkdir -p "$W"
if [ ! -d /tmp/site/torchtitan ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    2>&1 | grep -v "^$" | tail -3
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HOME=/tmp/hf TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
{
  echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -W ignore -c "import sys, torch, torchao, torchtitan, optuna; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda); [print(m.__name__, m.__version__) for m in (torchao, torchtitan, optuna)]" 2>&1
  echo "autotune: ttmoe worktree, commit ${AUTOTUNE_COMMIT:-unknown}"
} > "$W/header.txt" 2>&1
cat "$W/header.txt"
pack() { python3 bench/engine_smoke/dump_study.py "sqlite:///$W/study.db" "$W/trials.json" > "$W/table.txt" 2>&1
         tar -czf "$OUT/$M.tgz" -C /tmp "moe-$M"; cat "$W/shipped.txt" "$W/table.txt" 2>/dev/null; grep -h "step time\|simulated" "$W/validate.txt" 2>/dev/null; }
trap pack EXIT
if [ "$SHIPPED" = 1 ]; then
echo "== shipped ($(left) s left)"
python3 bench/engine_smoke/moe_shipped.py --model "$M" --layers "$LAYERS" --steps 5 --warmup 3 --timeout 200 \
  --engine-logs "$W/logs/shipped" --json "$W/shipped.json" > "$W/shipped.txt" 2>&1
rc=$?; tail -3 "$W/shipped.txt"
if [ $rc -ne 0 ]; then echo "shipped run failed (rc $rc): stopping"; tail -40 "$W"/logs/shipped/*.log 2>/dev/null | tail -60; exit 1; fi
fi
echo "== run ($(left) s left)"
CMD=(python3 -m autotune run --backend real --engine torchtitan --model "$M" --gpu h200 --layers "$LAYERS" --gpus 1
     --seq-len 4096 --global-batch 16K --trials "$TRIALS" --real-steps 5 --trial-timeout "$TRIAL_TIMEOUT" --timeout $(( $(left) > RUN_SLACK + 60 ? $(left) - RUN_SLACK : 60 ))
     --no-early-stop --storage "sqlite:///$W/study.db" --engine-logs "$W/logs")
echo "\$ ${CMD[*]}" > "$W/run.txt"
s=$(date +%s); "${CMD[@]}" >> "$W/run.txt" 2>&1; echo "rc $? after $(( $(date +%s) - s )) s" >> "$W/run.txt"
grep -E "kept:|screen|trial|rc " "$W/run.txt" | tail -25
STUDY=$(grep -o "export --study [^ ]*" "$W/run.txt" | head -1 | cut -d' ' -f3 | tr -d "'")
python3 -m autotune export --study "$STUDY" --storage "sqlite:///$W/study.db" -o "$W/plan.yaml" > "$W/export.txt" 2>&1
if [ "$(left)" -gt 75 ] && [ -s "$W/plan.yaml" ]; then
  echo "== validate ($(left) s left)"
  VCMD=(python3 -m autotune validate --engine torchtitan --layers "$LAYERS" --steps 5 --warmup 3 --timeout $(( $(left) - 10 ))
        --engine-logs "$W/logs/validate" --json "$W/validate.json" "$W/plan.yaml")
  echo "\$ ${VCMD[*]}" > "$W/validate.txt"
  s=$(date +%s); "${VCMD[@]}" >> "$W/validate.txt" 2>&1; echo "rc $? after $(( $(date +%s) - s )) s" >> "$W/validate.txt"
else
  echo "no time left for validate ($(left) s)" | tee "$W/validate.txt"
fi
