"""Sound integer ranges of kernel index expressions: the memory safety of generated kernels.

Program.load proves every load and store of a program's kernels stays inside its view, and
every kernel dispatch checks the same ranges against the allocation it binds.

The model is the arithmetic the renderers emit (render_c.CStyleRenderer), exactly:
- every integer is computed as an int64 that wraps (add, sub, mul, neg, abs, shl, pow and
  integer sums and products go through uint64_t), so a result that may leave int64 becomes
  the whole int64 range;
- a cast to a narrower integer type wraps: it keeps its source's range when that fits the
  target, else it is the target type's whole range; bool is [0, 1];
- a float becomes an integer by a saturating conversion (NaN gives 0), then wraps as above;
- integer division and modulo give 0 for a zero divisor (the cpu also raises), x / -1 is
  -x (wrapping), x % -1 is 0; shifts by a negative amount or by 64 or more are defined as
  torch defines them (0 for <<, the sign for >>);
- a load of an integer type gives that type's range; a bool is loaded as (byte != 0).
"""

from __future__ import annotations

from typing import Any, Optional

from aotrt.kernels import ir

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

Range = Optional[tuple[int, int]]

_FULL = (INT64_MIN, INT64_MAX)
_LOAD_RANGE = dict(ir.INT_RANGE)
_BOOL_OPS = frozenset({"lt", "le", "gt", "ge", "eq", "ne", "and", "or", "xor", "not", "isnan",
                       "isinf"})


def _clamp(lo: int, hi: int) -> tuple[int, int]:
    # Outside int64 the C code wraps, so the value can be anything an int64 holds.
    if lo < INT64_MIN or hi > INT64_MAX:
        return _FULL
    return lo, hi


def _span(values: Any) -> tuple[int, int]:
    vals = list(values)
    return _clamp(min(vals), max(vals))


def _union(*ranges: Range) -> Range:
    rs = [r for r in ranges if r is not None]
    if not rs:
        return None
    return (min(r[0] for r in rs), max(r[1] for r in rs))


def int_range(dtype: str) -> tuple[int, int]:
    """The values of an integer (or bool) dtype; int64's for anything else."""
    return _LOAD_RANGE.get(dtype, _FULL)


def cast_range(src: Range, src_dtype: str, dst: str) -> Range:
    """The range of a cast of a value of range `src` (of dtype `src_dtype`) to `dst`."""
    if src is None:
        return None
    if dst == "bool":
        return (0, 1)
    if dst in ir.FLOAT_DTYPES:
        return _FULL
    lo, hi = int_range(dst)
    if src_dtype in ir.FLOAT_DTYPES:
        return (lo, hi)          # saturating conversion, then a wrap into dst
    if lo <= src[0] and src[1] <= hi:
        return src
    return (lo, hi)


