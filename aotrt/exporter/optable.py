"""The kernel op table's types and helpers: `Space` (the iteration space a group needs),
`OpDef` (how one ATen overload becomes kernel code), the `OPS` table that pointwise.py and
reductions.py fill, and the IR expression helpers their value functions share."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx

from aotrt.errors import Unsupported
from aotrt.exporter.nodes import describe
from aotrt.kernels import ir
from aotrt.kernels.ir import Const, Expr, Op

I64 = "int64"
F32 = "float32"
BOOL = "bool"
ZERO = Const(0, I64)


# ---------------------------------------------------------------------------------------------
# node values


def compute_dtype(name: str) -> str:
    """The dtype an op computes in for values of dtype `name` (float32 for half types)."""
    return F32 if name in ir.FLOAT_DTYPES else name


def val(node: torch.fx.Node, out: int = 0) -> Any:
    """The FakeTensor (or one element of a tuple of them) that describes a node's result."""
    v = node.meta.get("val")
    if isinstance(v, (tuple, list)):
        v = v[out]
    return v


def shape_of(node: torch.fx.Node, out: int = 0) -> tuple[int, ...]:
    """Static shape of a node's result."""
    v = val(node, out)
    if not isinstance(v, torch.Tensor):
        raise Unsupported(f"{describe(node)} has no tensor value")
    shape = tuple(v.shape)
    if not all(isinstance(s, int) for s in shape):
        raise Unsupported(f"{describe(node)} has a symbolic shape {shape}")
    return shape


def numel(shape: Sequence[int]) -> int:
    """Number of elements of a shape."""
    return math.prod(shape)


def norm_dim(d: int, rank: int) -> int:
    """A dim index in [0, rank) (0-d tensors accept 0 and -1)."""
    r = max(rank, 1)
    if not -r <= d < r:
        raise Unsupported(f"dim {d} out of range for rank {rank}")
    return d % r


def broadcast_coords(shape: Sequence[int], out_shape: Sequence[int],
                     coords: Sequence[Expr]) -> tuple[Expr, ...]:
    """Coordinates into a tensor of `shape` broadcast (right-aligned) to `out_shape`."""
    lead = len(out_shape) - len(shape)
    if lead < 0:
        raise Unsupported(f"shape {tuple(shape)} does not broadcast to {tuple(out_shape)}")
    return tuple(ZERO if s == 1 else coords[lead + j] for j, s in enumerate(shape))


# ---------------------------------------------------------------------------------------------
# expression helpers


def op(name: str, *args: Expr, dtype: str | None = None) -> Expr:
    """An IR op; the dtype defaults to the first value operand's."""
    return Op(name, tuple(args), dtype or args[1 if name == "where" else 0].dtype)


def const(value: Any, dtype: str) -> Const:
    """A literal converted to `dtype`'s Python type."""
    if dtype == BOOL:
        return Const(bool(value), dtype)
    if dtype in ir.FLOAT_DTYPES:
        return Const(float(value), dtype)
    return Const(int(value), dtype)


def add(a: Expr, b: Expr) -> Expr:
    """a + b with constant folding of integer literals."""
    if isinstance(b, Const) and b.value == 0:
        return a
    if isinstance(a, Const) and a.value == 0 and a.dtype == b.dtype:
        return b
    if isinstance(a, Const) and isinstance(b, Const) and a.dtype == b.dtype == I64:
        return Const(int(a.value) + int(b.value), I64)
    return op("add", a, b)


def mul(a: Expr, b: Expr) -> Expr:
    """a * b with folding of 0 and 1 integer literals."""
    for x, y in ((a, b), (b, a)):
        if isinstance(y, Const) and y.dtype == I64 and x.dtype == I64:
            if y.value == 0:
                return ZERO
            if y.value == 1:
                return x
    return op("mul", a, b)


def wrap_index(i: Expr, size: int, negative: bool = True) -> Expr:
    """An index read from data, checked as torch checks it (outside [0, size), or with
    `negative` [-size, size), it is the kernel's error "index out of range", which the run
    raises), wrapped (with `negative`: counting from the end) and clamped into [0, size),
    so that a bad index never addresses memory outside the tensor, whatever the check does."""
    n = Const(size, I64)
    i = op("index_check_neg" if negative else "index_check", ir.cast(i, I64), n)
    if negative:
        i = op("where", op("lt", i, ZERO, dtype=BOOL), op("add", i, n), i)
    return op("minimum", op("maximum", i, ZERO), Const(max(size - 1, 0), I64))


# ---------------------------------------------------------------------------------------------
# the table


@dataclass(frozen=True)
class Space:
    """The iteration space a group of nodes needs.

    `full` is the shape of the widest values. Reductions reduce `rdims` of it (sorted; the
    outer domain is the rest); `scan` is the cumsum dim, for which every dim is outer and the
    reduce loop runs along that dim. Pointwise spaces have neither.
    """

    full: tuple[int, ...]
    rdims: tuple[int, ...] = ()
    reduce: bool = False
    scan: int | None = None

    @property
    def structural(self) -> bool:
        """True for reduction and scan spaces."""
        return self.reduce or self.scan is not None

    def role(self, shape: tuple[int, ...]) -> str | None:
        """How a value of `shape` is indexed by this space: 'full', 'keep' (reduced dims of
        size 1), 'squeeze' (reduced dims removed) or None (not at all)."""
        if shape == self.full:
            return "full"
        if self.reduce:
            if shape == tuple(1 if k in self.rdims else s for k, s in enumerate(self.full)):
                return "keep"
            if shape == tuple(s for k, s in enumerate(self.full) if k not in self.rdims):
                return "squeeze"
        return None


#: value(builder, node, coords, out) -> Expr in the dtype of output `out` of the node
ValueFn = Callable[[Any, torch.fx.Node, tuple[Expr, ...], int], Expr]


@dataclass(frozen=True)
class OpDef:
    """How one ATen overload becomes kernel code.

    kind: 'pointwise' (value from operands at broadcast coordinates), 'generator' (no tensor
    operand is read), 'remap' (reads operand `data` at computed coordinates; partition never
    puts `data` in the same group), 'reduce', 'scan' (structural: `space` gives the space).
    `outputs` > 1 marks a multi-output op whose results are selected by getitem nodes.
    `check` refuses nodes the handler cannot build (returns a reason, or None).
    """

    kind: str
    value: ValueFn
    space: Callable[[torch.fx.Node], Space] | None = None
    data: str | None = None
    outputs: int = 1
    check: Callable[[torch.fx.Node], str | None] | None = None
    weight: int = 1


OPS: dict[Any, OpDef] = {}


def register(targets: Sequence[Any], opdef: OpDef) -> None:
    """Add `opdef` for every overload in `targets` (missing overloads are skipped)."""
    for t in targets:
        if t is not None:
            OPS[t] = opdef


def overloads(packet: Any, *names: str) -> list[Any]:
    """Overloads of an op packet that exist in this torch."""
    return [getattr(packet, n) for n in names if hasattr(packet, n)]
