"""aotrt/runtime/backends/cuda/flags.py: a kernel library's error flag (page-locked host
memory its kernels write), read at a stream's wait and cleared. Skips without a GPU; the
end-to-end checks (eager runs, graph replays, a bound step) are tests/exporter/test_optable.py."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from aotrt.errors import InvalidArgument
from aotrt.kernels import ir
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


def test_a_kernel_reports_through_its_librarys_flag_at_the_wait() -> None:
    dev = get_device("cuda")
    i64 = "int64"
    chk = ir.Op("index_check", (ir.Load(0, ir.Idx(0), i64), ir.Const(4, i64)), i64)
    clamp = ir.Op("minimum", (ir.Op("maximum", (chk, ir.Const(0, i64)), i64),
                              ir.Const(3, i64)), i64)
    k = ir.Kernel("checked", (3,), (), (ir.Arg(i64, "r"), ir.Arg(i64, "w")),
                  (ir.Store(1, ir.Idx(0), clamp),))
    lib = dev.kernel_library([k])
    stream = dev.create_stream()
    try:
        from aotrt.runtime.memory import Owner, owner_scope
        from aotrt.runtime import shims

        with owner_scope(Owner("test")):
            idx = shims.empty_strided((3,), (1,), "int64", dev)
            out = shims.empty_strided((3,), (1,), "int64", dev)
            for values, bad in (([0, 3, 9], True), ([0, 1, 2], False)):
                dev.write(idx, np.array(values, np.int64))
                lib.kernel("checked")(stream, idx, out)
                if bad:
                    with pytest.raises(InvalidArgument, match="index out of range"):
                        stream.commit_and_wait()
                else:
                    stream.commit_and_wait()
                    np.testing.assert_array_equal(dev.read(out), values)
    finally:
        stream.close()
        lib.close()
