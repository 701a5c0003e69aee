"""The reference's library ops: mm, addmm, linear and linear_wq, in float64 with masks.

The runtime accumulates these in float32, in an order of its choosing (BLAS blocks, the
int4 kernel's per-group sums `s * (sum(x*q) - z * sum(x))`). So an output element is
marked undefined wherever the float32 error bound of such a sum, `(K + 4) * u * sum|terms|`
(a worst case, far above the usual error) plus what approximate inputs' own errors carry
into it (APPROX_ABS), could exceed the comparison's tolerance *as an absolute error*, and
wherever a term is not finite (an infinity's sign or a NaN may depend on the order).
Absolute, because a kernel after the op may turn it into a relative one: a softmax's exp of
scores near 1e5 with errors of 0.01 differs by 1% (campaign mutant 24796 of master 36, an
l2 weight of 379745, was judged different on a relative bound). Every other element is
compared with the tolerance of an approximate value (reference.compare).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aotrt.kernels import ir
from tests.fuzz.reference import Reference, RefRefusal, RefUnchecked, V, bf16_to_f

#: float32's unit roundoff
U32 = 2.0 ** -24
#: the comparison's tolerance (reference.compare: 1e-3 of max(1, |r|) for float32), as the
#: largest absolute error bound of a result that is checked
MARGIN = 1e-3
#: the absolute error, relative to max(1, |v|), that an approximate input may carry: float32
#: libm results near a cancellation (gelu's 1 + erf(x) at x = -5 is 7.4e-7 +- 6e-8) are off
#: by a few ulps of 1, not of themselves (campaign mutant 60146 of master 36: a gelu of
#: -1.4e-6 times an l2 weight of -5e5)
APPROX_ABS = 1e-6


def values(ref: Reference, t: dict
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(values as float64, undef, uninit, error) of view `t`, shaped as its sizes; `error`
    bounds an approximate value's absolute error (APPROX_ABS), 0 for an exact one."""
    key, _, _, dt, _, _ = ref._view(t)
    pos = ref.positions(t)
    if not pos.size:
        z = np.zeros(pos.shape, bool)
        return np.zeros(pos.shape), z, z, np.zeros(pos.shape)
    v, u, n, ap = ref._read(key, pos, dt)
    if dt.name == "bfloat16":
        v = bf16_to_f(v.view(np.uint16))
    v = v.astype(np.float64)
    with np.errstate(all="ignore"):
        err = np.where(ap, APPROX_ABS * np.maximum(1.0, np.abs(v)), 0.0)
    return v, u, n, err


def _product(a: np.ndarray, b: np.ndarray, mag: np.ndarray, err: Any = 0.0
             ) -> tuple[np.ndarray, np.ndarray]:
    """a @ b and the elements whose float32 error bound (from `mag`, the sum of the terms'
    magnitudes, and `err`, what the inputs' own errors carry into it) or non-finite terms
    make them order-dependent."""
    k = a.shape[-1]
    with np.errstate(all="ignore"):
        r = a @ b
        bound = (k + 4) * U32 * mag + err
        shaky = ~np.isfinite(mag) | ~np.isfinite(r) | ~(bound <= MARGIN)
    return r, shaky


def _masks_of(a_mask: np.ndarray, b_mask: np.ndarray) -> np.ndarray:
    """Output (m, n) is marked when row m of a or column n of b holds a marked element."""
    return a_mask.any(-1)[:, None] | b_mask.any(0)[None, :]


def _store(ref: Reference, o: dict, r: np.ndarray, und: np.ndarray,
           uni: np.ndarray) -> None:
    key = ref._view(o)[0]
    dt = ref._view(o)[3]
    with np.errstate(all="ignore"):
        v = V(r.astype(np.float32), "f", und, uni, np.ones(r.shape, bool))
    raw = ref._store_bytes(v, "float32", dt.name)
    ref._write(key, ref.positions(o), raw, (und, uni, v.approx), False)


