"""Lowering: a core-ATen graph from torch.export -> an aotrt Program. This file is the
driver; what each op becomes is its rule in aotrt/exporter/rules/ (one table, one family of
rules per file).

Every value of the graph becomes a `TView` (aotrt/exporter/tview.py): a view of one `Buf`
(an arena intermediate, an input, an output or a constant). The driver:

1. classifies the placeholders (inputs, weights) and refuses mutated inputs and buffers;
2. erases no-ops, folds batch norms into convolutions and constant subgraphs into constants
   (rules/fold.py), and lays convolution activations out channels-last when asked
   (layout.py);
3. checks every op against its rule before any instruction is made: anything unsupported
   raises Unsupported naming the op and the model's source line;
4. schedules units (fusion groups from aotrt.exporter.fuse, and single nodes) close to the
   graph's order, and lowers each one through its rule; a compute node writes a fresh Buf
   laid out as its meta['val'] strides, or straight into a consumer's memory
   (rules/cat_scatter.py);
5. gives outputs their own memory: a whole row-major arena Buf becomes the output root;
   anything else (inputs, constants, views, repeated values) is copied;
6. builds the Program (aotrt.exporter.builder; arena Bufs planned by plan.py from the
   instruction order).
"""

from __future__ import annotations

import heapq
import logging
import math
import re
from typing import Any, Collection, Sequence

import numpy as np
import torch
import torch.fx
from torch.export.graph_signature import InputKind, OutputKind

from aotrt import dtypes
from aotrt.errors import InvalidArgument, Unsupported
from aotrt.exporter import epilogue, fuse, layout
from aotrt.exporter.builder import ProgramBuilder
from aotrt.exporter.dedup import KernelSet
from aotrt.exporter.nodes import (describe, dtype_name, is_pointwise, static_ints, tensor_meta,
                                  unsupported)
from aotrt.exporter.outputs import builder_of, place_outputs
from aotrt.exporter.rules import rule_of
from aotrt.exporter.rules.cat_scatter import dest
from aotrt.exporter.rules.fold import (const_view, fold_batch_norms, propagate_constants,
                                       remove_noops)
from aotrt.exporter.rules.fused import lower_group
from aotrt.exporter.rules.library import (cast_gemm_operands, fold_query_scales,
                                          transpose_gemm_weights)
from aotrt.exporter.rules.stem import space_to_depth_stems
from aotrt.exporter.tview import Buf, Instr, TView, is_injective
from aotrt.kernels import ir
from aotrt.program import Program
from aotrt.program.strides import contiguous_strides

log = logging.getLogger(__name__)


