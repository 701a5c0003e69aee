"""Memory plan: one arena per delegate, with buffers whose lifetimes overlap kept apart.

Pure Python (no torch): the exporter and the tests both use it. A buffer's lifetime is the
closed interval [first, last] of instruction indices that touch it. Two buffers may share
bytes only when their intervals are disjoint; the single stream orders everything else.

The algorithm is greedy by size (TFLite's "greedy by size" planner): the largest buffers are
placed first, each into the tightest gap left between already-placed buffers whose lifetimes
overlap it (best fit), or after the last of them.
"""

from __future__ import annotations

from typing import Sequence

from aotrt.errors import InvalidArgument

#: offsets and sizes are kept below this so that the arena size never overflows 64 bits
LIMIT = 1 << 62


def _round_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def _check_inputs(sizes: Sequence[int], lifetimes: Sequence[tuple[int, int]],
                  align: int) -> list[tuple[int, int]]:
    if isinstance(align, bool) or not isinstance(align, int) or align <= 0:
        raise InvalidArgument(f"align: expected a positive int, got {align!r}")
    if align & (align - 1):
        raise InvalidArgument(f"align: {align} is not a power of two")
    if len(sizes) != len(lifetimes):
        raise InvalidArgument(f"lifetimes: {len(lifetimes)} lifetimes for {len(sizes)} sizes")
    spans = []
    for i, (n, life) in enumerate(zip(sizes, lifetimes)):
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < LIMIT:
            raise InvalidArgument(f"sizes[{i}]: expected an int in [0, 2**62), got {n!r}")
        try:
            first, last = life
        except (TypeError, ValueError):
            raise InvalidArgument(f"lifetimes[{i}]: expected (first, last), got {life!r}") from None
        for v in (first, last):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InvalidArgument(f"lifetimes[{i}]: expected non-negative ints, got {life!r}")
        if first > last:
            raise InvalidArgument(f"lifetimes[{i}]: first {first} is after last {last}")
        spans.append((first, last))
    return spans


def _live_together(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def plan(sizes: Sequence[int], lifetimes: Sequence[tuple[int, int]],
         align: int = 64) -> tuple[list[int], int]:
    """Byte offsets (multiples of `align`) of each buffer in one arena, and the arena size.

    Buffers whose [first, last] intervals overlap never overlap in bytes. Empty buffers get
    offset 0 and take no space.
    """
    spans = _check_inputs(sizes, lifetimes, align)
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], spans[i][0], i))
    offsets = [0] * len(sizes)
    placed: list[int] = []
    total = 0
    for i in order:
        n = sizes[i]
        if n == 0:
            continue
        need = _round_up(n, align)
        busy = sorted((offsets[j], offsets[j] + sizes[j]) for j in placed
                      if _live_together(spans[i], spans[j]))
        best, best_gap, cursor = None, None, 0
        for start, end in busy:
            gap = start - cursor
            if gap >= n and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, _round_up(end, align))
        offsets[i] = cursor if best is None else best
        if offsets[i] + need >= LIMIT:
            raise InvalidArgument(f"sizes: the arena would exceed 2**62 bytes at buffer {i}")
        placed.append(i)
        total = max(total, offsets[i] + need)
    return offsets, total


def check_plan(sizes: Sequence[int], lifetimes: Sequence[tuple[int, int]],
               offsets: Sequence[int], total: int, align: int = 64) -> None:
    """Raise InvalidArgument unless `offsets` keep live-together buffers apart inside `total`."""
    spans = _check_inputs(sizes, lifetimes, align)
    if len(offsets) != len(sizes):
        raise InvalidArgument(f"offsets: {len(offsets)} offsets for {len(sizes)} buffers")
    for i, (off, n) in enumerate(zip(offsets, sizes)):
        if isinstance(off, bool) or not isinstance(off, int) or off < 0:
            raise InvalidArgument(f"offsets[{i}]: {off!r} is not a non-negative int")
        if off % align:
            raise InvalidArgument(f"offsets[{i}]: {off} is not a multiple of {align}")
        if n and off + n > total:
            raise InvalidArgument(f"offsets[{i}]: bytes [{off}, {off + n}) exceed the arena "
                                  f"of {total} bytes")
    live = [i for i, n in enumerate(sizes) if n]
    # Sweep by offset so the check stays near-linear for large programs.
    live.sort(key=lambda i: offsets[i])
    for a_pos, a in enumerate(live):
        a_end = offsets[a] + sizes[a]
        for b in live[a_pos + 1:]:
            if offsets[b] >= a_end:
                break
            if _live_together(spans[a], spans[b]):
                raise InvalidArgument(
                    f"offsets: buffers {a} (bytes [{offsets[a]}, {a_end}), life {spans[a]}) "
                    f"and {b} (bytes [{offsets[b]}, {offsets[b] + sizes[b]}), life "
                    f"{spans[b]}) are live together and overlap")
