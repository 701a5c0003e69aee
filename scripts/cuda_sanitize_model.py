"""On the GPU machine: a zoo model's program under compute-sanitizer.

    python3 scripts/cuda_sanitize_model.py export MODEL DIR [--layout auto] [--dtype float16]
    compute-sanitizer --tool initcheck python3 scripts/cuda_sanitize_model.py run DIR

`export` (needs torch) saves DIR/program.aotp and DIR/inputs.npz; `run` (the runtime only,
so the sanitizer sees aotrt's kernels and libraries, not torch's) loads it on cuda without
CUDA graphs, runs it once and prints the output norms.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def export(name: str, out: Path, layout: str, dtype_name: str) -> None:
    """Build the zoo case and save its program and inputs."""
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    import zoo

    import aotrt

    m, inputs = zoo.build(name)
    with torch.no_grad():
        ref = zoo.tensors(m.double()(*(a.double() for a in inputs)))
    print("reference norms", [float(r.norm()) for r in ref])
    dt = getattr(torch, dtype_name)
    x = tuple(a.to(dt) for a in inputs)
    with torch.no_grad():
        prog = aotrt.export(m.to(dt), x, layout=layout)
    out.mkdir(parents=True, exist_ok=True)
    prog.save(out / "program.aotp")
    np.savez(out / "inputs.npz", *[a.numpy() for a in x])
    print(f"saved {len(prog.instructions)} instructions to {out}")


def run(out: Path) -> None:
    """Load on cuda without graphs, run once, print the outputs' norms."""
    import aotrt

    data = np.load(out / "inputs.npz")
    xs = [data[f"arr_{i}"] for i in range(len(data.files))]
    d = aotrt.load(aotrt.Program.load(out / "program.aotp"), device="cuda", cuda_graph=False)
    got = d.run(*xs)
    print("norms", [float(np.linalg.norm(np.asarray(g).astype(np.float64))) for g in got])
    d.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["export", "run"])
    ap.add_argument("args", nargs="+")
    ap.add_argument("--layout", default="auto")
    ap.add_argument("--dtype", default="float16")
    a = ap.parse_args()
    if a.mode == "export":
        export(a.args[0], Path(a.args[1]), a.layout, a.dtype)
    else:
        run(Path(a.args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
