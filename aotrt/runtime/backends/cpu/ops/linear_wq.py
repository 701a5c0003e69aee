"""The cpu work of linear_wq: a compiled kernel for a few rows, numpy for many.

A decode step (up to FUSED_MAX_ROWS rows) reads each packed weight once in one C kernel
(cpu_linear_wq.c): int8 or int4 values widened to float in vector registers, each column's
dot products in float32, scales applied per row (int8) or per group (int4, with the zero
points through each group's sum of x), so the weights' bytes are what it reads: a quarter
(int8) or an eighth (int4) of float32's. More rows (prefill) dequantize a block of weight
rows at a time into float32 and multiply it through numpy's BLAS, where the GEMM's own
work outweighs the dequantization. Either path gives the float32 result of the dequantized
weights, rounded once to out's dtype.

oneDNN 3.2 (the installed onednn-cpu-gomp) has no weight decompression in its matmul
(that came in 3.3 and 3.4, for brgemm on AVX-512 and AMX), so it is not used here.
"""

from __future__ import annotations

import ctypes
import logging
import math
from typing import TYPE_CHECKING, Callable

import numpy as np

from aotrt.errors import CompileError
from aotrt.runtime.backends.cpu import native as cpu_native
from aotrt.runtime.backends.cpu.library import OpSource
from aotrt.runtime.ops import _common as c
from aotrt.runtime.ops.linear_wq import FUSED_MAX_ROWS, dense, rows_of
from aotrt.runtime.tensor import Handle, host_array
from aotrt.runtime.work import Work
from aotrt.sources import source

if TYPE_CHECKING:
    from aotrt.runtime.backends.cpu.device import CpuDevice

log = logging.getLogger(__name__)

SYMBOL = "aot_linear_wq"
#: output columns a work item covers (the kernel's CB)
COLUMNS = 16
#: groups a row may have on the fused path (the kernel keeps a row's scales on its stack)
MAX_GROUPS = 1024
#: the kernel's dtype codes
CODES = {"float32": 0, "bfloat16": 1, "float16": 2}

SOURCE = source(__package__, "vec8.h") + (
    source(__package__, "linear_wq.c").replace("MAX_GROUPS", str(MAX_GROUPS))
    .replace("COLUMNS", str(COLUMNS)))


class LinearWqKernel(OpSource):
    """The device's compiled linear_wq kernel (one library: every shape is a parameter)."""

    def __init__(self, device: "CpuDevice") -> None:
        super().__init__(device, SOURCE, [SYMBOL])


def make_linear_wq(out: Handle, x: Handle, qweight: Handle, scales: Handle,
                   zeros: Handle | None, bias: Handle | None, bits: int,
                   group_size: int) -> Callable[[], None]:
    """The cpu work of linear_wq (arguments validated by check_linear_wq)."""
    fused = _fused(out, x, qweight, scales, zeros, bias, bits, group_size)
    if fused is not None:
        return fused
    return _numpy(out, x, qweight, scales, zeros, bias, bits, group_size)


def _fused(out: Handle, x: Handle, qweight: Handle, scales: Handle, zeros: Handle | None,
           bias: Handle | None, bits: int, group_size: int) -> Work | None:
    """The compiled kernel's work, or None where it does not take these views."""
    n, k = qweight.sizes[0], x.sizes[-1]
    groups = k // group_size if bits == 4 else 1
    xr, orow = rows_of(x), rows_of(out)
    if xr is None or orow is None or xr[1] > FUSED_MAX_ROWS or groups > MAX_GROUPS:
        return None
    if not all(dense(h) for h in (qweight, scales, zeros, bias)):
        return None
    # x is converted into scratch before any output is written; the others are read late.
    if any(h is not None and c.overlaps(out, h) for h in (qweight, scales, zeros, bias)):
        return None
    device = out.device
    try:
        loaded = device.libraries.linear_wq.library()
    except CompileError as e:
        log.debug("no linear_wq kernel (%s); numpy runs it", e)
        return None
    m = xr[1]
    params = np.array([m, n, k, groups, group_size, bits, xr[0], orow[0], CODES[x.dtype.name],
                       CODES[scales.dtype.name],
                       CODES[bias.dtype.name] if bias is not None else 0,
                       CODES[out.dtype.name]], np.int64)
    # x as float32 (regrouped for int4) and each group's sum of x, for this work alone.
    scratch = np.zeros(m * k + m * groups + 16, np.float32)
    ptrs = (ctypes.c_void_p * 8)(x.address, qweight.address, scales.address,
                                 zeros.address if zeros is not None else None,
                                 bias.address if bias is not None else None, out.address,
                                 params.ctypes.data, scratch.ctypes.data)
    items = -(-n // COLUMNS)
    label = f"linear_wq int{bits} {m}x{k}x{n}"
    return cpu_native.kernel_work(loaded, SYMBOL, label, ptrs, items, device.worker,
                                  keep=(params, scratch))


def dequantize_rows(q: np.ndarray, s: np.ndarray, z: np.ndarray | None, bits: int,
                    group_size: int) -> np.ndarray:
    """float32 [rows, K] weights of packed rows `q` with their float32 scales (and zeros)."""
    if bits == 8:
        w = q.astype(np.float32)
        w *= s.reshape(-1, 1)
        return w
    rows, half = q.shape
    vals = np.empty((rows, 2 * half), np.uint8)
    vals[:, 0::2] = q & 15
    vals[:, 1::2] = q >> 4
    w = vals.astype(np.float32).reshape(rows, 2 * half // group_size, group_size)
    w -= z[:, :, None]
    w *= s[:, :, None]
    return w.reshape(rows, 2 * half)


def _numpy(out: Handle, x: Handle, qweight: Handle, scales: Handle, zeros: Handle | None,
           bias: Handle | None, bits: int, group_size: int) -> Callable[[], None]:
    """Blocks of weight rows dequantized into float32, each multiplied through BLAS."""
    n, k = qweight.sizes[0], x.sizes[-1]
    block = c.rows_per_chunk(9 * k, n)
    blas = c.blas_scope(out.device.libraries.dnnl)

    def work() -> None:
        xv = c.load_f32(host_array(x))
        lead = xv.shape[:-1]
        x2 = xv.reshape(math.prod(lead), k)
        q = host_array(qweight)
        s = c.load_f32(host_array(scales))
        z = c.load_f32(host_array(zeros)) if zeros is not None else None
        res = np.empty((x2.shape[0], n), np.float32)
        for n0 in range(0, n, block):
            n1 = min(n, n0 + block)
            w = dequantize_rows(q[n0:n1], s[n0:n1], None if z is None else z[n0:n1], bits,
                                group_size)
            with blas():
                res[:, n0:n1] = x2 @ w.T
        if bias is not None:
            res += c.load_f32(host_array(bias))
        # res is a fresh temporary, so an out that overlaps an input is still right.
        c.store(host_array(out), res.reshape(lead + (n,)))
    return work


__all__ = ["COLUMNS", "LinearWqKernel", "MAX_GROUPS", "SOURCE", "dequantize_rows",
           "make_linear_wq"]
