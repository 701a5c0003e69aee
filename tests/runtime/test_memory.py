"""aotrt/runtime/memory.py: allocations and their users, owners, the per-stream pool, host
regions and constants.

Rows of reference/behaviors.md §3 are named "§3 #N" where a test rewrites one for our terms
(device buffer = allocation, CPU region = region, graph op = library op).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aotrt.errors import HazardError, InvalidArgument, OutOfMemory
from aotrt.runtime import shims
from aotrt.runtime.device import Block
from aotrt.runtime.memory import (ALIGN, PROCESS_OWNER, Allocation, Memory, Owner, PoolOptions,
                                  current_owner, owner_scope)
from aotrt.runtime.tensor import Handle
from tests.conftest import make_stream
from tests.support import iota, iota_kernel, kernel_fn, upload

KIB = 1024
MIB = 1024 * KIB


def free(a: Allocation) -> None:
    """Drop the last user of an allocation made with Memory.allocate (it has none yet)."""
    a.retain()
    a.release()


def handle_on(a: Allocation, n: int, dtype: str = "float32", offset: int = 0) -> Handle:
    """A published float handle of `n` elements at byte `offset` of allocation `a`."""
    from aotrt.dtypes import as_dtype

    return Handle(a, offset, (n,), (1,), as_dtype(dtype), a.memory.device,
                  current_owner())._publish()


@pytest.fixture
def mem(dev, owner):
    """A private Memory with a 1 MiB pool cap, so pool tests see only their own blocks."""
    m = Memory(dev, PoolOptions(cap_bytes=1 * MIB))
    yield m
    m.pool.clear()


def pooled_ptrs(m: Memory, stream=None) -> list[int]:
    """Addresses of the blocks pooled (for one stream, or all)."""
    return [e.block.ptr for e in m.pool.entries(stream)]


# -- PoolOptions ------------------------------------------------------------------------------


def test_pool_options_defaults_match_the_anchor():
    o = PoolOptions()
    assert (o.cap_bytes, o.headroom_ratio, o.headroom_bytes) == (256 * MIB, 2.0, 32 * KIB)


@pytest.mark.parametrize("raw,mb", [("1", 1), ("64", 64), ("16384", 16384)])
def test_pool_options_from_env_sets_the_cap(monkeypatch, raw, mb):
    monkeypatch.setenv("AOTRT_POOL_MB", raw)
    assert PoolOptions.from_env().cap_bytes == mb * MIB


def test_pool_options_from_env_without_the_variable_is_the_default(monkeypatch):
    monkeypatch.delenv("AOTRT_POOL_MB", raising=False)
    assert PoolOptions.from_env() == PoolOptions()


@pytest.mark.parametrize("raw", ["0", "16385", "-1", "abc", "", "1.5"])
def test_pool_options_from_env_refuses_bad_values(monkeypatch, raw):
    monkeypatch.setenv("AOTRT_POOL_MB", raw)
    with pytest.raises(InvalidArgument, match="^AOTRT_POOL_MB: must be an integer in 1..16384"):
        PoolOptions.from_env()


@pytest.mark.parametrize("kwargs,name", [
    ({"cap_bytes": -1}, "cap_bytes"),
    ({"cap_bytes": 1.5}, "cap_bytes"),
    ({"headroom_ratio": 0.99}, "headroom_ratio"),
    ({"headroom_ratio": float("nan")}, "headroom_ratio"),
    ({"headroom_bytes": -1}, "headroom_bytes"),
    ({"headroom_bytes": 2.0}, "headroom_bytes"),
])
def test_pool_options_refuse_bad_fields(kwargs, name):
    with pytest.raises(InvalidArgument, match=f"^{name}: "):
        PoolOptions(**kwargs)


def test_pool_options_accept_boundary_values():
    o = PoolOptions(cap_bytes=0, headroom_ratio=1.0, headroom_bytes=0)
    assert o.fits(4096, 4096)
    assert not o.fits(4160, 4096)
    assert not o.poolable(64)


@pytest.mark.parametrize("cap,req,ok", [
    (1000, 1000, True),            # exact
    (999, 1000, False),            # too small
    (2000, 1000, True),            # 2x is the limit for small requests
    (2001, 1000, False),
    (100_000 + 32 * KIB, 100_000, True),   # +32 KiB is the limit for large ones
    (100_001 + 32 * KIB, 100_000, False),
])
def test_pool_options_fits_is_bounded_headroom(cap, req, ok):
    assert PoolOptions().fits(cap, req) is ok


def test_pool_options_poolable_is_at_most_half_the_cap():
    o = PoolOptions(cap_bytes=64 * KIB)
    assert o.poolable(32 * KIB)
    assert not o.poolable(32 * KIB + 1)


# -- Owner ------------------------------------------------------------------------------------


def test_current_owner_defaults_to_the_process_owner():
    seen = []
    t = threading.Thread(target=lambda: seen.append(current_owner()))
    t.start()
    t.join()
    assert seen == [PROCESS_OWNER]


def test_owner_scope_sets_and_restores_nested(owner):
    assert current_owner() is owner
    inner = Owner("inner")
    with owner_scope(inner):
        assert current_owner() is inner
    assert current_owner() is owner
    inner.close()


def test_owner_scope_is_per_thread(owner):
    seen = []
    t = threading.Thread(target=lambda: seen.append(current_owner()))
    t.start()
    t.join()
    assert seen == [PROCESS_OWNER] and current_owner() is owner


def test_owner_scope_restores_after_an_exception(owner):
    inner = Owner("inner")
    with pytest.raises(RuntimeError):
        with owner_scope(inner):
            raise RuntimeError("boom")
    assert current_owner() is owner
    inner.close()


def test_owner_scope_refuses_a_non_owner():
    with pytest.raises(InvalidArgument, match="^owner: expected an Owner"):
        with owner_scope("delegate"):
            pass


def test_owner_scope_refuses_a_closed_owner():
    o = Owner("gone")
    o.close()
    with pytest.raises(InvalidArgument, match="^owner: .* is closed"):
        with owner_scope(o):
            pass


def test_owner_ids_are_unique_and_repr_names_it():
    a, b = Owner("a"), Owner("b")
    assert a.id != b.id and "a#" in repr(a)
    a.close()
    b.close()


def test_owner_close_retires_its_handles_and_frees_its_memory(dev, stream, owner):
    """§3 #3 / §7.2 full cleanup: after close no handle and no allocation of it is left."""
    o = Owner("delegate")
    with owner_scope(o):
        h = shims.empty_strided([4, 4], None, "float32", dev)
        v = shims.reinterpret_tensor(h, [2, 4], [4, 1], 8)
        alloc = h.alloc
    assert len(o.handles) == 2
    o.close()
    assert o.closed and not o.handles
    assert h.state == v.state == "retired"
    assert alloc not in dev.memory.live()
    assert alloc.users == 0
    assert not [e for e in dev.memory.pool.entries() if e.owner is o]


def test_owner_close_twice_is_safe(stream, owner):
    o = Owner("delegate")
    with owner_scope(o):
        shims.empty_strided([3], None, "float32")
    o.close()
    o.close()
    assert o.closed


def test_retired_handles_are_refused_by_every_shim_but_delete(stream, owner):
    """§7.2 retired handles: delete just drops them; every other shim refuses them."""
    o = Owner("delegate")
    with owner_scope(o):
        h = shims.empty_strided([2], None, "float32")
    o.close()
    for call in (lambda: shims.get_sizes(h), lambda: shims.new_tensor_handle(h),
                 lambda: shims.reinterpret_tensor(h, [1], [1], 0), lambda: h.numpy()):
        with pytest.raises(InvalidArgument, match="^handle: handle is retired"):
            call()
    shims.delete_tensor_object(h)
    assert h.state == "deleted"
    with pytest.raises(InvalidArgument):
        shims.delete_tensor_object(h)


