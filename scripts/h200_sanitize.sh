#!/usr/bin/env bash
# On the GPU machine (device tool, carry .whl): a zoo model's cuda program under
# compute-sanitizer's initcheck and memcheck, side by side; logs under $1.
#
#   bash scripts/h200_sanitize.sh $OUT/s dla34 [channels_last]
out="${1:?usage: h200_sanitize.sh OUTDIR MODEL [LAYOUT]}"
source scripts/device_env.sh || exit 1
CS="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
[ -n "$CS" ] || { echo "compute-sanitizer not found"; exit 2; }
python3 scripts/cuda_sanitize_model.py export "${2:?}" "$out/p" --layout "${3:-auto}" || exit 1
python3 scripts/cuda_sanitize_model.py run "$out/p"
for tool in initcheck memcheck; do
    (timeout 240 "$CS" --tool "$tool" --print-limit 30 \
        python3 scripts/cuda_sanitize_model.py run "$out/p" > "$out/$tool.txt" 2>&1) &
done
wait
for tool in initcheck memcheck; do
    echo "== $tool"; grep -E "ERROR SUMMARY|Uninitialized|Invalid|at 0x|by thread|norms|Kernel|kernel" \
        "$out/$tool.txt" | sort | uniq -c | sort -rn | head -25
done
