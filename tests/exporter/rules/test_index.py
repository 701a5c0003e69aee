"""index_put (aotrt/exporter/rules/index.py): advanced-index writes match eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import aotrt
from tests.exporter.harness import check_module, count_ops, randn
from tests.exporter.lowering import export_seeded


class IndexPuts(nn.Module):
    """Advanced-index writes: a column list, a mask, a gathered update, an index into a
    slice (in place through the slice), copy_ into a slice and a diagonal zero_."""

    def forward(self, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y[:, [0, 2]] = 0
        y[y > 1] = 0.5
        y[i] += 1
        y[1:3, i] = x[0, :2] * 3
        y[:, 0, :][i] = -1
        y[:, 1:3].copy_(x[:, :2])
        y[0].diagonal().zero_()
        return y


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_index_put_and_view_mutations_match_eager(dtype: torch.dtype) -> None:
    """index_put (integer lists with negative indices, masks), copy_ and diagonal
    mutations match eager; the index into a slice writes through the slice (no copy
    back)."""
    def make(gen: torch.Generator, dt: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return randn(gen, dt, 4, 5, 6), torch.tensor([3, -1])
    prog = check_module(IndexPuts(), make, dtype).program
    # y[1:3, i] = v writes the slice of y directly: no copy of a [2, 5, 6] block back.
    assert not [i for i in prog.instructions
                if i["op"] == "copy" and prog.tensors[i["dst"]]["sizes"] == [2, 5, 6]]
    # Inherent copies: copy_ from the input, and the select_scatter/diagonal_scatter whose
    # decompositions (where over the whole tensor) keep the old value alive.
    assert count_ops(prog).get("copy", 0) <= 4


def test_index_put_accumulate_is_refused() -> None:
    """index_put with accumulate=True (duplicate indices would race) is refused."""
    class Acc(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.index_put(x * 2, (torch.tensor([0, 0]),), torch.ones(2, 3),
                                   accumulate=True)
    with pytest.raises(aotrt.Unsupported, match="accumulate"):
        export_seeded(Acc(), (4, 3))
