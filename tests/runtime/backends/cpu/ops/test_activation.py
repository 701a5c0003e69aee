"""The cpu device's in-place relu and relu6 after a oneDNN convolution
(aotrt/runtime/backends/cpu/ops/activation.py): the views it takes, NaN and -0.0 kept as in torch,
and whole programs through it, in the Python and the native plan paths."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import aotrt
from aotrt.errors import CompileError
from aotrt.runtime.device import get_device
from aotrt.runtime.backends.cpu.ops import activation as cpu_activation
from aotrt.runtime.backends.cpu.ops import winograd as cpu_winograd

torch = pytest.importorskip("torch")


def _view(sizes, strides) -> SimpleNamespace:
    return SimpleNamespace(sizes=sizes, strides=strides)


def test_a_dense_view_is_one_row() -> None:
    assert cpu_activation.geometry(_view((2, 8, 5, 6), (240, 1, 48, 8))) == ([], [], 480)


def test_a_channel_slice_is_rows_of_its_channels() -> None:
    # 8 channels of a 24-channel NHWC buffer: 5 * 6 rows of 8, 24 apart
    assert cpu_activation.geometry(_view((1, 8, 5, 6), (720, 1, 144, 24))) == \
        ([30], [24], 8)


def test_dims_of_one_are_dropped_and_no_unit_stride_gives_rows_of_one() -> None:
    assert cpu_activation.geometry(_view((1, 3, 1, 4), (99, 9, 7, 2))) == ([3, 4], [9, 2], 1)
    # contiguous across: merged
    assert cpu_activation.geometry(_view((3, 4), (8, 2))) == ([12], [2], 1)


@pytest.mark.parametrize("strides", [(0, 1), (-1, 1)])
def test_a_broadcast_or_reversed_view_is_refused(strides) -> None:
    assert cpu_activation.geometry(_view((3, 4), strides)) is None


def test_too_many_dims_are_refused() -> None:
    sizes = (2,) * (cpu_activation.MAX_DIMS + 2)
    strides = tuple(4 ** (len(sizes) - i) for i in range(len(sizes)))
    assert cpu_activation.geometry(_view(sizes, strides)) is None


def _special(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    a = (rng.standard_normal(shape) * 5).astype(np.float32)
    flat = a.reshape(-1)
    flat[::7] = np.nan
    flat[3::11] = -0.0
    flat[5::13] = np.inf
    flat[6::17] = -np.inf
    return a


def _torch(a: np.ndarray, activation: str) -> np.ndarray:
    f = torch.relu if activation == "relu" else torch.nn.functional.relu6
    return f(torch.from_numpy(a.copy())).numpy()


@pytest.mark.parametrize("activation", ["relu", "relu6"])
@pytest.mark.parametrize("layout", ["channels_last", "channel_slice", "nchw", "long_row"])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_pass_is_torch_bit_for_bit(kit, stream, activation, layout, threads) -> None:
    if kit.dev.name != "cpu":
        pytest.skip("a cpu kernel")
    rng = np.random.default_rng(7)
    if layout == "long_row":        # several work items in one merged row
        shape = (1, 16, 3, cpu_activation.CHUNK // 16 + 5)
    else:
        shape = (2, 8, 5, 6)
    a = _special(rng, shape)
    if layout == "channel_slice":
        wide = kit.tensor(np.concatenate([a, a], 1), "channels_last")
        h = kit.view(wide, shape, (wide.strides[0], 1, wide.strides[2], wide.strides[3]),
                     wide.byte_offset)
    else:
        h = kit.tensor(a, "packed" if layout == "nchw" else "channels_last")
    ran: list[int] = []
    work = kit.dev.libraries.activation.after(lambda: ran.append(1), h, activation)
    assert work is not None
    kit.dev.worker.threads = threads
    try:
        work()
    finally:
        del kit.dev.worker.threads
    assert ran == [1]
    got, ref = kit.read(h), _torch(a, activation)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_array_equal(got[ok], ref[ok])
    np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(ref[ok]))   # -0.0 kept


def test_views_it_does_not_take_get_none(kit) -> None:
    if kit.dev.name != "cpu":
        pytest.skip("a cpu kernel")
    h = kit.tensor(np.ones((2, 3), np.float32))
    assert kit.dev.libraries.activation.after(lambda: None, h, "silu") is None
    half = kit.tensor(np.ones((2, 3), np.float16))
    assert kit.dev.libraries.activation.after(lambda: None, half, "relu") is None


class _ConvAct(torch.nn.Module):
    """A strided convolution (oneDNN's direct one, never Winograd) and an activation."""

    def __init__(self, activation: str, residual: bool) -> None:
        super().__init__()
        self.pre = torch.nn.Conv2d(16, 16, 1)
        self.conv = torch.nn.Conv2d(16, 16, 3, stride=2, padding=1)
        self.down = torch.nn.Conv2d(16, 16, 1, stride=2)
        self.act = torch.relu if activation == "relu" else torch.nn.functional.relu6
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pre(x)
        z = self.conv(y)
        if self.residual:
            z = z + self.down(y)
        return self.act(z)


@pytest.mark.parametrize("activation", ["relu", "relu6"])
@pytest.mark.parametrize("residual", [False, True])
def test_a_program_keeps_the_nans_torch_gives(dnnl, activation, residual) -> None:
    """Through a loaded program (the first run from Python, the next ones native), a NaN in
    the input is NaN in the output wherever it is in torch's, and the pass ran each time."""
    torch.manual_seed(11)
    m = _ConvAct(activation, residual).eval()
    x = torch.randn(1, 16, 14, 14) * 3
    prog = aotrt.export(m, (x,), layout="channels_last")
    x[0, 2, 6, 7] = float("nan")
    with torch.no_grad():
        ref = m(x).numpy()
    assert np.isnan(ref).any()
    before = dnnl.stats["activations"]
    with aotrt.load(prog, device="cpu") as d:
        for _ in range(3):
            got = np.asarray(d.run(x.numpy())[0])
            np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
            ok = ~np.isnan(ref)
            np.testing.assert_allclose(got[ok], ref[ok], rtol=1e-4, atol=1e-4)
    assert dnnl.stats["activations"] - before == 3


def test_without_a_compiler_numpy_applies_it(dnnl, monkeypatch) -> None:
    def no_compiler() -> None:
        raise CompileError("cc: not found")
    monkeypatch.setattr(get_device("cpu").libraries.activation, "library", no_compiler)
    monkeypatch.setattr(cpu_winograd, "MIN_TILES", {4: 10 ** 9, 2: 10 ** 9})
    m = _ConvAct("relu", False).eval()
    x = torch.randn(1, 16, 14, 14)
    prog = aotrt.export(m, (x,), layout="channels_last")
    x[0, 2, 6, 7] = float("nan")
    before = dnnl.stats["activations"]
    with aotrt.load(prog, device="cpu") as d:
        got = np.asarray(d.run(x.numpy())[0])
    assert dnnl.stats["activations"] == before
    with torch.no_grad():
        ref = m(x).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
