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
from typing import Any

from aotrt import dtypes
from aotrt.errors import InvalidArgument, Unsupported
from aotrt.runtime.device import Stream
from aotrt.runtime.ops import _common as c
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

# Query rows per block of causal attention (keys past a block's last row are skipped).
_CAUSAL_BLOCK = 128


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
    return c.launch(op, stream, [out], [q, k, v, attn_mask], "sdpa", out, q, k, v, attn_mask,
                    is_causal, scale, groups)
