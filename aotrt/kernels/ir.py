"""A small expression IR for pointwise and reduction kernels over strided views.

A kernel iterates over an outer `shape`; every outer element may reduce over `rshape`.
`Idx(d)` is the coordinate of outer dim d for d < len(shape), and of reduce dim
d - len(shape) otherwise. A `Load`/`Store` addresses its argument by an integer element
index expression, so strides, offsets, broadcasting and gathers are all just indices.
Arguments are bound at run time as (allocation, byte offset), so the index never carries
the view's storage offset.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, fields
from typing import Any, Iterator, Sequence, Union

from aotrt.errors import InvalidArgument, ProgramError

Scalar = Union[int, float, bool]

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8")
DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)

UNARY_OPS = frozenset({
    "neg", "abs", "exp", "exp2", "log", "log2", "log1p", "expm1", "sqrt", "rsqrt", "tanh",
    "sigmoid", "relu", "erf", "sin", "cos", "tan", "asin", "acos", "atan", "floor", "ceil",
    "round", "trunc", "reciprocal", "sign", "not", "isnan", "isinf", "bitwise_not", "gelu",
    "gelu_tanh", "silu",
})
BINARY_OPS = frozenset({
    "add", "sub", "mul", "div", "floordiv", "truncdiv", "mod", "fmod", "pow", "maximum",
    "minimum", "lt", "le", "gt", "ge", "eq", "ne", "and", "or", "xor", "bitwise_and",
    "bitwise_or", "bitwise_xor", "atan2", "shl", "shr", "index_check", "index_check_neg",
})
#: `index_check(i, n)` is i itself; an i outside [0, n) (an index read from data, out of
#: range for the size n of the dim it indexes) also sets the kernel's error 2.
#: `index_check_neg` allows [-n, n) (indices that count from the end). The index is still
#: clamped after either: the bounds proof never relies on the check.
OTHER_OPS = frozenset({"where", "cast"})
REDUCE_OPS = frozenset({"sum", "prod", "max", "min", "any", "all"})


class Expr:
    """Base of IR expressions; subclasses are frozen dataclasses with a `dtype`."""

    dtype: str


def const_key(value: Any, dtype: Any) -> tuple:
    """The bit-exact identity of a literal: -0.0 is not 0.0, NaN payloads differ, and an int,
    a bool and a float of the same value are three different constants."""
    if isinstance(value, bool):
        return ("b", int(value), dtype)
    if isinstance(value, int):
        return ("i", value, dtype)
    if isinstance(value, float):
        return ("f", struct.unpack("<Q", struct.pack("<d", value))[0], dtype)
    return ("?", type(value).__name__, repr(value), dtype)


@dataclass(frozen=True)
class Const(Expr):
    """A literal value of a dtype (equal to another only bit for bit, see `const_key`)."""

    value: Scalar
    dtype: str

    def __eq__(self, other: object) -> bool:
        if type(other) is not Const:
            return NotImplemented
        return const_key(self.value, self.dtype) == const_key(other.value, other.dtype)

    def __hash__(self) -> int:
        return hash(const_key(self.value, self.dtype))


def _cache_hash(node: Any) -> None:
    # Frozen-dataclass hashing re-hashes the whole subtree at every level (exponential on
    # shared IR): each node hashes once, from its children's cached hashes.
    object.__setattr__(node, "_hash", hash((type(node).__name__,
                                            *(getattr(node, f.name) for f in fields(node)))))


@dataclass(frozen=True)
class Idx(Expr):
    """The iteration coordinate of dim `dim` (outer dims first, then reduce dims)."""

    dim: int
    dtype: str = "int64"


@dataclass(frozen=True)
class Load(Expr):
    """Element `index` of argument `arg`, read as `dtype` (the argument's dtype)."""

    arg: int
    index: Expr
    dtype: str

    def __post_init__(self) -> None:
        _cache_hash(self)

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Op(Expr):
    """A pointwise operation whose result has dtype `dtype`."""

    op: str
    args: tuple[Expr, ...]
    dtype: str

    def __post_init__(self) -> None:
        _cache_hash(self)

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Reduce(Expr):
    """A reduction of `body` over the kernel's whole reduce domain, per outer element."""

    op: str
    body: Expr
    dtype: str

    def __post_init__(self) -> None:
        _cache_hash(self)

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Store:
    """Write `value` to element `index` of argument `arg`."""

    arg: int
    index: Expr
    value: Expr

    def __post_init__(self) -> None:
        _cache_hash(self)

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Arg:
    """A kernel argument: a view of `dtype`, read ('r'), written ('w') or both ('rw')."""

    dtype: str
    mode: str


@dataclass(frozen=True)
class Kernel:
    """One generated kernel: iteration shapes, arguments and stores."""

    name: str
    shape: tuple[int, ...]
    rshape: tuple[int, ...]
    args: tuple[Arg, ...]
    stores: tuple[Store, ...]

    def __post_init__(self) -> None:
        validate(self)

    @property
    def numel(self) -> int:
        """Number of outer elements (the grid size)."""
        n = 1
        for s in self.shape:
            n *= s
        return n


# ---------------------------------------------------------------------------------------------
# builders


def const(value: Scalar, dtype: str) -> Const:
    """A literal."""
    return Const(value, dtype)


def strided_index(strides: Sequence[int], dims: Sequence[int] | None = None) -> Expr:
    """The element index sum(Idx(d) * stride) over `dims` (default 0..len(strides)-1)."""
    dims = range(len(strides)) if dims is None else dims
    terms: list[Expr] = []
    for d, s in zip(dims, strides):
        if s == 0:
            continue
        term: Expr = Idx(d) if s == 1 else Op("mul", (Idx(d), Const(int(s), "int64")), "int64")
        terms.append(term)
    if not terms:
        return Const(0, "int64")
    out = terms[0]
    for t in terms[1:]:
        out = Op("add", (out, t), "int64")
    return out


def load(arg: int, strides: Sequence[int], dtype: str, dims: Sequence[int] | None = None) -> Load:
    """Load argument `arg` through `strides` over iteration dims `dims`."""
    return Load(arg, strided_index(strides, dims), dtype)


def store(arg: int, strides: Sequence[int], value: Expr,
          dims: Sequence[int] | None = None) -> Store:
    """Store `value` into argument `arg` through `strides`."""
    return Store(arg, strided_index(strides, dims), value)


def cast(x: Expr, dtype: str) -> Expr:
    """`x` converted to `dtype` (no-op when already of it)."""
    return x if x.dtype == dtype else Op("cast", (x,), dtype)


# ---------------------------------------------------------------------------------------------
# validation and (de)serialization


def children(e: Any) -> tuple[Any, ...]:
    """The direct operands of an IR node (a Store's index and value included)."""
    if isinstance(e, Store):
        return (e.index, e.value)
    if isinstance(e, Load):
        return (e.index,)
    if isinstance(e, Op):
        return e.args
    if isinstance(e, Reduce):
        return (e.body,)
    return ()


def walk(roots: Sequence[Any]) -> Iterator[Any]:
    """Every IR node reachable from `roots`, each once (shared subexpressions too)."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        stack.extend(children(e))


#: each IR class's fields and the kind of value each must hold (see `field_problem`)
FIELDS: dict[str, dict[str, str]] = {
    "Const": {"value": "scalar", "dtype": "str"},
    "Idx": {"dim": "int", "dtype": "str"},
    "Load": {"arg": "int", "index": "expr", "dtype": "str"},
    "Op": {"op": "str", "args": "exprs", "dtype": "str"},
    "Reduce": {"op": "str", "body": "expr", "dtype": "str"},
    "Store": {"arg": "int", "index": "expr", "value": "expr"},
    "Arg": {"dtype": "str", "mode": "str"},
    "Kernel": {"name": "str", "shape": "ints", "rshape": "ints", "args": "args",
               "stores": "stores"},
}


def _type_name(v: Any) -> str:
    # A JSON list is built as a tuple: name it as the file has it.
    return "list" if isinstance(v, tuple) else type(v).__name__


def field_problem(kind: str, v: Any) -> str:
    """Why `v` cannot be a field of kind `kind` (a value of FIELDS); "" when it can. Every
    field is checked by type before anything compares, hashes or walks it."""
    if kind == "int":
        return "" if isinstance(v, int) and not isinstance(v, bool) else \
            f"expected an integer, got {_type_name(v)}"
    if kind == "str":
        return "" if isinstance(v, str) else f"expected a string, got {_type_name(v)}"
    if kind == "scalar":
        return "" if isinstance(v, (int, float, bool)) else \
            f"expected a number or a bool, got {_type_name(v)}"
    if kind == "expr":
        return "" if isinstance(v, (Const, Idx, Load, Op, Reduce)) else \
            f"expected an expression node, got {_type_name(v)}"
    want = {"ints": (int, "integers"), "exprs": ((Const, Idx, Load, Op, Reduce),
                                                 "expression nodes"),
            "args": (Arg, "Arg nodes"), "stores": (Store, "Store nodes")}[kind]
    if not isinstance(v, tuple):
        return f"expected a list of {want[1]}, got {_type_name(v)}"
    for j, x in enumerate(v):
        if not isinstance(x, want[0]) or (kind == "ints" and isinstance(x, bool)):
            return f"entry {j}: expected one of {want[1]}, got {_type_name(x)}"
    return ""


def node_problem(node: Any) -> str:
    """"Type.field: why" for the first malformed field of an IR node ("" if none)."""
    name = type(node).__name__
    for f, kind in FIELDS.get(name, {}).items():
        problem = field_problem(kind, getattr(node, f, None))
        if problem:
            return f"{name}.{f}: {problem}"
    return ""


def validate(k: Kernel) -> None:
    """Check a kernel's structure; raise InvalidArgument naming the fault. Every node is
    checked by type before its fields are used, and looked at once however shared."""
    problem = node_problem(k)
    if problem:
        raise InvalidArgument(f"kernel: {problem}"[:300])
    if not k.name.isidentifier():
        raise InvalidArgument(f"kernel name {k.name!r} is not an identifier")
    for s in (*k.shape, *k.rshape):
        if s < 0:
            raise InvalidArgument(f"kernel {k.name}: bad iteration size {s!r}")
    ndim = len(k.shape) + len(k.rshape)
    for a in k.args:
        problem = node_problem(a)
        if problem:
            raise InvalidArgument(f"kernel {k.name}: {problem}"[:300])
        if a.dtype not in DTYPES or a.mode not in ("r", "w", "rw"):
            raise InvalidArgument(f"kernel {k.name}: bad argument {a!r}"[:300])
    seen: set[int] = set()
    stack: list[Any] = []
    for st in k.stores:
        problem = node_problem(st)
        if problem:
            raise InvalidArgument(f"kernel {k.name}: {problem}"[:300])
        if not 0 <= st.arg < len(k.args) or "w" not in k.args[st.arg].mode:
            raise InvalidArgument(f"kernel {k.name}: store to non-output argument {st.arg}")
        stack.extend((st.index, st.value))
    # One walk over all stores: a value shared by many stores is checked once.
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        problem = node_problem(e)
        if problem:
            raise InvalidArgument(f"kernel {k.name}: {problem}"[:300])
        _check_node(k, e, ndim)
        stack.extend(children(e))


def _check_node(k: Kernel, e: Expr, ndim: int) -> None:
    if e.dtype not in DTYPES:
        raise InvalidArgument(f"kernel {k.name}: bad dtype {e.dtype!r}")
    if isinstance(e, Idx) and not 0 <= e.dim < ndim:
        raise InvalidArgument(f"kernel {k.name}: index dim {e.dim} out of range")
    if isinstance(e, Load):
        if not 0 <= e.arg < len(k.args) or e.dtype != k.args[e.arg].dtype:
            raise InvalidArgument(f"kernel {k.name}: bad load of argument {e.arg}")
    if isinstance(e, Op):
        known = e.op in UNARY_OPS or e.op in BINARY_OPS or e.op in OTHER_OPS
        arity = 1 if e.op in UNARY_OPS or e.op == "cast" else 3 if e.op == "where" else 2
        if not known or len(e.args) != arity:
            raise InvalidArgument(f"kernel {k.name}: bad op {e.op!r}/{len(e.args)}")
    if isinstance(e, Reduce) and (e.op not in REDUCE_OPS or not k.rshape):
        raise InvalidArgument(f"kernel {k.name}: bad reduction {e.op!r}")
    if isinstance(e, Const):
        problem = const_problem(e.value, e.dtype)
        if problem:
            raise InvalidArgument(f"kernel {k.name}: constant {e.value!r} of {e.dtype}: "
                                  f"{problem}"[:300])


#: the values each integer dtype holds (the range the bounds proof assumes for it)
INT_RANGE = {
    "int64": (-(1 << 63), (1 << 63) - 1), "int32": (-(1 << 31), (1 << 31) - 1),
    "int16": (-(1 << 15), (1 << 15) - 1), "int8": (-128, 127), "uint8": (0, 255),
    "bool": (0, 1),
}


def const_problem(value: Any, dtype: str) -> str:
    """Why `value` cannot be a literal of `dtype` ("" when it can)."""
    if not isinstance(value, (int, float, bool)):
        return "not a number"
    if dtype == "bool":
        return "" if isinstance(value, bool) else "a bool constant must be true or false"
    if isinstance(value, bool):
        return "a bool value in a non-bool constant"
    if dtype in FLOAT_DTYPES:
        if isinstance(value, int) and not INT_RANGE["int64"][0] <= value <= INT_RANGE["int64"][1]:
            return "overflows int64"
        return ""
    if not isinstance(value, int):
        # NaN, inf and fractions have no integer meaning; the proof needs an exact value.
        return "not an integer"
    lo, hi = INT_RANGE[dtype]
    if not lo <= value <= hi:
        return f"overflows {dtype} (range [{lo}, {hi}])"
    return ""


_NODE_TYPES = {c.__name__: c for c in (Const, Idx, Load, Op, Reduce, Store, Arg, Kernel)}


def to_json(obj: Any) -> Any:
    """A JSON-ready form of an IR object (nested lists and dicts)."""
    if isinstance(obj, tuple(_NODE_TYPES.values())):
        d = {"t": type(obj).__name__}
        for f in fields(obj):
            d[f.name] = to_json(getattr(obj, f.name))
        return d
    if isinstance(obj, (list, tuple)):
        return [to_json(x) for x in obj]
    if isinstance(obj, float) and obj != obj:
        return {"t": "float", "v": "nan"}
    if isinstance(obj, float) and obj in (float("inf"), float("-inf")):
        return {"t": "float", "v": "inf" if obj > 0 else "-inf"}
    return obj


#: JSON nesting that from_json accepts (a file's JSON parser stops before this anyway)
MAX_JSON_DEPTH = 2000


def from_json(obj: Any) -> Any:
    """Rebuild IR objects from `to_json` output; raise ProgramError naming the malformed
    field. Iterative: no nesting depth reaches Python's recursion limit."""
    built: dict[int, Any] = {}
    stack: list[tuple[Any, int, bool]] = [(obj, 0, False)]
    while stack:
        o, depth, ready = stack.pop()
        if id(o) in built:
            continue
        if depth > MAX_JSON_DEPTH:
            raise ProgramError("kernel IR nests too deeply")
        kids = _json_kids(o)
        if not ready and kids:
            stack.append((o, depth, True))
            stack.extend((x, depth + 1, False) for x in kids if id(x) not in built)
            continue
        if isinstance(o, list):
            built[id(o)] = tuple(built[id(x)] for x in o)
        elif isinstance(o, dict) and o.get("t") != "float":
            built[id(o)] = _build(o, {f: built[id(v)] for f, v in o.items() if f != "t"})
        else:
            built[id(o)] = _json_scalar(o)
    return built[id(obj)]


def _json_kids(o: Any) -> list[Any]:
    """The JSON values an IR value is built from (checking a node's type and fields)."""
    if isinstance(o, list):
        return o
    if not isinstance(o, dict):
        return []
    t = o.get("t")
    if t == "float":
        return []
    if not isinstance(t, str) or t not in _NODE_TYPES:
        raise ProgramError(f"unknown IR node type {t!r}"[:200])
    names = set(FIELDS[t])
    if set(o) - {"t"} != names:
        raise ProgramError(f"IR node {t} has fields {sorted(map(str, o))}, expected "
                           f"{sorted(names)}"[:300])
    return [v for f, v in o.items() if f != "t"]


def _json_scalar(o: Any) -> Any:
    if isinstance(o, dict):       # a special float
        v = o.get("v")
        if set(o) != {"t", "v"} or not isinstance(v, str) or v not in ("nan", "inf", "-inf"):
            raise ProgramError(f"bad special float {v!r}"[:200])
        return float(v)
    if o is None or isinstance(o, (int, float, bool, str)):
        return o
    raise ProgramError(f"unexpected IR value {o!r}"[:200])


def _build(o: dict, kwargs: dict[str, Any]) -> Any:
    """The IR node `o` describes, from its built fields, each checked by type first."""
    t = o["t"]
    for f, kind in FIELDS[t].items():
        problem = field_problem(kind, kwargs[f])
        if problem:
            raise ProgramError(f"IR node {t}.{f}: {problem}"[:300])
    try:
        return _NODE_TYPES[t](**kwargs)
    except InvalidArgument as e:      # Kernel's own validate(): meaning, not types
        raise ProgramError(f"bad IR node {t}: {e}") from None


def dumps(kernels: Sequence[Kernel]) -> str:
    """Serialize kernels to a JSON string."""
    return json.dumps(to_json(list(kernels)))
