"""The cpu device's oneDNN state beyond convolutions and linear (those are tested with their
ops): the array matmul attention uses, the GEMM pool capability and the BLAS thread scope."""

from __future__ import annotations

import numpy as np
import pytest

from aotrt.runtime.device import get_device
from aotrt.runtime.backends.cpu import dnnl as cpu_dnnl


@pytest.fixture
def dnnl(monkeypatch):
    """The cpu device's oneDNN state, taking any matmul implementation (so the tests run
    the oneDNN path on every CPU); skips where onednn-cpu-gomp is not installed."""
    if cpu_dnnl.find_library() is None:
        pytest.skip(f"{cpu_dnnl.DIST} is not installed")
    monkeypatch.setattr(cpu_dnnl, "FAST_MATMUL", ("",))
    d = get_device("cpu").libraries.dnnl
    assert d is not None, "onednn-cpu-gomp is installed but the device did not load it"
    return d


def _rng(*shape):
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("case", ["2d", "3d", "b_transposed", "a_broadcast", "sliced"])
def test_gemm_arrays_matches_numpy(dnnl, case):
    a, b = _rng(4, 7, 5), _rng(4, 5, 6)
    if case == "2d":
        a, b = a[0], b[0]
    elif case == "b_transposed":
        b = _rng(4, 6, 5).transpose(0, 2, 1)
    elif case == "a_broadcast":
        a = a[:1]
    elif case == "sliced":
        a, b = _rng(4, 9, 8)[:, 1:8, 2:7], _rng(4, 5, 11)[:, :, 3:9]
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    out = np.full(shape, np.nan, np.float32)
    runs = dnnl.stats["runs"]
    assert dnnl.gemm_arrays(a, b, out)
    assert dnnl.stats["runs"] == runs + 1
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["float64", "negative_stride", "rank4", "empty"])
def test_gemm_arrays_declines_what_it_cannot_describe(dnnl, case):
    a, b = _rng(3, 4, 5), _rng(3, 5, 2)
    out = np.zeros((3, 4, 2), np.float32)
    if case == "float64":
        a = a.astype(np.float64)
    elif case == "negative_stride":
        a = a[:, ::-1]
    elif case == "rank4":
        a, b, out = a[None], b[None], out[None]
    elif case == "empty":
        a, out = a[:, :0], out[:, :0]
    assert not dnnl.gemm_arrays(a, b, out)
    assert not out.any()                  # nothing written


def test_numpy_blas_is_one_thread_only_inside_the_scope_where_gemms_use_the_pool(dnnl):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    blas = threadpoolctl.ThreadpoolController().select(user_api="blas")
    if not blas.lib_controllers:
        pytest.skip("numpy's BLAS is not one threadpoolctl controls")
    outside = blas.info()[0]["num_threads"]
    with dnnl.numpy_blas():
        inside = threadpoolctl.ThreadpoolController().select(user_api="blas").info()[0]
    assert inside["num_threads"] == (1 if dnnl.gemm_pool else outside)
    assert blas.info()[0]["num_threads"] == outside


def test_a_step_rebuilt_on_every_run_reorders_its_constant_weights_once(dnnl):
    """A convolution that reads the program's input is built again on each run; its
    weights' reordered copy is kept by the primitive, so only the first run fills it."""
    torch = pytest.importorskip("torch")
    import aotrt

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU()).eval()
    x = torch.randn(1, 16, 12, 12)
    prog = aotrt.export(m, (x,), layout="channels_last")
    with aotrt.load(prog, device="cpu") as d:
        before = dict(dnnl.stats)
        fills = []
        for seed in range(3):
            xs = torch.randn(1, 16, 12, 12, generator=torch.Generator().manual_seed(seed))
            got = np.asarray(d.run(xs.numpy())[0])
            with torch.no_grad():
                ref = m.double()(xs.double()).numpy()
                m.float()
            assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5
            fills.append(dnnl.stats["packs"] - before["packs"])
    if fills[0] == 0:
        pytest.skip("oneDNN reads these weights without a reorder on this CPU")
    assert fills == [1, 1, 1], fills


