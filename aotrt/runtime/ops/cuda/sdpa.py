"""Attention on cuda: two batched cuBLASLt GEMMs around a fused scale/mask/softmax kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from aotrt.errors import Unsupported
from aotrt.runtime.ops.cuda.common import (_CUDA_TYPE, Scratch, Work, _alignment,
                                           _broadcast_strides, _i32, _kernel, _typed)
from aotrt.runtime.ops.cuda.gemm import _operand, _plain_plan
from aotrt.runtime.tensor import Handle, contiguous_strides

if TYPE_CHECKING:
    from aotrt.runtime.devices.cuda import CudaStream

# ---------------------------------------------------------------------------------------------
# attention: two batched GEMMs around a fused scale/mask/softmax kernel


def _fold_batch(h: Handle, nb: int) -> Handle | None:
    """`h` [..., R, C] as [nb, R, C] when its batch dims fold into one stride, else None."""
    bs = [(s, st) for s, st in zip(h.sizes[:-2], h.strides[:-2]) if s != 1]
    if not bs:
        stride = 0
    else:
        stride, expect = bs[-1][1], bs[-1][1] * bs[-1][0]
        for s, st in reversed(bs[:-1]):
            if st != expect:
                return None
            expect = st * s
    if h.numel and nb != max(1, h.numel // (h.sizes[-1] * h.sizes[-2])):
        return None
    ok = _operand(Handle(None, 0, (nb,) + tuple(h.sizes[-2:]), (stride,) + tuple(h.strides[-2:]),
                         h.dtype, h.device, h.owner), False)
    if ok is None:
        return None
    return Handle(h.alloc, h.byte_offset, (nb,) + tuple(h.sizes[-2:]),
                  (stride,) + tuple(h.strides[-2:]), h.dtype, h.device, h.owner)


def make_sdpa(out: Handle, q: Handle, k: Handle, v: Handle, mask: Handle | None,
              is_causal: bool, scale: float, groups: int) -> Work:
    """softmax(q k^T * scale + mask) v for [..., L, E] views (batch dims broadcast, GQA)."""
    dev = out.device
    dt = out.dtype.name
    if dt not in _CUDA_TYPE:
        raise Unsupported(f"cuda sdpa: dtype {dt}")
    batch = tuple(out.sizes[:-2])
    nb = 1
    for s in batch:
        nb *= s
    lq, e = q.sizes[-2], q.sizes[-1]
    s_len, ev = k.sizes[-2], v.sizes[-1]
    if len(batch) > 4:
        raise Unsupported("cuda sdpa: more than 4 batch dims")
    if s_len == 0:
        return dev.strided_fill_work(out, 0)  # no keys: torch gives zeros

    def expanded(h: Handle) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """sizes/strides of h broadcast to the full batch (GQA heads repeated)."""
        sizes, strides = list(h.sizes[:-2]), list(h.strides[:-2])
        if groups > 1 and h is not q:
            # head index hq -> hq // groups: view dim -3 as (heads, groups) with stride 0
            hs = strides[-1]
            sizes = sizes[:-1] + [sizes[-1], groups]
            strides = strides[:-1] + [hs, 0]
            full = list(batch[:-1]) + [batch[-1] // groups, groups]
        else:
            full = list(batch)
        pad = len(full) - len(sizes)
        bst = []
        for i, n in enumerate(full):
            j = i - pad
            bst.append(0 if j < 0 or sizes[j] == 1 else strides[j])
        return tuple(full) + tuple(h.sizes[-2:]), tuple(bst) + tuple(h.strides[-2:])

    # Operands readable as one strided batch are used in place; others are packed.
    def operand(h: Handle) -> tuple[Handle, tuple | None]:
        if groups == 1 and tuple(h.sizes[:-2]) == batch:
            f = _fold_batch(h, nb)
            if f is not None:
                return f, None
        sizes, strides = expanded(h)
        packed = Handle(None, 0, (nb,) + tuple(h.sizes[-2:]),
                        contiguous_strides((nb,) + tuple(h.sizes[-2:])), h.dtype, h.device,
                        h.owner)
        return packed, (h.address, sizes, strides)

    qd, qpack = operand(q)
    kd, kpack = operand(k)
    vd, vpack = operand(v)
    kt = Handle(kd.alloc, kd.byte_offset, (nb, e, s_len), (kd.strides[0], kd.strides[2],
                                                           kd.strides[1]), kd.dtype, kd.device,
                kd.owner)
    sc_desc = Handle(None, 0, (nb, lq, s_len), contiguous_strides((nb, lq, s_len)), q.dtype,
                     q.device, q.owner)
    od = _fold_batch(out, nb) if tuple(out.sizes[:-2]) == batch else None
    o_scatter = od is None
    if o_scatter:
        od = Handle(None, 0, (nb, lq, ev), contiguous_strides((nb, lq, ev)), out.dtype,
                    out.device, out.owner)
    isz0 = out.dtype.itemsize

    def al(d: Handle, packed: Any) -> int:
        return 16 if packed is not None else _alignment(d.address, d.strides[0] * isz0)

    o_al = 16 if od.alloc is None else _alignment(od.address, od.strides[0] * isz0)
    plan1, swap1 = _plain_plan(dev, sc_desc, qd, kt, (al(qd, qpack), al(kd, kpack), 16))
    plan2, swap2 = _plain_plan(dev, od, sc_desc, vd, (16, al(vd, vpack), o_al))
    # mask: strides broadcast over (batch..., lq, s)
    mask_kind, mptr, mst, mname = 0, 0, [0] * 6, "float32"
    if mask is not None:
        full = batch + (lq, s_len)
        mst = list(_broadcast_strides(mask, full))
        mask_kind = 2 if mask.dtype.name == "bool" else 1
        mptr = mask.address
        mname = "float32" if mask_kind == 2 else mask.dtype.name
    bdims = list(batch) + [1] * (4 - len(batch))
    bms = mst[:len(batch)] + [0] * (4 - len(batch))
    sm_kernel = _kernel(dev, f"aot_softmax_{dt}_{mname}")
    sm_cfg = dev.launch_config(nb * lq * 32)
    sm_args = [0, mptr, _i32(mask_kind), nb, lq, s_len, np.float32(1.0),
               _i32(1 if is_causal else 0), _i32(len(batch)), *bdims, *bms, mst[-2], mst[-1]]
    isz = out.dtype.itemsize

    def work(s: "CudaStream") -> None:
        from cuda.core import launch

        scratch: list[Scratch] = []
        try:
            ptr = {}
            for name, d, pack, h in (("q", qd, qpack, q), ("k", kd, kpack, k),
                                     ("v", vd, vpack, v)):
                if pack is None:
                    ptr[name] = d.address
                    continue
                src, sizes, strides = pack
                sc = Scratch(s, d.numel * isz)
                scratch.append(sc)
                dev._strided(sc.ptr, src, sizes, contiguous_strides(sizes), strides, isz,
                             None)(s)
                ptr[name] = sc.ptr
            sbuf = Scratch(s, nb * lq * s_len * isz)
            scratch.append(sbuf)
            a1, b1 = (ptr["k"], ptr["q"]) if swap1 else (ptr["q"], ptr["k"])
            # scale in the GEMM's alpha keeps half-precision scores in range
            plan1.run(s, a1, b1, sbuf.ptr, sbuf.ptr, 0, scale, 0.0)
            args = _typed(list(sm_args))
            args[0] = np.int64(sbuf.ptr)
            launch(s.cs, sm_cfg, sm_kernel, *args)
            o_ptr = od.address
            if o_scatter:
                osc = Scratch(s, nb * lq * ev * isz)
                scratch.append(osc)
                o_ptr = osc.ptr
            a2, b2 = (ptr["v"], sbuf.ptr) if swap2 else (sbuf.ptr, ptr["v"])
            plan2.run(s, a2, b2, o_ptr, o_ptr, 0, 1.0, 0.0)
            if o_scatter:
                dev._strided(out.address, o_ptr, out.sizes, out.strides,
                             contiguous_strides(out.sizes), isz, None)(s)
        finally:
            for sc in scratch:
                sc.free()
    return work
