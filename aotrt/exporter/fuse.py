"""Fusion: which core-ATen nodes become generated kernels, how they group, and their IR.

- `fusible(node)`: the node can be kernel code (pointwise math, casts, generators, indirect
  loads, reductions, softmax, norms, cumsum; see `pointwise.OPS`).
- `partition(nodes)`: groups of fusible nodes, each one kernel with one iteration space.
- `build_kernel(name, group, inputs, outputs)`: the kernel IR of one group.

Every group has a `Space` (pointwise.py): a full shape F, and for reductions the reduced dims
D of F (for cumsum, the scanned dim). The kernel iterates over the outer dims (F without D,
ordered by the strides of the first output, size-1 dims dropped) and reduces over D. A group
member's value is built at explicit coordinates: a value of shape F is read at the outer
and reduce coordinates ("full" role, stored in the loop after the reductions), a value of F's
shape with D removed or set to 1 at the outer coordinates only (stored once per outer
element). Operands are read broadcast (size-1 dims at coordinate 0), so a group member of a
smaller shape that is only used inside the group is simply recomputed where it is needed.

Multi-output nodes (native_layer_norm, var_mean, max.dim, batch norm) are selected by
getitem nodes; those getitems are fusible, belong to their source's group and are what
`outputs` names. Half-precision values are computed in float32 and rounded per node, like
eager (the renderer's `round_to`).
"""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch

from aotrt.errors import Unsupported
from aotrt.kernels import ir
from aotrt.kernels.ir import Const, Expr, Idx, Load
from aotrt.exporter.pointwise import (
    I64, OPS, ZERO, OpDef, Space, broadcast_coords, const, dtype_name,
    node_args, numel, shape_of, val, where_from,
)
from aotrt.exporter.reductions import OPS_SPACE  # importing it registers the reductions

log = logging.getLogger(__name__)

#: fusion stops growing an expression past this many IR nodes (counted as a tree: the
#: serialized IR is a tree) or this many chained fx nodes (the IR and its renderer recurse)
MAX_TREE = 4000
MAX_DEPTH = 64


# ---------------------------------------------------------------------------------------------
# fusible


def _opdef(node: torch.fx.Node) -> OpDef | None:
    if node.op != "call_function":
        return None
    return OPS.get(node.target)


def _multi_source(node: torch.fx.Node) -> torch.fx.Node | None:
    """The multi-output fusible node a getitem selects from, else None."""
    if node.op != "call_function" or node.target is not operator.getitem:
        return None
    src = node.args[0]
    if isinstance(src, torch.fx.Node):
        d = _opdef(src)
        if d is not None and d.outputs > 1:
            return src
    return None


def _tensor_vals(node: torch.fx.Node) -> list[Any]:
    v = node.meta.get("val")
    return list(v) if isinstance(v, (tuple, list)) else [v]


def _why_not(node: torch.fx.Node) -> str | None:
    """None when `node` is fusible, else the reason it is not."""
    src = _multi_source(node)
    if src is not None:
        return _why_not(src)
    d = _opdef(node)
    if d is None:
        return "not a fusible op"
    for v in _tensor_vals(node):
        if not isinstance(v, torch.Tensor):
            return "no tensor value"
        if v.dtype not in _DTYPES or not all(isinstance(s, int) for s in v.shape):
            return f"dtype {v.dtype} / shape {tuple(v.shape)}"
    for x in node.all_input_nodes:
        for v in _tensor_vals(x):
            if isinstance(v, torch.Tensor) and v.dtype not in _DTYPES:
                return f"an input of dtype {v.dtype}"
    if d.check is not None:
        return d.check(node)
    return None


_DTYPES = {torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool}


def fusible(node: torch.fx.Node) -> bool:
    """True for call_function nodes that generated kernels implement (see pointwise.OPS),
    and for getitem nodes selecting a result of a fusible multi-output node."""
    return _why_not(node) is None


# ---------------------------------------------------------------------------------------------
# spaces


def node_space(node: torch.fx.Node) -> Space:
    """The iteration space a node needs: its own for reductions, scans and softmax/norms;
    the pointwise space of its output shape otherwise."""
    src = _multi_source(node)
    if src is not None:
        return node_space(src)
    space_fn = OPS_SPACE.get(node.target)
    if space_fn is not None:
        return space_fn(node)
    return Space(shape_of(node))


def _combine(a: Space, b: Space) -> Space | None:
    """The space of a group holding groups of spaces `a` and `b`, or None."""
    if a == b:
        return a
    if a.structural and b.structural:
        return None
    if not a.structural and not b.structural:
        return None
    s, p = (a, b) if a.structural else (b, a)
    return s if s.role(p.full) is not None else None


