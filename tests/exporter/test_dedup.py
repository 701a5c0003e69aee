"""Tests for aotrt/exporter/dedup.py: a program's identical kernels are one kernel (at
lowering, and in the merge of several methods), every instruction that called a copy calls
the survivor, and the program still runs as eager does: on each device, from a saved file,
and through the cpu kernel cache and native plan with one kernel called twice."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest
import torch

import aotrt
from aotrt.errors import InvalidArgument
from aotrt.exporter.builder import ProgramBuilder
from aotrt.exporter.dedup import KernelSet, kernel_key
from aotrt.exporter.methods import merge
from aotrt.kernels import ir
from aotrt.program import Program
from tests.conftest import DEVICES


class Block(torch.nn.Module):
    """norm -> scale -> gelu -> linear -> tanh, residual: the linear (a library op) keeps
    the fuser from fusing one block into the next whole."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.scale = torch.nn.Parameter(torch.randn(d))
        self.fc = torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(torch.nn.functional.gelu(self.norm(x) * self.scale))
        return x + torch.tanh(h)


class Stack(torch.nn.Module):
    """`n` blocks of the same shapes (different weights), then a row sum."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x.sum(-1)


def _stack(n: int) -> tuple[Stack, torch.Tensor]:
    torch.manual_seed(n)
    return Stack(n).eval(), torch.randn(3, 32)


def _calls(prog: Program) -> collections.Counter:
    """Kernel name -> how many instructions call it."""
    return collections.Counter(i["name"] for i in prog.instructions if i["op"] == "kernel")


def _eager(m: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return m(x).numpy()


def _add_kernel(name: str, n: int, value: float) -> ir.Kernel:
    """out[i] = a[i] + value over n float32 elements."""
    return ir.Kernel(name, (n,), (), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                     (ir.store(1, [1], ir.Op("add", (ir.load(0, [1], "float32"),
                                                      ir.const(value, "float32")),
                                             "float32")),))


# -- the key ----------------------------------------------------------------------------------


def test_the_key_ignores_the_name_only() -> None:
    a, b = _add_kernel("ka", 8, 1.0), _add_kernel("kb", 8, 1.0)
    assert kernel_key(a) == kernel_key(b)
    # literals are equal bit for bit only: -0.0 is not 0.0, nor the int 1 the float 1.0
    assert kernel_key(_add_kernel("k", 8, 0.0)) != kernel_key(_add_kernel("k", 8, -0.0))
    assert kernel_key(_add_kernel("k", 8, 1)) != kernel_key(a)
    assert kernel_key(_add_kernel("k", 9, 1.0)) != kernel_key(a)
    ks = KernelSet()
    assert ks.add(a) is a and ks.add(b) is a and ks.merged == 1
    assert ks.add(_add_kernel("kc", 8, 2.0)).name == "kc"


# -- at lowering ------------------------------------------------------------------------------


def test_repeated_blocks_share_their_kernels() -> None:
    """Six blocks need the kernels of two: the block kernels are called N-fold, once each."""
    progs = {n: aotrt.export(*(lambda m, x: (m, (x,)))(*_stack(n))) for n in (2, 6)}
    for prog in progs.values():
        keys = [kernel_key(k) for k in prog.kernels]
        assert len(set(keys)) == len(keys)
        # every instruction calls a kernel the program has, and every kernel is called
        assert set(_calls(prog)) == {k.name for k in prog.kernels}
    assert len(progs[6].kernels) == len(progs[2].kernels)
    c2, c6 = _calls(progs[2]), _calls(progs[6])
    assert sum(c6.values()) - sum(c2.values()) == 4        # a kernel instruction per block
    # the kernel the later blocks share: called once in 2 blocks, five times in 6
    assert max(c2.values()) == 1 and max(c6.values()) == 5
    # each instruction keeps its own source line, whatever kernel it calls
    srcs = {i["src"] for i in progs[6].instructions if i["op"] == "kernel"}
    assert any("self.norm(x)" in s for s in srcs)


@pytest.mark.parametrize("device", DEVICES)
def test_deduplicated_program_matches_eager(device: str) -> None:
    m, x = _stack(5)
    prog = aotrt.export(m, (x,))
    assert max(_calls(prog).values()) > 1
    with aotrt.load(prog, device=device, check_hazards=True) as mod:
        for seed in (1, 2):
            x = torch.randn(3, 32, generator=torch.Generator().manual_seed(seed))
            (got,) = mod.run(x.numpy())
            np.testing.assert_allclose(np.asarray(got), _eager(m, x), rtol=1e-4, atol=1e-4)


def test_saved_program_runs_the_same(tmp_path: Path) -> None:
    m, x = _stack(4)
    prog = aotrt.export(m, (x,))
    path = tmp_path / "stack.aotp"
    prog.save(path)
    loaded = Program.load(path)
    assert [k.name for k in loaded.kernels] == [k.name for k in prog.kernels]
    assert _calls(loaded) == _calls(prog)
    with aotrt.load(prog, device="cpu") as a, aotrt.load(path, device="cpu") as b:
        (want,) = a.run(x.numpy())
        (got,) = b.run(x.numpy())
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        np.testing.assert_allclose(np.asarray(got), _eager(m, x), rtol=1e-4, atol=1e-4)


# -- the merge of several methods -------------------------------------------------------------


def _one_kernel_program(kname: str, value: float) -> Program:
    b = ProgramBuilder("One")
    x = b.input("x", "float32", [8])
    y = b.output("y", "float32", [8])
    b.kernel(_add_kernel(kname, 8, value), [x, y], src=f"{kname} at m.py:1")
    return b.build()


def test_merge_dedups_kernels_across_methods_whatever_their_names() -> None:
    prog = merge({"a": _one_kernel_program("ka", 1.0), "b": _one_kernel_program("kb", 1.0),
                  "c": _one_kernel_program("ka", 2.0)})
    # a and b: one kernel under the first name; c's different "ka" is renamed
    assert [k.name for k in prog.kernels] == ["ka", "ka_1"]
    names = {m: prog.methods[m].instructions[0]["name"] for m in "abc"}
    assert names == {"a": "ka", "b": "ka", "c": "ka_1"}
    assert prog.methods["b"].instructions[0]["src"] == "kb at m.py:1"
    with aotrt.load(prog, device="cpu") as mod:
        x = np.arange(8, dtype=np.float32)
        for meth, add in (("a", 1), ("b", 1), ("c", 2)):
            (y,) = mod.method(meth).run(x)
            np.testing.assert_array_equal(np.asarray(y), x + add)


def test_exported_methods_share_their_kernels() -> None:
    m, x = _stack(3)
    one = aotrt.export(m, (x,))
    both = aotrt.export({"first": (m, (x,)), "again": (m, (x,))})
    assert len(both.kernels) == len(one.kernels)
    with aotrt.load(both, device="cpu") as mod:
        for meth in ("first", "again"):
            (got,) = mod.method(meth).run(x.numpy())
            np.testing.assert_allclose(np.asarray(got), _eager(m, x), rtol=1e-4, atol=1e-4)


# -- the cpu runtime: one kernel called by two instructions -----------------------------------


def _twice() -> Program:
    """x + 1 + 1: one kernel, two instructions (through an arena buffer)."""
    b = ProgramBuilder("Twice")
    x = b.input("x", "float32", [64])
    y = b.output("y", "float32", [64])
    t = b.in_buffer(b.buffer(64 * 4), 0, "float32", [64])
    k = _add_kernel("k_add1", 64, 1.0)
    b.kernel(k, [x, t], src="first at m.py:1")
    b.kernel(k, [t, y], src="second at m.py:2")
    return b.build()


def test_cpu_cache_and_native_plan_run_one_kernel_twice(monkeypatch) -> None:
    # the checker off, as by default: the static-I/O plan then goes native from run two
    monkeypatch.setenv("AOTRT_CHECK_HAZARDS", "0")
    prog = _twice()
    assert len(prog.kernels) == 1
    x = np.arange(64, dtype=np.float32)
    for _ in range(2):      # the second load takes the compiled library from the cache
        with aotrt.load(prog, device="cpu") as mod:
            for _ in range(3):
                (y,) = mod.run(x)
                np.testing.assert_array_equal(np.asarray(y), x + 2)
            mod.stream.commit_and_wait()
            plan = mod._static_io                                   # noqa: SLF001
            assert plan.native is not None and plan.native.whole


def test_a_shared_kernels_error_names_its_instruction(monkeypatch) -> None:
    """Two instructions call one division kernel: a division by zero in the second names
    that instruction and its source line (the kernel's name alone names both)."""
    monkeypatch.setenv("AOTRT_CHECK_HAZARDS", "0")
    i32 = "int32"
    k = ir.Kernel("k_div", (4,), (), (ir.Arg(i32, "r"), ir.Arg(i32, "r"), ir.Arg(i32, "w")),
                  (ir.store(2, [1], ir.Op("floordiv", (ir.load(0, [1], i32),
                                                       ir.load(1, [1], i32)), i32)),))
    b = ProgramBuilder("Div")
    x, d1, d2 = (b.input(n, i32, [4]) for n in ("x", "d1", "d2"))
    y = b.output("y", i32, [4])
    t = b.in_buffer(b.buffer(16), 0, i32, [4])
    b.kernel(k, [x, d1, t], src="first at m.py:1")
    b.kernel(k, [t, d2, y], src="second at m.py:2")
    one = np.ones(4, np.int32)
    with aotrt.load(b.build(), device="cpu") as mod:
        for _ in range(3):      # the general path, then the static-I/O plan, then native
            with pytest.raises(InvalidArgument, match="division") as info:
                np.asarray(mod.run(one * 8, one, one * 0)[0])
            assert any("second at m.py:2" in n for n in info.value.__notes__)
            np.testing.assert_array_equal(np.asarray(mod.run(one * 8, one, one * 2)[0]),
                                          one * 4)
