"""Attention on cuda: cuDNN's fused flash attention for half types where it takes the views
as they are (strided heads included), else two batched cuBLASLt GEMMs around a fused
scale/mask/softmax kernel."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from aotrt.errors import Unsupported
from aotrt.program.strides import contiguous_strides
from aotrt.runtime.backends.cuda.ops.common import (CUDA_TYPE, Scratch, Work, alignment,
                                                    broadcast_strides, i32, kernel, replayed,
                                                    stream_workspace, typed)
from aotrt.runtime.backends.cuda.ops.gemm import operand, plain_plan
from aotrt.runtime.backends.cuda.libraries import DNN_TYPES, Dnn
from aotrt.runtime.tensor import Handle
from aotrt.sources import source

if TYPE_CHECKING:
    from aotrt.runtime.backends.cuda.device import CudaStream

log = logging.getLogger(__name__)

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
    ok = operand(Handle(None, 0, (nb,) + tuple(h.sizes[-2:]), (stride,) + tuple(h.strides[-2:]),
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
    if dt not in CUDA_TYPE:
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
    fused = _cudnn_sdpa(out, q, k, v, mask, is_causal, scale)
    if fused is not None:
        return fused

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
        return 16 if packed is not None else alignment(d.address, d.strides[0] * isz0)

    o_al = 16 if od.alloc is None else alignment(od.address, od.strides[0] * isz0)
    plan1, swap1 = plain_plan(dev, sc_desc, qd, kt, (al(qd, qpack), al(kd, kpack), 16))
    plan2, swap2 = plain_plan(dev, od, sc_desc, vd, (16, al(vd, vpack), o_al))
    # mask: strides broadcast over (batch..., lq, s)
    mask_kind, mptr, mst, mname = 0, 0, [0] * 6, "float32"
    if mask is not None:
        full = batch + (lq, s_len)
        mst = list(broadcast_strides(mask, full))
        mask_kind = 2 if mask.dtype.name == "bool" else 1
        mptr = mask.address
        mname = "float32" if mask_kind == 2 else mask.dtype.name
    bdims = list(batch) + [1] * (4 - len(batch))
    bms = mst[:len(batch)] + [0] * (4 - len(batch))
    sm_kernel = kernel(dev, KERNELS, f"aot_softmax_{dt}_{mname}")
    sm_cfg = dev.launch_config(nb * lq * 32)
    sm_args = [0, mptr, i32(mask_kind), nb, lq, s_len, np.float32(1.0),
               i32(1 if is_causal else 0), i32(len(batch)), *bdims, *bms, mst[-2], mst[-1]]
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
                dev.strided_work(sc.ptr, src, sizes, contiguous_strides(sizes), strides, isz,
                             None)(s)
                ptr[name] = sc.ptr
            sbuf = Scratch(s, nb * lq * s_len * isz)
            scratch.append(sbuf)
            a1, b1 = (ptr["k"], ptr["q"]) if swap1 else (ptr["q"], ptr["k"])
            # scale in the GEMM's alpha keeps half-precision scores in range
            plan1.run(s, a1, b1, sbuf.ptr, sbuf.ptr, 0, scale, 0.0)
            args = typed(list(sm_args))
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
                dev.strided_work(out.address, o_ptr, out.sizes, out.strides,
                             contiguous_strides(out.sizes), isz, None)(s)
        finally:
            for sc in scratch:
                sc.free()
    return work


# ---------------------------------------------------------------------------------------------
# cuDNN's fused attention (fp16/bf16)

_FUSED_MAX_HEAD_DIM = 128


def _unit_strides(sizes: list[int], strides: list[int]) -> list[int]:
    """`strides` with each size-1 dim given the stride a packed tensor would have there
    (cuDNN checks every stride, even where it is never used)."""
    out = list(strides)
    for d in range(len(sizes) - 1, -1, -1):
        if sizes[d] == 1:
            out[d] = sizes[d + 1] * out[d + 1] if d + 1 < len(sizes) else 1
    return out


def _bhsd(h: Handle) -> tuple[list[int], list[int]] | None:
    """A [..., S, D] view as cuDNN's 4-D (b, h, s, d) dims and strides; None past 4-D, or
    when a dim is broadcast (stride 0) or the rows are not 16-byte aligned."""
    if not 2 <= h.ndim <= 4 or h.strides[-1] != 1:
        return None
    sizes = [1] * (4 - h.ndim) + list(h.sizes)
    strides = _unit_strides(sizes, [0] * (4 - h.ndim) + list(h.strides))
    if any(n > 1 and (st == 0 or (d < 3 and st % 8))
           for d, (n, st) in enumerate(zip(sizes, strides))):
        return None
    if h.address % 16:
        return None
    return sizes, strides


def _cudnn_sdpa(out: Handle, q: Handle, k: Handle, v: Handle, mask: Handle | None,
                is_causal: bool, scale: float) -> Work | None:
    """Work of one cuDNN flash-attention graph reading q, k, v (and an additive mask) and
    writing out in place, by strides; None where cuDNN does not take these operands."""
    dev = out.device
    dt_name = out.dtype.name
    if dt_name not in ("float16", "bfloat16") or q.sizes[-1] != v.sizes[-1] or \
            q.sizes[-1] % 8 or q.sizes[-1] > _FUSED_MAX_HEAD_DIM:
        return None
    if mask is not None and mask.dtype.name not in ("bool", "float32", "float16", "bfloat16"):
        return None
    dims = [_bhsd(h) for h in (q, k, v, out)]
    if any(d is None for d in dims) or q.ndim != k.ndim or q.ndim != v.ndim:
        return None
    (qd, qs), (kd, ks), (vd, vs), (od, os_) = dims  # type: ignore[misc]
    if kd[0] != qd[0] or vd[:2] != kd[:2] or qd[1] % kd[1]:
        return None
    # A mask becomes cuDNN's additive bias: a dense (b|1, h|1, L, S) copy in the io dtype,
    # rows padded to 16 bytes, made by a small kernel in the same work (bool: 0 or -inf).
    md = ms = None
    bias_fill = None
    if mask is not None:
        if mask.ndim > 4:
            return None
        full = [qd[0], qd[1], qd[2], kd[2]]
        mst = list(broadcast_strides(mask, full))
        bm, hm, sp = (qd[0] if mst[0] else 1), (qd[1] if mst[1] else 1), -(-kd[2] // 8) * 8
        md, ms = [bm, hm, qd[2], kd[2]], [hm * qd[2] * sp, qd[2] * sp, sp, 1]
        bias_fill = (kernel(dev, KERNELS, f"aot_mask_bias_{dt_name}_{mask.dtype.name}"),
                     dev.launch_config(bm * hm * qd[2] * kd[2]),
                     [mask.address, 0, bm, hm, qd[2], kd[2], sp, *mst], bm * hm * qd[2] * sp)
    dnn = dev.libraries.state(Dnn)
    if not dnn.available:
        return None
    cudnn = dnn.cudnn
    key = ("sdpa", dt_name, tuple(map(tuple, (qd, qs, kd, ks, vd, vs, od, os_))),
           None if md is None else (tuple(md), tuple(ms)), bool(is_causal), float(scale))
    with dnn.lock:
        entry = dnn.graphs.get(key, False)
        if entry is False:
            entry = dnn.graphs[key] = _build_sdpa(dnn, dt_name, qd, qs, kd, ks, vd, vs, od,
                                                  os_, md, ms, is_causal, scale)
    if entry is None:
        return None
    g, tensors, wsize = entry
    handle = dnn.handle
    ptrs = {t: h.address for t, h in zip(tensors, (q, k, v, out))}
    isz = out.dtype.itemsize

    def work(s: "CudaStream") -> None:
        from cuda.core import launch as core_launch

        ws_ptr = stream_workspace(s, wsize) if wsize else 0
        bias = None
        try:
            if bias_fill is not None:
                kern, cfg, args, n = bias_fill
                bias = Scratch(s, n * isz)
                args = typed(list(args))
                args[1] = np.int64(bias.ptr)
                core_launch(s.cs, cfg, kern, *args)
                ptrs[tensors[4]] = bias.ptr
            with dnn.lock:
                cudnn.set_stream(handle, s.handle)
                g.execute(ptrs, ws_ptr, handle=handle)
        finally:
            if bias is not None:
                bias.free()
    return replayed(work)


def _build_sdpa(dnn: Dnn, dt_name: str, qd: list, qs: list, kd: list, ks: list, vd: list,
                vs: list, od: list, os_: list, md: list | None, ms: list | None,
                is_causal: bool, scale: float) -> tuple | None:
    """Build and plan the graph once per shape; None (logged) where cuDNN refuses it."""
    cudnn = dnn.cudnn
    dt = getattr(cudnn.data_type, DNN_TYPES[dt_name])
    try:
        g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=dnn.handle)
        Q = g.tensor(name="q", dim=qd, stride=qs, data_type=dt)
        K = g.tensor(name="k", dim=kd, stride=ks, data_type=dt)
        V = g.tensor(name="v", dim=vd, stride=vs, data_type=dt)
        kw: dict[str, Any] = dict(name="sdpa", q=Q, k=K, v=V, attn_scale=scale,
                                  generate_stats=False)
        tensors = [Q, K, V]
        if md is not None:
            B = g.tensor(name="bias", dim=md, stride=ms, data_type=dt)
            kw["bias"] = B
        if is_causal:
            # torch's is_causal: query i sees keys j <= i, aligned at the top left
            kw["diagonal_alignment"] = cudnn.diagonal_alignment.TOP_LEFT
            kw["diagonal_band_right_bound"] = 0
        O, _ = g.sdpa(**kw)
        O.set_output(True).set_dim(od).set_stride(os_).set_data_type(dt)
        tensors.append(O)
        if md is not None:
            tensors.append(B)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        return g, tensors, int(g.get_workspace_size())
    except Exception as e:  # noqa: BLE001 - cuDNN refused: the two-GEMM path serves
        log.info("cuDNN sdpa refused %s q%s k%s mask %s: %s", dt_name, qd, kd, md, e)
        return None


# ---------------------------------------------------------------------------------------------
# CUDA C in sdpa.cu (compiled after common.PRELUDE, prelude.cuh)

KERNELS = source(__package__, "sdpa.cu")
