"""The cpu device's library state: `CpuDevice.libraries` holds what the library ops keep
between calls (oneDNN's engine and primitive cache, the ops' own compiled C: softmaxes, max
pools, fused attention, Winograd, activations, the quantized linear, GEMV and GEMM, and the C loop
of native plans and stream queues), and `CpuDevice.openmp` the OpenMP runtime they run on.

Each part is made on first use and lives as long as the device: nothing is keyed by a
device's address, and no delegate's close frees any of it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from aotrt.errors import AotrtError
from aotrt.runtime.backends.cpu import native as cpu_native
from aotrt.runtime.backends.cpu import queue as cpu_queue
from aotrt.runtime.backends.cpu.library import LoadedLibrary

if TYPE_CHECKING:
    from aotrt.runtime.backends.cpu.device import CpuDevice
    from aotrt.runtime.backends.cpu.dnnl import Dnnl
    from aotrt.runtime.backends.cpu.ops.activation import Activation
    from aotrt.runtime.backends.cpu.ops.attention import FusedAttention
    from aotrt.runtime.backends.cpu.ops.gemm import GemmKernel
    from aotrt.runtime.backends.cpu.ops.gemv import GemvKernel
    from aotrt.runtime.backends.cpu.ops.linear_wq import LinearWqKernel
    from aotrt.runtime.backends.cpu.ops.pool import PoolKernels
    from aotrt.runtime.backends.cpu.ops.softmax import SoftmaxCache
    from aotrt.runtime.backends.cpu.ops.winograd import Winograd

log = logging.getLogger(__name__)

#: the OpenMP runtimes -fopenmp code may link (gcc's, llvm's), by soname
OPENMP_RUNTIMES = ("libgomp.so.1", "libomp.so", "libomp.so.5", "libiomp5.so")

_UNSET = object()   # CpuLibraries._dnnl before its first use


class OpenMP:
    """The OpenMP runtime that oneDNN and the compiled kernels run on, kept mapped for good
    once a library has loaded it."""

    def __init__(self) -> None:
        self._lib: ctypes.CDLL | None = None

    def set_threads(self, n: int) -> None:
        """Give the calling thread's OpenMP parallel regions (oneDNN's) `n` threads."""
        lib = self._runtime()
        if lib is not None:
            lib.omp_set_num_threads(ctypes.c_int(max(int(n), 1)))

    def max_threads(self) -> int:
        """The calling thread's OpenMP thread count (0 where no runtime loads)."""
        lib = self._runtime()
        return int(lib.omp_get_max_threads()) if lib is not None else 0

    @contextlib.contextmanager
    def scope(self, n: int) -> Iterator[None]:
        """The calling thread's OpenMP thread count set to `n` for the block (0: as it is)."""
        before = self.max_threads() if n > 0 else 0
        if before == 0:
            yield
            return
        self.set_threads(n)
        try:
            yield
        finally:
            self.set_threads(before)

    def pin(self) -> None:
        """Keep the OpenMP runtime a kernel library pulled in mapped for good.

        Its pool threads outlive every parallel region; if closing the last kernel library
        unmapped the runtime, they would wake up in unmapped code (a crash).
        """
        self._runtime(load=False)

    def _runtime(self, load: bool = True) -> ctypes.CDLL | None:
        """The runtime, kept mapped for good; `load` False: only one a library already
        loaded."""
        if self._lib is None:
            mode = os.RTLD_NOW | os.RTLD_NODELETE | (0 if load else os.RTLD_NOLOAD)
            for name in OPENMP_RUNTIMES:
                try:
                    self._lib = ctypes.CDLL(name, mode=mode)
                    break
                except OSError:
                    continue
        return self._lib


