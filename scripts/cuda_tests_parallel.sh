#!/usr/bin/env bash
# On the GPU machine, after `source scripts/device_env.sh || exit 1`: the cuda cases of every
# runtime test file, 4 files at a time, each in its own process; logs and a summary under $1.
out="${1:-/tmp/cuda-tests}"
mkdir -p "$out"
run_one() {
    f="$1"; out="$2"; name="$(basename "$f" .py)"
    timeout "${AOTRT_TEST_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider --tb=short \
        -rfE -k cuda "$f" > "$out/$name.log" 2>&1
    echo "$name rc=$? $(grep -E 'passed|failed|error' "$out/$name.log" | tail -n1)"
}
export -f run_one
ls tests/runtime/devices/test_cuda.py tests/runtime/ops/test_*.py tests/runtime/test_*.py \
    | xargs -P 4 -I{} bash -c 'run_one "$@"' _ {} "$out" | sort | tee "$out/summary.txt"
