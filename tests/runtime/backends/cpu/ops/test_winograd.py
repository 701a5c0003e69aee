"""The cpu device's Winograd convolution (aotrt/runtime/backends/cpu/ops/winograd.py): which
convolutions it takes, the weight transform, and whole programs through it against float64
torch, in the Python and the native plan paths."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pytest

import aotrt
from aotrt.errors import CompileError, InvalidArgument
from aotrt.runtime.device import get_device
from aotrt.runtime.backends.cpu import dnnl as cpu_dnnl
from aotrt.runtime.backends.cpu.ops import winograd as cpu_winograd

torch = pytest.importorskip("torch")
from tests.exporter.harness import rel_err  # noqa: E402 - needs torch


@pytest.fixture
def dnnl(monkeypatch: pytest.MonkeyPatch) -> object:
    """The cpu device's oneDNN state, taking any matmul implementation for the Winograd
    GEMMs: without AVX-512, oneDNN 3.2 gives them its gemm:jit, not brgemm, and Winograd
    would never run on such a CPU (the transforms are what these tests check). Skips where
    onednn-cpu-gomp is not installed."""
    if cpu_dnnl.find_library() is None:
        pytest.skip(f"{cpu_dnnl.DIST} is not installed")
    monkeypatch.setattr(cpu_dnnl, "FAST_MATMUL", ("",))
    d = get_device("cpu").libraries.dnnl
    assert d is not None, "onednn-cpu-gomp is installed but the device did not load it"
    return d


class _IntoCat(torch.nn.Module):
    """A 3x3 convolution whose output is a channel slice of a concatenation."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = torch.nn.Conv2d(16, 16, 1)
        self.conv = torch.nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pre(x)
        return torch.cat([self.conv(y), y], 1)


class _Block(torch.nn.Module):
    """A 1x1 convolution (so the 3x3 one reads a channels-last activation), then a 3x3 one
    with the given padding and epilogue."""

    def __init__(self, c: int, o: int, padding: int, bias: bool, epilogue: str,
                 positive: bool = False) -> None:
        super().__init__()
        self.pre = torch.nn.Conv2d(c, c, 1)
        self.conv = torch.nn.Conv2d(c, o, 3, padding=padding, bias=bias)
        self.epilogue = epilogue
        if positive:        # an infinity then stays one (mixed signs make it a NaN)
            with torch.no_grad():
                for q in self.parameters():
                    q.abs_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pre(x)
        z = self.conv(y)
        if self.epilogue in ("residual", "residual_relu"):
            z = z + y
        if self.epilogue in ("relu", "residual_relu"):
            z = torch.relu(z)
        if self.epilogue == "relu6":
            z = torch.nn.functional.relu6(z)
        if self.epilogue == "silu":
            z = torch.nn.functional.silu(z)
        return z


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


_PROGRAM_CASES = [
    # (channels in, out, size, batch, padding, bias, epilogue)
    (16, 32, 28, 1, 1, True, "none"),
    (32, 16, 29, 2, 1, False, "relu"),           # partial tiles at the edges, a batch
    (16, 16, 30, 1, 0, True, "relu6"),           # no padding
    (16, 16, 27, 1, 2, True, "relu"),            # padding 2
    (16, 16, 27, 1, 1, True, "residual_relu"),   # the residual in the epilogue
    (32, 32, 28, 1, 1, True, "residual"),
    (16, 32, 20, 1, 1, True, "silu"),
]


# The CI slice runs each case with one tile, F(2) and F(4) in turn; the other seven (about
# 10 s on 2 cores) are slow.
@pytest.mark.parametrize("case,tile", [
    pytest.param(c, t, id=f"case{i}-{t}", marks=[] if k == i % 2 else [pytest.mark.slow])
    for i, c in enumerate(_PROGRAM_CASES) for k, t in enumerate([2, 4])])
