"""The stem rewrite: a large-kernel stride-2 convolution over a few input channels (ResNet's
7x7 over RGB) becomes a stride-1 convolution over the input's 2x2 space-to-depth.

    conv(x, w, stride 2, pad p), x (N, C, H, W), w (O, C, k, k)
      == conv(s2d(pad(x)), w', stride 1, pad 0),  s2d(x)[n, 4c + 2dy + dx, i, j]
                                                      = x[n, c, 2i + dy, 2j + dx]
    w'[o, 4c + 2dy + dx, a, b] = w[o, c, 2a + dy, 2b + dx] (0 past the kernel)

oneDNN 3.2 has no channels-last implementation for 3 input channels: its direct kernel wrote
ResNet's stem in a blocked layout and reordered it, 1.9 + 0.3 ms on two AVX-512 cores, where
its brgemm convolution took the 12-channel 4x4 form in 1.3 ms (the rewrite multiplies 30% more
zeros). For a 3x3 kernel (YOLOv8n's stem: 0.24 against 0.54 ms) it loses, so only kernels of
MIN_KERNEL and up are rewritten, and only in channels-last exports, whose convolutions run
NHWC. The products are the same; their sums are taken in another order.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
import torch.fx
from torch.export.graph_signature import InputKind

if TYPE_CHECKING:  # the driver imports the rules
    from aotrt.exporter.lower import Lowering

log = logging.getLogger(__name__)

Node = torch.fx.Node
aten = torch.ops.aten

#: the smallest square kernel rewritten, and the most input channels
MIN_KERNEL, MAX_CHANNELS = 5, 4


def space_to_depth_stems(lw: "Lowering") -> int:
    """Rewrite every stem convolution (see the module doc); how many were rewritten."""
    if not lw.channels_last:
        return 0
    n = 0
    for conv in list(lw.graph.nodes):
        if conv.op == "call_function" and conv.target == aten.convolution.default:
            n += _try_rewrite(lw, conv)
    return n


def _meta(node: Node) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _try_rewrite(lw: "Lowering", conv: Node) -> int:
    x, w, b, stride, padding, dilation, transposed, output_padding, groups = conv.args
    xv, wv = _meta(x), _meta(w)
    if xv is None or wv is None or xv.dim() != 4 or transposed or groups != 1:
        return 0
    if w not in lw.placeholder_value or (b is not None and b not in lw.placeholder_value):
        return 0
    if list(stride) != [2, 2] or list(dilation) != [1, 1] or xv.dtype != wv.dtype:
        return 0
    o, c, kh, kw = wv.shape
    if kh != kw or kh < MIN_KERNEL or c > MAX_CHANNELS or padding[0] != padding[1]:
        return 0
    n, _, h, wd = xv.shape
    p, k2 = int(padding[0]), (kh + 1) // 2
    oh, ow = (h + 2 * p - kh) // 2 + 1, (wd + 2 * p - kw) // 2 + 1
    # The padded input covers rows -p .. 2 (oh + k2 - 1) - p - 1 (cropping is not done).
    hp, wp = 2 * (oh + k2 - 1), 2 * (ow + k2 - 1)
    bottom, right = hp - h - p, wp - wd - p
    if oh < 1 or ow < 1 or bottom < 0 or right < 0:
        return 0
    weight = lw.placeholder_value[w]
    padded = torch.zeros((o, c, 2 * k2, 2 * k2), dtype=weight.dtype)
    padded[:, :, :kh, :kw] = weight
    new_w = (padded.view(o, c, k2, 2, k2, 2).permute(0, 1, 3, 5, 2, 4)
             .reshape(o, 4 * c, k2, k2).contiguous())
    g = lw.graph
    wn = _constant(lw, f"{w.name}_s2d", new_w)
    # Written channels-last, as the convolutions read their inputs: (N, H/2, W/2, C, 2, 2)
    # dense, seen as (N, 4C, H/2, W/2). A row-major result made cuDNN transpose it twice
    # and left the convolution's epilogue to a kernel of its own (ResNet-50 b32, H200).
    # One gather writes it: x[:, c, 2i + dy - p, 2j + dx - p] at clamped coordinates, zero
    # where they fall outside (a `where`, so an inf or NaN at the border stays out of the
    # padding). A pad, then a copy of its space-to-depth, took two passes and an
    # intermediate the size of the input (0.25 ms a run of ResNet's 224x224 stem).
    ih, iw = hp // 2, wp // 2
    rows = (2 * torch.arange(ih).view(ih, 1) + torch.arange(2).view(1, 2) - p)
    cols = (2 * torch.arange(iw).view(iw, 1) + torch.arange(2).view(1, 2) - p)
    inside = (((rows >= 0) & (rows < h)).view(ih, 1, 1, 2, 1)
              & ((cols >= 0) & (cols < wd)).view(1, iw, 1, 1, 2))
    consts = {
        "rows": rows.clamp(0, h - 1).view(ih, 1, 1, 2, 1),
        "cols": cols.clamp(0, wd - 1).view(1, iw, 1, 1, 2),
        "chan": torch.arange(c).view(1, 1, c, 1, 1),
        "inside": inside,
    }
    node = {key: _constant(lw, f"{x.name}_s2d_{key}", value) for key, value in consts.items()}
    meta = {key: torch.empty(v.shape, dtype=v.dtype, device="meta") for key, v in consts.items()}
    xm = torch.empty(tuple(xv.shape), dtype=xv.dtype, device="meta")
    gathered = aten.index.Tensor(xm, [None, meta["chan"], meta["rows"], meta["cols"]])
    masked = aten.where.ScalarOther(meta["inside"], gathered, 0.0)
    nhwc = aten.view.default(masked, [n, ih, iw, 4 * c])
    with g.inserting_before(conv):
        cur = _call(g, conv, aten.index.Tensor,
                    (x, [None, node["chan"], node["rows"], node["cols"]]), gathered)
        cur = _call(g, conv, aten.where.ScalarOther, (node["inside"], cur, 0.0), masked)
        cur = _call(g, conv, aten.view.default, (cur, [n, ih, iw, 4 * c]), nhwc)
        cur = _call(g, conv, aten.permute.default, (cur, [0, 3, 1, 2]),
                    aten.permute.default(nhwc, [0, 3, 1, 2]))
    conv.args = (cur, wn, b, [1, 1], [0, 0], [1, 1], False, output_padding, 1)
    log.debug("%s: %dx%d stride-2 stem over %d channels as a %dx%d convolution over its "
              "space-to-depth", conv.name, kh, kw, c, k2, k2)
    return 1


def _constant(lw: "Lowering", name: str, value: torch.Tensor) -> Node:
    """A new constant placeholder holding `value`."""
    g = lw.graph
    with g.inserting_before(next(iter(g.nodes))):
        node = g.placeholder(name)
    node.meta["val"] = torch.empty(value.shape, dtype=value.dtype, device="meta")
    lw.placeholder_value[node] = lw.const_values[node] = value.contiguous()
    lw.placeholder_kind[node] = InputKind.CONSTANT_TENSOR
    return node


def _call(g: torch.fx.Graph, conv: Node, target: object, args: tuple, meta: torch.Tensor
          ) -> Node:
    """A new call of `target` (before the insertion point) with this value, traced to conv."""
    node = g.call_function(target, args, {})
    node.meta["val"] = meta
    node.meta["stack_trace"] = conv.meta.get("stack_trace")
    return node


__all__ = ["MAX_CHANNELS", "MIN_KERNEL", "space_to_depth_stems"]
