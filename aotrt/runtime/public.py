"""`aotrt.Tensor`: the public tensor that delegates return.

A Tensor owns one handle (a view of memory it keeps alive). Its memory stays valid after
later runs and after its delegate is closed; it goes when the Tensor is released (or
collected) and no DLPack consumer still holds it. Host access waits for pending writes.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from aotrt.dtypes import DType
from aotrt.runtime import dlpack, finalize, shims
from aotrt.runtime.memory import PROCESS_OWNER, owner_scope
from aotrt.runtime.tensor import Handle, check_live

log = logging.getLogger(__name__)


def _delete_quietly(handle: Handle) -> None:
    if handle.state == "live" or handle.state == "retired":
        shims.delete_tensor_object(handle)


def _consumer_done(handle: Handle, stream: Any) -> None:
    """A DLPack consumer let go of `handle`: order reuse of its memory after the work the
    consumer queued on `stream`, then drop the reference (never raises: a C deleter)."""
    try:
        if handle.state == "live" and handle.alloc is not None:
            handle.device.after_consumer(handle.alloc, stream)
    except Exception as e:  # noqa: BLE001 - the consumer's deleter cannot report it
        log.warning("DLPack release: could not order reuse after the consumer: %s", e)
    finally:
        _delete_quietly(handle)


class Tensor:
    """A device tensor: shape, dtype, device; numpy(), __array__ and DLPack export."""

    __slots__ = ("_handle", "_finalizer", "__weakref__")

    def __init__(self, handle: Handle) -> None:
        """Take ownership of a live handle (internal: delegates make Tensors)."""
        check_live(handle, "handle")
        self._handle = handle
        self._finalizer = finalize.finalizer(self, _delete_quietly, handle)

    @classmethod
    def from_numpy(cls, array: Any, device: Any = "cpu") -> "Tensor":
        """A new Tensor on `device` holding a copy of `array` (row-major)."""
        from aotrt.dtypes import as_dtype
        from aotrt.runtime.device import get_device

        arr = np.asarray(array)
        dt = as_dtype(arr.dtype)
        dev = get_device(device)
        with owner_scope(PROCESS_OWNER):
            h = shims.empty_strided(arr.shape, None, dt, dev)
        try:
            if h.alloc is not None and h.numel:
                h.alloc.settle()       # pooled memory may still be in use on its stream
                dev.write(h, arr)
        except BaseException:
            shims.delete_tensor_object(h)
            raise
        return cls(h)

    @classmethod
    def _adopt(cls, handle: Handle) -> "Tensor":
        """A Tensor over a new process-owned handle to `handle`'s view."""
        with owner_scope(PROCESS_OWNER):
            return cls(shims.new_tensor_handle(handle))

    # -- properties ---------------------------------------------------------------------------

    @property
    def handle(self) -> Handle:
        """The runtime handle (raises once the Tensor is released)."""
        check_live(self._handle, "tensor")
        return self._handle

    @property
    def shape(self) -> tuple[int, ...]:
        """Sizes of each dim."""
        return self._handle.sizes

    @property
    def strides(self) -> tuple[int, ...]:
        """Strides of each dim, in elements."""
        return self._handle.strides

    @property
    def dtype(self) -> DType:
        """The aotrt dtype."""
        return self._handle.dtype

    @property
    def device(self) -> str:
        """'cpu' or 'cuda'."""
        return self._handle.device.name

    @property
    def ndim(self) -> int:
        """Number of dims."""
        return len(self._handle.sizes)

    @property
    def numel(self) -> int:
        """Number of elements."""
        return self._handle.numel

    @property
    def released(self) -> bool:
        """True once `release()` ran (or the memory was taken away)."""
        return self._handle.state != "live"

    def __repr__(self) -> str:
        state = "" if not self.released else " released"
        return (f"aotrt.Tensor(shape={list(self.shape)}, dtype={self.dtype.name}, "
                f"device='{self.device}'{state})")

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    # -- host access --------------------------------------------------------------------------

    def numpy(self) -> np.ndarray:
        """A host copy of the elements, after waiting for the writes that produce them."""
        return self.handle.numpy()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if copy is False:
            raise ValueError("aotrt.Tensor.__array__ always copies; use np.from_dlpack for a "
                             "zero-copy view of cpu memory")
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype, copy=False)

    # -- DLPack -------------------------------------------------------------------------------

    def __dlpack_device__(self) -> tuple[int, int]:
        return (dlpack.DEVICE_TYPES[self.device], 0)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None, **_: Any) -> Any:
        """A DLPack capsule over this tensor's memory (zero copy). The consumer keeps the
        memory alive on its own, even past `release()`."""
        h = self.handle
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"aotrt.Tensor on {self.device} cannot be exported to "
                              f"{tuple(dl_device)}")
        if copy is True:
            raise BufferError("aotrt.Tensor.__dlpack__ does not copy; pass copy=None")
        if h.alloc is not None:
            # NOTE: a full wait: the consumer may write as well as read.
            h.alloc.settle()
        with owner_scope(PROCESS_OWNER):
            ref = shims.new_tensor_handle(h)
        try:
            return dlpack.to_dlpack(ref.address, ref.sizes, ref.strides, ref.dtype, self.device,
                                    ref, lambda: _consumer_done(ref, stream))
        except BaseException:
            _delete_quietly(ref)
            raise

    # -- lifetime -----------------------------------------------------------------------------

    def release(self) -> None:
        """Give up this Tensor's claim on its memory now; safe to call twice."""
        self._finalizer()


def is_tensor(obj: Any) -> bool:
    """True for aotrt.Tensor."""
    return isinstance(obj, Tensor)


__all__ = ["Tensor", "is_tensor"]
