"""aotrt/runtime/tensor.py: Handle (one view of one allocation) and its layout helpers, plus
the seeds' two failing paths (reference/behaviors.md §1.1) rebuilt with our kernels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from aotrt.dtypes import as_dtype
from aotrt.errors import InvalidArgument
from aotrt.runtime import shims
from aotrt.runtime.tensor import Handle, check_live, strided_meet, views_meet
from tests.support import affine_kernel, copy_kernel, iota, iota_kernel, kernel_fn, rand, upload

# -- Handle -----------------------------------------------------------------------------------


def test_handle_properties(dev, stream, owner):
    base = shims.empty_strided([4, 6], None, "float32", dev)
    v = shims.reinterpret_tensor(base, [2, 3], [6, 2], 7)
    assert v.alloc is base.alloc and v.byte_offset == 28 and v.storage_offset == 7
    assert v.address == base.alloc.ptr + 28
    assert (v.numel, v.ndim, v.sizes, v.strides) == (6, 2, (2, 3), (6, 2))
    assert not v.packed and not v.row_major and base.packed and base.row_major
    assert v.byte_range() == (28, 28 + (6 + 4 + 1) * 4)
    assert v.owner is owner and v.device is dev and v.state == "live"
    for h in (v, base):
        shims.delete_tensor_object(h)


def test_handle_access_covers_its_byte_range(dev, stream, owner):
    base = shims.empty_strided([16], None, "float32", dev)
    v = shims.reinterpret_tensor(base, [4], [2], 3)
    acc = v.access(write=True)
    assert (acc.alloc, acc.start, acc.end, acc.write) == (base.alloc, 12, 12 + 7 * 4, True)
    assert not v.access(write=False).write
    for h in (v, base):
        shims.delete_tensor_object(h)


def test_empty_handle_has_an_empty_byte_range_at_its_address(dev, stream, owner):
    base = shims.empty_strided([8], None, "float32", dev)
    e = shims.reinterpret_tensor(base, [0], [1], 8)
    assert e.byte_range() == (32, 32) and e.address == base.alloc.end
    assert e.numpy().shape == (0,)
    for h in (e, base):
        shims.delete_tensor_object(h)


def test_handle_repr_names_state_layout_and_memory(dev, stream, owner):
    h = shims.empty_strided([2, 3], None, "float16", dev)
    text = repr(h)
    assert "live" in text and "float16[2, 3]" in text and "strides [3, 1]" in text
    shims.delete_tensor_object(h)
    assert "deleted" in repr(h)


def test_handle_numpy_waits_for_pending_writes(dev, stream, owner):
    """§3 #17: a copy to the host sees the result of still-queued work."""
    h = shims.empty_strided([5, 7], None, "float32", dev)
    kernel_fn(dev, iota_kernel([5, 7], [7, 1]))(stream, h)
    stream.commit()
    waits = stream.completed_waits
    np.testing.assert_array_equal(h.numpy(), iota([5, 7]))
    assert stream.completed_waits == waits + 1
    shims.delete_tensor_object(h)


def test_handle_numpy_without_pending_writes_does_not_wait(dev, stream, owner):
    """§3 #21: reading memory the queue does not write leaves unrelated work queued."""
    h = shims.empty_strided([4], None, "float32", dev)
    other = shims.empty_strided([4], None, "float32", dev)
    upload(h, iota([4]))
    kernel_fn(dev, iota_kernel([4], [1]))(stream, other)
    waits = stream.completed_waits
    np.testing.assert_array_equal(h.numpy(), iota([4]))
    assert stream.completed_waits == waits and other.alloc.busy()
    for x in (h, other):
        shims.delete_tensor_object(x)


def test_handle_numpy_is_a_copy(dev, stream, owner):
    h = shims.empty_strided([3], None, "float32", dev)
    upload(h, iota([3]))
    arr = h.numpy()
    arr[:] = 0
    np.testing.assert_array_equal(h.numpy(), iota([3]))
    shims.delete_tensor_object(h)


def test_handle_array_protocol_and_dtype(dev, stream, owner):
    h = shims.empty_strided([3], None, "int32", dev)
    upload(h, np.array([1, 2, 3], np.int32))
    assert np.asarray(h).dtype == np.int32
    np.testing.assert_array_equal(np.asarray(h, dtype=np.float64), [1.0, 2.0, 3.0])
    shims.delete_tensor_object(h)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64", "int32", "int16",
                                   "int8", "uint8", "bool"])
