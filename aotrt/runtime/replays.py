"""What a delegate replays instead of building its steps at each run: a captured CUDA graph
over static input/output buffers (`GraphReplay`), or, on a host device, every step's
commands planned once over such buffers (`StaticIO`). The static inputs live in the arena
where it has room for them (`arena_homes`)."""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from aotrt.analysis import referenced
from aotrt.dtypes import as_dtype
from aotrt.errors import AotrtError
from aotrt.runtime import shims
from aotrt.runtime.arguments import Arg
from aotrt.runtime.device import Command, Stream
from aotrt.runtime.hazards import Access
from aotrt.runtime.memory import PROCESS_OWNER, owner_scope
from aotrt.runtime.public import Tensor
from aotrt.runtime.tensor import Handle
from aotrt.runtime.work import Work

if TYPE_CHECKING:   # the delegate imports this module
    from aotrt.program.records import InstructionRecord, TensorRecord
    from aotrt.runtime.delegate import Delegate
    from aotrt.runtime.outputs import Outputs

log = logging.getLogger(__name__)


@dataclass
class GraphReplay:
    """A captured run: the graph, its static input/output buffers (uint8 bases), the views
    the capture used, and the accesses a replay makes (every allocation it can touch); the
    outputs' views over `outs` are the delegate's (runtime/outputs.py)."""

    graph: Any
    ins: list[Handle]
    outs: list[Handle]
    keep: list[Handle]
    accesses: list[Any]
    in_ptrs: list[int]


def capture(d: Delegate) -> GraphReplay:
    """Static input/output buffers, one eager warm-up over them (plans, workspaces and
    kernels get made), then the whole instruction list captured as one CUDA graph."""
    stream = d._stream
    keep: list[Handle] = []
    try:
        ins, outs, handles = d._static_buffers(keep)
        for b in ins:
            stream.fill(b, 0)
        # The warm-up runs the method on zeros: the state it writes is put back after.
        saved = d._loaded.snapshot_state()
        d._execute(handles)
        stream.label = ""
        d._loaded.restore_state(saved)
        stream.begin_capture()
        try:
            d._execute(handles)
        except BaseException:
            stream.abort_capture()
            raise
        finally:
            stream.label = ""
        graph = stream.end_capture()
    except BaseException:
        # The static buffers go now, not with the delegate (it may run on without a
        # graph), once the warm-up run over them is done.
        try:
            stream.commit_and_wait()
        except AotrtError as e:
            log.debug("%s: queued work before a failed capture: %s", d.name, e)
        for h in reversed(keep):
            if h.state == "live":
                shims.delete_tensor_object(h)
        raise
    allocs = {h.alloc for h in [*d._static, *ins, *outs]
              if h is not None and h.alloc is not None}
    accesses = [Access(a, 0, a.nbytes, True) for a in allocs]
    return GraphReplay(graph, ins, outs, keep, accesses, [h.address for h in ins])


def lean_ok(stream: Stream, args: list[Arg], outs: list[Arg] | None) -> bool:
    """Whether a run can take a lean replay: no out= tensors, the hazard checker off (it
    keeps its full checks), work enqueued at once, and every input bound where it lies in
    memory the runtime does not know (the general path handles aotrt memory, staging and
    overlaps)."""
    if outs is not None or stream.hazards.enabled or stream.options.deferred:
        return False
    mem = stream.device.memory
    for a in args:
        if a.kind == "empty":
            continue
        if a.kind != "blob" or a.span is None:
            return False
        if mem.knows(*a.span):
            return False
    return True


