#!/usr/bin/env bash
# On the GPU machine (device tool, carry .whl): a session's first call, within ~9 minutes.
# Logs under $1; the summaries are gathered into $1/summary.txt (8 files come back).
#
#   bash scripts/h200_session.sh $OUT/r
#
# A (parallel, ~4 min): every runtime test file's cuda cases, 4 files at a time, beside the
#   exporter tests' cuda cases (the module suite among them).
# B (GPU alone): profiles (ResNet-50's stem and max pool against torch.compile, ResNet-50
#   b32, BERT, RT-DETR-L) and the host time of runs without graphs (cProfile).
# C: bench.py, every runner, each in its own process.
out="${1:?usage: h200_session.sh OUTDIR}"
source scripts/device_env.sh || exit 1
mkdir -p "$out"
s="$out/summary.txt"
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv > "$s" 2>&1
t0=$(date +%s)
w=/tmp/h200-tests   # the test logs stay there (only a few files come back); failures.txt
mkdir -p "$w"       # gathers what failed
(AOTRT_TEST_TIMEOUT=230 bash scripts/cuda_tests_parallel.sh "$w" > /dev/null 2>&1) &
(timeout 240 python3 -m pytest -q -p no:cacheprovider --tb=short -rfE -k cuda tests/exporter \
    > "$w/exporter.log" 2>&1) &
wait
{ echo "== A: tests ($(( $(date +%s) - t0 )) s)"; cat "$w/summary.txt"
  echo "exporter: $(grep -E 'passed|failed' "$w/exporter.log" | tail -n1)"
  grep -hE "^(FAILED|ERROR)" "$w"/*.log | cut -c1-230 | head -40; } >> "$s"
grep -hE -B2 -A12 "^(____| *E  )" "$w"/*.log | head -400 > "$out/failures.txt"
prof() {  # model, then cuda_profile's options
    timeout 100 python3 scripts/cuda_profile.py "$@" 2>&1 | grep -v Warn | grep -v "return cls" \
        | grep -iv ultralytics
}
{ for m in stem_b32; do prof $m auto; done
  for m in resnet50_b32 bert_base_8x128 rtdetr_l; do prof $m auto --no-compile; done
} > "$out/profiles.txt" 2>&1
{ for m in resnet50_b1 bert_base_8x128; do
    timeout 80 python3 scripts/cuda_host_profile.py $m --iters 30 2>&1 | grep -v Warn
  done; } > "$out/host_profile.txt" 2>&1
{ echo "== B: profiles ($(( $(date +%s) - t0 )) s)"; grep -E "^==|^layout|  [0-9]" \
    "$out/profiles.txt" | head -60; grep -E "instructions|per run" "$out/host_profile.txt"; } >> "$s"
left=$(( 560 - ($(date +%s) - t0) ))
timeout $left python3 bench/bench.py --out "$out/bench.json" --budget $(( left - 15 )) \
    --iters 20 2>&1 | grep -v Warning | grep -v "return cls" > "$out/bench.log"
{ echo "== C: bench ($(( $(date +%s) - t0 )) s)"; tail -40 "$out/bench.log"; } >> "$s"
cat "$s"