def test_handle_roundtrips_every_dtype(dev, stream, owner, dtype):
    dt = as_dtype(dtype)
    data = (rand([3, 5], seed=3) * 50).astype(dt.np)
    h = shims.empty_strided([3, 5], None, dtype, dev)
    upload(h, data)
    got = h.numpy()
    assert got.dtype == dt.np
    np.testing.assert_array_equal(got, data)
    shims.delete_tensor_object(h)


def test_handle_without_memory_reads_as_zeros(dev, stream, owner):
    h = shims.create_tensor_from_blob(0, [0, 4], None, 0, "float32")
    assert h.alloc is None and h.address == 0
    assert h.numpy().shape == (0, 4)
    shims.delete_tensor_object(h)


def test_check_live_refuses_non_handles_and_dead_ones(dev, stream, owner):
    with pytest.raises(InvalidArgument, match="x: expected a tensor handle, got int"):
        check_live(3, "x")
    h = shims.empty_strided([1], None, "float32", dev)
    shims.delete_tensor_object(h)
    with pytest.raises(InvalidArgument, match="y: handle is deleted"):
        check_live(h, "y")
    unpublished = Handle(None, 0, (), (), as_dtype("float32"), dev, owner)
    with pytest.raises(InvalidArgument, match="handle is new"):
        check_live(unpublished, "z")


def test_publish_takes_one_count_and_joins_the_owner(dev, stream, owner):
    base = shims.empty_strided([4], None, "float32", dev)
    h = Handle(base.alloc, 0, (4,), (1,), base.dtype, dev, owner)
    assert h.state == "new" and h not in owner.handles and base.alloc.users == 1
    h._publish()
    assert h.state == "live" and h in owner.handles and base.alloc.users == 2
    h._delete()
    assert h.state == "deleted" and h not in owner.handles and base.alloc.users == 1
    shims.delete_tensor_object(base)


def test_retire_gives_the_count_back_once(dev, stream, owner):
    base = shims.empty_strided([4], None, "float32", dev)
    v = shims.new_tensor_handle(base)
    v._retire()
    v._retire()
    assert v.state == "retired" and base.alloc.users == 1 and v not in owner.handles
    v._delete()
    assert v.state == "deleted" and base.alloc.users == 1
    shims.delete_tensor_object(base)


# -- the seeds' failing paths (§1.1), with our kernels ----------------------------------------

PARENT = (12, 16)
LAST_DIM_HALF = ([12, 8], [16, 1], 8)       # non-packed
FIRST_DIM_HALF = ([6, 16], [16, 1], 96)     # packed, at an offset


def _ref_view(ref: np.ndarray, sizes, strides, offset) -> np.ndarray:
    flat = ref.reshape(-1)[offset:]
    return np.lib.stride_tricks.as_strided(flat, shape=sizes,
                                           strides=[s * ref.itemsize for s in strides])


def test_seed_views_read_in_the_same_command_buffer_as_the_parent_write(dev, stream, owner):
    """A kernel writes the whole parent; then, with no wait, kernels read the last-dim half
    and the first-dim half into other buffers: both see the parent's new data."""
    parent = shims.empty_strided(list(PARENT), None, "float32", dev)
    upload(parent, np.zeros(PARENT, np.float32))
    last = shims.reinterpret_tensor(parent, *LAST_DIM_HALF)
    first = shims.reinterpret_tensor(parent, *FIRST_DIM_HALF)
    assert not last.packed and first.packed
    assert last.alloc is parent.alloc is first.alloc
    out_last = shims.empty_strided([12, 8], None, "float32", dev)
    out_first = shims.empty_strided([6, 16], None, "float32", dev)
    waits = stream.completed_waits

    kernel_fn(dev, iota_kernel(PARENT, [16, 1]))(stream, parent)
    kernel_fn(dev, copy_kernel([12, 8], [8, 1], [16, 1]))(stream, last, out_last)
    kernel_fn(dev, copy_kernel([6, 16], [16, 1], [16, 1]))(stream, first, out_first)
    assert stream.completed_waits == waits        # one command buffer, no wait inside

    ref = iota(PARENT)
    np.testing.assert_array_equal(out_last.numpy(), ref[:, 8:])
    np.testing.assert_array_equal(out_first.numpy(), ref[6:])
    for h in (last, first, parent, out_last, out_first):
        shims.delete_tensor_object(h)


