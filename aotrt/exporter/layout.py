"""Activation layouts chosen at export: channels-last for convolution networks (2-D, and
1-D as N, L, C).

cuDNN's convolution engines work in NHWC; fed NCHW activations it transposes around every
convolution (half of ResNet-50's GPU time on the H200, issue #9). Two parts:
- the module is traced as a channels-last copy, so its convolution weights become KRSC
  (1-D: KSC) constants (the lowering keeps a constant's dense layout);
- `propagate_channels_last` then gives 1-D and 2-D convolution results, and what
  elementwise ops and pooling compute from them, channels-last meta strides before the
  lowering lays out buffers. Whisper's two 1-D convolutions were 6 cuDNN layout
  transposes per run on the H200 (21 us); their NLC result is also the (L, C) token order
  the encoder permutes it into, so that permute becomes free. torch's own propagation
  cannot be relied on: on the H200 (torch 2.11, cuda), a channels-last module traced on
  channels-last inputs still came out with every activation NCHW (0 of ResNet-50's 53
  convolutions), where torch 2.14 on cpu gives NHWC.
The program's inputs keep row-major specs, so callers still pass NCHW tensors.
"""

from __future__ import annotations

import copy
import itertools
import operator
from typing import Any, Callable

import torch

from aotrt.errors import InvalidArgument
from aotrt.exporter.epilogue import is_conv

aten = torch.ops.aten

#: the layouts `aotrt.export(..., layout=...)` takes
LAYOUTS = ("auto", "channels_last", "contiguous")


def has_conv(model: torch.nn.Module) -> bool:
    """True when the module holds a 1-D or 2-D convolution."""
    return any(isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d)) for m in model.modules())


def model_dtype(model: torch.nn.Module) -> str:
    """The dtype name of the module's first floating parameter or buffer ("float32" if
    none): the dtype its convolutions run in."""
    for t in itertools.chain(model.parameters(), model.buffers()):
        if t.is_floating_point():
            return str(t.dtype).removeprefix("torch.")
    return "float32"


def auto_channels_last(model: torch.nn.Module) -> bool:
    """"auto": channels-last for a model with 1-D or 2-D convolutions when the default device
    (the one `aotrt.load` picks here) prefers it in the model's dtype: cuda in half types
    (cuDNN's tensor-core engines), cpu in every dtype (oneDNN, whose NCHW path copies every
    activation into its blocked layout and back); either program runs correctly on either
    device."""
    from aotrt.runtime.device import default_device, get_device

    return (has_conv(model)
            and get_device(default_device()).prefers_channels_last(model_dtype(model)))


def for_layout(model: Any, layout: str) -> tuple[Any, bool]:
    """The module to trace for `layout` and whether to lower it channels-last: a
    channels-last copy (for "auto", see `auto_channels_last`) or the caller's own module,
    which is never changed."""
    if layout not in LAYOUTS:
        raise InvalidArgument(f"layout: expected one of {list(LAYOUTS)}, got {layout!r}")
    if not isinstance(model, torch.nn.Module) or layout == "contiguous":
        return model, False
    if layout == "auto" and not auto_channels_last(model):
        return model, False
    return _channels_last_copy(model), True


def _channels_last_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy whose 4-D parameters and buffers, and 1-D convolutions' weights, are stored
    channels-last. Module.to(memory_format=...) refuses modules with 5-D ones (timm's lambda
    layers), which keep their layout here. Other 3-D parameters (position embeddings) keep
    theirs: the kernels that read them want it."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        for t in itertools.chain(m.parameters(), m.buffers()):
            if t.dim() == 4:
                t.data = t.data.contiguous(memory_format=torch.channels_last)
        for mod in m.modules():
            if isinstance(mod, torch.nn.Conv1d) and mod.weight.dim() == 3:
                w = mod.weight
                w.data = w.data.transpose(1, 2).contiguous().transpose(1, 2)
    return m