class StaticIO:
    """Every step's commands, planned over static input/output buffers (uint8 bases); a lean
    run binds its outputs through `outputs` (the delegate's, runtime/outputs.py)."""

    def __init__(self, stream: Stream, outputs: Outputs | None = None) -> None:
        self.stream = stream
        self.outputs = outputs
        self.ins: list[Handle] = []
        self.outs: list[Handle] = []
        self.keep: list[Handle] = []        # every handle made for the plan, bases first
        self.steps: list[tuple[str, tuple[Command, ...]]] = []
        self._whole: Command | None = None
        # Where a lean run's outputs go, and the command copying them there, made once.
        self._out_slot = np.zeros(1, np.uint64)
        self._out_moves: Callable[[], None] | None = None
        self.native: Any = None     # the device's native plan of the steps, once made

    def delete(self) -> None:
        """Delete the plan's handles, views before their bases, once its work is done."""
        try:
            self.stream.commit_and_wait()
        except AotrtError as e:
            # After a failed run: its error is the one the caller gets, not this report of it.
            log.debug("static-I/O plan: queued work before its deletion: %s", e)
        for h in reversed(self.keep):
            if h.state == "live":
                shims.delete_tensor_object(h)
        self.keep.clear()

    def run_lean(self, args: list[Arg]) -> tuple[Tensor, ...]:
        """One run with little Python: the inputs copied in once the last run is done with
        them, the plan queued and submitted, one command copying every output root into one
        fresh allocation, and the results made as views of it (a run's outputs share it).

        The plan stays on the stream's worker even where it is wholly native: run on the
        calling thread, its oneDNN calls made a second OpenMP team, and with more pool
        threads than cores libgomp sleeps between parallel regions instead of spinning
        (MobileNet-v2 8.9 against 5.5 ms a run, 2 cores, 2026-12-04)."""
        stream, dev, o = self.stream, self.stream.device, self.outputs
        stream.commit_and_wait()
        for dst, a in zip(self.ins, args):
            if a.spec.nbytes:
                ctypes.memmove(dst.address, a.ptr, a.spec.nbytes)
        self.queue()
        stream.commit()         # the worker starts; a native plan needs no GIL meanwhile
        with owner_scope(PROCESS_OWNER):
            # Every output root at its offset in one allocation (Outputs' packed layout).
            base = shims.empty_strided(o.packed_sizes, [1], as_dtype("uint8"), dev)
            try:
                if self._out_moves is None:
                    moves = [(at, src.address, n) for at, src, n
                             in zip(o.packed_at, self.outs, o.nbytes) if n]
                    self._out_moves = _moves_to(self._out_slot, moves, dev)
                # The last run's outputs were copied out before its wait returned.
                self._out_slot[0] = base.address
                stream.record([*(h.access(write=False) for h in self.outs),
                               base.access(write=True)], self._out_moves, "outputs")
                stream.commit()
                return o.tensors((base,), o.packed_views)
            finally:
                shims.delete_tensor_object(base)      # the results keep the memory alive

    def _made(self, plan: Any) -> None:
        self.native = plan

    def queue(self) -> None:
        """Queue every planned command again: as one command without the hazard checker,
        else each under its instruction's label, so that the checker sees each one."""
        stream = self.stream
        if not stream.hazards.enabled:
            if self._whole is None:
                self._whole = _whole(self.steps, stream.device, self._made)
            stream.replay(self._whole)
            return
        try:
            for label, cmds in self.steps:
                stream.label = label
                for cmd in cmds:
                    stream.replay(cmd)
        finally:
            stream.label = ""


def _moves_to(slot: np.ndarray, moves: list[tuple[int, int, int]], device: Any
              ) -> Callable[[], None]:
    """memmoves (dst offset, src address, bytes) to the address `slot` holds at the time
    they run; through the device's native plan where it has one."""
    def work() -> None:
        base = int(slot[0])
        for off, src, n in moves:
            ctypes.memmove(base + off, src, n)

    moved = Work(work, native=lambda: device.native_moves(slot, moves))
    try:
        plan = device.native_plan([("outputs", moved)])
    except (AotrtError, OSError) as e:
        log.debug("lean run: its outputs are copied from Python (%s)", e)
        plan = None
    if plan is None:
        return moved
    return Work(work, native=moved.native, native_jobs=lambda: plan.jobs)


