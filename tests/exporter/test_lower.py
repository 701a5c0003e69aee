"""Lowering rules (aotrt/exporter/lower.py and capture.py): what the program looks like for
views, cats, mutations, batch-norm folding, outputs, constants and the memory plan, and
that unsupported models are refused at export, naming the op and the line.

Each structural check is paired with a numeric one (tests/exporter/harness.check_module).
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import aotrt
from aotrt.exporter.capture import KEPT_OPS, capture, decomposition_table
from aotrt.exporter.lower import Buf, TView, runs_whole, slice_view, view_strides
from tests.exporter import modules as M
from tests.exporter.harness import check_module, count_ops, randn

aten = torch.ops.aten


def _export(model: nn.Module, *shapes: tuple[int, ...]) -> aotrt.Program:
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        return aotrt.export(model.eval(), tuple(randn(gen, torch.float32, *s) for s in shapes))


def _check(model: nn.Module, *shapes: tuple[int, ...], dtype: torch.dtype = torch.float32
           ) -> aotrt.Program:
    return check_module(model, M.inputs(*shapes), dtype).program


def _tensor(prog: aotrt.Program, tid: int) -> dict:
    return prog.tensors[tid]


def _library(prog: aotrt.Program, fn: str) -> list[dict]:
    return [i for i in prog.instructions if i["op"] == "library" and i["fn"] == fn]


def _line_of(fn: object, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


# ---------------------------------------------------------------------------------------------
# capture


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


# ---------------------------------------------------------------------------------------------
# views


def test_view_strides_matches_torch() -> None:
    """view_strides agrees with torch.view on permuted and sliced layouts (and refuses
    where torch refuses)."""
    base = torch.randn(4, 6, 8)
    cases = [(base.permute(0, 2, 1), (4, 48)), (base.permute(0, 2, 1), (32, 6)),
             (base[:, 1:5], (4, 4, 2, 4)), (base.transpose(0, 1), (6, 32)),
             (base[:, :, :4], (24, 4)), (base[:, :, :4], (4, 24))]
    for t, shape in cases:
        got = view_strides(t.shape, t.stride(), shape)
        try:
            want = t.view(shape).stride()
        except RuntimeError:
            want = None
        assert got == want, (t.shape, t.stride(), shape)


def test_slice_view_clamps_like_aten() -> None:
    """Negative and out-of-range bounds clamp as aten.slice does."""
    tv = TView(Buf(4 * 40), 3, (5, 8), (8, 1), "float32")
    t = torch.empty(43)[3:].view(5, 8)
    for dim, start, end, step in [(1, -3, None, 1), (0, 1, 100, 2), (1, 6, 2, 1),
                                  (1, None, -1, 3)]:
        s = slice_view(tv, dim, start, end, step)
        ref = torch.ops.aten.slice.Tensor(t, dim, start, end, step)
        assert s.sizes == tuple(ref.shape)
        assert s.strides == tuple(ref.stride())
        assert s.offset == ref.storage_offset()


def test_chunk_is_a_view_not_a_copy() -> None:
    """linear -> chunk(2, -1) -> linear: the second linear reads a non-packed view of the
    first one's output at element offset 8 (seed 002's path 1); no copy, no kernel."""
    prog = _check(M.LinearChunkLastDim(), (12, 7))
    assert count_ops(prog) == {"library:linear": 2}
    first, second = _library(prog, "linear")
    out = _tensor(prog, first["outs"][0])
    x = _tensor(prog, second["ins"][0])
    assert x["root"] == out["root"] and x["index"] == out["index"]
    assert x["sizes"] == [12, 8] and x["strides"] == [16, 1]
    assert x["byte_offset"] == out["byte_offset"] + 8 * 4


def test_first_dim_chunk_is_a_packed_offset_view() -> None:
    """chunk(2, 0): sizes [6, 16], strides [16, 1] at element offset 96 (seed 002's path 2)."""
    prog = _check(M.LinearChunkFirstDim(), (12, 7))
    first, second = _library(prog, "linear")
    out, x = _tensor(prog, first["outs"][0]), _tensor(prog, second["ins"][0])
    assert (x["sizes"], x["strides"]) == ([6, 16], [16, 1])
    assert x["byte_offset"] == out["byte_offset"] + 96 * 4


def test_nested_views_flatten_to_one_view() -> None:
    """A view of a view of a view is one view of the root at the combined offset."""
    prog = _check(M.NestedView(), (12, 7))
    assert "copy" not in count_ops(prog)
    lin = _library(prog, "linear")
    base = _tensor(prog, lin[0]["outs"][0])
    packed = _tensor(prog, lin[1]["ins"][0])
    strided = _tensor(prog, lin[2]["ins"][0])
    assert (packed["sizes"], packed["strides"]) == ([3, 16], [16, 1])
    assert packed["byte_offset"] == base["byte_offset"] + 144 * 4
    ref = torch.empty(12, 16).view(12, 4, 4)[2:9:2, 1:3].reshape(4, 2, 4)[:, 1]
    assert strided["sizes"] == list(ref.shape) and strided["strides"] == list(ref.stride())
    assert strided["byte_offset"] == base["byte_offset"] + ref.storage_offset() * 4


class PermutedMulView(nn.Module):
    """mul.Scalar on a permuted tensor keeps its layout; the view after it relies on that."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.lin(x).view(1, 16, 4, 16).permute(0, 2, 1, 3)     # (1, 4, 16, 16)
        q = q * 0.25
        return q.transpose(1, 2).reshape(1, 16, 64) + 1.0


def test_elementwise_keeps_layout_and_view_follows() -> None:
    """The mul's output has the permuted strides of its meta, so the reshape is a view."""
    prog = _check(PermutedMulView(), (1, 16, 64))
    assert "copy" not in count_ops(prog)
    strides = {tuple(t["strides"]) for t in prog.tensors}
    assert (1024, 16, 64, 1) in strides


# ---------------------------------------------------------------------------------------------
# cat


@pytest.mark.parametrize("dim", [-1, 0])
def test_cat_producers_write_their_slots(dim: int) -> None:
    """cat of two linears: each writes its slot of the one result buffer, no copy (the
    last-dim slots are non-packed views)."""
    prog = _check(M.LinearCat(dim), (12, 7))
    assert count_ops(prog) == {"library:linear": 3}
    a, b, c = _library(prog, "linear")
    ta, tb = (_tensor(prog, i["outs"][0]) for i in (a, b))
    tc = _tensor(prog, c["ins"][0])
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
        prog = _check(M.LinearChunkCat(dim), (12, 7))
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
    prog = _check(CatOfCat(), (6, 4))
    counts = count_ops(prog)
    assert "copy" not in counts and counts["library:linear"] == 3


# ---------------------------------------------------------------------------------------------
# mutation of views


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
                if i["op"] == "copy" and _tensor(prog, i["dst"])["sizes"] == [2, 5, 6]]
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
        _export(Acc(), (4, 3))


