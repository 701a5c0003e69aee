"""The cpu device: 64-byte aligned host memory, an asynchronous stream on a worker thread,
C kernels compiled by the system compiler (cached on disk), numpy for library ops.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import queue
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from aotrt.errors import CompileError, DeviceError, OutOfMemory
from aotrt.kernels import ir
from aotrt.kernels.render_c import CRenderer
from aotrt.runtime import hazards
from aotrt.runtime.device import (Block, Device, KernelFunction, KernelLibrary, Stream,
                                  StreamOptions)
from aotrt.runtime.tensor import Handle

log = logging.getLogger(__name__)

CFLAGS = ("-O3", "-shared", "-fPIC", "-fno-math-errno", "-fno-trapping-math")


def cache_dir() -> Path:
    """Where compiled kernels are cached: $AOTRT_CACHE_DIR, else ~/.cache/aotrt."""
    root = os.environ.get("AOTRT_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "aotrt")
    return Path(root)


def host_array(handle: Handle) -> np.ndarray:
    """A zero-copy numpy view of a host-memory view's elements."""
    if handle.numel == 0 or handle.alloc is None:
        return np.empty(handle.sizes, dtype=handle.dtype.np)
    lo, hi = handle.byte_range()
    buf = (ctypes.c_uint8 * (hi - lo)).from_address(handle.alloc.ptr + lo)
    isz = handle.dtype.itemsize
    return np.ndarray(handle.sizes, dtype=handle.dtype.np, buffer=buf,
                      offset=handle.byte_offset - lo, strides=[s * isz for s in handle.strides])


class CpuStream(Stream):
    """Recorded work runs in order on a worker thread once committed.

    In deferred mode nothing runs until a wait, so a missing wait shows up every time.
    """

    def __init__(self, device: "CpuDevice", options: StreamOptions) -> None:
        super().__init__(device, options)
        self._open: list[Callable[[], None]] = []
        self._deferred: list[list[Callable[[], None]]] = []
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._worker = threading.Thread(target=self._run, name=f"aotrt-cpu-stream-{self.id}",
                                        daemon=True)
        self._worker.start()

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                if batch is None:
                    return
                if self._error is None:
                    for work in batch:
                        work()
            except BaseException as e:  # noqa: BLE001 - reported to the waiter
                self._error = e
            finally:
                self._queue.task_done()

    def _record(self, work: Any) -> None:
        self._open.append(work)

    def _submit(self) -> None:
        batch, self._open = self._open, []
        if self.options.deferred:
            self._deferred.append(batch)
        else:
            self._queue.put(batch)

    def _wait(self) -> None:
        for batch in self._deferred:
            self._queue.put(batch)
        self._deferred.clear()
        self._queue.join()
        if self._error is not None:
            err, self._error = self._error, None
            raise DeviceError(f"cpu stream {self.id}: queued work failed: {err!r}") from err

    def _close(self) -> None:
        self._queue.put(None)
        self._worker.join(timeout=10)

    def _copy_work(self, dst: Handle, src: Handle) -> Any:
        def work() -> None:
            np.copyto(host_array(dst), host_array(src))
        return work

    def _fill_work(self, view: Handle, byte: int) -> Any:
        value = np.frombuffer(bytes([byte]) * view.dtype.itemsize, dtype=view.dtype.np)[0]

        def work() -> None:
            host_array(view)[...] = value
        return work


class CpuKernelFunction(KernelFunction):
    """A C function `k(char **P, int64_t begin, int64_t end)` called through ctypes."""

    def __init__(self, library: "CpuKernelLibrary", kernel: ir.Kernel) -> None:
        super().__init__(library, kernel)
        fn = getattr(library.dll, kernel.name)
        fn.restype = None
        fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64, ctypes.c_int64]
        self._fn = fn

    def _work(self, bound: list[Handle], n: int) -> Any:
        ptrs = (ctypes.c_void_p * max(len(bound), 1))(*[h.address for h in bound])
        fn = self._fn

        def work() -> None:
            fn(ptrs, 0, n)
        return work


class CpuKernelLibrary(KernelLibrary):
    """C source compiled to a shared library once per (compiler, flags, source)."""

    def _compile(self) -> None:
        cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
        if cc is None:
            raise CompileError("no C compiler found (set CC)")
        version = _compiler_version(cc)
        key = hashlib.sha256("\0".join([version, *CFLAGS, self.source]).encode()).hexdigest()
        out = cache_dir() / f"{key[:32]}.so"
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
                src = Path(tmp) / "k.c"
                src.write_text(self.source)
                so = Path(tmp) / "k.so"
                proc = subprocess.run([cc, *CFLAGS, str(src), "-o", str(so), "-lm"],
                                      capture_output=True, text=True)
                if proc.returncode != 0:
                    raise CompileError(f"{cc} failed on {len(self.kernels)} kernel(s)",
                                       proc.stderr + proc.stdout)
                os.replace(so, out)  # atomic: concurrent builders never see half a file
            log.debug("compiled %d kernels into %s", len(self.kernels), out)
        self.path = out
        self.dll = ctypes.CDLL(str(out))

    def _function(self, kernel: ir.Kernel) -> KernelFunction:
        return CpuKernelFunction(self, kernel)


_versions: dict[str, str] = {}


def _compiler_version(cc: str) -> str:
    if cc not in _versions:
        proc = subprocess.run([cc, "--version"], capture_output=True, text=True)
        _versions[cc] = cc + "\n" + proc.stdout
    return _versions[cc]


class CpuDevice(Device):
    """Host memory and host execution behind the device protocol."""

    name = "cpu"
    renderer = CRenderer()

    def _create_stream(self, options: StreamOptions) -> Stream:
        return CpuStream(self, options)

    def _alloc(self, nbytes: int) -> Block:
        try:
            raw = np.empty(nbytes + 64, dtype=np.uint8)
        except MemoryError:
            raise OutOfMemory(f"cpu: cannot allocate {nbytes} bytes") from None
        base = raw.ctypes.data
        ptr = (base + 63) // 64 * 64
        return Block(ptr, nbytes, raw)

    def _free(self, block: Block) -> None:
        # The numpy buffer in block.keep is released with the last reference to the block.
        pass

    def _library(self, kernels: Sequence[ir.Kernel]) -> KernelLibrary:
        return CpuKernelLibrary(self, kernels)

    def read(self, handle: Handle) -> np.ndarray:
        """A host copy of the elements (the caller has waited for pending writes)."""
        if handle.alloc is not None:
            hazards.check_host_access(handle.alloc, False, "read")
        return np.array(host_array(handle), copy=True)

    def write(self, handle: Handle, array: np.ndarray) -> None:
        """Copy `array` into the elements (the caller has waited for pending work)."""
        if handle.alloc is not None:
            hazards.check_host_access(handle.alloc, True, "write")
        np.copyto(host_array(handle), np.asarray(array, dtype=handle.dtype.np))

    def host_view(self, handle: Handle) -> np.ndarray:
        """Zero-copy numpy view of the elements."""
        return host_array(handle)