def test_programs_through_winograd_match_float64(dnnl, monkeypatch, tile, case) -> None:
    monkeypatch.setattr(cpu_winograd, "MIN_TILES", {4: 1, 2: 1})
    c, o, size, n, padding, bias, epilogue = case
    if epilogue.startswith("residual"):
        o = c
    torch.manual_seed(sum(case[:4]) + tile)
    m = _Block(c, o, padding, bias, epilogue).eval()
    x = torch.randn(n, c, size, size)
    prog = aotrt.export(m, (x,), layout="channels_last")
    with torch.no_grad():
        ref = m.double()(x.double()).numpy()
        eager = m.float()(x).numpy()
    before = dnnl.stats["winograd"]
    with aotrt.load(prog, device="cpu", fp32_math=aotrt.Fp32Math(conv_winograd=tile)) as d:
        for _ in range(2):
            got = np.asarray(d.run(x.numpy())[0])
    assert dnnl.stats["winograd"] - before == 2
    # F(4, 3)'s transforms round: its error is about ten times the direct convolution's
    bound = max(_rel(eager, ref), 1e-7) * (40 if tile == 4 else 10)
    assert _rel(got, ref) <= bound


def test_a_nan_reaches_exactly_the_outputs_whose_window_holds_it(dnnl, monkeypatch) -> None:
    monkeypatch.setattr(cpu_winograd, "MIN_TILES", {4: 1, 2: 1})
    torch.manual_seed(3)
    conv = torch.nn.Conv2d(16, 16, 3, padding=1).eval()
    m = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 1), conv).eval()
    x = torch.randn(1, 16, 12, 12)
    prog = aotrt.export(m, (x,), layout="channels_last")
    x[0, :, 5, 6] = float("nan")
    with torch.no_grad():
        ref = m(x).numpy()
    for tile in (2, 4):
        before = dnnl.stats["winograd"]
        with aotrt.load(prog, device="cpu", fp32_math=aotrt.Fp32Math(conv_winograd=tile)) as d:
            got = np.asarray(d.run(x.numpy())[0])
        assert dnnl.stats["winograd"] - before == 1
        # A Winograd tile mixes its whole input patch; the tiles holding the NaN are
        # computed directly, so the NaNs are the direct convolution's, no more.
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        assert np.isnan(ref).sum() == 16 * 9
        finite = ~np.isnan(ref)
        np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tile", [2, 4])