def test_owner_close_frees_only_its_own(dev, stream, owner):
    """§7.5: destroying one delegate keeps the other's memory and data."""
    a, b = Owner("a"), Owner("b")
    with owner_scope(a):
        ha = shims.empty_strided([8], None, "float32", dev)
    with owner_scope(b):
        hb = shims.empty_strided([8], None, "float32", dev)
    upload(hb, iota([8]))
    a.close()
    assert hb.state == "live" and hb.alloc in dev.memory.live()
    np.testing.assert_array_equal(hb.numpy(), iota([8]))
    assert ha.alloc not in dev.memory.live()
    b.close()


def test_owner_close_waits_for_queued_work(dev, stream, owner):
    """§3 #68: cleanup waits for queued work first."""
    o = Owner("delegate")
    with owner_scope(o):
        h = shims.empty_strided([64], None, "float32", dev)
    kernel_fn(dev, iota_kernel([64], [1]))(stream, h)
    stream.commit()
    assert h.alloc.busy()
    o.close()
    assert stream.completed_seq == stream.recorded_seq


def test_owner_close_purges_its_pooled_blocks_even_without_live_handles(dev, stream, owner):
    """Bug fixed: close used to purge the pool only for allocations it still had handles in."""
    o = Owner("delegate")
    with owner_scope(o):
        h = shims.empty_strided([1000], None, "float32", dev)
    ptr = h.alloc.ptr
    shims.delete_tensor_object(h)
    assert ptr in pooled_ptrs(dev.memory, stream)
    raw = dev.memory.raw_bytes
    o.close()
    assert ptr not in pooled_ptrs(dev.memory)
    assert dev.memory.raw_bytes == raw - 4032


def test_owner_close_keeps_other_owners_pooled_blocks(mem, stream, owner):
    a, b = Owner("a"), Owner("b")
    xa = mem.allocate(1000, stream, a)
    xb = mem.allocate(1000, stream, b)
    free(xa)
    free(xb)
    a.close()
    assert pooled_ptrs(mem, stream) == [xb.ptr]
    b.close()
    assert pooled_ptrs(mem, stream) == []


def test_memory_freed_after_its_owner_closed_is_not_pooled(mem, stream, owner):
    """A closed owner's pooled blocks would never be purged: they are freed instead."""
    o = Owner("late")
    x = mem.allocate(1000, stream, o)
    x.retain()
    o.close()
    raw = mem.raw_bytes
    x.release()
    assert pooled_ptrs(mem) == [] and mem.raw_bytes == raw - 1024


def test_allocating_for_a_closed_owner_is_refused(mem, stream, owner):
    o = Owner("gone")
    o.close()
    live = mem.live()
    with pytest.raises(InvalidArgument, match="^owner: .* is closed"):
        mem.allocate(64, stream, o)
    assert mem.live() == live


def test_owner_close_after_a_failed_wait_can_be_retried(cpu, owner):
    """If queued work failed, close raises DeviceError and a second close still frees."""
    from aotrt.errors import DeviceError

    s = make_stream(cpu, "deferred")
    o = Owner("delegate")
    with cpu.stream_guard(s), owner_scope(o):
        h = shims.empty_strided([4], None, "float32")
    s.record([h.access(write=True)], lambda: 1 / 0, "bad work")
    s.commit()
    with pytest.raises(DeviceError):
        o.close()
    assert not o.closed and h.state == "live"
    o.close()
    assert o.closed and h.state == "retired" and h.alloc not in cpu.memory.live()
    s.close()


# -- Allocation -------------------------------------------------------------------------------


def test_allocate_is_aligned_sized_and_owned(dev, stream, owner):
    a = dev.memory.allocate(100, stream)
    try:
        assert a.ptr % ALIGN == 0
        assert (a.nbytes, a.end, a.kind, a.owner, a.users) == (100, a.ptr + 100, "device", owner, 0)
        assert a.block.nbytes >= 100 and a.stream is stream
        assert a in dev.memory.live() and dev.memory in owner.memories
    finally:
        free(a)


def test_allocate_zero_bytes_gives_a_findable_allocation(dev, stream, owner):
    a = dev.memory.allocate(0, stream)
    try:
        assert a.nbytes == 0 and a.block.nbytes == ALIGN
        assert dev.memory.find(a.ptr) is a
    finally:
        free(a)


@pytest.mark.parametrize("nbytes", [-1, 1.0, "8", None, 1 << 62])
def test_allocate_refuses_bad_sizes(dev, stream, owner, nbytes):
    live = dev.memory.live()
    with pytest.raises(InvalidArgument, match=r"^nbytes: must be an int in \[0, 2\*\*62\)"):
        dev.memory.allocate(nbytes, stream)
    assert dev.memory.live() == live


def test_retain_and_release_count_users(dev, stream, owner):
    a = dev.memory.allocate(64, stream)
    a.retain()
    a.retain()
    assert a.users == 2
    a.release()
    assert a.users == 1 and not a.freed and a in dev.memory.live()
    a.release()
    assert a.users == 0 and a.freed and a not in dev.memory.live()


def test_release_without_users_is_refused(dev, stream, owner):
    a = dev.memory.allocate(64, stream)
    with pytest.raises(InvalidArgument, match="^allocation .* has no users to release"):
        a.release()
    free(a)


def test_retain_after_free_is_refused(dev, stream, owner):
    a = dev.memory.allocate(64, stream)
    free(a)
    with pytest.raises(InvalidArgument, match="^allocation .* was already freed"):
        a.retain()


def test_describe_names_kind_device_and_owner(dev, stream, owner):
    a = dev.memory.allocate(64, stream)
    try:
        text = a.describe()
        assert "device@" in text and dev.name in text and "test" in text and "+64" in text
        assert "users=0" in repr(a)
    finally:
        free(a)


def test_busy_and_settle_follow_the_stream(dev, stream, owner):
    h = shims.empty_strided([16], None, "float32", dev)
    assert not h.alloc.busy()
    kernel_fn(dev, iota_kernel([16], [1]))(stream, h)
    assert h.alloc.busy() and h.alloc.busy(writes_only=True)
    h.alloc.settle()
    assert not h.alloc.busy()
    shims.delete_tensor_object(h)


def test_busy_writes_only_ignores_pending_reads(dev, stream, owner):
    src = shims.empty_strided([16], None, "float32", dev)
    dst = shims.empty_strided([16], None, "float32", dev)
    upload(src, iota([16]))
    from tests.support import copy_kernel
    kernel_fn(dev, copy_kernel([16], [1], [1]))(stream, src, dst)
    assert src.alloc.busy() and not src.alloc.busy(writes_only=True)
    waits = stream.completed_waits
    src.alloc.settle(writes_only=True)
    assert stream.completed_waits == waits   # nothing written to src: no wait
    src.alloc.settle()
    assert stream.completed_waits == waits + 1
    shims.delete_tensor_object(src)
    shims.delete_tensor_object(dst)


def test_settle_skips_closed_streams(dev, owner, stream):
    s2 = make_stream(dev, "deferred")
    with dev.stream_guard(s2):
        h = shims.empty_strided([4], None, "float32", dev)
    kernel_fn(dev, iota_kernel([4], [1]))(s2, h)
    s2.close()                      # waits
    h.alloc.settle()                # nothing to do on a closed stream
    np.testing.assert_array_equal(h.numpy(), iota([4]))
    shims.delete_tensor_object(h)


