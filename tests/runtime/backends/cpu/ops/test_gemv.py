"""The cpu device's few-row float32 GEMM kernel (backends/cpu/ops/gemv.py): linear, mm and addmm
through it against torch (float64 reference) in every layout it takes or declines, and the
same bits for any thread count."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from aotrt.runtime.device import get_device
from aotrt.runtime.ops import addmm, linear, mm
from aotrt.runtime.backends.cpu.ops import gemv as cpu_gemv
from aotrt.runtime.backends.cpu.ops import mm as cpu_mm


@pytest.fixture
def taken(kit, monkeypatch):
    """The kernel tried first (as on a CPU without brgemm), and a list of the works it
    made."""
    if kit.dev.name != "cpu":
        pytest.skip("cpu op")
    made: list[object] = []
    real = cpu_gemv.make_gemv

    def counting(*args):
        work = real(*args)
        if work is not None:
            made.append(work)
        return work

    monkeypatch.setattr(cpu_mm, "_gemv_first", lambda device, w: True)
    monkeypatch.setattr(cpu_mm.cpu_gemv, "make_gemv", counting)
    return made


@pytest.mark.parametrize("x_shape", [(37,), (1, 37), (3, 37), (8, 37), (2, 3, 37), (1, 1, 770)])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("layout", ["packed", "offset", "strided"])
def test_linear_through_the_kernel(kit, stream, taken, x_shape, with_bias, layout):
    check_linear(kit, stream, taken, x_shape, 101, with_bias, layout)


def check_linear(kit, stream, taken, x_shape, n, with_bias, layout) -> None:  # noqa: ANN001
    """linear of x [..., K] by a [n, K] weight in `layout` against torch (float64); the
    compiled kernel (`taken`) ran exactly when x and out fold into rows (a padded [2, 3, K]
    x does not: numpy runs it)."""
    k = x_shape[-1]
    x_np, w_np, b_np = (kit.randn(x_shape, "float32"), kit.randn((n, k), "float32"),
                        kit.randn((n,), "float32"))
    bias = kit.tensor(b_np, "offset") if with_bias else None
    out = kit.out(x_shape[:-1] + (n,), "float32", layout)
    x = kit.tensor(x_np, layout)
    linear(stream, out, x, kit.tensor(w_np, layout), bias)
    ref = torch.nn.functional.linear(kit.t64(x_np), kit.t64(w_np),
                                     kit.t64(b_np) if with_bias else None)
    kit.close(kit.read(out), ref, "float32")
    folds = cpu_gemv._rows(x) is not None and cpu_gemv._rows(out) is not None
    assert len(taken) == int(folds)


@pytest.mark.parametrize("bias_shape", [None, (45,), (1, 45)])
@pytest.mark.parametrize("rows", [1, 5])
def test_mm_and_addmm_of_a_column_major_weight(kit, stream, taken, bias_shape, rows):
    # GPT-2's Conv1D: x [M, K] @ w [K, N], w stored as its transpose (strides (1, K)).
    k, n = 300, 45
    a_np, w_np = kit.randn((rows, k), "float32"), kit.randn((n, k), "float32")
    b = kit.view(kit.tensor(w_np), [k, n], [1, k], 0)
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
    """A row-major [K, N] b, a full [M, N] bias, too many rows and a transposed x run on
    numpy, and still give torch's answer."""
    a_np, b_np, c_np = (kit.randn(s, "float32") for s in ((4, 20), (20, 9), (4, 9)))
    out = kit.out((4, 9), "float32")
    addmm(stream, out, kit.tensor(c_np), kit.tensor(a_np), kit.tensor(b_np))
    kit.close(kit.read(out), kit.t64(c_np) + kit.t64(a_np) @ kit.t64(b_np), "float32")
    x_np, w_np = kit.randn((cpu_gemv.MAX_ROWS + 1, 20), "float32"), kit.randn((9, 20), "float32")
    out2 = kit.out((cpu_gemv.MAX_ROWS + 1, 9), "float32")
    linear(stream, out2, kit.tensor(x_np), kit.tensor(w_np))
    kit.close(kit.read(out2), kit.t64(x_np) @ kit.t64(w_np).T, "float32")
    x3 = kit.randn((3, 20), "float32")
    out3 = kit.out((3, 9), "float32")
    linear(stream, out3, kit.tensor(x3, "transposed"), kit.tensor(w_np))
    kit.close(kit.read(out3), kit.t64(x3) @ kit.t64(w_np).T, "float32")
    assert taken == []


def test_output_over_its_input_reads_old_values(kit, stream, taken):
    """x is copied before any output is written: linear in place is right."""
    x_np, w_np, b_np = (kit.randn(s, "float32") for s in ((2, 64), (64, 64), (64,)))
    x = kit.tensor(x_np)
    linear(stream, x, x, kit.tensor(w_np), kit.tensor(b_np))
    ref = torch.nn.functional.linear(kit.t64(x_np), kit.t64(w_np), kit.t64(b_np))
    kit.close(kit.read(x), ref, "float32")
    assert len(taken) == 1


@pytest.mark.parametrize("m,n,k", [(1, 2304, 768), (3, 1000, 131), (8, 77, 3072)])
def test_any_thread_count_gives_the_same_bits(m, n, k):
    lib = get_device("cpu").libraries.gemv.library()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    results = []
    for threads in (1, 2, 3):
        out = np.full((m, n), np.nan, np.float32)
        params = np.array([m, n, k, k, k, n, 1], np.int64)
        scratch = np.zeros(m * k + 16, np.float32)
        ptrs = (ctypes.c_void_p * 6)(x.ctypes.data, w.ctypes.data, bias.ctypes.data,
                                     out.ctypes.data, params.ctypes.data, scratch.ctypes.data)
        lib.call(cpu_gemv.SYMBOL, "gemv", ptrs, -(-n // cpu_gemv.ROWS), threads)
        results.append(out)
    ref = x.astype(np.float64) @ w.astype(np.float64).T + bias
    np.testing.assert_allclose(results[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    for r in results[1:]:
        assert np.array_equal(r, results[0])
