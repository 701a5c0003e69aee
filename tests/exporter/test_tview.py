"""The view arithmetic of aotrt/exporter/tview.py agrees with torch."""

from __future__ import annotations

import torch

from aotrt.exporter.tview import Buf, TView, slice_view, view_strides


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
