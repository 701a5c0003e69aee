"""Scaled dot-product attention (torch.nn.functional.scaled_dot_product_attention), math
semantics, into a caller-provided output view.

q (..., L, E), k (..., S, E), v (..., S, Ev) -> out (..., L, Ev). Batch dims broadcast as in
torch's math backend; with enable_gqa the key/value heads (dim -3) are shared by groups of
Hq / Hk query heads. Masks are bool (True = attend) or float (added to the scores) and
broadcast to (..., L, S). is_causal keeps the top-left aligned lower triangle of (L, S).
A row with nothing to attend to gives zeros, as torch 2.14 does (its softmax is "safe").
Any head dim; dropout is not implemented.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from aotrt import dtypes
from aotrt.errors import InvalidArgument, Unsupported
from aotrt.runtime.device import Stream
from aotrt.runtime.ops import _common as c
from aotrt.runtime.ops import cpu_attention
from aotrt.runtime.ops.cuda import sdpa as cuda_sdpa
from aotrt.runtime.tensor import Handle


def check_sdpa(out: Any, q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: Any = 0.0,
               is_causal: Any = False, scale: Any = None, enable_gqa: Any = False
               ) -> tuple[tuple[bool, float, int], c.OpCost]:
    """Validate sdpa's metadata and params; return (is_causal, scale, gqa groups) and the
    cost."""
    op = "sdpa"
    c.check_output(op, out, "out")
    c.check_dtype(op, out, "out")
    for h, name in ((q, "q"), (k, "k"), (v, "v")):
        c.check_same_dtype(op, out, "out", h, name)
    dropout_p = c.as_float(op, dropout_p, "dropout_p")
    if dropout_p != 0.0:
        raise Unsupported(f"sdpa: dropout_p: dropout is not implemented (got {dropout_p})")
    is_causal = c.as_bool(op, is_causal, "is_causal")
    enable_gqa = c.as_bool(op, enable_gqa, "enable_gqa")
    if scale is not None:
        scale = c.as_float(op, scale, "scale")
    if q.ndim < 2:
        raise InvalidArgument(f"sdpa: q: expected rank >= 2 (..., L, E), got {list(q.sizes)}")
    for h, name in ((k, "k"), (v, "v")):
        if h.ndim != q.ndim:
            raise InvalidArgument(f"sdpa: {name}: rank {h.ndim} ({list(h.sizes)}) differs from "
                                  f"q's rank {q.ndim} ({list(q.sizes)})")
    e, ek = q.sizes[-1], k.sizes[-1]
    if e == 0:
        raise InvalidArgument(f"sdpa: q: zero head dim in {list(q.sizes)}")
    if ek != e:
        raise InvalidArgument(f"sdpa: k: head dim {ek} does not match q's {e}")
    if v.sizes[-2] != k.sizes[-2]:
        raise InvalidArgument(f"sdpa: v: sequence length {v.sizes[-2]} does not match k's "
                              f"{k.sizes[-2]}")
    qb, kb, vb = list(q.sizes[:-2]), list(k.sizes[:-2]), list(v.sizes[:-2])
    groups = 1
    if enable_gqa and q.ndim >= 3:
        hq, hk, hv = qb[-1], kb[-1], vb[-1]
        if hk == 0 or hv == 0:
            raise InvalidArgument(f"sdpa: k: zero key/value heads (k {list(k.sizes)}, v "
                                  f"{list(v.sizes)})")
        if hk != hv:
            raise InvalidArgument(f"sdpa: v: {hv} value heads differ from {hk} key heads")
        if hq % hk:
            raise InvalidArgument(f"sdpa: k: {hk} key heads do not divide {hq} query heads")
        groups = hq // hk
        kb[-1] = vb[-1] = hq
    batch = c.broadcast_shape(op, [tuple(qb), tuple(kb), tuple(vb)], "q/k/v batch dims")
    lq, s = q.sizes[-2], k.sizes[-2]
    if attn_mask is not None:
        if is_causal:
            raise InvalidArgument("sdpa: attn_mask: an explicit mask cannot be combined with "
                                  "is_causal=True")
        if attn_mask.dtype not in (dtypes.bool_, dtypes.float32, q.dtype):
            raise InvalidArgument(f"sdpa: attn_mask: dtype {attn_mask.dtype.name} must be bool, "
                                  f"float32 or q's {q.dtype.name}")
        full = batch + (lq, s)
        if c.broadcast_shape(op, [attn_mask.sizes, full], "attn_mask") != full:
            raise InvalidArgument(f"sdpa: attn_mask: sizes {list(attn_mask.sizes)} do not "
                                  f"broadcast to {list(full)}")
    c.check_shape(op, out, "out", batch + (lq, v.sizes[-1]))
    scale = 1.0 / math.sqrt(e) if scale is None else scale
    return (is_causal, scale, groups), sdpa_cost(out, q, k, v, attn_mask, is_causal, groups)


#: PY_STEPs charged per block of the cpu loop (its numpy calls and python overhead)
BLOCK_STEPS = 64


def _blocks(lq: int, s: int, inner: int, is_causal: bool) -> tuple[int, int]:
    """(query rows, heads) per block of the cpu loop."""
    # Causal rows l0:l1 see only keys [0, l1): blocks of rows skip the rest of the keys.
    lstep = min(lq, _CAUSAL_BLOCK) if is_causal else lq
    hstep = c.rows_per_chunk(lstep * s * 4, inner)
    if hstep == 1:
        lstep = min(lstep, c.rows_per_chunk(s * 4, lq))
    return max(lstep, 1), hstep


def sdpa_cost(out: Any, q: Any, k: Any, v: Any, mask: Any, is_causal: bool,
              groups: int) -> c.OpCost:
    """Cost of the cpu sdpa: two GEMMs and the softmax over every (query, key) pair, a loop
    step per block; scratch: detached input copies and one block's float32 operands, score
    matrix (with its mask copies) and result."""
    ins = [h for h in (q, k, v, mask) if h is not None]
    work = out.numel + sum(h.numel for h in ins)
    scratch = sum(h.numel * h.dtype.itemsize for h in ins)
    lq, s, e, ev = q.sizes[-2], k.sizes[-2], q.sizes[-1], v.sizes[-1]
    if s == 0 or out.numel == 0:
        return c.OpCost(work, scratch)
    bt = (1,) + tuple(out.sizes[:-2])
    if groups > 1:
        bt = bt[:-1] + (bt[-1] // groups, groups)
    inner, outer = bt[-1], math.prod(bt[:-1])
    lstep, hstep = _blocks(lq, s, inner, is_causal)
    steps = outer * -(-inner // hstep) * -(-lq // lstep)
    heads = math.prod(bt)
    # A block is about 20 numpy calls: 59 us for a 1x1x1 block (_attend, 2 shared cores,
    # 2026-12-06), so a file's many tiny batches are charged as the python steps they are.
    work += heads * lq * s * (e + ev + 4) + BLOCK_STEPS * c.PY_STEP * steps
    item = out.dtype.itemsize
    scratch += 4 * hstep * (lstep * e + s * (e + ev) + 3 * lstep * s) + lstep * s
    scratch += (4 + item) * hstep * lstep * ev
    return c.OpCost(work, scratch)


def sdpa(stream: Stream, out: Handle, q: Handle, k: Handle, v: Handle,
         attn_mask: Handle | None = None, dropout_p: float = 0.0, is_causal: bool = False,
         scale: float | None = None, enable_gqa: bool = False) -> int:
    """out = softmax(q @ k^T * scale + mask) @ v."""
    op = "sdpa"
    c.check_handles(op, stream, [(out, "out"), (q, "q"), (k, "k"), (v, "v"),
                                 (attn_mask, "attn_mask")])
    (is_causal, scale, groups), _ = check_sdpa(out, q, k, v, attn_mask, dropout_p, is_causal,
                                               scale, enable_gqa)
    return c.launch(op, stream, [out], [q, k, v, attn_mask], _SDPA, out, q, k, v, attn_mask,
                    is_causal, scale, groups)


# -- cpu ----------------------------------------------------------------------------------------

# Query rows per block of causal attention (keys past a block's last row are skipped).
_CAUSAL_BLOCK = 128


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


def _cpu_sdpa(out: Handle, q: Handle, k: Handle, v: Handle, mask: Handle | None,
              is_causal: bool, scale: float, groups: int) -> Callable[[], None]:
    from aotrt.runtime.devices.cpu import host_array

    # Float32 attention without a mask: one fused kernel, no score matrix in memory.
    fused = getattr(out.device, "attention", None)
    if fused is not None and cpu_attention.takes(out, q, k, v, mask, groups):
        return fused.work(out, q, k, v, is_causal, scale, groups)
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
        softmax = out.device.softmaxes.get(hstep * lstep, s)
    blas = c.blas_scope(out.device)
    dnnl = getattr(out.device, "dnnl", None)
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
        room = _Room(out.device.scratch(_Room.bytes_for(
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
    `softmax`: the compiled row softmax (ops/cpu_softmax.py), else numpy's passes; `gemm`:
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


_SDPA: dict[str, Callable[..., Any]] = {"cpu": _cpu_sdpa, "cuda": cuda_sdpa.make_sdpa}