def _group_space(members: Sequence[torch.fx.Node], outputs: Sequence[torch.fx.Node]) -> Space:
    structural = []
    for n in members:
        if _multi_source(n) is None:
            sp = node_space(n)
            if sp.structural and sp not in structural:
                structural.append(sp)
    if len(structural) > 1:
        raise Unsupported(f"group mixes iteration spaces {structural} "
                          f"({', '.join(where_from(n) for n in members[:3])})")
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
            if _opdef(n) is not None and _opdef(n).outputs > 1:
                self.members.update(u for u in n.users if _multi_source(u) is n)
        self.arg_of: dict[torch.fx.Node, int] = {}
        for i, n in enumerate(inputs):
            if n in self.members:
                raise Unsupported(f"kernel {name}: input {n.name} is a member of the group")
            self.arg_of.setdefault(n, i)
        self.inputs, self.outputs = list(inputs), list(outputs)
        for n in group:
            why = _why_not(n)
            if why is not None:
                raise Unsupported(f"{where_from(n)} cannot be fused: {why}")
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
        raise Unsupported(f"kernel {self.name}: output {where_from(node)} of shape {shape} "
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
            raise Unsupported(f"kernel {self.name}: {where_from(node)} needs space {space}, "
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
            raise Unsupported(f"kernel {self.name}: {where_from(node)} would be reduced "
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
            src = _multi_source(node)
            if src is not None:
                e = self._eval(src, coords, int(node.args[1]))
            else:
                e = self._eval(node, coords, 0)
        else:
            raise Unsupported(f"kernel {self.name}: {where_from(node)} is read but is "
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
            raise Unsupported(f"kernel {self.name}: cannot build {where_from(node)}: "
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


def group_io(group: Sequence[torch.fx.Node]) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
    """(inputs, outputs) of a group as `build_kernel` wants them: the tensor-valued nodes
    outside the group that members read (first use first), and the members (getitems for
    multi-output nodes) used outside the group."""
    members = _with_getitems(group)
    inputs: list[torch.fx.Node] = []
    outputs: list[torch.fx.Node] = []
    if not members:
        return inputs, outputs
    pos = {n: i for i, n in enumerate(next(iter(members)).graph.nodes)}
    for n in sorted(members, key=lambda m: pos[m]):
        d = _opdef(n)
        reads = [] if d is not None and d.kind == "generator" else n.all_input_nodes
        for x in reads:  # generators (full_like, ...) read only their operand's shape
            if x not in members and x not in inputs and isinstance(x.meta.get("val"),
                                                                   torch.Tensor):
                inputs.append(x)
        if d is not None and d.outputs > 1:
            continue
        if any(u not in members for u in n.users):
            outputs.append(n)
    return inputs, outputs


def _with_getitems(group: Iterable[torch.fx.Node]) -> set[torch.fx.Node]:
    members = set(group)
    for n in list(members):
        d = _opdef(n)
        if d is not None and d.outputs > 1:
            members.update(u for u in n.users if _multi_source(u) is n)
    return members


# ---------------------------------------------------------------------------------------------
# partition


@dataclass(eq=False)
class _Group:
    members: list[torch.fx.Node]
    space: Space
    mset: set[torch.fx.Node] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.mset = set(self.members)


def _operand_nodes(node: torch.fx.Node) -> list[torch.fx.Node]:
    return list(node.all_input_nodes)


def _data_operand(node: torch.fx.Node) -> torch.fx.Node | None:
    d = _opdef(node)
    if d is None or d.kind != "remap":
        return None
    x = node_args(node).get(d.data)
    return x if isinstance(x, torch.fx.Node) else None


def partition(nodes: list[torch.fx.Node]) -> list[list[torch.fx.Node]]:
    """Group fusible nodes (in topological order) into kernels; groups come back in the
    order they can run, each in topological order.

    Rules: a node joins the groups of its fusible producers when the spaces combine
    (pointwise chains of one shape; pointwise prologues of a reduction over its input shape;
    epilogues of the reduction's full or reduced shape; reductions of one space together;
    one cumsum with its pointwise neighbours); remap ops (gather, index, embedding, pad,
    flip, repeat) never share a group with the tensor they read from; expressions stay below
    MAX_TREE/MAX_DEPTH. Every group may run at the position of its last node: no node
    outside it that comes earlier uses a member, so no path leaves and re-enters a group.
    Groups of generators (full, arange, ...) whose users all sit in one other group are
    folded into it and recomputed there.
    """
    if not nodes:
        return []
    pos = {n: i for i, n in enumerate(nodes[0].graph.nodes)}
    order = sorted(set(nodes), key=lambda n: pos[n])
    group_of: dict[torch.fx.Node, _Group] = {}
    cost: dict[torch.fx.Node, tuple[int, int]] = {}
    for n in order:
        if n in group_of:  # a getitem placed with its multi-output source
            continue
        g = _Group([n], node_space(n))
        data = _data_operand(n)
        cands: list[_Group] = []
        for x in _operand_nodes(n):
            h = group_of.get(x)
            if h is not None and h not in cands and x is not data:
                cands.append(h)
        for h in cands:
            merged = _try_union(g, h, n, pos, cost)
            if merged is not None:
                g = merged
        cost[n] = _cost(n, g.mset, cost)
        d = _opdef(n)
        if d is not None and d.outputs > 1:  # its getitems belong to its group
            for u in n.users:
                if _multi_source(u) is n:
                    g.members.append(u)
                    g.mset.add(u)
                    cost[u] = cost[n]
        for m in g.members:
            group_of[m] = g
    groups = list({id(g): g for g in group_of.values()}.values())
    groups = _fold_generators(groups, group_of, pos)
    out = [sorted(g.members, key=lambda m: pos[m]) for g in groups]
    out.sort(key=lambda ms: pos[ms[-1]])
    log.debug("partition: %d fusible nodes in %d groups", len(order), len(out))
    return out


def _cost(n: torch.fx.Node, members: set[torch.fx.Node],
          cost: dict[torch.fx.Node, tuple[int, int]]) -> tuple[int, int]:
    """(IR tree size, fx depth) of n's expression when `members` are fused with it."""
    d = _opdef(n)
    w = d.weight if d is not None else 1
    size, depth = 4, 1
    for x in _operand_nodes(n):
        if x in members and x in cost:
            size += cost[x][0]
            depth = max(depth, cost[x][1] + 1)
        else:
            size += 6
    return size * w, depth


def _try_union(g: _Group, h: _Group, n: torch.fx.Node, pos: dict[torch.fx.Node, int],
               cost: dict[torch.fx.Node, tuple[int, int]]) -> _Group | None:
    """g (holding n, the newest node) united with h, or None when that breaks a rule."""
    space = _combine(g.space, h.space)
    if space is None:
        return None
    members = g.mset | h.mset
    scans = [m for m in members if _multi_source(m) is None and node_space(m).scan is not None]
    if len(scans) > 1:
        return None
    p = pos[n]
    for m in members:
        if m is not n and any(u not in members and pos[u] < p for u in m.users):
            return None  # an outside node between m and n uses m: the group could not run
        x = _data_operand(m)
        if x is not None and x in members:
            return None
    if space.reduce and shape_of(n) == space.full:
        for x in _operand_nodes(n):  # values read by a full-shaped node must not move
            if x in members and not _broadcast_ok(shape_of(x), space):  # with reduce dims
                return None
    size, depth = _cost(n, members, cost)
    if size > MAX_TREE or depth > MAX_DEPTH:
        return None
    merged = _Group(sorted(members, key=lambda m: pos[m]), space)
    return merged


def _broadcast_ok(shape: tuple[int, ...], space: Space) -> bool:
    """Whether a value of `shape`, read broadcast by a full-shaped node, avoids reduce dims
    (or is itself full-shaped)."""
    if shape == space.full:
        return True
    lead = len(space.full) - len(shape)
    if lead < 0:
        return False
    return all(s == 1 or (lead + j) not in space.rdims for j, s in enumerate(shape))


def _is_generator_group(g: _Group) -> bool:
    if g.space.structural:
        return False
    for m in g.members:
        d = _opdef(m)
        if d is None or d.kind not in ("generator", "pointwise"):
            return False
        # generators read only the shapes of their operands (full_like, empty_like)
        if d.kind == "pointwise" and any(x not in g.mset for x in _operand_nodes(m)):
            return False
    return True


def _fold_generators(groups: list[_Group], group_of: dict[torch.fx.Node, _Group],
                     pos: dict[torch.fx.Node, int]) -> list[_Group]:
    """Fold input-free groups into the one group that uses them (they are recomputed at
    the broadcast coordinates there instead of being stored and loaded)."""
    alive = list(groups)
    for g in groups:
        if not _is_generator_group(g):
            continue
        users = {u for m in g.members for u in m.users if u not in g.mset}
        targets = {id(group_of.get(u)): group_of.get(u) for u in users}
        if len(targets) != 1:
            continue
        h = next(iter(targets.values()))
        if h is None or h is g:
            continue
        h.members = sorted(h.members + g.members, key=lambda m: pos[m])
        h.mset |= g.mset
        for m in g.members:
            group_of[m] = h
        alive = [x for x in alive if x is not g]
    return alive
