"""topk on cuda, through the own kernels: few rows (RT-DETR's query selection: one row of
8400, k 300) get a thread per element that counts the elements ranked before it, many rows
a thread per row that makes k selection passes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from aotrt.runtime.ops._common import overlaps
from aotrt.runtime.backends.cuda.ops.common import (Scratch, Work, copy_packed, copy_unpacked,
                                                    kernel, typed)
from aotrt.runtime.tensor import Handle
from aotrt.sources import source

if TYPE_CHECKING:
    from aotrt.runtime.backends.cuda.device import CudaStream


def make_topk(values_out: Handle, indices_out: Handle, x: Handle, k: int, dim: int,
              largest: bool) -> Work:
    """topk along `dim` (rows: the other dims, folded, or packed first)."""
    dev = x.device
    if x.ndim == 0:
        return _topk_scalar(values_out, indices_out, x)
    n = x.sizes[dim]
    rows = 1
    for i, s_ in enumerate(x.sizes):
        if i != dim:
            rows *= s_
    # A thread per row runs k passes over n: one row of 8400 took 490 ms on the H200. A
    # thread per element counts, over n, the elements ranked before it (rows * n * n work,
    # all of it parallel); past RANK_MAX_N that square outgrows the k passes.
    by_rank = n <= RANK_MAX_N and rows < RANK_MAX_ROWS
    kern_name = f"aot_topk_{x.dtype.name}{'_rank' if by_rank else ''}"
    kern = kernel(dev, KERNELS, kern_name)  # refuses early if the module lacks it

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

    rx, rv, ri = rows_of(x), rows_of(values_out), rows_of(indices_out)
    # outputs over the input must read the old values: go through packed copies then
    direct = (rx is not None and rv is not None and ri is not None
              and not overlaps(values_out, x) and not overlaps(indices_out, x))
    cfg = dev.launch_config(rows * n if by_rank else rows)
    isz = x.dtype.itemsize
    xm, vm, im = moved(x), moved(values_out), moved(indices_out)

    def work(s: "CudaStream") -> None:
        from cuda.core import launch

        if direct:
            args = [x.address, values_out.address, indices_out.address, rows, n, k, rx[1], rx[2],
                    rv[1], rv[2], ri[1], ri[2]]
            launch(s.cs, cfg, kern, *typed(args), np.int32(1 if largest else 0))
            return
        xs, vs, ins = (Scratch(s, rows * n * isz), Scratch(s, rows * k * isz),
                       Scratch(s, rows * k * 8))
        try:
            copy_packed(dev, s, xs.ptr, xm)
            args = [xs.ptr, vs.ptr, ins.ptr, rows, n, k, n, 1, k, 1, k, 1]
            launch(s.cs, cfg, kern, *typed(args), np.int32(1 if largest else 0))
            copy_unpacked(dev, s, vm, vs.ptr)
            copy_unpacked(dev, s, im, ins.ptr)
        finally:
            for sc in (xs, vs, ins):
                sc.free()
    return work


#: the rank kernel serves rows up to this long ...
RANK_MAX_N = 1 << 16
#: ... when there are fewer rows than this (else a thread per row has parallelism enough)
RANK_MAX_ROWS = 8192


def _topk_scalar(values_out: Handle, indices_out: Handle, x: Handle) -> Work:
    """torch: a 0-D input gives itself and index 0."""
    dev = x.device
    copy = dev.strided_work(values_out.address, x.address, (1,), (1,), (1,), x.dtype.itemsize, None)
    zero = dev.strided_fill_work(indices_out, 0)

    def work(s: "CudaStream") -> None:
        copy(s)
        zero(s)
    return work


def _merge(sizes: Sequence[int], strides: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    from aotrt.runtime.tensor import merge_dims

    return merge_dims(sizes, strides)


# ---------------------------------------------------------------------------------------------
# CUDA C in topk.cu (compiled after common.PRELUDE, prelude.cuh)

KERNELS = source(__package__, "topk.cu")
