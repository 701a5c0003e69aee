"""aotrt/runtime/shims.py: the AOTI-style handle API.

Unit tests for reference/behaviors.md §3 and §4 in our terms ("§3 #N", "§4 name"), one
pytest.raises per refused bad input of §7.3 (each also checks that nothing was published),
and property tests of random view chains against numpy's as_strided.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aotrt import dtypes
from aotrt.errors import InvalidArgument, OutOfMemory
from aotrt.runtime import shims
from aotrt.runtime.device import get_device
from aotrt.runtime.memory import Owner, owner_scope
from aotrt.runtime.tensor import INT64_MAX, Handle
from tests.conftest import make_stream
from tests.support import copy_kernel, iota, iota_kernel, kernel_fn, rand, upload

# -- helpers ----------------------------------------------------------------------------------


def delete(*handles: Handle) -> None:
    """Delete handles in order."""
    for h in handles:
        shims.delete_tensor_object(h)


def snapshot(dev) -> tuple:
    """What a refused call must leave unchanged: handles, live allocations and their users."""
    from aotrt.runtime.memory import current_owner

    live = dev.memory.live()
    return (set(current_owner().handles), [(a, a.users) for a in live])


FAKE = 1 << 44      # an address no test memory has: regions there are bound, never touched


# -- empty_strided ----------------------------------------------------------------------------


def test_empty_strided_allocates_a_row_major_tensor(dev, stream, owner):
    h = shims.empty_strided([3, 4], None, "float32", dev)
    assert (h.sizes, h.strides, h.dtype, h.device, h.byte_offset) == (
        (3, 4), (4, 1), dtypes.float32, dev, 0)
    assert h.alloc.nbytes == 48 and h.alloc.users == 1 and h in owner.handles
    assert h.alloc.owner is owner and h.alloc.stream is stream
    delete(h)
    assert h.alloc.freed


def test_empty_strided_accepts_any_dense_permutation(dev, stream, owner):
    """§3 #43: column-major (a dense permutation) is accepted."""
    h = shims.empty_strided([3, 4, 5], [1, 15, 3], "float32", dev)
    assert h.strides == (1, 15, 3) and h.alloc.nbytes == 240 and h.packed
    delete(h)


def test_empty_strided_zero_dim_tensor(dev, stream, owner):
    h = shims.empty_strided([], [], "int64", dev)
    assert h.numel == 1 and h.ndim == 0 and h.alloc.nbytes == 8
    upload(h, np.array(-5, np.int64))
    assert h.numpy() == -5
    delete(h)


def test_empty_strided_zero_element_tensor_takes_any_strides(dev, stream, owner):
    """§3 #44 / §7.3: zero-element tensors accept any strides (no dense one exists)."""
    h = shims.empty_strided([2, 0, 3], [0, 77, 5], "float32", dev)
    assert h.numel == 0 and h.alloc.nbytes == 0 and h.numpy().shape == (2, 0, 3)
    delete(h)


@pytest.mark.parametrize("dtype", [dtypes.bfloat16, "bfloat16", np.float16, "torch.int8",
                                   "aotrt.bool", np.dtype("uint8"), "half", "long"])
def test_empty_strided_accepts_dtype_objects_and_names(dev, stream, owner, dtype):
    h = shims.empty_strided([2], None, dtype, dev)
    assert h.dtype is dtypes.as_dtype(dtype)
    delete(h)


@pytest.mark.parametrize("device", ["cpu", "cpu:0"])
def test_empty_strided_accepts_device_names(stream, owner, device):
    h = shims.empty_strided([2], None, "float32", device=device)
    assert h.device is get_device("cpu")
    delete(h)


def test_empty_strided_uses_the_current_stream_and_owner(dev, stream, owner):
    s2 = make_stream(dev, "async")
    o2 = Owner("o2")
    with dev.stream_guard(s2), owner_scope(o2):
        h = shims.empty_strided([2], None, "float32", dev)
    assert h.alloc.stream is s2 and h.owner is o2 and h.alloc.owner is o2
    delete(h)
    o2.close()
    s2.close()


def test_size_one_dims_may_have_any_stride(dev, stream, owner):
    """§3 #74: a size-1 dim's stride may exceed int32 (given strides)."""
    h = shims.empty_strided([1, 5], [1 << 40, 1], "float32", dev)
    assert h.strides == (1 << 40, 1) and h.alloc.nbytes == 20
    delete(h)


# -- one pytest.raises per refused bad input (§7.3) --------------------------------------------

BAD_EMPTY_STRIDED: list[tuple[str, dict, str]] = [
    ("null sizes", {"sizes": None}, "^sizes: "),
    ("sizes not a sequence", {"sizes": 4}, "^sizes: "),
    ("sizes a string", {"sizes": "44"}, "^sizes: "),
    ("negative size", {"sizes": [2, -1]}, r"^sizes\[1\]: "),
    ("float size", {"sizes": [2.0]}, r"^sizes\[0\]: "),
    ("bool size", {"sizes": [True]}, r"^sizes\[0\]: "),
    ("2**62 bytes", {"sizes": [1 << 60, 1], "strides": None},
     r"^sizes: .* 2\*\*62 bytes or more"),
    ("2**62 bytes over dims", {"sizes": [1 << 31, 1 << 31], "strides": None, "dtype": "uint8"},
     r"^sizes: .* 2\*\*62 bytes"),
    ("size over int64", {"sizes": [1 << 63, 1], "strides": None}, r"^sizes\[0\]: .*int64"),
    ("more than 64 dims", {"sizes": [1] * 65, "strides": None}, "^sizes: 65 dims; at most 64"),
    ("65 strides", {"sizes": [1] * 64, "strides": [1] * 65}, "^strides: 65 dims; at most 64"),
    ("numpy bool size", {"sizes": [np.bool_(True)]}, r"^sizes\[0\]: "),
    ("numpy float size", {"sizes": [np.float64(2)]}, r"^sizes\[0\]: "),
    ("NaN size", {"sizes": [float("nan")]}, r"^sizes\[0\]: "),
    ("2-d numpy sizes", {"sizes": np.ones((2, 2), dtype=np.int64)}, "^sizes: "),
    ("strides of another rank", {"strides": [1]}, "^strides: "),
    ("strides not a sequence", {"strides": 1}, "^strides: "),
    ("float stride", {"strides": [4.0, 1]}, r"^strides\[0\]: "),
    ("zero stride", {"strides": [0, 1]}, r"^strides\[0\]: .*zero"),
    ("negative stride", {"strides": [4, -1]}, r"^strides\[1\]: .*negative"),
    ("stride 2**31 leaves holes", {"sizes": [2, 2], "strides": [1 << 31, 1]},
     "^strides: .*holes"),
    ("stride over int64", {"sizes": [1, 2], "strides": [1 << 64, 1]}, r"^strides\[0\]: .*int64"),
    ("holes", {"strides": [5, 1]}, "^strides: .*holes"),
    ("overlap", {"strides": [2, 1]}, "^strides: .*overlap"),
    ("unsupported dtype name", {"dtype": "complex64"}, "^dtype: "),
    ("unsupported numpy dtype", {"dtype": np.complex64}, "^dtype: "),
    ("null dtype", {"dtype": None}, "^dtype: "),
    ("dtype not a dtype", {"dtype": 6}, "^dtype: "),
    ("dtype a list", {"dtype": ["float32"]}, "^dtype: "),
    ("dtype a dict", {"dtype": {"x": 1}}, "^dtype: "),
    ("dtype a structured spec", {"dtype": [("a", "f4", -1)]}, "^dtype: "),
    ("unknown device type", {"device": "tpu"}, "^device: "),
    ("device index other than 0", {"device": "cpu:1"}, "^device: index"),
    ("null device", {"device": None}, "^device: "),
    ("device not a name", {"device": 0}, "^device: "),
]


@pytest.mark.parametrize("case,kwargs,match", BAD_EMPTY_STRIDED,
                         ids=[c[0] for c in BAD_EMPTY_STRIDED])
def test_empty_strided_refuses(dev, stream, owner, case, kwargs, match):
    args = {"sizes": [3, 4], "strides": [4, 1], "dtype": "float32", "device": dev.name}
    args.update(kwargs)
    before = snapshot(dev)
    with pytest.raises(InvalidArgument, match=match):
        shims.empty_strided(**args)
    assert snapshot(dev) == before


