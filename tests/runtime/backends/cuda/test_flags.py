"""aotrt/runtime/backends/cuda/flags.py: a kernel library's error flag (page-locked host
memory its kernels write), read at a stream's wait and cleared. Skips without a GPU; the
end-to-end checks (eager runs, graph replays, a bound step) are tests/exporter/test_optable.py."""

from __future__ import annotations

import ctypes

import pytest

from aotrt.runtime.device import cuda_available, get_device

pytestmark = pytest.mark.skipif(not cuda_available(), reason="no CUDA GPU here")


def test_a_flag_is_read_once_and_let_go_after_its_library_closes() -> None:
    from aotrt.runtime.backends.cuda.flags import ErrorFlag, take_error

    get_device("cuda").ensure_current()
    flag = ErrorFlag()
    assert flag.device_ptr
    flags = {flag}
    assert take_error(flags) == "" and flags == {flag}
    ctypes.c_int32.from_address(flag._host).value = 2     # as a kernel would
    assert "index out of range" in take_error(flags)
    assert take_error(flags) == ""                          # cleared: it does not stick
    flag.retired = True
    take_error(flags)
    assert not flags
