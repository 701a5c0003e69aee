"""Folding: rules for ops that compute nothing, and the rewrites before lowering.

- No-op rules (asserts, range annotations) are erased from the graph.
- Batch norm (eval) folds into the convolution before it (through a cast).
- Subgraphs of constants fold into program constants (growing a constant only up to
  `fold_limit` elements); views of constants stay views (`const_view`).
"""

from __future__ import annotations

import logging
import operator
import re
from typing import TYPE_CHECKING

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.export.graph_signature import InputKind

from aotrt.exporter.nodes import dtype_name, is_random, to_numpy
from aotrt.exporter.rules.registry import Rule, register, rule_of
from aotrt.exporter.rules.views import multi_view, view_of
from aotrt.exporter.tview import Buf, TView
from aotrt.program.strides import contiguous_strides, is_packed

if TYPE_CHECKING:  # the driver imports the rules
    from aotrt.exporter.lower import Lowering

log = logging.getLogger(__name__)

Node = torch.fx.Node
aten = torch.ops.aten
_BN_NO_TRAINING = aten._native_batch_norm_legit_no_training.default


def _erased(lw: Lowering, node: Node) -> None:
    """Never called: `remove_noops` erases these nodes before anything is lowered."""


register(["aten._assert_tensor_metadata.default", "aten._assert_scalar.default",
          "aten.sym_constrain_range_for_size.default", "aten.sym_constrain_range.default",
          "aten._assert_async.msg", "aten._assert_async.default"],
         Rule("fold", _erased, noop=True))


def remove_noops(lw: Lowering) -> None:
    """Erase the nodes whose rule is a no-op (asserts, range annotations)."""
    for node in list(lw.graph.nodes):
        r = rule_of(node)
        if r is not None and r.noop:
            if node.users:
                node.replace_all_uses_with(None)  # pragma: no cover - asserts return None
            lw.graph.erase_node(node)


def fold_batch_norms(lw: Lowering) -> None:
    """conv -> [cast ->] batch norm (eval) becomes one conv with folded weight and bias."""
    for bn in list(lw.graph.nodes):
        if bn.op != "call_function" or bn.target != _BN_NO_TRAINING:
            continue
        _try_fold(lw, bn)


def _try_fold(lw: Lowering, bn: Node) -> None:
    x, gamma, beta, mean, var = bn.args[:5]
    eps = float(bn.args[6]) if len(bn.args) > 6 else float(bn.kwargs.get("eps", 1e-5))
    users = list(bn.users)
    if any(u.target is not operator.getitem or u.args[1] != 0 for u in users):
        return
    cast = None
    conv = x
    if (isinstance(x, Node) and x.target == aten._to_copy.default
            and len(x.users) == 1):
        cast, conv = x, x.args[0]
    if not isinstance(conv, Node) or conv.target != aten.convolution.default:
        return
    if len(conv.users) != 1:
        return
    (inp, w, b, stride, padding, dilation, transposed, output_padding, groups) = conv.args
    if transposed:
        return
    params = [w, gamma, beta, mean, var] + ([b] if b is not None else [])
    if not all(p is None or p in lw.placeholder_value for p in params):
        return
    if gamma is None or beta is None or mean is None or var is None:
        return
    value = lw.placeholder_value
    dt = value[w].dtype
    # Folded in float64, rounded once to the weights' dtype.
    wv = value[w].double()
    scale = value[gamma].double() / torch.sqrt(value[var].double() + eps)
    bias = value[b].double() if b is not None else torch.zeros_like(scale)
    new_w = (wv * scale.reshape(-1, *([1] * (wv.dim() - 1)))).to(dt)
    new_b = ((bias - value[mean].double()) * scale + value[beta].double()).to(dt)
    g = lw.graph
    first = next(iter(g.nodes))
    with g.inserting_before(first):
        wn = g.placeholder(f"{w.name}_bnfold")
        bnode = g.placeholder(f"{bn.name}_bnfold_bias")
    wn.meta["val"] = w.meta["val"]
    bnode.meta["val"] = torch.empty(new_b.shape, dtype=new_b.dtype, device="meta")
    for node, value in ((wn, new_w), (bnode, new_b)):
        lw.placeholder_value[node] = value
        lw.const_values[node] = value
        lw.placeholder_kind[node] = InputKind.CONSTANT_TENSOR
    conv.args = (inp, wn, bnode, stride, padding, dilation, transposed, output_padding,
                 groups)
    replacement = cast if cast is not None else conv
    for u in users:
        u.replace_all_uses_with(replacement)
        g.erase_node(u)
    g.erase_node(bn)
    log.debug("folded %s into %s", bn.name, conv.name)