BAD_BLOB: list[tuple[str, dict, str]] = [
    ("null data with elements", {"data_ptr": 0}, "^data_ptr: null"),
    ("None data with elements", {"data_ptr": None}, "^data_ptr: null"),
    ("negative address", {"data_ptr": -64}, "^data_ptr: "),
    ("address over int64", {"data_ptr": 1 << 63}, "^data_ptr: "),
    ("float address", {"data_ptr": 4096.0}, "^data_ptr: "),
    ("negative storage offset", {"storage_offset": -1}, "^storage_offset: "),
    ("float storage offset", {"storage_offset": 1.0}, "^storage_offset: "),
    ("offset wraps 64 bits", {"storage_offset": 1 << 62}, "^storage_offset: "),
    ("offset INT64_MAX", {"storage_offset": INT64_MAX}, "^storage_offset: "),
    ("end past int64", {"data_ptr": INT64_MAX - 8}, "^storage_offset: "),
    ("null sizes", {"sizes": None}, "^sizes: "),
    ("negative size", {"sizes": [-3]}, r"^sizes\[0\]: "),
    ("2**62 bytes", {"sizes": [1 << 60]}, r"^sizes: .* 2\*\*62 bytes or more"),
    ("more than 64 dims", {"sizes": [1] * 65}, "^sizes: 65 dims; at most 64"),
    ("bool address", {"data_ptr": True}, "^data_ptr: "),
    ("numpy float offset", {"storage_offset": np.float32(1)}, "^storage_offset: "),
    ("dtype a list", {"dtype": ["float32"]}, "^dtype: "),
    ("holes", {"sizes": [2, 2], "strides": [4, 1]}, "^strides: "),
    ("zero stride", {"sizes": [2, 2], "strides": [0, 1]}, r"^strides\[0\]: "),
    ("unsupported dtype", {"dtype": "float64"}, "^dtype: "),
    ("unknown device", {"device": "mps"}, "^device: "),
    ("device index", {"device": "cpu:3"}, "^device: "),
]


@pytest.mark.parametrize("case,kwargs,match", BAD_BLOB, ids=[c[0] for c in BAD_BLOB])
def test_create_tensor_from_blob_refuses(cpu, stream, owner, case, kwargs, match):
    host = rand([16], seed=2)
    args = {"data_ptr": host.ctypes.data, "sizes": [4, 4], "strides": None,
            "storage_offset": 0, "dtype": "float32", "device": "cpu"}
    args.update(kwargs)
    before = snapshot(cpu)
    with pytest.raises(InvalidArgument, match=match):
        shims.create_tensor_from_blob(**args)
    assert snapshot(cpu) == before


OUTSIDE = r"^sizes/strides/storage_offset: view bytes .* lie outside"
EMPTY_OUTSIDE = r"^storage_offset: empty view at byte .* is outside"


def _view(h: Handle, sizes, strides, offset, dtype=None) -> Handle:
    return shims.reinterpret_tensor(h, sizes, strides, offset, dtype=dtype)


BAD_VIEWS: list[tuple[str, Callable[[Handle], Any], str]] = [
    ("null handle", lambda h: _view(None, [2], [1], 0), "^handle: "),
    ("not a handle", lambda h: _view(h.alloc, [2], [1], 0), "^handle: "),
    ("null sizes", lambda h: _view(h, None, [1], 0), "^sizes: "),
    ("null strides", lambda h: _view(h, [2], None, 0), "^strides: must not be null"),
    ("negative size", lambda h: _view(h, [-2], [1], 0), r"^sizes\[0\]: negative"),
    ("negative stride", lambda h: _view(h, [2], [-1], 4), r"^strides\[0\]: negative"),
    ("size over int64", lambda h: _view(h, [1 << 63], [0], 0), r"^sizes\[0\]: .*int64"),
    ("stride 2**31 past the end", lambda h: _view(h, [2], [1 << 31], 0), OUTSIDE),
    ("more than 64 dims", lambda h: _view(h, [1] * 65, [1] * 65, 0), "^sizes: 65 dims"),
    ("65 strides", lambda h: _view(h, [1] * 64, [1] * 65, 0), "^strides: 65 dims"),
    ("dtype a list", lambda h: _view(h, [2], [1], 0, dtype=["int8"]), "^dtype: "),
    ("rank mismatch", lambda h: _view(h, [2, 2], [1], 0), "^strides: 1 strides for 2 sizes"),
    ("float offset", lambda h: _view(h, [2], [1], 0.5), "^storage_offset: expected an integer"),
    ("past the end", lambda h: _view(h, [5], [1], 60), OUTSIDE),
    ("one element past the end", lambda h: _view(h, [1], [1], 64), OUTSIDE),
    ("one element before the start", lambda h: _view(h, [1], [1], -1), OUTSIDE),
    ("strides past int32, overlapping", lambda h: _view(h, [(1 << 31) - 1, 2],
                                                       [(1 << 31) - 1] * 2, 0),
     "^sizes: .* overflows 64 bits"),
    # The last element of a float16 view at byte 2**63 - 4: its end fits int64, so the view is
    # only outside its memory; one element further, the end overflows.
    ("end just inside int64", lambda h: _view(_view(h, [128], [1], 0, "float16"),
                                              [(1 << 31) - 1, 5], [(1 << 31) - 1, 1610612735], 0),
     OUTSIDE),
    ("end just past int64", lambda h: _view(_view(h, [128], [1], 0, "float16"),
                                            [(1 << 31) - 1, 4], [(1 << 31) - 1] * 2, 0),
     "^sizes: .* overflows 64 bits"),
    ("broadcast of more than 2**63 bytes", lambda h: _view(h, [(1 << 31) - 1] * 2, [0, 0], 0),
     "^sizes: .* overflows 64 bits"),
    ("stride past int64", lambda h: _view(h, [1, 2], [1 << 63, 1], 0), r"^strides\[0\]: .*int64"),
    ("stride below int64", lambda h: _view(h, [1, 2], [-(1 << 63) - 1, 1], 0),
     r"^strides\[0\]: .*int64"),
    ("below the start", lambda h: _view(h, [2], [1], -1), OUTSIDE),
    ("strided past the end", lambda h: _view(h, [2, 5], [60, 1], 0), OUTSIDE),
    ("empty view past the end", lambda h: _view(h, [0], [1], 65), EMPTY_OUTSIDE),
    ("empty view below the start", lambda h: _view(h, [0], [1], -1), EMPTY_OUTSIDE),
    ("offset INT64_MAX", lambda h: _view(h, [1], [1], INT64_MAX), "^storage_offset: .*64 bits"),
    ("offset that wraps to the start", lambda h: _view(h, [1], [1], 1 << 62),
     "^storage_offset: .*64 bits"),
    ("offset that wraps, in bytes", lambda h: _view(_view(h, [8], [1], 0, "uint8"), [1], [1],
                                                    INT64_MAX), OUTSIDE),
    ("extent overflows 64 bits",
     lambda h: _view(h, [(1 << 31) - 1] * 5, [(1 << 31) - 1] * 5, 0),
     "^sizes: .* overflows 64 bits"),
    ("unsupported dtype", lambda h: _view(h, [2], [1], 0, dtype="float64"), "^dtype: "),
    ("misaligned dtype view", lambda h: _view(_view(h, [8], [1], 1, "uint8"), [1], [1], 0,
                                              "float32"), "^dtype: .*misaligned"),
]


@pytest.mark.parametrize("case,call,match", BAD_VIEWS, ids=[c[0] for c in BAD_VIEWS])
def test_reinterpret_tensor_refuses(dev, stream, owner, case, call, match):
    """§3 #46/#48/#53/#64: views outside their memory and impossible layouts are refused."""
    base = shims.empty_strided([64], None, "float32", dev)
    before = snapshot(dev)
    with pytest.raises(InvalidArgument, match=match):
        call(base)
    extra = [h for h in owner.handles if h is not base]
    delete(*extra)      # the misaligned case makes a valid uint8 view before the bad one
    assert snapshot(dev)[1] == before[1]
    delete(base)


def _dead_handle(dev) -> Handle:
    h = shims.empty_strided([2], None, "bool", dev)
    delete(h)
    return h


