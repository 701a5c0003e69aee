"""Convolution on cuda: cuDNN for every float dtype, else im2col (or col2im) around cuBLASLt
GEMMs."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from aotrt.errors import Unsupported
from aotrt.program.strides import contiguous_strides
from aotrt.runtime.ops._common import overlaps
from aotrt.runtime.backends.cuda.ops.common import (CUDA_TYPE, Scratch, Work, alignment,
                                                    copy_packed, copy_unpacked, i32, kernel,
                                                    replayed, stream_workspace, typed)
from aotrt.runtime.backends.cuda.ops.gemm import operand, plain_plan
from aotrt.runtime.backends.cuda.libraries import DNN_TYPES, Dnn
from aotrt.runtime.backends.cuda.ops.tf32 import faster_of
from aotrt.runtime.tensor import Handle
from aotrt.sources import source

if TYPE_CHECKING:
    from aotrt.runtime.backends.cuda.device import CudaDevice, CudaStream

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# convolution: cuDNN (frontend graph, bias fused), else im2col + cuBLASLt

#: cuDNN numerical notes of engines whose results miss the dtype's own accuracy
_INEXACT_NOTES = ("REDUCED_PRECISION_REDUCTION", "DOWN_CONVERT_INPUTS", "FFT", "WINOGRAD",
                  "WINOGRAD_TILE_4x4", "WINOGRAD_TILE_6x6", "WINOGRAD_TILE_13x13")


def _get_dnn(dev: "CudaDevice") -> Dnn | None:
    """The device's cuDNN, or None where it is missing."""
    dnn = dev.libraries.state(Dnn)
    return dnn if dnn.available else None


def _as_dnn(h: Handle) -> tuple[list[int], list[int]]:
    """A 3-D (N, C, L) view as (N, C, 1, L), the rank cuDNN takes; 4-D and 5-D as they are."""
    if h.ndim == 3:
        n, c, l_ = h.sizes
        s0, s1, s2 = h.strides
        return [n, c, 1, l_], [s0, s1, l_ * s2, s2]
    return list(h.sizes), list(h.strides)


def _as4d(h: Handle) -> tuple[list[int], list[int]]:
    """A 3-D view as (N, C, 1, L), a 5-D one (N, C, D, H, W) as (N, C, D*H, W) where D and H
    merge (the elementwise epilogue kernel only needs each element once, in 4 coordinates)."""
    if h.ndim == 5:
        n, c, d, hh, w = h.sizes
        s0, s1, s2, s3, s4 = h.strides
        if d > 1 and hh > 1 and s2 != hh * s3:
            raise Unsupported(f"cuda convolution epilogue: 3-D view {list(h.sizes)} with "
                              f"strides {list(h.strides)} (depth and height do not merge)")
        return [n, c, d * hh, w], [s0, s1, s3 if hh > 1 else s2, s4]
    return _as_dnn(h)


def _geometry(p: Any, ndim: int) -> tuple[list[int], list[int], list[int]]:
    if ndim == 3:
        return [0] + list(p.padding), [1] + list(p.stride), [1] + list(p.dilation)
    return list(p.padding), list(p.stride), list(p.dilation)


def _dense4d(h: Handle) -> tuple[list[int], list[int], bool]:
    """(sizes, strides, direct) of a 3-D/4-D/5-D conv operand as cuDNN gets it: the view itself
    when it is packed (any dense order) and 16-byte aligned, else a packed copy in the view's
    own channel order (`_packed_like`)."""
    sz, st = _as_dnn(h)
    if h.packed and h.address % 16 == 0 and all(x > 0 for n, x in zip(sz, st) if n > 1):
        canon = _canonical_strides(sz, st)
        if canon is not None:
            return sz, canon, True
        # size-1 dims get the stride a packed tensor would have (cuDNN checks them)
        fixed = list(st)
        for i in range(len(sz) - 1, -1, -1):
            if sz[i] == 1:
                inner = [st[j] * sz[j] for j in range(len(sz)) if sz[j] > 1 and st[j] < 2 ** 62]
                fixed[i] = max([1] + [v for v in inner])
        return sz, fixed, True
    return sz, _packed_like(sz, st), False