def _whole(steps: Sequence[tuple[str, tuple[Command, ...]]], device: Any,
           made: Callable[[Any], None]) -> Command:
    """One command running every step's work in order, touching what they touch: recording
    a command took about 20 us of run()'s Python, 1.5 ms of YOLOv8n's 82 (2 cores), and the
    worker started only once 16 were recorded. From the second run on, the works run through
    the device's native plan where it has one (`Device.native_plan`): the first run has set
    up what they set up once. `made` is given the native plan once it is made."""
    works = []
    merged: dict[Any, tuple[int, int, bool]] = {}
    for label, cmds in steps:
        for cmd in cmds:
            works.append((label, cmd.work))
            for acc in cmd.accesses:
                lo, hi, write = merged.get(acc.alloc, (acc.start, acc.end, False))
                merged[acc.alloc] = (min(lo, acc.start), max(hi, acc.end), write or acc.write)
    accesses = tuple(Access(alloc, lo, hi, write) for alloc, (lo, hi, write) in merged.items())
    in_python = _python(works)
    runs: list[Callable[[], None]] = []      # how later runs run them, once the first ran

    def run_all() -> None:
        if runs:
            runs[0]()
            return
        in_python()
        try:
            plan = device.native_plan(works)
        except (AotrtError, OSError) as e:
            log.debug("static-I/O plan: no native plan (%s); its works run from Python", e)
            plan = None
        runs.append(plan if plan is not None else in_python)
        if plan is not None:
            made(plan)

    # A stream with its queue in C runs the plan's native segments itself (cpu_queue.py).
    def native_jobs() -> list[Any] | None:
        return getattr(runs[0], "jobs", None) if runs else None
    return Command(accesses, Work(run_all, native_jobs=native_jobs), "static-I/O plan")


def _python(works: Sequence[tuple[str, Callable[[], None]]]) -> Callable[[], None]:
    """The works run one by one from Python; a failure names its instruction."""
    def run_all() -> None:
        label = ""
        try:
            for label, work in works:
                work()
        except BaseException as e:
            e.add_note(f"in {label}")       # the instruction, as its own command's label
            raise
    return run_all


#: byte alignment of a static input placed in the arena (cuDNN and vector loads want 16)
HOME_ALIGN = 256


def _extent(t: TensorRecord) -> tuple[int, int] | None:
    """The bytes [lo, hi) of a program tensor's view within its root; None when empty."""
    sizes, strides = t.sizes, t.strides
    if any(n == 0 for n in sizes):
        return None
    span = sum((n - 1) * abs(st) for n, st in zip(sizes, strides)) + 1
    return t.byte_offset, t.byte_offset + span * t.dtype.itemsize


def arena_homes(tensors: Sequence[TensorRecord], instructions: Sequence[InstructionRecord],
                arena_nbytes: int,
                nbytes: Sequence[int]) -> list[int | None]:
    """A byte offset in the arena for each program input's static buffer (`nbytes[k]`
    bytes), or None where the arena has no room for it.

    Input k may take arena bytes that no instruction up to its last reader touches, apart
    from the other inputs and from bytes a later instruction reads before any writes them:
    its values are dead after that reader, and every later use of the bytes starts by
    overwriting them, so a program that reads arena bytes it never wrote still reads the
    zeros the arena starts with (tests/test_limits.py). A replay copies its inputs in
    before the first instruction, on the same stream as the replay before it. A static
    input then costs no memory of its own (ResNet-50 at batch 32: 9.2 MiB).
    """
    readers: dict[int, int] = {}
    for i, ins in enumerate(instructions):
        for tid in referenced(ins):
            t = tensors[tid]
            if t.root == "input":
                readers[t.index] = i
    taken: list[tuple[int, int]] = []
    homes: list[int | None] = []
    for k, size in enumerate(nbytes):
        last = readers.get(k, -1)
        busy = taken + _read_first(tensors, instructions, last)
        for ins in instructions[:last + 1]:
            for tid in referenced(ins):
                t = tensors[tid]
                ext = _extent(t) if t.root == "arena" else None
                if ext is not None:
                    busy.append(ext)
        home = _first_gap(sorted(busy), arena_nbytes, max(size, 1))
        if home is not None:
            taken.append((home, home + max(size, 1)))
        homes.append(home)
    return homes