BAD_HANDLE_CALLS: list[tuple[str, Callable[[Handle, Handle], Any], str]] = [
    ("new_tensor_handle None", lambda ok, dead: shims.new_tensor_handle(None), "^handle: "),
    ("new_tensor_handle deleted", lambda ok, dead: shims.new_tensor_handle(dead), "^handle: "),
    ("new_tensor_handle not a handle", lambda ok, dead: shims.new_tensor_handle(3), "^handle: "),
    ("delete None", lambda ok, dead: shims.delete_tensor_object(None),
     "^handle: must not be null"),
    ("delete twice", lambda ok, dead: shims.delete_tensor_object(dead),
     "^handle: unknown or already deleted"),
    ("delete not a handle", lambda ok, dead: shims.delete_tensor_object("h"),
     "^handle: expected a tensor handle, got str$"),
    ("delete unpublished", lambda ok, dead: shims.delete_tensor_object(
        Handle(ok.alloc, 0, (1,), (1,), ok.dtype, ok.device, ok.owner)),
     "^handle: unknown or already deleted"),
    ("reinterpret deleted", lambda ok, dead: shims.reinterpret_tensor(dead, [1], [1], 0),
     "^handle: "),
    ("copy_ null dst", lambda ok, dead: shims.copy_(None, ok), "^dst: "),
    ("copy_ null src", lambda ok, dead: shims.copy_(ok, None), "^src: "),
    ("copy_ deleted dst", lambda ok, dead: shims.copy_(dead, ok), "^dst: "),
    ("copy_ deleted src", lambda ok, dead: shims.copy_(ok, dead), "^src: "),
    ("item_bool None", lambda ok, dead: shims.item_bool(None), "^handle: "),
    ("item_bool deleted", lambda ok, dead: shims.item_bool(dead), "^handle: "),
    ("item_bool non-bool", lambda ok, dead: shims.item_bool(
        shims.reinterpret_tensor(ok, [1], [1], 0, dtype="uint8")),
     "^handle: item_bool needs a bool"),
    ("item_bool two elements", lambda ok, dead: shims.item_bool(ok),
     "^handle: item_bool needs one element"),
]


@pytest.mark.parametrize("case,call,match", BAD_HANDLE_CALLS,
                         ids=[c[0] for c in BAD_HANDLE_CALLS])
def test_handle_shims_refuse(dev, stream, owner, case, call, match):
    ok = shims.empty_strided([2], None, "bool", dev)
    dead = _dead_handle(dev)
    before = snapshot(dev)
    with pytest.raises(InvalidArgument, match=match):
        call(ok, dead)
    delete(*[h for h in owner.handles if h is not ok])
    assert snapshot(dev)[1] == before[1]
    delete(ok)


GETTERS = [shims.get_sizes, shims.get_strides, shims.get_storage_offset, shims.get_dtype,
           shims.get_device, shims.get_device_index, shims.get_numel, shims.get_dim,
           shims.get_data_ptr, shims.get_storage_size]


@pytest.mark.parametrize("getter", GETTERS, ids=[g.__name__ for g in GETTERS])
def test_getters_refuse_dead_handles(dev, stream, owner, getter):
    dead = _dead_handle(dev)
    with pytest.raises(InvalidArgument, match="^handle: handle is deleted"):
        getter(dead)
    with pytest.raises(InvalidArgument, match="^handle: expected a tensor handle"):
        getter(None)


# -- create_tensor_from_blob ------------------------------------------------------------------


def test_blob_over_unknown_memory_is_a_zero_copy_region(cpu, stream, owner):
    host = rand([4, 4], seed=4)
    h = shims.create_tensor_from_blob(host.ctypes.data, [4, 4], None, 0, "float32")
    assert h.alloc.kind == "region" and h.alloc.ptr == host.ctypes.data
    assert h.alloc.nbytes == 64 and h.byte_offset == 0
    np.testing.assert_array_equal(h.numpy(), host)
    host[1, 2] = 42.0
    assert h.numpy()[1, 2] == 42.0
    delete(h)


def test_blob_storage_offset_advances_the_pointer(cpu, stream, owner):
    """§6: storage offset recorded, pointer advanced by offset * itemsize."""
    host = rand([16], seed=5)
    h = shims.create_tensor_from_blob(host.ctypes.data, [4], None, 6, "float32")
    assert h.address == host.ctypes.data + 24 == shims.get_data_ptr(h)
    np.testing.assert_array_equal(h.numpy(), host[6:10])
    delete(h)


def test_blob_inside_an_allocation_joins_it(dev, stream, owner):
    """§3 #30/#32: a blob at an offset into an allocation is (that allocation, offset); kernel
    writes through it land in the allocation; its views join it too."""
    base = shims.empty_strided([8, 8], None, "float32", dev)
    blob = shims.create_tensor_from_blob(base.alloc.ptr + 64, [2, 8], None, 0, "float32",
                                         device=dev.name)
    assert blob.alloc is base.alloc and blob.byte_offset == 64 and base.alloc.users == 2
    v = shims.reinterpret_tensor(blob, [8], [1], 4)
    assert v.alloc is base.alloc and v.byte_offset == 80
    upload(base, np.zeros((8, 8), np.float32))
    kernel_fn(dev, iota_kernel([2, 8], [8, 1]))(stream, blob)
    ref = np.zeros((8, 8), np.float32)
    ref[2:4] = iota([2, 8])
    np.testing.assert_array_equal(base.numpy(), ref)
    delete(v, blob, base)


def test_blob_keeps_the_allocation_it_lies_in_alive(dev, stream, owner):
    """§3 #40."""
    base = shims.empty_strided([8], None, "float32", dev)
    upload(base, iota([8]))
    blob = shims.create_tensor_from_blob(base.alloc.ptr + 16, [4], None, 0, "float32",
                                         device=dev.name)
    delete(base)
    assert not blob.alloc.freed and blob.alloc.users == 1
    np.testing.assert_array_equal(blob.numpy(), iota([8])[4:])
    alloc = blob.alloc
    delete(blob)
    assert alloc.freed


def test_blob_inside_a_region_joins_it(cpu, stream, owner):
    """§3 #31."""
    host = rand([32], seed=6)
    base = shims.create_tensor_from_blob(host.ctypes.data, [32], None, 0, "float32")
    blob = shims.create_tensor_from_blob(host.ctypes.data, [8], None, 4, "float32")
    assert blob.alloc is base.alloc and blob.byte_offset == 16
    np.testing.assert_array_equal(blob.numpy(), host[4:12])
    delete(base, blob)


def test_blob_at_an_address_already_tracked_joins_it(cpu, stream, owner):
    """§3 #1 (PR semantics): a second blob at an address a live blob tracks shares its region;
    §3 #34/#35/#42: each delete gives back only its own count; the address stays tracked
    while any handle remains and is forgotten with the last."""
    host = rand([8], seed=7)
    a = shims.create_tensor_from_blob(host.ctypes.data, [8], None, 0, "float32")
    b = shims.create_tensor_from_blob(host.ctypes.data, [8], None, 0, "float32")
    v = shims.reinterpret_tensor(a, [8], [1], 0)
    region = a.alloc
    assert b.alloc is region and region.users == 3
    delete(v)
    assert region.users == 2 and cpu.memory.find(host.ctypes.data) is region
    delete(a)
    assert region.users == 1 and cpu.memory.find(host.ctypes.data) is region
    delete(b)
    assert region.freed and cpu.memory.find(host.ctypes.data) is None


def test_blob_address_can_be_wrapped_again_after_its_owner_closed(cpu, stream, owner):
    """§3 #2: after cleanup the same address can be wrapped again."""
    host = rand([8], seed=8)
    o = Owner("model")
    with owner_scope(o):
        shims.create_tensor_from_blob(host.ctypes.data, [8], None, 0, "float32")
    o.close()
    assert cpu.memory.find(host.ctypes.data) is None
    again = shims.create_tensor_from_blob(host.ctypes.data, [8], None, 0, "float32")
    assert again.alloc.owner is owner
    delete(again)


def test_blob_running_past_its_allocation_is_refused(dev, stream, owner):
    """§3 #36/#69: a blob starting inside an allocation but running past its end."""
    base = shims.empty_strided([8], None, "float32", dev)
    before = snapshot(dev)
    with pytest.raises(InvalidArgument, match="runs past the end"):
        shims.create_tensor_from_blob(base.alloc.ptr + 8, [7], None, 0, "float32",
                                      device=dev.name)
    with pytest.raises(InvalidArgument, match="runs past the end"):
        shims.create_tensor_from_blob(base.alloc.ptr, [2, 4], [1, 2], 1, "float32",
                                      device=dev.name)
    assert snapshot(dev) == before
    delete(base)


def test_empty_blob_at_an_allocations_end_joins_it(dev, stream, owner):
    """§3 #78: an empty view at an allocation's end registers nothing past it."""
    base = shims.empty_strided([8], None, "float32", dev)
    live = dev.memory.live()
    e = shims.create_tensor_from_blob(base.alloc.end, [0], None, 0, "float32", device=dev.name)
    assert e.alloc is base.alloc and e.byte_offset == 32 and e.address == base.alloc.end
    assert dev.memory.live() == live
    delete(e, base)