# -- constant propagation -----------------------------------------------------------------


def propagate_constants(lw: Lowering) -> None:
    """Evaluate nodes whose inputs are all constants (eagerly, with torch).

    Views of constants stay views. A computed constant is kept only when it is small
    (fold_limit elements), so folding never blows up the program file.
    """
    for node in lw.graph.nodes:
        r = rule_of(node)
        if node.op != "call_function" or (r is not None and r.noop):
            continue
        if not isinstance(node.target, torch._ops.OpOverload) and \
                node.target is not operator.getitem:
            continue
        if is_random(node):
            continue
        deps = [a for a in node.all_input_nodes]
        if not all(d in lw.const_values for d in deps):
            continue
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else [val]
        if not all(isinstance(v, torch.Tensor) for v in vals):
            continue
        is_view = node.target is operator.getitem or (
            r is not None and (r.view is not None or r.views is not None))
        # Casts and transposes of weights fold whatever their size; growing a constant
        # (generators, broadcasts) only up to fold_limit elements.
        limit = max(lw.fold_limit, sum(lw.const_values[d].numel() for d in deps
                                       if isinstance(lw.const_values[d], torch.Tensor)))
        if not is_view and sum(v.numel() for v in vals) > limit:
            continue
        args, kwargs = pytree.tree_map_only(
            Node, lambda n: lw.const_values[n], (node.args, node.kwargs))
        try:
            with torch.no_grad():
                out = node.target(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - leave it to run time
            log.debug("could not fold %s: %s", node.name, e)
            continue
        lw.const_values[node] = out


def const_view(lw: Lowering, node: Node) -> TView:
    """A constant (placeholder or folded value); views of constants stay views."""
    if node in lw.env:
        return lw.env[node]
    t = node.target
    r = rule_of(node)
    src = rule_of(node.args[0]) if t is operator.getitem else None
    is_multi_view = src is not None and src.views is not None
    if node.op == "call_function" and ((r is not None and r.view is not None) or is_multi_view):
        base = node.args[0]
        if t is operator.getitem:
            parts = multi_view(base, const_view(lw, base.args[0]))
            tv = parts[node.args[1]]
        else:
            tv = view_of(node, const_view(lw, base))
        if tv is not None:
            lw.bind(node, tv)
            return tv
    value = lw.const_values[node]
    tv = add_constant(lw, node.name, value, node)
    lw.bind(node, tv)
    return tv


def add_constant(lw: Lowering, name: str, value: torch.Tensor, node: Node) -> TView:
    """A program constant holding `value`; its view keeps `value`'s layout when dense."""
    key = id(value)
    if key in lw.const_tv:
        return lw.const_tv[key]
    dt = dtype_name(value.dtype, node)
    sizes = tuple(value.shape)
    strides = tuple(value.stride())
    # Expanded dims (stride 0) are stored once; dense permuted layouts are kept.
    base = value
    for d, (n, s) in enumerate(zip(sizes, strides)):
        if s == 0 and n > 1:
            base = base.narrow(d, 0, 1)
    bsizes, bstrides = tuple(base.shape), tuple(base.stride())
    if is_packed(bsizes, bstrides) and base.numel() > 0:
        order = sorted(range(len(bsizes)), key=lambda d: (-bstrides[d], d))
        arr = to_numpy(base.permute(order).contiguous())
        # In the stored array dim order[k] has row-major stride; map back per dim.
        st_perm = contiguous_strides([bsizes[d] for d in order])
        dim_stride = [0] * len(bsizes)
        for k, d in enumerate(order):
            dim_stride[d] = st_perm[k]
        out_strides = tuple(0 if (s == 0 and n > 1) else dim_stride[d]
                            for d, (n, s) in enumerate(zip(sizes, strides)))
        arr = arr.reshape(-1)
    else:
        arr = to_numpy(value.contiguous()).reshape(-1)
        out_strides = contiguous_strides(sizes)
    cname = re.sub(r"[^0-9A-Za-z_.]", "_", name) or "c"
    while cname in lw.const_names:
        cname += "_"
    lw.const_names.add(cname)
    k = len(lw.consts)
    lw.consts.append((cname, arr))
    buf = Buf(arr.nbytes, "constant", k, cname)
    tv = TView(buf, 0, sizes, out_strides, dt)
    lw.const_tv[key] = tv
    return tv
