"""topk against torch: values exactly, indices valid and pointing at the values (torch
leaves the order of ties unspecified), every layout, and refused inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aotrt.errors import InvalidArgument, Unsupported
from aotrt.runtime.ops import OPS, linear, topk
from aotrt.runtime.device import Device, get_device
from tests.conftest import DEVICES
from tests.runtime.ops.conftest import NP

CUDA = DEVICES[1]

DTYPES = ("float32", "bfloat16", "float16")
LAYOUTS = ("packed", "offset", "strided", "transposed")


#: (device, topk path) pairs: cuda runs each case through both of its kernels, a thread per
#: element (rank) and a thread per row (rows); cpu has one path, so it has one variant (not
#: a second one generated and then skipped)
_PATHS = [pytest.param("cpu", "one", id="cpu"),
          *(pytest.param("cuda", path, id=f"cuda-{path}", marks=CUDA.marks)
            for path in ("rank", "rows"))]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize a test that takes `cuda_kernel` by (dev, path) pairs (see _PATHS), any
    other that takes `dev` by the devices, as conftest does."""
    if "cuda_kernel" in metafunc.fixturenames:
        metafunc.parametrize(("dev", "cuda_kernel"), _PATHS, indirect=True)
    elif "dev" in metafunc.fixturenames:
        metafunc.parametrize("dev", DEVICES, indirect=True)


@pytest.fixture
def dev(request: pytest.FixtureRequest) -> Device:
    """The device of this variant: conftest's `dev` without its own params, which would
    cross every device with every path."""
    return get_device(request.param)


@pytest.fixture
def cuda_kernel(request, kit, monkeypatch):
    """The topk path of this variant, forced on cuda (see _PATHS)."""
    if kit.dev.name != "cuda":
        return request.param
    from aotrt.runtime.backends.cuda.ops import topk as cuda_topk
    if request.param == "rows":
        monkeypatch.setattr(cuda_topk, "RANK_MAX_N", 0)
    return request.param


def _run(kit, stream, x_np, k, dim=-1, largest=True, layout="packed", out_layout="packed"):
    x = kit.tensor(x_np, layout)
    ref = torch.topk(torch.from_numpy(x_np.astype(np.float64)), k, dim, largest)
    dtype = x.dtype.name
    vals, idx = kit.out(tuple(ref.values.shape), dtype, out_layout), kit.out(
        tuple(ref.values.shape), "int64", out_layout)
    topk(stream, vals, idx, x, k, dim, largest, True)
    got_v, got_i = kit.read(vals), kit.read(idx)
    np.testing.assert_array_equal(got_v.astype(np.float64), ref.values.numpy())
    # Indices select the returned values from x.
    if x_np.ndim:
        picked = np.take_along_axis(x_np, got_i, axis=dim)
        np.testing.assert_array_equal(picked.astype(np.float64), got_v.astype(np.float64))
    return got_v, got_i


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("largest", [True, False])
def test_topk_matches_torch(kit, stream, cuda_kernel, dtype, layout, largest):
    x_np = kit.randn((4, 6, 9), dtype)
    for dim, k in ((-1, 3), (1, 6), (0, 1)):
        _run(kit, stream, x_np, k, dim, largest, layout, "strided")


def test_topk_unique_values_give_torch_indices(kit, stream, cuda_kernel):
    x_np = kit.rng.permutation(200).astype(np.float32).reshape(8, 25)
    _, idx = _run(kit, stream, x_np, 7)
    np.testing.assert_array_equal(idx, torch.topk(torch.from_numpy(x_np), 7).indices.numpy())


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_topk_of_one_long_row(kit, stream, cuda_kernel, dtype):
    """RT-DETR's query selection: k 300 of one row of 8400 scores."""
    x_np = kit.randn((1, 8400), dtype)
    x_np[0, ::97] = x_np[0, 5]            # ties among the top values too
    _run(kit, stream, x_np, 300)


def test_topk_ties_are_stable(kit, stream, cuda_kernel):
    x_np = np.array([1, 3, 3, 2, 3, 0], np.float32)
    _, idx = _run(kit, stream, x_np, 4)
    assert idx.tolist() == [1, 2, 4, 3]
    _, idx = _run(kit, stream, x_np, 3, largest=False)
    assert idx.tolist() == [5, 0, 3]


