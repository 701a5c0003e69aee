"""The command line: `python -m aotrt demo | export | run | bench | inspect`.

`run`, `bench` and `inspect` need only the runtime (numpy); `demo` and `export` import
torch, and only inside their own commands.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from aotrt import dtypes
from aotrt.errors import AotrtError

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# models (torch is imported inside the functions only)


def tiny_yolo(imgsz: int = 320, nc: int = 8) -> Any:
    """A small YOLOv8-style detector: Conv-BN-SiLU, C2f (chunk + cat), SPPF, an upsampling
    neck with cat, and a Detect head with DFL, anchors precomputed for `imgsz`."""
    import torch
    from torch import nn

    class Conv(nn.Module):
        def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1) -> None:
            super().__init__()
            self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
            self.bn = nn.BatchNorm2d(c2)
            self.act = nn.SiLU()

        def forward(self, x: Any) -> Any:
            return self.act(self.bn(self.conv(x)))

    class Bottleneck(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.cv1, self.cv2 = Conv(c, c, 3), Conv(c, c, 3)

        def forward(self, x: Any) -> Any:
            return x + self.cv2(self.cv1(x))

    class C2f(nn.Module):
        def __init__(self, c1: int, c2: int, n: int = 1) -> None:
            super().__init__()
            self.c = c2 // 2
            self.cv1 = Conv(c1, 2 * self.c)
            self.cv2 = Conv((2 + n) * self.c, c2)
            self.m = nn.ModuleList(Bottleneck(self.c) for _ in range(n))

        def forward(self, x: Any) -> Any:
            y = list(self.cv1(x).chunk(2, 1))
            y.extend(m(y[-1]) for m in self.m)
            return self.cv2(torch.cat(y, 1))

    class SPPF(nn.Module):
        def __init__(self, c1: int, c2: int) -> None:
            super().__init__()
            self.cv1, self.cv2 = Conv(c1, c1 // 2), Conv(c1 * 2, c2)
            self.m = nn.MaxPool2d(5, 1, 2)

        def forward(self, x: Any) -> Any:
            y = [self.cv1(x)]
            y.extend(self.m(y[-1]) for _ in range(3))
            return self.cv2(torch.cat(y, 1))

    class Detect(nn.Module):
        def __init__(self, chs: Sequence[int], strides: Sequence[int]) -> None:
            super().__init__()
            self.nc, self.reg = nc, 16
            self.box = nn.ModuleList(nn.Sequential(Conv(c, 32, 3), nn.Conv2d(32, 4 * 16, 1))
                                     for c in chs)
            self.cls = nn.ModuleList(nn.Sequential(Conv(c, 32, 3), nn.Conv2d(32, nc, 1))
                                     for c in chs)
            self.dfl = nn.Conv2d(16, 1, 1, bias=False).requires_grad_(False)
            self.dfl.weight.data[:] = torch.arange(16, dtype=torch.float32).view(1, 16, 1, 1)
            pts, strs = [], []
            for s in strides:
                n = imgsz // s
                sy, sx = torch.meshgrid(torch.arange(n) + 0.5, torch.arange(n) + 0.5,
                                        indexing="ij")
                pts.append(torch.stack((sx, sy), -1).view(-1, 2))
                strs.append(torch.full((n * n, 1), float(s)))
            self.register_buffer("anchors", torch.cat(pts).t().unsqueeze(0))
            self.register_buffer("strides", torch.cat(strs).t().unsqueeze(0))

        def forward(self, feats: list) -> Any:
            b = feats[0].shape[0]
            x = [torch.cat((bx(f), cl(f)), 1).view(b, 4 * 16 + self.nc, -1)
                 for f, bx, cl in zip(feats, self.box, self.cls)]
            x = torch.cat(x, 2)
            box, cls = x.split((4 * 16, self.nc), 1)
            a = box.shape[-1]
            dist = self.dfl(box.view(b, 4, 16, a).transpose(2, 1).softmax(1)).view(b, 4, a)
            lt, rb = dist.chunk(2, 1)
            xy = (self.anchors + (rb - lt) / 2) * self.strides
            wh = (lt + rb) * self.strides
            return torch.cat((xy, wh, cls.sigmoid()), 1)

    class TinyYolo(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(Conv(3, 16, 3, 2), Conv(16, 32, 3, 2), C2f(32, 32))
            self.p4 = nn.Sequential(Conv(32, 64, 3, 2), C2f(64, 64), SPPF(64, 64))
            self.up = nn.Upsample(scale_factor=2.0, mode="nearest")
            self.neck = C2f(96, 32)
            self.down = Conv(32, 32, 3, 2)
            self.neck2 = C2f(96, 64)
            self.detect = Detect((32, 64), (4, 8))

        def forward(self, x: Any) -> Any:
            p3 = self.stem(x)
            p4 = self.p4(p3)
            n3 = self.neck(torch.cat((self.up(p4), p3), 1))
            n4 = self.neck2(torch.cat((self.down(n3), p4), 1))
            return self.detect([n3, n4])

    torch.manual_seed(0)
    model = TinyYolo().eval()
    # Non-trivial batch-norm statistics, so that folding them is actually tested.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
    return model


def yolov8n() -> Any:
    """ultralytics' YOLOv8n built from its yaml with random weights (offline)."""
    os.environ.setdefault("YOLO_OFFLINE", "1")
    os.environ.setdefault("YOLO_CONFIG_DIR", os.path.join(tempfile.gettempdir(), "aotrt-yolo"))
    from ultralytics.nn.tasks import DetectionModel

    return DetectionModel("yolov8n.yaml", verbose=False).eval()


