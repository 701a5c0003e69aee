"""build_kernel: the kernel IR of one fusion group (aotrt.exporter.fuse makes the groups).

Every group has a `Space` (optable.py): a full shape F, and for reductions the reduced dims
D of F (for cumsum, the scanned dim). The kernel iterates over the outer dims (F without D,
ordered by the strides of the first output, size-1 dims dropped) and reduces over D. A group
member's value is built at explicit coordinates: a value of shape F is read at the outer
and reduce coordinates ("full" role, stored in the loop after the reductions), a value of F's
shape with D removed or set to 1 at the outer coordinates only (stored once per outer
element). Operands are read broadcast (size-1 dims at coordinate 0), so a group member of a
smaller shape that is only used inside the group is simply recomputed where it is needed.
Half-precision values are computed in float32 and rounded per node, like eager (the
renderer's `round_to`).
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

from aotrt.errors import Unsupported
from aotrt.exporter.fuse import multi_source, node_space, opdef_of, why_not
from aotrt.exporter.nodes import describe, dtype_name, node_args
from aotrt.exporter.optable import I64, OPS, ZERO, Space, broadcast_coords, const, numel, \
    shape_of, val
from aotrt.kernels import ir
from aotrt.kernels.ir import Const, Expr, Idx, Load


def _group_space(members: Sequence[torch.fx.Node], outputs: Sequence[torch.fx.Node]) -> Space:
    structural = []
    for n in members:
        if multi_source(n) is None:
            sp = node_space(n)
            if sp.structural and sp not in structural:
                structural.append(sp)
    if len(structural) > 1:
        raise Unsupported(f"group mixes iteration spaces {structural} "
                          f"({', '.join(describe(n) for n in members[:3])})")
    if structural:
        return structural[0]
    shapes = [shape_of(o) for o in outputs]
    live = [s for s in shapes if numel(s)]
    return Space((live or shapes or [shape_of(members[-1])])[0])


# ---------------------------------------------------------------------------------------------
# build_kernel


class _Builder:
    """Builds the IR of one group: values of nodes at coordinates, loads, stores."""

    def __init__(self, name: str, group: Sequence[torch.fx.Node],
                 inputs: Sequence[torch.fx.Node], outputs: Sequence[torch.fx.Node]) -> None:
        self.name = name
        self.members = set(group)
        for n in group:  # getitems of multi-output members belong to the group
            if opdef_of(n) is not None and opdef_of(n).outputs > 1:
                self.members.update(u for u in n.users if multi_source(u) is n)
        self.arg_of: dict[torch.fx.Node, int] = {}
        for i, n in enumerate(inputs):
            if n in self.members:
                raise Unsupported(f"kernel {name}: input {n.name} is a member of the group")
            self.arg_of.setdefault(n, i)
        self.inputs, self.outputs = list(inputs), list(outputs)
        for n in group:
            why = why_not(n)
            if why is not None:
                raise Unsupported(f"{describe(n)} cannot be fused: {why}")
        self.space = _group_space(list(group), outputs)
        self._memo: dict[Any, Expr] = {}
        self._ridx_memo: dict[int, bool] = {}
        self._args_memo: dict[torch.fx.Node, dict[str, Any]] = {}
        self._layout()

    # -- iteration space ---------------------------------------------------------------------

    def _layout(self) -> None:
        sp = self.space
        F = sp.full
        outer = [k for k in range(len(F)) if sp.scan is not None or k not in sp.rdims]
        strides = self._primary_strides()
        if strides is not None:  # iterate in the memory order of the first output
            outer.sort(key=lambda k: -abs(strides[k]))
        outer = [k for k in outer if F[k] != 1]
        self.shape = tuple(F[k] for k in outer)
        self.nouter = len(outer)
        full: list[Expr] = [ZERO] * len(F)
        for i, k in enumerate(outer):
            full[k] = Idx(i)
        self._ridx: dict[int, Expr] = {}
        if sp.scan is not None:
            self.rshape: tuple[int, ...] = (F[sp.scan],)
        elif sp.reduce:
            self.rshape = tuple(F[k] for k in sp.rdims) or (1,)
            for j, k in enumerate(sp.rdims):
                self._ridx[k] = Idx(self.nouter + j) if F[k] != 1 else ZERO
                full[k] = self._ridx[k]
        else:
            self.rshape = ()
        self.full_coords = tuple(full)

    def _primary_strides(self) -> tuple[int, ...] | None:
        """Strides of the first stored output per dim of F (None if there is none)."""
        for o in self.outputs:
            shape = shape_of(o)
            role = self.space.role(shape)
            if role is None or not numel(shape):
                continue
            st = tuple(val(o).stride())
            if role == "squeeze":
                it = iter(st)
                return tuple(0 if k in self.space.rdims else next(it)
                             for k in range(len(self.space.full)))
            return st
        return None

    def role_coords(self, node: torch.fx.Node, shape: tuple[int, ...]) -> tuple[Expr, ...]:
        """Coordinates at which a stored value of `shape` is produced."""
        role = self.space.role(shape)
        rd = self.space.rdims if self.space.reduce else ()
        if role == "full":
            return self.full_coords
        if role == "keep":
            return tuple(ZERO if k in rd else c for k, c in enumerate(self.full_coords))
        if role == "squeeze":
            return tuple(c for k, c in enumerate(self.full_coords) if k not in rd)
        raise Unsupported(f"kernel {self.name}: output {describe(node)} of shape {shape} "
                          f"does not fit the group's iteration space {self.space}")

    def ridx(self, k: int) -> Expr:
        """The reduce coordinate of dim k of the full shape."""
        return self._ridx[k]

    def scan_idx(self) -> Expr:
        """The reduce coordinate of a cumsum group (the summed position)."""
        return Idx(self.nouter) if self.rshape[0] != 1 else ZERO

    def require(self, node: torch.fx.Node, space: Space) -> Space:
        """The group's space, which must be `space` (the space `node` needs)."""
        if space != self.space:
            raise Unsupported(f"kernel {self.name}: {describe(node)} needs space {space}, "
                              f"the group has {self.space}")
        return self.space

    def uses_ridx(self, e: Expr) -> bool:
        """Whether `e` depends on a reduce coordinate outside any Reduce."""
        key = id(e)
        hit = self._ridx_memo.get(key)
        if hit is not None:
            return hit
        if isinstance(e, Idx):
            r = e.dim >= self.nouter
        elif isinstance(e, Load):
            r = self.uses_ridx(e.index)
        elif isinstance(e, ir.Op):
            r = any(self.uses_ridx(a) for a in e.args)
        else:
            r = False
        self._ridx_memo[key] = r
        return r

    def check_outer(self, coords: Iterable[Expr], node: torch.fx.Node) -> None:
        """Refuse a reduction evaluated at coordinates that move with the reduce loop."""
        if any(self.uses_ridx(c) for c in coords):
            raise Unsupported(f"kernel {self.name}: {describe(node)} would be reduced "
                              "inside another reduction's loop")

    # -- values -------------------------------------------------------------------------------

    def args(self, node: torch.fx.Node) -> dict[str, Any]:
        """Schema-named arguments of a node (cached)."""
        a = self._args_memo.get(node)
        if a is None:
            a = self._args_memo[node] = node_args(node)
        return a

    def dtype(self, node: torch.fx.Node, out: int = 0) -> str:
        """IR dtype of output `out` of a node."""
        return dtype_name(val(node, out).dtype, node)

    def meta_or_scalar(self, x: Any) -> Any:
        """What type promotion sees for an operand: its FakeTensor, or the Python scalar."""
        return val(x) if isinstance(x, torch.fx.Node) else x

    def operand(self, x: Any, out_shape: tuple[int, ...], coords: tuple[Expr, ...],
                dtype: str) -> Expr:
        """Operand `x` (node or scalar) read broadcast to `out_shape` at `coords`, as
        `dtype`."""
        if isinstance(x, torch.fx.Node):
            xc = broadcast_coords(shape_of(x), out_shape, coords)
            return ir.cast(self.value(x, xc), dtype)
        if isinstance(x, (bool, int, float)):
            return const(x, dtype)
        raise Unsupported(f"kernel {self.name}: operand {x!r} is not a tensor or a number")

    def value(self, node: torch.fx.Node, coords: tuple[Expr, ...]) -> Expr:
        """The value of `node` at `coords` (one per dim of its shape), in its dtype."""
        key = (node, coords)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        if len(coords) != len(shape_of(node)):
            raise Unsupported(f"kernel {self.name}: {node.name} read with {len(coords)} "
                              f"coordinates, it has {len(shape_of(node))} dims")
        if node in self.arg_of:
            e: Expr = self._load(node, coords)
        elif node in self.members:
            src = multi_source(node)
            if src is not None:
                e = self._eval(src, coords, int(node.args[1]))
            else:
                e = self._eval(node, coords, 0)
        else:
            raise Unsupported(f"kernel {self.name}: {describe(node)} is read but is "
                              "neither in the group nor an input")
        self._memo[key] = e
        return e

    def _eval(self, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
        opdef = OPS[node.target]
        try:
            e = opdef.value(self, node, coords, out)
        except Unsupported:
            raise
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
            raise Unsupported(f"kernel {self.name}: cannot build {describe(node)}: "
                              f"{type(exc).__name__}: {exc}") from exc
        return ir.cast(e, self.dtype(node, out))

    def _load(self, node: torch.fx.Node, coords: tuple[Expr, ...]) -> Expr:
        return Load(self.arg_of[node], self.index(node, coords), self.dtype(node))

    def index(self, node: torch.fx.Node, coords: tuple[Expr, ...]) -> Expr:
        """Element index of `coords` in the view described by node's meta['val'] (strides
        only: the runtime binds every argument at its byte offset)."""
        v = val(node)
        terms: list[Expr] = []
        offset = 0
        for c, s, n in zip(coords, v.stride(), v.shape):
            if n == 1 or s == 0:
                continue
            if isinstance(c, Const):
                offset += int(c.value) * s
                continue
            terms.append(c if s == 1 else ir.Op("mul", (c, Const(int(s), I64)), I64))
        if offset or not terms:
            terms.append(Const(offset, I64))
        out = terms[0]
        for t in terms[1:]:
            out = ir.Op("add", (out, t), I64)
        return out

    # -- kernel ---------------------------------------------------------------------------------

    def kernel(self) -> ir.Kernel:
        """The finished kernel."""
        args = [ir.Arg(self.dtype(n), "r") for n in self.inputs]
        stores = []
        for j, o in enumerate(self.outputs):
            if o not in self.members:
                raise Unsupported(f"kernel {self.name}: output {o.name} is not in the group")
            args.append(ir.Arg(self.dtype(o), "w"))
            shape = shape_of(o)
            if not numel(shape):
                continue
            coords = self.role_coords(o, shape)
            value = ir.cast(self.value(o, coords), self.dtype(o))
            stores.append(ir.Store(len(self.inputs) + j, self.index(o, coords), value))
        return ir.Kernel(self.name, self.shape, self.rshape if self._has_reduce(stores) else (),
                         tuple(args), tuple(stores))

    def _has_reduce(self, stores: list[ir.Store]) -> bool:
        if not self.rshape:
            return False
        seen: set[int] = set()
        stack: list[Expr] = [x for s in stores for x in (s.index, s.value)]
        while stack:
            e = stack.pop()
            if id(e) in seen:
                continue
            seen.add(id(e))
            if isinstance(e, (ir.Reduce,)) or (isinstance(e, Idx) and e.dim >= self.nouter):
                return True
            if isinstance(e, Load):
                stack.append(e.index)
            elif isinstance(e, ir.Op):
                stack.extend(e.args)
        return False


def build_kernel(name: str, group: list[torch.fx.Node], inputs: list[torch.fx.Node],
                 outputs: list[torch.fx.Node]) -> ir.Kernel:
    """The kernel of one group: args are `inputs` (mode 'r') then `outputs` (mode 'w').

    `outputs` are group members whose values are needed outside; for a multi-output node
    they are its getitem nodes (the node itself is never an output; its unused results,
    such as batch norm's empty statistics, are not computed). An input that no member reads
    (the shape operand of full_like) is allowed and stays unread. Loads and stores index
    each view by the strides of its meta['val']. Raises Unsupported naming the op and its
    source line when the group cannot be built.
    """
    if not group:
        raise Unsupported(f"kernel {name}: empty group")
    return _Builder(name, group, inputs, outputs).kernel()
