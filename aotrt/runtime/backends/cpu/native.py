"""The native plan runner of the cpu device: a static plan's works whose calls are fixed at
load (oneDNN primitives, generated and compiled kernels, copies) run from one C loop, one
ctypes call for every run of them in a row, with the GIL released throughout.

A work closure offers its native form as `work.native()`: a `Native` (its steps, and what
they need kept alive, pinned and counted), or None while it still has something to do in
Python (its first run sets memory handles and packs weights). Python between two oneDNN
calls cost about 7 us a call where the caches are cold after a convolution (MobileNet-v2's
53: 5.01 against 4.63 ms a run, 2 cores, 2026-12-04), and each such gap let the OpenMP
pool go to sleep.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from aotrt.errors import DeviceError
from aotrt.runtime.work import Work, native_of
from aotrt.sources import source

#: step kinds (the C loop's switch); MOVE_AT: a memmove to the address held in `a`, plus `m`
DNNL, KERNEL, MOVE, COPY, MOVE_AT = 1, 2, 3, 4, 5
#: dims a strided copy step takes (more go to numpy)
COPY_DIMS = 4
SYMBOL = "aotrt_run_steps"

SOURCE = source(__package__, "native.c")


class Step(ctypes.Structure):
    """One step of the C loop (aotrt_step)."""

    _fields_ = [("kind", ctypes.c_int64), ("fn", ctypes.c_void_p), ("a", ctypes.c_void_p),
                ("b", ctypes.c_void_p), ("n", ctypes.c_int64), ("m", ctypes.c_int64),
                ("flag", ctypes.c_void_p), ("geo", ctypes.c_void_p)]


@dataclass
class Native:
    """One work's native form: its steps (Step field tuples) and what they need."""

    steps: list[tuple[int, int, int, int, int, int, int, int]]
    keep: list[Any] = field(default_factory=list)   # what the addresses point into
    library: Any = None     # a LoadedLibrary kept mapped while the steps run (its flag)
    label: str = ""         # the kernel's name, in its error
    dnnl: Any = None        # the Dnnl whose calling-thread stream the steps run on
    counts: dict[str, int] = field(default_factory=dict)   # added to dnnl.stats per run


def kernel(library: Any, symbol: str, label: str, ptrs: Any, n: int,
           threads: int) -> Native:
    """A compiled kernel's call over [0, n) on `threads` threads, `ptrs` its pointers."""
    fn, flag = library.address(symbol)
    return Native([(KERNEL, fn, ctypes.addressof(ptrs), 0, n, max(int(threads), 1), flag, 0)],
                  keep=[ptrs], library=library, label=label)


def kernel_work(library: Any, symbol: str, label: str, ptrs: Any, n: int, worker: Any,
                keep: Sequence[Any] = ()) -> Work:
    """A compiled kernel's call over [0, n) as a stream's Work: from Python through the
    library, or natively, on the worker's threads; `keep` lives as long as the work."""
    def run() -> None:
        library.call(symbol, label, ptrs, n, getattr(worker, "threads", 1))

    def native() -> Native:
        return kernel(library, symbol, label, ptrs, n, getattr(worker, "threads", 1))

    return Work(run, native=native, keep=(*keep, ptrs, library))


def address(x: Any) -> int:
    """The address a ctypes pointer (or an int) holds."""
    return x if isinstance(x, int) else (ctypes.cast(x, ctypes.c_void_p).value or 0)


