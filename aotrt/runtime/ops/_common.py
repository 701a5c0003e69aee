"""Shared validation and launch helpers of the library ops.

Every op validates all of its arguments before it records anything, so a refused call
leaves the stream, the handles and the memory exactly as they were. Each op then records
ONE command whose accesses name every view it reads and writes; the work itself comes from
the implementation its device's backend registered for the op (`register`, called by the
device modules when they are imported: cpu, the make_* functions of backends/cpu/ops/<op>.py; cuda,
those of backends/cuda/ops/<op>.py), so no op asks a device for its name.
"""

from __future__ import annotations

import contextlib

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from aotrt import dtypes
from aotrt.dtypes import DType
from aotrt.errors import InvalidArgument, Unsupported
from aotrt.runtime.device import Stream
from aotrt.runtime.hazards import Access
from aotrt.runtime.tensor import Handle, check_live, views_meet

FLOATS: tuple[DType, ...] = (dtypes.float32, dtypes.float16, dtypes.bfloat16)
INTS: tuple[DType, ...] = (dtypes.int64, dtypes.int32, dtypes.int16, dtypes.int8, dtypes.uint8)
F32 = np.dtype(np.float32)

# Scratch per step of a chunked cpu op; bounds temporaries without many python iterations.
CHUNK_BYTES = 32 << 20

# Geometry params (kernel sizes, strides, padding, dilation) must fit int32: the cuda kernels
# and cuDNN take them as int, and larger values only describe windows no tensor can hold.
MAX_GEOMETRY = (1 << 31) - 1

# Work units charged per python-level loop iteration of a cpu implementation (a numpy call
# on a small block costs about a microsecond, a thousand elementary steps).
PY_STEP = 1000

# More dims than numpy supports (64) cannot be viewed on the cpu device.
MAX_DIMS = 64


@dataclass(frozen=True)
class TensorMeta:
    """A tensor as a program file describes it: dtype name, sizes and strides (elements)."""

    dtype: str
    sizes: tuple[int, ...]
    strides: tuple[int, ...]


@dataclass(frozen=True)
class OpCost:
    """Cost of one call on the cpu implementation: elementary steps and scratch bytes."""

    work: int
    scratch_bytes: int


class View:
    """Metadata with the attributes the op validators read (a Handle has the same ones)."""

    __slots__ = ("dtype", "sizes", "strides")

    def __init__(self, dtype: DType, sizes: tuple[int, ...], strides: tuple[int, ...]) -> None:
        self.dtype = dtype
        self.sizes = sizes
        self.strides = strides

    @property
    def ndim(self) -> int:
        """Number of dims."""
        return len(self.sizes)

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.sizes)

    def __repr__(self) -> str:
        return f"View({self.dtype.name}, {list(self.sizes)}, {list(self.strides)})"


_DTYPE_BY_NAME = {d.name: d for d in dtypes.ALL}


def _meta_ints(op: str, value: Any, name: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)):
        raise InvalidArgument(f"{op}: {name}: expected a list of ints, got {value!r}")
    if len(value) > MAX_DIMS:
        raise InvalidArgument(f"{op}: {name}: {len(value)} dims, at most {MAX_DIMS} supported")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise InvalidArgument(f"{op}: {name}[{i}]: expected an integer, got {v!r}")
    return tuple(int(v) for v in value)


def view_of(op: str, meta: Any, name: str) -> View:
    """The validator's View of a TensorMeta, refusing a malformed one (InvalidArgument)."""
    if not isinstance(meta, TensorMeta):
        raise InvalidArgument(f"{op}: {name}: expected a TensorMeta, got {meta!r}")
    if not isinstance(meta.dtype, str):
        raise InvalidArgument(f"{op}: {name}: dtype: expected a name, got {meta.dtype!r}")
    dt = _DTYPE_BY_NAME.get(meta.dtype)
    if dt is None:
        raise InvalidArgument(f"{op}: {name}: dtype: unknown dtype {meta.dtype!r}")
    sizes = _meta_ints(op, meta.sizes, f"{name}: sizes")
    strides = _meta_ints(op, meta.strides, f"{name}: strides")
    if len(strides) != len(sizes):
        raise InvalidArgument(f"{op}: {name}: {len(sizes)} sizes but {len(strides)} strides")
    if any(n < 0 for n in sizes):
        raise InvalidArgument(f"{op}: {name}: sizes must be >= 0, got {list(sizes)}")
    return View(dt, sizes, strides)


