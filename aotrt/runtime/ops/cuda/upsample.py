"""Nearest upsampling on cuda: a gather through source-index arrays kept on the device."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from aotrt.errors import DeviceError
from aotrt.runtime.ops.cuda.common import Work, _blas_lock, _launch
from aotrt.runtime.tensor import Handle

if TYPE_CHECKING:
    from aotrt.runtime.devices.cuda import CudaDevice


def make_upsample(out: Handle, x: Handle, rows: np.ndarray, cols: np.ndarray) -> Work:
    """Nearest upsampling as a gather through the op's own source-index arrays (uploaded
    once per distinct array and kept on the device)."""
    dev = out.device
    n, c, h, w = x.sizes
    ho, wo = out.sizes[2:]
    args = [x.address, out.address, _index_buffer(dev, rows), _index_buffer(dev, cols), n, c,
            h, w, ho, wo, *x.strides, *out.strides]
    return _launch(dev, f"aot_upsample{x.dtype.itemsize}", n * c * ho * wo, args)


_index_buffers: dict[tuple[int, bytes], Any] = {}


def _index_buffer(dev: "CudaDevice", arr: np.ndarray) -> int:
    """Device address of an int64 copy of `arr` (cached; small and immutable)."""
    from cuda.bindings import driver

    data = np.ascontiguousarray(arr, dtype=np.int64)
    key = (id(dev), data.tobytes())
    with _blas_lock:
        buf = _index_buffers.get(key)
        if buf is None:
            dev.ensure_current()
            buf = dev.core.allocate(max(data.nbytes, 8), stream=dev._alloc_stream)
            dev._alloc_stream.sync()
            err = driver.cuMemcpyHtoD(int(buf.handle), data.ctypes.data, data.nbytes)[0]
            if int(err) != 0:
                raise DeviceError(f"cuda: upload of upsample indices failed: {err}")
            _index_buffers[key] = buf
        return int(buf.handle)
