"""aotrt/runtime/device.py: the device registry, streams (ordering, sync verbs, waits), copy
and fill, and the KernelLibrary / KernelFunction protocol."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from aotrt.errors import DeviceError, HazardError, InvalidArgument
from aotrt import dtypes
from aotrt.kernels import ir
from aotrt.runtime import shims
from aotrt.runtime.memory import Owner, owner_scope
from aotrt.runtime.device import (Device, Stream, StreamOptions, SyncKind, cuda_available,
                                  default_device, get_device, parse_device)
from tests.conftest import DEVICES, make_stream
from tests.support import affine_kernel, copy_kernel, iota, iota_kernel, kernel_fn, rand, upload

# -- registry ---------------------------------------------------------------------------------


def test_get_device_is_one_instance_per_type():
    cpu = get_device("cpu")
    assert isinstance(cpu, Device) and cpu.name == "cpu"
    assert get_device("cpu:0") is cpu and get_device(cpu) is cpu and get_device() is cpu


@pytest.mark.parametrize("spec,match", [
    ("tpu", "unknown device type"), ("cpu:1", "index"), ("cuda:2", "index"), (3, "device name"),
    (None, "device name"), ("", "unknown device type"),
])
def test_parse_device_refuses(spec, match):
    with pytest.raises(InvalidArgument, match="device: .*" + match):
        parse_device(spec)


def test_parse_device_accepts_names_and_devices():
    assert parse_device("cuda:0") == "cuda" and parse_device(get_device("cpu")) == "cpu"


@pytest.mark.skipif(cuda_available(), reason="a CUDA device is present")
def test_unavailable_device_raises_device_error():
    """Bug fixed: a missing driver or module surfaced as ModuleNotFoundError/ImportError."""
    with pytest.raises(DeviceError, match="cuda"):
        get_device("cuda")
    assert default_device() == "cpu" and cuda_available() is False


# -- stream basics ----------------------------------------------------------------------------


def test_new_stream_state(dev):
    s = dev.create_stream(StreamOptions(check_hazards=True))
    assert s.is_empty and s.completed_waits == 0
    assert (s.recorded_seq, s.submitted_seq, s.completed_seq) == (0, 0, 0)
    assert s.hazards.enabled and not s.closed and f"stream {s.id}" in repr(s)
    s.close()


def test_streams_get_distinct_ids(dev):
    a, b = dev.create_stream(), dev.create_stream()
    assert a.id != b.id
    a.close()
    b.close()


def test_create_stream_refuses_other_options(dev):
    with pytest.raises(InvalidArgument, match="options"):
        dev.create_stream({"deferred": True})


@pytest.mark.parametrize("value", [-1, 1.5, "4", None])
def test_stream_options_refuse_bad_flush_intervals(value):
    with pytest.raises(InvalidArgument, match="flush_interval"):
        StreamOptions(flush_interval=value)


def test_stream_options_from_env(monkeypatch):
    monkeypatch.setenv("AOTRT_FLUSH_INTERVAL", "3")
    assert StreamOptions.from_env(deferred=True) == StreamOptions(deferred=True, flush_interval=3)
    assert StreamOptions.from_env(flush_interval=5).flush_interval == 5
    monkeypatch.setenv("AOTRT_FLUSH_INTERVAL", "x")
    with pytest.raises(InvalidArgument, match="AOTRT_FLUSH_INTERVAL"):
        StreamOptions.from_env()


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
def test_stream_threads_must_be_a_positive_int(bad):
    with pytest.raises(InvalidArgument, match="threads: expected a positive int"):
        StreamOptions(threads=bad)


def test_stream_threads_default_to_the_cores_this_process_may_use():
    import os

    assert StreamOptions().kernel_threads == len(os.sched_getaffinity(0))
    assert StreamOptions(threads=5).kernel_threads == 5
    assert StreamOptions.from_env(threads=2).threads == 2


def test_hazard_checking_follows_the_environment(dev, monkeypatch):
    monkeypatch.setenv("AOTRT_CHECK_HAZARDS", "0")
    s = dev.create_stream(StreamOptions())
    assert not s.hazards.enabled
    s.close()
    monkeypatch.setenv("AOTRT_CHECK_HAZARDS", "1")
    s = dev.create_stream(StreamOptions())
    assert s.hazards.enabled
    s.close()


def _log_work(log: list, tag: str, delay: float = 0.0):
    def work() -> None:
        if delay:
            time.sleep(delay)
        log.append(tag)
    return work


def test_record_numbers_commands_and_fills_the_buffer(stream):
    log: list[str] = []
    assert stream.record([], _log_work(log, "a")) == 1
    assert stream.record([], _log_work(log, "b")) == 2
    assert not stream.is_empty and stream.submitted_seq == 0
    stream.commit()
    assert stream.is_empty and stream.submitted_seq == 2
    stream.commit_and_wait()
    assert log == ["a", "b"] and stream.completed_seq == 2


# -- waits cover everything before them (§3 #23/#24, §7.1) -------------------------------------

VERBS = {
    "commit": lambda s: s.commit(),
    "flush": lambda s: s.flush(),
    "commit_and_continue": lambda s: s.commit_and_continue(),
    "synchronize(commit)": lambda s: s.synchronize("commit"),
    "synchronize(FLUSH)": lambda s: s.synchronize(SyncKind.FLUSH),
    "synchronize(COMMIT_AND_CONTINUE)": lambda s: s.synchronize(SyncKind.COMMIT_AND_CONTINUE),
}


@pytest.mark.parametrize("verb", list(VERBS))
def test_a_wait_after_a_submit_covers_the_submitted_work(stream, verb):
    """The anchor's commit dropped the buffer, so a later wait did not wait for it."""
    log: list[str] = []
    stream.record([], _log_work(log, "slow", delay=0.05))
    VERBS[verb](stream)
    assert stream.is_empty
    waits = stream.completed_waits
    stream.commit_and_wait()
    assert log == ["slow"]
    assert stream.completed_waits == waits + 1 and stream.completed_seq == stream.recorded_seq


