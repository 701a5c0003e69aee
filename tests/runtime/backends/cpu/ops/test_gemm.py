"""The cpu device's many-row float32 GEMM (backends/cpu/ops/gemm.py: oneDNN's sgemm on blocks
of columns over the stream's threads): linear, mm and addmm through it against torch
(float64 reference) in the layouts it takes, the views it declines, and the same bits for
any thread count."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from aotrt.runtime.device import get_device
from aotrt.runtime.ops import addmm, linear, mm
from aotrt.runtime.backends.cpu.ops import gemm as cpu_gemm
from aotrt.runtime.backends.cpu.ops import mm as cpu_mm
from tests.runtime.backends.cpu.ops.test_gemv import check_linear


@pytest.fixture
def taken(kit, monkeypatch):
    """The compiled kernels tried first (as on a CPU without brgemm), and a list of the
    works the GEMM kernel made."""
    if kit.dev.name != "cpu":
        pytest.skip("cpu op")
    if kit.dev.libraries.gemm.sgemm() == 0:
        pytest.skip("oneDNN is not installed")
    made: list[object] = []
    real = cpu_gemm.make_gemm

    def counting(*args):
        work = real(*args)
        if work is not None:
            made.append(work)
        return work

    monkeypatch.setattr(cpu_mm, "_gemv_first", lambda device, w: True)
    monkeypatch.setattr(cpu_mm.cpu_gemm, "make_gemm", counting)
    return made


@pytest.mark.parametrize("x_shape", [(9, 37), (128, 200), (2, 40, 37), (1, 130, 770)])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("layout", ["packed", "offset", "strided"])
def test_linear_through_the_kernel(kit, stream, taken, x_shape, with_bias, layout):
    check_linear(kit, stream, taken, x_shape, 301, with_bias, layout)


@pytest.mark.parametrize("bias_shape", [None, (45,), (1, 45)])
@pytest.mark.parametrize("w_layout", ["column_major", "row_major"])
def test_mm_and_addmm(kit, stream, taken, bias_shape, w_layout):
    # GPT-2's Conv1D: x [M, K] @ w [K, N], the exporter stores w column-major (strides
    # (1, K)); a row-major one is B as it lies
    rows, k, n = 128, 300, 45
    a_np, w_np = kit.randn((rows, k), "float32"), kit.randn((n, k), "float32")
    if w_layout == "column_major":
        b = kit.view(kit.tensor(w_np), [k, n], [1, k], 0)
    else:
        b = kit.tensor(np.ascontiguousarray(w_np.T))
    out = kit.out((rows, n), "float32")
    ref = kit.t64(a_np) @ kit.t64(w_np).T
    if bias_shape is None:
        mm(stream, out, kit.tensor(a_np), b)
    else:
        c_np = kit.randn(bias_shape, "float32")
        addmm(stream, out, kit.tensor(c_np), kit.tensor(a_np), b)
        ref = ref + kit.t64(c_np)
    kit.close(kit.read(out), ref, "float32")
    assert len(taken) == 1


def test_declined_views_stay_right(kit, stream, taken):
    """A full [M, N] bias, a transposed x and an output over its input run on numpy, and
    still give torch's answer."""
    a_np, b_np, c_np = (kit.randn(s, "float32") for s in ((12, 20), (20, 9), (12, 9)))
    out = kit.out((12, 9), "float32")
    addmm(stream, out, kit.tensor(c_np), kit.tensor(a_np), kit.tensor(b_np))
    kit.close(kit.read(out), kit.t64(c_np) + kit.t64(a_np) @ kit.t64(b_np), "float32")
    x_np, w_np = kit.randn((16, 20), "float32"), kit.randn((9, 20), "float32")
    out2 = kit.out((16, 9), "float32")
    linear(stream, out2, kit.tensor(x_np, "transposed"), kit.tensor(w_np))
    kit.close(kit.read(out2), kit.t64(x_np) @ kit.t64(w_np).T, "float32")
    sq_np, wsq_np = kit.randn((16, 64), "float32"), kit.randn((64, 64), "float32")
    x = kit.tensor(sq_np)
    linear(stream, x, x, kit.tensor(wsq_np))
    kit.close(kit.read(x), kit.t64(sq_np) @ kit.t64(wsq_np).T, "float32")
    assert taken == []


@pytest.mark.parametrize("m,n,k", [(128, 2304, 768), (37, 101, 300), (128, 33, 64),
                                   (16, 17, 64), (9, 1, 20)])
@pytest.mark.parametrize("w_layout", ["nk", "kn"])
def test_any_thread_count_gives_the_same_bits(m, n, k, w_layout):
    kernel = get_device("cpu").libraries.gemm
    sgemm = kernel.sgemm()
    if not sgemm:
        pytest.skip("oneDNN is not installed")
    lib = kernel.library()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    wa, ldb, trans = (w, k, 1) if w_layout == "nk" else (np.ascontiguousarray(w.T), n, 0)
    bias = rng.standard_normal(n, dtype=np.float32)
    results = []
    for threads in (1, 2, 3, 4):
        out = np.full((m, n), np.nan, np.float32)
        params = np.array([m, n, k, k, ldb, trans, n, cpu_gemm.COLUMNS], np.int64)
        ptrs = (ctypes.c_void_p * 6)(x.ctypes.data, wa.ctypes.data, bias.ctypes.data,
                                     out.ctypes.data, params.ctypes.data, sgemm)
        lib.call(cpu_gemm.SYMBOL, "gemm", ptrs, n, threads)
        results.append(out)
    ref = x.astype(np.float64) @ w.astype(np.float64).T + bias
    np.testing.assert_allclose(results[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    for r in results[1:]:
        assert np.array_equal(r, results[0])
