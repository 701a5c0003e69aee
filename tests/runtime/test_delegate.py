"""aotrt/runtime/delegate.py: load, run and close hand-built programs on every device.

The programs are built by hand with ProgramBuilder (kernels from aotrt.kernels.ir, library
ops from aotrt.runtime.ops, copies), including the seeds' linear -> chunk -> linear pattern
with views of the arena at offsets, the last-dim cat written through views, and a nested
view. References are numpy in float64.
"""

from __future__ import annotations

import gc
import threading
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import aotrt
from aotrt.errors import HazardError, InvalidArgument, ProgramError, Unsupported
from aotrt.kernels import ir
from aotrt.exporter.builder import ProgramBuilder
from aotrt.program import Program
from aotrt.runtime import delegate as delegate_mod, steps
from aotrt.runtime import shims
from aotrt.runtime.device import Device
from aotrt.runtime.memory import PROCESS_OWNER
from tests.conftest import DEVICES
from tests.support import rand, rel_err

TOL = {"float32": 1e-4, "bfloat16": 2e-2}
NP = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def names_kernel(name: str, shape: tuple[int, ...], a_strides: list[int], b_strides: list[int],
                 out_strides: list[int], dtype: str, scale: float) -> ir.Kernel:
    """out = a * scale + b, each through its own strides."""
    val = ir.Op("add", (ir.Op("mul", (ir.load(0, a_strides, dtype), ir.const(scale, dtype)),
                              dtype), ir.load(1, b_strides, dtype)), dtype)
    return ir.Kernel(name, shape, (), (ir.Arg(dtype, "r"), ir.Arg(dtype, "r"),
                                       ir.Arg(dtype, "w")), (ir.store(2, out_strides, val),))


def plus_one_kernel(name: str, shape: tuple[int, ...], in_strides: list[int],
                    out_strides: list[int], dtype: str) -> ir.Kernel:
    val = ir.Op("add", (ir.load(0, in_strides, dtype), ir.const(1.0, dtype)), dtype)
    return ir.Kernel(name, shape, (), (ir.Arg(dtype, "r"), ir.Arg(dtype, "w")),
                     (ir.store(1, out_strides, val),))


def seed_program(dtype: str = "float32", module: str = "Seed") -> Program:
    """linear -> chunk(2, -1) -> linear, a kernel over both chunks, the last-dim cat of the
    chunks swapped (written through views of its result), and a nested view."""
    b = ProgramBuilder(module)
    x = b.input("x", dtype, [12, 7])
    rng = np.random.default_rng(7)
    w1 = b.constant("w1", rand([16, 7], NP[dtype], seed=1))
    w2 = b.constant("w2", rand([5, 8], NP[dtype], seed=2))
    b2 = b.constant("b2", rand([5], NP[dtype], seed=3))
    del rng
    y = b.output("y", dtype, [12, 5])
    z = b.output("z", dtype, [12, 8])
    cat = b.output("cat", dtype, [12, 16])
    nested = b.output("nested", dtype, [8, 6])
    isz = NP[dtype].itemsize
    h = b.buffer(12 * 16 * isz)
    hv = b.in_buffer(h, 0, dtype, [12, 16])
    # linear 1: h = x @ w1.T (w1.T is a transposed view of the constant)
    b.library("mm", [hv], [x, b.alias(w1, [7, 16], [1, 7], 0)], src="linear1 at m.py:10")
    c0 = b.alias(hv, [12, 8], [16, 1], 0)
    c1 = b.alias(hv, [12, 8], [16, 1], 8)            # chunk 1: offset 8, non-contiguous
    ybuf = b.in_buffer(b.buffer(12 * 5 * isz), 0, dtype, [12, 5])
    b.library("addmm", [ybuf], [b2, c1, b.alias(w2, [8, 5], [1, 8], 0)],
              {"beta": 1.0, "alpha": 1.0}, src="linear2 at m.py:12")
    b.copy(y, ybuf, "m.py:12")
    # z = c0 * 2 + c1 straight into the output
    b.kernel(names_kernel(f"k_z_{dtype}", (12, 8), [16, 1], [16, 1], [8, 1], dtype, 2.0),
             [c0, c1, z], src="add at m.py:13")
    # cat([c1, c0], -1): each chunk written through a view of the cat buffer
    cbuf = b.buffer(12 * 16 * isz)
    b.copy(b.in_buffer(cbuf, 0, dtype, [12, 8], [16, 1]), c1, "cat at m.py:14")
    b.copy(b.in_buffer(cbuf, 8 * isz, dtype, [12, 8], [16, 1]), c0, "cat at m.py:14")
    b.copy(cat, b.in_buffer(cbuf, 0, dtype, [12, 16]), "m.py:14")
    # nested view: c1[2:10, 1:7] = h[2:10, 9:15]
    nv = b.alias(hv, [8, 6], [16, 1], 2 * 16 + 9)
    b.kernel(plus_one_kernel(f"k_nested_{dtype}", (8, 6), [16, 1], [6, 1], dtype),
             [nv, nested], src="add at m.py:15")
    return b.build()


