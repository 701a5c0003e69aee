#!/usr/bin/env bash
# On the GPU machine (device tool, carry .whl): the cuda test cases, the host time per
# instruction on cuda, and the fp32 convolution networks; everything logged under $1.
out="${1:?usage: h200_check.sh OUTDIR}"
source scripts/device_env.sh || exit 1
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv > "$out/gpu.txt" 2>&1
AOTRT_TEST_TIMEOUT=300 bash scripts/cuda_tests_parallel.sh "$out/tests" > "$out/tests.txt" 2>&1
tail -n 40 "$out"/tests/*.log | grep -E "FAILED|ERROR|Error" | head -40 > "$out/failures.txt"
for h in "" --hazards; do
    python3 bench/bench_host.py --device cuda --iters 100 $h >> "$out/host.txt" 2>&1
    python3 bench/bench_host.py --device cpu --iters 100 $h >> "$out/host.txt" 2>&1
done
timeout 240 python3 bench/bench_cliffs.py > "$out/cliffs.md" 2>&1
