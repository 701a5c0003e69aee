#!/usr/bin/env bash
# On the GPU machine, after `source scripts/device_env.sh || exit 1`: run the cuda cases of
# every runtime test file in a process of its own (a crash in one file cannot hide the
# others), logs under ${1:-/tmp/cuda-tests}, one summary line per file.
out="${1:-/tmp/cuda-tests}"
mkdir -p "$out"
for f in tests/runtime/backends/cuda/test_device.py tests/runtime/ops/test_*.py tests/runtime/test_*.py; do
    name="$(basename "$f" .py)"
    timeout "${AOTRT_TEST_TIMEOUT:-120}" python3 -m pytest -q -p no:cacheprovider --tb=short -rfE \
        -k cuda "$f" > "$out/$name.log" 2>&1
    rc=$?
    echo "$name rc=$rc $(grep -E '^[0-9]+ (passed|failed)|passed|failed|error' "$out/$name.log" | tail -n1)"
done