def _packed_like(sz: list[int], st: list[int]) -> list[int]:
    """Packed strides for a copy of a (sizes, strides) view: N...C when the view keeps its
    channels innermost, else NC... row-major. A channel slice of a channels-last
    concatenation copied as NCHW gave cuDNN mixed layouts (NHWC input, NCHW output), and
    its fused engines then left parts of the output unwritten (compute-sanitizer initcheck
    on DLA-34 at fp16, H200, 2026-12-02)."""
    real = [x for n, x in zip(sz, st) if n > 1]
    return _dense_strides(sz, sz[1] > 1 and len(sz) > 2 and st[1] == min(real))


def _canonical_strides(sz: list[int], st: list[int]) -> list[int] | None:
    """The strides of the packed NC... or N...C tensor these dims are, size-1 dims included,
    where the view is one; else None. Size-1 dims given the largest stride become the
    outermost dims to cuDNN, which then computed garbage: R(2+1)D's (64, 45, 3, 1, 1) NDHWC
    weights (error 1.2 on the H200, 2026-12-02), and Inception's (160, 128, 7, 1) KCRS
    weights at float32 (error 1.4, 2026-12-03)."""
    canon = _dense_strides(sz, sz[1] > 1 and st[1] == 1 and any(n > 1 for n in sz[2:]))
    if all(canon[d] == st[d] for d in range(len(sz)) if sz[d] > 1):
        return canon
    return None


def _dense_strides(sz: list[int], channels_last: bool) -> list[int]:
    """The strides of a packed tensor of sizes `sz`, N...C or NC... (size-1 dims included)."""
    order = [0, *range(2, len(sz)), 1] if channels_last else list(range(len(sz)))
    strides = [0] * len(sz)
    acc = 1
    for d in reversed(order):
        strides[d] = acc
        acc *= sz[d]
    return strides


