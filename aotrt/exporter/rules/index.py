"""index_put: out = base with out[indices] = values, as one generated scatter kernel over
the indexed region, in place when base is dead afterwards (else into a copy).

With accumulate=True (out[indices] += values; F.fold decomposes to it) duplicate indices
would make a scatter race, so the indices must be constants: the export inverts them into a
table of the value positions each touched element sums, and one gather kernel adds those in
a fixed order (deterministic, one writer per element).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.fx

from aotrt.exporter.nodes import arg, describe, meta_val, tensor_meta, to_numpy, unsupported
from aotrt.exporter.optable import wrap_index
from aotrt.exporter.rules.cat_scatter import can_mutate, dest
from aotrt.exporter.rules.fold import add_constant
from aotrt.exporter.rules.registry import rule
from aotrt.exporter.tview import TView
from aotrt.kernels import ir

if TYPE_CHECKING:  # the driver imports the rules
    from aotrt.exporter.lower import Lowering

Node = torch.fx.Node


#: a gather table may hold this many entries per value summed (duplicate counts so uneven
#: that the table would outgrow the values many times over are refused)
TABLE_GROWTH = 8


def _check_index_put(node: torch.fx.Node) -> None:
    """Refuse index_put forms the scatter kernel does not implement."""
    base = tensor_meta(node.args[0])
    if bool(arg(node, 3, "accumulate", False)):
        indices = [i for i in node.args[1] if i is not None]
        if base.dtype == torch.bool or any(meta_val(i).dtype not in (torch.int64, torch.int32)
                                           for i in indices):
            raise unsupported(node, "index_put with accumulate=True supports integer indices "
                                    "into a numeric tensor")
        return      # the lowering wants them constant (`_lower_accumulate`)
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


def _region(nd: int, indexed: list[int], nb: int) -> tuple[list[int], dict[int, int]]:
    """(the region dims of the broadcast index shape, region dim of each non-indexed dim):
    consecutive indexed dims keep their place, others move to the front (PyTorch's rule)."""
    rest = [d for d in range(nd) if d not in indexed]
    if indexed == list(range(indexed[0], indexed[-1] + 1)):
        before = [d for d in rest if d < indexed[0]]
        dim_of = {d: i for i, d in enumerate(before)}
        dim_of.update({d: nb + i for i, d in enumerate(rest) if d > indexed[-1]})
        return list(range(len(before), len(before) + nb)), dim_of
    return list(range(nb)), {d: nb + i for i, d in enumerate(rest)}


def index_put_kernel(name: str, out: TView, idx: list[TView | None], vals: TView
                     ) -> tuple[ir.Kernel | None, list[TView]]:
    """A kernel writing `vals` into `out` at advanced indices (PyTorch semantics: broadcast
    index tensors; consecutive indexed dims keep their place, others move to the front).
    Indices are checked (out of range: the run's error), wrapped (negative) and clamped, so
    no file can index out of bounds."""
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
    bdims, dim_of = _region(nd, indexed, nb)
    region = [0] * (nb + len(rest))
    for j, b in enumerate(bdims):
        region[b] = bshape[j]
    for d in rest:
        region[dim_of[d]] = out.sizes[d]
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
        coord[d] = wrap_index(ir.load(i_arg, strides, t.dtype, dims), out.sizes[d])
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


def gather_table(sizes: tuple[int, ...], idx: list[np.ndarray | None], bdims: list[int],
                 v_strides: list[int], out_strides: tuple[int, ...]
                 ) -> tuple[np.ndarray, np.ndarray] | str:
    """The inverse of constant accumulate indices: (element offset in the output of each
    touched position of the indexed dims [U], offsets in the values of the positions each
    one sums, in index order, -1 padded [U, M]); or why there is none (a str).

    `idx` holds each dim's index array broadcast to the index shape (None: not indexed),
    `bdims` the region dims of the index shape, `v_strides` the values' strides over the
    region."""
    indexed = [d for d, t in enumerate(idx) if t is not None]
    bshape = idx[indexed[0]].shape
    coords = []
    for d in indexed:
        c = idx[d].reshape(-1).astype(np.int64)
        c = np.where(c < 0, c + sizes[d], c)
        if c.size and (c.min() < 0 or c.max() >= sizes[d]):
            return f"an index of dim {d} is out of range for size {sizes[d]}"
        coords.append(c)
    flat = np.ravel_multi_index(coords, [sizes[d] for d in indexed])
    # value offset of each index position: its coordinates over the region's index dims
    pos = np.indices(bshape).reshape(len(bshape), -1) if bshape else np.zeros((0, 1), np.int64)
    voff = sum((pos[j] * v_strides[b] for j, b in enumerate(bdims)), np.zeros(flat.size,
                                                                               np.int64))
    order = np.argsort(flat, kind="stable")          # index order within each target
    targets, first, counts = np.unique(flat[order], return_index=True, return_counts=True)
    m = int(counts.max())
    if targets.size * m > TABLE_GROWTH * flat.size + 4096:
        return (f"{m} duplicates of one index against {flat.size / targets.size:.1f} on "
                f"average (the gather table would be too big)")
    table = np.full((targets.size, m), -1, np.int64)
    slot = np.arange(flat.size) - np.repeat(first, counts)
    table[np.repeat(np.arange(targets.size), counts), slot] = voff[order]
    touched = np.unravel_index(targets, [sizes[d] for d in indexed])
    toff = sum((t * out_strides[d] for t, d in zip(touched, indexed)),
               np.zeros(targets.size, np.int64))
    return toff.astype(np.int64), table


def accumulate_kernel(name: str, out: TView, toff: TView, table: TView, vals: TView,
                      rest: list[int], v_rest: list[int], bounds: tuple[int, int]) -> ir.Kernel:
    """out[t] += sum of vals at table[t] (in the table's order) for each touched output
    position t, over every coordinate of the non-indexed dims `rest` (the values' strides
    over those: `v_rest`). Arguments: toff, table, vals, out. `bounds`: the largest offset
    in toff and in table, to which loaded offsets are clamped (the bounds proof needs it)."""
    nr = len(rest)
    u, m = table.sizes
    i64 = "int64"

    def clamp(e: ir.Expr, hi: int) -> ir.Expr:
        return ir.Op("minimum", (ir.Op("maximum", (e, ir.Const(0, i64)), i64),
                                 ir.Const(hi, i64)), i64)

    def plus(a: ir.Expr, b: ir.Expr) -> ir.Expr:
        return b if isinstance(a, ir.Const) and a.value == 0 else ir.Op("add", (a, b), i64)

    o_rest = ir.strided_index([out.strides[d] for d in rest], range(nr))
    o_idx = plus(o_rest, clamp(ir.Load(0, ir.Idx(nr), i64), bounds[0]))
    slot = ir.Load(1, ir.strided_index(table.strides, (nr, nr + 1)), i64)
    v_idx = plus(ir.strided_index(v_rest, range(nr)), clamp(slot, bounds[1]))
    acc_dt = "float32" if out.dtype in ir.FLOAT_DTYPES else i64
    v = ir.cast(ir.Load(2, v_idx, vals.dtype), acc_dt)
    term = ir.Op("where", (ir.Op("ge", (slot, ir.Const(0, i64)), "bool"), v,
                           ir.Const(0.0 if acc_dt == "float32" else 0, acc_dt)), acc_dt)
    old = ir.cast(ir.Load(3, o_idx, out.dtype), acc_dt)
    value = ir.cast(ir.Op("add", (old, ir.Reduce("sum", term, acc_dt)), acc_dt), out.dtype)
    shape = tuple(out.sizes[d] for d in rest) + (u,)
    return ir.Kernel(name, shape, (m,), (ir.Arg(i64, "r"), ir.Arg(i64, "r"),
                                         ir.Arg(vals.dtype, "r"), ir.Arg(out.dtype, "rw")),
                     (ir.Store(3, o_idx, value),))


def _lower_accumulate(lw: Lowering, node: Node, result: TView, indices: list,
                      vals: TView) -> None:
    """out[indices] += vals with constant indices, as one gather kernel."""
    nd = len(result.sizes)
    indices = indices + [None] * (nd - len(indices))
    indexed = [d for d in range(nd) if indices[d] is not None]
    if not all(lw.is_const(indices[d]) for d in indexed):
        raise unsupported(node, "index_put with accumulate=True needs constant indices "
                                "(duplicate indices computed at run time would race)")
    arrays = [None if i is None else to_numpy(lw.const_values[i]) for i in indices]
    bshape = np.broadcast_shapes(*[arrays[d].shape for d in indexed])
    arrays = [None if a is None else np.broadcast_to(a, bshape) for a in arrays]
    if math.prod(bshape) == 0 or result.numel == 0:
        return
    bdims, dim_of = _region(nd, indexed, len(bshape))
    nregion = len(bshape) + nd - len(indexed)
    pad = nregion - len(vals.sizes)
    v_strides = [0] * pad + [s if n != 1 else 0 for n, s in zip(vals.sizes, vals.strides)]
    got = gather_table(result.sizes, arrays, bdims, v_strides, result.strides)
    if isinstance(got, str):
        raise unsupported(node, f"index_put with accumulate=True: {got}")
    toff, table = got
    rest = [d for d in range(nd) if indices[d] is None]
    # The tables' tensors live in the node's meta: constants are keyed by id() while lowering.
    tensors = (torch.from_numpy(toff), torch.from_numpy(table))
    node.meta["aotrt_gather_tables"] = tensors
    t_tv, g_tv = (add_constant(lw, f"{node.name}_{what}", t, node)
                  for what, t in zip(("targets", "sources"), tensors))
    k = accumulate_kernel(lw.kname("index_put_acc"), result, t_tv, g_tv, vals, rest,
                          [v_strides[dim_of[d]] for d in rest],
                          (int(toff.max()), max(int(table.max()), 0)))
    lw.emit_kernel(k, [t_tv, g_tv, vals, result], describe(node))


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
    if d is None and can_mutate(lw, base_tv.buf, lw.pos[node]):
        result = base_tv
    else:
        result = d if d is not None else lw.fresh(node)
        lw.emit_copy(result, base_tv, describe(node))
    vals_tv = lw.tv(values)
    accumulate = bool(arg(node, 3, "accumulate", False))
    # Accumulate's constant indices become gather tables, never views of their own.
    idx_tvs = [None if i is None or accumulate else lw.tv(i) for i in indices]
    # A values/index view sharing bytes with the result is read through a copy, so the
    # scatter never reads what it already wrote.
    lo, hi = result.span()

    def detached(tv: TView) -> TView:
        a, b = tv.span()
        if tv.buf is result.buf and a < hi and lo < b:
            return lw.materialize(node, tv)
        return tv
    vals_tv = detached(vals_tv)
    if accumulate:
        _lower_accumulate(lw, node, result, indices, vals_tv)
        lw.bind(node, result)
        return
    idx_tvs = [None if t is None else detached(t) for t in idx_tvs]
    kernel, args = index_put_kernel(lw.kname("index_put"), result, idx_tvs, vals_tv)
    if kernel is not None:
        lw.emit_kernel(kernel, args, describe(node))
    lw.bind(node, result)
