"""aotrt/program/strides.py: the stride arithmetic of views (element counts, row-major
strides, spans, extents, packing)."""

from __future__ import annotations

import pytest

from aotrt.program.strides import (contiguous_strides, extent, is_packed, is_row_major,
                                   numel_of, span)


@pytest.mark.parametrize("sizes,strides,expect", [
    ((), (), (0, 0)),
    ((4,), (1,), (0, 3)),
    ((3, 4), (4, 1), (0, 11)),
    ((3, 4), (1, 3), (0, 11)),
    ((1, 5), (1000, 2), (0, 8)),      # a size-1 dim does not step
    ((3,), (-2,), (-4, 0)),
    ((2, 3), (0, 1), (0, 2)),         # broadcast dim
])
def test_span_is_the_lowest_and_highest_element(sizes, strides, expect):
    assert span(sizes, strides) == expect


@pytest.mark.parametrize("sizes,n", [((), 1), ((0,), 0), ((2, 3, 4), 24), ((5, 0, 7), 0)])
def test_numel_of(sizes, n):
    assert numel_of(sizes) == n


@pytest.mark.parametrize("sizes,strides", [
    ((), ()), ((5,), (1,)), ((2, 3, 4), (12, 4, 1)), ((2, 0, 3), (3, 3, 1)), ((1, 1), (1, 1)),
])
def test_contiguous_strides_are_row_major(sizes, strides):
    assert contiguous_strides(sizes) == strides


@pytest.mark.parametrize("sizes,strides,packed", [
    ((), (), True),
    ((4,), (1,), True),
    ((3, 4), (4, 1), True),
    ((3, 4), (1, 3), True),           # column-major is a dense permutation
    ((2, 3, 4), (1, 8, 2), True),
    ((1, 4), (99, 1), True),          # size-1 dims are ignored
    ((12, 8), (16, 1), False),        # the seeds' last-dim half
    ((6, 16), (16, 1), True),         # the seeds' first-dim half
    ((4,), (2,), False),              # holes
    ((2, 3), (0, 1), False),          # overlapping (broadcast)
    ((2, 2), (1, 1), False),          # overlapping dims
    ((3,), (-1,), False),
    ((0, 5), (7, 3), True),           # empty: anything goes
])
def test_is_packed(sizes, strides, packed):
    assert is_packed(sizes, strides) is packed


@pytest.mark.parametrize("sizes,strides,row_major", [
    ((3, 4), (4, 1), True),
    ((3, 4), (1, 3), False),
    ((3, 1, 4), (4, 77, 1), True),    # §3 #85: size-1 dims ignored
    ((1,), (5,), True),
    ((), (), True),
    ((2, 2), (2, 2), False),
])
def test_is_row_major(sizes, strides, row_major):
    assert is_row_major(sizes, strides) is row_major


@pytest.mark.parametrize("sizes,strides,itemsize,expect", [
    ((), (), 4, (0, 4)),
    ((0, 3), (3, 1), 4, (0, 0)),      # empty: no bytes
    ((2, 3), (3, 1), 2, (0, 12)),
    ((2, 3), (1, 2), 4, (0, 24)),
    ((4, 1), (0, 99), 8, (0, 8)),     # broadcast over 4, a size-1 dim does not step
])
def test_extent_is_the_bytes_a_view_touches(sizes, strides, itemsize, expect):
    assert extent(sizes, strides, itemsize) == expect
