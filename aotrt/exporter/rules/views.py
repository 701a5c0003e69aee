"""View rules: view ops make new TViews of their base's Buf, computed from the base's real
layout (never copies; a view of a view is one view of the root). A reshape that no layout
allows reads a row-major copy. Also: getitem, and clone/copy that alias their source.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
import torch.fx

from aotrt.exporter import fuse
from aotrt.exporter.nodes import (arg, describe, meta_val, static_ints, target_name,
                                  tensor_meta, unsupported)
from aotrt.exporter.rules.cat_scatter import consumer_slot, split_slot
from aotrt.exporter.rules.registry import rule, rule_of
from aotrt.exporter.tview import (TView, diagonal_view, is_injective, narrow_view, select_view,
                                  slice_view, view_strides, wrap_dim)

if TYPE_CHECKING:  # the driver imports the rules
    from aotrt.exporter.lower import Lowering

Node = torch.fx.Node


def view_of(node: Node, base: TView) -> TView | None:
    """The view a single-result view op makes of `base`, or None when it cannot be one."""
    static_ints(tensor_meta(node).shape, node)
    return rule_of(node).view(node, base)


def multi_view(node: Node, base: TView) -> list[TView]:
    """The views a multi-result view op (split, unbind) makes of `base`."""
    return rule_of(node).views(node, base)


def _lower_view(lw: Lowering, node: Node) -> None:
    base = lw.tv(node.args[0])
    tv = view_of(node, base)
    if tv is None:
        base = lw.materialize(node.args[0], base)
        tv = view_of(node, base)
        if tv is None:
            raise unsupported(node, "cannot express this view")
    lw.bind(node, tv)


def _lower_views(lw: Lowering, node: Node) -> None:
    lw.bind(node, multi_view(node, lw.tv(node.args[0])))


#: inverse(view, source sizes, target): a layout of the view's source that the view maps
#: onto `target` (checked by `_inverse_slot`), or None
InverseFn = Callable[[Node, tuple[int, ...], TView], "TView | None"]
ViewFn = Callable[[Node, TView], "TView | None"]


def _inverse_slot(inverse: InverseFn) -> Callable[..., "TView | None"]:
    """The slot hook of an invertible view: a reshape/permute-like view, the one user of
    `node`, leading on to a consumer's slot (Detect's `xi.view(b, no, -1)` into a cat)
    places `node`'s value at the layout the view maps onto that slot."""
    def slot(lw: Lowering, view: Node, node: Node, via_view: bool) -> TView | None:
        if len(node.users) != 1:
            return None
        target = consumer_slot(lw, view, via_view=True)
        if target is None:
            return None
        cand = inverse(view, static_ints(tensor_meta(view.args[0]).shape, view), target)
        if cand is None or not is_injective(cand.sizes, cand.strides) or \
                view_of(view, cand) != target:
            return None
        return cand
    return slot


def _view_rule(*names: str, inverse: InverseFn | None = None) -> Callable[[ViewFn], ViewFn]:
    """Register a view function as the rule of `names`, lowered by `_lower_view`; with
    `inverse`, a producer's layout can be chosen through the view (`_inverse_slot`)."""
    def deco(fn: ViewFn) -> ViewFn:
        slot = None if inverse is None else _inverse_slot(inverse)
        rule(*names, view=fn, slot=slot)(_lower_view)
        return fn
    return deco


def _same(view: Node, sizes: tuple[int, ...], target: TView) -> TView | None:
    return target


def _restrided(view: Node, sizes: tuple[int, ...], target: TView) -> TView | None:
    st = view_strides(target.sizes, target.strides, sizes)
    return None if st is None else target.with_layout(target.offset, sizes, st)


def _unpermuted(view: Node, sizes: tuple[int, ...], target: TView) -> TView | None:
    nd = len(sizes)
    if view.target == torch.ops.aten.permute.default:
        dims = [wrap_dim(d, nd) for d in view.args[1]]
    else:
        dims = list(range(nd))
        if nd >= 2:
            d0, d1 = (0, 1) if view.target == torch.ops.aten.t.default else (
                wrap_dim(view.args[1], nd), wrap_dim(view.args[2], nd))
            dims[d0], dims[d1] = dims[d1], dims[d0]
    strides = [0] * nd
    for i, d in enumerate(dims):
        strides[d] = target.strides[i]
    return target.with_layout(target.offset, sizes, strides)


# -- single-result views ----------------------------------------------------------------------


@_view_rule("aten.alias.default", "aten.detach.default", inverse=_same)
def _alias(node: Node, base: TView) -> TView | None:
    return base


@_view_rule("aten.lift_fresh_copy.default")
def _lift_fresh_copy(node: Node, base: TView) -> TView | None:
    return base


