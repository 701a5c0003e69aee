#!/usr/bin/env bash
# On the GPU machine (device tool, carry .whl): the session's last check in one call, for
# when little device time is left. Logs under $1; summary.txt gathers them.
#
#   bash scripts/h200_final.sh $OUT/r
#
# A (at once, correctness only): the cuda cases of the test files this session changed,
#   the generated-kernel tests with block reductions on, the fp16 zoo models that were
#   wrong or unjudgeable, and the profiles of ResNet-50 b32 and RT-DETR-L.
# B: bench.py, eager / aotrt / aotrt + graph / reduce-overhead, alone on the GPU.
# C: BERT's profile with block reductions (AOTRT_CUDA_BLOCK_REDUCE=1).
out="${1:?usage: h200_final.sh OUTDIR}"
source scripts/device_env.sh || exit 1
mkdir -p "$out"
s="$out/summary.txt"
tests="tests/runtime/ops/test_conv.py tests/runtime/ops/test_sdpa.py
tests/runtime/ops/test_pool.py tests/runtime/ops/test_upsample.py
tests/runtime/ops/test_cuda_sources.py tests/runtime/devices/test_cuda.py
tests/runtime/test_delegate.py tests/exporter/test_epilogue.py tests/exporter/test_layout.py"
(for f in $tests; do
    echo "== $f"
    timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=line -k cuda "$f" 2>&1 \
        | grep -E "^(FAILED|ERROR)|Error|passed|failed" | tail -8
done > "$out/tests.txt" 2>&1) &
(AOTRT_CUDA_BLOCK_REDUCE=1 timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=line \
    -k cuda tests/runtime/devices/test_cuda.py 2>&1 | tail -6 > "$out/tests_block.txt") &
(OMP_NUM_THREADS=2 timeout 160 python3 bench/zoo.py --device cuda --dtypes float16 \
    --workers 6 --timeout 150 --out "$out/zoo-recheck.json" \
    --only resnet101,regnet_x_16gf,regnet_y_16gf,convnext_base,efficientnet_v2_l,efficientnet_b0,mobilenet_v2,resnet50,yolov8n \
    > "$out/zoo-recheck.log" 2>&1) &
for m in resnet50_b32 rtdetr_l; do
    timeout 100 python3 scripts/cuda_profile.py $m auto --no-compile 2>&1 \
        | grep -v Warn | grep -v "return cls" | grep -iv ultralytics > "$out/profile_$m.txt"
done
wait
cat "$out/tests.txt" "$out/tests_block.txt" > "$s"
tail -14 "$out/zoo-recheck.log" >> "$s"
for m in resnet50_b32 rtdetr_l; do head -24 "$out/profile_$m.txt" >> "$s"; done
timeout 170 python3 bench/bench.py --out "$out/bench.json" --budget 160 --iters 20 \
    --runners eager,aotrt,aotrt_graph,compile_reduce_overhead 2>&1 | grep -v Warning \
    | grep -v "return cls" > "$out/bench.log"
tail -8 "$out/bench.log" >> "$s"
AOTRT_CUDA_BLOCK_REDUCE=1 timeout 60 python3 scripts/cuda_profile.py bert_base_8x128 auto \
    --no-compile 2>&1 | grep -v Warn > "$out/profile_bert_block.txt"
head -14 "$out/profile_bert_block.txt" >> "$s"
cat "$s"