def _cudnn_conv(dnn: Dnn, out: Handle, x: Handle, w: Handle, bias: Handle | None,
                p: Any, xb: Handle, ob: Handle, residual: Handle | None = None,
                activation: str = "none", tf32: bool = False) -> Work:
    """One cuDNN graph: conv_fprop (or dgrad), then bias, the residual add and the
    activation as pointwise nodes, computed in float and written once; `tf32`: float32 may
    take TF32 tensor-core engines."""
    cudnn = dnn.cudnn
    dev = out.device
    dt = getattr(cudnn.data_type, DNN_TYPES[out.dtype.name])
    xs, xst, x_direct = _dense4d(xb)
    ws, wst, w_direct = _dense4d(w)
    os_, ost, o_direct = _dense4d(ob)
    b_direct = bias is None or (bias.strides[0] == 1 or bias.sizes[0] == 1) and \
        bias.address % 16 == 0
    rb = None if residual is None else _batched(residual, p)
    rs, rst, r_direct = _dense4d(rb) if rb is not None else ([], [], True)
    pad, stride, dil = _geometry(p, xb.ndim)
    key = (out.dtype.name, p.transposed, tuple(xs), tuple(xst), tuple(ws), tuple(wst),
           tuple(os_), tuple(ost), tuple(pad), tuple(stride), tuple(dil), bias is not None,
           tuple(rst), activation, tf32)

    def build(exact: bool) -> tuple:
        """The graph, its tensors and workspace size; `exact`: no tensor-core engines."""
        g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=dnn.handle)
        X = g.tensor(name="x", dim=xs, stride=xst, data_type=dt)
        W = g.tensor(name="w", dim=ws, stride=wst, data_type=dt)
        if p.transposed:
            # a transposed convolution is the data gradient of the forward one
            Y = g.conv_dgrad(loss=X, filter=W, padding=pad, stride=stride, dilation=dil,
                             compute_data_type=cudnn.data_type.FLOAT, name="convt")
            Y.set_dim(os_).set_stride(ost)
        else:
            Y = g.conv_fprop(image=X, weight=W, padding=pad, stride=stride, dilation=dil,
                             compute_data_type=cudnn.data_type.FLOAT, name="conv")
        B = None
        if bias is not None:
            co = bias.sizes[0]
            spatial = [1] * (len(os_) - 2)
            B = g.tensor(name="b", dim=[1, co, *spatial], stride=[co, 1, *spatial],
                         data_type=dt)
            Y = g.bias(input=Y, bias=B, name="bias")
        R = None
        if rb is not None:
            R = g.tensor(name="r", dim=rs, stride=rst, data_type=dt)
            Y = g.add(a=Y, b=R, name="residual")
        if activation == "relu":
            Y = g.relu(input=Y, name="relu")
        elif activation == "relu6":
            Y = g.relu(input=Y, lower_clip=0.0, upper_clip=6.0, name="relu6")
        elif activation == "silu":
            Y = g.swish(input=Y, name="silu")
        Y.set_output(True).set_data_type(dt).set_dim(os_).set_stride(ost)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        # Engines that trade accuracy for speed are not used: Winograd and FFT transforms,
        # reductions in the io type and inputs converted down lose about 1e-2 per
        # convolution in half types, which a deep network (ResNet-101, RegNet-16GF and
        # ConvNeXt-B at fp16 in the zoo) compounds into a wrong answer. Tensor-core
        # engines run float32 as TF32 (10-bit mantissa): float32 keeps float32 engines
        # (`exact`) unless the stream's Fp32Math allows TF32, as torch's cudnn.allow_tf32
        # does, and then only where TF32 pays (`faster_of`).
        notes = [getattr(cudnn.numerical_note, n) for n in _INEXACT_NOTES
                 if hasattr(cudnn.numerical_note, n)]
        if exact:
            notes.append(cudnn.numerical_note.TENSOR_CORE)
        g.deselect_numeric_notes(notes)
        g.check_support()
        g.build_plans()
        return g, X, W, B, R, Y, int(g.get_workspace_size())

    with dnn.lock:
        entry = dnn.graphs.get(key)
        if entry is None:
            if out.dtype.name == "float32" and tf32:
                sizes = [math.prod(xs) * 4, math.prod(ws) * 4,
                         0 if bias is None else bias.sizes[0] * 4,
                         math.prod(rs) * 4 if rb is not None else 0, math.prod(os_) * 4]
                entry = faster_of(dnn, lambda: build(True), lambda: build(False), sizes)
            else:
                entry = build(out.dtype.name == "float32")
            dnn.graphs[key] = entry
    g, X, W, B, R, Y, wsize = entry
    handle = dnn.handle
    isz = out.dtype.itemsize
    xv, wv, ov = _dnn_view(xb), _dnn_view(w), _dnn_view(ob)
    rv = None if rb is None else _dnn_view(rb)
    # a residual the output overlaps is read from a copy, made before the graph writes
    r_overlaps = rb is not None and overlaps(out, residual)

    def work(s: "CudaStream") -> None:
        scratch: list[Scratch] = []
        try:
            def packed(view: Handle, direct: bool, copy_in: bool,
                       strides: list[int] | None) -> int:
                if direct:
                    return view.address
                sc = Scratch(s, view.numel * isz)
                scratch.append(sc)
                if copy_in:
                    copy_packed(dev, s, sc.ptr, view, strides)
                return sc.ptr
            pack = {X: packed(xv, x_direct, True, xst), W: packed(wv, w_direct, True, wst),
                    Y: packed(ov, o_direct, False, ost)}
            if B is not None:
                pack[B] = packed(bias, b_direct, True, None)
            if R is not None:
                # copies are laid out as the graph's R says (an overlapping residual was
                # copied row-major under NHWC strides before: wrong values)
                pack[R] = packed(rv, r_direct and not r_overlaps, True, rst)
            ws_ptr = stream_workspace(s, wsize) if wsize else 0
            with dnn.lock:
                cudnn.set_stream(handle, s.handle)
                g.execute(pack, ws_ptr, handle=handle)
            if not o_direct:
                copy_unpacked(dev, s, ov, pack[Y], ost)
        finally:
            for sc in scratch:
                sc.free()
    return replayed(work)


def _dnn_view(h: Handle) -> Handle:
    """`h` at the rank cuDNN is given it (3-D as 4-D)."""
    sz, st = _as_dnn(h)
    return Handle(h.alloc, h.byte_offset, tuple(sz), tuple(st), h.dtype, h.device, h.owner)