def test_a_wait_covers_every_earlier_batch_in_order(stream):
    log: list[str] = []
    for i, verb in enumerate(["commit", "flush", "commit_and_continue", "commit"]):
        stream.record([], _log_work(log, f"w{i}", delay=0.01 * (i % 2)))
        VERBS[verb](stream)
    stream.record([], _log_work(log, "open"))      # still recording: the wait submits it
    stream.synchronize()                            # default: commit_and_wait
    assert log == ["w0", "w1", "w2", "w3", "open"]


def test_synchronize_none_only_records(stream):
    log: list[str] = []
    stream.record([], _log_work(log, "a"))
    stream.synchronize("none")
    stream.synchronize(SyncKind.NONE)
    assert not stream.is_empty and stream.completed_waits == 0
    stream.commit_and_wait()
    assert log == ["a"]


@pytest.mark.parametrize("kind", ["wait", 3, None])
def test_synchronize_refuses_unknown_kinds(stream, kind):
    with pytest.raises(InvalidArgument, match="kind"):
        stream.synchronize(kind)


def test_every_wait_counts_even_with_nothing_recorded(stream):
    stream.commit_and_wait()
    stream.synchronize(SyncKind.COMMIT_AND_WAIT)
    assert stream.completed_waits == 2


def test_deferred_stream_runs_nothing_until_a_wait(dev):
    s = make_stream(dev, "deferred")
    log: list[str] = []
    s.record([], _log_work(log, "a"))
    s.commit()
    s.record([], _log_work(log, "b"))
    s.flush()
    s.record([], _log_work(log, "c"))
    s.commit_and_continue()
    time.sleep(0.05)
    assert log == []
    s.commit_and_wait()
    assert log == ["a", "b", "c"]
    s.close()


def test_async_stream_runs_committed_work_without_a_wait(dev):
    s = make_stream(dev, "async")
    done = threading.Event()
    s.record([], done.set)
    s.commit()
    assert done.wait(5.0)
    s.close()


def test_async_stream_commits_and_continues_every_flush_interval(dev):
    s = dev.create_stream(StreamOptions(flush_interval=4, check_hazards=True))
    for _ in range(9):
        s.record([], lambda: None)
    assert s.submitted_seq == 8 and s.recorded_seq == 9
    s.close()
    d = dev.create_stream(StreamOptions(deferred=True, flush_interval=4))
    for _ in range(9):
        d.record([], lambda: None)
    assert d.submitted_seq == 0
    d.close()