def _views(ref: Reference, ins: dict) -> tuple[list[dict], list[dict | None]]:
    outs = [ref.p.tensors[t] for t in ins["outs"]]
    xs = [ref.p.tensors[t] if t is not None else None for t in ins["ins"]]
    return outs, xs


def mm(ref: Reference, ins: dict) -> None:
    """mm(a, b) and addmm(bias, a, b, beta, alpha), 2-D, one float dtype."""
    fn = ins["fn"]
    outs, xs = _views(ref, ins)
    want = 2 if fn == "mm" else 3
    if len(outs) != 1 or len(xs) != want or any(x is None for x in xs):
        raise RefRefusal(f"{fn}: bad argument counts")
    o = outs[0]
    if any(len(t["sizes"]) != 2 or t["dtype"] != o["dtype"] for t in (o, *xs)) or \
            o["dtype"] not in ir.FLOAT_DTYPES:
        raise RefRefusal(f"{fn}: bad ranks or dtypes")
    a, b = xs[-2], xs[-1]
    (m, kk), (k2, nn) = a["sizes"], b["sizes"]
    if kk != k2 or o["sizes"] != [m, nn]:
        raise RefRefusal(f"{fn}: bad shapes")
    (av, au, an, ae), (bv, bu, bn, be) = values(ref, a), values(ref, b)
    with np.errstate(all="ignore"):
        r, shaky = _product(av, bv, np.abs(av) @ np.abs(bv),
                            ae @ np.abs(bv) + np.abs(av) @ be)
    und = _masks_of(au, bu) | shaky if kk else np.zeros((m, nn), bool)
    uni = _masks_of(an, bn) if kk else np.zeros((m, nn), bool)
    if fn == "addmm":
        params = ins.get("params", {})
        beta, alpha = params.get("beta", 1), params.get("alpha", 1)
        cv, cu, cn, _ = values(ref, xs[0])
        if cv.shape != (m, nn):
            raise RefRefusal("addmm: bias shape")
        with np.errstate(all="ignore"):
            r = beta * cv + alpha * r
            und = und | cu | ~np.isfinite(r)
        uni = uni | cn
    _store(ref, o, r, und, uni)


def linear(ref: Reference, ins: dict) -> None:
    """linear(x [..., K], w [N, K], bias [N] | [1] | [] | None) -> [..., N]."""
    outs, xs = _views(ref, ins)
    if len(outs) != 1 or len(xs) not in (2, 3) or xs[0] is None or xs[1] is None:
        raise RefRefusal("linear: bad argument counts")
    o, x, w = outs[0], xs[0], xs[1]
    bias = xs[2] if len(xs) == 3 else None
    k = x["sizes"][-1] if x["sizes"] else -1
    if len(w["sizes"]) != 2 or w["sizes"][1] != k:
        raise RefRefusal("linear: bad shapes")
    n = w["sizes"][0]
    (xv, xu, xn, xe), (wv, wu, wn, we) = values(ref, x), values(ref, w)
    rows = xv.reshape(-1, k)
    with np.errstate(all="ignore"):
        err = xe.reshape(-1, k) @ np.abs(wv.T) + np.abs(rows) @ we.T
    r, shaky = _product(rows, wv.T, np.abs(rows) @ np.abs(wv.T), err)
    und = _masks_of(xu.reshape(-1, k), wu.T) | shaky
    uni = _masks_of(xn.reshape(-1, k), wn.T)
    if bias is not None:
        r, und, uni = _add_bias(ref, bias, n, r, und, uni)
    _store(ref, o, _shaped(r, o), _shaped(und, o), _shaped(uni, o))


