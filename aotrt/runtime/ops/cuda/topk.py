"""topk on cuda: one thread per row of the other dims, through the own topk kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from aotrt.runtime.ops.cuda.common import (Scratch, Work, _copy_packed, _copy_unpacked, _kernel,
                                           _typed)
from aotrt.runtime.tensor import Handle

if TYPE_CHECKING:
    from aotrt.runtime.devices.cuda import CudaStream


def make_topk(values_out: Handle, indices_out: Handle, x: Handle, k: int, dim: int,
              largest: bool) -> Work:
    """topk along `dim`: one thread per row of the other dims (folded, or packed first)."""
    dev = x.device
    if x.ndim == 0:
        return _topk_scalar(values_out, indices_out, x)
    n = x.sizes[dim]
    kern_name = f"aot_topk_{x.dtype.name}"
    _kernel(dev, kern_name)  # refuse early if the module lacks it

    def rows_of(h: Handle) -> tuple[int, int, int] | None:
        sizes = [s for i, s in enumerate(h.sizes) if i != dim]
        strides = [st for i, st in enumerate(h.strides) if i != dim]
        msz, (mst,) = _merge(sizes, strides)
        if len(msz) > 1:
            return None
        return (msz[0] if msz else 1), (mst[0] if mst else 0), h.strides[dim]

    def moved(h: Handle) -> Handle:
        order = [i for i in range(h.ndim) if i != dim] + [dim]
        return Handle(h.alloc, h.byte_offset, tuple(h.sizes[i] for i in order),
                      tuple(h.strides[i] for i in order), h.dtype, h.device, h.owner)

    rows = 1
    for i, s_ in enumerate(x.sizes):
        if i != dim:
            rows *= s_
    rx, rv, ri = rows_of(x), rows_of(values_out), rows_of(indices_out)
    # outputs over the input must read the old values: go through packed copies then
    direct = (rx is not None and rv is not None and ri is not None
              and not _overlaps(values_out, x) and not _overlaps(indices_out, x))
    kern = _kernel(dev, kern_name)
    cfg = dev.launch_config(rows)
    isz = x.dtype.itemsize
    xm, vm, im = moved(x), moved(values_out), moved(indices_out)

    def work(s: "CudaStream") -> None:
        from cuda.core import launch

        if direct:
            args = [x.address, values_out.address, indices_out.address, rows, n, k, rx[1], rx[2],
                    rv[1], rv[2], ri[1], ri[2]]
            launch(s.cs, cfg, kern, *_typed(args), np.int32(1 if largest else 0))
            return
        xs, vs, ins = (Scratch(s, rows * n * isz), Scratch(s, rows * k * isz),
                       Scratch(s, rows * k * 8))
        try:
            _copy_packed(dev, s, xs.ptr, xm)
            args = [xs.ptr, vs.ptr, ins.ptr, rows, n, k, n, 1, k, 1, k, 1]
            launch(s.cs, cfg, kern, *_typed(args), np.int32(1 if largest else 0))
            _copy_unpacked(dev, s, vm, vs.ptr)
            _copy_unpacked(dev, s, im, ins.ptr)
        finally:
            for sc in (xs, vs, ins):
                sc.free()
    return work


def _overlaps(a: Handle, b: Handle) -> bool:
    """True when two views share bytes of one allocation (conservatively, by byte range)."""
    if a.alloc is None or b.alloc is None or a.alloc is not b.alloc:
        return False
    a0, a1 = a.byte_range()
    b0, b1 = b.byte_range()
    return a0 < b1 and b0 < a1


def _topk_scalar(values_out: Handle, indices_out: Handle, x: Handle) -> Work:
    """torch: a 0-D input gives itself and index 0."""
    dev = x.device
    copy = dev._strided(values_out.address, x.address, (1,), (1,), (1,), x.dtype.itemsize, None)
    zero = dev.strided_fill_work(indices_out, 0)

    def work(s: "CudaStream") -> None:
        copy(s)
        zero(s)
    return work


def _merge(sizes: Sequence[int], strides: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    from aotrt.runtime.devices.cuda import _merge_dims

    return _merge_dims(sizes, strides)