def test_wait_for_waits_only_when_the_allocation_is_pending(dev, stream, owner):
    h = shims.empty_strided([8], None, "float32", dev)
    assert stream.wait_for(h.alloc) is False
    kernel_fn(dev, iota_kernel([8], [1]))(stream, h)
    assert stream.wait_for(h.alloc) is True
    assert stream.wait_for(h.alloc) is False
    shims.delete_tensor_object(h)


def test_failed_work_raises_device_error_at_the_wait(stream):
    log: list[str] = []

    def boom() -> None:
        raise ValueError("kernel crashed")

    stream.record([], boom)
    stream.commit()
    stream.record([], _log_work(log, "after"))
    with pytest.raises(DeviceError, match="kernel crashed"):
        stream.commit_and_wait()
    stream.record([], _log_work(log, "later"))
    stream.commit_and_wait()           # the error was reported once; the stream goes on
    assert "later" in log


# -- closing ----------------------------------------------------------------------------------


def test_close_waits_for_queued_work(dev):
    """§7.1: stream destruction waits for its work."""
    for mode in ("async", "deferred"):
        s = make_stream(dev, mode)
        log: list[str] = []
        s.record([], _log_work(log, "a", delay=0.02))
        s.commit()
        s.close()
        assert log == ["a"] and s.closed


def test_closed_stream_refuses_work(dev):
    s = make_stream(dev, "async")
    s.close()
    s.close()                                       # twice is fine
    for call in (lambda: s.record([], lambda: None), s.commit, s.flush, s.commit_and_wait,
                 s.commit_and_continue):
        with pytest.raises(InvalidArgument, match="stream: .* is closed"):
            call()


def test_default_stream_is_lazy_shared_and_replaced_after_close(dev):
    d = dev.default_stream()
    assert dev.default_stream() is d
    with dev.stream_guard(make_stream(dev, "async")) as s:
        assert dev.current_stream() is s
        s.close()
        assert dev.current_stream() is dev.default_stream()   # a closed stream is not current


def test_current_stream_is_per_thread(dev, stream):
    seen = []
    t = threading.Thread(target=lambda: seen.append(dev.current_stream()))
    t.start()
    t.join()
    assert dev.current_stream() is stream and seen == [dev.default_stream()]


def test_nested_stream_guards_restore_the_previous_stream(dev, stream):
    inner = make_stream(dev, "async")
    with dev.stream_guard(inner):
        assert dev.current_stream() is inner
        with pytest.raises(RuntimeError):
            with dev.stream_guard(stream):
                raise RuntimeError("boom")
        assert dev.current_stream() is inner
    assert dev.current_stream() is stream
    inner.close()


@pytest.mark.parametrize("bad", [None, "stream", 0])
def test_stream_guard_refuses_non_streams(dev, bad):
    with pytest.raises(InvalidArgument, match="stream"):
        with dev.stream_guard(bad):
            pass


# -- copy and fill ----------------------------------------------------------------------------


@pytest.mark.parametrize("byte,expect", [(0, 0.0), (0x3F, np.frombuffer(b"\x3f" * 4, "<f4")[0])])
def test_fill_sets_every_byte_of_a_view(dev, stream, owner, byte, expect):
    base = shims.empty_strided([4, 4], None, "float32", dev)
    upload(base, iota([4, 4]))
    right = shims.reinterpret_tensor(base, [4, 2], [4, 1], 2)
    stream.fill(right, byte)
    got = base.numpy()
    ref = iota([4, 4])
    ref[:, 2:] = expect
    np.testing.assert_array_equal(got, ref)
    shims.delete_tensor_object(right)
    shims.delete_tensor_object(base)


@pytest.mark.parametrize("byte", [-1, 256, 1.0, "0"])
def test_fill_refuses_bad_bytes(dev, stream, owner, byte):
    h = shims.empty_strided([2], None, "uint8", dev)
    with pytest.raises(InvalidArgument, match="byte"):
        stream.fill(h, byte)
    assert stream.is_empty
    shims.delete_tensor_object(h)


def test_fill_and_copy_of_empty_views_record_nothing(dev, stream, owner):
    a = shims.empty_strided([0], None, "float32", dev)
    b = shims.empty_strided([0], None, "float32", dev)
    assert stream.fill(a, 1) == 0 and stream.copy(a, b) == 0 and stream.is_empty
    shims.delete_tensor_object(a)
    shims.delete_tensor_object(b)


