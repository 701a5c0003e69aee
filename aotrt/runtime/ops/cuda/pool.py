"""max_pool2d on cuda: one thread per output element, through the own pooling kernel."""

from __future__ import annotations

from typing import Any

from aotrt.runtime.ops.cuda.common import Work, _i32, _launch
from aotrt.runtime.tensor import Handle


def _nchw(h: Handle) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(sizes, strides) of a 3-D (C, H, W) or 4-D view as 4-D."""
    if h.ndim == 3:
        return (1,) + tuple(h.sizes), (0,) + tuple(h.strides)
    return tuple(h.sizes), tuple(h.strides)


def make_maxpool(out: Handle, indices_out: Handle | None, x: Handle, p: Any) -> Work:
    """max_pool2d with optional int64 indices (flat h * W + w per plane)."""
    dev = out.device
    (n, c, h, w), xs = _nchw(x)
    (_, _, ho, wo), os_ = _nchw(out)
    if indices_out is not None:
        _, is_ = _nchw(indices_out)
        iptr = indices_out.address
    else:
        is_, iptr = (0, 0, 0, 0), 0
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = p.kernel, p.stride, p.padding, p.dilation
    args = [x.address, out.address, iptr, n, c, h, w, ho, wo, *xs, *os_, *is_,
            *(_i32(v) for v in (kh, kw, sh, sw, ph, pw, dh, dw))]
    return _launch(dev, f"aot_maxpool_{x.dtype.name}", n * c * ho * wo, args)
