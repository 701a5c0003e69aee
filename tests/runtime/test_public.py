"""aotrt/runtime/public.py (aotrt.Tensor) and aotrt/runtime/dlpack.py: host access, DLPack
export to torch and numpy (zero copy, memory kept alive by the consumer), DLPack import."""

from __future__ import annotations

import gc

import ml_dtypes
import numpy as np
import pytest

import aotrt
from aotrt import dtypes
from aotrt.errors import InvalidArgument
from aotrt.exporter.builder import ProgramBuilder
from aotrt.runtime import dlpack, shims
from aotrt.runtime.device import cuda_available, get_device
from aotrt.runtime.memory import PROCESS_OWNER, owner_scope
from tests.support import rand

torch = pytest.importorskip("torch")

DTYPES = [("float32", np.float32, torch.float32), ("bfloat16", ml_dtypes.bfloat16, torch.bfloat16),
          ("float16", np.float16, torch.float16), ("int64", np.int64, torch.int64),
          ("int32", np.int32, torch.int32), ("uint8", np.uint8, torch.uint8),
          ("bool", np.bool_, torch.bool)]


def identity(dtype: str, shape: list[int]) -> aotrt.Delegate:
    b = ProgramBuilder(f"Id_{dtype}")
    x = b.input("x", dtype, shape)
    o = b.output("o", dtype, shape)
    b.copy(o, x)
    return aotrt.load(b.build(), check_hazards=True)


def sample(np_dtype: type, shape: list[int], seed: int) -> np.ndarray:
    if np_dtype is np.bool_:
        return np.random.default_rng(seed).random(shape) < 0.5
    if np.dtype(np_dtype).kind in "iu":
        return np.random.default_rng(seed).integers(1, 100, size=shape).astype(np_dtype)
    return rand(shape, np_dtype, seed=seed)


@pytest.mark.parametrize("name,np_dtype,t_dtype", DTYPES, ids=[d[0] for d in DTYPES])
def test_torch_from_dlpack_is_zero_copy(name: str, np_dtype: type, t_dtype: object) -> None:
    with identity(name, [3, 5]) as m:
        x = sample(np_dtype, [3, 5], 1)
        (out,) = m.run(x)
        assert out.dtype is aotrt.dtypes.as_dtype(name) and out.device == "cpu"
        t = torch.from_dlpack(out)
        assert t.dtype == t_dtype and tuple(t.shape) == (3, 5)
        np.testing.assert_array_equal(t.to(torch.float32).numpy() if name == "bfloat16"
                                      else t.numpy(), x.astype(np.float32) if name == "bfloat16"
                                      else x)
        assert t.data_ptr() == out.handle.address
        # Shared memory: a write through torch shows in the Tensor.
        t[0, 0] = t[1, 1]
        assert out.numpy()[0, 0] == x[1, 1]


@pytest.mark.parametrize("name,np_dtype,t_dtype", DTYPES, ids=[d[0] for d in DTYPES])
def test_torch_inputs_of_every_dtype(name: str, np_dtype: type, t_dtype: object) -> None:
    with identity(name, [4, 2]) as m:
        x = torch.from_numpy(sample(np_dtype, [4, 2], 2).view(np.uint16)).view(torch.bfloat16) \
            if name == "bfloat16" else torch.from_numpy(sample(np_dtype, [4, 2], 2))
        (out,) = m.run(x)
        assert torch.equal(torch.from_dlpack(out), x)


def test_memory_outlives_release_and_close_while_torch_holds_it() -> None:
    dev = get_device("cpu")
    m = identity("float32", [1000])
    x = rand([1000], seed=3)
    (out,) = m.run(x)
    alloc = out.handle.alloc
    t = torch.from_dlpack(out)
    out.release()
    out.release()     # safe twice
    m.close()
    del out
    gc.collect()
    assert alloc in dev.memory.live()
    np.testing.assert_array_equal(t.numpy(), x)
    del t
    gc.collect()
    assert alloc not in dev.memory.live()


