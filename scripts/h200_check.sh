#!/usr/bin/env bash
# On the GPU machine (device tool, carry .whl): one call that checks and measures what the
# cuda issues need, logging everything under $1 (keep it within the 8 files that come back:
# the summaries are concatenated into $1/summary.txt).
#
#   bash scripts/h200_check.sh $OUT/r [quick|full]
#
# quick: the cuda test cases, the layout check of ResNet-50 (how many convolutions write
# NHWC) and its profile, the host time per instruction. full adds the benchmark against
# torch eager / torch.compile / reduce-overhead and the module suite on cuda.
out="${1:?usage: h200_check.sh OUTDIR [quick|full]}"
mode="${2:-quick}"
source scripts/device_env.sh || exit 1
mkdir -p "$out"
s="$out/summary.txt"
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv > "$s" 2>&1
AOTRT_TEST_TIMEOUT=300 bash scripts/cuda_tests_parallel.sh "$out/tests" >> "$s" 2>&1
grep -hE "^(FAILED|ERROR)" "$out"/tests/*.log | head -40 >> "$s"
timeout 120 python3 scripts/cuda_profile.py resnet50_b32 auto --no-compile 2>&1 \
    | grep -v Warn | grep -v "return cls" > "$out/profile_resnet50_b32.txt"
head -20 "$out/profile_resnet50_b32.txt" >> "$s"
for h in "" --hazards; do
    python3 bench/bench_host.py --device cuda --iters 100 $h >> "$s" 2>&1
done
if [ "$mode" = full ]; then
    python3 bench/bench.py --out "$out/bench.json" --budget 390 --iters 30 2>&1 \
        | grep -v Warning | grep -v "return cls" | tail -12 >> "$s"
    timeout 280 python3 -m pytest -q -p no:cacheprovider -x tests/exporter/test_modules.py \
        -k cuda 2>&1 | tail -15 >> "$s"
fi
cat "$s"
