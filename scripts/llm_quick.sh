#!/usr/bin/env bash
# On the GPU machine, when little device time is left: the language-model cuda tests and the
# aotrt runners of bench/bench_llm.py on GPT-2 (batch 1 and 8); logs under $1.
#
#   source scripts/device_env.sh || exit 1; bash scripts/llm_quick.sh $OUT
set -u
out="${1:?usage: llm_quick.sh OUTDIR}"
mkdir -p "$out"
nvidia-smi --query-gpu=name --format=csv,noheader > "$out/gpu.txt" 2>&1
timeout 140 python3 -m pytest -q -p no:cacheprovider --tb=short -k cuda -x \
    tests/runtime/ops/test_linear_wq.py tests/exporter/test_state.py tests/llm/test_generate.py \
    tests/llm/test_quantized.py tests/exporter/test_dedup.py tests/llm/test_whisper.py \
    tests/llm/test_sampling.py > "$out/llm_cuda_tests.txt" 2>&1
tail -4 "$out/llm_cuda_tests.txt"
timeout 100 python3 bench/bench_llm.py --model gpt2 --batch 1 8 --runs 3 \
    --runners aotrt aotrt_int8 --out "$out/gpt2.json" > "$out/gpt2.txt" 2>&1
tail -6 "$out/gpt2.txt"
