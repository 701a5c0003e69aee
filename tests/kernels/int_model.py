"""An exact Python model of the integer arithmetic generated kernels compute, and a random
generator of integer kernel IR over every op and dtype (used by test_bounds and
test_hostile_kernels).

The model is the contract between bounds.py and the renderers: int64 values that wrap,
narrowing casts that wrap, floats that become integers saturating (NaN -> 0), division by 0
giving 0, x / -1 == -x (wrapping), x % -1 == 0, and shifts and powers as torch defines them.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from aotrt.kernels import ir

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
RANGE = dict(ir.INT_RANGE)
INT_DTYPES = ir.INT_DTYPES
EDGE = [0, 1, -1, 2, -2, 3, 7, -7, 62, 63, 64, -64, 65, 127, -128, 128, 255, 256, 32767,
        -32768, (1 << 31) - 1, -(1 << 31), 1 << 32, 3037000499, 3037000500, -3037000500,
        INT64_MAX, INT64_MIN, INT64_MAX - 1, INT64_MIN + 1, 1 << 62, -(1 << 62)]
FLOAT_EDGE = [0.0, -0.0, 0.5, -0.5, 2.7, -2.7, 127.9, 128.0, -129.0, 255.5, 300.0, 1e10, -1e10,
              2.0**31, 2.0**63, -(2.0**63), 2.0**64, 1e30, -1e30, math.inf, -math.inf, math.nan]

ARITH = ("add", "sub", "mul", "maximum", "minimum", "floordiv", "truncdiv", "mod", "fmod",
         "bitwise_and", "bitwise_or", "bitwise_xor", "shl", "shr", "pow")
DIVISIONS = ("floordiv", "truncdiv", "mod", "fmod")
UNARY = ("neg", "abs", "relu", "sign", "bitwise_not", "floor", "ceil", "round", "trunc")
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")


def wrap(v: int, dtype: str = "int64") -> int:
    """`v` wrapped into integer `dtype` (two's complement; bool is v != 0)."""
    if dtype == "bool":
        return int(v != 0)
    lo, hi = RANGE[dtype]
    span = hi - lo + 1
    return (v - lo) % span + lo


def f2i(x: float) -> int:
    """The saturating float -> int64 conversion (NaN -> 0)."""
    if x != x:
        return 0
    if x >= 2.0**63:
        return INT64_MAX
    if x < -(2.0**63):
        return INT64_MIN
    return int(x)


def to_f32(x: object) -> float:
    """`x` rounded once to the nearest float32 (ties to even), as C's (float) does."""
    if isinstance(x, float):
        return float(np.float32(x))
    n = int(x)   # type: ignore[call-overload]
    shift = abs(n).bit_length() - 24
    if shift <= 0:
        return float(n)
    q, r = divmod(abs(n), 1 << shift)
    half = 1 << (shift - 1)
    if r > half or (r == half and q & 1):
        q += 1
    return math.copysign(float(q << shift), n)


def tdiv(a: int, b: int) -> int:
    """C's truncating division (b != 0)."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def binary(op: str, a: int, b: int) -> int:
    """One integer binary op as the kernels compute it (int64, wrapping)."""
    if op == "add":
        return wrap(a + b)
    if op == "sub":
        return wrap(a - b)
    if op == "mul":
        return wrap(a * b)
    if op == "maximum":
        return max(a, b)
    if op == "minimum":
        return min(a, b)
    if op in DIVISIONS:
        if b == 0:
            return 0
        if b == -1:
            return wrap(-a) if op in ("floordiv", "truncdiv") else 0
        if op == "floordiv":
            return a // b
        if op == "truncdiv":
            return tdiv(a, b)
        if op == "mod":
            return a % b
        return a - b * tdiv(a, b)
    if op == "bitwise_and":
        return a & b
    if op == "bitwise_or":
        return a | b
    if op == "bitwise_xor":
        return a ^ b
    if op == "shl":
        return 0 if b < 0 or b >= 64 else wrap(a << b)
    if op == "shr":
        return a >> (63 if b < 0 or b >= 63 else b)
    if op == "pow":
        if b < 0:
            return 1 if a == 1 else ((-1 if b & 1 else 1) if a == -1 else 0)
        return wrap(pow(a, b, 1 << 64))
    if op in COMPARE:
        return int({"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b,
                    "ne": a != b}[op])
    raise ValueError(op)


def unary(op: str, a: int) -> int:
    """One integer unary op as the kernels compute it."""
    if op == "neg":
        return wrap(-a)
    if op == "abs":
        return wrap(abs(a))
    if op == "relu":
        return max(a, 0)
    if op == "sign":
        return (a > 0) - (a < 0)
    if op == "bitwise_not":
        return ~a
    if op == "not":
        return int(a == 0)
    if op in ("floor", "ceil", "round", "trunc"):
        return a
    raise ValueError(op)


def evaluate(e: ir.Expr, idx: Sequence[int], load: Callable[[int, int, str], object]) -> object:
    """The value of integer (or float32 leaf) expression `e`: ints as Python ints, float32
    values as Python floats. `load(arg, index, dtype)` reads an argument element."""
    memo: dict[int, object] = {}
    stack: list[tuple[ir.Expr, bool]] = [(e, False)]
    while stack:
        node, ready = stack.pop()
        if id(node) in memo:
            continue
        if not ready:
            stack.append((node, True))
            stack.extend((c, False) for c in ir.children(node))
            continue
        memo[id(node)] = _eval_node(node, memo, idx, load)
    return memo[id(e)]


def _as_int(v: object) -> int:
    return f2i(v) if isinstance(v, float) else int(v)   # type: ignore[arg-type]


def _eval_node(e: ir.Expr, memo: dict, idx: Sequence[int], load: Callable) -> object:
    if isinstance(e, ir.Const):
        return float(e.value) if e.dtype in ir.FLOAT_DTYPES else int(e.value)
    if isinstance(e, ir.Idx):
        return idx[e.dim]
    if isinstance(e, ir.Load):
        return load(e.arg, _as_int(memo[id(e.index)]), e.dtype)
    assert isinstance(e, ir.Op)
    args = [memo[id(a)] for a in e.args]
    if e.op == "cast":
        (x,) = args
        src = e.args[0].dtype
        if e.dtype == "float32":
            return to_f32(x)
        if e.dtype == "bool":
            return int(x != 0)
        return wrap(f2i(x) if src in ir.FLOAT_DTYPES else int(x), e.dtype)
    if e.op == "where":
        c, x, y = args
        v = _as_int(x) if c != 0 else _as_int(y)
    elif e.op == "bitwise_not" and e.dtype == "bool" and e.args[0].dtype == "bool":
        v = int(args[0] == 0)       # ~ of a bool is logical not, as torch's
    elif len(args) == 1:
        v = unary(e.op, _as_int(args[0]))
    else:
        v = binary(e.op, _as_int(args[0]), _as_int(args[1]))
    # A bool-typed op is a C bool: any non-zero value is 1.
    return int(v != 0) if e.dtype == "bool" else v


class Gen:
    """Random integer IR over every op and dtype; `pick(n)` chooses in [0, n)."""

    def __init__(self, pick: Callable[[int], int], leaves: Callable[[], ir.Expr],
                 safe_division: bool = False) -> None:
        self.pick = pick
        self.leaves = leaves
        self.safe_division = safe_division

    def choice(self, xs: Sequence):
        return xs[self.pick(len(xs))]

    def expr(self, depth: int) -> ir.Expr:
        if depth <= 0 or self.pick(4) == 0:
            return self.leaves()
        kind = self.pick(10)
        if kind < 5:
            op = self.choice(ARITH)
            a, b = self.expr(depth - 1), self.expr(depth - 1)
            if self.safe_division and op in DIVISIONS:
                # cpu raises on a zero divisor (tested on its own): keep divisors non-zero
                zero = ir.Op("eq", (b, ir.Const(0, "int64")), "bool")
                b = ir.Op("where", (zero, ir.Const(7, "int64"), b), "int64")
            return ir.Op(op, (a, b), self.choice(("int64",) * 6 + INT_DTYPES[1:] + ("bool",)))
        if kind < 7:
            return ir.Op("cast", (self.expr(depth - 1),),
                         self.choice(INT_DTYPES + ("bool",)))
        if kind == 7:
            return ir.Op(self.choice(UNARY), (self.expr(depth - 1),), "int64")
        if kind == 8:
            cond = ir.Op(self.choice(COMPARE), (self.expr(depth - 1), self.expr(depth - 1)),
                         "bool")
            return ir.Op("where", (cond, self.expr(depth - 1), self.expr(depth - 1)), "int64")
        # a float on its way to an integer: int -> float32 -> int
        f = ir.Op("cast", (self.expr(depth - 1),), "float32")
        return ir.Op("cast", (f,), self.choice(INT_DTYPES))