def demo_model(choice: str, imgsz: int) -> tuple[str, Any]:
    """('yolov8n (ultralytics)', model) when ultralytics imports, else the built-in one."""
    if choice in ("auto", "yolov8n"):
        try:
            return "YOLOv8n (ultralytics, random weights)", yolov8n()
        except ImportError as e:
            if choice == "yolov8n":
                raise AotrtError(f"ultralytics is not available: {e}") from e
            log.info("ultralytics unavailable (%s); using the built-in detector", e)
    return "TinyYolo (built-in YOLOv8-style detector)", tiny_yolo(imgsz)


def load_model(spec: str, imgsz: int) -> tuple[str, Any]:
    """A model by name ('yolov8n', 'tiny-yolo') or 'package.module:factory'."""
    if spec == "yolov8n":
        return "YOLOv8n", yolov8n()
    if spec == "tiny-yolo":
        return "TinyYolo", tiny_yolo(imgsz)
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise AotrtError(f"model: expected 'yolov8n', 'tiny-yolo' or 'module:factory', got "
                         f"{spec!r}")
    factory = getattr(importlib.import_module(module), attr)
    model = factory() if callable(factory) and not hasattr(factory, "forward") else factory
    return attr, model.eval()


# ---------------------------------------------------------------------------------------------
# helpers


def _leaves(out: Any) -> list[Any]:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [x for v in out.values() for x in _leaves(v)]
    if isinstance(out, (list, tuple)):
        return [x for v in out for x in _leaves(v)]
    return []


def _errors(got: Sequence[Any], ref: Sequence[Any]) -> tuple[float, float]:
    """(max abs error, max abs error / max |ref|) over all outputs, in float64."""
    abs_err, rel = 0.0, 0.0
    for g, r in zip(got, ref):
        g64 = np.asarray(g, dtype=np.float64)
        r64 = np.asarray(r, dtype=np.float64)
        if r64.size == 0:
            continue
        e = float(np.max(np.abs(g64 - r64)))
        abs_err = max(abs_err, e)
        rel = max(rel, e / max(float(np.max(np.abs(r64))), 1e-30))
    return abs_err, rel