def static_inputs(program: Any, static: Sequence[Handle | None], nbytes: Sequence[int],
                  device: Any) -> list[Handle]:
    """The static input buffers (uint8 bases of `nbytes[k]` bytes) of a replay of
    `program`, whose arena and constant views are `static`: in the arena where
    `arena_homes` finds room, else memory of their own."""
    u8 = as_dtype("uint8")
    sizes = [max(n, 1) for n in nbytes]
    record = program.record
    anchor = next((h for h, t in zip(static, record.tensors)
                   if h is not None and t.root == "arena"), None)
    homes = [None] * len(sizes) if anchor is None else arena_homes(
        record.tensors, record.instructions, record.arena_nbytes, sizes)
    return [shims.empty_strided([n], [1], u8, device) if home is None else
            shims.reinterpret_tensor(anchor, [n], [1], home - anchor.byte_offset, dtype=u8)
            for n, home in zip(sizes, homes)]


def _read_first(tensors: Sequence[TensorRecord], instructions: Sequence[InstructionRecord],
                after: int) -> list[tuple[int, int]]:
    """Arena byte ranges that an instruction past index `after` may read before any
    instruction past it writes them. Only a library op's outputs (not also among its
    inputs) and a copy's destination count as writes, and only when dense (a strided
    view's extent has bytes it does not write); a kernel's arguments count as reads."""
    written: list[tuple[int, int]] = []     # merged, sorted ranges written so far
    unsafe: list[tuple[int, int]] = []
    for ins in instructions[after + 1:]:
        if ins.op == "library":
            reads = [t for t in ins.ins if t is not None]
            writes = [t for t in ins.outs if t is not None and t not in reads]
        elif ins.op == "copy":
            reads, writes = list(ins.ins), list(ins.outs)
        else:
            reads, writes = list(ins.args), []
        for tid in reads:
            t = tensors[tid]
            ext = _extent(t) if t.root == "arena" else None
            if ext is not None:
                unsafe += _minus(ext, written)
        for tid in writes:
            t = tensors[tid]
            ext = _extent(t) if t.root == "arena" else None
            if ext is not None and _dense(t, ext):
                written = _merged(written + [ext])
    return unsafe


def _dense(t: TensorRecord, ext: tuple[int, int]) -> bool:
    """Whether a view's elements fill its byte extent (it writes every byte of it)."""
    numel = 1
    for n in t.sizes:
        numel *= n
    return numel * t.dtype.itemsize == ext[1] - ext[0]


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, overlapping or touching ranges joined."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _minus(ext: tuple[int, int], covered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of `ext` outside the sorted, merged `covered` ranges."""
    lo, hi = ext
    parts: list[tuple[int, int]] = []
    for c_lo, c_hi in covered:
        if c_hi <= lo or c_lo >= hi:
            continue
        if c_lo > lo:
            parts.append((lo, c_lo))
        lo = max(lo, c_hi)
    if lo < hi:
        parts.append((lo, hi))
    return parts


def _first_gap(busy: list[tuple[int, int]], limit: int, size: int) -> int | None:
    """The lowest aligned offset of `size` free bytes below `limit`, past sorted `busy`."""
    at = 0
    for lo, hi in busy:
        if lo - at >= size:
            return at
        at = max(at, -(-hi // HOME_ALIGN) * HOME_ALIGN)
    return at if limit - at >= size else None


__all__ = ["GraphReplay", "StaticIO", "arena_homes", "static_inputs"]
