"""index_put (aotrt/exporter/rules/index.py): advanced-index writes match eager, and
accumulating ones (F.fold) sum duplicates deterministically."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import aotrt
from aotrt.exporter.rules.index import gather_table
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


class Fold(nn.Module):
    """F.fold (col2im): overlapping patches sum, through index_put with accumulate=True."""

    def __init__(self, **kw: object) -> None:
        super().__init__()
        self.kw = kw

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.fold(x * 1.5, **self.kw) + 1


def _patches(out: tuple[int, int], k: int, s: int = 1, p: int = 0, d: int = 1) -> int:
    """How many sliding blocks F.fold takes for these parameters."""
    return math.prod((o + 2 * p - d * (k - 1) - 1) // s + 1 for o in out)


FOLDS = [  # (channels, output_size, kernel, stride, padding, dilation)
    (3, (6, 7), 3, 1, 0, 1),
    (2, (6, 7), 3, 2, 1, 1),        # stride 2: targets summing 1, 2 and 4 patches
    (4, (8, 8), 2, 2, 0, 1),        # no overlap (every target once)
    (2, (9, 8), 3, 1, 2, 2),        # dilated and padded
    (1, (5, 5), 3, 3, 0, 1),        # stride past the kernel: gaps keep the zero base
]


@pytest.mark.parametrize("c,out,k,s,p,d", FOLDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fold_matches_eager(c: int, out: tuple[int, int], k: int, s: int, p: int, d: int,
                            dtype: torch.dtype) -> None:
    """F.fold over several kernel/stride/padding/dilation: one gather kernel per fold, no
    scatter of its own; fresh random inputs against float64 eager."""
    n = _patches(out, k, s, p, d)
    model = Fold(output_size=out, kernel_size=k, stride=s, padding=p, dilation=d)

    def make(gen: torch.Generator, dt: torch.dtype) -> tuple[torch.Tensor]:
        return (randn(gen, dt, 2, c * k * k, n),)
    prog = check_module(model, make, dtype).program
    assert [k for k in prog.kernels if k.name.endswith("index_put_acc")]


class Accumulate(nn.Module):
    """x[i] += v and x[:, j, k] += w with duplicate (and negative) constant indices."""

    def forward(self, x: torch.Tensor, v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = torch.index_put(x * 2, (torch.tensor([0, 2, 0, -4, 3, 0]),), v, accumulate=True)
        j = torch.tensor([[1, 1], [0, 1]])
        k = torch.tensor([2, -1])
        return torch.index_put(y, (torch.arange(4)[:, None, None], j, k), w, accumulate=True)


def test_index_put_accumulate_with_duplicate_constant_indices() -> None:
    """Duplicates sum (row 0 takes four updates, one through -4); the result repeats bit
    for bit."""
    def make(gen: torch.Generator, dt: torch.dtype) -> tuple[torch.Tensor, ...]:
        return randn(gen, dt, 4, 3, 5), randn(gen, dt, 6, 3, 5), randn(gen, dt, 4, 2, 2)
    prog = check_module(Accumulate(), make, torch.float32).program
    x, v, w = make(torch.Generator().manual_seed(7), torch.float32)
    with aotrt.load(prog) as dlg:
        a, b = (np.asarray(dlg.run(x, v, w)[0]) for _ in range(2))
    assert a.tobytes() == b.tobytes()


def test_gather_table_sums_in_index_order() -> None:
    """Each touched element lists its value positions in index order, -1 padded."""
    idx = np.array([2, 0, 2, -1, 2])
    toff, table = gather_table((4, 3), [idx, None], [0], [10, 1], (3, 1))
    assert toff.tolist() == [0, 6, 9]                          # rows 0, 2 and 3 (-1)
    assert table.tolist() == [[10, -1, -1], [0, 20, 40], [30, -1, -1]]
    assert "out of range" in gather_table((4,), [np.array([4])], [0], [1], (1,))
    # one element taking every update of a large set would blow the table up
    skewed = np.concatenate([np.zeros(5000, np.int64), np.arange(1, 5000)])
    assert "too big" in gather_table((5000,), [skewed], [0], [1], (1,))


def test_index_put_accumulate_with_run_time_indices_is_refused() -> None:
    """Indices computed at run time could repeat between threads: refused, naming why."""
    class Acc(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            i = (x[:, 0] > 0).long()
            return torch.index_put(x * 2, (i,), torch.ones(4, 3), accumulate=True)
    with pytest.raises(aotrt.Unsupported, match="accumulate=True needs constant indices"):
        export_seeded(Acc(), (4, 3))