def test_stream_copy_refuses_mismatches(dev, stream, owner):
    a = shims.empty_strided([2, 3], None, "float32", dev)
    b = shims.empty_strided([3, 2], None, "float32", dev)
    c = shims.empty_strided([2, 3], None, "int32", dev)
    with pytest.raises(InvalidArgument, match="sizes mismatch"):
        stream.copy(a, b)
    with pytest.raises(InvalidArgument, match="dtype mismatch"):
        stream.copy(a, c)
    shims.delete_tensor_object(c)
    with pytest.raises(InvalidArgument, match="src"):
        stream.copy(a, c)
    with pytest.raises(InvalidArgument, match="view"):
        stream.fill(c, 0)
    assert stream.is_empty
    shims.delete_tensor_object(a)
    shims.delete_tensor_object(b)


def test_stream_copy_is_strided(dev, stream, owner):
    src = shims.empty_strided([3, 4], None, "float32", dev)
    upload(src, iota([3, 4]))
    dst = shims.empty_strided([4, 3], None, "float32", dev)
    t = shims.reinterpret_tensor(dst, [3, 4], [1, 3], 0)
    stream.copy(t, src)
    np.testing.assert_array_equal(dst.numpy(), iota([3, 4]).T)
    for h in (src, t, dst):
        shims.delete_tensor_object(h)


# -- a missing wait is caught, every time, in deferred mode ------------------------------------


def test_missing_wait_is_caught_every_time_in_deferred_mode(dev, owner, stream):
    """dev.read without a wait raises HazardError, however often it is tried."""
    s = make_stream(dev, "deferred")
    with dev.stream_guard(s):
        h = shims.empty_strided([32], None, "float32", dev)
    fn = kernel_fn(dev, iota_kernel([32], [1]))
    for i in range(20):
        fn(s, h)
        if i % 2:
            s.commit()              # a commit is not a wait
        with pytest.raises(HazardError, match="host read .* no wait"):
            dev.read(h)
        with pytest.raises(HazardError, match="host write"):
            dev.write(h, np.zeros(32, np.float32))
        s.commit_and_wait()
        np.testing.assert_array_equal(dev.read(h), iota([32]))
        dev.write(h, np.zeros(32, np.float32))
    shims.delete_tensor_object(h)
    s.close()


def test_missing_wait_shows_stale_data_in_deferred_mode(cpu, owner, stream):
    """What a missing wait would read: in deferred mode the queued write has not happened."""
    from aotrt.runtime.backends.cpu.device import host_array

    s = make_stream(cpu, "deferred")
    with cpu.stream_guard(s):
        h = shims.empty_strided([16], None, "float32")
    upload(h, np.full(16, -1.0, np.float32))
    fn = kernel_fn(cpu, iota_kernel([16], [1]))
    for _ in range(10):
        fn(s, h)
        s.commit()
        time.sleep(0.001)
        np.testing.assert_array_equal(host_array(h), np.full(16, -1.0, np.float32))
        s.commit_and_wait()
        np.testing.assert_array_equal(host_array(h), iota([16]))
        host_array(h)[:] = -1.0
    shims.delete_tensor_object(h)
    s.close()


def test_reads_after_a_wait_on_an_async_stream_see_the_work(dev, owner, stream):
    s = make_stream(dev, "async")
    with dev.stream_guard(s):
        h = shims.empty_strided([64], None, "float32", dev)
        src = shims.empty_strided([64], None, "float32", dev)
    fn = kernel_fn(dev, copy_kernel([64], [1], [1]))
    for base in range(10):
        upload(src, iota([64], base=float(base)))
        fn(s, src, h)
        s.commit_and_wait()
        np.testing.assert_array_equal(dev.read(h), iota([64], base=float(base)))
    shims.delete_tensor_object(h)
    shims.delete_tensor_object(src)
    s.close()