def make_conv(out: Handle, x: Handle, w: Handle, bias: Handle | None, p: Any,
              residual: Handle | None = None, tf32: bool = False) -> Work:
    """aten.convolution (1-D/2-D/3-D, strided, padded, dilated, grouped, transposed) on cuda,
    with its fused epilogue (out = activation(conv + bias + residual)).

    Every float dtype goes through cuDNN (float32 on engines without tensor cores, whose TF32
    would miss float32 accuracy, unless `tf32`), the epilogue inside the same graph; im2col
    + a cuBLASLt GEMM serves what cuDNN refuses, and col2im transposed convolutions, with
    the epilogue as one kernel after them. 3-D convolutions have cuDNN only (the im2col
    kernels are 2-D).
    """
    dev = out.device
    if out.dtype.name not in CUDA_TYPE:
        raise Unsupported(f"cuda convolution: dtype {out.dtype.name}")
    xb, ob = _batched(x, p), _batched(out, p)
    if w.ndim == 5:
        return _conv3d(out, x, w, bias, p, xb, ob, residual, tf32)
    act = getattr(p, "activation", "none")
    fused = residual is not None or act != "none"
    if not p.transposed:
        dnn = _get_dnn(dev)
        # cuDNN's fused conv + pointwise engines gave wrong half-type results, now and then,
        # on the H200 when the activations were NHWC and the weights KCRS (tests/runtime/ops
        # test_conv_epilogue_matches_torch, 2026-12-02); uniform layouts, what the exporter
        # makes, matched everywhere. Mixed layouts keep the epilogue out of the graph.
        one_graph = not fused or _uniform_layout(xb, w, ob, residual)
        if dnn is not None:
            if one_graph:
                try:
                    return _cudnn_conv(dnn, out, x, w, bias, p, xb, ob, residual, act, tf32)
                except Exception as e:  # noqa: BLE001 - any refusal: a path below works
                    log.info("cuDNN refused a convolution%s (%s)",
                             " with its epilogue" if fused else "", e)
            if fused:
                try:
                    return _then_epilogue(_cudnn_conv(dnn, out, x, w, bias, p, xb, ob,
                                                      tf32=tf32), out, residual, act, p)
                except Exception as e:  # noqa: BLE001
                    log.info("cuDNN refused a convolution (%s); using im2col + GEMM", e)
        base = _im2col_conv(out, w, bias, p, xb, ob)
    else:
        base = _gemm_col2im_conv(out, w, bias, p, xb, ob)
    return _then_epilogue(base, out, residual, act, p) if fused else base


def _conv3d(out: Handle, x: Handle, w: Handle, bias: Handle | None, p: Any, xb: Handle,
            ob: Handle, residual: Handle | None, tf32: bool) -> Work:
    """A 3-D convolution: one cuDNN graph (the epilogue in it when the layouts agree), else
    the cuDNN convolution and the epilogue kernel; Unsupported without cuDNN, and transposed."""
    act = getattr(p, "activation", "none")
    fused = residual is not None or act != "none"
    dnn = _get_dnn(out.device)
    if dnn is None or p.transposed:
        # cuDNN's 3-D data gradient refused strided, dilated and grouped cases on the H200
        # (2026-12-02), and there is no 3-D col2im kernel: transposed 3-D stays on cpu
        what = "a transposed 3-D convolution is not implemented on the cuda device" \
            if p.transposed else "3-D convolution needs cuDNN on the cuda device"
        raise Unsupported(f"convolution: {what} (w {list(w.sizes)}); load the program on cpu")
    if not fused or _uniform_layout(xb, w, ob, residual):
        try:
            return _cudnn_conv(dnn, out, x, w, bias, p, xb, ob, residual, act, tf32)
        except Exception as e:  # noqa: BLE001 - the plain graph below may still build
            if not fused:
                raise Unsupported(f"convolution: cuDNN refused the 3-D convolution "
                                  f"(w {list(w.sizes)}): {e}") from e
            log.info("cuDNN refused a 3-D convolution with its epilogue (%s)", e)
    return _then_epilogue(_cudnn_conv(dnn, out, x, w, bias, p, xb, ob, tf32=tf32), out,
                          residual, act, p)


