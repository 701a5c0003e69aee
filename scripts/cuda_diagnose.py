"""On the GPU machine: which load or export knob changes a zoo model's cuda error.

    python3 scripts/cuda_diagnose.py MODEL [MODEL ...] [--dtype float16]

For each model (bench/zoo.py's case, recalibrated), the error against a float64 eager
reference of: the default program and load, without CUDA graphs, with the hazard checker on,
on a second run, and exported with contiguous (NCHW) activations. Then single 3-D
convolutions shaped like R(2+1)D's factored ones, in both layouts.
"""

from __future__ import annotations

import argparse
import copy
import sys
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import zoo  # noqa: E402

import aotrt  # noqa: E402


def _rel(got: np.ndarray, ref: torch.Tensor) -> float:
    return zoo.rel_err(torch.from_numpy(np.asarray(got).astype(np.float64)), ref)


def _try(label: str, fn: object) -> None:
    try:
        print(f"  {label:<34} {fn():9.2e}", flush=True)   # type: ignore[operator]
    except Exception as e:  # noqa: BLE001 - reported, the next probe runs
        print(f"  {label:<34} {type(e).__name__}: {str(e)[:150]}", flush=True)


def model(name: str, dtype_name: str) -> None:
    """Print the error of each variant of one model's program."""
    m, inputs = zoo.build(name)
    dt = getattr(torch, dtype_name)
    x = tuple(a.to(dt) for a in inputs)
    with torch.no_grad():
        ref = [o for o in zoo.tensors(copy.deepcopy(m).double()(*[a.double() for a in inputs]))
               if o.is_floating_point()]
        m_dt = copy.deepcopy(m).to(dt)
        progs = {lay: aotrt.export(m_dt, x, layout=lay) for lay in ("auto", "contiguous")}
    xs = [a.numpy() for a in x]
    print(f"== {name} {dtype_name}", flush=True)

    def err(layout: str = "auto", runs: int = 1, **kw: object) -> float:
        d = aotrt.load(progs[layout], device="cuda", **kw)
        try:
            for _ in range(runs):
                got = d.run(*xs)
            return max(_rel(g, r) for g, r in zip(got, ref))
        finally:
            d.close()

    _try("default", err)
    _try("cuda_graph=False", lambda: err(cuda_graph=False))
    _try("check_hazards=True, no graph", lambda: err(cuda_graph=False, check_hazards=True))
    _try("third run", lambda: err(runs=3))
    _try("layout=contiguous", lambda: err("contiguous"))
    _try("layout=contiguous, no graph", lambda: err("contiguous", cuda_graph=False))


def conv3d() -> None:
    """Single 3-D convolutions like R(2+1)D's, exported in both layouts."""
    print("== conv3d", flush=True)
    for cin, cout, k, p in ((45, 64, (3, 1, 1), (1, 0, 0)), (64, 144, (1, 3, 3), (0, 1, 1)),
                            (144, 64, (3, 1, 1), (1, 0, 0)), (48, 64, (3, 1, 1), (1, 0, 0)),
                            (45, 64, (3, 3, 3), (1, 1, 1))):
        torch.manual_seed(0)
        conv = torch.nn.Conv3d(cin, cout, k, padding=p, bias=False).eval()
        x = torch.randn(1, cin, 8, 16, 16)
        with torch.no_grad():
            ref = conv.double()(x.double())
            c16 = copy.deepcopy(conv).half()
            for lay in ("auto", "contiguous"):
                def e(lay: str = lay) -> float:
                    d = aotrt.load(aotrt.export(c16, (x.half(),), layout=lay), device="cuda")
                    try:
                        return _rel(d.run(x.half().numpy())[0], ref)
                    finally:
                        d.close()
                _try(f"{cin}->{cout} k{k} {lay}", e)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--dtype", default="float16")
    args = ap.parse_args()
    conv3d()
    for name in args.models:
        try:
            model(name, args.dtype)
        except Exception:  # noqa: BLE001 - the next model still runs
            traceback.print_exc()
    return 0


if __name__ == "__main__":
    sys.exit(main())
