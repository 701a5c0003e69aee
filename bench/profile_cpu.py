"""Where a saved program's time goes on the cpu device: the wall time of each planned command
(its work on the stream's worker), summed per instruction kind, over several runs.

    .venv/bin/python bench/profile_cpu.py PROGRAM.aotp INPUTS.npz [--threads 2] [--runs 10]

INPUTS.npz holds x0, x1, ... (bench_cpu.py's workdir has both files per model). Reads the
delegate's private run plan (a measuring tool, not an API); steps that are not planned at
load (per-run views) are counted as one "unplanned" bucket through the whole run's time.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import re
import sys
import time
from typing import Any, Callable

import numpy as np

import aotrt


def _timed(work: Callable[[], None], key: str, acc: dict[str, list[float]]) -> Callable:
    def run() -> None:
        t = time.perf_counter()
        work()
        acc[key].append(time.perf_counter() - t)
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("program")
    ap.add_argument("inputs")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    data = np.load(args.inputs)
    xs = [data[k] for k in sorted((k for k in data.files if k.startswith("x")),
                                  key=lambda k: int(k[1:]))]
    d = aotrt.load(aotrt.Program.load(args.program), device="cpu", threads=args.threads)
    acc: dict[str, list[float]] = collections.defaultdict(list)
    per_ins: dict[str, list[float]] = collections.defaultdict(list)
    for step in d._steps:       # noqa: SLF001 - a profiler reads the plan
        if step.planned is None:
            continue
        # "instruction #i kernel|library NAME [src]": kernels grouped by name less its number.
        parts = step.label.split(" ")
        name = re.sub(r"_?\d+$", "", parts[3]) if len(parts) > 3 else ""
        key = f"{parts[2] if len(parts) > 2 else step.label} {name}".strip()
        cmds = []
        for cmd in step.planned:
            w = _timed(cmd.work, key, acc)
            w = _timed(w, step.label, per_ins)
            cmds.append(dataclasses.replace(cmd, work=w))
        step.planned = tuple(cmds)
    for _ in range(2):
        d.run(*xs)
        d.stream.commit_and_wait()
    acc.clear()
    per_ins.clear()
    walls = []
    for _ in range(args.runs):
        t = time.perf_counter()
        d.run(*xs)
        d.stream.commit_and_wait()
        walls.append(time.perf_counter() - t)
    wall = float(np.median(walls)) * 1e3
    total = sum(sum(v) for v in acc.values()) / args.runs * 1e3
    print(f"median run {wall:.2f} ms; planned work {total:.2f} ms; the rest (Python, "
          f"queueing, unplanned steps) {wall - total:.2f} ms")
    rows = sorted(((sum(v) / args.runs * 1e3, len(v) // args.runs, k) for k, v in acc.items()),
                  reverse=True)
    print(f"{'ms/run':>8} {'calls':>6}  kind")
    for ms, n, k in rows:
        print(f"{ms:8.2f} {n:6d}  {k}")
    print(f"\ntop {args.top} instructions:")
    rows = sorted(((sum(v) / args.runs * 1e3, k) for k, v in per_ins.items()), reverse=True)
    for ms, k in rows[:args.top]:
        print(f"{ms:8.2f}  {k[:110]}")
    d.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
