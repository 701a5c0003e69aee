"""Tests for aotrt/runtime/backends/cpu/native.py: the C loop that runs a static plan's native
works (oneDNN calls, compiled kernels, copies) and the Python ones between them, in order."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

import aotrt
from aotrt.errors import DeviceError, InvalidArgument
from aotrt.runtime.device import get_device
from aotrt.runtime.backends.cpu import native as cpu_native
from aotrt.runtime.backends.cpu import queue as cpu_queue
from aotrt.runtime.work import Work
from tests.support import FLAG_SOURCE


@pytest.fixture
def cpu():
    return get_device("cpu")


@pytest.fixture
def runner(cpu):
    return cpu.libraries.c_library(cpu_native.SOURCE, [cpu_native.SYMBOL])


def _copy(dst: np.ndarray, src: np.ndarray) -> cpu_native.Native:
    nat = cpu_native.copies([(dst, src)])
    assert nat is not None
    return nat


def _plan(runner, natives_or_works, threads: int = 1) -> cpu_native.NativePlan:
    works = []
    for i, w in enumerate(natives_or_works):
        if isinstance(w, cpu_native.Native):
            def work() -> None:
                raise AssertionError("a native work ran from Python")
            work = Work(work, native=lambda w=w: w)
            works.append((f"instruction #{i}", work))
        else:
            works.append((f"instruction #{i}", w))
    return cpu_native.NativePlan(runner, works, lambda: threads)


@pytest.mark.parametrize("case", ["nhwc_slice_in_nchw_order", "transpose", "rows", "strided_1d",
                                  "five_dims_that_merge"])
def test_a_strided_copy_matches_numpy(runner, case: str) -> None:
    rng = np.random.default_rng(3)
    if case == "nhwc_slice_in_nchw_order":
        big = rng.standard_normal((1, 9, 11, 48), dtype=np.float32)
        src = big[..., 8:40].transpose(0, 3, 1, 2)        # a channel slice, NCHW dim order
        dst = np.zeros((1, 9, 11, 32), np.float32).transpose(0, 3, 1, 2)
    elif case == "transpose":
        src = rng.standard_normal((13, 7), dtype=np.float32).T
        dst = np.zeros((7, 13), np.float32)
    elif case == "rows":
        src = rng.standard_normal((6, 20), dtype=np.float32)[:, 3:17]
        dst = np.zeros((6, 14), np.float32)
    elif case == "strided_1d":
        src = np.arange(40, dtype=np.int64)[::3]
        dst = np.zeros(42, np.int64)[1::3]
    else:
        src = rng.standard_normal((2, 3, 4, 5, 6), dtype=np.float32)
        dst = np.zeros_like(src)
    want = np.array(src, copy=True)
    _plan(runner, [_copy(dst, src)])()
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_large_copy_split_over_threads_matches_numpy(runner, threads: int) -> None:
    """From 256 KiB a copy's rows are split over the threads (a C2f slice of YOLOv8n)."""
    big = np.random.default_rng(4).standard_normal((1, 80, 81, 48), dtype=np.float32)
    src = big[..., 16:48].transpose(0, 3, 1, 2)
    dst = np.zeros((1, 80, 81, 32), np.float32).transpose(0, 3, 1, 2)
    assert dst.nbytes >= 1 << 18
    _plan(runner, [_copy(dst, src)], threads)()
    np.testing.assert_array_equal(dst, src)


@pytest.mark.parametrize("case", ["2d_tails", "outer_dims", "int64", "nhwc_to_nchw_slice",
                                  "large_threaded"])
def test_a_transpose_goes_by_tiles_and_matches_numpy(runner, case: str) -> None:
    """dst contiguous along one dim and src along another: tile by tile, tails (sizes not a
    multiple of the tile) included."""
    rng = np.random.default_rng(5)
    threads = 1
    if case == "2d_tails":
        src = rng.standard_normal((37, 53), dtype=np.float32).T
        dst = np.zeros((53, 37), np.float32)
    elif case == "outer_dims":
        src = rng.standard_normal((3, 20, 33), dtype=np.float32).transpose(0, 2, 1)
        dst = np.zeros((3, 33, 20), np.float32)
    elif case == "int64":
        src = rng.integers(-9, 9, (19, 22)).T
        dst = np.zeros((22, 19), np.int64)
    elif case == "nhwc_to_nchw_slice":
        # YOLOv8n's head: an NHWC map into its channel-major slice of the output
        src = rng.standard_normal((1, 40, 40, 64), dtype=np.float32).transpose(0, 3, 1, 2)
        out = np.zeros((1, 144, 2100), np.float32)
        dst = out[:, :64, :1600].reshape(1, 64, 40, 40)
        assert np.shares_memory(dst, out)
    else:
        src = rng.standard_normal((300, 400), dtype=np.float32).T
        dst = np.zeros((400, 300), np.float32)
        threads = 2
    nat = _copy(dst, src)
    geo = np.ctypeslib.as_array((ctypes.c_int64 * 14).from_address(nat.steps[0][7]))
    assert geo[13] >= 0, geo            # taken as a transpose
    want = np.array(src, copy=True)
    _plan(runner, [nat], threads)()
    np.testing.assert_array_equal(dst, want)
    if case == "nhwc_to_nchw_slice":
        assert not out[:, 64:].any() and not out[:, :, 1600:].any()


