"""Stride arithmetic of views: element counts, row-major strides, extents and packing.

The one copy: the program's validator, the exporter and the runtime's handles all use it.
Sizes and strides are in elements; nothing here knows about memory or devices.
"""

from __future__ import annotations

from typing import Sequence


def numel_of(sizes: Sequence[int]) -> int:
    """Product of sizes."""
    n = 1
    for s in sizes:
        n *= s
    return n


def contiguous_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides for `sizes`."""
    out, acc = [], 1
    for n in reversed(sizes):
        out.append(acc)
        acc *= max(int(n), 1)
    return tuple(reversed(out))


def span(sizes: Sequence[int], strides: Sequence[int]) -> tuple[int, int]:
    """(lowest, highest) element offset a non-empty view reaches, relative to element 0."""
    lo = hi = 0
    for n, s in zip(sizes, strides):
        if n > 1:
            if s >= 0:
                hi += (n - 1) * s
            else:
                lo += (n - 1) * s
    return lo, hi


def extent(sizes: Sequence[int], strides: Sequence[int], itemsize: int) -> tuple[int, int]:
    """[lo, hi) bytes relative to element 0 that a view with non-negative strides touches."""
    if numel_of(sizes) == 0:
        return 0, 0
    hi = sum((n - 1) * s for n, s in zip(sizes, strides) if n > 1)
    return 0, (hi + 1) * itemsize


def is_packed(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """True when the elements fill [element 0, extent) exactly: no holes, no overlap.

    Extent = highest offset + 1 over dims of size > 1, which must equal the element count;
    dims that overlap (equal or zero strides) make it larger or smaller, so they are
    non-packed too.
    """
    n = numel_of(sizes)
    if n == 0:
        return True
    if any(s < 0 for d, s in zip(sizes, strides) if d > 1):
        return False
    dims = sorted((s, d) for d, s in zip(sizes, strides) if d > 1)
    expect = 1
    for s, d in dims:
        if s != expect:
            return False
        expect *= d
    return expect == n


def is_row_major(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """True for C-contiguous views, ignoring the strides of size-1 dims."""
    expect = 1
    for n, s in zip(reversed(sizes), reversed(strides)):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


__all__ = ["contiguous_strides", "extent", "is_packed", "is_row_major", "numel_of", "span"]