def failing_mm(monkeypatch: pytest.MonkeyPatch, armed: bool) -> dict[str, bool]:
    """Make the library op `mm` raise InvalidArgument("mm: refused for the test") while
    the returned switch's "on" is True (it starts as `armed`)."""
    from aotrt.runtime import delegate as delegate_mod

    ops = dict(delegate_mod.library_ops())
    switch = {"on": armed}
    real_mm = ops["mm"]

    def flaky_mm(stream: Any, outs: list, ins: list, **params: Any) -> int:
        if switch["on"]:
            raise InvalidArgument("mm: refused for the test")
        return real_mm(stream, outs, ins, **params)
    ops["mm"] = flaky_mm
    monkeypatch.setattr(delegate_mod, "library_ops", lambda: ops)
    return switch


def seed_reference(prog: Program, x: np.ndarray) -> list[np.ndarray]:
    c = {k: v.astype(np.float64) for k, v in prog.constants.items()}
    h = x.astype(np.float64) @ c["w1"].T
    if prog.inputs[0]["dtype"] == "bfloat16":
        h = h.astype(ml_dtypes.bfloat16).astype(np.float64)   # h is stored in bf16
    c0, c1 = h[:, :8], h[:, 8:]
    return [c1 @ c["w2"].T + c["b2"], c0 * 2 + c1, np.concatenate([c1, c0], -1),
            h[2:10, 9:15] + 1]


def check(outs: Any, refs: list[np.ndarray], dtype: str) -> None:
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        got = np.asarray(o).astype(np.float64)
        assert got.shape == r.shape
        assert rel_err(got, r) < TOL[dtype], rel_err(got, r)


def owner_allocs(dev: Device, d: aotrt.Delegate) -> list:
    return [a for a in dev.memory.live() if a.owner is d.owner]


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return request.param


# -- running -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_seed_program_matches_reference(device: str, dtype: str) -> None:
    prog = seed_program(dtype)
    with aotrt.load(prog, device=device, check_hazards=True) as m:
        for seed in range(3):
            x = rand([12, 7], NP[dtype], seed=10 + seed)
            outs = m.run(x)
            assert all(isinstance(o, aotrt.Tensor) for o in outs)
            assert [o.shape for o in outs] == [(12, 5), (12, 8), (12, 16), (8, 6)]
            assert all(o.dtype is aotrt.dtypes.as_dtype(dtype) for o in outs)
            check(outs, seed_reference(prog, x), dtype)


def test_outputs_stay_valid_after_later_runs_and_close(device: str) -> None:
    prog = seed_program()
    m = aotrt.load(prog, device=device, check_hazards=True)
    xs = [rand([12, 7], seed=s) for s in range(4)]
    results = [m.run(x) for x in xs]
    m.close()
    for x, outs in zip(xs, results):
        check(outs, seed_reference(prog, x), "float32")


def test_load_from_path_and_call(tmp_path: Path, device: str) -> None:
    path = tmp_path / "seed.aotp"
    prog = seed_program()
    prog.save(path)
    x = rand([12, 7], seed=3)
    with aotrt.load(str(path), device=device) as m:
        check(m(x), seed_reference(prog, x), "float32")
        assert m.load_seconds > 0


def test_kernel_library_and_copy_on_hand_built_views() -> None:
    """Kernel reads a broadcast (zero-stride) view of a constant into a buffer, copied out."""
    b = ProgramBuilder("Bcast")
    x = b.input("x", "float32", [3, 4])
    bias = b.constant("bias", rand([4], seed=5))
    o = b.output("o", "float32", [3, 4])
    acc = b.in_buffer(b.buffer(48), 0, "float32", [3, 4])
    k = names_kernel("k_bcast", (3, 4), [4, 1], [0, 1], [4, 1], "float32", 3.0)
    b.kernel(k, [x, b.alias(bias, [3, 4], [0, 1], 0), acc])
    b.copy(o, acc)
    prog = b.build()
    x_np = rand([3, 4], seed=6)
    with aotrt.load(prog, check_hazards=True) as m:
        (r,) = m.run(x_np)
        assert rel_err(r, x_np.astype(np.float64) * 3 + prog.constants["bias"]) < 1e-6


def test_empty_tensors_run() -> None:
    b = ProgramBuilder("Empty")
    x = b.input("x", "float32", [0, 3])
    o = b.output("o", "float32", [0, 3])
    b.copy(o, x)
    with aotrt.load(b.build(), check_hazards=True) as m:
        (r,) = m.run(np.zeros((0, 3), np.float32))
        assert r.shape == (0, 3) and r.numpy().shape == (0, 3)


# -- inputs -----------------------------------------------------------------------------------


def test_non_contiguous_and_fortran_inputs_are_copied() -> None:
    prog = seed_program()
    big = rand([12, 14], seed=4)
    with aotrt.load(prog, check_hazards=True) as m:
        for x in (big[:, ::2], np.asfortranarray(big[:, :7]), big[:, 7:]):
            check(m.run(x), seed_reference(prog, np.ascontiguousarray(x)), "float32")