# -- lookup -----------------------------------------------------------------------------------


def test_find_covers_exactly_the_allocations_bytes(dev, stream, owner):
    a = dev.memory.allocate(100, stream)
    try:
        m = dev.memory
        assert m.find(a.ptr) is a and m.find(a.ptr + 50) is a and m.find(a.ptr + 99) is a
        assert m.find(a.ptr + 100) is not a
        assert m.find(a.ptr - 1) is not a
    finally:
        free(a)


def test_find_of_unknown_memory_is_none(dev):
    assert dev.memory.find(8) is None


def test_overlapping_lists_intersecting_allocations(dev, stream, owner):
    a = dev.memory.allocate(128, stream)
    try:
        m = dev.memory
        assert a in m.overlapping(a.ptr, a.ptr + 1)
        assert a in m.overlapping(a.ptr + 127, a.ptr + 500)
        assert a in m.overlapping(a.ptr - 10, a.ptr + 1)
        assert a not in m.overlapping(a.ptr + 128, a.ptr + 200)
        assert a not in m.overlapping(a.ptr - 10, a.ptr)
    finally:
        free(a)


def test_knows_covers_live_and_pooled_memory_but_not_foreign(dev, stream, owner):
    """The check the lean CUDA graph replay uses to leave runtime memory to the full path."""
    m = dev.memory
    a = m.allocate(4096, stream)
    lo, hi = a.ptr, a.ptr + 4096
    assert m.knows(lo + 100, lo + 200) and m.knows(lo - 8, lo + 1)
    assert not m.knows(hi + (1 << 40), hi + (1 << 40) + 64)
    free(a)
    assert m.pool.overlapping(lo, hi), "a small freed block is kept by the pool"
    assert m.knows(lo, hi)              # pooled: still the runtime's
    m.pool.clear()
    assert not m.knows(lo, hi)


def test_live_lists_allocations_in_address_order(dev, stream, owner):
    xs = [dev.memory.allocate(64, stream) for _ in range(5)]
    try:
        live = [a.ptr for a in dev.memory.live()]
        assert live == sorted(live)
        assert all(x in dev.memory.live() for x in xs)
    finally:
        for x in xs:
            free(x)


def test_raw_bytes_and_peak_track_device_memory(mem, stream, owner):
    a = mem.allocate(4000, stream)
    assert mem.raw_bytes == 4032 and mem.peak_raw_bytes == 4032
    b = mem.allocate(1000, stream)
    assert mem.raw_bytes == 4032 + 1024
    free(a)       # pooled: still held
    assert mem.raw_bytes == 4032 + 1024
    mem.pool.clear()
    assert mem.raw_bytes == 1024 and mem.peak_raw_bytes == 4032 + 1024
    free(b)


# -- pool -------------------------------------------------------------------------------------


def test_last_release_pools_device_memory(mem, stream, owner):
    a = mem.allocate(1000, stream)
    free(a)
    assert a.freed and a not in mem.live()
    assert pooled_ptrs(mem, stream) == [a.ptr]
    assert mem.pool.pooled_bytes == 1024


def test_pool_reuses_a_block_on_its_stream(mem, stream, owner):
    a = mem.allocate(1000, stream)
    free(a)
    b = mem.allocate(1000, stream)
    assert b.ptr == a.ptr and b is not a and b.block is a.block
    assert mem.pool.pooled_bytes == 0 and pooled_ptrs(mem) == []
    free(b)


def test_pool_picks_the_best_fit(mem, stream, owner):
    blocks = {n: mem.allocate(n, stream) for n in (8192, 4096, 6144)}
    ptrs = {n: a.ptr for n, a in blocks.items()}
    for a in blocks.values():
        free(a)
    got = mem.allocate(5000, stream)      # 6144 and 8192 fit; 6144 is best
    assert got.ptr == ptrs[6144]
    got2 = mem.allocate(4096, stream)
    assert got2.ptr == ptrs[4096]
    free(got)
    free(got2)


def test_pool_ratio_bounds_small_requests(mem, stream, owner):
    big = mem.allocate(4096, stream)
    free(big)
    small = mem.allocate(1024, stream)      # 4096 > 2 x 1024: not reused
    assert small.ptr != big.ptr and pooled_ptrs(mem, stream) == [big.ptr]
    free(small)


def test_pool_headroom_bytes_bound_large_requests(mem, stream, owner):
    big = mem.allocate(140_032, stream)
    free(big)
    a = mem.allocate(100_032, stream)       # 140032 > 100032 + 32 KiB
    assert a.ptr != big.ptr
    b = mem.allocate(110_016, stream)       # 140032 <= 110016 + 32 KiB
    assert b.ptr == big.ptr
    free(a)
    free(b)


def test_pool_evicts_the_least_recently_freed_over_the_cap(dev, stream, owner):
    m = Memory(dev, PoolOptions(cap_bytes=64 * KIB))
    xs = [m.allocate(16 * KIB, stream) for _ in range(5)]
    raw = m.raw_bytes
    for x in xs[:4]:
        free(x)
    assert m.pool.pooled_bytes == 64 * KIB and len(m.pool.entries()) == 4
    free(xs[4])
    assert m.pool.pooled_bytes == 64 * KIB
    assert pooled_ptrs(m) == [x.ptr for x in xs[1:]]    # the first freed went
    assert m.raw_bytes == raw - 16 * KIB
    m.pool.clear()
    assert m.raw_bytes == 0


def test_pool_eviction_is_global_over_streams(dev, stream, owner):
    m = Memory(dev, PoolOptions(cap_bytes=32 * KIB))
    s2 = make_stream(dev, "async")
    a = m.allocate(16 * KIB, s2)
    b = m.allocate(16 * KIB, stream)
    c = m.allocate(16 * KIB, stream)
    free(a)
    free(b)
    free(c)
    assert pooled_ptrs(m, s2) == [] and pooled_ptrs(m, stream) == [b.ptr, c.ptr]
    m.pool.clear()
    s2.close()


def test_pool_does_not_keep_oversize_blocks(dev, stream, owner):
    m = Memory(dev, PoolOptions(cap_bytes=64 * KIB))
    a = m.allocate(32 * KIB, stream)
    b = m.allocate(32 * KIB + 64, stream)
    free(a)
    free(b)
    assert pooled_ptrs(m) == [a.ptr]
    assert m.raw_bytes == 32 * KIB
    m.pool.clear()


def test_pool_with_zero_cap_pools_nothing(dev, stream, owner):
    m = Memory(dev, PoolOptions(cap_bytes=0))
    free(m.allocate(64, stream))
    assert m.pool.entries() == [] and m.raw_bytes == 0


def test_pool_prefers_the_requesting_streams_own_block(mem, dev, stream, owner):
    s2 = make_stream(dev, "async")
    other = mem.allocate(1000, s2)
    mine = mem.allocate(1000, stream)
    free(other)
    free(mine)
    got = mem.allocate(1000, stream)
    assert got.ptr == mine.ptr and pooled_ptrs(mem, s2) == [other.ptr]
    free(got)
    s2.close()


def _pending_write(dev, m: Memory, s, n: int = 256):
    """An allocation of `m` with a queued (not waited) kernel write on stream `s`."""
    a = m.allocate(n * 4, s)
    h = handle_on(a, n)
    kernel_fn(dev, iota_kernel([n], [1]))(s, h)
    return a, h


