"""Tests for aotrt/runtime/backends/cpu/library.py: a loaded library's code stays mapped while
a call of it runs (`call`, or a native call within `pinned`), and its error flag is read and
cleared once."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from aotrt.errors import InvalidArgument
from aotrt.runtime.device import get_device
from tests.runtime.backends.cpu.test_native import FLAG_SOURCE


@pytest.fixture
def loaded():
    lib = get_device("cpu").libraries.c_library(FLAG_SOURCE, ["k_flag"])
    yield lib
    lib.close()


def test_address_is_the_kernel_and_its_flag(loaded) -> None:
    """A call through the addresses does what `call` does, and sets the same flag."""
    fn, flag = loaded.address("k_flag")
    assert fn and flag
    call = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64,
                            ctypes.c_int64, ctypes.c_int64)(fn)
    x = np.array([0, 0], np.int64)
    with loaded.pinned("k_flag"):
        call((ctypes.c_void_p * 1)(x.ctypes.data), 0, 1, 1)
    assert x[1] == 7
    x[:] = (5, 0)
    with loaded.pinned("k_flag"):
        call((ctypes.c_void_p * 1)(x.ctypes.data), 0, 1, 1)
    assert ctypes.c_int32.from_address(flag).value == 5
    with pytest.raises(InvalidArgument, match="kernel k_flag: "):
        loaded.take_error("k_flag")
    loaded.take_error("k_flag")                     # cleared: nothing to raise
    assert ctypes.c_int32.from_address(flag).value == 0


def test_a_close_inside_pinned_unmaps_at_its_end(loaded) -> None:
    with loaded.pinned("k"):
        assert loaded.close() is False              # a call of it runs: still mapped
        loaded.address("k_flag")                    # the code is still there
    assert loaded.close() is True
    with pytest.raises(InvalidArgument, match="closed"):
        with loaded.pinned("k"):
            pass
    with pytest.raises(InvalidArgument, match="closed"):
        loaded.address("k_flag")
