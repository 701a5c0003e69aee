"""The hazard checker: catches missing waits, frees under pending work, aliases, dead handles.

It models the strictest device we target (Metal): ordering is tracked per allocation
object, so two allocation objects over the same bytes used in one command buffer are a
fault even where a given device would happen to order them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aotrt.errors import HazardError

if TYPE_CHECKING:
    from aotrt.runtime.memory import Allocation


def enabled_by_env() -> bool:
    """True when AOTRT_CHECK_HAZARDS asks for the checker."""
    return os.environ.get("AOTRT_CHECK_HAZARDS", "0") not in ("", "0", "false", "no")


@dataclass(frozen=True)
class Access:
    """Bytes [start, end) of `alloc` (relative to its base) read or written by a command."""

    alloc: "Allocation"
    start: int
    end: int
    write: bool


class HazardChecker:
    """Per-stream record of the writes in the open command buffer, checked on every command."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        # allocation object -> list of (absolute start, absolute end, label) written so far
        self._writes: dict["Allocation", list[tuple[int, int, str]]] = {}

    def on_command(self, accesses: list[Access], label: str) -> None:
        """Check a new command against earlier writes of this command buffer, then record it."""
        if not self.enabled:
            return
        for acc in accesses:
            if acc.end <= acc.start:
                continue
            lo, hi = acc.alloc.ptr + acc.start, acc.alloc.ptr + acc.end
            for other, ranges in self._writes.items():
                if other is acc.alloc:
                    continue
                for s, e, earlier in ranges:
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
                self._writes.setdefault(acc.alloc, []).append((lo, acc.alloc.ptr + acc.end, label))

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


def check_free(alloc: "Allocation", what: str) -> None:
    """Raise if `alloc` is freed or recycled while checked work on it may still run."""
    for stream, (last, _) in list(alloc.uses.items()):
        if stream.hazards.enabled and last > stream.completed_seq:
            raise HazardError(
                f"{what} of {alloc.describe()} while command #{last} on {stream!r} may "
                f"still use it (completed #{stream.completed_seq})")