def test_same_array_twice_and_read_only_inputs() -> None:
    b = ProgramBuilder("Twice")
    x = b.input("a", "float32", [4, 3])
    y = b.input("b", "float32", [4, 3])
    o = b.output("o", "float32", [4, 3])
    b.kernel(names_kernel("k_twice", (4, 3), [3, 1], [3, 1], [3, 1], "float32", 2.0), [x, y, o])
    arr = rand([4, 3], seed=8)
    arr.flags.writeable = False
    with aotrt.load(b.build(), check_hazards=True) as m:
        (r,) = m.run(arr, arr)
        assert rel_err(r, arr.astype(np.float64) * 3) < 1e-6
        # Two different views into one array (partly overlapping memory)
        base = rand([5, 3], seed=9)
        (r,) = m.run(base[:4], base[1:])
        assert rel_err(r, base[:4] * 2.0 + base[1:]) < 1e-6


def test_output_tensor_feeds_another_delegate_without_a_copy() -> None:
    prog = seed_program()
    b = ProgramBuilder("Next")
    z = b.input("z", "float32", [12, 8])
    o = b.output("o", "float32", [12, 8])
    b.kernel(plus_one_kernel("k_next", (12, 8), [8, 1], [8, 1], "float32"), [z, o])
    x = rand([12, 7], seed=11)
    with aotrt.load(prog, check_hazards=True) as m1, aotrt.load(b.build(),
                                                               check_hazards=True) as m2:
        outs = m1.run(x)
        (r,) = m2.run(outs[1])
        assert rel_err(r, seed_reference(prog, x)[1] + 1) < 1e-5
        # A zero-copy numpy view of an output is memory the runtime knows: joined, not rebound.
        view = np.from_dlpack(outs[1])
        (r2,) = m2.run(view)
        assert rel_err(r2, seed_reference(prog, x)[1] + 1) < 1e-5


def test_torch_inputs_through_dlpack() -> None:
    torch = pytest.importorskip("torch")
    for dtype, tdt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        prog = seed_program(dtype)
        x = torch.randn(12, 7, dtype=torch.float64).to(tdt)
        xt = torch.randn(7, 12, dtype=torch.float64).to(tdt).t()   # non-contiguous
        with aotrt.load(prog, check_hazards=True) as m:
            for inp in (x, xt):
                ref_in = inp.to(torch.float32).numpy().astype(NP[dtype])
                check(m.run(inp), seed_reference(prog, ref_in), dtype)


@pytest.mark.parametrize("bad,match", [
    (lambda: rand([12, 8]), r"input 0 'x': expected shape \[12, 7\], got \[12, 8\]"),
    (lambda: rand([12, 7], np.float64), "input 0 'x': expected dtype float32, got"),
    (lambda: rand([12, 7], np.float16), "input 0 'x': expected dtype float32, got float16"),
    (lambda: [[1.0] * 7] * 12, "input 0 'x': expected a numpy array, an aotrt.Tensor or a "
                               "__dlpack__ tensor, got list"),
    (lambda: rand([7]), r"input 0 'x': expected shape \[12, 7\], got \[7\]"),
])
def test_wrong_input_is_refused_and_names_it(bad: Any, match: str) -> None:
    with aotrt.load(seed_program(), check_hazards=True) as m:
        before = len(m.owner.handles)
        with pytest.raises(InvalidArgument, match=match):
            m.run(bad())
        assert len(m.owner.handles) == before
        x = rand([12, 7], seed=1)
        check(m.run(x), seed_reference(m.program, x), "float32")


def test_wrong_input_count_is_refused() -> None:
    with aotrt.load(seed_program(), check_hazards=True) as m:
        with pytest.raises(InvalidArgument, match=r"takes 1 inputs \(x\), got 0"):
            m.run()
        with pytest.raises(InvalidArgument, match=r"takes 1 inputs \(x\), got 2"):
            m.run(rand([12, 7]), rand([12, 7]))


def test_torch_tensor_of_wrong_dtype_is_refused() -> None:
    torch = pytest.importorskip("torch")
    with aotrt.load(seed_program(), check_hazards=True) as m:
        with pytest.raises(InvalidArgument, match="input 0 'x': expected dtype float32, got "
                                                  "bfloat16"):
            m.run(torch.ones(12, 7, dtype=torch.bfloat16))


def test_released_tensor_input_is_refused() -> None:
    with aotrt.load(seed_program(), check_hazards=True) as m:
        outs = m.run(rand([12, 7]))
        outs[0].release()
        with pytest.raises(InvalidArgument, match="input 0 'x': the aotrt.Tensor was released"):
            m.run(outs[0])


# -- out= -------------------------------------------------------------------------------------


def out_arrays() -> list[np.ndarray]:
    return [np.full(s, np.nan, np.float32) for s in ((12, 5), (12, 8), (12, 16), (8, 6))]


