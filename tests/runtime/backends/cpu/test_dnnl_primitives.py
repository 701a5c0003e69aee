"""Tests for aotrt/runtime/backends/cpu/dnnl_primitives.py: the layouts a primitive asks for,
and the kept copies of constant weights (the runs are tested with the ops, in test_conv)."""

from __future__ import annotations

import pytest

from aotrt.runtime.device import get_device
from aotrt.runtime.backends.cpu.dnnl_primitives import ConvKey, ConvPrimitive

C, H, W = 16, 6, 5
DENSE = ((1, C, H, W), (C * H * W, 1, W * C, C))
SLICED = ((1, C, H, W), (2 * C * H * W, 1, W * 2 * C, 2 * C))     # channels of a 2C buffer
WEIGHTS = ((C, C, 3, 3), (9 * C, 1, 3 * C, C))


def _prim(dnnl, src, dst, blocked: bool) -> ConvPrimitive:
    key = ConvKey("float32", src, WEIGHTS, None, dst, (1, 1), (1, 1), (1, 1), "silu")
    return ConvPrimitive(dnnl, key, blocked)


def test_a_channel_slice_gets_a_dense_plain_copy_numpy_can_make(dnnl) -> None:
    p = _prim(dnnl, SLICED, SLICED, blocked=True)
    try:
        if p.src.reorder is None:
            pytest.skip(f"{p.impl} reads the strided view as it is on this CPU")
        for op in (p.src, p.dst):
            assert op.plain is not None
            sizes, strides = op.plain
            assert sizes == (1, C, H, W)
            assert strides in (DENSE[1], (C * H * W, H * W, W, 1))     # NHWC or NCHW, dense
            assert op.bytes == C * H * W * 4
    finally:
        p.destroy()


def test_dense_nhwc_views_need_no_activation_copy(dnnl) -> None:
    p = _prim(dnnl, DENSE, DENSE, blocked=False)
    try:
        if p.impl.startswith("ref"):
            pytest.skip("oneDNN has only its reference loops here")
        assert p.src.reorder is None and p.dst.reorder is None
        assert p.src.plain is None and p.dst.plain is None
    finally:
        p.destroy()


def test_kept_weight_copies_are_per_allocation_and_offset(dnnl) -> None:
    from aotrt import dtypes
    from aotrt.runtime import shims

    dev = get_device("cpu")
    p = _prim(dnnl, DENSE, DENSE, blocked=False)
    base = shims.empty_strided([4096], [1], dtypes.float32, dev)
    try:
        w1 = shims.reinterpret_tensor(base, [C, C, 3, 3], [9 * C, 1, 3 * C, C], 0)
        w2 = shims.reinterpret_tensor(base, [C, C, 3, 3], [9 * C, 1, 3 * C, C], 0)
        w3 = shims.reinterpret_tensor(base, [C, C, 3, 3], [9 * C, 1, 3 * C, C], 64)
        first = p.packed_weights(w1)
        assert p.packed_weights(w2) is first            # same bytes: one copy
        assert p.packed_weights(w3) is not first        # other bytes: another
        assert not first.filled
        for h in (w3, w2, w1):
            shims.delete_tensor_object(h)
    finally:
        shims.delete_tensor_object(base)
        p.destroy()