def test_hazard_checks_off_allow_reads_without_a_wait(dev, owner, stream, monkeypatch):
    """check_hazards=False with AOTRT_CHECK_HAZARDS unset turns the checker off: a read
    without a wait is not refused, and sees the data from before the queued work (deferred
    mode runs it at the wait); the same read on a checked stream is refused."""
    monkeypatch.setenv("AOTRT_CHECK_HAZARDS", "0")
    fn = kernel_fn(dev, iota_kernel([4], [1]))
    s = dev.create_stream(StreamOptions(deferred=True, check_hazards=False))
    assert not s.hazards.enabled            # the options and the environment decide it
    with dev.stream_guard(s):
        h = shims.empty_strided([4], None, "float32", dev)
    upload(h, np.full(4, -1.0, np.float32))
    fn(s, h)
    # unchecked: no error, and no guarantee: here the queued write has not happened yet
    np.testing.assert_array_equal(dev.read(h), np.full(4, -1.0, np.float32))
    s.commit_and_wait()
    np.testing.assert_array_equal(dev.read(h), iota([4]))
    s.close()
    checked = dev.create_stream(StreamOptions(deferred=True, check_hazards=True))
    assert checked.hazards.enabled
    fn(checked, h)
    with pytest.raises(HazardError, match="host read .* no wait"):
        dev.read(h)
    checked.commit_and_wait()
    checked.close()
    shims.delete_tensor_object(h)


# -- kernel library and kernel functions ------------------------------------------------------


def test_library_refuses_duplicate_names(dev):
    k = iota_kernel([4], [1])
    with pytest.raises(InvalidArgument, match="duplicate"):
        dev.kernel_library([k, k])


def test_library_kernel_by_name(dev):
    k1, k2 = iota_kernel([4], [1]), iota_kernel([8], [1])
    lib = dev.kernel_library([k1, k2])
    assert lib.kernel(k1.name).kernel is k1 and lib.kernel(k2.name).name == k2.name
    assert k1.name in lib.source and k2.name in lib.source
    with pytest.raises(InvalidArgument, match="name: no kernel"):
        lib.kernel("missing")


def test_kernel_call_checks_the_argument_count(dev, stream, owner):
    fn = kernel_fn(dev, copy_kernel([4], [1], [1]))
    h = shims.empty_strided([4], None, "float32", dev)
    with pytest.raises(InvalidArgument, match="takes 2 arguments, got 1"):
        fn(stream, h)
    assert stream.is_empty
    shims.delete_tensor_object(h)


@pytest.mark.parametrize("slot", [-1, 2, "0", None])
def test_bind_refuses_bad_slots(dev, stream, owner, slot):
    fn = kernel_fn(dev, copy_kernel([4], [1], [1]))
    h = shims.empty_strided([4], None, "float32", dev)
    with pytest.raises(InvalidArgument, match="slot"):
        fn.bind(slot, h)
    shims.delete_tensor_object(h)


def test_bind_refuses_non_handles_and_wrong_dtypes(dev, stream, owner):
    fn = kernel_fn(dev, copy_kernel([4], [1], [1]))
    h = shims.empty_strided([4], None, "int32", dev)
    with pytest.raises(InvalidArgument, match="arg 0: expected a Handle"):
        fn.bind(0, np.zeros(4, np.float32))
    with pytest.raises(InvalidArgument, match="arg 1: .* wants float32, got int32"):
        fn.bind(1, h)
    shims.delete_tensor_object(h)


def test_dispatch_refuses_unbound_arguments(dev, stream, owner):
    fn = kernel_fn(dev, copy_kernel([4], [1], [1]))
    h = shims.empty_strided([4], None, "float32", dev)
    fn.bind(0, h)
    with pytest.raises(InvalidArgument, match="argument 1 is not bound"):
        fn.dispatch(stream)
    assert stream.is_empty
    shims.delete_tensor_object(h)


def test_dispatch_forgets_its_bindings(dev, stream, owner):
    """After a dispatch the arguments must be bound again (as the anchor's encoder rule)."""
    fn = kernel_fn(dev, iota_kernel([4], [1]))
    h = shims.empty_strided([4], None, "float32", dev)
    fn.bind(0, h)
    fn.dispatch(stream)
    with pytest.raises(InvalidArgument, match="not bound"):
        fn.dispatch(stream)
    stream.commit_and_wait()
    shims.delete_tensor_object(h)