def test_out_writes_into_caller_arrays() -> None:
    prog = seed_program()
    x = rand([12, 7], seed=12)
    outs = out_arrays()
    with aotrt.load(prog, check_hazards=True) as m:
        ret = m.run(x, out=outs)
        assert all(a is b for a, b in zip(ret, outs))
    check(outs, seed_reference(prog, x), "float32")


def test_out_with_other_layouts_and_tensors() -> None:
    prog = seed_program()
    x1, x2 = rand([12, 7], seed=13), rand([12, 7], seed=14)
    with aotrt.load(prog, check_hazards=True) as m:
        tensors = m.run(x1)
        outs = out_arrays()
        outs[0] = np.asfortranarray(outs[0])                      # other layout: copied back
        outs[2] = np.full((12, 32), np.nan, np.float32)[:, ::2]   # non-packed view
        m.run(x2, out=[outs[0], tensors[1], outs[2], outs[3]])
        ref = seed_reference(prog, x2)
        check([outs[0], tensors[1], outs[2], outs[3]], ref, "float32")


def test_out_aliasing_the_input_is_computed_apart() -> None:
    b = ProgramBuilder("Inplace")
    x = b.input("x", "float32", [6, 4])
    o = b.output("o", "float32", [6, 4])
    # out[i, j] = x[5 - i, j] + 1: writing in place while reading would corrupt later rows
    idx = ir.Op("add", (ir.Op("mul", (ir.Op("sub", (ir.const(5, "int64"), ir.Idx(0)), "int64"),
                                      ir.const(4, "int64")), "int64"), ir.Idx(1)), "int64")
    k = ir.Kernel("k_flip", (6, 4), (), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                  (ir.store(1, [4, 1], ir.Op("add", (ir.Load(0, idx, "float32"),
                                                     ir.const(1.0, "float32")), "float32")),))
    b.kernel(k, [x, o])
    arr = rand([6, 4], seed=15)
    ref = arr[::-1].astype(np.float64) + 1
    with aotrt.load(b.build(), check_hazards=True) as m:
        m.run(arr, out=arr)
    assert rel_err(arr, ref) < 1e-6


@pytest.mark.parametrize("make,match", [
    (lambda o: o[:3], r"out: .* has 4 outputs, got 3 out tensors"),
    (lambda o: [o[0].astype(np.float16)] + o[1:], "out 0 'y': expected dtype float32"),
    (lambda o: [o[0], o[1][:, :4]] + o[2:], r"out 1 'z': expected shape \[12, 8\]"),
    (lambda o: [o[0], o[1], o[2], _read_only(o[3])], "out 3 'nested': the array is read-only"),
    (lambda o: [o[0], o[1], o[2], o[2][:8, :6]], "out 3 'nested': shares memory with out 2"),
    (lambda o: o[0], "out: expected a tuple of 4 tensors"),
])
def test_bad_out_is_refused(make: Any, match: str) -> None:
    with aotrt.load(seed_program(), check_hazards=True) as m:
        with pytest.raises(InvalidArgument, match=match):
            m.run(rand([12, 7]), out=make(out_arrays()))


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


# -- lifecycle --------------------------------------------------------------------------------


def test_two_delegates_close_one_the_other_still_matches(device: str) -> None:
    dev = aotrt.runtime.device.get_device(device)
    prog_a, prog_b = seed_program(module="A"), seed_program(module="B")
    a = aotrt.load(prog_a, device=device, check_hazards=True)
    b = aotrt.load(prog_b, device=device, check_hazards=True)
    x = rand([12, 7], seed=20)
    check(a.run(x), seed_reference(prog_a, x), "float32")
    check(b.run(x), seed_reference(prog_b, x), "float32")
    assert owner_allocs(dev, a) and owner_allocs(dev, b)
    a.close()
    gc.collect()
    assert owner_allocs(dev, a) == []
    assert not a.owner.handles
    assert all(e.owner is not a.owner for e in dev.memory.pool.entries())
    for seed in range(3):
        x = rand([12, 7], seed=30 + seed)
        check(b.run(x), seed_reference(prog_b, x), "float32")
    b.close()
    assert owner_allocs(dev, b) == []


def test_close_twice_and_run_after_close() -> None:
    m = aotrt.load(seed_program(), check_hazards=True)
    m.close()
    m.close()
    assert m.closed
    with pytest.raises(InvalidArgument, match="delegate Seed is closed"):
        m.run(rand([12, 7]))
    with aotrt.load(seed_program()) as m2:
        pass
    assert m2.closed


def test_unreferenced_delegate_is_torn_down() -> None:
    dev = aotrt.runtime.device.get_device("cpu")
    m = aotrt.load(seed_program(module="Dropped"), check_hazards=True)
    m.run(rand([12, 7]))
    owner, stream = m.owner, m.stream
    del m
    gc.collect()
    assert owner.closed and stream.closed
    assert [a for a in dev.memory.live() if a.owner is owner] == []


def _live_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("aotrt-cpu-stream"))


