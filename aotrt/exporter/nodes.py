"""Helpers on fx nodes shared by the lowering and the kernel builders: the one torch dtype
table, the one way an error names a node (op and source line), and argument access."""

from __future__ import annotations

import re
from typing import Any, Iterable

import numpy as np
import torch
import torch.fx

from aotrt import dtypes
from aotrt.errors import Unsupported

aten = torch.ops.aten

#: torch dtype -> aotrt dtype name: the dtypes programs and generated kernels support
TORCH_DTYPES: dict[torch.dtype, str] = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8",
    torch.uint8: "uint8", torch.bool: "bool",
}


def ops(*names: str) -> frozenset[Any]:
    """The aten overloads named 'packet.overload' that this torch has (2.11 .. 2.14)."""
    out = set()
    for name in names:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(aten, packet, None), overload, None)
        if op is not None:
            out.add(op)
    return frozenset(out)


# ---------------------------------------------------------------------------------------------
# naming a node in messages

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in ([^\n]+)\n?([^\n]*)')


def source_line(node: torch.fx.Node) -> str:
    """'file.py:12 (code)' of the last frame of node.meta['stack_trace'], or ''."""
    trace = node.meta.get("stack_trace") or ""
    frames = _FRAME.findall(trace)
    if not frames:
        return ""
    path, line, _, code = frames[-1]
    code = code.strip()
    return f"{path}:{line}" + (f" ({code})" if code else "")


def describe(node: torch.fx.Node) -> str:
    """'aten.add.Tensor at model.py:12 (return x + y)' for messages and instruction src."""
    where = source_line(node)
    return f"{op_name(node)} at {where}" if where else f"{op_name(node)} (node {node.name})"


def op_name(node: torch.fx.Node) -> str:
    """The printable name of a node's target ('aten.add.Tensor', 'getitem')."""
    return target_name(node.target)


def target_name(target: Any) -> str:
    """The printable name of an fx target: str() of an OpOverload, else its __name__."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))


def is_random(node: torch.fx.Node) -> bool:
    """Whether the node draws random numbers (rand, randn, dropout in training, ...)."""
    t = node.target
    return isinstance(t, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in t.tags


def unsupported(node: torch.fx.Node, why: str = "") -> Unsupported:
    """An Unsupported error naming the op and the user's source line (and, for a random op
    with no other reason given, that random ops are not supported)."""
    if not why and is_random(node):
        why = ("random ops are not supported (programs are deterministic): pass random "
               "values in as an input, and call model.eval() for dropout")
    msg = f"{describe(node)}: not supported by aotrt"
    return Unsupported(f"{msg}: {why}" if why else msg)


# ---------------------------------------------------------------------------------------------
# values and arguments


def meta_val(node: Any) -> Any:
    """node.meta['val'] for an fx Node, else the value itself (python scalars)."""
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def dtype_name(dt: Any, node: torch.fx.Node | None = None) -> str:
    """The aotrt name of a torch dtype; Unsupported for the others (float64, complex)."""
    name = TORCH_DTYPES.get(dt)
    if name is None:
        if node is not None:
            raise unsupported(node, f"dtype {dt} is not supported")
        raise Unsupported(f"dtype {dt} is not supported")
    return name


def static_ints(values: Iterable[Any], node: torch.fx.Node) -> tuple[int, ...]:
    """Concrete ints (shapes are static); Unsupported for symbolic ones."""
    out = []
    for v in values:
        if not isinstance(v, int):
            try:
                v = int(v)
            except Exception:
                raise unsupported(node, f"dynamic shape {v!r}") from None
        out.append(v)
    return tuple(out)


def tensor_meta(node: torch.fx.Node) -> torch.Tensor:
    """The node's fake tensor value."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise unsupported(node, "the node has no tensor value")
    return val


def arg(node: torch.fx.Node, i: int, name: str, default: Any = None) -> Any:
    """Argument `i` (positional) or `name` (keyword) of a node, else `default`."""
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def node_args(node: torch.fx.Node) -> dict[str, Any]:
    """The node's arguments by schema name, defaults filled in."""
    schema = node.target._schema
    out: dict[str, Any] = {}
    for i, a in enumerate(schema.arguments):
        if i < len(node.args) and not a.kwarg_only:
            out[a.name] = node.args[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
        else:
            out[a.name] = None
    return out


def is_pointwise(node: torch.fx.Node) -> bool:
    """True for ops tagged pointwise (each output element reads only its own positions)."""
    t = node.target
    return isinstance(t, torch._ops.OpOverload) and torch.Tag.pointwise in t.tags


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A host numpy copy of a tensor of a supported dtype (bf16 via ml_dtypes)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(dtypes.bfloat16.np).copy()
    return t.contiguous().numpy().copy()
