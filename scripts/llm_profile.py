"""On the GPU machine: where a decode step of an llm.export program spends its time: the
host part of a bound step under cProfile, and the GPU time per kernel of one step (CUPTI
through torch.profiler, graphs off so each kernel shows).

    python3 scripts/llm_profile.py gpt2 [--batch 1] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import aotrt  # noqa: E402
import bench_llm  # noqa: E402
from aotrt import llm  # noqa: E402


def kernel_table(prof, steps: int) -> None:
    """Kernels by GPU time per step (us), grouped by name."""
    import torch

    tot: dict = collections.Counter()
    cnt: dict = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            tot[e.name[:70]] += e.device_time_total
            cnt[e.name[:70]] += 1
    total = sum(tot.values())
    print(f"== GPU {total / steps:.1f} us per step, {sum(cnt.values()) / steps:.0f} kernels")
    for k, v in tot.most_common(20):
        print(f"  {v / steps:8.1f} us  x{cnt[k] / steps:4.0f}  {k}")


def main() -> None:
    """Profile the host and the GPU side of one model's decode step."""
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args()
    from torch.profiler import ProfilerActivity, profile

    model = bench_llm._model(args.model, args.dtype)
    prog = llm.export(model, max_seq_len=256, max_batch=args.batch, prefill_len=128)
    ids = np.zeros((args.batch, 1), np.int64)
    start = np.zeros(args.batch, np.int64)
    with aotrt.load(prog, device="cuda") as m:
        bound = m.method("decode").bind()
        for _ in range(20):
            np.asarray(bound.run(ids, np.array(130), start)[0])
        pr = cProfile.Profile()
        host = []
        for i in range(200):
            t0 = time.perf_counter()
            pr.enable()
            bound.run(ids, np.array(130), start)
            pr.disable()
            host.append(time.perf_counter() - t0)
            np.asarray(bound.outputs[0])
        print(f"== bound decode step host time, median of 200 (under cProfile): "
              f"{np.median(host) * 1e6:.1f} us")
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)
    with aotrt.load(prog, device="cuda", cuda_graph=False) as m:
        dec = m.method("decode")
        for _ in range(5):
            np.asarray(dec.run(ids, np.array(130), start)[0])
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                np.asarray(dec.run(ids, np.array(130), start)[0])
        kernel_table(prof, 10)


if __name__ == "__main__":
    main()
