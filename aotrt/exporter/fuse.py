"""Fusion: which core-ATen nodes become generated kernels, and how they group.

- `fusible(node)`: the node can be kernel code (pointwise math, casts, generators, indirect
  loads, reductions, softmax, norms, cumsum; see `optable.OPS`, filled by pointwise.py and
  reductions.py).
- `partition(nodes)`: groups of fusible nodes, each one kernel with one iteration space
  (`Space`, optable.py); codegen.py builds each group's kernel IR.
- `group_io(group)`: the nodes a group reads and the members used outside it.

Multi-output nodes (native_layer_norm, var_mean, max.dim, batch norm) are selected by
getitem nodes; those getitems are fusible, belong to their source's group and are what a
group's outputs name.
"""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch

# Importing the table's two halves registers their entries into optable.OPS.
from aotrt.exporter import pointwise, reductions  # noqa: F401
from aotrt.exporter.nodes import TORCH_DTYPES, node_args
from aotrt.exporter.optable import OPS, OpDef, Space, shape_of

log = logging.getLogger(__name__)

#: fusion stops growing an expression past this many IR nodes (counted as a tree: the
#: serialized IR is a tree) or this many chained fx nodes (the IR and its renderer recurse)
MAX_TREE = 4000
MAX_DEPTH = 64


# ---------------------------------------------------------------------------------------------
# fusible


def opdef_of(node: torch.fx.Node) -> OpDef | None:
    """The kernel-table entry of a call_function node, or None."""
    if node.op != "call_function":
        return None
    return OPS.get(node.target)


def multi_source(node: torch.fx.Node) -> torch.fx.Node | None:
    """The multi-output fusible node a getitem selects from, else None."""
    if node.op != "call_function" or node.target is not operator.getitem:
        return None
    src = node.args[0]
    if isinstance(src, torch.fx.Node):
        d = opdef_of(src)
        if d is not None and d.outputs > 1:
            return src
    return None


def _tensor_vals(node: torch.fx.Node) -> list[Any]:
    v = node.meta.get("val")
    return list(v) if isinstance(v, (tuple, list)) else [v]


def why_not(node: torch.fx.Node) -> str | None:
    """None when `node` is fusible, else the reason it is not."""
    src = multi_source(node)
    if src is not None:
        return why_not(src)
    d = opdef_of(node)
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


_DTYPES = frozenset(TORCH_DTYPES)


def reads_values(node: torch.fx.Node) -> bool:
    """False for generators (full_like, empty_like, ...): they read only their operands'
    shapes, never their values."""
    d = opdef_of(node)
    return d is None or d.kind != "generator"


def fusible(node: torch.fx.Node) -> bool:
    """True for call_function nodes that generated kernels implement (see optable.OPS),
    and for getitem nodes selecting a result of a fusible multi-output node."""
    return why_not(node) is None


# ---------------------------------------------------------------------------------------------
# spaces


def node_space(node: torch.fx.Node) -> Space:
    """The iteration space a node needs: its own for reductions, scans and softmax/norms;
    the pointwise space of its output shape otherwise."""
    src = multi_source(node)
    if src is not None:
        return node_space(src)
    d = opdef_of(node)
    if d is not None and d.space is not None:
        return d.space(node)
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
        d = opdef_of(n)
        reads = n.all_input_nodes if reads_values(n) else []
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
        d = opdef_of(n)
        if d is not None and d.outputs > 1:
            members.update(u for u in n.users if multi_source(u) is n)
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
    d = opdef_of(node)
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
        d = opdef_of(n)
        if d is not None and d.outputs > 1:  # its getitems belong to its group
            for u in n.users:
                if multi_source(u) is n:
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
    d = opdef_of(n)
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
    scans = [m for m in members if multi_source(m) is None and node_space(m).scan is not None]
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
        d = opdef_of(m)
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
