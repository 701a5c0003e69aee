"""2-D max pooling (aten.max_pool2d_with_indices), with optional int64 indices, into
caller-provided output views.

Semantics follow torch's cpu kernel: padding is never selected, the first maximum in
row-major window order wins, a NaN wins over numbers (the last NaN in window order), and
indices are flat offsets h * W + w into each input plane.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aotrt import dtypes
from aotrt.errors import InvalidArgument
from aotrt.runtime.device import Stream
from aotrt.runtime.ops import _common as c
from aotrt.runtime.tensor import Handle


#: windows of at most this many taps are folded by a python loop over the taps (a few
#: whole-plane passes); larger ones by one numpy reduction over the strided windows
TAP_LOOP = 64


@dataclass(frozen=True)
class PoolParams:
    """Validated pooling geometry, (h, w) pairs."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    out_hw: tuple[int, int]


def _out_size(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch's pooling_output_shape."""
    span = n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = span // s + 1
    # The last window must start inside the input or its left padding.
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


def check_max_pool2d(out: Any, x: Any, kernel_size: Any, stride: Any = (), padding: Any = 0,
                     dilation: Any = 1, ceil_mode: Any = False,
                     indices_out: Any = None) -> tuple[PoolParams, c.OpCost]:
    """Validate max_pool2d's metadata and params; return the geometry and the cost."""
    op = "max_pool2d"
    c.check_dtype(op, x, "x")
    c.check_output(op, out, "out")
    c.check_same_dtype(op, x, "x", out, "out")
    if indices_out is not None:
        c.check_output(op, indices_out, "indices_out")
        if indices_out.dtype is not dtypes.int64:
            raise InvalidArgument(f"max_pool2d: indices_out: dtype must be int64, got "
                                  f"{indices_out.dtype.name}")
    c.check_rank(op, x, "x", (3, 4))
    if any(n == 0 for n in x.sizes[-3:]):
        raise InvalidArgument(f"max_pool2d: x: channel and spatial dims must be non-zero, got "
                              f"{list(x.sizes)}")
    kernel = c.as_ints(op, kernel_size, "kernel_size", 2, minimum=1)
    if stride is None or (isinstance(stride, (list, tuple)) and len(stride) == 0):
        stride = kernel  # aten's default: an empty stride means stride = kernel_size
    else:
        stride = c.as_ints(op, stride, "stride", 2, minimum=1)
    padding = c.as_ints(op, padding, "padding", 2, default=0, minimum=0)
    dilation = c.as_ints(op, dilation, "dilation", 2, default=1, minimum=1)
    ceil_mode = c.as_bool(op, ceil_mode, "ceil_mode")
    for k, p in zip(kernel, padding):
        if p > k // 2:
            raise InvalidArgument(f"max_pool2d: padding: {list(padding)} must be at most half "
                                  f"of kernel_size {list(kernel)}")
    h, w = x.sizes[-2:]
    out_hw = (_out_size(h, kernel[0], stride[0], padding[0], dilation[0], ceil_mode),
              _out_size(w, kernel[1], stride[1], padding[1], dilation[1], ceil_mode))
    if min(out_hw) < 1 and any(d * (k - 1) + 1 > n + 2 * q for n, k, q, d in
                               zip((h, w), kernel, padding, dilation)):
        raise InvalidArgument(f"max_pool2d: kernel_size: {list(kernel)} with dilation "
                              f"{list(dilation)} spans more than the input {list(x.sizes)} "
                              f"padded by {list(padding)}: output size {list(out_hw)} is too "
                              f"small")
    if min(out_hw) < 1:
        raise InvalidArgument(f"max_pool2d: x: input {list(x.sizes)} gives output size "
                              f"{list(out_hw)}, which is too small")
    shape = tuple(x.sizes[:-2]) + out_hw
    c.check_shape(op, out, "out", shape)
    if indices_out is not None:
        c.check_shape(op, indices_out, "indices_out", shape)
    p = PoolParams(kernel, stride, padding, dilation, out_hw)
    return p, pool_cost(x, out, indices_out is not None, p)


def _geometry(h: int, w: int, p: PoolParams) -> tuple[tuple[int, int], ...]:
    """The cpu code's geometry: strides and dilations that move nothing set to 1, and the
    right/bottom padding that ceil_mode windows need."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (ho, wo) = (p.kernel, p.stride, p.padding,
                                                        p.dilation, p.out_hw)
    sh, sw = (sh if ho > 1 else 1), (sw if wo > 1 else 1)
    dh, dw = (dh if kh > 1 else 1), (dw if kw > 1 else 1)
    # ceil_mode windows may run past the right padding; pad far enough for all of them.
    rh = max(ph, (ho - 1) * sh + dh * (kh - 1) + 1 - h - ph)
    rw = max(pw, (wo - 1) * sw + dw * (kw - 1) + 1 - w - pw)
    return (kh, kw), (sh, sw), (ph, pw), (dh, dw), (ho, wo), (rh, rw)


def pool_cost(x: Any, out: Any, indices: bool, p: PoolParams) -> c.OpCost:
    """Cost of the cpu max_pool2d: window taps (several passes with indices), loop steps,
    and scratch: float32 and detached input copies, the padded chunk, the window copies
    and index maps of the indices path."""
    n, ch, h, w = (1,) + tuple(x.sizes) if x.ndim == 3 else tuple(x.sizes)
    (kh, kw), _, (ph, pw), _, (ho, wo), (rh, rw) = _geometry(h, w, p)
    item = x.dtype.itemsize
    step = c.rows_per_chunk(ch * ho * wo * kh * kw * 4 * 3, n)
    chunks = -(-n // step)
    padded = (h + ph + rh) * (w + pw + rw)
    work = x.numel + out.numel * (2 if indices else 1)
    scratch = (4 + item) * x.numel + 4 * step * ch * padded
    taps = n * ch * ho * wo * kh * kw
    if not indices:
        # The numpy path loops over the taps of small windows only (_pool).
        loops = kh * kw if kh * kw <= TAP_LOOP else 1
        work += taps + c.PY_STEP * chunks * (loops + 2)
        scratch += (4 + item) * step * ch * ho * wo
        return c.OpCost(work, scratch)
    plane = ho * wo * kh * kw
    work += 6 * taps + 4 * plane + padded + c.PY_STEP * chunks
    scratch += padded + plane * (1 + 4 * 8)
    scratch += step * ch * (7 * kh * kw * ho * wo + (4 + item + 4 * 8) * ho * wo)
    return c.OpCost(work, scratch)


def max_pool2d(stream: Stream, out: Handle, x: Handle, kernel_size: Any, stride: Any = (),
               padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False,
               indices_out: Handle | None = None) -> int:
    """out (and indices_out) = max_pool2d_with_indices(x, ...) for (N,)C,H,W input."""
    op = "max_pool2d"
    c.check_handles(op, stream, [(x, "x"), (out, "out"), (indices_out, "indices_out")])
    p, _ = check_max_pool2d(out, x, kernel_size, stride, padding, dilation, ceil_mode,
                            indices_out)
    return c.launch(op, stream, [out, indices_out], [x], "max_pool2d", out, indices_out, x, p)
