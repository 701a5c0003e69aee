"""On the GPU machine: where the host time of aotrt's run() goes without CUDA graphs
(issue #9: aotrt without graphs must beat eager), by Python function, under cProfile.

    python3 scripts/cuda_host_profile.py resnet50_b1 [--iters 50] [--graph]

Prints the wall time per run with and without the profiler, the host time of run() alone
(what it takes to enqueue), and the functions with the most own time (tottime) and
cumulative time per run. `--graph` profiles the CUDA graph replay path instead.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

sys.path.insert(0, "bench")
import bench  # noqa: E402

import aotrt  # noqa: E402


def pre_launch(d, inputs, iters: int) -> None:
    """The host time from run()'s call to the graph launch: what a caller's latency adds
    to the graph's GPU time when the GPU is idle (the benchmark's case)."""
    from aotrt.runtime.backends.cuda.device import CudaGraph

    real = CudaGraph.launch
    stamps: list[float] = []

    def launch(self, stream, copies=()):
        stamps.append(time.perf_counter())
        return real(self, stream, copies)

    CudaGraph.launch = launch
    try:
        gaps = []
        for _ in range(iters):
            stamps.clear()
            t0 = time.perf_counter()
            d.run(*inputs)
            if stamps:
                gaps.append(stamps[0] - t0)
            d.stream.commit_and_wait()
    finally:
        CudaGraph.launch = real
    gaps.sort()
    if gaps:
        print(f"run() to graph launch (median): {gaps[len(gaps) // 2] * 1e6:.1f} us")


def stages(d, inputs, iters: int) -> None:
    """Medians of the pieces of run()'s way to the launch that cross into torch: its
    `__dlpack__` with our stream (it orders its current stream before ours with a new
    event each call) and without (-1: no ordering), and aotrt's import of the capsule."""
    from aotrt.runtime import dlpack

    x = inputs[0]
    s = int(d.stream.handle) or 1

    def median(f) -> float:
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        ts.sort()
        return ts[len(ts) // 2] * 1e6

    print(f"torch __dlpack__(stream=ours): {median(lambda: x.__dlpack__(stream=s)):.1f} us, "
          f"(stream=-1): {median(lambda: x.__dlpack__(stream=-1)):.1f} us, "
          f"aotrt from_dlpack(stream=ours): "
          f"{median(lambda: dlpack.from_dlpack(x, stream=s)):.1f} us")


def main() -> None:
    """Export one benchmark model, run it without graphs, profile the runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a bench.build name, e.g. resnet50_b1")
    ap.add_argument("--iters", type=int, default=50, help="profiled runs")
    ap.add_argument("--graph", action="store_true", help="with CUDA graphs")
    a = ap.parse_args()
    m, inputs = bench.build(a.model)
    prog = aotrt.export(m, inputs)
    print(f"{a.model}: {len(prog.instructions)} instructions")
    with aotrt.load(prog, device="cuda", cuda_graph=a.graph) as d:
        for _ in range(5):
            d.run(*inputs)
        d.stream.commit_and_wait()
        host = []
        for _ in range(a.iters):
            t0 = time.perf_counter()
            d.run(*inputs)
            host.append(time.perf_counter() - t0)
            d.stream.commit_and_wait()
        host.sort()
        print(f"run() alone (enqueue, median): {host[len(host) // 2] * 1e3:.3f} ms")
        if a.graph:
            pre_launch(d, inputs, a.iters)
            stages(d, inputs, a.iters)
        t0 = time.perf_counter()
        for _ in range(a.iters):
            d.run(*inputs)
        d.stream.commit_and_wait()
        plain = (time.perf_counter() - t0) / a.iters
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        for _ in range(a.iters):
            d.run(*inputs)
        d.stream.commit_and_wait()
        prof.disable()
        profiled = (time.perf_counter() - t0) / a.iters
    print(f"per run: {plain * 1e3:.3f} ms, {profiled * 1e3:.3f} ms under cProfile "
          f"({plain * 1e6 / max(1, len(prog.instructions)):.1f} us per instruction)")
    st = pstats.Stats(prof)
    for key in ("tottime", "cumulative"):
        print(f"== by {key} (totals over {a.iters} runs)")
        st.sort_stats(key).print_stats(22)


if __name__ == "__main__":
    main()
