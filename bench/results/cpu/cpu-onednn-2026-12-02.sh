#!/usr/bin/env bash
# One process per (threads, runner, model, layout); JSON lines to out/results.jsonl
cd /work/wt-dnnl
PY=/work/main/.venv/bin/python
OUT=/tmp/dnnl-bench/out/results.jsonl
OUT=${OUTF:-$OUT}; : > $OUT
for th in ${THS:-default 1}; do
  for m in resnet18 mobilenet_v2; do
    for l in contiguous channels_last; do
      for r in numpy onednn eager; do
        env=(PYTHONPATH=/work/wt-dnnl)
        [ $r = onednn ] && env=(PYTHONPATH=/work/wt-dnnl:/tmp/dnnl-prefix/lib/python3.11/site-packages)
        [ $th = 1 ] && env+=(OMP_NUM_THREADS=1); [ $th = passive ] && env+=(OMP_WAIT_POLICY=passive)
        what=aotrt; [ $r = eager ] && what=eager
        line=$(env "${env[@]}" timeout 300 $PY bench/bench_conv_cpu.py $what /tmp/dnnl-bench $m $l --iters 7 2>/dev/null | tail -1)
        echo "{\"config\": \"$r\", \"omp\": \"$th\", \"result\": ${line:-null}}" >> $OUT
      done
    done
  done
done
echo done >> /tmp/dnnl-bench/out/done
