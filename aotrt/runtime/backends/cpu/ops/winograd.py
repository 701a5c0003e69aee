"""Winograd convolution for the cpu device: a float32 3x3, stride-1, undilated, ungrouped
channels-last convolution as F(m x m, 3 x 3) (Lavin and Gray, 2015), m = 2 or 4.

    V[xi, t, c] = (B^T d B)[xi]      d: the (m + 2)^2 input patch of tile t (0 outside)
    U[xi, c, o] = (G g G^T)[xi]      g: the 3 x 3 kernel; made once, from constant weights
    M[xi]       = V[xi] @ U[xi]      (m + 2)^2 GEMMs of tiles x C by C x O: oneDNN's matmul
    out         = act(A^T M A + bias + residual)   per tile, written into the output view

Two C kernels beside this file's Python do the transforms, 16 channels a vector; the GEMMs
are one batched oneDNN matmul. F(2, 3) multiplies 2.25 times less than the direct
convolution and F(4, 3) 4 times less. oneDNN 3.2 has no Winograd implementation on x64,
and its direct brgemm convolution runs ResNet's 3x3 layers at about 220 GFLOP/s on two
AVX-512 cores, where the batched GEMMs of F(4, 3) at 56 x 56 x 64 take a third of its time.

Rounding: F(2, 3)'s transforms are exact in binary (0, +-1, +-1/2), and its error against
float64 was 1.7 to 2.5 times the direct convolution's (2.8e-7 against 1.6e-7, 64 to 512
channels); F(4, 3)'s transforms round (1/6, 1/24), and its error was 12 to 16 times the
direct one's (1.9e-6 to 4.8e-6). Which one runs is Fp32Math.conv_winograd (0: none).

NaN and infinity: the transforms mix a tile's whole input patch, so one NaN made all m^2
outputs of each tile whose patch held it NaN, and an infinity became NaNs (inf - inf),
where torch's direct convolution gives a NaN or an infinity only where the window holds
one. The output kernel checks each 16-channel block of a tile for a non-finite value
(its corner outputs, which every patch element reaches) and computes a block that has one
directly from x and the constant weights, before the same epilogue: torch's answer, at
about no cost where all is finite (the corners: 3 adds and a fold a block).
"""

from __future__ import annotations

import ctypes
import logging
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from aotrt.errors import CompileError
from aotrt.kernels.math_c import MATH_C
from aotrt.runtime.backends.cpu import native as cpu_native
from aotrt.runtime.backends.cpu.library import OpSource
from aotrt.runtime.ops import _common as c
from aotrt.runtime.tensor import Handle, host_array
from aotrt.runtime.work import Work
from aotrt.sources import source

if TYPE_CHECKING:
    from aotrt.runtime.backends.cpu.device import CpuDevice
    from aotrt.runtime.ops.conv import ConvParams

log = logging.getLogger(__name__)

#: the output tile sizes the kernels have (Fp32Math.conv_winograd)
TILES = (2, 4)
#: channels a vector (the kernels take input and output channels in whole vectors)
LANES = 16
#: the activation codes the output kernel applies (conv.ACTIVATIONS it has)
ACTIVATION_CODES = {"none": 0, "relu": 1, "relu6": 2, "silu": 3}
#: the int64 parameter block's length
_NPARAMS = 30
SYMBOLS = ("aot_wino_input", "aot_wino_output")

