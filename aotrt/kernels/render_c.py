"""Render kernel IR as C. `CStyleRenderer` is the shared base; `CRenderer` targets the cpu.

Half-precision values are computed in float, as Inductor does, and rounded on store.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Sequence

from aotrt.analysis import IRMemo, uses_reduce_dim
from aotrt.kernels import ir
from aotrt.kernels.math_c import MATH_C
from aotrt.sources import source

#: codes a cpu kernel stores in its library's `aotrt_error` flag (contract C2)
KERNEL_ERRORS: dict[int, str] = {1: "integer division or modulo by zero",
                                  2: "index out of range",
                                  3: "a library call failed"}


def symbol(index: int) -> str:
    """The exported name of kernel `index` of a library: aotrt's own, never the file's."""
    return f"aotrt_k{index}"


def _label(name: Any) -> str:
    # The file's kernel name only ever lands in a comment, and only its harmless characters.
    return re.sub(r"[^0-9A-Za-z_]", "_", str(name))[:80]


#: elements a float sum adds in float before it carries the partial sum in double (cpu)
SUM_BLOCK = 64
#: float accumulators a cpu sum keeps per block (element j in lane j % SUM_LANES): one
#: AVX-512 vector, two AVX2 ones; a divisor of SUM_BLOCK
SUM_LANES = 16

COMPUTE_TYPE = {
    "float32": "float", "float16": "float", "bfloat16": "float",
    "int64": "int64_t", "int32": "int64_t", "int16": "int64_t", "int8": "int64_t",
    "uint8": "int64_t", "bool": "bool",
}

# relu as `x < 0 ? 0 : x`: a NaN stays NaN and -0.0 stays -0.0, as in torch (`x > 0 ? x : 0`
# made both 0).
_UNARY_FLOAT = {
    "neg": "(-{0})", "abs": "fabsf({0})", "exp": "expf({0})", "exp2": "exp2f({0})",
    "log": "logf({0})", "log2": "log2f({0})", "log1p": "log1pf({0})", "expm1": "expm1f({0})",
    "sqrt": "sqrtf({0})", "rsqrt": "(1.0f / sqrtf({0}))", "tanh": "tanhf({0})",
    "sigmoid": "(1.0f / (1.0f + expf(-({0}))))", "relu": "(({0}) < 0.0f ? 0.0f : ({0}))",
    "erf": "erff({0})", "sin": "sinf({0})", "cos": "cosf({0})", "tan": "tanf({0})",
    "asin": "asinf({0})", "acos": "acosf({0})", "atan": "atanf({0})",
    "floor": "floorf({0})", "ceil": "ceilf({0})",
    "round": "nearbyintf({0})", "trunc": "truncf({0})", "reciprocal": "(1.0f / ({0}))",
    "sign": "(float)((({0}) > 0.0f) - (({0}) < 0.0f))", "isnan": "isnan({0})",
    "isinf": "isinf({0})", "not": "(!({0}))",
    "gelu": "(0.5f * ({0}) * (1.0f + erff(({0}) * 0.70710678118654752f)))",
    "gelu_tanh": "(0.5f * ({0}) * (1.0f + tanhf(0.79788456080286536f * (({0}) + "
                 "0.044715f * ({0}) * ({0}) * ({0})))))",
    "silu": "(({0}) / (1.0f + expf(-({0}))))",
}
# Integer arithmetic wraps through uint64_t: signed overflow is undefined in C and CUDA, and
# the bounds proof (bounds.py) models exactly this wrapping.
_UNARY_INT = {
    "neg": "((int64_t)(0ULL - (uint64_t)({0})))", "abs": "aot_iabs({0})",
    "relu": "(({0}) > 0 ? ({0}) : 0)",
    "sign": "(int64_t)((({0}) > 0) - (({0}) < 0))", "not": "(!({0}))",
    "bitwise_not": "(~({0}))", "isnan": "false", "isinf": "false",
    "floor": "({0})", "ceil": "({0})", "round": "({0})", "trunc": "({0})",
}
_BINARY_FLOAT = {
    "add": "(({0}) + ({1}))", "sub": "(({0}) - ({1}))", "mul": "(({0}) * ({1}))",
    "div": "(({0}) / ({1}))", "truncdiv": "truncf(({0}) / ({1}))",
    "floordiv": "aot_floordivf({0}, {1})", "pow": "powf({0}, {1})", "fmod": "fmodf({0}, {1})",
    "mod": "aot_fmod_py({0}, {1})", "maximum": "aot_fmaxf({0}, {1})",
    "minimum": "aot_fminf({0}, {1})", "atan2": "atan2f({0}, {1})",
}
_BINARY_INT = {
    "add": "((int64_t)((uint64_t)({0}) + (uint64_t)({1})))",
    "sub": "((int64_t)((uint64_t)({0}) - (uint64_t)({1})))",
    "mul": "((int64_t)((uint64_t)({0}) * (uint64_t)({1})))",
    "truncdiv": "aot_tdiv({0}, {1} AOT_ERR_ARG)",
    "floordiv": "aot_floordiv({0}, {1} AOT_ERR_ARG)",
    "mod": "aot_mod_py({0}, {1} AOT_ERR_ARG)", "fmod": "aot_fmod({0}, {1} AOT_ERR_ARG)",
    "maximum": "(({0}) > ({1}) ? ({0}) : ({1}))", "minimum": "(({0}) < ({1}) ? ({0}) : ({1}))",
    "bitwise_and": "(({0}) & ({1}))", "bitwise_or": "(({0}) | ({1}))",
    "bitwise_xor": "(({0}) ^ ({1}))", "shl": "aot_shl({0}, {1})", "shr": "aot_shr({0}, {1})",
    "pow": "aot_ipow({0}, {1})", "index_check": "aot_chkidx({0}, {1} AOT_ERR_ARG)",
    "index_check_neg": "aot_chkidx_neg({0}, {1} AOT_ERR_ARG)",
}
_NARROW_INT = {"int32": "int32_t", "int16": "int16_t", "int8": "int8_t", "uint8": "uint8_t"}
_COMPARE = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_LOGICAL = {"and": "&&", "or": "||", "xor": "!="}


class CStyleRenderer:
    """Shared C-like rendering; targets override the hooks at the bottom."""

    #: helpers shared by every C-like target (helpers.h); `{q}` is the function qualifier.
    #: Integer division never traps: a zero divisor gives 0 and reports error 1 (AOT_ERR: the
    #: library's flag, on cpu and cuda), x / -1 is -x wrapping (INT64_MIN / -1 ==
    #: INT64_MIN, as torch), x % -1 is 0.
    #: Shifts and powers follow torch (ATen's lshift/rshift/powi); floats become integers
    #: saturating, NaN giving 0.
    HELPERS = source(__package__, "helpers.h")

    def render(self, kernels: Sequence[ir.Kernel]) -> str:
        """Source text of one library holding all `kernels`."""
        # A device shares one renderer between threads: per-kernel state (lines, scope,
        # interned keys) lives in a copy of it for this call.
        worker = copy.copy(self)
        parts = [worker.preamble()]
        for i, k in enumerate(kernels):
            parts.append(worker.render_kernel(k, i))
        return "\n".join(parts)

    # -- expression rendering -----------------------------------------------------------------

    def render_kernel(self, k: ir.Kernel, index: int = 0) -> str:
        """Source text of one kernel, exported as `symbol(index)`.

        Stores whose index or value depends on a reduce coordinate (softmax, layer norm
        outputs) run in a loop over the reduce domain after the reductions they use.
        """
        self._k = k
        self._symbol = symbol(index)
        self._lines: list[str] = []
        self._count = 0
        # Estimated work of one outer element: emitted lines, each weighted by the trip count
        # of the reduce loops around it (a target may split the outer range by it).
        self._cost = 0
        self._mult = 1
        # Subexpressions are cached by a structural key interned per node (linear on deep or
        # shared IR; constants keyed bit for bit, so -0.0 is not 0.0).
        self._ids: dict[int, int] = {}
        self._intern: dict[tuple, int] = {}
        scope: dict[int, str] = {}
        for line in self.outer_lines(k):
            self._emit(1, line)
        nouter = len(k.shape)
        # One memo for the kernel: stores sharing a value look at its nodes once.
        memo = IRMemo()
        uses = [uses_reduce_dim(st, nouter, memo) for st in k.stores]
        outer = [st for st, u in zip(k.stores, uses) if not u]
        inner = [st for st, u in zip(k.stores, uses) if u]
        for st in outer:
            self._store(st, scope, 1)
        if inner:
            roots = [x for st in inner for x in (st.index, st.value)]
            for red in _direct_reduces(roots, self._done(scope)):
                self._expr(red, scope, 1)
            self._open_rloop(1, "je")
            loop_scope = dict(scope)
            for st in inner:
                self._store(st, loop_scope, 2)
            self._close_rloop(1)
        return self.wrap_kernel(k, "\n".join(self._lines))

    def _store(self, st: ir.Store, scope: dict, depth: int) -> None:
        idx = self._as_int(self._expr(st.index, scope, depth), st.index.dtype)
        val = self._expr(st.value, scope, depth)
        dtype = self._k.args[st.arg].dtype
        if st.value.dtype in ir.FLOAT_DTYPES and dtype not in ir.FLOAT_DTYPES:
            val = self.cast(val, st.value.dtype, dtype)   # never C's UB float conversion
        self._emit(depth, self.store(dtype, st.arg, idx, val))

    def _rnumel(self) -> int:
        rn = 1
        for s in self._k.rshape:
            rn *= s
        return rn

    def _open_rloop(self, depth: int, var: str) -> None:
        rn = self._rnumel()
        self._emit(depth, f"for (int64_t {var} = 0; {var} < {rn}; {var}++) {{")
        self._mult *= max(rn, 1)
        for line in self.decompose(var, self._k.rshape, len(self._k.shape)):
            self._emit(depth + 1, line)

    def _close_rloop(self, depth: int) -> None:
        self._mult //= max(self._rnumel(), 1)
        self._emit(depth, "}")

    def outer_lines(self, k: ir.Kernel) -> list[str]:
        """Lines at the top of the body defining the outer coordinates d0.. of this element
        (a target whose wrapper loops over them itself returns fewer)."""
        return [f"const int64_t i = {self.flat_index()};", *self.decompose("i", k.shape, 0)]

    def decompose(self, flat: str, shape: tuple[int, ...], dim0: int) -> list[str]:
        """Lines defining the coordinate variables d<dim0..> of `flat` over `shape`."""
        lines = []
        rest = flat
        for j in range(len(shape) - 1, -1, -1):
            d = dim0 + j
            if j == 0:
                lines.append(f"const int64_t d{d} = {rest};")
            else:
                lines.append(f"const int64_t d{d} = {rest} % {shape[j]};")
                lines.append(f"const int64_t q{d} = {rest} / {shape[j]};")
                rest = f"q{d}"
        return lines

    def _new(self) -> str:
        self._count += 1
        return f"v{self._count}"

    def _emit(self, depth: int, text: str) -> None:
        self._lines.append("  " * depth + text)
        self._cost += self._mult

    def _key(self, e: ir.Expr) -> int:
        """The interned structural key of `e` (equal keys: the same value, bit for bit)."""
        ids = self._ids
        if id(e) in ids:
            return ids[id(e)]
        stack = [e]
        while stack:
            node = stack[-1]
            if id(node) in ids:
                stack.pop()
                continue
            missing = [c for c in ir.children(node) if id(c) not in ids]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            if isinstance(node, ir.Const):
                t: tuple = ("C", *ir.const_key(node.value, node.dtype))
            elif isinstance(node, ir.Idx):
                t = ("I", node.dim, node.dtype)
            elif isinstance(node, ir.Load):
                t = ("L", node.arg, node.dtype, ids[id(node.index)])
            elif isinstance(node, ir.Op):
                t = ("O", node.op, node.dtype, *(ids[id(c)] for c in node.args))
            elif isinstance(node, ir.Reduce):
                t = ("R", node.op, node.dtype, ids[id(node.body)])
            else:
                raise TypeError(f"unknown IR node {node!r}")
            ids[id(node)] = self._intern.setdefault(t, len(self._intern))
        return ids[id(e)]

    def _done(self, scope: dict) -> Any:
        """Whether a node's value is already in `scope` (then so is every Reduce under it,
        and a walk for Reduces need not look inside it again)."""
        return lambda e: not isinstance(e, (ir.Const, ir.Idx)) and self._key(e) in scope

    def _text(self, e: ir.Expr, scope: dict) -> str:
        if isinstance(e, ir.Const):
            return self.literal(e.value, e.dtype)
        if isinstance(e, ir.Idx):
            return f"d{e.dim}"
        return scope[self._key(e)]

    def _expr(self, e: ir.Expr, scope: dict, depth: int) -> str:
        # Iterative post-order: no Python recursion however deep the IR (a Reduce still
        # recurses once into its own loop).
        stack: list[tuple[ir.Expr, bool]] = [(e, False)]
        while stack:
            node, ready = stack.pop()
            if isinstance(node, (ir.Const, ir.Idx)) or self._key(node) in scope:
                continue
            if not ready:
                stack.append((node, True))
                if not isinstance(node, ir.Reduce):
                    stack.extend((c, False) for c in reversed(ir.children(node)))
                continue
            if isinstance(node, ir.Load):
                idx = self._as_int(self._text(node.index, scope), node.index.dtype)
                text = self.load(node.dtype, node.arg, idx)
            elif isinstance(node, ir.Op):
                text = self.op(node, [self._text(a, scope) for a in node.args])
            elif isinstance(node, ir.Reduce):
                text = self._reduce(node, scope, depth)
            else:
                raise TypeError(f"unknown IR node {node!r}")
            name = self._new()
            self._emit(depth, f"const {COMPUTE_TYPE[node.dtype]} {name} = {text};")
            scope[self._key(node)] = name
        return self._text(e, scope)

    @staticmethod
    def _as_int(text: str, dtype: str) -> str:
        """`text` (of `dtype`) where an int64 is needed: floats convert saturating."""
        return f"aot_f2i({text})" if dtype in ir.FLOAT_DTYPES else text

    def _reduce(self, e: ir.Reduce, scope: dict, depth: int) -> str:
        # Reductions used inside this one are per outer element: compute them first, once.
        for red in _direct_reduces([e.body], self._done(scope)):
            self._expr(red, scope, depth)
        acc = self._new()
        self._emit(depth, f"{COMPUTE_TYPE[e.dtype]} {acc} = {self.reduce_init(e.op, e.dtype)};")
        self._open_rloop(depth, f"j{acc}")
        val = self._expr(e.body, dict(scope), depth + 1)
        if e.dtype in ir.INT_DTYPES:
            val = self._as_int(val, e.body.dtype)
        self._emit(depth + 1, f"{acc} = {self.reduce_step(e.op, e.dtype, acc, val)};")
        self._close_rloop(depth)
        return acc

    def reduce_init(self, op: str, dtype: str) -> str:
        """Initial accumulator value for a reduction."""
        f = dtype in ir.FLOAT_DTYPES
        return {
            "sum": "0.0f" if f else "0", "prod": "1.0f" if f else "1",
            "max": "-INFINITY" if f else ("false" if dtype == "bool" else "INT64_MIN"),
            "min": "INFINITY" if f else ("true" if dtype == "bool" else "INT64_MAX"),
            "any": "false", "all": "true",
        }[op]

    def reduce_step(self, op: str, dtype: str, acc: str, val: str) -> str:
        """Expression folding `val` into accumulator `acc`."""
        f = dtype in ir.FLOAT_DTYPES
        if op in ("sum", "prod") and dtype in ir.INT_DTYPES:
            sym = "+" if op == "sum" else "*"          # wraps, like every integer op
            return f"(int64_t)((uint64_t){acc} {sym} (uint64_t)({val}))"
        if op == "sum":
            return f"{acc} + {val}"
        if op == "prod":
            return f"{acc} * {val}"
        if op == "max":
            return f"aot_fmaxf({acc}, {val})" if f else f"({val} > {acc} ? {val} : {acc})"
        if op == "min":
            return f"aot_fminf({acc}, {val})" if f else f"({val} < {acc} ? {val} : {acc})"
        if op == "any":
            return f"{acc} || {val}"
        return f"{acc} && {val}"

    def op(self, e: ir.Op, args: list[str]) -> str:
        """Text of one pointwise op."""
        if e.op == "cast":
            return self.cast(args[0], e.args[0].dtype, e.dtype)
        if e.op == "where":
            a, b = args[1], args[2]
            if e.dtype in ir.INT_DTYPES:
                a, b = self._as_int(a, e.args[1].dtype), self._as_int(b, e.args[2].dtype)
            return f"(({args[0]}) ? ({a}) : ({b}))"
        src = e.args[0].dtype
        if e.op in _COMPARE:
            return f"(({args[0]}) {_COMPARE[e.op]} ({args[1]}))"
        if e.op in _LOGICAL and src == "bool":
            # truth values of both sides (xor as != must not compare 1 with 5)
            a, b = (t if x.dtype == "bool" else f"(({t}) != 0)" for t, x in zip(args, e.args))
            return f"(({a}) {_LOGICAL[e.op]} ({b}))"
        if e.op in ("bitwise_and", "bitwise_or", "bitwise_xor") and all(
                x.dtype == "bool" for x in e.args):
            sym = {"bitwise_and": "&&", "bitwise_or": "||", "bitwise_xor": "!="}[e.op]
            return f"(({args[0]}) {sym} ({args[1]}))"
        if e.op == "bitwise_not" and src == "bool" and e.dtype == "bool":
            return f"(!({args[0]}))"
        if e.op in ("isnan", "isinf") and src not in ir.FLOAT_DTYPES:
            return "false"
        floaty = e.dtype in ir.FLOAT_DTYPES or (e.op in ("isnan", "isinf"))
        table = (_UNARY_FLOAT if floaty else _UNARY_INT) if len(args) == 1 else (
            _BINARY_FLOAT if floaty else _BINARY_INT)
        if e.op not in table:
            raise ir.InvalidArgument(f"op {e.op} is not defined for {e.dtype}")
        # Operands take the op's kind first: integer arithmetic inside a float op would be
        # C's (trapping, overflowing) one, and a float in an integer op an UB conversion.
        if floaty:
            args = [a if x.dtype in ir.FLOAT_DTYPES else f"((float)({a}))"
                    for a, x in zip(args, e.args)]
        else:
            args = [self._as_int(a, x.dtype) for a, x in zip(args, e.args)]
        return self.fn_name(table[e.op]).format(*args)

    def cast(self, x: str, src: str, dst: str) -> str:
        """Conversion of a computed value between dtypes."""
        if dst == "bool":
            return f"(({x}) != 0)"
        if src in ir.FLOAT_DTYPES and dst not in ir.FLOAT_DTYPES:
            # C's conversion of an out-of-range float is undefined: saturate (NaN -> 0) to
            # int64, then wrap into a narrower type as an integer cast does.
            wide = f"aot_f2i({x})"
            if dst in _NARROW_INT:
                return f"((int64_t)({_NARROW_INT[dst]})({wide}))"
            return wide
        if dst in _NARROW_INT:
            # wrap like a store would, so a cast inside an expression means what torch's does;
            # even from its own dtype: a narrow-typed op is computed in int64 and may be outside
            return f"((int64_t)({_NARROW_INT[dst]})(int64_t)({x}))"
        if dst in ("float16", "bfloat16") and src != dst:
            return self.round_to(f"((float)({x}))", dst)
        return f"(({COMPUTE_TYPE[dst]})({x}))"

    def round_to(self, x: str, dtype: str) -> str:
        """A float rounded to the nearest value of half type `dtype`, still as a float.

        The base keeps full float precision (Inductor's rule: round only on store); targets
        override it to round per cast, as torch eager does per op.
        """
        return x

    def literal(self, value: ir.Scalar, dtype: str) -> str:
        """A literal in the compute type of `dtype`."""
        if dtype == "bool":
            return "true" if value else "false"
        if dtype in ir.FLOAT_DTYPES:
            v = float(value)
            if v != v:
                return "NAN"
            if v in (float("inf"), float("-inf")):
                return "INFINITY" if v > 0 else "(-INFINITY)"
            return f"{v!r}f" if "e" in repr(v) or "." in repr(v) else f"{v!r}.0f"
        iv = int(value)
        if iv == -(2**63):
            return "INT64_MIN"
        return f"((int64_t){iv}LL)"

    # -- target hooks -------------------------------------------------------------------------

    def preamble(self) -> str:  # pragma: no cover - overridden
        """Includes, type definitions and helpers for the target."""
        raise NotImplementedError

    def fn_name(self, template: str) -> str:
        """Map a math-function template to the target's names."""
        return template

    def flat_index(self) -> str:
        """Expression for the outer flat index of this invocation."""
        raise NotImplementedError

    def load(self, dtype: str, arg: int, idx: str) -> str:
        """Expression reading element `idx` of argument `arg`, in the compute type."""
        raise NotImplementedError

    def store(self, dtype: str, arg: int, idx: str, val: str) -> str:
        """Statement writing `val` to element `idx` of argument `arg`."""
        raise NotImplementedError

    def wrap_kernel(self, k: ir.Kernel, body: str) -> str:
        """The kernel function around its body."""
        raise NotImplementedError


STORAGE_TYPE_C = {
    "float32": "float", "float16": "_Float16", "bfloat16": "uint16_t", "int64": "int64_t",
    "int32": "int32_t", "int16": "int16_t", "int8": "int8_t", "uint8": "uint8_t",
    "bool": "bool",
}


def _children(e: ir.Expr) -> tuple[ir.Expr, ...]:
    # A Reduce's body runs in its own loop: callers here never look inside it.
    return () if isinstance(e, ir.Reduce) else ir.children(e)



def _direct_reduces(roots: list[ir.Expr], done: Any = None) -> list[ir.Reduce]:
    """Reduce nodes reachable from `roots` without entering another Reduce, innermost first;
    nodes for which `done(node)` holds (already computed) are not entered either."""
    out: list[ir.Reduce] = []
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if done is not None and done(e):
            continue
        if isinstance(e, ir.Reduce):
            out.append(e)
        else:
            stack.extend(_children(e))
    return out


#: work units (emitted C lines, weighted by reduce trip counts) one thread must get before a
#: cpu kernel call is split across threads; about 20-50 us of work on a current core
PARALLEL_GRAIN = 65536


class CRenderer(CStyleRenderer):
    """C for the cpu: `void k(char **P, int64_t begin, int64_t end, int64_t threads)`."""

    def preamble(self) -> str:
        """Includes, bf16 conversions and helpers."""
        prelude = source(__package__, "render_c_prelude.h")
        return (prelude.replace("{grain}", str(PARALLEL_GRAIN))
                + self.HELPERS.replace("{q}", "static inline") + MATH_C)

    def _sum_in_double(self, e: ir.Reduce, scope: dict, depth: int) -> str:
        """A float sum adds SUM_BLOCK elements at a time in float and the blocks' sums in
        double; it rounds once at the end. One float accumulator's error grows with the
        row: GroupNorm(1, 64) over 64x56x56 came out 1000x less accurate than torch's
        pairwise sums (2.6e-5 against 2.5e-8; blocked, 4.1e-8).

        Inside a block, element j goes to lane j % SUM_LANES, and the lanes are added in
        lane order: a fixed order that the compiler vectorises across lanes (an in-order
        float sum it cannot vectorise without reordering it), so every CPU, whatever its
        vector width, computes the same bits. The row's last partial group of lanes runs
        as a scalar tail into the same lanes. The in-order sum ran at one element per add's
        latency: a 1500-column softmax's sum pass took 2.9 ms over 4500 rows on one core
        of this AVX-512 machine."""
        for red in _direct_reduces([e.body], self._done(scope)):
            self._expr(red, scope, depth)
        acc = self._new()
        rn = self._rnumel()
        var, lanes = f"j{acc}", SUM_LANES
        self._emit(depth, f"double {acc}_d = 0.0;")
        self._emit(depth, f"for (int64_t {var}b = 0; {var}b < {rn}; {var}b += {SUM_BLOCK}) {{")
        self._emit(depth + 1, f"const int64_t {var}e = {var}b + {SUM_BLOCK} < {rn} ? "
                              f"{var}b + {SUM_BLOCK} : {rn};")
        self._emit(depth + 1, f"float {acc}_l[{lanes}] = {{0.0f}};")
        self._emit(depth + 1, f"int64_t {var}g = {var}b;")
        self._emit(depth + 1, f"for (; {var}g + {lanes} <= {var}e; {var}g += {lanes}) {{")
        self._emit(depth + 2, "#pragma omp simd")
        self._emit(depth + 2, f"for (int64_t {var}k = 0; {var}k < {lanes}; {var}k++) {{")
        self._emit(depth + 3, f"const int64_t {var} = {var}g + {var}k;")
        self._sum_step(e, scope, depth + 3, acc, var, f"{var}k", rn - rn % lanes)
        self._emit(depth + 2, "}")
        self._emit(depth + 1, "}")
        self._emit(depth + 1, f"for (int64_t {var} = {var}g; {var} < {var}e; {var}++) {{")
        self._sum_step(e, scope, depth + 2, acc, var, f"{var} - {var}g", rn % lanes)
        self._emit(depth + 1, "}")
        self._emit(depth + 1, f"float {acc}_b = 0.0f;")
        self._emit(depth + 1, f"for (int {var}k = 0; {var}k < {lanes}; {var}k++) "
                              f"{acc}_b = {acc}_b + {acc}_l[{var}k];")
        self._emit(depth + 1, f"{acc}_d += (double){acc}_b;")
        self._emit(depth, "}")
        ct = COMPUTE_TYPE[e.dtype]
        self._emit(depth, f"const {ct} {acc} = ({ct}){acc}_d;")
        return acc

    def _sum_step(self, e: ir.Reduce, scope: dict, depth: int, acc: str, var: str, lane: str,
                  trips: int) -> None:
        """The sum's body at reduce index `var`, added into lane `lane` of `acc`; its lines
        weigh `trips` each in the kernel's cost (the times a row runs them)."""
        outer = self._mult
        self._mult = outer * trips
        for line in self.decompose(var, self._k.rshape, len(self._k.shape)):
            self._emit(depth, line)
        val = self._expr(e.body, dict(scope), depth)
        self._emit(depth, f"{acc}_l[{lane}] = {acc}_l[{lane}] + {val};")
        self._mult = outer

    def fn_name(self, template: str) -> str:
        """exp, tanh and erf as the preamble's branch-free versions, which the compiler
        vectorises (libm's are calls it cannot), computing the same bits in a vector lane
        as in the scalar tail, so a result never depends on where a thread's chunk starts."""
        return (template.replace("expf(", "aot_expf(").replace("tanhf(", "aot_tanhf(")
                .replace("erff(", "aot_erff("))

    def flat_index(self) -> str:
        """The loop variable."""
        return "it"

    def _reduce(self, e: ir.Reduce, scope: dict, depth: int) -> str:
        """A float max/min as a SIMD reduction that ignores NaN, with an "any NaN" flag
        beside it that makes the result NaN (torch's max keeps NaN): a NaN-keeping compare
        in the loop cannot be vectorised, and the chain of dependent compares took 40% of a
        softmax. Unlike a sum's, a max's value does not depend on the order (float sums
        stay in order: the kernels' results are defined bit for bit, tests/fuzz)."""
        if e.op == "sum" and e.dtype in ir.FLOAT_DTYPES:
            return self._sum_in_double(e, scope, depth)
        if e.op not in ("max", "min") or e.dtype not in ir.FLOAT_DTYPES:
            return super()._reduce(e, scope, depth)
        for red in _direct_reduces([e.body], self._done(scope)):
            self._expr(red, scope, depth)
        acc = self._new()
        nan = f"{acc}_nan"
        init = "-INFINITY" if e.op == "max" else "INFINITY"
        self._emit(depth, f"{COMPUTE_TYPE[e.dtype]} {acc} = {init}; int {nan} = 0;")
        self._emit(depth, f"#pragma omp simd reduction({e.op}:{acc}) reduction(|:{nan})")
        self._open_rloop(depth, f"j{acc}")
        val = self._expr(e.body, dict(scope), depth + 1)
        cmp = ">=" if e.op == "max" else "<="      # ties take the new value, as aot_fmaxf
        self._emit(depth + 1, f"{acc} = ({val}) {cmp} {acc} ? ({val}) : {acc};")
        self._emit(depth + 1, f"{nan} |= ({val}) != ({val});")
        self._close_rloop(depth)
        self._emit(depth, f"if ({nan}) {acc} = NAN;")
        return acc

    def outer_lines(self, k: ir.Kernel) -> list[str]:
        """None where the wrapper's row loop defines the coordinates (rank >= 1)."""
        return [] if k.shape else super().outer_lines(k)

    def round_to(self, x: str, dtype: str) -> str:
        """Round through the storage type, so casts inside a kernel round like torch."""
        if dtype == "bfloat16":
            return f"aot_bf16_to_f(aot_f_to_bf16({x}))"
        return f"((float)(_Float16)({x}))"

    def load(self, dtype: str, arg: int, idx: str) -> str:
        """Typed read with widening to the compute type."""
        if dtype == "bool":
            # Any byte may sit in a bool argument; reading it as C bool is undefined.
            return f"(((const uint8_t *)A{arg})[{idx}] != 0)"
        raw = f"((const {STORAGE_TYPE_C[dtype]} *)A{arg})[{idx}]"
        if dtype == "bfloat16":
            return f"aot_bf16_to_f({raw})"
        return f"(({COMPUTE_TYPE[dtype]}){raw})"

    def store(self, dtype: str, arg: int, idx: str, val: str) -> str:
        """Typed write with rounding from the compute type."""
        dst = f"(({STORAGE_TYPE_C[dtype]} *)A{arg})[{idx}]"
        if dtype == "bfloat16":
            return f"{dst} = aot_f_to_bf16({val});"
        return f"{dst} = ({STORAGE_TYPE_C[dtype]})({val});"

    def wrap_kernel(self, k: ir.Kernel, body: str) -> str:
        """A function over [begin, end) of the outer elements, on up to `threads` threads.

        The range is cut into one contiguous chunk per thread at outer-element boundaries:
        an outer element (a whole row of a reduction) is computed by one thread exactly as
        in a single-threaded call, so the results are bit-identical for any thread count.
        """
        # Capped so the literal fits an int64 (nested reductions multiply trip counts).
        sym, cost = self._symbol, min(max(self._cost, 1), 1 << 40)
        # The arguments' pointers as locals: read through P, a store could alias P itself,
        # and the compiler would reload them per element and not vectorise.
        ptrs = "".join(f"  char *const A{j} = P[{j}];\n" for j in range(len(k.args)))
        return (f"/* kernel {_label(k.name)} */\n"
                f"static void {sym}_range(char **P, int64_t begin, int64_t end) {{\n"
                f"{ptrs}{self._loops(k, body)}}}\n"
                f"void {sym}(char **P, int64_t begin, int64_t end, int64_t threads) {{\n"
                f"  const int64_t n = end - begin;\n"
                f"  const int64_t nt = aot_nthreads(n, {cost}LL, threads);\n"
                f"  if (nt <= 1) {{ {sym}_range(P, begin, end); return; }}\n"
                f"  const int64_t chunk = n / nt, rem = n % nt;\n"
                f"  #pragma omp parallel for num_threads(nt) schedule(static, 1)\n"
                f"  for (int64_t c = 0; c < nt; c++) {{\n"
                f"    const int64_t lo = begin + c * chunk + (c < rem ? c : rem);\n"
                f"    {sym}_range(P, lo, lo + chunk + (c < rem ? 1 : 0));\n"
                f"  }}\n}}\n")

    def _loops(self, k: ir.Kernel, body: str) -> str:
        """The loops over outer elements [begin, end) around `body`.

        Rank >= 1: a loop over the last coordinate itself, so that indices are affine in the
        loop variable and the compiler can vectorise the row; the leading coordinates are
        divided out once, at `begin`, and then stepped row by row with carries. Dividing
        them out per row cost more than the row when rows are short (ResNet's stem
        space-to-depth, rows of 2: 0.22 ms a run). The elements are visited in the same
        order as a flat loop, each computed the same way.
        """
        if not k.shape:
            inner = "\n".join("  " + line for line in body.splitlines())
            return f"  for (int64_t it = begin; it < end; it++) {{\n{inner}\n  }}\n"
        last = len(k.shape) - 1
        n = k.shape[last]
        inner = "\n".join("    " + line for line in body.splitlines())
        lead = step = ""
        if last:
            # An empty range returns before dividing (a dim of size 0 has no elements).
            lead = (f"  if (begin >= end) return;\n"
                    f"  int64_t {', '.join(f'd{j}' for j in range(last))};\n"
                    f"  {{\n    int64_t q = begin / {n}LL;\n")
            for j in range(last - 1, 0, -1):
                lead += f"    d{j} = q % {k.shape[j]}LL; q /= {k.shape[j]}LL;\n"
            lead += "    d0 = q;\n  }\n"
            # d_j wraps into d_{j-1}; d0 only grows (the loop ends before it passes its size)
            step = "d0++;"
            for j in range(1, last):
                step = f"if (++d{j} == {k.shape[j]}LL) {{ d{j} = 0; {step} }}"
            step = f"    {step}\n"
        return (f"{lead}"
                f"  int64_t it = begin, lo = begin % {n}LL;\n"
                f"  while (it < end) {{\n"
                f"    const int64_t hi = end - it < {n}LL - lo ? lo + (end - it) : {n}LL;\n"
                f"    for (int64_t d{last} = lo; d{last} < hi; d{last}++) {{\n{inner}\n    }}\n"
                f"    it += hi - lo;\n"
                f"    lo = 0;\n"
                f"{step}"
                f"  }}\n")
