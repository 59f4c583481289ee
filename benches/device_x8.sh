#!/usr/bin/env bash
# Issue 17 on the device, in one call: TP8 rank r -> GPU r (10 GB each), memory freed on every GPU for
# TP1/2/4/8 placed with --base-gpu-id and CUDA_VISIBLE_DEVICES, and the GPU-busy check on real NVML.
# With fewer GPUs it runs what fits (one GPU: TP1 of each part) and the JSON lists what was skipped.
# Usage (on the device, from the repository root): bash benches/device_x8.sh [parts]
#   parts: mapping,release,busy (default all); wheels carried in .whl as for benches/device_run.sh
set -u
# NVLink multicast off in every process started from here (the servers and CLIs inherit this env).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
else
  export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv | tee "$OUT/nvidia-smi-x8.txt"
python3 -c 'import torch;print("torch",torch.__version__,"cuda",torch.cuda.is_available(),torch.cuda.device_count())'
timeout 540 python3 benches/gpu_x8.py --gb "${GB:-10}" --parts "${1:-mapping,release,busy}" \
  --out "$OUT/gpu_x8.json" 2>&1 | tee "$OUT/gpu_x8.txt" | grep -v '^  ' | tail -40
rc=${PIPESTATUS[0]}
nvidia-smi --query-gpu=index,memory.used --format=csv | tee "$OUT/nvidia-smi-x8-after.txt"
exit "$rc"
