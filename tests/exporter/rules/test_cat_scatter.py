"""cat and scatter rules (aotrt/exporter/rules/cat_scatter.py): producers write their cat
slots and scatter regions in place; a live old value forces a copy."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import aotrt
from tests.exporter import modules as M
from tests.exporter.harness import check_module, count_ops
from tests.exporter.lowering import check_shapes, export_seeded, library_instrs


@pytest.mark.parametrize("dim", [-1, 0])
def test_cat_producers_write_their_slots(dim: int) -> None:
    """cat of two linears: each writes its slot of the one result buffer, no copy (the
    last-dim slots are non-packed views)."""
    prog = check_shapes(M.LinearCat(dim), (12, 7))
    assert count_ops(prog) == {"library:linear": 3}
    a, b, c = library_instrs(prog, "linear")
    ta, tb = (prog.tensors[i["outs"][0]] for i in (a, b))
    tc = prog.tensors[c["ins"][0]]
    assert ta["root"] == tb["root"] == tc["root"]
    if dim == -1:
        assert ta["strides"] == tb["strides"] == [16, 1]
        assert tb["byte_offset"] - ta["byte_offset"] == 8 * 4
    else:
        assert tb["byte_offset"] - ta["byte_offset"] == 12 * 8 * 4
    assert tc["byte_offset"] == ta["byte_offset"]


def test_cat_of_views_copies_into_slots() -> None:
    """Views feeding a cat are copied into their slots; the producer of the middle input
    writes straight into its slot."""
    for dim in (-1, 0):
        prog = check_shapes(M.LinearChunkCat(dim), (12, 7))
        assert count_ops(prog) == {"library:linear": 3, "copy": 2}


class CatOfCat(nn.Module):
    """A cat whose input is another cat: the inner result is a slot of the outer one."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(4, 5)
        self.c = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = torch.cat([self.a(x), self.b(x)], 1)
        return torch.cat([self.c(x), inner], 1).sigmoid()


def test_cat_of_cat_writes_through() -> None:
    """No copies at all: every linear writes into the outer cat's buffer."""
    prog = check_shapes(CatOfCat(), (6, 4))
    counts = count_ops(prog)
    assert "copy" not in counts and counts["library:linear"] == 3


class SliceAdd(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y[:, 2:5] += 1
        return y


class NestedSliceAdd(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y[:, 2:5] += 1
        y[:, 1:3][0] += 5
        y[1:3, ::2] = x[:2, :4].sigmoid()
        return y


class MutateAfterClone(nn.Module):
    """The old value stays live (through a clone), so the scatter must not be in place."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2
        z = y.clone()
        y[:, 1:3] += 1
        return y + 1, z


class MutateInput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x[:, 1] += 1
        return x * 2


def test_slice_mutation_writes_in_place() -> None:
    """y[:, 2:5] += 1 after functionalization: the add writes its slice of y, no copy."""
    prog = check_shapes(SliceAdd(), (4, 8))
    assert count_ops(prog) == {"kernel": 2}
    add = prog.instructions[1]
    dst = prog.tensors[add["args"][-1]]
    assert dst["root"] == "output" and dst["byte_offset"] == 2 * 4
    assert dst["sizes"] == [4, 3] and dst["strides"] == [8, 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nested_mutations_match_eager(dtype: torch.dtype) -> None:
    """Nested view mutations and a strided assignment match eager."""
    check_shapes(NestedSliceAdd(), (4, 8), dtype=dtype)


def test_mutation_with_live_old_value_copies() -> None:
    """When the old value is still read later, the scatter writes a copy."""
    prog = check_shapes(MutateAfterClone(), (4, 8))
    assert count_ops(prog).get("copy", 0) >= 1


def test_input_mutation_is_refused() -> None:
    """A model that writes its input is refused at export."""
    with pytest.raises(aotrt.Unsupported, match="mutates user input"):
        export_seeded(MutateInput(), (4, 8))


@pytest.mark.parametrize("case", [c for c in M.YOLO_BLOCKS if c.name in ("c2f", "sppf",
                                                                          "detect_dfl")],
                         ids=lambda c: c.name)
def test_yolo_blocks_fill_cats_without_copies(case: M.Case) -> None:
    """C2f's chunk pieces, SPPF's pooled maps and Detect's per-level cats (through
    `view(b, no, -1)`) are all written straight into the cat results: no copy at all (in
    NCHW: channels-last adds its layout copies at the inputs and outputs)."""
    prog = check_module(case.build(), case.make_inputs, torch.float32,
                        layout="contiguous").program
    assert "copy" not in count_ops(prog)
