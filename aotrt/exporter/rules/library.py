"""Library-op rules: GEMMs (mm, bmm, addmm, linear), convolution, attention, topk (and
sort, as a topk of the whole dim), max pooling, nearest upsampling and weight-only quantized
linears (aotrt::linear_wq, exporter/quantize.py) become library instructions
(aotrt.runtime.ops), reading their inputs' views as they are."""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch
import torch.fx

from aotrt.exporter.nodes import arg, describe, meta_val, unsupported
from aotrt.exporter.rules.registry import LowerFn, Rule, register
from aotrt.exporter.tview import Instr, TView

if TYPE_CHECKING:  # the driver imports the rules
    from aotrt.exporter.lower import Lowering

Node = torch.fx.Node
aten = torch.ops.aten


def _float_inputs(node: Node) -> None:
    for d in node.all_input_nodes:
        v = d.meta.get("val")
        if isinstance(v, torch.Tensor) and v.dtype not in (torch.float32, torch.float16,
                                                           torch.bfloat16):
            raise unsupported(node, f"input {d.name} has dtype {v.dtype}; only float32, "
                                    f"float16 and bfloat16 are supported")


def _conv_check(node: Node) -> None:
    _float_inputs(node)
    if meta_val(node.args[1]).dim() not in (3, 4, 5):
        raise unsupported(node, "only 1-D, 2-D and 3-D convolutions are supported")


def _topk_check(node: Node) -> None:
    if meta_val(node.args[0]).dtype == torch.bool:
        raise unsupported(node, "topk of a bool tensor")


def _opt(lw: Lowering, v: Any) -> TView | None:
    return None if v is None else lw.tv(v)


def _simple(fn: str, ins: Callable[[Node], list[Any]],
            params: Callable[[Node], dict[str, Any]] = lambda n: {}) -> LowerFn:
    """A one-result library op reading the tensors `ins(node)`."""
    def lower(lw: Lowering, node: Node) -> None:
        in_views = [_opt(lw, v) for v in ins(node)]
        out = lw.out_view(node)
        lw.instrs.append(Instr("library", describe(node), fn=fn, outs=(out,),
                               ins=tuple(in_views), params=params(node)))
        lw.bind(node, out)
    return lower


def _sdpa_check(node: Node) -> None:
    for d in node.args[:3]:
        v = meta_val(d)
        if not isinstance(v, torch.Tensor) or v.dtype not in (torch.float32, torch.float16,
                                                              torch.bfloat16):
            raise unsupported(node, "q, k and v must be float32, float16 or bfloat16 tensors")
    mask = arg(node, 3, "attn_mask", None)
    if mask is not None and meta_val(mask).dtype not in (torch.bool, meta_val(node.args[0]).dtype):
        raise unsupported(node, f"attn_mask of dtype {meta_val(mask).dtype} for "
                                f"{meta_val(node.args[0]).dtype} q")
    if float(arg(node, 4, "dropout_p", 0.0) or 0.0) != 0.0:
        raise unsupported(node, "dropout in attention is not supported (export in eval mode)")


def _sdpa_params(node: Node) -> dict[str, Any]:
    scale = arg(node, 6, "scale", None)
    return {"dropout_p": 0.0, "is_causal": bool(arg(node, 5, "is_causal", False)),
            "scale": None if scale is None else float(scale),
            "enable_gqa": bool(arg(node, 7, "enable_gqa", False))}


def _lower_sdpa(lw: Lowering, node: Node) -> None:
    """sdpa as the library op; a constant mask that masks nothing is dropped, and one that
    is exactly the causal triangle becomes is_causal. GPT-2's (1, 1, 256, 256) bool mask,
    folded to a constant, was turned into an additive bias by every one of its 12 attention
    calls (35 us a layer on the H200) where the fused kernels skip the masked blocks
    themselves."""
    mask = arg(node, 3, "attn_mask", None)
    params = _sdpa_params(node)
    value = lw.const_values.get(mask) if mask is not None else None
    if isinstance(value, torch.Tensor):
        # on the host: a module exported on cuda folds its mask to a cuda tensor (bench.py's
        # BERT and GPT-2 on the H200 failed with "two devices" when it was compared as is)
        value = value.detach().cpu()
    if _masks_nothing(value):
        mask = None
    elif not params["is_causal"] and _is_causal_mask(value):
        mask, params = None, dict(params, is_causal=True)
    ins = [_opt(lw, v) for v in (node.args[0], node.args[1], node.args[2], mask)]
    out = lw.out_view(node)
    lw.instrs.append(Instr("library", describe(node), fn="sdpa", outs=(out,), ins=tuple(ins),
                           params=params))
    lw.bind(node, out)


