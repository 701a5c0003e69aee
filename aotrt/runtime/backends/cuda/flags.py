"""The error flag of a cuda kernel library: one int in page-locked host memory, mapped into
the device, that the library's kernels store an error code into (an index out of range,
render_cuda's `aot_err`). A stream reads the flags of the libraries whose kernels it ran
after each wait it already makes (CudaStream._wait): the check adds no synchronisation."""

from __future__ import annotations

import ctypes
import logging
from typing import Any

from aotrt.errors import DeviceError

log = logging.getLogger(__name__)

try:
    from cuda.bindings import driver as _drv
except Exception:  # noqa: BLE001 - the cuda device says it is unavailable (device.py)
    _drv = None

#: bytes allocated for one flag (a cache line: kernels of no other flag share it)
FLAG_BYTES = 64


def _ok(result: Any, what: str) -> Any:
    """The values of a cuda.bindings (err, *values) result; DeviceError on an error."""
    if int(result[0]) != 0:
        raise DeviceError(f"cuda: {what} failed: {result[0]}")
    return result[1:]


class ErrorFlag:
    """One kernel library's flag: `device_ptr` is what its kernels get, `take` reads and
    clears it. Owned by the library and by every stream its kernels were queued on (a
    stream lets it go at a wait after the library closed), freed with the last owner."""

    def __init__(self) -> None:
        flags = _drv.CU_MEMHOSTALLOC_DEVICEMAP | _drv.CU_MEMHOSTALLOC_PORTABLE
        self._host = int(_ok(_drv.cuMemHostAlloc(FLAG_BYTES, flags), "kernel error flag")[0])
        try:
            self.device_ptr = int(_ok(_drv.cuMemHostGetDevicePointer(self._host, 0),
                                      "kernel error flag's device address")[0])
        except BaseException:
            _drv.cuMemFreeHost(self._host)
            self._host = 0
            raise
        ctypes.memset(self._host, 0, FLAG_BYTES)
        self._value = ctypes.c_int32.from_address(self._host)
        res = _drv.cuCtxGetCurrent()
        self._ctx = res[1] if int(res[0]) == 0 else None
        #: set when the library closes: no new launch will write the flag
        self.retired = False

    def take(self) -> int:
        """The code stored since the last take (0: none), cleared. Call it only where no
        kernel of the library can still run (after a wait that covers them)."""
        code = self._value.value
        if code:
            self._value.value = 0
        return code

    def _free(self) -> None:
        if not self._host:
            return
        pushed = self._ctx is not None and int(_drv.cuCtxPushCurrent(self._ctx)[0]) == 0
        try:
            err = _drv.cuMemFreeHost(self._host)[0]
            if int(err) != 0:
                log.warning("cuda: freeing a kernel error flag failed: %s", err)
        finally:
            if pushed:
                _drv.cuCtxPopCurrent()
        self._host = 0

    def __del__(self) -> None:
        try:
            self._free()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def take_error(flags: set[ErrorFlag]) -> str:
    """What the kernels of `flags` reported since the last call ("" if nothing): every flag
    read and cleared, and those of closed libraries let go. Call it only after a wait that
    covers their kernels: a flag lives in host memory, so reading it needs no sync of its
    own."""
    code = 0
    for flag in list(flags):
        code = flag.take() or code
        if flag.retired:
            flags.discard(flag)
    if not code:
        return ""
    from aotrt.kernels.render_c import KERNEL_ERRORS

    return f"a kernel failed: {KERNEL_ERRORS.get(code, f'error code {code}')}"


__all__ = ["ErrorFlag", "FLAG_BYTES", "take_error"]
