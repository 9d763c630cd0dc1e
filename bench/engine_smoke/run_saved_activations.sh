#!/usr/bin/env bash
# Issue 23, item 1: torchtitan's block's saved bytes on the GPU host (bench/torchtitan_saved_activations.py),
# and what the host has for building Transformer Engine from source (nvcc, CUDA headers, cuDNN).
# Run from the project root on the GPU host with ../.whl (torchao, ...) and ../.whl-tt (torchtitan 0.2.2).
set -u
OUT=${OUT:-/tmp/sa-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  ../.whl/*.whl ../.whl-tt/*.whl 2>&1 | grep -v "^$" | tail -3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor NCCL_NVLS_ENABLE=0
T="$OUT/te-build-check.txt"
{
  echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
  for x in nvcc cmake ninja g++ gcc make git; do printf '%-6s ' "$x"; command -v $x || echo "NOT FOUND"; done
  nvcc --version 2>&1 | tail -2
  echo "CUDA_HOME=${CUDA_HOME:-unset}"; ls -d /usr/local/cuda* 2>&1
  echo "-- headers / libraries (find under /usr /opt /usr/local and the Python site-packages)"
  for f in cuda_runtime.h cublas_v2.h cudnn.h cudnn_version.h nccl.h; do
    printf '%-18s ' "$f"; find /usr /opt /usr/local $(python3 -c 'import site; print(" ".join(site.getsitepackages()))') \
      -name "$f" 2>/dev/null | head -2 | tr '\n' ' '; echo; done
  for f in 'libcudnn.so*' 'libcudart.so*' 'libnvrtc.so*' 'libcublas.so*'; do
    printf '%-18s ' "$f"; find /usr /opt $(python3 -c 'import site; print(" ".join(site.getsitepackages()))') \
      -name "$f" 2>/dev/null | head -2 | tr '\n' ' '; echo; done
  python3 -m pip list 2>/dev/null | grep -i -E "nvidia|cudnn|transformer|apex|flash" 
  python3 -c "import transformer_engine" 2>&1 | tail -1
} > "$T" 2>&1
cat "$T"
python3 bench/torchtitan_saved_activations.py --budget-s ${BUDGET_S:-330} --out "$OUT/torchtitan-saved-activations.json" \
  2>&1 | grep -v -E "Warning|warn\(" | tee "$OUT/torchtitan-saved-activations.log" | tail -20