def _masks_nothing(m: Any) -> bool:
    """True for a constant host mask that changes no score: all True (bool) or all zero
    (added). BERT's padding mask without padding is a (1, 1, 128, 128) all-True constant, which
    every attention call applied (a pass over the scores on cpu, a bias kernel on cuda)."""
    if not isinstance(m, torch.Tensor) or m.numel() == 0:
        return False
    if m.dtype == torch.bool:
        return bool(m.all())
    return m.is_floating_point() and bool((m == 0).all())


def _is_causal_mask(m: Any) -> bool:
    """True for a bool (..., L, L) host tensor that is the lower triangle (col <= row) in
    every leading index: what is_causal means, with L == S so top-left and bottom-right agree."""
    if not isinstance(m, torch.Tensor) or m.dtype != torch.bool or m.dim() < 2:
        return False
    rows, cols = m.shape[-2], m.shape[-1]
    if rows != cols or rows == 0:
        return False
    tril = torch.ones(rows, cols, dtype=torch.bool).tril()
    return bool((m == tril).all())


#: ops that only re-view their one tensor operand: a query scale may pass through them
_QUERY_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default,
                aten.transpose.int, aten.permute.default, aten.clone.default,
                aten.unsqueeze.default, aten.squeeze.dim)
_SCALES = (aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar)


def _query_only(node: Node, sdpas: list[Node]) -> bool:
    """True when every path from `node` goes through views to attention's query (argument
    0) and nowhere else; the attention nodes reached go to `sdpas`."""
    if not node.users:
        return False
    for u in node.users:
        if u.target == aten.scaled_dot_product_attention.default:
            if u.args[0] is not node or any(a is node for a in (*u.args[1:],
                                                                *u.kwargs.values())):
                return False
            sdpas.append(u)
        elif u.target not in _QUERY_VIEWS or u.args[0] is not node or not _query_only(u, sdpas):
            return False
    return True


def fold_query_scales(graph: torch.fx.Graph) -> int:
    """A query multiplied (or divided) by a positive constant, then only re-viewed into
    attention, becomes attention's scale; returns how many were folded.

    Hugging Face's Whisper, BART and others scale the q projection by head_dim ** -0.5
    and call sdpa with scale 1.0: one elementwise kernel per layer over the queries. The
    fused attention applies its scale to the scores in float32, which is exact where the
    constant is a power of two (Whisper's 0.125) and otherwise rounds less than eager's
    half-type product does.
    """
    n = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _SCALES or len(node.args) != 2:
            continue
        x, c = node.args
        if not isinstance(x, torch.fx.Node) or isinstance(c, bool) \
                or not isinstance(c, (int, float)):
            continue
        if node.target in (aten.div.Tensor, aten.div.Scalar):
            c = 1.0 / float(c) if c else 0.0        # 0.0 never folds
        c = float(c)
        xv, val = meta_val(x), meta_val(node)
        if not (isinstance(xv, torch.Tensor) and isinstance(val, torch.Tensor)
                and xv.dtype == val.dtype and xv.is_floating_point()
                and tuple(xv.shape) == tuple(val.shape) and 0.0 < c < float("inf")):
            continue
        sdpas: list[Node] = []
        if not _query_only(node, sdpas) or any(
                not isinstance(arg(a, 6, "scale", None), (int, float, type(None)))
                for a in sdpas):
            continue
        for a in sdpas:
            scale = arg(a, 6, "scale", None)
            if scale is None:
                scale = int(meta_val(a.args[0]).shape[-1]) ** -0.5
            if len(a.args) > 6:
                a.args = (*a.args[:6], float(scale) * c, *a.args[7:])
            else:
                a.kwargs = {**a.kwargs, "scale": float(scale) * c}
        node.replace_all_uses_with(x)
        graph.erase_node(node)
        n += 1
    return n


_GEMMS = (aten.mm.default, aten.bmm.default, aten.addmm.default, aten.linear.default)


