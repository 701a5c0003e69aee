"""Lowering: a core-ATen graph from torch.export -> an aotrt Program.

Every value of the graph becomes a `TView`: a view (element offset, sizes, strides, dtype)
of one `Buf` (an arena intermediate, an input, an output or a constant).

- View ops (view, permute, expand, slice, select, split, diagonal, as_strided, ...) make new
  TViews of the same Buf, computed from the base's real layout (never copies; a view of a
  view is one view of the root). A reshape that no layout allows reads a row-major copy.
- Compute nodes write a fresh Buf laid out as their meta['val'] strides (elementwise ops keep
  their input's layout, and later `view` nodes rely on it), or straight into a consumer's
  memory: their slot of a `cat` result (also through a split whose pieces are consecutive
  cat inputs, and through reshape/permute views), or the region of an in-place
  `slice_scatter`/`index_put`. A cat input that is not written in place is copied into its
  slot.
- Functional scatters (slice/select/diagonal_scatter, index_put) mutate their base in place
  when no older alias of its Buf is read later; otherwise they write a copy.
- Pointwise and reduction nodes go to aotrt.exporter.fuse (partition + build_kernel, which
  sees the views' real strides); GEMMs, convolution, attention, topk (and sort, as a topk
  of the whole dim), pooling and nearest upsampling become library instructions
  (aotrt.runtime.ops).
- Batch norm (eval) folds into the convolution before it; subgraphs of constants fold into
  program constants (growing a constant only up to `fold_limit` elements).
- Outputs own their memory: a whole row-major arena Buf becomes the output root; anything
  else (inputs, constants, views, repeated values) is copied.
- Anything unsupported raises Unsupported naming the op and the model's source line,
  before any instruction is made. Arena Bufs are planned by ProgramBuilder (export/plan.py)
  from the instruction order.
"""

from __future__ import annotations

import heapq
import logging
import math
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.export.graph_signature import InputKind, OutputKind

from aotrt import dtypes
from aotrt.errors import AotrtError, InvalidArgument, Unsupported
from aotrt.exporter import fuse, layout
from aotrt.kernels import ir
from aotrt.exporter.builder import ProgramBuilder
from aotrt.program import Program
from aotrt.runtime.tensor import contiguous_strides, is_packed

log = logging.getLogger(__name__)

aten = torch.ops.aten

TORCH_DTYPES: dict[torch.dtype, str] = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8",
    torch.uint8: "uint8", torch.bool: "bool",
}

def _ops(*names: str) -> frozenset[Any]:
    """The aten overloads named 'packet.overload' that this torch has (2.11 .. 2.14)."""
    out = set()
    for name in names:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(aten, packet, None), overload, None)
        if op is not None:
            out.add(op)
    return frozenset(out)


#: ops that check or annotate and compute nothing
NOOPS = _ops("_assert_tensor_metadata.default", "_assert_scalar.default",
             "sym_constrain_range_for_size.default", "sym_constrain_range.default",
             "_assert_async.msg", "_assert_async.default")

#: view ops with a single result, lowered by `_view_of`
VIEW_OPS = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
    aten.expand.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
    aten.squeeze.default, aten.slice.Tensor, aten.select.int, aten.t.default,
    aten.transpose.int, aten.alias.default, aten.detach.default, aten.as_strided.default,
    aten.unfold.default, aten.lift_fresh_copy.default, aten.narrow.default,
    aten.diagonal.default,
})

#: view ops with a list of results (picked by getitem)
MULTI_VIEW_OPS = frozenset({
    aten.split_with_sizes.default, aten.split.Tensor, aten.unbind.int,
})

#: views a producer's layout can be chosen through (see Lowering._inverse_view)
INVERTIBLE_VIEWS = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
    aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
    aten.t.default, aten.transpose.int, aten.alias.default, aten.detach.default,
})

CAT_OPS = frozenset({aten.cat.default})

#: ops that read only their input's shape and dtype, never its values
SHAPE_ONLY_OPS = frozenset({
    aten.full_like.default, aten.zeros_like.default, aten.ones_like.default,
    aten.empty_like.default,
})
#: functional "write src into a view of base" ops, lowered in place when base is dead after
SCATTER_OPS = frozenset({aten.slice_scatter.default, aten.select_scatter.default,
                         aten.diagonal_scatter.default})
INDEX_PUT_OPS = frozenset({aten.index_put.default})
COPY_OPS = frozenset({aten.clone.default, aten.copy.default})

BN_NO_TRAINING = aten._native_batch_norm_legit_no_training.default


# ---------------------------------------------------------------------------------------------
# buffers and views


class Buf:
    """One memory root: an arena intermediate, or an input / output / constant of the program.

    Compared by identity: two Bufs never share bytes except through the arena plan.
    """

    __slots__ = ("nbytes", "kind", "index", "label")

    def __init__(self, nbytes: int, kind: str = "arena", index: int = -1, label: str = "") -> None:
        self.nbytes = nbytes
        self.kind = kind
        self.index = index
        self.label = label

    def __repr__(self) -> str:
        return f"<Buf {self.kind}{self.index if self.index >= 0 else ''} {self.label} " \
               f"{self.nbytes}B>"


@dataclass(frozen=True)
class TView:
    """A view of a Buf: element offset (in `dtype` units), sizes, strides and dtype."""

    buf: Buf
    offset: int
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return dtypes.as_dtype(self.dtype).itemsize

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.sizes)

    def span(self) -> tuple[int, int]:
        """[lo, hi) element offsets from the Buf's start that the view touches."""
        if self.numel == 0:
            return self.offset, self.offset
        hi = sum((n - 1) * s for n, s in zip(self.sizes, self.strides) if n > 1)
        return self.offset, self.offset + hi + 1

    def byte_span(self) -> tuple[int, int]:
        """[lo, hi) bytes from the Buf's start."""
        lo, hi = self.span()
        return lo * self.itemsize, hi * self.itemsize

    def with_layout(self, offset: int, sizes: Sequence[int], strides: Sequence[int]) -> "TView":
        """Another view of the same Buf."""
        return TView(self.buf, int(offset), tuple(int(s) for s in sizes),
                     tuple(int(s) for s in strides), self.dtype)


