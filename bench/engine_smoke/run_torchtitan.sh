#!/usr/bin/env bash
# torchtitan's own trainer on one GPU from autotune-written job files, nothing downloaded (issue 23).
# Run from the project root on the GPU host; OUT = result folder. Needs, carried or installed:
#   .whl-tt/*.whl        torchtitan 0.2.2 and what its trainer imports that the H200 image lacks
#                        (tyro, docstring_parser, typeguard, typing_extensions, torchdata, datasets, dill,
#                        multiprocess, fsspec)
#   .whl-tt/v030/*.whl   torchtitan 0.3.0 (+ spmd_types, torch_checkpointing): only its import is tried
#   .whl/torchao-*.whl   torchao 0.17.0 (float8 converter)
#   .whl-tt/assets       tokenizer + dataset: python bench/engine_smoke/make_assets.py .whl-tt/assets
# Jobs: bench/engine_smoke/jobs/*.toml (bench/engine_smoke/make_jobs.py). VARIANTS selects and orders them.
set -u
OUT=${OUT:-docs/results/engines/run}
mkdir -p "$OUT"
BUDGET=${BUDGET:-450}           # seconds for all variants; one is started only with >= 60 s left
CAP=${CAP:-200}                 # seconds at most for one variant
VARIANTS=${VARIANTS:-"bf16-eager fp8rowwise-compile bf16-compile fp8tensorwise-compile"}
ASSETS=${ASSETS:-.whl-tt/assets}
T0=$(date +%s)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HOME=/tmp/hf \
  TORCHINDUCTOR_CACHE_DIR=/tmp/inductor NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl-tt/*.whl .whl/torchao-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site030 \
  .whl-tt/v030/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
H="$OUT/header.txt"
{
  echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, torch, torchao, torchtitan, datasets, tyro, torchdata, tokenizers, fsspec; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda); [print(m.__name__, m.__version__) for m in (torchao, torchtitan, datasets, tyro, tokenizers, fsspec)]; print('device', torch.cuda.get_device_name(0))"
  echo "--- torchtitan 0.3.0 under this torch: import torchtitan.train"
  PYTHONPATH=/tmp/site030:/tmp/site python3 -c "import torchtitan, torchtitan.train; print('ok', torchtitan.__version__)" 2>&1 | tail -2
} > "$H" 2>&1
cat "$H"
for v in $VARIANTS; do
  left=$(( BUDGET - ($(date +%s) - T0) ))
  if (( left > CAP )); then left=$CAP; fi
  if (( left < 60 )); then echo "== $v: skipped, ${left}s of the budget left" | tee -a "$H"; continue; fi
  cmd=(torchrun --standalone --nproc-per-node=1 -m torchtitan.train --job.config_file "bench/engine_smoke/jobs/$v.toml"
       --model.hf_assets_path "$ASSETS/tokenizer" --training.dataset_path "$ASSETS/c4_local" --job.dump_folder "/tmp/tt/$v")
  echo "== $v (limit ${left}s): ${cmd[*]}" | tee -a "$H"
  s=$(date +%s)
  timeout "$left" "${cmd[@]}" > "$OUT/$v.log" 2>&1
  echo "== $v: rc $? after $(( $(date +%s) - s ))s" | tee -a "$H"
  grep -E "step: |Error|error:" "$OUT/$v.log" | tail -4
done
python3 - "$OUT" $VARIANTS <<'EOF'
import json, sys
from pathlib import Path
from autotune.engines.torchtitan.log import parse_file
out, names = Path(sys.argv[1]), sys.argv[2:]
res = {n: parse_file(out / f"{n}.log") for n in names if (out / f"{n}.log").exists()}
(out / "summary.json").write_text(json.dumps(res, indent=1))
print(f"{'variant':24} {'steps':>5} {'step s':>7} {'tps':>7} {'TFLOP/s':>8} {'MFU %':>6} {'mem GiB':>8} {'loss':>7}")
for n, r in res.items():
    s, f = r["summary"], r["facts"]
    if not s:
        print(f"{n:24} no steps after warm-up (oom={f.get('oom')})"); continue
    tok = f.get("local_batch_size", 1) * f.get("seq_len", 8192) * f.get("grad_accum_steps", 1)
    mfu = "n/a" if s["mfu_pct"] is None else f"{s['mfu_pct']:.1f}"
    print(f"{n:24} {s['steps']:5d} {tok / s['tps']:7.3f} {s['tps']:7.0f} {s['tflops']:8.1f} {mfu:>6} "
          f"{s['memory_gib']:8.2f} {s['final_loss']:7.3f}")
EOF
