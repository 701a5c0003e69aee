"""The AOTI-style handle API. Every entry point validates all of its arguments and
publishes nothing (no handle, no count, no region) unless the whole call succeeds.

The delegate's interpreter executes programs through these same functions.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from aotrt.dtypes import DType, as_dtype
from aotrt.errors import InvalidArgument
from aotrt.program.strides import contiguous_strides, is_packed, numel_of, span
from aotrt.runtime.device import Device
from aotrt.runtime.device import get_device as _get_device
from aotrt.runtime.memory import current_owner
from aotrt.runtime.tensor import EXTENT_LIMIT, INT64_MAX, MAX_DIMS, Handle, check_live


def _int(value: Any, name: str) -> int:
    # bool is an int to Python, never a size to us; numpy integers are (np.bool_ is not one).
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    raise InvalidArgument(f"{name}: expected an integer, got {_short(value)}")


def _short(value: Any) -> str:
    """repr of a caller's value, cut short: a hostile value may be huge or have a bad repr."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - any repr failure still names the type
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def _seq(value: Any, name: str) -> Sequence[Any]:
    """`value` as a sequence of at most MAX_DIMS entries (a list, tuple or 1-d numpy array)."""
    if value is None:
        raise InvalidArgument(f"{name}: must not be null")
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iu":
        value = list(value)
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise InvalidArgument(f"{name}: expected a sequence of ints, got {_short(value)}")
    try:
        n = len(value)
    except Exception as e:  # noqa: BLE001 - a hostile __len__
        raise InvalidArgument(f"{name}: has no usable length ({type(e).__name__})") from None
    if n > MAX_DIMS:
        raise InvalidArgument(f"{name}: {n} dims; at most {MAX_DIMS} are supported")
    return value


def _dtype(value: Any) -> DType:
    """as_dtype, with anything numpy raises for a strange value told as InvalidArgument."""
    try:
        return as_dtype(value)
    except (TypeError, ValueError, OverflowError, RecursionError):
        raise InvalidArgument(f"dtype: unsupported dtype {_short(value)}") from None


def _dims(sizes: Any, strides: Any, allow_zero_strides: bool) -> tuple[tuple[int, ...],
                                                                         tuple[int, ...]]:
    """Validated (sizes, strides); strides None means row-major. Sizes and strides are
    int64, as in AOTI; what a view may reach is bounded by _extent_bytes."""
    sz = tuple(_int(n, f"sizes[{i}]") for i, n in enumerate(_seq(sizes, "sizes")))
    for i, n in enumerate(sz):
        if n < 0:
            raise InvalidArgument(f"sizes[{i}]: negative size {n}")
        if n > INT64_MAX:
            raise InvalidArgument(f"sizes[{i}]: size {n} does not fit int64")
    if strides is None:
        st = contiguous_strides(sz)
    else:
        st = tuple(_int(s, f"strides[{i}]") for i, s in enumerate(_seq(strides, "strides")))
        if len(st) != len(sz):
            raise InvalidArgument(f"strides: {len(st)} strides for {len(sz)} sizes")
    n = numel_of(sz)
    for i, (d, s) in enumerate(zip(sz, st)):
        if not -INT64_MAX - 1 <= s <= INT64_MAX:
            raise InvalidArgument(f"strides[{i}]: stride {s} does not fit int64")
        if d > 1 and n > 0:
            if s < 0:
                raise InvalidArgument(f"strides[{i}]: negative stride {s} is not supported")
            if s == 0 and not allow_zero_strides:
                raise InvalidArgument(f"strides[{i}]: zero stride on a dim of size {d}: no "
                                      f"dense tensor has it")
    if n > 0 and not allow_zero_strides and not is_packed(sz, st):
        raise InvalidArgument(f"strides: {list(st)} for sizes {list(sz)} leave holes or overlap; "
                              f"no dense tensor has them")
    return sz, st


def _extent_bytes(sz: tuple[int, ...], st: tuple[int, ...], dtype: DType) -> tuple[int, int]:
    """(lowest, end) byte offsets relative to element 0, refusing 64-bit overflow."""
    if numel_of(sz) == 0:
        return 0, 0
    lo, hi = span(sz, st)
    if numel_of(sz) * dtype.itemsize > INT64_MAX or (hi + 1) * dtype.itemsize > INT64_MAX:
        raise InvalidArgument(f"sizes: {list(sz)} x {dtype.itemsize} bytes overflows 64 bits")
    return lo * dtype.itemsize, (hi + 1) * dtype.itemsize


def _memory_extent(sz: tuple[int, ...], st: tuple[int, ...], dtype: DType) -> int:
    """Bytes new memory (an allocation or a blob's region) for the view spans, < 2**62."""
    _, end = _extent_bytes(sz, st, dtype)
    if end >= EXTENT_LIMIT:
        raise InvalidArgument(f"sizes: {list(sz)} x {dtype.itemsize} bytes span {end} bytes; "
                              f"memory of 2**62 bytes or more is not supported")
    return end