def check_output(op: str, h: Any, name: str) -> None:
    """Refuse an output with a zero stride over several elements (torch's internal-overlap
    rule): its elements alias one another, so what the op writes there is ambiguous."""
    if h.numel > 1 and any(n > 1 and s == 0 for n, s in zip(h.sizes, h.strides)):
        raise InvalidArgument(f"{op}: {name}: output sizes {list(h.sizes)} strides "
                              f"{list(h.strides)} have a zero stride (elements alias)")


def check_handles(op: str, stream: Any, named: Sequence[tuple[Any, str]]) -> Stream:
    """The open stream and every named handle live on its device (None entries skipped)."""
    stream = check_stream(op, stream)
    for h, name in named:
        if h is not None:
            check_tensor(op, stream, h, name)
    return stream


def check_stream(op: str, stream: Any) -> Stream:
    """The stream, which must be an open Stream."""
    if not isinstance(stream, Stream):
        raise InvalidArgument(f"{op}: stream: expected a Stream, got {type(stream).__name__}")
    if stream.closed:
        raise InvalidArgument(f"{op}: stream: {stream!r} is closed")
    return stream


def check_tensor(op: str, stream: Stream, h: Any, name: str) -> Handle:
    """A live handle on the stream's device."""
    try:
        check_live(h, name)
    except InvalidArgument as e:
        raise InvalidArgument(f"{op}: {e}") from None
    if h.device is not stream.device:
        raise InvalidArgument(f"{op}: {name}: handle is on {h.device.name}, the stream on "
                              f"{stream.device.name}")
    return h


def check_dtype(op: str, h: Handle, name: str, allowed: Sequence[DType] = FLOATS) -> DType:
    """Refuse (Unsupported) a dtype this op does not implement."""
    if h.dtype not in allowed:
        names = ", ".join(d.name for d in allowed)
        raise Unsupported(f"{op}: {name}: dtype {h.dtype.name} is not supported (supported: "
                          f"{names})")
    return h.dtype


def check_same_dtype(op: str, ref: Handle, ref_name: str, h: Handle, name: str) -> None:
    """Refuse a handle whose dtype differs from `ref`'s."""
    if h.dtype is not ref.dtype:
        raise InvalidArgument(f"{op}: {name}: dtype {h.dtype.name} does not match {ref_name}'s "
                              f"{ref.dtype.name}")


def check_rank(op: str, h: Handle, name: str, ranks: Sequence[int]) -> None:
    """Refuse a handle whose rank is not one of `ranks`."""
    if h.ndim not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise InvalidArgument(f"{op}: {name}: expected a {want}-D tensor, got {h.ndim}-D "
                              f"{list(h.sizes)}")


def check_shape(op: str, h: Handle, name: str, shape: Sequence[int]) -> None:
    """Refuse a handle (an output) whose sizes are not exactly `shape`."""
    if tuple(h.sizes) != tuple(shape):
        raise InvalidArgument(f"{op}: {name}: expected sizes {list(shape)}, got "
                              f"{list(h.sizes)}")


def as_int(op: str, value: Any, name: str) -> int:
    """An integer parameter (bool refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgument(f"{op}: {name}: expected an integer, got {value!r}")
    return int(value)


def as_bool(op: str, value: Any, name: str) -> bool:
    """A boolean parameter (0/1 accepted, as JSON writers sometimes emit them)."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise InvalidArgument(f"{op}: {name}: expected a bool, got {value!r}")


def as_float(op: str, value: Any, name: str) -> float:
    """A real scalar parameter (bool refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgument(f"{op}: {name}: expected a number, got {value!r}")
    try:
        return float(value)
    except OverflowError:
        raise InvalidArgument(f"{op}: {name}: {value!r} does not fit a float") from None


def as_ints(op: str, value: Any, name: str, n: int, default: int | None = None,
            minimum: int | None = None, maximum: int = MAX_GEOMETRY) -> tuple[int, ...]:
    """`n` ints from an int, a 1-element list (repeated) or an n-element list.

    An empty list (or None) takes `default` when there is one, as aten's convolution and
    pooling do for stride and friends. Values above `maximum` are refused.
    """
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        if default is None:
            raise InvalidArgument(f"{op}: {name}: a value is required")
        return (default,) * n
    if isinstance(value, (list, tuple)):
        vals = [as_int(op, v, f"{name}[{i}]") for i, v in enumerate(value)]
        if len(vals) == 1:
            vals = vals * n
        if len(vals) != n:
            raise InvalidArgument(f"{op}: {name}: expected 1 or {n} values, got {list(value)}")
    else:
        vals = [as_int(op, value, name)] * n
    if minimum is not None:
        for v in vals:
            if v < minimum:
                raise InvalidArgument(f"{op}: {name}: values must be >= {minimum}, got {vals}")
    for v in vals:
        if v > maximum:
            raise InvalidArgument(f"{op}: {name}: values must be <= {maximum}, got {vals}")
    return tuple(vals)


def broadcast_shape(op: str, shapes: Sequence[tuple[int, ...]], what: str) -> tuple[int, ...]:
    """numpy/torch broadcasting of `shapes`, refusing incompatible ones."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise InvalidArgument(f"{op}: {what}: shapes {[list(s) for s in shapes]} do not "
                              f"broadcast") from None


