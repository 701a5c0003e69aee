"""A plain numpy interpreter of the kernel IR and of a program's kernel/copy/mm steps.

It implements the semantics the runtime promises (DESIGN.md, render_c.py's comments):
integers compute in int64 and wrap, narrowing casts and stores wrap, float->int converts
saturating (NaN -> 0), integer division or modulo by zero is an error (the runtime must refuse),
INT64_MIN // -1 == INT64_MIN, bool loads are (byte != 0), half types compute in float and round
on cast and store. It evaluates every lane of every store at once, as the C code evaluates
every node of every lane.

Every value carries three masks: `undef` (the runtime may legitimately produce anything:
a race between lanes, or an index that is not known exactly), `uninit` (derived from memory
nothing wrote) and `approx` (a float computed through libm, compared with a tolerance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from aotrt import dtypes
from aotrt.kernels import ir
from aotrt.kernels.render_c import SUM_BLOCK, SUM_LANES
from aotrt.program.symbols import instantiate

#: the largest iteration grid (outer x reduce elements) and memory the reference evaluates
GRID_LIMIT = 1 << 22
MEMORY_LIMIT = 64 << 20
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1


class RefRefusal(Exception):
    """The program's semantics are an error: the runtime must refuse it (at load or run)."""


class RefUnchecked(Exception):
    """The reference cannot judge this program (too big, or an op it does not model)."""


def _kind(dtype: str) -> str:
    return "f" if dtype in ir.FLOAT_DTYPES else "b" if dtype == "bool" else "i"


@dataclass
class V:
    """A vector value over a kernel's lanes, with its masks (see the module docstring)."""

    v: np.ndarray
    k: str          # compute kind: 'b' bool, 'i' int64, 'f' float32
    undef: np.ndarray
    uninit: np.ndarray
    approx: np.ndarray


def _masks(*xs: V) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    u, n, a = xs[0].undef, xs[0].uninit, xs[0].approx
    for x in xs[1:]:
        u, n, a = u | x.undef, n | x.uninit, a | x.approx
    return u, n, a


def f2i(x: np.ndarray) -> np.ndarray:
    """float -> int64 saturating, NaN -> 0 (the renderer's aot_f2i)."""
    d = np.asarray(x, np.float32).astype(np.float64)
    inside = (d >= -2.0 ** 63) & (d < 2.0 ** 63)
    with np.errstate(all="ignore"):
        out = np.where(inside, d, 0.0).astype(np.int64)
    out = np.where(d >= 2.0 ** 63, I64_MAX, out)
    out = np.where(d < -2.0 ** 63, I64_MIN, out)
    return np.where(np.isnan(d), 0, out).astype(np.int64)


def to_kind(x: V, k: str) -> V:
    """C's conversion of a compute value to another compute kind (float->int saturating)."""
    if x.k == k:
        return x
    u, n, a = x.undef, x.uninit, x.approx
    if k == "b":
        if x.k == "f":
            u = u | a   # near zero an approximation may fall either side
        return V(x.v != 0, "b", u, n, np.zeros_like(a))
    if k == "i":
        if x.k == "f":
            return V(f2i(x.v), "i", u | a, n, np.zeros_like(a))
        return V(x.v.astype(np.int64), "i", u, n, a)
    return V(x.v.astype(np.float32), "f", u, n, a)


