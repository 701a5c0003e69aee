"""index_put: out = base with out[indices] = values, as one generated scatter kernel over
the indexed region, in place when base is dead afterwards (else into a copy)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.fx

from aotrt.exporter.nodes import arg, describe, meta_val, tensor_meta, unsupported
from aotrt.exporter.rules.cat_scatter import can_mutate, dest
from aotrt.exporter.rules.registry import rule
from aotrt.exporter.tview import TView
from aotrt.kernels import ir

if TYPE_CHECKING:  # the driver imports the rules
    from aotrt.exporter.lower import Lowering

Node = torch.fx.Node


def _check_index_put(node: torch.fx.Node) -> None:
    """Refuse index_put forms the scatter kernel does not implement."""
    if bool(arg(node, 3, "accumulate", False)):
        raise unsupported(node, "index_put with accumulate=True (duplicate indices race)")
    base = tensor_meta(node.args[0])
    indices = list(node.args[1])
    masks = [i for i in indices if i is not None and meta_val(i).dtype == torch.bool]
    if masks:
        if len(indices) != 1 or meta_val(node.args[2]).numel() != 1:
            raise unsupported(node, "boolean-mask index_put needs one mask and one value")
        if tuple(meta_val(indices[0]).shape) != tuple(base.shape[:meta_val(indices[0]).dim()]):
            raise unsupported(node, "the mask must match the leading dims")
        return
    for i in indices:
        if i is not None and meta_val(i).dtype not in (torch.int64, torch.int32):
            raise unsupported(node, f"index dtype {meta_val(i).dtype}")


def index_put_kernel(name: str, out: TView, idx: list[TView | None], vals: TView
                     ) -> tuple[ir.Kernel | None, list[TView]]:
    """A kernel writing `vals` into `out` at advanced indices (PyTorch semantics: broadcast
    index tensors; consecutive indexed dims keep their place, others move to the front).
    Indices are wrapped (negative) and clamped, so no file can index out of bounds."""
    nd = len(out.sizes)
    idx = idx + [None] * (nd - len(idx))
    if any(t is not None and t.dtype == "bool" for t in idx):
        mask = next(t for t in idx if t is not None)
        shape = out.sizes
        args = [mask, vals, out]
        mdims = list(range(len(mask.sizes)))
        cond = ir.Op("ne", (ir.load(0, mask.strides, "bool", mdims), ir.Const(False, "bool")),
                     "bool")
        v = ir.cast(ir.Load(1, ir.Const(0, "int64"), vals.dtype), out.dtype)
        old = ir.load(2, out.strides, out.dtype)
        value = ir.Op("where", (cond, v, old), out.dtype)
        k = ir.Kernel(name, shape, (), (ir.Arg("bool", "r"), ir.Arg(vals.dtype, "r"),
                                        ir.Arg(out.dtype, "rw")),
                      (ir.store(2, out.strides, value),))
        return (k if math.prod(shape) else None), args
    indexed = [d for d in range(nd) if idx[d] is not None]
    bshape = tuple(torch.broadcast_shapes(*[tuple(idx[d].sizes) for d in indexed]))
    nb = len(bshape)
    rest = [d for d in range(nd) if idx[d] is None]
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
    if adjacent:
        before = [d for d in rest if d < indexed[0]]
        after = [d for d in rest if d > indexed[-1]]
        region = [out.sizes[d] for d in before] + list(bshape) + [out.sizes[d] for d in after]
        bdims = list(range(len(before), len(before) + nb))
        dim_of = {d: i for i, d in enumerate(before)}
        dim_of.update({d: len(before) + nb + i for i, d in enumerate(after)})
    else:
        region = list(bshape) + [out.sizes[d] for d in rest]
        bdims = list(range(nb))
        dim_of = {d: nb + i for i, d in enumerate(rest)}
    shape = tuple(region)
    if math.prod(shape) == 0:
        return None, []
    args: list[TView] = []
    ir_args: list[ir.Arg] = []
    coord: dict[int, ir.Expr] = {}
    for d in indexed:
        t = idx[d]
        pad = nb - len(t.sizes)
        dims = [bdims[pad + j] for j in range(len(t.sizes))]
        strides = [s if n != 1 else 0 for n, s in zip(t.sizes, t.strides)]
        i_arg = len(args)
        args.append(t)
        ir_args.append(ir.Arg(t.dtype, "r"))
        raw = ir.cast(ir.load(i_arg, strides, t.dtype, dims), "int64")
        n = ir.Const(out.sizes[d], "int64")
        wrapped = ir.Op("where", (ir.Op("lt", (raw, ir.Const(0, "int64")), "bool"),
                                  ir.Op("add", (raw, n), "int64"), raw), "int64")
        clamped = ir.Op("minimum", (ir.Op("maximum", (wrapped, ir.Const(0, "int64")), "int64"),
                                    ir.Const(out.sizes[d] - 1, "int64")), "int64")
        coord[d] = clamped
    for d in rest:
        coord[d] = ir.Idx(dim_of[d])
    # values broadcast to the region's shape
    pad = len(shape) - len(vals.sizes)
    v_strides = [s if n != 1 else 0 for n, s in zip(vals.sizes, vals.strides)]
    v_arg = len(args)
    args.append(vals)
    ir_args.append(ir.Arg(vals.dtype, "r"))
    value = ir.cast(ir.load(v_arg, v_strides, vals.dtype, list(range(pad, len(shape)))),
                    out.dtype)
    terms: list[ir.Expr] = []
    for d in range(nd):
        if out.sizes[d] == 1 or out.strides[d] == 0:
            continue
        c = coord[d]
        terms.append(c if out.strides[d] == 1 else
                     ir.Op("mul", (c, ir.Const(out.strides[d], "int64")), "int64"))
    index: ir.Expr = terms[0] if terms else ir.Const(0, "int64")
    for t in terms[1:]:
        index = ir.Op("add", (index, t), "int64")
    o_arg = len(args)
    args.append(out)
    ir_args.append(ir.Arg(out.dtype, "w"))
    k = ir.Kernel(name, shape, (), tuple(ir_args), (ir.Store(o_arg, index, value),))
    return k, args


def _writes_over(lw: Lowering, node: Node, region: TView) -> bool:
    """Its base is copied into the region first (nothing when it is the region), and
    overlapping values/indices are read through copies (`_lower_index_put`)."""
    base = lw.env.get(node.args[0])
    return isinstance(base, TView) and (base == region or base.buf is not region.buf)


@rule("aten.index_put.default", check=_check_index_put, writes_over=_writes_over)
def _lower_index_put(lw: Lowering, node: Node) -> None:
    """out = base with out[indices] = values: in place when base is dead afterwards,
    else into a copy; then one generated scatter kernel over the indexed region."""
    base, indices, values = node.args[0], list(node.args[1]), node.args[2]
    base_tv = lw.tv(base)
    d = dest(lw, node)          # y[1:3, i] = v: the slice_scatter's region of y
    if d is None and base_tv.buf.kind == "arena" and can_mutate(lw, base_tv.buf, lw.pos[node]):
        result = base_tv
    else:
        result = d if d is not None else lw.fresh(node)
        lw.emit_copy(result, base_tv, describe(node))
    vals_tv = lw.tv(values)
    idx_tvs = [None if i is None else lw.tv(i) for i in indices]
    # A values/index view sharing bytes with the result is read through a copy, so the
    # scatter never reads what it already wrote.
    lo, hi = result.span()

    def detached(tv: TView) -> TView:
        a, b = tv.span()
        if tv.buf is result.buf and a < hi and lo < b:
            return lw.materialize(node, tv)
        return tv
    vals_tv = detached(vals_tv)
    idx_tvs = [None if t is None else detached(t) for t in idx_tvs]
    kernel, args = index_put_kernel(lw.kname("index_put"), result, idx_tvs, vals_tv)
    if kernel is not None:
        lw.emit_kernel(kernel, args, describe(node))
    lw.bind(node, result)
