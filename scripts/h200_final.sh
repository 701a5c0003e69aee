#!/usr/bin/env bash
# On the GPU machine (device tool, carry .whl): the changed cuda tests, the cuDNN execute
# probe and a dtype probe side by side, then bench.py over the six models, alone on the GPU.
#
#   bash scripts/h200_final.sh $OUT/f
out="${1:?usage: h200_final.sh OUTDIR}"
source scripts/device_env.sh || exit 1
mkdir -p "$out"
t() { timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short -rfE -k cuda "$@"; }
(t tests/runtime/ops/test_pool.py tests/runtime/devices/test_cuda.py \
    tests/runtime/ops/test_cuda_sources.py > "$out/tests1.log" 2>&1) &
(t tests/runtime/ops/test_mm.py tests/exporter/test_layout.py \
    tests/exporter/rules/test_library.py > "$out/tests2.log" 2>&1) &
(timeout 60 python3 scripts/cudnn_execute_probe.py > "$out/probe.txt" 2>&1;
 timeout 80 python3 scripts/dtype_probe.py levit_128s > "$out/dtype.txt" 2>&1) &
wait
for f in "$out"/tests1.log "$out"/tests2.log; do
    echo "== $f"; tail -2 "$f"; grep -E "^(FAILED|ERROR)" "$f" | cut -c1-200 | head -12
done
echo "== probe"; grep -v Warn "$out/probe.txt" | tail -8
echo "== dtype"; grep -v Warn "$out/dtype.txt" | grep -v "next(self" | tail -30
uptime
timeout 320 python3 bench/bench.py --out "$out/bench.json" --budget 300 --iters 20 2>&1 \
    | grep -v Warning | grep -v "return cls" > "$out/bench.log"
tail -8 "$out/bench.log"