def test_a_copy_the_loop_cannot_do_in_order_is_refused() -> None:
    """Overlapping bytes (numpy orders such a copy), negative strides, more than four dims
    after merging, mismatched shapes: None, the work stays in Python."""
    a = np.arange(64, dtype=np.float32)
    assert cpu_native.strided_copy(a[1:33], a[0:32], []) is None
    assert cpu_native.strided_copy(np.zeros(8, np.float32), a[:8][::-1], []) is None
    deep = np.zeros((2, 2, 2, 2, 2), np.float32)
    assert cpu_native.strided_copy(deep, np.zeros_like(deep).transpose(4, 2, 0, 3, 1),
                                   []) is None
    assert cpu_native.strided_copy(np.zeros(4, np.float32), np.zeros(5, np.float32), []) is None


def test_native_and_python_works_run_in_order(runner) -> None:
    b = np.array([1, 0, 0, 0], np.int64)

    def python_work() -> None:
        b[0] = 2
    plan = _plan(runner, [_copy(b[1:2], b[0:1]), python_work, _copy(b[2:3], b[0:1])])
    assert plan.segments == 2 and plan.steps == 2
    plan()
    np.testing.assert_array_equal(b, [2, 1, 2, 0])


def test_a_kernel_error_names_its_instruction_and_the_flag_is_reset(cpu, runner) -> None:
    loaded = cpu.libraries.c_library(FLAG_SOURCE, ["k_flag"])
    x = np.array([3, 0], np.int64)
    ptrs = (ctypes.c_void_p * 1)(x.ctypes.data)
    kernel = cpu_native.kernel(loaded, "k_flag", "k_flag", ptrs, 1, 1)
    y = np.zeros(2, np.int64)
    plan = _plan(runner, [_copy(y, x), kernel])
    with pytest.raises(InvalidArgument, match="kernel k_flag: ") as e:
        plan()
    assert "in instruction #1" in e.value.__notes__
    np.testing.assert_array_equal(y, [3, 0])       # the step before it ran
    x[0] = 0
    plan()                                          # the flag was reset
    assert x[1] == 7


def test_an_unknown_step_fails_as_a_device_error(runner) -> None:
    plan = _plan(runner, [cpu_native.Native([(99, 0, 0, 0, 0, 0, 0, 0)])])
    with pytest.raises(DeviceError, match="native plan: step 0") as e:
        plan()
    assert "in instruction #0" in e.value.__notes__


def test_a_closed_kernel_library_refuses_the_plan(cpu, runner) -> None:
    loaded = cpu.libraries.c_library(FLAG_SOURCE, ["k_flag"])
    x = np.zeros(2, np.int64)
    ptrs = (ctypes.c_void_p * 1)(x.ctypes.data)
    plan = _plan(runner, [cpu_native.kernel(loaded, "k_flag", "k_flag", ptrs, 1, 1)])
    loaded.close()
    with pytest.raises(InvalidArgument, match="closed"):
        plan()


@pytest.mark.parametrize("queue", ["c", "python"])
def test_a_convnet_runs_its_plan_natively_from_the_second_run(monkeypatch, queue: str) -> None:
    """No checker: from the second run the plan's oneDNN calls, kernels and copies run from
    the C loop (called by the stream's queue in C, or from its Python worker), each run
    matches eager, and oneDNN's counters count every call."""
    monkeypatch.setenv("AOTRT_CHECK_HAZARDS", "0")
    calls: list[int] = []
    real = cpu_native.NativePlan.__call__

    def counted(self) -> None:
        calls.append(self.steps)
        real(self)
    monkeypatch.setattr(cpu_native.NativePlan, "__call__", counted)
    pushed: list[tuple[int, int]] = []
    real_push = cpu_queue.NativeQueue.push

    def push(self, kind, ptrs=None, n=0, threads=1, wait=0):
        pushed.append((kind, n))
        return real_push(self, kind, ptrs, n, threads, wait)
    monkeypatch.setattr(cpu_queue.NativeQueue, "push", push)
    if queue == "python":
        monkeypatch.setattr(get_device("cpu").libraries, "native_queue", lambda: None)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.SiLU(),
                            torch.nn.Upsample(scale_factor=2), torch.nn.Conv2d(8, 4, 1),
                            torch.nn.Flatten(), torch.nn.Linear(4 * 16 * 16, 5)).eval()
    x = torch.randn(1, 3, 8, 8)
    prog = aotrt.export(m, (x,), layout="channels_last")
    with aotrt.load(prog, device="cpu") as d:
        dnnl = d.device.libraries.dnnl
        per_run = []
        for i in range(3):
            xi = torch.randn(1, 3, 8, 8)
            before = None if dnnl is None else dnnl.stats["runs"]
            del pushed[:]
            (out,) = d.run(xi.numpy())
            got = np.asarray(out)
            per_run.append(list(pushed))
            with torch.no_grad():
                ref = m.double()(xi.double()).numpy()
                m.float()
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
            if dnnl is not None:
                assert dnnl.stats["runs"] - before >= 2     # two convolutions at least
        plan = d._static_io.native
    assert plan.steps > 0
    if queue == "python":
        assert calls == [plan.steps, plan.steps] and per_run == [[], [], []]
        return
    # The first run sets up in Python; later runs queue the plan's segments as native jobs
    # (numpy's ops, such as a small linear or every op without oneDNN, as Python jobs), then
    # the output copy as one more.
    jobs = [(cpu_queue.NATIVE, j.n) if isinstance(j, cpu_native.Segment)
            else (cpu_queue.PYTHON, 0) for j in plan.jobs]
    assert calls == []
    assert (cpu_queue.PYTHON, 0) in per_run[0]
    assert sum(n for kind, n in jobs if kind == cpu_queue.NATIVE) == plan.steps
    assert per_run[1] == per_run[2] == [*jobs, (cpu_queue.NATIVE, 1)]