def strided_copy(dst: np.ndarray, src: np.ndarray, keep: list[Any]
                 ) -> tuple[int, int, int, int, int, int, int, int] | None:
    """The step copying `src` into `dst` (equal shapes, dtypes and non-negative strides),
    its geometry appended to `keep`; None where the C loop does not take it.

    The dims are taken in dst's memory order and merged where both sides are contiguous
    across them, so that the inner loop copies rows (a channels-last slice in NCHW dim
    order had its elements copied one at a time, 6 ms more for YOLOv8n)."""
    if dst.shape != src.shape or dst.dtype != src.dtype:
        return None
    if any(s < 0 for s in (*dst.strides, *src.strides)) or dst.size == 0:
        return None
    d0, s0 = dst.ctypes.data, src.ctypes.data
    d1 = d0 + sum((n - 1) * st for n, st in zip(dst.shape, dst.strides)) + dst.itemsize
    s1 = s0 + sum((n - 1) * st for n, st in zip(src.shape, src.strides)) + src.itemsize
    if d0 < s1 and s0 < d1:
        return None         # numpy orders an overlapping copy; memcpy would not
    dims = sorted(((n, ds, ss) for n, ds, ss in zip(dst.shape, dst.strides, src.strides)
                   if n != 1), key=lambda d: (d[1], d[2]), reverse=True)
    merged: list[tuple[int, int, int]] = []
    for n, ds, ss in dims:
        if merged and merged[-1][1] == n * ds and merged[-1][2] == n * ss:
            m = merged.pop()
            n = n * m[0]
        merged.append((n, ds, ss))
    if len(merged) > COPY_DIMS:
        return None
    pad = [(1, 0, 0)] * (COPY_DIMS - len(merged))
    merged = pad + merged
    geo = np.array([dst.itemsize, *(d[0] for d in merged), *(d[1] for d in merged),
                    *(d[2] for d in merged), _transposed(merged, dst.itemsize)], np.int64)
    keep += [geo, dst, src]
    return (COPY, 0, d0, s0, 0, 0, 0, geo.ctypes.data)


def _transposed(dims: list[tuple[int, int, int]], itemsize: int) -> int:
    """The dim (of the first three) along which src is contiguous, where dst is contiguous
    along the last and src is not: the copy then goes tile by tile (-1: row by row)."""
    n3, ds3, ss3 = dims[-1]
    if ds3 != itemsize or ss3 == itemsize or n3 < 4:
        return -1
    for k, (n, _, ss) in enumerate(dims[:-1]):
        if ss == itemsize and n >= 4:
            return k
    return -1


