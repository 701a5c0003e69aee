"""The cpu device's stream: recorded work runs in order on a worker thread once committed,
from a queue in C (backends/cpu/queue.py) where the device can build one, else from a Python
queue."""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import threading
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from aotrt.errors import AotrtError, DeviceError
from aotrt.runtime import finalize
from aotrt.runtime.device import Stream, StreamOptions
from aotrt.runtime.backends.cpu import native as cpu_native
from aotrt.runtime.backends.cpu import queue as cpu_queue
from aotrt.runtime.tensor import Handle, host_array
from aotrt.runtime.work import Work, native_jobs_of

if TYPE_CHECKING:
    from aotrt.runtime.backends.cpu.device import CpuDevice

log = logging.getLogger(__name__)

#: native jobs a stream queues without a wait before it unpins the finished ones
PRUNE_AT = 64


class Worker(threading.local):
    """The calling thread's state as a stream's worker (`CpuDevice.worker`): `threads`, its
    kernel thread count (set by the stream), and the library ops' scratch."""

    def __init__(self) -> None:
        self._scratch: np.ndarray | None = None

    def scratch(self, nbytes: int) -> np.ndarray:
        """`nbytes` of 64-byte aligned scratch (uint8, contents undefined) for the command
        running on this thread, kept per thread and grown as needed, so that library ops do
        not fault in fresh pages on every run (a 27 MB score block of Whisper's attention
        took 5 ms more in fresh memory). A command may hold one scratch at a time; the next
        call on the same thread reuses its bytes."""
        buf = self._scratch
        if buf is None or buf.nbytes < nbytes:
            self._scratch = None                    # the old one goes before the new one
            raw = np.empty(nbytes + 64, np.uint8)
            start = -raw.ctypes.data % 64
            buf = self._scratch = raw[start:start + nbytes]
        return buf[:nbytes]


