#!/usr/bin/env bash
# On the GPU machine (device tool, `.whl` in carry): the language-model cuda tests, a decode
# profile of GPT-2 and bench/bench_llm.py on GPT-2 with every runner; logs under $1.
#
#   source scripts/device_env.sh || exit 1; bash scripts/llm_check.sh $OUT
#   bash scripts/llm_check.sh $OUT llama-1b [RUNNERS...]   # the benchmark only, batch 1,
#                                  # int8/int4 with their embeddings quantized too
#   bash scripts/llm_check.sh $OUT whisper     # bench/bench_whisper.py (Whisper-tiny, 30 s)
set -u
out="${1:?usage: llm_check.sh OUTDIR [MODEL]}"
model="${2:-}"
shift 2 2>/dev/null || shift $#
runners="${*:-aotrt aotrt_int4 aotrt_int8 torchao_int4 hf_static}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
if [ "$model" = whisper ]; then
    timeout 540 python3 bench/bench_whisper.py --runs 3 --out "$out/whisper.json" \
        > "$out/whisper.txt" 2>&1
    tail -6 "$out/whisper.txt"
    exit 0
fi
if [ -n "$model" ]; then
    timeout 540 python3 bench/bench_llm.py --model "$model" --batch 1 --runs 3 \
        --runners $runners --embeddings \
        --out "$out/$model.json" > "$out/$model.txt" 2>&1
    tail -12 "$out/$model.txt"
    exit 0
fi
timeout 170 python3 -m pytest -q -p no:cacheprovider --tb=short -k cuda \
    tests/llm tests/exporter/test_state.py tests/runtime/ops/test_linear_wq.py \
    tests/exporter/test_quantize.py tests/exporter/test_grouped_mm.py \
    tests/exporter/test_dedup.py tests/exporter/test_dynamic.py \
    > "$out/llm_cuda_tests.txt" 2>&1
tail -3 "$out/llm_cuda_tests.txt"
timeout 80 python3 scripts/llm_profile.py gpt2 > "$out/llm_profile.txt" 2>&1
grep -m1 "host time" "$out/llm_profile.txt"; grep -A8 "== GPU" "$out/llm_profile.txt"
timeout 250 python3 bench/bench_llm.py --model gpt2 --batch 1 8 --runs 3 \
    --runners aotrt aotrt_int8 hf_static hf_eager \
    --out "$out/gpt2.json" > "$out/gpt2.txt" 2>&1
tail -10 "$out/gpt2.txt"