def test_rebinding_a_slot_replaces_the_earlier_binding(dev, stream, owner):
    """§4 PackingKeepsArgumentsAlreadyBound in our terms: the last binding of a slot wins."""
    fn = kernel_fn(dev, iota_kernel([4], [1]))
    a = shims.empty_strided([4], None, "float32", dev)
    b = shims.empty_strided([4], None, "float32", dev)
    upload(a, np.zeros(4, np.float32))
    fn.bind(0, a)
    fn.bind(0, b)
    fn.dispatch(stream)
    np.testing.assert_array_equal(b.numpy(), iota([4]))
    np.testing.assert_array_equal(a.numpy(), np.zeros(4, np.float32))
    shims.delete_tensor_object(a)
    shims.delete_tensor_object(b)


@pytest.mark.parametrize("grid", [-1, 9, 2.0])
def test_dispatch_refuses_grids_outside_the_kernel(dev, stream, owner, grid):
    fn = kernel_fn(dev, iota_kernel([8], [1]))
    h = shims.empty_strided([8], None, "float32", dev)
    fn.bind(0, h)
    with pytest.raises(InvalidArgument, match="grid"):
        fn.dispatch(stream, grid=grid)
    shims.delete_tensor_object(h)


def test_dispatch_over_part_of_the_grid(dev, stream, owner):
    fn = kernel_fn(dev, iota_kernel([8], [1]))
    h = shims.empty_strided([8], None, "float32", dev)
    upload(h, np.zeros(8, np.float32))
    fn.bind(0, h)
    fn.dispatch(stream, grid=3)
    np.testing.assert_array_equal(h.numpy(), [1, 2, 3, 0, 0, 0, 0, 0])
    fn.bind(0, h)
    seq = stream.recorded_seq
    assert fn.dispatch(stream, grid=0) == seq and stream.is_empty
    shims.delete_tensor_object(h)


def test_kernel_with_empty_views_records_nothing(dev, stream, owner):
    """§3 #66 in our terms: empty views at offsets go through a dispatch (as a no-op)."""
    k = copy_kernel([2, 0], [0, 1], [0, 1])
    base = shims.empty_strided([4], None, "float32", dev)
    a = shims.reinterpret_tensor(base, [2, 0], [0, 1], 4)
    b = shims.reinterpret_tensor(base, [2, 0], [0, 1], 2)
    seq = stream.recorded_seq
    assert kernel_fn(dev, k)(stream, a, b) == seq and stream.is_empty
    for h in (a, b, base):
        shims.delete_tensor_object(h)


def test_failed_dispatch_leaves_nothing_behind(dev, stream, owner):
    """§3 #13 in our terms: a refused dispatch leaves no recorded work and no wait armed."""
    fn = kernel_fn(dev, copy_kernel([4], [1], [1]))
    a = shims.empty_strided([4], None, "float32", dev)
    b = shims.empty_strided([4], None, "int32", dev)
    waits = stream.completed_waits
    with pytest.raises(InvalidArgument):
        fn(stream, a, b)
    assert stream.is_empty and stream.recorded_seq == 0 and stream.completed_waits == waits
    shims.delete_tensor_object(a)
    shims.delete_tensor_object(b)


def test_a_kernel_may_write_a_strided_view(dev, stream, owner):
    """§4 HandWrittenKernelMayNotWriteAStridedView, reversed: our kernels write a non-packed
    view in place, so the writes reach the parent."""
    base = shims.empty_strided([4, 4], None, "float32", dev)
    upload(base, np.zeros((4, 4), np.float32))
    right = shims.reinterpret_tensor(base, [4, 2], [4, 1], 2)
    kernel_fn(dev, iota_kernel([4, 2], [4, 1]))(stream, right)
    ref = np.zeros((4, 4), np.float32)
    ref[:, 2:] = iota([4, 2])
    np.testing.assert_array_equal(base.numpy(), ref)
    shims.delete_tensor_object(right)
    shims.delete_tensor_object(base)


def test_stream_is_abstract():
    with pytest.raises(TypeError):
        Stream(get_device("cpu"), StreamOptions())      # type: ignore[abstract]