def is_row_major(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """C-contiguous, ignoring strides of size-1 dims."""
    expect = 1
    for n, s in zip(reversed(sizes), reversed(strides)):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


def is_injective(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """True when no two indices of the layout reach the same element (gaps allowed)."""
    if math.prod(sizes) == 0:
        return True
    dims = sorted((s, n) for n, s in zip(sizes, strides) if n > 1)
    reach = 0
    for s, n in dims:
        if s < 0 or s <= reach:
            return False
        reach += (n - 1) * s
    return True


def view_strides(old_sizes: Sequence[int], old_strides: Sequence[int],
                 new_sizes: Sequence[int]) -> tuple[int, ...] | None:
    """Strides that let `new_sizes` view a tensor of (old_sizes, old_strides), or None.

    ATen's computeStride: dims are walked in chunks that are contiguous with each other.
    """
    numel = math.prod(old_sizes)
    if numel == 0 or len(old_sizes) == 0:
        return contiguous_strides(new_sizes) if math.prod(new_sizes) == numel else None
    new_strides = [0] * len(new_sizes)
    view_d = len(new_sizes) - 1
    chunk_base = old_strides[-1]
    tensor_numel = 1
    view_numel = 1
    for tensor_d in range(len(old_sizes) - 1, -1, -1):
        tensor_numel *= old_sizes[tensor_d]
        if tensor_d == 0 or (old_sizes[tensor_d - 1] != 1 and
                             old_strides[tensor_d - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or new_sizes[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base
                view_numel *= new_sizes[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base = old_strides[tensor_d - 1]
                tensor_numel = 1
                view_numel = 1
    if view_d != -1:
        return None
    return tuple(new_strides)


def _wrap(dim: int, ndim: int) -> int:
    nd = max(ndim, 1)
    if not -nd <= dim < nd:
        raise InvalidArgument(f"dim {dim} out of range for {ndim} dims")
    return dim % nd


def slice_view(tv: TView, dim: int, start: Any, end: Any, step: int = 1) -> TView:
    """tv[..., start:end:step, ...] along `dim` (aten.slice.Tensor's clamping)."""
    dim = _wrap(dim, len(tv.sizes))
    n = tv.sizes[dim]
    start = 0 if start is None else int(start)
    end = n if end is None else int(end)
    if start < 0:
        start += n
    if end < 0:
        end += n
    start = min(max(start, 0), n)
    end = min(max(end, start), n)
    length = (end - start + step - 1) // step
    sizes = list(tv.sizes)
    strides = list(tv.strides)
    sizes[dim] = length
    offset = tv.offset + start * strides[dim]
    strides[dim] *= step
    return tv.with_layout(offset, sizes, strides)


def select_view(tv: TView, dim: int, index: int) -> TView:
    """tv.select(dim, index)."""
    dim = _wrap(dim, len(tv.sizes))
    n = tv.sizes[dim]
    if index < 0:
        index += n
    if not 0 <= index < n:
        raise InvalidArgument(f"select: index {index} out of range for size {n}")
    sizes = list(tv.sizes)
    strides = list(tv.strides)
    offset = tv.offset + index * strides[dim]
    del sizes[dim], strides[dim]
    return tv.with_layout(offset, sizes, strides)


def diagonal_view(tv: TView, offset: int = 0, dim1: int = 0, dim2: int = 1) -> TView:
    """tv.diagonal(offset, dim1, dim2): the diagonal becomes the last dim."""
    nd = len(tv.sizes)
    d1, d2 = _wrap(dim1, nd), _wrap(dim2, nd)
    if d1 == d2:
        raise InvalidArgument("diagonal: dim1 and dim2 must differ")
    n1, n2 = tv.sizes[d1], tv.sizes[d2]
    s1, s2 = tv.strides[d1], tv.strides[d2]
    if offset >= 0:
        length = max(0, min(n1, n2 - offset))
        start = tv.offset + (offset * s2 if length else 0)
    else:
        length = max(0, min(n1 + offset, n2))
        start = tv.offset + (-offset * s1 if length else 0)
    keep = [i for i in range(nd) if i not in (d1, d2)]
    return tv.with_layout(start, [tv.sizes[i] for i in keep] + [length],
                          [tv.strides[i] for i in keep] + [s1 + s2])


def narrow_view(tv: TView, dim: int, start: int, length: int) -> TView:
    """tv.narrow(dim, start, length)."""
    return slice_view(tv, dim, start, start + length)


# ---------------------------------------------------------------------------------------------
# source lines

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
    """The printable name of a node's target."""
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return str(t)
    return getattr(t, "__name__", str(t))


def unsupported(node: torch.fx.Node, why: str = "") -> Unsupported:
    """An Unsupported error naming the op and the user's source line."""
    msg = f"{describe(node)}: not supported by aotrt"
    return Unsupported(f"{msg}: {why}" if why else msg)


# ---------------------------------------------------------------------------------------------
# small helpers on nodes


def meta_val(node: Any) -> Any:
    """node.meta['val'] for an fx Node, else the value itself (python scalars)."""
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def dtype_name(dt: torch.dtype, node: torch.fx.Node | None = None) -> str:
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


def _copy_is_alias(node: torch.fx.Node) -> bool:
    """A clone/copy whose result has its source's dtype, shape and layout shares its memory.

    Nothing in a functional graph writes either one afterwards; in-place scatters check
    every alias of a buffer before they mutate it.
    """
    val = node.meta.get("val")
    src = node.args[0] if node.target == aten.clone.default else node.args[1]
    sv = meta_val(src)
    if not isinstance(val, torch.Tensor) or not isinstance(sv, torch.Tensor):
        return False
    return (sv.dtype == val.dtype and tuple(sv.shape) == tuple(val.shape)
            and tuple(sv.stride()) == tuple(val.stride())
            and is_injective(tuple(val.shape), tuple(val.stride())))


def _check_index_put(node: torch.fx.Node) -> None:
    """Refuse index_put forms the scatter kernel does not implement."""
    if bool(_arg(node, 3, "accumulate", False)):
        raise unsupported(node, "index_put with accumulate=True (duplicate indices race)")
    base = tensor_meta(node.args[0])
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


def _index_put_kernel(name: str, out: TView, idx: list[TView | None], vals: TView
                      ) -> tuple[ir.Kernel | None, list[TView]]:
    """A kernel writing `vals` into `out` at advanced indices (PyTorch semantics: broadcast
    index tensors; consecutive indexed dims keep their place, others move to the front).
    Indices are wrapped (negative) and clamped, so no file can index out of bounds."""
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
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
    if adjacent:
        before = [d for d in rest if d < indexed[0]]
        after = [d for d in rest if d > indexed[-1]]
        region = [out.sizes[d] for d in before] + list(bshape) + [out.sizes[d] for d in after]
        bdims = list(range(len(before), len(before) + nb))
        dim_of = {d: i for i, d in enumerate(before)}
        dim_of.update({d: len(before) + nb + i for i, d in enumerate(after)})
    else:
        region = list(bshape) + [out.sizes[d] for d in rest]
        bdims = list(range(nb))
        dim_of = {d: nb + i for i, d in enumerate(rest)}
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
        raw = ir.cast(ir.load(i_arg, strides, t.dtype, dims), "int64")
        n = ir.Const(out.sizes[d], "int64")
        wrapped = ir.Op("where", (ir.Op("lt", (raw, ir.Const(0, "int64")), "bool"),
                                  ir.Op("add", (raw, n), "int64"), raw), "int64")
        clamped = ir.Op("minimum", (ir.Op("maximum", (wrapped, ir.Const(0, "int64")), "int64"),
                                    ir.Const(out.sizes[d] - 1, "int64")), "int64")
        coord[d] = clamped
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


class _actual_layouts:
    """Swap node.meta['val'] for meta tensors with the views' real strides, then restore."""

    def __init__(self, pairs: Sequence[tuple[torch.fx.Node, TView]]) -> None:
        self.pairs = pairs
        self.saved: list[tuple[torch.fx.Node, Any]] = []

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


# ---------------------------------------------------------------------------------------------
# instructions (kept symbolic until the end, when Bufs get their roots)


@dataclass
class Instr:
    """One instruction over TViews: op 'kernel' | 'library' | 'copy'."""

    op: str
    src: str
    kernel: ir.Kernel | None = None
    args: tuple[TView, ...] = ()
    fn: str = ""
    outs: tuple[TView | None, ...] = ()
    ins: tuple[TView | None, ...] = ()
    params: dict[str, Any] | None = None

    def views(self) -> list[TView]:
        """Every view the instruction touches."""
        return [v for v in (*self.args, *self.outs, *self.ins) if v is not None]


# ---------------------------------------------------------------------------------------------
# the lowering


class Lowering:
    """Lower one ExportedProgram (core ATen) into a Program."""

    def __init__(self, ep: torch.export.ExportedProgram, name: str = "module",
                 fold_limit: int = 1 << 16, channels_last: bool = False) -> None:
        self.ep = ep
        self.channels_last = channels_last
        self.gm = ep.graph_module
        self.graph = ep.graph
        self.name = name
        self.fold_limit = fold_limit
        self.env: dict[torch.fx.Node, Any] = {}       # node -> TView | list[TView|None]
        self.instrs: list[Instr] = []
        self.kernels: dict[str, ir.Kernel] = {}
        self.inputs: list[tuple[str, TView]] = []
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
        self._classify_placeholders()
        self._check_outputs()
        self._remove_noops()
        self._fold_batch_norms()
        self.graph.eliminate_dead_code()
        if self.channels_last:
            n = layout.propagate_channels_last(self.graph, is_pointwise)
            log.debug("channels-last: %d nodes laid out NHWC", n)
        self._propagate_constants()
        self._check_supported()
        units = self._schedule()
        for i, unit in enumerate(units):
            for n in unit:
                self.pos[n] = i
                self.unit_of[n] = unit
        for unit in units:
            self._lower_unit(unit)
        outputs = self._lower_outputs()
        return self._build(outputs)

    # -- placeholders, outputs ----------------------------------------------------------------

    def _classify_placeholders(self) -> None:
        sig = self.ep.graph_signature
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
                self._bind(node, tv)
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

    def _check_outputs(self) -> None:
        for spec in self.ep.graph_signature.output_specs:
            if spec.kind == OutputKind.USER_INPUT_MUTATION:
                raise Unsupported(f"the model mutates user input {spec.target!r} in place; "
                                  f"aotrt programs never write their inputs (clone it first)")
            if spec.kind == OutputKind.BUFFER_MUTATION:
                raise Unsupported(f"the model updates buffer {spec.target!r} in place; aotrt "
                                  f"programs never write their weights (a model in training "
                                  f"mode updates batch-norm statistics: call model.eval())")
            if spec.kind != OutputKind.USER_OUTPUT:
                raise Unsupported(f"output kind {spec.kind.name} is not supported")

    # -- graph rewrites -----------------------------------------------------------------------

    def _remove_noops(self) -> None:
        for node in list(self.graph.nodes):
            if node.op == "call_function" and node.target in NOOPS:
                if node.users:
                    node.replace_all_uses_with(None)  # pragma: no cover - asserts return None
                self.graph.erase_node(node)

    def _is_const_placeholder(self, node: Any) -> bool:
        return isinstance(node, torch.fx.Node) and node in self.placeholder_value

    def _fold_batch_norms(self) -> None:
        """conv -> [cast ->] batch norm (eval) becomes one conv with folded weight and bias."""
        for bn in list(self.graph.nodes):
            if bn.op != "call_function" or bn.target != BN_NO_TRAINING:
                continue
            self._try_fold(bn)

    def _try_fold(self, bn: torch.fx.Node) -> None:
        x, gamma, beta, mean, var = bn.args[:5]
        eps = float(bn.args[6]) if len(bn.args) > 6 else float(bn.kwargs.get("eps", 1e-5))
        users = list(bn.users)
        if any(u.target is not operator.getitem or u.args[1] != 0 for u in users):
            return
        cast = None
        conv = x
        if (isinstance(x, torch.fx.Node) and x.target == aten._to_copy.default
                and len(x.users) == 1):
            cast, conv = x, x.args[0]
        if not isinstance(conv, torch.fx.Node) or conv.target != aten.convolution.default:
            return
        if len(conv.users) != 1:
            return
        (inp, w, b, stride, padding, dilation, transposed, output_padding, groups) = conv.args
        if transposed:
            return
        params = [w, gamma, beta, mean, var] + ([b] if b is not None else [])
        if not all(p is None or self._is_const_placeholder(p) for p in params):
            return
        if gamma is None or beta is None or mean is None or var is None:
            return
        value = self.placeholder_value
        dt = value[w].dtype
        # Folded in float64, rounded once to the weights' dtype.
        wv = value[w].double()
        scale = value[gamma].double() / torch.sqrt(value[var].double() + eps)
        bias = value[b].double() if b is not None else torch.zeros_like(scale)
        new_w = (wv * scale.reshape(-1, *([1] * (wv.dim() - 1)))).to(dt)
        new_b = ((bias - value[mean].double()) * scale + value[beta].double()).to(dt)
        g = self.graph
        first = next(iter(g.nodes))
        with g.inserting_before(first):
            wn = g.placeholder(f"{w.name}_bnfold")
            bnode = g.placeholder(f"{bn.name}_bnfold_bias")
        wn.meta["val"] = w.meta["val"]
        bnode.meta["val"] = torch.empty(new_b.shape, dtype=new_b.dtype, device="meta")
        for node, value in ((wn, new_w), (bnode, new_b)):
            self.placeholder_value[node] = value
            self.const_values[node] = value
            self.placeholder_kind[node] = InputKind.CONSTANT_TENSOR
        conv.args = (inp, wn, bnode, stride, padding, dilation, transposed, output_padding,
                     groups)
        replacement = cast if cast is not None else conv
        for u in users:
            u.replace_all_uses_with(replacement)
            g.erase_node(u)
        g.erase_node(bn)
        log.debug("folded %s into %s", bn.name, conv.name)

    # -- constant propagation -----------------------------------------------------------------

    def _propagate_constants(self) -> None:
        """Evaluate nodes whose inputs are all constants (eagerly, with torch).

        Views of constants stay views. A computed constant is kept only when it is small
        (fold_limit elements), so folding never blows up the program file.
        """
        for node in self.graph.nodes:
            if node.op != "call_function" or node.target in NOOPS:
                continue
            if not isinstance(node.target, torch._ops.OpOverload) and \
                    node.target is not operator.getitem:
                continue
            if isinstance(node.target, torch._ops.OpOverload) and (
                    torch.Tag.nondeterministic_seeded in node.target.tags):
                continue
            deps = [a for a in node.all_input_nodes]
            if not all(d in self.const_values for d in deps):
                continue
            val = node.meta.get("val")
            vals = val if isinstance(val, (list, tuple)) else [val]
            if not all(isinstance(v, torch.Tensor) for v in vals):
                continue
            is_view = node.target in VIEW_OPS or node.target in MULTI_VIEW_OPS or \
                node.target is operator.getitem
            # Casts and transposes of weights fold whatever their size; growing a constant
            # (generators, broadcasts) only up to fold_limit elements.
            limit = max(self.fold_limit, sum(self.const_values[d].numel() for d in deps
                                             if isinstance(self.const_values[d], torch.Tensor)))
            if not is_view and sum(v.numel() for v in vals) > limit:
                continue
            args, kwargs = pytree.tree_map_only(
                torch.fx.Node, lambda n: self.const_values[n], (node.args, node.kwargs))
            try:
                with torch.no_grad():
                    out = node.target(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - leave it to run time
                log.debug("could not fold %s: %s", node.name, e)
                continue
            self.const_values[node] = out

    def _is_const(self, node: Any) -> bool:
        return isinstance(node, torch.fx.Node) and node in self.const_values

    # -- support check ------------------------------------------------------------------------

    def _runtime_nodes(self) -> list[torch.fx.Node]:
        """call_function nodes that run at run time (not folded away)."""
        return [n for n in self.graph.nodes
                if n.op == "call_function" and not self._is_const(n)]

    def _check_supported(self) -> None:
        for node in self.graph.nodes:
            if node.op == "placeholder" and node not in self.placeholder_kind and node.users:
                raise Unsupported(f"graph input {node.name!r} is not a user input or constant")
            if node.op == "get_attr":
                raise unsupported(node, "get_attr nodes are not supported")
        for node in self._runtime_nodes():
            self._check_node(node)

    def _check_node(self, node: torch.fx.Node) -> None:
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else [val]
        for v in vals:
            if isinstance(v, torch.Tensor):
                dtype_name(v.dtype, node)
                static_ints(v.shape, node)
        t = node.target
        if t is operator.getitem or self._is_fusible(node):
            return
        if t in VIEW_OPS or t in MULTI_VIEW_OPS or t in CAT_OPS or t in SCATTER_OPS or \
                t in COPY_OPS:
            return
        if t in INDEX_PUT_OPS:
            _check_index_put(node)
            return
        if t in LIBRARY:
            LIBRARY[t].check(self, node)
            return
        raise unsupported(node)

    # -- scheduling ---------------------------------------------------------------------------

    def _schedule(self) -> list[list[torch.fx.Node]]:
        """Units in a topological order close to the graph's: fusion groups and single nodes."""
        nodes = self._runtime_nodes()
        index = {n: i for i, n in enumerate(nodes)}
        fusible = [n for n in nodes if self._is_fusible(n)]
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

    def _is_fusible(self, node: torch.fx.Node) -> bool:
        t = node.target
        if t is operator.getitem:
            src = node.args[0]
            return not self._is_const(src) and self._is_fusible(src)
        if t in VIEW_OPS or t in MULTI_VIEW_OPS or t in CAT_OPS or t in SCATTER_OPS or \
                t in LIBRARY or t in INDEX_PUT_OPS:
            return False
        if t in COPY_OPS and _copy_is_alias(node):
            return False
        return fuse.fusible(node)

    # -- values -------------------------------------------------------------------------------

    def _bind(self, node: torch.fx.Node, value: Any) -> None:
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
        if self._is_const(node):
            return self._const_view(node)
        raise InvalidArgument(f"node {node.name} was used before it was computed")

    def _const_view(self, node: torch.fx.Node) -> TView:
        """A constant (placeholder or folded value); views of constants stay views."""
        if node in self.env:
            return self.env[node]
        t = node.target
        is_multi_view = t is operator.getitem and node.args[0].target in MULTI_VIEW_OPS
        if node.op == "call_function" and (t in VIEW_OPS or is_multi_view):
            base = node.args[0]
            if t is operator.getitem:
                parts = self._multi_view(base, self._const_view(base.args[0]))
                tv = parts[node.args[1]]
            else:
                tv = self._view_of(node, self._const_view(base))
            if tv is not None:
                self._bind(node, tv)
                return tv
        value = self.const_values[node]
        tv = self._add_constant(node.name, value, node)
        self._bind(node, tv)
        return tv

    def _add_constant(self, name: str, value: torch.Tensor, node: torch.fx.Node) -> TView:
        """A program constant holding `value`; its view keeps `value`'s layout when dense."""
        key = id(value)
        if key in self.const_tv:
            return self.const_tv[key]
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
        while cname in self.const_names:
            cname += "_"
        self.const_names.add(cname)
        k = len(self.consts)
        self.consts.append((cname, arr))
        buf = Buf(arr.nbytes, "constant", k, cname)
        tv = TView(buf, 0, sizes, out_strides, dt)
        self.const_tv[key] = tv
        return tv

    def _fresh(self, node: torch.fx.Node, val: torch.Tensor | None = None) -> TView:
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
        dest = self._dest(node)
        if dest is not None:
            return dest
        return self._fresh(node, val)

    def _dest(self, node: torch.fx.Node) -> TView | None:
        if node in self.dest_memo:
            return self.dest_memo[node]
        dest = None if self._is_const(node) else self._consumer_slot(node, via_view=False)
        self.dest_memo[node] = dest
        return dest

    def _consumer_slot(self, node: torch.fx.Node, via_view: bool) -> TView | None:
        """The view of a consumer's memory that `node`'s value can live in, or None.

        - a cat among its users: its slot of the cat's result (other users read it there);
        - its one user is an in-place slice_scatter taking it as the source: the region;
        - a split among its users whose pieces are consecutive inputs of one cat (C2f): the
          slots of all pieces (the pieces become views of the cat's result);
        - its one user is a reshape/permute-like view leading on to such a slot (Detect's
          `xi.view(b, no, -1)` into a cat): the layout that view maps onto the slot.
        """
        users = list(node.users)
        if len(users) == 1 and users[0].target in SCATTER_OPS:
            return None if via_view else self._scatter_slot(users[0], node)
        # Other readers of the value simply read it from the consumer's memory.
        for u in users:
            if u.op != "call_function" or self._is_const(u):
                continue
            slot = None
            if u.target in CAT_OPS:
                slot = self._cat_slot(u, node)
            elif u.target in INVERTIBLE_VIEWS and len(users) == 1:
                target = self._consumer_slot(u, via_view=True)
                slot = None if target is None else self._inverse_view(u, target)
            elif u.target in (aten.split_with_sizes.default, aten.split.Tensor):
                slot = self._split_slot(u, node)
            if slot is not None:
                return slot
        return None

    def _cat_slot(self, cat: torch.fx.Node, node: torch.fx.Node) -> TView | None:
        inputs = list(cat.args[0])
        if inputs.count(node) != 1:
            return None
        return self._cat_range(cat, inputs.index(node), node)

    def _cat_range(self, cat: torch.fx.Node, first: int, node: torch.fx.Node) -> TView | None:
        """The slot of `node`'s value in `cat`'s result, starting at input `first`."""
        val = tensor_meta(node)
        if val.dtype != tensor_meta(cat).dtype or val.dim() == 0:
            return None
        dim = self._cat_dim(cat)
        start = sum(self._cat_len(a, dim) for a in list(cat.args[0])[:first])
        result = self.result_view(cat)
        slot = narrow_view(result, dim, start, int(val.shape[dim]))
        if slot.sizes != tuple(val.shape):
            return None
        return slot

    def _split_slot(self, split: torch.fx.Node, node: torch.fx.Node) -> TView | None:
        vals = split.meta.get("val")
        if not isinstance(vals, (list, tuple)) or not vals:
            return None
        pieces: list[torch.fx.Node | None] = [None] * len(vals)
        for g in split.users:
            if g.target is not operator.getitem or pieces[g.args[1]] is not None:
                return None
            pieces[g.args[1]] = g
        if any(p is None for p in pieces):
            return None
        cats = {u for p in pieces for u in p.users if u.target in CAT_OPS}
        if len(cats) != 1:
            return None
        cat = cats.pop()
        inputs = list(cat.args[0])
        if any(inputs.count(p) != 1 for p in pieces):
            return None
        first = inputs.index(pieces[0])
        if [inputs.index(p) for p in pieces] != list(range(first, first + len(pieces))):
            return None
        nd = tensor_meta(node).dim()
        sdim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
        if nd == 0 or _wrap(int(sdim), nd) != self._cat_dim(cat):
            return None
        return self._cat_range(cat, first, node)

    def _inverse_view(self, view: torch.fx.Node, target: TView) -> TView | None:
        """A layout for view.args[0] such that the view op maps it exactly onto `target`."""
        src_val = tensor_meta(view.args[0])
        sizes = static_ints(src_val.shape, view)
        t = view.target
        if t in (aten.permute.default, aten.t.default, aten.transpose.int):
            nd = len(sizes)
            if t == aten.permute.default:
                dims = [_wrap(d, nd) for d in view.args[1]]
            else:
                dims = list(range(nd))
                if nd >= 2:
                    d0, d1 = (0, 1) if t == aten.t.default else (_wrap(view.args[1], nd),
                                                                  _wrap(view.args[2], nd))
                    dims[d0], dims[d1] = dims[d1], dims[d0]
            strides = [0] * nd
            for i, d in enumerate(dims):
                strides[d] = target.strides[i]
            cand = target.with_layout(target.offset, sizes, strides)
        elif t in (aten.alias.default, aten.detach.default):
            cand = target
        else:
            st = view_strides(target.sizes, target.strides, sizes)
            if st is None:
                return None
            cand = target.with_layout(target.offset, sizes, st)
        if not is_injective(cand.sizes, cand.strides) or self._view_of(view, cand) != target:
            return None
        return cand

    def _cat_dim(self, cat: torch.fx.Node) -> int:
        dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
        return _wrap(int(dim), tensor_meta(cat).dim())

    def _cat_len(self, a: Any, dim: int) -> int:
        v = meta_val(a)
        if v.dim() == 1 and v.shape[0] == 0:   # legacy empty inputs are skipped
            return 0
        return int(v.shape[dim])

    def result_view(self, node: torch.fx.Node) -> TView:
        """The memory of a cat's result (allocated once; may itself be a slot of another cat)."""
        if node not in self.result_memo:
            self.result_memo[node] = self.out_view(node)
        return self.result_memo[node]

    def _scatter_region(self, sc: torch.fx.Node, base_tv: TView) -> TView:
        """The view of `base_tv` that a scatter op writes its source into."""
        if sc.target == aten.select_scatter.default:
            return select_view(base_tv, int(_arg(sc, 2, "dim")), int(_arg(sc, 3, "index")))
        if sc.target == aten.diagonal_scatter.default:
            return diagonal_view(base_tv, int(_arg(sc, 2, "offset", 0)),
                                 int(_arg(sc, 3, "dim1", 0)), int(_arg(sc, 4, "dim2", 1)))
        step = _arg(sc, 5, "step", 1)
        return slice_view(base_tv, int(_arg(sc, 2, "dim", 0) or 0), _arg(sc, 3, "start", None),
                          _arg(sc, 4, "end", None), 1 if step is None else int(step))

    def _can_mutate(self, buf: Buf, at: float, after: float | None = None) -> bool:
        """True when no old alias of `buf` is read after position `at` (or, with `after`,
        between `after` and `at`, exclusive)."""
        if buf.kind != "arena":
            return False
        for alias in self.aliases.get(buf, []):
            for u in alias.users:
                p = self.pos.get(u, math.inf) if u.op != "output" else math.inf
                if after is None:
                    if p > at:
                        return False
                elif after < p < at or p > at:
                    return False
        return True

    def _in_place(self, sc: torch.fx.Node) -> bool:
        if sc in self.forced_in_place:
            return True
        base = sc.args[0]
        if base not in self.env:
            return False
        return self._can_mutate(self.tv(base).buf, self.pos[sc])

    def _scatter_slot(self, sc: torch.fx.Node, node: torch.fx.Node) -> TView | None:
        base, src = sc.args[0], sc.args[1]
        if src is not node or base is node or node.target in CAT_OPS:
            return None
        if base not in self.env or not isinstance(self.env[base], TView):
            return None
        base_tv = self.env[base]
        # A getitem's value is written by its source's unit.
        writer = node.args[0] if node.target is operator.getitem and \
            node.args[0] not in self.unit_of.get(node, ()) else node
        if base_tv.buf.kind != "arena" or not self._can_mutate(base_tv.buf, self.pos[sc],
                                                                  after=self.pos[writer]):
            return None
        region = self._scatter_region(sc, base_tv)
        if region.sizes != tuple(tensor_meta(node).shape):
            return None
        if not self._unit_reads_allow(writer, region):
            return None
        self.forced_in_place.add(sc)
        return region

    def _unit_reads_allow(self, node: torch.fx.Node, region: TView) -> bool:
        """Can `node`'s unit write `region` while reading its inputs from the same Buf?"""
        unit = self.unit_of[node]
        if len(unit) == 1 and node.target in LIBRARY:
            return True      # library ops read overlapping inputs through a temporary
        if node.target in INDEX_PUT_OPS:
            # Its base is copied into the region first (nothing when it is the region), and
            # overlapping values/indices are read through copies (_lower_index_put).
            base = self.env.get(node.args[0])
            return isinstance(base, TView) and (base == region or base.buf is not region.buf)
        unit_set = set(unit)
        pointwise = all(is_pointwise(n) and isinstance(n.meta.get("val"), torch.Tensor) and
                        tuple(n.meta["val"].shape) == region.sizes for n in unit)
        lo, hi = region.span()
        for n in unit:
            if n.target in SHAPE_ONLY_OPS:
                continue     # reads only the shape of its input
            for d in n.all_input_nodes:
                if d in unit_set or d not in self.env:
                    continue
                v = self.env[d]
                for t in (v if isinstance(v, list) else [v]):
                    if not isinstance(t, TView) or t.buf is not region.buf:
                        continue
                    if t == region and pointwise:
                        continue
                    a, b = t.span()
                    if a < hi and lo < b:
                        return False
        return True

    # -- lowering units -----------------------------------------------------------------------

    def _lower_unit(self, unit: list[torch.fx.Node]) -> None:
        if len(unit) > 1 or self._is_fusible(unit[0]):
            self._lower_group(unit)
            return
        node = unit[0]
        t = node.target
        if t is operator.getitem:
            val = self.env[node.args[0]]
            self._bind(node, val[node.args[1]])
        elif t in VIEW_OPS:
            base = self.tv(node.args[0])
            tv = self._view_of(node, base)
            if tv is None:
                base = self._materialize(node.args[0], base)
                tv = self._view_of(node, base)
                if tv is None:
                    raise unsupported(node, "cannot express this view")
            self._bind(node, tv)
        elif t in MULTI_VIEW_OPS:
            self._bind(node, self._multi_view(node, self.tv(node.args[0])))
        elif t in CAT_OPS:
            self._lower_cat(node)
        elif t in SCATTER_OPS:
            self._lower_scatter(node)
        elif t in INDEX_PUT_OPS:
            self._lower_index_put(node)
        elif t in COPY_OPS:
            self._lower_copy(node)
        elif t in LIBRARY:
            LIBRARY[t].lower(self, node)
        else:  # pragma: no cover - _check_supported refused it
            raise unsupported(node)

    # views

    def _view_of(self, node: torch.fx.Node, base: TView) -> TView | None:
        """The view a single-result view op makes of `base`, or None when it cannot be one."""
        t = node.target
        a = node.args
        val = tensor_meta(node)
        out_sizes = static_ints(val.shape, node)
        if t in (aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default):
            return base
        if t in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
            st = view_strides(base.sizes, base.strides, out_sizes)
            return None if st is None else base.with_layout(base.offset, out_sizes, st)
        if t == aten.permute.default:
            dims = [_wrap(d, len(base.sizes)) for d in a[1]]
            return base.with_layout(base.offset, [base.sizes[d] for d in dims],
                                    [base.strides[d] for d in dims])
        if t in (aten.t.default, aten.transpose.int):
            nd = len(base.sizes)
            if nd < 2:
                return base
            d0, d1 = (0, 1) if t == aten.t.default else (_wrap(a[1], nd), _wrap(a[2], nd))
            sizes, strides = list(base.sizes), list(base.strides)
            sizes[d0], sizes[d1] = sizes[d1], sizes[d0]
            strides[d0], strides[d1] = strides[d1], strides[d0]
            return base.with_layout(base.offset, sizes, strides)
        if t == aten.expand.default:
            nd_new = len(out_sizes)
            pad = nd_new - len(base.sizes)
            strides = []
            for i, n in enumerate(out_sizes):
                if i < pad:
                    strides.append(0)
                else:
                    bn = base.sizes[i - pad]
                    strides.append(base.strides[i - pad] if bn == n else 0)
            return base.with_layout(base.offset, out_sizes, strides)
        if t == aten.unsqueeze.default:
            nd = len(base.sizes) + 1
            d = _wrap(a[1], nd)
            sizes, strides = list(base.sizes), list(base.strides)
            st = sizes[d] * strides[d] if d < len(sizes) else 1
            sizes.insert(d, 1)
            strides.insert(d, st)
            return base.with_layout(base.offset, sizes, strides)
        if t in (aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default):
            nd = len(base.sizes)
            if t == aten.squeeze.default:
                dims = set(range(nd))
            elif t == aten.squeeze.dim:
                dims = {_wrap(a[1], nd)}
            else:
                dims = {_wrap(d, nd) for d in a[1]}
            keep = [i for i in range(nd) if not (i in dims and base.sizes[i] == 1)]
            return base.with_layout(base.offset, [base.sizes[i] for i in keep],
                                    [base.strides[i] for i in keep])
        if t == aten.slice.Tensor:
            args = list(a) + [None] * (5 - len(a))
            dim = node.kwargs.get("dim", args[1] if args[1] is not None else 0)
            start = node.kwargs.get("start", args[2])
            end = node.kwargs.get("end", args[3])
            step = node.kwargs.get("step", args[4] if args[4] is not None else 1)
            return slice_view(base, int(dim), start, end, int(step))
        if t == aten.narrow.default:
            return narrow_view(base, int(a[1]), int(a[2]), int(a[3]))
        if t == aten.select.int:
            return select_view(base, int(a[1]), int(a[2]))
        if t == aten.diagonal.default:
            return diagonal_view(base, int(_arg(node, 1, "offset", 0)),
                                 int(_arg(node, 2, "dim1", 0)), int(_arg(node, 3, "dim2", 1)))
        if t == aten.unfold.default:
            nd = len(base.sizes)
            d = _wrap(a[1], nd)
            size, step = int(a[2]), int(a[3])
            sizes, strides = list(base.sizes), list(base.strides)
            sizes[d] = (sizes[d] - size) // step + 1 if nd else 1
            st = strides[d] if nd else 1
            strides[d] = st * step
            sizes.append(size)
            strides.append(st)
            return base.with_layout(base.offset, sizes, strides)
        if t == aten.as_strided.default:
            mb = tensor_meta(node.args[0])
            if (base.sizes != tuple(mb.shape) or base.strides != tuple(mb.stride())):
                return None
            off = a[3] if len(a) > 3 and a[3] is not None else mb.storage_offset()
            origin = base.offset - mb.storage_offset()
            if origin + off < 0:
                return None
            return base.with_layout(origin + off, static_ints(a[1], node),
                                    static_ints(a[2], node))
        return None  # pragma: no cover

    def _multi_view(self, node: torch.fx.Node, base: TView) -> list[TView]:
        t = node.target
        a = node.args
        nd = len(base.sizes)
        if t == aten.unbind.int:
            dim = _wrap(a[1] if len(a) > 1 else 0, nd)
            return [select_view(base, dim, i) for i in range(base.sizes[dim])]
        dim = _wrap(a[2] if len(a) > 2 else node.kwargs.get("dim", 0), nd)
        if t == aten.split_with_sizes.default:
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

    def _materialize(self, node: torch.fx.Node, tv: TView) -> TView:
        """A row-major copy of `tv`, so that a view op can reshape it."""
        dst = self.new_buffer(tv.sizes, None, tv.dtype, node.name + "_contig")
        self.emit_copy(dst, tv, describe(node))
        return dst

    # copies

    def emit_copy(self, dst: TView, src: TView, where: str) -> None:
        """dst[...] = src (same sizes; dtypes may differ: then a cast kernel)."""
        if dst == src or dst.numel == 0:
            return
        if dst.dtype == src.dtype:
            self.instrs.append(Instr("copy", where, outs=(dst,), ins=(src,)))
            return
        name = self._kname("cast")
        k = ir.Kernel(name, dst.sizes, (), (ir.Arg(src.dtype, "r"), ir.Arg(dst.dtype, "w")),
                      (ir.store(1, dst.strides, ir.cast(ir.load(0, src.strides, src.dtype),
                                                        dst.dtype)),))
        self.emit_kernel(k, [src, dst], where)

    def _lower_copy(self, node: torch.fx.Node) -> None:
        """A clone/copy that `_copy_is_alias` let through: share the source's memory."""
        src = self.tv(node.args[0] if node.target == aten.clone.default else node.args[1])
        val = tensor_meta(node)
        if src.strides == tuple(val.stride()):
            self._bind(node, src)
            return
        dst = self.out_view(node)          # the source is not laid out as its meta said
        self.emit_copy(dst, src, describe(node))
        self._bind(node, dst)

    # cat and scatter

    def _lower_cat(self, node: torch.fx.Node) -> None:
        result = self.result_view(node)
        dim = self._cat_dim(node)
        start = 0
        for a in node.args[0]:
            n = self._cat_len(a, dim)
            if n == 0 and meta_val(a).dim() == 1:
                continue
            slot = narrow_view(result, dim, start, n)
            start += n
            src = self.tv(a)
            if src != slot:
                self.emit_copy(slot, src, describe(node))
        self._bind(node, result)

    def _lower_scatter(self, node: torch.fx.Node) -> None:
        base, src = node.args[0], node.args[1]
        base_tv = self.tv(base)
        if self._in_place(node):
            result = base_tv
        else:
            result = self.out_view(node)
            self.emit_copy(result, base_tv, describe(node))
        region = self._scatter_region(node, result)
        self.emit_copy(region, self.tv(src), describe(node))
        self._bind(node, result)

    def _lower_index_put(self, node: torch.fx.Node) -> None:
        """out = base with out[indices] = values: in place when base is dead afterwards,
        else into a copy; then one generated scatter kernel over the indexed region."""
        base, indices, values = node.args[0], list(node.args[1]), node.args[2]
        base_tv = self.tv(base)
        dest = self._dest(node)     # y[1:3, i] = v: the slice_scatter's region of y
        if dest is None and base_tv.buf.kind == "arena" and \
                self._can_mutate(base_tv.buf, self.pos[node]):
            result = base_tv
        else:
            result = dest if dest is not None else self._fresh(node)
            self.emit_copy(result, base_tv, describe(node))
        vals_tv = self.tv(values)
        idx_tvs = [None if i is None else self.tv(i) for i in indices]
        # A values/index view sharing bytes with the result is read through a copy, so the
        # scatter never reads what it already wrote.
        lo, hi = result.span()

        def detached(tv: TView, label: str) -> TView:
            a, b = tv.span()
            if tv.buf is result.buf and a < hi and lo < b:
                return self._materialize(node, tv)
            return tv
        vals_tv = detached(vals_tv, "values")
        idx_tvs = [None if t is None else detached(t, "index") for t in idx_tvs]
        kernel, args = _index_put_kernel(self._kname("index_put"), result, idx_tvs, vals_tv)
        if kernel is not None:
            self.emit_kernel(kernel, args, describe(node))
        self._bind(node, result)

    # fused groups

    def _kname(self, what: str) -> str:
        self._kcount += 1
        what = re.sub(r"[^0-9A-Za-z_]", "_", what)[:40]
        return f"k{self._kcount}_{what}"

    def emit_kernel(self, kernel: ir.Kernel, args: Sequence[TView], where: str) -> None:
        """Append a kernel instruction (args in the kernel's argument order)."""
        self.kernels[kernel.name] = kernel
        self.instrs.append(Instr("kernel", where, kernel=kernel, args=tuple(args)))

    def _lower_group(self, group: list[torch.fx.Node]) -> None:
        inputs, outputs = fuse.group_io(group)
        in_views = [self.tv(d) for d in inputs]
        out_views = [self.out_view(n) for n in outputs]
        last = group[-1]
        name = self._kname(op_name(last).replace("aten.", "").split(".")[0])
        # build_kernel indexes every view by its node's meta['val'] strides; where ours differ
        # (cat slots, constants, inputs) it sees ours for the duration of the call.
        with _actual_layouts(list(zip(inputs, in_views)) + list(zip(outputs, out_views))):
            try:
                kernel = fuse.build_kernel(name, group, inputs, outputs)
            except AotrtError:
                raise
            except Exception as e:  # a generator bug must still name the op and line
                raise unsupported(last, f"kernel generation failed: {type(e).__name__}: "
                                        f"{e}") from e
        self.emit_kernel(kernel, [*in_views, *out_views], describe(last))
        for n, v in zip(outputs, out_views):
            self._bind(n, v)

    # -- outputs ------------------------------------------------------------------------------

    def _lower_outputs(self) -> list[tuple[str, TView]]:
        out_node = next(n for n in self.graph.nodes if n.op == "output")
        flat = list(out_node.args[0])
        names = self._output_names(len(flat))
        outputs: list[tuple[str, TView]] = []
        claimed: set[Buf] = set()
        for k, (name, value) in enumerate(zip(names, flat)):
            if not isinstance(value, torch.fx.Node) or not isinstance(
                    value.meta.get("val"), torch.Tensor):
                raise Unsupported(f"output {name!r}: only tensor outputs are supported, got "
                                  f"{value!r}")
            tv = self.tv(value)
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
            self.emit_copy(dst, tv, f"output {name}")
            outputs.append((name, dst))
        return outputs

    def _output_names(self, n: int) -> list[str]:
        spec = getattr(self.ep.call_spec, "out_spec", None)
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

    # -- build --------------------------------------------------------------------------------

    def _build(self, outputs: list[tuple[str, TView]]) -> Program:
        pb = ProgramBuilder(module=self.name, provenance={"torch": torch.__version__})
        for name, tv in self.inputs:
            pb.input(name, tv.dtype, tv.sizes, tv.strides)
        for name, arr in self.consts:
            pb.constant(name, arr)
        for name, tv in outputs:
            pb.output(name, tv.dtype, tv.sizes, contiguous_strides(tv.sizes))
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

        for ins in self.instrs:
            if ins.op == "kernel":
                pb.kernel(ins.kernel, [tid(v) for v in ins.args], ins.src)
            elif ins.op == "library":
                pb.library(ins.fn, [tid(v) for v in ins.outs], [tid(v) for v in ins.ins],
                           ins.params or {}, ins.src)
            else:
                pb.copy(tid(ins.outs[0]), tid(ins.ins[0]), ins.src)
        return pb.build()


# ---------------------------------------------------------------------------------------------
# library ops


@dataclass(frozen=True)
class LibOp:
    """How one aten op becomes a library instruction."""

    fn: str
    lower: Callable[[Lowering, torch.fx.Node], None]
    check: Callable[[Lowering, torch.fx.Node], None] = lambda lw, node: None


def _arg(node: torch.fx.Node, i: int, name: str, default: Any = None) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _float_inputs(lw: Lowering, node: torch.fx.Node) -> None:
    for d in node.all_input_nodes:
        v = d.meta.get("val")
        if isinstance(v, torch.Tensor) and v.dtype not in (torch.float32, torch.float16,
                                                           torch.bfloat16):
            raise unsupported(node, f"input {d.name} has dtype {v.dtype}; only float32, "
                                    f"float16 and bfloat16 are supported")


def _conv_check(lw: Lowering, node: torch.fx.Node) -> None:
    _float_inputs(lw, node)
    if meta_val(node.args[1]).dim() not in (3, 4, 5):
        raise unsupported(node, "only 1-D, 2-D and 3-D convolutions are supported")


def _topk_check(lw: Lowering, node: torch.fx.Node) -> None:
    if meta_val(node.args[0]).dtype == torch.bool:
        raise unsupported(node, "topk of a bool tensor")


def _opt(lw: Lowering, v: Any) -> TView | None:
    return None if v is None else lw.tv(v)


def _simple(fn: str, ins: Callable[[torch.fx.Node], list[Any]],
            params: Callable[[torch.fx.Node], dict[str, Any]] = lambda n: {}) -> LibOp:
    def lower(lw: Lowering, node: torch.fx.Node) -> None:
        in_views = [_opt(lw, v) for v in ins(node)]
        out = lw.out_view(node)
        lw.instrs.append(Instr("library", describe(node), fn=fn, outs=(out,),
                               ins=tuple(in_views), params=params(node)))
        lw._bind(node, out)
    return LibOp(fn, lower, _float_inputs)


def _sdpa_check(lw: Lowering, node: torch.fx.Node) -> None:
    for d in node.args[:3]:
        v = meta_val(d)
        if not isinstance(v, torch.Tensor) or v.dtype not in (torch.float32, torch.float16,
                                                              torch.bfloat16):
            raise unsupported(node, "q, k and v must be float32, float16 or bfloat16 tensors")
    mask = _arg(node, 3, "attn_mask", None)
    if mask is not None and meta_val(mask).dtype not in (torch.bool, meta_val(node.args[0]).dtype):
        raise unsupported(node, f"attn_mask of dtype {meta_val(mask).dtype} for "
                                f"{meta_val(node.args[0]).dtype} q")
    if float(_arg(node, 4, "dropout_p", 0.0) or 0.0) != 0.0:
        raise unsupported(node, "dropout in attention is not supported (export in eval mode)")


def _sdpa_params(node: torch.fx.Node) -> dict[str, Any]:
    scale = _arg(node, 6, "scale", None)
    return {"dropout_p": 0.0, "is_causal": bool(_arg(node, 5, "is_causal", False)),
            "scale": None if scale is None else float(scale),
            "enable_gqa": bool(_arg(node, 7, "enable_gqa", False))}


def _conv_params(node: torch.fx.Node) -> dict[str, Any]:
    a = node.args
    return {"stride": list(a[3]), "padding": list(a[4]), "dilation": list(a[5]),
            "transposed": bool(a[6]), "output_padding": list(a[7]), "groups": int(a[8])}


def _lower_multi(fn: str, params: Callable[[torch.fx.Node], dict[str, Any]],
                 optional_second: bool) -> Callable[[Lowering, torch.fx.Node], None]:
    """Ops with two results (values + indices), picked by getitem."""
    def lower(lw: Lowering, node: torch.fx.Node) -> None:
        vals = node.meta["val"]
        picks: dict[int, torch.fx.Node] = {}
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
                outs.append(lw._fresh(node, v))
            else:
                outs.append(lw.out_view(user, v))
        out_list = [o for o in outs if o is not None]
        lw.instrs.append(Instr("library", describe(node), fn=fn, outs=tuple(out_list),
                               ins=(lw.tv(node.args[0]),), params=params(node)))
        lw._bind(node, outs)
    return lower


def _topk_params(node: torch.fx.Node) -> dict[str, Any]:
    return {"k": int(_arg(node, 1, "k")), "dim": int(_arg(node, 2, "dim", -1)),
            "largest": bool(_arg(node, 3, "largest", True)),
            "sorted": bool(_arg(node, 4, "sorted", True))}


def _sort_params(node: torch.fx.Node) -> dict[str, Any]:
    """aten.sort as the topk library op with k = the dim's size. The runtime's topk is a
    stable sort on every device (ties in ascending index order, NaN largest), which is
    torch.sort(stable=True) ascending and descending; for stable=False torch leaves the order
    of ties unspecified, and the stable order is one of its valid answers."""
    x = meta_val(node.args[0])
    if node.target == aten.sort.stable:
        dim, descending = node.kwargs.get("dim", -1), node.kwargs.get("descending", False)
    else:
        dim, descending = _arg(node, 1, "dim", -1), _arg(node, 2, "descending", False)
    dim = int(dim)
    k = x.shape[dim] if x.dim() else 1
    return {"k": int(k), "dim": dim, "largest": bool(descending), "sorted": True}


def _sort_check(lw: Lowering, node: torch.fx.Node) -> None:
    if meta_val(node.args[0]).dtype == torch.bool:
        raise unsupported(node, "sort of a bool tensor")


def _pool_params(node: torch.fx.Node) -> dict[str, Any]:
    def ints(v: Any) -> list[int]:
        return [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)]
    return {"kernel_size": ints(_arg(node, 1, "kernel_size")),
            "stride": ints(_arg(node, 2, "stride", []) or []),
            "padding": ints(_arg(node, 3, "padding", 0)),
            "dilation": ints(_arg(node, 4, "dilation", 1)),
            "ceil_mode": bool(_arg(node, 5, "ceil_mode", False))}


def _upsample_params(node: torch.fx.Node) -> dict[str, Any]:
    if node.target == aten.upsample_nearest2d.vec:
        size = _arg(node, 1, "output_size", None)
        scales = _arg(node, 2, "scale_factors", None)
        return {"output_size": None if size is None else [int(s) for s in size],
                "scale_factors": None if scales is None else [float(s) for s in scales]}
    size = _arg(node, 1, "output_size")
    sh, sw = _arg(node, 2, "scales_h", None), _arg(node, 3, "scales_w", None)
    # NOTE: aten's scales_h/scales_w are already output/input factors, like .vec's.
    scales = None if sh is None or sw is None else [float(sh), float(sw)]
    return {"output_size": [int(s) for s in size], "scale_factors": scales}


def _upsample_check(lw: Lowering, node: torch.fx.Node) -> None:
    _float_inputs(lw, node)
    if node.target == aten.upsample_nearest2d.default:
        sh, sw = _arg(node, 2, "scales_h", None), _arg(node, 3, "scales_w", None)
        if (sh is None) != (sw is None):
            raise unsupported(node, "only one of scales_h / scales_w given")


def _linear_ins(n: torch.fx.Node) -> list[Any]:
    return [n.args[0], n.args[1], _arg(n, 2, "bias", None)]


LIBRARY: dict[Any, LibOp] = {
    aten.mm.default: _simple("mm", lambda n: [n.args[0], n.args[1]]),
    aten.bmm.default: _simple("bmm", lambda n: [n.args[0], n.args[1]]),
    aten.addmm.default: _simple(
        "addmm", lambda n: [n.args[0], n.args[1], n.args[2]],
        lambda n: {"beta": float(_arg(n, 3, "beta", 1)), "alpha": float(_arg(n, 4, "alpha", 1))}),
    aten.linear.default: _simple("linear", _linear_ins),
    aten.convolution.default: LibOp("convolution", _simple(
        "convolution", lambda n: [n.args[0], n.args[1], n.args[2]], _conv_params).lower,
        _conv_check),
    aten.scaled_dot_product_attention.default: LibOp(
            "sdpa", _simple("sdpa", lambda n: [n.args[0], n.args[1], n.args[2],
                                           _arg(n, 3, "attn_mask", None)],
                        _sdpa_params).lower, _sdpa_check),
    aten.topk.default: LibOp("topk", _lower_multi("topk", _topk_params, False), _topk_check),
    aten.sort.default: LibOp("topk", _lower_multi("topk", _sort_params, False), _sort_check),
    aten.sort.stable: LibOp("topk", _lower_multi("topk", _sort_params, False), _sort_check),
    aten.max_pool2d_with_indices.default: LibOp(
        "max_pool2d", _lower_multi("max_pool2d", _pool_params, True), _float_inputs),
    aten.upsample_nearest2d.vec: LibOp(
        "upsample_nearest2d", _simple("upsample_nearest2d", lambda n: [n.args[0]],
                                      _upsample_params).lower, _upsample_check),
    aten.upsample_nearest2d.default: LibOp(
        "upsample_nearest2d", _simple("upsample_nearest2d", lambda n: [n.args[0]],
                                      _upsample_params).lower, _upsample_check),
}


def runs_whole(node: torch.fx.Node) -> bool:
    """True when the lowering can run `node` as it is (capture decomposes the others
    further where torch knows how)."""
    t = node.target
    if node.op != "call_function" or t is operator.getitem or t in NOOPS:
        return True
    if t in VIEW_OPS or t in MULTI_VIEW_OPS or t in CAT_OPS or t in SCATTER_OPS or \
            t in COPY_OPS:
        return True
    try:
        if t in INDEX_PUT_OPS:
            _check_index_put(node)
            return True
        if t in LIBRARY:
            LIBRARY[t].check(None, node)  # type: ignore[arg-type]
            return True
        return fuse.fusible(node)
    except Exception:  # noqa: BLE001 - anything odd: let decomposition have a go
        return False


def lower(ep: torch.export.ExportedProgram, name: str = "module",
          channels_last: bool = False) -> Program:
    """Lower a decomposed ExportedProgram into a validated Program (`channels_last`: lay
    2-D convolution activations out NHWC, aotrt/exporter/layout.py)."""
    return Lowering(ep, name, channels_last=channels_last).run()
