"""2-D max pooling without indices on the cpu device, as one generated C kernel per pooling
instruction, made at load: every window tap is a clamped load masked to -inf outside the
plane, and the taps are folded with a NaN-propagating maximum (torch's semantics: padding
is never selected, a NaN in the window wins).

The outer loop runs over the views' own layout, channels innermost for channels-last views,
so the compiler vectorises across channels; it is split over the stream's threads. Of
several NaNs in a window the last in window order wins, as in torch's cpu kernel. numpy's
nine strided passes over ResNet-18's stem pool took 8.7 ms of a 29 ms run on two cores
(bench/profile_cpu.py, 2026-12-02); the indices form (rare: max_unpool) stays on numpy.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import TYPE_CHECKING, Callable

from aotrt.kernels import ir
from aotrt.runtime.backends.cpu import native as cpu_native
from aotrt.runtime.device import KernelLibrary, arg_bounds
from aotrt.runtime.ops import _common as c
from aotrt.runtime.tensor import Handle
from aotrt.runtime.work import Work

if TYPE_CHECKING:
    from aotrt.runtime.backends.cpu.device import CpuDevice
    from aotrt.runtime.ops.pool import PoolParams

#: windows of more taps than this stay on numpy (the kernel unrolls every tap)
MAX_TAPS = 64

Dims = tuple[tuple[int, ...], tuple[int, ...]]
#: x's and out's 4-D (sizes, strides), the dtype and the pooling parameters
Geometry = tuple[Dims, Dims, str, "PoolParams"]


def _dims4(h: Handle) -> Dims:
    """(sizes, strides) of a (N,)C,H,W view as N,C,H,W (a missing N of size 1)."""
    if h.ndim == 3:
        return (1, *h.sizes), (0, *h.strides)
    return tuple(h.sizes), tuple(h.strides)


def _windows_meet_plane(size: int, out: int, k: int, s: int, p: int) -> bool:
    """Whether every undilated window along one dim holds at least one element of it."""
    # Window starts o * s - p grow with o: the first and the last decide (a loop over the
    # outputs would be 2**31 python steps for a file's stride-0 view).
    return out < 1 or (k - 1 - p >= 0 and (out - 1) * s - p <= size - 1)


def _within(op: Callable[..., ir.Expr], i: ir.Expr, size: int) -> ir.Expr:
    """0 <= i < size, as a bool expression."""
    zero, top = ir.const(0, "int64"), ir.const(size, "int64")
    return op("and", op("ge", i, zero, dtype="bool"), op("lt", i, top, dtype="bool"),
              dtype="bool")


def _nan_max(acc: ir.Expr, v: ir.Expr) -> ir.Expr:
    """max(acc, v) where a NaN wins, NaN-tested on `v` only: a NaN `acc` stays, as no number
    compares greater. The IR's own maximum tests both sides, and gcc 12 does not vectorise
    a chain of those (it merges the NaN tests of a select into a select of masks)."""
    bigger = ir.Op("where", (ir.Op("gt", (v, acc), "bool"), v, acc), "float32")
    return ir.Op("where", (ir.Op("isnan", (v,), "bool"), v, bigger), "float32")


def max_pool_kernel(x: Dims, out: Dims, dtype: str, p: "PoolParams") -> ir.Kernel:
    """out[n, c, oh, ow] = max over the window's taps of x, for 4-D (sizes, strides)."""
    (n, ch, h, w), xs = x
    (_, _, ho, wo), os_ = out
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = p.kernel, p.stride, p.padding, p.dilation
    # Iteration dims in the views' layout: channels last where both views keep them dense.
    order = (0, 2, 3, 1) if xs[1] == 1 and os_[1] == 1 and ch > 1 else (0, 1, 2, 3)
    shape = tuple((n, ch, ho, wo)[d] for d in order)
    coord = {d: ir.Idx(order.index(d)) for d in range(4)}     # logical dim -> iteration Idx

    def i64(v: int) -> ir.Expr:
        return ir.const(v, "int64")

    def op(name: str, *args: ir.Expr, dtype: str = "int64") -> ir.Expr:
        return ir.Op(name, tuple(args), dtype)

    def term(e: ir.Expr, stride: int) -> ir.Expr:
        return e if stride == 1 else op("mul", e, i64(stride))

    # Without dilation, a window that meets the plane holds the plane's edge row or column
    # wherever it reaches past it: a clamped tap reads a value of its own window, so the
    # maximum (NaN included) is unchanged and needs no mask, and the row loop vectorises
    # (a masked tap mixes bool and float vectors, which gcc 12 does not vectorise).
    edge_taps_inside = (dh, dw) == (1, 1) and _windows_meet_plane(h, ho, kh, sh, ph) and \
        _windows_meet_plane(w, wo, kw, sw, pw)
    base = op("add", term(coord[0], xs[0]), term(coord[1], xs[1]))
    lowest = ir.const(float("-inf"), "float32")
    taps: list[ir.Expr] = []
    for i in range(kh):
        ih = op("add", op("mul", coord[2], i64(sh)), i64(i * dh - ph))
        for j in range(kw):
            iw = op("add", op("mul", coord[3], i64(sw)), i64(j * dw - pw))
            # Clamped into the plane, so the load is in bounds even where it is masked.
            ihc = op("maximum", op("minimum", ih, i64(h - 1)), i64(0))
            iwc = op("maximum", op("minimum", iw, i64(w - 1)), i64(0))
            idx = op("add", base, op("add", term(ihc, xs[2]), term(iwc, xs[3])))
            v = ir.cast(ir.Load(0, idx, dtype), "float32")
            if not edge_taps_inside:
                inside = op("and", _within(op, ih, h), _within(op, iw, w), dtype="bool")
                v = op("where", inside, v, lowest, dtype="float32")
            taps.append(v)
    # check_max_pool2d refused empty windows: there is at least one tap
    acc = functools.reduce(_nan_max, taps)
    out_idx = ir.strided_index([os_[d] for d in order])
    name = f"max_pool2d_{kh}x{kw}"
    return ir.Kernel(name, shape, (), (ir.Arg(dtype, "r"), ir.Arg(dtype, "w")),
                     (ir.Store(1, out_idx, ir.cast(acc, dtype)),))