def test_topk_nan_is_largest(kit, stream, cuda_kernel):
    x_np = np.array([1, np.nan, 3, -np.inf, np.inf], np.float32)
    v, idx = _run(kit, stream, x_np, 2)
    assert np.isnan(v[0]) and idx.tolist() == [1, 4]
    v, idx = _run(kit, stream, x_np, 2, largest=False)
    assert idx.tolist() == [3, 0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64"])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_of_the_whole_dim_is_torch_stable_sort(kit, stream, cuda_kernel, dtype, dim, largest):
    # The exporter lowers aten.sort to topk with k = the dim's size: values and indices must
    # equal torch.sort(stable=True) exactly, with ties, -0.0 next to 0.0, and NaN (largest).
    x_np = np.round(kit.rng.standard_normal((6, 40, 5)) * 2)
    if dtype == "int64":
        x_np = x_np.astype(np.int64)
    else:
        x_np[kit.rng.random(x_np.shape) < 0.05] = np.nan
        x_np[kit.rng.random(x_np.shape) < 0.05] = -0.0
        x_np = x_np.astype(NP[dtype])
    x = kit.tensor(x_np, "strided")
    n = x_np.shape[dim]
    shape = x_np.shape
    vals, idx = kit.out(shape, dtype, "transposed"), kit.out(shape, "int64", "offset")
    OPS["topk"](stream, [vals, idx], [x], k=n, dim=dim, largest=largest, sorted=True)
    ref = torch.sort(kit.t64(x_np), dim=dim, descending=largest, stable=True)
    got_v = kit.read(vals).astype(np.float64)
    np.testing.assert_array_equal(got_v, ref.values.numpy())
    np.testing.assert_array_equal(np.signbit(got_v), np.signbit(ref.values.numpy()))
    np.testing.assert_array_equal(kit.read(idx), ref.indices.numpy())


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_topk_integers(kit, stream, cuda_kernel, dtype):
    x_np = kit.rng.integers(-50, 50, size=(5, 7)).astype(dtype)
    x_np[0, 0] = np.iinfo(dtype).min
    _run(kit, stream, x_np, 7, largest=True)
    _run(kit, stream, x_np, 2, dim=0, largest=False)


def test_topk_k_zero_and_empty_dims_record_nothing(kit, stream):
    before = stream.recorded_seq
    _run(kit, stream, kit.randn((3, 4), "float32"), 0)
    _run(kit, stream, np.zeros((3, 0), np.float32), 0)
    _run(kit, stream, np.zeros((0, 5), np.float32), 2, dim=1)
    assert stream.recorded_seq == before


@pytest.mark.parametrize("k", [0, 1])
def test_topk_0d_input_gives_itself(kit, stream, k):
    v, idx = _run(kit, stream, np.array(2.5, np.float32), k, dim=0)
    assert v == 2.5 and idx == 0


def test_topk_of_linear_like_section_5(kit, stream):
    # §5 topk: Linear 64 -> 8 (no bias), topk(2, dim=-1), values; in bf16 and f32.
    for dtype in ("float32", "bfloat16"):
        x_np, w_np = kit.randn((4, 64), dtype), kit.randn((8, 64), dtype)
        h = kit.out((4, 8), dtype)
        linear(stream, h, kit.tensor(x_np), kit.tensor(w_np))
        vals, idx = kit.out((4, 2), dtype), kit.out((4, 2), "int64")
        OPS["topk"](stream, [vals, idx], [h], k=2, dim=-1, largest=True, sorted=True)
        ref = torch.topk(kit.t64(x_np) @ kit.t64(w_np).T, 2).values
        kit.close(kit.read(vals), ref, dtype)


def test_topk_values_over_the_input_read_old_values(kit, stream):
    x_np = kit.randn((4, 6), "float32")
    x = kit.tensor(x_np)
    vals = kit.view(x, [4, 3], [6, 1], 0)  # the first half of each row of x
    idx = kit.out((4, 3), "int64")
    topk(stream, vals, idx, x, 3)
    ref = torch.topk(torch.from_numpy(x_np), 3)
    np.testing.assert_array_equal(kit.read(vals), ref.values.numpy())

# -- refused inputs -----------------------------------------------------------------------------

def _call(kit, stream, shape=(3, 5), k=2, dim=-1, out_shape=None, dtype="float32",
          idx_dtype="int64", vals_dtype=None):
    x = kit.tensor(kit.randn(shape, dtype) if dtype != "bool" else np.ones(shape, bool))
    out_shape = out_shape or (3, 2)
    topk(stream, kit.out(out_shape, vals_dtype or dtype), kit.out(out_shape, idx_dtype), x, k,
         dim)


def test_refuses_negative_k(kit, stream):
    with pytest.raises(InvalidArgument, match="k: -1 is out of range"):
        _call(kit, stream, k=-1)


def test_refuses_k_larger_than_dim(kit, stream):
    with pytest.raises(InvalidArgument, match="k: 6 is out of range"):
        _call(kit, stream, k=6)


def test_refuses_dim_out_of_range(kit, stream):
    with pytest.raises(InvalidArgument, match="dim: 2 is out of range"):
        _call(kit, stream, dim=2)
    with pytest.raises(InvalidArgument, match="dim: -3 is out of range"):
        _call(kit, stream, dim=-3)


def test_refuses_non_int64_indices(kit, stream):
    with pytest.raises(InvalidArgument, match="indices_out: dtype must be int64"):
        _call(kit, stream, idx_dtype="int32")


def test_refuses_values_dtype_mismatch(kit, stream):
    with pytest.raises(InvalidArgument, match="values_out: dtype"):
        _call(kit, stream, vals_dtype="bfloat16")


def test_refuses_wrong_output_shape(kit, stream):
    with pytest.raises(InvalidArgument, match="values_out: expected sizes"):
        _call(kit, stream, out_shape=(3, 3))


def test_refuses_bool_input(kit, stream):
    with pytest.raises(Unsupported, match="bool"):
        _call(kit, stream, dtype="bool")


def test_refuses_non_integer_k(kit, stream):
    with pytest.raises(InvalidArgument, match="k: expected an integer"):
        _call(kit, stream, k=2.0)


def test_registry_requires_k(kit, stream):
    x = kit.tensor(kit.randn((3, 5), "float32"))
    with pytest.raises(InvalidArgument, match=r"\['k'\] required"):
        OPS["topk"](stream, [kit.out((3, 2), "float32"), kit.out((3, 2), "int64")], [x])