def _time(fn: Callable[[], Any], runs: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _random_inputs(prog: Any, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    for s in prog.inputs:
        dt = dtypes.as_dtype(s["dtype"])
        if dt.is_float:
            a = rng.standard_normal(s["shape"]).astype(dt.np)
        elif dt.name == "bool":
            a = rng.random(s["shape"]) < 0.5
        else:
            a = rng.integers(0, 10, size=s["shape"]).astype(dt.np)
        arrays.append(a)
    return arrays


def _synced_run(m: Any, inputs: Sequence[Any]) -> Any:
    outs = m.run(*inputs)
    m.stream.synchronize()
    return outs


# ---------------------------------------------------------------------------------------------
# commands


def cmd_demo(args: argparse.Namespace) -> int:
    """Export a YOLO-style detector, run it, and compare it with torch eager."""
    import aotrt
    import torch

    torch.manual_seed(args.seed)
    name, model = demo_model(args.model, args.size)
    x = torch.rand(1, 3, args.size, args.size)
    with torch.no_grad():
        ref = _leaves(model(x))      # eager once first: Detect caches its anchors
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
            outs = _synced_run(m, [xd])
            got = [o.numpy() for o in outs]
            if len(got) != len(ref):
                print(f"note: {len(got)} program outputs vs {len(ref)} eager tensors; comparing "
                      f"the first")
                got, ref = got[:1], ref[:1]
            abs_err, rel = _errors(got, [r.numpy() for r in ref])
            times = _time(lambda: _synced_run(m, [xd]), args.runs, args.warmup)
            eager_times = _eager_times(model, x, dev, args.runs, args.warmup)
            print(f"device:   {dev}")
            print(f"load:     {load_s:.3f} s")
            print(f"error:    max abs {abs_err:.3e}, max relative {rel:.3e} vs eager "
                  f"({len(got)} output(s))")
            print(f"latency:  median {_ms(statistics.median(times))} over {args.runs} runs "
                  f"(torch eager on {dev}: {_ms(statistics.median(eager_times))})")
    tol = 1e-3
    if rel > tol:
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
        return _time(step, runs, warmup)


def cmd_export(args: argparse.Namespace) -> int:
    """Export a model to a .aotp file."""
    import aotrt
    import torch

    name, model = load_model(args.model, args.size)
    shapes = args.shape or [f"1,3,{args.size},{args.size}"]
    tdt = getattr(torch, args.dtype)
    torch.manual_seed(args.seed)
    inputs = tuple(torch.rand(*[int(s) for s in sh.split(",")]).to(tdt) for sh in shapes)
    model = model.to(tdt)
    with torch.no_grad():
        model(*inputs)
    t0 = time.perf_counter()
    prog = aotrt.export(model, inputs)
    prog.save(args.output)
    print(f"exported {name} to {args.output} in {time.perf_counter() - t0:.2f} s")
    print(prog.summary())
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run a program on given (.npz/.npy) or random inputs and print or save the outputs."""
    import aotrt

    prog = aotrt.Program.load(args.program)
    if args.inputs:
        data = np.load(args.inputs, allow_pickle=False)
        inputs = [data[s["name"]] for s in prog.inputs] if hasattr(data, "files") else [data]
    else:
        inputs = _random_inputs(prog, args.seed)
    with aotrt.load(prog, device=args.device) as m:
        outs = m.run(*inputs)
        arrays = {s["name"]: o.numpy() for s, o in zip(prog.outputs, outs)}
    for name, a in arrays.items():
        stats = "" if a.size == 0 else (f" min {a.min().astype(np.float64):.4g} max "
                                        f"{a.max().astype(np.float64):.4g} mean "
                                        f"{a.astype(np.float64).mean():.4g}")
        print(f"{name}: {a.dtype}{list(a.shape)}{stats}")
    if args.save:
        np.savez(args.save, **arrays)
        print(f"saved outputs to {args.save}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Time load and run of a program."""
    import aotrt

    prog = aotrt.Program.load(args.program)
    inputs = _random_inputs(prog, args.seed)
    t0 = time.perf_counter()
    with aotrt.load(prog, device=args.device) as m:
        load_s = time.perf_counter() - t0
        times = _time(lambda: _synced_run(m, inputs), args.runs, args.warmup)
        dev = m.device
    times.sort()
    print(f"device:  {dev.name}")
    print(f"load:    {load_s:.3f} s")
    print(f"latency: median {_ms(statistics.median(times))}, min {_ms(times[0])}, "
          f"p90 {_ms(times[int(0.9 * (len(times) - 1))])} over {len(times)} runs")
    print(f"memory:  peak {dev.memory.peak_raw_bytes / 2**20:.1f} MiB of device memory")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    """Print a program's summary (validates it; runs nothing)."""
    from aotrt.program import Program

    print(Program.load(args.program).summary())
    return 0


def parser() -> argparse.ArgumentParser:
    """The argument parser of `aotrt`."""
    p = argparse.ArgumentParser(prog="aotrt", description="aotrt: export and run PyTorch "
                                "programs from a small Python runtime.")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="export a YOLO-style detector and run it vs torch eager")
    d.add_argument("--model", choices=("auto", "yolov8n", "tiny-yolo"), default="auto",
                   help="auto: ultralytics YOLOv8n when installed, else the built-in model")
    d.add_argument("--size", type=int, default=320, help="input height and width")
    d.add_argument("--runs", type=int, default=10)
    d.add_argument("--warmup", type=int, default=3)
    d.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(fn=cmd_demo)

    e = sub.add_parser("export", help="export a model to a .aotp program file")
    e.add_argument("model", help="yolov8n, tiny-yolo, or package.module:factory")
    e.add_argument("-o", "--output", required=True)
    e.add_argument("--shape", action="append", help="an input shape like 1,3,320,320 "
                   "(repeat for several inputs)")
    e.add_argument("--size", type=int, default=320)
    e.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    e.add_argument("--seed", type=int, default=0)
    e.set_defaults(fn=cmd_export)

    r = sub.add_parser("run", help="run a program on .npz/.npy or random inputs")
    r.add_argument("program")
    r.add_argument("--inputs", help=".npz keyed by input name, or one .npy")
    r.add_argument("--save", help="write the outputs to this .npz")
    r.add_argument("--device", default=None)
    r.add_argument("--seed", type=int, default=0)
    r.set_defaults(fn=cmd_run)

    b = sub.add_parser("bench", help="time loading and running a program")
    b.add_argument("program")
    b.add_argument("--runs", type=int, default=50)
    b.add_argument("--warmup", type=int, default=5)
    b.add_argument("--device", default=None)
    b.add_argument("--seed", type=int, default=0)
    b.set_defaults(fn=cmd_bench)

    i = sub.add_parser("inspect", help="print a program's summary")
    i.add_argument("program")
    i.set_defaults(fn=cmd_inspect)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `aotrt` / `python -m aotrt`; returns the exit status."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    for key in ("runs", "size"):
        if getattr(args, key, 1) < 1:
            print(f"aotrt: error: --{key} must be at least 1", file=sys.stderr)
            return 2
    try:
        return args.fn(args)
    except (AotrtError, OSError, KeyError, ValueError) as e:
        print(f"aotrt {args.command}: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"aotrt {args.command}: error: {e} (install the 'export' extra for torch)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
