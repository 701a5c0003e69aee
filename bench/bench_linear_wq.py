"""Time weight-only quantized linear layers (linear_wq, issue 38) against float32 linear on
one device: GPT-2-sized layers (768 -> 3072 and 3072 -> 768) and the two as an MLP, at a
few row counts, each as a one-method program run through aotrt.load (the decode path: the
bound static plan, native on cpu). Prints the median time a run and the ratio to float32.

    .venv/bin/python bench/bench_linear_wq.py [--device cpu] [--rows 1,4,16,64] [--runs 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aotrt  # noqa: E402
from aotrt.exporter.builder import ProgramBuilder  # noqa: E402
from aotrt.measure import time_calls  # noqa: E402

LAYERS = {"fc 768->3072": [(3072, 768)], "proj 3072->768": [(768, 3072)],
          "mlp 768->3072->768": [(3072, 768), (768, 3072)]}


def pack(w: np.ndarray, scheme: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """(qweight, scales, zeros, group size) of float32 weights (numpy; no torch)."""
    n, k = w.shape
    if scheme == "int8":
        s = np.maximum(np.abs(w).max(1), 1e-8) / 127
        return np.clip(np.round(w / s[:, None]), -127, 127).astype(np.int8), \
            s.astype(np.float32), None, k
    gs = int(scheme.split("g")[1])
    g = w.reshape(n, k // gs, gs)
    lo, hi = np.minimum(g.min(-1), 0), np.maximum(g.max(-1), 0)
    s = np.maximum(hi - lo, 1e-8) / 15
    z = np.clip(np.round(-lo / s), 0, 15)
    q = np.clip(np.round(g / s[..., None]) + z[..., None], 0, 15).astype(np.uint8).reshape(n, k)
    return q[:, 0::2] | (q[:, 1::2] << 4), s.astype(np.float32), z.astype(np.float32), gs


def program(shapes: list[tuple[int, int]], rows: int, scheme: str) -> aotrt.Program:
    """x -> each layer in turn (float32 linear, or linear_wq of `scheme`)."""
    rng = np.random.default_rng(0)
    b = ProgramBuilder(f"bench_{scheme}")
    cur = b.input("x", "float32", [rows, shapes[0][1]])
    for i, (n, k) in enumerate(shapes):
        w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        last = i == len(shapes) - 1
        out = b.output("y", "float32", [rows, n]) if last else b.in_buffer(
            b.buffer(rows * n * 4), 0, "float32", [rows, n])
        bias = b.constant(f"b{i}", np.zeros(n, np.float32))
        if scheme == "float32":
            b.library("linear", [out], [cur, b.constant(f"w{i}", w), bias])
        else:
            q, s, z, gs = pack(w, scheme)
            ins = [cur, b.constant(f"q{i}", q), b.constant(f"s{i}", s),
                   None if z is None else b.constant(f"z{i}", z), bias]
            b.library("linear_wq", [out], ins, {"bits": 8 if scheme == "int8" else 4,
                                                "group_size": gs})
        cur = out
    return b.build()


def main() -> None:
    """Run the table."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cpu")
    p.add_argument("--rows", default="1,4,16,64")
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--schemes", default="float32,int8,int4g128,int4g32")
    p.add_argument("--threads", type=int, default=None, help="cpu threads (default: all)")
    a = p.parse_args()
    schemes = a.schemes.split(",")
    print(f"device {a.device}, threads {a.threads or 'default'}; median (min) ms a run over "
          f"{a.runs} runs, ratio of medians to float32")
    for name, shapes in LAYERS.items():
        for rows in (int(r) for r in a.rows.split(",")):
            x = np.random.default_rng(1).standard_normal((rows, shapes[0][1])).astype(
                np.float32)
            cells, base = [], None
            for scheme in schemes:
                opts = {"threads": a.threads} if a.threads else {}
                with aotrt.load(program(shapes, rows, scheme), device=a.device, **opts) as m:
                    step = m.bind()

                    def once() -> None:
                        step.run(x)
                        m.stream.synchronize()
                    times = time_calls(once, a.runs, 20)
                t, lo = statistics.median(times) * 1e3, min(times) * 1e3
                base = t if scheme == "float32" else base
                ratio = f" {t / base:.2f}x" if base and scheme != "float32" else ""
                cells.append(f"{scheme} {t:.3f} ({lo:.3f}){ratio}")
            print(f"{name:20s} rows {rows:3d}: " + "  ".join(cells))


if __name__ == "__main__":
    main()