# The transforms (Lavin and Gray's matrices): B^T (alpha x alpha), G (alpha x 3), A^T.
BT = {2: [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
       4: [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
           [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]}
G = {2: [[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]],
      4: [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
          [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]}
AT = {2: [[1, 1, 1, 0], [0, 1, -1, -1]],
       4: [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
           [0, 1, -1, 8, -8, 1]]}

SOURCE = source(__package__, "winograd.c").replace(
    '#include "../../../../kernels/math_c.h"', MATH_C)


def takes(out: Handle, x: Handle, w: Handle, bias: Handle | None, p: "ConvParams",
          residual: Handle | None, tile: int) -> bool:
    """Whether the Winograd path takes this convolution: `tile` one of TILES, float32, 2-D,
    3x3, stride 1, undilated, ungrouped, padding at most 2, channels-last activations
    (channel stride 1; the output dense) with channels in whole vectors, constant weights,
    a dense bias, and an output that shares no bytes with what it reads."""
    if tile not in TILES or p.transposed or p.groups != 1 or w.ndim != 4:
        return False
    if any(h is not None and h.dtype.name != "float32" for h in (out, x, w, bias, residual)):
        return False
    if tuple(w.sizes[2:]) != (3, 3) or p.stride != (1, 1) or p.dilation != (1, 1):
        return False
    if any(q > 2 for q in p.padding) or not p.batched or p.activation not in ACTIVATION_CODES:
        return False
    if w.alloc is None or w.alloc.kind != "constants":
        return False
    o, cin = w.sizes[:2]
    if o % LANES or cin % LANES or 0 in x.sizes:
        return False
    acts = [h for h in (out, x, residual) if h is not None]
    if any(h.alloc is None or h.strides[1] != 1 for h in acts):
        return False
    oh, ow = out.sizes[2:]
    if tuple(out.strides) != (oh * ow * o, 1, ow * o, o):
        return False        # the threads' tiles must not share an output byte
    if bias is not None and bias.strides[0] != 1:
        return False
    return not any(c.overlaps(out, h) for h in (x, w, bias, residual) if h is not None)


#: the fewest output tiles per image a tile size is used for: fewer tiles make the GEMMs
#: too short for their transformed weights, (m + 2)^2 / 9 times the kernel's bytes, read
#: on every run (set from ResNet-18's and -50's layers, 2 cores, 2026-12-05)
MIN_TILES = {4: 49, 2: 49}


def tile_for(out: Handle, tile: int) -> int:
    """The output tile the convolution writing `out` is run with, at most `tile` (0: none)."""
    oh, ow = out.sizes[-2:]
    for m in (4, 2):
        if m <= tile and -(-oh // m) * -(-ow // m) >= MIN_TILES[m]:
            return m
    return 0


def transformed_weights(w: np.ndarray, tile: int) -> np.ndarray:
    """U[xi, c, o] = (G g G^T) of the (O, C, 3, 3) weights, in float64, rounded once to
    float32, laid out (alpha^2, C, O) as the GEMMs read it."""
    g = np.asarray(G[tile], np.float64)
    u = np.einsum("ia,ocab,jb->ijco", g, w.astype(np.float64), g)
    a = tile + 2
    return np.ascontiguousarray(u.reshape(a * a, w.shape[1], w.shape[0]), dtype=np.float32)


def _aligned(shape: tuple[int, ...]) -> np.ndarray:
    """A float32 array of `shape`, 64-byte aligned (the GEMMs' and the vectors' rows)."""
    n = int(np.prod(shape))
    raw = np.empty(n + 16, np.float32)
    start = (-raw.ctypes.data % 64) // 4
    return raw[start:start + n].reshape(shape)


class Winograd(OpSource):
    """The cpu device's Winograd kernels (one library: every shape is a parameter)."""

    def __init__(self, device: "CpuDevice") -> None:
        super().__init__(device, SOURCE, list(SYMBOLS))

    def work(self, out: Handle, x: Handle, w: Handle, bias: Handle | None, p: "ConvParams",
             residual: Handle | None, tile: int, threads: int,
             budget: int) -> Callable[[], None] | None:
        """The work closure of the convolution (views checked by `takes`), or None where
        oneDNN has no fast batched GEMM for it or its buffers would pass `budget` bytes.
        Geometry, buffers and the GEMM are fixed now; the weights are transformed on the
        first run, from the constant's bytes as they are then. `threads`: the stream's, which
        the GEMM is made for; the transforms take the running worker's."""
        dnnl = self.device.libraries.dnnl
        if dnnl is None:
            return None
        n, cin, h, wd = x.sizes
        o, oh, ow = out.sizes[1], out.sizes[2], out.sizes[3]
        a = tile + 2
        th, tw = -(-oh // tile), -(-ow // tile)
        tiles = n * th * tw
        if 4 * a * a * tiles * (cin + o) > budget:
            log.debug("Winograd F(%d, 3) of %s needs more than %d scratch bytes", tile,
                      list(out.sizes), budget)
            return None
        V, M = _aligned((a * a, tiles, cin)), _aligned((a * a, tiles, o))
        U = _aligned((a * a, cin, o))      # untouched (no pages) where the GEMM packs it
        gemm = dnnl.fixed_matmul(V, U, M, threads, pack=True)
        if gemm is None:
            return None
        weights = [U] if not gemm.packed else []
        params = np.zeros(_NPARAMS, np.int64)
        res_strides = residual.strides if residual is not None else (0, 0, 0, 0)
        params[:12] = (n, h, wd, cin, oh, ow, o, p.padding[0], p.padding[1], th, tw, tiles)
        params[12:24] = (*x.strides, *out.strides, *res_strides)
        params[24:26] = (ACTIVATION_CODES[p.activation], tile)
        params[26:] = w.strides          # for tiles the direct convolution redoes
        try:
            loaded = self.library()
        except CompileError as e:
            log.debug("Winograd: no transform kernels (%s); oneDNN's direct convolution runs", e)
            return None
        label = f"winograd F({tile}, 3) {list(x.sizes)} -> {list(out.sizes)}"
        filled: list[bool] = []
        worker, stats = self.device.worker, dnnl.stats

        def fill() -> None:
            u = transformed_weights(host_array(w), tile)
            if gemm.packed:
                gemm.pack(u)        # the GEMM's copy: u goes when this returns
            else:
                weights[0][...] = u
            filled.append(True)

        def pointers() -> tuple[Any, Any]:
            zero = None
            ins = (ctypes.c_void_p * 3)(x.address, V.ctypes.data, params.ctypes.data)
            outs = (ctypes.c_void_p * 7)(
                M.ctypes.data, out.address, zero if bias is None else bias.address,
                zero if residual is None else residual.address, params.ctypes.data,
                w.address, x.address)
            return ins, outs

        def work() -> None:
            if not filled:
                fill()
            ins, outs = pointers()
            nt = getattr(worker, "threads", 1)
            loaded.call(SYMBOLS[0], label, ins, tiles, nt)
            gemm.run()
            loaded.call(SYMBOLS[1], label, outs, tiles, nt)
            stats["winograd"] += 1

        def native() -> cpu_native.Native | None:
            if not filled:
                return None
            ins, outs = pointers()
            nt = getattr(worker, "threads", 1)
            first = cpu_native.kernel(loaded, SYMBOLS[0], label, ins, tiles, nt)
            last = cpu_native.kernel(loaded, SYMBOLS[1], label, outs, tiles, nt)
            return cpu_native.Native(first.steps + [gemm.step()] + last.steps,
                                     keep=[ins, outs, gemm], library=loaded, label=label,
                                     dnnl=dnnl, counts={"runs": 1, "winograd": 1})

        return Work(work, native=native, keep=(V, M, weights, params, gemm, loaded))


__all__ = ["ACTIVATION_CODES", "AT", "BT", "G", "LANES", "MIN_TILES", "SOURCE", "SYMBOLS", "TILES",
           "Winograd", "takes", "tile_for", "transformed_weights"]