@pytest.mark.parametrize("where", ["kernels", "library_ops", "reinterpret", "write"])
def test_failed_init_leaks_nothing(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    dev = aotrt.runtime.device.get_device("cpu")
    prog = seed_program(module=f"Fail_{where}")
    threads, process_handles = _live_threads(), len(PROCESS_OWNER.handles)
    made: list = []

    class Boom(RuntimeError):
        pass

    if where == "kernels":
        def fail(*a: Any, **k: Any) -> Any:
            raise Boom("compiler crashed")
        monkeypatch.setattr(type(dev), "kernel_library", fail)
    elif where == "library_ops":
        def fail() -> Any:
            raise Unsupported("no ops")
        monkeypatch.setattr(delegate_mod, "library_ops", fail)
    elif where == "reinterpret":
        real = shims.reinterpret_tensor

        def fail(*a: Any, **k: Any) -> Any:
            if len(made) == 5:
                raise Boom("sixth view")
            h = real(*a, **k)
            made.append(h)
            return h
        monkeypatch.setattr(shims, "reinterpret_tensor", fail)
    else:
        real_write = type(dev).write
        calls = []

        def fail(self: Any, h: Any, arr: Any) -> None:
            calls.append(1)
            if len(calls) == 2:
                raise Boom("copy of weight 2")
            real_write(self, h, arr)
        monkeypatch.setattr(type(dev), "write", fail)
    with pytest.raises((Boom, Unsupported)):
        aotrt.load(prog, check_hazards=True)
    gc.collect()
    leaked = [a for a in dev.memory.live() if a.owner.name == f"delegate Fail_{where}"]
    assert leaked == []
    assert all(h.state != "live" for h in made)
    assert _live_threads() == threads
    assert len(PROCESS_OWNER.handles) == process_handles


def test_unknown_library_op_is_unsupported_at_load() -> None:
    b = ProgramBuilder("NoOp")
    x = b.input("x", "float32", [2])
    o = b.output("o", "float32", [2])
    b.library("frobnicate", [o], [x])
    # Checked when the program is validated at load (issue 7, item 12), naming the field.
    with pytest.raises(ProgramError, match=r"instructions\[0\].*library op 'frobnicate' is "
                                           r"not in this runtime"):
        aotrt.load(b.build())


def test_load_validates_hand_edited_programs() -> None:
    prog = seed_program()
    prog.tensors[0]["byte_offset"] = 1 << 20
    with pytest.raises(ProgramError, match="lie outside"):
        aotrt.load(prog)
    with pytest.raises(InvalidArgument, match="expected an aotrt.Program or a path"):
        aotrt.load(42)
    with pytest.raises(InvalidArgument, match="unknown device type 'tpu'"):
        aotrt.load(seed_program(), device="tpu")


def test_failed_run_cleans_up_and_names_the_instruction(monkeypatch: pytest.MonkeyPatch) -> None:
    """A library op that touches freed memory: the HazardError names the instruction, op and
    source line; the run leaves no handle behind and the next run works."""
    dev = aotrt.runtime.device.get_device("cpu")
    ops = dict(delegate_mod.library_ops())
    state = {"armed": True}
    real_mm = ops["mm"]

    def flaky_mm(stream: Any, outs: list, ins: list, **params: Any) -> int:
        if state["armed"]:
            a = dev.memory.allocate(64, stream)
            a.retain()
            a.release()
            from aotrt.runtime.hazards import Access
            return stream.record([Access(a, 0, 64, True)], lambda: None, "mm")
        return real_mm(stream, outs, ins, **params)
    ops["mm"] = flaky_mm
    monkeypatch.setattr(delegate_mod, "library_ops", lambda: ops)
    prog = seed_program()
    with aotrt.load(prog, check_hazards=True) as m:
        static = len(m.owner.handles)
        before = len(PROCESS_OWNER.handles)
        with pytest.raises(HazardError, match=r"instruction #0 library mm \[linear1 at m.py:10\]"):
            m.run(rand([12, 7]))
        assert len(m.owner.handles) == static
        assert len(PROCESS_OWNER.handles) == before
        state["armed"] = False
        x = rand([12, 7], seed=40)
        check(m.run(x), seed_reference(prog, x), "float32")


def test_two_delegates_run_from_two_threads() -> None:
    progs = [seed_program(module="T0"), seed_program(module="T1")]
    errors: list[BaseException] = []
    dels = [aotrt.load(p, check_hazards=True) for p in progs]
    barrier = threading.Barrier(2)

    def work(i: int) -> None:
        try:
            barrier.wait()
            for it in range(40):
                x = rand([12, 7], seed=1000 * i + it)
                check(dels[i].run(x), seed_reference(progs[i], x), "float32")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for d in dels:
        d.close()
    assert not errors, errors


def test_one_delegate_shared_by_threads_serializes_runs() -> None:
    prog = seed_program(module="Shared")
    errors: list[BaseException] = []
    with aotrt.load(prog, check_hazards=True) as m:
        def work(i: int) -> None:
            try:
                for it in range(20):
                    x = rand([12, 7], seed=500 * i + it)
                    check(m.run(x), seed_reference(prog, x), "float32")
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
        threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors


def test_tensor_from_another_delegates_stream_is_waited_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Delegate A runs on a deferred stream (nothing runs until a wait); B reads A's output
    Tensor: B must wait for A's stream first, or it reads bytes A has not written yet."""
    from aotrt.runtime.device import StreamOptions

    class Deferred:
        @staticmethod
        def from_env(**kw: Any) -> StreamOptions:
            return StreamOptions(deferred=True, **kw)

    def plus_one(name: str) -> Program:
        b = ProgramBuilder(name)
        x = b.input("x", "float32", [64])
        o = b.output("o", "float32", [64])
        b.kernel(plus_one_kernel("k_p1_64", (64,), [1], [1], "float32"), [x, o])
        return b.build()

    monkeypatch.setattr(delegate_mod, "StreamOptions", Deferred)
    a = aotrt.load(plus_one("A"), check_hazards=True)
    monkeypatch.undo()
    b = aotrt.load(plus_one("B"), check_hazards=True)
    x = rand([64], seed=50)
    (t0,) = a.run(x)          # a numpy input: releasing its region waits for A
    (t1,) = a.run(t0)         # a Tensor input: A's work stays queued (deferred)
    assert a.stream.completed_seq < a.stream.submitted_seq
    (t2,) = b.run(t1)
    assert rel_err(t2, x.astype(np.float64) + 3) < 1e-6
    a.close()
    b.close()


# -- leaks: libraries, threads, fds, mappings (issue 7, item 6) ------------------------------


def _const_program(c: float, module: str = "Leak") -> Program:
    """o = x + c over 8 elements: one kernel, so each c is a distinct compiled library."""
    b = ProgramBuilder(module)
    x = b.input("x", "float32", [8])
    o = b.output("o", "float32", [8])
    val = ir.Op("add", (ir.load(0, (1,), "float32"), ir.const(float(c), "float32")), "float32")
    b.kernel(ir.Kernel("k_leak", (8,), (), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                       (ir.store(1, (1,), val),)), [x, o])
    return b.build()


def _cache_mappings() -> int:
    """Lines of /proc/self/maps that map a file of the kernel cache."""
    root = str(aotrt.runtime.disk_cache.cache_dir())
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if root in line)


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _fds() -> int:
    import os

    return len(os.listdir("/proc/self/fd"))