def test_empty_blob_inside_an_allocation_joins_it(dev, stream, owner):
    """§3 #75: an empty blob inside an allocation joins it; later views share it."""
    base = shims.empty_strided([8], None, "float32", dev)
    e = shims.create_tensor_from_blob(base.alloc.ptr + 8, [0, 3], None, 0, "float32",
                                      device=dev.name)
    assert e.alloc is base.alloc
    v = shims.reinterpret_tensor(e, [2], [1], 0)
    assert v.alloc is base.alloc and v.byte_offset == 8
    delete(v, e, base)


def test_empty_blob_over_unknown_memory_is_an_empty_region(cpu, stream, owner):
    e = shims.create_tensor_from_blob(FAKE, [0], None, 0, "float32")
    assert e.alloc.kind == "region" and e.alloc.nbytes == 0
    e2 = shims.create_tensor_from_blob(FAKE, [0, 2], None, 0, "float32")
    assert e2.alloc is e.alloc
    with pytest.raises(InvalidArgument, match="runs past the end"):
        shims.create_tensor_from_blob(FAKE, [1], None, 0, "float32")
    delete(e, e2)
    assert cpu.memory.find(FAKE) is None


def test_null_data_without_elements_is_a_tensor_without_memory(dev, stream, owner):
    """§3 #72: null-data tensors with zero elements, their views and copies work."""
    h = shims.create_tensor_from_blob(0, [3, 0], None, 0, "float32", device=dev.name)
    assert h.alloc is None and shims.get_data_ptr(h) == 0 and shims.get_storage_size(h) == 0
    v = shims.reinterpret_tensor(h, [0], [1], 0)
    c = shims.new_tensor_handle(h)
    other = shims.empty_strided([3, 0], None, "float32", dev)
    shims.copy_(other, h)
    shims.copy_(h, other)
    with pytest.raises(InvalidArgument, match="^handle: a tensor without memory only has empty"):
        shims.reinterpret_tensor(h, [0], [1], 2)
    delete(v, c, h, other)


def test_tensors_of_more_than_2_to_31_elements(cpu, stream, owner):
    """§3 #73 / §4: >= 2^31 elements and spans past 2^32 are fine when strides fit int32."""
    big = shims.create_tensor_from_blob(FAKE, [4, (1 << 31) - 1], None, 0, "uint8")
    assert big.numel == 4 * ((1 << 31) - 1) and big.alloc.nbytes == big.numel
    v = shims.reinterpret_tensor(big, [3, 1 << 20], [(1 << 31) - 1, 1024], 5)
    assert v.byte_range()[1] > 1 << 32
    delete(v, big)


# -- int64 sizes, strides and offsets; at most 64 dims (issue 7, items 9 and 10) --------------

GIB = 1 << 30


def test_sizes_and_strides_past_int32_are_int64(cpu, stream, owner):
    """AOTI's shims take int64: a dim of 2**31 or more and a stride of 2**31 or more (metadata
    over an 8 GiB region that nothing touches) are views like any other."""
    big = shims.create_tensor_from_blob(FAKE, [8 * GIB], None, 0, "uint8")
    assert big.alloc.nbytes == 8 * GIB and big.numel == 8 * GIB
    rows = shims.reinterpret_tensor(big, [2, 3 * GIB], [4 * GIB, 1], 5)
    assert rows.strides == (4 * GIB, 1) and rows.byte_range() == (5, 5 + 7 * GIB)
    f = shims.reinterpret_tensor(big, [GIB + 1], [1], 0, dtype="float32")
    assert f.byte_range() == (0, 4 * GIB + 4)
    dense = shims.create_tensor_from_blob(FAKE + 16 * GIB, [3, 1 << 31], [1, 3], 0, "int16")
    assert dense.strides == (1, 3) and dense.byte_range()[1] == 3 * 2 * (1 << 31)
    delete(f, rows, big, dense)