class CpuLibraries:
    """The library state of one cpu device, each part made on first use."""

    def __init__(self, device: "CpuDevice") -> None:
        self.device = device
        self._dnnl: Any = _UNSET
        self._dnnl_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._softmaxes: Any = None
        self._pools: Any = None
        self._attention: Any = None
        self._winograd: Any = None
        self._activation: Any = None
        self._linear_wq: Any = None
        self._gemv: Any = None
        self._gemm: Any = None
        self._native: Any = None

    @property
    def dnnl(self) -> "Dnnl | None":
        """The device's oneDNN state (engine, primitive cache), made on first use; None where
        oneDNN is not installed (library ops then use numpy)."""
        with self._dnnl_lock:
            if self._dnnl is _UNSET:
                from aotrt.runtime.backends.cpu import dnnl as cpu_dnnl

                self._dnnl = cpu_dnnl.create(self.device)
            return self._dnnl

    def _once(self, attr: str, make: Callable[[], Any]) -> Any:
        """The op state held in `attr`, made by `make` on first use (one lock for all)."""
        with self._state_lock:
            if getattr(self, attr) is None:
                setattr(self, attr, make())
            return getattr(self, attr)

    @property
    def softmaxes(self) -> "SoftmaxCache":
        """The compiled row softmaxes (ops/softmax.py)."""
        from aotrt.runtime.backends.cpu.ops.softmax import SoftmaxCache

        return self._once("_softmaxes", lambda: SoftmaxCache(self.device))

    @property
    def pools(self) -> "PoolKernels":
        """The compiled max pools (ops/pool.py)."""
        from aotrt.runtime.backends.cpu.ops.pool import PoolKernels

        return self._once("_pools", lambda: PoolKernels(self.device))

    @property
    def attention(self) -> "FusedAttention":
        """The compiled fused attention (ops/attention.py)."""
        from aotrt.runtime.backends.cpu.ops.attention import FusedAttention

        return self._once("_attention", lambda: FusedAttention(self.device))

    @property
    def winograd(self) -> "Winograd":
        """The compiled Winograd transforms (ops/winograd.py)."""
        from aotrt.runtime.backends.cpu.ops.winograd import Winograd

        return self._once("_winograd", lambda: Winograd(self.device))

    @property
    def activation(self) -> "Activation":
        """The compiled in-place relu and relu6 (ops/activation.py)."""
        from aotrt.runtime.backends.cpu.ops.activation import Activation

        return self._once("_activation", lambda: Activation(self.device))

    @property
    def linear_wq(self) -> "LinearWqKernel":
        """The compiled weight-only quantized linear (ops/linear_wq.py)."""
        from aotrt.runtime.backends.cpu.ops.linear_wq import LinearWqKernel

        return self._once("_linear_wq", lambda: LinearWqKernel(self.device))

    @property
    def gemv(self) -> "GemvKernel":
        """The compiled float32 GEMM of a few rows (ops/gemv.py)."""
        from aotrt.runtime.backends.cpu.ops.gemv import GemvKernel

        return self._once("_gemv", lambda: GemvKernel(self.device))

    @property
    def gemm(self) -> "GemmKernel":
        """The compiled float32 GEMM of many rows on oneDNN's sgemm (ops/gemm.py)."""
        from aotrt.runtime.backends.cpu.ops.gemm import GemmKernel

        return self._once("_gemm", lambda: GemmKernel(self.device))

    def c_library(self, source: str, symbols: Sequence[str]) -> LoadedLibrary:
        """An op's own C source (ops/attention.py, ...), built once through the device's
        kernel cache and loaded; `symbols` are its kernels, each called as generated kernels
        are."""
        path = self.device.cache.build_so(source, [*symbols, "aotrt_error"], len(symbols))
        loaded = LoadedLibrary(path)
        self.device.openmp.pin()
        return loaded

    def native_runner(self) -> LoadedLibrary:
        """The C loop of native plans and the streams' queues (native.py, queue.py), built
        and loaded on first use."""
        return self._once("_native", lambda: self.c_library(
            cpu_native.SOURCE + cpu_queue.SOURCE, [cpu_native.SYMBOL, *cpu_queue.SYMBOLS]))

    def native_queue(self) -> cpu_queue.NativeQueue | None:
        """A new stream queue in C; None where the runner cannot be built (no compiler):
        the stream then keeps a Python queue."""
        try:
            return cpu_queue.NativeQueue(self.native_runner())
        except (AotrtError, OSError) as e:
            log.debug("cpu stream: no native queue (%s); a Python one", e)
            return None


__all__ = ["OPENMP_RUNTIMES", "CpuLibraries", "OpenMP"]
