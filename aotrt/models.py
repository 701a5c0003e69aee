"""The models of `aotrt demo` and `aotrt export`, and how the CLI finds a model by name.

torch is imported inside the functions only, so importing this module (or the CLI) stays
torch-free.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

from aotrt.errors import AotrtError, InvalidArgument

log = logging.getLogger(__name__)


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
    """(name, model) for `spec`: 'yolov8n', 'tiny-yolo', 'package.module:factory' (a module,
    a module class, or a function returning a module), or a `.pt2` file written by
    torch.export.save (then the model is its ExportedProgram)."""
    import torch

    if spec == "yolov8n":
        return "YOLOv8n", yolov8n()
    if spec == "tiny-yolo":
        return "TinyYolo", tiny_yolo(imgsz)
    if spec.endswith(".pt2"):
        return Path(spec).stem, load_pt2(spec)
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise InvalidArgument(f"model: expected 'yolov8n', 'tiny-yolo', 'module:factory' or a "
                              f".pt2 file, got {spec!r}")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        # Only a missing module of the path itself is the user's typo; a dependency that
        # the module lacks (torch included) stays an ImportError with its own hint.
        if e.name is None or not (module == e.name or module.startswith(e.name + ".")):
            raise
        raise InvalidArgument(f"model: no module named {module!r}") from None
    if not hasattr(mod, attr):
        close = difflib.get_close_matches(attr, [n for n in dir(mod) if not n.startswith("_")])
        hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
        raise InvalidArgument(f"model: module {module!r} has no {attr!r}{hint}")
    factory = getattr(mod, attr)
    if isinstance(factory, torch.nn.Module):
        model = factory
    elif callable(factory):
        try:
            model = factory()
        except Exception as e:  # noqa: BLE001 - the factory's own failure, named
            raise AotrtError(f"model: {spec}() failed: {type(e).__name__}: {e}") from e
    else:
        raise InvalidArgument(f"model: {spec} is a {type(factory).__name__}, not a "
                              f"torch.nn.Module, a module class or a factory")
    if not isinstance(model, torch.nn.Module):
        raise InvalidArgument(f"model: {spec}() returned a {type(model).__name__}, not a "
                              f"torch.nn.Module")
    return attr, model.eval()


def load_pt2(path: str) -> Any:
    """The ExportedProgram that torch.export.save wrote to `path`."""
    import torch

    if not os.path.isfile(path):
        raise InvalidArgument(f"model: no such file {path!r}")
    try:
        return torch.export.load(path)
    except Exception as e:  # noqa: BLE001 - torch raises many types for a bad archive
        raise InvalidArgument(f"model: {path!r} is not a program saved by torch.export.save: "
                              f"{type(e).__name__}: {e}") from e
