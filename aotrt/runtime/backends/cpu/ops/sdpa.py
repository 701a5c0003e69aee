"""The cpu work of scaled dot-product attention: the fused kernel, else numpy."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from aotrt.runtime.ops import _common as c
from aotrt.runtime.backends.cpu.ops import attention as cpu_attention
from aotrt.runtime.ops.sdpa import _blocks
from aotrt.runtime.tensor import Handle, host_array


def _split_heads(a: np.ndarray, groups: int) -> np.ndarray:
    """View dim -3 (H) as (H / groups, groups), keeping strides (always possible)."""
    shape = a.shape[:-3] + (a.shape[-3] // groups, groups) + a.shape[-2:]
    st = a.strides[:-3] + (a.strides[-3] * groups, a.strides[-3]) + a.strides[-2:]
    return as_strided(a, shape, st, writeable=a.flags.writeable)


def _gqa_mask(m: np.ndarray, groups: int) -> np.ndarray:
    """Align a mask broadcastable to (..., Hq, L, S) with (..., Hk, groups, L, S)."""
    if m.ndim < 3:
        return m
    if m.shape[-3] == 1:
        return m[..., None, :, :]
    return _split_heads(m, groups)


def _expand(a: np.ndarray, batch: tuple[int, ...]) -> np.ndarray:
    """Broadcast `a`'s batch dims to `batch`, except the innermost, which keeps its size
    (1 or full) so that matmul broadcasts it without materializing copies."""
    a = a.reshape((1,) * (len(batch) + 2 - a.ndim) + a.shape)
    inner = a.shape[-3]
    return np.broadcast_to(a, batch[:-1] + (inner,) + a.shape[-2:])


def make_sdpa(out: Handle, q: Handle, k: Handle, v: Handle, mask: Handle | None,
              is_causal: bool, scale: float, groups: int) -> Callable[[], None]:
    """The cpu work of scaled dot-product attention."""
    # Float32 attention without a mask or with a bool one: one fused kernel, no score
    # matrix in memory. GPT-2's decode step (1 query over 256 cache slots, a bool mask) took
    # 0.4-0.6 ms a layer through the block loop below, Python and numpy passes.
    fused = out.device.libraries.attention
    if cpu_attention.takes(out, q, k, v, mask, groups):
        return fused.work(out, q, k, v, is_causal, scale, groups, mask)
    # The block loop, decided now (at load): the innermost batch dim is the group of query
    # heads sharing a key head, else the heads (as work() sees them, after its leading unit
    # dim); q, k and out broadcast to the same lengths.
    lq, s = q.sizes[-2], k.sizes[-2]
    inner = groups if groups > 1 else (out.sizes[-3] if out.ndim >= 3 else 1)
    lstep, hstep = _blocks(lq, s, inner, is_causal) if s > 0 else (1, 1)
    # Blocks whose scores are rows of all s keys (every block without a causal mask; with
    # one, the blocks whose last row sees every key: GPT-2's whole 128-token attention)
    # take one compiled softmax, made now, for the largest block; the masked-out scores
    # are -inf there, whose exp is 0. Other causal blocks use numpy's passes.
    softmax = None
    if s > 0 and out.numel > 0 and (not is_causal or lq >= s):
        softmax = out.device.libraries.softmaxes.get(hstep * lstep, s)
    dnnl = out.device.libraries.dnnl
    blas = c.blas_scope(dnnl)
    # The block GEMMs on oneDNN's pool where the device's GEMMs are (numpy's BLAS on one
    # thread: 248 of Whisper-tiny's 333 ms went to its 4 attentions, 150 through oneDNN).
    gemm = dnnl.gemm_arrays if dnnl is not None and dnnl.gemm_pool else None

    def work() -> None:
        with blas():
            _work()

    def _work() -> None:
        o = host_array(out)
        qa, ka, va, ma = c.detach_inputs([out], [q, k, v, mask], [
            host_array(q), host_array(k), host_array(v),
            None if mask is None else host_array(mask)])
        if ka.shape[-2] == 0:
            o[...] = 0  # nothing to attend to: torch gives zeros
            return
        # A leading unit dim gives every problem at least one batch dim to iterate over.
        # (Masks align from the right; _expand pads them.)
        qa, ka, va, o = qa[None], ka[None], va[None], o[None]
        if groups > 1:
            qa, o = _split_heads(qa, groups), _split_heads(o, groups)
            ka, va = ka[..., None, :, :], va[..., None, :, :]
            ma = None if ma is None else _gqa_mask(ma, groups)
        batch = o.shape[:-2]
        qx, kx, vx = _expand(qa, batch), _expand(ka, batch), _expand(va, batch)
        mx = None if ma is None else _expand(ma, batch)
        # One block's operands, scores and result, in the worker's kept scratch: fresh
        # pages on every call cost Whisper-tiny's attention 5 ms a block, and GPT-2's
        # (12, 128, 64) result and packed copies 0.7-1.7 ms a layer (AVX-512, 2 cores).
        e, ev = qa.shape[-1], va.shape[-1]
        room = _Room(out.device.worker.scratch(_Room.bytes_for(
            [(hstep, lstep, e), (hstep, s, e), (hstep, s, ev), (hstep, lstep, s),
             (hstep, lstep, ev)])))
        for idx in np.ndindex(batch[:-1]):
            for h0 in range(0, inner, hstep):
                for l0 in range(0, lq, lstep):
                    l1 = min(l0 + lstep, lq)
                    room.reset()
                    res = _attend(qx[idx], kx[idx], vx[idx], None if mx is None else mx[idx],
                                  h0, h0 + hstep, l0, l1, min(s, l1) if is_causal else s,
                                  is_causal, scale, softmax, gemm, room)
                    c.store(o[idx][h0:h0 + hstep, l0:l1], res)
    return work


def _rows(a: np.ndarray, h0: int, h1: int) -> np.ndarray:
    """Heads h0:h1 of an array whose head dim is full or 1 (then it broadcasts)."""
    return a if a.shape[0] == 1 else a[h0:h1]


class _Room:
    """float32 arrays carved one after another out of one buffer (the worker's kept
    scratch), 64-byte aligned; `take` gives None once the buffer is used up."""

    ALIGN = 16     # float32 elements: 64 bytes

    def __init__(self, buf: np.ndarray) -> None:
        self.buf = buf.view(np.float32)
        self.used = 0

    @classmethod
    def bytes_for(cls, shapes: list[tuple[int, ...]]) -> int:
        """The bytes that arrays of these shapes take, one after another."""
        return 4 * sum(-(-math.prod(sh) // cls.ALIGN) * cls.ALIGN for sh in shapes)

    def reset(self) -> None:
        """Every array taken so far is free again."""
        self.used = 0

    def take(self, shape: tuple[int, ...]) -> np.ndarray | None:
        """A row-major float32 array of `shape` (contents undefined), or None."""
        n = math.prod(shape)
        end = self.used + -(-n // self.ALIGN) * self.ALIGN
        if end > self.buf.size:
            return None
        arr = self.buf[self.used:self.used + n].reshape(shape)
        self.used = end
        return arr


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, m: np.ndarray | None, h0: int,
            h1: int, l0: int, l1: int, kend: int, is_causal: bool, scale: float,
            softmax: Any = None, gemm: Any = None, room: _Room | None = None) -> np.ndarray:
    """Attention of query rows l0:l1 of heads h0:h1 over keys [0, kend), in float32;
    `softmax`: the compiled row softmax (backends/cpu/ops/softmax.py), else numpy's passes; `gemm`:
    oneDNN's array matmul (Dnnl.gemm_arrays), else numpy's; `room`: where the block's
    copies, scores and result go, else fresh memory."""
    # Queries packed (row-major) as they are scaled: oneDNN refuses heads interleaved in
    # the rows, and a refused first try packed the transposed keys again.
    qc = _packed(_rows(q, h0, h1)[:, l0:l1], room, always=True)
    qc *= np.float32(scale)
    # Keys with heads interleaved in their rows are packed as they lie, before the
    # transpose: packing the transposed view gathered columns (91 against 11 us for
    # BERT's 12x128x64 keys, AVX-512, one core).
    kc = _packed(_rows(k, h0, h1)[:, :kend], room)
    vc = _packed(_rows(v, h0, h1)[:, :kend], room)
    scores = _matmul(gemm, qc, kc.transpose(0, 2, 1), room)
    if m is not None:
        mc = _rows(m, h0, h1)
        mc = mc if mc.shape[-2] == 1 else mc[:, l0:l1]
        mc = mc if mc.shape[-1] == 1 else mc[..., :kend]
        full = np.broadcast_shapes(scores.shape, mc.shape)
        if full != scores.shape:  # only the mask has all the heads of this block
            scores = np.array(np.broadcast_to(scores, full))
        if mc.dtype == np.bool_:
            np.copyto(scores, np.float32(-np.inf), where=~mc)
        else:
            scores += c.load_f32(mc)
    if is_causal:
        keep = np.arange(kend)[None, :] <= np.arange(l0, l1)[:, None]
        np.copyto(scores, np.float32(-np.inf), where=~keep)
    if softmax is not None and scores.shape[-1] == softmax.cols and \
            scores.size // softmax.cols <= softmax.rows and scores.flags.c_contiguous:
        softmax(scores, scores)
        return _matmul(gemm, scores, vc, room)
    top = scores.max(axis=-1, keepdims=True)
    # A fully masked row has max -inf; shifting by 0 keeps exp() at 0 instead of NaN.
    top[np.isneginf(top)] = 0
    np.subtract(scores, top, out=scores)
    np.exp(scores, out=scores)
    total = scores.sum(axis=-1, keepdims=True)
    total[total == 0] = 1
    scores /= total
    return _matmul(gemm, scores, vc, room)


def _packed(x: np.ndarray, room: _Room | None, always: bool = False) -> np.ndarray:
    """`x` as float32 with its batch dim outermost: `x` itself where it already is (and not
    `always`), else a copy, in `room` where it has space."""
    if not always and x.dtype == np.float32 and not _interleaved(x):
        return x
    dst = None if room is None else room.take(x.shape)
    if dst is None:
        return np.ascontiguousarray(x, dtype=np.float32)
    np.copyto(dst, x, casting="unsafe")
    return dst


def _matmul(gemm: Any, a: np.ndarray, b: np.ndarray, room: _Room | None = None) -> np.ndarray:
    """a @ b (3-D, float32), through `gemm` where it takes them, else numpy; the result in
    `room` where it has space."""
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    out = None if room is None else room.take(shape)
    if gemm is not None:
        if out is None:
            out = np.empty(shape, np.float32)
        # `a` and `b` come packed where oneDNN refuses them as they lie (heads interleaved
        # in the rows: _packed); a refused first try still retries on dense copies.
        if gemm(a, b, out) or gemm(np.ascontiguousarray(a), np.ascontiguousarray(b), out):
            return out
    return np.matmul(a, b) if out is None else np.matmul(a, b, out=out)


def _interleaved(x: np.ndarray) -> bool:
    """Whether a 3-D array's batch stride is below another of its strides."""
    return x.ndim == 3 and x.shape[0] > 1 and x.strides[0] < max(x.strides[1:])
