"""runtime/loop.py: a bound method run step after step, an output fed back as an input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import aotrt
from aotrt.errors import InvalidArgument
from aotrt.runtime.loop import DEPTH, Loop
from tests.conftest import DEVICES


class Affine(torch.nn.Module):
    """y = 0.5 * x + s (flattened): fed back, the steps form a known sequence."""

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return (x * 0.5 + s).reshape(-1)


@pytest.fixture(scope="module")
def program() -> aotrt.Program:
    args = (torch.zeros(3, 1), torch.zeros(()))
    return aotrt.export(Affine(), args)


def _sequence(x0: np.ndarray, shifts: list[float]) -> list[np.ndarray]:
    """Each step's output, computed in float32 as the program does."""
    out, x = [], x0.reshape(-1).astype(np.float32)
    for s in shifts:
        x = (x * np.float32(0.5) + np.float32(s)).astype(np.float32)
        out.append(x)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("checker", ["on", "off"])
def test_fed_steps_read_a_step_late_give_the_sequence(program, device, checker,
                                                      monkeypatch) -> None:
    # With the checker off, cuda takes the device path (fed copies, page-locked readback).
    if checker == "off":
        monkeypatch.delenv("AOTRT_CHECK_HAZARDS", raising=False)
    else:
        monkeypatch.setenv("AOTRT_CHECK_HAZARDS", "1")
    x0 = np.random.default_rng(0).standard_normal((3, 1)).astype(np.float32)
    shifts = [float(k) - 2.5 for k in range(9)]
    ref = _sequence(x0, shifts)
    with aotrt.load(program, device=device) as m:
        got = []
        with Loop(m.bind(), feed={0: 0}) as loop:
            loop.step(x0, np.array(shifts[0], np.float32))
            for s in shifts[1:]:
                loop.step(None, np.array(s, np.float32))
                got.append(loop.result()[0])
            got.append(loop.result()[0])
            assert loop.pending == 0
    for k, (g, r) in enumerate(zip(got, ref)):
        np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-6, err_msg=f"step {k}")


@pytest.mark.parametrize("device", DEVICES)
def test_a_given_input_at_a_fed_position_replaces_the_fed_value(program, device) -> None:
    x0, x1 = np.ones((3, 1), np.float32), np.full((3, 1), 8.0, np.float32)
    with aotrt.load(program, device=device) as m, Loop(m.bind(), feed={0: 0}) as loop:
        loop.step(x0, np.array(0.0, np.float32))
        loop.step(x1, np.array(1.0, np.float32))
        np.testing.assert_allclose(loop.result()[0], [0.5] * 3)
        np.testing.assert_allclose(loop.result()[0], [5.0] * 3)


def test_misuse_is_refused_with_a_clear_error(program) -> None:
    z = np.zeros((3, 1), np.float32)
    s = np.array(0.0, np.float32)
    with aotrt.load(program) as m:
        b = m.bind()
        with pytest.raises(InvalidArgument, match="outside them"):
            Loop(b, feed={1: 0})
        with pytest.raises(InvalidArgument, match="cannot become input"):
            Loop(b, feed={0: 1})
        loop = Loop(b, feed={0: 0})
        with pytest.raises(InvalidArgument, match="not fed from an earlier step"):
            loop.step(None, s)              # nothing to feed at step 0
        with pytest.raises(InvalidArgument, match="takes 2 inputs"):
            loop.step(z)
        with pytest.raises(InvalidArgument, match="no step is unread"):
            loop.result()
        loop.step(z, s)
        with pytest.raises(InvalidArgument, match="not fed from an earlier step"):
            loop.step(z, None)              # input 1 is not fed
        for _ in range(DEPTH - 1):
            loop.step(None, s)
        with pytest.raises(InvalidArgument, match="unread"):
            loop.step(None, s)
        loop.close()
        loop.close()                        # twice is fine
        with pytest.raises(InvalidArgument, match="closed"):
            loop.step(z, s)
