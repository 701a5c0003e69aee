"""aotrt/runtime/backends/cpu/stream.py: the cpu stream's worker, with its queue in C
(backends/cpu/queue.py) or, where the device has none, in Python. Native plan segments and
Python work run in queue order; a failure skips what follows until a wait reports it; a
worker that stops never leaves a waiter hanging."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from aotrt.errors import DeviceError, InvalidArgument
from aotrt.runtime.device import StreamOptions, get_device
from aotrt.runtime.backends.cpu import native as cpu_native
from aotrt.runtime.backends.cpu import queue as cpu_queue
from aotrt.runtime.backends.cpu.stream import PRUNE_AT, CpuStream
from aotrt.runtime.work import Work
from tests.conftest import make_stream
from tests.support import FLAG_SOURCE


@pytest.fixture(params=["c", "python"])
def queue_kind(request, monkeypatch) -> str:
    """Each queue a cpu stream may have: the one in C, and the Python one it falls back to."""
    if request.param == "python":
        monkeypatch.setattr(get_device("cpu").libraries, "native_queue", lambda: None)
    return request.param


def _stream(mode: str = "async", check: bool = False) -> CpuStream:
    dev = get_device("cpu")
    s = dev.create_stream(StreamOptions(deferred=mode == "deferred", check_hazards=check))
    assert isinstance(s, CpuStream)
    return s


def _copy_plan(dst: np.ndarray, src: np.ndarray, label: str = "instruction #0"
               ) -> cpu_native.NativePlan:
    """A native plan of one strided copy (one segment)."""
    def work() -> None:
        raise AssertionError("a native work ran from Python")
    work = Work(work, native=lambda: cpu_native.copies([(dst, src)]))
    return cpu_native.NativePlan(get_device("cpu").libraries.native_runner(), [(label, work)])


def _offering(plan: cpu_native.NativePlan):
    """A work that offers the plan's jobs to the stream (as a static plan's command does),
    and runs the plan itself where the stream takes no native jobs."""
    def work() -> None:
        plan()
    work = Work(work, native_jobs=lambda: plan.jobs)
    return work


def test_stream_runs_on_its_own_worker_thread(queue_kind):
    s = make_stream(get_device("cpu"), "async")
    assert isinstance(s, CpuStream)
    assert (s._native is None) == (queue_kind == "python")
    seen = []
    s.record([], lambda: seen.append(threading.current_thread().name))
    s.commit_and_wait()
    assert seen == [f"aotrt-cpu-stream-{s.id}"]
    worker = s._worker
    s.close()
    assert not worker.is_alive()


def test_work_after_a_failure_in_the_same_wait_is_skipped(queue_kind):
    s = make_stream(get_device("cpu"), "deferred")
    log = []
    s.record([], lambda: log.append(1))
    s.record([], lambda: (_ for _ in ()).throw(RuntimeError("bad")))
    s.commit()
    s.record([], lambda: log.append(3))
    with pytest.raises(DeviceError, match="bad"):
        s.commit_and_wait()
    assert log == [1]
    s.record([], lambda: log.append(4))       # reported: the stream runs work again
    s.commit_and_wait()
    assert log == [1, 4]
    s.close()


@pytest.mark.parametrize("mode", ["async", "deferred"])
def test_native_segments_and_python_work_run_in_queue_order(queue_kind, mode):
    """Python work, a native copy, Python work reading what the copy wrote, in order, over
    several commits and waits."""
    srcs = [np.full((64, 48), r, np.float32) for r in range(3)]
    dst = np.zeros((48, 64), np.float32)
    plans = [_copy_plan(dst, src.T) for src in srcs]
    s = _stream(mode)
    seen = []
    for r in range(3):
        s.record([], lambda r=r: seen.append(("before", r, float(dst[0, 0]))))
        s.record([], _offering(plans[r]))
        s.record([], lambda r=r: seen.append(("after", r, float(dst[5, 7]))))
        s.commit()
        if r != 1:
            s.commit_and_wait()
    s.commit_and_wait()
    s.close()
    assert seen == [("before", 0, 0.0), ("after", 0, 0.0), ("before", 1, 0.0),
                    ("after", 1, 1.0), ("before", 2, 1.0), ("after", 2, 2.0)]


def test_the_c_queue_runs_a_segment_without_python():
    """With the queue in C, the plan's segment runs from C: the plan's Python call and the
    offering work's Python body are never used."""
    src = np.arange(12, dtype=np.float32).reshape(3, 4)
    dst = np.zeros((4, 3), np.float32)
    plan = _copy_plan(dst, src.T)
    s = _stream()
    assert s._native is not None

    def work() -> None:
        raise AssertionError("ran from Python")
    work = Work(work, native_jobs=lambda: plan.jobs)
    s.record([], work)
    s.commit_and_wait()
    s.close()
    np.testing.assert_array_equal(dst, src.T)


