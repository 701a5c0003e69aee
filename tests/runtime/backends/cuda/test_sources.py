"""Every CUDA source aotrt ships compiles with NVRTC, on a machine without a GPU (CI).

NVRTC needs no device, so a broken kernel fails here instead of waiting for the next GPU
run (issue #9, tests): each library op's own kernels (KERNELS in
aotrt/runtime/backends/cuda/ops/<op>.py, compiled after common.PRELUDE), the device's copy/fill
helpers (aotrt/runtime/backends/cuda/copies.py) and the CUDA renderer's
output for the fuzzer's seed programs (integer, division, cast, reduction and softmax
kernels; aotrt/kernels/render_cuda.py).
"""

from __future__ import annotations

import pytest

from aotrt.errors import CompileError
from aotrt.runtime.backends.cuda import copies as cuda_copies
from aotrt.kernels.render_cuda import CudaRenderer
from tests.fuzz.mutate import SEEDS

cuda_mod = pytest.importorskip("aotrt.runtime.backends.cuda.device")
common = pytest.importorskip("aotrt.runtime.backends.cuda.ops.common")

#: The sources hold no arch-dependent code: the CI slice compiles each at sm_90 (the H100 and
#: H200), --all at sm_80 too (about 25 s more on 2 cores).
ARCHS = ["sm_90", pytest.param("sm_80", marks=pytest.mark.slow)]


def _nvrtc_ok() -> bool:
    try:
        cuda_mod.compile_source('extern "C" __global__ void k() {}', "sm_90")
        return True
    except CompileError:
        return False


pytestmark = pytest.mark.skipif(not _nvrtc_ok(), reason="NVRTC is not installed here")


OP_KERNELS = {
    "pool": ("aot_maxpool_float16", "aot_maxpool_bfloat16", "aot_maxpool_nhwc8_float16",
             "aot_maxpool_nhwc1_bfloat16", "aot_maxpool_nhwc4_float32"),
    "upsample": ("aot_upsample1", "aot_upsample8"),
    "sdpa": ("aot_softmax_float16_float32", "aot_softmax_bfloat16_bfloat16"),
    "conv": ("aot_im2col2", "aot_col2im_float32", "aot_conv_epilogue_float16"),
    "topk": ("aot_topk_int64", "aot_topk_uint8"),
    "linear_wq": ("aot_wq_gemv4_bfloat16_bfloat16", "aot_wq_gemv8_float16_float32",
                  "aot_wq_dequant4_float32_bfloat16", "aot_wq_dequant8_bfloat16_float16"),
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("op", sorted(OP_KERNELS))
def test_library_op_kernels_compile(op: str, arch: str) -> None:
    mod = pytest.importorskip(f"aotrt.runtime.backends.cuda.ops.{op}")
    code = cuda_mod.compile_source(common.PRELUDE + mod.KERNELS, arch, f"{op} kernels")
    for name in OP_KERNELS[op]:
        assert name.encode() in code


@pytest.mark.parametrize("arch", ARCHS)
def test_copy_fill_helpers_compile(arch: str) -> None:
    code = cuda_mod.compile_source(cuda_copies.COPY_SOURCE, arch, "copy/fill")
    for name in ("aot_copy2", "aot_fill8", "aot_rows16", "aot_rows8", "aot_rows4"):
        assert name.encode() in code


@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_rendered_seed_programs_compile(seed: str) -> None:
    prog = SEEDS[seed]()
    if not prog.kernels:
        pytest.skip(f"seed {seed} has no kernels")
    kernels = list(prog.kernels.values()) if isinstance(prog.kernels, dict) else \
        list(prog.kernels)
    src = CudaRenderer().render(kernels)
    code = cuda_mod.compile_source(src, "sm_90", f"seed {seed}")
    for i in range(len(kernels)):
        assert f"aotrt_k{i}".encode() in code


def test_a_broken_kernel_fails_with_its_log() -> None:
    topk = pytest.importorskip("aotrt.runtime.backends.cuda.ops.topk")
    bad = common.PRELUDE + topk.KERNELS.replace("AOT_TOPK(aot_topk_uint8, unsigned char)",
                                  "AOT_TOPK(aot_topk_uint8, no_such_type)")
    with pytest.raises(CompileError) as info:
        cuda_mod.compile_source(bad, "sm_90", "library op kernels")
    assert "no_such_type" in info.value.log