def test_slice_mutation_writes_in_place() -> None:
    """y[:, 2:5] += 1 after functionalization: the add writes its slice of y, no copy."""
    prog = _check(SliceAdd(), (4, 8))
    assert count_ops(prog) == {"kernel": 2}
    add = prog.instructions[1]
    dst = _tensor(prog, add["args"][-1])
    assert dst["root"] == "output" and dst["byte_offset"] == 2 * 4
    assert dst["sizes"] == [4, 3] and dst["strides"] == [8, 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nested_mutations_match_eager(dtype: torch.dtype) -> None:
    """Nested view mutations and a strided assignment match eager."""
    _check(NestedSliceAdd(), (4, 8), dtype=dtype)


def test_mutation_with_live_old_value_copies() -> None:
    """When the old value is still read later, the scatter writes a copy."""
    prog = _check(MutateAfterClone(), (4, 8))
    assert count_ops(prog).get("copy", 0) >= 1


def test_input_mutation_is_refused() -> None:
    """A model that writes its input is refused at export."""
    with pytest.raises(aotrt.Unsupported, match="mutates user input"):
        _export(MutateInput(), (4, 8))


# ---------------------------------------------------------------------------------------------
# batch norm folding


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
    """conv -> BN (eval): one convolution with folded weight and bias, no BN kernel."""
    prog = _check(ConvBN(False), (1, 4, 8, 8))
    assert count_ops(prog) == {"library:convolution": 1, "kernel": 1}
    assert any("bnfold" in name for name in prog.constants)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_norm_not_folded_when_conv_output_is_used(dtype: torch.dtype) -> None:
    """The conv output is also returned, so the BN stays a (fused) kernel."""
    prog = _check(ConvBN(True), (1, 4, 8, 8), dtype=dtype)
    assert not any("bnfold" in name for name in prog.constants)


# ---------------------------------------------------------------------------------------------
# outputs and constants


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
    prog = _check(AliasOutputs(), (3, 4))
    names = [o["name"] for o in prog.outputs]
    assert names == ["out.same", "out.t", "out.y", "out.y_again", "out.w", "out.nested.0",
                     "out.nested.1"]
    for k, tid in enumerate(prog.outputs_tensors):
        t = _tensor(prog, tid)
        assert t["root"] == "output" and t["index"] == k
    assert count_ops(prog)["copy"] == 6


class EmptyAndScalars(nn.Module):
    """Zero-size views and cat inputs, 0-dim results and inputs, bool outputs."""

    def forward(self, s: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple:
        e = x[:, :0]
        c = torch.cat([e, x * s, e], 1)
        return (c.sum(), x > 0, e * 3, torch.cat([y[0:0], y], 0), x.mean(), y[..., 1],
                s + 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_empty_and_scalar_values(dtype: torch.dtype) -> None:
    """Empty tensors and 0-dim values lower and run (bool outputs compared exactly)."""
    def make(gen: torch.Generator, dt: torch.dtype) -> tuple[torch.Tensor, ...]:
        return (torch.randn((), generator=gen).to(dt), randn(gen, dt, 3, 4),
                randn(gen, dt, 2, 5))
    prog = check_module(EmptyAndScalars(), make, dtype).program
    assert [o["shape"] for o in prog.outputs] == [[], [3, 4], [3, 0], [2, 5], [], [2], []]


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
    prog = _check(TransposedWeight(), (3, 8))
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
    prog = _check(Generated(), (2, 6, 6))
    assert count_ops(prog) == {"kernel": 1}
    assert any(a.dtype == bool for a in prog.constants.values())


class Chain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for lin in self.layers:
            x = lin(x).relu()
        return x


def test_memory_plan_reuses_the_arena() -> None:
    """Intermediates whose lifetimes do not overlap share bytes."""
    prog = _check(Chain(), (32, 64))
    one = 32 * 64 * 4
    assert prog.arena_nbytes <= 3 * one


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


# ---------------------------------------------------------------------------------------------
# refusals at export


class KthValue(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        return torch.kthvalue(y, 2, dim=-1).values + 1


class Dropout(nn.Module):
    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)


def test_unsupported_op_names_op_and_line() -> None:
    """An op aotrt cannot run is refused at export with the op and the model's line."""
    line = _line_of(KthValue.forward, "torch.kthvalue")
    with pytest.raises(aotrt.Unsupported) as info:
        _export(KthValue(), (3, 5))
    msg = str(info.value)
    assert "aten.kthvalue" in msg
    assert f"test_lower.py:{line}" in msg


def test_attention_dropout_is_refused() -> None:
    """Dropout inside attention cannot be reproduced: refused at export, with the line."""
    line = _line_of(Dropout.forward, "dropout_p")
    with pytest.raises(aotrt.Unsupported, match=f"test_lower.py:{line}"):
        _export(Dropout(), (1, 2, 4, 8))


def test_training_mode_batch_norm_is_refused() -> None:
    """A batch norm in training mode updates its statistics: refused, suggesting eval()."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    with pytest.raises(aotrt.Unsupported, match=r"running_mean.*model\.eval"):
        aotrt.export(model, (torch.randn(1, 3, 6, 6),))


def test_float64_is_refused() -> None:
    """float64 has no aotrt dtype: refused at export."""
    with pytest.raises(aotrt.Unsupported, match="float64"):
        with torch.no_grad():
            aotrt.export(nn.Linear(3, 2).double(), (torch.randn(2, 3, dtype=torch.float64),))


@pytest.mark.parametrize("case", [c for c in M.YOLO_BLOCKS if c.name in ("c2f", "sppf",
                                                                          "detect_dfl")],
                         ids=lambda c: c.name)
def test_yolo_blocks_fill_cats_without_copies(case: M.Case) -> None:
    """C2f's chunk pieces, SPPF's pooled maps and Detect's per-level cats (through
    `view(b, no, -1)`) are all written straight into the cat results: no copy at all."""
    prog = check_module(case.build(), case.make_inputs, torch.float32).program
    assert "copy" not in count_ops(prog)