def test_seed_views_written_then_the_parent_read_in_one_command_buffer(dev, stream, owner):
    """Reverse direction: kernels write through each view (the non-packed one included),
    then a kernel reads the parent: every write reached the parent."""
    parent = shims.empty_strided(list(PARENT), None, "float32", dev)
    last = shims.reinterpret_tensor(parent, *LAST_DIM_HALF)
    first = shims.reinterpret_tensor(parent, *FIRST_DIM_HALF)
    out = shims.empty_strided(list(PARENT), None, "float32", dev)
    waits = stream.completed_waits

    kernel_fn(dev, iota_kernel(PARENT, [16, 1], base=1000.0))(stream, parent)
    kernel_fn(dev, iota_kernel([12, 8], [16, 1], base=1.0))(stream, last)
    kernel_fn(dev, iota_kernel([6, 16], [16, 1], base=500.0))(stream, first)
    kernel_fn(dev, copy_kernel(PARENT, [16, 1], [16, 1]))(stream, parent, out)
    assert stream.completed_waits == waits

    ref = iota(PARENT, base=1000.0)
    ref[:, 8:] = iota([12, 8], base=1.0)
    ref[6:] = iota([6, 16], base=500.0)
    np.testing.assert_array_equal(out.numpy(), ref)
    np.testing.assert_array_equal(parent.numpy(), ref)
    for h in (last, first, parent, out):
        shims.delete_tensor_object(h)


def test_seed_views_through_copy_in_one_command_buffer(dev, stream, owner):
    """The same two views through the stream's own copy (a library-style op): right data."""
    parent = shims.empty_strided(list(PARENT), None, "float32", dev)
    last = shims.reinterpret_tensor(parent, *LAST_DIM_HALF)
    first = shims.reinterpret_tensor(parent, *FIRST_DIM_HALF)
    out_last = shims.empty_strided([12, 8], None, "float32", dev)
    out_first = shims.empty_strided([6, 16], None, "float32", dev)
    kernel_fn(dev, iota_kernel(PARENT, [16, 1]))(stream, parent)
    shims.copy_(out_last, last)
    shims.copy_(out_first, first)
    ref = iota(PARENT)
    np.testing.assert_array_equal(out_last.numpy(), ref[:, 8:])
    np.testing.assert_array_equal(out_first.numpy(), ref[6:])
    for h in (last, first, parent, out_last, out_first):
        shims.delete_tensor_object(h)


def test_nested_view_is_flattened_into_one_offset(dev, stream, owner):
    """§1.2 #3: a view of a view lands in the parent at the combined (larger) offset."""
    parent = shims.empty_strided(list(PARENT), None, "float32", dev)
    first = shims.reinterpret_tensor(parent, *FIRST_DIM_HALF)
    nested = shims.reinterpret_tensor(first, [3, 16], [16, 1], 16)
    assert nested.alloc is parent.alloc and nested.storage_offset == 112
    out = shims.empty_strided([3, 16], None, "float32", dev)
    kernel_fn(dev, iota_kernel(PARENT, [16, 1]))(stream, parent)
    kernel_fn(dev, copy_kernel([3, 16], [16, 1], [16, 1]))(stream, nested, out)
    np.testing.assert_array_equal(out.numpy(), iota(PARENT)[7:10])
    for h in (nested, first, parent, out):
        shims.delete_tensor_object(h)


def test_cat_filled_through_last_dim_views(dev, stream, owner):
    """§1.1: a cat result allocated once and filled through (non-packed) views of it; the
    last-dim cat the anchor had to skip."""
    a, b = rand([12, 8], seed=10), rand([12, 8], seed=11)
    ha = shims.empty_strided([12, 8], None, "float32", dev)
    hb = shims.empty_strided([12, 8], None, "float32", dev)
    upload(ha, a)
    upload(hb, b)
    cat = shims.empty_strided([12, 16], None, "float32", dev)
    left = shims.reinterpret_tensor(cat, [12, 8], [16, 1], 0)
    right = shims.reinterpret_tensor(cat, [12, 8], [16, 1], 8)
    scale = affine_kernel([12, 8], [8, 1], [16, 1], 2.0, 0.5)
    kernel_fn(dev, scale)(stream, ha, left)
    kernel_fn(dev, scale)(stream, hb, right)
    out = shims.empty_strided([12, 16], None, "float32", dev)
    kernel_fn(dev, affine_kernel([12, 16], [16, 1], [16, 1], 1.0, 1.0))(stream, cat, out)
    ref = np.concatenate([a * 2.0 + 0.5, b * 2.0 + 0.5], axis=1) + 1.0
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6)
    for h in (ha, hb, left, right, cat, out):
        shims.delete_tensor_object(h)


