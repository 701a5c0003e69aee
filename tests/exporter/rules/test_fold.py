"""Folding (aotrt/exporter/rules/fold.py): batch norms into convolutions, constant
subgraphs into constants that keep their layout."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tests.exporter import modules as M
from tests.exporter.harness import count_ops
from tests.exporter.lowering import check_shapes


class ConvBN(nn.Module):
    def __init__(self, tap: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.tap = tap
        M._randomize_bn(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        z = self.bn(y).relu()
        return (z, y) if self.tap else z


def test_batch_norm_folds_into_conv() -> None:
    """conv -> BN (eval) -> relu: one convolution with folded weight and bias and the relu
    as its epilogue (aotrt/exporter/epilogue.py), no kernel at all."""
    prog = check_shapes(ConvBN(False), (1, 4, 8, 8), layout="contiguous")
    assert count_ops(prog) == {"library:convolution": 1}
    assert any("bnfold" in name for name in prog.constants)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_norm_not_folded_when_conv_output_is_used(dtype: torch.dtype) -> None:
    """The conv output is also returned, so the BN stays a (fused) kernel."""
    prog = check_shapes(ConvBN(True), (1, 4, 8, 8), dtype=dtype)
    assert not any("bnfold" in name for name in prog.constants)


class TransposedWeight(nn.Module):
    """A parameter whose storage is transposed (non-contiguous strides)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(5, 8).t())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mm(self.w) + self.w.sum(0)


def test_non_contiguous_constant_keeps_its_layout() -> None:
    """The constant is stored contiguous in its memory order and read through a view with
    the parameter's strides."""
    prog = check_shapes(TransposedWeight(), (3, 8))
    shapes = {tuple(a.shape) for a in prog.constants.values()}
    assert (40,) in shapes
    assert any(t["root"] == "constant" and t["strides"] == [1, 8] for t in prog.tensors)


class Generated(nn.Module):
    """A mask built from arange: folded into a constant at export."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-1]
        mask = torch.arange(n)[None, :] <= torch.arange(n)[:, None]
        return x.masked_fill(~mask, 0.0) * 2


def test_constant_subgraphs_fold() -> None:
    """The arange/compare subgraph becomes one bool constant; one kernel remains."""
    prog = check_shapes(Generated(), (2, 6, 6))
    assert count_ops(prog) == {"kernel": 1}
    assert any(a.dtype == bool for a in prog.constants.values())