@pytest.mark.parametrize("mode", ["async", "deferred"])
def test_pool_reuse_on_another_stream_waits_for_the_first(mem, dev, stream, owner, mode):
    """§3 #25 in our terms: a block freed on A with work pending is handed to B only after A
    waited; A's work is then complete, so B cannot clobber it or see it half done."""
    a_stream = make_stream(dev, mode)
    a, h = _pending_write(dev, mem, a_stream)
    a_stream.commit()
    shims.delete_tensor_object(h)
    assert pooled_ptrs(mem, a_stream) == [a.ptr]
    waits = a_stream.completed_waits
    b = mem.allocate(1024, stream)
    assert b.ptr == a.ptr
    assert a_stream.completed_waits == waits + 1
    hb = handle_on(b, 256)
    np.testing.assert_array_equal(hb.numpy(), iota([256]))
    shims.delete_tensor_object(hb)
    a_stream.close()


def test_pool_reuse_on_another_stream_after_its_wait_does_not_wait_again(mem, dev, stream,
                                                                         owner):
    """§3 #27: a block freed before the stream's last wait is reused without waiting."""
    a_stream = make_stream(dev, "deferred")
    a, h = _pending_write(dev, mem, a_stream)
    shims.delete_tensor_object(h)
    a_stream.commit_and_wait()
    waits = a_stream.completed_waits
    b = mem.allocate(1024, stream)
    assert b.ptr == a.ptr and a_stream.completed_waits == waits
    free(b)
    a_stream.close()


def test_pool_entry_is_tagged_with_the_streams_progress(mem, dev, stream, owner):
    a, h = _pending_write(dev, mem, stream)
    shims.delete_tensor_object(h)
    (entry,) = mem.pool.entries(stream)
    assert entry.uses[stream][0] == stream.recorded_seq > stream.completed_seq
    assert entry.owner is owner
    stream.commit_and_wait()


def test_pool_reuse_on_the_same_stream_is_in_stream_order(mem, dev, stream, owner):
    """Reuse on the freeing stream does not wait: the stream orders the old and new work."""
    a, h = _pending_write(dev, mem, stream)
    shims.delete_tensor_object(h)
    waits = stream.completed_waits
    b = mem.allocate(1024, stream)
    assert b.ptr == a.ptr and stream.completed_waits == waits
    hb = handle_on(b, 256)
    kernel_fn(dev, iota_kernel([256], [1], base=7.0))(stream, hb)  # same command buffer
    np.testing.assert_array_equal(hb.numpy(), iota([256], base=7.0))
    shims.delete_tensor_object(hb)


def test_recycled_block_keeps_its_history_for_host_access(mem, dev, stream, owner):
    """§3 #22: a pooled destination still written by queued work is waited for first."""
    a, h = _pending_write(dev, mem, stream)
    shims.delete_tensor_object(h)
    b = mem.allocate(1024, stream)
    assert b.busy()
    hb = handle_on(b, 256)
    upload(hb, np.full(256, 5.0, np.float32))   # waits, then the host write wins
    np.testing.assert_array_equal(hb.numpy(), np.full(256, 5.0, np.float32))
    shims.delete_tensor_object(hb)


def test_pool_reuse_waits_for_other_streams_that_used_the_block(mem, dev, stream, owner):
    """Bug fixed: a block used on B, then freed on A, was reused on A with B's work pending."""
    b_stream = make_stream(dev, "deferred")
    a = mem.allocate(1024, stream)
    h = handle_on(a, 256)
    kernel_fn(dev, iota_kernel([256], [1]))(b_stream, h)    # pending on B
    b_stream.commit()
    shims.delete_tensor_object(h)                            # pooled on A (its stream)
    waits = b_stream.completed_waits
    again = mem.allocate(1024, stream)
    assert again.ptr == a.ptr and b_stream.completed_waits == waits + 1
    free(again)
    b_stream.close()


def test_pool_purges_a_closed_streams_blocks(dev, owner, stream):
    """§3 #26: a destroyed stream's pooled blocks go with it."""
    s2 = make_stream(dev, "async")
    a = dev.memory.allocate(3008, s2)
    free(a)
    assert pooled_ptrs(dev.memory, s2) == [a.ptr]
    raw = dev.memory.raw_bytes
    s2.close()
    assert pooled_ptrs(dev.memory, s2) == []
    assert dev.memory.raw_bytes == raw - 3008


def test_pool_refuses_blocks_for_a_closed_stream(mem, dev, owner, stream):
    s2 = make_stream(dev, "async")
    a = mem.allocate(1000, s2)
    s2.close()
    raw = mem.raw_bytes
    free(a)
    assert pooled_ptrs(mem) == [] and mem.raw_bytes == raw - 1024


def test_pool_clear_frees_everything(mem, dev, stream, owner):
    s2 = make_stream(dev, "async")
    free(mem.allocate(1000, stream))
    free(mem.allocate(2000, s2))
    mem.pool.clear()
    assert mem.pool.entries() == [] and mem.pool.pooled_bytes == 0 and mem.raw_bytes == 0
    s2.close()


def test_pool_eviction_waits_for_pending_work(dev, stream, owner, monkeypatch):
    """An evicted block goes back to the device only after the work queued on it."""
    m = Memory(dev, PoolOptions(cap_bytes=2 * KIB))
    a, h = _pending_write(dev, m, stream, n=256)          # a 1 KiB block, busy
    shims.delete_tensor_object(h)
    freed = []
    real = dev._free
    monkeypatch.setattr(dev, "_free", lambda block: (freed.append(block), real(block)))
    waits = stream.completed_waits
    s2 = make_stream(dev, "async")
    small = [m.allocate(448, s2) for _ in range(3)]     # too small to take the 1 KiB block
    for x in small[:2]:
        free(x)
    assert stream.completed_waits == waits and freed == []
    free(small[2])                                       # over the cap: evicts the busy one
    assert stream.completed_waits == waits + 1 and freed == [a.block]
    assert pooled_ptrs(m) != [] and a.ptr not in pooled_ptrs(m)
    m.pool.clear()
    s2.close()


def test_freeing_settled_pooled_blocks_does_not_wait(mem, dev, stream, owner, monkeypatch):
    a, h = _pending_write(dev, mem, stream)
    shims.delete_tensor_object(h)
    stream.commit_and_wait()
    freed = []
    real = dev._free
    monkeypatch.setattr(dev, "_free", lambda block: (freed.append(block), real(block)))
    waits = stream.completed_waits
    mem.pool.clear()
    assert stream.completed_waits == waits and freed == [a.block]


def test_a_closed_stream_leaves_no_trace_in_the_pool(dev, owner, stream):
    s2 = make_stream(dev, "async")
    free(dev.memory.allocate(704, s2))
    s2.close()
    assert s2 not in dev.memory.pool._lists


def test_allocation_retries_once_after_dropping_the_pool(mem, dev, stream, owner, monkeypatch):
    free(mem.allocate(2000, stream))
    real = dev._alloc
    calls = []

    def flaky(n):
        calls.append(n)
        if len(calls) == 1:
            raise OutOfMemory("first try")
        return real(n)

    monkeypatch.setattr(dev, "_alloc", flaky)
    a = mem.allocate(100_000, stream)
    assert len(calls) == 2 and mem.pool.entries() == []
    free(a)


def test_out_of_memory_after_the_retry_propagates(mem, dev, stream, owner, monkeypatch):
    def never(n):
        raise OutOfMemory("no")

    monkeypatch.setattr(dev, "_alloc", never)
    live = mem.live()
    with pytest.raises(OutOfMemory):
        mem.allocate(100, stream)
    assert mem.live() == live


