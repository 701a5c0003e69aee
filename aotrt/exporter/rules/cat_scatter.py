"""cat and the functional scatters, and where a producer writes its value.

- `cat` allocates its result once and has each input written through a view of it; a cat
  input that is not written in place is copied into its slot.
- slice/select/diagonal_scatter mutate their base in place when no older alias of its Buf is
  read later; otherwise they write a copy.
- Placement (`dest`): a compute node writes straight into a consumer's memory when it can:
  its slot of a `cat` result (also through a split whose pieces are consecutive cat inputs,
  and through reshape/permute views), or the region of an in-place scatter. Each consumer's
  rule says where (`Rule.slot`).
"""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING

import torch
import torch.fx

from aotrt.exporter import fuse
from aotrt.exporter.nodes import (arg, describe, is_pointwise, meta_val, target_name,
                                  tensor_meta)
from aotrt.exporter.rules.registry import rule, rule_of
from aotrt.exporter.tview import (Buf, TView, diagonal_view, narrow_view, select_view,
                                  slice_view, wrap_dim)

if TYPE_CHECKING:  # the driver imports the rules
    from aotrt.exporter.lower import Lowering

Node = torch.fx.Node
CAT = "aten.cat.default"
SPLITS = ("aten.split_with_sizes.default", "aten.split.Tensor")


# -- placement ----------------------------------------------------------------------------------


def dest(lw: Lowering, node: Node) -> TView | None:
    """The consumer's memory `node`'s value is written into, or None (a fresh Buf)."""
    if node in lw.dest_memo:
        return lw.dest_memo[node]
    d = None if lw.is_const(node) else consumer_slot(lw, node, via_view=False)
    lw.dest_memo[node] = d
    return d


def consumer_slot(lw: Lowering, node: Node, via_view: bool) -> TView | None:
    """The view of a consumer's memory that `node`'s value can live in, or None: the first
    user whose rule gives a slot (other readers of the value read it there)."""
    for u in list(node.users):
        if u.op != "call_function" or lw.is_const(u):
            continue
        r = rule_of(u)
        if r is not None and r.slot is not None:
            slot = r.slot(lw, u, node, via_view)
            if slot is not None:
                return slot
    return None


def result_view(lw: Lowering, node: Node) -> TView:
    """The memory of a cat's result (allocated once; may itself be a slot of another cat)."""
    if node not in lw.result_memo:
        lw.result_memo[node] = lw.out_view(node)
    return lw.result_memo[node]


def _cat_dim(cat: Node) -> int:
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    return wrap_dim(int(dim), tensor_meta(cat).dim())


def _cat_len(a: object, dim: int) -> int:
    v = meta_val(a)
    if v.dim() == 1 and v.shape[0] == 0:   # legacy empty inputs are skipped
        return 0
    return int(v.shape[dim])


def _cat_range(lw: Lowering, cat: Node, first: int, node: Node) -> TView | None:
    """The slot of `node`'s value in `cat`'s result, starting at input `first`."""
    val = tensor_meta(node)
    if val.dtype != tensor_meta(cat).dtype or val.dim() == 0:
        return None
    dim = _cat_dim(cat)
    start = sum(_cat_len(a, dim) for a in list(cat.args[0])[:first])
    slot = narrow_view(result_view(lw, cat), dim, start, int(val.shape[dim]))
    if slot.sizes != tuple(val.shape):
        return None
    return slot


def _cat_slot(lw: Lowering, cat: Node, node: Node, via_view: bool) -> TView | None:
    inputs = list(cat.args[0])
    if inputs.count(node) != 1:
        return None
    return _cat_range(lw, cat, inputs.index(node), node)


def split_slot(lw: Lowering, split: Node, node: Node, via_view: bool) -> TView | None:
    """A split whose pieces are consecutive inputs of one cat (C2f): `node`'s value lives in
    the slots of all the pieces (they become views of the cat's result)."""
    vals = split.meta.get("val")
    if not isinstance(vals, (list, tuple)) or not vals:
        return None
    pieces: list[Node | None] = [None] * len(vals)
    for g in split.users:
        if g.target is not operator.getitem or pieces[g.args[1]] is not None:
            return None
        pieces[g.args[1]] = g
    if any(p is None for p in pieces):
        return None
    cats = {u for p in pieces for u in p.users if target_name(u.target) == CAT}
    if len(cats) != 1:
        return None
    cat = cats.pop()
    inputs = list(cat.args[0])
    if any(inputs.count(p) != 1 for p in pieces):
        return None
    first = inputs.index(pieces[0])
    if [inputs.index(p) for p in pieces] != list(range(first, first + len(pieces))):
        return None
    nd = tensor_meta(node).dim()
    sdim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
    if nd == 0 or wrap_dim(int(sdim), nd) != _cat_dim(cat):
        return None
    return _cat_range(lw, cat, first, node)


#: the Buf kinds a lowering may overwrite once their old value is dead
WRITABLE = ("arena", "state")


