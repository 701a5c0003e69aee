"""aotrt/runtime/dlpack.py: DLPack by hand, both directions, with numpy and torch, and its
refusals; every capsule's memory is released exactly once."""

from __future__ import annotations

import ctypes
import gc
import sys
import weakref
from typing import Any, Callable

import ml_dtypes
import numpy as np
import pytest

from aotrt import dtypes
from aotrt.errors import InvalidArgument
from aotrt.runtime import dlpack
from tests.support import rand

torch = pytest.importorskip("torch")


class Producer:
    """An object whose __dlpack__ hands out a given capsule (or raises)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        return self.make()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (dlpack.CPU, 0)


class Counter:
    """Counts release calls; the owner object of an exported capsule."""

    def __init__(self) -> None:
        self.released = 0

    def release(self) -> None:
        self.released += 1


def _export(arr: np.ndarray, counter: Counter, dtype: dtypes.DType | None = None) -> Any:
    """A capsule over `arr`'s own memory (strides in elements)."""
    strides = tuple(s // arr.itemsize for s in arr.strides)
    return dlpack.to_dlpack(arr.ctypes.data, arr.shape, strides,
                            dtype or dtypes.as_dtype(arr.dtype), "cpu", arr, counter.release)


# -- import ----------------------------------------------------------------------------------


@pytest.mark.parametrize("view", [
    lambda a: a,
    lambda a: a.T,
    lambda a: a[1:, ::2],
    lambda a: a[2],
    lambda a: a[:0],
    lambda a: a[3, 4, ...],       # 0-dim
], ids=["dense", "transposed", "offset-step", "row", "empty", "scalar"])
def test_import_numpy_views_in_place(view: Callable[[np.ndarray], np.ndarray]) -> None:
    base = rand([6, 8], seed=1)
    a = view(base)
    imp = dlpack.from_dlpack(a)
    assert imp.device == "cpu" and imp.device_id == 0 and imp.dtype is dtypes.float32
    assert imp.shape == a.shape
    if a.size:
        assert imp.ptr == a.ctypes.data
        assert imp.strides == tuple(s // a.itemsize for s in a.strides)
        # Read through the imported address: the very elements of the view.
        got = np.lib.stride_tricks.as_strided(
            np.ctypeslib.as_array(ctypes.cast(imp.ptr, ctypes.POINTER(ctypes.c_float)),
                                  (1,)), a.shape, a.strides)
        np.testing.assert_array_equal(got, a)


@pytest.mark.parametrize("tdt", [torch.float32, torch.bfloat16, torch.float16, torch.int64,
                                 torch.int8, torch.uint8, torch.bool])
def test_import_torch_tensors(tdt: Any) -> None:
    base = (torch.randn(5, 7) * 10).to(tdt)
    t = base.t()[1:]                     # transposed, with a storage offset
    imp = dlpack.from_dlpack(t)
    assert imp.ptr == t.data_ptr()
    assert imp.shape == tuple(t.shape) and imp.strides == t.stride()
    assert imp.dtype is dtypes.as_dtype(tdt) and imp.device == "cpu"


def test_an_import_releases_the_producer_once_when_collected() -> None:
    a = rand([64], seed=2)
    before = sys.getrefcount(a)
    imp = dlpack.from_dlpack(a)
    assert sys.getrefcount(a) > before      # numpy's capsule context holds the array
    del imp
    gc.collect()
    assert sys.getrefcount(a) == before


@pytest.mark.parametrize("make,match", [
    (lambda: 42, "did not return a 'dltensor' capsule"),
    (lambda: (_ for _ in ()).throw(BufferError("not today")), "not today"),
    (lambda: (_ for _ in ()).throw(TypeError("no stream")), "no stream"),
])
def test_bad_producers_are_refused(make: Callable[[], Any], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        dlpack.from_dlpack(Producer(make))


def test_a_used_capsule_is_refused() -> None:
    a = rand([4], seed=3)
    capsule = a.__dlpack__()
    torch.from_dlpack(capsule)              # consumes it: renamed "used_dltensor"
    with pytest.raises(InvalidArgument, match="'dltensor' capsule"):
        dlpack.from_dlpack(Producer(lambda: capsule))


def test_unsupported_dtypes_are_refused_and_released() -> None:
    a = np.ones(5, np.complex64)
    before = sys.getrefcount(a)
    with pytest.raises(InvalidArgument, match="DLPack dtype"):
        dlpack.from_dlpack(a)
    gc.collect()
    assert sys.getrefcount(a) == before


@pytest.mark.parametrize("field,value,match", [
    ("device_type", 7, "device type 7"),
    ("ndim", 65, "65 dims"),
    ("ndim", -1, "-1 dims"),
])
def test_bad_tensor_descriptions_are_refused(field: str, value: int, match: str) -> None:
    arr = rand([3, 4], seed=4)
    counter = Counter()

    def make() -> Any:
        capsule = _export(arr, counter)
        address = ctypes.pythonapi.PyCapsule_GetPointer(ctypes.py_object(capsule), b"dltensor")
        t = dlpack.DLManagedTensor.from_address(address).dl_tensor
        if field == "device_type":
            t.device.device_type = value
        else:
            t.ndim = value
        return capsule

    with pytest.raises(InvalidArgument, match=match):
        dlpack.from_dlpack(Producer(make))
    gc.collect()
    assert counter.released == 1            # refused, and still released, once


# -- export ----------------------------------------------------------------------------------


@pytest.mark.parametrize("consumer", ["torch", "numpy"])
def test_export_is_zero_copy_and_released_once(consumer: str) -> None:
    arr = rand([5, 6], seed=5)
    counter = Counter()
    owner_ref = weakref.ref(arr)
    capsule = _export(arr, counter)
    if consumer == "torch":
        t = torch.from_dlpack(capsule)
        view = t.numpy()
        assert t.data_ptr() == arr.ctypes.data
    else:
        view = np.from_dlpack(Producer(lambda c=capsule: c))
        assert view.ctypes.data == arr.ctypes.data
    np.testing.assert_array_equal(view, arr)
    if consumer == "torch":
        view[2, 3] = 123.0                  # writes reach the producer's memory
        assert arr[2, 3] == 123.0
    arr[4, 5] = -7.0                        # and the producer's writes are seen
    assert view[4, 5] == -7.0
    del arr, capsule
    gc.collect()
    assert owner_ref() is not None and counter.released == 0   # the consumer holds it
    del view
    if consumer == "torch":
        del t
    gc.collect()
    assert counter.released == 1 and owner_ref() is None


def test_export_of_strided_bfloat16_to_torch() -> None:
    base = rand([4, 6], seed=6).astype(ml_dtypes.bfloat16)
    view = base.T[1:]                      # strides (1, 6), offset one element
    counter = Counter()
    t = torch.from_dlpack(_export(view, counter))
    assert t.dtype == torch.bfloat16 and t.stride() == (1, 6) and tuple(t.shape) == (5, 4)
    np.testing.assert_array_equal(t.float().numpy(), view.astype(np.float32))
    del t
    gc.collect()
    assert counter.released == 1


def test_an_unconsumed_capsule_releases_when_dropped() -> None:
    counter = Counter()
    capsule = _export(rand([3], seed=7), counter)
    assert counter.released == 0
    del capsule
    gc.collect()
    assert counter.released == 1


def test_round_trip_numpy_to_torch_through_both_directions() -> None:
    a = rand([3, 4, 5], seed=8).transpose(2, 0, 1)
    imp = dlpack.from_dlpack(a)
    counter = Counter()
    t = torch.from_dlpack(dlpack.to_dlpack(imp.ptr, imp.shape, imp.strides, imp.dtype, "cpu",
                                           imp, counter.release))
    assert t.data_ptr() == a.ctypes.data and t.stride() == imp.strides
    np.testing.assert_array_equal(t.numpy(), a)
    del t
    gc.collect()
    assert counter.released == 1