def bf16_round(f: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits -> float32, as aot_f_to_bf16 / aot_bf16_to_f."""
    return bf16_to_f(f_to_bf16(f))


def f_to_bf16(f: np.ndarray) -> np.ndarray:
    """The renderer's float -> bfloat16 bits (round to nearest even, NaN quieted)."""
    u = np.ascontiguousarray(f, np.float32).view(np.uint32)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    r = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    q = (u >> np.uint32(16)) | np.uint32(0x40)
    return np.where(nan, q, r).astype(np.uint16)


def bf16_to_f(b: np.ndarray) -> np.ndarray:
    """bfloat16 bits -> float32."""
    return (np.asarray(b, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _round_half(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return bf16_round(x)
    return x.astype(np.float16).astype(np.float32)


_NARROW = {"int32": np.int32, "int16": np.int16, "int8": np.int8, "uint8": np.uint8}
_APPROX_UNARY = {"exp", "exp2", "log", "log2", "log1p", "expm1", "tanh", "sigmoid", "erf", "sin",
                 "cos", "tan", "asin", "acos", "atan", "gelu", "gelu_tanh", "silu"}
_erf = np.frompyfunc(math.erf, 1, 1)


def _f_unary(op: str, x: np.ndarray) -> np.ndarray | None:
    f32 = np.float32
    if op == "neg":
        return -x
    if op == "abs":
        return np.abs(x)
    if op in ("exp", "exp2", "log", "log2", "log1p", "expm1", "sqrt", "tanh", "sin", "cos",
              "tan", "asin", "acos", "floor", "ceil", "trunc"):
        return getattr(np, {"asin": "arcsin", "acos": "arccos"}.get(op, op))(x).astype(f32)
    if op == "atan":
        return np.arctan(x).astype(f32)
    if op == "rsqrt":
        return (f32(1) / np.sqrt(x)).astype(f32)
    if op == "sigmoid":
        return (f32(1) / (f32(1) + np.exp(-x))).astype(f32)
    if op == "relu":
        # relu(-0.0) is -0.0, as torch.relu and the renderer's (x < 0 ? 0 : x); NaN stays
        return np.where(x < 0, f32(0), x).astype(f32)
    if op == "erf":
        return _erf(x.astype(np.float64)).astype(f32)
    if op == "round":
        return np.rint(x).astype(f32)
    if op == "reciprocal":
        return (f32(1) / x).astype(f32)
    if op == "sign":
        return ((x > 0).astype(f32) - (x < 0).astype(f32)).astype(f32)
    if op == "gelu":
        return (0.5 * x.astype(np.float64) * (1 + _erf(x.astype(np.float64) * 0.7071067811865476)
                                               .astype(np.float64))).astype(f32)
    if op == "gelu_tanh":
        d = x.astype(np.float64)
        return (0.5 * d * (1 + np.tanh(0.7978845608028654 * (d + 0.044715 * d ** 3)))).astype(f32)
    if op == "silu":
        return (x.astype(np.float64) / (1 + np.exp(-x.astype(np.float64)))).astype(f32)
    return None


def _f_floordiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    f32 = np.float32
    m = np.fmod(a, b)
    d = ((a - m) / b).astype(f32)
    d = np.where((m != 0) & ((b < 0) != (m < 0)), d - f32(1), d).astype(f32)
    fl = np.floor(d)
    r = np.where(d - fl > f32(0.5), fl + f32(1), fl).astype(f32)
    r = np.where(d == 0, np.copysign(f32(0), a / b), r)
    return np.where(b == 0, a / b, r).astype(f32)


def _f_binary(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    f32 = np.float32
    if op in ("add", "sub", "mul", "div"):
        return {"add": np.add, "sub": np.subtract, "mul": np.multiply,
                "div": np.divide}[op](a, b).astype(f32)
    if op == "truncdiv":
        return np.trunc(a / b).astype(f32)
    if op == "floordiv":
        return _f_floordiv(a, b)
    if op == "pow":
        return np.power(a, b).astype(f32)
    if op == "fmod":
        return np.fmod(a, b).astype(f32)
    if op == "mod":
        r = np.fmod(a, b)
        return np.where((r != 0) & ((r < 0) != (b < 0)), r + b, r).astype(f32)
    if op == "maximum":
        return np.where((a != a) | (a > b), a, b).astype(f32)
    if op == "minimum":
        return np.where((a != a) | (a < b), a, b).astype(f32)
    if op == "atan2":
        return np.arctan2(a, b).astype(f32)
    return None


def _i_binary(op: str, a: np.ndarray, b: np.ndarray, err: list) -> np.ndarray | None:
    if op in ("add", "sub", "mul"):
        return {"add": np.add, "sub": np.subtract, "mul": np.multiply}[op](a, b)
    if op in ("truncdiv", "floordiv", "mod", "fmod"):
        zero = b == 0
        if zero.any():
            err.append(zero)
        m1 = b == -1
        bs = np.where(zero | m1, 1, b)
        q = np.floor_divide(a, bs)
        r = a - q * bs                  # Python remainder (sign of the divisor)
        if op == "floordiv":
            out = np.where(m1, 0 - a, q)
        elif op == "truncdiv":
            out = np.where(m1, 0 - a, np.where((r != 0) & ((a < 0) != (bs < 0)), q + 1, q))
        elif op == "mod":
            out = np.where(m1, 0, r)
        else:
            out = np.where(m1, 0, np.where((r != 0) & ((a < 0) != (bs < 0)), r - bs, r))
        return np.where(zero, 0, out).astype(np.int64)
    if op == "maximum":
        return np.where(a > b, a, b)
    if op == "minimum":
        return np.where(a < b, a, b)
    if op in ("bitwise_and", "bitwise_or", "bitwise_xor"):
        return {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
                "bitwise_xor": np.bitwise_xor}[op](a, b)
    if op == "shl":
        ok = (b >= 0) & (b < 64)
        return np.where(ok, (a.astype(np.uint64) << np.where(ok, b, 0).astype(np.uint64))
                        .astype(np.int64), 0)
    if op == "shr":
        return a >> np.where((b < 0) | (b >= 63), 63, b)
    if op == "pow":
        return _ipow(a, b)
    if op in ("index_check", "index_check_neg"):
        lo = np.where(b > 0, 0 - b, 0) if op == "index_check_neg" else 0
        bad = (a < lo) | (a >= b)
        if bad.any():
            err.append(bad)     # the kernel's error 2 ("index out of range"); i passes
        return a


def _ipow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.broadcast_arrays(a, b)
    neg = np.where(a == 1, 1, np.where(a == -1, np.where(b & 1, -1, 1), 0))
    r = np.ones(a.shape, np.uint64)
    x = a.astype(np.uint64)
    e = np.where(b < 0, 0, b)
    with np.errstate(all="ignore"):
        while (e > 0).any():
            r = np.where(e & 1, r * x, r)
            x = x * x
            e = e >> 1
    return np.where(b < 0, neg, r.astype(np.int64)).astype(np.int64)


class _Kernel:
    """Evaluate one kernel over a memory snapshot; collect its reads, writes and errors."""

    def __init__(self, ref: "Reference", k: ir.Kernel, views: Sequence[dict]) -> None:
        self.ref, self.k, self.views = ref, k, views
        self.nout = len(k.shape)
        self.N = int(np.prod(k.shape, dtype=object)) if k.shape else 1
        self.R = int(np.prod(k.rshape, dtype=object)) if k.rshape else 1
        if self.N * max(self.R, 1) > GRID_LIMIT:
            raise RefUnchecked(f"kernel {k.name}: grid of {self.N}x{self.R}")
        oc = np.unravel_index(np.arange(self.N), k.shape) if k.shape else ()
        rc = np.unravel_index(np.arange(self.R), k.rshape) if k.rshape else ()
        self.coords = [c.reshape(-1, 1) for c in oc] + [c.reshape(1, -1) for c in rc]
        self.memo: dict[tuple[int, str], V] = {}
        self.reads: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.div0: list[str] = []

    def lanes(self, level: str) -> tuple[np.ndarray, np.ndarray]:
        """(outer lane, inner lane or -1) arrays for a level."""
        it = np.arange(self.N).reshape(-1, 1)
        if level == "f":
            return np.broadcast_to(it, (self.N, self.R)), np.broadcast_to(
                np.arange(self.R).reshape(1, -1), (self.N, self.R))
        return it, np.full((self.N, 1), -1)

    def _const(self, e: ir.Const) -> V:
        z = np.zeros((1, 1), bool)
        k = _kind(e.dtype)
        if k == "f":
            v = np.full((1, 1), np.float32(float(e.value)))
        elif k == "b":
            v = np.full((1, 1), bool(e.value))
        else:
            v = np.full((1, 1), int(e.value), np.int64)
        return V(v, k, z, z, z)

    def eval(self, root: ir.Expr, level: str, before: bool = False) -> V:
        """The value of `root` at `level` ('o': per outer lane, 'f': per (outer, reduce))."""
        stack = [(root, False)]
        while stack:
            node, ready = stack.pop()
            key = (id(node), level)
            if key in self.memo:
                continue
            if isinstance(node, ir.Reduce):
                self.memo[key] = self._reduce(node)
                continue
            if not ready:
                stack.append((node, True))
                stack.extend((c, False) for c in ir.children(node))
                continue
            self.memo[key] = self._node(node, level, before)
        return self.memo[(id(root), level)]

    def _node(self, e: ir.Expr, level: str, before: bool) -> V:
        if isinstance(e, ir.Const):
            return self._const(e)
        if isinstance(e, ir.Idx):
            if e.dim >= len(self.coords):
                raise RefRefusal(f"Idx({e.dim}) out of range")
            c = self.coords[e.dim].astype(np.int64)
            z = np.zeros(c.shape, bool)
            return V(c, "i", z, z, z)
        args = [self.memo[(id(c), level)] for c in ir.children(e)]
        if isinstance(e, ir.Load):
            return self._load(e, args[0], level, before)
        return self._op(e, args)

    def _reduce(self, e: ir.Reduce) -> V:
        body = self.eval(e.body, "f", before=True)
        k = _kind(e.dtype)
        f = k == "f"
        init = {"sum": 0, "prod": 1, "max": -np.inf if f else (False if k == "b" else I64_MIN),
                "min": np.inf if f else (True if k == "b" else I64_MAX), "any": 0, "all": 1}
        if e.op not in init:
            raise RefRefusal(f"unknown reduction {e.op}")
        dt = {"f": np.float32, "i": np.int64, "b": bool}[k]
        # a float sum adds each block of SUM_BLOCK in float, element j into lane
        # j % SUM_LANES, the lanes in lane order; the blocks in double, rounded once
        # (render_c._sum_in_double)
        fsum = k == "f" and e.op == "sum"
        acc = np.full((self.N, 1), init[e.op], dtype=dt)
        lanes = np.zeros((self.N, SUM_LANES), np.float32)
        total = np.zeros((self.N, 1), np.float64)
        val = to_kind(body, "i") if k == "i" else body
        vv = np.broadcast_to(val.v, (self.N, self.R))
        u, n, a = (np.broadcast_to(m, (self.N, self.R)).any(axis=1, keepdims=True)
                   for m in (val.undef, val.uninit, val.approx))
        with np.errstate(all="ignore"):
            for j in range(self.R):
                x = vv[:, j:j + 1]
                if fsum:
                    lanes[:, j % SUM_LANES] += x[:, 0].astype(np.float32)
                    if j % SUM_BLOCK == SUM_BLOCK - 1 or j == self.R - 1:
                        block = np.zeros((self.N,), np.float32)
                        for lane in range(SUM_LANES):
                            block += lanes[:, lane]
                        total += block[:, None].astype(np.float64)
                        lanes[:] = 0
                    continue
                if e.op in ("any", "all"):
                    r = (acc != 0) | (x != 0) if e.op == "any" else (acc != 0) & (x != 0)
                elif e.op in ("sum", "prod"):
                    if k == "i":
                        r = acc + x if e.op == "sum" else acc * x
                    elif k == "f":
                        r = (acc + x.astype(np.float32)) if e.op == "sum" else (
                            acc * x.astype(np.float32))
                    else:
                        s = acc.astype(np.float32 if val.k == "f" else np.int64)
                        r = s + x if e.op == "sum" else s * x
                elif k == "f":
                    x = x.astype(np.float32)
                    # aot_fmaxf(acc, val): (acc != acc || acc > val) ? acc : val
                    r = np.where((acc != acc) | ((acc > x) if e.op == "max" else (acc < x)),
                                 acc, x)
                else:
                    r = np.where((x > acc) if e.op == "max" else (x < acc), x, acc)
                acc = (r != 0) if k == "b" else r.astype(dt)
        if fsum:
            acc = total.astype(np.float32)
        return V(acc, k, u, n, a | np.isnan(acc) if k == "f" else np.zeros_like(a))

    def _load(self, e: ir.Load, idx: V, level: str, before: bool) -> V:
        view = self.views[e.arg]
        return self.ref.gather(view, idx, self, level, before)

    def _op(self, e: ir.Op, args: list[V]) -> V:
        op, dt = e.op, e.dtype
        u, n, a = _masks(*args)
        out_k = _kind(dt)
        if op == "cast":
            return self._cast(args[0], e.args[0].dtype, dt)
        if op == "where":
            c = to_kind(args[0], "b")
            x, y = args[1], args[2]
            if out_k == "i":
                x, y = to_kind(x, "i"), to_kind(y, "i")
            elif "f" in (x.k, y.k):
                x, y = to_kind(x, "f"), to_kind(y, "f")
            elif x.k != y.k:
                x, y = to_kind(x, "i"), to_kind(y, "i")
            r = V(np.where(c.v, x.v, y.v), x.k, c.undef | np.where(c.v, x.undef, y.undef),
                  c.uninit | np.where(c.v, x.uninit, y.uninit), np.where(c.v, x.approx, y.approx))
            return to_kind(r, out_k)
        src = e.args[0].dtype
        with np.errstate(all="ignore"):
            allbool = all(x.dtype == "bool" for x in e.args)
            if (src == "bool" and op in ("and", "or", "xor")) or (
                    allbool and op in ("bitwise_and", "bitwise_or", "bitwise_xor")):
                # truth values of both sides (xor must not compare 1 with 5)
                xb, yb = to_kind(args[0], "b"), to_kind(args[1], "b")
                f = {"and": np.logical_and, "or": np.logical_or, "xor": np.not_equal,
                     "bitwise_and": np.logical_and, "bitwise_or": np.logical_or,
                     "bitwise_xor": np.not_equal}[op]
                u = xb.undef | yb.undef
                return to_kind(V(f(xb.v, yb.v).astype(np.int64), "i", u, n, np.zeros_like(u)),
                               out_k)
            if op in ("lt", "le", "gt", "ge", "eq", "ne"):
                x, y = args
                ck = "f" if "f" in (x.k, y.k) else "i"
                x, y = to_kind(x, ck), to_kind(y, ck)
                sym = {"lt": np.less, "le": np.less_equal, "gt": np.greater,
                       "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal}[op]
                v = sym(x.v, y.v).astype(np.int64)
                return to_kind(V(v, "i", u | a, n, np.zeros_like(u)), out_k)
            if op == "bitwise_not" and src == "bool" and dt == "bool":
                x = to_kind(args[0], "b")
                return V(~x.v, "b", u, n, np.zeros_like(u))
            if op in ("isnan", "isinf") and src not in ir.FLOAT_DTYPES:
                return to_kind(V(np.zeros(args[0].v.shape, np.int64), "i", u, n, a & False),
                               out_k)
            floaty = out_k == "f" or op in ("isnan", "isinf")
            if floaty:
                xs = [to_kind(x, "f") for x in args]
                if op in ("isnan", "isinf"):
                    v = (np.isnan(xs[0].v) if op == "isnan" else np.isinf(xs[0].v))
                    return to_kind(V(v.astype(np.int64), "i", u, n, a & False), out_k)
                if op == "not":
                    return to_kind(V((xs[0].v == 0).astype(np.int64), "i", u | a, n,
                                     a & False), out_k)
                r = _f_unary(op, xs[0].v) if len(xs) == 1 else _f_binary(op, xs[0].v, xs[1].v)
                if r is None:
                    raise RefRefusal(f"op {op} is not defined for {dt}")
                inexact = op in _APPROX_UNARY or op in ("pow", "atan2")
                if op in ("floor", "ceil", "round", "trunc", "sign", "truncdiv", "floordiv",
                          "mod", "fmod"):
                    u = u | a      # discontinuous: an approximation decides nothing
                # a NaN's payload is the C compiler's and the CPU's choice (which operand's,
                # or the default one): its bits are approximate, never read as an int
                return V(r.astype(np.float32), "f", u, n, a | inexact | np.isnan(r))
            xs = [to_kind(x, "i") for x in args]
            u, n, a = _masks(*xs)
            if len(xs) == 1:
                x = xs[0].v
                tab = {"neg": lambda: 0 - x, "abs": lambda: np.where(x < 0, 0 - x, x),
                       "relu": lambda: np.where(x > 0, x, 0),
                       "sign": lambda: (x > 0).astype(np.int64) - (x < 0),
                       "not": lambda: (x == 0).astype(np.int64),
                       "bitwise_not": lambda: ~x, "floor": lambda: x, "ceil": lambda: x,
                       "round": lambda: x, "trunc": lambda: x}
                if op not in tab:
                    raise RefRefusal(f"op {op} is not defined for {dt}")
                r = np.asarray(tab[op](), np.int64)
            else:
                err: list = []
                r = _i_binary(op, xs[0].v, xs[1].v, err)
                if r is None:
                    raise RefRefusal(f"op {op} is not defined for {dt}")
                for z in err:
                    zb = np.broadcast_to(z, np.broadcast(z, u).shape)
                    ub = np.broadcast_to(u, zb.shape)
                    if (zb & ~ub).any():
                        self.div0.append(op)
                    u = u | z      # the value of an undefined division is not compared
            return to_kind(V(np.asarray(r, np.int64), "i", u, n, a), out_k)

    def _cast(self, x: V, src: str, dst: str) -> V:
        if dst == "bool":
            return to_kind(x, "b")
        if src in ir.FLOAT_DTYPES and dst not in ir.FLOAT_DTYPES:
            w = to_kind(x, "i")
            if dst in _NARROW:
                w = V(w.v.astype(_NARROW[dst]).astype(np.int64), "i", w.undef, w.uninit, w.approx)
            return w
        if dst in _NARROW:
            # wraps even from its own dtype: a narrow-typed op computes in int64 (render_c)
            w = to_kind(x, "i")
            return V(w.v.astype(_NARROW[dst]).astype(np.int64), "i", w.undef, w.uninit, w.approx)
        if dst in ("float16", "bfloat16") and src != dst:
            f = to_kind(x, "f")
            with np.errstate(all="ignore"):
                h = _round_half(f.v, dst)
            return V(h, "f", f.undef, f.uninit, f.approx | np.isnan(h))
        return to_kind(x, _kind(dst))


class Reference:
    """Run a validated aotrt.Program on numpy inputs; `run` returns the outputs' values and masks.

    Memory is one byte array per root with three byte masks (undef, uninit, approx) and a
    `written` mask: outputs whose bytes nothing wrote are reported by `compare`.
    """

    def __init__(self, prog: Any) -> None:
        self.prog = prog
        methods = prog.methods
        # the roots every method shares (constants, state) live as long as the Reference;
        # a run gets fresh arena, input and output roots (a run may not rely on what an
        # earlier run left in the arena: it starts undefined)
        shared = prog.root_nbytes()
        per_run = max((sum(sum(m.root_nbytes()[r]) for r in ("arena", "input", "output"))
                       for m in methods.values()), default=0)
        total = sum(shared["constant"]) + sum(shared["state"]) + per_run
        if total > MEMORY_LIMIT:
            raise RefUnchecked(f"{total} bytes of memory")
        self.mem: dict[tuple[str, int], dict[str, np.ndarray]] = {}
        for root in ("constant", "state"):
            for i, nb in enumerate(shared[root]):
                self.mem[(root, i)] = {
                    "b": np.zeros(nb, np.uint8), "undef": np.zeros(nb, bool),
                    "uninit": np.zeros(nb, bool), "approx": np.zeros(nb, bool),
                    "written": np.ones(nb, bool)}
        for i, arr in enumerate(prog.constants.values()):
            self.mem[("constant", i)]["b"][:] = np.ascontiguousarray(arr).reshape(-1).view(
                np.uint8)
        # a state starts as its init constant's bytes, or zeros
        for i, spec in enumerate(prog.state):
            if spec["init"] is not None:
                arr = prog.constants[spec["init"]]
                self.mem[("state", i)]["b"][:] = np.ascontiguousarray(arr).reshape(-1).view(
                    np.uint8)
        self._begin(next(iter(methods)))

    def _begin(self, method: str, sizes: Mapping[str, int] | None = None) -> None:
        """Fresh per-run roots for a run of `method` (a dynamic one's at `sizes`)."""
        self.p = self.prog.methods[method]
        if sizes is not None:
            self.p = instantiate(self.p, sizes)
        for key in [k for k in self.mem if k[0] not in ("constant", "state")]:
            del self.mem[key]
        for root in ("arena", "input", "output"):
            for i, nb in enumerate(self.p.root_nbytes()[root]):
                init = root == "input"
                self.mem[(root, i)] = {
                    "b": np.zeros(nb, np.uint8), "undef": np.full(nb, not init),
                    "uninit": np.full(nb, not init), "approx": np.zeros(nb, bool),
                    "written": np.full(nb, init)}
        base = 0
        self.base: dict[tuple[str, int], int] = {}
        for key, m in self.mem.items():
            self.base[key] = base
            base += len(m["b"]) + 64

    # -- views --------------------------------------------------------------------------------

    @staticmethod
    def _view(t: dict) -> tuple[tuple[str, int], int, int, np.dtype, list, list]:
        dt = dtypes.as_dtype(t["dtype"])
        return (t["root"], t["index"]), t["byte_offset"], dt.itemsize, dt, t["sizes"], t["strides"]

    def positions(self, t: dict) -> np.ndarray:
        """Byte offsets in the root of every element of view `t` (shape = its sizes)."""
        _, off, isz, _, sizes, strides = self._view(t)
        pos = np.full(tuple(sizes), off, np.int64)
        for d, (n, s) in enumerate(zip(sizes, strides)):
            shape = [1] * len(sizes)
            shape[d] = n
            pos = pos + (np.arange(n, dtype=np.int64) * s * isz).reshape(shape)
        return pos

    def _elems(self, t: dict) -> int:
        _, _, _, _, sizes, strides = self._view(t)
        if any(n == 0 for n in sizes):
            return 0
        return 1 + sum((n - 1) * s for n, s in zip(sizes, strides) if n > 1)

    def _read(self, key: tuple[str, int], pos: np.ndarray, dt: Any) -> tuple[np.ndarray, ...]:
        m = self.mem[key]
        isz = dt.itemsize
        byt = pos[..., None] + np.arange(isz)
        raw = m["b"][byt]
        vals = np.ascontiguousarray(raw).view(dt.np if dt.name != "bool" else np.uint8)[..., 0]
        return (vals, m["undef"][byt].any(-1), m["uninit"][byt].any(-1),
                m["approx"][byt].any(-1))

    def gather(self, t: dict, idx: V, kern: _Kernel, level: str, before: bool) -> V:
        """A Load: element `idx` of view `t`, with bounds checked on every known lane."""
        key, off, isz, dt, _, _ = self._view(t)
        iv = to_kind(idx, "i")
        unk = iv.undef | iv.uninit | iv.approx
        n = self._elems(t)
        bad = ((iv.v < 0) | (iv.v >= n)) & ~unk
        shape = np.broadcast(iv.v, np.zeros(kern.lanes(level)[0].shape)).shape
        if bad.any() and kern.N * kern.R > 0:
            raise RefRefusal(f"kernel {kern.k.name} loads element {int(iv.v[bad][0])} of a "
                             f"{n}-element view")
        safe = np.broadcast_to(np.where(bad | unk | (iv.v < 0) | (iv.v >= n), 0, iv.v), shape)
        if n == 0:
            z = np.ones(shape, bool)
            vals = np.zeros(shape, dt.np if dt.name != "bool" else np.uint8)
            und, uni, apx = z, np.broadcast_to(iv.uninit, shape), ~z
        else:
            pos = off + safe * isz
            vals, und, uni, apx = self._read(key, pos, dt)
            it, je = kern.lanes(level)
            if before:
                je = np.full(np.broadcast_to(je, shape).shape, -1)
            kern.reads.append((self.base[key] + pos, np.broadcast_to(it, shape),
                               np.broadcast_to(je, shape), isz))
        und = und | np.broadcast_to(iv.undef | iv.approx, shape)
        uni = uni | np.broadcast_to(iv.uninit, shape)
        if dt.name in ("float32", "float16"):
            return V(vals.astype(np.float32), "f", und, uni, apx)
        if dt.name == "bfloat16":
            return V(bf16_to_f(vals.view(np.uint16)), "f", und, uni, apx)
        # bytes of an approximate float (a NaN's payload) read as an integer: any bits
        und = und | apx
        if dt.name == "bool":
            return V(vals != 0, "b", und, uni, np.zeros(shape, bool))
        return V(vals.astype(np.int64), "i", und, uni, np.zeros(shape, bool))

    # -- instructions -------------------------------------------------------------------------

    def set_input(self, i: int, arr: np.ndarray) -> None:
        """Place input `i`'s elements at its spec's strides."""
        spec = self.p.inputs[i]
        t = {"root": "input", "index": i, "byte_offset": 0, "dtype": spec["dtype"],
             "sizes": spec["shape"], "strides": spec["strides"]}
        pos = self.positions(t)
        dt = dtypes.as_dtype(spec["dtype"])
        raw = np.ascontiguousarray(arr).view(np.uint8).reshape(*arr.shape, dt.itemsize)
        self.mem[("input", i)]["b"][pos[..., None] + np.arange(dt.itemsize)] = raw

    def run(self, inputs: Sequence[np.ndarray], method: str | None = None,
            sizes: Mapping[str, int] | None = None) -> list[dict[str, np.ndarray]]:
        """Execute the instructions of `method` (default: the first; a dynamic one's with its
        symbols at `sizes`, else as stored) from the state the runs before left; the
        outputs as dicts of values and masks."""
        self._begin(next(iter(self.prog.methods)) if method is None else method, sizes)
        for i, x in enumerate(inputs):
            self.set_input(i, x)
        kernels = {k.name: k for k in self.p.kernels}
        for ins in self.p.instructions:
            op = ins["op"]
            if op == "kernel":
                self._kernel(kernels[ins["name"]], [self.p.tensors[a] for a in ins["args"]])
            elif op == "copy":
                self._copy(self.p.tensors[ins["dst"]], self.p.tensors[ins["src"]])
            elif op == "library":
                self._library(ins)
        outs = []
        for k, spec in enumerate(self.p.outputs):
            t = {"root": "output", "index": k, "byte_offset": 0, "dtype": spec["dtype"],
                 "sizes": spec["shape"], "strides": spec["strides"]}
            dt = dtypes.as_dtype(spec["dtype"])
            pos = self.positions(t)
            vals, und, uni, apx = self._read(("output", k), pos, dt) if pos.size else (
                np.zeros(pos.shape, np.uint8), *(np.zeros(pos.shape, bool),) * 3)
            m = self.mem[("output", k)]
            byt = pos[..., None] + np.arange(dt.itemsize)
            unwritten = ~m["written"][byt].all(-1) if pos.size else np.zeros(pos.shape, bool)
            outs.append({"v": vals, "undef": und, "uninit": uni, "approx": apx,
                         "unwritten": unwritten, "dtype": dt.name})
        return outs

    def state_values(self) -> list[dict[str, np.ndarray]]:
        """Every state buffer as it is now, as `run` gives outputs (for `compare`)."""
        outs = []
        for i, spec in enumerate(self.prog.state):
            dt = dtypes.as_dtype(spec["dtype"])
            shape = [int(n) for n in spec["shape"]]
            strides, n = [], 1
            for size in reversed(shape):
                strides.insert(0, n)
                n *= max(size, 1)
            t = {"root": "state", "index": i, "byte_offset": 0, "dtype": dt.name,
                 "sizes": shape, "strides": strides}
            pos = self.positions(t)
            vals, und, uni, apx = self._read(("state", i), pos, dt) if pos.size else (
                np.zeros(pos.shape, np.uint8), *(np.zeros(pos.shape, bool),) * 3)
            outs.append({"v": vals, "undef": und, "uninit": uni, "approx": apx,
                         "unwritten": np.zeros(pos.shape, bool), "dtype": dt.name})
        return outs

    def _write(self, key: tuple[str, int], pos: np.ndarray, raw: np.ndarray,
               masks: tuple[np.ndarray, ...], racy: bool) -> None:
        m = self.mem[key]
        isz = raw.shape[-1]
        byt = (pos[..., None] + np.arange(isz)).reshape(-1)
        raw = raw.reshape(-1)
        und, uni, apx = (np.repeat(np.asarray(x).reshape(-1), isz) for x in masks)
        # Bytes written twice with different values (or flagged racy) end up undefined.
        order = np.argsort(byt, kind="stable")
        b_s, r_s = byt[order], raw[order]
        dup = np.zeros(len(b_s), bool)
        if len(b_s) > 1:
            same = b_s[1:] == b_s[:-1]
            diff = same & (r_s[1:] != r_s[:-1])
            bad_addr = np.unique(b_s[1:][diff])
            dup = np.isin(byt, bad_addr)
        m["b"][byt] = raw
        m["undef"][byt] = und | dup | racy
        m["uninit"][byt] = uni
        m["approx"][byt] = apx
        m["written"][byt] = True

    def _kernel(self, k: ir.Kernel, views: list[dict]) -> None:
        kern = _Kernel(self, k, views)
        if kern.N == 0:
            return
        nouter = len(k.shape)
        pending = []
        for st in k.stores:
            inner = _uses_rdim(st, nouter)
            level = "f" if inner else "o"
            if inner and kern.R == 0:
                continue
            idx = kern.eval(st.index, level)
            val = kern.eval(st.value, level)
            pending.append((st, level, idx, val))
        if kern.div0:
            what = ("an index out of range" if kern.div0[0].startswith("index_check")
                    else f"integer {kern.div0[0]} by zero")
            raise RefRefusal(f"kernel {k.name}: {what}")
        writes = []
        for st, level, idx, val in pending:
            t = views[st.arg]
            key, off, isz, dt, _, _ = self._view(t)
            n = self._elems(t)
            iv = to_kind(idx, "i")
            unk = iv.undef | iv.uninit | iv.approx
            shape = np.broadcast(iv.v, val.v, np.zeros(kern.lanes(level)[0].shape)).shape
            ivb = np.broadcast_to(iv.v, shape)
            unkb = np.broadcast_to(unk, shape)
            bad = ((ivb < 0) | (ivb >= n)) & ~unkb
            if bad.any():
                raise RefRefusal(f"kernel {k.name} stores to element {int(ivb[bad][0])} of a "
                                 f"{n}-element view")
            if unkb.any():
                # A store to an unknown index may land anywhere in the view.
                allpos = off + np.arange(n) * isz
                full = np.broadcast_to(np.ones(1, bool), allpos.shape)
                self._write(key, allpos, self._read(key, allpos, dt)[0].view(np.uint8).reshape(
                    n, isz), (full, np.broadcast_to(iv.uninit.any(), allpos.shape), ~full),
                    False)
                ok = ~unkb
            else:
                ok = np.ones(shape, bool)
            raw = self._store_bytes(val, st.value.dtype, dt.name)
            raw = np.broadcast_to(raw, (*shape, isz))
            pos = off + ivb * isz
            it, je = kern.lanes(level)
            writes.append((key, pos[ok], raw[ok], tuple(np.broadcast_to(m, shape)[ok] for m in (
                val.undef, val.uninit, val.approx)), np.broadcast_to(it, shape)[ok],
                np.broadcast_to(je, shape)[ok], isz))
        racy = self._conflict(kern, writes)
        for key, pos, raw, masks, _, _, _ in writes:
            self._write(key, pos, raw, masks, racy)
        self._undef_lane_races(kern, writes)

    def _undef_lane_races(self, kern: _Kernel, writes: list) -> None:
        """Mark undefined each byte that two lanes write with different values, across the
        kernel's stores too: which lane writes last depends on their order (threads, or a
        store of one lane after another store of an earlier one). One lane's own stores
        happen in program order, which `_write` follows. (Campaign mutant 32642 of master 36:
        one store's row stride 64 made 63 wrote the other store's bytes a lane earlier.)"""
        if len(writes) < 2:
            return      # one store's lanes: _write marks its duplicate bytes
        byt, lane, val = [], [], []
        for key, pos, raw, _, it, je, isz in writes:
            b = (self.base[key] + pos)[..., None] + np.arange(isz)
            byt.append(b.reshape(-1))
            lane.append(np.repeat((it * (kern.R + 1) + je).reshape(-1), isz))
            val.append(np.asarray(raw).reshape(-1))
        b_a, l_a, v_a = (np.concatenate(x) for x in (byt, lane, val))
        order = np.lexsort((l_a, b_a))
        b_s, l_s, v_s = b_a[order], l_a[order], v_a[order]
        clash = (b_s[1:] == b_s[:-1]) & (l_s[1:] != l_s[:-1]) & (v_s[1:] != v_s[:-1])
        if not clash.any():
            return
        bad = np.unique(b_s[1:][clash])
        for key, pos, _, _, _, _, isz in writes:
            b = (self.base[key] + pos)[..., None] + np.arange(isz)
            hit = np.isin(b.reshape(-1), bad)
            if hit.any():
                self.mem[key]["undef"][(pos[..., None] + np.arange(isz)).reshape(-1)[hit]] = True

    def _conflict(self, kern: _Kernel, writes: list) -> bool:
        """Whether some byte the kernel writes is also read by another lane (order matters)."""
        if not writes or not kern.reads:
            return False
        wb, wl = [], []
        for key, pos, _, _, it, je, isz in writes:
            b = (self.base[key] + pos)[:, None] + np.arange(isz)
            wb.append(b.reshape(-1))
            wl.append(np.repeat(it * (kern.R + 1) + je + 1, isz))
        wb_a, wl_a = np.concatenate(wb), np.concatenate(wl)
        rb, rl, rit = [], [], []
        for pos, it, je, isz in kern.reads:
            b = pos.reshape(-1)[:, None] + np.arange(isz)
            rb.append(b.reshape(-1))
            rl.append(np.repeat((it * (kern.R + 1) + je + 1).reshape(-1), isz))
            rit.append(np.repeat(np.broadcast_to(it, pos.shape).reshape(-1), isz))
        rb_a, rl_a, rit_a = np.concatenate(rb), np.concatenate(rl), np.concatenate(rit)
        hit = np.isin(rb_a, wb_a)
        if not hit.any():
            return False
        if len(writes) > 1 or len(kern.k.stores) > 1 or len(np.unique(wb_a)) != len(wb_a):
            return True
        lane_of = dict(zip(wb_a.tolist(), wl_a.tolist()))
        for b, lane, it in zip(rb_a[hit].tolist(), rl_a[hit].tolist(), rit_a[hit].tolist()):
            w = lane_of[b]
            # Fine: the writing lane itself, or its own outer lane before its reduce loop. A
            # read by another outer lane of what this one writes depends on the lanes' order
            # (an in-place kernel reading a neighbour: acc[i] = acc[i - 1] + x[i]).
            if lane != w and not (lane == it * (kern.R + 1) and w // (kern.R + 1) == it):
                return True
        return False

    @staticmethod
    def _store_bytes(val: V, vdtype: str, dst: str) -> np.ndarray:
        with np.errstate(all="ignore"):
            if vdtype in ir.FLOAT_DTYPES and dst not in ir.FLOAT_DTYPES:
                if dst == "bool":
                    v = (val.v != 0).astype(np.uint8)
                else:
                    v = f2i(val.v)
                    v = v.astype(_NARROW[dst]) if dst in _NARROW else v
            elif dst == "bool":
                v = (val.v != 0).astype(np.uint8)
            elif dst == "bfloat16":
                v = f_to_bf16(val.v.astype(np.float32))
            elif dst in ("float32", "float16"):
                v = val.v.astype(np.float32).astype(np.float16 if dst == "float16" else
                                                    np.float32)
            else:
                v = val.v.astype(np.int64).astype(_NARROW.get(dst, np.int64))
        v = np.ascontiguousarray(v)
        return v.view(np.uint8).reshape(*v.shape, v.dtype.itemsize)

    def _copy(self, dst: dict, src: dict) -> None:
        skey, _, isz, dt, _, _ = self._view(src)
        dkey = self._view(dst)[0]
        sp, dp = self.positions(src), self.positions(dst)
        if sp.size == 0:
            return
        vals, und, uni, apx = self._read(skey, sp, dt)
        racy = False
        if skey == dkey:
            sb = set((sp[..., None] + np.arange(isz)).reshape(-1).tolist())
            db = (dp[..., None] + np.arange(isz)).reshape(-1)
            racy = bool(np.isin(db, list(sb)).any()) and not np.array_equal(sp, dp)
        raw = np.ascontiguousarray(vals).view(np.uint8).reshape(*vals.shape, isz)
        self._write(dkey, dp, raw, (und, uni, apx), racy)

    def _library(self, ins: dict) -> None:
        # imported here: reference_lib imports this module
        from tests.fuzz import reference_lib
        reference_lib.run(self, ins)


def _uses_rdim(st: ir.Store, nouter: int) -> bool:
    stack: list = [st.index, st.value]
    seen: set[int] = set()
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ir.Idx) and e.dim >= nouter:
            return True
        if not isinstance(e, ir.Reduce):
            stack.extend(ir.children(e))
    return False


def compare(ref_outs: list[dict], got: Sequence[np.ndarray]) -> str:
    """'' when the runtime's outputs equal the reference's, else what differs."""
    for k, (r, g) in enumerate(zip(ref_outs, got)):
        g = np.asarray(g)
        if g.shape != r["v"].shape:
            return f"output {k}: shape {g.shape}, expected {r['v'].shape}"
        if r["unwritten"].any():
            return f"output {k}: {int(r['unwritten'].sum())} elements never written were returned"
        check = ~(r["undef"] | r["uninit"])
        dt = r["dtype"]
        if dt not in ir.FLOAT_DTYPES:
            check &= ~r["approx"]       # an approximate float's bytes (a NaN's payload)
        if dt == "bool":
            gv = np.ascontiguousarray(g).view(np.uint8)
            bad = check & (gv != r["v"].astype(np.uint8))
        elif dt in ir.INT_DTYPES:
            bad = check & (g != r["v"])
        else:
            rv = bf16_to_f(r["v"].view(np.uint16)) if dt == "bfloat16" else r["v"].astype(
                np.float32)
            gv = (bf16_to_f(np.ascontiguousarray(g).view(np.uint16)) if dt == "bfloat16"
                  else g.astype(np.float32))
            both_nan = np.isnan(rv) & np.isnan(gv)
            exact = (rv.view(np.uint32) == gv.view(np.uint32)) | both_nan
            tol = 2e-2 if dt != "float32" else 1e-3
            with np.errstate(all="ignore"):
                close = both_nan | (rv == gv) | (np.abs(rv.astype(np.float64) - gv) <=
                                                 tol * np.maximum(1.0, np.abs(rv)))
            bad = check & np.where(r["approx"], ~close, ~exact)
        if bad.any():
            i = np.argwhere(bad)[0]
            return (f"output {k} ({dt}): {int(bad.sum())} elements differ, first at "
                    f"{tuple(int(x) for x in i)}: got {g[tuple(i)]!r}, expected "
                    f"{r['v'][tuple(i)]!r}")
    return ""