class Lowering:
    """Lower one ExportedProgram (core ATen) into a Program."""

    def __init__(self, ep: torch.export.ExportedProgram, name: str = "module",
                 fold_limit: int = 1 << 16, channels_last: bool = False,
                 state: Collection[str] = ()) -> None:
        self.ep = ep
        self.shared_state = frozenset(state)
        self.channels_last = channels_last
        self.gm = ep.graph_module
        self.graph = ep.graph
        self.name = name
        self.fold_limit = fold_limit
        self.env: dict[torch.fx.Node, Any] = {}       # node -> TView | list[TView|None]
        self.instrs: list[Instr] = []
        self.kernels: dict[str, ir.Kernel] = {}
        #: kernels by canonical form: a repeated layer's kernels are emitted once
        self.kernel_set = KernelSet()
        self.inputs: list[tuple[str, TView]] = []
        #: buffers the graph writes in place: (name, initial value, the view of its state)
        self.state: list[tuple[str, torch.Tensor, TView]] = []
        self.consts: list[tuple[str, np.ndarray]] = []
        self.const_names: set[str] = set()
        self.const_values: dict[torch.fx.Node, torch.Tensor] = {}   # folded values
        self.const_tv: dict[int, TView] = {}          # id(tensor) -> its constant view
        self.aliases: dict[Buf, list[torch.fx.Node]] = {}
        self.pos: dict[torch.fx.Node, float] = {}
        self.dest_memo: dict[torch.fx.Node, TView | None] = {}
        self.result_memo: dict[torch.fx.Node, TView] = {}
        self.forced_in_place: set[torch.fx.Node] = set()
        self.placeholder_kind: dict[torch.fx.Node, InputKind] = {}
        self.placeholder_value: dict[torch.fx.Node, torch.Tensor] = {}
        self.unit_of: dict[torch.fx.Node, list[torch.fx.Node]] = {}
        self._kcount = 0

    # -- driver -------------------------------------------------------------------------------

    def run(self) -> Program:
        """Lower the whole graph; raise Unsupported (naming op and line) before any work."""
        return self.builder().build()

    def builder(self) -> ProgramBuilder:
        """Lower the whole graph into a ProgramBuilder, before its arena is planned (the
        dynamic-size export compares these across sizes, exporter/dynamic.py)."""
        self._classify_placeholders()
        self._check_outputs()
        remove_noops(self)
        n = cast_gemm_operands(self.graph)
        log.debug("%d GEMM operands cast to their result's dtype", n)
        fold_batch_norms(self)
        n = space_to_depth_stems(self)
        log.debug("%d stem convolutions take their input's space-to-depth", n)
        n = fold_query_scales(self.graph)
        log.debug("%d query scales folded into attention's scale", n)
        self.graph.eliminate_dead_code()
        n = epilogue.fuse_conv_epilogues(self.graph)
        log.debug("%d convolutions took their epilogue", n)
        if self.channels_last:
            n = layout.propagate_channels_last(self.graph, is_pointwise)
            log.debug("channels-last: %d nodes laid out NHWC", n)
        n = layout.heads_merged_by_attention(self.graph)
        log.debug("%d attention results laid out with heads merged", n)
        n = layout.row_major_for_row_reductions(self.graph, is_pointwise)
        log.debug("%d elementwise results laid out row-major for the rows reduced", n)
        n = transpose_gemm_weights(self)
        log.debug("%d GEMM weights stored column-major", n)
        propagate_constants(self)
        self._check_supported()
        units = self._schedule()
        for i, unit in enumerate(units):
            for n in unit:
                self.pos[n] = i
                self.unit_of[n] = unit
        for unit in units:
            if len(unit) > 1 or self.is_fusible(unit[0]):
                lower_group(self, unit)
            else:
                rule_of(unit[0]).lower(self, unit[0])
        pb = builder_of(self, place_outputs(self))
        log.debug("%d kernel instructions call an identical earlier kernel",
                  self.kernel_set.merged)
        return pb

    # -- the signature: inputs, constants, outputs --------------------------------------------

    def _classify_placeholders(self) -> None:
        sig = self.ep.graph_signature
        mutated = set(sig.buffers_to_mutate.values())
        nodes = {n.name: n for n in self.graph.nodes if n.op == "placeholder"}
        for spec in sig.input_specs:
            arg = spec.arg
            name = getattr(arg, "name", None)
            node = nodes.get(name) if name is not None else None
            if node is None:
                continue
            self.placeholder_kind[node] = spec.kind
            if spec.kind == InputKind.USER_INPUT:
                val = node.meta.get("val")
                if not isinstance(val, torch.Tensor):
                    if node.users:
                        raise Unsupported(f"input {name!r}: only tensor inputs are supported, "
                                          f"got {type(val).__name__}")
                    continue
                sizes = static_ints(val.shape, node)
                dt = dtype_name(val.dtype, node)
                k = len(self.inputs)
                buf = Buf(math.prod(sizes) * dtypes.as_dtype(dt).itemsize, "input", k, name)
                tv = TView(buf, 0, sizes, contiguous_strides(sizes), dt)
                self.inputs.append((name, tv))
                self.bind(node, tv)
            elif spec.kind == InputKind.BUFFER and (spec.target in mutated or
                                                     spec.target in self.shared_state):
                self._bind_state(node, spec.target)
            elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                target = spec.target
                if target in self.ep.state_dict:
                    value = self.ep.state_dict[target]
                elif target in self.ep.constants:
                    value = self.ep.constants[target]
                else:
                    raise Unsupported(f"constant {target!r} has no value in the exported program")
                if not isinstance(value, torch.Tensor):
                    raise Unsupported(f"constant {target!r} is a {type(value).__name__}, not a "
                                      f"tensor")
                if isinstance(value, torch.nn.Parameter):
                    value = value.data
                self.placeholder_value[node] = value
                self.const_values[node] = value
            else:
                raise Unsupported(f"input {name!r} of kind {spec.kind.name} is not supported")

    def _bind_state(self, node: torch.fx.Node, target: str) -> None:
        """A buffer the graph writes in place becomes state: memory the loaded program
        keeps between runs, initialised from the buffer's value at export."""
        value = self.ep.state_dict.get(target)
        if value is None:
            value = self.ep.constants.get(target)
        if not isinstance(value, torch.Tensor):
            raise Unsupported(f"buffer {target!r} is written in place but has no tensor value")
        val = node.meta.get("val")
        sizes = static_ints(val.shape, node)
        dt = dtype_name(val.dtype, node)
        buf = Buf(math.prod(sizes) * dtypes.as_dtype(dt).itemsize, "state", len(self.state),
                  target)
        tv = TView(buf, 0, sizes, contiguous_strides(sizes), dt)
        self.state.append((target, value.detach(), tv))
        self.bind(node, tv)

    def _check_outputs(self) -> None:
        for spec in self.ep.graph_signature.output_specs:
            if spec.kind == OutputKind.USER_INPUT_MUTATION:
                raise Unsupported(f"the model mutates user input {spec.target!r} in place; "
                                  f"aotrt programs never write their inputs (clone it first)")
            if spec.kind == OutputKind.BUFFER_MUTATION:
                if any(spec.target == name for name, _, _ in self.state):
                    continue
                raise Unsupported(f"the model updates buffer {spec.target!r} in place, which "
                                  f"aotrt cannot keep as state")
            if spec.kind != OutputKind.USER_OUTPUT:
                raise Unsupported(f"output kind {spec.kind.name} is not supported")


    # -- support check ------------------------------------------------------------------------

    def is_const(self, node: Any) -> bool:
        """True for a node whose value is a (folded) constant."""
        return isinstance(node, torch.fx.Node) and node in self.const_values

    def _runtime_nodes(self) -> list[torch.fx.Node]:
        """call_function nodes that run at run time (not folded away)."""
        return [n for n in self.graph.nodes
                if n.op == "call_function" and not self.is_const(n)]

    def _check_supported(self) -> None:
        for node in self.graph.nodes:
            if node.op == "placeholder" and node not in self.placeholder_kind and node.users:
                raise Unsupported(f"graph input {node.name!r} is not a user input or constant")
            if node.op == "get_attr":
                raise unsupported(node, "get_attr nodes are not supported")
        for node in self._runtime_nodes():
            val = node.meta.get("val")
            for v in val if isinstance(val, (list, tuple)) else [val]:
                if isinstance(v, torch.Tensor):
                    dtype_name(v.dtype, node)
                    static_ints(v.shape, node)
            r = rule_of(node)
            if r is None:
                raise unsupported(node)
            if r.check is not None and not self.is_fusible(node):
                r.check(node)

    def is_fusible(self, node: torch.fx.Node) -> bool:
        """True when the node goes to fusion (its rule says so)."""
        r = rule_of(node)
        return r is not None and r.fusible is not None and r.fusible(self, node)

    # -- scheduling ---------------------------------------------------------------------------

    def _schedule(self) -> list[list[torch.fx.Node]]:
        """Units in a topological order close to the graph's: fusion groups and single nodes."""
        nodes = self._runtime_nodes()
        index = {n: i for i, n in enumerate(nodes)}
        fusible = [n for n in nodes if self.is_fusible(n)]
        groups = fuse.partition(fusible) if fusible else []
        unit_of: dict[torch.fx.Node, int] = {}
        units: list[list[torch.fx.Node]] = []
        for g in groups:
            g = sorted(g, key=index.__getitem__)
            for n in g:
                unit_of[n] = len(units)
            units.append(g)
        for n in nodes:
            if n not in unit_of:
                unit_of[n] = len(units)
                units.append([n])
        deps: list[set[int]] = [set() for _ in units]
        users: list[set[int]] = [set() for _ in units]
        for n in nodes:
            u = unit_of[n]
            for d in n.all_input_nodes:
                du = unit_of.get(d)
                if du is not None and du != u:
                    deps[u].add(du)
                    users[du].add(u)
        key = [min(index[n] for n in unit) for unit in units]
        ready = [(key[u], u) for u in range(len(units)) if not deps[u]]
        heapq.heapify(ready)
        order: list[int] = []
        pending = [len(d) for d in deps]
        while ready:
            _, u = heapq.heappop(ready)
            order.append(u)
            for v in users[u]:
                pending[v] -= 1
                if pending[v] == 0:
                    heapq.heappush(ready, (key[v], v))
        if len(order) != len(units):
            raise Unsupported("fusion produced a cyclic schedule (aotrt.exporter.fuse bug)")
        return [units[u] for u in order]

    # -- values -------------------------------------------------------------------------------

    def bind(self, node: torch.fx.Node, value: Any) -> None:
        """Give `node` its value (a TView, or a list of them for multi-result ops)."""
        self.env[node] = value
        for tv in (value if isinstance(value, list) else [value]):
            if isinstance(tv, TView):
                self.aliases.setdefault(tv.buf, []).append(node)

    def tv(self, node: Any) -> TView:
        """The TView of a tensor-valued node (constants materialize on first use)."""
        if node in self.env:
            val = self.env[node]
            if isinstance(val, TView):
                return val
            raise InvalidArgument(f"node {node.name} has no single tensor value")
        if self.is_const(node):
            return const_view(self, node)
        raise InvalidArgument(f"node {node.name} was used before it was computed")

    def fresh(self, node: torch.fx.Node, val: torch.Tensor | None = None) -> TView:
        """A new arena Buf laid out as the value's meta strides (row-major if those overlap)."""
        val = tensor_meta(node) if val is None else val
        sizes = static_ints(val.shape, node)
        strides = static_ints(val.stride(), node)
        if not is_injective(sizes, strides):
            strides = contiguous_strides(sizes)
        return self.new_buffer(sizes, strides, dtype_name(val.dtype, node), node.name)

    def new_buffer(self, sizes: Sequence[int], strides: Sequence[int] | None, dtype: str,
                   label: str = "") -> TView:
        """A TView covering a new arena Buf."""
        sizes = tuple(int(s) for s in sizes)
        strides = contiguous_strides(sizes) if strides is None else tuple(strides)
        itemsize = dtypes.as_dtype(dtype).itemsize
        n = math.prod(sizes)
        hi = sum((a - 1) * s for a, s in zip(sizes, strides) if a > 1) + 1 if n else 0
        buf = Buf(hi * itemsize, "arena", -1, label)
        return TView(buf, 0, sizes, strides, dtype)

    # -- destinations: write straight into the consumer's memory ------------------------------

    def out_view(self, node: torch.fx.Node, val: torch.Tensor | None = None) -> TView:
        """Where a compute node (or one getitem of it) writes its value."""
        d = dest(self, node)
        return d if d is not None else self.fresh(node, val)

    # -- instructions -------------------------------------------------------------------------

    def materialize(self, node: torch.fx.Node, tv: TView) -> TView:
        """A row-major copy of `tv`, so that a view op can reshape it."""
        dst = self.new_buffer(tv.sizes, None, tv.dtype, node.name + "_contig")
        self.emit_copy(dst, tv, describe(node))
        return dst

    def emit_copy(self, dst: TView, src: TView, where: str) -> None:
        """dst[...] = src (same sizes; dtypes may differ: then a cast kernel)."""
        if dst == src or dst.numel == 0:
            return
        if dst.dtype == src.dtype:
            self.instrs.append(Instr("copy", where, outs=(dst,), ins=(src,)))
            return
        name = self.kname("cast")
        k = ir.Kernel(name, dst.sizes, (), (ir.Arg(src.dtype, "r"), ir.Arg(dst.dtype, "w")),
                      (ir.store(1, dst.strides, ir.cast(ir.load(0, src.strides, src.dtype),
                                                        dst.dtype)),))
        self.emit_kernel(k, [src, dst], where)

    def kname(self, what: str) -> str:
        """A fresh kernel name: 'k<n>_<what>'."""
        self._kcount += 1
        what = re.sub(r"[^0-9A-Za-z_]", "_", what)[:40]
        return f"k{self._kcount}_{what}"

    def emit_kernel(self, kernel: ir.Kernel, args: Sequence[TView], where: str) -> None:
        """Append a kernel instruction (args in the kernel's argument order); a kernel
        identical to an earlier one but for its name calls that one (aotrt.exporter.dedup)."""
        kernel = self.kernel_set.add(kernel)
        self.kernels[kernel.name] = kernel
        self.instrs.append(Instr("kernel", where, kernel=kernel, args=tuple(args)))


def runs_whole(node: torch.fx.Node) -> bool:
    """True when the lowering can run `node` as it is: it has a rule, which accepts it
    (capture decomposes the others further where torch knows how)."""
    if node.op != "call_function":
        return True
    r = rule_of(node)
    if r is None:
        return False
    try:
        if r.check is not None:
            r.check(node)
        return True
    except Exception:  # noqa: BLE001 - anything odd: let decomposition have a go
        return False


def lower(ep: torch.export.ExportedProgram, name: str = "module",
          channels_last: bool = False, state: Collection[str] = ()) -> Program:
    """Lower a decomposed ExportedProgram into a validated Program (`channels_last`: lay
    2-D convolution activations out NHWC, aotrt/exporter/layout.py; `state`: buffers bound
    as state even where this program only reads them, since another method writes them)."""
    return Lowering(ep, name, channels_last=channels_last, state=state).run()
