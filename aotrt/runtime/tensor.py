"""Handle: one view of one allocation (allocation, byte offset, sizes, strides, dtype).

A view of a view resolves to the same allocation with the combined offset; there is never
a second allocation object over the same bytes.
"""

from __future__ import annotations

import ctypes
import os

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from aotrt.dtypes import DType
from aotrt.errors import InvalidArgument, OutOfMemory
from aotrt.program.strides import is_packed, is_row_major, numel_of, span
from aotrt.runtime.hazards import Access

if TYPE_CHECKING:
    from aotrt.runtime.device import Device
    from aotrt.runtime.memory import Allocation, Owner

INT64_MAX = (1 << 63) - 1
# numpy's (and DLPack consumers') limit on dims; a view with more could not be read.
MAX_DIMS = 64
# Views and blobs reach less than 2**62 bytes (as allocations do): offsets, extents and their
# sums in kernels then never overflow int64.
EXTENT_LIMIT = 1 << 62


class Handle:
    """One view: allocation + byte offset of element 0 + sizes/strides (elements) + dtype."""

    __slots__ = ("alloc", "byte_offset", "sizes", "strides", "dtype", "device", "owner",
                 "state", "__weakref__")

    def __init__(self, alloc: "Allocation | None", byte_offset: int, sizes: tuple[int, ...],
                 strides: tuple[int, ...], dtype: DType, device: "Device", owner: "Owner") -> None:
        if len(sizes) > MAX_DIMS or len(strides) != len(sizes):
            raise InvalidArgument(f"sizes: {len(sizes)} dims with {len(strides)} strides; at "
                                  f"most {MAX_DIMS} dims, one stride each")
        self.alloc = alloc
        self.byte_offset = byte_offset
        self.sizes = sizes
        self.strides = strides
        self.dtype = dtype
        self.device = device
        self.owner = owner
        self.state = "new"

    def __repr__(self) -> str:
        where = self.alloc.describe() if self.alloc else "no memory"
        return (f"<Handle {self.state} {self.dtype.name}{list(self.sizes)} strides "
                f"{list(self.strides)} at +{self.byte_offset} of {where}>")

    # -- lifecycle (used by shims and delegates) ----------------------------------------------

    def _publish(self) -> "Handle":
        """Take a count on the allocation and join the owner: only after validation passed."""
        if self.alloc is not None:
            self.alloc.retain()
        self.owner.handles.add(self)
        self.state = "live"
        return self

    def _delete(self) -> None:
        if self.state == "retired" or (self.state == "live" and self.alloc is not None
                                       and self.alloc.freed):
            # Retired, or its memory went with its owner (constants): there is no count left
            # to give back; just drop the handle.
            self.owner.handles.discard(self)
            self.state = "deleted"
            return
        check_live(self, "handle")
        self.state = "deleted"
        self.owner.handles.discard(self)
        if self.alloc is not None:
            self.alloc.release()

    def _retire(self) -> None:
        """The owner went away: give the count back; later use is refused."""
        if self.state != "live":
            return
        self.state = "retired"
        self.owner.handles.discard(self)
        if self.alloc is not None:
            self.alloc.release()

    # -- derived ------------------------------------------------------------------------------

    @property
    def numel(self) -> int:
        """Number of elements."""
        return numel_of(self.sizes)

    @property
    def ndim(self) -> int:
        """Number of dims."""
        return len(self.sizes)

    @property
    def address(self) -> int:
        """The address element 0 stands for (may be one past the end for an empty view)."""
        return (self.alloc.ptr if self.alloc else 0) + self.byte_offset

    @property
    def storage_offset(self) -> int:
        """Element offset from the start of the allocation, as PyTorch counts it."""
        return self.byte_offset // self.dtype.itemsize

    @property
    def packed(self) -> bool:
        """True when the view's elements are dense in memory (any dense order)."""
        return is_packed(self.sizes, self.strides)

    @property
    def row_major(self) -> bool:
        """True when C-contiguous (size-1 dims ignored)."""
        return is_row_major(self.sizes, self.strides)

    def byte_range(self) -> tuple[int, int]:
        """[start, end) bytes relative to the allocation that the elements occupy."""
        if self.numel == 0:
            return self.byte_offset, self.byte_offset
        lo, hi = span(self.sizes, self.strides)
        isz = self.dtype.itemsize
        return self.byte_offset + lo * isz, self.byte_offset + (hi + 1) * isz

    def access(self, write: bool) -> Access:
        """The hazard record of touching this view."""
        start, end = self.byte_range()
        return Access(self.alloc, start, end, write)

    # -- host access --------------------------------------------------------------------------

    def numpy(self) -> np.ndarray:
        """A host copy of the elements, after waiting for pending writes to them.

        A view with zero strides (a broadcast) copies only its distinct elements and comes
        back as a read-only numpy broadcast of them, as large as the view but no larger in
        memory than those elements.
        """
        check_live(self, "handle")
        if self.numel == 0 or self.alloc is None:
            return _host(lambda: np.zeros(self.sizes, dtype=self.dtype.np), self.sizes,
                         self.dtype)
        self.alloc.settle(writes_only=True)
        distinct = tuple(1 if s == 0 else n for n, s in zip(self.sizes, self.strides))
        if distinct == self.sizes:
            return _host(lambda: self.device.read(self), self.sizes, self.dtype)
        # Unpublished: a read-only view of this handle's own bytes, never handed out.
        part = Handle(self.alloc, self.byte_offset, distinct, self.strides, self.dtype,
                      self.device, self.owner)
        arr = _host(lambda: self.device.read(part), distinct, self.dtype)
        return np.broadcast_to(arr, self.sizes)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        arr = self.numpy()
        if dtype is None and not copy:
            return arr
        return _host(lambda: np.array(arr, dtype=dtype, copy=True), self.sizes,
                     self.dtype if dtype is None else np.dtype(dtype))


