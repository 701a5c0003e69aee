"""The hazard checker: catches missing waits, frees under pending work, aliases, dead handles.

It models the strictest device we target (Metal): ordering is tracked per allocation
object, so two allocation objects over the same bytes used in one command buffer are a
fault even where a given device would happen to order them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from aotrt import settings
from aotrt.errors import HazardError

if TYPE_CHECKING:
    from aotrt.runtime.memory import Allocation


def enabled_by_env() -> bool:
    """True when AOTRT_CHECK_HAZARDS asks for the checker."""
    return settings.env().check_hazards


@dataclass(frozen=True)
class Access:
    """Bytes [start, end) of `alloc` (relative to its base) read or written by a command."""

    alloc: "Allocation"
    start: int
    end: int
    write: bool


def _buffer_id(alloc: "Allocation") -> int:
    """Identity of the device buffer object behind `alloc`.

    Runtime memory is a raw block that the pool recycles into new Allocation objects; the
    device orders work per block (Metal keeps the same MTLBuffer), so a recycled block is not
    an alias. A region has no block: its Allocation is its one buffer object.
    """
    block = alloc.block
    return id(block) if block is not None else id(alloc)


class HazardChecker:
    """Per-stream record of the writes in the open command buffer, checked on every command."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        # buffer id -> list of (absolute start, absolute end, label, allocation) written so far;
        # the allocation also keeps the buffer (and so its id) alive until end_buffer.
        self._writes: dict[int, list[tuple[int, int, str, "Allocation"]]] = {}

    def on_command(self, accesses: list[Access], label: str) -> None:
        """Check a new command against earlier writes of this command buffer, then record it."""
        if not self.enabled:
            return
        for acc in accesses:
            if acc.end <= acc.start:
                continue
            lo, hi = acc.alloc.ptr + acc.start, acc.alloc.ptr + acc.end
            buf = _buffer_id(acc.alloc)
            for other_buf, ranges in self._writes.items():
                if other_buf == buf:
                    continue
                for s, e, earlier, other in ranges:
                    if s < hi and lo < e:
                        kind = "writes" if acc.write else "reads"
                        raise HazardError(
                            f"alias hazard: {label} {kind} bytes [{lo:#x}, {hi:#x}) through "
                            f"allocation {acc.alloc.describe()}, which {earlier} wrote earlier "
                            f"in the same command buffer through another allocation object "
                            f"{other.describe()}; the device does not order the two")
        for acc in accesses:
            if acc.write and acc.end > acc.start:
                lo = acc.alloc.ptr + acc.start
                self._writes.setdefault(_buffer_id(acc.alloc), []).append(
                    (lo, acc.alloc.ptr + acc.end, label, acc.alloc))

    def end_buffer(self) -> None:
        """A commit ended the command buffer: its writes are ordered before later work."""
        self._writes.clear()



def check_host_access(alloc: "Allocation", write: bool, what: str) -> None:
    """Raise if the host touches `alloc` while checked device work on it was not waited for."""
    for stream, (last, last_write) in list(alloc.uses.items()):
        pending = last if write else last_write
        if stream.hazards.enabled and pending > stream.completed_seq:
            raise HazardError(
                f"host {('write to' if write else 'read of')} {alloc.describe()} ({what}) "
                f"with device work pending on {stream!r} (command #{pending}, completed "
                f"#{stream.completed_seq}) and no wait")


def free_hazard(alloc: "Allocation", what: str) -> HazardError | None:
    """The error for freeing `alloc` now, if checked work on it was recorded and not committed.

    The memory layer waits before it frees, so a free is never unsafe here; but a free
    under work the caller has not even committed only works because that wait commits the
    caller's open command buffer for it, and on a device whose free does not wait (the
    anchor's) it is a use after free. Committed work is the stream's to finish: the wait
    in the free covers it, which is how a delegate's run hands back the caller's arrays.
    Memory calls this before its wait (after the wait nothing would be pending).
    """
    for stream, (last, _) in list(alloc.uses.items()):
        if stream.hazards.enabled and last > stream.submitted_seq and not stream.closed:
            return HazardError(
                f"{what} of {alloc.describe()} while command #{last} on {stream!r} may "
                f"still use it (not committed; completed #{stream.completed_seq})")
    return None
