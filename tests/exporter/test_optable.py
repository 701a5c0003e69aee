"""aotrt/exporter/optable.py's `wrap_index`: an index read from data (embedding, gather,
index_select, advanced indexing, index_put) is checked as torch checks it, and one out of
range is a run's InvalidArgument ("index out of range") on every device, never a silently
clamped answer; in-range negative indices still count from the end where torch allows them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import aotrt
from aotrt.errors import InvalidArgument
from aotrt.kernels import ir
from tests.conftest import DEVICES


@dataclass(frozen=True)
class Case:
    """A model over (data, index); `size` is the indexed dim's, `negative` whether torch
    takes indices in [-size, 0) (advanced indexing, index_put) or refuses them."""

    fn: Callable[..., torch.Tensor]
    data: tuple[int, ...]
    index: tuple[int, ...]
    size: int
    negative: bool


CASES = {
    "embedding": Case(lambda w, i: F.embedding(i, w) * 2, (10, 6), (3, 4), 10, False),
    "gather": Case(lambda x, i: x.gather(1, i) + 1, (4, 6), (4, 3), 6, False),
    "index_select": Case(lambda x, i: x.index_select(1, i) + 1, (3, 5), (4,), 5, False),
    "index": Case(lambda x, i: x[i] * 3, (4, 5), (3,), 4, True),
    "index_put": Case(lambda x, i: torch.index_put(x, (i,), torch.full((3, 5), 7.0)),
                      (4, 5), (3,), 4, True),
}


class Model(torch.nn.Module):
    """A case's function as a module."""

    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return self.fn(x, i)


_PROGRAMS: dict[str, Any] = {}


def _program(name: str) -> Any:
    """The case's program, exported once (the indices of the example are in range)."""
    if name not in _PROGRAMS:
        c = CASES[name]
        _PROGRAMS[name] = aotrt.export(Model(c.fn), (torch.randn(*c.data),
                                                     torch.zeros(c.index, dtype=torch.long)))
    return _PROGRAMS[name]


def _good(c: Case, rng: np.random.Generator) -> np.ndarray:
    lo = -c.size if c.negative else 0
    return rng.integers(lo, c.size, c.index).astype(np.int64)


def _run(m: Any, x: np.ndarray, i: np.ndarray) -> np.ndarray:
    """One run, its output read back (the wait that reports a kernel's error)."""
    return np.asarray(m.run(x, i)[0])


def _torch(c: Case, x: np.ndarray, i: np.ndarray) -> np.ndarray:
    return c.fn(torch.from_numpy(x), torch.from_numpy(i)).numpy()


def _bad_values(c: Case) -> dict[str, int]:
    return {"too_big": c.size, "too_negative": -c.size - 1 if c.negative else -1}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_in_range_indices_match_torch(device: str, name: str) -> None:
    """Negative ones included where torch counts them from the end."""
    c = CASES[name]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(c.data).astype(np.float32)
    i = _good(c, rng)
    if c.negative:
        i.flat[0] = -1
    with aotrt.load(_program(name), device=device) as m:
        np.testing.assert_allclose(_run(m, x, i), _torch(c, x, i), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("bad", ["too_big", "too_negative"])
def test_an_index_out_of_range_raises_and_does_not_stick(device: str, name: str,
                                                         bad: str) -> None:
    c = CASES[name]
    rng = np.random.default_rng(1)
    x = rng.standard_normal(c.data).astype(np.float32)
    good = _good(c, rng)
    i = good.copy()
    i.flat[-1] = _bad_values(c)[bad]      # one bad index in the last row of the batch
    with pytest.raises((IndexError, RuntimeError)):
        _torch(c, x, i)                 # torch refuses it too
    with aotrt.load(_program(name), device=device) as m:
        with pytest.raises(InvalidArgument, match="index out of range"):
            _run(m, x, i)
        # the next good run succeeds: the error was reported once and cleared
        np.testing.assert_allclose(_run(m, x, good), _torch(c, x, good), rtol=1e-6,
                                   atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_a_bound_step_reports_a_bad_row_and_goes_on(device: str) -> None:
    """A bound step (on cuda a graph replay) checks as a run does: a batch with one bad row
    raises at the read of its output, and the next step is right."""
    c = CASES["embedding"]
    rng = np.random.default_rng(2)
    w = rng.standard_normal(c.data).astype(np.float32)
    with aotrt.load(_program("embedding"), device=device) as m:
        step = m.bind()
        for k in range(3):
            ids = _good(c, rng)
            if k == 1:
                ids[2, 1] = c.size + 5
                with pytest.raises(InvalidArgument, match="index out of range"):
                    np.asarray(step.run(w, ids)[0])
                continue
            np.testing.assert_allclose(np.asarray(step.run(w, ids)[0]), _torch(c, w, ids),
                                       rtol=1e-6)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_data_index_goes_through_the_check(name: str) -> None:
    """The check sits on the loaded index, inside the clamp that the bounds proof reads."""
    c = CASES[name]
    ops = [e.op for k in _program(name).kernels for e in ir.walk(
        [x for st in k.stores for x in (st.index, st.value)]) if isinstance(e, ir.Op)]
    want = "index_check_neg" if c.negative else "index_check"
    assert want in ops and "minimum" in ops and "maximum" in ops, ops


@pytest.mark.parametrize("device", DEVICES)
def test_the_lean_run_path_reports_it_too(device: str) -> None:
    """Without the hazard checker, runs after the first take the lean plan (on cpu the
    native plan's C loop, which reads the library's flag after each kernel)."""
    c = CASES["embedding"]
    rng = np.random.default_rng(3)
    w = rng.standard_normal(c.data).astype(np.float32)
    with aotrt.load(_program("embedding"), device=device, check_hazards=False) as m:
        for k in range(5):
            ids = _good(c, rng)
            if k in (2, 4):
                ids[0, 0] = c.size
                with pytest.raises(InvalidArgument, match="index out of range"):
                    _run(m, w, ids)
            else:
                np.testing.assert_allclose(_run(m, w, ids), _torch(c, w, ids), rtol=1e-6)