class CpuStream(Stream):
    """Recorded work runs in order on a worker thread once committed.

    In deferred mode nothing runs until a wait, so a missing wait shows up every time.
    A kernel call on the worker may use `options.threads` threads (default: every core).
    """

    def __init__(self, device: "CpuDevice", options: StreamOptions) -> None:
        super().__init__(device, options)
        self.threads = options.kernel_threads
        self._open: list[Callable[[], None]] = []
        self._deferred: list[list[Callable[[], None]]] = []
        self._error: BaseException | None = None
        # The queue in C (cpu_queue.py), where the device can build it; else a Python one.
        self._native = device.libraries.native_queue()
        self._batches: collections.deque[list[Callable[[], None]]] = collections.deque()
        # Native jobs queued and not yet waited for: (sequence number, segment, its pins).
        self._segments: list[tuple[int, Any, contextlib.ExitStack | None]] = []
        self._dead: DeviceError | None = None
        self._queue: queue.Queue = queue.Queue()
        target = self._run if self._native is None else self._run_native
        self._worker = threading.Thread(target=target, name=f"aotrt-cpu-stream-{self.id}",
                                        daemon=True)
        self._worker.start()

    def _start_worker(self) -> None:
        # Finalizers the collector starts here go to the reaper (runtime/finalize.py).
        finalize.mark_worker_thread()
        # Kernel work reads its thread count from the thread it runs on (the work objects
        # are built without a stream, and a prepared one serves every stream).
        self.device.worker.threads = self.threads
        # oneDNN (GNU OpenMP build) sizes its parallel regions from the calling thread's
        # OpenMP thread count, not from ours: without this, threads=1 still ran its
        # convolutions and matmuls on every core.
        self.device.openmp.set_threads(self.threads)

    def _run(self) -> None:
        self._start_worker()
        while True:
            batch = self._queue.get()
            try:
                if batch is None:
                    return
                if self._error is None:
                    for work in batch:
                        work()
            except BaseException as e:  # noqa: BLE001 - reported to the waiter
                self._error = e
            finally:
                self._queue.task_done()

    def _run_native(self) -> None:
        q = self._native
        try:
            self._start_worker()
            with q.library.pinned("cpu stream queue"):
                while True:
                    kind = q.next()         # runs native jobs, without the GIL
                    if kind != cpu_queue.PYTHON:
                        q.finish(False)
                        return
                    batch, failed = self._batches.popleft(), False
                    try:
                        if self._error is None and not q.failed:
                            for work in batch:
                                work()
                    except BaseException as e:  # noqa: BLE001 - reported to the waiter
                        self._error, failed = e, True
                    finally:
                        q.finish(failed)
        except BaseException as e:  # noqa: BLE001 - no waiter may hang on a dead worker
            self._dead = DeviceError(f"cpu stream {self.id}: its worker stopped: {e!r}")
            q.abandon()

    def _record(self, work: Any) -> None:
        self._open.append(work)

    def _submit(self) -> None:
        batch, self._open = self._open, []
        if self.options.deferred:
            self._deferred.append(batch)
        else:
            self._enqueue(batch)

    def _enqueue(self, batch: list[Callable[[], None]]) -> None:
        """Queue a batch; with the queue in C, a work that offers native jobs
        (`work.native_jobs()`, cpu_native.NativePlan.jobs) has its segments run from C."""
        q = self._native
        if q is None:
            self._queue.put(batch)
            return
        if self._dead is not None:
            raise self._dead
        if len(self._segments) > PRUNE_AT:
            self._prune()
        python: list[Callable[[], None]] = []
        for work in batch:
            offer = native_jobs_of(work)
            jobs = offer() if offer is not None else None
            if jobs is None:
                python.append(work)
                continue
            for job in jobs:
                if not isinstance(job, cpu_native.Segment):
                    python.append(job)
                    continue
                try:
                    pins = job.pinned() if job.runs_on(self._worker.ident) else False
                except AotrtError:
                    pins = False    # a closed library: its run on the worker reports it
                if pins is False:
                    python.append(job.run)
                    continue
                if python:
                    self._push_python(python)
                    python = []
                seq = q.push(cpu_queue.NATIVE, job.ptrs, job.n, self.threads, job.wait_fn)
                self._segments.append((seq, job, pins))
        if python:
            self._push_python(python)

    def _prune(self) -> None:
        """Unpin the finished native jobs of a stream that queues without waiting (their
        failure, if one failed, stays for the wait to report)."""
        if self._native.failed:
            return
        done, keep = self._native.done, []
        for seq, seg, pins in self._segments:
            if seq <= done:
                if pins is not None:
                    pins.close()
                seg.account()
            else:
                keep.append((seq, seg, pins))
        self._segments = keep

    def _push_python(self, batch: list[Callable[[], None]]) -> None:
        self._batches.append(batch)
        self._native.push(cpu_queue.PYTHON)

    def _wait(self) -> None:
        for batch in self._deferred:
            self._enqueue(batch)
        self._deferred.clear()
        q = self._native
        if q is None:
            self._queue.join()
            err = self._error
        else:
            q.wait()                # without the GIL
            if self._dead is not None:
                raise self._dead
            err = self._error
            segments, self._segments = self._segments, []
            failed = q.take_failed()
            for _, seg, pins in segments:
                if pins is not None:
                    pins.close()
                if not failed:
                    seg.account()
                    continue
                try:
                    seg.check()
                except BaseException as e:  # noqa: BLE001 - the first failure is raised
                    err = err or e
            if failed and err is None:
                err = DeviceError(f"cpu stream {self.id}: a native job failed")
        if err is not None:
            self._error = None
            if isinstance(err, AotrtError):
                raise err       # a kernel's own error (contract C2), as it was raised
            raise DeviceError(f"cpu stream {self.id}: queued work failed: {err!r}") from err

    def _final_wait(self) -> None:
        """The close's wait; a stream whose worker stopped closes without the wait it can no
        longer make."""
        if self._dead is not None:
            return
        try:
            super()._final_wait()
        except DeviceError:
            if self._dead is None:
                raise

    def _close(self) -> None:
        q = self._native
        if q is None:
            self._queue.put(None)
        else:
            q.push(cpu_queue.STOP)
        self._worker.join(timeout=10)
        if self._worker.is_alive():
            # Only work that outlived the close's own wait can keep it: the daemon thread is
            # left to finish it, and the libraries it runs stay mapped (LoadedLibrary.close).
            # Its native queue stays allocated too.
            log.warning("cpu stream %d: worker still busy after close; left running", self.id)
        elif q is not None:
            for _, _, pins in self._segments:
                if pins is not None:
                    pins.close()
            self._segments.clear()
            q.free()

    def _copy_work(self, dst: Handle, src: Handle) -> Any:
        def work() -> None:
            np.copyto(host_array(dst), host_array(src))

        return Work(work, native=lambda: cpu_native.copies(
            [(host_array(dst), host_array(src))]))

    def _fill_work(self, view: Handle, byte: int) -> Any:
        value = np.frombuffer(bytes([byte]) * view.dtype.itemsize, dtype=view.dtype.np)[0]

        def work() -> None:
            host_array(view)[...] = value
        return work
