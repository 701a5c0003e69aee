"""max_pool2d on cuda: the own pooling kernels. Dense NHWC views without indices (what a
channels-last network makes) take a vectorized kernel with 32-bit coordinates; every other
view the general one, one thread per output element."""

from __future__ import annotations

from typing import Any

from aotrt.runtime.backends.cuda.ops.common import Work, i32, launch
from aotrt.runtime.tensor import Handle
from aotrt.sources import source


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
    lanes = _nhwc_lanes(x, out) if indices_out is None else 0
    if lanes:
        args = [x.address, out.address,
                *(i32(v) for v in (n, c, h, w, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw))]
        return launch(dev, KERNELS, f"aot_maxpool_nhwc{lanes}_{x.dtype.name}",
                      n * ho * wo * (c // lanes), args)
    # Threads walk the elements in the input's order (it is read kh*kw times, the output
    # once): channel fastest for an NHWC input, so that neighbours read neighbouring bytes.
    cl = xs[1] == 1 and c > 1
    args = [x.address, out.address, iptr, n, c, h, w, ho, wo, *xs, *os_, *is_,
            *(i32(v) for v in (kh, kw, sh, sw, ph, pw, dh, dw, cl))]
    return launch(dev, KERNELS, f"aot_maxpool_{x.dtype.name}", n * c * ho * wo, args)


def _nhwc_lanes(x: Handle, out: Handle) -> int:
    """Channels per thread of the NHWC kernel (16-byte vectors where the channel count and
    the addresses allow, else 1), or 0 when the views are not dense 4-D NHWC or are too big
    for 32-bit coordinates. ResNet-50's max pool at b32 took 270 us in the general kernel on
    the H200 (64-bit coordinates, one element a thread), against 26 us for torch.compile."""
    if x.ndim != 4 or out.ndim != 4 or x.numel >= 2 ** 31 or out.numel >= 2 ** 31:
        return 0
    for v in (x, out):
        _, c, h, w = v.sizes
        if tuple(v.strides)[1:] != (1, w * c, c) or (v.sizes[0] > 1 and
                                                      v.strides[0] != h * w * c):
            return 0
    c, isz = x.sizes[1], x.dtype.itemsize
    vec = 16 // isz
    if c % vec == 0 and x.address % 16 == 0 and out.address % 16 == 0:
        return vec
    return 1


# ---------------------------------------------------------------------------------------------
# CUDA C in pool.cu (compiled after common.PRELUDE, prelude.cuh)

KERNELS = source(__package__, "pool.cu")
