"""The cuda device's copy and fill kernels, and the plan of one strided copy or fill: which
kernel, over how many threads, with which arguments (devices/cuda.py launches it).

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

#: the most dims a generic strided copy or fill handles after merging dims
MAX_COPY_DIMS = 8

COPY_SOURCE = r"""typedef long long int64_t;
typedef unsigned long long uint64_t;
typedef unsigned int uint32_t;
typedef unsigned short uint16_t;
typedef unsigned char uint8_t;
#define AOT_DIMS(T) int64_t ndim, \
  int64_t s0, int64_t s1, int64_t s2, int64_t s3, int64_t s4, int64_t s5, int64_t s6, \
  int64_t s7, int64_t a0, int64_t a1, int64_t a2, int64_t a3, int64_t a4, int64_t a5, \
  int64_t a6, int64_t a7, int64_t b0, int64_t b1, int64_t b2, int64_t b3, int64_t b4, \
  int64_t b5, int64_t b6, int64_t b7
#define AOT_OFFSETS \
  const int64_t S[8] = {s0, s1, s2, s3, s4, s5, s6, s7}; \
  const int64_t A[8] = {a0, a1, a2, a3, a4, a5, a6, a7}; \
  const int64_t B[8] = {b0, b1, b2, b3, b4, b5, b6, b7}; \
  int64_t oa = 0, ob = 0; int64_t r = i; \
  _Pragma("unroll") for (int d = 7; d >= 0; d--) { if (d < ndim) { \
    int64_t c; if (n < 2147483647LL) { c = (int64_t)((uint32_t)r % (uint32_t)S[d]); \
      r = (int64_t)((uint32_t)r / (uint32_t)S[d]); } else { c = r % S[d]; r = r / S[d]; } \
    oa += c * A[d]; ob += c * B[d]; } }
#define AOT_COPY(NAME, T) \
extern "C" __global__ void NAME(char* dst, const char* src, int64_t n, AOT_DIMS(T)) { \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; \
       i += (int64_t)gridDim.x * blockDim.x) { AOT_OFFSETS \
    ((T*)dst)[oa] = ((const T*)src)[ob]; } }
#define AOT_FILL(NAME, T) \
extern "C" __global__ void NAME(char* dst, uint64_t value, int64_t n, AOT_DIMS(T)) { \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; \
       i += (int64_t)gridDim.x * blockDim.x) { AOT_OFFSETS \
    ((T*)dst)[oa] = (T)value; } }
/* Rows of `cols` units of T, each row `dpitch` / `spitch` units apart: a channel slice of
   an NHWC activation (a view of a concatenation) copied to or from packed memory, moved in
   16-byte units where the row and both pitches and addresses allow. */
struct alignas(16) aot_v16 { uint64_t a, b; };
struct alignas(8) aot_v8 { uint64_t a; };
#define AOT_ROWS(NAME, T) \
extern "C" __global__ void NAME(char* dst, const char* src, int64_t n, int64_t cols, \
                                int64_t dpitch, int64_t spitch) { \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; \
       i += (int64_t)gridDim.x * blockDim.x) { \
    int64_t r, c; \
    if (n < 2147483647LL) { r = (int64_t)((uint32_t)i / (uint32_t)cols); \
      c = i - r * cols; } else { r = i / cols; c = i - r * cols; } \
    ((T*)dst)[r * dpitch + c] = ((const T*)src)[r * spitch + c]; } }
AOT_ROWS(aot_rows16, aot_v16)
AOT_ROWS(aot_rows8, aot_v8)
AOT_ROWS(aot_rows4, uint32_t)
AOT_COPY(aot_copy1, uint8_t)
AOT_COPY(aot_copy2, uint16_t)
AOT_COPY(aot_copy4, uint32_t)
AOT_COPY(aot_copy8, uint64_t)
AOT_FILL(aot_fill1, uint8_t)
AOT_FILL(aot_fill2, uint16_t)
AOT_FILL(aot_fill4, uint32_t)
AOT_FILL(aot_fill8, uint64_t)
"""


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