# The CI slice's counts: the mapping and leak checks are exact at any count; the full ones
# (about 80 s and 20 s on 2 cores, mostly compiles and cycles) also watch RSS grow slowly.
@pytest.mark.parametrize("n", [30, pytest.param(300, marks=pytest.mark.slow)])
def test_distinct_programs_load_and_close_leave_no_library_mapped(n: int) -> None:
    """n load/close cycles of distinct programs: the cache's mappings and RSS stay flat."""
    from concurrent.futures import ThreadPoolExecutor

    import aotrt.runtime.disk_cache  # noqa: F401 - cache_dir

    dev = aotrt.runtime.device.get_device("cpu")
    x = rand([8], seed=70)
    with aotrt.load(_const_program(-1.0)) as m:    # warm: allocator, numpy, the compiler
        m.run(x)
        assert _cache_mappings() > 0               # the probe sees a loaded library
    progs = [_const_program(i + 0.5) for i in range(n)]

    def build(prog: Program) -> None:
        dev.kernel_library(prog.kernels).close()

    # Compile in parallel first (the compiles, not the cycles, are what costs time here).
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(build, progs))
    # The baseline follows the programs and the compiles: what is measured is the cycles.
    gc.collect()
    maps0, rss0 = _cache_mappings(), _rss_kib()
    for i, prog in enumerate(progs):
        with aotrt.load(prog) as m:
            (r,) = m.run(x)
            if i % 50 == 0:
                assert rel_err(r, x.astype(np.float64) + i + 0.5) < 1e-6
    gc.collect()
    assert _cache_mappings() == maps0
    assert _rss_kib() - rss0 < 2048, f"RSS grew by more than 2 MiB over {n} programs"


@pytest.mark.parametrize("cycles", [200, pytest.param(2000, marks=pytest.mark.slow)])
def test_many_cycles_of_one_program_leave_nothing_behind(cycles: int) -> None:
    """Many load/run/close cycles: no allocation, thread, mapping or fd is left behind."""
    dev = aotrt.runtime.device.get_device("cpu")
    prog, x = _const_program(2.5), rand([8], seed=71)
    with aotrt.load(prog) as m:
        m.run(x)
    gc.collect()
    live0, threads0, maps0 = len(dev.memory.live()), _live_threads(), _cache_mappings()
    fds0, rss0 = _fds(), _rss_kib()
    for _ in range(cycles):
        m = aotrt.load(prog)
        (r,) = m.run(x)
        m.close()
        del r
    gc.collect()
    assert len(dev.memory.live()) == live0
    assert _live_threads() == threads0
    assert _cache_mappings() == maps0
    assert _fds() == fds0
    assert _rss_kib() - rss0 < 4096


