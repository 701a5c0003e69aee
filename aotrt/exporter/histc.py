"""aten.histc as core ATen: per-bin counts by comparison with the bin indices.

Mixture-of-experts routing in transformers (Mixtral, Qwen2-MoE) counts tokens per expert
with `torch.histc`, which torch has no decomposition for. This follows torch's cpu kernel:
with min == max the range is the data's own (widened by 1 each way if that is empty still);
an element x in [min, max] goes to bin int((x - min) / (max - min) * bins), x == max to the
last bin; NaN and elements outside the range are not counted. (With a data range, torch
raises on NaN; a traced graph cannot raise, so NaN is left out of the range and the counts.)
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def histc(x: torch.Tensor, bins: int = 100, min: float = 0, max: float = 0) -> torch.Tensor:
    """torch.histc(x, bins, min, max) from comparisons and a sum."""
    flat = x.reshape(-1)
    lo = torch.full((), float(min), dtype=x.dtype, device=x.device)
    hi = torch.full((), float(max), dtype=x.dtype, device=x.device)
    if min == max and flat.numel():
        ok = torch.isfinite(flat)
        lo = torch.where(ok, flat, float("inf")).min()
        hi = torch.where(ok, flat, float("-inf")).max()
        same = lo == hi
        lo, hi = torch.where(same, lo - 1, lo), torch.where(same, hi + 1, hi)
    pos = ((flat - lo) / (hi - lo) * bins).to(torch.int64)
    pos = torch.where(flat == hi, bins - 1, pos)
    inside = (flat >= lo) & (flat <= hi)            # False for NaN
    hits = (pos.unsqueeze(1) == torch.arange(bins, device=x.device)) & inside.unsqueeze(1)
    return hits.sum(0).to(x.dtype)


__all__ = ["histc"]