def _batched(h: Handle, p: Any) -> Handle:
    """An unbatched (C, *spatial) view as (1, C, *spatial)."""
    if p.batched:
        return h
    return Handle(h.alloc, h.byte_offset, (1,) + tuple(h.sizes), (h.numel,) + tuple(h.strides),
                  h.dtype, h.device, h.owner)


def _channels_last(h: Handle) -> bool | None:
    """Whether a 3-D/4-D view keeps its channels innermost; None when one channel (or a
    channel dim of stride equal to another's) makes either order fit."""
    sizes, strides = _as_dnn(h)
    if sizes[1] == 1:
        return None
    inner = min(st for n, st in zip(sizes, strides) if n > 1)
    return strides[1] == inner


def _uniform_layout(*views: Handle | None) -> bool:
    """True when the convolution's views agree on NCHW or NHWC order."""
    orders = {_channels_last(h) for h in views if h is not None} - {None}
    return len(orders) <= 1


_ACT_CODES = {"none": 0, "relu": 1, "silu": 2, "relu6": 3}


def _then_epilogue(base: Work, out: Handle, residual: Handle | None, activation: str,
                   p: Any) -> Work:
    """`base` (the convolution), then one kernel: out = act(out + residual), in float."""
    dev = out.device
    ob = _batched(out, p)
    (n, c, h, wd), ost = _as4d(ob)
    if residual is not None:
        rb = _batched(residual, p)
        _, rst = _as4d(rb)
        r_copy = overlaps(out, residual)
    else:
        rst, r_copy = [0, 0, 0, 0], False
    total = n * c * h * wd
    # Dense output and residual laid out alike: element i of one is element i of the other,
    # and the kernel walks memory without coordinates (their integer divisions made the
    # strided walk 4x slower than memory on the H200: 128 us for ResNet-50 b32's stem).
    flat = out.packed and (residual is None or (
        not r_copy and residual.packed and tuple(rst) == tuple(ost)))
    kern = kernel(dev, KERNELS, f"aot_conv_epilogue_{'flat_' if flat else ''}{out.dtype.name}")
    cfg = dev.launch_config(total)
    isz = out.dtype.itemsize
    cl = ost[1] == 1 and c > 1

    def work(s: "CudaStream") -> None:
        from cuda.core import launch

        scratch = None
        try:
            r_ptr = 0 if residual is None else residual.address
            r_st = list(rst)
            if r_copy:      # the convolution is about to write over the residual
                scratch = Scratch(s, total * isz)
                copy_packed(dev, s, scratch.ptr, residual)
                r_ptr, r_st = scratch.ptr, list(contiguous_strides((n, c, h, wd)))
            base(s)
            has_res, act = i32(1 if residual is not None else 0), i32(_ACT_CODES[activation])
            if flat:
                launch(s.cs, cfg, kern, *typed([out.address, r_ptr, total]), has_res, act)
            else:
                launch(s.cs, cfg, kern, *typed([out.address, r_ptr, n, c, h, wd, *ost, *r_st]),
                       has_res, act, i32(cl))
        finally:
            if scratch is not None:
                scratch.free()
    return work


