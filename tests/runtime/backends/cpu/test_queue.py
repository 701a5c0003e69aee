"""aotrt/runtime/backends/cpu/queue.py: the stream queue in C, driven here by a worker thread
of the test's own (the stream's use of it is in test_stream.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from aotrt.runtime.device import get_device
from aotrt.runtime.backends.cpu import native as cpu_native
from aotrt.runtime.backends.cpu import queue as cpu_queue
from aotrt.runtime.work import Work


@pytest.fixture
def q():
    queue = cpu_queue.NativeQueue(get_device("cpu").libraries.native_runner())
    yield queue
    queue.free()


def _segment(dst: np.ndarray, src: np.ndarray) -> cpu_native.Segment:
    def work() -> None:
        raise AssertionError("ran from Python")
    work = Work(work, native=lambda: cpu_native.copies([(dst, src)]))
    runner = get_device("cpu").libraries.native_runner()
    (seg,) = cpu_native.NativePlan(runner, [("copy", work)]).jobs
    return seg


def _worker(q: cpu_queue.NativeQueue, seen: list) -> threading.Thread:
    """A worker as the stream's: native jobs run in C; it records each Python job's turn."""
    def loop() -> None:
        while True:
            kind = q.next()
            seen.append(kind)
            q.finish(False)
            if kind == cpu_queue.STOP:
                return
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def test_jobs_run_in_order_and_a_wait_covers_its_sequence_number(q):
    src = np.arange(6, dtype=np.float32)
    dst = np.zeros(6, np.float32)
    seg = _segment(dst, src)
    seen: list[int] = []
    assert q.push(cpu_queue.PYTHON) == 1            # queued before any worker exists
    assert q.push(cpu_queue.NATIVE, seg.ptrs, seg.n, 1, 0) == 2
    assert q.done == 0
    t = _worker(q, seen)
    q.wait(2)
    assert q.done >= 2 and seen[:1] == [cpu_queue.PYTHON]
    np.testing.assert_array_equal(dst, src)
    q.push(cpu_queue.STOP)
    q.wait()
    t.join(timeout=10)
    assert seen == [cpu_queue.PYTHON, cpu_queue.STOP] and q.done == 3


def test_a_failed_job_skips_native_jobs_until_it_is_taken(q):
    """A native job that fails (an unknown step kind) sets the flag; the next native job
    is skipped; take_failed clears it and native jobs run again."""
    src = np.ones(4, np.float32)
    dst = np.zeros(4, np.float32)
    good = _segment(dst, src)
    bad = _segment(np.zeros(4, np.float32), src)
    bad.array[0].kind = 99
    seen: list[int] = []
    t = _worker(q, seen)
    q.push(cpu_queue.NATIVE, bad.ptrs, bad.n, 1, 0)
    q.push(cpu_queue.NATIVE, good.ptrs, good.n, 1, 0)
    q.wait()
    assert q.failed and not dst.any()
    assert int(bad.out[0]) == 1 and int(bad.out[1]) == -1
    assert q.take_failed() and not q.failed
    q.push(cpu_queue.NATIVE, good.ptrs, good.n, 1, 0)
    q.wait()
    assert dst.all()
    q.push(cpu_queue.STOP)
    t.join(timeout=10)


def test_abandon_lets_every_wait_return(q):
    """With no worker left, waits return at once (the stream then raises its error)."""
    q.push(cpu_queue.PYTHON)
    q.abandon()
    q.wait()
    q.wait(10**6)
    assert q.failed
