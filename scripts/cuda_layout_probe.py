"""On the GPU machine: small convolution blocks on cuda in both layouts, against float64
eager, beside eager's own error, to find which one a zoo model's mismatch comes from.

    python3 scripts/cuda_layout_probe.py [--dtype float32]

Blocks: avg_pool2d with and without count_include_pad (timm's Inception-v4 and
Inception-ResNet-v2 use count_include_pad=False; torchvision's Inception-v3 does not), a
bias-free depthwise convolution, and a 1x1 convolution after each.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aotrt  # noqa: E402


class Pool(nn.Module):
    """relu(x * 1.5) -> avg_pool2d(3, 1, 1) -> 1x1 convolution."""

    def __init__(self, c: int, count_include_pad: bool) -> None:
        super().__init__()
        self.cip = count_include_pad
        self.conv = nn.Conv2d(c, 32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.avg_pool2d(torch.relu(x * 1.5), 3, 1, 1, count_include_pad=self.cip)
        return self.conv(y)


class Depthwise(nn.Module):
    """A bias-free depthwise 3x3 convolution, then a 1x1 convolution."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        self.conv = nn.Conv2d(c, 32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.dw(torch.relu(x)))


def err(a: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative L2 error against the float64 reference."""
    return float((a.double().cpu() - ref).norm() / ref.norm())


def main() -> None:
    """Every block, both layouts, at --dtype."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    dt = getattr(torch, args.dtype)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    blocks = {"avgpool_cip": lambda c: Pool(c, True), "avgpool_nocip": lambda c: Pool(c, False),
              "depthwise_nobias": Depthwise}
    for name, make in blocks.items():
        for c, hw in ((192, 35), (64, 9)):
            torch.manual_seed(0)
            m = make(c).eval()
            x = torch.randn(1, c, hw, hw)
            with torch.no_grad():
                ref = m.double()(x.double())
                eager = m.to(dt).cuda()(x.to(dt).cuda())
                m = m.float().to(dt)
            for layout in ("contiguous", "channels_last"):
                try:
                    prog = aotrt.export(m.cpu(), (x.to(dt),), layout=layout)
                    with aotrt.load(prog, device="cuda") as d:
                        got = d.run(x.to(dt).cuda())[0]
                        got = torch.from_dlpack(got) if not isinstance(got, torch.Tensor) else got
                    e = f"{err(got, ref):.2e}"
                except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
                    e = f"{type(exc).__name__}: {exc}"[:120]
                print(f"{name:18s} c={c:3d} {hw}x{hw} {layout:13s} aotrt {e}  eager "
                      f"{err(eager, ref):.2e}", flush=True)


if __name__ == "__main__":
    main()
