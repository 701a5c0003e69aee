#!/usr/bin/env bash
# On the GPU machine (device tool, carry .whl): the whole cuda test set (runtime tests and the
# module suite, 4 files at a time) beside a submodule bisection of the zoo's cuda mismatches.
#
#   bash scripts/h200_bisect.sh $OUT/b "yolo11n:4 dla34:3"
out="${1:?usage: h200_bisect.sh OUTDIR \"MODEL:DEPTH ...\"}"
source scripts/device_env.sh || exit 1
mkdir -p "$out/tests"
(AOTRT_TEST_TIMEOUT=400 bash scripts/cuda_tests_parallel.sh "$out/tests" > /dev/null 2>&1) &
(timeout 400 python3 -m pytest -q -p no:cacheprovider --tb=short -rfE -k cuda \
     tests/exporter/test_modules.py > "$out/tests/modules.log" 2>&1;
 echo "modules rc=$? $(grep -E 'passed|failed' "$out/tests/modules.log" | tail -n1)" \
     > "$out/tests/modules.txt") &
for spec in ${2:?}; do
    timeout 110 python3 scripts/cuda_bisect.py "${spec%%:*}" --depth "${spec##*:}" \
        >> "$out/bisect.txt" 2>&1
done
wait
cat "$out/tests/summary.txt" "$out/tests/modules.txt"; grep -E "^(FAILED|ERROR)" "$out"/tests/*.log | head -40
grep -E "<<<|Error" "$out/bisect.txt" | head -60
