"""The cuda device (aotrt/runtime/backends/cuda/device.py) and its renderer
(kernels/render_cuda.py).

Rendering and NVRTC compilation run wherever NVRTC is installed (no GPU needed); everything
else skips cleanly without a GPU. Numerics are compared with numpy in float64 on fresh
random inputs, and with the cpu device running the same kernel IR.
"""

from __future__ import annotations

import numpy as np
import pytest

from aotrt import dtypes
from aotrt.errors import CompileError, DeviceError, HazardError, InvalidArgument
from aotrt.kernels import ir
from aotrt.kernels.render_cuda import BLOCK, CudaRenderer
from aotrt.runtime import shims
from aotrt.runtime.device import StreamOptions, cuda_available, get_device
from aotrt.runtime.tensor import Handle

cuda_mod = pytest.importorskip("aotrt.runtime.backends.cuda.device")

needs_gpu = pytest.mark.skipif(not cuda_available(), reason="no CUDA GPU here")
TOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 2e-2}


def _nvrtc_ok() -> bool:
    try:
        cuda_mod.compile_source('extern "C" __global__ void k() {}', "sm_90")
        return True
    except Exception:  # noqa: BLE001 - no NVRTC library here
        return False


needs_nvrtc = pytest.mark.skipif(not _nvrtc_ok(), reason="NVRTC is not installed here")


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """||got - ref|| / ||ref|| in float64."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


# -- kernels used by several tests --------------------------------------------------------------

def k_silu_bcast(dt: str, shape=(4, 5, 6)) -> ir.Kernel:
    """out = silu(a.T-ish + b[broadcast last dim]) with `a` read through permuted strides."""
    n0, n1, n2 = shape
    a_strides = (1, n0 * n2, n0)  # a is stored as [n1, n2, n0] and read permuted
    x = ir.Op("add", (ir.cast(ir.load(0, a_strides, dt), "float32"),
                      ir.cast(ir.load(1, (0, 0, 1), dt), "float32")), "float32")
    y = ir.cast(ir.Op("silu", (x,), "float32"), dt)
    return ir.Kernel("silu_bcast", shape, (),
                     (ir.Arg(dt, "r"), ir.Arg(dt, "r"), ir.Arg(dt, "w")),
                     (ir.store(2, (n1 * n2, n2, 1), y),))


def k_layer_norm(dt: str, rows: int, cols: int, eps: float = 1e-5) -> ir.Kernel:
    """out[r, c] = (x - mean) * rsqrt(var + eps) * w[c] + b[c], reductions over c."""
    f = "float32"
    xr = ir.cast(ir.Load(0, ir.Op("add", (ir.Op("mul", (ir.Idx(0), ir.Const(cols, "int64")),
                                                "int64"), ir.Idx(1)), "int64"), dt), f)
    inv_n = ir.Const(1.0 / cols, f)
    mean = ir.Op("mul", (ir.Reduce("sum", xr, f), inv_n), f)
    diff = ir.Op("sub", (xr, mean), f)
    var = ir.Op("mul", (ir.Reduce("sum", ir.Op("mul", (diff, diff), f), f), inv_n), f)
    rstd = ir.Op("rsqrt", (ir.Op("add", (var, ir.Const(eps, f)), f),), f)
    w = ir.cast(ir.Load(1, ir.Idx(1), dt), f)
    b = ir.cast(ir.Load(2, ir.Idx(1), dt), f)
    y = ir.Op("add", (ir.Op("mul", (ir.Op("mul", (diff, rstd), f), w), f), b), f)
    idx = ir.Op("add", (ir.Op("mul", (ir.Idx(0), ir.Const(cols, "int64")), "int64"),
                        ir.Idx(1)), "int64")
    return ir.Kernel("layer_norm", (rows,), (cols,),
                     (ir.Arg(dt, "r"), ir.Arg(dt, "r"), ir.Arg(dt, "r"), ir.Arg(dt, "w"),
                      ir.Arg(f, "w")),
                     (ir.Store(3, idx, ir.cast(y, dt)), ir.Store(4, ir.Idx(0), mean)))


def k_softmax_max(rows: int, cols: int) -> ir.Kernel:
    """softmax over the last dim (fp32) and the row max as a second output."""
    f = "float32"
    idx = ir.Op("add", (ir.Op("mul", (ir.Idx(0), ir.Const(cols, "int64")), "int64"),
                        ir.Idx(1)), "int64")
    x = ir.Load(0, idx, f)
    m = ir.Reduce("max", x, f)
    e = ir.Op("exp", (ir.Op("sub", (x, m), f),), f)
    s = ir.Reduce("sum", e, f)
    return ir.Kernel("softmax", (rows,), (cols,),
                     (ir.Arg(f, "r"), ir.Arg(f, "w"), ir.Arg(f, "w")),
                     (ir.Store(1, idx, ir.Op("div", (e, s), f)), ir.Store(2, ir.Idx(0), m)))


def k_small_reduce(rows: int, cols: int) -> ir.Kernel:
    """int64 sum and bool any over a short last dim (one thread per row)."""
    idx = ir.Op("add", (ir.Op("mul", (ir.Idx(0), ir.Const(cols, "int64")), "int64"),
                        ir.Idx(1)), "int64")
    x = ir.Load(0, idx, "int64")
    pos = ir.Op("gt", (x, ir.Const(3, "int64")), "bool")
    return ir.Kernel("small_reduce", (rows,), (cols,),
                     (ir.Arg("int64", "r"), ir.Arg("int64", "w"), ir.Arg("bool", "w")),
                     (ir.Store(1, ir.Idx(0), ir.Reduce("sum", x, "int64")),
                      ir.Store(2, ir.Idx(0), ir.Reduce("any", pos, "bool"))))


def k_int_ops(n: int) -> ir.Kernel:
    """Python-style floordiv/mod on int64, a compare, a where and a bf16 round trip."""
    a = ir.Load(0, ir.Idx(0), "int64")
    b = ir.Load(1, ir.Idx(0), "int64")
    fd = ir.Op("floordiv", (a, b), "int64")
    md = ir.Op("mod", (a, b), "int64")
    w = ir.Op("where", (ir.Op("lt", (a, b), "bool"), fd, md), "int64")
    bf = ir.cast(ir.cast(a, "bfloat16"), "float32")
    return ir.Kernel("int_ops", (n,), (),
                     (ir.Arg("int64", "r"), ir.Arg("int64", "r"), ir.Arg("int64", "w"),
                      ir.Arg("int64", "w"), ir.Arg("int64", "w"), ir.Arg("float32", "w")),
                     (ir.Store(2, ir.Idx(0), fd), ir.Store(3, ir.Idx(0), md),
                      ir.Store(4, ir.Idx(0), w), ir.Store(5, ir.Idx(0), bf)))


ALL_KERNELS = [k_silu_bcast("float16"), k_layer_norm("bfloat16", 3, 70),
               k_softmax_max(5, 300), k_small_reduce(7, 4), k_int_ops(9)]


# -- rendering (no GPU needed) ------------------------------------------------------------------

def test_lanes_choose_block_or_warp_for_long_reductions() -> None:
    assert CudaRenderer.lanes(k_layer_norm("float32", 4, 768)) == BLOCK
    assert CudaRenderer.lanes(k_layer_norm("float32", 4, 64)) == 32
    assert CudaRenderer.lanes(k_small_reduce(4, 4)) == 1
    assert CudaRenderer.lanes(k_silu_bcast("float32")) == 1


def test_render_has_kernel_signatures() -> None:
    src = CudaRenderer().render(ALL_KERNELS)
    # Contract C1: kernel i is exported as aotrt_k{i}; its name is only a comment.
    assert 'extern "C" __global__ void __launch_bounds__(256) aotrt_k0(char* p0, char* p1, ' \
           'char* p2, int64_t n, int* aot_err)' in src
    assert "/* kernel silu_bcast */" in src and "void __launch_bounds__(256) silu_bcast" not in src
    assert "aot_warp_sum" in src and "#include" not in src


@needs_nvrtc
def test_rendered_kernels_compile_with_nvrtc() -> None:
    code = cuda_mod.compile_source(CudaRenderer().render(ALL_KERNELS), "sm_90")
    assert len(code) > 1000


@needs_nvrtc
def test_compile_error_carries_the_log() -> None:
    with pytest.raises(CompileError) as info:
        cuda_mod.compile_source("this is not cuda", "sm_90")
    assert "this" in info.value.log


# -- the device ---------------------------------------------------------------------------------

@pytest.fixture
def dev():
    if not cuda_available():
        pytest.skip("no CUDA GPU here")
    return get_device("cuda")


@pytest.fixture
def stream(dev):
    s = dev.create_stream(StreamOptions(check_hazards=True))
    yield s
    s.close()


def _tensor(dev, stream, arr: np.ndarray, dtype: str, strides=None) -> Handle:
    """A new cuda tensor holding `arr` (optionally through non-row-major strides)."""
    with dev.stream_guard(stream):
        h = shims.empty_strided(arr.shape, strides, dtype, device=dev)
    dev.write(h, arr)
    return h


def _empty(dev, stream, shape, dtype: str) -> Handle:
    with dev.stream_guard(stream):
        return shims.empty_strided(shape, None, dtype, device=dev)


def _np(dt: str):
    return dtypes.as_dtype(dt).np


@needs_gpu
@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
def test_pointwise_kernel_matches_numpy(dev, stream, dt) -> None:
    rng = np.random.default_rng()
    k = k_silu_bcast(dt)
    a_store = rng.standard_normal((5, 6, 4)).astype(_np(dt))
    b = rng.standard_normal(6).astype(_np(dt))
    ha, hb = _tensor(dev, stream, a_store, dt), _tensor(dev, stream, b, dt)
    ho = _empty(dev, stream, (4, 5, 6), dt)
    dev.kernel_library([k]).kernel(k.name)(stream, ha, hb, ho)
    got = ho.numpy()
    x = a_store.astype(np.float64).transpose(2, 0, 1) + b.astype(np.float64)
    ref = x / (1 + np.exp(-x))
    assert rel_err(got, ref) < TOL[dt]


@needs_gpu
@pytest.mark.parametrize("dt,rows,cols", [("float32", 7, 768), ("float16", 33, 100),
                                          ("bfloat16", 3, 70), ("float32", 2, 5)])
def test_layer_norm_kernel_matches_numpy(dev, stream, dt, rows, cols) -> None:
    rng = np.random.default_rng()
    k = k_layer_norm(dt, rows, cols)
    x = (rng.standard_normal((rows, cols)) * 3 + 1).astype(_np(dt))
    w = rng.standard_normal(cols).astype(_np(dt))
    b = rng.standard_normal(cols).astype(_np(dt))
    hx, hw, hb = (_tensor(dev, stream, v, dt) for v in (x, w, b))
    ho, hm = _empty(dev, stream, (rows, cols), dt), _empty(dev, stream, (rows,), "float32")
    stream.fill(hm, 0xFF)  # poison: every row must be written
    dev.kernel_library([k]).kernel(k.name)(stream, hx, hw, hb, ho, hm)
    x64 = x.astype(np.float64)
    mean = x64.mean(1, keepdims=True)
    ref = (x64 - mean) / np.sqrt(x64.var(1, keepdims=True) + 1e-5) * w.astype(np.float64) \
        + b.astype(np.float64)
    assert rel_err(ho.numpy(), ref) < TOL[dt]
    assert rel_err(hm.numpy(), mean[:, 0]) < 1e-4


@needs_gpu
def test_softmax_and_small_reductions(dev, stream) -> None:
    rng = np.random.default_rng()
    x = (rng.standard_normal((5, 300)) * 4).astype(np.float32)
    k = k_softmax_max(5, 300)
    hx = _tensor(dev, stream, x, "float32")
    hs, hm = _empty(dev, stream, (5, 300), "float32"), _empty(dev, stream, (5,), "float32")
    dev.kernel_library([k]).kernel(k.name)(stream, hx, hs, hm)
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    assert rel_err(hs.numpy(), e / e.sum(1, keepdims=True)) < 1e-4
    np.testing.assert_array_equal(hm.numpy(), x.max(1))

    xi = rng.integers(-10, 10, size=(7, 4)).astype(np.int64)
    k2 = k_small_reduce(7, 4)
    hi = _tensor(dev, stream, xi, "int64")
    hsum, hany = _empty(dev, stream, (7,), "int64"), _empty(dev, stream, (7,), "bool")
    dev.kernel_library([k2]).kernel(k2.name)(stream, hi, hsum, hany)
    np.testing.assert_array_equal(hsum.numpy(), xi.sum(1))
    np.testing.assert_array_equal(hany.numpy(), (xi > 3).any(1))


@needs_gpu
def test_int_ops_match_python_semantics(dev, stream) -> None:
    rng = np.random.default_rng()
    a = rng.integers(-50, 50, size=9).astype(np.int64)
    b = rng.integers(1, 7, size=9).astype(np.int64) * rng.choice([-1, 1], size=9)
    k = k_int_ops(9)
    ha, hb = _tensor(dev, stream, a, "int64"), _tensor(dev, stream, b, "int64")
    outs = [_empty(dev, stream, (9,), "int64") for _ in range(3)] + [
        _empty(dev, stream, (9,), "float32")]
    dev.kernel_library([k]).kernel(k.name)(stream, ha, hb, *outs)
    np.testing.assert_array_equal(outs[0].numpy(), a // b)
    np.testing.assert_array_equal(outs[1].numpy(), a % b)
    np.testing.assert_array_equal(outs[2].numpy(), np.where(a < b, a // b, a % b))
    np.testing.assert_array_equal(outs[3].numpy(), a.astype(np.float32))


@needs_gpu
def test_cuda_matches_cpu_device_on_same_ir(dev, stream) -> None:
    """The same IR on both devices gives the same numbers (within rounding), and both are
    right: each is also held to numpy in float64, so that a shared fault (in the IR, or in
    a path both devices take) cannot pass as agreement."""
    cpu = get_device("cpu")
    rng = np.random.default_rng()
    k = k_layer_norm("float32", 16, 128)
    vals = [rng.standard_normal(s).astype(np.float32) for s in ((16, 128), (128,), (128,))]
    x64, w64, b64 = (v.astype(np.float64) for v in vals)
    mean = x64.mean(1, keepdims=True)
    ref = (x64 - mean) / np.sqrt(x64.var(1, keepdims=True) + 1e-5) * w64 + b64
    results = []
    for d in (cpu, dev):
        s = d.create_stream(StreamOptions(check_hazards=True))
        hs = [_tensor(d, s, v, "float32") for v in vals]
        ho, hm = _empty(d, s, (16, 128), "float32"), _empty(d, s, (16,), "float32")
        d.kernel_library([k]).kernel(k.name)(s, *hs, ho, hm)
        results.append(ho.numpy())
        assert rel_err(results[-1], ref) < TOL["float32"], d.name
        assert rel_err(hm.numpy(), mean[:, 0]) < TOL["float32"], d.name
        s.close()
    assert rel_err(results[1], results[0]) < 1e-5


@needs_gpu
@pytest.mark.parametrize("dt", ["float16", "int64", "uint8"])
def test_copy_packed_and_strided(dev, stream, dt) -> None:
    rng = np.random.default_rng()
    src = (rng.standard_normal((6, 7, 5)) * 100).astype(_np(dt))
    hs = _tensor(dev, stream, src, dt)
    # packed, same layout: one memcpy
    hd = _empty(dev, stream, (6, 7, 5), dt)
    stream.copy(hd, hs)
    np.testing.assert_array_equal(hd.numpy(), src)
    # into a transposed view: the strided copy kernel
    ht = _empty(dev, stream, (5, 7, 6), dt)
    view = shims.reinterpret_tensor(ht, (6, 7, 5), (1, 6, 42), 0)
    stream.copy(view, hs)
    np.testing.assert_array_equal(ht.numpy(), src.transpose(2, 1, 0))
    # from a slice with gaps, into a slice with gaps of a bigger tensor
    big = _tensor(dev, stream, np.zeros((6, 7, 12), _np(dt)), dt)
    dst = shims.reinterpret_tensor(big, (6, 7, 5), (84, 12, 2), 1)
    stream.copy(dst, hs)
    got = big.numpy()
    np.testing.assert_array_equal(got[:, :, 1:11:2], src)
    assert not got[:, :, 0::2].any()


@needs_gpu
@pytest.mark.parametrize("dt", ["float16", "float32", "uint8"])
@pytest.mark.parametrize("lo", [0, 2, 3, 8])
def test_channel_slices_of_nhwc_copy_both_ways(dev, stream, dt, lo) -> None:
    """Channels lo:lo+c of an NHWC tensor (a view of a concatenation) to a packed NHWC
    tensor and back: the rows kernel in 16-, 8- or 4-byte units where the bytes line up,
    element by element where they do not (odd offsets), the other channels untouched."""
    rng = np.random.default_rng(lo)
    n, c_all, h, w, c = 2, 40, 5, 7, 16
    full = (rng.standard_normal((n, h, w, c_all)) * 50).astype(_np(dt))
    hf = _tensor(dev, stream, full, dt)
    st = (h * w * c_all, 1, w * c_all, c_all)
    sl = shims.reinterpret_tensor(hf, (n, c, h, w), st, lo)
    packed = _empty(dev, stream, (n, h, w, c), dt)
    pv = shims.reinterpret_tensor(packed, (n, c, h, w), (h * w * c, 1, w * c, c), 0)
    stream.copy(pv, sl)
    np.testing.assert_array_equal(packed.numpy(), full[..., lo:lo + c])
    back = (rng.standard_normal((n, h, w, c)) * 50).astype(_np(dt))
    hb = _tensor(dev, stream, back, dt)
    stream.copy(sl, shims.reinterpret_tensor(hb, (n, c, h, w), (h * w * c, 1, w * c, c), 0))
    want = full.copy()
    want[..., lo:lo + c] = back
    np.testing.assert_array_equal(hf.numpy(), want)


@needs_gpu
def test_a_write_has_landed_when_it_returns(dev, stream) -> None:
    """A stream's first read of freshly written memory sees the new bytes. cuMemcpyHtoD from
    pageable memory may return before its last DMA lands, and aotrt's streams are not
    ordered after it (wrong answers under load on the H200, 2026-12-02); the tail of a large
    write is read at once, several times over."""
    n = 32 << 20                                          # 128 MiB of float32
    for rep in range(4):
        src = np.full(n, rep + 1, np.float32)
        src[-4096:] = np.arange(4096, dtype=np.float32) + 1000 * (rep + 1)
        h = _tensor(dev, stream, src, "float32")
        tail = shims.reinterpret_tensor(h, (4096,), (1,), n - 4096)
        out = _empty(dev, stream, (4096,), "float32")
        stream.copy(out, tail)
        np.testing.assert_array_equal(out.numpy(), src[-4096:])


@needs_gpu
def test_fill_packed_and_strided(dev, stream) -> None:
    h = _tensor(dev, stream, np.arange(24, dtype=np.int32).reshape(4, 6), "int32")
    stream.fill(h, 0)
    assert not h.numpy().any()
    col = shims.reinterpret_tensor(h, (4,), (6,), 2)
    stream.fill(col, 0x01)
    got = h.numpy()
    assert (got[:, 2] == 0x01010101).all() and got[:, [0, 1, 3, 4, 5]].sum() == 0


@needs_gpu
def test_read_write_non_packed_views(dev, stream) -> None:
    rng = np.random.default_rng()
    base = _tensor(dev, stream, np.zeros((8, 10), np.float32), "float32")
    view = shims.reinterpret_tensor(base, (4, 5), (20, 2), 1)
    vals = rng.standard_normal((4, 5)).astype(np.float32)
    base.alloc.settle()
    dev.write(view, vals)
    np.testing.assert_array_equal(view.numpy(), vals)
    full = base.numpy()
    np.testing.assert_array_equal(full[0::2, 1::2], vals)
    full[0::2, 1::2] = 0
    assert not full.any()


@needs_gpu
def test_host_read_without_wait_is_a_hazard(dev, stream) -> None:
    h = _tensor(dev, stream, np.ones(1 << 16, np.float32), "float32")
    stream.fill(h, 0)
    with pytest.raises(HazardError):
        dev.read(h)
    assert not h.numpy().any()  # numpy() waits first


@needs_gpu
def test_deferred_stream_runs_at_wait(dev) -> None:
    s = dev.create_stream(StreamOptions(deferred=True, check_hazards=True))
    h = _tensor(dev, s, np.ones(100, np.float32), "float32")
    s.fill(h, 0)
    assert not h.numpy().any()
    s.close()


@needs_gpu
def test_graph_capture_and_replay(dev, stream) -> None:
    rng = np.random.default_rng()
    k = k_softmax_max(4, 64)
    lib = dev.kernel_library([k])
    x = rng.standard_normal((4, 64)).astype(np.float32)
    hx = _tensor(dev, stream, x, "float32")
    hs, hm = _empty(dev, stream, (4, 64), "float32"), _empty(dev, stream, (4,), "float32")
    stream.begin_capture()
    try:
        stream.fill(hs, 0)
        lib.kernel(k.name)(stream, hx, hs, hm)
    finally:
        graph = stream.end_capture()
    for _ in range(2):
        x = rng.standard_normal((4, 64)).astype(np.float32)
        hx.alloc.settle()
        dev.write(hx, x)
        graph.launch(stream)
        stream.commit_and_wait()
        e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
        assert rel_err(hs.numpy(), e / e.sum(1, keepdims=True)) < 1e-4
    graph.close()
    graph.close()


@needs_gpu
def test_wait_while_capturing_is_refused(dev, stream) -> None:
    stream.begin_capture()
    try:
        with pytest.raises(DeviceError, match="cannot wait while capturing a graph"):
            stream.commit_and_wait()
    finally:
        stream.abort_capture()


@needs_gpu
def test_pool_reuses_freed_memory(dev, stream) -> None:
    h = _empty(dev, stream, (1000,), "float32")
    ptr = h.address
    shims.delete_tensor_object(h)
    h2 = _empty(dev, stream, (1000,), "float32")
    assert h2.address == ptr


@needs_gpu
def test_kernel_cache_on_disk(dev, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path))
    k = k_int_ops(3)
    dev._modules.clear()
    dev.kernel_library([k])
    files = list(tmp_path.glob("*.cubin"))
    assert len(files) == 1
    mtime = files[0].stat().st_mtime_ns
    dev._modules.clear()
    dev.kernel_library([k])
    assert files[0].stat().st_mtime_ns == mtime


@needs_gpu
def test_dlpack_torch_tensor_is_used_without_copy(dev, stream) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    t = torch.randn(3, 4, device="cuda").t()  # a transposed view
    ptr, sizes, strides, dt = dev.dlpack_info(t, stream)
    assert ptr == t.data_ptr() and sizes == (4, 3) and strides == (1, 4)
    assert dt is dtypes.float32
    with dev.stream_guard(stream):
        h = shims.create_tensor_from_blob(ptr, sizes, strides, 0, dt, device=dev)
    np.testing.assert_array_equal(h.numpy(), t.cpu().numpy())
    stream.fill(h, 0)
    stream.commit_and_wait()
    assert float(t.abs().sum()) == 0.0
    shims.delete_tensor_object(h)


@needs_gpu
def test_bad_arguments_are_refused(dev, stream) -> None:
    h = _empty(dev, stream, (4,), "float32")
    with pytest.raises(InvalidArgument):
        stream.fill(h, 256)
    with pytest.raises(InvalidArgument):
        stream.copy(h, _empty(dev, stream, (5,), "float32"))
    k = k_int_ops(9)
    with pytest.raises(InvalidArgument):
        dev.kernel_library([k]).kernel(k.name)(stream, h)


# -- delegates on cuda --------------------------------------------------------------------------

def _small_program():
    torch = pytest.importorskip("torch")
    import aotrt

    class Small(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(8)
            self.fc = torch.nn.Linear(8, 5)

        def forward(self, x):
            y = torch.nn.functional.silu(self.bn(self.conv(x)))
            y = torch.nn.functional.max_pool2d(y, 2)
            return self.fc(y.mean((2, 3))).softmax(-1)

    torch.manual_seed(0)
    m = Small().eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 1.5)
    return torch, m, aotrt.export(m, (torch.randn(2, 3, 16, 16),))


@needs_gpu
@pytest.mark.parametrize("graph", [False, True])
def test_delegate_runs_on_cuda_with_and_without_graphs(graph) -> None:
    torch, m, prog = _small_program()
    import aotrt

    with aotrt.load(prog, device="cuda", cuda_graph=graph) as d:
        for _ in range(3):
            x = torch.randn(2, 3, 16, 16)
            (out,) = d.run(x.numpy())
            ref = m(x).detach().numpy()
            assert rel_err(np.asarray(out), ref) < 1e-4
        if torch.cuda.is_available():
            xc = torch.randn(2, 3, 16, 16, device="cuda")
            (out,) = d.run(xc)
            got = torch.from_dlpack(out)
            assert got.device.type == "cuda"
            assert rel_err(got.cpu().numpy(), m(xc.cpu()).detach().numpy()) < 1e-4


@needs_gpu
def test_delegate_replays_a_graph_by_default() -> None:
    """A static program on cuda replays one CUDA graph unless cuda_graph=False."""
    torch, m, prog = _small_program()
    import aotrt

    with aotrt.load(prog, device="cuda") as d:
        assert d.uses_graph
        x = torch.randn(2, 3, 16, 16)
        for _ in range(2):
            (out,) = d.run(x.numpy())
            assert rel_err(np.asarray(out), m(x).detach().numpy()) < 1e-4
    with aotrt.load(prog, device="cuda", cuda_graph=False) as d:
        assert not d.uses_graph


@needs_gpu
def test_a_program_without_a_possible_graph_runs_without_one(monkeypatch, caplog) -> None:
    """A graph CUDA cannot serialize (Unsupported at the end of the capture) leaves the
    default delegate running without one, right, with a warning; cuda_graph=True raises."""
    from aotrt.errors import Unsupported

    torch, m, prog = _small_program()
    import aotrt

    def refuse(graph):
        raise Unsupported("cuda graph: its 1 early-launch edges cannot be made full")
    monkeypatch.setattr(cuda_mod, "serialize_graph", refuse)
    x = torch.randn(2, 3, 16, 16)
    with aotrt.load(prog, device="cuda") as d:
        with caplog.at_level("WARNING", logger="aotrt.runtime.delegate"):
            (out,) = d.run(x.numpy())
        assert "runs without a CUDA graph" in caplog.text and not d.uses_graph
        assert rel_err(np.asarray(out), m(x).detach().numpy()) < 1e-4
        (out,) = d.run(x.numpy())
        assert rel_err(np.asarray(out), m(x).detach().numpy()) < 1e-4
    with aotrt.load(prog, device="cuda", cuda_graph=True) as d:
        with pytest.raises(Unsupported, match="early-launch edges"):
            d.run(x.numpy())


@needs_gpu
def test_graph_run_returns_before_its_replay_and_reads_inputs_as_they_were() -> None:
    """run() waits for its input copies alone: the replay is still queued when it returns,
    and a caller that overwrites its cuda input at once does not change the result."""
    torch, m, prog = _small_program()
    import aotrt

    if not torch.cuda.is_available():
        pytest.skip("torch has no cuda here")
    with aotrt.load(prog, device="cuda", cuda_graph=True) as d:
        d.run(np.zeros((2, 3, 16, 16), np.float32))     # capture
        for _ in range(3):
            xc = torch.randn(2, 3, 16, 16, device="cuda")
            ref = m(xc.cpu()).detach().numpy()
            (out,) = d.run(xc)
            pending = d.stream.recorded_seq > d.stream.completed_seq
            xc.fill_(1e4)                               # the caller reuses its input at once
            assert pending, "run() waited for its own replay"
            assert rel_err(torch.from_dlpack(out).cpu().numpy(), ref) < 1e-4


@needs_gpu
@pytest.mark.parametrize("checker", ["0", "1"])
def test_the_lean_replay_reads_a_torch_input_before_run_returns_even_behind_queued_work(
        monkeypatch: pytest.MonkeyPatch, checker: str) -> None:
    """A torch cuda input takes the lean replay (raw copies, the graph, fresh outputs) unless
    the hazard checker is on (the full path keeps its checks). Its copy is queued behind a
    long replay still running, and run() returns only once that copy has read the input:
    the caller may overwrite it at once."""
    import torch

    import aotrt
    from aotrt.runtime import delegate as delegate_mod

    if not torch.cuda.is_available():
        pytest.skip("torch has no cuda here")

    class Chain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(2048, 2048) / 2048 ** 0.5)

        def forward(self, x):
            for _ in range(24):             # ~400 GFLOP: milliseconds of GPU time
                x = torch.tanh(x @ self.w)
            return x

    monkeypatch.setenv("AOTRT_CHECK_HAZARDS", checker)
    torch.manual_seed(0)
    m = Chain().eval()
    prog = aotrt.export(m, (torch.randn(2048, 2048),))
    lean = []
    real = delegate_mod.Delegate._replay_direct
    monkeypatch.setattr(delegate_mod.Delegate, "_replay_direct",
                        lambda self, g, args: lean.append(1) or real(self, g, args))
    mc = m.cuda()
    with aotrt.load(prog, device="cuda") as d, torch.no_grad():
        d.run(torch.randn(2048, 2048, device="cuda"))        # capture
        xa, xb = (torch.randn(2048, 2048, device="cuda") for _ in range(2))
        ref = mc(xb).double()
        d.run(xa)                                            # queued, still running
        (out,) = d.run(xb)                                   # its copy waits behind it
        xb.fill_(float("nan"))                               # the caller reuses xb at once
        got = torch.from_dlpack(out).double()
        assert lean == ([1, 1, 1] if checker == "0" else [])
        assert torch.isfinite(got).all()
        assert ((got - ref).norm() / ref.norm()).item() < 1e-3


# -- library lifetime, cache, int64 grids (issue 7, items 6, 9, 10) --------------------------


def test_launch_config_caps_the_grid_over_more_than_2_31_threads() -> None:
    """A grid over 3 * 2^31 threads: the blocks are capped and the kernels grid-stride."""
    import types

    stub = types.SimpleNamespace(max_blocks=132 * 16, _configs={})
    cfg = cuda_mod.CudaDevice.launch_config(stub, 3 << 31)
    assert cfg.grid == (132 * 16, 1, 1)


def test_kernels_over_more_than_2_31_elements_index_in_int64() -> None:
    n = 3 << 31
    k = ir.Kernel("k_huge", (n,), (), (ir.Arg("float32", "w"),),
                  (ir.store(0, (1,), ir.const(1.0, "float32")),))
    src = CudaRenderer().render([k])
    assert "uint32_t" not in src.split("__global__")[-1]     # no 32-bit coordinates
    assert "int64_t it = (int64_t)blockIdx.x * blockDim.x + threadIdx.x" in src
    assert "it += step" in src


@needs_gpu
def test_closed_library_releases_its_module_and_refuses_kernels(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path))
    dev = get_device("cuda")
    kept = len(dev._modules)
    for i in range(20):                       # distinct programs: distinct modules
        k = ir.Kernel(f"k_rel{i}", (8,), (), (ir.Arg("float32", "w"),),
                      (ir.store(0, (1,), ir.const(float(i), "float32")),))
        lib = dev.kernel_library([k])
        s = dev.create_stream(StreamOptions(check_hazards=True))
        h = shims.empty_strided([8], None, "float32", dev)
        fn = lib.kernel(k.name)
        fn(s, h)
        np.testing.assert_array_equal(h.numpy(), np.full(8, float(i), np.float32))
        lib.close()
        assert lib.module is None
        with pytest.raises(InvalidArgument, match="closed"):
            fn(s, h)
        shims.delete_tensor_object(h)
        s.close()
    assert len(dev._modules) == kept          # the device holds no program's module


@needs_gpu
@pytest.mark.parametrize("damage", ["truncate", "sidecar"])
def test_a_damaged_cubin_is_rebuilt(tmp_path, monkeypatch, damage) -> None:
    monkeypatch.setenv("AOTRT_CACHE_DIR", str(tmp_path))
    dev = get_device("cuda")
    src = 'extern "C" __global__ void aotrt_k0(float* p) { p[0] = 1.0f; }\n'
    dev.compile_cubin(src, "probe", keep=False)
    (path,) = tmp_path.glob("*.cubin")
    side = path.with_name(path.name + ".sha256")
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:64])
    else:
        side.write_text("0" * 64)
    module = dev.compile_cubin(src, "probe", keep=False)
    assert module.get_kernel("aotrt_k0") is not None
    import hashlib

    assert hashlib.sha256(path.read_bytes()).hexdigest() == side.read_text().strip()
