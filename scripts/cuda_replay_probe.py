"""On the GPU machine: why one benchmark model's CUDA-graph time moves between processes
(issue #9: ResNet-50 b1 measured 0.44-0.69 ms, GPT-2 0.64-0.83 ms, in runs of one code).

    python3 scripts/cuda_replay_probe.py resnet50_b1 gpt2_1x256 [--procs 3] [--iters 100]

Exports each model once, then in each of `procs` fresh processes loads it with graphs and
prints, in ms: the benchmark's own timing (events around one run() on an idle GPU, median),
the GPU time per run (events around `iters` back-to-back runs: the host overlaps the GPU),
run()'s host time to the graph launch and in all (medians), so a slow process shows whether
its GPU or its host is slow.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, "bench")


def child(name: str, path: str, iters: int) -> None:
    """One fresh process: load, warm up, measure, print one line."""
    import bench

    import aotrt
    from aotrt.runtime.devices.cuda import CudaGraph

    _, inputs = bench.build(name)
    prog = aotrt.Program.load(path)
    with aotrt.load(prog, device="cuda", cuda_graph=True) as d:
        s = d.stream
        event_ms, _ = bench.time_aotrt(d, inputs, iters, 10)
        e0 = s.timing_event()
        for _ in range(iters):
            d.run(*inputs)
        e1 = s.timing_event()
        e1.sync()
        gpu_ms = (e1 - e0) / iters
        real = CudaGraph.launch
        stamps: list[float] = []

        def launch(self, stream, copies=()):  # type: ignore[no-untyped-def]
            stamps.append(time.perf_counter())
            return real(self, stream, copies)

        CudaGraph.launch = launch
        pre, whole = [], []
        try:
            for _ in range(iters):
                stamps.clear()
                t0 = time.perf_counter()
                d.run(*inputs)
                t1 = time.perf_counter()
                s.commit_and_wait()
                pre.append(stamps[0] - t0)
                whole.append(t1 - t0)
        finally:
            CudaGraph.launch = real
    pre.sort()
    whole.sort()
    print(f"{name:14s} pid {os.getpid():7d}  bench-style {event_ms:.3f}  gpu/run {gpu_ms:.3f}  "
          f"to launch {pre[len(pre) // 2] * 1e3:.3f}  run() {whole[len(whole) // 2] * 1e3:.3f}",
          flush=True)


def main() -> None:
    """Export each model, then measure it in fresh processes."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["resnet50_b1", "gpt2_1x256"])
    ap.add_argument("--procs", type=int, default=3)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1], a.iters)
        return
    import bench
    import torch

    import aotrt

    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models:
            m, inputs = bench.build(name)
            with torch.no_grad():
                prog = aotrt.export(m, inputs)
            path = os.path.join(tmp, f"{name}.aotp")
            prog.save(path)
            del m
            for _ in range(a.procs):
                subprocess.run([sys.executable, __file__, "--child", name, path,
                                "--iters", str(a.iters)], timeout=120, check=False)


if __name__ == "__main__":
    main()
