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
    convolution         outs [out]             ins [x, w, bias|None(, residual|None)]
                                                   params stride, padding, dilation,
                                                   transposed, output_padding, groups,
                                                   activation ("none", "relu", "relu6", "silu"):
                                                   out = act(conv + bias + residual)
    sdpa                outs [out]             ins [q, k, v, mask|None] params dropout_p,
                                                   is_causal, scale, enable_gqa
    topk                outs [values, indices] ins [x]                params k, dim, largest,
                                                                             sorted
    max_pool2d          outs [out] or [out, indices]  ins [x]         params kernel_size,
                                                   stride, padding, dilation, ceil_mode
    upsample_nearest2d  outs [out]             ins [x]                params output_size,
                                                                             scale_factors
    linear_wq           outs [out]             ins [x, qweight, scales, zeros|None, bias|None]
                                                   params bits (4, 8), group_size: weight-only
                                                   quantized linear (ops/linear_wq.py)

Params are JSON values (ints, floats, bools, lists, null); defaults follow aten. Unknown
param names and wrong list lengths are refused with InvalidArgument.

Load-time checks: `check(fn, outs, ins, params) -> OpCost` validates a call from metadata
alone (`TensorMeta`: dtype name, sizes, strides), through the same per-op `check_<op>`
function the op itself runs before recording (so both refuse with the same message), and
returns its cost on the cpu implementation: elementary steps (`work`, with PY_STEP per
python-level loop iteration) and the bytes of numpy temporaries (`scratch_bytes`), in exact
python ints. Geometry params above int32 are refused; outputs whose elements alias (a zero
stride over several elements) are refused. Every op writes all of its outputs.

Devices: each backend registers its implementation of an op for its device class
(`ops.register(CpuDevice, "convolution", make)`, done by backends/cpu/device.py and
backends/cuda/device.py when they are imported), and `_common.launch` finds it from the
stream's device with the op's validated arguments; the cpu makers live in
`backends/cpu/ops/<op>.py`, the cuda ones in `backends/cuda/ops/<op>.py`, and a device
without one raises Unsupported. Every implementation must give an output that overlaps an
input the result computed from the input's old values: the exporter writes results in place
over memory they read (tests/runtime/ops pins this down on every device).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from aotrt.errors import InvalidArgument, Unsupported
from aotrt.program import library
from aotrt.runtime.ops._common import OpCost, TensorMeta, register, view_of
from aotrt.runtime.ops.conv import check_convolution, convolution
from aotrt.runtime.ops.linear_wq import check_linear_wq, linear_wq
from aotrt.runtime.ops.mm import addmm, bmm, check_addmm, check_bmm, check_linear, check_mm, \
    linear, mm
from aotrt.runtime.ops.pool import check_max_pool2d, max_pool2d
from aotrt.runtime.ops.sdpa import check_sdpa, sdpa
from aotrt.runtime.ops.topk import check_topk, topk
from aotrt.runtime.ops.upsample import check_upsample_nearest2d, upsample_nearest2d

OpFn = Callable[..., int]
# (fn, outs, ins, params) -> the op's positional and keyword arguments after the stream.
_Bind = Callable[[list, list, dict], tuple[list, dict]]


@dataclass(frozen=True)
class _Spec:
    """One library op: its argument counts, param names, run and metadata-check functions."""

    name: str
    run: OpFn
    validate: Callable[..., tuple[Any, OpCost]]
    bind: _Bind
    n_outs: tuple[int, ...]
    n_ins: int
    optional_ins: tuple[int, ...] = ()
    params: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    #: how many of the last inputs may be left out of the list altogether
    omissible: int = 0


def _check_call(spec: _Spec, outs: Any, ins: Any, kw: Mapping[str, Any]) -> None:
    """Counts of outs and ins, absent inputs and param names, for both paths."""
    name = spec.name
    if not isinstance(outs, (list, tuple)) or len(outs) not in spec.n_outs:
        want = " or ".join(str(n) for n in spec.n_outs)
        raise InvalidArgument(f"{name}: outs: expected a list of {want} handles, got "
                              f"{outs!r}")
    lo = spec.n_ins - spec.omissible
    if not isinstance(ins, (list, tuple)) or not lo <= len(ins) <= spec.n_ins:
        want = f"{lo} to {spec.n_ins}" if lo < spec.n_ins else str(spec.n_ins)
        raise InvalidArgument(f"{name}: ins: expected a list of {want} inputs, got {ins!r}")
    for i, h in enumerate(ins):
        if h is None and i not in spec.optional_ins:
            raise InvalidArgument(f"{name}: ins[{i}]: this input is required")
    for i, h in enumerate(outs):
        if h is None:
            raise InvalidArgument(f"{name}: outs[{i}]: an output handle is required")
    if not isinstance(kw, Mapping) or not all(isinstance(k, str) for k in kw):
        raise InvalidArgument(f"{name}: params: expected a mapping of names, got {kw!r}")
    allowed = frozenset(spec.params) | frozenset(spec.required)
    unknown = sorted(set(kw) - allowed)
    if unknown:
        raise InvalidArgument(f"{name}: params: unknown {unknown}; known {sorted(allowed)}")
    missing = [p for p in spec.required if p not in kw]
    if missing:
        raise InvalidArgument(f"{name}: params: {missing} required")


