#!/usr/bin/env bash
# On the GPU machine (device tool, carry .whl): every test file's cuda cases, the close-race
# stress on cuda, and bench/bench_decode.py, within about 8 minutes. Logs under $1; the
# summary in $1/summary.txt (few files come back: the rest stay under /tmp/cuda-check).
#
#   source scripts/device_env.sh || exit 1; bash scripts/cuda_check.sh $OUT
out="${1:?usage: cuda_check.sh OUTDIR}"
w=/tmp/cuda-check
mkdir -p "$out" "$w"
s="$out/summary.txt"
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$s" 2>&1
AOTRT_TEST_TIMEOUT=200 timeout 230 bash scripts/cuda_tests_parallel.sh "$w/ct" > /dev/null 2>&1
{ echo "== cuda tests ($(( $(date +%s) - t0 )) s): files with cuda cases, by outcome"
  grep -v " rc=5" "$w/ct/summary.txt" | awk '{print $2}' | sort | uniq -c
  grep -v " rc=5" "$w/ct/summary.txt" | grep -v " rc=0"
  grep -hE "^(FAILED|ERROR)" "$w"/ct/*.log | cut -c1-220 | head -40
  grep -h -E "[0-9]+ passed" "$w"/ct/*.log | awk '{p+=$1} END {print "passed in all:", p}'
} >> "$s"
grep -hE -B2 -A14 "^(____| *E  )" "$w"/ct/*.log | head -300 > "$out/failures.txt"
timeout 90 python3 -m pytest -q -p no:cacheprovider --tb=short -rfE \
    "tests/runtime/test_close_race.py" -k "cuda and 30" > "$w/race30.log" 2>&1
echo "== close race, 30 s on cuda: $(tail -n1 "$w/race30.log")" >> "$s"
timeout 200 python3 bench/bench_decode.py --device cuda --passes 3 --out "$out/decode" \
    > "$w/decode.log" 2>&1
{ echo "== decode ($(( $(date +%s) - t0 )) s)"; cat "$out/decode.md" 2>/dev/null \
    || tail -20 "$w/decode.log"; } >> "$s"
cat "$s"