def test_a_non_finite_value_anywhere_in_a_tile_is_found(dnnl, monkeypatch, tile) -> None:
    """Each pixel of a 12x12 image in turn, NaN, +inf and -inf: the kernel checks only a
    tile's corner outputs, which every element of its input patch must reach."""
    monkeypatch.setattr(cpu_winograd, "MIN_TILES", {4: 1, 2: 1})
    torch.manual_seed(4)
    m = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 1), torch.nn.Conv2d(16, 16, 3, padding=1))
    with torch.no_grad():
        for q in m.parameters():
            q.abs_()            # an infinity stays one, and +inf - inf in a tile is a NaN
    x = torch.randn(1, 16, 12, 12)
    prog = aotrt.export(m.eval(), (x,), layout="channels_last")
    before = dnnl.stats["winograd"]
    with aotrt.load(prog, device="cpu", fp32_math=aotrt.Fp32Math(conv_winograd=tile)) as d:
        for k in range(12 * 12 * 3):
            xs = x.clone()
            xs[0, :, k // 36, k // 3 % 12] = (float("nan"), float("inf"), float("-inf"))[k % 3]
            with torch.no_grad():
                ref = m(xs).numpy()
            got = np.asarray(d.run(xs.numpy())[0])
            with np.errstate(invalid="ignore"):
                assert rel_err(got, ref) < 1e-5, (k // 36, k // 3 % 12, k % 3)
    assert dnnl.stats["winograd"] - before == 12 * 12 * 3


def test_the_issues_module_gives_torchs_nans_with_all_defaults(dnnl) -> None:
    """Issue 34's case: 256 NaNs where torch has 144, with every default."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 1), torch.nn.Conv2d(16, 16, 3, padding=1),
                            torch.nn.ReLU()).eval()
    x = torch.randn(1, 16, 32, 32)
    prog = aotrt.export(m, (x,))
    x[0, :, 10, 13] = float("nan")
    with torch.no_grad():
        ref = m(x).numpy()
    before = dnnl.stats["winograd"]
    with aotrt.load(prog, device="cpu") as d:
        got = np.asarray(d.run(x.numpy())[0])
    assert dnnl.stats["winograd"] - before == 1
    assert np.isnan(got).sum() == np.isnan(ref).sum() == 144
    assert rel_err(got, ref) < 1e-5


#: where the non-finite pixel goes in each image of the batch: beside the padding (a corner,
#: an edge), on a tile's corner, inside a tile, at the last row and column
_PIXELS = [(0, 0), (4, 3), (10, 13), (-1, 7), (5, -1), (-1, -1)]


_NON_FINITE_CASES = [
    # (size, batch, padding, Fp32Math.conv_winograd or None (the default), epilogue,
    #  positive weights, the tile that runs)
    (32, 1, 1, None, "relu", False, 4),
    (56, 2, 1, None, "none", True, 4),
    (30, 2, 1, None, "residual_relu", True, 4),      # partial tiles at the edges
    (34, 1, 0, None, "silu", True, 4),               # no padding
    (14, 2, 1, None, "relu6", True, 2),              # 49 tiles of 2: F(2) by default
    (15, 1, 1, 2, "residual", True, 2),              # F(2), partial tiles
    (32, 2, 2, 2, "silu", False, 2),                 # padding 2
]
_NON_FINITE = [float("nan"), float("inf"), float("-inf")]
_BUILT: dict[tuple, tuple[torch.nn.Module, torch.Tensor, aotrt.Program]] = {}


@pytest.fixture(scope="module", autouse=True)
def _forget_built() -> Iterator[None]:
    """The programs go with this module's tests."""
    yield
    _BUILT.clear()


def _built(case: tuple) -> tuple[torch.nn.Module, torch.Tensor, aotrt.Program]:
    """The case's block, input and program, exported once for its three values."""
    if case not in _BUILT:
        size, n, padding, _, epilogue, positive, _ = case
        torch.manual_seed(size + n)
        m = _Block(16, 16, padding, True, epilogue, positive).eval()
        x = torch.randn(n, 16, size, size)
        if positive:
            x = x.abs()
        _BUILT[case] = m, x, aotrt.export(m, (x,))
    return _BUILT[case]


# The CI slice takes one value per case, each value in turn (nan, inf, -inf: every branch
# below); the other 14 pairs (about 25 s on 2 cores) are marked slow.
@pytest.mark.parametrize("case,value", [
    pytest.param(c, v, id=f"case{i}-{v}", marks=[] if j == i % 3 else [pytest.mark.slow])
    for i, c in enumerate(_NON_FINITE_CASES) for j, v in enumerate(_NON_FINITE)])
def test_non_finite_inputs_give_torchs_outputs(dnnl, monkeypatch, case, value) -> None:
    """A NaN, +inf or -inf pixel: the same NaNs and infinities (signs included) as torch
    eager, every other output finite and float32-close, through Winograd's tiles."""
    size, n, padding, tile, epilogue, positive, runs = case
    m, x, prog = _built(case)
    tiles: list[int] = []
    chosen = cpu_winograd.tile_for

    def spy(out: object, t: int) -> int:
        tiles.append(chosen(out, t))
        return tiles[-1]
    monkeypatch.setattr(cpu_winograd, "tile_for", spy)
    fp32 = aotrt.Fp32Math() if tile is None else aotrt.Fp32Math(conv_winograd=tile)
    with aotrt.load(prog, device="cpu", fp32_math=fp32) as d:
        assert tiles == [runs]
        for k, (i, j) in enumerate(_PIXELS):
            xs = x.clone()
            xs[k % n, :, i, j] = value
            with torch.no_grad():
                ref = m(xs).numpy()
            before = dnnl.stats["winograd"]
            got = np.asarray(d.run(xs.numpy())[0])
            assert dnnl.stats["winograd"] - before == 1
            if positive and np.isinf(value) and epilogue in ("none", "residual"):
                assert np.isinf(ref).any(), "positive weights keep the infinity"
            elif not np.isinf(value):
                assert np.isnan(ref).any()
            np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), f"{(i, j)}")
            np.testing.assert_array_equal(got[np.isinf(ref)], ref[np.isinf(ref)])
            finite = np.isfinite(ref)
            np.testing.assert_allclose(got[finite], ref[finite], rtol=1e-4, atol=1e-4)
            with np.errstate(invalid="ignore"):      # inf - inf, outside rel_err's mask
                assert rel_err(got, ref) < 1e-5


