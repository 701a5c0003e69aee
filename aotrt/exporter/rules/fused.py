"""The fused family: every op of the kernel table (aotrt.exporter.pointwise and
reductions.py) becomes generated kernel code. Fusion (aotrt.exporter.fuse) groups these
nodes; each group is lowered here into one kernel over the views' real strides.

Registered last (rules/__init__.py): an op of the kernel table that another family already
lowers (alias and lift_fresh_copy as views, aliasing clone/copy) keeps that rule, which then
sends its node here when `fuse.fusible` says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.fx

from aotrt.errors import AotrtError
from aotrt.exporter import fuse
from aotrt.exporter.codegen import build_kernel
from aotrt.exporter.nodes import describe, op_name, target_name, unsupported
from aotrt.exporter.optable import OPS
from aotrt.exporter.rules.registry import RULES, Rule, register
from aotrt.exporter.tview import TView

if TYPE_CHECKING:  # the driver imports the rules
    from aotrt.exporter.lower import Lowering

Node = torch.fx.Node


class _actual_layouts:
    """Swap node.meta['val'] for meta tensors with the views' real strides, then restore."""

    def __init__(self, pairs: Sequence[tuple[Node, TView]]) -> None:
        self.pairs = pairs
        self.saved: list[tuple[Node, Any]] = []

    def __enter__(self) -> None:
        for node, tv in self.pairs:
            v = node.meta.get("val")
            if isinstance(v, torch.Tensor) and tuple(v.stride()) != tv.strides:
                self.saved.append((node, v))
                node.meta["val"] = torch.empty_strided(tv.sizes, tv.strides, dtype=v.dtype,
                                                       device="meta")

    def __exit__(self, *exc: Any) -> None:
        for node, v in reversed(self.saved):
            node.meta["val"] = v
        self.saved.clear()


def lower_group(lw: Lowering, group: list[Node]) -> None:
    """One fusion group -> one kernel instruction; binds the group's outputs."""
    inputs, outputs = fuse.group_io(group)
    in_views = [lw.tv(d) for d in inputs]
    out_views = [lw.out_view(n) for n in outputs]
    last = group[-1]
    name = lw.kname(op_name(last).replace("aten.", "").split(".")[0])
    # build_kernel indexes every view by its node's meta['val'] strides; where ours differ
    # (cat slots, constants, inputs) it sees ours for the duration of the call.
    with _actual_layouts(list(zip(inputs, in_views)) + list(zip(outputs, out_views))):
        try:
            kernel = build_kernel(name, group, inputs, outputs)
        except AotrtError:
            raise
        except Exception as e:  # a generator bug must still name the op and line
            raise unsupported(last, f"kernel generation failed: {type(e).__name__}: "
                                    f"{e}") from e
    lw.emit_kernel(kernel, [*in_views, *out_views], describe(last))
    for n, v in zip(outputs, out_views):
        lw.bind(n, v)


def _lower(lw: Lowering, node: Node) -> None:
    lower_group(lw, [node])


def _check(node: Node) -> None:
    why = fuse.why_not(node)
    if why is not None:
        raise unsupported(node, why)


def _fusible(lw: Lowering, node: Node) -> bool:
    return fuse.fusible(node)


register(sorted({target_name(t) for t in OPS} - set(RULES)),
         Rule("fused", _lower, check=_check, fusible=_fusible))