def cast_gemm_operands(graph: torch.fx.Graph) -> int:
    """Give a GEMM operand of another float dtype than the GEMM's result a cast to that
    dtype (what eager computed); returns how many casts were added. torch 2.11's capture
    of timm's LeViT and EfficientFormer at fp16 on cuda fed a float32 softmax
    (half_to_float) straight into an fp16 bmm; the program was refused at export with
    "a: dtype float32 does not match out's float16" (H200, 2026-12-02)."""
    added = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _GEMMS:
            continue
        out = node.meta.get("val")
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            continue
        for a in list(node.all_input_nodes):
            v = a.meta.get("val")
            if not (isinstance(v, torch.Tensor) and v.is_floating_point()
                    and v.dtype != out.dtype):
                continue
            with graph.inserting_before(node):
                cast = graph.call_function(aten._to_copy.default, (a,), {"dtype": out.dtype})
            cast.meta = dict(a.meta)
            cast.meta["val"] = torch.empty_strided(tuple(v.shape), tuple(v.stride()),
                                                   dtype=out.dtype, device="meta")
            node.replace_input_with(a, cast)
            added += 1
    return added


_B_OPERAND = {aten.mm.default: 1, aten.addmm.default: 2}


def transpose_gemm_weights(lw: Lowering) -> int:
    """Store a constant that GEMMs read as their [K, N] right operand column-major (the
    bytes of its [N, K] transpose, as nn.Linear keeps its weight), when every use is one;
    returns how many constants changed. oneDNN's brgemm matmul reorders a row-major [K, N]
    operand on every run: GPT-2's Conv1D addmm weights cost it 140 -> 108 ms a run on two
    AVX-512 cores when packed, a column-major one is read as it is; cuBLASLt takes either."""
    changed = 0
    for node in lw.graph.nodes:
        value = lw.const_values.get(node)
        if (node.op != "placeholder" or not isinstance(value, torch.Tensor) or value.dim() != 2
                or not value.is_floating_point() or not value.is_contiguous()
                or min(value.shape) < 2 or not node.users):
            continue
        if not all(u.op == "call_function" and u.target in _B_OPERAND
                   and len(u.args) > _B_OPERAND[u.target]
                   and u.args[_B_OPERAND[u.target]] is node
                   and node not in u.args[:_B_OPERAND[u.target]] for u in node.users):
            continue
        flipped = value.t().contiguous().t()
        lw.const_values[node] = flipped
        if node in lw.placeholder_value:
            lw.placeholder_value[node] = flipped
        changed += 1
    return changed


def _conv_params(node: Node) -> dict[str, Any]:
    a = node.args
    return {"stride": list(a[3]), "padding": list(a[4]), "dilation": list(a[5]),
            "transposed": bool(a[6]), "output_padding": list(a[7]), "groups": int(a[8])}


def _lower_multi(fn: str, params: Callable[[Node], dict[str, Any]],
                 optional_second: bool) -> LowerFn:
    """Ops with two results (values + indices), picked by getitem."""
    def lower(lw: Lowering, node: Node) -> None:
        vals = node.meta["val"]
        picks: dict[int, Node] = {}
        for u in node.users:
            if u.target is operator.getitem:
                picks.setdefault(int(u.args[1]), u)
        outs: list[TView | None] = []
        for i, v in enumerate(vals):
            user = picks.get(i)
            if user is None:
                if i == 1 and optional_second:
                    outs.append(None)
                    continue
                outs.append(lw.fresh(node, v))
            else:
                outs.append(lw.out_view(user, v))
        out_list = [o for o in outs if o is not None]
        lw.instrs.append(Instr("library", describe(node), fn=fn, outs=tuple(out_list),
                               ins=(lw.tv(node.args[0]),), params=params(node)))
        lw.bind(node, outs)
    return lower


def _topk_params(node: Node) -> dict[str, Any]:
    return {"k": int(arg(node, 1, "k")), "dim": int(arg(node, 2, "dim", -1)),
            "largest": bool(arg(node, 3, "largest", True)),
            "sorted": bool(arg(node, 4, "sorted", True))}


def _sort_params(node: Node) -> dict[str, Any]:
    """aten.sort as the topk library op with k = the dim's size. The runtime's topk is a
    stable sort on every device (ties in ascending index order, NaN largest), which is
    torch.sort(stable=True) ascending and descending; for stable=False torch leaves the order
    of ties unspecified, and the stable order is one of its valid answers."""
    x = meta_val(node.args[0])
    if node.target == aten.sort.stable:
        dim, descending = node.kwargs.get("dim", -1), node.kwargs.get("descending", False)
    else:
        dim, descending = arg(node, 1, "dim", -1), arg(node, 2, "descending", False)
    dim = int(dim)
    k = x.shape[dim] if x.dim() else 1
    return {"k": int(k), "dim": dim, "largest": bool(descending), "sorted": True}


def _sort_check(node: Node) -> None:
    if meta_val(node.args[0]).dtype == torch.bool:
        raise unsupported(node, "sort of a bool tensor")