def _device(device: Any) -> Device:
    if device is None:
        raise InvalidArgument("device: must not be null")
    return _get_device(device)


def empty_strided(sizes: Sequence[int], strides: Sequence[int] | None, dtype: Any,
                  device: Any = "cpu") -> Handle:
    """A new tensor in fresh (possibly pooled) memory of the current owner."""
    sz, st = _dims(sizes, strides, allow_zero_strides=False)
    dt = _dtype(dtype)
    end = _memory_extent(sz, st, dt)
    dev = _device(device)
    alloc = dev.memory.allocate(end, dev.current_stream(), current_owner())
    h = Handle(alloc, 0, sz, st, dt, dev, current_owner())
    try:
        return h._publish()
    except BaseException:
        alloc.retain()
        alloc.release()
        raise


def create_tensor_from_blob(data_ptr: int, sizes: Sequence[int], strides: Sequence[int] | None,
                            storage_offset: int, dtype: Any, device: Any = "cpu") -> Handle:
    """Wrap memory at `data_ptr` (+ storage_offset elements) without copying.

    Memory inside a known allocation joins it as a view (and keeps it alive); unknown
    memory becomes a new region that goes with its last handle.
    """
    if data_ptr is None:
        data_ptr = 0
    ptr = _int(data_ptr, "data_ptr")
    if ptr < 0 or ptr > INT64_MAX:
        raise InvalidArgument(f"data_ptr: {ptr:#x} is not an address")
    off = _int(storage_offset, "storage_offset")
    if off < 0:
        raise InvalidArgument(f"storage_offset: negative offset {off}")
    sz, st = _dims(sizes, strides, allow_zero_strides=False)
    dt = _dtype(dtype)
    dev = _device(device)
    nbytes = _memory_extent(sz, st, dt)
    n = numel_of(sz)
    if ptr == 0:
        if n:
            raise InvalidArgument(f"data_ptr: null data for {n} elements")
        return Handle(None, 0, sz, st, dt, dev, current_owner())._publish()
    if off * dt.itemsize > INT64_MAX or ptr + off * dt.itemsize + nbytes > INT64_MAX:
        raise InvalidArgument(f"storage_offset: {off} elements past {ptr:#x} overflows 64 bits")
    start = ptr + off * dt.itemsize
    mem = dev.memory
    with mem._lock:
        alloc = mem.find(start)
        if alloc is None and n == 0:
            before = mem.find(start - 1)
            alloc = before if before is not None and before.end == start else None
        if alloc is not None:
            seg_lo, seg_hi = alloc.segment_of(start - alloc.ptr)
            if start - alloc.ptr + nbytes > seg_hi:
                raise InvalidArgument(
                    f"data_ptr: blob [{start:#x}, {start + nbytes:#x}) runs past the end of "
                    f"{'its constant in ' if alloc.segments else ''}{alloc.describe()}")
            return Handle(alloc, start - alloc.ptr, sz, st, dt, dev, current_owner())._publish()
        region = mem.bind_region(start, nbytes, current_owner())
        try:
            return Handle(region, 0, sz, st, dt, dev, current_owner())._publish()
        except BaseException:
            region.retain()
            region.release()
            raise


def reinterpret_tensor(handle: Handle, sizes: Sequence[int], strides: Sequence[int],
                       storage_offset: int, dtype: Any = None) -> Handle:
    """A view of `handle`'s memory whose element 0 is `storage_offset` elements past
    `handle`'s own; it lives in the same allocation and must stay inside it.

    `dtype` (an extension of the AOTI signature) reads the bytes as another dtype; the
    offset then counts elements of that dtype and must keep element 0 aligned to it.
    """
    check_live(handle, "handle")
    if strides is None:
        raise InvalidArgument("strides: must not be null")
    sz, st = _dims(sizes, strides, allow_zero_strides=True)
    off = _int(storage_offset, "storage_offset")
    dt = handle.dtype if dtype is None else _dtype(dtype)
    if (handle.byte_offset + off * dt.itemsize) % dt.itemsize:
        raise InvalidArgument(f"dtype: {dt.name} view at byte {handle.byte_offset} is misaligned")
    lo, hi = _extent_bytes(sz, st, dt)
    if abs(off) * dt.itemsize > INT64_MAX:
        raise InvalidArgument(f"storage_offset: {off} overflows 64 bits")
    new_off = handle.byte_offset + off * dt.itemsize
    alloc = handle.alloc
    if alloc is None:
        if numel_of(sz) or off:
            raise InvalidArgument("handle: a tensor without memory only has empty views at 0")
        return Handle(None, 0, sz, st, dt, handle.device, current_owner())._publish()
    seg_lo, seg_hi = alloc.segment_of(min(handle.byte_offset, max(alloc.nbytes - 1, 0)))
    if numel_of(sz) == 0:
        if not seg_lo <= new_off <= seg_hi:
            raise InvalidArgument(
                f"storage_offset: empty view at byte {new_off} is outside [{seg_lo}, {seg_hi}] "
                f"of {alloc.describe()}")
    elif new_off + lo < seg_lo or new_off + hi > seg_hi:
        raise InvalidArgument(
            f"sizes/strides/storage_offset: view bytes [{new_off + lo}, {new_off + hi}) lie "
            f"outside [{seg_lo}, {seg_hi}) of {alloc.describe()}")
    return Handle(alloc, new_off, sz, st, dt, handle.device, current_owner())._publish()


