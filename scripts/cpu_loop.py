"""Mean ms of finished aotrt runs (run, then its outputs read as numpy arrays) of one
bench_cpu.py model on cpu, back to back, for a before/after comparison of one change (each
side in its own process, nothing else running).

    python3 scripts/cpu_loop.py yolov8n [--seconds 12]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> None:
    """Export with bench_cpu.py's layout rule, warm up, then run for --seconds."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--seconds", type=float, default=12.0)
    a = ap.parse_args()
    import aotrt
    import bench_cpu

    m, x = bench_cpu.build(a.model)
    prog = aotrt.export(m, x, layout=bench_cpu.aotrt_layout(m))
    xs = [t.numpy() for t in x]
    with aotrt.load(prog, device="cpu") as d:
        def finished() -> None:
            for o in d.run(*xs):
                np.asarray(o)
        for _ in range(5):
            finished()
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < a.seconds:
            finished()
            n += 1
        print(f"{a.model}: {n} runs, {(time.perf_counter() - t0) / n * 1e3:.2f} ms a run")


if __name__ == "__main__":
    main()
