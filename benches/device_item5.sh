#!/usr/bin/env bash
# Issue 24 item 5 on the GPU machine in one call: the host's disk and memory facts, the collector path vs
# cp (no server), the extraction job vs capture-only at the llama8b and kimi shapes (py-spy of the job
# process), and the job over 1, 2 and 4 real-model replicas on the one GPU.  Results land in $OUT.
# Usage (on the device, wheels carried in .whl): bash benches/device_item5.sh [facts,collector,kimi,llama8b,scaling]
set -u
PARTS=",${1:-facts,collector,kimi,llama8b,scaling},"
SAMPLES_KIMI=${SAMPLES_KIMI:-150}
SAMPLES_LLAMA=${SAMPLES_LLAMA:-240}
ROUNDS_KIMI=${ROUNDS_KIMI:-2}
ROUNDS_LLAMA=${ROUNDS_LLAMA:-1}
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SPY=$(command -v py-spy || true)
if [[ $PARTS == *,facts,* ]]; then
  {
    nproc; free -g; df -hT /tmp /dev/shm; mount | grep -E ' on (/|/tmp|/dev/shm) '
    grep -H . /proc/sys/vm/dirty_ratio /proc/sys/vm/dirty_background_ratio /proc/sys/vm/dirty_bytes \
      /proc/sys/vm/dirty_background_bytes /proc/sys/vm/dirty_expire_centisecs 2>/dev/null
    cat /sys/fs/cgroup/memory.max 2>/dev/null; lsblk -o NAME,SIZE,ROTA,TYPE,MOUNTPOINT 2>/dev/null | head -20
    for mb in 1024 4096; do
      sync; s=$(date +%s.%N); dd if=/dev/zero of=/tmp/dd.bin bs=4M count=$((mb / 4)) conv=fsync status=none
      e=$(date +%s.%N); echo "dd conv=fsync $mb MB: $(python3 -c "print(round($mb/($e-$s),1))") MB/s"; rm -f /tmp/dd.bin
    done
  } 2>&1 | tee "$OUT/facts.txt"
fi
for shape in kimi llama8b; do
  [[ $PARTS == *,$shape,* ]] || continue
  n=$SAMPLES_KIMI; rounds=$ROUNDS_KIMI; limit=115
  [[ $shape == llama8b ]] && n=$SAMPLES_LLAMA rounds=$ROUNDS_LLAMA limit=125
  echo "== extraction at the $shape shape, $n samples, $rounds rounds"
  timeout -s INT -k 10 $limit python3 benches/bench_extract.py --device cuda --only extraction --shape $shape --samples $n \
    --rounds $rounds --warmups 1 ${SPY:+--py-spy $SPY --py-spy-idle --py-spy-out $OUT/pyspy_$shape.raw} 2>&1 \
    | grep --line-buffered -v "Token indices" | tee "$OUT/extract_$shape.txt" | tail -16
done
if [[ $PARTS == *,scaling,* ]]; then
  echo "== one job over 1, 2, 4 real-model replicas on the one GPU"
  timeout -s INT -k 10 ${SCALING_LIMIT:-60} python3 benches/bench_extract_scaling.py --device cuda --servers 1,2,4 --samples ${SAMPLES_SCALING:-160} \
    --concurrency 16 --hidden-size ${SCALING_HIDDEN:-1024} --answer-words 40 2>&1 | tee "$OUT/scaling_cuda.txt" | tail -12
fi
if [[ $PARTS == *,collector,* ]]; then
  echo "== collector path vs cp, kimi shape"
  timeout -s INT -k 10 40 python3 benches/bench_extract.py --only collector --shape kimi --collector-samples 120 2>&1 \
    | tee "$OUT/collector_kimi.txt" | tail -8
fi
ps -eo pid,pgid,etimes,args | grep -E "emulator|extraction" | grep -v grep | tee "$OUT/leftovers.txt"
ls -la "$OUT"