def test_collected_tensor_frees_its_memory() -> None:
    dev = get_device("cpu")
    handles = len(PROCESS_OWNER.handles)
    with identity("float32", [256]) as m:
        (out,) = m.run(rand([256], seed=4))
        alloc = out.handle.alloc
        assert len(PROCESS_OWNER.handles) == handles + 1
        del out
        gc.collect()
        assert alloc not in dev.memory.live()
        assert len(PROCESS_OWNER.handles) == handles


def test_unconsumed_capsule_releases_its_reference() -> None:
    handles = len(PROCESS_OWNER.handles)
    with identity("float32", [8]) as m:
        (out,) = m.run(rand([8], seed=5))
        cap = out.__dlpack__()
        assert len(PROCESS_OWNER.handles) == handles + 2
        del cap
        gc.collect()
        assert len(PROCESS_OWNER.handles) == handles + 1
        out.release()
    assert len(PROCESS_OWNER.handles) == handles


def test_numpy_from_dlpack_and_array_protocols() -> None:
    with identity("float32", [2, 3]) as m:
        x = rand([2, 3], seed=6)
        (out,) = m.run(x)
        view = np.from_dlpack(out)
        np.testing.assert_array_equal(view, x)
        np.testing.assert_array_equal(np.asarray(out), x)
        np.testing.assert_array_equal(out.numpy(), x)
        assert np.asarray(out, dtype=np.float64).dtype == np.float64
        assert np.asarray(out) is not np.asarray(out)      # __array__ copies
        assert out.__dlpack_device__() == (1, 0)
        assert out.shape == (2, 3) and out.strides == (3, 1) and out.ndim == 2
        assert out.numel == 6 and len(out) == 2
        assert "shape=[2, 3]" in repr(out)


def test_released_tensor_refuses_use() -> None:
    with identity("float32", [2]) as m:
        (out,) = m.run(rand([2], seed=7))
        out.release()
        assert out.released and "released" in repr(out)
        with pytest.raises(InvalidArgument, match="tensor: handle is deleted"):
            out.numpy()
        with pytest.raises(InvalidArgument):
            out.__dlpack__()


def test_dlpack_export_refuses_copy_and_other_devices() -> None:
    with identity("float32", [2]) as m:
        (out,) = m.run(rand([2], seed=8))
        with pytest.raises(BufferError, match="does not copy"):
            out.__dlpack__(copy=True)
        with pytest.raises(BufferError, match="cannot be exported"):
            out.__dlpack__(dl_device=(2, 0))


