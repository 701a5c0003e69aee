"""oneDNN 3.2 primitives for the cpu device (backends/cpu/dnnl.py runs them): the keys a
primitive is cached by, the convolution and matmul primitives with their post-ops, the
reorders between a view's layout and the one an implementation wants, and the kept copies
of constant weights."""

from __future__ import annotations

import ctypes
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from aotrt.errors import DeviceError
from aotrt.runtime.backends.cpu.dnnl_api import Dims as _Dims, VoidP as _p
from aotrt.runtime.tensor import Handle

if TYPE_CHECKING:
    from aotrt.runtime.backends.cpu.dnnl import Dnnl

# Enum values and argument indices of oneDNN 3.2 (dnnl_types.h, dnnl_common_types.h).
_SUCCESS = 0
CPU = 1                     # dnnl_cpu
_FORMAT_ANY = 1             # dnnl_format_tag_any
_FORWARD_INFERENCE = 96     # dnnl_forward_inference
_CONV_DIRECT = 1            # dnnl_convolution_direct
_SCRATCHPAD_USER = 1        # dnnl_scratchpad_mode_user
_QUERY_IMPL_INFO = 8        # dnnl_query_impl_info_str
_QUERY_SRC_MD = 129         # dnnl_query_src_md
_QUERY_WEIGHTS_MD = 131     # dnnl_query_weights_md
_QUERY_DST_MD = 133         # dnnl_query_dst_md
_QUERY_SCRATCHPAD_MD = 136  # dnnl_query_scratchpad_md
STREAM_IN_ORDER = 1
# Implementations slower than the blocked ones (oneDNN's im2col + gemm, reference loops).
SLOW = ("gemm", "x64:gemm", "ref")
ARG_SRC, ARG_DST, ARG_WEIGHTS, ARG_BIAS, ARG_SCRATCHPAD = 1, 17, 33, 41, 80
#: the second operand of post-op 0, a binary one: DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) |
#: DNNL_ARG_SRC_1 (oneDNN 3.2's dnnl_types.h: post-op arguments start at 32768)
ARG_POST_OP0_SRC1 = 32768 | 2
_BINARY_ADD = 0x1FFF0       # dnnl_binary_add
# aotrt dtype name -> dnnl_data_type_t
DATA_TYPES = {"float16": 1, "bfloat16": 2, "float32": 3}


def check(status: int, what: str) -> None:
    """Raise DeviceError naming `what` unless oneDNN returned success."""
    # DeviceError: at load it only means "not through oneDNN" (the caller falls back); in a
    # run it is the stream's error, reported at the next wait.
    if status != _SUCCESS:
        raise DeviceError(f"oneDNN: {what} failed with status {status}")


def _dims(values: Sequence[int]) -> Any:
    return _Dims(*values)


@dataclass(frozen=True)
class ConvKey:
    """What a convolution primitive depends on: views' sizes and strides, dtype, geometry."""

    dtype: str
    src: tuple[tuple[int, ...], tuple[int, ...]]
    weights: tuple[tuple[int, ...], tuple[int, ...]]
    bias: tuple[int, ...] | None
    dst: tuple[tuple[int, ...], tuple[int, ...]]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    #: an activation oneDNN applies to the result, as a post-op (POST_OP_ACTIVATIONS)
    activation: str = "none"
    #: a residual (sizes, strides) oneDNN adds to the result before the activation, as a
    #: binary post-op reading the view in place
    residual: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    #: the OpenMP threads it is made for (oneDNN fixes its split at creation); 0: those of
    #: the creating thread
    threads: int = 0


#: oneDNN's eltwise algorithm (dnnl_alg_kind_t, oneDNN 3.2's dnnl_types.h), alpha and beta
#: of the activations a convolution applies: swish(x) = x * sigmoid(1 * x). Not relu (0x20)
#: or clip (0x2E): their vector max maps a NaN to the bound (backends/cpu/ops/activation.py).
POST_OP_ACTIVATIONS = {"silu": (0x2C, 1.0, 0.0)}


@dataclass(frozen=True)
class MatmulKey:
    """What a matmul primitive depends on: dst[M,N] = src[M,K] @ weights[K,N] (+ bias[N]),
    each a 2-D view's (sizes, strides); the bias by its stride."""

    dtype: str
    src: tuple[tuple[int, ...], tuple[int, ...]]
    weights: tuple[tuple[int, ...], tuple[int, ...]]
    bias: int | None
    dst: tuple[tuple[int, ...], tuple[int, ...]]
    #: the OpenMP threads it is made for, as ConvKey's
    threads: int = 0
    #: weights in the layout the implementation chooses (re-laid in place, once, where one
    #: instruction alone reads them: Dnnl.work), not as the view lies
    packed: bool = False