def _add_bias(ref: Reference, bias: dict, n: int, r: np.ndarray, und: np.ndarray,
              uni: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    bv, bu, bn, _ = values(ref, bias)
    if bv.size not in (1, n):
        raise RefRefusal("bias: bad shape")
    bv, bu, bn = (np.broadcast_to(z.reshape(-1), (n,)) for z in (bv, bu, bn))
    with np.errstate(all="ignore"):
        r = r + bv
    return r, und | bu | ~np.isfinite(r), uni | bn


def _shaped(a: np.ndarray, o: dict) -> np.ndarray:
    if a.size != int(np.prod(o["sizes"], dtype=np.int64)):
        raise RefRefusal("output: bad shape")
    return a.reshape(o["sizes"])


def linear_wq(ref: Reference, ins: dict) -> None:
    """linear_wq(x, qweight, scales, zeros, bias; bits, group_size) (runtime/ops/linear_wq.py:
    int8 per channel, or int4 two a byte, low nibble first, per group along K)."""
    outs, xs = _views(ref, ins)
    if len(outs) != 1 or len(xs) != 5 or any(t is None for t in xs[:3]):
        raise RefRefusal("linear_wq: bad argument counts")
    params = ins.get("params", {})
    bits = params.get("bits", 8)
    o, x, q, s, z, bias = outs[0], *xs
    k = x["sizes"][-1] if x["sizes"] else -1
    gs = params.get("group_size") or k
    n = q["sizes"][0] if len(q["sizes"]) == 2 else -1
    xv, xu, xn, xe = values(ref, x)
    qv, qu, qn, _ = values(ref, q)
    sv, su, sn, _ = values(ref, s)
    if bits == 8:
        groups = 1
        qk = qv
        zv = np.zeros((n, 1))
        zu = zn = np.zeros((n, 1), bool)
        sv, su, sn = (a.reshape(n, 1) for a in (sv, su, sn))
    elif bits == 4 and z is not None and k % gs == 0:
        groups = k // gs
        raw = qv.astype(np.int64)
        qk = np.stack((raw & 0xF, raw >> 4), -1).reshape(n, k).astype(np.float64)
        qu, qn = (np.repeat(m, 2, axis=1) for m in (qu, qn))
        zv, zu, zn, _ = values(ref, z)
    else:
        raise RefRefusal(f"linear_wq: bits {bits} with zeros {z is not None}")
    if qk.shape != (n, k) or sv.shape != (n, groups) or zv.shape != (n, groups):
        raise RefRefusal("linear_wq: bad packing shapes")
    # the dequantized weights, as float32 makes them
    g = np.arange(k) // (k // groups)
    with np.errstate(all="ignore"):
        s32 = sv.astype(np.float32).astype(np.float64)[:, g]
        z32 = zv.astype(np.float32).astype(np.float64)[:, g]
        w = (qk - z32) * s32
        mag = np.abs(xv.reshape(-1, k)) @ ((np.abs(qk) + np.abs(z32)) * np.abs(s32)).T
    rows = xv.reshape(-1, k)
    with np.errstate(all="ignore"):
        err = xe.reshape(-1, k) @ np.abs(w.T)
    r, shaky = _product(rows, w.T, mag, err)
    wu = qu | (su | zu)[:, g]
    wn = qn | (sn | zn)[:, g]
    und = _masks_of(xu.reshape(-1, k), wu.T) | shaky
    uni = _masks_of(xn.reshape(-1, k), wn.T)
    if bias is not None:
        r, und, uni = _add_bias(ref, bias, n, r, und, uni)
    _store(ref, o, _shaped(r, o), _shaped(und, o), _shaped(uni, o))


#: the library ops the reference runs; any other is RefUnchecked
OPS = {"mm": mm, "addmm": mm, "linear": linear, "linear_wq": linear_wq}


def run(ref: Reference, ins: dict) -> Any:
    """Run library instruction `ins` on the reference's memory."""
    op = OPS.get(ins["fn"])
    if op is None:
        raise RefUnchecked(f"library op {ins['fn']}")
    return op(ref, ins)