def test_gemm_arrays_keeps_its_memory_objects_per_thread_and_layout(dnnl):
    """A second call of one layout reuses the first call's memory objects (it sets data
    handles only), with other arrays of that layout; another thread makes its own."""
    import threading

    a, b = _rng(3, 6, 5), _rng(3, 5, 7)
    out = np.empty((3, 6, 7), np.float32)
    made = dnnl.stats["array_runs"]
    assert dnnl.gemm_arrays(a, b, out)
    assert dnnl.stats["array_runs"] <= made + 1        # none if this layout ran before
    made = dnnl.stats["array_runs"]
    a2, b2 = _rng(3, 6, 5) * 2, _rng(3, 5, 7) - 1
    out2 = np.empty_like(out)
    assert dnnl.gemm_arrays(a2, b2, out2)
    assert dnnl.stats["array_runs"] == made
    np.testing.assert_allclose(out2, np.matmul(a2, b2), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-4, atol=1e-4)
    seen = []

    def other() -> None:
        o = np.empty_like(out)
        seen.append((dnnl.gemm_arrays(a, b, o), o))
    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen[0][0] and dnnl.stats["array_runs"] == made + 1
    np.testing.assert_allclose(seen[0][1], out, rtol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_delegates_primitives_are_made_for_its_threads(dnnl, monkeypatch, threads):
    """A delegate of `threads` threads makes its convolution and linear primitives (at
    load, on the caller's thread) for that many OpenMP threads: oneDNN fixes its split
    when it makes a primitive, and threads=1 otherwise ran on every core."""
    torch = pytest.importorskip("torch")
    import aotrt

    made = []
    real = cpu_dnnl.Dnnl._create

    def create(self, cls, key, blocked):
        made.append((cls.__name__, key.threads))
        return real(self, cls, key, blocked)
    monkeypatch.setattr(cpu_dnnl.Dnnl, "_create", create)
    # shapes no other test uses: the primitive cache would otherwise answer first
    m = torch.nn.Sequential(torch.nn.Conv2d(5, 7, 3), torch.nn.Flatten(),
                            torch.nn.Linear(7 * 7 * 7, 3)).eval()
    x = torch.randn(1, 5, 9, 9)
    with torch.no_grad():
        prog = aotrt.export(m, (x,))
        ref = m(x).numpy()
    with aotrt.load(prog, device="cpu", threads=threads) as d:
        got = np.asarray(d.run(x.numpy())[0])
    kinds = {k for k, t in made if t == threads}
    assert {"ConvPrimitive", "MatmulPrimitive"} <= kinds, made
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


class _Shared(object):
    """Two linears of their own weights and one linear applied twice (a shared weight)."""

    @staticmethod
    def build():
        import torch

        class M(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.a, self.b = torch.nn.Linear(256, 512), torch.nn.Linear(512, 256)
                self.tied = torch.nn.Linear(256, 256)

            def forward(self, x):
                y = self.b(torch.relu(self.a(x)))
                return self.tied(self.tied(y))
        torch.manual_seed(3)
        return M().eval()


def test_weights_one_linear_alone_reads_are_re_laid_in_place_once(dnnl):
    """Each weight only its linear reads is packed into brgemm's layout where it lies, at
    load, once (a plan built again does not pack it twice); the tied weight, read by two
    instructions, is read as it lies; every run matches eager."""
    torch = pytest.importorskip("torch")
    import aotrt

    m = _Shared.build()
    prog = aotrt.export(m, (torch.randn(16, 256),))
    packs = dnnl.stats["packs"]
    with aotrt.load(prog, device="cpu") as d:
        relaid = None
        for seed in range(3):
            x = torch.randn(16, 256, generator=torch.Generator().manual_seed(seed))
            got = np.asarray(d.run(x.numpy())[0])
            with torch.no_grad():
                ref = m.double()(x.double()).numpy()
                m.float()
            assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5
            # (steps that read the input are built at the first run, the others at load)
            relaid = dnnl.stats["packs"] - packs if relaid is None else relaid
            if d._static_io is not None:       # noqa: SLF001 - a plan built again
                plan, d._static_io = d._static_io, None
                plan.delete()
        assert dnnl.stats["packs"] - packs == relaid
    if relaid == 0:
        pytest.skip("oneDNN reads these weights without a reorder on this CPU")
    assert relaid == 2, relaid


def test_a_re_laid_weight_is_never_read_as_it_lies(dnnl, monkeypatch):
    """Asked for by another path (here: its oneDNN matmul made unavailable after it was
    re-laid), the weight is refused with an error, never read as a view."""
    torch = pytest.importorskip("torch")
    import aotrt
    from aotrt.errors import AotrtError

    m = torch.nn.Linear(256, 512).eval()
    prog = aotrt.export(m, (torch.randn(16, 256),))
    with aotrt.load(prog, device="cpu") as d:
        d.run(torch.randn(16, 256).numpy())
        mine = {id(b.alloc) for b in d._loaded.constant_bases}     # noqa: SLF001
        if not any(id(a) in mine for a in list(dnnl._relaid)):      # noqa: SLF001
            # Without brgemm (AVX2) the compiled GEMM runs it and nothing is re-laid.
            pytest.skip("this program's weights were not re-laid on this CPU")
        monkeypatch.setattr(cpu_dnnl, "FAST_MATMUL", ("no such implementation",))
        plan, d._static_io = d._static_io, None     # noqa: SLF001 - built again
        if plan is not None:
            plan.delete()
        with pytest.raises(AotrtError, match="re-laid"):
            d.run(torch.randn(16, 256).numpy())


def test_fixed_matmul_runs_on_its_buffers(dnnl):
    a, b = _rng(3, 9, 16), _rng(3, 16, 5)
    out = np.full((3, 9, 5), np.nan, np.float32)
    mm = dnnl.fixed_matmul(a, b, out, 1)
    assert mm is not None
    runs = dnnl.stats["runs"]
    mm.run()
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    assert dnnl.stats["runs"] == runs + 1
    a[...] = _rng(3, 9, 16) + 1.0      # the same buffers, new contents: read again
    mm.run()
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    assert mm.step()[0] == cpu_dnnl.cpu_native.DNNL


def test_a_fixed_matmul_with_packed_weights_reads_its_own_copy(dnnl):
    a, b = _rng(16, 40, 64), _rng(16, 64, 64)
    out = np.empty((16, 40, 64), np.float32)
    mm = dnnl.fixed_matmul(a, np.empty_like(b), out, 1, pack=True)
    assert mm is not None
    if not mm.prim.impl.startswith("brg"):
        # gemm:jit (AVX2 CPUs with oneDNN 3.2) reads weights as they are: nothing to pack.
        assert not mm.packed
        pytest.skip(f"oneDNN's matmul here is {mm.prim.impl}, not brgemm: nothing is packed")
    assert mm.packed        # brgemm lays weights out in blocks of its own
    mm.pack(b)
    kept = b.copy()
    b[...] = 0.0            # the matmul no longer reads b
    mm.run()
    np.testing.assert_allclose(out, a @ kept, rtol=1e-4, atol=1e-4)
    with pytest.raises(cpu_dnnl.DeviceError, match="packing weights"):
        mm.pack(np.empty((16, 64, 32), np.float32))


def test_fixed_matmul_refuses_what_onednn_cannot_describe(dnnl):
    a, b = _rng(2, 4, 4), _rng(2, 4, 4)
    assert dnnl.fixed_matmul(a.astype(np.float64), b, np.empty((2, 4, 4), np.float32), 1) is None
    assert dnnl.fixed_matmul(a, b[0], np.empty((2, 4, 4), np.float32), 1) is None


# A run still in flight when the interpreter exits: the delegate's teardown is a finalizer
# like the oneDNN objects' own, and exit runs the newest first, so the primitives and their
# memory objects were destroyed under the running work (a segfault on every try).
_EXIT_SCRIPT = """
import numpy as np, torch, aotrt
m = torch.nn.Sequential(torch.nn.Conv2d(64, 64, 1), torch.nn.Conv2d(64, 64, 3, padding=1))
x = torch.randn(1, 64, 56, 56)
d = aotrt.load(aotrt.export(m.eval(), (x,)), device="cpu", threads=2)
d.run(x.numpy())
print("ok")
"""


def test_exit_with_a_run_in_flight_does_not_crash(dnnl, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("torch")
    script = tmp_path / "exit_in_flight.py"
    script.write_text(_EXIT_SCRIPT)
    repo = Path(__file__).resolve().parents[4]
    r = subprocess.run([sys.executable, str(script)], cwd=repo, capture_output=True, text=True,
                       timeout=300, env={"PYTHONPATH": str(repo), "PATH": "/usr/bin"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "ok"