def _host(make: Any, sizes: tuple[int, ...], dtype: Any) -> np.ndarray:
    """`make()`, with host memory exhaustion told as OutOfMemory naming the size.

    A copy larger than the machine's physical memory is refused before it is made: where the
    kernel overcommits, numpy's allocation would succeed and the process would be killed
    while filling it (seen on a 128 GB host for an 8 TB broadcast copy).
    """
    itemsize = getattr(dtype, "itemsize", 1)
    nbytes = numel_of(sizes) * itemsize
    if nbytes > physical_memory():
        raise OutOfMemory(f"host copy of {nbytes} bytes ({list(sizes)} x {itemsize}) does not "
                          f"fit in host memory")
    try:
        return make()
    except MemoryError:
        raise OutOfMemory(f"host copy of {nbytes} bytes ({list(sizes)} x {itemsize}) does not "
                          f"fit in host memory") from None


def physical_memory() -> int:
    """Bytes of physical memory of this machine (no limit where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def check_live(h: Any, name: str) -> None:
    """Raise InvalidArgument unless `h` is a live Handle."""
    if not isinstance(h, Handle):
        raise InvalidArgument(f"{name}: expected a tensor handle, got {type(h).__name__}")
    if h.state != "live":
        raise InvalidArgument(f"{name}: handle is {h.state} and cannot be used")
    if h.alloc is not None and h.alloc.freed:
        # A view into constants whose owner closed: the memory is gone, like a retired handle.
        raise InvalidArgument(f"{name}: the memory of {h!r} was freed with its owner")


def host_array(handle: Handle) -> np.ndarray:
    """A zero-copy numpy view of a host-memory view's elements."""
    if handle.numel == 0 or handle.alloc is None:
        return np.empty(handle.sizes, dtype=handle.dtype.np)
    lo, hi = handle.byte_range()
    buf = (ctypes.c_uint8 * (hi - lo)).from_address(handle.alloc.ptr + lo)
    isz = handle.dtype.itemsize
    return np.ndarray(handle.sizes, dtype=handle.dtype.np, buffer=buf,
                      offset=handle.byte_offset - lo, strides=[s * isz for s in handle.strides])