def copies(pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> Native | None:
    """The native form of copies (dst, src) made in order; None where one is not taken."""
    keep: list[Any] = []
    steps = [strided_copy(d, s, keep) for d, s in pairs]
    if any(st is None for st in steps):
        return None
    return Native(steps, keep=keep)  # type: ignore[arg-type]


def moves_to(slot: Any, moves: Sequence[tuple[int, int, int]]) -> Native:
    """memmoves (dst offset, src address, bytes) to the address the one-pointer array `slot`
    holds when they run (a lean run's outputs go to a fresh allocation each time)."""
    at = slot.ctypes.data
    return Native([(MOVE_AT, 0, at, src, n, off, 0, 0) for off, src, n in moves if n],
                  keep=[slot])


class Segment:
    """Works in a row that all have a native form: one call of the C loop, made from this
    thread (`run`) or by the stream's queue in C (backends/cpu/queue.py)."""

    def __init__(self, runner: Any, threads: Callable[[], int]) -> None:
        self.runner = runner
        self.threads = threads
        self.natives: list[Native] = []
        self.owners: list[tuple[str, Native]] = []   # per step: (instruction, its work's)

    def add(self, label: str, nat: Native) -> None:
        """Append one work's steps."""
        self.natives.append(nat)
        self.owners += [(label, nat)] * len(nat.steps)

    def seal(self) -> None:
        """Lay the steps out for the C loop, once, for the oneDNN stream of the thread that
        makes it (the stream's worker)."""
        steps = [s for nat in self.natives for s in nat.steps]
        self.n = len(steps)
        self.array = (Step * self.n)(*(Step(*s) for s in steps))
        self.out = np.zeros(2, np.int64)
        self.ptrs = (ctypes.c_void_p * 4)(ctypes.addressof(self.array), None,
                                          self.out.ctypes.data, self.out.ctypes.data + 8)
        libraries: list[Any] = []
        for nat in self.natives:
            if nat.library is not None and all(nat.library is not x for x in libraries):
                libraries.append(nat.library)
        self.libraries = libraries
        self.dnnl = next((n.dnnl for n in self.natives if n.dnnl is not None), None)
        self.thread = threading.get_ident()
        #: the dnnl stream wait's address, called after the steps (0: no oneDNN step)
        self.wait_fn = 0
        if self.dnnl is not None:
            self.ptrs[1] = self.dnnl.stream()
            self.wait_fn = address(self.dnnl.lib.dnnl_stream_wait)
        counts: dict[str, int] = {}
        for nat in self.natives:
            for k, v in nat.counts.items():
                counts[k] = counts.get(k, 0) + v
        self.counts = list(counts.items())

    def run(self) -> None:
        """One call of the C loop over the steps, on this thread; a failed step's error
        names its instruction, as the work's own would have."""
        if self.dnnl is not None:
            self.ptrs[1] = self.dnnl.stream()
        self.out[:] = 0
        with self.pinned(calling=True) or contextlib.nullcontext():
            self.runner.call(SYMBOL, "native plan", self.ptrs, self.n, self.threads())
        self.check()
        if self.dnnl is not None:
            self.dnnl.wait()
        self.account()

    def runs_on(self, thread: int) -> bool:
        """Whether thread `thread` may run the steps from C as laid out (their oneDNN
        stream is its own)."""
        return self.dnnl is None or self.thread == thread

    def pinned(self, calling: bool = False) -> contextlib.ExitStack | None:
        """The libraries the steps call, pinned (mapped) until the stack closes, from any
        thread; None where they call none. `calling`: this thread calls them within the
        stack (a close made there, by a finalizer, leaves the unmapping to the last pin)."""
        if not self.libraries:
            return None
        pins = contextlib.ExitStack()
        try:
            for lib in self.libraries:
                if calling:
                    pins.enter_context(lib.pinned("native plan"))
                else:
                    # A stream pins a segment it queues on run()'s thread and unpins it at
                    # a wait, on whichever thread waits (the closing one, at a close).
                    pins.callback(lib.pin("native plan").release)
        except BaseException:
            pins.close()
            raise
        return pins

    def account(self) -> None:
        """Count one run's oneDNN calls in the device's stats."""
        if self.dnnl is not None:
            stats = self.dnnl.stats
            for k, v in self.counts:
                stats[k] += v

    def check(self) -> None:
        """Raise the error of the step that failed in the last run, if one did."""
        failed, code = int(self.out[0]), int(self.out[1])
        if not failed:
            return
        try:
            if failed > self.n:
                from aotrt.runtime.backends.cpu.dnnl_primitives import check

                check(code, "stream wait")
                raise DeviceError(f"native plan: the oneDNN stream's wait failed ({code})")
            label, nat = self.owners[failed - 1]
            try:
                kind = self.array[failed - 1].kind
                if kind == KERNEL:
                    nat.library.take_error(nat.label)
                elif kind == DNNL:
                    from aotrt.runtime.backends.cpu.dnnl_primitives import check

                    check(code, "primitive execute")
                raise DeviceError(f"native plan: step {failed - 1} failed ({code})")
            except BaseException as e:
                e.add_note(f"in {label}")
                raise
        finally:
            self.out[:] = 0


class NativePlan:
    """A plan's works, run in order: native ones from the C loop, the rest in Python."""

    def __init__(self, runner: Any, works: Sequence[tuple[str, Callable[[], None]]],
                 threads: Callable[[], int] = lambda: 1) -> None:
        """`threads`: the calling thread's kernel thread count, read at each run (copies
        split their rows over them)."""
        #: in order: a Segment, or a work run from Python (its error names its instruction)
        self.jobs: list[Any] = []
        seg: Segment | None = None
        for label, work in works:
            make = native_of(work)
            nat = make() if make is not None else None
            if nat is None:
                seg = None
                self.jobs.append(_labelled(label, work))
                continue
            if seg is None:
                seg = Segment(runner, threads)
                self.jobs.append(seg)
            seg.add(label, nat)
        segments = [j for j in self.jobs if isinstance(j, Segment)]
        for seg in segments:
            seg.seal()
        self.segments = len(segments)
        self.steps = sum(seg.n for seg in segments)
        #: every work runs natively
        self.whole = self.segments > 0 and self.segments == len(self.jobs)

    def __call__(self) -> None:
        for job in self.jobs:
            if isinstance(job, Segment):
                job.run()
            else:
                job()


def _labelled(label: str, work: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            work()
        except BaseException as e:
            e.add_note(f"in {label}")       # the instruction, as its own command's label
            raise
    return run
