"""aotrt/runtime/steps.py: a method's Steps (kernel launch, library op, copy), the program
tensors each may have rebound per run, and the library ops' registry they call.

steps.py registers nothing itself: `library_ops()` is the registry of the ops a program's
`library` instructions name (aotrt/runtime/ops, loaded on first use), and a backend
registers its implementation of an op for its device class with `ops.register`. Both are
checked here through what a delegate does with them.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest

import aotrt
from aotrt import dtypes
from aotrt.errors import Unsupported
from aotrt.runtime import delegate as delegate_mod, shims
from aotrt.runtime.ops import _common
from aotrt.runtime.steps import COPY, KERNEL, LIBRARY, Step, library_ops
from tests.runtime.test_delegate import seed_program, seed_reference
from tests.support import rand

#: the ops a program file may name (docs/PROGRAM.md, aotrt/runtime/ops/__init__.py)
KNOWN_OPS = {"mm", "bmm", "addmm", "linear", "convolution", "sdpa", "topk", "max_pool2d",
             "upsample_nearest2d", "linear_wq"}


# -- Steps ------------------------------------------------------------------------------------


def test_the_kinds_are_three_distinct_values() -> None:
    assert len({KERNEL, LIBRARY, COPY}) == 3


def test_a_kernel_step_names_only_the_slots_a_run_rebinds() -> None:
    """A kernel's launch is prepared at load over its static views; the step keeps the
    tensor ids of the per-run slots alone, and those are what a run may rebind."""
    step = Step(KERNEL, object(), (4, 9), None, {}, "instruction #0 kernel k")
    assert step.tensor_ids() == [4, 9]
    assert Step(KERNEL, object(), (), None, {}, "k").tensor_ids() == []


def test_a_library_step_names_its_outputs_then_its_present_inputs() -> None:
    step = Step(LIBRARY, library_ops()["linear"], (7,), (1, 2, None), {}, "linear")
    assert step.tensor_ids() == [7, 1, 2]       # the absent bias is no tensor


def test_a_copy_step_names_its_destination_and_source() -> None:
    assert Step(COPY, None, 3, 5, {}, "copy").tensor_ids() == [3, 5]


def test_a_step_is_built_at_load_exactly_when_it_touches_no_input_or_output() -> None:
    """The run plan builds a step's commands once at load when every tensor it may rebind
    is static (arena or constant); a step touching an input or output is built per run
    (or once over the static-I/O buffers), and the runs still match."""
    prog = seed_program()
    roots = [t.root for t in prog.record.tensors]
    with aotrt.load(prog, device="cpu") as m:
        steps = m._steps                                        # noqa: SLF001
        assert len(steps) == len(prog.record.instructions)
        for step in steps:
            per_run = any(roots[t] in ("input", "output") for t in step.tensor_ids())
            assert (step.planned is None) == per_run, step.label
            if step.planned is not None:
                assert step.planned, step.label      # its commands, kept to replay
        assert any(s.planned is None for s in steps) and any(s.planned for s in steps)
        x = rand([12, 7], seed=3)
        for got, want in zip(m.run(x), seed_reference(prog, x)):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_each_steps_label_names_its_instruction_op_and_source() -> None:
    prog = seed_program()
    with aotrt.load(prog, device="cpu") as m:
        labels = [s.label for s in m._steps]                    # noqa: SLF001
    assert labels[0] == "instruction #0 library mm [linear1 at m.py:10]"
    assert labels[1].startswith("instruction #1 library addmm")
    assert any(lb.startswith("instruction #") and " kernel k_z_float32 " in lb
               for lb in labels)
    assert any(lb.split(" ")[2] == "copy" for lb in labels)


# -- the library ops' registry ----------------------------------------------------------------


def test_the_registry_holds_every_op_a_program_may_name() -> None:
    ops = library_ops()
    assert set(ops) == KNOWN_OPS
    assert all(callable(fn) for fn in ops.values())
    assert library_ops() is ops                 # one registry, looked up again
    assert ops.get("frobnicate") is None


def test_an_op_looked_up_runs_with_the_uniform_convention(dev, stream, owner) -> None:
    """OPS[name](stream, outs, ins, **params): addmm of handles, against numpy; a param
    the op does not take is refused naming it."""
    a, b, bias = rand([3, 4], seed=1), rand([4, 5], seed=2), rand([5], seed=3)
    hs = [shims.empty_strided(list(x.shape), None, dtypes.float32, dev) for x in (a, b, bias)]
    out = shims.empty_strided([3, 5], None, dtypes.float32, dev)
    try:
        for h, x in zip(hs, (a, b, bias)):
            h.alloc.settle()
            dev.write(h, x)
        library_ops()["addmm"](stream, [out], [hs[2], hs[0], hs[1]], beta=0.5, alpha=2.0)
        stream.commit_and_wait()
        want = 0.5 * bias.astype(np.float64) + 2.0 * (a.astype(np.float64) @ b)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
        with pytest.raises(aotrt.errors.InvalidArgument, match=r"addmm: params: unknown "
                                                                r"\['gamma'\]"):
            library_ops()["addmm"](stream, [out], [hs[2], hs[0], hs[1]], gamma=1.0)
    finally:
        stream.commit_and_wait()
        for h in (*hs, out):
            shims.delete_tensor_object(h)


def test_a_delegate_refuses_an_op_its_runtime_lacks_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A program that passed validation but names an op this runtime's registry lacks: load
    raises Unsupported naming the instruction, the op and the ops there are."""
    ops = {k: v for k, v in library_ops().items() if k != "addmm"}
    monkeypatch.setattr(delegate_mod, "library_ops", lambda: ops)
    with pytest.raises(Unsupported, match=r"instruction #1 library addmm .*: library op "
                                          r"'addmm' is not in this runtime \(known: "
                                          r"\['bmm', 'convolution', "):
        aotrt.load(seed_program(), device="cpu")


def test_without_the_ops_package_the_registry_is_unsupported(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The ops are imported on first use: where they cannot be, every library step is
    refused with Unsupported saying so, not an ImportError."""
    monkeypatch.setitem(sys.modules, "aotrt.runtime.ops", None)
    with pytest.raises(Unsupported, match="library ops are not available: "):
        library_ops()


def test_a_backend_registers_an_op_for_its_device_class_and_subclasses_find_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """ops.register(DeviceClass, name, make): the implementation a library op dispatches to
    on a device is its class's, else its nearest base's; none for an unrelated class."""
    monkeypatch.setattr(_common, "_IMPLS", {})

    class Base:
        pass

    class Derived(Base):
        pass

    class Other:
        pass

    def make_base(*a: Any) -> str:
        return "base"

    def make_derived(*a: Any) -> str:
        return "derived"

    _common.register(Base, "frob", make_base)
    assert _common.implementation("frob", Derived()) is make_base
    _common.register(Derived, "frob", make_derived)
    assert _common.implementation("frob", Derived()) is make_derived
    assert _common.implementation("frob", Base()) is make_base
    assert _common.implementation("frob", Other()) is None
    assert _common.implementation("unknown", Base()) is None