def test_device_memory_without_a_stream_is_freed_not_pooled(mem, owner):
    a = mem.allocate(100, None)
    free(a)
    assert mem.pool.entries() == [] and mem.raw_bytes == 0


def test_free_with_pending_work_is_a_hazard(dev, stream, owner, monkeypatch):
    """§7 hazard: a free while work is pending (the wait before it skipped) raises."""
    m = Memory(dev, PoolOptions(cap_bytes=0))      # nothing pooled: a real free
    a, h = _pending_write(dev, m, stream)
    monkeypatch.setattr(Allocation, "settle", lambda self, writes_only=False: None)
    with pytest.raises(HazardError, match="^free of .* may still use it"):
        shims.delete_tensor_object(h)
    monkeypatch.undo()
    stream.commit_and_wait()


# -- regions ----------------------------------------------------------------------------------


@pytest.fixture
def host(cpu, owner):
    """A caller's float32 array of 64 elements (random, never zeros)."""
    from tests.support import rand

    return rand([64], seed=1)


def test_bind_region_over_caller_memory(cpu, owner, host):
    r = cpu.memory.bind_region(host.ctypes.data, host.nbytes, keepalive=host)
    try:
        assert (r.kind, r.ptr, r.nbytes, r.block, r.owner) == ("region", host.ctypes.data,
                                                               256, None, owner)
        assert cpu.memory.find(host.ctypes.data + 255) is r
        assert r.keepalive is host
    finally:
        free(r)
    assert r.keepalive is None and r not in cpu.memory.live()


@pytest.mark.parametrize("ptr,nbytes,name", [
    (0, 16, "data_ptr"), (-64, 16, "data_ptr"), (None, 16, "data_ptr"), (4096.0, 16, "data_ptr"),
    (4096, -1, "nbytes"), (4096, 1.0, "nbytes"), ((1 << 64) - 8, 16, "nbytes"),
])
def test_bind_region_refuses_bad_arguments(cpu, owner, ptr, nbytes, name):
    live = cpu.memory.live()
    with pytest.raises(InvalidArgument, match=f"^{name}: "):
        cpu.memory.bind_region(ptr, nbytes)
    assert cpu.memory.live() == live


@pytest.mark.parametrize("start,end", [(0, 256), (-16, 16), (240, 300), (64, 128), (-8, 300)])
def test_second_binding_over_bound_memory_is_refused(cpu, owner, host, start, end):
    """§3 #39/#57/#59: a region never overlaps another region."""
    base = host.ctypes.data
    r = cpu.memory.bind_region(base, 256)
    try:
        with pytest.raises(InvalidArgument, match="^data_ptr: region .* would overlap"):
            cpu.memory.bind_region(base + start, end - start)
    finally:
        free(r)


def test_adjacent_regions_are_fine(cpu, owner, host):
    base = host.ctypes.data
    r1 = cpu.memory.bind_region(base, 128)
    r2 = cpu.memory.bind_region(base + 128, 128)
    assert cpu.memory.find(base + 127) is r1 and cpu.memory.find(base + 128) is r2
    free(r1)
    free(r2)


def test_region_over_an_allocation_is_refused(dev, stream, owner):
    """§3 #59: a region over memory an allocation covers is refused."""
    a = dev.memory.allocate(256, stream)
    try:
        for start, n in [(0, 16), (100, 16), (250, 100), (-8, 16)]:
            with pytest.raises(InvalidArgument, match="^data_ptr: region .* would overlap"):
                dev.memory.bind_region(a.ptr + start, n)
    finally:
        free(a)


def test_region_goes_with_its_last_handle_after_queued_work(cpu, stream, owner, host):
    """§3 #19/#84: borrowed memory is released with its last view, after queued work on it."""
    h = shims.create_tensor_from_blob(host.ctypes.data, [64], None, 0, "float32")
    v = shims.reinterpret_tensor(h, [32], [1], 32)
    region = h.alloc
    kernel_fn(cpu, iota_kernel([32], [1]))(stream, v)
    stream.commit()
    shims.delete_tensor_object(h)
    assert region in cpu.memory.live()
    shims.delete_tensor_object(v)           # last handle: waits, then releases
    assert region not in cpu.memory.live() and not region.busy()
    np.testing.assert_array_equal(host[32:], iota([32]))


def test_region_release_without_pending_work_does_not_wait(cpu, stream, owner, host):
    """§3 #67/#82: freeing host memory the device did not touch since the last wait leaves
    other queued work queued."""
    other = shims.empty_strided([8], None, "float32")
    h = shims.create_tensor_from_blob(host.ctypes.data, [64], None, 0, "float32")
    kernel_fn(cpu, iota_kernel([8], [1]))(stream, other)
    waits = stream.completed_waits
    shims.delete_tensor_object(h)
    assert stream.completed_waits == waits and other.alloc.busy()
    shims.delete_tensor_object(other)
    stream.commit_and_wait()


def test_region_release_with_pending_work_is_a_hazard_when_not_waited(cpu, stream, owner, host,
                                                                      monkeypatch):
    h = shims.create_tensor_from_blob(host.ctypes.data, [64], None, 0, "float32")
    kernel_fn(cpu, iota_kernel([64], [1]))(stream, h)
    monkeypatch.setattr(Allocation, "settle", lambda self, writes_only=False: None)
    with pytest.raises(HazardError, match="^release of region of "):
        shims.delete_tensor_object(h)
    monkeypatch.undo()
    stream.commit_and_wait()


def test_region_is_never_pooled(cpu, stream, owner, host):
    h = shims.create_tensor_from_blob(host.ctypes.data, [64], None, 0, "float32")
    shims.delete_tensor_object(h)
    assert host.ctypes.data not in pooled_ptrs(cpu.memory)


def test_view_past_a_regions_end_is_refused(cpu, stream, owner, host):
    """§3 #58/#77 in our terms: a region does not grow; a view past its end is refused."""
    h = shims.create_tensor_from_blob(host.ctypes.data, [32], None, 0, "float32")
    with pytest.raises(InvalidArgument, 
            match=r"^sizes/strides/storage_offset: view bytes .* lie outside"):
        shims.reinterpret_tensor(h, [33], [1], 0)
    with pytest.raises(InvalidArgument, 
            match=r"^sizes/strides/storage_offset: view bytes .* lie outside"):
        shims.reinterpret_tensor(h, [4], [1], 30)
    assert h.alloc.nbytes == 128
    shims.delete_tensor_object(h)


def test_blob_growing_a_live_region_is_refused(cpu, stream, owner, host):
    h = shims.create_tensor_from_blob(host.ctypes.data, [32], None, 0, "float32")
    with pytest.raises(InvalidArgument, match="^data_ptr: blob .* runs past the end of region@"):
        shims.create_tensor_from_blob(host.ctypes.data, [64], None, 0, "float32")
    with pytest.raises(InvalidArgument, match="^data_ptr: blob .* runs past the end of region@"):
        shims.create_tensor_from_blob(host.ctypes.data + 64, [32], None, 0, "float32")
    assert owner.handles == {h}
    shims.delete_tensor_object(h)