def test_two_delegates_of_one_program_share_nothing_they_close() -> None:
    """Closing one delegate keeps the other's library loaded and running."""
    prog, x = _const_program(3.25, "Shared"), rand([8], seed=72)
    a, b = aotrt.load(prog), aotrt.load(prog)
    a.close()
    for _ in range(3):
        (r,) = b.run(x)
        assert rel_err(r, x.astype(np.float64) + 3.25) < 1e-6
    b.close()


def test_closed_delegates_library_refuses_its_kernels() -> None:
    m = aotrt.load(_const_program(4.5, "Refuse"))
    launch = m._steps[0].target          # the run plan's prepared launch
    fn = launch.fn
    lib = fn.library
    m.close()
    assert lib.closed
    with pytest.raises(InvalidArgument, match="closed"):
        lib.kernel("k_leak")
    stream = aotrt.runtime.device.get_device("cpu").default_stream()
    with pytest.raises(InvalidArgument, match="closed"):
        fn.dispatch(stream)
    with pytest.raises(InvalidArgument, match="closed"):
        launch.launch(stream, [])


def test_unreferenced_delegate_releases_its_library() -> None:
    m = aotrt.load(_const_program(5.75, "Gc"))
    m.run(rand([8], seed=73))
    lib = m._steps[0].target.fn.library
    del m
    gc.collect()
    assert lib.closed and lib.loaded.closed


# -- the run plan (issue #9 item 1) ------------------------------------------------------------


def test_run_launches_the_plan_built_at_load(monkeypatch: pytest.MonkeyPatch,
                                             device: str) -> None:
    """run() never binds or dispatches a kernel: the launches were prepared at load, and only
    the per-run slots (views of inputs and outputs) are checked and resolved per run; on a
    host device, once, at the first run, over static input/output buffers."""
    from aotrt.runtime.device import KernelFunction

    prog = seed_program()
    m = aotrt.load(prog, device=device, cuda_graph=False)   # the launches, not a graph
    assert not m.uses_graph
    kernel_args = [ins["args"] for ins in prog.instructions if ins["op"] == "kernel"]
    per_run = sum(1 for args in kernel_args for t in args
                  if prog.tensors[t]["root"] in ("input", "output"))
    assert 0 < per_run < sum(len(a) for a in kernel_args)   # both kinds of slot are covered

    def refuse(*a: Any, **k: Any) -> None:
        raise AssertionError("run() bound or dispatched a kernel")
    monkeypatch.setattr(KernelFunction, "bind", refuse)
    monkeypatch.setattr(KernelFunction, "dispatch", refuse)
    resolved = []
    orig = KernelFunction._arg_accesses
    monkeypatch.setattr(KernelFunction, "_arg_accesses",
                        lambda self, i, h: resolved.append(i) or orig(self, i, h))
    xs = [rand([12, 7], seed=s) for s in (80, 81, 82)]
    results = [m.run(x) for x in xs]          # queued back to back; each run its own outputs
    assert len(resolved) == (per_run if m.device.host_addressable else 3 * per_run)
    for x, outs in zip(xs, results):
        check(outs, seed_reference(prog, x), "float32")
    m.close()


# -- the run plan (issues 8 and 9): static steps are validated and built once, at load -----


def test_static_steps_are_built_at_load_and_only_replayed(monkeypatch: pytest.MonkeyPatch) -> None:
    """addmm and the cat copies touch only arena and constant views: their op is called
    once, at load; each run replays the commands built then and still matches."""
    ops = dict(delegate_mod.library_ops())
    calls = {"mm": 0, "addmm": 0}

    def counting(name: str) -> Any:
        real = ops[name]

        def op(stream: Any, outs: list, ins: list, **params: Any) -> int:
            calls[name] += 1
            return real(stream, outs, ins, **params)
        return op
    ops["mm"], ops["addmm"] = counting("mm"), counting("addmm")
    monkeypatch.setattr(delegate_mod, "library_ops", lambda: ops)
    prog = seed_program()
    with aotrt.load(prog, check_hazards=True) as m:
        kinds = [(s.kind, s.planned is not None) for s in m._steps]
        assert calls == {"mm": 0, "addmm": 1}
        for seed in range(3):
            x = rand([12, 7], seed=60 + seed)
            check(m.run(x), seed_reference(prog, x), "float32")
    # mm reads the input x: built once, at the first run, over the static input buffer (on
    # cpu, a host device), then replayed; addmm: built once, at load.
    assert calls == {"mm": 1, "addmm": 1}
    # mm (reads x), addmm, copy to y, kernel into z, the two cat copies, copy to cat, nested
    assert [p for _, p in kinds] == [False, True, False, False, True, True, False, False]
    assert kinds[1][0] == steps.LIBRARY and kinds[4][0] == steps.COPY


