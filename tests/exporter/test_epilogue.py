"""Tests for aotrt/exporter/epilogue.py: a convolution's residual add and activation become
the convolution's own epilogue, and the exported program still matches eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import aotrt
from tests.conftest import DEVICES
from tests.support import rel_err


class Basic(nn.Module):
    """ResNet's basic block: conv-bn-relu, conv-bn, + identity, relu."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(y)) + x)


class SiluConv(nn.Module):
    """YOLO's Conv: conv-bn-SiLU, twice, and a 1x1 conv whose output is used twice."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU())
        self.b = nn.Sequential(nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.SiLU())
        self.c = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.c(self.b(self.a(x)))
        return torch.relu(y) + y            # y has two users: no epilogue for it


class InvertedResidual(nn.Module):
    """MobileNet-v2's block: 1x1 expand-bn-ReLU6, depthwise-bn-ReLU6, 1x1 project-bn,
    + identity; then a hardtanh with other bounds, which stays a kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(8, 24, 1, bias=False), nn.BatchNorm2d(24),
                                    nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(24, 24, 3, padding=1, groups=24, bias=False),
                                nn.BatchNorm2d(24), nn.ReLU6())
        self.project = nn.Sequential(nn.Conv2d(24, 8, 1, bias=False), nn.BatchNorm2d(8))
        self.last = nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + self.project(self.dw(self.expand(x)))
        return nn.functional.hardtanh(self.last(y) * 4.0, -1.0, 2.0)


def _model(cls: type) -> nn.Module:
    torch.manual_seed(0)
    m = cls().eval()
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 1.5)
    return m


def _convs(prog: aotrt.Program) -> list[dict]:
    return [i for i in prog.instructions if i.get("fn") == "convolution"]


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_basic_block_takes_relu_and_the_residual(layout: str) -> None:
    x = torch.randn(2, 8, 6, 6)
    with torch.no_grad():
        prog = aotrt.export(_model(Basic), (x,), layout=layout)
    convs = _convs(prog)
    assert [c["params"].get("activation") for c in convs] == ["relu", "relu"]
    assert len(convs[0]["ins"]) in (3, 4) and (len(convs[0]["ins"]) == 3 or
                                               convs[0]["ins"][3] is None)
    assert convs[1]["ins"][3] is not None            # the identity is the residual
    assert not [i for i in prog.instructions if i["op"] == "kernel"]   # nothing left over


def test_a_conv_used_twice_keeps_its_output() -> None:
    with torch.no_grad():
        prog = aotrt.export(_model(SiluConv), (torch.randn(1, 3, 8, 8),))
    acts = [c["params"].get("activation", "none") for c in _convs(prog)]
    assert acts == ["silu", "silu", "none"]


def test_relu6_is_an_epilogue_and_other_hardtanh_bounds_are_not() -> None:
    """ReLU6 reaches the exporter as hardtanh(x, 0, 6): it becomes the "relu6" epilogue;
    hardtanh(x, -1, 2) after a scaled convolution stays out of it."""
    with torch.no_grad():
        prog = aotrt.export(_model(InvertedResidual), (torch.randn(2, 8, 6, 6),))
    acts = [c["params"].get("activation", "none") for c in _convs(prog)]
    assert acts == ["relu6", "relu6", "none", "none"]
    assert _convs(prog)[2]["ins"][3] is not None        # the identity is the residual


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls", [Basic, SiluConv, InvertedResidual])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_fused_programs_match_eager(cls: type, layout: str, device: str) -> None:
    m = _model(cls)
    shape = (1, 3, 8, 8) if cls is SiluConv else (2, 8, 6, 6)
    with torch.no_grad():
        prog = aotrt.export(m, (torch.randn(shape),), layout=layout)
    with aotrt.load(prog, device=device, check_hazards=True) as d:
        for seed in range(2):
            x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
            with torch.no_grad():
                ref = m.double()(x.double()).numpy()
                m.float()
            got = np.asarray(d.run(x.numpy())[0]).astype(np.float64)
            assert rel_err(got, ref) < 1e-5