def test_the_direct_convolution_runs_where_winograd_is_off(dnnl) -> None:
    m = _Block(16, 16, 1, True, "none").eval()
    x = torch.randn(1, 16, 28, 28)
    prog = aotrt.export(m, (x,), layout="channels_last")
    before = dnnl.stats["winograd"]
    with aotrt.load(prog, device="cpu", fp32_math=aotrt.Fp32Math(conv_winograd=0)) as d:
        d.run(x.numpy())
    assert dnnl.stats["winograd"] == before


def test_without_a_compiler_the_direct_convolution_runs(dnnl, monkeypatch) -> None:
    def no_compiler() -> None:
        raise CompileError("cc: not found")
    monkeypatch.setattr(get_device("cpu").libraries.winograd, "library", no_compiler)
    m = _Block(16, 16, 1, True, "relu").eval()
    x = torch.randn(1, 16, 28, 28)
    prog = aotrt.export(m, (x,), layout="channels_last")
    before = dnnl.stats["winograd"]
    with aotrt.load(prog, device="cpu") as d:
        got = np.asarray(d.run(x.numpy())[0])
    assert dnnl.stats["winograd"] == before
    with torch.no_grad():
        np.testing.assert_allclose(got, m(x).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("what", ["stride", "groups", "channels", "nchw", "dilation",
                                  "cat_slice"])
def test_what_winograd_does_not_take(dnnl, what) -> None:
    conv = {"stride": torch.nn.Conv2d(16, 16, 3, stride=2, padding=1),
            "groups": torch.nn.Conv2d(16, 16, 3, padding=1, groups=2),
            "channels": torch.nn.Conv2d(16, 24, 3, padding=1),
            "nchw": torch.nn.Conv2d(16, 16, 3, padding=1),
            "dilation": torch.nn.Conv2d(16, 16, 3, padding=2, dilation=2),
            "cat_slice": None}[what]
    m = (_IntoCat() if conv is None
         else torch.nn.Sequential(torch.nn.Conv2d(16, 16, 1), conv)).eval()
    x = torch.randn(1, 16, 28, 28)
    layout = "contiguous" if what == "nchw" else "channels_last"
    prog = aotrt.export(m, (x,), layout=layout)
    before = dnnl.stats["winograd"]
    with aotrt.load(prog, device="cpu", fp32_math=aotrt.Fp32Math(conv_winograd=4)) as d:
        got = np.asarray(d.run(x.numpy())[0])
    assert dnnl.stats["winograd"] == before
    with torch.no_grad():
        np.testing.assert_allclose(got, m(x).numpy(), rtol=1e-4, atol=1e-4)


def test_the_tile_follows_the_output_size() -> None:
    class Out:
        def __init__(self, h: int, w: int) -> None:
            self.sizes = (1, 64, h, w)

    assert cpu_winograd.tile_for(Out(56, 56), 4) == 4
    assert cpu_winograd.tile_for(Out(56, 56), 2) == 2
    assert cpu_winograd.tile_for(Out(14, 14), 4) == 2     # 16 tiles of 4: too few
    assert cpu_winograd.tile_for(Out(7, 7), 4) == 0
    assert cpu_winograd.tile_for(Out(56, 56), 0) == 0


def test_transformed_weights_give_the_direct_convolution() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 16, 3, 3))
    d = rng.standard_normal((16, 6, 6))
    direct = np.stack([[np.einsum("ocab,cab->o", w, d[:, i:i + 3, j:j + 3])
                        for j in range(4)] for i in range(4)])            # (4, 4, O)
    bt, at = np.asarray(cpu_winograd.BT[4], float), np.asarray(cpu_winograd.AT[4], float)
    u = cpu_winograd.transformed_weights(w, 4).astype(np.float64).reshape(6, 6, 16, 32)
    v = np.einsum("ia,cab,jb->ijc", bt, d, bt)
    y = np.einsum("ai,ijo,bj->abo", at, np.einsum("ijc,ijco->ijo", v, u), at)
    # U is rounded to float32 once: the result is float32-close, not exact
    assert np.linalg.norm(y - direct) <= 1e-6 * np.linalg.norm(direct)


@pytest.mark.parametrize("bad", [3, 1, -2, True, "4", None])
def test_fp32math_refuses_other_tiles(bad) -> None:
    with pytest.raises(InvalidArgument, match="conv_winograd"):
        aotrt.Fp32Math(conv_winograd=bad)
