"""Caller tensors: how each input, or `out=` tensor, of a run is checked against its spec
and becomes a root of the program: bound where it lies ("handle", "blob"), staged through a
copy ("stage"), or nothing to bind ("empty"). A Delegate holds one Arguments; its outputs
are bound through it by runtime/outputs.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from aotrt import dtypes
from aotrt.dtypes import DType
from aotrt.errors import InvalidArgument
from aotrt.program.records import SpecRecord
from aotrt.program.strides import extent
from aotrt.runtime import dlpack, shims
from aotrt.runtime.device import Device, Stream
from aotrt.runtime.memory import Allocation
from aotrt.runtime.public import Tensor
from aotrt.runtime.tensor import Handle

#: the kinds of caller tensor bound where they lie (no copy)
BOUND = frozenset(("handle", "blob", "empty"))


@dataclass
class Arg:
    """One caller tensor, classified: how its memory becomes a root of the program."""

    what: str
    spec: SpecRecord
    kind: str                      # "handle" | "blob" | "stage" | "empty"
    handle: Handle | None = None   # an aotrt.Tensor's view (kind handle, or stage source)
    ptr: int = 0                   # element 0 on the delegate's device (kind blob)
    array: np.ndarray | None = None  # host memory (stage source/target)
    foreign: Any = None            # an imported DLPack tensor to stage through (device memory)
    keep: list = field(default_factory=list)
    span: tuple[int, int] | None = None   # absolute bytes, for overlap checks


class Arguments:
    """Checks and classifies one delegate's caller tensors against its input/output specs."""

    def __init__(self, device: Device, stream: Stream, inputs: list[SpecRecord],
                 outputs: list[SpecRecord], name: str) -> None:
        self.device = device
        self.stream = stream
        self.inputs = inputs
        self.outputs = outputs
        self.name = name
        self._whats = [f"input {k} '{spec.name}'" for k, spec in enumerate(inputs)]
        # Per input, what a host array bound where it lies has: (numpy dtype, shape, byte
        # strides); None where the spec has no such array (empty, or not dense ascending).
        self._plain: list[tuple[Any, tuple, tuple] | None] = [
            (spec.dtype.np, spec.shape, tuple(st * spec.dtype.itemsize for st in spec.strides))
            if device.host_addressable and spec.nbytes and all(st > 0 for st in spec.strides)
            else None for spec in inputs]

    def classify_inputs(self, inputs: Sequence[Any]) -> list[Arg]:
        """Every input of one run, checked and classified (their count checked already).

        A host array of exactly the spec's dtype, shape and strides takes a short check:
        run() spends most of its Python time where the caches are cold after the last run
        (a full classify took 90-180 us there against 9 hot, MobileNet-v2, 2 cores)."""
        args = []
        for x, spec, what, plain in zip(inputs, self.inputs, self._whats, self._plain):
            if (plain is not None and type(x) is np.ndarray and x.dtype == plain[0]
                    and x.shape == plain[1] and x.strides == plain[2] and x.flags.aligned):
                ptr = x.__array_interface__["data"][0]
                args.append(Arg(what, spec, "blob", ptr=ptr, array=x, keep=[x],
                                span=(ptr, ptr + spec.nbytes)))
            else:
                args.append(self.classify(x, spec, what, False))
        return args

    def classify_out(self, out: Any, args: list[Arg]) -> list[Arg] | None:
        """The `out=` tensors of one run, checked and classified (None: no out=)."""
        if out is None:
            return None
        if not isinstance(out, (tuple, list)):
            if len(self.outputs) != 1:
                raise InvalidArgument(f"out: expected a tuple of {len(self.outputs)} tensors, "
                                      f"got {type(out).__name__}")
            out = (out,)
        if len(out) != len(self.outputs):
            raise InvalidArgument(f"out: {self.name} has {len(self.outputs)} outputs, got "
                                  f"{len(out)} out tensors")
        outs = [self.classify(o, spec, f"out {k} '{spec.name}'", True)
                for k, (o, spec) in enumerate(zip(out, self.outputs))]
        for k, o in enumerate(outs):
            if o.span is None:
                continue
            for j, other in enumerate(outs[:k]):
                if other.span is not None and overlap(o.span, other.span):
                    raise InvalidArgument(f"{o.what}: shares memory with {other.what}")
            if o.kind != "stage" and any(a.span is not None and overlap(o.span, a.span)
                                         for a in args):
                # Written while inputs are still read: compute apart, then copy in.
                o.kind = "stage"
        return outs

    def classify(self, x: Any, spec: SpecRecord, what: str, writes: bool) -> Arg:
        """Check one caller tensor against its spec and decide how to bind it."""
        dev = self.device
        if isinstance(x, Tensor):
            if x.released:
                raise InvalidArgument(f"{what}: the aotrt.Tensor was released")
            h = x.handle
            check_meta(what, spec, h.dtype, h.sizes)
            if h.device is not dev:
                raise InvalidArgument(f"{what}: tensor is on {h.device.name}, the delegate on "
                                      f"{dev.name}")
            lo, hi = h.byte_range()
            span = (h.alloc.ptr + lo, h.alloc.ptr + hi) if h.alloc is not None and hi > lo else None
            kind = "handle" if spec.layout_matches(h.strides) else "stage"
            return Arg(what, spec, kind if spec.nbytes else "empty", handle=h, keep=[x],
                        span=span)
        if isinstance(x, np.generic) and not writes:
            x = np.asarray(x)       # a numpy scalar: a 0-d input
        if isinstance(x, np.ndarray):
            return self._host(x, spec, what, writes, [])
        if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
            try:
                dev_type = x.__dlpack_device__()[0]
            except Exception as e:  # noqa: BLE001 - a foreign object's failure, reported
                raise InvalidArgument(f"{what}: __dlpack_device__ failed: {e}") from None
            if dev_type == dlpack.CPU:
                try:
                    arr = np.from_dlpack(x)
                    keep: list = [x]
                except (BufferError, TypeError, RuntimeError, ValueError):
                    # numpy lacks some dtypes (bfloat16): take the capsule ourselves.
                    imp = dlpack.from_dlpack(x)
                    arr = host_view(imp)
                    keep = [x, imp]
                return self._host(arr, spec, what, writes, keep)
            # The producer orders its pending work before our stream (DLPack's stream rule;
            # 1 is CUDA's legacy default stream, which must not be passed as 0).
            handle = getattr(self.stream, "handle", None)
            stream_arg = None if handle is None else (int(handle) or 1)
            imp = dlpack.from_dlpack(x, stream=stream_arg)
            return self._device(imp, x, spec, what)
        raise InvalidArgument(f"{what}: expected a numpy array, an aotrt.Tensor or a "
                              f"__dlpack__ tensor, got {type(x).__name__}")

    def _host(self, arr: np.ndarray, spec: SpecRecord, what: str, writes: bool,
                       keep: list) -> Arg:
        try:
            dt = dtypes.as_dtype(arr.dtype)
        except InvalidArgument:
            raise InvalidArgument(f"{what}: expected dtype {spec.dtype.name}, got unsupported "
                                  f"{arr.dtype}") from None
        check_meta(what, spec, dt, arr.shape)
        if writes and not arr.flags.writeable:
            raise InvalidArgument(f"{what}: the array is read-only")
        keep = [*keep, arr]
        if not spec.nbytes:
            return Arg(what, spec, "empty", keep=keep)
        isz = dt.itemsize
        lo, hi = np.lib.array_utils.byte_bounds(arr) if hasattr(np.lib, "array_utils") else \
            np.byte_bounds(arr)
        strides = [s // isz if s % isz == 0 else None for s in arr.strides]
        direct = (self.device.host_addressable and arr.flags.aligned and None not in strides
                  and spec.layout_matches(strides))
        ptr = arr.__array_interface__["data"][0]
        if direct:
            return Arg(what, spec, "blob", ptr=ptr, array=arr, keep=keep, span=(lo, hi))
        return Arg(what, spec, "stage", array=arr, keep=keep, span=(lo, hi))

    def _device(self, imp: dlpack.Imported, x: Any, spec: SpecRecord, what: str) -> Arg:
        check_meta(what, spec, imp.dtype, imp.shape)
        if dlpack.DEVICE_TYPES.get(imp.device) != self.device.dlpack_type or imp.device_id != 0:
            raise InvalidArgument(f"{what}: tensor is on {imp.device}:{imp.device_id}, the "
                                  f"delegate on {self.device.name}")
        if not spec.nbytes:
            return Arg(what, spec, "empty", keep=[x, imp])
        lo = imp.ptr + min(0, sum((n - 1) * s for n, s in zip(imp.shape, imp.strides)
                                  if s < 0)) * imp.dtype.itemsize
        hi = imp.ptr + extent(imp.shape, [abs(s) for s in imp.strides], imp.dtype.itemsize)[1]
        if spec.layout_matches(imp.strides):
            return Arg(what, spec, "blob", ptr=imp.ptr, keep=[x, imp], span=(lo, hi))
        return Arg(what, spec, "stage", foreign=imp, keep=[x, imp], span=(lo, hi))

    # -- binding ------------------------------------------------------------------------------

    def bind(self, a: Arg, temps: list[Handle], output: bool) -> Handle:
        """The uint8 base handle of one caller tensor's root (bound, or staged); every handle
        made goes to `temps`."""
        dev, u8, spec = self.device, dtypes.uint8, a.spec
        if a.kind == "empty":
            base = shims.create_tensor_from_blob(0, [0], [1], 0, u8, dev)
        elif a.kind == "handle":
            base = shims.reinterpret_tensor(a.handle, [spec.nbytes], [1], 0, dtype=u8)
        elif a.kind == "blob":
            try:
                base = shims.create_tensor_from_blob(a.ptr, [spec.nbytes], [1], 0, u8, dev)
            except InvalidArgument:
                if a.array is None or output:
                    raise
                # Partly overlapping memory the runtime already knows: read a copy instead.
                a.kind = "stage"
                return self.bind(a, temps, output)
        else:
            base = shims.empty_strided([spec.nbytes], [1], u8, dev)
            temps.append(base)
            if not output:
                self._stage_in(a, base, temps)
            return base
        temps.append(base)
        if base.alloc is not None:
            settle_other_streams(base.alloc, self.stream, writes_only=not output)
        return base

    def _stage_in(self, a: Arg, base: Handle, temps: list[Handle]) -> None:
        """Fill a staging root with an input's values, in the spec's layout."""
        spec = a.spec
        typed = shims.reinterpret_tensor(base, spec.shape, spec.strides, 0, dtype=spec.dtype)
        temps.append(typed)
        if a.array is not None:
            base.alloc.settle()
            self.device.write(typed, a.array)
            return
        self.stream.copy(typed, self._caller_handle(a, temps, writes_only=True))

    def unstage(self, o: Arg, result: Handle, temps: list[Handle],
                copy_back: list[tuple[np.ndarray, Handle]]) -> None:
        """Copy a computed output into a caller's out tensor that could not be bound: queued
        for a device tensor, left in `copy_back` for a host array (copied after the wait)."""
        if o.array is not None:
            copy_back.append((o.array, result))
            return
        self.stream.copy(self._caller_handle(o, temps, writes_only=False), result)

    def _caller_handle(self, a: Arg, temps: list[Handle], writes_only: bool) -> Handle:
        """A handle on a caller's device tensor, ordered after other streams' work on it."""
        h = a.handle
        if a.foreign is not None:
            imp = a.foreign
            h = shims.create_tensor_from_blob(imp.ptr, imp.shape, imp.strides, 0, imp.dtype,
                                              self.device)
            temps.append(h)
        if h.alloc is not None:
            settle_other_streams(h.alloc, self.stream, writes_only=writes_only)
        return h


def settle_other_streams(alloc: Allocation, stream: Stream, writes_only: bool) -> None:
    """Wait for other streams' unfinished work on memory this stream is about to use."""
    for other in list(alloc.uses):
        if other is not stream and not other.closed:
            other.wait_for(alloc, writes_only)


def overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """True when two [start, end) byte spans intersect."""
    return a[0] < b[1] and b[0] < a[1]


def check_meta(what: str, spec: SpecRecord, dt: DType, shape: Sequence[int]) -> None:
    """Refuse a caller tensor whose dtype or shape is not the spec's."""
    if dt is not spec.dtype:
        raise InvalidArgument(f"{what}: expected dtype {spec.dtype.name}, got {dt.name}")
    if tuple(shape) != spec.shape:
        raise InvalidArgument(f"{what}: expected shape {list(spec.shape)}, got {list(shape)}")


def host_view(imp: dlpack.Imported) -> np.ndarray:
    """A numpy view of host memory described by an imported DLPack tensor."""
    import ctypes

    isz = imp.dtype.itemsize
    if 0 in imp.shape:
        return np.empty(imp.shape, dtype=imp.dtype.np)
    lo = sum((n - 1) * s for n, s in zip(imp.shape, imp.strides) if s < 0) * isz
    hi = (sum((n - 1) * s for n, s in zip(imp.shape, imp.strides) if s > 0) + 1) * isz
    buf = (ctypes.c_uint8 * (hi - lo)).from_address(imp.ptr + lo)
    return np.ndarray(imp.shape, dtype=imp.dtype.np, buffer=buf, offset=-lo,
                      strides=[s * isz for s in imp.strides])


__all__ = ["BOUND", "Arg", "Arguments", "check_meta", "host_view", "overlap",
           "settle_other_streams"]