def can_mutate(lw: Lowering, buf: Buf, at: float, after: float | None = None) -> bool:
    """True when no old alias of `buf` is read after position `at` (or, with `after`,
    between `after` and `at`, exclusive)."""
    # State is written in place too: its new value is what the method leaves there.
    if buf.kind not in WRITABLE:
        return False
    for alias in lw.aliases.get(buf, []):
        for u in alias.users:
            p = lw.pos.get(u, math.inf) if u.op != "output" else math.inf
            if after is None:
                if p > at:
                    return False
            elif after < p < at or p > at:
                return False
    return True


def _scatter_slot(lw: Lowering, sc: Node, node: Node, via_view: bool) -> TView | None:
    """`node` is the source of in-place scatter `sc`, its one user: the region it fills."""
    if via_view or len(node.users) != 1:
        return None
    base, src = sc.args[0], sc.args[1]
    if src is not node or base is node or target_name(node.target) == CAT:
        return None
    if base not in lw.env or not isinstance(lw.env[base], TView):
        return None
    base_tv = lw.env[base]
    # A getitem's value is written by its source's unit.
    writer = node.args[0] if node.target is operator.getitem and \
        node.args[0] not in lw.unit_of.get(node, ()) else node
    if base_tv.buf.kind not in WRITABLE or not can_mutate(lw, base_tv.buf, lw.pos[sc],
                                                     after=lw.pos[writer]):
        return None
    region = _scatter_region(sc, base_tv)
    if region.sizes != tuple(tensor_meta(node).shape):
        return None
    if not unit_may_write(lw, writer, region):
        return None
    lw.forced_in_place.add(sc)
    return region


def unit_may_write(lw: Lowering, node: Node, region: TView) -> bool:
    """Can `node`'s unit write `region` while reading its inputs from the same Buf?"""
    unit = lw.unit_of[node]
    r = rule_of(node)
    if len(unit) == 1 and r is not None and r.writes_over is not None:
        return r.writes_over(lw, node, region)
    unit_set = set(unit)
    pointwise = all(is_pointwise(n) and isinstance(n.meta.get("val"), torch.Tensor) and
                    tuple(n.meta["val"].shape) == region.sizes for n in unit)
    lo, hi = region.span()
    for n in unit:
        if not fuse.reads_values(n):
            continue     # reads only the shape of its input
        for d in n.all_input_nodes:
            if d in unit_set or d not in lw.env:
                continue
            v = lw.env[d]
            for t in (v if isinstance(v, list) else [v]):
                if not isinstance(t, TView) or t.buf is not region.buf:
                    continue
                if t == region and pointwise:
                    continue
                a, b = t.span()
                if a < hi and lo < b:
                    return False
    return True


# -- cat ----------------------------------------------------------------------------------------


@rule(CAT, slot=_cat_slot)
def _lower_cat(lw: Lowering, node: Node) -> None:
    result = result_view(lw, node)
    dim = _cat_dim(node)
    start = 0
    for a in node.args[0]:
        n = _cat_len(a, dim)
        if n == 0 and meta_val(a).dim() == 1:
            continue
        slot = narrow_view(result, dim, start, n)
        start += n
        src = lw.tv(a)
        if src != slot:
            lw.emit_copy(slot, src, describe(node))
    lw.bind(node, result)


# -- scatters -----------------------------------------------------------------------------------


def _scatter_region(sc: Node, base_tv: TView) -> TView:
    """The view of `base_tv` that a scatter op writes its source into."""
    name = target_name(sc.target)
    if name == "aten.select_scatter.default":
        return select_view(base_tv, int(arg(sc, 2, "dim")), int(arg(sc, 3, "index")))
    if name == "aten.diagonal_scatter.default":
        return diagonal_view(base_tv, int(arg(sc, 2, "offset", 0)),
                             int(arg(sc, 3, "dim1", 0)), int(arg(sc, 4, "dim2", 1)))
    step = arg(sc, 5, "step", 1)
    return slice_view(base_tv, int(arg(sc, 2, "dim", 0) or 0), arg(sc, 3, "start", None),
                      arg(sc, 4, "end", None), 1 if step is None else int(step))


def _in_place(lw: Lowering, sc: Node) -> bool:
    if sc in lw.forced_in_place:
        return True
    base = sc.args[0]
    if base not in lw.env:
        return False
    return can_mutate(lw, lw.tv(base).buf, lw.pos[sc])


@rule("aten.slice_scatter.default", "aten.select_scatter.default",
      "aten.diagonal_scatter.default", slot=_scatter_slot)
def _lower_scatter(lw: Lowering, node: Node) -> None:
    base, src = node.args[0], node.args[1]
    base_tv = lw.tv(base)
    if _in_place(lw, node):
        result = base_tv
    else:
        result = lw.out_view(node)
        lw.emit_copy(result, base_tv, describe(node))
    region = _scatter_region(node, result)
    lw.emit_copy(region, lw.tv(src), describe(node))
    lw.bind(node, result)
