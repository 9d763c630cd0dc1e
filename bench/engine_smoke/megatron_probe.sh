#!/usr/bin/env bash
# Can Megatron-LM's pretrain_gpt.py train on one H200 with what installs there (issue 23)?
# BF16, --transformer-impl local (Transformer Engine has no binary wheel), mock data, NullTokenizer:
# nothing downloaded. Run from the project root on the GPU host (carried: .mg = megatron-src.tar.gz,
# the Megatron-LM tree at d98e8a64 (megatron/, pretrain_gpt.py, gpt_builders.py, model_provider.py),
# and pybind11 / einops wheels). OUT = result folder. Two runs: a tiny model (does the software path
# work at all), then Llama 3.1 8B widths at 16 layers, seq 8192, global batch 2 (the torchtitan shape).
set -u
OUT=${OUT:-/tmp/mg-out}; mkdir -p "$OUT"
L="$OUT/megatron-probe.log"
MG=/tmp/mgsrc; mkdir -p $MG && tar -xzf ../.mg/megatron-src.tar.gz -C $MG
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/mgsite ../.mg/*.whl 2>&1 | tail -2
export PYTHONPATH=$MG:/tmp/mgsite PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 CUDA_DEVICE_MAX_CONNECTIONS=1
{
  echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "megatron-lm: NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22)"
  python3 - <<'PY'
import importlib, sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
for m in ("transformer_engine", "apex", "einops", "pybind11", "megatron.core", "flash_attn", "nvidia_resiliency_ext"):
    try:
        mod = importlib.import_module(m); print("import", m, "ok", getattr(mod, "__version__", ""))
    except Exception as e:
        print("import", m, "FAILED:", type(e).__name__, str(e).splitlines()[0][:200])
PY
  which g++ make || echo "no g++/make on PATH"
} > "$L" 2>&1
cat "$L"
COMMON=(--bf16 --transformer-impl local --mock-data --tokenizer-type NullTokenizer --normalization RMSNorm --swiglu
  --position-embedding-type rope --untie-embeddings-and-output-weights --disable-bias-linear
  --no-gradient-accumulation-fusion --no-masked-softmax-fusion --no-bias-swiglu-fusion --no-bias-dropout-fusion
  --no-rope-fusion --no-persist-layer-norm --attention-dropout 0 --hidden-dropout 0 --lr 1e-4 --min-lr 1e-5
  --lr-decay-style constant --weight-decay 0.1 --clip-grad 1.0 --log-interval 1 --eval-iters 0 --eval-interval 1000
  --log-throughput --log-memory-to-tensorboard --distributed-timeout-minutes 5)
run() {  # name limit args...
  local name=$1 lim=$2; shift 2
  echo "== $name (limit ${lim}s)" | tee -a "$L"; local s=$(date +%s)
  timeout "$lim" torchrun --standalone --nproc-per-node=1 $MG/pretrain_gpt.py "${COMMON[@]}" "$@" > "$OUT/megatron-$name.log" 2>&1
  echo "== $name: rc $? after $(( $(date +%s) - s ))s" | tee -a "$L"
  grep -E "iteration +[0-9]+/|Error|error|Traceback" "$OUT/megatron-$name.log" | tail -6 | tee -a "$L"
}
run tiny 100 --num-layers 2 --hidden-size 512 --ffn-hidden-size 1536 --num-attention-heads 8 --group-query-attention \
  --num-query-groups 2 --seq-length 1024 --max-position-embeddings 1024 --vocab-size 32000 --micro-batch-size 1 \
  --global-batch-size 2 --train-iters 6
if grep -q "iteration *6/" "$OUT/megatron-tiny.log"; then
  run 8b-l16 150 --num-layers 16 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 \
    --group-query-attention --num-query-groups 8 --seq-length 8192 --max-position-embeddings 8192 --vocab-size 128256 \
    --rotary-base 500000 --micro-batch-size 1 --global-batch-size 2 --train-iters 10 --recompute-granularity selective
fi
