#!/usr/bin/env bash
# On the GPU machine (device tool, carry .whl): the model zoo in one dtype within a time
# limit, every model timed against eager (--time), plus the cuda tests named in $4 (run
# beside the zoo's first minutes), over the families named in $5 (default: all). Logs under
# $1; zoo.json/.md/.log and tests.txt come back. $6: more bench/zoo.py arguments.
#
#   bash scripts/h200_zoo.sh $OUT/z float16 540 ["tests/runtime/ops/test_topk.py ..."] [hf,timm]
#   bash scripts/h200_zoo.sh $OUT/z float32 400 "" timm "--fp32-math eager"
out="${1:?usage: h200_zoo.sh OUTDIR DTYPE SECONDS [TEST_FILES]}"
dtype="${2:?}"
secs="${3:?}"
tests="${4:-}"
families="${5:-hf,timm,torchvision,ultralytics}"
extra="${6:-}"
source scripts/device_env.sh || exit 1
mkdir -p "$out"
if [ -n "$tests" ]; then
    (timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rfE -k cuda $tests \
        > "$out/tests.log" 2>&1; grep -E "^(FAILED|ERROR)|passed|failed" "$out/tests.log" \
        | tail -30 > "$out/tests.txt") &
fi
OMP_NUM_THREADS=1 timeout "$secs" python3 bench/zoo.py --device cuda --dtypes "$dtype" \
    --families "$families" --workers 15 --timeout 240 --time --out "$out/zoo.json" $extra \
    > "$out/zoo.log" 2>&1
wait
python3 bench/zoo.py --report "$out/zoo.json" > "$out/zoo.md" 2>&1
tail -3 "$out/zoo.log"; head -12 "$out/zoo.md"; cat "$out/tests.txt" 2>/dev/null || true