@_view_rule("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
            inverse=_restrided)
def _reshape(node: Node, base: TView) -> TView | None:
    out_sizes = static_ints(tensor_meta(node).shape, node)
    st = view_strides(base.sizes, base.strides, out_sizes)
    return None if st is None else base.with_layout(base.offset, out_sizes, st)


@_view_rule("aten.permute.default", inverse=_unpermuted)
def _permute(node: Node, base: TView) -> TView | None:
    dims = [wrap_dim(d, len(base.sizes)) for d in node.args[1]]
    return base.with_layout(base.offset, [base.sizes[d] for d in dims],
                            [base.strides[d] for d in dims])


@_view_rule("aten.t.default", "aten.transpose.int", inverse=_unpermuted)
def _transpose(node: Node, base: TView) -> TView | None:
    nd = len(base.sizes)
    if nd < 2:
        return base
    a = node.args
    d0, d1 = (0, 1) if node.target == torch.ops.aten.t.default else (wrap_dim(a[1], nd),
                                                                      wrap_dim(a[2], nd))
    sizes, strides = list(base.sizes), list(base.strides)
    sizes[d0], sizes[d1] = sizes[d1], sizes[d0]
    strides[d0], strides[d1] = strides[d1], strides[d0]
    return base.with_layout(base.offset, sizes, strides)


@_view_rule("aten.expand.default")
def _expand(node: Node, base: TView) -> TView | None:
    out_sizes = static_ints(tensor_meta(node).shape, node)
    pad = len(out_sizes) - len(base.sizes)
    strides = []
    for i, n in enumerate(out_sizes):
        if i < pad:
            strides.append(0)
        else:
            bn = base.sizes[i - pad]
            strides.append(base.strides[i - pad] if bn == n else 0)
    return base.with_layout(base.offset, out_sizes, strides)


@_view_rule("aten.unsqueeze.default", inverse=_restrided)
def _unsqueeze(node: Node, base: TView) -> TView | None:
    nd = len(base.sizes) + 1
    d = wrap_dim(node.args[1], nd)
    sizes, strides = list(base.sizes), list(base.strides)
    st = sizes[d] * strides[d] if d < len(sizes) else 1
    sizes.insert(d, 1)
    strides.insert(d, st)
    return base.with_layout(base.offset, sizes, strides)


@_view_rule("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default",
            inverse=_restrided)
def _squeeze(node: Node, base: TView) -> TView | None:
    nd = len(base.sizes)
    name = target_name(node.target)
    if name == "aten.squeeze.default":
        dims = set(range(nd))
    elif name == "aten.squeeze.dim":
        dims = {wrap_dim(node.args[1], nd)}
    else:
        dims = {wrap_dim(d, nd) for d in node.args[1]}
    keep = [i for i in range(nd) if not (i in dims and base.sizes[i] == 1)]
    return base.with_layout(base.offset, [base.sizes[i] for i in keep],
                            [base.strides[i] for i in keep])


@_view_rule("aten.slice.Tensor")
def _slice(node: Node, base: TView) -> TView | None:
    args = list(node.args) + [None] * (5 - len(node.args))
    dim = node.kwargs.get("dim", args[1] if args[1] is not None else 0)
    start = node.kwargs.get("start", args[2])
    end = node.kwargs.get("end", args[3])
    step = node.kwargs.get("step", args[4] if args[4] is not None else 1)
    return slice_view(base, int(dim), start, end, int(step))


@_view_rule("aten.narrow.default")
def _narrow(node: Node, base: TView) -> TView | None:
    a = node.args
    return narrow_view(base, int(a[1]), int(a[2]), int(a[3]))


@_view_rule("aten.select.int")
def _select(node: Node, base: TView) -> TView | None:
    return select_view(base, int(node.args[1]), int(node.args[2]))


@_view_rule("aten.diagonal.default")
def _diagonal(node: Node, base: TView) -> TView | None:
    return diagonal_view(base, int(arg(node, 1, "offset", 0)), int(arg(node, 2, "dim1", 0)),
                         int(arg(node, 3, "dim2", 1)))


@_view_rule("aten.unfold.default")
def _unfold(node: Node, base: TView) -> TView | None:
    a = node.args
    nd = len(base.sizes)
    d = wrap_dim(a[1], nd)
    size, step = int(a[2]), int(a[3])
    sizes, strides = list(base.sizes), list(base.strides)
    sizes[d] = (sizes[d] - size) // step + 1 if nd else 1
    st = strides[d] if nd else 1
    strides[d] = st * step
    sizes.append(size)
    strides.append(st)
    return base.with_layout(base.offset, sizes, strides)