def channels_last_strides(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of an (N, C, H, W) tensor stored N, H, W, C (and of (N, C, L) stored
    N, L, C)."""
    if len(sizes) == 3:
        n, c, l_ = sizes
        return (l_ * c, 1, c)
    n, c, h, w = sizes
    return (h * w * c, 1, w * c, c)


_POOLS = (aten.max_pool2d_with_indices.default, aten.upsample_nearest2d.vec,
          aten.upsample_nearest2d.default)
# A concatenation of channels-last activations (YOLO's C2f and neck) left NCHW made every
# convolution after it read NCHW: 28 of YOLOv8n's 64 convolutions on torch 2.11 (cuda),
# whose trace keeps every activation NCHW, each one a cuDNN `nchwToNhwc` on the H200.
_CATS = (aten.cat.default,)


def propagate_channels_last(graph: torch.fx.Graph,
                            is_pointwise: Callable[[torch.fx.Node], bool]) -> int:
    """Give 1-D and 2-D convolution results channels-last meta strides, and the same to the
    results of elementwise ops, pooling, upsampling and concatenations that read one of
    them; returns how many nodes changed. Views, reductions and everything else keep
    torch's layout (the lowering derives views from their base's real layout and copies
    where none fits)."""
    marked: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        t = node.target
        if is_conv(node):
            w = node.args[1].meta.get("val") if isinstance(node.args[1], torch.fx.Node) else None
            take = (isinstance(w, torch.Tensor) and w.dim() in (3, 4) and not node.args[6])
        elif t in _POOLS or is_pointwise(node) or _elementwise(node) or t in _CATS:
            take = any(a in marked for a in node.all_input_nodes[:1 if t in _POOLS else None])
        elif t is operator.getitem:
            take = node.args[0] in marked
        else:
            take = False
        if take and _relayout(node):
            marked.add(node)
    return len(marked)


def _row_reductions() -> dict[Any, int | None]:
    """Ops that reduce rows, each with the index of its dim argument (None: always the last
    dims, as LayerNorm)."""
    ops: dict[Any, int | None] = {aten.layer_norm.default: None,
                                  aten.native_layer_norm.default: None,
                                  aten._softmax.default: 1, aten.softmax.int: 1,
                                  aten._log_softmax.default: 1, aten.log_softmax.int: 1}
    for name in ("rms_norm", "_fused_rms_norm"):
        op = getattr(aten, name, None)
        if op is not None:
            ops[op.default] = None
    return ops


def row_major_for_row_reductions(graph: torch.fx.Graph,
                                 is_pointwise: Callable[[torch.fx.Node], bool]) -> int:
    """Give elementwise results that a LayerNorm or a softmax over their last dim reads
    row-major meta strides, where torch's propagation left them permuted; returns how many
    nodes changed. Whisper's encoder permutes its convolution output, and every residual
    add after it kept that (1, 384, 1500) order: each add + LayerNorm kernel then read its
    rows with a stride of 1500 elements (19 us each on the H200, 7 per run, against 3 us
    for torch.compile's, which lays out its intermediates itself). Program outputs keep
    torch's layout."""
    reductions = _row_reductions()
    changed = 0
    for node in graph.nodes:
        if node.op != "call_function" or not (is_pointwise(node) or _elementwise(node)):
            continue
        val = node.meta.get("val")
        if (not isinstance(val, torch.Tensor) or val.dim() < 2 or val.numel() == 0
                or val.is_contiguous() or not _dense(val)
                or any(u.op == "output" for u in node.users)):
            continue
        if not any(_reads_rows(u, node, reductions) for u in node.users):
            continue
        node.meta["val"] = torch.empty(tuple(val.shape), dtype=val.dtype, device="meta")
        changed += 1
    return changed


_SAME_SHAPE_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default,
                     aten.alias.default)


def _head_merges(node: torch.fx.Node, found: list[torch.fx.Node]) -> bool:
    """True when every reader of `node` (4-D) swaps dims 1 and 2, directly or after views
    that keep its shape (Whisper reshapes to the same shape first); the nodes on the way,
    swaps last, go to `found`."""
    if not node.users:
        return False
    shape = tuple(node.meta["val"].shape)
    for u in node.users:
        if u.op != "call_function" or not u.args or u.args[0] is not node:
            return False
        uv = u.meta.get("val")
        if u.target in _SAME_SHAPE_VIEWS and isinstance(uv, torch.Tensor) \
                and tuple(uv.shape) == shape:
            found.append(u)
            if not _head_merges(u, found):
                return False
        elif (u.target == aten.transpose.int and len(u.args) == 3 and
              {d % 4 for d in u.args[1:] if isinstance(d, int)} == {1, 2}) or \
                (u.target == aten.permute.default and len(u.args) == 2 and
                 [d % 4 for d in u.args[1] if isinstance(d, int)] == [0, 2, 1, 3]):
            found.append(u)
        else:
            return False
    return True