def test_blob_at_a_released_regions_start_makes_a_larger_region(cpu, stream, owner, host):
    """§3 #70 in our terms: the small region went with its tensor; a new blob binds anew."""
    h = shims.create_tensor_from_blob(host.ctypes.data, [16], None, 0, "float32")
    shims.delete_tensor_object(h)
    h2 = shims.create_tensor_from_blob(host.ctypes.data, [64], None, 0, "float32")
    assert h2.alloc.nbytes == 256
    np.testing.assert_array_equal(h2.numpy(), host)
    shims.delete_tensor_object(h2)


def test_blob_reaching_into_a_region_from_before_is_refused(cpu, stream, owner, host):
    """§3 #33: a blob that starts before a region and reaches into it."""
    h = shims.create_tensor_from_blob(host.ctypes.data + 128, [32], None, 0, "float32")
    live = cpu.memory.live()
    with pytest.raises(InvalidArgument, match="^data_ptr: region .* would overlap"):
        shims.create_tensor_from_blob(host.ctypes.data, [33], None, 0, "float32")
    assert cpu.memory.live() == live and owner.handles == {h}
    shims.delete_tensor_object(h)


def test_blob_reaching_into_an_allocation_is_refused(dev, stream, owner):
    """§3 #56: a blob starting before a runtime allocation and reaching into it."""
    a = shims.empty_strided([64], None, "float32", dev)
    live = dev.memory.live()
    with pytest.raises(InvalidArgument, match="^data_ptr: region .* would overlap"):
        shims.create_tensor_from_blob(a.alloc.ptr - 16, [8], None, 0, "float32", dev)
    assert dev.memory.live() == live and owner.handles == {a}
    shims.delete_tensor_object(a)


def test_region_handle_reads_and_writes_the_callers_memory(cpu, stream, owner, host):
    """§3 #14/#31: an offset view of a region is bound into it; kernel writes land there."""
    h = shims.create_tensor_from_blob(host.ctypes.data, [8, 8], None, 0, "float32")
    v = shims.reinterpret_tensor(h, [4, 4], [8, 1], 12)
    assert v.alloc is h.alloc and v.byte_offset == 48
    kernel_fn(cpu, iota_kernel([4, 4], [8, 1]))(stream, v)
    stream.commit_and_wait()
    np.testing.assert_array_equal(host.reshape(8, 8)[1:5, 4:8], iota([4, 4]))
    shims.delete_tensor_object(v)
    shims.delete_tensor_object(h)


def test_overlapping_region_views_see_each_others_writes(cpu, stream, owner, host):
    """§3 #76: two overlapping views of one region in one command buffer are ordered."""
    from tests.support import copy_kernel

    base = shims.create_tensor_from_blob(host.ctypes.data, [64], None, 0, "float32")
    a = shims.reinterpret_tensor(base, [32], [1], 0)
    b = shims.reinterpret_tensor(base, [32], [1], 16)
    out = shims.empty_strided([32], None, "float32")
    kernel_fn(cpu, iota_kernel([32], [1]))(stream, a)
    kernel_fn(cpu, copy_kernel([32], [1], [1]))(stream, b, out)
    got = out.numpy()
    np.testing.assert_array_equal(got[:16], iota([32])[16:])
    for h in (a, b, base, out):
        shims.delete_tensor_object(h)


def test_region_views_made_after_a_delete_are_still_ordered(cpu, stream, owner, host):
    """§3 #80: delete a view, make a new one at the same place: queued work through both is
    ordered, because both bind the one region."""
    from tests.support import copy_kernel

    base = shims.create_tensor_from_blob(host.ctypes.data, [64], None, 0, "float32")
    v1 = shims.reinterpret_tensor(base, [16], [1], 8)
    kernel_fn(cpu, iota_kernel([16], [1], base=3.0))(stream, v1)
    shims.delete_tensor_object(v1)
    v2 = shims.reinterpret_tensor(base, [16], [1], 8)
    out = shims.empty_strided([16], None, "float32")
    kernel_fn(cpu, copy_kernel([16], [1], [1]))(stream, v2, out)
    np.testing.assert_array_equal(out.numpy(), iota([16], base=3.0))
    for h in (v2, base, out):
        shims.delete_tensor_object(h)


# -- constants --------------------------------------------------------------------------------


@pytest.fixture
def consts(dev, stream, owner):
    """A constants allocation of three weights (16, 0 and 40 bytes) in the test's owner."""
    a, offsets = dev.memory.allocate_constants([16, 0, 40], stream)
    return a, offsets


def test_constants_are_one_aligned_allocation(dev, owner, consts):
    a, offsets = consts
    assert a.kind == "constants" and a.owner is owner and a in owner.allocations
    assert offsets == [0, 64, 64]
    assert a.nbytes == 128 and a.segments == [(0, 16), (64, 104)]
    assert a.ptr % ALIGN == 0


def test_constants_segments_bound_blobs_and_views(dev, consts):
    a, _ = consts
    assert a.segment_of(0) == (0, 16) and a.segment_of(15) == (0, 16)
    assert a.segment_of(64) == (64, 104) and a.segment_of(103) == (64, 104)
    assert a.segment_of(16) == (0, 16) and a.segment_of(104) == (64, 104)   # their ends
    assert a.segment_of(20) == (16, 64)      # padding belongs to no constant
    assert a.segment_of(110) == (104, 128)


def test_blob_in_the_padding_reaches_no_constant(dev, stream, owner, consts):
    """Bug fixed: a blob starting in the padding after a weight could run into the next."""
    a, offsets = consts
    with pytest.raises(InvalidArgument, match="^data_ptr: blob .* its constant"):
        shims.create_tensor_from_blob(a.ptr + 16, [13], None, 0, "float32", device=dev.name)
    with pytest.raises(InvalidArgument, match="^data_ptr: blob .* its constant"):
        shims.create_tensor_from_blob(a.ptr + 20, [12], None, 0, "float32", device=dev.name)
    pad = shims.create_tensor_from_blob(a.ptr + 20, [11], None, 0, "float32", device=dev.name)
    shims.delete_tensor_object(pad)


def test_empty_view_at_a_constants_end_views_back_into_it(dev, stream, owner, consts):
    a, _ = consts
    w = shims.create_tensor_from_blob(a.ptr, [4], None, 0, "float32", device=dev.name)
    end = shims.create_tensor_from_blob(a.ptr + 16, [0], None, 0, "float32", device=dev.name)
    assert end.alloc is a and end.byte_offset == 16
    back = shims.reinterpret_tensor(end, [2], [1], -2)
    assert back.byte_offset == 8
    with pytest.raises(InvalidArgument, match="^sizes/strides/storage_offset: .* outside"):
        shims.reinterpret_tensor(end, [1], [1], 0)
    for h in (w, end, back):
        shims.delete_tensor_object(h)


@pytest.mark.parametrize("sizes", [[-1], [4, 1.5], ["8"], [None]])
def test_allocate_constants_refuses_bad_sizes(dev, stream, owner, sizes):
    live = dev.memory.live()
    with pytest.raises(InvalidArgument, match="^sizes: constant size"):
        dev.memory.allocate_constants(sizes, stream)
    assert dev.memory.live() == live and not owner.allocations


def test_constants_with_no_weights(dev, stream, owner):
    a, offsets = dev.memory.allocate_constants([], stream)
    assert offsets == [] and a.nbytes == 0 and a.segments == []


def test_constants_are_not_freed_with_their_last_handle(dev, stream, owner, consts):
    a, _ = consts
    h = shims.create_tensor_from_blob(a.ptr, [4], None, 0, "float32", dev)
    shims.delete_tensor_object(h)
    assert a.users == 0 and not a.freed and a in dev.memory.live()
    assert a.ptr not in pooled_ptrs(dev.memory)


