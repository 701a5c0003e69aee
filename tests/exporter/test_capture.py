"""Capture (aotrt/exporter/capture.py): the kept ops stay whole, and ops the lowering cannot
run whole are decomposed further."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import aotrt
from aotrt.exporter.capture import KEPT_OPS, capture, decomposition_table
from aotrt.exporter.lower import runs_whole
from tests.exporter import modules as M
from tests.exporter.harness import check_module

aten = torch.ops.aten


def test_decomposition_table_keeps_sdpa_layer_norm_linear() -> None:
    """The kept ops are out of the table; everything else of the default table stays."""
    table = decomposition_table()
    for op in KEPT_OPS:
        assert op not in table
    assert len(table) == len(torch.export.default_decompositions()) - len(
        [op for op in KEPT_OPS if op in torch.export.default_decompositions()])


def test_capture_keeps_ops_whole() -> None:
    """A GPT-2 block keeps linear, layer_norm and sdpa whole after decomposition."""
    ep = capture(M.GPT2Block().eval(), (torch.randn(1, 8, 64),))
    targets = {n.target for n in ep.graph.nodes if n.op == "call_function"}
    assert aten.linear.default in targets
    assert aten.layer_norm.default in targets
    assert aten.scaled_dot_product_attention.default in targets
    assert aten.transpose.int not in targets   # core ATen: permute


def test_capture_refuses_non_module() -> None:
    """A plain function is refused with InvalidArgument."""
    with pytest.raises(aotrt.InvalidArgument, match="torch.nn.Module"):
        capture(lambda x: x, (torch.randn(2),))  # type: ignore[arg-type]


class FurtherDecomposed(nn.Module):
    """Ops the core table keeps but aotrt cannot run whole: capture decomposes them further
    (group/instance norm, bilinear upsampling, average and adaptive pooling)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)
        self.gn = nn.GroupNorm(2, 6)
        self.inorm = nn.InstanceNorm2d(6, affine=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inorm(self.gn(self.up(x)))
        y = F.interpolate(y, scale_factor=1.5, mode="bilinear", align_corners=False)
        y = F.avg_pool2d(y, 3, stride=2, padding=1, count_include_pad=False)
        return F.adaptive_avg_pool2d(y, (3, 2)).flatten(1).log_softmax(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unsupported_ops_decompose_further(dtype: torch.dtype) -> None:
    """The program has no group-norm/upsample/pool op left and matches eager."""
    check_module(FurtherDecomposed(), M.inputs((1, 4, 5, 5)), dtype)
    ep = capture(FurtherDecomposed().eval(), (torch.randn(1, 4, 5, 5),),
                 runs_whole=runs_whole)
    targets = {n.target for n in ep.graph.nodes if n.op == "call_function"}
    assert not targets & {aten.native_group_norm.default, aten.upsample_bilinear2d.vec,
                          aten.avg_pool2d.default, aten._adaptive_avg_pool2d.default}