def _pool_params(node: Node) -> dict[str, Any]:
    def ints(v: Any) -> list[int]:
        return [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)]
    return {"kernel_size": ints(arg(node, 1, "kernel_size")),
            "stride": ints(arg(node, 2, "stride", []) or []),
            "padding": ints(arg(node, 3, "padding", 0)),
            "dilation": ints(arg(node, 4, "dilation", 1)),
            "ceil_mode": bool(arg(node, 5, "ceil_mode", False))}


def _upsample_params(node: Node) -> dict[str, Any]:
    if node.target == aten.upsample_nearest2d.vec:
        size = arg(node, 1, "output_size", None)
        scales = arg(node, 2, "scale_factors", None)
        return {"output_size": None if size is None else [int(s) for s in size],
                "scale_factors": None if scales is None else [float(s) for s in scales]}
    size = arg(node, 1, "output_size")
    sh, sw = arg(node, 2, "scales_h", None), arg(node, 3, "scales_w", None)
    # NOTE: aten's scales_h/scales_w are already output/input factors, like .vec's.
    scales = None if sh is None or sw is None else [float(sh), float(sw)]
    return {"output_size": [int(s) for s in size], "scale_factors": scales}


def _upsample_check(node: Node) -> None:
    _float_inputs(node)
    if node.target == aten.upsample_nearest2d.default:
        sh, sw = arg(node, 2, "scales_h", None), arg(node, 3, "scales_w", None)
        if (sh is None) != (sw is None):
            raise unsupported(node, "only one of scales_h / scales_w given")


def _linear_ins(n: Node) -> list[Any]:
    return [n.args[0], n.args[1], arg(n, 2, "bias", None)]


#: the tensor arguments of aotrt::linear_wq (aotrt/exporter/quantize.py), in the library op's
#: order: its packed weights stay constants as they are
_WQ_INS = ("x", "qweight", "scales", "zeros", "bias")


def _linear_wq_params(node: Node) -> dict[str, Any]:
    return {"bits": int(arg(node, 5, "bits")), "group_size": int(arg(node, 6, "group_size"))}


def _linear_wq_check(node: Node) -> None:
    x = meta_val(arg(node, 0, "x"))
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise unsupported(node, f"x of dtype {x.dtype}; only float32, float16 and bfloat16")


def _writes_over(lw: Lowering, node: Node, region: TView) -> bool:
    return True      # library ops read overlapping inputs through a temporary


def _library(names: Iterable[str], lower: LowerFn, check: Callable[[Node], None]) -> None:
    register(names, Rule("library", lower, check=check, writes_over=_writes_over))


_library(["aten.mm.default"], _simple("mm", lambda n: [n.args[0], n.args[1]]), _float_inputs)
_library(["aten.bmm.default"], _simple("bmm", lambda n: [n.args[0], n.args[1]]),
         _float_inputs)
_library(["aten.addmm.default"], _simple(
    "addmm", lambda n: [n.args[0], n.args[1], n.args[2]],
    lambda n: {"beta": float(arg(n, 3, "beta", 1)), "alpha": float(arg(n, 4, "alpha", 1))}),
    _float_inputs)
_library(["aten.linear.default"], _simple("linear", _linear_ins), _float_inputs)
_library(["aten.convolution.default"], _simple(
    "convolution", lambda n: [n.args[0], n.args[1], n.args[2]], _conv_params), _conv_check)
# a convolution with its epilogue (aotrt/exporter/epilogue.py): the residual is a 4th input
_library(["conv_epilogue"], _simple(
    "convolution", lambda n: [n.args[0], n.args[1], n.args[2], n.args[9]],
    lambda n: dict(_conv_params(n), activation=n.args[10])), _conv_check)
_library(["aten.scaled_dot_product_attention.default"], _lower_sdpa, _sdpa_check)
_library(["aten.topk.default"], _lower_multi("topk", _topk_params, False), _topk_check)
_library(["aten.sort.default", "aten.sort.stable"], _lower_multi("topk", _sort_params, False),
         _sort_check)
_library(["aten.max_pool2d_with_indices.default"],
         _lower_multi("max_pool2d", _pool_params, True), _float_inputs)
_library(["aotrt.linear_wq.default"], _simple(
    "linear_wq", lambda n: [arg(n, i, name) for i, name in enumerate(_WQ_INS)],
    _linear_wq_params), _linear_wq_check)
_library(["aten.upsample_nearest2d.vec", "aten.upsample_nearest2d.default"],
         _simple("upsample_nearest2d", lambda n: [n.args[0]], _upsample_params),
         _upsample_check)
