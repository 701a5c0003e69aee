"""The cuda device's library state: one object per device (`CudaDevice.libraries`) that holds
what the library ops keep between calls: the cuBLASLt and cuDNN handles with their plan
caches, and the small device buffers the own kernels read (upsampling's source indices).

Each op module defines the class of its own state; `state(cls)` makes the device's one
instance on first use. Nothing is keyed by a device's address, and the memory the state
holds comes from the device's `Memory`, under an owner of the device's own, so no
delegate's destroy can free it.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import numpy as np

from aotrt.runtime import shims
from aotrt.runtime.memory import Owner, owner_scope

if TYPE_CHECKING:
    from aotrt.runtime.backends.cuda.device import CudaDevice

log = logging.getLogger(__name__)

T = TypeVar("T")


class CudaLibraries:
    """The library state of one cuda device."""

    def __init__(self, device: "CudaDevice") -> None:
        self.device = device
        #: owns the memory of library state (index buffers); lives as long as the device
        self.owner = Owner(f"{device.name} libraries")
        self._states: dict[type, Any] = {}
        self._buffers: dict[bytes, Any] = {}
        # Re-entrant: a state's constructor may ask for another state or a buffer.
        self._lock = threading.RLock()

    def state(self, cls: Callable[["CudaDevice"], T]) -> T:
        """The device's one instance of `cls`, made as cls(device) on first use."""
        with self._lock:
            got = self._states.get(cls)  # type: ignore[arg-type]
            if got is None:
                self.device.ensure_current()
                got = self._states[cls] = cls(self.device)  # type: ignore[index]
            return got

    def int64_buffer(self, values: np.ndarray) -> int:
        """Device address of an immutable int64 copy of `values`, uploaded once per distinct
        content and kept for the device's lifetime."""
        data = np.ascontiguousarray(values, dtype=np.int64).reshape(-1)
        key = data.tobytes()
        with self._lock:
            h = self._buffers.get(key)
            if h is None:
                from aotrt import dtypes

                with owner_scope(self.owner):
                    h = shims.empty_strided([max(data.size, 1)], [1], dtypes.int64,
                                            self.device)
                if data.size:
                    self.device.write(h, data)
                self._buffers[key] = h
            return h.address


#: cuDNN frontend data type names of the float dtypes
DNN_TYPES = {"float32": "FLOAT", "float16": "HALF", "bfloat16": "BFLOAT16"}


class Dnn:
    """The device's cuDNN handle and its graphs cached by shape (device.libraries state);
    `available` is False where the frontend or the library is missing."""

    def __init__(self, device: "CudaDevice") -> None:
        self.device = device
        self.graphs: dict[tuple, Any] = {}
        self.lock = threading.Lock()
        self.available = False
        self._tuning: Any = None
        try:
            import cudnn

            self.cudnn = cudnn
            self.handle = cudnn.create_handle()
            self.available = True
        except Exception as e:  # noqa: BLE001 - no cuDNN: the im2col path serves
            log.info("cuDNN is not available (%r): convolutions use im2col + GEMM, attention "
                     "two GEMMs", e)

    def tuning_stream(self) -> Any:
        """A stream of the device's own, on which graphs are timed at load (ops/tf32.py)
        apart from every delegate's work; made on first use."""
        if self._tuning is None or self._tuning.closed:
            from aotrt.runtime.options import StreamOptions

            self._tuning = self.device.create_stream(StreamOptions())
        return self._tuning


__all__ = ["DNN_TYPES", "CudaLibraries", "Dnn"]
