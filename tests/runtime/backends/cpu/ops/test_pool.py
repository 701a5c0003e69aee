"""The cpu device's compiled max pooling (values only): it matches torch in every layout and
dtype, with NaN, -inf and padding-only windows, and it is the path the cpu device takes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aotrt.runtime.ops import max_pool2d
from aotrt.runtime.backends.cpu.ops import pool as cpu_pool

CASES = [
    # kernel, stride, padding, dilation, ceil_mode
    ([3, 3], [2, 2], [1, 1], [1, 1], False),   # ResNet stem
    ([5, 5], [1, 1], [2, 2], [1, 1], False),   # YOLO SPPF
    ([2, 2], [2, 2], [0, 0], [1, 1], True),
    ([3, 2], [2, 3], [1, 0], [2, 1], True),    # dilated: masked taps
    ([2, 3], [1, 2], [1, 1], [3, 2], False),
]


@pytest.fixture
def compiled(monkeypatch):
    """How many max pools the compiled kernel took, and how many fell back."""
    taken = {"compiled": 0, "numpy": 0}
    real = cpu_pool.compiled_max_pool

    def counting(out, x, p):
        work = real(out, x, p)
        taken["compiled" if work is not None else "numpy"] += 1
        return work

    monkeypatch.setattr(cpu_pool, "compiled_max_pool", counting)
    return taken


def _check(kit, stream, x_np, kernel, stride, padding, dilation, ceil_mode, layout):
    ref = torch.ops.aten.max_pool2d_with_indices(
        torch.from_numpy(x_np.astype(np.float32)), kernel, stride, padding, dilation,
        ceil_mode)[0].numpy()
    out = kit.out(ref.shape, str(x_np.dtype), layout)
    max_pool2d(stream, out, kit.tensor(x_np, layout), kernel, stride, padding, dilation,
               ceil_mode)
    np.testing.assert_array_equal(kit.read(out).astype(np.float32), ref)


DTYPES = ("float32", "bfloat16", "float16")
LAYOUTS = ("channels_last", "packed", "offset", "transposed")


# Each is a kernel of its own to compile: the CI slice keeps a Latin square, dtype (layout +
# case) % 3, in which every case meets every layout and every layout every dtype; the other
# two thirds (about 12 s on 2 cores) are slow.
@pytest.mark.parametrize("case,layout,dtype", [
    pytest.param(c, lay, dt, id=f"{c}-{lay}-{dt}",
                 marks=[] if d == (j + c) % 3 else [pytest.mark.slow])
    for c in range(len(CASES)) for j, lay in enumerate(LAYOUTS) for d, dt in enumerate(DTYPES)])
def test_values_match_torch(kit, stream, compiled, dtype, layout, case):
    x = kit.randn((2, 19, 11, 10), dtype)     # 19 channels: a vector body and a tail
    x[0, 3, 0, :] = -np.inf
    x[1, 5, 4, 4] = np.nan
    x[1, 18, 7, 2] = np.nan
    _check(kit, stream, x, *CASES[case], layout)
    if stream.device.name == "cpu":
        assert compiled == {"compiled": 1, "numpy": 0}


def test_windows_of_padding_only_are_minus_inf(kit, stream, compiled):
    # Dilation can make a window miss the plane: its value is -inf, never a clamped tap.
    _check(kit, stream, kit.randn((1, 2, 1, 3), "float32"), [2, 2], [1, 1], [1, 1], [2, 3],
           False, "packed")
    if stream.device.name == "cpu":
        assert compiled["compiled"] == 1


def test_unbatched_input(kit, stream, compiled):
    _check(kit, stream, kit.randn((4, 9, 9), "float32"), [3, 3], [2, 2], [1, 1], [1, 1],
           True, "packed")
    if stream.device.name == "cpu":
        assert compiled["compiled"] == 1


def test_a_window_over_max_taps_falls_back_and_matches(kit, stream, compiled):
    k = 9                                     # 81 taps > MAX_TAPS
    assert k * k > cpu_pool.MAX_TAPS
    _check(kit, stream, kit.randn((1, 3, 12, 12), "float32"), [k, k], [1, 1], [4, 4],
           [1, 1], False, "channels_last")
    if stream.device.name == "cpu":
        assert compiled == {"compiled": 0, "numpy": 1}


def test_an_output_over_its_input_falls_back(kit, stream, compiled):
    x_np = kit.randn((3, 2, 6, 6), "float32")
    x = kit.tensor(x_np)
    out = kit.view(x, [3, 2, 3, 3], [18, 9, 3, 1], 72)   # lands on x's second sample
    max_pool2d(stream, out, x, [2, 2], [], [0, 0], [1, 1], False)
    ref = torch.nn.functional.max_pool2d(torch.from_numpy(x_np), 2)
    np.testing.assert_array_equal(kit.read(out), ref.numpy())
    if stream.device.name == "cpu":
        assert compiled == {"compiled": 0, "numpy": 1}


def test_undilated_windows_are_not_masked():
    # The vectorisable form: no select on a tap's bounds where every window meets the plane.
    from aotrt.kernels import ir
    from aotrt.runtime.ops.pool import PoolParams

    def kernel(dilation):
        p = PoolParams((3, 3), (2, 2), (1, 1), dilation, (4, 4))
        return cpu_pool.max_pool_kernel(((1, 8, 8, 8), (512, 1, 64, 8)),
                                        ((1, 8, 4, 4), (128, 1, 32, 8)), "float32", p)

    def selects(k):
        return sum(1 for e in ir.walk(list(k.stores)) if isinstance(e, ir.Op)
                   and e.op == "where" and e.args[0].dtype == "bool"
                   and isinstance(e.args[2], ir.Const))

    assert selects(kernel((1, 1))) == 0
    assert selects(kernel((2, 2))) == 9
    assert kernel((1, 1)).shape == (1, 4, 4, 8)    # channels innermost
