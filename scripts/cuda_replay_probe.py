"""On the GPU machine: why one benchmark model's CUDA-graph time and answer move between
processes (issue #9: ResNet-50 b1 measured 0.44-0.69 ms, GPT-2 0.64-0.83 ms, in runs of one
code; ResNet-50 b32 with graphs once gave 9.7e-4 against the fp32 reference, 3.47e-4 in five
other runs).

    python3 scripts/cuda_replay_probe.py resnet50_b1 gpt2_1x256 [--procs 3] [--iters 100]

Exports each model once, then in each of `procs` fresh processes loads it with graphs and
prints, in ms: the benchmark's own timing (events around one run() on an idle GPU, median),
the GPU time per run (events around `iters` back-to-back runs: the host overlaps the GPU),
run()'s host time to the graph launch and in all (medians), so a slow process shows whether
its GPU or its host is slow. Each process also prints its output's error against the fp32
reference (made once, in the parent), a digest of the output's bits for the first and last
run with graphs and for one run without, and how many of `iters` further replays gave bits
other than the first's: a race or a read of unwritten memory shows as digests that differ.

`--early-edges` also runs each process's twin with the captured graphs' programmatic
(early-launch) edges kept, as before `serialize_graph` (devices/cuda_graphs.py): what making
them full dependencies costs each model, in GPU time per run.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, "bench")


def digest(out: object) -> str:
    """A short digest of an output tensor's bits."""
    import torch

    t = torch.from_dlpack(out).contiguous().view(torch.uint8).cpu().numpy()
    return hashlib.sha1(t.tobytes()).hexdigest()[:10]


def child(name: str, path: str, iters: int, ref_path: str, early: bool) -> None:
    """One fresh process: load, warm up, measure, print one line."""
    import bench
    import torch

    import aotrt
    from aotrt.runtime.devices import cuda as cuda_dev
    from aotrt.runtime.devices.cuda import CudaGraph

    if early:
        cuda_dev.serialize_graph = lambda graph: 0

    _, inputs = bench.build(name)
    ref32 = torch.load(ref_path)
    prog = aotrt.Program.load(path)
    with aotrt.load(prog, device="cuda", cuda_graph=False) as d:
        plain = d.run(*inputs)[0]
        plain_digest = digest(plain)
    with aotrt.load(prog, device="cuda", cuda_graph=True) as d:
        s = d.stream
        first = d.run(*inputs)[0]
        first_digest = digest(first)
        errs = bench.errors(name, torch.from_dlpack(first), ref32)
        event_ms, last = bench.time_aotrt(d, inputs, iters, 10)
        last_digest = digest(last[0])
        others = sum(digest(d.run(*inputs)[0]) != first_digest for _ in range(iters))
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
    tag = " early" if early else ""
    print(f"{name:14s}{tag} pid {os.getpid():7d}  bench-style {event_ms:.3f}  "
          f"gpu/run {gpu_ms:.3f}  "
          f"to launch {pre[len(pre) // 2] * 1e3:.3f}  run() {whole[len(whole) // 2] * 1e3:.3f}  "
          f"err {' '.join(f'{k} {v:.2e}' for k, v in errs.items())}  bits: no graph "
          f"{plain_digest} graph first {first_digest} last {last_digest}  "
          f"{others}/{iters} differ", flush=True)


def main() -> None:
    """Export each model, then measure it in fresh processes."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["resnet50_b1", "gpt2_1x256"])
    ap.add_argument("--procs", type=int, default=3)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--early-edges", action="store_true",
                    help="also each process's twin with programmatic edges kept")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(*a.child[:2], a.iters, a.child[2], a.early_edges)
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
            ref_path = os.path.join(tmp, f"{name}.ref.pt")
            torch.save(bench.fp32_reference(m, inputs), ref_path)
            del m
            for _ in range(a.procs):
                for early in ([False, True] if a.early_edges else [False]):
                    subprocess.run([sys.executable, __file__, "--child", name, path, ref_path,
                                    "--iters", str(a.iters)] + (["--early-edges"] * early),
                                   timeout=120, check=False)


if __name__ == "__main__":
    main()
