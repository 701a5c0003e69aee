"""The torch side of `aotrt demo` and `aotrt export`: the CLI imports this lazily, so that
only these two commands (and aotrt.export) import torch."""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from aotrt.errors import InvalidArgument
from aotrt.measure import max_errors, ms, synced_run, time_calls
from aotrt.models import demo_model, load_model
from aotrt.runtime.device import default_device

__all__ = ["run_demo", "run_export"]


def _leaves(out: Any) -> list[Any]:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [x for v in out.values() for x in _leaves(v)]
    if isinstance(out, (list, tuple)):
        return [x for v in out for x in _leaves(v)]
    return []


def run_demo(args: argparse.Namespace) -> int:
    """Export a YOLO-style detector, run it, and compare it with torch eager."""
    import torch

    import aotrt

    torch.manual_seed(args.seed)
    name, model = demo_model(args.model, args.size)
    x = torch.rand(1, 3, args.size, args.size)
    with torch.no_grad():
        ref = _leaves(model(x))      # eager once first: Detect caches its anchors
    # Eager is timed before aotrt loads: a cpu delegate's OpenMP pool, still spinning after
    # its runs, took the cores from torch's threads and tripled eager's time (YOLOv8n 320²:
    # 42-48 ms in this process, 14.8 in a process of its own).
    dev = args.device or default_device()
    eager_times = _eager_times(copy.deepcopy(model), x, dev, args.runs, args.warmup)
    nparams = sum(p.numel() for p in model.parameters())
    print(f"model:    {name}, {nparams / 1e6:.2f} M parameters, input 1x3x{args.size}x{args.size}")
    t0 = time.perf_counter()
    prog = aotrt.export(model, (x,))
    export_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="aotrt-demo-") as tmp:
        path = Path(tmp) / "model.aotp"
        prog.save(path)
        size = path.stat().st_size
        print(f"export:   {export_s:.2f} s, {len(prog.instructions)} instructions, "
              f"{len(prog.kernels)} kernels, file {size / 2**20:.1f} MiB")
        t0 = time.perf_counter()
        with aotrt.load(path, device=args.device) as m:
            load_s = time.perf_counter() - t0
            dev = m.device.name
            # The input lives on the delegate's device (a torch tensor, taken without a copy).
            xd = x.to(dev) if dev == "cuda" else x.numpy()
            outs = synced_run(m, [xd])
            got = [o.numpy() for o in outs]
            if len(got) != len(ref):
                print(f"note: {len(got)} program outputs vs {len(ref)} eager tensors; comparing "
                      f"the first")
                got, ref = got[:1], ref[:1]
            abs_err, rel = max_errors(got, [r.numpy() for r in ref])
            times = time_calls(lambda: synced_run(m, [xd]), args.runs, args.warmup)
            print(f"device:   {dev}")
            print(f"load:     {load_s:.3f} s")
            print(f"error:    max abs {abs_err:.3e}, max relative {rel:.3e} vs eager "
                  f"({len(got)} output(s))")
            print(f"latency:  median {ms(statistics.median(times))} over {args.runs} runs "
                  f"(torch eager on {dev}: {ms(statistics.median(eager_times))})")
    tol = 1e-3
    if not rel <= tol:          # a NaN error (see max_errors) fails too
        print(f"FAIL: relative error {rel:.3e} above {tol}")
        return 1
    return 0


def _eager_times(model: Any, x: Any, dev: str, runs: int, warmup: int) -> list[float]:
    """Median-ready timings of torch eager on `dev` (synchronized on cuda)."""
    import torch

    model, x = model.to(dev), x.to(dev)

    def step() -> None:
        model(x)
        if dev == "cuda":
            torch.cuda.synchronize()
    with torch.no_grad():
        return time_calls(step, runs, warmup)


def _shapes(specs: list[str]) -> list[list[int]]:
    """--shape values ('1,3,320,320') as lists of ints; InvalidArgument for anything else."""
    shapes = []
    for spec in specs:
        try:
            dims = [int(s) for s in spec.split(",")]
        except ValueError:
            dims = []
        if not dims or any(d < 0 for d in dims):
            raise InvalidArgument(f"--shape: expected sizes like 1,3,320,320, got {spec!r}")
        shapes.append(dims)
    return shapes


def run_export(args: argparse.Namespace) -> int:
    """Export a model (by name, module:factory, or a torch.export .pt2 file) to a .aotp."""
    import torch

    import aotrt

    name, model = load_model(args.model, args.size)
    t0 = time.perf_counter()
    if isinstance(model, torch.export.ExportedProgram):
        if args.shape or args.dtype:
            raise InvalidArgument("--shape/--dtype: a .pt2 program has its own input shapes "
                                  "and dtypes")
        prog = aotrt.export(model, None, name=name, layout=args.layout)
    else:
        shapes = _shapes(args.shape or [f"1,3,{args.size},{args.size}"])
        tdt = getattr(torch, args.dtype or "float32")
        torch.manual_seed(args.seed)
        inputs = tuple(torch.rand(*sh).to(tdt) for sh in shapes)
        model = model.to(tdt)
        try:
            with torch.no_grad():
                model(*inputs)
        except Exception as e:  # noqa: BLE001 - the model's own refusal of these inputs
            raise InvalidArgument(f"--shape: {name} does not run on {args.dtype or 'float32'} "
                                  f"inputs of shape {shapes}: {type(e).__name__}: {e}") from e
        prog = aotrt.export(model, inputs, layout=args.layout)
    prog.save(args.output)
    print(f"exported {name} to {args.output} in {time.perf_counter() - t0:.2f} s")
    print(prog.summary())
    return 0