def heads_merged_by_attention(graph: torch.fx.Graph) -> int:
    """Lay out attention results (B, H, L, D) as (B, L, H, D) where every reader swaps heads
    and tokens back (the head merge before the output projection), so that the merge is a
    view and its `.contiguous()` no copy; returns how many attention results changed. The
    attention ops write by strides (cuDNN's flash attention on cuda, a strided store on
    cpu). BERT, GPT-2 and Whisper merged heads with one copy kernel per layer."""
    changed = 0
    for node in graph.nodes:
        if node.op != "call_function" or node.target != aten.scaled_dot_product_attention.default:
            continue
        val = node.meta.get("val")
        found: list[torch.fx.Node] = []
        if (not isinstance(val, torch.Tensor) or val.dim() != 4 or val.numel() == 0
                or not val.is_contiguous() or not _head_merges(node, found)):
            continue
        b, h, l_, d = val.shape
        merged = (l_ * h * d, d, h * d, 1)
        for n in (node, *found):
            v = n.meta["val"]
            if n.target in (aten.transpose.int, aten.permute.default):
                n.meta["val"] = torch.empty(tuple(v.shape), dtype=v.dtype, device="meta")
            else:
                n.meta["val"] = torch.empty_strided(tuple(v.shape), merged, dtype=v.dtype,
                                                    device="meta")
        changed += 1
    return changed


def _dense(t: torch.Tensor) -> bool:
    """True when `t` covers its memory exactly once, in some order of its dims."""
    dims = sorted((st, n) for n, st in zip(t.shape, t.stride()) if n != 1)
    acc = 1
    for st, n in dims:
        if st != acc:
            return False
        acc *= n
    return True


def _reads_rows(user: torch.fx.Node, node: torch.fx.Node, ops: dict[Any, int | None]) -> bool:
    """True when `user` normalizes `node` over its last dim."""
    if user.op != "call_function" or user.target not in ops or not user.args \
            or user.args[0] is not node:
        return False
    k = ops[user.target]
    if k is None:
        return True
    ndim = node.meta["val"].dim()
    dim = user.args[k] if len(user.args) > k else user.kwargs.get("dim", -1)
    return isinstance(dim, int) and dim % ndim == ndim - 1


def _elementwise(node: torch.fx.Node) -> bool:
    """True for ops the lowering's own table lowers elementwise. torch leaves the pointwise
    tag off some (hardswish, _to_copy, where.Scalar*, rsub), and a cast or a hardswish
    between two convolutions must not turn the activations back to NCHW (MobileNetV3; YOLO
    at fp16 on torch 2.11, whose traced SiLU went through a cast)."""
    from aotrt.exporter.optable import OPS

    opdef = OPS.get(node.target)
    return opdef is not None and opdef.kind == "pointwise"


def _relayout(node: torch.fx.Node) -> bool:
    """Swap a node's 3-D or 4-D floating meta value(s) for channels-last ones; False if it
    has none to swap."""
    val = node.meta.get("val")

    def cl(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.dim() in (3, 4) and v.numel() > 0:
            return torch.empty_strided(tuple(v.shape), channels_last_strides(tuple(v.shape)),
                                       dtype=v.dtype, device="meta")
        return v
    if isinstance(val, torch.Tensor):
        if val.dim() not in (3, 4) or not val.is_floating_point() or val.numel() == 0:
            return False
        node.meta["val"] = cl(val)
        return True
    if isinstance(val, (tuple, list)) and val and isinstance(val[0], torch.Tensor):
        node.meta["val"] = type(val)(cl(v) for v in val)
        return True
    return False


__all__ = ["LAYOUTS", "auto_channels_last", "channels_last_strides", "for_layout", "has_conv",
           "heads_merged_by_attention",
           "model_dtype", "propagate_channels_last", "row_major_for_row_reductions"]
