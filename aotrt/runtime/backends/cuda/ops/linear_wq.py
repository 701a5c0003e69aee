"""linear_wq on cuda: a fused dequantize-GEMV kernel for a few rows, and for more rows the
weights dequantized into scratch and multiplied by cuBLASLt.

A decode step reads each weight once, so its time is the weights' bytes over the memory
bandwidth: the GEMV reads the int8 or int4 bytes themselves (a half or a quarter of bf16's)
and never writes a dequantized copy. Prefill is compute-bound, where the tensor-core GEMM
over a dequantized scratch copy (N x K in x's dtype, freed in stream order) wins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aotrt.runtime.ops._common import overlaps
from aotrt.runtime.backends.cuda.ops.common import (Scratch, Work, alignment, copy_packed,
                                                    copy_unpacked, i32, kernel, typed)
from aotrt.runtime.backends.cuda.ops.gemm import plain_plan
from aotrt.runtime.ops.linear_wq import dense, rows_of
from aotrt.runtime.tensor import Handle
from aotrt.sources import source

if TYPE_CHECKING:
    from aotrt.runtime.backends.cuda.device import CudaStream

#: rows the GEMV takes (each tile of 8 rows reads the weights once more, from L2)
GEMV_MAX_ROWS = 16


def make_linear_wq(out: Handle, x: Handle, qweight: Handle, scales: Handle,
                   zeros: Handle | None, bias: Handle | None, bits: int,
                   group_size: int) -> Work:
    """The cuda work of linear_wq (arguments validated by check_linear_wq)."""
    dev = out.device
    n, k = qweight.sizes[0], x.sizes[-1]
    groups = k // group_size if bits == 4 else 1
    m = out.numel // n
    isz = x.dtype.itemsize
    suffix = f"{bits}_{x.dtype.name}_{scales.dtype.name}"
    gemv = m <= GEMV_MAX_ROWS or k == 0
    # The kernels index q, scales, zeros and bias row-major; other views go through packed
    # scratch copies (a program's weights are dense constants, so this is for odd files).
    packs = {id(h) for h in (qweight, scales, zeros, bias) if h is not None and not dense(h)}
    xr = rows_of(x)
    # The GEMV's warps write out while others still read x: an overlapping out gets scratch.
    ins = [x, qweight, scales, zeros, bias]
    o_rows = rows_of(out)
    o_direct = o_rows is not None and not any(h is not None and overlaps(out, h) for h in ins)
    x_direct = xr is not None
    xrs = xr[0] if x_direct else k
    ors = o_rows[0] if o_direct else n

    def pointers(s: "CudaStream", scratch: list[Scratch]) -> dict[str, int]:
        ptr = {"x": x.address, "out": out.address}
        for name, h in (("q", qweight), ("s", scales), ("z", zeros), ("b", bias)):
            ptr[name] = 0 if h is None else h.address
            if h is not None and id(h) in packs:
                sc = Scratch(s, h.numel * h.dtype.itemsize)
                scratch.append(sc)
                copy_packed(dev, s, sc.ptr, h)
                ptr[name] = sc.ptr
        if not x_direct:
            sc = Scratch(s, m * k * isz)
            scratch.append(sc)
            copy_packed(dev, s, sc.ptr, x)
            ptr["x"] = sc.ptr
        if not o_direct:
            sc = Scratch(s, m * n * isz)
            scratch.append(sc)
            ptr["out"] = sc.ptr
        return ptr

    if gemv:
        kern = kernel(dev, KERNELS, f"aot_wq_gemv{suffix}")
        cfg = dev.launch_config(n * 32)
        # 8-byte (int8) or 4-byte (int4) loads of each row's chunks where rows stay aligned
        unit = 8 if bits == 8 else 4
        row_bytes = k if bits == 8 else k // 2
        # a packed copy is scratch, 256-byte aligned
        vec = row_bytes % unit == 0 and (id(qweight) in packs or qweight.address % unit == 0)

        def work(s: "CudaStream") -> None:
            from cuda.core import launch

            scratch: list[Scratch] = []
            try:
                ptr = pointers(s, scratch)
                args = typed([ptr["x"], ptr["q"], ptr["s"], ptr["z"], ptr["b"], ptr["out"], m, n,
                              k, groups, group_size, xrs, ors])
                launch(s.cs, cfg, kern, *args, i32(1 if vec else 0))
                if not o_direct:
                    copy_unpacked(dev, s, out, ptr["out"])
            finally:
                for sc in scratch:
                    sc.free()
        return work

    deq = kernel(dev, KERNELS, f"aot_wq_dequant{suffix}")
    deq_cfg = dev.launch_config(n * k)
    # out[m, n] = x[m, k] @ w^T, w^T read as the column-major [K, N] view of scratch w [N, K]
    o2 = Handle(None, 0, (m, n), (ors, 1), out.dtype, out.device, out.owner)
    x2 = Handle(None, 0, (m, k), (xrs, 1), x.dtype, x.device, x.owner)
    wt = Handle(None, 0, (k, n), (1, k), x.dtype, x.device, x.owner)
    x_al = alignment(x.address if x_direct else 0, xrs * isz)
    o_al = alignment(out.address if o_direct else 0, ors * isz)
    plan, swap = plain_plan(dev, o2, x2, wt, (x_al, alignment(k * isz), o_al))

    def work(s: "CudaStream") -> None:
        from cuda.core import launch

        scratch: list[Scratch] = []
        try:
            ptr = pointers(s, scratch)
            w = Scratch(s, n * k * isz)
            scratch.append(w)
            launch(s.cs, deq_cfg, deq, *typed([ptr["q"], ptr["s"], ptr["z"], w.ptr, n, k,
                                              groups, group_size]))
            beta = 0.0
            if bias is not None:
                # the bias broadcast into out first, then accumulated through C = D
                dev.strided_work(ptr["out"], ptr["b"], (m, n), (ors, 1),
                                 (0, 1 if id(bias) in packs else bias.strides[0]), isz,
                                 None)(s)
                beta = 1.0
            a, b = (w.ptr, ptr["x"]) if swap else (ptr["x"], w.ptr)
            plan.run(s, a, b, ptr["out"], ptr["out"], 0, 1.0, beta)
            if not o_direct:
                copy_unpacked(dev, s, out, ptr["out"])
        finally:
            for sc in scratch:
                sc.free()
    return work


# ---------------------------------------------------------------------------------------------
# CUDA C in linear_wq.cu (compiled after common.PRELUDE, prelude.cuh)

KERNELS = source(__package__, "linear_wq.cu")