class Operand:
    """One argument of a primitive: the view's descriptor, the one the implementation uses,
    and the reorder between them (None when the implementation takes the view as it is)."""

    def __init__(self, user_md: Any) -> None:
        self.user_md = user_md
        self.impl_md = user_md
        self.reorder: Any = None
        self.reorder_scratch_md: Any = None
        self.reorder_scratch_bytes = 0
        self.bytes = 0          # the implementation's copy, when there is a reorder
        #: (sizes, element strides) of the implementation's layout when it is a dense plain
        #: one (channels-last or row-major): the copy to or from it is then a numpy copy
        self.plain: tuple[tuple[int, ...], tuple[int, ...]] | None = None

    def extra_bytes(self) -> int:
        """Scratch bytes one run of this operand needs beside the view."""
        return self.bytes + self.reorder_scratch_bytes


class Primitive:
    """A created primitive (a subclass says which): the primitive, its scratchpad, and per
    operand the reorder between the view's layout and the implementation's (weights always
    may be reordered; with `blocked`, the activations too, through scratch copies)."""

    #: let the implementation choose the weights' layout (a reorder, kept for constants)
    pack_weights = True

    def __init__(self, ctx: "Dnnl", key: Any, blocked: bool) -> None:
        lib = self.lib = ctx.lib
        self.key, self.blocked = key, blocked
        self._owned_md: list[Any] = []
        self._owned_pd: list[Any] = []
        self._owned_prim: list[Any] = []
        # Freed with the last work closure or cache entry that holds it.
        self._free = weakref.finalize(self, _destroy_objects, lib, self._owned_prim,
                                      self._owned_pd, self._owned_md)
        # At exit a daemon stream may still run it (as a kernel library's code stays mapped).
        self._free.atexit = False
        # Reordered copies of constant weights, by the constants' allocation and the view's
        # byte offset: a step rebuilt on every run (one that touches the run's inputs or
        # outputs) reorders its weights once, not on each run. An entry goes with its
        # allocation (the delegate's constants).
        self._packed: weakref.WeakKeyDictionary[Any, dict[int, Packed]] = \
            weakref.WeakKeyDictionary()
        self._packed_lock = threading.Lock()
        dt = DATA_TYPES[key.dtype]
        self.src = Operand(self._md(*key.src, dt))
        self.w = Operand(self._md(*key.weights, dt))
        self.bias_md = None if key.bias is None else self._bias_md(dt)
        self.dst = Operand(self._md(*key.dst, dt))
        any_src = self._any(key.src[0], dt) if blocked else self.src.user_md
        any_dst = self._any(key.dst[0], dt) if blocked else self.dst.user_md
        any_w = self._any(key.weights[0], dt) if self.pack_weights else self.w.user_md
        attr = _p()
        check(lib.dnnl_primitive_attr_create(ctypes.byref(attr)), "primitive_attr_create")
        try:
            check(lib.dnnl_primitive_attr_set_scratchpad_mode(attr, _SCRATCHPAD_USER),
                   "set_scratchpad_mode")
            pd = self._descriptor(ctx, attr, any_src, any_w, any_dst)
            self._owned_pd.append(pd)
            self.scratch_md = lib.dnnl_primitive_desc_query_md(pd, _QUERY_SCRATCHPAD_MD, 0)
            self.scratch_bytes = lib.dnnl_memory_desc_get_size(self.scratch_md)
            self.impl = self._impl_name(pd)
            self.prim = self._primitive(pd)
            for op, query, into in ((self.src, _QUERY_SRC_MD, True),
                                    (self.w, _QUERY_WEIGHTS_MD, True),
                                    (self.dst, _QUERY_DST_MD, False)):
                self._plan_reorder(ctx, attr, op, lib.dnnl_primitive_desc_query_md(pd, query, 0),
                                   into)
            for op, geometry in ((self.src, key.src), (self.dst, key.dst)):
                if op.reorder is not None:
                    op.plain = self._plain_layout(op.impl_md, geometry[0], dt)
        except BaseException:
            self.destroy()
            raise
        finally:
            lib.dnnl_primitive_attr_destroy(attr)

    def _bias_md(self, dt: int) -> Any:
        raise NotImplementedError

    def _descriptor(self, ctx: "Dnnl", attr: Any, src: Any, w: Any, dst: Any) -> Any:
        """The primitive descriptor over these descriptors (format "any" where free)."""
        raise NotImplementedError

    def _plan_reorder(self, ctx: "Dnnl", attr: Any, op: Operand, impl_md: Any,
                      into: bool) -> None:
        """Set up the reorder view -> implementation (`into`) or back, where they differ."""
        lib = self.lib
        if lib.dnnl_memory_desc_equal(impl_md, op.user_md):
            return
        op.impl_md = impl_md
        src, dst = (op.user_md, impl_md) if into else (impl_md, op.user_md)
        rpd = _p()
        check(lib.dnnl_reorder_primitive_desc_create(ctypes.byref(rpd), src, ctx.engine, dst,
                                                      ctx.engine, attr),
               "reorder_primitive_desc_create")
        self._owned_pd.append(rpd)
        op.reorder_scratch_md = lib.dnnl_primitive_desc_query_md(rpd, _QUERY_SCRATCHPAD_MD, 0)
        op.reorder_scratch_bytes = lib.dnnl_memory_desc_get_size(op.reorder_scratch_md)
        op.reorder = self._primitive(rpd)
        op.bytes = lib.dnnl_memory_desc_get_size(impl_md)

    def _plain_layout(self, impl_md: Any, sizes: Sequence[int], dt: int
                      ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """(sizes, strides) when `impl_md` is the dense channels-last or row-major layout of
        an activation of these (N, C, *spatial) sizes, else None (a blocked layout)."""
        sizes = tuple(sizes)
        row = [1] * len(sizes)
        for i in range(len(sizes) - 2, -1, -1):
            row[i] = row[i + 1] * sizes[i + 1]
        last = [0] * len(sizes)
        acc = 1
        for i in [1] + list(range(len(sizes) - 1, 1, -1)) + [0]:
            last[i], acc = acc, acc * sizes[i]
        for strides in (tuple(last), tuple(row)):
            if self.lib.dnnl_memory_desc_equal(impl_md, self._md(sizes, strides, dt)):
                return sizes, strides
        return None

    def _any(self, sizes: Sequence[int], dt: int) -> Any:
        md = _p()
        check(self.lib.dnnl_memory_desc_create_with_tag(ctypes.byref(md), len(sizes),
                                                         _dims(sizes), dt, _FORMAT_ANY),
               "memory_desc_create_with_tag")
        self._owned_md.append(md)
        return md

    def _md(self, sizes: Sequence[int], strides: Sequence[int], dt: int) -> Any:
        md = _p()
        check(self.lib.dnnl_memory_desc_create_with_strides(
            ctypes.byref(md), len(sizes), _dims(sizes), dt, _dims(strides)),
            f"memory_desc_create_with_strides({list(sizes)}, {list(strides)})")
        self._owned_md.append(md)
        return md

    def _impl_name(self, pd: Any) -> str:
        out = ctypes.c_char_p()
        check(self.lib.dnnl_primitive_desc_query(pd, _QUERY_IMPL_INFO, 0, ctypes.byref(out)),
               "query impl_info_str")
        return (out.value or b"?").decode()

    def _primitive(self, pd: Any) -> Any:
        prim = _p()
        check(self.lib.dnnl_primitive_create(ctypes.byref(prim), pd), "primitive_create")
        self._owned_prim.append(prim)
        return prim

    def packed_weights(self, w: Handle) -> "Packed":
        """The kept reordered copy of the constant weights `w` (filled on first use)."""
        with self._packed_lock:
            by_offset = self._packed.setdefault(w.alloc, {})
            entry = by_offset.get(w.byte_offset)
            if entry is None:
                entry = by_offset[w.byte_offset] = Packed(self.w.bytes)
            return entry

    def extra_bytes(self) -> int:
        """Bytes one run allocates beside the views: reordered copies and scratchpads."""
        return (self.scratch_bytes + self.src.extra_bytes() + self.w.extra_bytes()
                + self.dst.extra_bytes())

    def destroy(self) -> None:
        """Free the primitives and descriptors now (once; later calls do nothing)."""
        self._free()


class ConvPrimitive(Primitive):
    """A forward convolution (direct algorithm: oneDNN picks its implementation)."""

    key: ConvKey

    #: the residual's descriptor (its view as it is), with a residual
    residual_md: Any = None

    def _bias_md(self, dt: int) -> Any:
        return self._md((self.key.dst[0][1],), self.key.bias, dt)

    def _descriptor(self, ctx: "Dnnl", attr: Any, src: Any, w: Any, dst: Any) -> Any:
        key, pd, lib = self.key, _p(), self.lib
        nd = len(key.stride)
        # The epilogue is post-ops of the convolution's own attr only: the reorders share
        # `attr`, and must not apply it. oneDNN applies them in order: conv + bias, then
        # + residual, then the activation.
        conv_attr, post = attr, None
        if key.activation != "none" or key.residual is not None:
            conv_attr, post = _p(), _p()
            check(lib.dnnl_primitive_attr_create(ctypes.byref(conv_attr)),
                   "primitive_attr_create")
        try:
            if post is not None:
                check(lib.dnnl_primitive_attr_set_scratchpad_mode(conv_attr, _SCRATCHPAD_USER),
                       "set_scratchpad_mode")
                check(lib.dnnl_post_ops_create(ctypes.byref(post)), "post_ops_create")
                if key.residual is not None:
                    self.residual_md = self._md(*key.residual, DATA_TYPES[key.dtype])
                    check(lib.dnnl_post_ops_append_binary(post, _BINARY_ADD, self.residual_md),
                           "post_ops_append_binary")
                if key.activation != "none":
                    alg, alpha, beta = POST_OP_ACTIVATIONS[key.activation]
                    check(lib.dnnl_post_ops_append_eltwise(post, alg, alpha, beta),
                           "post_ops_append_eltwise")
                check(lib.dnnl_primitive_attr_set_post_ops(conv_attr, post),
                       "primitive_attr_set_post_ops")
            check(lib.dnnl_convolution_forward_primitive_desc_create(
                ctypes.byref(pd), ctx.engine, _FORWARD_INFERENCE, _CONV_DIRECT, src, w,
                self.bias_md, dst, _dims(key.stride), _dims([d - 1 for d in key.dilation]),
                _dims(key.padding), _dims(key.padding[:nd]), conv_attr),
                "convolution_forward_primitive_desc_create")
        finally:
            if post is not None:
                if post.value:
                    lib.dnnl_post_ops_destroy(post)
                lib.dnnl_primitive_attr_destroy(conv_attr)
        return pd


class MatmulPrimitive(Primitive):
    """A 2-D matmul, the bias a broadcast row. The weights are read as they are (the exporter
    stores GEMM weights in the layout brgemm reads: rules/library.transpose_gemm_weights;
    a kept packed copy cost GPT-2 300 MB of RSS past eager's), or, for a `packed` key, in
    brgemm's blocked layout, re-laid in place (BERT's 72 GEMMs with packed weights: 106
    against 123 ms in one profile)."""

    key: MatmulKey

    @property
    def pack_weights(self) -> bool:  # type: ignore[override]
        """Only for a key that asks: the weights are then re-laid in place (Dnnl.work)."""
        return self.key.packed

    def _bias_md(self, dt: int) -> Any:
        n, stride = self.key.dst[0][1], self.key.bias
        return self._md((1, n), (n * stride, stride), dt)

    def _descriptor(self, ctx: "Dnnl", attr: Any, src: Any, w: Any, dst: Any) -> Any:
        pd = _p()
        check(self.lib.dnnl_matmul_primitive_desc_create(
            ctypes.byref(pd), ctx.engine, src, w, self.bias_md, dst, attr),
            "matmul_primitive_desc_create")
        return pd


def _destroy_objects(lib: ctypes.CDLL, prims: list[Any], pds: list[Any], mds: list[Any]
                     ) -> None:
    for prim in prims:
        lib.dnnl_primitive_destroy(prim)
    for pd in pds:
        lib.dnnl_primitive_desc_destroy(pd)
    for md in mds:
        lib.dnnl_memory_desc_destroy(md)


def aligned(nbytes: int, phase: int = 0) -> tuple[np.ndarray, int]:
    """A host buffer and an address in it that is `phase` bytes past a 64-byte boundary."""
    raw = np.empty(nbytes + 128, dtype=np.uint8)
    base = raw.ctypes.data
    return raw, (base + 63) // 64 * 64 + phase % 64


class Packed:
    """A reordered copy of constant weights: its buffer, and whether it is filled yet (the
    lock orders a first fill against another stream's worker using the same copy)."""

    def __init__(self, nbytes: int) -> None:
        self.buf, self.addr = aligned(nbytes)
        self.filled = False
        self.lock = threading.Lock()
