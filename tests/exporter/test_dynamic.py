"""Bounded dynamic sizes (issue 35 item 4): a module exported with a torch.export Dim on its
sequence runs at every size in range and gives eager's answer; sizes outside, unbounded
dims and sizes aotrt cannot express are refused clearly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

import aotrt
from aotrt.errors import InvalidArgument, Unsupported
from tests.conftest import DEVICES

D, H, LO, HI = 16, 2, 1, 64


class Block(torch.nn.Module):
    """An MLP, a softmax and a matmul over the sequence, and an attention: [B, S, D]."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(D, 32)
        self.l2 = torch.nn.Linear(32, D)
        self.qkv = torch.nn.Linear(D, 3 * D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.l2(F.gelu(self.l1(x)))
        b, s, d = x.shape
        q, k, v = (t.view(b, s, H, d // H).transpose(1, 2) for t in self.qkv(h).split(d, -1))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, d)
        mix = torch.softmax(h @ h.transpose(1, 2) * 0.25, -1) @ h
        return a + mix + x


@pytest.fixture(scope="module")
def block() -> tuple[torch.nn.Module, aotrt.Program]:
    torch.manual_seed(0)
    m = Block().eval()
    prog = aotrt.export(m, (torch.randn(2, 8, D),),
                        dynamic_shapes=({1: Dim("S", min=LO, max=HI)},))
    return m, prog


def _check(mod, m: torch.nn.Module, s: int, seed: int) -> None:
    x = torch.randn(2, s, D, generator=torch.Generator().manual_seed(seed))
    y, = mod.run(x.numpy())
    with torch.no_grad():
        ref = m(x).numpy()
    assert np.asarray(y).shape == (2, s, D)
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-4, atol=1e-4)


def test_the_program_records_the_symbol_and_its_sizes(block, tmp_path: Path) -> None:
    _, prog = block
    assert prog.version == 2 and prog.symbols == [{"name": "S", "min": LO, "max": HI}]
    assert prog.inputs[0]["shape"] == [2, HI, D]         # stored at the upper bound
    at = {str(e["at"]): e["expr"] for e in prog.symbolic}
    assert at[str(["inputs", 0, "shape", 1])] == [[1, "S"]]
    assert at[str(["outputs", 0, "strides", 0])] == [[D, "S"]]
    # the [S, S] scores of the matmul: a term in S*S
    assert any(len(t) == 3 for e in prog.symbolic for t in e["expr"])
    prog.save(tmp_path / "d.aotp")
    again = aotrt.Program.load(tmp_path / "d.aotp")
    assert again.method("forward").symbolic == prog.symbolic


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_min_max_middle_and_mixed_sizes_match_eager(block, device: str) -> None:
    m, prog = block
    with aotrt.load(prog, device=device) as mod:
        for i, s in enumerate((LO, HI, 33, 7, LO, HI, 33, 2, 7)):
            _check(mod, m, s, i)
        method = mod.method("forward")
        # one plan per distinct size, kept: repeats made none
        assert method.plans_made == 5 and len(method.sizes_cached) == 5


@pytest.mark.parametrize("device", DEVICES)
def test_sizes_outside_the_bounds_are_refused(block, device: str) -> None:
    _, prog = block
    with aotrt.load(prog, device=device) as mod:
        for s in (0, HI + 1):
            with pytest.raises(InvalidArgument, match=rf"input 'x' dim 1 is S = {s}, outside "
                                                      rf"its bounds \[{LO}, {HI}\]"):
                mod.run(np.zeros((2, s, D), np.float32))
        with pytest.raises(InvalidArgument, match="input 'x' dim 0: expected 2, got 3"):
            mod.run(np.zeros((3, 4, D), np.float32))        # a static dim wrong
        assert mod.method("forward").plans_made == 0


def test_the_plan_cache_is_bounded(block) -> None:
    m, prog = block
    with aotrt.load(prog, device="cpu") as mod:
        method = mod.method("forward")
        method.max_sizes = 2
        for i, s in enumerate((3, 4, 5, 3)):
            _check(mod, m, s, i)
        assert method.sizes_cached == ((5,), (3,)) and method.plans_made == 4


class TwoInputs(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.softmax(a + b, -1) * 2


def test_inputs_that_disagree_on_a_symbol_are_refused() -> None:
    s = Dim("S", min=1, max=16)
    prog = aotrt.export(TwoInputs(), (torch.randn(4, 3), torch.randn(4, 3)),
                        dynamic_shapes=({0: s}, {0: s}))
    with aotrt.load(prog, device="cpu") as mod:
        a, b = np.ones((5, 3), np.float32), np.ones((6, 3), np.float32)
        with pytest.raises(InvalidArgument, match=r"input 'b' dim 0 is S = 6, but input 'a' "
                                                  r"dim 0 is S = 5"):
            mod.run(a, b)
        y, = mod.run(a, a)
        np.testing.assert_allclose(np.asarray(y), np.full((5, 3), 2 / 3, np.float32),
                                   rtol=1e-6)


def test_an_unbounded_dim_is_refused_naming_input_and_dim() -> None:
    for dim in (Dim("S"), Dim.AUTO, Dim.DYNAMIC):
        with pytest.raises(Unsupported, match=r"input 'a' dim 0 is unbounded"):
            aotrt.export(TwoInputs(), (torch.randn(4, 3), torch.randn(4, 3)),
                         dynamic_shapes=({0: dim}, {0: dim}))


def test_dim_auto_with_a_max_is_accepted() -> None:
    prog = aotrt.export(TwoInputs(), (torch.randn(4, 3), torch.randn(4, 3)),
                        dynamic_shapes=({0: Dim.AUTO(min=1, max=8)},
                                        {0: Dim.AUTO(min=1, max=8)}))
    assert [s["max"] for s in prog.symbols] == [8]
    with aotrt.load(prog, device="cpu") as mod:
        y, = mod.run(np.zeros((8, 3), np.float32), np.zeros((8, 3), np.float32))
        assert np.asarray(y).shape == (8, 3)


class MeanOverS(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(1)


def test_a_float_that_depends_on_a_size_is_refused_naming_it() -> None:
    with pytest.raises(Unsupported, match=r"dynamic sizes \['S'\]: kernels.*differs between "
                                          r"sizes.*mean over a dynamic dim"):
        aotrt.export(MeanOverS(), (torch.randn(2, 8, 4),),
                     dynamic_shapes=({1: Dim("S", min=1, max=32)},))


def test_a_range_without_two_sizes_to_fit_is_refused() -> None:
    with pytest.raises(Unsupported, match=r"Dim S in \[1, 2\] has no size >= 2 below its max"):
        aotrt.export(TwoInputs(), (torch.randn(2, 3), torch.randn(2, 3)),
                     dynamic_shapes=({0: Dim("S", min=1, max=2)}, {0: Dim("S", min=1, max=2)}))


def test_a_delegate_refuses_a_dynamic_method() -> None:
    prog = aotrt.export(TwoInputs(), (torch.randn(4, 3), torch.randn(4, 3)),
                        dynamic_shapes=({0: Dim("S", min=1, max=8)},
                                        {0: Dim("S", min=1, max=8)}))
    with pytest.raises(InvalidArgument, match="dynamic sizes"):
        aotrt.Delegate(prog)


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_a_program_with_a_dynamic_and_a_static_method(device: str) -> None:
    torch.manual_seed(1)
    m = Block().eval()
    prog = aotrt.export({
        "prefill": {"model": m, "args": (torch.randn(2, 8, D),),
                    "dynamic_shapes": ({1: Dim("S", min=1, max=32)},)},
        "decode": (m, (torch.randn(2, 1, D),)),
    })
    assert prog.method("prefill").symbols and not prog.method("decode").symbols
    with aotrt.load(prog, device=device) as mod:
        assert mod.methods == ("prefill", "decode")
        for i, s in enumerate((32, 1, 9)):
            x = torch.randn(2, s, D, generator=torch.Generator().manual_seed(i))
            y, = mod.method("prefill").run(x.numpy())
            with torch.no_grad():
                np.testing.assert_allclose(np.asarray(y), m(x).numpy(), rtol=1e-4, atol=1e-4)
        x = torch.randn(2, 1, D)
        y, = mod.method("decode").run(x.numpy())
        with torch.no_grad():
            np.testing.assert_allclose(np.asarray(y), m(x).numpy(), rtol=1e-4, atol=1e-4)
        with pytest.raises(Unsupported, match="dynamic sizes cannot be bound"):
            mod.method("prefill").bind()
