"""aotrt/runtime/hazards.py: the hazard checker (aliases in one command buffer, host access
without a wait, frees under pending work, dead handles), including the seeds' alias
experiment (reference/behaviors.md §1.1)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from aotrt.errors import HazardError
from aotrt.runtime import hazards, shims
from aotrt.runtime.hazards import Access, HazardChecker, check_host_access, free_hazard
from aotrt.runtime.memory import Allocation, Memory, Owner, PoolOptions, current_owner
from aotrt.runtime.tensor import Handle
from tests.support import copy_kernel, iota, iota_kernel, kernel_fn, upload


@pytest.mark.parametrize("value,on", [("1", True), ("yes", True), ("true", True), ("0", False),
                                      ("", False), ("false", False), ("no", False)])
def test_enabled_by_env(monkeypatch, value, on):
    monkeypatch.setenv("AOTRT_CHECK_HAZARDS", value)
    assert hazards.enabled_by_env() is on


def test_disabled_by_default(monkeypatch):
    monkeypatch.delenv("AOTRT_CHECK_HAZARDS", raising=False)
    assert hazards.enabled_by_env() is False


def alias_of(h: Handle, elem_offset: int, n: int) -> Handle:
    """The seeds' unsound alias: a second allocation object over `n` elements of `h`'s
    bytes starting `elem_offset` elements in (made directly, bypassing bind_region)."""
    a = h.alloc
    isz = h.dtype.itemsize
    alias = Allocation(a.memory, None, a.ptr + h.byte_offset + elem_offset * isz, n * isz,
                       "region", current_owner(), None)
    return Handle(alias, 0, (n,), (1,), h.dtype, h.device, current_owner())._publish()


def test_alias_experiment_write_parent_then_read_alias(dev, stream, owner):
    """A kernel writes the parent; in the same command buffer a kernel reads its tail
    through a second allocation object over the same bytes: HazardError."""
    parent = shims.empty_strided([12, 16], None, "float32", dev)
    tail = alias_of(parent, 96, 96)
    out = shims.empty_strided([96], None, "float32", dev)
    kernel_fn(dev, iota_kernel([12, 16], [16, 1]))(stream, parent)
    with pytest.raises(HazardError, match="alias hazard.*reads.*another allocation object"):
        kernel_fn(dev, copy_kernel([96], [1], [1]))(stream, tail, out)
    assert stream.recorded_seq == 1            # the refused command was not recorded
    stream.commit_and_wait()
    for h in (tail, parent, out):
        shims.delete_tensor_object(h)


def test_alias_experiment_write_alias_then_read_parent(dev, stream, owner):
    """The seeds' standalone experiment: write through an alias of the parent's tail, then
    read the parent, in one command buffer (stale 200/200 on Metal): HazardError."""
    parent = shims.empty_strided([12, 16], None, "float32", dev)
    tail = alias_of(parent, 96, 96)
    out = shims.empty_strided([12, 16], None, "float32", dev)
    kernel_fn(dev, iota_kernel([96], [1]))(stream, tail)
    with pytest.raises(HazardError, match="kernel copy.*reads"):
        kernel_fn(dev, copy_kernel([12, 16], [16, 1], [16, 1]))(stream, parent, out)
    stream.commit_and_wait()
    for h in (tail, parent, out):
        shims.delete_tensor_object(h)


def test_alias_write_after_write_is_a_hazard(dev, stream, owner):
    parent = shims.empty_strided([64], None, "float32", dev)
    alias = alias_of(parent, 0, 64)
    kernel_fn(dev, iota_kernel([64], [1]))(stream, parent)
    with pytest.raises(HazardError, match="writes"):
        kernel_fn(dev, iota_kernel([64], [1]))(stream, alias)
    stream.commit_and_wait()
    for h in (alias, parent):
        shims.delete_tensor_object(h)


def test_alias_after_commit_and_continue_is_still_a_hazard(dev, stream, owner):
    """commit-and-continue keeps recording into the same command buffer."""
    parent = shims.empty_strided([32], None, "float32", dev)
    alias = alias_of(parent, 0, 32)
    out = shims.empty_strided([32], None, "float32", dev)
    kernel_fn(dev, iota_kernel([32], [1]))(stream, parent)
    stream.commit_and_continue()
    with pytest.raises(HazardError):
        kernel_fn(dev, copy_kernel([32], [1], [1]))(stream, alias, out)
    stream.commit_and_wait()
    for h in (alias, parent, out):
        shims.delete_tensor_object(h)


@pytest.mark.parametrize("verb", ["commit", "flush", "commit_and_wait"])
def test_alias_in_the_next_command_buffer_is_ordered(dev, stream, owner, verb):
    parent = shims.empty_strided([32], None, "float32", dev)
    alias = alias_of(parent, 8, 24)
    out = shims.empty_strided([24], None, "float32", dev)
    kernel_fn(dev, iota_kernel([32], [1]))(stream, parent)
    getattr(stream, verb)()
    kernel_fn(dev, copy_kernel([24], [1], [1]))(stream, alias, out)
    np.testing.assert_array_equal(out.numpy(), iota([32])[8:])
    for h in (alias, parent, out):
        shims.delete_tensor_object(h)


def test_alias_over_other_bytes_is_no_hazard(dev, stream, owner):
    parent = shims.empty_strided([32], None, "float32", dev)
    head = shims.reinterpret_tensor(parent, [16], [1], 0)
    tail = alias_of(parent, 16, 16)
    kernel_fn(dev, iota_kernel([16], [1]))(stream, head)
    kernel_fn(dev, iota_kernel([16], [1]))(stream, tail)
    stream.commit_and_wait()
    for h in (head, tail, parent):
        shims.delete_tensor_object(h)


def test_offset_views_of_one_allocation_are_no_hazard(dev, stream, owner):
    """Our design: a view is (allocation, offset), so parent and views are one object."""
    parent = shims.empty_strided([12, 16], None, "float32", dev)
    views = [shims.reinterpret_tensor(parent, [12, 8], [16, 1], 8),
             shims.reinterpret_tensor(parent, [6, 16], [16, 1], 96),
             shims.new_tensor_handle(parent)]
    kernel_fn(dev, iota_kernel([12, 16], [16, 1]))(stream, parent)
    kernel_fn(dev, iota_kernel([12, 8], [16, 1]))(stream, views[0])
    kernel_fn(dev, iota_kernel([6, 16], [16, 1]))(stream, views[1])
    kernel_fn(dev, iota_kernel([12, 16], [16, 1]))(stream, views[2])
    stream.commit_and_wait()
    for h in (*views, parent):
        shims.delete_tensor_object(h)


def test_recycled_block_in_the_same_command_buffer_is_no_alias(dev, stream, owner):
    """Bug fixed: a block freed and taken again from the pool inside one command buffer got
    a new Allocation object, and the checker called it an alias. It is the same device
    buffer, ordered by the stream."""
    m = Memory(dev, PoolOptions(cap_bytes=1 << 20))
    a = m.allocate(256, stream)
    h = Handle(a, 0, (64,), (1,), parent_dtype(), dev, owner)._publish()
    kernel_fn(dev, iota_kernel([64], [1]))(stream, h)
    shims.delete_tensor_object(h)
    b = m.allocate(256, stream)
    assert b.block is a.block and b is not a
    h2 = Handle(b, 0, (64,), (1,), parent_dtype(), dev, owner)._publish()
    kernel_fn(dev, iota_kernel([64], [1], base=9.0))(stream, h2)
    np.testing.assert_array_equal(h2.numpy(), iota([64], base=9.0))
    shims.delete_tensor_object(h2)
    m.pool.clear()


def parent_dtype():
    from aotrt.dtypes import float32

    return float32


def test_hazard_message_names_the_command_and_both_allocations(dev, stream, owner):
    parent = shims.empty_strided([16], None, "float32", dev)
    alias = alias_of(parent, 0, 16)
    kernel_fn(dev, iota_kernel([16], [1]))(stream, parent, label="instr 3: aten.add at m.py:7")
    with pytest.raises(HazardError) as e:
        kernel_fn(dev, iota_kernel([16], [1]))(stream, alias, label="instr 4: aten.mul")
    text = str(e.value)
    assert "instr 4: aten.mul" in text and "instr 3: aten.add at m.py:7" in text
    assert parent.alloc.describe() in text and alias.alloc.describe() in text
    stream.commit_and_wait()
    for h in (alias, parent):
        shims.delete_tensor_object(h)


def test_checker_off_lets_aliases_through(dev, stream, owner):
    parent = shims.empty_strided([16], None, "float32", dev)
    alias = alias_of(parent, 0, 16)
    checker = HazardChecker(False)
    checker.on_command([parent.access(write=True)], "w")
    checker.on_command([alias.access(write=False)], "r")
    on = HazardChecker(True)
    on.on_command([parent.access(write=True)], "w")
    on.on_command([alias.access(write=False), alias.access(write=True)][:0], "nothing")
    with pytest.raises(HazardError):
        on.on_command([alias.access(write=False)], "r")
    on.end_buffer()
    on.on_command([alias.access(write=False)], "r")
    for h in (alias, parent):
        shims.delete_tensor_object(h)


def test_reads_through_an_alias_after_reads_are_fine(dev, stream, owner):
    """Only writes order work: two readers through different objects do not conflict."""
    parent = shims.empty_strided([16], None, "float32", dev)
    alias = alias_of(parent, 0, 16)
    on = HazardChecker(True)
    on.on_command([parent.access(write=False)], "r1")
    on.on_command([alias.access(write=False)], "r2")
    on.on_command([Access(alias.alloc, 4, 4, True)], "empty write")
    on.on_command([parent.access(write=False)], "r3")
    for h in (alias, parent):
        shims.delete_tensor_object(h)


# -- host access, frees, dead handles ---------------------------------------------------------


def test_host_read_with_a_pending_write_is_a_hazard(dev, stream, owner):
    h = shims.empty_strided([8], None, "float32", dev)
    kernel_fn(dev, iota_kernel([8], [1]))(stream, h)
    with pytest.raises(HazardError, match=r"host read of .*\(x\).*no wait"):
        check_host_access(h.alloc, False, "x")
    with pytest.raises(HazardError, match="host write to"):
        check_host_access(h.alloc, True, "y")
    stream.commit_and_wait()
    check_host_access(h.alloc, False, "x")
    check_host_access(h.alloc, True, "y")
    shims.delete_tensor_object(h)


def test_host_write_waits_for_pending_reads_but_reads_do_not(dev, stream, owner):
    src = shims.empty_strided([8], None, "float32", dev)
    dst = shims.empty_strided([8], None, "float32", dev)
    upload(src, iota([8]))
    kernel_fn(dev, copy_kernel([8], [1], [1]))(stream, src, dst)
    check_host_access(src.alloc, False, "read while a kernel reads it")
    with pytest.raises(HazardError, match="host write"):
        check_host_access(src.alloc, True, "write while a kernel reads it")
    stream.commit_and_wait()
    for h in (src, dst):
        shims.delete_tensor_object(h)


def test_free_hazard_only_while_work_is_pending(dev, stream, owner):
    h = shims.empty_strided([8], None, "float32", dev)
    assert free_hazard(h.alloc, "free") is None
    kernel_fn(dev, iota_kernel([8], [1]))(stream, h)
    err = free_hazard(h.alloc, "pool reuse")
    assert isinstance(err, HazardError)
    assert re.search("pool reuse of .* may still use it", str(err)), err
    stream.commit_and_wait()
    assert free_hazard(h.alloc, "free") is None
    shims.delete_tensor_object(h)


def test_unchecked_streams_are_not_reported(dev, owner, stream):
    from aotrt.runtime.device import StreamOptions

    s = dev.create_stream(StreamOptions(deferred=True))
    s.hazards.enabled = False
    with dev.stream_guard(s):
        h = shims.empty_strided([8], None, "float32", dev)
    kernel_fn(dev, iota_kernel([8], [1]))(s, h)
    check_host_access(h.alloc, True, "unchecked")
    assert free_hazard(h.alloc, "unchecked") is None
    s.close()
    shims.delete_tensor_object(h)


def test_a_deleted_handle_in_a_kernel_is_a_hazard(dev, stream, owner):
    h = shims.empty_strided([8], None, "float32", dev)
    shims.delete_tensor_object(h)
    with pytest.raises(HazardError, match="argument 0 is a deleted handle"):
        kernel_fn(dev, iota_kernel([8], [1]))(stream, h)
    assert stream.is_empty


def test_a_handle_deleted_between_bind_and_dispatch_is_a_hazard(dev, stream, owner):
    h = shims.empty_strided([8], None, "float32", dev)
    fn = kernel_fn(dev, iota_kernel([8], [1]))
    fn.bind(0, h)
    shims.delete_tensor_object(h)
    with pytest.raises(HazardError, match="argument 0 is a deleted handle"):
        fn.dispatch(stream)
    assert stream.is_empty


def test_a_retired_handle_in_a_kernel_is_a_hazard(dev, stream, owner):
    from aotrt.runtime.memory import Owner, owner_scope

    o = Owner("gone")
    with owner_scope(o):
        h = shims.empty_strided([8], None, "float32", dev)
    o.close()
    with pytest.raises(HazardError, match="retired handle"):
        kernel_fn(dev, iota_kernel([8], [1]))(stream, h)
    shims.delete_tensor_object(h)


def test_recording_work_on_freed_memory_is_a_hazard(dev, stream, owner):
    h = shims.empty_strided([8], None, "float32", dev)
    acc = h.access(write=True)
    shims.delete_tensor_object(h)
    with pytest.raises(HazardError, match="uses freed allocation"):
        stream.record([acc], lambda: None, "late kernel")
    assert stream.is_empty


# -- frees under pending work: the check runs before the memory layer's wait ------------------


def _unpooled(dev, cpu_region: bool) -> tuple[Handle, str, np.ndarray | None]:
    """A handle whose last delete frees memory outright (no pool), what the free is called,
    and the host array behind it: a region over a numpy array (cpu), or device memory from
    a Memory that pools nothing."""
    from aotrt.dtypes import float32

    if cpu_region:
        arr = np.zeros(64, dtype=np.float32)
        h = shims.create_tensor_from_blob(arr.ctypes.data, [64], None, 0, "float32", dev)
        return h, "release of region", arr
    a = Memory(dev, PoolOptions(cap_bytes=0)).allocate(256, dev.current_stream())
    return Handle(a, 0, (64,), (1,), float32, dev, current_owner())._publish(), "free", None


def _free_paths(dev):
    """(region?, ...) cases that exist on `dev`: regions are host memory (cpu only)."""
    return [True, False] if dev.name == "cpu" else [False]


def test_free_with_uncommitted_work_is_a_hazard_on_every_free_path(dev, stream, owner):
    """Work queued on a checked stream and not committed, then the memory's last handle goes:
    HazardError naming the free; the memory is still freed, after the queued work ran."""
    for region in _free_paths(dev):
        h, what, arr = _unpooled(dev, region)
        a = h.alloc
        kernel_fn(dev, iota_kernel([64], [1]))(stream, h)
        with pytest.raises(HazardError, match=f"^{what} of .* while command #\\d+ on "):
            shims.delete_tensor_object(h)
        # Waited, then freed: nothing leaks and nothing runs on memory that went.
        assert a.freed and not a.busy() and a not in a.memory.live()
        if arr is not None:
            np.testing.assert_array_equal(arr, iota([64]))


def test_free_of_constants_with_uncommitted_work_is_a_hazard(dev, stream, owner):
    from aotrt.dtypes import float32

    m = Memory(dev, PoolOptions(cap_bytes=0))
    o = Owner("constants-hazard")
    calloc, offs = m.allocate_constants([256], stream, o)
    h = Handle(calloc, 0, (64,), (1,), float32, dev, current_owner())._publish()
    kernel_fn(dev, iota_kernel([64], [1]))(stream, h)
    with pytest.raises(HazardError, match="^free of constants of .* while command"):
        m.drop_owned(calloc)
    assert calloc.freed and not calloc.busy()
    shims.delete_tensor_object(h)


def test_free_after_a_commit_is_no_hazard_and_waits(dev, stream, owner):
    """Committed work is the stream's to finish: the free waits for it (runs it, on a
    deferred stream) and the bytes are written before they go."""
    for region in _free_paths(dev):
        h, _, arr = _unpooled(dev, region)
        a = h.alloc
        kernel_fn(dev, iota_kernel([64], [1]))(stream, h)
        stream.commit()
        shims.delete_tensor_object(h)
        assert a.freed and not a.busy()
        if arr is not None:
            np.testing.assert_array_equal(arr, iota([64]))


def test_free_without_the_checker_waits_safely(dev, owner):
    from aotrt.runtime.device import StreamOptions

    s = dev.create_stream(StreamOptions(deferred=True))
    s.hazards.enabled = False
    with dev.stream_guard(s):
        for region in _free_paths(dev):
            h, _, arr = _unpooled(dev, region)
            a = h.alloc
            kernel_fn(dev, iota_kernel([64], [1]))(s, h)
            assert a.busy()
            shims.delete_tensor_object(h)          # no HazardError: it waits instead
            assert a.freed and not a.busy() and s.completed_seq == s.recorded_seq
            if arr is not None:
                np.testing.assert_array_equal(arr, iota([64]))
    s.close()
