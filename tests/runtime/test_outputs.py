"""aotrt/runtime/outputs.py: every run path binds its outputs one way (Outputs).

Each path a run can take is forced and checked to be the one taken: the plain run (the
interpreter over the caller's memory; on cpu only when forced), a replay over static
buffers with the results copied out ("staged": the hazard checker on, or out=), the lean
host run (no checker, no out=), bind() and its runs, a dynamic method's plans, and on cuda
the graph's staged and lean replays. On each: fresh result Tensors, or out= numpy arrays,
aotrt Tensors, views of another layout and memory that partly overlaps the input (staged
back), each against a numpy reference; and nothing left behind (allocations, handles).
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pytest

import aotrt
from aotrt.errors import InvalidArgument
from aotrt.exporter.builder import ProgramBuilder
from aotrt.runtime import shims
from aotrt.runtime.delegate import Delegate
from aotrt.runtime.device import cuda_available, get_device
from aotrt.runtime.memory import PROCESS_OWNER, owner_scope
from aotrt.runtime.replays import StaticIO
from tests.program.test_symbols import dynamic_program
from tests.conftest import DEVICES
from tests.runtime.test_delegate import failing_mm, seed_program, seed_reference
from tests.support import rand

CUDA = [pytest.mark.cuda, pytest.mark.skipif(not cuda_available(), reason="no CUDA device here")]


@dataclass(frozen=True)
class Path:
    """One way through Delegate.run: the device, the checker, a graph, and which method
    serves every run after the first (the first may capture or plan)."""

    name: str
    device: str
    checker: bool
    serves: str                  # the Delegate/StaticIO method each run goes through
    graph: bool | None = None
    plain: bool = False          # force the interpreter on a host device
    torch_input: bool = False    # a torch cuda input (the lean replay takes device memory)


PLAIN = Path("plain", "cpu", True, "_run", plain=True)
STAGED = Path("staged", "cpu", True, "_run_staged")
STAGED_UNCHECKED = Path("staged-unchecked", "cpu", False, "_run_staged")   # out= only
LEAN = Path("lean", "cpu", False, "run_lean")                               # no out=
CUDA_PLAIN = Path("cuda-plain", "cuda", True, "_run", graph=False)
CUDA_STAGED = Path("cuda-staged", "cuda", True, "_run_staged", graph=True)
CUDA_LEAN = Path("cuda-lean", "cuda", False, "_replay_direct", graph=True, torch_input=True)


def _params(paths: list[Path]) -> list[Any]:
    return [pytest.param(p, id=p.name, marks=CUDA if p.device == "cuda" else ())
            for p in paths]


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The run-path methods called, in order (every one still does its work)."""
    seen: list[str] = []
    for cls, name in ((Delegate, "_run"), (Delegate, "_run_staged"),
                      (Delegate, "_replay_direct"), (StaticIO, "run_lean")):
        real = getattr(cls, name)

        def spy(self: Any, *a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            seen.append(_name)
            return _real(self, *a, **k)
        monkeypatch.setattr(cls, name, spy)
    return seen


def _load(path: Path, prog: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`prog` loaded so that its runs take `path`."""
    monkeypatch.setenv("AOTRT_CHECK_HAZARDS", "1" if path.checker else "0")
    if path.plain:
        # A host device plans its I/O steps; the interpreter is what a device without
        # graphs and host memory runs, here on the cpu.
        monkeypatch.setattr(Delegate, "_run_static_io", lambda self, *a: self._run(*a))
    kw = {} if path.graph is None else {"cuda_graph": path.graph}
    return aotrt.load(prog, device=path.device, check_hazards=path.checker, **kw)


def _input(path: Path, x: np.ndarray) -> Any:
    if not path.torch_input:
        return x
    torch = pytest.importorskip("torch")
    return torch.from_numpy(x).cuda()


def _new(allocs: list) -> set:
    return {id(a) for a in allocs}


@contextlib.contextmanager
def leaves_nothing(device: str) -> Iterator[None]:
    """No allocation made inside the block for the caller (process-owned) or for a
    delegate or program (its owner closed by now) outlives it, nor any process-owned
    handle. What the device keeps for itself (library workspaces, made on first use) has
    an owner of its own that stays open."""
    dev = get_device(device)
    gc.collect()
    live0, handles0 = _new(dev.memory.live()), set(PROCESS_OWNER.handles)
    yield
    gc.collect()
    left = [a for a in dev.memory.live() if id(a) not in live0 and
            (a.owner is PROCESS_OWNER or a.owner.closed)]
    assert left == [], f"allocations left: {left[:4]}"
    handles = [h for h in PROCESS_OWNER.handles if h not in handles0]
    assert handles == [], f"process-owned handles left: {handles[:4]}"


def _check(got: Any, want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g = np.asarray(g)
        assert g.shape == w.shape
        np.testing.assert_allclose(g.astype(np.float64), w, rtol=1e-5, atol=1e-5)


SHAPES = [(12, 5), (12, 8), (12, 16), (8, 6)]      # the seed program's outputs


# -- fresh results ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", _params([PLAIN, STAGED, LEAN, CUDA_PLAIN, CUDA_STAGED,
                                          CUDA_LEAN]))
def test_results_are_fresh_tensors_that_outlive_later_runs_and_close(
        path: Path, served: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Three runs: each run's Tensors match the reference after later runs and after the
    delegate is closed, each run adds no handle of the delegate's, and once the results
    are released nothing made is left."""
    prog = seed_program()
    with leaves_nothing(path.device):
        m = _load(path, prog, monkeypatch)
        xs = [rand([12, 7], seed=s) for s in (60, 61, 62)]
        results = [m.run(_input(path, xs[0]))]
        handles = len(m.owner.handles)
        del served[:]
        for x in xs[1:]:
            results.append(m.run(_input(path, x)))
            assert len(m.owner.handles) == handles
        assert served == [path.serves] * 2
        m.close()
        for x, outs in zip(xs, results):
            assert all(isinstance(o, aotrt.Tensor) for o in outs)
            _check(outs, seed_reference(prog, x))
        for outs in results:
            for o in outs:
                o.release()


def test_a_lean_runs_outputs_lie_apart_on_cache_lines_of_one_allocation(
        served: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The lean host run puts every output root at a 64-byte aligned offset of one fresh
    allocation, none overlapping another."""
    with _load(LEAN, seed_program(), monkeypatch) as m:
        m.run(rand([12, 7], seed=63))
        outs = m.run(rand([12, 7], seed=64))
        assert served[-1] == "run_lean"
        assert len({o.handle.alloc for o in outs}) == 1
        ranges = sorted(o.handle.byte_range() for o in outs)
        assert all(lo % 64 == 0 for lo, _ in ranges)
        assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))


# -- out= -------------------------------------------------------------------------------------


def _out_tensor(shape: tuple[int, ...], device: str, strides: list[int] | None = None
                ) -> aotrt.Tensor:
    """A NaN-filled aotrt Tensor, row-major or over `strides` (another layout)."""
    n = int(np.prod(shape))
    if strides is None:
        return aotrt.Tensor.from_numpy(np.full(shape, np.nan, np.float32), device=device)
    flat = aotrt.Tensor.from_numpy(np.full(n, np.nan, np.float32), device=device)
    with owner_scope(PROCESS_OWNER):
        view = aotrt.Tensor(shims.reinterpret_tensor(flat.handle, list(shape), strides, 0))
    flat.release()      # the view keeps the memory
    return view


def _outs(kind: str, device: str, x: np.ndarray) -> tuple[list[Any], np.ndarray, list[Any]]:
    """The out= tensors of one kind, the input to run on (a view of the same memory for
    "overlap"), and what to release after."""
    nan = np.float32(np.nan)
    if kind == "arrays":
        return [np.full(s, nan, np.float32) for s in SHAPES], x, []
    if kind == "tensors":
        outs = [_out_tensor(s, device) for s in SHAPES]
        return outs, x, outs
    if kind == "strided":
        # Every other column of a wider array, a Fortran array, a negative-stride view.
        outs = [np.full((12, 10), nan, np.float32)[:, ::2],
                np.asfortranarray(np.full((12, 8), nan, np.float32)),
                np.full((12, 16), nan, np.float32)[::-1],
                np.full((8, 6), nan, np.float32)]
        return outs, x, []
    if kind == "tensor-strided":
        # Column-major aotrt Tensors: bound nowhere, copied back on the device.
        outs = [_out_tensor(s, device, [1, s[0]]) for s in SHAPES]
        return outs, x, outs
    if kind == "overlap":
        # The input and out 1 share bytes (out 1 starts inside the input): the results are
        # computed apart and copied in; the others lie apart in the same array.
        mem = np.full(1024, nan, np.float32)
        xin = mem[:84].reshape(12, 7)
        xin[...] = x
        outs = [mem[140:200].reshape(12, 5), mem[40:136].reshape(12, 8),
                mem[200:392].reshape(12, 16), mem[400:448].reshape(8, 6)]
        return outs, xin, []
    raise ValueError(kind)


OUT_KINDS = ["arrays", "tensors", "strided", "tensor-strided", "overlap"]


@pytest.mark.parametrize("kind", OUT_KINDS)
@pytest.mark.parametrize("path", _params([PLAIN, STAGED, STAGED_UNCHECKED, CUDA_PLAIN,
                                          CUDA_STAGED]))
def test_out_tensors_are_filled_and_returned(path: Path, kind: str, served: list[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """run(x, out=...) writes every output into the caller's tensors (bound where they lie,
    else computed apart and copied back) and returns them; a run in between without out=
    does not touch them; nothing is left once they go."""
    prog = seed_program()
    with leaves_nothing(path.device):
        with _load(path, prog, monkeypatch) as m:
            for seed in (70, 71):
                x = rand([12, 7], seed=seed)
                outs, xin, made = _outs(kind, path.device, x)
                del served[:]
                ret = m.run(xin, out=outs)
                assert len(ret) == 4 and all(r is o for r, o in zip(ret, outs))
                assert served == [path.serves]
                ref = seed_reference(prog, x)
                _check(outs, ref)
                other = m.run(rand([12, 7], seed=seed + 10))
                _check(outs, ref)
                for t in (*other, *made):
                    t.release()


@pytest.mark.parametrize("path", [PLAIN, STAGED, STAGED_UNCHECKED], ids=lambda p: p.name)
def test_one_out_tensor_for_a_method_of_one_output(path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """out= may be the tensor itself where the method has one output; the result is it."""
    b = ProgramBuilder("One")
    x = b.input("x", "float32", [3, 4])
    o = b.output("o", "float32", [3, 4])
    b.copy(o, x)
    arr = rand([3, 4], seed=5)
    out = np.full((3, 4), np.nan, np.float32)
    with _load(path, b.build(), monkeypatch) as m:
        (got,) = m.run(arr, out=out)
        assert got is out
    np.testing.assert_array_equal(out, arr)


@pytest.mark.parametrize("path", _params([PLAIN, STAGED, LEAN, CUDA_PLAIN, CUDA_STAGED]))
def test_empty_outputs_on_every_path(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An output with no elements, beside one with some: a Tensor of its shape, or the
    caller's empty out array untouched."""
    b = ProgramBuilder("Empties")
    x = b.input("x", "float32", [4, 3])
    e = b.input("e", "float32", [0, 3])
    o = b.output("o", "float32", [4, 3])
    oe = b.output("oe", "float32", [0, 3])
    b.copy(o, x)
    b.copy(oe, e)
    arr, empty = rand([4, 3], seed=6), np.zeros((0, 3), np.float32)
    with leaves_nothing(path.device):
        with _load(path, b.build(), monkeypatch) as m:
            for _ in range(2):
                r, re = m.run(arr, empty)
                assert re.shape == (0, 3) and np.asarray(re).shape == (0, 3)
                np.testing.assert_array_equal(np.asarray(r), arr)
                r.release()
                re.release()
            if path in (PLAIN, STAGED):
                outs = (np.full((4, 3), np.nan, np.float32), np.zeros((0, 3), np.float32))
                m.run(arr, empty, out=outs)
                np.testing.assert_array_equal(outs[0], arr)


# -- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [PLAIN, STAGED], ids=lambda p: p.name)
def test_a_failed_run_leaves_no_output_memory_and_the_next_matches(
        path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An op that fails mid-run: run() raises its error, the fresh output roots and every
    per-run handle go (fresh results or out=), and the next run matches."""
    armed = failing_mm(monkeypatch, armed=False)
    prog = seed_program()
    with leaves_nothing("cpu"):
        with _load(path, prog, monkeypatch) as m:
            handles = len(m.owner.handles)
            armed["on"] = True
            for out in (None, [np.full(s, np.nan, np.float32) for s in SHAPES]):
                with pytest.raises(InvalidArgument, match="refused for the test"):
                    m.run(rand([12, 7], seed=80), out=out)
                assert len(m.owner.handles) == handles
            armed["on"] = False
            x = rand([12, 7], seed=81)
            outs = m.run(x)
            _check(outs, seed_reference(prog, x))
            for o in outs:
                o.release()


# -- bind() -----------------------------------------------------------------------------------


@pytest.mark.parametrize("checker", [True, False], ids=["checker", "no-checker"])
@pytest.mark.parametrize("device", DEVICES)
def test_bound_runs_return_the_same_outputs_with_each_runs_values(
        device: str, checker: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Binding's runs return its own output Tensors each time, holding that run's values,
    for dense and strided (staged) inputs, and add no handle; nothing is left after close."""
    prog = seed_program()
    path = Path("bind", device, checker, "", graph=None)
    with leaves_nothing(device):
        with _load(path, prog, monkeypatch) as m:
            b = m.bind()
            handles = len(m.owner.handles)
            wide = rand([12, 14], seed=90)
            for x in (rand([12, 7], seed=91), wide[:, ::2], rand([12, 7], seed=92)):
                outs = b.run(x)
                assert outs is b.outputs
                _check(outs, seed_reference(prog, np.ascontiguousarray(x)))
                assert len(m.owner.handles) == handles


# -- dynamic sizes ----------------------------------------------------------------------------


@pytest.mark.parametrize("checker", [True, False], ids=["checker", "no-checker"])
@pytest.mark.parametrize("device", DEVICES)
def test_a_dynamic_method_binds_its_outputs_at_each_size(
        device: str, checker: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """o = x * 2 + w at S = 3, 8 and 3 again: fresh results of the run's size, and out=
    arrays (dense, and a strided view copied back), each against numpy; nothing is left
    after close."""
    w = np.arange(4, dtype=np.float32)
    path = Path("dynamic", device, checker, "")
    with leaves_nothing(device):
        with _load(path, dynamic_program(), monkeypatch) as mod:
            for s in (3, 8, 3):
                x = rand([s, 4], seed=100 + s)
                want = x.astype(np.float64) * 2 + w
                (y,) = mod.run(x)
                assert y.shape == (s, 4)
                np.testing.assert_allclose(np.asarray(y), want, rtol=1e-6)
                y.release()
                dense = np.full((s, 4), np.nan, np.float32)
                strided = np.full((s, 8), np.nan, np.float32)[:, ::2]
                for out in (dense, strided):
                    assert mod.run(x, out=out) == (out,)
                    np.testing.assert_allclose(out, want, rtol=1e-6)
            assert sorted(mod.method("forward").sizes_cached) == [(3,), (8,)]