def test_dispatch_refuses_a_kernel_that_would_touch_bytes_outside_the_allocation(dev, stream,
                                                                                  owner):
    # The kernel writes 12x16 elements; the bound tensor's allocation holds only 4.
    small = shims.empty_strided([4], None, "float32", dev)
    fn = kernel_fn(dev, iota_kernel([12, 16], [16, 1]))
    before = stream.recorded_seq
    with pytest.raises(InvalidArgument, match=r"arg 0: kernel .* touches bytes \[0, 768\)"):
        fn(stream, small)
    assert stream.recorded_seq == before
    # A small view whose kernel range runs past the allocation's end is refused too.
    big = shims.empty_strided([12 * 16 + 8], None, "float32", dev)
    tail = shims.reinterpret_tensor(big, [4], [1], 16)
    with pytest.raises(InvalidArgument, match="outside its"):
        fn(stream, tail)
    fits = shims.reinterpret_tensor(big, [12, 16], [16, 1], 8)
    fn(stream, fits)
    stream.commit_and_wait()
    np.testing.assert_array_equal(fits.numpy(), iota([12, 16]))
    for h in (small, big, tail, fits):
        shims.delete_tensor_object(h)


# -- prepared launches (a run plan's kernel steps) --------------------------------------------


def _recording(stream: Stream) -> list[list]:
    """Wrap `stream.record` so the test sees every command's access records."""
    seen: list[list] = []
    record = stream.record

    def spy(accesses, work, label=""):
        seen.append(list(accesses))
        return record(accesses, work, label)
    stream.record = spy
    return seen


@pytest.mark.parametrize("static_slot", [0, 1, None])
def test_prepared_launch_matches_dispatch_with_the_same_access_records(dev, stream, owner,
                                                                       static_slot):
    fn = kernel_fn(dev, affine_kernel([4, 6], [6, 1], [1, 4], 2.0, -1.0))
    src = shims.empty_strided([4, 6], None, "float32", dev)
    # A view at an offset, so the records carry the view's byte offset.
    dst_base = shims.empty_strided([32], None, "float32", dev)
    dst = shims.reinterpret_tensor(dst_base, [6, 4], [4, 1], 8)
    x = rand([4, 6], seed=3)
    upload(src, x)
    handles = [src, dst]
    static = [h if i == static_slot or static_slot is None else None
              for i, h in enumerate(handles)]
    launch = fn.prepare(static)
    assert launch.per_run == tuple(i for i, h in enumerate(static) if h is None)
    seen = _recording(stream)
    fn(stream, src, dst)
    launch.launch(stream, [handles[i] for i in launch.per_run])
    del stream.record
    assert len(seen) == 2 and seen[0] == seen[1] and len(seen[0]) == 2
    stream.commit_and_wait()
    np.testing.assert_allclose(dev.read(dst_base)[8:].reshape(6, 4), x.T * 2 - 1, rtol=1e-6)
    for h in (dst, dst_base, src):
        shims.delete_tensor_object(h)


def test_prepared_launch_patches_the_per_run_slots_of_every_queued_launch(dev, owner):
    """Launches queued before any of them runs each keep their own per-run pointers."""
    s = make_stream(dev, "deferred")
    with dev.stream_guard(s):
        src = shims.empty_strided([16], None, "float32", dev)
        dsts = [shims.empty_strided([16], None, "float32", dev) for _ in range(3)]
        fn = kernel_fn(dev, affine_kernel([16], [1], [1], 3.0, 0.5))
        x = rand([16], seed=4)
        upload(src, x)
        s.commit_and_wait()
        launch = fn.prepare([src, None])
        for d in dsts:
            launch.launch(s, [d])
        also = fn.prepare([src, dsts[0]])          # all static: one work object, run twice
        also.launch(s)
        also.launch(s)
        assert s.recorded_seq - s.submitted_seq == 5
        s.commit_and_wait()
        for d in dsts:
            np.testing.assert_allclose(dev.read(d), x * 3 + 0.5, rtol=1e-6)
        for h in (*dsts, src):
            shims.delete_tensor_object(h)
    s.close()