def _divide(op: str, x: tuple[int, int], y: tuple[int, int]) -> tuple[int, int]:
    """floordiv / truncdiv over every x in `x`, y in `y` (see the module docstring)."""
    (a, b), (c, d) = x, y
    div = (lambda p, q: p // q) if op == "floordiv" else _tdiv
    parts: list[Range] = []
    if c <= 0 <= d:
        parts.append((0, 0))
    for lo, hi in ((c, min(d, -1)), (max(c, 1), d)):
        if lo > hi:
            continue
        if lo <= -1 <= hi and a == INT64_MIN:
            return _FULL          # INT64_MIN / -1 wraps to INT64_MIN
        # x / y is monotone in each of x and y on a rectangle that excludes y == 0,
        # and so are its floor and its truncation: the extremes are at the corners.
        parts.append(_span(div(p, q) for p in (a, b) for q in (lo, hi)))
    return _union(*parts) or (0, 0)


def _tdiv(x: int, y: int) -> int:
    """C's truncating division (y != 0)."""
    q = abs(x) // abs(y)
    return q if (x < 0) == (y < 0) else -q


def _mod(x: tuple[int, int], y: tuple[int, int]) -> tuple[int, int]:
    """Python's modulo (the sign of the divisor) over the ranges."""
    (a, b), (c, d) = x, y
    parts: list[Range] = []
    if c <= 0 <= d:
        parts.append((0, 0))
    c1, d1 = max(c, 1), d
    if c1 <= d1:
        if a >= 0 and b < c1:
            parts.append((a, b))
        else:
            parts.append((0, min(d1 - 1, b) if a >= 0 else d1 - 1))
    c2, d2 = c, min(d, -1)
    if c2 <= d2:
        if b <= 0 and a > d2:
            parts.append((a, b))
        else:
            parts.append((max(c2 + 1, a) if b <= 0 else c2 + 1, 0))
    return _union(*parts) or (0, 0)


def _fmod(x: tuple[int, int], y: tuple[int, int]) -> tuple[int, int]:
    """C's remainder (the sign of the dividend) over the ranges."""
    (a, b), (c, d) = x, y
    parts: list[Range] = []
    if c <= 0 <= d:
        parts.append((0, 0))
    nonzero = [(lo, hi) for lo, hi in ((c, min(d, -1)), (max(c, 1), d)) if lo <= hi]
    if nonzero:
        big = max(max(abs(lo), abs(hi)) for lo, hi in nonzero)       # largest |y|
        small = min(min(abs(lo), abs(hi)) for lo, hi in nonzero)     # smallest |y|
        if (a >= 0 and b < small) or (b <= 0 and -a < small):
            parts.append((a, b))
        else:
            parts.append((max(a, -(big - 1)) if a < 0 else 0, min(b, big - 1) if b > 0 else 0))
    return _union(*parts) or (0, 0)


def _bits(lo: int, hi: int) -> int:
    """The least k with -2**k <= lo and hi < 2**k (values of a k+1 bit two's complement)."""
    return max((-lo - 1).bit_length() if lo < 0 else 0, hi.bit_length() if hi > 0 else 0)


def _bitwise(op: str, x: tuple[int, int], y: tuple[int, int]) -> tuple[int, int]:
    (a, b), (c, d) = x, y
    k = max(_bits(a, b), _bits(c, d))
    generic = (-(1 << k), (1 << k) - 1)   # and/or/xor of k+1 bit values are k+1 bit values
    if op == "bitwise_and":
        if a >= 0 or c >= 0:
            # x & y with y >= 0 lies in [0, y]
            return (0, min(b if a >= 0 else INT64_MAX, d if c >= 0 else INT64_MAX))
        if b < 0 and d < 0:
            return (generic[0], min(b, d))
        return generic
    if op == "bitwise_or":
        if a >= 0 and c >= 0:
            return (max(a, c), (1 << max(b, d).bit_length()) - 1)
        if b < 0 and d < 0:
            return (max(a, c), -1)
        if b < 0 or d < 0:
            # or with a negative value only sets bits of it: it stays in [that value, -1]
            return (c if d < 0 else a, -1)
        return generic
    if a >= 0 and c >= 0:
        return (0, (1 << max(b, d).bit_length()) - 1)
    return generic


def _shl(x: tuple[int, int], s: tuple[int, int]) -> tuple[int, int]:
    (a, b), (c, d) = x, s
    parts: list[Range] = []
    if c < 0 or d >= 64:
        parts.append((0, 0))      # torch: a shift out of [0, 64) gives 0
    lo, hi = max(c, 0), min(d, 63)
    if lo <= hi:
        # x * 2**k is monotone in x for a fixed k and in k for a fixed x: corners
        parts.append(_span(p << q for p in (a, b) for q in (lo, hi)))
    return _union(*parts) or (0, 0)


def _shr(x: tuple[int, int], s: tuple[int, int]) -> tuple[int, int]:
    (a, b), (c, d) = x, s
    ks = [k for k in (max(c, 0), min(d, 62)) if max(c, 0) <= min(d, 62)]
    if c < 0 or d >= 63:
        ks.append(63)             # torch: out of [0, 63) gives the sign (x >> 63)
    return _span(p >> q for p in (a, b) for q in ks)


def _pow(x: tuple[int, int], y: tuple[int, int]) -> tuple[int, int]:
    (a, b), (c, d) = x, y
    parts: list[Range] = []
    if c < 0:
        # torch: 1 ** -n = 1, (-1) ** -n = +-1, anything else ** -n = 0
        parts.append((-1 if a <= -1 else 0, 1))
    if d >= 0:
        e_lo, e_hi = max(c, 0), d
        big = max(abs(a), abs(b))
        if big >= 2 and e_hi > 63:
            return _FULL
        top = big ** e_hi if big >= 1 else (1 if e_lo == 0 else 0)
        top = max(top, 1)
        if top > INT64_MAX:
            return _FULL
        if a >= 0:
            # x ** k for x >= 0, k >= 0: 0 ** 0 = 1, otherwise monotone in both
            vals = [p ** q for p in (a, b) for q in (e_lo, e_hi)]
            if a == 0 and e_hi >= 1:
                vals.append(0)
            parts.append((min(vals), max(vals)))
        else:
            parts.append((-top, top))
    return _union(*parts) or (0, 0)


class _Ranges:
    """Sound integer ranges of a kernel's expressions (see the module docstring)."""

    def __init__(self, kernel: ir.Kernel) -> None:
        self.dims = (*kernel.shape, *kernel.rshape)
        rn = 1
        for s in kernel.rshape:
            rn *= s
        self.rnumel = rn
        self.memo: dict[int, Any] = {}

    def of(self, e: ir.Expr) -> Any:
        """The range of `e` (None if it is never evaluated); iterative, so deep IR is fine."""
        memo = self.memo
        if id(e) in memo:
            return memo[id(e)]
        stack: list[tuple[Any, bool]] = [(e, False)]
        while stack:
            node, ready = stack.pop()
            if id(node) in memo:
                continue
            if not ready:
                stack.append((node, True))
                stack.extend((c, False) for c in ir.children(node) if id(c) not in memo)
                continue
            memo[id(node)] = self._of(node)
        return memo[id(e)]

    def _int(self, e: ir.Expr) -> Any:
        """The range of `e` where the renderer uses it as an integer (floats saturate)."""
        r = self.memo[id(e)]
        if r is None:
            return None
        return _FULL if e.dtype in ir.FLOAT_DTYPES else r

    def _of(self, e: ir.Expr) -> Any:
        if isinstance(e, ir.Const):
            if isinstance(e.value, bool):
                return (int(e.value), int(e.value))
            if isinstance(e.value, int):
                return _clamp(e.value, e.value)
            return _FULL
        if isinstance(e, ir.Idx):
            n = self.dims[e.dim]
            return None if n == 0 else (0, n - 1)
        if isinstance(e, ir.Load):
            if self.memo[id(e.index)] is None:
                return None
            return int_range(e.dtype)
        if isinstance(e, ir.Op):
            args = [self.memo[id(a)] for a in e.args]
            if any(a is None for a in args):
                return None
            return self._op(e)
        if isinstance(e, ir.Reduce):
            return self._reduce(e)
        return _FULL

    def _reduce(self, e: ir.Reduce) -> Any:
        if e.dtype == "bool" or e.op in ("any", "all"):
            return (0, 1)
        if e.dtype in ir.FLOAT_DTYPES:
            return _FULL
        init = {"sum": 0, "prod": 1, "max": INT64_MIN, "min": INT64_MAX}[e.op]
        if self.rnumel == 0:
            return (init, init)
        body = self._int(e.body)
        if body is None:
            return None
        lo, hi = body
        n = self.rnumel
        if e.op in ("max", "min"):
            return body
        if e.op == "sum":
            return _clamp(n * lo, n * hi)
        big = max(abs(lo), abs(hi))
        if big <= 1:
            return (0, 1) if lo >= 0 else (-1, 1)
        if n > 63:
            return _FULL
        if lo >= 0:
            return _clamp(lo ** n, hi ** n)
        return _clamp(-(big ** n), big ** n)

    def _op(self, e: ir.Op) -> Any:
        if e.op in _BOOL_OPS or e.dtype == "bool":
            return (0, 1)
        if e.op == "cast":
            src = e.args[0]
            return cast_range(self.memo[id(src)], src.dtype, e.dtype)
        if e.dtype in ir.FLOAT_DTYPES:
            return _FULL
        if e.op == "where":
            return _union(self._int(e.args[1]), self._int(e.args[2]))
        args = [self._int(a) for a in e.args]
        if len(args) == 1:
            return self._unary(e.op, args[0])
        if len(args) != 2:
            return _FULL
        x, y = args
        (a, b), (c, d) = x, y
        if e.op == "add":
            return _clamp(a + c, b + d)
        if e.op == "sub":
            return _clamp(a - d, b - c)
        if e.op == "mul":
            return _span((a * c, a * d, b * c, b * d))
        if e.op == "maximum":
            return (max(a, c), max(b, d))
        if e.op == "minimum":
            return (min(a, c), min(b, d))
        if e.op in ("floordiv", "truncdiv"):
            return _divide(e.op, x, y)
        if e.op == "mod":
            return _mod(x, y)
        if e.op == "fmod":
            return _fmod(x, y)
        if e.op in ("bitwise_and", "bitwise_or", "bitwise_xor"):
            return _bitwise(e.op, x, y)
        if e.op == "shl":
            return _shl(x, y)
        if e.op == "shr":
            return _shr(x, y)
        if e.op == "pow":
            return _pow(x, y)
        if e.op in ("index_check", "index_check_neg"):
            return x        # i itself (it only reports an i outside [-n, n))
        return _FULL

    @staticmethod
    def _unary(op: str, x: tuple[int, int]) -> tuple[int, int]:
        lo, hi = x
        if op == "neg":
            return _clamp(-hi, -lo)
        if op == "abs":
            if lo == INT64_MIN:
                return _FULL          # abs(INT64_MIN) wraps to INT64_MIN
            return (0 if lo <= 0 <= hi else min(abs(lo), abs(hi)), max(abs(lo), abs(hi)))
        if op == "relu":
            return (max(lo, 0), max(hi, 0))
        if op == "sign":
            return ((lo > 0) - (lo < 0), (hi > 0) - (hi < 0))
        if op == "bitwise_not":
            return (~hi, ~lo)
        if op in ("floor", "ceil", "round", "trunc"):
            return x
        return _FULL


walk = ir.walk


def expr_range(kernel: ir.Kernel, e: ir.Expr) -> Any:
    """The range of expression `e` of `kernel` (None if it is never evaluated)."""
    return _Ranges(kernel).of(e)


def kernel_accesses(kernel: ir.Kernel, memo: Any = None) -> list[tuple[int, Any, bool]]:
    """(argument, index range or None, is_store) of every load and store of a kernel.

    A range of None means the access never runs (an empty iteration dim). With `memo` (an
    aotrt.analysis.IRMemo) the nodes looked at are counted into its `visits`.
    """
    if kernel.numel == 0:
        return []
    ranges = _Ranges(kernel)
    out = []
    for e in (memo.walk(kernel.stores) if memo is not None else walk(kernel.stores)):
        if isinstance(e, (ir.Load, ir.Store)):
            if e.index.dtype not in ir.INT_DTYPES and e.index.dtype != "bool":
                out.append((e.arg, "float", isinstance(e, ir.Store)))
                continue
            out.append((e.arg, ranges.of(e.index), isinstance(e, ir.Store)))
    if memo is not None:
        memo.visits += len(ranges.memo)
    return out


def arg_ranges(kernel: ir.Kernel, memo: Any = None) -> dict[tuple[int, bool], Any]:
    """(argument, is_store) -> the union of the index ranges of the argument's loads (or
    stores), or "float" when one of their indices is not an integer; accesses that never
    run are left out. A view holds every access exactly when it holds the union, so a
    program checks each use of a kernel in O(arguments), not O(loads)."""
    out: dict[tuple[int, bool], Any] = {}
    for arg, rng, is_store in kernel_accesses(kernel, memo):
        if rng is None:
            continue
        key = (arg, is_store)
        have = out.get(key)
        if rng == "float" or have == "float":
            out[key] = "float"
        elif have is None:
            out[key] = rng
        else:
            out[key] = (min(have[0], rng[0]), max(have[1], rng[1]))
    return out