def test_a_failed_native_step_names_its_instruction_and_skips_what_follows(queue_kind):
    """A kernel that sets its error flag inside a segment: the wait raises its error with
    the instruction's label; the Python work queued after it did not run; the next wait is
    clean."""
    dev = get_device("cpu")
    lib = dev.libraries.c_library(FLAG_SOURCE, ["k_flag"])
    x = np.array([3, 0], np.int64)     # error code 3: an index out of bounds
    ptrs = (cpu_native.ctypes.c_void_p * 1)(x.ctypes.data)

    def work() -> None:
        raise AssertionError("a native work ran from Python")
    work = Work(work, native=lambda: cpu_native.kernel(lib, "k_flag", "k_flag", ptrs, 1, 1))
    plan = cpu_native.NativePlan(dev.libraries.native_runner(), [("instruction #7 (flag)", work)])
    s = _stream("deferred")
    log = []
    s.record([], _offering(plan))
    s.record([], lambda: log.append("after"))
    with pytest.raises(InvalidArgument, match="kernel k_flag") as info:
        s.commit_and_wait()
    assert any("instruction #7 (flag)" in n for n in getattr(info.value, "__notes__", []))
    assert log == []
    x[0] = 0
    s.record([], _offering(plan))
    s.record([], lambda: log.append("again"))
    s.commit_and_wait()
    s.close()
    assert log == ["again"] and x[1] == 7


def test_a_python_failure_skips_the_native_jobs_after_it(queue_kind):
    src = np.ones((8, 8), np.float32)
    dst = np.zeros((8, 8), np.float32)
    plan = _copy_plan(dst, src)
    s = _stream("deferred")
    s.record([], lambda: (_ for _ in ()).throw(RuntimeError("first")))
    s.record([], _offering(plan))
    with pytest.raises(DeviceError, match="first"):
        s.commit_and_wait()
    assert not dst.any()
    s.record([], _offering(plan))
    s.commit_and_wait()
    s.close()
    assert dst.all()


def test_a_full_ring_waits_for_room_and_keeps_the_order():
    """More jobs than the ring holds, queued while the worker is held in a Python job: the
    submit waits for room (releasing the GIL) and every job runs, in order."""
    s = _stream()
    gate = threading.Event()
    seen = []
    src = np.zeros(4, np.float32)
    dst = np.zeros(4, np.float32)
    plan = _copy_plan(dst, src)
    s.record([], lambda: gate.wait(timeout=30))
    s.commit()
    threading.Timer(0.2, gate.set).start()
    n = cpu_queue.RING + 50
    for i in range(n):
        s.record([], _offering(plan) if i % 2 else (lambda i=i: seen.append(i)))
        s.commit()
    s.commit_and_wait()
    s.close()
    assert seen == list(range(0, n, 2))
    assert gate.is_set()


def test_finished_native_jobs_are_let_go_without_a_wait():
    """A stream that queues native jobs and never waits does not keep them (and their
    pins) past PRUNE_AT."""
    src = np.ones(4, np.float32)
    dst = np.zeros(4, np.float32)
    plan = _copy_plan(dst, src)
    s = _stream()
    longest = 0
    for _ in range(3 * PRUNE_AT):
        s.record([], _offering(plan))
        s.commit()
        longest = max(longest, len(s._segments))
        deadline = time.monotonic() + 30
        while s._native.done < s._native.pushed and time.monotonic() < deadline:
            time.sleep(0.001)
    assert longest == PRUNE_AT + 1
    s.commit_and_wait()
    assert s._segments == [] and dst.all()
    s.close()


def test_a_segment_of_a_closed_library_is_refused_at_the_wait(queue_kind):
    """A queued plan whose kernel library was closed is not run: the wait reports it."""
    dev = get_device("cpu")
    lib = dev.libraries.c_library(FLAG_SOURCE, ["k_flag"])
    x = np.array([0, 0], np.int64)
    ptrs = (cpu_native.ctypes.c_void_p * 1)(x.ctypes.data)

    def work() -> None:
        raise AssertionError("a native work ran from Python")
    work = Work(work, native=lambda: cpu_native.kernel(lib, "k_flag", "k_flag", ptrs, 1, 1))
    plan = cpu_native.NativePlan(dev.libraries.native_runner(), [("instruction #2 (flag)", work)])
    lib.close()
    s = _stream()
    s.record([], _offering(plan))
    with pytest.raises(InvalidArgument, match="closed"):
        s.commit_and_wait()
    s.close()
    assert x[1] == 0


def test_a_worker_that_stops_fails_every_wait_instead_of_hanging(monkeypatch):
    """Should the worker's loop itself fail, each wait raises at once, naming it."""
    def broken(self) -> int:
        raise RuntimeError("the loop broke")
    monkeypatch.setattr(cpu_queue.NativeQueue, "next", broken)
    s = _stream()
    s._worker.join(timeout=10)
    assert not s._worker.is_alive()
    # "At once", deterministically: any wait the stream still makes in C is one that the
    # dead worker's abandon() has already satisfied, so none can block.
    real_wait = cpu_queue.NativeQueue.wait

    def wait(self: cpu_queue.NativeQueue, seq: int | None = None) -> None:
        target = self.pushed if seq is None else seq
        assert self.done >= target, f"a wait for job {target} with {self.done} done blocks"
        real_wait(self, seq)

    monkeypatch.setattr(cpu_queue.NativeQueue, "wait", wait)
    s.record([], lambda: None)
    with pytest.raises(DeviceError, match="its worker stopped.*the loop broke"):
        s.commit_and_wait()
    with pytest.raises(DeviceError, match="its worker stopped"):
        s.commit_and_wait()
    s.close()
    assert s.closed and s._native._q is None


def test_close_stops_the_worker_and_frees_the_queue(queue_kind):
    s = _stream()
    s.record([], lambda: None)
    s.commit()
    worker = s._worker
    s.close()
    assert not worker.is_alive()
    if queue_kind == "c":
        assert s._native._q is None
