"""On the GPU machine: find the submodules of a zoo model that aotrt's cuda device gets wrong.

    python3 scripts/cuda_bisect.py MODEL [MODEL ...] [--dtype float16] [--depth 2]

Builds the zoo case (bench/zoo.py: seeded weights, recalibrated BatchNorms), records each
submodule's inputs in one eager call, then exports every submodule down to --depth whose
inputs are all tensors, runs it on cuda, and prints its error against a float64 eager
reference beside eager's own error in the dtype. A submodule whose error is far above
eager's, while its children's are not, is where the defect is.
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


def _record(seen: dict, path: str, args: tuple) -> None:
    # A pre-hook returning a value would replace the call's arguments: return None.
    seen.setdefault(path, args)


def bisect(name: str, dtype_name: str, depth: int, device: str) -> None:
    """Print one line per submodule: its error on cuda and eager's."""
    m, inputs = zoo.build(name)
    dt = getattr(torch, dtype_name)
    seen: dict[str, tuple] = {}
    hooks = []
    for path, mod in m.named_modules():
        if path and path.count(".") < depth:
            hooks.append(mod.register_forward_pre_hook(
                lambda mod, args, path=path: _record(seen, path, args)))
    with torch.no_grad():
        m(*inputs)
    for h in hooks:
        h.remove()
    mods = dict(m.named_modules())
    print(f"== {name} {dtype_name}: {len(seen)} submodules")
    for path, args in seen.items():
        if not args or not all(isinstance(a, torch.Tensor) for a in args):
            continue
        sub = mods[path]
        try:
            with torch.no_grad():
                ref = zoo.tensors(copy.deepcopy(sub).double()(*[
                    a.double() if a.is_floating_point() else a for a in args]))
                sub_dt = copy.deepcopy(sub).to(dt)
                cast = tuple(a.to(dt) if a.is_floating_point() else a for a in args)
                eager = zoo.tensors(copy.deepcopy(sub_dt).to(device)(*[a.to(device) for a in cast]))
                prog = aotrt.export(sub_dt, cast)
            d = aotrt.load(prog, device=device)
            got = d.run(*[a.numpy() for a in cast])
            d.close()
            errs = [zoo.rel_err(torch.from_numpy(np.asarray(g).astype("float64")), r)
                    for g, r in zip(got, ref) if r.is_floating_point()]
            eerr = [zoo.rel_err(e.cpu(), r) for e, r in zip(eager, ref) if r.is_floating_point()]
            worst = max(errs, default=0.0)
            flag = " <<<" if worst > 10 * max(max(eerr, default=0.0), 2e-3) else ""
            print(f"{path:<28} {type(sub).__name__:<22} aotrt {worst:9.2e}  eager "
                  f"{max(eerr, default=0.0):9.2e}{flag}", flush=True)
        except Exception as e:  # noqa: BLE001 - one submodule's failure, reported
            print(f"{path:<28} {type(sub).__name__:<22} {type(e).__name__}: "
                  f"{str(e)[:120]}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    for name in args.models:
        try:
            bisect(name, args.dtype, args.depth, args.device)
        except Exception:  # noqa: BLE001 - the next model still runs
            traceback.print_exc()
    return 0


if __name__ == "__main__":
    sys.exit(main())