def _adapter(spec: _Spec) -> OpFn:
    """Wrap `spec.run(stream, ...)` into the uniform instruction convention."""

    def call(stream: Any, outs: Sequence[Any], ins: Sequence[Any], **kw: Any) -> int:
        _check_call(spec, outs, ins, kw)
        args, kwargs = spec.bind(list(outs), list(ins), dict(kw))
        return spec.run(stream, *args, **kwargs)

    call.__name__ = spec.name
    call.__doc__ = f"Uniform-convention adapter of aotrt.runtime.ops {spec.name}."
    return call


def _plain(o: list, i: list, kw: dict) -> tuple[list, dict]:
    return [o[0], *i], kw


def _bind_conv(o: list, i: list, kw: dict) -> tuple[list, dict]:
    return [o[0], i[0], i[1], i[2]], dict(kw, residual=i[3] if len(i) > 3 else None)


def _bind_sdpa(o: list, i: list, kw: dict) -> tuple[list, dict]:
    return [o[0], i[0], i[1], i[2]], dict(kw, attn_mask=i[3])


def _bind_topk(o: list, i: list, kw: dict) -> tuple[list, dict]:
    return [o[0], o[1], i[0]], kw


def _bind_pool(o: list, i: list, kw: dict) -> tuple[list, dict]:
    return [o[0], i[0]], dict(kw, indices_out=o[1] if len(o) > 1 else None)


_SPECS: dict[str, _Spec] = {s.name: s for s in (
    _Spec("mm", mm, check_mm, _plain, (1,), 2),
    _Spec("bmm", bmm, check_bmm, _plain, (1,), 2),
    _Spec("addmm", addmm, check_addmm, _plain, (1,), 3, params=("beta", "alpha")),
    _Spec("linear", linear, check_linear, _plain, (1,), 3, (2,)),
    _Spec("convolution", convolution, check_convolution, _bind_conv, (1,), 4, (2, 3),
          ("stride", "padding", "dilation", "transposed", "output_padding", "groups",
           "activation"), omissible=1),
    _Spec("sdpa", sdpa, check_sdpa, _bind_sdpa, (1,), 4, (3,),
          ("dropout_p", "is_causal", "scale", "enable_gqa")),
    _Spec("topk", topk, check_topk, _bind_topk, (2,), 1, (), ("dim", "largest", "sorted"),
          ("k",)),
    _Spec("max_pool2d", max_pool2d, check_max_pool2d, _bind_pool, (1, 2), 1, (),
          ("stride", "padding", "dilation", "ceil_mode"), ("kernel_size",)),
    _Spec("upsample_nearest2d", upsample_nearest2d, check_upsample_nearest2d, _plain, (1,), 1,
          (), ("output_size", "scale_factors")),
    _Spec("linear_wq", linear_wq, check_linear_wq, _plain, (1,), 5, (3, 4), ("group_size",),
          ("bits",)),
)}

SCRATCH_OVERHEAD = 4096

#: every library op's param names (the program file's error paths name them as params)
PARAM_NAMES: frozenset[str] = frozenset(
    p for spec in _SPECS.values() for p in (*spec.params, *spec.required))

OPS: dict[str, OpFn] = {name: _adapter(spec) for name, spec in _SPECS.items()}


def check(fn: str, outs: Sequence[TensorMeta], ins: Sequence[TensorMeta | None],
          params: Mapping[str, Any]) -> OpCost:
    """Validate a library op call from metadata alone, as the op does at call time.

    Unknown `fn`: Unsupported. Bad counts, params, dtypes or shapes: InvalidArgument naming
    the field (Unsupported for a dtype or feature the ops do not implement). Returns the
    cost of one call on the cpu implementation.
    """
    spec = _SPECS.get(fn) if isinstance(fn, str) else None
    if spec is None:
        raise Unsupported(f"library op {fn!r} is not in this runtime (known: {sorted(_SPECS)})")
    _check_call(spec, outs, ins, params)
    o = [view_of(fn, m, f"outs[{i}]") for i, m in enumerate(outs)]
    i_ = [None if m is None else view_of(fn, m, f"ins[{j}]") for j, m in enumerate(ins)]
    args, kwargs = spec.bind(o, i_, dict(params))
    _, cost = spec.validate(*args, **kwargs)
    # Nothing runs for outputs without elements (launch records nothing).
    if all(v.numel == 0 for v in o):
        return OpCost(0, 0)
    # numpy array headers and small index vectors of any call.
    return OpCost(cost.work, cost.scratch_bytes + SCRATCH_OVERHEAD)


# The program's validator checks library instructions through these (aotrt/program/library.py).
library.register(library.Signatures(check=check, meta=TensorMeta, param_names=PARAM_NAMES))

__all__ = ["OPS", "OpCost", "PARAM_NAMES", "TensorMeta", "check", "mm", "bmm", "addmm", "linear",
           "convolution", "sdpa", "topk", "max_pool2d", "upsample_nearest2d", "linear_wq",
           "register"]
