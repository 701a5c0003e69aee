"""Models and the torch side of `aotrt demo` / `aotrt export` (the CLI imports this lazily,
so that only aotrt.export imports torch)."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from aotrt.cli import _errors, _ms, _synced_run, _time
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
# commands


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


def run_export(args: argparse.Namespace) -> int:
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
    prog = aotrt.export(model, inputs, layout=getattr(args, "layout", "auto"))
    prog.save(args.output)
    print(f"exported {name} to {args.output} in {time.perf_counter() - t0:.2f} s")
    print(prog.summary())
    return 0
