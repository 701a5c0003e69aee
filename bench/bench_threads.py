"""Generated cpu kernels on one core and on several (issue #8 items 3 and 5).

    .venv/bin/python bench/bench_threads.py prepare --dir DIR
    .venv/bin/python bench/bench_threads.py time --dir DIR --model NAME [--threads N]
        [--iters 30] [--label TEXT]

`prepare` (imports torch) builds each model with seeded random weights, exports it with
aotrt.export(model, (x,), layout="contiguous"), and saves the program, its input and the
torch eager output under DIR. `time` (no torch) loads one program with aotrt.load(prog,
device="cpu"[, threads=N]) in this process, runs it `--iters` times after warm-up (each run:
m.run(x), then m.stream.commit_and_wait()) and prints one JSON line: the median, min and max
ms, the error against eager, os.getloadavg() before and after. One process per
configuration; run the `time` step with PYTHONPATH pointing at the aotrt tree to measure
(an older checkout has no threads= argument: leave --threads out there).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

MODELS = {
    "pointwise": "a chain of 12 pointwise ops (silu, tanh, exp, mul, add...) on 1x64x256x256",
    "norm_softmax": "softmax(x * 0.5, -1) + LayerNorm(x), x 4096x1024",
    "resnet18": "torchvision resnet18, random weights, 1x3x224x224",
    "mobilenet_v2": "torchvision mobilenet_v2, random weights, 1x3x224x224",
}


def build(name: str) -> tuple[Any, Any]:
    """(module in eval mode, float32 input), seeded."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)
    if name == "pointwise":
        class Chain(nn.Module):
            """Pointwise only: fused into large elementwise kernels."""

            def forward(self, x: Any) -> Any:
                y = torch.nn.functional.silu(x) * 0.5 + torch.tanh(x)
                z = torch.exp(-y * y) * x - torch.sigmoid(y)
                return torch.sqrt(torch.abs(z) + 1.0) * torch.cos(y) + z * 0.25

        return Chain().eval(), torch.randn(1, 64, 256, 256, generator=g)
    if name == "norm_softmax":
        class NormSoftmax(nn.Module):
            """LayerNorm and softmax rows: reduce kernels, one row per outer element."""

            def __init__(self) -> None:
                super().__init__()
                self.ln = nn.LayerNorm(1024)

            def forward(self, x: Any) -> Any:
                # Not softmax(ln(x)): the load limits count nested reductions as rn ** depth.
                return torch.softmax(x * 0.5, -1) + self.ln(x)

        return NormSoftmax().eval(), torch.randn(4096, 1024, generator=g)
    import torchvision

    m = getattr(torchvision.models, name)(weights=None)
    return m.eval(), torch.randn(1, 3, 224, 224, generator=g)


def prepare(workdir: Path) -> None:
    """Export every model once; save program, input and eager output."""
    import torch

    import aotrt

    workdir.mkdir(parents=True, exist_ok=True)
    for name in MODELS:
        m, x = build(name)
        with torch.no_grad():
            ref = m(x)
        prog = aotrt.export(m, (x,), layout="contiguous")
        prog.save(workdir / f"{name}.aotp")
        np.save(workdir / f"{name}.x.npy", x.numpy())
        np.save(workdir / f"{name}.ref.npy", ref.numpy())
        print(name, len(prog.kernels), "kernels", len(prog.instructions), "instructions",
              flush=True)


def time_model(workdir: Path, name: str, threads: int | None, iters: int) -> dict:
    """Load one program and time its runs (see the module docstring)."""
    import aotrt

    load0 = os.getloadavg()
    x = np.load(workdir / f"{name}.x.npy")
    ref = np.load(workdir / f"{name}.ref.npy").astype(np.float64)
    kw = {} if threads is None else {"threads": threads}
    t = time.perf_counter()
    m = aotrt.load(str(workdir / f"{name}.aotp"), device="cpu", **kw)
    load_s = time.perf_counter() - t
    (y,) = m.run(x)
    m.stream.commit_and_wait()
    got = np.asarray(y).astype(np.float64)
    err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    for _ in range(3):
        m.run(x)
        m.stream.commit_and_wait()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        m.run(x)
        m.stream.commit_and_wait()
        times.append((time.perf_counter() - t) * 1e3)
    m.close()
    return {"model": name, "threads": threads, "ms": statistics.median(times),
            "min_ms": min(times), "max_ms": max(times), "runs": len(times),
            "rel_err_vs_eager": err, "load_s": load_s, "aotrt": aotrt.__file__,
            "loadavg_before": load0, "loadavg_after": os.getloadavg()}


def main() -> None:
    """Command line (see the module docstring)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("step", choices=["prepare", "time"])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--model", choices=sorted(MODELS))
    ap.add_argument("--threads", type=int)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    if a.step == "prepare":
        prepare(Path(a.dir))
        return
    if a.model is None:
        sys.exit("time: --model is required")
    os.environ.pop("AOTRT_CHECK_HAZARDS", None)
    res = time_model(Path(a.dir), a.model, a.threads, a.iters)
    res["label"] = a.label
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
