"""The cpu work of topk (numpy, stable)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from aotrt import dtypes
from aotrt.runtime.ops import _common as c
from aotrt.runtime.tensor import Handle, host_array


def stable_topk_indices(a: np.ndarray, k: int, largest: bool) -> np.ndarray:
    """Indices of the top k along the last axis; ties in ascending index order."""
    if a.dtype == dtypes.bfloat16.np:
        a = a.astype(np.float32)  # exact; numpy sorts float32 natively
    if not largest:
        return np.argsort(a, axis=-1, kind="stable")[..., :k]
    # Stable descending: sort the reversed row ascending, then reverse back. numpy puts NaN
    # last in ascending order, so it comes first here, as torch ranks it.
    n = a.shape[-1]
    order = np.argsort(a[..., ::-1], axis=-1, kind="stable")[..., ::-1]
    return (n - 1) - order[..., :k]


def make_topk(values_out: Handle, indices_out: Handle, x: Handle, k: int, dim: int,
              largest: bool) -> Callable[[], None]:
    """The cpu work of topk."""
    def work() -> None:
        xv = host_array(x)
        vo, io = host_array(values_out), host_array(indices_out)
        if xv.ndim == 0:
            # torch: a 0-D input gives itself and index 0 for k of 0 or 1.
            vo[...], io[...] = xv.copy(), 0
            return
        xm = np.moveaxis(xv, dim, -1)
        idx = stable_topk_indices(xm, k, largest)
        vals = np.take_along_axis(xm, idx, axis=-1)  # a copy, so outputs may overlap x
        c.store(np.moveaxis(vo, dim, -1), vals)
        c.store(np.moveaxis(io, dim, -1), idx)
    return work