def _gemm_col2im_conv(out: Handle, w: Handle, bias: Handle | None, p: Any, xb: Handle,
                      ob: Handle) -> Work:
    """Transposed convolution: cols = W_g^T x_g per group (cuBLASLt), then a col2im gather
    that sums the taps of each output element and adds the bias."""
    dev = out.device
    (n, cin, h, wd), xst = _as4d(xb)
    (_, co, ho, wo), ost = _as4d(ob)
    wsz, wst = _as4d(w)
    kh, kw = wsz[2], wsz[3]
    pad, stride, dil = _geometry(p, xb.ndim)
    groups = p.groups
    cg, og = cin // groups, co // groups
    kk, hw = kh * kw, h * wd
    isz = out.dtype.itemsize
    w_direct = tuple(wst) == tuple(contiguous_strides(tuple(wsz)))
    x_direct = xst[3] == 1 and (xst[2] == wd or h == 1)
    xv = Handle(xb.alloc, xb.byte_offset, (n, cin, h, wd), tuple(xst), xb.dtype, xb.device,
                xb.owner)
    wv = Handle(w.alloc, w.byte_offset, tuple(wsz), tuple(wst), w.dtype, w.device, w.owner)
    x_rows = Handle(None, 0, (n, cg, hw), (xst[0], xst[1], 1) if x_direct else
                    (cin * hw, hw, 1), out.dtype, out.device, out.owner)
    if operand(x_rows, False) is None:
        x_direct = False
        x_rows = Handle(None, 0, (n, cg, hw), (cin * hw, hw, 1), out.dtype, out.device,
                        out.owner)
    w_t = Handle(None, 0, (n, og * kk, cg), (0, 1, og * kk), out.dtype, out.device, out.owner)
    c_rows = Handle(None, 0, (n, og * kk, hw), (groups * og * kk * hw, hw, 1), out.dtype,
                    out.device, out.owner)
    x_cs = xst[1] if x_direct else hw
    w_al = alignment(wv.address if w_direct else 0, cg * og * kk * isz)
    x_al = alignment(xv.address if x_direct else 0, cg * x_cs * isz,
                      (xst[0] if x_direct else cin * hw) * isz)
    c_al = alignment(og * kk * hw * isz, groups * og * kk * hw * isz)
    plan, swap = plain_plan(dev, c_rows, w_t, x_rows, (w_al, x_al, c_al))
    kern = kernel(dev, KERNELS, f"aot_col2im_{out.dtype.name}")
    cfg = dev.launch_config(n * co * ho * wo)
    x_cstride = xst[1] if x_direct else hw
    tail = [bias.strides[0] if bias is not None else 0, n, co, groups, h, wd, ho, wo, *ost]
    geo = [i32(v) for v in (kh, kw, stride[0], stride[1], pad[0], pad[1], dil[0], dil[1])]

    def work(s: "CudaStream") -> None:
        from cuda.core import launch

        scratch: list[Scratch] = []
        try:
            x_ptr, w_ptr = xv.address, wv.address
            if not x_direct:
                sc = Scratch(s, xv.numel * isz)
                scratch.append(sc)
                copy_packed(dev, s, sc.ptr, xv)
                x_ptr = sc.ptr
            if not w_direct:
                sc = Scratch(s, wv.numel * isz)
                scratch.append(sc)
                copy_packed(dev, s, sc.ptr, wv)
                w_ptr = sc.ptr
            cols = Scratch(s, n * groups * og * kk * hw * isz)
            scratch.append(cols)
            for gi in range(groups):
                wp = w_ptr + gi * cg * og * kk * isz
                xp = x_ptr + gi * cg * x_cstride * isz
                cp = cols.ptr + gi * og * kk * hw * isz
                a_ptr, b_ptr = (xp, wp) if swap else (wp, xp)
                plan.run(s, a_ptr, b_ptr, cp, cp, 0, 1.0, 0.0)
            args = typed([cols.ptr, ob.address, bias.address if bias is not None else 0,
                           *tail])
            launch(s.cs, cfg, kern, *args, *geo)
        finally:
            for sc in scratch:
                sc.free()
    return work


