"""Grouped matrix products (mixture-of-experts layers) as core ATen the lowering runs.

transformers' default experts implementation sorts the (token, expert) pairs by expert and
multiplies each expert's rows by its weight in one grouped product: `torch._grouped_mm` (or
`F.grouped_mm`) where it can, else its custom op `transformers::grouped_mm_fallback` (any
dtype but bfloat16 under export). Both take `offs`, the cumulative row count of each group,
which is data: the eager ops slice at `offs.tolist()`, which no static graph can.

Here row r's group is the number of offsets <= r, and its result is one row-vector product
with that group's matrix, `(x[r, :, None] * w[g[r]]).sum(0)`: a gather of the weight that
the lowering fuses into the reduction's loads (no copy of the weights), so only the routed
work is done (S rows of K x N multiply-adds, S = tokens x top-k), never every expert's GEMM
on every token. What it costs against a grouped GEMM: rows of one group do not share loads
of the group's matrix (a matrix-vector product per row), which matters in a long prefill,
not in decode. The reduction runs along K, fast where K is the weight's contiguous dim
(transformers' [experts, N, K] layout): an [experts, K, N] weight (`is_transposed` experts)
is read across rows, 18x slower on cpu for 2 rows by a 1024 x 2048 expert. Rows past
`offs[-1]` are zero (the fallback's value; torch leaves them undefined). Products accumulate
in float32 and round once, as torch's grouped GEMM does.
"""

from __future__ import annotations

from typing import Any

import torch

#: dtypes whose products accumulate in float32 before rounding to the result's dtype
_HALF = (torch.float16, torch.bfloat16)


def _groups(offs: torch.Tensor, rows: int, last: int) -> torch.Tensor:
    """Each row's group, int64 [rows]: how many of the cumulative ends `offs` are <= the row,
    at most `last` (rows past the last end are masked by the caller)."""
    r = torch.arange(rows, device=offs.device)
    # offs compared as it is (int32): a cast of its own would be a kernel of its own.
    return torch.clamp((r[:, None] >= offs[None, :]).sum(1), max=last)


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> Any:
    """aten._grouped_mm for 2-D x (rows grouped by `offs`) by 3-D w, and 3-D by 3-D (a
    batched product); NotImplemented (the op is kept, for the lowering to refuse) else."""
    # A bias is refused: torch's kernels take none yet, so its broadcast is unsettled.
    if not x.is_floating_point() or x.dtype != w.dtype or bias is not None:
        return NotImplemented
    dtype = out_dtype or x.dtype
    acc = torch.float32 if x.dtype in _HALF else x.dtype
    if offs is None and x.dim() == 3 and w.dim() == 3:
        return torch.bmm(x, w).to(dtype)     # bmm accumulates half in float32
    if offs is None or x.dim() != 2 or w.dim() != 3 or offs.dim() != 1 or \
            offs.shape[0] != w.shape[0] or offs.is_floating_point():
        return NotImplemented
    rows, n = x.shape[0], w.shape[2]
    g = _groups(offs, rows, w.shape[0] - 1)
    # The cast after the gather: the kernel reads each routed weight in its own dtype (a
    # cast before it would fold into a float32 copy of every expert's weights).
    out = (x[:, :, None].to(acc) * w[g].to(acc)).sum(1)
    # Rows past the last end are zero; the mask is built in the result's shape so that it
    # is the reduction's epilogue, not a kernel of its own.
    r = torch.arange(rows, device=x.device)[:, None].expand(rows, n)
    out = torch.where(r < offs[-1], out, 0.0)
    return out.to(dtype)


def grouped_mm_fallback(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> Any:
    """transformers::grouped_mm_fallback(input, weight, offs): as aten._grouped_mm."""
    return grouped_mm(input, weight, offs)


__all__ = ["grouped_mm", "grouped_mm_fallback"]
