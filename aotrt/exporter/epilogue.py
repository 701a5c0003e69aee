"""Convolution epilogues: a convolution followed by a residual add and/or an activation
(ReLU, ReLU6, SiLU) becomes one library call, `convolution` with a residual input and an
`activation` param (aotrt/runtime/ops/conv.py: out = activation(conv + bias + residual)).
cuDNN then runs the tail inside the convolution's own graph and the result is written
once, instead of a separate kernel reading it back (ResNet's relu and residual adds, YOLO's
SiLU, MobileNet's ReLU6). Batch norm is folded into the convolution before this pass runs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

aten = torch.ops.aten

#: the activations the runtime's convolution applies in its epilogue
_ACTIVATIONS = {aten.relu.default: "relu", aten.silu.default: "silu"}


def conv_epilogue(x: Any, w: Any, bias: Any, stride: Any, padding: Any, dilation: Any,
                  transposed: Any, output_padding: Any, groups: Any, residual: Any,
                  activation: str) -> Any:
    """The fx target of a convolution with its epilogue: act(conv + bias + residual)."""
    y = aten.convolution.default(x, w, bias, stride, padding, dilation, transposed,
                                 output_padding, groups)
    if residual is not None:
        y = y + residual
    return {"none": lambda t: t, "relu": torch.relu, "relu6": torch.nn.functional.relu6,
            "silu": torch.nn.functional.silu}[activation](y)


def is_conv(node: torch.fx.Node) -> bool:
    """True for a convolution, with or without its fused epilogue."""
    return node.op == "call_function" and node.target in (aten.convolution.default,
                                                          conv_epilogue)


def _only_user(node: torch.fx.Node) -> torch.fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _same_meta(a: Any, b: Any) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and a.shape == b.shape and a.dtype == b.dtype)


def _activation(act: torch.fx.Node, last: torch.fx.Node) -> str | None:
    """The epilogue activation `act` applies to `last`, or None: relu, silu, and ReLU6 as
    torch.export gives it (hardtanh(x, 0, 6); other bounds stay a kernel)."""
    if act.op != "call_function" or not act.args or act.args[0] is not last:
        return None
    if act.target in _ACTIVATIONS:
        return _ACTIVATIONS[act.target]
    if act.target is aten.hardtanh.default:
        lo = act.args[1] if len(act.args) > 1 else act.kwargs.get("min_val", -1.0)
        hi = act.args[2] if len(act.args) > 2 else act.kwargs.get("max_val", 1.0)
        if (lo, hi) == (0.0, 6.0):
            return "relu6"
    return None


def _decomposed_silu(y: torch.fx.Node, val: torch.Tensor
                     ) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """(sigmoid, mul) when `y`'s only users compute y * sigmoid(y), SiLU as core ATen
    decomposes it; else None."""
    users = list(y.users)
    if len(users) != 2:
        return None
    sig = next((u for u in users if u.target is aten.sigmoid.default), None)
    mul = next((u for u in users if u.target is aten.mul.Tensor), None)
    if sig is None or mul is None or sig.args[0] is not y or _only_user(sig) is not mul:
        return None
    if set(mul.args) != {y, sig} or len(mul.args) != 2:
        return None
    return (sig, mul) if _same_meta(mul.meta.get("val"), val) else None


def fuse_conv_epilogues(graph: torch.fx.Graph) -> int:
    """Fold each convolution's single-user `+ residual` (same shape and dtype, alpha 1) and
    then its single-user ReLU, ReLU6 or SiLU into one `conv_epilogue` node; returns how many."""
    fused = 0
    for conv in list(graph.nodes):
        if conv.op != "call_function" or conv.target is not aten.convolution.default:
            continue
        val = conv.meta.get("val")
        if not isinstance(val, torch.Tensor) or not val.is_floating_point():
            continue
        last, residual, activation = conv, None, "none"
        add = _only_user(conv)
        if (add is not None and add.target is aten.add.Tensor and len(add.args) == 2
                and add.kwargs.get("alpha", 1) == 1):
            other = add.args[1] if add.args[0] is conv else add.args[0]
            if (isinstance(other, torch.fx.Node) and other is not conv
                    and _same_meta(other.meta.get("val"), val)
                    and _same_meta(add.meta.get("val"), val)):
                last, residual = add, other
        act = _only_user(last)
        extra: list[torch.fx.Node] = []
        kind = None if act is None else _activation(act, last)
        if kind is not None and _same_meta(act.meta.get("val"), val):
            last, activation = act, kind
        else:
            silu = _decomposed_silu(last, val)
            if silu is not None:
                (sig, act), activation = silu, "silu"
                last, extra = act, [sig]
        if last is conv:
            continue
        with graph.inserting_before(last):
            new = graph.call_function(conv_epilogue,
                                      tuple(conv.args[:9]) + (residual, activation))
        new.meta = dict(conv.meta)
        last.replace_all_uses_with(new)
        # the chain's nodes, each left without users by the one erased before it
        chain = [last] + extra + ([add] if residual is not None and add is not last else []) \
            + [conv]
        for n in chain:
            graph.erase_node(n)
        fused += 1
    return fused


__all__ = ["conv_epilogue", "fuse_conv_epilogues", "is_conv"]
