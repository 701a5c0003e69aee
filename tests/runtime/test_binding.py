"""runtime/binding.py: a method bound once to static buffers; bound inputs that share the
arena are never read again as if they had kept their values."""

from __future__ import annotations

import numpy as np
import pytest

import aotrt
from aotrt.errors import InvalidArgument
from aotrt.exporter.builder import ProgramBuilder
from tests.conftest import DEVICES
from tests.runtime.test_delegate import plus_one_kernel


def _arena_reuser() -> aotrt.Program:
    """o = (x + 1) + 1 through an arena temporary u whose bytes the plan also gives the
    bound input x (x is dead once the first kernel read it)."""
    b = ProgramBuilder("ArenaHome")
    x = b.input("x", "float32", [64])
    o = b.output("o", "float32", [64])
    t = b.in_buffer(b.buffer(256), 0, "float32", [64])
    u = b.in_buffer(b.buffer(256), 0, "float32", [64])
    b.kernel(plus_one_kernel("k_a", (64,), [1], [1], "float32"), [x, t])
    b.copy(u, t)
    b.kernel(plus_one_kernel("k_b", (64,), [1], [1], "float32"), [u, o])
    return b.build()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hazards", [True, False])
def test_inputs_in_the_arena_are_not_run_again_without_new_values(device: str,
                                                                  hazards: bool) -> None:
    xv = np.arange(64, dtype=np.float32)
    with aotrt.load(_arena_reuser(), device=device, check_hazards=hazards) as m:
        b = m.bind()
        assert not b.inputs_kept
        np.testing.assert_array_equal(np.asarray(b.run(xv)[0]), xv + 2)
        # run() alone would read what the run's temporaries left in x's bytes (x + 1).
        with pytest.raises(InvalidArgument, match="share the arena"):
            b.run()
        np.testing.assert_array_equal(np.asarray(b.run(xv * 3)[0]), xv * 3 + 2)


@pytest.mark.parametrize("device", DEVICES)
def test_inputs_of_their_own_run_again_on_the_bound_values(device: str) -> None:
    b = ProgramBuilder("OwnHome")
    x = b.input("x", "float32", [64])
    o = b.output("o", "float32", [64])
    b.kernel(plus_one_kernel("k_c", (64,), [1], [1], "float32"), [x, o])
    xv = np.arange(64, dtype=np.float32)
    with aotrt.load(b.build(), device=device) as m:
        bound = m.bind()
        assert bound.inputs_kept
        np.testing.assert_array_equal(np.asarray(bound.run(xv)[0]), xv + 1)
        np.testing.assert_array_equal(np.asarray(bound.run()[0]), xv + 1)