def overlaps(a: Handle, b: Handle) -> bool:
    """True when two views of one allocation may share a byte (exact for views laid out
    alike, such as channel slices of one concatenation: `tensor.views_meet`)."""
    return views_meet(a, b)


# implementation key -> device class -> maker of the work. Backends fill it when their device
# module is imported (a device exists only once its module is), so an op never imports one.
_IMPLS: dict[str, dict[type, Callable[..., Any]]] = {}


def register(device_type: type, impl: str, make: Callable[..., Any]) -> None:
    """Make `make(*args)` the work of implementation key `impl` on `device_type` devices."""
    _IMPLS.setdefault(impl, {})[device_type] = make


def implementation(impl: str, device: Any) -> Callable[..., Any] | None:
    """The maker registered for `impl` on the device's class or its nearest base, or None."""
    table = _IMPLS.get(impl, {})
    for cls in type(device).__mro__:
        make = table.get(cls)
        if make is not None:
            return make
    return None


def launch(op: str, stream: Stream, outs: Sequence[Handle | None],
           ins: Sequence[Handle | None], impl: str, *args: Any) -> int:
    """Record one command of `op`: reads of `ins`, writes of `outs`, work from `impl`.

    The maker registered for `impl` on the stream's device returns the device work of
    `make(*args)`. A command whose outputs have no elements does nothing, so nothing is
    recorded and the stream's last sequence number is returned. The caller has validated
    everything; the maker may still refuse (Unsupported).
    """
    live_outs = [h for h in outs if h is not None]
    if all(h.numel == 0 for h in live_outs):
        return stream.recorded_seq
    make = implementation(impl, stream.device)
    if make is None:
        raise Unsupported(f"{op}: not implemented on the {stream.device.name} device yet")
    work = make(*args)
    accesses: list[Access] = []
    for h in ins:
        if h is not None and h.alloc is not None and h.numel:
            accesses.append(h.access(write=False))
    for h in live_outs:
        if h.alloc is not None:
            accesses.append(h.access(write=True))
    return stream.record(accesses, work, op)


# -- cpu helpers (numpy) ------------------------------------------------------------------------

def blas_scope(dnnl: Any) -> Callable[[], Any]:
    """What a cpu work wraps its numpy GEMMs in, given the device's oneDNN state (None:
    none): its `numpy_blas` (one BLAS thread where the GEMMs run on oneDNN's pool), else a
    no-op; decided at load."""
    if dnnl is None or not dnnl.gemm_pool:
        return contextlib.nullcontext
    return dnnl.numpy_blas


def load_f32(arr: np.ndarray) -> np.ndarray:
    """The values as float32 (a view when already float32)."""
    return arr if arr.dtype == F32 else arr.astype(F32)


def store(dst: np.ndarray, value: np.ndarray) -> None:
    """Write `value` into the (possibly strided) view `dst`, rounding to its dtype."""
    if value.dtype != dst.dtype:
        value = value.astype(dst.dtype)
    np.copyto(dst, value, casting="unsafe")


def detach_inputs(outs: Sequence[Handle | None], ins: Sequence[Handle | None],
                  arrays: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
    """Copy each input array that shares bytes with an output, so that writing the output
    piecewise cannot change what is read later in the same command."""
    res = []
    for h, arr in zip(ins, arrays):
        if h is not None and arr is not None and any(
                o is not None and overlaps(o, h) for o in outs):
            arr = np.array(arr, copy=True)
        res.append(arr)
    return res


def rows_per_chunk(row_bytes: int, total: int) -> int:
    """How many rows of `row_bytes` scratch fit in CHUNK_BYTES (at least 1)."""
    return max(1, min(total, CHUNK_BYTES // max(row_bytes, 1)))