def merge_dims(sizes: Sequence[int], *stride_lists: Sequence[int]
               ) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge neighbours that are contiguous in every stride list."""
    keep = [i for i, n in enumerate(sizes) if n != 1]
    out_sizes: list[int] = []
    out_strides: list[list[int]] = [[] for _ in stride_lists]
    for i in keep:
        n = sizes[i]
        if out_sizes and all(st[-1] == sl[i] * n for st, sl in zip(out_strides, stride_lists)):
            out_sizes[-1] *= n
            for st, sl in zip(out_strides, stride_lists):
                st[-1] = sl[i]
            continue
        out_sizes.append(n)
        for st, sl in zip(out_strides, stride_lists):
            st.append(sl[i])
    return out_sizes, out_strides


#: search nodes `strided_meet` may visit before it answers "they may meet"
_MEET_BUDGET = 4096


def strided_meet(offset: int, sizes_a: Sequence[int], sizes_b: Sequence[int],
                 strides: Sequence[int]) -> bool:
    """Whether two views with the same element strides, b starting `offset` elements after
    a, share an element: some index differences d (-sizes_b < d < sizes_a per dim) with
    sum(d * stride) == offset. Exact, by a search over the dims from the largest stride,
    each step keeping only the differences the remaining dims can still make up; True
    (conservatively) for negative strides or a search past _MEET_BUDGET nodes.

    Channel slices of one NHWC concatenation interleave in memory, so their byte ranges
    intersect while their elements never do: YOLOv8n's C2f convolutions read one slice and
    write another, and a byte-range test had the cpu device copy the input every run."""
    dims = []
    for na, nb, st in zip(sizes_a, sizes_b, strides):
        if na == 0 or nb == 0:
            return False
        if st < 0:
            return True
        if st > 0 and (na > 1 or nb > 1):
            dims.append((st, -(nb - 1), na - 1))
    dims.sort(reverse=True)
    # the least and most the dims from i on can contribute
    low = [0] * (len(dims) + 1)
    high = [0] * (len(dims) + 1)
    for i in range(len(dims) - 1, -1, -1):
        st, lo, hi = dims[i]
        low[i], high[i] = low[i + 1] + lo * st, high[i + 1] + hi * st
    budget = [_MEET_BUDGET]

    def meet(i: int, rest: int) -> bool:
        if i == len(dims):
            return rest == 0
        budget[0] -= 1
        if budget[0] < 0:
            return True
        st, lo, hi = dims[i]
        # d * st must leave a rest the later dims can make: low[i+1] <= rest - d*st <= high
        first = max(lo, -((high[i + 1] - rest) // st))
        last = min(hi, (rest - low[i + 1]) // st)
        return any(meet(i + 1, rest - d * st) for d in range(first, last + 1))

    return low[0] <= offset <= high[0] and meet(0, offset)


def views_meet(a: Handle, b: Handle) -> bool:
    """Whether two views of one allocation share a byte: exact where both have the same
    element size and strides and their offsets differ by whole elements (`strided_meet`),
    else whether their byte ranges intersect."""
    if a.alloc is None or b.alloc is None or a.alloc is not b.alloc:
        return False
    a0, a1 = a.byte_range()
    b0, b1 = b.byte_range()
    if not (a0 < b1 and b0 < a1):
        return False
    isz = a.dtype.itemsize
    delta = b.byte_offset - a.byte_offset
    if (b.dtype.itemsize != isz or a.ndim != b.ndim or tuple(a.strides) != tuple(b.strides)
            or delta % isz):
        return True
    return strided_meet(delta // isz, a.sizes, b.sizes, a.strides)


def same_dense_layout(a: Handle, b: Handle) -> bool:
    """True when both views are packed and lay their elements out identically."""
    if a.sizes != b.sizes or a.dtype.itemsize != b.dtype.itemsize:
        return False
    if not (is_packed(a.sizes, a.strides) and is_packed(b.sizes, b.strides)):
        return False
    return all(sa == sb for n, sa, sb in zip(a.sizes, a.strides, b.strides) if n > 1)
