#!/usr/bin/env bash
# The GPU-machine runs for the closing notes, in one call (device time is scarce): NVML memory release on
# stop, the TUI on real NVML next to nvitop, and extraction on the GPU. Results land in $OUT.
# Usage (on the device): bash benches/device_run.sh [release,tui,extract]   (default: all three; wheels
# carried in .whl, see README "GPU runs")
set -u
PARTS=",${1:-release,tui,extract},"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/nvitop .whl/nvitop/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
export PATH=/tmp/site/bin:$PATH
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/nvidia-smi.txt"
python3 -c 'import torch;print("torch",torch.__version__,"cuda",torch.cuda.is_available(),torch.cuda.device_count())'
if [[ $PARTS == *,release,* ]]; then
  echo "== memory release"
  timeout 200 python3 benches/gpu_memory_release.py --tp 1,2,4,8 --gb 10 --out "$OUT/gpu_release.json" 2>&1 | tail -40
fi
if [[ $PARTS == *,tui,* ]]; then
  echo "== tui vs nvitop"
  timeout 240 python3 benches/gpu_tui_vs_nvitop.py --out "$OUT" --nvitop-path /tmp/nvitop --seconds 60 2>&1 | tail -40
fi
if [[ $PARTS == *,extract,* ]]; then
  echo "== extraction: client dispatch, collector vs cp (dumps in /dev/shm, output on local disk), GPU extraction"
  timeout 300 python3 benches/bench_extract.py --device cuda --samples 2000 --rounds 3 2>&1 \
    | tee "$OUT/gpu_extract.txt" | tail -30
  echo "== extraction, longer samples on a wider model (H=1024, 16 layers, ~500 tokens/sample)"
  timeout 240 python3 benches/bench_extract.py --device cuda --only extraction --samples 600 --rounds 3 \
    --hidden-size 1024 --layers 16 --answer-words 150 2>&1 | tee "$OUT/gpu_extract_long.txt" | tail -12
  for shape in llama8b kimi; do  # issue 24 item 5: H=4096/16 layers/~1,000 tokens; H=7168/8 layers/522 tokens
    echo "== extraction at the $shape shape (full-width demo model on the GPU; disk durable rate by dd)"
    timeout 420 python3 benches/bench_extract.py --device cuda --only extraction --shape $shape --samples 600 \
      --rounds 3 2>&1 | tee "$OUT/gpu_extract_$shape.txt" | tail -14
  done
fi
ls -la "$OUT"
