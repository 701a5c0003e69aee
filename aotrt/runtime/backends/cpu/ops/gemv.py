"""The cpu work of a float32 GEMM of a few rows (a decode step's linear layers): one compiled
kernel (cpu_gemv.c) reading the weight once along K, a native plan step.

Where oneDNN has no brgemm matmul (AVX2: `cpu_dnnl.FAST_MATMUL`), mm, addmm and linear ran
on numpy's OpenBLAS: GPT-2's 48 Conv1D addmm layers at one row took 140-148 ms a decode step
on two shared AVX2 cores (2.4 GB/s of weights), where OpenBLAS's two threads met at every
call, and each call went back to Python between native segments. The kernel splits the
weight's rows over the stream's kernel threads in small dynamic chunks (a thread whose core
another process holds takes fewer) and runs in the native plan's C loop.
"""

from __future__ import annotations

import ctypes
import logging
from typing import TYPE_CHECKING

import numpy as np

from aotrt.errors import CompileError
from aotrt.runtime.backends.cpu import native as cpu_native
from aotrt.runtime.backends.cpu.library import OpSource
from aotrt.runtime.ops import _common as c
from aotrt.runtime.tensor import Handle
from aotrt.runtime.work import Work
from aotrt.sources import source

if TYPE_CHECKING:
    from aotrt.runtime.backends.cpu.device import CpuDevice

log = logging.getLogger(__name__)

SYMBOL = "aot_gemv"
#: rows of w a work item covers (the kernel's CB)
ROWS = 16
#: the most rows of x the kernel takes; more are a GEMM for BLAS (prefill)
MAX_ROWS = 8
#: weight bytes below which one thread runs it: a parallel region's wake-up costs more than
#: it saves on a small layer
MIN_PARALLEL_BYTES = 1 << 18

SOURCE = source(__package__, "vec8.h") + source(__package__, "gemv.c")


class GemvKernel(OpSource):
    """The device's compiled few-row GEMM (one library: every shape is a parameter)."""

    def __init__(self, device: "CpuDevice") -> None:
        super().__init__(device, SOURCE, [SYMBOL])


def _rows(h: Handle) -> tuple[int, int] | None:
    """(rows, row stride) of a view whose last dim is unit-stride (or of one element) and
    whose leading dims fold into one; None otherwise."""
    sizes, strides = tuple(h.sizes), tuple(h.strides)
    if not sizes or (sizes[-1] > 1 and strides[-1] != 1):
        return None
    lead = [(n, s) for n, s in zip(sizes[:-1], strides[:-1]) if n != 1]
    for (_, s0), (n1, s1) in zip(lead, lead[1:]):
        if s0 != n1 * s1:
            return None
    rows = int(np.prod([n for n, _ in lead], dtype=np.int64)) if lead else 1
    return rows, (lead[-1][1] if lead else sizes[-1])


def make_gemv(out: Handle, x: Handle, w: Handle, w_nk: tuple[int, int, int], bias: Handle | None
              ) -> Work | None:
    """The kernel's work of out = x @ w.T (+ bias), `w` seen as [N, K] through `w_nk` (N, K,
    the stride between its rows; unit stride along K); None where it does not take these
    views (then the caller's numpy path runs)."""
    n, k, ws = w_nk
    if any(h is not None and h.dtype.name != "float32" for h in (out, x, w, bias)):
        return None
    xr, orow = _rows(x), _rows(out)
    if xr is None or orow is None or xr[0] != orow[0] or xr[0] > MAX_ROWS or k < 1 or n < 1:
        return None
    if bias is not None and (bias.numel != n or _rows(bias) is None):
        return None
    # x is copied into scratch before any output is written; w and the bias are read late.
    if any(h is not None and c.overlaps(out, h) for h in (w, bias)):
        return None
    device = out.device
    try:
        loaded = device.libraries.gemv.library()
    except CompileError as e:
        log.debug("no gemv kernel (%s); numpy runs it", e)
        return None
    m = xr[0]
    items = -(-n // ROWS)
    min_items = -(-MIN_PARALLEL_BYTES // (ROWS * k * 4))
    params = np.array([m, n, k, xr[1], ws, orow[1], min_items], np.int64)
    scratch = np.zeros(m * k + 16, np.float32)
    ptrs = (ctypes.c_void_p * 6)(x.address, w.address,
                                 bias.address if bias is not None else None, out.address,
                                 params.ctypes.data, scratch.ctypes.data)
    label = f"gemv {m}x{k}x{n}"
    return cpu_native.kernel_work(loaded, SYMBOL, label, ptrs, items, device.worker,
                                  keep=(params, scratch))


__all__ = ["GemvKernel", "MAX_ROWS", "ROWS", "SOURCE", "make_gemv"]
