"""aotrt/runtime/constants.py: a loaded program's constants hold the right to re-lay a weight
in place, and a delegate hands them to the library ops it prepares, never through the
generic Allocation."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

import aotrt
from aotrt.dtypes import as_dtype
from aotrt.runtime import constants, shims
from aotrt.runtime.constants import Constants
from aotrt.runtime.memory import Allocation, current_owner
from aotrt.runtime.ops import OPS
from aotrt.runtime.tensor import Handle
from tests.runtime.test_delegate import seed_program


def _view(a: Allocation, offset: int, sizes: tuple[int, ...],
          strides: tuple[int, ...]) -> Handle:
    return Handle(a, offset, sizes, strides, as_dtype("float32"), a.memory.device,
                  current_owner())._publish()


def test_sole_read_is_a_whole_dense_constant_of_its_own_allocation(dev, stream, owner):
    a, offsets = dev.memory.allocate_constants([64, 128], stream)
    other, _ = dev.memory.allocate_constants([128], stream)
    consts = Constants(a, frozenset({(offsets[1], offsets[1] + 128)}))
    views = {"whole": _view(a, offsets[1], (32,), (1,)),
             "transposed": _view(a, offsets[1], (4, 8), (1, 4)),      # dense all the same
             "part": _view(a, offsets[1], (16,), (1,)),
             "strided": _view(a, offsets[1], (16,), (2,)),
             "read elsewhere too": _view(a, offsets[0], (16,), (1,)),
             "another program's": _view(other, 0, (32,), (1,))}
    try:
        got = {k: consts.sole_read(h) for k, h in views.items()}
    finally:
        for h in views.values():
            shims.delete_tensor_object(h)
    assert got == {"whole": True, "transposed": True, "part": False, "strided": False,
                   "read elsewhere too": False, "another program's": False}
    assert not hasattr(a, "sole_read")      # the generic Allocation holds no such right


def test_current_is_set_only_inside_preparing_on_its_thread(dev, stream, owner):
    a, _ = dev.memory.allocate_constants([64], stream)
    outer, inner = Constants(a, frozenset()), Constants(a, frozenset())
    assert constants.current() is None
    with outer.preparing():
        assert constants.current() is outer
        with inner.preparing():
            assert constants.current() is inner
        assert constants.current() is outer
        seen: list[Any] = []
        t = threading.Thread(target=lambda: seen.append(constants.current()))
        t.start()
        t.join()
        assert seen == [None]
    assert constants.current() is None


def test_a_delegate_prepares_its_library_ops_with_its_programs_constants(monkeypatch):
    """The mm reading w1 alone gets the right to w1; addmm's w2 and b2 are read by it alone
    too; outside the delegate's steps no op has any."""
    seen: list[tuple[str, Any, list[bool]]] = []

    def spy(name: str) -> Any:
        real = OPS[name]

        def op(stream: Any, outs: Any, ins: Any, **params: Any) -> Any:
            now = constants.current()
            seen.append((name, now, [h is not None and now is not None and now.sole_read(h)
                                     for h in ins]))
            return real(stream, outs, ins, **params)
        return op

    for name in ("mm", "addmm"):
        monkeypatch.setitem(OPS, name, spy(name))
    prog = seed_program()
    with aotrt.load(prog, device="cpu") as d:
        d.run(np.ones((12, 7), np.float32))
        program = d._loaded.constants       # noqa: SLF001 - the program's own
        assert seen and all(now is program for _, now, _ in seen)
        by_op = {name: reads for name, _, reads in seen}
        assert by_op["mm"] == [False, True]                 # x is an input, w1 a constant
        assert by_op["addmm"] == [True, False, True]        # b2, the chunk of h, w2
    assert constants.current() is None


def test_a_dynamic_methods_constants_are_never_re_laid() -> None:
    """Each size of a dynamic method prepares its own GEMM over the same weight, each of
    which could want its own layout: the program grants no re-lay right for them."""
    torch = __import__("pytest").importorskip("torch")

    class Lin(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Linear(16, 8)

        def forward(self, x: Any) -> Any:
            return self.w(x)

    s = torch.export.Dim("S", min=1, max=32)
    dyn = aotrt.export(Lin().eval(), (torch.randn(4, 16),), dynamic_shapes=({0: s},))
    static = aotrt.export(Lin().eval(), (torch.randn(4, 16),))
    with aotrt.load(dyn, device="cpu") as m, aotrt.load(static, device="cpu") as d:
        assert not m._loaded.constants._sole_read          # noqa: SLF001
        assert d._loaded.constants._sole_read              # noqa: SLF001 - the static one may
