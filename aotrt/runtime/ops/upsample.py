"""Nearest-neighbour 2-D upsampling (aten.upsample_nearest2d), into a caller-provided view.

Source index = min(floor(dst * scale), in - 1) in float32 arithmetic, with scale =
1 / scale_factor when a factor is given and in / out otherwise, exactly as torch computes
it. With only scale_factors, the output size is floor(in * factor). Giving both follows
the aten `.default` overload: sizes from output_size, source indices from the factors.
It is a pure gather, so every dtype is supported.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from aotrt import dtypes
from aotrt.errors import InvalidArgument
from aotrt.runtime.device import Stream
from aotrt.runtime.ops import _common as c
from aotrt.runtime.tensor import Handle


_F32_MAX = float(np.finfo(np.float32).max)

#: integer factors of at most this many (row, column) phases are one strided copy per
#: phase (native where the device has it); more take one broadcast copy
MAX_COPIES = 64


def _factors(op: str, value: Any) -> tuple[float, float] | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise InvalidArgument(f"{op}: scale_factors: expected 2 numbers, got {value!r}")
    vals = tuple(c.as_float(op, v, f"scale_factors[{i}]") for i, v in enumerate(value))
    for v in vals:
        # The source index scale is 1 / factor in float32; it must be a finite number too.
        if not (math.isfinite(v) and v > 0 and 1.0 / v <= _F32_MAX):
            raise InvalidArgument(f"{op}: scale_factors: must be positive and finite (their "
                                  f"inverses too, in float32), got {list(vals)}")
    return vals  # type: ignore[return-value]


def source_indices(n_in: int, n_out: int, factor: float | None) -> np.ndarray:
    """Source index of each output position along one dim, as torch's nearest_idx."""
    dst = np.arange(n_out, dtype=np.int64)
    if n_out == n_in:
        return dst
    if n_out == 2 * n_in:
        return dst >> 1  # torch's fast path, which ignores the factor (both given)
    if factor is not None and factor > 0:
        scale = np.float32(1.0 / factor)
    else:
        scale = np.float32(n_in) / np.float32(n_out)
    src = np.floor(dst.astype(np.float32) * scale)
    # Clamp before the cast (a float32 product may exceed int64), in float64 so that
    # n_in - 1 is exact; torch clamps the same value after its cast.
    return np.minimum(src.astype(np.float64), n_in - 1).astype(np.int64)


def check_upsample_nearest2d(out: Any, x: Any, output_size: Any = None,
                             scale_factors: Any = None
                             ) -> tuple[tuple[tuple[int, int], tuple], c.OpCost]:
    """Validate upsample_nearest2d's metadata and params; return (output size, factors)
    and the cost."""
    op = "upsample_nearest2d"
    c.check_dtype(op, x, "x", dtypes.ALL)
    c.check_output(op, out, "out")
    c.check_same_dtype(op, x, "x", out, "out")
    c.check_rank(op, x, "x", (4,))
    factors = _factors(op, scale_factors)
    h, w = x.sizes[2:]
    if output_size is None:
        if factors is None:
            raise InvalidArgument(f"{op}: output_size: give output_size or scale_factors")
        fsize = (h * factors[0], w * factors[1])
        if not all(math.isfinite(f) for f in fsize):
            raise InvalidArgument(f"{op}: scale_factors: {list(factors)} give an infinite "
                                  f"output size for input {list(x.sizes[2:])}")
        size = (math.floor(fsize[0]), math.floor(fsize[1]))
    else:
        if not isinstance(output_size, (list, tuple)) or len(output_size) != 2:
            raise InvalidArgument(f"{op}: output_size: expected 2 ints, got {output_size!r}")
        size = tuple(c.as_int(op, v, f"output_size[{i}]") for i, v in enumerate(output_size))
    if max(size) > c.MAX_GEOMETRY:
        field = "output_size" if output_size is not None else "scale_factors"
        raise InvalidArgument(f"{op}: {field}: output size {list(size)} must be at most "
                              f"{c.MAX_GEOMETRY} (int32) per dim")
    if min(h, w) < 1 or min(size) < 1:
        field = "x" if min(h, w) < 1 else "output_size" if output_size is not None else \
            "scale_factors"
        raise InvalidArgument(f"{op}: {field}: input {list(x.sizes[2:])} and output "
                              f"{list(size)} sizes must be greater than 0")
    c.check_shape(op, out, "out", tuple(x.sizes[:2]) + tuple(size))
    fac = factors if factors is not None else (None, None)
    # Index maps (8 bytes per output row and column), the (rows, cols) index grid numpy's
    # fancy indexing broadcasts them to, and the gathered copy of the output.
    cost = c.OpCost(2 * out.numel + size[0] + size[1] + c.PY_STEP * (MAX_COPIES + 2),
                    8 * (size[0] + size[1]) * 2 + 16 * size[0] * size[1]
                    + out.numel * out.dtype.itemsize)
    return (size, fac), cost  # type: ignore[return-value]


def upsample_nearest2d(stream: Stream, out: Handle, x: Handle,
                       output_size: Sequence[int] | None = None,
                       scale_factors: Sequence[float] | None = None) -> int:
    """out = upsample_nearest2d(x, output_size, scale_factors) for a 4-D input."""
    op = "upsample_nearest2d"
    c.check_handles(op, stream, [(x, "x"), (out, "out")])
    (size, (fh, fw)), _ = check_upsample_nearest2d(out, x, output_size, scale_factors)
    if out.numel == 0:
        return stream.recorded_seq  # nothing to write: no index maps either
    h, w = x.sizes[2:]
    rows, cols = source_indices(h, size[0], fh), source_indices(w, size[1], fw)
    return c.launch(op, stream, [out], [x], "upsample_nearest2d", out, x, rows, cols)
