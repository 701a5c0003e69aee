"""aotrt/kernels/render_cuda.py: the CUDA C of generated kernels. Structure checks of the
rendered text (signature, grid-stride loops, warp and block reductions, 32-bit index math,
half/bfloat16/bool access) and, where NVRTC is installed, compiles (no GPU needed)."""

from __future__ import annotations

import re

import pytest

from aotrt.errors import CompileError
from aotrt.kernels import ir, render_cuda
from aotrt.kernels.render_cuda import BLOCK, CudaRenderer
from tests.kernels.test_render_c import f32, flat, softmax_kernel


def _cuda() -> object | None:
    """aotrt.runtime.backends.cuda.device when NVRTC compiles a trivial kernel here, else None."""
    try:
        import aotrt.runtime.backends.cuda.device as cuda_mod
    except ImportError:
        return None
    try:
        cuda_mod.compile_source('extern "C" __global__ void k() {}', "sm_90")
    except CompileError:
        return None
    return cuda_mod


CUDA = _cuda()
needs_nvrtc = pytest.mark.skipif(CUDA is None, reason="NVRTC is not installed here")


def pointwise(dtype: str, shape: tuple[int, ...] = (6, 5)) -> ir.Kernel:
    """out = sigmoid(x) * 2 in `dtype`, computed in float."""
    x = f32(ir.Load(0, flat(shape), dtype))
    y = ir.Op("mul", (ir.Op("sigmoid", (x,), "float32"), ir.const(2.0, "float32")), "float32")
    return ir.Kernel(f"pointwise_{dtype}", shape, (), (ir.Arg(dtype, "r"), ir.Arg(dtype, "w")),
                     (ir.Store(1, flat(shape), ir.cast(y, dtype)),))