def test_prepare_and_launch_refuse_what_dispatch_refuses(dev, stream, owner):
    k = affine_kernel([8], [1], [1], 1.0, 7.0)
    lib = dev.kernel_library([k])
    fn = lib.kernel(k.name)
    good = shims.empty_strided([8], None, "float32", dev)
    small = shims.empty_strided([4], None, "float32", dev)
    wrong = shims.empty_strided([8], None, "int32", dev)
    with pytest.raises(InvalidArgument, match="takes 2 arguments, got 1"):
        fn.prepare([good])
    with pytest.raises(InvalidArgument, match="arg 0: .* wants float32, got int32"):
        fn.prepare([wrong, None])
    with pytest.raises(InvalidArgument, match="arg 0: .* touches bytes"):
        fn.prepare([small, None])
    launch = fn.prepare([good, None])
    with pytest.raises(InvalidArgument, match="1 per-run arguments, got 0"):
        launch.launch(stream, [])
    with pytest.raises(InvalidArgument, match="arg 1: .* wants float32, got int32"):
        launch.launch(stream, [wrong])
    with pytest.raises(InvalidArgument, match="arg 1: .* touches bytes"):
        launch.launch(stream, [small])
    gone = shims.empty_strided([8], None, "float32", dev)
    shims.delete_tensor_object(gone)
    with pytest.raises(HazardError, match="argument 1 is a"):
        launch.launch(stream, [gone])
    assert stream.is_empty
    lib.close()
    with pytest.raises(InvalidArgument, match="library is closed"):
        launch.launch(stream, [good])
    for h in (good, small, wrong):
        shims.delete_tensor_object(h)


# -- planning: record once, replay many (the delegate's run plan) ---------------------------


def test_planning_keeps_commands_and_replay_queues_them() -> None:
    from aotrt.runtime.device import get_device
    dev = get_device("cpu")
    s = dev.create_stream(StreamOptions(check_hazards=True))
    try:
        src = shims.empty_strided([4], [1], dtypes.float32, dev)
        dst = shims.empty_strided([4], [1], dtypes.float32, dev)
        dev.write(src, np.arange(4, dtype=np.float32))
        with s.planning() as cmds:
            seq = s.copy(dst, src)
            with pytest.raises(InvalidArgument, match="already planning"):
                with s.planning():
                    pass
        assert seq == 0 and s.recorded_seq == 0 and len(cmds) == 1
        assert [a.write for a in cmds[0].accesses] == [False, True]
        for _ in range(2):
            s.replay(cmds[0])
        assert s.recorded_seq == 2
        s.commit_and_wait()
        np.testing.assert_array_equal(dst.numpy(), np.arange(4, dtype=np.float32))
        shims.delete_tensor_object(src)
        with pytest.raises(HazardError, match="copy uses freed allocation"):
            s.replay(cmds[0])
        shims.delete_tensor_object(dst)
    finally:
        s.close()


@pytest.mark.parametrize("device", DEVICES)
def test_a_kernels_error_is_raised_at_the_wait_and_the_stream_goes_on(device: str) -> None:
    """The wait that reports a kernel's error (its library's flag) still completes: the
    host may write the inputs again at once (no hazard), and the next run is clean."""
    dev = get_device(device)
    i64 = "int64"
    chk = ir.Op("index_check", (ir.Load(0, ir.Idx(0), i64), ir.Const(4, i64)), i64)
    clamp = ir.Op("minimum", (ir.Op("maximum", (chk, ir.Const(0, i64)), i64),
                              ir.Const(3, i64)), i64)
    k = ir.Kernel("checked", (3,), (), (ir.Arg(i64, "r"), ir.Arg(i64, "w")),
                  (ir.Store(1, ir.Idx(0), clamp),))
    lib = dev.kernel_library([k])
    stream = dev.create_stream()
    handles = []
    try:
        # The stream current, so that what the test frees goes to its pool, purged at close.
        with dev.stream_guard(stream), owner_scope(Owner("test")):
            idx = shims.empty_strided((3,), (1,), "int64", dev)
            handles.append(idx)
            out = shims.empty_strided((3,), (1,), "int64", dev)
            handles.append(out)
            for values, bad in (([0, 3, 9], True), ([0, 1, 2], False)):
                dev.write(idx, np.array(values, np.int64))
                lib.kernel("checked")(stream, idx, out)
                if bad:
                    with pytest.raises(InvalidArgument, match="index out of range"):
                        stream.commit_and_wait()
                else:
                    stream.commit_and_wait()
                    np.testing.assert_array_equal(dev.read(out), values)
    finally:
        # Freed here, not by the collector: a later test binds a blob over most of the
        # address space and must find no allocation of ours inside it.
        with dev.stream_guard(stream):
            for h in handles:
                shims.delete_tensor_object(h)
        stream.close()
        lib.close()