def compiled_max_pool(out: Handle, x: Handle, p: "PoolParams") -> Callable[[], None] | None:
    """The work of out = max_pool2d(x) through a compiled kernel; None where the numpy path
    must run it (overlapping views, very large windows, no memory, non-float dtype)."""
    taps = p.kernel[0] * p.kernel[1]
    if (taps > MAX_TAPS or x.alloc is None or out.alloc is None or c.overlaps(out, x)
            or x.dtype.name not in ir.FLOAT_DTYPES or out.dtype != x.dtype):
        return None
    geometry = (_dims4(x), _dims4(out), x.dtype.name, p)
    kernel = out.device.libraries.pools.kernel(geometry)
    # The code must stay inside the views it was given: the kernel's own index range, as
    # the prover sees it, against each view's.
    for h, rng in zip((x, out), arg_bounds(kernel)):
        if rng is None or rng == "float":
            return None
        lo, hi = h.byte_range()
        isz = h.dtype.itemsize
        if h.byte_offset + rng[0] * isz < lo or h.byte_offset + (rng[1] + 1) * isz > hi:
            return None
    device = out.device
    library = device.libraries.pools.library(geometry)
    symbol, label = library.symbol(kernel.name), f"max_pool2d {list(x.sizes)}"
    worker, n = device.worker, kernel.numel

    def work() -> None:
        ptrs = (ctypes.c_void_p * 2)(x.address, out.address)
        library.loaded.call(symbol, label, ptrs, n, getattr(worker, "threads", 1))

    def native() -> cpu_native.Native:
        return cpu_native.kernel(library.loaded, symbol, label,
                                 (ctypes.c_void_p * 2)(x.address, out.address), n,
                                 getattr(worker, "threads", 1))

    # The code lives as long as the work.
    return Work(work, native=native, keep=library)


class PoolKernels:
    """The cpu device's compiled max pools, by geometry (a device's state, as its softmaxes
    are): pools of one geometry, such as YOLO's three SPPF pools, share one library. Keyed
    by the geometry, not the kernel: IR equality walks shared subtrees once per path."""

    def __init__(self, device: "CpuDevice") -> None:
        self._device = device
        self._lock = threading.Lock()
        self._kernels: dict[Geometry, ir.Kernel] = {}
        self._made: dict[Geometry, KernelLibrary] = {}

    def kernel(self, geometry: "Geometry") -> ir.Kernel:
        """The kernel of `geometry` (x's and out's 4-D sizes and strides, dtype, params)."""
        with self._lock:
            k = self._kernels.get(geometry)
            if k is None:
                k = self._kernels[geometry] = max_pool_kernel(*geometry)
            return k

    def library(self, geometry: "Geometry") -> KernelLibrary:
        """The compiled library of `geometry`'s kernel (compiled once, kept)."""
        k = self.kernel(geometry)
        with self._lock:
            lib = self._made.get(geometry)
            if lib is None or lib.closed:
                lib = self._made[geometry] = self._device.kernel_library([k])
            return lib

    def close(self) -> None:
        """Let the compiled libraries go."""
        with self._lock:
            for lib in self._made.values():
                lib.close()
            self._made.clear()


__all__ = ["MAX_TAPS", "PoolKernels", "compiled_max_pool", "max_pool_kernel"]
