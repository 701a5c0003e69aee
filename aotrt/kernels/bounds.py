"""Sound integer ranges of kernel index expressions: the memory safety of generated kernels.

Program.load proves every load and store of a program's kernels stays inside its view, and
every kernel dispatch checks the same ranges against the allocation it binds.
"""

from __future__ import annotations

from typing import Any

from aotrt.kernels import ir

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1



_FULL = (INT64_MIN, INT64_MAX)
_LOAD_RANGE = {
    "int64": _FULL, "int32": (-(1 << 31), (1 << 31) - 1), "int16": (-(1 << 15), (1 << 15) - 1),
    "int8": (-128, 127), "uint8": (0, 255), "bool": (0, 1),
}
_BOOL_OPS = frozenset({"lt", "le", "gt", "ge", "eq", "ne", "and", "or", "xor", "not", "isnan",
                       "isinf"})



def _clamp(lo: int, hi: int) -> tuple[int, int]:
    # Outside int64 the C code wraps, so the value can be anything an int64 holds.
    if lo < INT64_MIN or hi > INT64_MAX:
        return _FULL
    return lo, hi


class _Ranges:
    """Sound integer ranges of a kernel's expressions (C int64 semantics)."""

    def __init__(self, kernel: ir.Kernel) -> None:
        self.dims = (*kernel.shape, *kernel.rshape)
        self.memo: dict[int, Any] = {}

    def of(self, e: ir.Expr) -> Any:
        key = id(e)
        if key not in self.memo:
            self.memo[key] = self._of(e)
        return self.memo[key]

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
            return _LOAD_RANGE.get(e.dtype, _FULL)
        if isinstance(e, ir.Op):
            return self._op(e)
        return _FULL

    def _op(self, e: ir.Op) -> Any:
        if e.op in _BOOL_OPS or e.dtype == "bool":
            return (0, 1)
        args = [self.of(a) for a in e.args]
        if any(a is None for a in args):
            return None
        if e.op == "cast":
            src = e.args[0].dtype
            if src in ir.FLOAT_DTYPES or e.dtype in ir.FLOAT_DTYPES:
                return _FULL
            return args[0]
        if e.op == "where":
            (_, _), (a, b), (c, d) = args
            return (min(a, c), max(b, d))
        if any(a.dtype in ir.FLOAT_DTYPES for a in e.args) or e.dtype in ir.FLOAT_DTYPES:
            return _FULL
        if e.op == "neg":
            return _clamp(-args[0][1], -args[0][0])
        if e.op == "abs":
            lo, hi = args[0]
            if lo == INT64_MIN:
                return _FULL
            return (0 if lo <= 0 <= hi else min(abs(lo), abs(hi)), max(abs(lo), abs(hi)))
        if len(args) != 2:
            return _FULL
        (a, b), (c, d) = args
        if e.op == "add":
            return _clamp(a + c, b + d)
        if e.op == "sub":
            return _clamp(a - d, b - c)
        if e.op == "mul":
            corners = (a * c, a * d, b * c, b * d)
            return _clamp(min(corners), max(corners))
        if e.op == "maximum":
            return (max(a, c), max(b, d))
        if e.op == "minimum":
            return (min(a, c), min(b, d))
        if e.op in ("floordiv", "truncdiv") and c > 0:
            div = (lambda x, y: x // y) if e.op == "floordiv" else _tdiv
            corners = (div(a, c), div(a, d), div(b, c), div(b, d))
            return (min(corners), max(corners))
        if e.op == "mod" and c > 0:
            return (a, b) if a >= 0 and b < c else (0, d - 1)
        if e.op == "fmod" and c > 0:
            if a >= 0:
                return (a, b) if b < c else (0, min(b, d - 1))
            return (-(d - 1), d - 1)
        if e.op == "bitwise_and" and (a >= 0 or c >= 0):
            # x & y with y >= 0 lies in [0, y]
            return (0, min(b if a >= 0 else INT64_MAX, d if c >= 0 else INT64_MAX))
        return _FULL


def _tdiv(x: int, y: int) -> int:
    """C's truncating division for y > 0."""
    return -((-x) // y) if x < 0 else x // y


walk = ir.walk


def kernel_accesses(kernel: ir.Kernel) -> list[tuple[int, Any, bool]]:
    """(argument, index range or None, is_store) of every load and store of a kernel.

    A range of None means the access never runs (an empty iteration dim).
    """
    if kernel.numel == 0:
        return []
    ranges = _Ranges(kernel)
    out = []
    for e in walk(kernel.stores):
        if isinstance(e, (ir.Load, ir.Store)):
            if e.index.dtype not in ir.INT_DTYPES and e.index.dtype != "bool":
                out.append((e.arg, "float", isinstance(e, ir.Store)))
                continue
            out.append((e.arg, ranges.of(e.index), isinstance(e, ir.Store)))
    return out
