"""DLPack by hand (ctypes): import any `__dlpack__` object, export aotrt memory.

numpy's own DLPack support lacks bfloat16 and non-host devices, so both directions are done
here on the legacy `DLManagedTensor` ABI (capsule name "dltensor"), which every consumer
(torch, CuPy, numpy, JAX) accepts. Ownership stays in objects: an imported tensor's
deleter runs when its `Imported` record is collected; an exported capsule keeps a Python
context object alive (one manual reference) until the consumer calls our deleter.
"""

from __future__ import annotations

import ctypes
import logging
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from aotrt import dtypes
from aotrt.errors import InvalidArgument

log = logging.getLogger(__name__)

CPU, CUDA, CUDA_HOST = 1, 2, 3
DEVICE_NAMES = {CPU: "cpu", CUDA: "cuda"}
DEVICE_TYPES = {"cpu": CPU, "cuda": CUDA}


class DLDevice(ctypes.Structure):
    """DLPack's device: (type, id)."""

    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    """DLPack's dtype: (code, bits, lanes)."""

    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    """DLPack's tensor description."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    """DLPack's managed tensor (legacy, unversioned ABI)."""


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _Deleter),
]

_NAME = b"dltensor"
_USED = b"used_dltensor"

_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.Py_IncRef.argtypes = [ctypes.py_object]
_api.Py_DecRef.argtypes = [ctypes.py_object]

# The destructor gets a raw PyObject* of a capsule that is being destroyed: use the
# raw-pointer variants so that ctypes never takes a reference to a dying object.
_IsValidRaw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", _api))
_GetPointerRaw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))


# -- import ----------------------------------------------------------------------------------


@dataclass
class Imported:
    """A tensor taken from a DLPack capsule: where its elements are, and its owner record.

    `ptr` is the address of element 0; `strides` are in elements. The producer's memory
    stays valid while this object lives; its deleter runs when it is collected.
    """

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: dtypes.DType
    device: str
    device_id: int
    keep: Any


class _ManagedOwner:
    """Calls a DLManagedTensor's deleter exactly once, when collected."""

    def __init__(self, address: int, deleter: Any, capsule: Any) -> None:
        self._capsule = capsule  # the capsule holds the producer's context
        self._finalizer = weakref.finalize(self, _call_deleter, address, deleter)


def _call_deleter(address: int, deleter: Any) -> None:
    if deleter:
        deleter(address)


def from_dlpack(obj: Any, stream: int | None = None) -> Imported:
    """Take `obj.__dlpack__()` without copying; refuse what aotrt cannot address."""
    try:
        capsule = obj.__dlpack__() if stream is None else obj.__dlpack__(stream=stream)
    except (TypeError, BufferError, RuntimeError, ValueError) as e:
        raise InvalidArgument(f"__dlpack__ of {type(obj).__name__} failed: {e}") from None
    if not _api.PyCapsule_IsValid(capsule, _NAME):
        raise InvalidArgument(f"{type(obj).__name__}.__dlpack__ did not return a "
                              f"'dltensor' capsule")
    address = _api.PyCapsule_GetPointer(capsule, _NAME)
    managed = DLManagedTensor.from_address(address)
    # From here on the capsule is ours: mark it used so the producer's destructor leaves it.
    _api.PyCapsule_SetName(capsule, _USED)
    deleter = managed.deleter
    keep = _ManagedOwner(address, deleter if deleter else None, capsule)
    t = managed.dl_tensor
    ndim = t.ndim
    if not 0 <= ndim <= 64:
        raise InvalidArgument(f"DLPack tensor has {ndim} dims")
    shape = tuple(int(t.shape[i]) for i in range(ndim))
    if t.strides:
        strides = tuple(int(t.strides[i]) for i in range(ndim))
    else:
        acc, st = 1, []
        for n in reversed(shape):
            st.append(acc)
            acc *= max(n, 1)
        strides = tuple(reversed(st))
    dt = dtypes.from_dlpack_code(t.dtype.code, t.dtype.bits, t.dtype.lanes)
    dev = DEVICE_NAMES.get(t.device.device_type)
    if dev is None:
        raise InvalidArgument(f"DLPack device type {t.device.device_type} is not supported")
    ptr = (t.data or 0) + int(t.byte_offset)
    return Imported(ptr, shape, strides, dt, dev, int(t.device.device_id), keep)


# -- export ----------------------------------------------------------------------------------


class _Exported:
    """Everything an exported capsule points at; alive until the consumer's deleter call."""

    def __init__(self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...],
                 dtype: dtypes.DType, device: str, owner: Any, release: Callable[[], None]):
        n = len(shape)
        self.shape = (ctypes.c_int64 * max(n, 1))(*shape)
        self.strides = (ctypes.c_int64 * max(n, 1))(*strides)
        self.owner = owner
        self.release = release
        self.managed = DLManagedTensor()
        m = self.managed
        m.dl_tensor.data = ptr or None
        m.dl_tensor.device = DLDevice(DEVICE_TYPES[device], 0)
        m.dl_tensor.ndim = n
        m.dl_tensor.dtype = DLDataType(dtype.dl_code, dtype.dl_bits, 1)
        m.dl_tensor.shape = ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))
        m.dl_tensor.strides = ctypes.cast(self.strides, ctypes.POINTER(ctypes.c_int64))
        m.dl_tensor.byte_offset = 0
        m.manager_ctx = id(self)
        m.deleter = _DELETER


def _deleter(address: int) -> None:
    """Called by the consumer (or by our capsule destructor) when it is done with the memory."""
    try:
        managed = DLManagedTensor.from_address(address)
        ctx = ctypes.cast(managed.manager_ctx, ctypes.py_object).value
        release, ctx.release = ctx.release, None
        _api.Py_DecRef(ctypes.py_object(ctx))
        if release is not None:
            release()
    except Exception:  # noqa: BLE001 - a C callback must not raise
        log.exception("aotrt DLPack deleter failed")


_DELETER = _Deleter(_deleter)


def _capsule_destructor(capsule: int) -> None:
    # Unconsumed capsules (still named "dltensor") free their tensor themselves.
    try:
        if _IsValidRaw(capsule, _NAME):
            _deleter(_GetPointerRaw(capsule, _NAME))
    except Exception:  # noqa: BLE001 - a C callback must not raise
        log.exception("aotrt DLPack capsule destructor failed")


_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_capsule_destructor)


def to_dlpack(ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: dtypes.DType,
              device: str, owner: Any, release: Callable[[], None]) -> Any:
    """A 'dltensor' capsule over memory at `ptr`; `release()` runs when the consumer is done.

    `owner` is kept alive as long as the consumer holds the capsule's tensor.
    """
    ctx = _Exported(ptr, shape, strides, dtype, device, owner, release)
    _api.Py_IncRef(ctypes.py_object(ctx))
    try:
        return _api.PyCapsule_New(ctypes.addressof(ctx.managed), _NAME,
                                  ctypes.cast(_DESTRUCTOR, ctypes.c_void_p))
    except BaseException:
        _api.Py_DecRef(ctypes.py_object(ctx))
        raise
