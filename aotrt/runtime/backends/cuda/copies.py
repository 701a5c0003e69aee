"""The cuda device's copy and fill kernels, and the plan of one strided copy or fill: which
kernel, over how many threads, with which arguments (backends/cuda/device.py launches it).

A copy of rows of contiguous elements (a channel slice of an NHWC activation, a view of a
concatenation, copied to or from the packed memory a cuDNN convolution reads) moves 16-, 8-
or 4-byte units; anything else goes element by element over up to MAX_COPY_DIMS merged
dims.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from aotrt.errors import Unsupported
from aotrt.runtime.tensor import merge_dims
from aotrt.sources import source

#: the most dims a generic strided copy or fill handles after merging dims
MAX_COPY_DIMS = 8

COPY_SOURCE = source(__package__, "copies.cu")


def plan(dst_ptr: int, src_ptr: int | None, sizes: Sequence[int], dst_strides: Sequence[int],
         src_strides: Sequence[int], itemsize: int, fill: int | None
         ) -> tuple[str, int, list[Any]]:
    """(kernel name, threads, arguments) copying a strided view between raw device
    addresses, or filling one (`src_ptr` None) with the repeated byte `fill`."""
    # Dims in the destination's memory order (outermost first), then merged: every element
    # is copied once whatever the order, and the order makes a channel slice of an NHWC
    # view, whose dims are N, C, H, W, merge into rows x channels.
    order = sorted(range(len(sizes)), key=lambda d: (-dst_strides[d], -src_strides[d]))
    sizes = [sizes[d] for d in order]
    dst_strides = [dst_strides[d] for d in order]
    src_strides = [src_strides[d] for d in order]
    if src_ptr is None:
        msz, (mst,) = merge_dims(sizes, dst_strides)
        mst2 = [0] * len(mst)
    else:
        msz, (mst, mst2) = merge_dims(sizes, dst_strides, src_strides)
        rows = _rows(dst_ptr, src_ptr, msz, mst, mst2, itemsize)
        if rows is not None:
            return rows
    if len(msz) > MAX_COPY_DIMS:
        raise Unsupported(f"strided copy of {len(msz)} irreducible dims (max "
                          f"{MAX_COPY_DIMS})")
    n = 1
    for s in msz:
        n *= s
    pad = MAX_COPY_DIMS - len(msz)
    dims = [len(msz), *msz, *([1] * pad), *mst, *([0] * pad), *mst2, *([0] * pad)]
    tail = [np.int64(n), *(np.int64(v) for v in dims)]
    if fill is None:
        return f"aot_copy{itemsize}", n, [np.uint64(dst_ptr), np.uint64(src_ptr), *tail]
    value = int.from_bytes(bytes([fill]) * itemsize, "little")
    return f"aot_fill{itemsize}", n, [np.uint64(dst_ptr), np.uint64(value), *tail]


def _rows(dst_ptr: int, src_ptr: int, msz: Sequence[int], mst: Sequence[int],
          mst2: Sequence[int], itemsize: int) -> tuple[str, int, list[Any]] | None:
    """The rows kernel's plan where the merged dims are rows x inner elements of stride 1 on
    both sides and the row, both pitches and both addresses share a 16-, 8- or 4-byte unit;
    else None. The element-wise kernel moved YOLOv8n's fp16 channel slices 2 bytes a
    thread, with a division per dim: 18 copies, 83 us of its 604 us a run on the H200
    (2026-12-03)."""
    if len(msz) == 1:
        msz, mst, mst2 = [1, *msz], [0, *mst], [0, *mst2]
    if len(msz) != 2 or mst[1] != 1 or mst2[1] != 1:
        return None
    width, dp, sp = msz[1] * itemsize, mst[0] * itemsize, mst2[0] * itemsize
    for unit in (16, 8, 4):
        if all(v % unit == 0 for v in (width, dp, sp, dst_ptr, src_ptr)):
            cols = width // unit
            n = msz[0] * cols
            return f"aot_rows{unit}", n, [np.uint64(dst_ptr), np.uint64(src_ptr), np.int64(n),
                                          np.int64(cols), np.int64(dp // unit),
                                          np.int64(sp // unit)]
    return None


__all__ = ["COPY_SOURCE", "MAX_COPY_DIMS", "plan"]