def row_sum(cols: int) -> ir.Kernel:
    """out[r] = sum_c x[r, c] over a reduce domain of `cols`."""
    idx = ir.strided_index((cols, 1), (0, 1))
    s = ir.Reduce("sum", ir.Load(0, idx, "float32"), "float32")
    return ir.Kernel(f"row_sum_{cols}", (3,), (cols,),
                     (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                     (ir.Store(1, ir.Idx(0), s),))


def mask_where() -> ir.Kernel:
    """out = where(mask, x, -x) with a bool argument, and an int64 count of the mask."""
    shape = (8,)
    m = ir.Load(0, flat(shape), "bool")
    x = ir.Load(1, flat(shape), "float16")
    y = ir.Op("where", (m, f32(x), ir.Op("neg", (f32(x),), "float32")), "float32")
    return ir.Kernel("mask_where", shape, (),
                     (ir.Arg("bool", "r"), ir.Arg("float16", "r"), ir.Arg("bfloat16", "w"),
                      ir.Arg("int64", "w")),
                     (ir.Store(2, flat(shape), ir.cast(y, "bfloat16")),
                      ir.Store(3, flat(shape), ir.cast(m, "int64"))))


def inverse_trig() -> ir.Kernel:
    """out0 = asin(x), out1 = acos(x) in float32."""
    shape = (9,)
    x = ir.Load(0, flat(shape), "float32")
    return ir.Kernel("inverse_trig", shape, (), (ir.Arg("float32", "r"),)
                     + (ir.Arg("float32", "w"),) * 2,
                     tuple(ir.Store(1 + i, flat(shape), ir.Op(op, (x,), "float32"))
                           for i, op in enumerate(("asin", "acos"))))


def int_division() -> ir.Kernel:
    """out = x // y, x % y and trunc(x / y) in int64: the helpers that report a zero
    divisor through the library's flag."""
    shape = (7,)
    x, y = (ir.Load(i, flat(shape), "int64") for i in range(2))
    return ir.Kernel("int_division", shape, (), (ir.Arg("int64", "r"),) * 2
                     + (ir.Arg("int64", "w"),) * 3,
                     tuple(ir.Store(2 + i, flat(shape), ir.Op(op, (x, y), "int64"))
                           for i, op in enumerate(("floordiv", "mod", "truncdiv"))))


def _kernel_text(src: str, index: int) -> str:
    """The text of kernel `index` of a rendered library (from its signature on)."""
    start = src.index(f"aotrt_k{index}(")
    end = src.find("/* kernel ", start)
    return src[start:end if end >= 0 else len(src)]


def test_the_preamble_needs_no_headers() -> None:
    src = CudaRenderer().render([pointwise("float32")])
    assert "#include" not in src
    for name in ("typedef long long int64_t;", "aot_h2f", "aot_f2h", "aot_bf2f", "aot_f2bf",
                 "aot_warp_sum", "#define INFINITY"):
        assert name in src, name


def test_signature_and_grid_stride_loop_of_a_pointwise_kernel() -> None:
    src = CudaRenderer().render([pointwise("float32"), pointwise("float16")])
    sig = re.findall(r'extern "C" __global__ void __launch_bounds__\((\d+)\) (aotrt_k\d+)'
                     r"\(([^)]*)\)", src)
    assert [(b, s) for b, s, _ in sig] == [(str(BLOCK), "aotrt_k0"), (str(BLOCK), "aotrt_k1")]
    assert sig[0][2] == "char* p0, char* p1, int64_t n, int* aot_err"
    k0 = _kernel_text(src, 0)
    assert "it < n; it += step" in k0 and "blockIdx.x * blockDim.x + threadIdx.x" in k0
    assert "lane" not in k0                         # one thread per element
    assert "/* kernel pointwise_float32 */" in src and "/* kernel pointwise_float16 */" in src


def test_inverse_sine_and_cosine_call_the_device_math_library() -> None:
    body = _kernel_text(CudaRenderer().render([inverse_trig()]), 0)
    assert "asinf(" in body and "acosf(" in body


def test_small_domains_index_in_32_bits_and_huge_ones_in_64() -> None:
    small = _kernel_text(CudaRenderer().render([pointwise("float32", (6, 5))]), 0)
    assert "((uint32_t)(i)) % 5u" in small and "((uint32_t)(i)) / 5u" in small
    huge = _kernel_text(CudaRenderer().render([pointwise("float32", (1 << 16, 1 << 16))]), 0)
    assert "uint32_t" not in huge and "i % 65536;" in huge and "i / 65536;" in huge


@pytest.mark.parametrize("cols,lanes", [(1, 1), (31, 1), (32, 32), (33, 32), (255, 32),
                                        (256, BLOCK), (4096, BLOCK)])
def test_lanes_per_outer_element(cols: int, lanes: int) -> None:
    assert CudaRenderer.lanes(row_sum(cols)) == lanes
    assert CudaRenderer.lanes(pointwise("float32")) == 1


def test_middling_reductions_run_a_warp_per_row() -> None:
    src = CudaRenderer().render([softmax_kernel(4, 64, "float32"), row_sum(8)])
    warp = _kernel_text(src, 0)
    assert "const int64_t lane = threadIdx.x & 31;" in warp
    assert re.search(r"for \(int64_t (\w+) = lane; \1 < 64; \1 \+= 32\)", warp), warp
    assert "aot_warp_max(" in warp and "aot_warp_sum(" in warp
    short = _kernel_text(src, 1)                     # 8 elements: one thread does a row
    assert "lane" not in short and "aot_warp_" not in short


def test_long_reductions_run_a_block_per_row() -> None:
    assert CudaRenderer.lanes(row_sum(300)) == BLOCK and CudaRenderer.lanes(row_sum(64)) == 32
    src = CudaRenderer().render([row_sum(300)])
    k = _kernel_text(src, 0)
    assert "aot_block_sum(" in k and "it += gridDim.x" in k
    assert re.search(rf"(\w+) = lane; \1 < 300; \1 \+= {BLOCK}\)", k), k
    assert "#define AOT_BLOCK" in src


def test_half_bfloat16_and_bool_access() -> None:
    src = CudaRenderer().render([mask_where(), pointwise("float16")])
    k0 = _kernel_text(src, 0)
    assert "(((const uint8_t *)p0)[" in k0 and "] != 0)" in k0       # bool read as a byte
    assert "aot_h2f(((const uint16_t *)p1)[" in k0
    assert re.search(r"\(\(uint16_t \*\)p2\)\[[^]]+\] = aot_f2bf\(", k0), k0
    assert re.search(r"\(\(int64_t \*\)p3\)\[[^]]+\] = \(int64_t\)\(", k0), k0
    k1 = _kernel_text(src, 1)
    assert re.search(r"\(\(uint16_t \*\)p1\)\[[^]]+\] = aot_f2h\(", k1), k1


def test_a_cast_inside_a_kernel_rounds_through_the_storage_type() -> None:
    shape = (4,)
    x = ir.Load(0, flat(shape), "float32")
    y = f32(ir.cast(ir.cast(x, "bfloat16"), "float32"))
    k = ir.Kernel("round_trip", shape, (), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                  (ir.Store(1, flat(shape), ir.Op("add", (f32(ir.cast(x, "float16")), y),
                                                  "float32")),))
    body = _kernel_text(CudaRenderer().render([k]), 0)
    assert "aot_bf2f(aot_f2bf(" in body and "aot_h2f(aot_f2h(" in body


# -- NVRTC compiles (CPU only) ---------------------------------------------------------------


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_rendered_kernels_compile(arch: str) -> None:
    kernels = [pointwise("float32"), pointwise("bfloat16", (1 << 16, 1 << 16)), mask_where(),
               softmax_kernel(4, 64, "float16"), row_sum(8), row_sum(40), inverse_trig(),
               int_division()]
    code = CUDA.compile_source(CudaRenderer().render(kernels), arch, "render_cuda test")
    for i in range(len(kernels)):
        assert f"aotrt_k{i}".encode() in code


@needs_nvrtc
def test_block_reduction_kernels_compile() -> None:
    src = CudaRenderer().render([row_sum(300), softmax_kernel(2, 512, "float32")])
    code = CUDA.compile_source(src, "sm_90", "block reductions")
    assert b"aotrt_k0" in code and b"aotrt_k1" in code


@needs_nvrtc
def test_a_broken_rendering_fails_to_compile() -> None:
    """The compile check can fail: a renderer that emits an unknown type is caught."""
    src = CudaRenderer().render([pointwise("float32")]).replace("int64_t n,", "no_type n,")
    with pytest.raises(CompileError) as info:
        CUDA.compile_source(src, "sm_90", "broken")
    assert "no_type" in info.value.log


def gather_checked(op: str) -> ir.Kernel:
    """out[r, c] = x[clamp(index_check(idx[r]))), c]: an embedding lookup's kernel."""
    i64 = "int64"
    chk = ir.Op(op, (ir.Load(1, ir.Idx(0), i64), ir.Const(10, i64)), i64)
    row = ir.Op("minimum", (ir.Op("maximum", (chk, ir.Const(0, i64)), i64),
                            ir.Const(9, i64)), i64)
    at = ir.Op("add", (ir.Op("mul", (row, ir.Const(4, i64)), i64), ir.Idx(1)), i64)
    return ir.Kernel(f"gather_{op}", (3, 4), (), (ir.Arg("float32", "r"), ir.Arg(i64, "r"),
                                                  ir.Arg("float32", "w")),
                     (ir.store(2, (4, 1), ir.Load(0, at, "float32")),))


def test_an_index_check_reports_through_the_kernels_flag_parameter() -> None:
    src = CudaRenderer().render([gather_checked("index_check"),
                                 gather_checked("index_check_neg")])
    assert "aot_chkidx(" in src and "aot_chkidx_neg(" in src and "AOT_ERR_ARG" in src
    assert "#define AOT_ERR_ARG , aot_err" in src


@needs_nvrtc
def test_index_check_kernels_compile() -> None:
    src = CudaRenderer().render([gather_checked("index_check"),
                                 gather_checked("index_check_neg")])
    code = CUDA.compile_source(src, "sm_90", "index checks")
    assert b"aotrt_k0" in code and b"aotrt_k1" in code
