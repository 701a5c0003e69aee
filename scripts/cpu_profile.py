"""Where one cpu run's time goes, by instruction kind: each queued command is timed on the
stream's worker, under the label of the instruction it belongs to.

    python3 scripts/cpu_profile.py gpt2 [--threads 2] [--runs 5] [--layout convnets-nhwc]

Models are bench/bench_cpu.py's. Prints the median run, then the commands grouped by
instruction kind (library op name, or kernel name without its number), most time first.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> None:
    """Export, load on cpu, time the commands of a few runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--layout", default="convnets-nhwc")
    a = ap.parse_args()
    import bench_cpu
    import numpy as np
    import torch

    import aotrt
    from aotrt.runtime import device as device_mod

    m, inputs = bench_cpu.build(a.model)
    with torch.no_grad():
        prog = aotrt.export(m, inputs, layout=bench_cpu.aotrt_layout(m, a.layout))
    xs = [np.ascontiguousarray(t.numpy()) for t in inputs]
    times: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.Counter()
    record = device_mod.Stream.record

    def timed(self, accesses, work, label=""):  # type: ignore[no-untyped-def]
        name = self.label or label
        key = re.sub(r"^instruction #\d+ ", "", name).split(" [")[0]
        key = re.sub(r"k\d+_", "k_", key)

        def run(*args):  # type: ignore[no-untyped-def]
            t = time.perf_counter()
            try:
                return work(*args)
            finally:
                times[key] += time.perf_counter() - t
                counts[key] += 1
        return record(self, accesses, run, label)

    with aotrt.load(prog, device="cpu", threads=a.threads) as d:
        for _ in range(2):
            d.run(*xs)
        device_mod.Stream.record = timed
        try:
            walls = []
            for _ in range(a.runs):
                t = time.perf_counter()
                d.run(*xs)
                walls.append(time.perf_counter() - t)
        finally:
            device_mod.Stream.record = record
    walls.sort()
    total = sum(times.values()) / a.runs
    print(f"{a.model}: {len(prog.instructions)} instructions, median run "
          f"{walls[len(walls) // 2] * 1e3:.1f} ms, commands {total * 1e3:.1f} ms a run")
    for key, t in sorted(times.items(), key=lambda kv: -kv[1])[:20]:
        print(f"  {t / a.runs * 1e3:8.2f} ms  x{counts[key] / a.runs:5.1f}  {key[:90]}")


if __name__ == "__main__":
    main()
