"""Finalizers that the garbage collector may start on any thread, run where they cannot hang.

The collector runs pending finalizers on whichever thread happens to allocate. When that is a
stream's worker thread (the cpu device runs queued work on one), a finalizer that frees
memory or closes a delegate may need a lock that the thread waiting for this very worker
holds (`Memory` waits for the stream while it holds its lock): a deadlock that depends only
on when the collector ran. So a finalizer started on a worker thread is handed to one reaper
thread, which runs it after the worker's current work; anywhere else it runs at once, as
before. Explicit calls (`close()`, `release()`) come from the caller's own thread and so
always run at once.
"""

from __future__ import annotations

import logging
import queue
import threading
import weakref
from typing import Any, Callable

log = logging.getLogger(__name__)

_thread_role = threading.local()


def mark_worker_thread() -> None:
    """Mark the calling thread as one that runs queued device work (never block there)."""
    _thread_role.worker = True


def on_worker_thread() -> bool:
    """True on a thread that `mark_worker_thread` marked."""
    return getattr(_thread_role, "worker", False)


class Reaper:
    """One daemon thread that runs finalizers handed off by worker threads, in order."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Callable[..., Any], tuple] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[..., Any], args: tuple) -> None:
        """Queue `fn(*args)` for the reaper thread, starting it on first use."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="aotrt-reaper",
                                                daemon=True)
                self._thread.start()
        self._queue.put((fn, args))

    def drain(self) -> None:
        """Block until every finalizer handed over so far has run."""
        self._queue.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                fn, args = item
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - a finalizer's failure has no caller
                log.warning("finalizer %r failed: %r", getattr(item[0], "__name__", item[0]),
                            e)
            finally:
                self._queue.task_done()


REAPER = Reaper()


def run_or_defer(fn: Callable[..., Any], *args: Any) -> None:
    """Run `fn(*args)` now, or on the reaper thread when called on a worker thread."""
    if on_worker_thread():
        REAPER.submit(fn, args)
    else:
        fn(*args)


def finalizer(obj: Any, fn: Callable[..., Any], *args: Any) -> weakref.finalize:
    """`weakref.finalize(obj, fn, *args)` whose collector-started call never runs `fn` on a
    worker thread (see the module); calling the finalizer explicitly runs it at once."""
    return weakref.finalize(obj, run_or_defer, fn, *args)


def drain() -> None:
    """Wait until every finalizer handed to the reaper has run (tests, orderly shutdown)."""
    REAPER.drain()


__all__ = ["Reaper", "REAPER", "drain", "finalizer", "mark_worker_thread", "on_worker_thread",
           "run_or_defer"]
