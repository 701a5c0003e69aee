"""Host time per instruction of Delegate.run(), without graphs (issue #9 item 1).

    .venv/bin/python bench/bench_host.py [--device cpu|cuda] [--instructions 200]
        [--iters 200] [--hazards]

A chain of small float32 kernels (numel 1..64, so a kernel's own work is negligible and the
time is the Python around it): x -> k0 -> t0 -> k1 -> t1 ... -> y, every intermediate in the
arena, the first kernel reading the per-run input and the last writing the per-run output.
Each timed iteration is `d.run(x)` then `d.stream.commit_and_wait()`; the number is the
median over iterations divided by the instruction count; "run() only" is the time until
run() returns (its work is submitted to the worker thread, which may still be running).
The hazard checker is off unless --hazards (AOTRT_CHECK_HAZARDS is cleared for the process
either way). Prints one markdown table row (see bench/results/cpu/cpu-host-*.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

os.environ.pop("AOTRT_CHECK_HAZARDS", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aotrt  # noqa: E402
from aotrt.kernels import ir  # noqa: E402
from aotrt.exporter.builder import ProgramBuilder  # noqa: E402
from aotrt.program import Program  # noqa: E402


def chain_program(n: int) -> Program:
    """`n` kernels t[i+1] = t[i] * 0.5 + 1 over sizes cycling through 1..64 (prefix views)."""
    b = ProgramBuilder("HostBench")
    x = b.input("x", "float32", [64])
    y = b.output("y", "float32", [64])
    bufs = [b.in_buffer(b.buffer(64 * 4), 0, "float32", [64]) for _ in range(2)]
    prev = x
    for i in range(n):
        numel = 1 + (i * 37) % 64
        dst = y if i == n - 1 else bufs[i % 2]
        if i == n - 1:
            numel = 64
        src_v = prev if numel == 64 else b.alias(prev, [numel], [1], 0)
        dst_v = dst if numel == 64 else b.alias(dst, [numel], [1], 0)
        val = ir.Op("add", (ir.Op("mul", (ir.load(0, [1], "float32"),
                                          ir.const(0.5, "float32")), "float32"),
                            ir.const(1.0, "float32")), "float32")
        k = ir.Kernel(f"hb_{numel}", (numel,), (), (ir.Arg("float32", "r"),
                                                    ir.Arg("float32", "w")),
                      (ir.store(1, [1], val),))
        b.kernel(k, [src_v, dst_v], src=f"bench:{i}")
        prev = dst
    return b.build()


def reference(x: np.ndarray, n: int) -> np.ndarray:
    """The chain in numpy (float32, as the kernels compute it): y after `n` kernels."""
    bufs = [np.zeros(64, np.float32), np.zeros(64, np.float32)]   # the arena starts zeroed
    y = np.zeros(64, np.float32)
    prev = x
    for i in range(n):
        numel = 64 if i == n - 1 else 1 + (i * 37) % 64
        dst = y if i == n - 1 else bufs[i % 2]
        dst[:numel] = prev[:numel] * np.float32(0.5) + np.float32(1.0)
        prev = dst
    return y.astype(np.float64)


def torchvision_program(name: str, size: int) -> tuple[Program, np.ndarray]:
    """A torchvision classifier exported row-major at batch 1, and an input for it."""
    import torch
    import torchvision

    torch.manual_seed(0)
    m = getattr(torchvision.models, name)(weights=None).eval()
    x = torch.randn(1, 3, size, size)
    with torch.no_grad():
        return aotrt.export(m, (x,), layout="contiguous"), x.numpy()


def main() -> None:
    """Time run() and print one markdown table row."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--instructions", type=int, default=200)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--hazards", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--torchvision", help="time this torchvision model instead of the chain")
    ap.add_argument("--size", type=int, default=64, help="input size of --torchvision")
    a = ap.parse_args()
    if a.torchvision:
        model_row(a)
        return
    prog = chain_program(a.instructions)
    t0 = time.perf_counter()
    d = aotrt.load(prog, device=a.device, check_hazards=a.hazards, cuda_graph=False)
    load_s = time.perf_counter() - t0
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    got = np.asarray(d.run(x)[0]).astype(np.float64)
    d.stream.commit_and_wait()
    err = float(np.max(np.abs(got - reference(x, a.instructions))))
    n_ins = len(prog.instructions)
    times, host = timed_runs(d, x, 10, a.iters)
    med, hmed = statistics.median(times), statistics.median(host)
    print(f"| {a.device} | {n_ins} | {'on' if a.hazards else 'off'} | {med * 1e3:.2f} | "
          f"{med / n_ins * 1e6:.1f} | {min(times) / n_ins * 1e6:.1f} | "
          f"{hmed / n_ins * 1e6:.1f} | {load_s:.2f} | "
          f"{os.getloadavg()[0]:.2f} | {err:.1e} |")
    d.close()


def timed_runs(d: aotrt.Delegate, x: np.ndarray, warmup: int,
               iters: int) -> tuple[list[float], list[float]]:
    """Seconds per run until its work is done, and until run() returned, after warm-up."""
    for _ in range(warmup):
        d.run(x)
        d.stream.commit_and_wait()
    times, host = [], []
    for _ in range(iters):
        t = time.perf_counter()
        d.run(x)
        host.append(time.perf_counter() - t)
        d.stream.commit_and_wait()
        times.append(time.perf_counter() - t)
    return times, host


def model_row(a: argparse.Namespace) -> None:
    """Host time of run() on a real model: the time until run() returns (everything queued)
    and until its work is done, per instruction; prints one markdown table row."""
    prog, x = torchvision_program(a.torchvision, a.size)
    d = aotrt.load(prog, device=a.device, check_hazards=a.hazards, cuda_graph=False)
    times, host = timed_runs(d, x, 5, a.iters)
    n_ins = len(prog.instructions)
    hmed, med = statistics.median(host), statistics.median(times)
    print(f"| {a.device} | {a.torchvision} {a.size}x{a.size} | {n_ins} | "
          f"{'on' if a.hazards else 'off'} | {hmed * 1e3:.2f} | {hmed / n_ins * 1e6:.1f} | "
          f"{med * 1e3:.2f} | {os.getloadavg()[0]:.2f} |")
    d.close()


if __name__ == "__main__":
    main()