@_view_rule("aten.as_strided.default")
def _as_strided(node: Node, base: TView) -> TView | None:
    a = node.args
    mb = tensor_meta(node.args[0])
    if (base.sizes != tuple(mb.shape) or base.strides != tuple(mb.stride())):
        return None
    off = a[3] if len(a) > 3 and a[3] is not None else mb.storage_offset()
    origin = base.offset - mb.storage_offset()
    if origin + off < 0:
        return None
    return base.with_layout(origin + off, static_ints(a[1], node), static_ints(a[2], node))


# -- multi-result views (picked by getitem) ---------------------------------------------------


def _unbind(node: Node, base: TView) -> list[TView]:
    a = node.args
    dim = wrap_dim(a[1] if len(a) > 1 else 0, len(base.sizes))
    return [select_view(base, dim, i) for i in range(base.sizes[dim])]


@rule("aten.unbind.int", views=_unbind)
def _lower_unbind(lw: Lowering, node: Node) -> None:
    _lower_views(lw, node)


def _split(node: Node, base: TView) -> list[TView]:
    a = node.args
    dim = wrap_dim(a[2] if len(a) > 2 else node.kwargs.get("dim", 0), len(base.sizes))
    if node.target == torch.ops.aten.split_with_sizes.default:
        sizes = [int(s) for s in a[1]]
    else:
        step = int(a[1])
        n = base.sizes[dim]
        sizes = [min(step, n - i) for i in range(0, n, step)] if step > 0 else [n]
        if not sizes:
            sizes = [0]
    out, start = [], 0
    for s in sizes:
        out.append(narrow_view(base, dim, start, s))
        start += s
    return out


@rule("aten.split_with_sizes.default", "aten.split.Tensor", views=_split, slot=split_slot)
def _lower_split(lw: Lowering, node: Node) -> None:
    _lower_views(lw, node)


def _getitem_fusible(lw: Lowering, node: Node) -> bool:
    src = node.args[0]
    return not lw.is_const(src) and lw.is_fusible(src)


@rule("getitem", fusible=_getitem_fusible)
def _lower_getitem(lw: Lowering, node: Node) -> None:
    lw.bind(node, lw.env[node.args[0]][node.args[1]])


# -- clone / copy that alias their source -----------------------------------------------------


def copy_is_alias(node: Node) -> bool:
    """A clone/copy whose result has its source's dtype, shape and layout shares its memory.

    Nothing in a functional graph writes either one afterwards; in-place scatters check
    every alias of a buffer before they mutate it.
    """
    val = node.meta.get("val")
    src = node.args[0] if node.target == torch.ops.aten.clone.default else node.args[1]
    sv = meta_val(src)
    if not isinstance(val, torch.Tensor) or not isinstance(sv, torch.Tensor):
        return False
    return (sv.dtype == val.dtype and tuple(sv.shape) == tuple(val.shape)
            and tuple(sv.stride()) == tuple(val.stride())
            and is_injective(tuple(val.shape), tuple(val.stride())))


_SDPA = "aten.scaled_dot_product_attention.default"


def feeds_attention_only(node: Node) -> bool:
    """A clone used only as attention's q, k or v: the sdpa op reads its operands by
    strides, so the copy is not needed. Hugging Face's head split `.view(...).transpose(1,
    2).contiguous()` made three of these per Whisper layer, each a kernel of its own."""
    users = list(node.users)
    return node.target == torch.ops.aten.clone.default and bool(users) and all(
        target_name(u.target) == _SDPA and any(a is node for a in u.args[:3])
        and not any(a is node for a in (*u.args[3:], *u.kwargs.values())) for u in users)


def _copy_fusible(lw: Lowering, node: Node) -> bool:
    return not copy_is_alias(node) and not feeds_attention_only(node) and fuse.fusible(node)


@rule("aten.clone.default", "aten.copy.default", fusible=_copy_fusible)
def _lower_copy(lw: Lowering, node: Node) -> None:
    """A clone/copy that `copy_is_alias` or `feeds_attention_only` let through: share the
    source's memory."""
    src = lw.tv(node.args[0] if node.target == torch.ops.aten.clone.default else node.args[1])
    val = tensor_meta(node)
    # strides of size-1 dims say nothing about the layout (a head merge of a batch of one)
    same = len(src.strides) == val.dim() and all(
        a == b or n == 1 for a, b, n in zip(src.strides, val.stride(), val.shape))
    if same or feeds_attention_only(node):
        lw.bind(node, src)
        return
    dst = lw.out_view(node)          # the source is not laid out as its meta said
    lw.emit_copy(dst, src, describe(node))
    lw.bind(node, dst)

