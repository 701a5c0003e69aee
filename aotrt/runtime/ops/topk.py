"""topk: the k largest (or smallest) entries along a dim, with int64 indices, into
caller-provided output views.

NaN counts as larger than every number, as in torch. Equal values come out in ascending
index order (a stable sort); torch leaves the order of ties unspecified and its cpu kernel
does not always agree, so only the values and the validity of indices are comparable.
sorted=False still returns sorted results, which satisfies torch's contract.

The exporter lowers aten.sort to this op with k = the dim's size: the stable order above is
exactly torch.sort(stable=True), ascending and descending, on every device (the cuda kernel
ranks the same way), so any change to the tie or NaN rule changes sort too.
"""

from __future__ import annotations

from typing import Any

from aotrt import dtypes
from aotrt.errors import InvalidArgument
from aotrt.runtime.device import Stream
from aotrt.runtime.ops import _common as c
from aotrt.runtime.tensor import Handle

DTYPES = c.FLOATS + c.INTS


def check_topk(values_out: Any, indices_out: Any, x: Any, k: Any, dim: Any = -1,
               largest: Any = True, sorted: Any = True
               ) -> tuple[tuple[int, int, bool], c.OpCost]:
    """Validate topk's metadata and params; return (k, dim, largest) and the cost."""
    op = "topk"
    c.check_dtype(op, x, "x", DTYPES)
    c.check_output(op, values_out, "values_out")
    c.check_same_dtype(op, x, "x", values_out, "values_out")
    c.check_output(op, indices_out, "indices_out")
    if indices_out.dtype is not dtypes.int64:
        raise InvalidArgument(f"topk: indices_out: dtype must be int64, got "
                              f"{indices_out.dtype.name}")
    k = c.as_int(op, k, "k")
    dim = c.as_int(op, dim, "dim")
    largest = c.as_bool(op, largest, "largest")
    sorted = c.as_bool(op, sorted, "sorted")
    rank = max(x.ndim, 1)
    if not -rank <= dim < rank:
        raise InvalidArgument(f"topk: dim: {dim} is out of range for a {x.ndim}-D tensor")
    dim %= rank
    size = x.sizes[dim] if x.ndim else 1
    if not 0 <= k <= size:
        raise InvalidArgument(f"topk: k: {k} is out of range [0, {size}] for dim {dim} of "
                              f"{list(x.sizes)}")
    # A 0-D input gives 0-D outputs (torch, even for k == 0).
    shape = tuple(x.sizes[:dim]) + (k,) + tuple(x.sizes[dim + 1:]) if x.ndim else ()
    c.check_shape(op, values_out, "values_out", shape)
    c.check_shape(op, indices_out, "indices_out", shape)
    return (k, dim, largest), topk_cost(x, k, size)


def topk_cost(x: Any, k: int, n: int) -> c.OpCost:
    """Cost of the cpu topk: a stable sort of every row (n log n); scratch: the float32
    copy (bfloat16), the sorted copy and the argsort result of every row, and the k
    selected indices and values of every row."""
    rows = x.numel // max(n, 1)
    logn = max(n, 1).bit_length()
    work = rows * n * logn + 3 * rows * k + x.numel
    scratch = rows * n * (4 + x.dtype.itemsize + 8) + rows * k * (8 + 8 + x.dtype.itemsize)
    return c.OpCost(work, scratch)


def topk(stream: Stream, values_out: Handle, indices_out: Handle, x: Handle, k: int,
         dim: int = -1, largest: bool = True, sorted: bool = True) -> int:
    """values_out, indices_out = torch.topk(x, k, dim, largest, sorted)."""
    op = "topk"
    c.check_handles(op, stream, [(x, "x"), (values_out, "values_out"),
                                 (indices_out, "indices_out")])
    (k, dim, largest), _ = check_topk(values_out, indices_out, x, k, dim, largest, sorted)
    return c.launch(op, stream, [values_out, indices_out], [x], "topk", values_out, indices_out,
                    x, k, dim, largest)
