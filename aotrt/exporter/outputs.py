"""The end of the lowering: outputs get memory of their own, and the symbolic instructions
over TViews become a Program (ProgramBuilder plans the arena Bufs)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.export.graph_signature import OutputKind

from aotrt.errors import Unsupported
from aotrt.exporter.builder import ProgramBuilder
from aotrt.exporter.nodes import to_numpy
from aotrt.exporter.tview import Buf, TView
from aotrt.program.strides import is_row_major
from aotrt.program import Program
from aotrt.program.strides import contiguous_strides

if TYPE_CHECKING:  # the driver imports this module
    from aotrt.exporter.lower import Lowering


def place_outputs(lw: Lowering) -> list[tuple[str, TView]]:
    """The program's outputs, each with memory of its own: a whole row-major arena Buf
    becomes the output root; anything else (inputs, constants, views, repeated values) is
    copied into a new output."""
    out_node = next(n for n in lw.graph.nodes if n.op == "output")
    flat = list(out_node.args[0])
    # torch.export puts the buffers' new values first: they go back into their state,
    # after every user output is copied (an output may still be a view of the old value).
    kinds = [spec.kind for spec in lw.ep.graph_signature.output_specs]
    state_of = {name: tv for name, _, tv in lw.state}
    updates = [(spec.target, value) for spec, value in
               zip(lw.ep.graph_signature.output_specs, flat)
               if spec.kind == OutputKind.BUFFER_MUTATION]
    flat = [v for kind, v in zip(kinds, flat) if kind != OutputKind.BUFFER_MUTATION]
    names = _output_names(lw, len(flat))
    outputs: list[tuple[str, TView]] = []
    claimed: set[Buf] = set()
    for k, (name, value) in enumerate(zip(names, flat)):
        if not isinstance(value, torch.fx.Node) or not isinstance(
                value.meta.get("val"), torch.Tensor):
            raise Unsupported(f"output {name!r}: only tensor outputs are supported, got "
                              f"{value!r}")
        tv = lw.tv(value)
        buf = tv.buf
        whole = (tv.offset == 0 and is_row_major(tv.sizes, tv.strides)
                 and buf.nbytes == tv.numel * tv.itemsize)
        if buf.kind == "arena" and whole and buf not in claimed and tv.numel > 0:
            buf.kind, buf.index = "output", k
            claimed.add(buf)
            outputs.append((name, tv))
            continue
        buf_out = Buf(tv.numel * tv.itemsize, "output", k, name)
        dst = TView(buf_out, 0, tv.sizes, contiguous_strides(tv.sizes), tv.dtype)
        lw.emit_copy(dst, tv, f"output {name}")
        outputs.append((name, dst))
    for target, value in updates:
        dst, src = state_of[target], lw.tv(value)
        if src != dst:          # else written in place already
            lw.emit_copy(dst, src, f"state {target}")
    return outputs


def _output_names(lw: Lowering, n: int) -> list[str]:
    spec = getattr(lw.ep.call_spec, "out_spec", None)
    names: list[str] = []
    if spec is not None:
        try:
            tree = pytree.tree_unflatten(list(range(n)), spec)
            leaves, _ = pytree.tree_flatten_with_path(tree)
            for path, _leaf in leaves:
                key = pytree.keystr(path)
                key = re.sub(r"[\[\]'\"]+", ".", key).strip(".").replace("..", ".")
                names.append("out" + ("." + key if key else ""))
        except Exception:  # noqa: BLE001 - fall back to positional names
            names = []
    if len(names) != n or len(set(names)) != n:
        names = [f"out{i}" for i in range(n)]
    return names


def build(lw: Lowering, outputs: list[tuple[str, TView]]) -> Program:
    """The Program of the lowered instructions (arena Bufs planned by ProgramBuilder)."""
    return builder_of(lw, outputs).build()


def builder_of(lw: Lowering, outputs: list[tuple[str, TView]]) -> ProgramBuilder:
    """The lowered instructions in a ProgramBuilder, its arena Bufs not yet planned."""
    pb = ProgramBuilder(module=lw.name, provenance={"torch": torch.__version__})
    for name, tv in lw.inputs:
        pb.input(name, tv.dtype, tv.sizes, tv.strides)
    for name, arr in lw.consts:
        pb.constant(name, arr)
    for name, tv in outputs:
        pb.output(name, tv.dtype, tv.sizes, contiguous_strides(tv.sizes))
    for name, value, tv in lw.state:
        pb.state(name, to_numpy(value.detach().cpu()))
    buf_ids: dict[Buf, int] = {}

    def tid(v: TView | None) -> int | None:
        if v is None:
            return None
        b = v.buf
        off = v.offset * v.itemsize
        if b.kind == "arena":
            if b not in buf_ids:
                buf_ids[b] = pb.buffer(b.nbytes)
            return pb.in_buffer(buf_ids[b], off, v.dtype, v.sizes, v.strides)
        return pb.tensor(b.kind, b.index, off, v.dtype, v.sizes, v.strides)

    for ins in lw.instrs:
        if ins.op == "kernel":
            pb.kernel(ins.kernel, [tid(v) for v in ins.args], ins.src)
        elif ins.op == "library":
            pb.library(ins.fn, [tid(v) for v in ins.outs], [tid(v) for v in ins.ins],
                       ins.params or {}, ins.src)
        else:
            pb.copy(tid(ins.outs[0]), tid(ins.ins[0]), ins.src)
    return pb
