"""Outputs (aotrt/exporter/outputs.py) own their memory and are named after the output tree."""

from __future__ import annotations

import torch
import torch.nn as nn

from tests.exporter.harness import count_ops
from tests.exporter.lowering import check_shapes


class AliasOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 4))

    def forward(self, x: torch.Tensor) -> dict[str, object]:
        y = x.sigmoid()
        return {"same": x, "t": x.t(), "y": y, "y_again": y, "w": self.w,
                "nested": (y[1:], self.w.t())}


def test_outputs_own_their_memory() -> None:
    """Outputs that alias inputs, constants or each other are copies; names follow the
    output tree."""
    prog = check_shapes(AliasOutputs(), (3, 4))
    names = [o["name"] for o in prog.outputs]
    assert names == ["out.same", "out.t", "out.y", "out.y_again", "out.w", "out.nested.0",
                     "out.nested.1"]
    for k, tid in enumerate(prog.outputs_tensors):
        t = prog.tensors[tid]
        assert t["root"] == "output" and t["index"] == k
    assert count_ops(prog)["copy"] == 6
