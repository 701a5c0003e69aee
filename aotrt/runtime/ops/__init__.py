"""Library ops: GEMMs, convolution, attention, topk, pooling and upsampling.

Each op takes the stream explicitly and caller-provided output Handles, validates every
argument (InvalidArgument naming it; Unsupported for a dtype or feature not implemented),
records ONE command on the stream that reads its inputs and writes its outputs in place at
their offsets (non-packed outputs included), and returns the command's sequence number.
An op whose outputs have no elements records nothing. Ops allocate no result memory; the
cpu implementations use numpy temporaries as scratch, so an output that shares bytes with
an input is still computed from the input's old values.

The exporter's interpreter calls them through `OPS`, one uniform convention:

    OPS[name](stream, outs: list[Handle], ins: list[Handle | None], **params) -> int

with, per name (None marks an absent optional input):

    mm                  outs [out]             ins [a, b]
    bmm                 outs [out]             ins [a, b]
    addmm               outs [out]             ins [bias, a, b]       params beta, alpha
    linear              outs [out]             ins [x, w, bias|None]
    convolution         outs [out]             ins [x, w, bias|None]  params stride, padding,
                                                   dilation, transposed, output_padding, groups
    sdpa                outs [out]             ins [q, k, v, mask|None] params dropout_p,
                                                   is_causal, scale, enable_gqa
    topk                outs [values, indices] ins [x]                params k, dim, largest,
                                                                             sorted
    max_pool2d          outs [out] or [out, indices]  ins [x]         params kernel_size,
                                                   stride, padding, dilation, ceil_mode
    upsample_nearest2d  outs [out]             ins [x]                params output_size,
                                                                             scale_factors

Params are JSON values (ints, floats, bools, lists, null); defaults follow aten. Unknown
param names and wrong list lengths are refused with InvalidArgument.

Devices: each op file keeps a table `{device name: make_work}` that `_common.launch`
consults with the op's validated arguments; the cpu entry builds a closure for the stream's
worker thread, the cuda entries live in `cuda/` (one file per op), and a device without an
entry raises Unsupported. Every implementation must give an output that overlaps an input
the result computed from the input's old values: the exporter writes results in place over
memory they read (tests/runtime/ops pins this down on every device).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from aotrt.errors import InvalidArgument
from aotrt.runtime.ops.conv import convolution
from aotrt.runtime.ops.mm import addmm, bmm, linear, mm
from aotrt.runtime.ops.pool import max_pool2d
from aotrt.runtime.ops.sdpa import sdpa
from aotrt.runtime.ops.topk import topk
from aotrt.runtime.ops.upsample import upsample_nearest2d

OpFn = Callable[..., int]


def _adapter(name: str, fn: OpFn, n_outs: Sequence[int], n_ins: int,
             optional_ins: Sequence[int], params: Sequence[str],
             required: Sequence[str] = ()) -> OpFn:
    """Wrap `fn(stream, *outs, *ins, **params)` into the uniform instruction convention."""
    allowed = frozenset(params) | frozenset(required)

    def call(stream: Any, outs: Sequence[Any], ins: Sequence[Any], **kw: Any) -> int:
        if not isinstance(outs, (list, tuple)) or len(outs) not in n_outs:
            want = " or ".join(str(n) for n in n_outs)
            raise InvalidArgument(f"{name}: outs: expected a list of {want} handles, got "
                                  f"{outs!r}")
        if not isinstance(ins, (list, tuple)) or len(ins) != n_ins:
            raise InvalidArgument(f"{name}: ins: expected a list of {n_ins} inputs, got "
                                  f"{ins!r}")
        for i, h in enumerate(ins):
            if h is None and i not in optional_ins:
                raise InvalidArgument(f"{name}: ins[{i}]: this input is required")
        for i, h in enumerate(outs):
            if h is None:
                raise InvalidArgument(f"{name}: outs[{i}]: an output handle is required")
        unknown = sorted(set(kw) - allowed)
        if unknown:
            raise InvalidArgument(f"{name}: params: unknown {unknown}; known "
                                  f"{sorted(allowed)}")
        missing = [p for p in required if p not in kw]
        if missing:
            raise InvalidArgument(f"{name}: params: {missing} required")
        return _CALLS[name](fn, stream, list(outs), list(ins), kw)

    call.__name__ = name
    call.__doc__ = f"Uniform-convention adapter of aotrt.runtime.ops {name}."
    return call


def _pool_call(fn: OpFn, stream: Any, outs: list, ins: list, kw: dict) -> int:
    return fn(stream, outs[0], ins[0], indices_out=outs[1] if len(outs) > 1 else None, **kw)


_CALLS: dict[str, Callable[[OpFn, Any, list, list, dict], int]] = {
    "mm": lambda fn, s, o, i, kw: fn(s, o[0], *i, **kw),
    "bmm": lambda fn, s, o, i, kw: fn(s, o[0], *i, **kw),
    "addmm": lambda fn, s, o, i, kw: fn(s, o[0], *i, **kw),
    "linear": lambda fn, s, o, i, kw: fn(s, o[0], *i, **kw),
    "convolution": lambda fn, s, o, i, kw: fn(s, o[0], *i, **kw),
    "sdpa": lambda fn, s, o, i, kw: fn(s, o[0], i[0], i[1], i[2], attn_mask=i[3], **kw),
    "topk": lambda fn, s, o, i, kw: fn(s, o[0], o[1], i[0], **kw),
    "max_pool2d": _pool_call,
    "upsample_nearest2d": lambda fn, s, o, i, kw: fn(s, o[0], i[0], **kw),
}

OPS: dict[str, OpFn] = {
    "mm": _adapter("mm", mm, (1,), 2, (), ()),
    "bmm": _adapter("bmm", bmm, (1,), 2, (), ()),
    "addmm": _adapter("addmm", addmm, (1,), 3, (), ("beta", "alpha")),
    "linear": _adapter("linear", linear, (1,), 3, (2,), ()),
    "convolution": _adapter("convolution", convolution, (1,), 3, (2,),
                            ("stride", "padding", "dilation", "transposed", "output_padding",
                             "groups")),
    "sdpa": _adapter("sdpa", sdpa, (1,), 4, (3,),
                     ("dropout_p", "is_causal", "scale", "enable_gqa")),
    "topk": _adapter("topk", topk, (2,), 1, (), ("dim", "largest", "sorted"), ("k",)),
    "max_pool2d": _adapter("max_pool2d", max_pool2d, (1, 2), 1, (),
                           ("stride", "padding", "dilation", "ceil_mode"), ("kernel_size",)),
    "upsample_nearest2d": _adapter("upsample_nearest2d", upsample_nearest2d, (1,), 1, (),
                                   ("output_size", "scale_factors")),
}

__all__ = ["OPS", "mm", "bmm", "addmm", "linear", "convolution", "sdpa", "topk",
           "max_pool2d", "upsample_nearest2d"]
