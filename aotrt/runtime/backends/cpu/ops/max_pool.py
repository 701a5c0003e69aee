"""The cpu work of max_pool2d: compiled kernels where they serve, else numpy."""

from __future__ import annotations

from typing import Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from aotrt.runtime.ops import _common as c
from aotrt.runtime.backends.cpu.ops import pool as cpu_pool
from aotrt.runtime.ops.pool import TAP_LOOP, PoolParams, _geometry
from aotrt.runtime.tensor import Handle, host_array


def make_max_pool(out: Handle, indices_out: Handle | None, x: Handle,
                  p: PoolParams) -> Callable[[], None]:
    """The cpu work of max_pool2d."""
    if indices_out is None:
        compiled = cpu_pool.compiled_max_pool(out, x, p)
        if compiled is not None:
            return compiled

    def work() -> None:
        (xa,) = c.detach_inputs([out, indices_out], [x], [host_array(x)])
        xv = c.load_f32(xa)
        o = host_array(out)
        io = None if indices_out is None else host_array(indices_out)
        if xv.ndim == 3:
            xv, o = xv[None], o[None]
            io = None if io is None else io[None]
        _pool(xv, o, io, p)
    return work


def _pool(xv: np.ndarray, o: np.ndarray, io: np.ndarray | None, p: PoolParams) -> None:
    n, ch, h, w = xv.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (ho, wo), (rh, rw) = _geometry(h, w, p)
    step = c.rows_per_chunk(ch * ho * wo * kh * kw * 4 * 3, n)
    if io is None:
        for n0 in range(0, n, step):
            xp = np.pad(xv[n0:n0 + step], ((0, 0), (0, 0), (ph, rh), (pw, rw)),
                        constant_values=-np.inf)
            if kh * kw > TAP_LOOP:
                # A python step per tap would let a file's window size (up to 2**62 taps)
                # choose the run time: one reduction over the strided windows instead.
                s_n, s_c, s_h, s_w = xp.strides
                win = as_strided(xp, (xp.shape[0], ch, ho, wo, kh, kw),
                                 (s_n, s_c, s_h * sh, s_w * sw, s_h * dh, s_w * dw),
                                 writeable=False)
                c.store(o[n0:n0 + step], win.max(axis=(4, 5)))  # a NaN wins, as in torch
                continue
            # A running maximum over the taps reads each window in place; materializing the
            # windows (below, needed for indices) copies kh*kw times the output.
            top = None
            for i in range(kh):
                for j in range(kw):
                    tap = xp[:, :, i * dh:i * dh + (ho - 1) * sh + 1:sh,
                             j * dw:j * dw + (wo - 1) * sw + 1:sw]
                    top = tap.copy() if top is None else np.maximum(top, tap, out=top)
            c.store(o[n0:n0 + step], top)
        return
    valid = np.pad(np.ones((h, w), dtype=bool), ((ph, rh), (pw, rw)))
    vs = valid.strides
    vwin = as_strided(valid, (ho, wo, kh, kw), (vs[0] * sh, vs[1] * sw, vs[0] * dh, vs[1] * dw),
                      writeable=False).reshape(ho, wo, kh * kw)
    # Flat input index of each window tap: (oh*sh - ph + i*dh) * W + (ow*sw - pw + j*dw).
    tap_h = (np.arange(ho) * sh - ph)[:, None] + (np.arange(kh) * dh)[None, :]
    tap_w = (np.arange(wo) * sw - pw)[:, None] + (np.arange(kw) * dw)[None, :]
    flat = (tap_h[:, None, :, None] * w + tap_w[None, :, None, :]).reshape(ho, wo, kh * kw)
    # A window of padding only (dilation can skip the input): torch's index is its first
    # tap moved past the leading padding, even where that lies beyond the plane.
    h0, w0 = tap_h[:, 0], tap_w[:, 0]
    empty = ~vwin.any(axis=-1)
    moved = (h0 + _skip(h0, dh))[:, None] * w + (w0 + _skip(w0, dw))[None, :]
    for n0 in range(0, n, step):
        xp = np.pad(xv[n0:n0 + step], ((0, 0), (0, 0), (ph, rh), (pw, rw)),
                    constant_values=-np.inf)
        s_n, s_c, s_h, s_w = xp.strides
        win = as_strided(xp, (xp.shape[0], ch, ho, wo, kh, kw),
                         (s_n, s_c, s_h * sh, s_w * sw, s_h * dh, s_w * dw),
                         writeable=False).reshape(xp.shape[0], ch, ho, wo, kh * kw)
        top = win.max(axis=-1)  # NaN propagates; padding (-inf) never exceeds a value
        c.store(o[n0:n0 + step], top)
        first = np.argmax((win == top[..., None]) & vwin, axis=-1)
        nan = np.isnan(win)
        last_nan = kh * kw - 1 - np.argmax(nan[..., ::-1], axis=-1)
        pos = np.where(nan.any(axis=-1), last_nan, first)
        idx = flat[np.arange(ho)[:, None], np.arange(wo)[None, :], pos]
        c.store(io[n0:n0 + step], np.where(empty, moved, idx))


def _skip(start: np.ndarray, d: int) -> np.ndarray:
    """How far a window starting at `start` (< 0 in the padding) moves to its first tap at
    or after 0, in steps of the dilation `d`."""
    return ((-start).clip(0) + d - 1) // d * d