def _im2col_conv(out: Handle, w: Handle, bias: Handle | None, p: Any, xb: Handle,
                 ob: Handle) -> Work:
    """Convolution as im2col (own kernel) + one batched cuBLASLt GEMM per group; a 1x1
    stride-1 unpadded convolution of a plane-contiguous input needs no im2col at all."""
    dev = out.device
    (n, c, h, wd), xst = _as4d(xb)
    (_, co, ho, wo), ost = _as4d(ob)
    wsz, wst = _as4d(w)
    kh, kw = wsz[2], wsz[3]
    pad, stride, dil = _geometry(p, xb.ndim)
    groups = p.groups
    cg, og = c // groups, co // groups
    kg = cg * kh * kw
    hw = ho * wo
    isz = out.dtype.itemsize
    if isz not in (2, 4):
        raise Unsupported(f"cuda convolution: dtype {out.dtype.name}")
    w_direct = tuple(wst) == tuple(contiguous_strides(tuple(wsz)))
    direct = (kh == kw == 1 and stride == [1, 1] and pad == [0, 0] and xst[3] == 1
              and (xst[2] == wd or h == 1))
    # the stride of the flattened spatial index, when (ho, wo) fold into one dim
    if hw == 1 or ho == 1:
        sp = ost[3] if wo > 1 else 1
    elif wo == 1:
        sp = ost[2]
    else:
        sp = ost[3] if ost[2] == wo * ost[3] else None
    o_direct = sp is not None
    if o_direct:
        o_rows = Handle(None, 0, (n, og, hw), (ost[0], ost[1], sp), out.dtype, out.device,
                        out.owner)
        o_direct = operand(o_rows, True) is not None
    if not o_direct:
        o_rows = Handle(None, 0, (n, og, hw), (co * hw, hw, 1), out.dtype, out.device,
                        out.owner)
    w_rows = Handle(None, 0, (n, og, kg), (0, kg, 1), w.dtype, w.device, w.owner)
    if direct:
        col_rows = Handle(None, 0, (n, kg, hw), (xst[0], xst[1], 1), xb.dtype, xb.device,
                          xb.owner)
        if operand(col_rows, False) is None:
            direct = False
    if not direct:
        col_rows = Handle(None, 0, (n, kg, hw), (c * kh * kw * hw, hw, 1), out.dtype,
                          out.device, out.owner)
    w_al = alignment(w.address if w_direct else 0, og * kg * isz)
    c_al = (alignment(xb.address, cg * xst[1] * isz, xst[0] * isz) if direct else
            alignment(kg * hw * isz, c * kh * kw * hw * isz))
    o_al = (alignment(ob.address, og * ost[1] * isz, ost[0] * isz) if o_direct else
            alignment(og * hw * isz, co * hw * isz))
    plan, swap = plain_plan(dev, o_rows, w_rows, col_rows, (w_al, c_al, o_al))
    im2col = None if direct else kernel(dev, KERNELS, f"aot_im2col{isz}")
    cfg = dev.launch_config(n * c * kh * kw * hw)
    im_args = [xb.address, 0, n, c, h, wd, ho, wo, *xst]
    im_tail = [i32(v) for v in (kh, kw, stride[0], stride[1], pad[0], pad[1], dil[0], dil[1])]
    ov = Handle(ob.alloc, ob.byte_offset, (n, co, ho, wo), tuple(ost), ob.dtype, ob.device,
                ob.owner)
    wv = Handle(w.alloc, w.byte_offset, tuple(wsz), tuple(wst), w.dtype, w.device, w.owner)
    o_stride_c = ost[1] if o_direct else hw
    col_stride_c = xst[1] if direct else hw

    def work(s: "CudaStream") -> None:
        from cuda.core import launch

        scratch: list[Scratch] = []
        try:
            col_ptr = xb.address
            if im2col is not None:
                sc = Scratch(s, n * c * kh * kw * hw * isz)
                scratch.append(sc)
                args = typed(list(im_args))
                args[1] = np.int64(sc.ptr)
                launch(s.cs, cfg, im2col, *args, *im_tail)
                col_ptr = sc.ptr
            w_ptr = wv.address
            if not w_direct:
                sc = Scratch(s, wv.numel * isz)
                scratch.append(sc)
                copy_packed(dev, s, sc.ptr, wv)
                w_ptr = sc.ptr
            o_ptr = ov.address
            if not o_direct:
                sc = Scratch(s, ov.numel * isz)
                scratch.append(sc)
                o_ptr = sc.ptr
            beta = 0.0
            if bias is not None:
                o_st = ost if o_direct else contiguous_strides((n, co, ho, wo))
                dev.strided_work(o_ptr, bias.address, (n, co, ho, wo), o_st,
                             (0, bias.strides[0], 0, 0), isz, None)(s)
                beta = 1.0
            for gi in range(groups):
                wp = w_ptr + gi * og * kg * isz
                cp = col_ptr + gi * (cg * col_stride_c if direct else kg * hw) * isz
                op = o_ptr + gi * og * o_stride_c * isz
                a_ptr, b_ptr = (cp, wp) if swap else (wp, cp)
                plan.run(s, a_ptr, b_ptr, op, op, 0, 1.0, beta)
            if not o_direct:
                copy_unpacked(dev, s, ov, o_ptr)
        finally:
            for sc in scratch:
                sc.free()
    return work


# ---------------------------------------------------------------------------------------------
# CUDA C in conv.cu (compiled after common.PRELUDE, prelude.cuh)

KERNELS = source(__package__, "conv.cu")