def test_cuda_graph_is_refused_on_a_device_without_graphs() -> None:
    dev = aotrt.runtime.device.get_device("cpu")
    assert not dev.supports_graphs and dev.host_addressable
    with pytest.raises(InvalidArgument, match="cpu device cannot replay graphs"):
        aotrt.load(seed_program(), device="cpu", cuda_graph=True)
    with pytest.raises(InvalidArgument, match="cuda_graph: expected a bool or None"):
        aotrt.load(seed_program(), device="cpu", cuda_graph="yes")
    for graph in (None, False):
        with aotrt.load(seed_program(), device="cpu", cuda_graph=graph) as m:
            assert not m.uses_graph
            x = rand([12, 7], seed=72)
            check(m.run(x), seed_reference(seed_program(), x), "float32")


def test_load_of_a_path_validates_once_and_a_program_object_again(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """aotrt.load(path) validates the Program it reads once (no one else holds it); a
    Program object handed in is validated by the Delegate, since it may have changed."""
    prog = seed_program()
    path = tmp_path / "seed.aotp"
    prog.save(path)
    calls = []
    real = Program.validate
    monkeypatch.setattr(Program, "validate",
                        lambda self, limits=None: calls.append(1) or real(self, limits))
    with aotrt.load(path) as m:
        x = rand([12, 7], seed=90)
        check(m.run(x), seed_reference(prog, x), "float32")
    assert len(calls) == 1
    with aotrt.load(prog):
        pass
    assert len(calls) == 2


# -- threads ----------------------------------------------------------------------------------


def softmax_program(rows: int = 1001, cols: int = 257) -> Program:
    """One row-softmax kernel, big enough that the cpu device splits it across threads."""
    b = ProgramBuilder("Softmax")
    x = b.input("x", "float32", [rows, cols])
    y = b.output("y", "float32", [rows, cols])
    idx = ir.strided_index((cols, 1), (0, 1))
    xv = ir.Load(0, idx, "float32")
    e = ir.Op("exp", (ir.Op("sub", (xv, ir.Reduce("max", xv, "float32")), "float32"),),
              "float32")
    k = ir.Kernel(f"softmax_{rows}x{cols}", (rows,), (cols,),
                  (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                  (ir.Store(1, idx, ir.Op("div", (e, ir.Reduce("sum", e, "float32")),
                                          "float32")),))
    b.kernel(k, [x, y], src="softmax at m.py:3")
    return b.build()


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "2"])
def test_threads_must_be_a_positive_int(bad) -> None:
    with pytest.raises(InvalidArgument, match="threads: expected a positive int"):
        aotrt.load(softmax_program(8, 4), device="cpu", threads=bad)
    with pytest.raises(InvalidArgument, match="threads: expected a positive int"):
        aotrt.Delegate(softmax_program(8, 4), device="cpu", threads=bad)


def test_threads_belong_to_the_delegates_stream_and_give_identical_results() -> None:
    import os

    x = rand([1001, 257], seed=81) * 4
    outs = {}
    for threads in (None, 1, 2, 3):
        with aotrt.load(softmax_program(), device="cpu", threads=threads) as m:
            want = len(os.sched_getaffinity(0)) if threads is None else threads
            assert m.stream.threads == want
            (y,) = m.run(x)
            outs[threads] = np.asarray(y).tobytes()
    assert len(set(outs.values())) == 1
    x64 = x.astype(np.float64)
    ref = np.exp(x64 - x64.max(axis=1, keepdims=True))
    got = np.frombuffer(outs[1], np.float32).reshape(x.shape)
    assert rel_err(got, ref / ref.sum(axis=1, keepdims=True)) < TOL["float32"]


@pytest.mark.parametrize("device", DEVICES)
def test_threads_are_accepted_on_every_device(device) -> None:
    """cuda takes the argument and ignores it (its kernels do not run on host threads)."""
    x = rand([8, 4], seed=82)
    with aotrt.load(softmax_program(8, 4), device=device, threads=1) as m:
        (y,) = m.run(x)
        e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
        assert rel_err(np.asarray(y), e / e.sum(axis=1, keepdims=True)) < TOL["float32"]


@pytest.mark.parametrize("bad", ["tf32", True, {"conv_tf32": True}])
def test_fp32_math_must_be_an_fp32_math(bad) -> None:
    with pytest.raises(InvalidArgument, match="fp32_math: expected an aotrt.Fp32Math"):
        aotrt.load(softmax_program(8, 4), device="cpu", fp32_math=bad)


@pytest.mark.parametrize("device", DEVICES)
def test_fp32_math_belongs_to_the_delegates_stream(device) -> None:
    """The delegate's own stream carries its Fp32Math; another delegate keeps float32."""
    tf32 = aotrt.Fp32Math(conv_tf32=True, matmul_tf32=True)
    with aotrt.load(softmax_program(8, 4), device=device, fp32_math=tf32) as m, \
            aotrt.load(softmax_program(8, 4), device=device) as plain:
        assert m.stream.options.fp32_math == tf32
        assert plain.stream.options.fp32_math == aotrt.Fp32Math()
