"""The lowering's value model: `Buf` (one memory root), `TView` (a view of one: element
offset, sizes, strides, dtype), `Instr` (an instruction over TViews, kept symbolic until the
program is built) and the view arithmetic the view rules and placements share. No torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from aotrt import dtypes
from aotrt.errors import InvalidArgument
from aotrt.kernels import ir
from aotrt.program.strides import contiguous_strides


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


def wrap_dim(dim: int, ndim: int) -> int:
    """`dim` in [0, ndim) (0-d views accept 0 and -1); InvalidArgument when out of range."""
    nd = max(ndim, 1)
    if not -nd <= dim < nd:
        raise InvalidArgument(f"dim {dim} out of range for {ndim} dims")
    return dim % nd


def slice_view(tv: TView, dim: int, start: Any, end: Any, step: int = 1) -> TView:
    """tv[..., start:end:step, ...] along `dim` (aten.slice.Tensor's clamping)."""
    dim = wrap_dim(dim, len(tv.sizes))
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
    dim = wrap_dim(dim, len(tv.sizes))
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
    d1, d2 = wrap_dim(dim1, nd), wrap_dim(dim2, nd)
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
