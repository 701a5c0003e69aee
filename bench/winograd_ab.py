"""Time one saved program on the cpu device with the direct convolution and with Winograd:
one process per setting, the settings in turn, several rounds.

    .venv/bin/python bench/winograd_ab.py PROGRAM.aotp INPUTS.npz [--tiles 0,4]
        [--rounds 3] [--blocks 8] [--runs 10] [--threads 2]

INPUTS.npz holds x0, x1, ... (bench_cpu.py's workdir has both files per model). Each process
loads the program with Fp32Math(conv_winograd=TILE) and times --blocks blocks of --runs runs
after 3 warm-ups. Prints, per setting, each process's median of its block medians (ms), the
median over processes, and the largest norm-wise relative difference of its outputs from the
first setting's. Delegates of several settings in one process share its caches, and the
Winograd buffers of one then slow the others: one process each. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def child(program: str, inputs: str, tile: int, blocks: int, runs: int, threads: int,
          save: str) -> None:
    """Load, time and save the outputs of one setting; print its block medians as JSON."""
    import aotrt

    data = np.load(inputs)
    xs = [data[k] for k in sorted(k for k in data.files if k.startswith("x"))]
    d = aotrt.load(aotrt.Program.load(program), device="cpu", threads=threads,
                   fp32_math=aotrt.Fp32Math(conv_winograd=tile))
    outs = []
    for _ in range(3):
        outs = [np.asarray(o, dtype=np.float64) for o in d.run(*xs)]
    np.savez(save, *outs)
    medians = []
    for _ in range(blocks):
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            d.run(*xs)
            times.append(time.perf_counter() - start)
        medians.append(float(np.median(times)) * 1e3)
    print(json.dumps(medians))


def main() -> None:
    """Run the settings in turn, one process each, and print the summary."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("program")
    ap.add_argument("inputs")
    ap.add_argument("--tiles", default="0,4", help="Fp32Math.conv_winograd values")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--runs", type=int, default=10, help="runs a block")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--save", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.program, args.inputs, args.child, args.blocks, args.runs, args.threads,
              args.save)
        return
    tiles = [int(t) for t in args.tiles.split(",")]
    got: dict[int, list[float]] = {t: [] for t in tiles}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for t in tiles:
                cmd = [sys.executable, __file__, args.program, args.inputs, "--child", str(t),
                       "--blocks", str(args.blocks), "--runs", str(args.runs), "--threads",
                       str(args.threads), "--save", os.path.join(tmp, f"{t}.npz")]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                got[t].append(float(np.median(json.loads(out.strip().splitlines()[-1]))))
        outs = {t: np.load(os.path.join(tmp, f"{t}.npz")) for t in tiles}
        base = outs[tiles[0]]
        for t in tiles:
            diff = max(float(np.linalg.norm(outs[t][k] - base[k])
                             / max(np.linalg.norm(base[k]), 1e-300)) for k in base.files)
            print(f"conv_winograd={t}: " + " / ".join(f"{v:.2f}" for v in got[t])
                  + f"  median {np.median(got[t]):.2f} ms  output diff {diff:.1e}")


if __name__ == "__main__":
    main()
