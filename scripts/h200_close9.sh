#!/usr/bin/env bash
# On the GPU machine (device tool, carry .whl): what closing the cuda issue asks beside the
# benchmark. GPU kernel profiles of ResNet-50 b32 and BERT (alone on the GPU), then every cuda
# test case of the repository, then the zoo models named in $2 with graphs, timed against
# eager. What comes back under $1 (8 files at most): summary.txt, the two profiles, the zoo's
# json and md per dtype, and logs.tar.gz with every log.
#
#   bash scripts/h200_close9.sh $OUT/c "coat_lite_tiny,yolov3u,mobilevit"
out="${1:?usage: h200_close9.sh OUTDIR [ZOO_MODELS]}"
source scripts/device_env.sh || exit 1
w=/tmp/close9
mkdir -p "$out" "$w"
s="$out/summary.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$s" 2>&1
flt() { grep -v Warn | grep -v "return cls" | grep -iv ultralytics; }
for m in resnet50_b32 bert_base_8x128; do
    timeout 150 python3 scripts/cuda_profile.py "$m" 2>&1 | flt > "$out/profile_$m.txt"
    { echo "== gpu profile: $m"; head -30 "$out/profile_$m.txt"; } >> "$s"
done
echo "== cuda tests" >> "$s"
start=$(date +%s)
AOTRT_TEST_JOBS=6 AOTRT_TEST_TIMEOUT=300 bash scripts/cuda_tests_parallel.sh "$w/tests" \
    > /dev/null 2>&1
grep -v "rc=5" "$w/tests/summary.txt" >> "$s"
echo "files with no cuda case: $(grep -c "rc=5" "$w/tests/summary.txt")" >> "$s"
echo "wall $(( $(date +%s) - start )) s" >> "$s"
grep -hE "^(FAILED|ERROR)" "$w"/tests/*.log | cut -c1-220 | head -30 >> "$s"
if [ -n "${2:-}" ]; then
    for d in float32 float16; do
        OMP_NUM_THREADS=1 timeout 200 python3 bench/zoo.py --device cuda --dtypes "$d" \
            --only "$2" --workers 4 --timeout 180 --time --out "$out/zoo-$d.json" \
            > "$w/zoo-$d.log" 2>&1
        python3 bench/zoo.py --report "$out/zoo-$d.json" > "$out/zoo-$d.md" 2>&1
        { echo "== zoo $d"; grep -A30 "^timed" "$out/zoo-$d.md"; } >> "$s"
    done
fi
tar czf "$out/logs.tar.gz" -C "$w" .
cat "$s"