def test_host_array_is_a_zero_copy_view_with_the_handle_strides() -> None:
    from aotrt import dtypes
    from aotrt.runtime.device import get_device
    from aotrt.runtime.tensor import host_array

    dev = get_device("cpu")
    base = shims.empty_strided([64], [1], dtypes.float32, dev)
    try:
        view = shims.reinterpret_tensor(base, [3, 4], [1, 5], 2)     # transposed, offset 2
        a = host_array(view)
        assert a.shape == (3, 4) and a.strides == (4, 20)
        a[...] = np.arange(12, dtype=np.float32).reshape(3, 4)
        flat = host_array(base)
        assert flat[2 + 1 * 1 + 2 * 5] == a[1, 2] == 6.0          # written in place
        empty = shims.reinterpret_tensor(base, [0, 4], [4, 1], 0)
        assert host_array(empty).shape == (0, 4)
        shims.delete_tensor_object(empty)
        shims.delete_tensor_object(view)
    finally:
        shims.delete_tensor_object(base)


def test_merge_dims() -> None:
    from aotrt.runtime.tensor import merge_dims

    sizes, (a, b) = merge_dims((2, 1, 3, 4), (12, 99, 4, 1), (1, 99, 9, 2))
    assert sizes == [2, 3, 4] and a == [12, 4, 1] and b == [1, 9, 2]
    sizes, (a,) = merge_dims((2, 3, 4), (12, 4, 1))
    assert sizes == [24] and a == [1]


# -- strided_meet / views_meet ----------------------------------------------------------------


def _elements(offset: int, sizes: tuple[int, ...], strides: tuple[int, ...]) -> set[int]:
    return {offset + sum(i * s for i, s in zip(idx, strides)) for idx in np.ndindex(*sizes)}


@settings(max_examples=400, deadline=None)
@given(hst.lists(hst.tuples(hst.integers(1, 4), hst.integers(1, 4), hst.integers(0, 40)),
                 min_size=1, max_size=4), hst.integers(-200, 200))
def test_strided_meet_agrees_with_enumerating_the_elements(dims, offset) -> None:
    sizes_a = tuple(d[0] for d in dims)
    sizes_b = tuple(d[1] for d in dims)
    strides = tuple(d[2] for d in dims)
    want = bool(_elements(0, sizes_a, strides) & _elements(offset, sizes_b, strides))
    assert strided_meet(offset, sizes_a, sizes_b, strides) == want


def test_channel_slices_of_one_nhwc_buffer_do_not_meet(dev, stream, owner) -> None:
    """YOLOv8n's C2f: channels 0:32 and 32:64 of one (1, 64, 8, 8) NHWC buffer interleave
    in memory (their byte ranges intersect) but share no element; 16:48 meets both."""
    whole = shims.empty_strided([1, 8, 8, 64], None, "float32", dev)
    other = shims.empty_strided([1, 8, 8, 64], None, "float32", dev)
    st = [4096, 1, 512, 64]
    a, b, mid = (shims.reinterpret_tensor(whole, [1, 32, 8, 8], st, lo) for lo in (0, 32, 16))
    assert a.byte_range()[1] > b.byte_range()[0]              # the ranges do intersect
    assert not views_meet(a, b) and not views_meet(b, a)
    assert views_meet(a, mid) and views_meet(mid, b)
    # other strides: the byte ranges decide (conservative)
    wide = shims.reinterpret_tensor(whole, [1, 32, 8, 8], [4096, 2, 512, 64], 1)
    assert views_meet(a, wide)
    elsewhere = shims.reinterpret_tensor(other, [1, 32, 8, 8], st, 0)
    assert not views_meet(a, elsewhere)
    for h in (a, b, mid, wide, elsewhere, whole, other):
        shims.delete_tensor_object(h)
