"""The cpu work of a float32 GEMM of many rows (a prefill's linear layers) where oneDNN has
no brgemm matmul (AVX2): oneDNN's sgemm on blocks of output columns, the blocks taken
dynamically by the stream's kernel threads in one compiled kernel (gemm.c), a native plan
step.

numpy's OpenBLAS ran them before, from Python between native segments: its own pool of
threads split each call evenly, so a thread whose core another process held stalled the
call (GPT-2's 48 prefill addmm took 262 ms at rest, 1.5 s at a load of 4, 2 cores), and its
threads spun after each call on the cores the kernels' OpenMP threads needed. OpenBLAS
cannot be kept to the calling thread per thread (its pthreads build's
openblas_set_num_threads_local sets the process-wide count), while oneDNN's sgemm, called
inside our parallel region, runs on its calling thread alone; one core of it matched
OpenBLAS's (86-92 GFLOP/s on GPT-2's and the Llama's shapes, AVX2).
"""

from __future__ import annotations

import ctypes
import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from aotrt.errors import CompileError
from aotrt.runtime.backends.cpu import native as cpu_native
from aotrt.runtime.backends.cpu.library import OpSource
from aotrt.runtime.backends.cpu.ops import gemv as cpu_gemv
from aotrt.runtime.ops import _common as c
from aotrt.runtime.tensor import Handle
from aotrt.runtime.work import Work
from aotrt.sources import source

if TYPE_CHECKING:
    from aotrt.runtime.backends.cpu.device import CpuDevice

log = logging.getLogger(__name__)

SYMBOL = "aot_gemm"
#: output columns of one block (the kernel widens it to even the blocks out over the
#: threads): blocks of 32, 64 and 128 and whole calls took the same CPU time on one core
#: (GPT-2's 48 prefill GEMMs 269-276 ms, llama-200m's 84 249-257, AVX2), and small blocks
#: leave less to wait for when another process holds a thread's core
COLUMNS = 64

SOURCE = source(__package__, "gemm.c")


class GemmKernel(OpSource):
    """The device's compiled block-split GEMM (one library: every shape is a parameter)."""

    def __init__(self, device: "CpuDevice") -> None:
        super().__init__(device, SOURCE, [SYMBOL])

    def sgemm(self) -> int:
        """The address of oneDNN's dnnl_sgemm; 0 where oneDNN is not loaded."""
        dnnl = self.device.libraries.dnnl
        if dnnl is None:
            return 0
        try:
            return ctypes.cast(dnnl.lib["dnnl_sgemm"], ctypes.c_void_p).value or 0
        except AttributeError:
            return 0


def _weight(w_nk: tuple[int, int, int, int]) -> tuple[int, int] | None:
    """(ldb, transposed) of w [N, K] at strides (sn, sk) read by oneDNN as B transposed
    (unit stride along K) or as a row-major B (unit stride along N); None for neither."""
    n, k, sn, sk = w_nk
    if (sk == 1 or k == 1) and sn >= k:
        return sn, 1
    if (sn == 1 or n == 1) and sk >= n:
        return sk, 0
    return None


def _dense(bias: Handle, n: int) -> bool:
    """Whether `bias` is `n` floats one after another (the kernel copies it as a row)."""
    if bias.numel != n:
        return False
    return n == 1 or all(st == 1 for size, st in zip(bias.sizes, bias.strides) if size > 1)


def make_gemm(out: Handle, x: Handle, w: Handle, w_nk: tuple[int, int, int, int],
              bias: Handle | None) -> Work | None:
    """The kernel's work of out = x @ w.T (+ bias), `w` seen as [N, K] through `w_nk` (N, K
    and their strides in elements); None where it does not take these views (then the
    caller's numpy path runs)."""
    n, k = w_nk[:2]
    if any(h is not None and h.dtype.name != "float32" for h in (out, x, w, bias)):
        return None
    xr, orow = cpu_gemv._rows(x), cpu_gemv._rows(out)
    if xr is None or orow is None or xr[0] != orow[0] or k < 1 or n < 1 or xr[0] < 1:
        return None
    m = xr[0]
    lda, ldc = (xr[1] if m > 1 else k), (orow[1] if m > 1 else n)
    b = _weight(w_nk)
    if lda < k or ldc < n or b is None:
        return None
    if bias is not None and not _dense(bias, n):
        return None
    # Blocks of out are written while other threads still read x, w and the bias.
    if any(h is not None and c.overlaps(out, h) for h in (x, w, bias)):
        return None
    device = out.device
    kernel = device.libraries.gemm
    sgemm = kernel.sgemm()
    if not sgemm:
        return None
    try:
        loaded = kernel.library()
    except CompileError as e:
        log.debug("no gemm kernel (%s); numpy runs it", e)
        return None
    params = np.array([m, n, k, lda, b[0], b[1], ldc, COLUMNS], np.int64)
    ptrs = (ctypes.c_void_p * 6)(x.address, w.address,
                                 bias.address if bias is not None else None, out.address,
                                 params.ctypes.data, sgemm)
    keep: tuple[Any, ...] = (params,)
    return cpu_native.kernel_work(loaded, SYMBOL, f"gemm {m}x{k}x{n}", ptrs, n, device.worker,
                                  keep=keep)


__all__ = ["COLUMNS", "GemmKernel", "SOURCE", "SYMBOL", "make_gemm"]
