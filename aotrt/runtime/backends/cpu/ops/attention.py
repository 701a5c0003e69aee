"""Fused attention for the cpu device: one compiled C kernel (flash attention's blocking)
for float32 scaled dot-product attention without a mask, with the causal one, or with a bool
mask (a language model's decode and prefill steps).

Each thread takes blocks of 64 query rows of one head, keeps the block's scores (64 x 128
keys at a time) in its cache, and folds them into its output rows with an online softmax,
so no score matrix is written to memory and no Python runs per block. The keys of a head
are packed transposed once per thread and head. The scores' and the output's products run
in vector-extension registers (16 floats: AVX-512 where the kernel cache may use the CPU's
own features, narrower vectors elsewhere) and are allowed to fuse multiply and add, which
the elementwise kernels are not: attention's result is compared with eager by tolerance,
not bit for bit.

Whisper-tiny's encoder attention (6 heads of 1500 x 1500, head dim 64) took 28-30 ms a
layer through two oneDNN GEMMs and a compiled softmax over a materialised 6 x 1500 x 1500
score matrix (2 cores, AVX-512; bench/profile_cpu.py, 2026-12-04).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from aotrt.errors import DeviceError
from aotrt.kernels.math_c import MATH_C
from aotrt.runtime.backends.cpu import native as cpu_native
from aotrt.runtime.backends.cpu.library import OpSource
from aotrt.runtime.ops import _common as c
from aotrt.runtime.backends.cpu.dnnl_primitives import aligned
from aotrt.runtime.work import Work
from aotrt.sources import source

if TYPE_CHECKING:
    from aotrt.runtime.backends.cpu.device import CpuDevice
    from aotrt.runtime.tensor import Handle

#: query rows and keys per block (the kernel's BM and BN)
ROWS, KEYS = 64, 128
#: the head dims the kernel takes: value head dims in whole vectors of 16 floats, at most
#: MAX_EV (its accumulators are 4 rows x 4 vectors at a time)
MAX_E, MAX_EV = 512, 256
#: the int64 parameter block's length (a[0] .. a[24] in the kernel)
_NPARAMS = 25

SYMBOL = "aot_attention_f32"

SOURCE = source(__package__, "attention.c").replace(
    '#include "../../../../kernels/math_c.h"', MATH_C)


def takes(out: "Handle", q: "Handle", k: "Handle", v: "Handle", mask: "Handle | None",
          groups: int) -> bool:
    """Whether the fused kernel takes this attention: float32 (B, H, L, E) views (or
    (H, L, E)) with unit stride along the head dims, k and v of H / groups heads, no mask or
    a bool one that broadcasts to the scores, head dims the kernel has registers for, and
    no zero-length dim."""
    hs = (out, q, k, v)
    if any(h.dtype.name != "float32" for h in hs):
        return False
    if mask is not None and (mask.dtype.name != "bool" or c.overlaps(out, mask)
                             or _mask_strides(mask, out, k.sizes[-2]) is None):
        return False
    if not all(h.ndim == q.ndim for h in hs) or q.ndim not in (3, 4):
        return False
    if any(h.strides[-1] != 1 or 0 in h.sizes for h in hs):
        return False
    if any(c.overlaps(out, h) for h in (q, k, v)):
        return False        # rows written while other threads still read them
    b, hq, lq, e = (1, *q.sizes) if q.ndim == 3 else q.sizes
    kb = (1, *k.sizes[:-2]) if k.ndim == 3 else k.sizes[:-2]
    vb = (1, *v.sizes[:-2]) if v.ndim == 3 else v.sizes[:-2]
    ob = (1, *out.sizes[:-2]) if out.ndim == 3 else out.sizes[:-2]
    ev = v.sizes[-1]
    return (tuple(kb) == tuple(vb) == (b, hq // groups) and tuple(ob) == (b, hq)
            and hq % groups == 0 and out.sizes[-2:] == (lq, ev) and k.sizes[-1] == e
            and e <= MAX_E and ev % 16 == 0 and ev <= MAX_EV)


def _mask_strides(mask: "Handle", out: "Handle", s: int
                  ) -> tuple[int, int, int, int] | None:
    """The (batch, head, row, key) strides in elements of a mask read as broadcast to the
    scores (B, H, L, S) of `out` (B, H, L, EV) (or (H, L, EV)) over `s` keys, 0 along a dim
    of size 1; None where it does not broadcast so."""
    b, h, lq = (1, *out.sizes[:2]) if out.ndim == 3 else tuple(out.sizes[:3])
    if mask.ndim > 4 or mask.ndim < 1:
        return None
    pad = 4 - mask.ndim
    sizes, strides = (1,) * pad + tuple(mask.sizes), (0,) * pad + tuple(mask.strides)
    res = []
    for n, st, want in zip(sizes, strides, (b, h, lq, s)):
        if n not in (1, want):
            return None
        res.append(0 if n == 1 else st)
    return res[0], res[1], res[2], res[3]


def _strides3(h: "Handle") -> tuple[int, int, int]:
    """(batch, head, row) strides in elements, a missing batch dim as 0."""
    return (0, *h.strides[:2]) if h.ndim == 3 else tuple(h.strides[:3])


class FusedAttention(OpSource):
    """The device's compiled attention kernel (one library: every shape is a parameter)."""

    def __init__(self, device: "CpuDevice") -> None:
        super().__init__(device, SOURCE, [SYMBOL])

    def work(self, out: "Handle", q: "Handle", k: "Handle", v: "Handle", is_causal: bool,
             scale: float, groups: int, mask: "Handle | None" = None) -> Callable[[], None]:
        """The work computing attention into `out` (views checked by `takes`), with a
        native form; parameters and scratch sizes are fixed now."""
        loaded = self.library()
        b, hq, lq, e = (1, *q.sizes) if q.ndim == 3 else q.sizes
        s, ev = k.sizes[-2], v.sizes[-1]
        per_thread = scratch_bytes(q, k, v, 1)
        params = np.zeros(_NPARAMS, np.int64)
        params[:8] = (b, hq, lq, s, e, ev, groups, int(is_causal))
        params[8:20] = (*_strides3(q), *_strides3(k), *_strides3(v), *_strides3(out))
        params[20] = per_thread
        if mask is not None:
            ms = _mask_strides(mask, out, s)
            if ms is None:              # takes() declines such masks before this is made
                raise DeviceError(f"cpu attention: a mask of strides {list(mask.strides)} "
                                  f"reached the fused kernel, which cannot read it")
            params[21:25] = ms
        fscale = np.array([scale], np.float64)
        items = b * hq * -(-lq // ROWS)
        label = f"attention {b}x{hq}x{lq}x{s}x{e}"
        device = self.device

        def pointers(scratch: int) -> Any:
            return (ctypes.c_void_p * 8)(q.address, k.address, v.address, out.address,
                                         params.ctypes.data, fscale.ctypes.data, scratch,
                                         mask.address if mask is not None else None)

        def run() -> None:
            threads = max(1, getattr(device.worker, "threads", 1))
            scratch = device.worker.scratch(per_thread * min(threads, items))
            loaded.call(SYMBOL, label, pointers(scratch.ctypes.data), items, threads)

        def native() -> cpu_native.Native:
            # A native step keeps its own scratch: the worker's kept one may be replaced by
            # a larger one later. Run from Python, GPT-2's 12 decode attentions cost 2.5 ms
            # a step (0.2 ms each, mostly the way back into Python and out) against
            # 0.03 ms of kernel (2 cores, AVX2).
            threads = max(1, getattr(device.worker, "threads", 1))
            buf, addr = aligned(per_thread * min(threads, items))
            ptrs = pointers(addr)
            nat = cpu_native.kernel(loaded, SYMBOL, label, ptrs, items, threads)
            nat.keep.append(buf)
            return nat

        return Work(run, native=native, keep=(params, fscale, loaded))


def scratch_bytes(q: "Handle", k: "Handle", v: "Handle", threads: int) -> int:
    """The scratch the kernel takes on `threads` threads: per thread, a head's keys packed
    transposed, a block's queries, scores and output rows, and the rows' running max and
    sum, each 64-byte aligned as the kernel's vector loads and stores need."""
    e, s, ev = q.sizes[-1], k.sizes[-2], v.sizes[-1]
    floats = e * (-(-s // 16) * 16) + ROWS * e + ROWS * KEYS + ROWS * ev + 2 * ROWS
    return threads * -(-floats * 4 // 64) * 64


__all__ = ["FusedAttention", "MAX_E", "MAX_EV", "SOURCE", "takes", "scratch_bytes"]
