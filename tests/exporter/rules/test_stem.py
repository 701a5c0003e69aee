"""The stem rewrite (aotrt/exporter/rules/stem.py): a 7x7 stride-2 convolution over a few
channels becomes a 4x4 stride-1 convolution over the input's space-to-depth, in channels-last
exports only, and the model still matches eager (check_shapes runs it against float64)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tests.exporter.lowering import check_shapes, library_instrs


class Stem(nn.Module):
    def __init__(self, c: int, k: int, pad: int, bias: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, 8, k, stride=2, padding=pad, bias=bias)
        self.bn = nn.BatchNorm2d(8)
        self.bn.running_mean.uniform_(-0.5, 0.5)
        self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x)).relu()


def _geometry(prog, fn: str = "convolution") -> list[tuple]:
    """(weight sizes, stride) of each convolution."""
    return [(tuple(prog.tensors[i["ins"][1]]["sizes"]), tuple(i["params"]["stride"]))
            for i in library_instrs(prog, fn)]


@pytest.mark.parametrize("c,k,pad,hw", [
    (3, 7, 3, (1, 3, 36, 36)),         # ResNet's stem, smaller
    (3, 7, 3, (2, 3, 33, 31)),         # odd sizes: the padding past the input is zeros
    (1, 5, 2, (1, 1, 20, 24)),         # one channel, a 5x5 kernel
    (4, 7, 0, (1, 4, 21, 21)),         # no padding
])
def test_rewritten_and_matches(c, k, pad, hw):
    prog = check_shapes(Stem(c, k, pad, bias=False), hw, layout="channels_last")
    k2 = (k + 1) // 2
    assert _geometry(prog) == [((8, 4 * c, k2, k2), (1, 1))]
    # its input is written channels-last, as the convolution reads it (no transposes)
    conv = library_instrs(prog, "convolution")[0]
    assert prog.tensors[conv["ins"][0]]["strides"][1] == 1
    # and by one gather from the input (no padded copy of it first)
    assert len(prog.kernels) == 1, [k.name for k in prog.kernels]


@pytest.mark.parametrize("why,c,k,layout", [
    ("contiguous export", 3, 7, "contiguous"),
    ("3x3 kernel", 3, 3, "channels_last"),
    ("many channels", 8, 7, "channels_last"),
])
def test_left_alone(why, c, k, layout):
    prog = check_shapes(Stem(c, k, k // 2, bias=True), (1, c, 24, 24), layout=layout)
    assert _geometry(prog) == [((8, c, k, k), (2, 2))], why


def test_half_types_match():
    prog = check_shapes(Stem(3, 7, 3, bias=True), (1, 3, 30, 30), dtype=torch.bfloat16,
                        layout="channels_last")
    assert _geometry(prog) == [((8, 12, 4, 4), (1, 1))]
