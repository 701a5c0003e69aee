"""Measuring runs, for the CLI and the demo: wall-clock timings and errors against a
reference. numpy only (no torch), so that `aotrt bench` needs only the runtime."""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["max_errors", "time_calls", "ms", "synced_run"]


def max_errors(got: Sequence[Any], ref: Sequence[Any]) -> tuple[float, float]:
    """(max abs error, max abs error / max |ref|) over all outputs, in float64; (nan, nan)
    where an output's NaNs, infinities or shape are not the reference's, so that no
    comparison `error <= tol` accepts it."""
    abs_err, rel = 0.0, 0.0
    for g, r in zip(got, ref):
        g64 = np.asarray(g, dtype=np.float64)
        r64 = np.asarray(r, dtype=np.float64)
        if g64.shape != r64.shape:
            return math.nan, math.nan
        if r64.size == 0:
            continue
        # Python's max() drops a NaN (nan > x is False): a non-finite value is judged here,
        # where it must equal the reference's (NaN for NaN, the same infinity).
        finite = np.isfinite(r64)
        same = (g64 == r64) | (np.isnan(g64) & np.isnan(r64))
        if not (same[~finite].all() and np.isfinite(g64[finite]).all()):
            return math.nan, math.nan
        if not finite.any():
            continue
        e = float(np.max(np.abs(g64[finite] - r64[finite])))
        abs_err = max(abs_err, e)
        rel = max(rel, e / max(float(np.max(np.abs(r64[finite]))), 1e-30))
    return abs_err, rel


def time_calls(fn: Callable[[], Any], runs: int, warmup: int) -> list[float]:
    """Seconds of each of `runs` calls of `fn`, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def ms(seconds: float) -> str:
    """`seconds` as milliseconds with two decimals, e.g. '1.25 ms'."""
    return f"{seconds * 1e3:.2f} ms"


def synced_run(m: Any, inputs: Sequence[Any]) -> Any:
    """Run delegate `m` on `inputs` and wait for its stream, so a timing covers the work."""
    outs = m.run(*inputs)
    m.stream.synchronize()
    return outs