def test_constants_are_freed_with_their_owner(dev, stream, owner):
    """§3 #51: freeing constants (closing their owner) frees their memory."""
    o = Owner("delegate")
    with owner_scope(o):
        a, _ = dev.memory.allocate_constants([64], stream)
        h = shims.create_tensor_from_blob(a.ptr, [16], None, 0, "float32", dev)
    raw = dev.memory.raw_bytes
    o.close()
    assert a.freed and a not in dev.memory.live() and not o.allocations
    assert dev.memory.raw_bytes == raw - 64
    assert h.state == "retired"
    m = Memory(dev, PoolOptions())          # alone, so the count is exact
    o2 = Owner("delegate2")
    m.allocate_constants([100, 28], stream, owner=o2)
    assert m.raw_bytes == 192
    o2.close()
    assert m.raw_bytes == 0


def test_constants_are_never_taken_from_the_pool(dev, stream, owner):
    d = dev.memory.allocate(960, stream)
    free(d)
    a, _ = dev.memory.allocate_constants([960], stream)
    assert a.ptr != d.ptr


def test_constants_load_one_after_another(dev, stream, owner, consts):
    """§3 #38: wrapping the first constant does not block loading the second."""
    a, offsets = consts
    w0 = shims.create_tensor_from_blob(a.ptr, [4], None, 0, "float32", dev)
    upload(w0, iota([4]))
    w2 = shims.create_tensor_from_blob(a.ptr + offsets[2], [10], None, 0, "float32", dev)
    upload(w2, iota([10], base=100.0))
    np.testing.assert_array_equal(w0.numpy(), iota([4]))
    np.testing.assert_array_equal(w2.numpy(), iota([10], base=100.0))
    shims.delete_tensor_object(w0)
    shims.delete_tensor_object(w2)


def test_blob_inside_a_constant_stays_inside_it(dev, stream, owner, consts):
    """§3 #37/#71: a blob in a constant may not reach into the next one."""
    a, offsets = consts
    ok = shims.create_tensor_from_blob(a.ptr + 8, [2], None, 0, "float32", dev)
    with pytest.raises(InvalidArgument, 
            match="^data_ptr: blob .* past the end of its constant in constants@"):
        shims.create_tensor_from_blob(a.ptr + 8, [3], None, 0, "float32", dev)
    with pytest.raises(InvalidArgument, 
            match="^data_ptr: blob .* past the end of its constant in constants@"):
        shims.create_tensor_from_blob(a.ptr + offsets[2], [11], None, 0, "float32", dev)
    assert owner.handles == {ok}
    shims.delete_tensor_object(ok)


def test_view_of_a_constant_stays_inside_it(dev, stream, owner, consts):
    """§3 #60: a view of the offset-0 constant must stay inside that constant."""
    a, offsets = consts
    w0 = shims.create_tensor_from_blob(a.ptr, [4], None, 0, "float32", dev)
    w2 = shims.create_tensor_from_blob(a.ptr + offsets[2], [10], None, 0, "float32", dev)
    with pytest.raises(InvalidArgument, 
            match=r"^sizes/strides/storage_offset: view bytes .* lie outside"):
        shims.reinterpret_tensor(w0, [5], [1], 0)
    with pytest.raises(InvalidArgument, 
            match=r"^sizes/strides/storage_offset: view bytes .* lie outside"):
        shims.reinterpret_tensor(w2, [4], [1], -1)
    v = shims.reinterpret_tensor(w2, [5], [1], 5)
    assert v.byte_offset == 64 + 20
    for h in (w0, w2, v):
        shims.delete_tensor_object(h)


def test_reloading_a_constant_is_ordered_after_its_readers(dev, stream, owner, consts):
    """§3 #61: re-copying a constant does not change what queued readers see."""
    from tests.support import copy_kernel

    a, _ = consts
    w = shims.create_tensor_from_blob(a.ptr, [4], None, 0, "float32", dev)
    upload(w, iota([4]))
    out = shims.empty_strided([4], None, "float32", dev)
    new = shims.empty_strided([4], None, "float32", dev)
    upload(new, iota([4], base=50.0))
    kernel_fn(dev, copy_kernel([4], [1], [1]))(stream, w, out)
    shims.copy_(w, new)
    np.testing.assert_array_equal(out.numpy(), iota([4]))
    np.testing.assert_array_equal(w.numpy(), iota([4], base=50.0))
    for h in (w, out, new):
        shims.delete_tensor_object(h)


def test_freeing_constants_waits_for_their_readers(dev, stream, owner):
    """§3 #62: queued readers still get the data when the constants' owner closes."""
    from tests.support import copy_kernel

    o = Owner("delegate")
    with owner_scope(o):
        a, _ = dev.memory.allocate_constants([16], stream)
        w = shims.create_tensor_from_blob(a.ptr, [4], None, 0, "float32", dev)
    upload(w, iota([4]))
    out = shims.empty_strided([4], None, "float32", dev)
    kernel_fn(dev, copy_kernel([4], [1], [1]))(stream, w, out)
    stream.commit()
    o.close()
    assert a.freed
    np.testing.assert_array_equal(out.numpy(), iota([4]))
    shims.delete_tensor_object(out)


def test_views_of_freed_constants_from_other_owners_are_refused(dev, stream, owner):
    """Bug fixed: a handle in another owner kept using constants freed with their owner.
    Like the anchor's retired handles (§7.2), every shim refuses it; delete just drops it."""
    o = Owner("delegate")
    with owner_scope(o):
        a, _ = dev.memory.allocate_constants([16], stream)
        w = shims.create_tensor_from_blob(a.ptr, [4], None, 0, "float32", dev)
    mine = shims.new_tensor_handle(w)
    o.close()
    with pytest.raises(InvalidArgument, match="^handle: the memory of .* was freed with its owner"):
        mine.numpy()
    with pytest.raises(InvalidArgument, match="^handle: the memory of .* was freed with its owner"):
        shims.reinterpret_tensor(mine, [2], [1], 0)
    shims.delete_tensor_object(mine)
    assert mine.state == "deleted" and mine not in owner.handles


def test_drop_owned_is_idempotent(dev, stream, owner):
    a, _ = dev.memory.allocate_constants([8], stream)
    dev.memory.drop_owned(a)
    raw = dev.memory.raw_bytes
    dev.memory.drop_owned(a)
    assert a.freed and dev.memory.raw_bytes == raw and a not in owner.allocations


def test_block_repr_hides_its_buffer():
    b = Block(4096, 64, keep=np.zeros(64, np.uint8))
    assert "keep" not in repr(b) and b == Block(4096, 64)


# -- boundaries (found by mutation testing, docs/mutation.md) ----------------------------------


def test_a_new_memory_has_no_bytes_and_no_peak(dev):
    m = Memory(dev, PoolOptions())
    assert (m.raw_bytes, m.peak_raw_bytes, m.live(), m.pool.entries()) == (0, 0, [], [])


def test_find_of_a_zero_byte_allocation_covers_only_its_start(dev, stream, owner):
    a = dev.memory.allocate(0, stream)
    try:
        assert dev.memory.find(a.ptr) is a and dev.memory.find(a.ptr + 1) is not a
    finally:
        free(a)


def test_empty_region_just_before_an_allocation_is_its_own(dev, stream, owner):
    a = shims.empty_strided([4], None, "float32", dev)
    e = shims.create_tensor_from_blob(a.alloc.ptr - 1, [0], None, 0, "uint8", device=dev.name)
    assert e.alloc is not a.alloc and e.alloc.kind == "region" and e.alloc.ptr == a.alloc.ptr - 1
    shims.delete_tensor_object(e)
    shims.delete_tensor_object(a)


