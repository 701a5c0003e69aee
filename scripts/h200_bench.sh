#!/usr/bin/env bash
# On the GPU machine (device tool, carry .whl): cuda tests of the files named in $2, host
# profiles of the runs named in $3 ("model[:graph]" words), GPU kernel profiles of the models
# named in $5, then bench.py over the six models with every runner, alone on the GPU, within
# $4 seconds. Logs under $1.
#
#   bash scripts/h200_bench.sh $OUT/b "tests/runtime/backends/cuda/test_device.py" \
#       "resnet50_b1:graph whisper_tiny_encoder" 420 "stem_b32 resnet50_b32"
#
# bench.py splits $4 evenly over the models left after the exports (about 36 s): give the
# six models 360 s or more. With 330 s, BERT's reduce-overhead runner did not finish inside
# its 54 s share (session 20); with 360 s it did (session 19). $6: timed runs per runner
# (default 30; the median of 30 sub-millisecond replays moved by 0.1 ms between runs).
out="${1:?usage: h200_bench.sh OUTDIR TEST_FILES PROFILES SECONDS}"
source scripts/device_env.sh || exit 1
mkdir -p "$out"
s="$out/summary.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$s" 2>&1
flt() { grep -v Warn | grep -v "return cls" | grep -iv ultralytics; }
if [ -n "${2:-}" ]; then
    timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rfE -k cuda $2 \
        > "$out/tests.log" 2>&1
    { echo "== tests"; tail -1 "$out/tests.log"; grep -E "^(FAILED|ERROR)" "$out/tests.log" \
        | cut -c1-220 | head -20; } >> "$s"
fi
for p in ${3:-}; do
    m="${p%%:*}"; g=""; [ "$p" != "$m" ] && g="--graph"
    echo "== host profile: $m $g" >> "$s"
    timeout 90 python3 scripts/cuda_host_profile.py "$m" $g --iters 60 2>&1 | flt \
        | head -${HOST_PROFILE_LINES:-34} >> "$s"
done
for m in ${5:-}; do
    echo "== gpu profile: $m" >> "$s"
    timeout 120 python3 scripts/cuda_profile.py "$m" 2>&1 | flt | grep -v "strides \[" \
        | head -36 >> "$s"
done
secs="${4:-420}"
timeout $((secs + 20)) python3 bench/bench.py --out "$out/bench.json" --budget "$secs" \
    --iters "${6:-30}" 2>&1 | flt > "$out/bench.log"
tail -12 "$out/bench.log" >> "$s"
cat "$s"