@pytest.mark.parametrize("dtype", ["uint8", "int16", "float32", "int64"])
def test_extents_stop_below_2_to_62_bytes(cpu, stream, owner, dtype):
    """Every byte count stays below 2**62: a blob one element short is bound; at the limit
    it is refused with the reason, and so is a dense tensor of that many bytes."""
    isz = dtypes.as_dtype(dtype).itemsize
    n = (1 << 62) // isz
    h = shims.create_tensor_from_blob(1 << 12, [n - 1], None, 0, dtype)
    assert h.alloc.nbytes == (n - 1) * isz
    delete(h)
    before = snapshot(cpu)
    for call in (lambda: shims.create_tensor_from_blob(1 << 12, [n], None, 0, dtype),
                 lambda: shims.empty_strided([n], None, dtype, "cpu"),
                 lambda: shims.empty_strided([2, n // 2], [n // 2, 1], dtype, "cpu")):
        with pytest.raises(InvalidArgument, match=r"^sizes: .* 2\*\*62 bytes or more"):
            call()
    assert snapshot(cpu) == before


def test_a_real_allocation_past_2_gib_reads_and_writes_past_2_to_31(cpu, stream, owner):
    """One 2.5 GiB cpu allocation (untouched pages are free): views, copies and fills at byte
    offsets past 2**31 and 2**32 land where they should."""
    n = 5 * GIB // 2
    h = shims.empty_strided([n], None, "uint8", cpu)
    assert h.alloc.nbytes == n
    far = shims.reinterpret_tensor(h, [16], [1], n - 16)
    mid = shims.reinterpret_tensor(h, [2], [1 << 31], 7, dtype="uint8")   # 2 bytes, 2 GiB apart
    small = shims.empty_strided([16], None, "uint8", cpu)
    cpu.write(small, np.arange(16, dtype=np.uint8) + 1)
    stream.copy(far, small)
    stream.fill(mid, 0xAB)
    stream.commit_and_wait()
    np.testing.assert_array_equal(far.numpy(), np.arange(16, dtype=np.uint8) + 1)
    assert mid.numpy().tolist() == [0xAB] * 2
    # The fill reached bytes 7 + k * 2**31, and nothing next to them.
    wide = shims.reinterpret_tensor(h, [2, 3], [1 << 31, 1], 6)
    assert wide.numpy().tolist() == [[0, 0xAB, 0]] * 2
    delete(wide, mid, far, small, h)


@pytest.mark.parametrize("ndim", [63, 64])
def test_64_dims_are_accepted_and_readable(dev, stream, owner, ndim):
    h = shims.empty_strided([1] * (ndim - 1) + [3], None, "float32", dev)
    v = shims.reinterpret_tensor(h, [1] * ndim, [1] * ndim, 2)
    assert v.numpy().shape == (1,) * ndim and h.numpy().shape == (1,) * (ndim - 1) + (3,)
    delete(v, h)


def test_more_than_64_dims_are_refused_by_the_handle_itself(dev, stream, owner):
    """The one constructor every view goes through (shims, delegates, copies) refuses them."""
    h = shims.empty_strided([4], None, "float32", dev)
    with pytest.raises(InvalidArgument, match="^sizes: 65 dims .* at most 64 dims"):
        Handle(h.alloc, 0, (1,) * 65, (1,) * 65, h.dtype, dev, h.owner)
    with pytest.raises(InvalidArgument, match="^sizes: 2 dims with 1 strides"):
        Handle(h.alloc, 0, (1, 1), (1,), h.dtype, dev, h.owner)
    delete(h)


def _uploaded(dev, array: np.ndarray) -> Handle:
    h = shims.empty_strided(array.shape, None, array.dtype, dev)
    upload(h, array)
    return h


@pytest.mark.parametrize("sizes,strides", [
    ([1 << 40], [0]),
    ([3, 1 << 40], [1, 0]),
    ([1 << 20, 2, 1 << 20], [0, 1, 0]),
    ([1 << 30] * 2, [0, 0]),
])
def test_numpy_of_a_huge_broadcast_copies_only_its_distinct_elements(dev, stream, owner, sizes,
                                                                      strides):
    """A stride-0 view of up to 2**60 elements reads as a read-only numpy broadcast of its
    distinct elements, with the right values, in no more memory than those."""
    base = _uploaded(dev, rand([8], seed=4))
    v = shims.reinterpret_tensor(base, sizes, strides, 1)
    got = v.numpy()
    assert got.shape == tuple(sizes) and not got.flags.writeable
    want = np.lib.stride_tricks.as_strided(rand([8], seed=4)[1:], sizes,
                                           [s * 4 for s in strides])
    idx = tuple(n - 1 for n in sizes)
    assert got[idx] == want[idx] and got[(0,) * len(sizes)] == want[(0,) * len(sizes)]
    assert got.base is not None and got.base.size <= 3       # distinct elements only
    delete(v, base)


def test_materialising_a_huge_broadcast_is_out_of_memory(dev, stream, owner):
    """Asking for a real copy of 2**43 bytes gives OutOfMemory naming the size, not numpy's
    MemoryError."""
    from aotrt.errors import OutOfMemory

    base = _uploaded(dev, rand([8], seed=4))
    v = shims.reinterpret_tensor(base, [1 << 40], [0], 0)
    with pytest.raises(OutOfMemory, match=f"^host copy of {8 << 40} bytes"):
        np.asarray(v, dtype=np.float64)
    with pytest.raises(OutOfMemory, match=f"^host copy of {4 << 40} bytes"):
        v.__array__(copy=True)
    small = shims.reinterpret_tensor(base, [4], [0], 0)
    np.testing.assert_array_equal(np.asarray(small, dtype=np.float64), [rand([8], seed=4)[0]] * 4)
    delete(small, v, base)


def test_a_blob_over_a_pooled_block_is_refused(cpu, stream, owner):
    """Freed memory the pool keeps is the runtime's: a blob over any byte of it would see the
    next allocation's data, so it is refused, whole or partly overlapping, empty or not."""
    h = shims.empty_strided([64], None, "float32", cpu)
    ptr = h.alloc.ptr
    delete(h)
    assert any(e.block.ptr == ptr for e in cpu.memory.pool.entries())
    before = snapshot(cpu)
    for start, sizes in ((ptr, [4]), (ptr + 100, [8]), (ptr - 8, [4]), (ptr + 16, [0]),
                         (ptr + 252, [1])):
        with pytest.raises(InvalidArgument, match="^data_ptr: .* freed memory .* pool keeps"):
            shims.create_tensor_from_blob(start, sizes, None, 0, "float32")
    with pytest.raises(InvalidArgument, match="^data_ptr: .* freed memory"):
        cpu.memory.bind_region(ptr + 4, 4)
    assert snapshot(cpu) == before
    # Once the pool let it go, the bytes are no longer the runtime's.
    again = shims.empty_strided([64], None, "float32", cpu)
    assert again.alloc.ptr == ptr
    delete(again)


def test_size_one_dim_stride_past_int32_in_a_blob(cpu, stream, owner):
    """§3 #74: logits of one long sequence: a size-1 dim may have a huge computed stride."""
    host = rand([1, 6], seed=9)
    h = shims.create_tensor_from_blob(host.ctypes.data, [1, 6], [1 << 33, 1], 0, "float32")
    np.testing.assert_array_equal(h.numpy(), host)
    delete(h)


# -- reinterpret_tensor -----------------------------------------------------------------------


def test_reinterpret_offset_composes_with_the_handles_own(dev, stream, owner):
    """A view of a view: storage offsets count from the allocation's start (Inductor)."""
    base = shims.empty_strided([64], None, "float32", dev)
    v1 = shims.reinterpret_tensor(base, [32], [1], 16)
    v2 = shims.reinterpret_tensor(v1, [8], [1], 8)
    assert (v1.storage_offset, v2.storage_offset) == (16, 24)
    assert shims.get_storage_offset(v2) == 24 and v2.alloc is base.alloc
    assert base.alloc.users == 3
    delete(v2, v1, base)


def test_reinterpret_negative_offset_back_to_the_start(dev, stream, owner):
    """§3 #47: a view of a view with a negative offset back to the start; counts balance."""
    base = shims.empty_strided([16], None, "float32", dev)
    upload(base, iota([16]))
    v = shims.reinterpret_tensor(base, [8], [1], 8)
    back = shims.reinterpret_tensor(v, [16], [1], -8)
    assert back.byte_offset == 0 and back.alloc is base.alloc and base.alloc.users == 3
    np.testing.assert_array_equal(back.numpy(), iota([16]))
    delete(base, v)
    assert back.alloc.users == 1
    delete(back)
    assert back.alloc.freed


def test_non_packed_view_stays_in_the_parent(dev, stream, owner):
    """§4 NonPackedViewStaysInParentBuffer: the view points into the parent at its offset and
    carries its real strides (no copy, no materialization)."""
    base = shims.empty_strided([4, 4], None, "float32", dev)
    upload(base, iota([4, 4], base=0.0))
    right = shims.reinterpret_tensor(base, [4, 2], [4, 1], 2)
    assert right.alloc is base.alloc and right.strides == (4, 1) and not right.packed
    assert right.byte_offset == 8
    np.testing.assert_array_equal(right.numpy().ravel(), [2, 3, 6, 7, 10, 11, 14, 15])
    delete(right, base)


def test_view_with_overlapping_dims_reads_the_right_values(dev, stream, owner):
    """§3 #45: dims that overlap (broadcast, sliding windows) read the right elements, by
    the host and by a kernel."""
    base = shims.empty_strided([8], None, "float32", dev)
    upload(base, iota([8]))
    win = shims.reinterpret_tensor(base, [3, 4], [2, 1], 0)   # overlapping windows
    bc = shims.reinterpret_tensor(base, [3, 4], [0, 1], 4)    # broadcast of the last 4
    ref = np.lib.stride_tricks.as_strided(iota([8]), (3, 4), (8, 4))
    np.testing.assert_array_equal(win.numpy(), ref)
    np.testing.assert_array_equal(bc.numpy(), np.broadcast_to(iota([8])[4:], (3, 4)))
    out = shims.empty_strided([3, 4], None, "float32", dev)
    kernel_fn(dev, copy_kernel([3, 4], [4, 1], [2, 1]))(stream, win, out)
    np.testing.assert_array_equal(out.numpy(), ref)
    delete(win, bc, out, base)


def test_empty_views_may_sit_at_the_end(dev, stream, owner):
    base = shims.empty_strided([8], None, "float32", dev)
    e = shims.reinterpret_tensor(base, [0, 4], [4, 1], 8)
    assert e.address == base.alloc.end and e.byte_offset == 32
    delete(e, base)


def test_views_of_an_empty_view_are_bounded_from_its_address(dev, stream, owner):
    """§1.2 #19: an empty view at offset 8 of an 8-element allocation: reinterpreting it as
    4 elements at offset 0 is refused; views back inside are fine."""
    base = shims.empty_strided([8], None, "float32", dev)
    e = shims.reinterpret_tensor(base, [0], [1], 8)
    with pytest.raises(InvalidArgument, match="outside"):
        shims.reinterpret_tensor(e, [4], [1], 0)
    inside = shims.reinterpret_tensor(e, [4], [1], -4)
    assert inside.byte_offset == 16
    empty_again = shims.reinterpret_tensor(e, [0], [1], 0)
    assert empty_again.byte_offset == 32
    delete(inside, empty_again, e, base)


def test_reinterpret_as_another_dtype(dev, stream, owner):
    """Program contract: byte-typed roots are viewed as typed tensors at element offsets."""
    raw = shims.empty_strided([64], None, "uint8", dev)
    f = shims.reinterpret_tensor(raw, [4], [1], 4, dtype="float32")
    assert f.dtype is dtypes.float32 and f.byte_offset == 16
    upload(f, iota([4]))
    back = shims.reinterpret_tensor(raw, [16], [1], 16)
    np.testing.assert_array_equal(back.numpy().view(np.float32), iota([4]))
    delete(f, back, raw)


def test_reinterpret_of_a_null_memory_tensor(dev, stream, owner):
    h = shims.create_tensor_from_blob(None, [0], None, 0, "float32", device=dev.name)
    v = shims.reinterpret_tensor(h, [2, 0], [0, 1], 0)
    assert v.alloc is None and v.sizes == (2, 0)
    delete(v, h)


def test_reinterpret_takes_one_count_per_view(dev, stream, owner):
    base = shims.empty_strided([8], None, "float32", dev)
    views = [shims.reinterpret_tensor(base, [2], [1], i) for i in range(5)]
    assert base.alloc.users == 6
    delete(*views)
    assert base.alloc.users == 1
    delete(base)


# -- new_tensor_handle and deletion orders ----------------------------------------------------


def test_new_tensor_handle_is_the_same_view(dev, stream, owner):
    """§4 CopiedHandleIsAStridedViewToo: a copied handle keeps the strided layout."""
    base = shims.empty_strided([4, 4], None, "float32", dev)
    right = shims.reinterpret_tensor(base, [4, 2], [4, 1], 2)
    c = shims.new_tensor_handle(right)
    assert c is not right
    assert (c.alloc, c.byte_offset, c.sizes, c.strides, c.dtype) == (
        right.alloc, right.byte_offset, right.sizes, right.strides, right.dtype)
    assert base.alloc.users == 3
    delete(right)
    assert not c.packed and c.state == "live"
    delete(c, base)


def test_new_tensor_handle_chains(dev, stream, owner):
    base = shims.empty_strided([3], None, "int64", dev)
    upload(base, np.array([7, 8, 9], np.int64))
    chain = [base]
    for _ in range(10):
        chain.append(shims.new_tensor_handle(chain[-1]))
    delete(*chain[:-1])
    np.testing.assert_array_equal(chain[-1].numpy(), [7, 8, 9])
    delete(chain[-1])


def test_new_tensor_handle_belongs_to_the_current_owner(dev, stream, owner):
    base = shims.empty_strided([2], None, "float32", dev)
    o2 = Owner("o2")
    with owner_scope(o2):
        c = shims.new_tensor_handle(base)
    assert c.owner is o2 and c in o2.handles and c not in owner.handles
    o2.close()
    assert c.state == "retired" and base.alloc.users == 1
    delete(c, base)


@pytest.mark.parametrize("order", list(itertools.permutations(range(5))))
def test_every_deletion_order_frees_exactly_at_the_last_handle(dev, stream, owner, order):
    """§3 #4-#11, §7.2: base, view, copied view, reinterpret-at-0 of the view and a nested
    view each hold the allocation; any deletion order keeps the data readable through the
    survivors and frees the memory exactly with the last one."""
    base = shims.empty_strided([16], None, "float32", dev)
    upload(base, iota([16]))
    view = shims.reinterpret_tensor(base, [8], [1], 8)
    copy = shims.new_tensor_handle(view)
    same = shims.reinterpret_tensor(view, [8], [1], 0)
    nested = shims.reinterpret_tensor(view, [4], [1], 2)
    hs = [base, view, copy, same, nested]
    expect = [iota([16]), iota([16])[8:], iota([16])[8:], iota([16])[8:], iota([16])[10:14]]
    alloc = base.alloc
    for n, i in enumerate(order):
        delete(hs[i])
        alive = [j for j in order[n + 1:]]
        assert alloc.users == len(alive) and alloc.freed == (not alive)
        if alive:
            j = alive[0]
            np.testing.assert_array_equal(hs[j].numpy(), expect[j])


# -- copy_ ------------------------------------------------------------------------------------


def test_copy_gathers_a_strided_view(dev, stream, owner):
    """§4 PackedCopyGathersTheViewsElements: {2,3,6,7,10,11,14,15}."""
    base = shims.empty_strided([4, 4], None, "float32", dev)
    upload(base, iota([4, 4], base=0.0))
    right = shims.reinterpret_tensor(base, [4, 2], [4, 1], 2)
    packed = shims.empty_strided([4, 2], None, "float32", dev)
    shims.copy_(packed, right)
    np.testing.assert_array_equal(packed.numpy().ravel(), [2, 3, 6, 7, 10, 11, 14, 15])
    delete(right, packed, base)


def test_copy_into_an_allocation_is_queued(dev, stream, owner):
    """§4 CopyOfStridedViewIntoMetalMemoryDoesNotWait: the copy is stream work, no wait."""
    src = shims.empty_strided([4, 4], None, "float32", dev)
    upload(src, iota([4, 4]))
    dst = shims.empty_strided([8, 4], None, "float32", dev)
    dst_view = shims.reinterpret_tensor(dst, [4, 4], [1, 4], 16)   # transposed, at an offset
    waits = stream.completed_waits
    shims.copy_(dst_view, src)
    assert stream.completed_waits == waits and dst.alloc.busy()
    np.testing.assert_array_equal(dst.numpy()[4:], iota([4, 4]).T)
    delete(src, dst_view, dst)


def test_copy_into_a_region_is_done_on_return(cpu, stream, owner):
    """§3 #83, §4 CopyOfStridedViewIntoCpuMemoryIsDoneOnReturn."""
    host = np.zeros((4, 4), np.float32)
    dst = shims.create_tensor_from_blob(host.ctypes.data, [4, 4], None, 0, "float32")
    src = shims.empty_strided([4, 4], None, "float32")
    upload(src, iota([4, 4]))
    shims.copy_(dst, src)
    assert stream.is_empty and not dst.alloc.busy()
    np.testing.assert_array_equal(host, iota([4, 4]))      # the caller's memory, no wait
    delete(dst, src)


def test_copy_out_of_a_region_is_done_on_return(cpu, stream, owner):
    host = rand([8], seed=12)
    src = shims.create_tensor_from_blob(host.ctypes.data, [8], None, 0, "float32")
    dst = shims.empty_strided([8], None, "float32")
    shims.copy_(dst, src)
    assert not src.alloc.busy()
    host[:] = 0.0           # the caller may reuse its array at once
    np.testing.assert_array_equal(dst.numpy(), rand([8], seed=12))
    delete(dst, src)


def test_copy_within_one_allocation_overlapping(dev, stream, owner):
    """§4 CopyOfStridedViewIntoItsOwnBufferIsCorrect: source and destination overlap."""
    base = shims.empty_strided([16], None, "float32", dev)
    upload(base, iota([16]))
    src = shims.reinterpret_tensor(base, [12], [1], 0)
    dst = shims.reinterpret_tensor(base, [12], [1], 4)
    shims.copy_(dst, src)
    ref = iota([16])
    ref[4:] = iota([16])[:12].copy()
    np.testing.assert_array_equal(base.numpy(), ref)
    delete(src, dst, base)


def test_copy_across_ranks_when_both_are_row_major(dev, stream, owner):
    """§3 #65: different ranks copy bytewise when both are row-major dense."""
    src = shims.empty_strided([2, 3, 4], None, "float32", dev)
    upload(src, iota([2, 3, 4]))
    dst = shims.empty_strided([6, 4], None, "float32", dev)
    shims.copy_(dst, src)
    np.testing.assert_array_equal(dst.numpy(), iota([6, 4]))
    delete(src, dst)


def test_copy_across_ranks_into_a_transposed_destination_is_refused(dev, stream, owner):
    """§3 #65 / §7.3: a layout copy_ cannot map."""
    src = shims.empty_strided([2, 3, 4], None, "float32", dev)
    dst = shims.empty_strided([6, 4], [1, 6], "float32", dev)
    with pytest.raises(InvalidArgument, match="src.*row-major"):
        shims.copy_(dst, src)
    delete(src, dst)


def test_copy_ignores_the_stride_of_a_size_one_dim(dev, stream, owner):
    """§3 #86."""
    src = shims.empty_strided([3, 1, 4], [4, 99, 1], "float32", dev)
    upload(src, iota([3, 1, 4]))
    dst = shims.empty_strided([3, 4], None, "float32", dev)
    shims.copy_(dst, src)
    np.testing.assert_array_equal(dst.numpy(), iota([3, 4]))
    delete(src, dst)


def test_copy_refuses_dtype_mismatch(dev, stream, owner):
    a = shims.empty_strided([4], None, "float32", dev)
    b = shims.empty_strided([4], None, "int32", dev)
    with pytest.raises(InvalidArgument, match="src: dtype int32 does not match dst float32"):
        shims.copy_(a, b)
    delete(a, b)


def test_copy_refuses_numel_mismatch(dev, stream, owner):
    a = shims.empty_strided([4], None, "float32", dev)
    b = shims.empty_strided([5], None, "float32", dev)
    with pytest.raises(InvalidArgument, match="src: 5 elements"):
        shims.copy_(a, b)
    delete(a, b)


def test_empty_copies_succeed(dev, stream, owner):
    """§3 #55."""
    a = shims.empty_strided([0, 4], None, "float32", dev)
    b = shims.empty_strided([4, 0], None, "float32", dev)
    seq = stream.recorded_seq
    shims.copy_(a, b)
    assert stream.recorded_seq == seq
    delete(a, b)


def test_copy_is_ordered_after_queued_writes_to_its_source(dev, stream, owner):
    src = shims.empty_strided([32], None, "float32", dev)
    dst = shims.empty_strided([32], None, "float32", dev)
    kernel_fn(dev, iota_kernel([32], [1]))(stream, src)
    shims.copy_(dst, src)
    np.testing.assert_array_equal(dst.numpy(), iota([32]))
    delete(src, dst)


def test_copy_from_the_host_waits_for_pending_readers(dev, stream, owner):
    """§3 #18: writing an input from the host does not overwrite what a queued op has yet
    to read."""
    inp = shims.empty_strided([16], None, "float32", dev)
    out = shims.empty_strided([16], None, "float32", dev)
    upload(inp, iota([16]))
    kernel_fn(dev, copy_kernel([16], [1], [1]))(stream, inp, out)
    upload(inp, iota([16], base=100.0))
    np.testing.assert_array_equal(out.numpy(), iota([16]))
    np.testing.assert_array_equal(inp.numpy(), iota([16], base=100.0))
    delete(inp, out)


# -- item_bool and getters --------------------------------------------------------------------


@pytest.mark.parametrize("value", [True, False])
def test_item_bool_reads_one_bool(dev, stream, owner, value):
    h = shims.empty_strided([1, 1], None, "bool", dev)
    upload(h, np.array([[value]]))
    assert shims.item_bool(h) is value
    delete(h)


def test_item_bool_waits_for_the_kernel_that_wrote_it(dev, stream, owner):
    from aotrt.kernels import ir

    h = shims.empty_strided([], [], "bool", dev)
    k = ir.Kernel("set_true", (), (), (ir.Arg("bool", "w"),),
                  (ir.Store(0, ir.const(0, "int64"), ir.const(True, "bool")),))
    upload(h, np.array(False))
    kernel_fn(dev, k)(stream, h)
    assert shims.item_bool(h) is True
    delete(h)


def test_getters_answer_from_the_handles_own_state(dev, stream, owner):
    """§7.3: real storage offset, real device, sizes/strides of this view."""
    base = shims.empty_strided([6, 8], None, "float16", dev)
    v = shims.reinterpret_tensor(base, [3, 4], [8, 2], 10)
    assert shims.get_sizes(v) == (3, 4)
    assert shims.get_strides(v) == (8, 2)
    assert shims.get_storage_offset(v) == 10
    assert shims.get_dtype(v) is dtypes.float16
    assert shims.get_device(v) == dev.name
    assert shims.get_device_index(v) == 0
    assert shims.get_numel(v) == 12
    assert shims.get_dim(v) == 2
    assert shims.get_data_ptr(v) == base.alloc.ptr + 20
    assert shims.get_storage_size(v) == 96
    delete(v, base)


def test_getters_of_a_zero_dim_tensor(dev, stream, owner):
    h = shims.empty_strided([], None, "float32", dev)
    assert shims.get_sizes(h) == () and shims.get_strides(h) == ()
    assert shims.get_dim(h) == 0 and shims.get_numel(h) == 1
    delete(h)


# -- property tests: random view chains against numpy as_strided -------------------------------

N = 48
VIEW = st.tuples(
    st.lists(st.integers(0, 4), min_size=0, max_size=3),          # sizes
    st.lists(st.integers(0, 9), min_size=3, max_size=3),          # strides (cut to rank)
    st.integers(-N, N),                                           # offset (relative)
)


def _valid(off: int, sizes, strides) -> bool:
    if int(np.prod(sizes)) == 0:
        return 0 <= off <= N
    hi = sum((n - 1) * s for n, s in zip(sizes, strides) if n > 1)
    return off >= 0 and off + hi + 1 <= N


def _ref_view(ref: np.ndarray, off: int, sizes, strides) -> np.ndarray:
    return np.lib.stride_tricks.as_strided(ref[off:], shape=sizes,
                                           strides=[s * ref.itemsize for s in strides])


def _self_overlapping(sizes, strides) -> bool:
    offs = {0}
    for n, s in zip(sizes, strides):
        offs = {o + i * s for o in offs for i in range(n)}
    return len(offs) != int(np.prod(sizes))


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_view_chains_match_numpy(cpu, data):
    """Random chains of reinterpret_tensor / new_tensor_handle / delete_tensor_object (and
    writes through views with copy_ or a kernel) in random orders match numpy as_strided on a
    reference copy; refused views publish nothing; at the end the allocation's users are
    back to zero and nothing stays tracked."""
    mode = data.draw(st.sampled_from(["async", "deferred"]), label="mode")
    s = make_stream(cpu, mode)
    o = Owner("hypothesis")
    try:
        with cpu.stream_guard(s), owner_scope(o):
            _run_chain(cpu, s, o, data)
        assert not o.handles
        assert not [a for a in cpu.memory.live() if a.owner is o]
    finally:
        o.close()
        s.close()


def _run_chain(dev, s, o, data) -> None:
    ref = rand([N], seed=data.draw(st.integers(0, 1000), label="seed"))
    base = shims.empty_strided([N], None, "float32", dev)
    upload(base, ref)
    ref = ref.copy()
    alloc = base.alloc
    live: list[tuple[Handle, int, tuple, tuple]] = [(base, 0, (N,), (1,))]
    steps = data.draw(st.integers(1, 25), label="steps")
    for _ in range(steps):
        op = data.draw(st.sampled_from(["view", "view", "copy", "delete", "write", "read"]))
        if not live:
            break
        i = data.draw(st.integers(0, len(live) - 1))
        h, off, sizes, strides = live[i]
        if op == "view":
            sz, sd, rel = data.draw(VIEW)
            sz, sd = tuple(sz), tuple(sd[:len(sz)])
            new_off = off + rel
            before = (set(o.handles), alloc.users)
            if _valid(new_off, sz, sd):
                v = shims.reinterpret_tensor(h, sz, sd, rel)
                assert v.alloc is alloc and v.storage_offset == new_off
                live.append((v, new_off, sz, sd))
            else:
                with pytest.raises(InvalidArgument):
                    shims.reinterpret_tensor(h, sz, sd, rel)
                assert (set(o.handles), alloc.users) == before
        elif op == "copy":
            c = shims.new_tensor_handle(h)
            live.append((c, off, sizes, strides))
        elif op == "delete":
            shims.delete_tensor_object(h)
            live.pop(i)
        elif op == "write" and int(np.prod(sizes)) and not _self_overlapping(sizes, strides):
            vals = rand(sizes, seed=data.draw(st.integers(0, 1000)))
            src = shims.empty_strided(list(sizes), None, "float32", dev)
            upload(src, vals)
            # A kernel bakes its strides in (a compile each): one write in four goes that way.
            if data.draw(st.integers(0, 3), label="by kernel") == 0:
                k = copy_kernel(sizes, strides, tuple(np.array(vals).strides[d] // 4
                                                      for d in range(len(sizes))))
                kernel_fn(dev, k)(s, src, h)
            else:
                shims.copy_(h, src)
            shims.delete_tensor_object(src)
            _ref_view(ref, off, sizes, strides)[...] = vals
        elif op == "read":
            np.testing.assert_array_equal(h.numpy(), _ref_view(ref, off, sizes, strides))
        assert alloc.users == len(live)
    if live:
        whole = shims.reinterpret_tensor(live[0][0], [N], [1], -live[0][1])
        np.testing.assert_array_equal(whole.numpy(), ref)
        shims.delete_tensor_object(whole)
    for h, *_ in live:
        shims.delete_tensor_object(h)
    assert alloc.users == 0 and alloc.freed and alloc not in dev.memory.live()


def test_empty_blob_at_the_highest_address(cpu, stream, owner):
    """The address range ends at INT64_MAX: an empty blob there is fine, one past it is not."""
    e = shims.create_tensor_from_blob(INT64_MAX, [0], None, 0, "uint8")
    assert e.address == INT64_MAX and e.alloc.nbytes == 0
    delete(e)


def test_blob_past_the_end_message_names_the_blob_and_its_allocation(dev, stream, owner):
    base = shims.empty_strided([8], None, "float32", dev)
    start = base.alloc.ptr + 8
    with pytest.raises(InvalidArgument) as e:
        shims.create_tensor_from_blob(start, [8], None, 0, "float32", device=dev.name)
    assert str(e.value) == (f"data_ptr: blob [{start:#x}, {start + 32:#x}) runs past the end "
                            f"of {base.alloc.describe()}")
    delete(base)


def test_blob_past_its_constant_message_names_the_constant(dev, stream, owner):
    a, _ = dev.memory.allocate_constants([8, 8], stream)
    with pytest.raises(InvalidArgument) as e:
        shims.create_tensor_from_blob(a.ptr, [3], None, 0, "float32", device=dev.name)
    assert str(e.value) == (f"data_ptr: blob [{a.ptr:#x}, {a.ptr + 12:#x}) runs past the end "
                            f"of its constant in {a.describe()}")


def test_blob_whose_end_passes_int64_through_its_offset_is_refused(cpu, stream, owner):
    host = rand([4], seed=20)
    before = snapshot(cpu)
    with pytest.raises(InvalidArgument, match="^storage_offset: .* overflows 64 bits"):
        shims.create_tensor_from_blob(host.ctypes.data, [4], None, INT64_MAX // 4, "float32")
    assert snapshot(cpu) == before


def test_empty_blob_at_the_end_of_a_one_byte_allocation_joins_it(dev, stream, owner):
    one = shims.empty_strided([1], None, "uint8", dev)
    e = shims.create_tensor_from_blob(one.alloc.end, [0], None, 0, "uint8", device=dev.name)
    assert e.alloc is one.alloc and e.byte_offset == 1
    delete(e, one)


def test_empty_blob_past_a_zero_byte_allocation_does_not_join_it(dev, stream, owner):
    z = shims.empty_strided([0], None, "uint8", dev)
    e = shims.create_tensor_from_blob(z.alloc.ptr + 1, [0], None, 0, "uint8", device=dev.name)
    assert e.alloc is not z.alloc and e.alloc.ptr == z.alloc.ptr + 1
    delete(e, z)


def test_null_blob_keeps_its_layout_and_device(dev, stream, owner):
    h = shims.create_tensor_from_blob(0, [3, 0], [5, 7], 0, "int16", device=dev.name)
    assert shims.get_strides(h) == (5, 7) and shims.get_device(h) == dev.name
    assert h.device is dev and shims.get_dtype(h) is dtypes.int16
    delete(h)


def test_copy_across_devices_goes_through_the_host_after_the_waits(cpu, owner, stream):
    """copy_ between two devices reads the source after its pending writes and writes the
    destination after its pending work (here two cpu device instances stand for cpu/cuda)."""
    from aotrt.dtypes import float32
    from aotrt.runtime.backends.cpu.device import CpuDevice

    other = CpuDevice()
    s = make_stream(cpu, "deferred")
    with cpu.stream_guard(s):
        src = shims.empty_strided([4, 4], None, "float32")
    kernel_fn(cpu, iota_kernel([4, 4], [4, 1]))(s, src)      # pending, not waited
    s.commit()
    dst_alloc = other.memory.allocate(64, None, owner)
    dst = Handle(dst_alloc, 0, (4, 4), (1, 4), float32, other, owner)._publish()
    shims.copy_(dst, src)
    np.testing.assert_array_equal(dst.numpy(), iota([4, 4]))
    # A queued reader of the source is no reason to wait: the copy only reads it too.
    out = shims.empty_strided([4, 4], None, "float32", device="cpu")
    kernel_fn(cpu, copy_kernel([4, 4], [4, 1], [4, 1]))(s, src, out)
    s.commit()
    waits = s.completed_waits
    shims.copy_(dst, src)
    assert s.completed_waits == waits and out.alloc.busy()
    delete(dst, src, out)
    s.close()


def test_int64_stride_limits_are_inclusive(dev, stream, owner):
    """A size-1 dim's stride may be anything that fits int64, both ends included."""
    base = shims.empty_strided([4], None, "float32", dev)
    for stride in (INT64_MAX, -INT64_MAX - 1, -INT64_MAX):
        v = shims.reinterpret_tensor(base, [1, 2], [stride, 1], 0)
        assert v.strides == (stride, 1)
        delete(v)
    delete(base)


def test_the_largest_element_count_is_int64_max(dev, stream, owner):
    """A broadcast byte view of exactly INT64_MAX elements is accepted; its extent is one."""
    base = shims.empty_strided([4], None, "uint8", dev)
    sizes = [7 * 7 * 73 * 127 * 337, 92737, 649657]       # product: 2**63 - 1
    assert int(np.prod(np.array(sizes, dtype=object))) == INT64_MAX
    v = shims.reinterpret_tensor(base, sizes, [0, 0, 0], 1)
    assert v.numel == INT64_MAX and v.byte_range() == (1, 2)
    delete(v, base)


def test_numpy_integers_are_accepted(dev, stream, owner):
    h = shims.empty_strided([np.int64(2), np.int32(3)], [np.int64(3), np.uint8(1)], "float32", dev)
    assert h.sizes == (2, 3) and h.strides == (3, 1)
    assert all(type(x) is int for x in h.sizes + h.strides)
    v = shims.reinterpret_tensor(h, [np.int16(2)], [np.int64(1)], np.int64(4))
    assert v.storage_offset == 4 and type(v.storage_offset) is int
    delete(v, h)


def test_views_of_a_null_tensor_stand_for_address_zero(dev, stream, owner):
    h = shims.create_tensor_from_blob(0, [0, 3], None, 0, "float32", device=dev.name)
    v = shims.reinterpret_tensor(h, [3, 0], [1, 1], 0)
    assert shims.get_data_ptr(v) == 0 and shims.get_storage_offset(v) == 0
    assert v.strides == (1, 1) and v.dtype is dtypes.float32 and v.device is dev
    delete(v, h)


def test_outside_message_names_the_view_and_its_bounds(dev, stream, owner):
    base = shims.empty_strided([16], None, "float32", dev)
    v = shims.reinterpret_tensor(base, [8], [1], 4)
    with pytest.raises(InvalidArgument) as e:
        shims.reinterpret_tensor(v, [2, 3], [5, 1], 6)
    assert str(e.value) == (f"sizes/strides/storage_offset: view bytes [40, 72) lie outside "
                            f"[0, 64) of {base.alloc.describe()}")
    delete(v, base)


# -- hostile values: every refusal is an aotrt error, never numpy's, ctypes' or int()'s -----

_HOSTILE_INT = st.one_of(
    st.integers(-(1 << 70), 1 << 70), st.sampled_from([0, 1, 2, (1 << 31), (1 << 62), INT64_MAX,
                                                       1 << 63, -(1 << 63) - 1]),
    st.booleans(), st.floats(allow_nan=True), st.none(), st.text(max_size=3),
    st.builds(np.int64, st.integers(-(1 << 63), INT64_MAX)),
    st.builds(np.uint64, st.integers(0, (1 << 64) - 1)), st.builds(np.bool_, st.booleans()),
    st.builds(np.float32, st.floats(width=32)))
_HOSTILE_DIMS = st.one_of(st.lists(_HOSTILE_INT, max_size=4), st.lists(st.just(1),
                                                                      min_size=63, max_size=70),
                          _HOSTILE_INT, st.just(np.arange(3)), st.just(np.ones((2, 2), int)))
_HOSTILE_DTYPE = st.one_of(st.sampled_from(["float32", "uint8", "bool", "bfloat16", "float64",
                                            "nope", np.int16, np.complex64, None, 3, ["f4"],
                                            {"a": 1}, [("a", "f4", -1)], b"f4", object()]))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_hostile_shim_arguments_raise_only_aotrt_errors(cpu, stream, owner, data):
    """A bad argument is an InvalidArgument (module docstring, §7.3); only a size too big
    for memory may be an OutOfMemory, and only where memory is allocated."""
    base = shims.empty_strided([64], None, "float32", cpu)
    made: list[Handle] = []
    def arg(valid: Any, hostile: Any) -> Any:
        # Mostly valid arguments, so that the one hostile value reaches its check.
        return data.draw(valid if data.draw(st.integers(0, 3)) else hostile)

    dims = st.sampled_from([[4], [2, 3], [1] * 64, [1] * 65, [0, 5]])
    dtype = st.sampled_from(["float32", "uint8", "int64"])
    calls = {
        "empty_strided": lambda: shims.empty_strided(
            arg(dims, _HOSTILE_DIMS), arg(st.none(), _HOSTILE_DIMS), arg(dtype, _HOSTILE_DTYPE),
            arg(st.just("cpu"), st.sampled_from([None, 1, "cpu:7", ["cpu"]]))),
        "create_tensor_from_blob": lambda: shims.create_tensor_from_blob(
            arg(st.sampled_from([base.alloc.ptr, base.alloc.ptr + 4]), _HOSTILE_INT),
            arg(dims, _HOSTILE_DIMS), arg(st.none(), _HOSTILE_DIMS),
            arg(st.just(0), _HOSTILE_INT), arg(dtype, _HOSTILE_DTYPE), "cpu"),
        "reinterpret_tensor": lambda: shims.reinterpret_tensor(
            base, arg(dims, _HOSTILE_DIMS), arg(st.sampled_from([[1], [0, 1], [1] * 65]),
                                                 _HOSTILE_DIMS),
            arg(st.just(0), _HOSTILE_INT), arg(st.none(), _HOSTILE_DTYPE)),
    }
    name = data.draw(st.sampled_from(sorted(calls)))
    try:
        h = calls[name]()
        made.append(h)
        # What was accepted is a usable view: its metadata, and its values where they are
        # in memory the test owns and small enough to read.
        assert len(h.sizes) <= 64 and h.numel >= 0
        lo, hi = h.byte_range()
        if h.alloc is not None and h.alloc.kind != "region" and h.numel <= 1 << 16:
            arr = h.numpy()
            assert arr.shape == h.sizes
        del lo, hi
    except InvalidArgument:
        pass
    except OutOfMemory:
        assert name == "empty_strided", f"{name} allocates nothing, yet raised OutOfMemory"
    except MemoryError as e:                      # pragma: no cover - the defect under test
        pytest.fail(f"{name}: raw MemoryError {e!r}")
    finally:
        for h in made:
            delete(h)
        delete(base)