def test_region_at_the_lowest_address(cpu, owner):
    r = cpu.memory.bind_region(1, 0)
    assert r.ptr == 1 and r.nbytes == 0
    free(r)


def test_region_reaching_the_top_of_the_address_space_is_refused(cpu, owner):
    with pytest.raises(InvalidArgument, match="^nbytes: region size 16 is invalid"):
        cpu.memory.bind_region((1 << 64) - 16, 16)
    r = cpu.memory.bind_region((1 << 64) - 17, 16)
    free(r)


def test_overlap_message_names_the_refused_range(cpu, owner, host):
    base = host.ctypes.data
    r = cpu.memory.bind_region(base, 64)
    try:
        with pytest.raises(InvalidArgument) as e:
            cpu.memory.bind_region(base + 32, 64)
        assert str(e.value).startswith(
            f"data_ptr: region [{base + 32:#x}, {base + 96:#x}) would overlap {r.describe()}")
    finally:
        free(r)


def test_constants_belong_to_the_given_owner_and_stream(dev, stream, owner):
    o = Owner("delegate")
    a, _ = dev.memory.allocate_constants([8, 8], stream, owner=o)
    assert a.owner is o and a in o.allocations and a not in owner.allocations
    assert a.stream is stream and a.kind == "constants"
    o.close()
    assert a.freed


def test_a_one_byte_constant_bounds_its_blobs(dev, stream, owner):
    a, offsets = dev.memory.allocate_constants([1, 4], stream)
    assert a.segments == [(0, 1), (64, 68)]
    one = shims.create_tensor_from_blob(a.ptr, [1], None, 0, "uint8", device=dev.name)
    with pytest.raises(InvalidArgument, match="^data_ptr: blob .* its constant"):
        shims.create_tensor_from_blob(a.ptr, [2], None, 0, "uint8", device=dev.name)
    shims.delete_tensor_object(one)


def test_freeing_constants_gives_the_device_its_block(dev, stream, owner, monkeypatch):
    freed = []
    real = dev._free
    monkeypatch.setattr(dev, "_free", lambda block: (freed.append(block), real(block)))
    o = Owner("delegate")
    a, _ = dev.memory.allocate_constants([32], stream, owner=o)
    block = a.block
    o.close()
    assert [b for b in freed if b is block] == [block]


def test_freeing_constants_under_pending_work_is_a_hazard(dev, stream, owner, monkeypatch):
    from tests.support import copy_kernel

    a, _ = dev.memory.allocate_constants([16], stream)
    w = shims.create_tensor_from_blob(a.ptr, [4], None, 0, "float32", device=dev.name)
    out = shims.empty_strided([4], None, "float32", dev)
    kernel_fn(dev, copy_kernel([4], [1], [1]))(stream, w, out)
    monkeypatch.setattr(Allocation, "settle", lambda self, writes_only=False: None)
    with pytest.raises(HazardError, match="^free of constants of constants@"):
        dev.memory.drop_owned(a)
    monkeypatch.undo()
    stream.commit_and_wait()
    for h in (w, out):
        shims.delete_tensor_object(h)


def test_a_block_not_pooled_goes_back_to_the_device(dev, stream, owner, monkeypatch):
    m = Memory(dev, PoolOptions(cap_bytes=0))
    freed = []
    real = dev._free
    monkeypatch.setattr(dev, "_free", lambda block: (freed.append(block), real(block)))
    a = m.allocate(100, stream)
    free(a)
    assert freed == [a.block] and m.raw_bytes == 0


def test_among_equal_fits_the_oldest_block_is_reused(mem, stream, owner):
    """The block freed first is the one most likely done with its work: it goes first."""
    xs = [mem.allocate(1000, stream) for _ in range(3)]
    for x in xs:
        free(x)
    got = [mem.allocate(1000, stream) for _ in range(3)]
    assert [g.ptr for g in got] == [x.ptr for x in xs]
    for g in got:
        free(g)


def test_take_looks_past_the_requesting_streams_own_list(mem, dev, stream, owner):
    """The requesting stream's pool has no fit: another stream's block is taken (after a
    wait), not a new one."""
    other = make_stream(dev, "async")
    mine = mem.allocate(64, stream)
    free(mine)                                  # this stream's list exists, too small
    theirs = mem.allocate(4096, other)
    free(theirs)
    got = mem.allocate(4096, stream)
    assert got.ptr == theirs.ptr
    free(got)
    other.close()


def test_reuse_from_another_streams_list_does_not_wait_on_the_requester(mem, dev, stream,
                                                                         owner):
    """A block freed on T but last written on S is reused on S in S's order: no wait on S."""
    t = make_stream(dev, "async")
    s = make_stream(dev, "deferred")
    a = mem.allocate(1024, t)
    h = handle_on(a, 256)
    kernel_fn(dev, iota_kernel([256], [1]))(s, h)        # pending on S
    shims.delete_tensor_object(h)                         # pooled on T, its stream
    waits = s.completed_waits
    b = mem.allocate(1024, s)
    assert b.ptr == a.ptr and s.completed_waits == waits
    free(b)
    s.close()
    t.close()


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 1), st.integers(0, 40_000)),
                    max_size=40))
def test_pool_accounting_holds_under_random_traffic(cpu, ops):
    """Random allocations and frees on two streams: every block is either live (in one
    allocation) or pooled, never both; the byte counts add up; the cap holds; live blocks
    never overlap; clearing the pool gives every byte back."""
    cap = 64 * KIB
    m = Memory(cpu, PoolOptions(cap_bytes=cap))
    streams = [make_stream(cpu, "async"), make_stream(cpu, "async")]
    o = Owner("pool-traffic")
    live: list[Allocation] = []
    try:
        for alloc, si, n in ops:
            if alloc or not live:
                live.append(m.allocate(n, streams[si], o))
            else:
                free(live.pop(n % len(live)))
            entries = m.pool.entries()
            pooled = {id(e.block) for e in entries}
            used = [a.block for a in m.live()]
            assert len({id(b) for b in used}) == len(used) and not pooled & {id(b) for b in used}
            assert m.pool.pooled_bytes == sum(e.block.nbytes for e in entries) <= cap
            assert m.raw_bytes == sum(b.nbytes for b in used) + m.pool.pooled_bytes
            spans = sorted((b.ptr, b.ptr + b.nbytes) for b in used)
            assert all(e1 <= s2 for (_, e1), (s2, _) in zip(spans, spans[1:]))
            assert all(a.block.nbytes >= max(a.nbytes, 1) for a in m.live())
        for a in live:
            free(a)
        live.clear()
        m.pool.clear()
        assert m.raw_bytes == 0 and m.live() == [] and m.pool.pooled_bytes == 0
    finally:
        for a in live:
            free(a)
        o.close()
        for s in streams:
            s.close()


def test_padding_after_a_middle_constant_ends_at_the_next(dev, stream, owner):
    a, offsets = dev.memory.allocate_constants([16, 8, 4], stream)
    assert offsets == [0, 64, 128] and a.segment_of(80) == (72, 128)
    pad = shims.create_tensor_from_blob(a.ptr + 76, [13], None, 0, "float32", device=dev.name)
    with pytest.raises(InvalidArgument, match="^data_ptr: blob .* its constant"):
        shims.create_tensor_from_blob(a.ptr + 76, [14], None, 0, "float32", device=dev.name)
    shims.delete_tensor_object(pad)
