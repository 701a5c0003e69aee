"""The memory layer: allocations with user counts, owners, the per-stream pool, host
regions and constants.

An Allocation is freed (or pooled) when its last user goes. Users are handles (views,
copies, blobs inside it) and explicit retains; queued device work is covered by waiting
before the free. Everything created in an Owner's scope belongs to that owner, and
`Owner.close` frees only its own.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from aotrt import settings
from aotrt.errors import InvalidArgument, OutOfMemory
from aotrt.runtime import hazards
from aotrt.runtime.device import Block

if TYPE_CHECKING:
    from aotrt.runtime.device import Device, Stream
    from aotrt.runtime.tensor import Handle

log = logging.getLogger(__name__)

ALIGN = 64
_MIB = 1 << 20


def _round_up(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


def _raise(err: BaseException | None) -> None:
    if err is not None:
        raise err


@dataclass(frozen=True)
class PoolOptions:
    """Pool policy: best fit within bounded headroom, LRU-capped, oversize not pooled."""

    cap_bytes: int = 256 * _MIB
    headroom_ratio: float = 2.0
    headroom_bytes: int = 32 * 1024

    def __post_init__(self) -> None:
        if not isinstance(self.cap_bytes, int) or self.cap_bytes < 0:
            raise InvalidArgument(f"cap_bytes: must be a non-negative int, got {self.cap_bytes!r}")
        if not self.headroom_ratio >= 1.0:
            raise InvalidArgument(f"headroom_ratio: must be >= 1, got {self.headroom_ratio!r}")
        if not isinstance(self.headroom_bytes, int) or self.headroom_bytes < 0:
            raise InvalidArgument(f"headroom_bytes: must be >= 0, got {self.headroom_bytes!r}")

    @staticmethod
    def from_env() -> "PoolOptions":
        """Defaults, with AOTRT_POOL_MB (1..16384) overriding the cap."""
        raw = settings.env().pool_mb
        if raw is None:
            return PoolOptions()
        try:
            mb = int(raw)
        except ValueError:
            mb = -1
        if not 1 <= mb <= 16384:
            raise InvalidArgument(f"AOTRT_POOL_MB: must be an integer in 1..16384, got {raw!r}")
        return PoolOptions(cap_bytes=mb * _MIB)

    def fits(self, capacity: int, nbytes: int) -> bool:
        """Whether a block of `capacity` may serve a request of `nbytes`."""
        return nbytes <= capacity <= min(int(nbytes * self.headroom_ratio),
                                         nbytes + self.headroom_bytes) or capacity == nbytes

    def poolable(self, capacity: int) -> bool:
        """Blocks larger than half the cap are released instead of pooled."""
        return capacity * 2 <= self.cap_bytes


class Owner:
    """What a delegate (or the process) owns: its live handles and its allocations."""

    _ids = itertools.count(1)

    def __init__(self, name: str) -> None:
        self.name = name
        self.id = next(Owner._ids)
        self.handles: set["Handle"] = set()
        self.allocations: set["Allocation"] = set()
        # Memories this owner allocated from: their pools may hold its freed blocks.
        self.memories: set["Memory"] = set()
        self.closed = False
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"<owner {self.name}#{self.id}>"

    def close(self) -> None:
        """Wait for queued work on its memory, retire its handles, free its allocations."""
        with self._lock:
            if self.closed:
                return
            handles = list(self.handles)
            allocs = {h.alloc for h in handles if h.alloc is not None} | set(self.allocations)
            # Settle before marking closed: if queued work failed, a second close can retry.
            for a in allocs:
                a.settle()
            # Closed first, so that what the retired handles release is freed, not pooled.
            self.closed = True
            for h in handles:
                h._retire()
            for a in list(self.allocations):
                a.memory.drop_owned(a)
            for m in self.memories | {a.memory for a in allocs}:
                m.pool.purge_owner(self)


_tls = threading.local()
PROCESS_OWNER = Owner("process")


def current_owner() -> Owner:
    """The owner of what the calling thread creates now."""
    return getattr(_tls, "owner", None) or PROCESS_OWNER


@contextlib.contextmanager
def owner_scope(owner: Owner) -> Iterator[Owner]:
    """Make `owner` current in this thread for the block."""
    if not isinstance(owner, Owner):
        raise InvalidArgument(f"owner: expected an Owner, got {owner!r}")
    if owner.closed:
        raise InvalidArgument(f"owner: {owner!r} is closed")
    prev = getattr(_tls, "owner", None)
    _tls.owner = owner
    try:
        yield owner
    finally:
        _tls.owner = prev


class Allocation:
    """One block of memory the runtime knows: its device, size, owner and users.

    kind: 'device' (runtime memory, pooled), 'region' (memory the runtime did not
    allocate, e.g. a caller's array), 'constants' (a delegate's weights).
    """

    __slots__ = ("memory", "block", "ptr", "nbytes", "kind", "owner", "users", "freed",
                 "keepalive", "uses", "segments", "stream", "__weakref__")

    def __init__(self, memory: "Memory", block: Block | None, ptr: int, nbytes: int, kind: str,
                 owner: Owner, stream: "Stream | None", keepalive: Any = None) -> None:
        self.memory = memory
        self.block = block
        self.ptr = ptr
        self.nbytes = nbytes
        self.kind = kind
        self.owner = owner
        self.users = 0
        self.freed = False
        self.keepalive = keepalive
        # stream -> (last command seq touching it, last command seq writing it)
        self.uses: dict["Stream", tuple[int, int]] = {}
        # constants: sorted (start, end) byte ranges of each weight, for blob bounds
        self.segments: list[tuple[int, int]] | None = None
        self.stream = stream

    def __repr__(self) -> str:
        return f"<Allocation {self.describe()} users={self.users}>"

    def describe(self) -> str:
        """Short text naming this allocation in errors."""
        where = f"{self.memory.device.name}, {self.owner.name}"
        return f"{self.kind}@{self.ptr:#x}+{self.nbytes} ({where})"

    @property
    def end(self) -> int:
        """One past the last byte address."""
        return self.ptr + self.nbytes

    def retain(self) -> None:
        """Add a user."""
        # Under the memory's lock: users on several threads (a run's outputs, released where
        # the caller drops them) must not lose a count, or the memory leaks or goes early.
        with self.memory._lock:
            if self.freed:
                raise InvalidArgument(f"allocation {self.describe()} was already freed")
            self.users += 1

    def release(self) -> None:
        """Drop a user; the last one frees or pools the memory."""
        with self.memory._lock:
            if self.users <= 0:
                raise InvalidArgument(f"allocation {self.describe()} has no users to release")
            self.users -= 1
            if self.users == 0 and self.kind != "constants":
                self.memory._last_release(self)

    def busy(self, writes_only: bool = False) -> bool:
        """True when some stream has unfinished work on this memory."""
        for stream, (last, last_write) in self.uses.items():
            if (last_write if writes_only else last) > stream.completed_seq:
                return True
        return False

    def settle(self, writes_only: bool = False) -> None:
        """Wait on every stream with unfinished work (writes only, if asked) on this memory."""
        for stream in list(self.uses):
            stream.wait_for(self, writes_only)    # nothing to wait for on a closed stream

    def segment_of(self, offset: int) -> tuple[int, int]:
        """The byte range a blob starting at `offset` must stay inside.

        In constants: the weight it starts in, or ends at (an empty view there); a blob in
        the padding between weights gets only that padding, so it reaches no weight.
        """
        if self.segments:
            starts = [s for s, _ in self.segments]
            i = bisect.bisect_right(starts, offset) - 1
            if i >= 0 and offset <= self.segments[i][1]:
                return self.segments[i]
            lo = self.segments[i][1] if i >= 0 else 0
            hi = self.segments[i + 1][0] if i + 1 < len(self.segments) else self.nbytes
            return (lo, hi)
        return (0, self.nbytes)


@dataclass
class _PoolEntry:
    block: Block
    owner: Owner
    uses: dict


class Pool:
    """Per-stream free lists of raw blocks: best fit, bounded headroom, LRU cap."""

    def __init__(self, memory: "Memory", options: PoolOptions) -> None:
        self.memory = memory
        self.options = options
        self._lists: dict["Stream", OrderedDict[int, _PoolEntry]] = {}
        self._ids = itertools.count()
        self.pooled_bytes = 0

    # Every method holds the memory's lock: streams and owners close (and purge) from any
    # thread while others allocate and free. The put after a stream or owner is marked
    # closed is refused, and the purge that follows the mark takes what came before it.

    def entries(self, stream: "Stream | None" = None) -> list[_PoolEntry]:
        """Pooled entries (of one stream, or all)."""
        with self.memory._lock:
            if stream is not None:
                return list(self._lists.get(stream, {}).values())
            return [e for lst in self._lists.values() for e in lst.values()]

    def overlapping(self, start: int, end: int) -> list[Block]:
        """Pooled blocks whose bytes intersect [start, end): freed memory kept for reuse."""
        with self.memory._lock:
            return [e.block for lst in self._lists.values() for e in lst.values()
                    if e.block.ptr < end and start < e.block.ptr + e.block.nbytes]

    def put(self, block: Block, stream: "Stream", owner: Owner, uses: dict) -> bool:
        """Keep `block` for reuse on `stream`; returns False if it is not poolable."""
        with self.memory._lock:
            if (stream is None or stream.closed or owner.closed
                    or not self.options.poolable(block.nbytes)):
                return False
            lst = self._lists.setdefault(stream, OrderedDict())
            lst[next(self._ids)] = _PoolEntry(block, owner, dict(uses))
            self.pooled_bytes += block.nbytes
            while self.pooled_bytes > self.options.cap_bytes:
                self._evict_lru()
            return True

    def take(self, nbytes: int, stream: "Stream") -> _PoolEntry | None:
        """Best-fit block for `nbytes`: own stream first; another stream's only after a wait."""
        with self.memory._lock:
            found = self._best(self._lists.get(stream), nbytes)
            if found is not None:
                return self._settled(self._pop(stream, found), stream)
            for other, lst in list(self._lists.items()):
                if other is stream:
                    continue
                key = self._best(lst, nbytes)
                if key is not None:
                    return self._settled(self._pop(other, key), stream)
            return None

    @staticmethod
    def _settled(entry: _PoolEntry, stream: "Stream") -> _PoolEntry:
        """Wait on every stream but `stream` whose work may still use the entry's block."""
        for other, (last, _) in list(entry.uses.items()):
            if other is not stream:
                # NOTE: stream order covers `stream` itself; any other stream must finish
                # (a closed one has).
                other.wait_past(last)
        return entry

    def _best(self, lst: OrderedDict | None, nbytes: int) -> int | None:
        if not lst:
            return None
        best, best_cap = None, None
        for key, e in lst.items():
            cap = e.block.nbytes
            if self.options.fits(cap, nbytes) and (best_cap is None or cap < best_cap):
                best, best_cap = key, cap
        return best

    def _pop(self, stream: "Stream", key: int) -> _PoolEntry:
        entry = self._lists[stream].pop(key)
        self.pooled_bytes -= entry.block.nbytes
        return entry

    def _evict_lru(self) -> None:
        oldest_stream, oldest_key = None, None
        for s, lst in self._lists.items():
            if lst:
                k = next(iter(lst))
                if oldest_key is None or k < oldest_key:
                    oldest_stream, oldest_key = s, k
        if oldest_stream is None:
            return
        entry = self._pop(oldest_stream, oldest_key)
        self.memory._free_block(entry.block, entry.uses)

    def purge_stream(self, stream: "Stream") -> None:
        """Free every block pooled for `stream` (the stream is going away)."""
        with self.memory._lock:
            for key in list(self._lists.get(stream, {})):
                entry = self._pop(stream, key)
                self.memory._free_block(entry.block, entry.uses)
            self._lists.pop(stream, None)

    def purge_owner(self, owner: Owner) -> None:
        """Free every block pooled by `owner`'s allocations."""
        with self.memory._lock:
            for stream, lst in list(self._lists.items()):
                for key in [k for k, e in lst.items() if e.owner is owner]:
                    entry = self._pop(stream, key)
                    self.memory._free_block(entry.block, entry.uses)

    def clear(self) -> None:
        """Free everything pooled."""
        with self.memory._lock:
            for stream in list(self._lists):
                self.purge_stream(stream)