def new_tensor_handle(handle: Handle) -> Handle:
    """Another handle to the same view; it keeps the allocation alive on its own."""
    check_live(handle, "handle")
    h = handle
    return Handle(h.alloc, h.byte_offset, h.sizes, h.strides, h.dtype, h.device,
                  current_owner())._publish()


def delete_tensor_object(handle: Handle) -> None:
    """Delete a handle; the last handle into an allocation frees (or pools) it.

    A null or unknown handle is refused; a retired handle is just dropped.
    """
    if handle is None:
        raise InvalidArgument("handle: must not be null")
    if not isinstance(handle, Handle):
        raise InvalidArgument(f"handle: expected a tensor handle, got {type(handle).__name__}")
    if handle.state == "deleted" or handle.state == "new":
        raise InvalidArgument(f"handle: unknown or already deleted handle {handle!r}")
    handle._delete()


def copy_(dst: Handle, src: Handle) -> None:
    """Copy src's elements into dst in order on the current stream.

    Sizes must match, or both must be row-major dense with equal element counts. A copy
    touching memory the runtime did not allocate (a region) is complete on return.
    """
    check_live(dst, "dst")
    check_live(src, "src")
    if dst.dtype is not src.dtype:
        raise InvalidArgument(f"src: dtype {src.dtype.name} does not match dst {dst.dtype.name}")
    if dst.numel != src.numel:
        raise InvalidArgument(f"src: {src.numel} elements do not match dst's {dst.numel}")
    if dst.numel == 0:
        return
    if dst.sizes != src.sizes:
        if not (dst.row_major and src.row_major):
            raise InvalidArgument(
                f"src: sizes {list(src.sizes)} vs dst {list(dst.sizes)} differ and are not both "
                f"row-major dense")
        flat = (dst.numel,)
        dst = Handle(dst.alloc, dst.byte_offset, flat, (1,), dst.dtype, dst.device, dst.owner)
        src = Handle(src.alloc, src.byte_offset, flat, (1,), src.dtype, src.device, src.owner)
        dst.state = src.state = "live"
    if dst.device is src.device:
        stream = dst.device.current_stream()
        stream.copy(dst, src)
        if dst.alloc.kind == "region" or src.alloc.kind == "region":
            stream.commit_and_wait()
        return
    # Across devices: through the host, after the waits each side needs.
    src.alloc.settle(writes_only=True)
    data = src.device.read(src)
    dst.alloc.settle()
    dst.device.write(dst, data)


def item_bool(handle: Handle) -> bool:
    """The value of a one-element bool tensor."""
    check_live(handle, "handle")
    if handle.dtype.name != "bool":
        raise InvalidArgument(f"handle: item_bool needs a bool tensor, got {handle.dtype.name}")
    if handle.numel != 1:
        raise InvalidArgument(f"handle: item_bool needs one element, got {handle.numel}")
    return bool(handle.numpy().reshape(()))


def get_sizes(handle: Handle) -> tuple[int, ...]:
    """The view's sizes."""
    check_live(handle, "handle")
    return handle.sizes


def get_strides(handle: Handle) -> tuple[int, ...]:
    """The view's strides, in elements."""
    check_live(handle, "handle")
    return handle.strides


def get_storage_offset(handle: Handle) -> int:
    """Element offset of element 0 from the start of its allocation."""
    check_live(handle, "handle")
    return handle.storage_offset


def get_dtype(handle: Handle) -> DType:
    """The element type."""
    check_live(handle, "handle")
    return handle.dtype


def get_device(handle: Handle) -> str:
    """The device type name ('cpu' or 'cuda')."""
    check_live(handle, "handle")
    return handle.device.name


def get_device_index(handle: Handle) -> int:
    """The device index (always 0: one device of each type)."""
    check_live(handle, "handle")
    return 0


def get_numel(handle: Handle) -> int:
    """Number of elements."""
    check_live(handle, "handle")
    return handle.numel


def get_dim(handle: Handle) -> int:
    """Number of dims."""
    check_live(handle, "handle")
    return handle.ndim


def get_data_ptr(handle: Handle) -> int:
    """The address of element 0 (0 for a tensor without memory)."""
    check_live(handle, "handle")
    return handle.address


def get_storage_size(handle: Handle) -> int:
    """Bytes in the allocation the view lives in."""
    check_live(handle, "handle")
    return handle.alloc.nbytes if handle.alloc is not None else 0
