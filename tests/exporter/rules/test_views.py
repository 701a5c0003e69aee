"""View rules (aotrt/exporter/rules/views.py): views of views are one view of the root,
never copies."""

from __future__ import annotations

import torch
import torch.nn as nn

from tests.exporter import modules as M
from tests.exporter.harness import count_ops
from tests.exporter.lowering import check_shapes, library_instrs


def test_chunk_is_a_view_not_a_copy() -> None:
    """linear -> chunk(2, -1) -> linear: the second linear reads a non-packed view of the
    first one's output at element offset 8 (seed 002's path 1); no copy, no kernel."""
    prog = check_shapes(M.LinearChunkLastDim(), (12, 7))
    assert count_ops(prog) == {"library:linear": 2}
    first, second = library_instrs(prog, "linear")
    out = prog.tensors[first["outs"][0]]
    x = prog.tensors[second["ins"][0]]
    assert x["root"] == out["root"] and x["index"] == out["index"]
    assert x["sizes"] == [12, 8] and x["strides"] == [16, 1]
    assert x["byte_offset"] == out["byte_offset"] + 8 * 4


def test_first_dim_chunk_is_a_packed_offset_view() -> None:
    """chunk(2, 0): sizes [6, 16], strides [16, 1] at element offset 96 (seed 002's path 2)."""
    prog = check_shapes(M.LinearChunkFirstDim(), (12, 7))
    first, second = library_instrs(prog, "linear")
    out, x = prog.tensors[first["outs"][0]], prog.tensors[second["ins"][0]]
    assert (x["sizes"], x["strides"]) == ([6, 16], [16, 1])
    assert x["byte_offset"] == out["byte_offset"] + 96 * 4


def test_nested_views_flatten_to_one_view() -> None:
    """A view of a view of a view is one view of the root at the combined offset."""
    prog = check_shapes(M.NestedView(), (12, 7))
    assert "copy" not in count_ops(prog)
    lin = library_instrs(prog, "linear")
    base = prog.tensors[lin[0]["outs"][0]]
    packed = prog.tensors[lin[1]["ins"][0]]
    strided = prog.tensors[lin[2]["ins"][0]]
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
    prog = check_shapes(PermutedMulView(), (1, 16, 64))
    assert "copy" not in count_ops(prog)
    strides = {tuple(t["strides"]) for t in prog.tensors}
    assert (1024, 16, 64, 1) in strides


class HeadSplitAttention(nn.Module):
    """Hugging Face's head split before attention (Whisper, BART): q, k and v each
    `.view(b, s, h, d).transpose(1, 2).contiguous()`; `keep_k` also returns k's copy."""

    def __init__(self, keep_k: bool = False) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32)
        self.keep_k = keep_k

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(1, 6, 4, 8).transpose(1, 2).contiguous()
        q, k, v = heads(self.q(x) * 0.5), heads(self.k(x)), heads(self.v(x))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return (out, k + 1.0) if self.keep_k else out


def test_a_copy_only_attention_reads_is_its_source_read_by_strides() -> None:
    """The head-split copies feeding sdpa's q, k and v go: sdpa reads the projections'
    outputs by strides (sizes [1, 4, 6, 8], strides [192, 8, 32, 1]), and matches eager."""
    prog = check_shapes(HeadSplitAttention(), (1, 6, 32))
    assert "copy" not in count_ops(prog)
    (att,) = library_instrs(prog, "sdpa")
    lin = library_instrs(prog, "linear")
    for t, src in zip(att["ins"][1:3], lin[1:]):
        view, out = prog.tensors[t], prog.tensors[src["outs"][0]]
        assert (view["root"], view["index"]) == (out["root"], out["index"])
        assert (view["sizes"], view["strides"]) == ([1, 4, 6, 8], [192, 8, 32, 1])


def test_a_copy_with_another_reader_stays_a_copy() -> None:
    """k's copy is also an output's operand: only sdpa reads by strides, so it stays."""
    prog = check_shapes(HeadSplitAttention(keep_k=True), (1, 6, 32))
    (att,) = library_instrs(prog, "sdpa")
    k = prog.tensors[att["ins"][1]]
    assert k["strides"] == [192, 48, 8, 1]
