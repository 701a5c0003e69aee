"""Time resnet18 and mobilenet_v2 (1x3x224x224 float32) on the cpu device, exported with
layout="contiguous" and layout="channels_last", against torch eager, one process each.

    .venv/bin/python bench/bench_conv_cpu.py prepare DIR        # export (needs torch)
    .venv/bin/python bench/bench_conv_cpu.py aotrt DIR MODEL LAYOUT [--iters N]
    .venv/bin/python bench/bench_conv_cpu.py eager DIR MODEL LAYOUT [--iters N]

Each timing process prints one JSON line: the median and minimum ms of N full runs after
two warm-up runs, the max relative error against the eager output saved by `prepare`, the
1-minute load average before and after, and (aotrt) whether oneDNN served the device's
convolutions (its primitive counts). Whether oneDNN is used at all is the caller's choice:
without the onednn-cpu-gomp package importable the cpu device runs numpy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

MODELS = ("resnet18", "mobilenet_v2")
LAYOUTS = ("contiguous", "channels_last")


def _model(name: str):  # noqa: ANN202 - torch module
    import torch
    import torchvision

    torch.manual_seed(0)
    m = getattr(torchvision.models, name)(weights=None).eval()
    return m


def prepare(out_dir: str) -> None:
    """Export every (model, layout) and save the input and eager output."""
    import torch

    import aotrt

    os.makedirs(out_dir, exist_ok=True)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 3, 224, 224))
                         .astype(np.float32))
    np.save(os.path.join(out_dir, "x.npy"), x.numpy())
    for name in MODELS:
        m = _model(name)
        with torch.no_grad():
            np.save(os.path.join(out_dir, f"{name}.ref.npy"), m(x).numpy())
        for layout in LAYOUTS:
            prog = aotrt.export(m, (x,), layout=layout)
            prog.save(os.path.join(out_dir, f"{name}-{layout}.aotp"))
            print(f"exported {name} {layout}", flush=True)


def _time(fn, iters: int) -> tuple[float, float]:  # noqa: ANN001
    for _ in range(2):
        fn()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts), min(ts)


def run_aotrt(out_dir: str, name: str, layout: str, iters: int) -> dict:
    """Load the program on cpu and time full runs."""
    import aotrt
    from aotrt.runtime.device import get_device

    x = np.load(os.path.join(out_dir, "x.npy"))
    ref = np.load(os.path.join(out_dir, f"{name}.ref.npy"))
    la0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    m = aotrt.load(os.path.join(out_dir, f"{name}-{layout}.aotp"), device="cpu")
    load_s = time.perf_counter() - t0
    got = {}

    def once() -> None:
        got["y"] = np.asarray(m.run(x)[0])

    med, lo = _time(once, iters)
    err = float(np.abs(got["y"] - ref).max() / np.abs(ref).max())
    dnnl = get_device("cpu").libraries.dnnl
    m.close()
    return {"runner": "aotrt", "model": name, "layout": layout, "median_ms": med, "min_ms": lo,
            "load_s": load_s, "rel_err": err, "loadavg": [la0, os.getloadavg()[0]],
            "onednn": None if dnnl is None else dict(dnnl.stats)}


def run_eager(out_dir: str, name: str, layout: str, iters: int) -> dict:
    """torch eager on the same input (channels_last: model and input converted)."""
    import torch

    x = torch.from_numpy(np.load(os.path.join(out_dir, "x.npy")))
    m = _model(name)
    if layout == "channels_last":
        m, x = m.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    la0 = os.getloadavg()[0]
    with torch.no_grad():
        med, lo = _time(lambda: m(x), iters)
    return {"runner": "eager", "model": name, "layout": layout, "median_ms": med, "min_ms": lo,
            "threads": torch.get_num_threads(), "loadavg": [la0, os.getloadavg()[0]]}


def main() -> None:
    """Command line (see the module docstring)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("prepare", "aotrt", "eager"))
    ap.add_argument("dir")
    ap.add_argument("model", nargs="?", choices=MODELS)
    ap.add_argument("layout", nargs="?", choices=LAYOUTS)
    ap.add_argument("--iters", type=int, default=7)
    a = ap.parse_args()
    if a.what == "prepare":
        prepare(a.dir)
        return
    fn = run_aotrt if a.what == "aotrt" else run_eager
    print(json.dumps(fn(a.dir, a.model, a.layout, a.iters)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
