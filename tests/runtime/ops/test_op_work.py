"""Library ops declare their work to the load-time budget, and a file cannot buy python steps.

Issue 34 item 1: a kilobyte file with one max_pool2d of a 2**28-tap window passed
`Program.load` and its run sat in a python loop over the taps for minutes. Every op's cost
(`ops.check`) counts its multiply-adds, window taps, sort steps and python loop steps in the
one `max_work` budget, an op over it is refused by name, the cpu paths loop in python over
a bounded count only (counted here with a profiler, deterministically), and geometry params
at their extremes are refused naming the param.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Callable, Sequence

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from aotrt.errors import ProgramError
from aotrt.limits import Limits
from aotrt.program import Program
from aotrt.runtime.ops import OPS, pool, upsample
from aotrt.runtime.backends.cpu.ops import conv as cpu_conv
from aotrt.runtime.backends.cpu.ops import max_pool as cpu_max_pool
from aotrt.runtime.backends.cpu.ops import pool as cpu_pool
from aotrt.runtime.backends.cpu.ops import upsample as cpu_upsample
from aotrt.runtime.ops._common import View
from aotrt import dtypes

BIG = 1 << 14
#: python lines a bounded cpu path may run (np.pad alone runs a few hundred; the loops over
#: taps or phases that a file could size ran 3,200 to 100,000 here)
STEPS = 1000


def view(root: str, index: int, sizes: Sequence[int], strides: Sequence[int] | None = None,
         dtype: str = "float32") -> dict[str, Any]:
    """A tensor entry of the program document (row-major strides by default)."""
    if strides is None:
        strides = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
    return {"root": "arena" if root == "arena" else root, "index": index, "byte_offset": 0,
            "dtype": dtype, "sizes": list(sizes), "strides": list(strides)}


def one_op(fn: str, outs: list[dict], ins: list[dict | None], params: dict) -> Program:
    """A program whose instruction 0 is library op `fn` on stride-0 views of a one-element
    input (`ins`) into the arena (`outs`), and whose output is written by a copy."""
    tensors = [view("output", 0, [1]), view("arena", 0, [1])]
    ids: list[list[int | None]] = [[], []]
    for k, group in enumerate((outs, ins)):
        for t in group:
            if t is None:
                ids[k].append(None)
                continue
            ids[k].append(len(tensors))
            tensors.append(t)
    arena = max([64] + [8 * math.prod(t["sizes"]) + 64 for t in outs])
    spec = {"name": "x", "dtype": "float32", "shape": [1], "strides": [1]}
    lib = {"op": "library", "fn": fn, "outs": ids[0], "ins": ids[1], "params": params}
    return Program(inputs=[spec], outputs=[dict(spec, name="out")], arena_nbytes=arena,
                   tensors=tensors, instructions=[lib, {"op": "copy", "dst": 0, "src": 1}],
                   outputs_tensors=[0])


def x0(*sizes: int, dtype: str = "float32") -> dict[str, Any]:
    """A view of the one-element input seen as `sizes` (all strides 0)."""
    return view("input", 0, sizes, [0] * len(sizes), dtype)


def a(*sizes: int, dtype: str = "float32") -> dict[str, Any]:
    """A dense arena view (an output)."""
    return view("arena", 0, sizes, dtype=dtype)


# -- the hostile file of the issue ---------------------------------------------------------------


def hostile_pool() -> Program:
    """One max_pool2d whose window is 2**14 x 2**14 = 2**28 taps (the issue's file)."""
    return one_op("max_pool2d", [a(1, 1, 1, 1)], [x0(1, 1, BIG, BIG)],
                  {"kernel_size": [BIG, BIG]})


def test_a_2_28_tap_pool_declares_its_taps_not_a_python_step_each() -> None:
    p = hostile_pool()
    # 2**28 taps, 2**28 input elements and a few python steps: the numpy path reduces the
    # window in one call (it was charged, and run, as 2**28 python steps: 2**38).
    p.validate(Limits(max_work=1 << 30))
    with pytest.raises(ProgramError, match=r"instructions\[0\] \(library\) max_pool2d: work "
                                           r"of this op \(elementary steps\): \d+ exceeds the "
                                           r"load limit max_work=268435456"):
        p.validate(Limits(max_work=1 << 28))


# -- every op: its work is counted and an op over the budget is named ----------------------------

#: per op, a call on stride-0 views whose work is far over 2**40 (shown: the count)
OVER: dict[str, Callable[[], Program]] = {
    # M*N*K = 2**14 * 2**14 * 2**14
    "mm": lambda: one_op("mm", [a(BIG, BIG)], [x0(BIG, BIG), x0(BIG, BIG)], {}),
    "bmm": lambda: one_op("bmm", [a(4, BIG, BIG)], [x0(4, BIG, BIG), x0(4, BIG, BIG)], {}),
    "addmm": lambda: one_op("addmm", [a(BIG, BIG)], [x0(BIG), x0(BIG, BIG), x0(BIG, BIG)], {}),
    "linear": lambda: one_op("linear", [a(BIG, BIG)], [x0(BIG, BIG), x0(BIG, BIG), None], {}),
    # output pixels * taps = 2**14 * 2**28
    "convolution": lambda: one_op("convolution", [a(1, 1, 1, BIG)],
                                  [x0(1, 1, BIG, 2 * BIG - 1), x0(1, 1, BIG, BIG), None], {}),
    # B*Lq*Lk*(E+Ev) = 2**14 * 2**14 * (2**14 + 1)
    "sdpa": lambda: one_op("sdpa", [a(1, BIG, 1)], [x0(1, BIG, BIG), x0(1, BIG, BIG),
                                                    x0(1, BIG, 1), None], {}),
    # a sort of 2**30 rows of 2**14: n log n each
    "topk": lambda: one_op("topk", [a(1 << 16, 1), a(1 << 16, 1, dtype="int64")],
                           [x0(1 << 16, 1 << 28)], {"k": 1}),
    # 2**28 output pixels x 2**20 taps
    "max_pool2d": lambda: one_op("max_pool2d", [a(1, 1, BIG, 1)],
                                 [x0(1, 1, BIG + (1 << 20) - 1, 1 << 10)],
                                 {"kernel_size": [1 << 20, 1 << 10], "stride": [1, 1]}),
    # 2**40 outputs, charged per element (a 4 TiB arena, never allocated here)
    "upsample_nearest2d": lambda: one_op("upsample_nearest2d", [a(1 << 20, 1 << 10, 1 << 10, 1)],
                                         [x0(1 << 20, 1 << 10, 1, 1)],
                                         {"output_size": [1 << 10, 1]}),
}


OVER["linear_wq"] = lambda: one_op(  # M*N*K = 2**42, int8 weights
    "linear_wq", [a(BIG, BIG)], [x0(BIG, BIG), x0(BIG, BIG, dtype="int8"), x0(BIG), None, None],
    {"bits": 8, "group_size": BIG})


def test_every_library_op_has_a_work_case() -> None:
    assert set(OVER) == set(OPS)


@pytest.mark.parametrize("fn", sorted(OVER))
def test_an_op_over_max_work_is_refused_naming_the_instruction_and_the_op(fn: str) -> None:
    p = OVER[fn]()
    lim = Limits(max_work=1 << 40, max_memory_bytes=1 << 50, max_scratch_bytes=1 << 50,
                 max_coverage_bytes=1 << 50)
    with pytest.raises(ProgramError, match=rf"instructions\[0\] \(library\) {fn}: work of "
                                           rf"this op \(elementary steps\): \d+ exceeds the "
                                           rf"load limit max_work=1099511627776") as e:
        p.validate(lim)
    shown = int(str(e.value).split("steps): ")[1].split()[0])
    assert shown > 1 << 40


# -- python steps of the cpu paths do not grow with a file's window or factor ---------------------


def python_steps(fn: Callable[[], Any]) -> int:
    """Python lines `fn` executes on this thread (every loop iteration runs at least one),
    counted by the tracer; numpy's work in C runs none."""
    count = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        count += event == "line"
        return trace

    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


def _pool_ref(x: np.ndarray, k: int, s: int, p: int, d: int) -> np.ndarray:
    """max_pool2d in float64 by sliding windows over the -inf padded input."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)),
                constant_values=-np.inf)
    win = sliding_window_view(xp, (d * (k - 1) + 1,) * 2, axis=(2, 3))
    return win[:, :, ::s, ::s, ::d, ::d].max(axis=(-2, -1))


@pytest.mark.parametrize("k,s,p,d", [(100, 1, 0, 1), (65, 3, 32, 2), (9, 1, 4, 1)])
def test_numpy_pool_of_a_big_window_takes_few_python_steps(k: int, s: int, p: int,
                                                           d: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 140, 140)).astype(np.float32)
    x[0, 1, 70, 70] = np.nan
    x[1, 2, 3, 3] = -np.inf
    ref = _pool_ref(x, k, s, p, d)
    ho = ref.shape[2]
    params, _ = pool.check_max_pool2d(View(dtypes.float32, (2, 3, ho, ho),
                                           (3 * ho * ho, ho * ho, ho, 1)),
                                      View(dtypes.float32, x.shape, (0,) * 4), [k, k], [s, s],
                                      [p, p], [d, d])
    out = np.full(ref.shape, 7.0, np.float32)
    steps = python_steps(lambda: cpu_max_pool._pool(x, out, None, params))
    np.testing.assert_array_equal(out, ref.astype(np.float32))
    assert np.isnan(out[0, 1]).any() and not np.isnan(out[1]).any()
    # A 3x3 window folds its 9 taps in python; 10,000 taps take one reduction.
    assert steps < STEPS, steps


def test_depthwise_convolution_of_a_big_kernel_takes_few_python_steps() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 3, 1, 50, 50)).astype(np.float32)
    w = rng.standard_normal((3, 1, 1, 40, 40)).astype(np.float32)
    ref = (sliding_window_view(x.astype(np.float64), (40, 40), axis=(3, 4))
           * w[:, 0, 0][None, :, None, None, None].astype(np.float64)).sum(axis=(-2, -1))
    got: list[np.ndarray] = []
    steps = python_steps(lambda: cpu_conv._forward(x, w, (1, 1, 1), (0, 0, 0), (1, 1, 1), 3,
                                               (1, 11, 11), lambda a, b, r: got.append(r)))
    np.testing.assert_allclose(got[0], ref, rtol=1e-4, atol=1e-4)
    assert steps < STEPS, steps        # 1600 taps were 3200 python lines


def test_transposed_convolution_of_a_big_kernel_takes_few_python_steps() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 2, 1, 2, 3)).astype(np.float32)
    w = rng.standard_normal((2, 3, 1, 24, 24)).astype(np.float32)
    s, pad = 2, 1
    out_sp = (1, (2 - 1) * s - 2 * pad + 24, (3 - 1) * s - 2 * pad + 24)
    full = np.zeros((1, 3, 1, 2 * s + 24, 3 * s + 24))
    for i in range(2):
        for j in range(3):
            full[0, :, 0, i * s:i * s + 24, j * s:j * s + 24] += np.einsum(
                "c,cokl->okl", x[0, :, 0, i, j].astype(np.float64), w[:, :, 0])
    ref = full[:, :, :, pad:pad + out_sp[1], pad:pad + out_sp[2]]
    got: list[np.ndarray] = []
    steps = python_steps(lambda: cpu_conv._transposed(x, w, (1, s, s), (0, pad, pad), (1, 1, 1),
                                                  out_sp, 1, lambda a, b, r: got.append(r)))
    np.testing.assert_allclose(got[0], ref, rtol=1e-4, atol=1e-4)
    assert steps < STEPS, steps        # 576 taps were 8,700 python lines


@pytest.mark.parametrize("dev", ["cpu"], indirect=True)
def test_upsample_by_a_big_integer_factor_takes_few_python_steps(kit: Any, stream: Any) -> None:
    x = kit.randn((1, 2, 3, 2), "float32")
    hx = kit.tensor(x)
    out = kit.out((1, 2, 3 * 96, 2 * 96), "float32")
    rows = upsample.source_indices(3, 3 * 96, None)
    cols = upsample.source_indices(2, 2 * 96, None)
    stream.synchronize()
    work = cpu_upsample.make_upsample(out, hx, rows, cols)
    steps = python_steps(work)
    np.testing.assert_array_equal(kit.read(out), np.repeat(np.repeat(x, 96, 2), 96, 3))
    assert steps < STEPS, steps        # 96 * 96 phases were 37,000 python lines


def test_pool_kernel_edge_test_is_closed_form() -> None:
    # out = 2**31 - 1 outputs (a stride-0 view) were as many python steps.
    steps = python_steps(lambda: cpu_pool._windows_meet_plane(10 ** 6, 10 ** 6, 3, 1, 1))
    assert steps < 10, steps
    assert cpu_pool._windows_meet_plane(5, 5, 3, 1, 1)
    assert not cpu_pool._windows_meet_plane(5, 5, 3, 1, 3)       # the first window: padding
    assert not cpu_pool._windows_meet_plane(5, 4, 1, 2, 0)       # the last starts past 4


# -- geometry params at their extremes are refused naming the param -------------------------------

H = 1 << 62


def _pool_call(**params: Any) -> Program:
    return one_op("max_pool2d", [a(1, 1, 4, 4)], [x0(1, 1, 8, 8)],
                  {"kernel_size": [2, 2], **params})


def _conv_call(w: Sequence[int] = (1, 1, 3, 3), **params: Any) -> Program:
    return one_op("convolution", [a(1, 1, 6, 6)], [x0(1, 1, 8, 8), x0(*w), None], params)


EXTREMES = [
    (lambda: _pool_call(kernel_size=[0, 2]), "params.kernel_size", ">= 1"),
    (lambda: _pool_call(kernel_size=-1), "params.kernel_size", ">= 1"),
    (lambda: _pool_call(kernel_size=[H, H]), "params.kernel_size", "<= 2147483647"),
    (lambda: _pool_call(kernel_size=[9, 9]), "params.kernel_size", "spans more than the input"),
    (lambda: _pool_call(stride=[0, 1]), "params.stride", ">= 1"),
    (lambda: _pool_call(stride=[-1, 1]), "params.stride", ">= 1"),
    (lambda: _pool_call(stride=H), "params.stride", "<= 2147483647"),
    (lambda: _pool_call(padding=-1), "params.padding", ">= 0"),
    (lambda: _pool_call(padding=H), "params.padding", "<= 2147483647"),
    (lambda: _pool_call(dilation=0), "params.dilation", ">= 1"),
    (lambda: _pool_call(dilation=H), "params.dilation", "<= 2147483647"),
    (lambda: _pool_call(dilation=[8, 8]), "params.kernel_size", "spans more than the input"),
    (lambda: _conv_call(stride=0), "params.stride", ">= 1"),
    (lambda: _conv_call(stride=H), "params.stride", "<= 2147483647"),
    (lambda: _conv_call(padding=-1), "params.padding", ">= 0"),
    (lambda: _conv_call(padding=H), "params.padding", "<= 2147483647"),
    (lambda: _conv_call(dilation=0), "params.dilation", ">= 1"),
    (lambda: _conv_call(dilation=-1), "params.dilation", ">= 1"),
    (lambda: _conv_call(groups=0), "params.groups", ">= 1"),
    (lambda: _conv_call(groups=-1), "params.groups", ">= 1"),
    (lambda: _conv_call(groups=H), "params.groups", "more than the input channels"),
    (lambda: _conv_call(output_padding=-1, transposed=True), "params.output_padding", ">= 0"),
    (lambda: _conv_call(w=(1, 1, 9, 9)), "(library)", "smaller than the dilated kernel 9"),
    (lambda: one_op("upsample_nearest2d", [a(1, 1, 4, 4)], [x0(1, 1, 2, 2)],
                    {"output_size": [H, 4]}), "params.output_size", "at most 2147483647"),
    (lambda: one_op("upsample_nearest2d", [a(1, 1, 4, 4)], [x0(1, 1, 2, 2)],
                    {"output_size": [0, 4]}), "params.output_size", "greater than 0"),
    (lambda: one_op("upsample_nearest2d", [a(1, 1, 4, 4)], [x0(1, 1, 2, 2)],
                    {"scale_factors": [2.0 ** 40, 2.0]}), "params.scale_factors",
     "at most 2147483647"),
    (lambda: one_op("topk", [a(1, 1), a(1, 1, dtype="int64")], [x0(1, 8)], {"k": H}),
     "params.k", "out of range"),
    (lambda: one_op("topk", [a(1, 1), a(1, 1, dtype="int64")], [x0(1, 8)], {"k": -1}),
     "params.k", "out of range"),
    (lambda: one_op("topk", [a(1, 1), a(1, 1, dtype="int64")], [x0(1, 8)],
                    {"k": 1, "dim": H}), "params.dim", "out of range"),
]


@pytest.mark.parametrize("make,field,what", EXTREMES,
                         ids=[f"{i}-{f}" for i, (_, f, _) in enumerate(EXTREMES)])
def test_geometry_params_at_extremes_are_refused_naming_the_param(
        make: Callable[[], Program], field: str, what: str) -> None:
    with pytest.raises(ProgramError) as e:
        make().validate()
    msg = str(e.value)
    assert msg.startswith("instructions[0] (library)") and field in msg.split(": ")[0], msg
    assert what in msg, msg