class Memory:
    """One device's memory: live allocations by address, the pool, regions, constants."""

    def __init__(self, device: "Device", options: PoolOptions | None = None) -> None:
        self.device = device
        self.pool = Pool(self, options or PoolOptions.from_env())
        self._starts: list[int] = []
        self._allocs: list[Allocation] = []
        self._lock = threading.RLock()
        self.raw_bytes = 0
        self.peak_raw_bytes = 0

    # -- lookup -------------------------------------------------------------------------------

    def live(self) -> list[Allocation]:
        """Every allocation that is neither freed nor pooled."""
        with self._lock:
            return list(self._allocs)

    def find(self, ptr: int) -> Allocation | None:
        """The live allocation whose bytes contain address `ptr`."""
        with self._lock:
            i = bisect.bisect_right(self._starts, ptr) - 1
            if i >= 0:
                a = self._allocs[i]
                if a.ptr <= ptr < max(a.end, a.ptr + 1):
                    return a
            return None

    def overlapping(self, start: int, end: int) -> list[Allocation]:
        """Live allocations whose bytes intersect [start, end)."""
        with self._lock:
            i = bisect.bisect_left(self._starts, end)
            return [a for a in self._allocs[:i] if a.end > start and a.ptr < end]

    def knows(self, start: int, end: int) -> bool:
        """Whether [start, end) touches memory of this runtime: live, bound or pooled."""
        with self._lock:
            return bool(self.overlapping(start, end) or self.pool.overlapping(start, end))

    def _add(self, a: Allocation) -> None:
        i = bisect.bisect_right(self._starts, a.ptr)
        self._starts.insert(i, a.ptr)
        self._allocs.insert(i, a)

    def _remove(self, a: Allocation) -> None:
        for i in range(bisect.bisect_left(self._starts, a.ptr), len(self._allocs)):
            if self._allocs[i] is a:
                del self._starts[i]
                del self._allocs[i]
                return

    # -- allocate / free ----------------------------------------------------------------------

    def allocate(self, nbytes: int, stream: "Stream", owner: Owner | None = None,
                 kind: str = "device") -> Allocation:
        """A new allocation of `nbytes` for use on `stream`, from the pool when it fits."""
        if not isinstance(nbytes, int) or nbytes < 0 or nbytes >= 1 << 62:
            raise InvalidArgument(f"nbytes: must be an int in [0, 2**62), got {nbytes!r}")
        owner = owner or current_owner()
        if owner.closed:
            raise InvalidArgument(f"owner: {owner!r} is closed")
        want = _round_up(max(nbytes, 1))
        with self._lock:
            entry = self.pool.take(want, stream) if kind == "device" else None
            if entry is not None:
                block, uses = entry.block, entry.uses
            else:
                block, uses = self._raw(want), {}
            a = Allocation(self, block, block.ptr, nbytes, kind, owner, stream)
            # A recycled block keeps the history of its work, so host access still waits.
            a.uses = dict(uses)
            self._add(a)
            owner.memories.add(self)
            return a

    def _raw(self, nbytes: int) -> Block:
        try:
            block = self.device._alloc(nbytes)
        except OutOfMemory:
            # NOTE: cached blocks may be what stands in the way; drop them and retry once.
            self.pool.clear()
            block = self.device._alloc(nbytes)
        self.raw_bytes += block.nbytes
        self.peak_raw_bytes = max(self.peak_raw_bytes, self.raw_bytes)
        return block

    def _free_block(self, block: Block, uses: dict) -> None:
        for stream, (last, _) in list(uses.items()):
            stream.wait_past(last)        # a closed stream has finished its work
        self.device._free(block)
        self.raw_bytes -= block.nbytes

    def _last_release(self, a: Allocation) -> None:
        with self._lock:
            if a.freed:
                return
            self._remove(a)
            a.freed = True
            if a.kind == "region":
                # Borrowed memory goes back to its owner only once queued work is done with it.
                # The checker looks first: after the wait nothing would be pending.
                hazard = hazards.free_hazard(a, "release of region")
                a.settle()
                a.keepalive = None
                _raise(hazard)
                return
            stream = a.stream
            if a.kind == "device" and stream is not None and self.pool.put(
                    a.block, stream, a.owner, a.uses):
                return
            hazard = hazards.free_hazard(a, "free")
            a.settle()
            self.device._free(a.block)
            self.raw_bytes -= a.block.nbytes
            # Reported once the memory is safely gone, so a hazard leaks nothing.
            _raise(hazard)

    def drop_owned(self, a: Allocation) -> None:
        """Free an owner's allocation (constants) once queued work is done with it."""
        with self._lock:
            a.owner.allocations.discard(a)
            if a.freed:
                return
            self._remove(a)
            a.freed = True
            hazard = hazards.free_hazard(a, "free of constants")
            a.settle()
            if a.block is not None:
                self.device._free(a.block)
                self.raw_bytes -= a.block.nbytes
            _raise(hazard)

    # -- regions ------------------------------------------------------------------------------

    def bind_region(self, ptr: int, nbytes: int, owner: Owner | None = None,
                    keepalive: Any = None) -> Allocation:
        """Bind memory the runtime did not allocate; refuse overlap with anything known."""
        if not isinstance(ptr, int) or ptr <= 0:
            raise InvalidArgument(f"data_ptr: region start must be a non-null address, got {ptr!r}")
        if not isinstance(nbytes, int) or not 0 <= nbytes < 1 << 62 or ptr + nbytes >= 1 << 64:
            raise InvalidArgument(f"nbytes: region size {nbytes!r} is invalid at {ptr:#x}")
        with self._lock:
            clash = self.overlapping(ptr, ptr + max(nbytes, 1))
            if clash:
                raise InvalidArgument(
                    f"data_ptr: region [{ptr:#x}, {ptr + nbytes:#x}) would overlap "
                    f"{clash[0].describe()}")
            # Freed memory the pool keeps is the runtime's: a later allocation lands on it.
            pooled = self.pool.overlapping(ptr, ptr + max(nbytes, 1))
            if pooled:
                b = pooled[0]
                raise InvalidArgument(
                    f"data_ptr: region [{ptr:#x}, {ptr + nbytes:#x}) would overlap freed "
                    f"memory [{b.ptr:#x}, {b.ptr + b.nbytes:#x}) that the "
                    f"{self.device.name} pool keeps for reuse")
            a = Allocation(self, None, ptr, nbytes, "region", owner or current_owner(), None,
                           keepalive)
            self._add(a)
            return a

    # -- constants ----------------------------------------------------------------------------

    def allocate_constants(self, sizes: list[int], stream: "Stream",
                           owner: Owner | None = None) -> tuple[Allocation, list[int]]:
        """One allocation holding every constant; returns it and each constant's byte offset."""
        offsets, total = [], 0
        for n in sizes:
            if not isinstance(n, int) or n < 0:
                raise InvalidArgument(f"sizes: constant size {n!r} is invalid")
            offsets.append(total)
            total = _round_up(total + n)
        owner = owner or current_owner()
        a = self.allocate(total, stream, owner, kind="constants")
        a.segments = [(o, o + n) for o, n in zip(offsets, sizes) if n > 0]
        owner.allocations.add(a)
        return a, offsets
