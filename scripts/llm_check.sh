#!/usr/bin/env bash
# On the GPU machine (device tool, `.whl` in carry): the language-model cuda tests, a decode
# profile and the aotrt side of the GPT-2 benchmark, logs under $1.
#
#   source scripts/device_env.sh || exit 1; bash scripts/llm_check.sh $OUT
set -u
out="${1:?usage: llm_check.sh OUTDIR}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -k cuda \
    tests/llm tests/exporter/test_state.py tests/runtime/ops/test_linear_wq.py \
    tests/exporter/test_quantize.py tests/exporter/test_grouped_mm.py \
    > "$out/llm_cuda_tests.txt" 2>&1
tail -3 "$out/llm_cuda_tests.txt"
timeout 120 python3 scripts/llm_profile.py gpt2 > "$out/llm_profile.txt" 2>&1
grep -m1 "host time" "$out/llm_profile.txt"; grep -A6 "== GPU" "$out/llm_profile.txt"
timeout 150 python3 bench/bench_llm.py --model gpt2 --batch 1 8 --runs 5 --runners aotrt \
    --out "$out/gpt2_aotrt.json" > "$out/gpt2_aotrt.txt" 2>&1
tail -3 "$out/gpt2_aotrt.txt"
