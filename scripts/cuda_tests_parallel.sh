#!/usr/bin/env bash
# On the GPU machine, after `source scripts/device_env.sh || exit 1`: the cuda cases of every
# test file (the module suite included), ${AOTRT_TEST_JOBS:-4} files at a time, each in its own
# process; logs and a summary under $1. rc=5 means the file has no cuda case. `-m ""`: the
# slow cases too (the CI slice's -m "not slow" is scripts/test.sh's alone).
out="${1:-/tmp/cuda-tests}"
mkdir -p "$out"
run_one() {
    f="$1"; out="$2"; name="$(echo "${f#tests/}" | tr / _)"; name="${name%.py}"
    timeout "${AOTRT_TEST_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider --tb=short \
        -rfE -m "" -k cuda "$f" > "$out/$name.log" 2>&1
    echo "$name rc=$? $(grep -E 'passed|failed|error' "$out/$name.log" | tail -n1)"
}
export -f run_one
find tests -name "test_*.py" | sort \
    | xargs -P "${AOTRT_TEST_JOBS:-4}" -I{} bash -c 'run_one "$@"' _ {} "$out" | sort \
    | tee "$out/summary.txt"
