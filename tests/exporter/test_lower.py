"""The lowering driver (aotrt/exporter/lower.py): empty and 0-dim values, the memory plan,
and models refused at export, naming the op and the line. The rules have their own tests
in tests/exporter/rules/; each structural check there is paired with a numeric one
(tests/exporter/harness.check_module)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import aotrt
from tests.exporter.harness import check_module, randn
from tests.exporter.lowering import check_shapes, export_seeded, line_of


class EmptyAndScalars(nn.Module):
    """Zero-size views and cat inputs, 0-dim results and inputs, bool outputs."""

    def forward(self, s: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple:
        e = x[:, :0]
        c = torch.cat([e, x * s, e], 1)
        return (c.sum(), x > 0, e * 3, torch.cat([y[0:0], y], 0), x.mean(), y[..., 1],
                s + 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_empty_and_scalar_values(dtype: torch.dtype) -> None:
    """Empty tensors and 0-dim values lower and run (bool outputs compared exactly)."""
    def make(gen: torch.Generator, dt: torch.dtype) -> tuple[torch.Tensor, ...]:
        return (torch.randn((), generator=gen).to(dt), randn(gen, dt, 3, 4),
                randn(gen, dt, 2, 5))
    prog = check_module(EmptyAndScalars(), make, dtype).program
    assert [o["shape"] for o in prog.outputs] == [[], [3, 4], [3, 0], [2, 5], [], [2], []]


class Chain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for lin in self.layers:
            x = lin(x).relu()
        return x


def test_memory_plan_reuses_the_arena() -> None:
    """Intermediates whose lifetimes do not overlap share bytes."""
    prog = check_shapes(Chain(), (32, 64))
    one = 32 * 64 * 4
    assert prog.arena_nbytes <= 3 * one


# ---------------------------------------------------------------------------------------------
# refusals at export


class KthValue(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        return torch.kthvalue(y, 2, dim=-1).values + 1


class Dropout(nn.Module):
    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)


def test_unsupported_op_names_op_and_line() -> None:
    """An op aotrt cannot run is refused at export with the op and the model's line."""
    line = line_of(KthValue.forward, "torch.kthvalue")
    with pytest.raises(aotrt.Unsupported) as info:
        export_seeded(KthValue(), (3, 5))
    msg = str(info.value)
    assert "aten.kthvalue" in msg
    assert f"test_lower.py:{line}" in msg


def test_attention_dropout_is_refused() -> None:
    """Dropout inside attention cannot be reproduced: refused at export, with the line."""
    line = line_of(Dropout.forward, "dropout_p")
    with pytest.raises(aotrt.Unsupported, match=f"test_lower.py:{line}"):
        export_seeded(Dropout(), (1, 2, 4, 8))


class RandomMasking(nn.Module):
    """MAE-style random masking: noise drawn in forward orders the patches."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.rand(x.shape[0], x.shape[1])
        return torch.gather(x, 1, noise.argsort(dim=1)[:, :2, None].expand(-1, -1, x.shape[2]))


def test_random_ops_are_refused_saying_so() -> None:
    """A random op in forward is refused with the line and a reason: random ops are not
    supported, pass the values in."""
    line = line_of(RandomMasking.forward, "torch.rand(")
    with pytest.raises(aotrt.Unsupported) as info:
        export_seeded(RandomMasking(), (2, 5, 3))
    msg = str(info.value)
    assert "aten.rand.default at " in msg and f"test_lower.py:{line}" in msg
    assert "random ops are not supported" in msg and "as an input" in msg


def test_training_mode_batch_norm_is_refused() -> None:
    """A batch norm in training mode updates its statistics: refused, suggesting eval()."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    with pytest.raises(aotrt.Unsupported, match=r"running_mean.*model\.eval"):
        aotrt.export(model, (torch.randn(1, 3, 6, 6),))


def test_float64_is_refused() -> None:
    """float64 has no aotrt dtype: refused at export."""
    with pytest.raises(aotrt.Unsupported, match="float64"):
        with torch.no_grad():
            aotrt.export(nn.Linear(3, 2).double(), (torch.randn(2, 3, dtype=torch.float64),))
