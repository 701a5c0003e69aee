#!/usr/bin/env bash
# On the GPU machine (device tool, carry .whl): recheck named zoo models in one dtype, the
# cuda conv tests and scripts/cuda_diagnose.py on named models, side by side; logs under $1.
#
#   bash scripts/h200_recheck.sh $OUT/r float16 "levit_128s,r2plus1d_18" "yolo11n dla34"
out="${1:?usage: h200_recheck.sh OUTDIR DTYPE ZOO_MODELS DIAGNOSE_MODELS}"
source scripts/device_env.sh || exit 1
mkdir -p "$out"
(timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -rfE -k cuda \
    tests/runtime/ops/test_conv.py > "$out/conv.log" 2>&1) &
(OMP_NUM_THREADS=1 timeout 300 python3 bench/zoo.py --device cuda --dtypes "${2:?}" \
    --only "${3:?}" --workers 8 --timeout 240 --out "$out/zoo.json" > "$out/zoo.log" 2>&1;
 python3 bench/zoo.py --report "$out/zoo.json" > "$out/zoo.md" 2>&1) &
timeout 300 python3 scripts/cuda_diagnose.py ${4:-} 2>&1 | grep -v Warning \
    | grep -v "return cls" > "$out/diag.txt"
wait
tail -3 "$out/conv.log"; cat "$out/diag.txt"; grep -E "^\| [a-z-]+ \| [a-z0-9_-]+ \|" "$out/zoo.md"
