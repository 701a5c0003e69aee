"""Row softmax for the cpu device's library ops (attention's scores), as one generated C
kernel: rows split over the stream's threads, each row's loops vectorised with inline exp.

numpy's softmax is five single-threaded passes over the scores (max, subtract, exp, sum,
divide): 120 ms of each Whisper-tiny encoder attention (6 heads of 1500 x 1500) on two
cores, where its two GEMMs take about 40 (bench/profile_cpu.py, 2026-12-02).
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING

import numpy as np

from aotrt.errors import InvalidArgument
from aotrt.kernels import ir

if TYPE_CHECKING:
    from aotrt.runtime.backends.cpu.device import CpuDevice

#: a fully masked row (max -inf) is shifted by this instead, so exp() gives 0, not NaN ...
_LOWEST = -3.0e38
#: ... and its sum of 0 is divided as this, so the row comes out as zeros (torch's "safe"
#: softmax); a row with a finite max sums to at least 1, which this never changes
_TINY = 1e-30


def softmax_kernels(rows: int, cols: int) -> tuple[ir.Kernel, ir.Kernel]:
    """The row softmax as two passes, float32: w = exp(x - max(x)), then w = w * (1 /
    sum(w)). Each element's exp is taken once (one kernel computing exp(x - max) / sum
    computes it twice: once for the sum, once for the store, half of Whisper-tiny's
    softmax time), and the division is one per row, as in torch's vectorised softmax."""
    idx = ir.strided_index((cols, 1), (0, 1))            # dim 1 is the reduce dim
    x = ir.Load(0, idx, "float32")
    top = ir.Op("maximum", (ir.Reduce("max", x, "float32"), ir.const(_LOWEST, "float32")),
                "float32")
    e = ir.Op("exp", (ir.Op("sub", (x, top), "float32"),), "float32")
    exp_pass = ir.Kernel(f"row_softmax_exp_{rows}x{cols}", (rows,), (cols,),
                         (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                         (ir.Store(1, idx, e),))
    y = ir.Load(0, idx, "float32")
    total = ir.Op("maximum", (ir.Reduce("sum", y, "float32"), ir.const(_TINY, "float32")),
                  "float32")
    inv = ir.Op("div", (ir.const(1.0, "float32"), total), "float32")
    scale_pass = ir.Kernel(f"row_softmax_scale_{rows}x{cols}", (rows,), (cols,),
                           (ir.Arg("float32", "rw"),),
                           (ir.Store(0, idx, ir.Op("mul", (y, inv), "float32")),))
    return exp_pass, scale_pass


class RowSoftmax:
    """The compiled softmax of up to `rows` rows of `cols` float32 values."""

    def __init__(self, device: "CpuDevice", rows: int, cols: int) -> None:
        self.rows, self.cols = rows, cols
        kernels = softmax_kernels(rows, cols)
        self._device = device
        self._library = device.kernel_library(list(kernels))
        self._symbols = [self._library.symbol(k.name) for k in kernels]
        self._label = f"softmax {rows}x{cols}"

    def __call__(self, src: np.ndarray, dst: np.ndarray) -> None:
        """dst = softmax(src) along the last dim; both C-contiguous float32 (n, cols), n <=
        rows, and `dst` may be `src` itself; runs on the calling thread (a stream's worker)
        with that stream's threads."""
        for name, a in (("src", src), ("dst", dst)):
            if a.dtype != np.float32 or not a.flags.c_contiguous or a.ndim < 1 or \
                    a.shape[-1] != self.cols or a.size // max(self.cols, 1) > self.rows:
                raise InvalidArgument(f"{self._label}: {name} {a.dtype} {a.shape} is not a "
                                      f"C-contiguous float32 block of rows of {self.cols}")
        if src.shape != dst.shape:
            raise InvalidArgument(f"{self._label}: src {src.shape} and dst {dst.shape} differ")
        if dst.ctypes.data != src.ctypes.data and np.shares_memory(src, dst):
            raise InvalidArgument(f"{self._label}: src and dst overlap without being equal")
        n = src.size // max(self.cols, 1)
        threads = getattr(self._device.worker, "threads", 1)
        loaded = self._library.loaded
        loaded.call(self._symbols[0], self._label,
                    (ctypes.c_void_p * 2)(src.ctypes.data, dst.ctypes.data), n, threads)
        loaded.call(self._symbols[1], self._label, (ctypes.c_void_p * 1)(dst.ctypes.data), n,
                    threads)

    def close(self) -> None:
        """Let the compiled library go."""
        self._library.close()


class SoftmaxCache:
    """The cpu device's compiled row softmaxes, by shape (a device's state, as its oneDNN
    primitives are)."""

    def __init__(self, device: "CpuDevice") -> None:
        self._device = device
        self._lock = threading.Lock()
        self._made: dict[tuple[int, int], RowSoftmax] = {}

    def get(self, rows: int, cols: int) -> RowSoftmax:
        """The softmax for blocks of up to `rows` rows of `cols` (compiled once, cached)."""
        with self._lock:
            sm = self._made.get((rows, cols))
            if sm is None:
                sm = self._made[(rows, cols)] = RowSoftmax(self._device, rows, cols)
            return sm

    def shapes(self) -> list[tuple[int, int]]:
        """The (rows, cols) compiled so far."""
        with self._lock:
            return list(self._made)

    def close(self) -> None:
        """Let the compiled libraries go."""
        with self._lock:
            for sm in self._made.values():
                sm.close()
            self._made.clear()


__all__ = ["RowSoftmax", "SoftmaxCache", "softmax_kernels"]