def test_numpy_waits_for_pending_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a deferred stream nothing runs before a wait: numpy() must wait, not read early."""
    from aotrt.runtime import delegate as delegate_mod
    from aotrt.runtime.device import StreamOptions

    class Deferred:
        @staticmethod
        def from_env(**kw: object) -> StreamOptions:
            return StreamOptions(deferred=True, **kw)
    monkeypatch.setattr(delegate_mod, "StreamOptions", Deferred)
    with identity("float32", [64]) as m:
        (a,) = m.run(rand([64], seed=9))
        (b,) = m.run(a)                   # a Tensor input: nothing waits during the run
        assert m.stream.completed_seq < m.stream.submitted_seq
        np.testing.assert_array_equal(b.numpy(), a.numpy())
        (c,) = m.run(a)
        np.testing.assert_array_equal(torch.from_dlpack(c).numpy(), a.numpy())


def test_import_of_a_bfloat16_capsule() -> None:
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16).t()
    imp = dlpack.from_dlpack(t)
    assert imp.dtype is aotrt.bfloat16 and imp.shape == (4, 3) and imp.strides == (1, 4)
    assert imp.ptr == t.data_ptr() and imp.device == "cpu"


def test_import_refuses_objects_without_dlpack() -> None:
    class Fake:
        def __dlpack__(self) -> object:
            return "not a capsule"
    with pytest.raises(InvalidArgument, match="did not return a 'dltensor' capsule"):
        dlpack.from_dlpack(Fake())


@pytest.mark.parametrize("name,np_dtype,t_dtype", DTYPES[:3], ids=[d[0] for d in DTYPES[:3]])
def test_from_numpy_makes_a_device_tensor(name: str, np_dtype: type, t_dtype: object) -> None:
    x = sample(np_dtype, [3, 4], 11)
    t = aotrt.Tensor.from_numpy(x)
    assert t.shape == (3, 4) and t.dtype.name == name and t.device == "cpu"
    np.testing.assert_array_equal(t.numpy(), x)
    x[0, 0] = x[1, 1] + 1          # a copy: later changes to the array do not show
    assert t.numpy()[0, 0] != x[0, 0]
    with identity(name, [3, 4]) as m:
        (out,) = m.run(t)
        np.testing.assert_array_equal(out.numpy(), t.numpy())
    t.release()


def test_numpy_scalar_input() -> None:
    with identity("float32", []) as m:
        (out,) = m.run(np.float32(2.5))
        assert out.shape == () and float(out.numpy()) == 2.5


def _export_and_let_go(seed: int) -> object:
    """A cpu Tensor exported to torch, then let go by both; returns its allocation."""
    out = aotrt.Tensor.from_numpy(rand([64], seed=seed))
    alloc = out.handle.alloc
    t = torch.from_dlpack(out)
    out.release()
    del t
    gc.collect()
    return alloc


def test_letting_go_tells_the_device_the_consumers_stream(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """A DLPack consumer letting go passes its stream to the device's `after_consumer`
    before the memory goes; a hook that fails is logged, and the memory still goes."""
    dev = get_device("cpu")
    seen: list[tuple[object, object]] = []
    monkeypatch.setattr(type(dev), "after_consumer",
                        lambda self, alloc, stream: seen.append((alloc, stream)))
    alloc = _export_and_let_go(5)
    assert seen == [(alloc, None)]
    assert alloc not in dev.memory.live()

    def fails(self: object, alloc: object, stream: object) -> None:
        raise RuntimeError("boom")
    monkeypatch.setattr(type(dev), "after_consumer", fails)
    assert _export_and_let_go(6) not in dev.memory.live()


@pytest.mark.skipif(not cuda_available() or not torch.cuda.is_available(),
                    reason="no CUDA GPU here")
def test_memory_torch_still_reads_is_reused_only_after_torch_is_done() -> None:
    """torch frees a DLPack tensor when its last kernel is queued, not run. The block goes
    back to the pool of the stream that made it; a write there into the reused block must
    wait for torch's queued read (a spin of about 0.5 s holds that read back)."""
    dev = get_device("cuda")
    stream = dev.default_stream()
    n = 1 << 20
    first = aotrt.Tensor.from_numpy(np.full(n, 1.0, np.float32), device="cuda")
    ptr = first.handle.alloc.ptr
    # A collection inside the window would take long enough to let the spin end first.
    gc.collect()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        t = torch.from_dlpack(first)
        torch.cuda._sleep(1_000_000_000)
        copy = t.clone()
        read = torch.cuda.Event()
        read.record()
        del t
    first.release()
    del first
    with owner_scope(PROCESS_OWNER):
        h = shims.empty_strided([n], [1], dtypes.float32, dev)
    try:
        assert h.alloc.ptr == ptr, "the pool did not hand the block out again"
        stream.fill(h, 0)
        stream.commit()
        pending = not read.query()
        stream.commit_and_wait()
        torch.cuda.synchronize()
        assert pending, "torch's read was done before aotrt's write was queued: no check"
        assert bool((copy == 1.0).all()), "torch read the block after aotrt overwrote it"
    finally:
        shims.delete_tensor_object(h)
