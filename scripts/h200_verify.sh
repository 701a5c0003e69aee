#!/usr/bin/env bash
# On the GPU machine (device tool, carry .whl): a session's first, short call. The GPU alone
# first: host time of graph runs (cProfile) and GPU time per kernel of named models; then the
# cuda tests of files named in $2 beside a fp16 zoo recheck of models named in $3.
#
#   bash scripts/h200_verify.sh $OUT/v "tests/runtime/ops/test_conv.py ..." "levit,levit_128s"
out="${1:?usage: h200_verify.sh OUTDIR TEST_FILES ZOO_MODELS}"
source scripts/device_env.sh || exit 1
mkdir -p "$out"
s="$out/summary.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$s" 2>&1
flt() { grep -v Warn | grep -v "return cls" | grep -iv ultralytics; }
for m in resnet50_b1 whisper_tiny_encoder; do
    echo "== host profile, graph: $m" >> "$s"
    timeout 90 python3 scripts/cuda_host_profile.py "$m" --graph --iters 100 2>&1 | flt \
        | head -60 >> "$s"
done
for m in whisper_tiny_encoder gpt2_1x256; do
    echo "== gpu profile: $m" >> "$s"
    timeout 120 python3 scripts/cuda_profile.py "$m" 2>&1 | flt | head -40 >> "$s"
done
(timeout 240 python3 -m pytest -q -p no:cacheprovider --tb=short -rfE -k cuda ${2:?} \
    > "$out/tests.log" 2>&1) &
(OMP_NUM_THREADS=1 timeout 240 python3 bench/zoo.py --device cuda --dtypes float16 \
    --only "${3:?}" --workers 6 --timeout 200 --out "$out/zoo.json" > "$out/zoo.log" 2>&1;
 python3 bench/zoo.py --report "$out/zoo.json" > "$out/zoo.md" 2>&1) &
wait
{ echo "== tests"; tail -2 "$out/tests.log"; grep -E "^(FAILED|ERROR)" "$out/tests.log" \
    | cut -c1-220 | head -20; echo "== zoo"; grep -E "^\| [a-z-]+ \| [a-z0-9_-]+ \|" \
    "$out/zoo.md"; } >> "$s"
cat "$s"
