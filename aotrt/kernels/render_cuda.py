"""Render kernel IR as CUDA C for NVRTC, as small overrides of `CStyleRenderer`.

Each kernel is `extern "C" __global__ void name(char* p0, ..., int64_t n, int* aot_err)`:
`aot_err` is where it reports an error (an index out of range), its library's flag. Pointwise
kernels run one thread per outer element over a grid-stride loop. Kernels that reduce over
32 or more elements per outer element run one warp per outer element: the lanes split the
reduce loop and combine with shuffles, so a row of a layer norm or softmax is read
coalesced instead of by one thread.

The source needs no headers (NVRTC finds none on a bare machine): fixed-width types, the
infinity macros and the half/bfloat16 conversions (one PTX instruction each) are defined
in render_cuda_prelude.cuh. Half-precision values are computed in float and rounded on
store, as on the cpu.
"""

from __future__ import annotations


from aotrt.kernels import ir
from aotrt.kernels.render_c import COMPUTE_TYPE, CStyleRenderer, _label
from aotrt.sources import source

#: threads per block of every generated kernel
BLOCK = 256
#: a reduce domain at least this long gets a warp per outer element
WARP_REDUCE_MIN = 32
#: ... and at least this long a whole block: BERT's LayerNorm rows (768) took 13 us with a
#: warp per row and 9 us with a block per row on the H200 (issue #9, 2026-12-02)
BLOCK_REDUCE_MIN = 256

STORAGE_TYPE_CUDA = {
    "float32": "float", "float16": "uint16_t", "bfloat16": "uint16_t", "int64": "int64_t",
    "int32": "int32_t", "int16": "int16_t", "int8": "int8_t", "uint8": "uint8_t",
    "bool": "bool",
}

_PREAMBLE = source(__package__, "render_cuda_prelude.cuh")

# Warp all-reduces: every lane ends with the result (butterfly), so later code may use it
# from any lane. Bool values travel as int.
_WARP = source(__package__, "render_cuda_warp.cuh")

# Block all-reduces: warp results meet in shared memory; the first barrier keeps a block
# from overwriting partials that another warp of it still reads from the previous call.
_BLOCK = source(__package__, "render_cuda_block.cuh")


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


class CudaRenderer(CStyleRenderer):
    """CUDA C for the cuda device (compiled by NVRTC)."""

    def preamble(self) -> str:
        """Types, macros, conversions, the shared helpers and the warp reductions."""
        helpers = self.HELPERS.replace("{q}", "static __device__ __forceinline__")
        return _PREAMBLE + helpers + _WARP + _BLOCK

    @staticmethod
    def lanes(k: ir.Kernel) -> int:
        """Threads that work on one outer element: a block or a warp for long reductions,
        else 1."""
        if not k.rshape:
            return 1
        rn = _prod(k.rshape)
        if rn >= BLOCK_REDUCE_MIN:
            return BLOCK
        return 32 if rn >= WARP_REDUCE_MIN else 1

    def render_kernel(self, k: ir.Kernel, index: int = 0) -> str:
        """One kernel; remembers how many threads share one outer element."""
        self._lanes = self.lanes(k)
        self._warp = self._lanes > 1
        return super().render_kernel(k, index)

    def flat_index(self) -> str:
        """The grid-stride loop variable."""
        return "it"

    def decompose(self, flat: str, shape: tuple[int, ...], dim0: int) -> list[str]:
        """Coordinates of `flat`; 32-bit division when the domain fits (int64 division is
        emulated on the GPU and dominates cheap pointwise kernels)."""
        if _prod(shape) >= 1 << 31:
            return super().decompose(flat, shape, dim0)
        lines = []
        rest = f"((uint32_t)({flat}))"
        for j in range(len(shape) - 1, -1, -1):
            d = dim0 + j
            if j == 0:
                lines.append(f"const int64_t d{d} = (int64_t)({rest});")
            else:
                lines.append(f"const int64_t d{d} = (int64_t)({rest} % {shape[j]}u);")
                lines.append(f"const uint32_t q{d} = {rest} / {shape[j]}u;")
                rest = f"q{d}"
        return lines

    def _open_rloop(self, depth: int, var: str) -> None:
        if not self._warp:
            super()._open_rloop(depth, var)
            return
        rn = _prod(self._k.rshape)
        step = self._lanes
        self._emit(depth, f"for (int64_t {var} = lane; {var} < {rn}; {var} += {step}) {{")
        for line in self.decompose(var, self._k.rshape, len(self._k.shape)):
            self._emit(depth + 1, line)

    def _reduce(self, e: ir.Reduce, scope: dict, depth: int) -> str:
        acc = super()._reduce(e, scope, depth)
        if self._warp:
            scope_ = "block" if self._lanes == BLOCK else "warp"
            self._emit(depth, f"{acc} = aot_{scope_}_{e.op}({acc});")
        return acc

    def round_to(self, x: str, dtype: str) -> str:
        """Round through the storage type, so casts inside a kernel round like torch."""
        if dtype == "bfloat16":
            return f"aot_bf2f(aot_f2bf({x}))"
        return f"aot_h2f(aot_f2h({x}))"

    def load(self, dtype: str, arg: int, idx: str) -> str:
        """Typed read widened to the compute type."""
        if dtype == "bool":
            # Any byte may sit in a bool argument; reading it as bool is undefined.
            return f"(((const uint8_t *)p{arg})[{idx}] != 0)"
        raw = f"((const {STORAGE_TYPE_CUDA[dtype]} *)p{arg})[{idx}]"
        if dtype == "float16":
            return f"aot_h2f({raw})"
        if dtype == "bfloat16":
            return f"aot_bf2f({raw})"
        return f"(({COMPUTE_TYPE[dtype]}){raw})"

    def store(self, dtype: str, arg: int, idx: str, val: str) -> str:
        """Typed write rounded from the compute type."""
        dst = f"(({STORAGE_TYPE_CUDA[dtype]} *)p{arg})[{idx}]"
        if dtype == "float16":
            return f"{dst} = aot_f2h({val});"
        if dtype == "bfloat16":
            return f"{dst} = aot_f2bf({val});"
        return f"{dst} = ({STORAGE_TYPE_CUDA[dtype]})({val});"

    def wrap_kernel(self, k: ir.Kernel, body: str) -> str:
        """A __global__ function over a grid-stride loop of outer elements (or of warps)."""
        params = ", ".join([f"char* p{i}" for i in range(len(k.args))]
                           + ["int64_t n", "int* aot_err"])
        inner = "\n".join("  " + line for line in body.splitlines())
        if self._lanes == BLOCK:
            head = ("  const int64_t lane = threadIdx.x;\n"
                    "  for (int64_t it = blockIdx.x; it < n; it += gridDim.x) {\n")
        elif self._warp:
            head = ("  const int64_t lane = threadIdx.x & 31;\n"
                    "  const int64_t step = ((int64_t)gridDim.x * blockDim.x) >> 5;\n"
                    "  for (int64_t it = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;"
                    " it < n; it += step) {\n")
        else:
            head = ("  const int64_t step = (int64_t)gridDim.x * blockDim.x;\n"
                    "  for (int64_t it = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;"
                    " it < n; it += step) {\n")
        return (f"/* kernel {_label(k.name)} */\n"
                f'extern "C" __global__ void __launch_bounds__({BLOCK}) {self._symbol}({params}) '
                f"{{\n{head}{inner}\n  }}\n}}\n")
