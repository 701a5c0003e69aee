"""oneDNN (libdnnl.so.3, bound in ops/cpu_dnnl_api.py) for the cpu device: its
forward convolution on the views' own memory, any strides (NCHW, NHWC, slices), and its
matmuls (linear, mm, addmm on views; attention's GEMMs on arrays).

The cpu device owns one `Dnnl` (its `dnnl` attribute, made on first use): the engine, a
dnnl stream per worker thread and the primitive cache. Primitives are made when an op's work
is made (at load for a delegate's static steps) and cached by (shapes, strides, dtype,
geometry). Scratchpads are user-managed, so every byte oneDNN uses is one we allocated and
counted, and one primitive can run on several worker threads at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from aotrt.errors import DeviceError
from aotrt.runtime.ops.cpu_dnnl_api import Dims as _Dims, ExecArg as _ExecArg, VoidP as _p
# Re-exported: callers ask this module whether oneDNN is there.
from aotrt.runtime.ops.cpu_dnnl_api import DIST, find_library, library  # noqa: F401
from aotrt.runtime.tensor import Handle

log = logging.getLogger(__name__)


# Enum values and argument indices of oneDNN 3.2 (dnnl_types.h, dnnl_common_types.h).
_SUCCESS = 0
_CPU = 1                    # dnnl_cpu
_FORMAT_ANY = 1             # dnnl_format_tag_any
_FORWARD_INFERENCE = 96     # dnnl_forward_inference
_CONV_DIRECT = 1            # dnnl_convolution_direct
_SCRATCHPAD_USER = 1        # dnnl_scratchpad_mode_user
_QUERY_IMPL_INFO = 8        # dnnl_query_impl_info_str
_QUERY_SRC_MD = 129         # dnnl_query_src_md
_QUERY_WEIGHTS_MD = 131     # dnnl_query_weights_md
_QUERY_DST_MD = 133         # dnnl_query_dst_md
_QUERY_SCRATCHPAD_MD = 136  # dnnl_query_scratchpad_md
_STREAM_IN_ORDER = 1
# Implementations slower than the blocked ones (oneDNN's im2col + gemm, reference loops).
_SLOW = ("gemm", "x64:gemm", "ref")
ARG_SRC, ARG_DST, ARG_WEIGHTS, ARG_BIAS, ARG_SCRATCHPAD = 1, 17, 33, 41, 80
#: the second operand of post-op 0, a binary one: DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) |
#: DNNL_ARG_SRC_1 (oneDNN 3.2's dnnl_types.h: post-op arguments start at 32768)
ARG_POST_OP0_SRC1 = 32768 | 2
_BINARY_ADD = 0x1FFF0       # dnnl_binary_add
# Primitives a device keeps for reuse (each holds JIT code; programs of many shapes evict).
MAX_CACHED = 512

#: oneDNN matmul implementations aotrt prefers to numpy's OpenBLAS: brgemm (AVX-512 and up).
#: Where oneDNN 3.2 has only gemm:jit (AVX2), OpenBLAS took 1.5-1.8x less time at rest
#: (bench/results/cpu-speed-2026-12-02.md), so GEMMs stay on numpy there.
FAST_MATMUL = ("brg",)

# aotrt dtype name -> dnnl_data_type_t
DATA_TYPES = {"float16": 1, "bfloat16": 2, "float32": 3}

def _check(status: int, what: str) -> None:
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
    #: an activation oneDNN applies to the result, as a post-op ("none", "relu", "silu")
    activation: str = "none"
    #: a residual (sizes, strides) oneDNN adds to the result before the activation, as a
    #: binary post-op reading the view in place
    residual: tuple[tuple[int, ...], tuple[int, ...]] | None = None


#: oneDNN's eltwise algorithm (dnnl_alg_kind_t, oneDNN 3.2's dnnl_types.h) and alpha of the
#: activations a convolution applies: relu(x) with slope 0, swish(x) = x * sigmoid(1 * x)
_ELTWISE = {"relu": (0x20, 0.0), "silu": (0x2C, 1.0)}


@dataclass(frozen=True)
class MatmulKey:
    """What a matmul primitive depends on: dst[M,N] = src[M,K] @ weights[K,N] (+ bias[N]),
    each a 2-D view's (sizes, strides); the bias by its stride."""

    dtype: str
    src: tuple[tuple[int, ...], tuple[int, ...]]
    weights: tuple[tuple[int, ...], tuple[int, ...]]
    bias: int | None
    dst: tuple[tuple[int, ...], tuple[int, ...]]


class _Operand:
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
        # Reordered copies of constant weights, by the constants' allocation and the view's
        # byte offset: a step rebuilt on every run (one that touches the run's inputs or
        # outputs) reorders its weights once, not on each run. An entry goes with its
        # allocation (the delegate's constants).
        self._packed: weakref.WeakKeyDictionary[Any, dict[int, _Packed]] = \
            weakref.WeakKeyDictionary()
        self._packed_lock = threading.Lock()
        dt = DATA_TYPES[key.dtype]
        self.src = _Operand(self._md(*key.src, dt))
        self.w = _Operand(self._md(*key.weights, dt))
        self.bias_md = None if key.bias is None else self._bias_md(dt)
        self.dst = _Operand(self._md(*key.dst, dt))
        any_src = self._any(key.src[0], dt) if blocked else self.src.user_md
        any_dst = self._any(key.dst[0], dt) if blocked else self.dst.user_md
        any_w = self._any(key.weights[0], dt) if self.pack_weights else self.w.user_md
        attr = _p()
        _check(lib.dnnl_primitive_attr_create(ctypes.byref(attr)), "primitive_attr_create")
        try:
            _check(lib.dnnl_primitive_attr_set_scratchpad_mode(attr, _SCRATCHPAD_USER),
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

    def _plan_reorder(self, ctx: "Dnnl", attr: Any, op: _Operand, impl_md: Any,
                      into: bool) -> None:
        """Set up the reorder view -> implementation (`into`) or back, where they differ."""
        lib = self.lib
        if lib.dnnl_memory_desc_equal(impl_md, op.user_md):
            return
        op.impl_md = impl_md
        src, dst = (op.user_md, impl_md) if into else (impl_md, op.user_md)
        rpd = _p()
        _check(lib.dnnl_reorder_primitive_desc_create(ctypes.byref(rpd), src, ctx.engine, dst,
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
        _check(self.lib.dnnl_memory_desc_create_with_tag(ctypes.byref(md), len(sizes),
                                                         _dims(sizes), dt, _FORMAT_ANY),
               "memory_desc_create_with_tag")
        self._owned_md.append(md)
        return md

    def _md(self, sizes: Sequence[int], strides: Sequence[int], dt: int) -> Any:
        md = _p()
        _check(self.lib.dnnl_memory_desc_create_with_strides(
            ctypes.byref(md), len(sizes), _dims(sizes), dt, _dims(strides)),
            f"memory_desc_create_with_strides({list(sizes)}, {list(strides)})")
        self._owned_md.append(md)
        return md

    def _impl_name(self, pd: Any) -> str:
        out = ctypes.c_char_p()
        _check(self.lib.dnnl_primitive_desc_query(pd, _QUERY_IMPL_INFO, 0, ctypes.byref(out)),
               "query impl_info_str")
        return (out.value or b"?").decode()

    def _primitive(self, pd: Any) -> Any:
        prim = _p()
        _check(self.lib.dnnl_primitive_create(ctypes.byref(prim), pd), "primitive_create")
        self._owned_prim.append(prim)
        return prim

    def packed_weights(self, w: Handle) -> "_Packed":
        """The kept reordered copy of the constant weights `w` (filled on first use)."""
        with self._packed_lock:
            by_offset = self._packed.setdefault(w.alloc, {})
            entry = by_offset.get(w.byte_offset)
            if entry is None:
                entry = by_offset[w.byte_offset] = _Packed(self.w.bytes)
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
            _check(lib.dnnl_primitive_attr_create(ctypes.byref(conv_attr)),
                   "primitive_attr_create")
        try:
            if post is not None:
                _check(lib.dnnl_primitive_attr_set_scratchpad_mode(conv_attr, _SCRATCHPAD_USER),
                       "set_scratchpad_mode")
                _check(lib.dnnl_post_ops_create(ctypes.byref(post)), "post_ops_create")
                if key.residual is not None:
                    self.residual_md = self._md(*key.residual, DATA_TYPES[key.dtype])
                    _check(lib.dnnl_post_ops_append_binary(post, _BINARY_ADD, self.residual_md),
                           "post_ops_append_binary")
                if key.activation != "none":
                    alg, alpha = _ELTWISE[key.activation]
                    _check(lib.dnnl_post_ops_append_eltwise(post, alg, alpha, 0.0),
                           "post_ops_append_eltwise")
                _check(lib.dnnl_primitive_attr_set_post_ops(conv_attr, post),
                       "primitive_attr_set_post_ops")
            _check(lib.dnnl_convolution_forward_primitive_desc_create(
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
    """A 2-D matmul, the bias a broadcast row, the weights read as they are: the exporter
    stores GEMM weights in the layout brgemm reads (rules/library.transpose_gemm_weights),
    where a kept packed copy cost GPT-2 300 MB of RSS past eager's."""

    key: MatmulKey
    pack_weights = False

    def _bias_md(self, dt: int) -> Any:
        n, stride = self.key.dst[0][1], self.key.bias
        return self._md((1, n), (n * stride, stride), dt)

    def _descriptor(self, ctx: "Dnnl", attr: Any, src: Any, w: Any, dst: Any) -> Any:
        pd = _p()
        _check(self.lib.dnnl_matmul_primitive_desc_create(
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


def _aligned(nbytes: int, phase: int = 0) -> tuple[np.ndarray, int]:
    """A host buffer and an address in it that is `phase` bytes past a 64-byte boundary."""
    raw = np.empty(nbytes + 128, dtype=np.uint8)
    base = raw.ctypes.data
    return raw, (base + 63) // 64 * 64 + phase % 64


def _copy(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[...] = src, where one of them may lack the leading batch dim of 1 (an unbatched
    view against the primitive's batched geometry)."""
    if dst.ndim > src.ndim:
        dst = dst[0]
    elif src.ndim > dst.ndim:
        src = src[0]
    np.copyto(dst, src)


class _Packed:
    """A reordered copy of constant weights: its buffer, and whether it is filled yet (the
    lock orders a first fill against another stream's worker using the same copy)."""

    def __init__(self, nbytes: int) -> None:
        self.buf, self.addr = _aligned(nbytes)
        self.filled = False
        self.lock = threading.Lock()


class _Run:
    """Memory objects and scratch buffers of one work closure (handles set at each run)."""

    def __init__(self, lib: ctypes.CDLL, engine: Any) -> None:
        self.lib, self.engine = lib, engine
        self.objs: list[Any] = []
        self.bufs: list[np.ndarray] = []
        weakref.finalize(self, _destroy_memories, lib, self.objs)

    def memory(self, md: Any, nbytes: int = 0) -> tuple[Any, int]:
        """A memory object of `md`, and a scratch address of `nbytes` for it (0: none)."""
        m = _p()
        _check(self.lib.dnnl_memory_create(ctypes.byref(m), md, self.engine, None),
               "memory_create")
        self.objs.append(m)
        if not nbytes:
            return m, 0
        buf, addr = _aligned(nbytes)
        self.bufs.append(buf)
        return m, addr


def _destroy_memories(lib: ctypes.CDLL, objs: list[Any]) -> None:
    for m in objs:
        lib.dnnl_memory_destroy(m)


def _args(pairs: Sequence[tuple[int, Any]]) -> Any:
    arr = (_ExecArg * len(pairs))()
    for i, (arg, mem) in enumerate(pairs):
        arr[i].arg, arr[i].memory = arg, mem
    return arr


class Dnnl:
    """oneDNN state of one cpu device: the engine, per-thread streams, the primitive cache.

    `stats` counts primitives created, cache hits, refusals, runs (and of them, those with
    the epilogue as post-ops), kept weight copies filled, activation copies made with
    numpy in place of a reorder, and convolutions left to numpy (tests and benchmarks read
    it to see the path taken).
    """

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        engine = _p()
        _check(lib.dnnl_engine_create(ctypes.byref(engine), _CPU, 0), "engine_create")
        self.engine = engine
        self._lock = threading.Lock()
        # Convolutions and matmuls, by key (their keys are of different classes).
        self._prims: OrderedDict[Any, Primitive | None] = OrderedDict()
        self._local = threading.local()
        self.stats = {"created": 0, "hits": 0, "refused": 0, "runs": 0, "epilogues": 0,
                      "packs": 0, "copies": 0, "numpy": 0}
        self._probe_impl: str | None = None   # the implementation of a probe matmul
        self._blas: Any = None      # threadpoolctl's controller of numpy's BLAS, or False

    @property
    def gemm_pool(self) -> bool:
        """Whether this device's float32 GEMMs run on oneDNN's OpenMP pool (a FAST_MATMUL
        implementation exists on this CPU), rather than on numpy's BLAS threads."""
        if self._probe_impl is None:
            key = MatmulKey("float32", ((64, 64), (64, 1)), ((64, 64), (64, 1)), None,
                            ((64, 64), (64, 1)))
            prim = self._create(MatmulPrimitive, key, False)
            self._probe_impl = "" if prim is None else prim.impl
            if prim is not None:
                prim.destroy()
        return bool(self._probe_impl) and self._probe_impl.startswith(FAST_MATMUL)

    def numpy_blas(self) -> Any:
        """A context in which numpy's BLAS uses the calling thread only, where the GEMMs run
        on oneDNN's pool: OpenBLAS's threads spin for a while after each call, on the cores
        the pool's threads need (ResNet-18 with its one numpy linear: 23.4 ms, without:
        14.7, AVX-512, two cores). numpy's BLAS thread count is process-wide, so a numpy
        call of another thread made meanwhile is limited too."""
        if not self.gemm_pool:
            return contextlib.nullcontext()
        if self._blas is None:
            try:
                import threadpoolctl

                self._blas = threadpoolctl.ThreadpoolController().select(user_api="blas")
            except ImportError:
                log.debug("oneDNN: threadpoolctl is missing; numpy's BLAS keeps its threads")
                self._blas = False
        if not self._blas:
            return contextlib.nullcontext()
        return self._blas.limit(limits=1)

    def stream(self) -> Any:
        """This thread's dnnl stream (oneDNN streams are not shared between threads)."""
        st = getattr(self._local, "stream", None)
        if st is None:
            st = _p()
            _check(self.lib.dnnl_stream_create(ctypes.byref(st), self.engine,
                                               _STREAM_IN_ORDER), "stream_create")
            # The stream goes with the thread's local storage.
            holder = _StreamHolder(self.lib, st)
            self._local.stream, self._local.holder = st, holder
        return st

    def _create(self, cls: type[Primitive], key: Any, blocked: bool) -> Any:
        try:
            return cls(self, key, blocked)
        except DeviceError as e:
            log.debug("oneDNN refuses %s (blocked=%s): %s", key, blocked, e)
            return None

    def _cached(self, key: Any) -> tuple[bool, Any]:
        """(found, the cached primitive or None); the caller holds the lock."""
        if key not in self._prims:
            return False, None
        self.stats["hits"] += 1
        self._prims.move_to_end(key)
        return True, self._prims[key]

    def _keep(self, key: Any, prim: Primitive | None) -> None:
        """Cache `prim` (None: refused) under `key`; the caller holds the lock."""
        if prim is None:
            self.stats["refused"] += 1
        else:
            self.stats["created"] += 1
            log.debug("oneDNN %s: %s (blocked=%s)", key, prim.impl, prim.blocked)
        self._prims[key] = prim
        while len(self._prims) > MAX_CACHED:
            # Least recently used first; work closures keep theirs alive.
            self._prims.popitem(last=False)

    def matmul(self, key: MatmulKey) -> MatmulPrimitive | None:
        """The cached matmul primitive for `key`, created now; None where oneDNN refuses
        it or has only its reference loops for it."""
        with self._lock:
            found, prim = self._cached(key)
            if found:
                return prim
            prim = self._create(MatmulPrimitive, key, False)
            if prim is not None and prim.impl.startswith("ref"):
                prim.destroy()
                prim = None
            self._keep(key, prim)
            return prim

    def gemm_arrays(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
        """out = a @ b through oneDNN on this thread's stream, for float32 arrays of rank 2
        or 3 (batch dims of size 1 broadcast) of any non-negative strides; False, with
        nothing done, where no FAST_MATMUL implementation takes them (numpy then runs it)."""
        dims = [_array_dims(x) for x in (a, b, out)]
        if any(d is None for d in dims) or not a.ndim == b.ndim == out.ndim:
            return False
        prim = self.matmul(MatmulKey("float32", dims[0], dims[1], None, dims[2]))
        if prim is None or not prim.impl.startswith(FAST_MATMUL):
            return False
        run = _Run(self.lib, self.engine)
        pairs = []
        for arg, md, arr in ((ARG_SRC, prim.src.user_md, a), (ARG_WEIGHTS, prim.w.user_md, b),
                             (ARG_DST, prim.dst.user_md, out)):
            mem, _ = run.memory(md)
            _check(self.lib.dnnl_memory_set_data_handle(mem, arr.ctypes.data),
                   "memory_set_data_handle")
            pairs.append((arg, mem))
        m_scr, a_scr = run.memory(prim.scratch_md, prim.scratch_bytes)
        if a_scr:
            _check(self.lib.dnnl_memory_set_data_handle(m_scr, a_scr), "memory_set_data_handle")
        pairs.append((ARG_SCRATCHPAD, m_scr))
        st = self.stream()
        _check(self.lib.dnnl_primitive_execute(prim.prim, st, len(pairs), _args(pairs)),
               "primitive execute")
        _check(self.lib.dnnl_stream_wait(st), "stream_wait")
        self.stats["runs"] += 1
        return True

    def convolution(self, key: ConvKey) -> ConvPrimitive | None:
        """The cached primitive for `key`, created now; None where oneDNN refuses it.

        The views' own layouts come first; where oneDNN has only its gemm or reference
        code for them (NCHW, non-dense views), the activations go through blocked copies.
        """
        with self._lock:
            found, prim = self._cached(key)
            if found:
                return prim
            prim = self._create(ConvPrimitive, key, False)
            if prim is None or prim.impl.startswith(_SLOW):
                other = self._create(ConvPrimitive, key, True)
                if other is not None and (prim is None or not other.impl.startswith(_SLOW)):
                    if prim is not None:
                        prim.destroy()
                    prim = other
                elif other is not None:
                    other.destroy()
            self._keep(key, prim)
            return prim

    def work(self, prim: Primitive, x: Handle, w: Handle, bias: Handle | None,
             out: Handle, detach: Sequence[Handle], keep_weights: bool,
             residual: Handle | None = None) -> Callable[[], None]:
        """The work closure running `prim` on the views' memory, writing `out` in place
        (plus `residual`, for a primitive made with one).

        Inputs in `detach` share bytes with `out`: their bytes are copied to scratch first
        and read from there. With `keep_weights` (weights that never change, a delegate's
        constants) the weights are reordered once, into the primitive's kept copy for them
        (`packed_weights`), which later closures over the same weights share.
        """
        from aotrt.runtime.devices.cpu import host_array

        lib = self.lib
        run = _Run(lib, self.engine)
        copies: dict[Handle, tuple[np.ndarray, int]] = {}   # by the view itself
        for h in detach:
            lo, hi = h.byte_range()
            buf, base = _aligned(hi - lo, h.alloc.ptr + lo)
            copies[h] = (buf, base)
        sets: list[tuple[Any, Callable[[], int]]] = []   # (memory, its address at run time)
        pre: list[tuple[Any, Any]] = []                  # (reorder, args) before the conv
        post: list[tuple[Any, Any]] = []                 # (reorder, args) after it
        w_pre: list[tuple[Any, Any]] = []
        # (view, dense array) numpy copies before and after the conv, in place of reorders
        np_pre: list[tuple[Handle, np.ndarray]] = []
        np_post: list[tuple[Handle, np.ndarray]] = []

        def operand(op: _Operand, view: Callable[[], int], into: bool,
                    into_list: list[tuple[Any, Any]], h: Handle | None = None) -> Any:
            if op.reorder is not None and op.plain is not None and h is not None \
                    and h not in copies:
                # A strided view (a channel slice) to or from a dense plain layout: numpy
                # copies it in a few microseconds, where oneDNN 3.2's reorder took 40-70
                # (YOLOv8n's C2f slices: 43 reorders, about 2 ms a run, AVX-512, 2 cores).
                sizes, strides = op.plain
                isz = h.dtype.itemsize
                raw, base = _aligned(op.bytes)
                arr = np.ndarray(sizes, dtype=h.dtype.np, buffer=raw,
                                 offset=base - raw.ctypes.data,
                                 strides=[s * isz for s in strides])
                run.bufs.append(raw)
                m_impl, _ = run.memory(op.impl_md)
                sets.append((m_impl, lambda: base))
                (np_pre if into else np_post).append((h, arr))
                return m_impl
            m_user, _ = run.memory(op.user_md)
            sets.append((m_user, view))
            if op.reorder is None:
                return m_user
            m_impl, a_impl = run.memory(op.impl_md, op.bytes)
            sets.append((m_impl, lambda: a_impl))
            m_rs, a_rs = run.memory(op.reorder_scratch_md, op.reorder_scratch_bytes)
            if a_rs:
                sets.append((m_rs, lambda: a_rs))
            frm, to = (m_user, m_impl) if into else (m_impl, m_user)
            into_list.append((op.reorder, _args([(ARG_SRC, frm), (ARG_DST, to),
                                                 (ARG_SCRATCHPAD, m_rs)])))
            return m_impl

        def addr(h: Handle) -> Callable[[], int]:
            c = copies.get(h)
            if c is None:
                return lambda: h.address
            src, base = h, c[1]          # c[0], the buffer, lives in work.keep

            def copied() -> int:
                lo, hi = src.byte_range()
                # The input's bytes as they are now, at the same distance from 64-byte lines.
                ctypes.memmove(base, src.alloc.ptr + lo, hi - lo)
                return base + (src.address - (src.alloc.ptr + lo))
            return copied

        m_src = operand(prim.src, addr(x), True, pre, x)
        packed = None
        if keep_weights and prim.w.reorder is not None:
            packed = prim.packed_weights(w)
            m_user, _ = run.memory(prim.w.user_md)
            sets.append((m_user, addr(w)))
            m_w, _ = run.memory(prim.w.impl_md)
            sets.append((m_w, lambda: packed.addr))
            m_rs, a_rs = run.memory(prim.w.reorder_scratch_md, prim.w.reorder_scratch_bytes)
            if a_rs:
                sets.append((m_rs, lambda: a_rs))
            w_pre.append((prim.w.reorder, _args([(ARG_SRC, m_user), (ARG_DST, m_w),
                                                 (ARG_SCRATCHPAD, m_rs)])))
        else:
            m_w = operand(prim.w, addr(w), True, w_pre)
        m_dst = operand(prim.dst, lambda: out.address, False, post, out)
        pairs = [(ARG_SRC, m_src), (ARG_WEIGHTS, m_w), (ARG_DST, m_dst)]
        if bias is not None:
            m_bias, _ = run.memory(prim.bias_md)
            sets.append((m_bias, addr(bias)))
            pairs.append((ARG_BIAS, m_bias))
        if residual is not None:
            m_res, _ = run.memory(prim.residual_md)
            sets.append((m_res, addr(residual)))
            pairs.append((ARG_POST_OP0_SRC1, m_res))
        m_scr, a_scr = run.memory(prim.scratch_md, prim.scratch_bytes)
        if a_scr:
            sets.append((m_scr, lambda: a_scr))
        pairs.append((ARG_SCRATCHPAD, m_scr))
        conv_args = _args(pairs)
        set_handle, execute = lib.dnnl_memory_set_data_handle, lib.dnnl_primitive_execute
        stats = self.stats
        key = prim.key
        epilogue = int(getattr(key, "activation", "none") != "none"
                       or getattr(key, "residual", None) is not None)

        def work() -> None:
            st = self.stream()
            for mem, where in sets:
                _check(set_handle(mem, where()), "memory_set_data_handle")
            steps = pre
            if packed is not None:
                if not packed.filled:
                    with packed.lock:
                        if not packed.filled:
                            for rp, rargs in w_pre:
                                _check(execute(rp, st, 3, rargs), "reorder execute")
                            _check(lib.dnnl_stream_wait(st), "stream_wait")
                            packed.filled = True
                            stats["packs"] += 1
            else:
                steps = w_pre + pre     # weights that may change: reordered on every run
            for h, arr in np_pre:
                _copy(arr, host_array(h))
            for rp, rargs in steps:
                _check(execute(rp, st, 3, rargs), "reorder execute")
            _check(execute(prim.prim, st, len(pairs), conv_args), "primitive execute")
            for rp, rargs in post:
                _check(execute(rp, st, 3, rargs), "reorder execute")
            _check(lib.dnnl_stream_wait(st), "stream_wait")
            for h, arr in np_post:
                _copy(host_array(h), arr)
            stats["runs"] += 1
            stats["epilogues"] += epilogue
            stats["copies"] += len(np_pre) + len(np_post)

        work.keep = (run, copies, prim)  # type: ignore[attr-defined]  # live as the work
        return work


def _array_dims(a: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """A float32 array's (sizes, strides in elements), a size-1 dim given a dense stride;
    None where oneDNN cannot describe it (another dtype, a negative or odd stride)."""
    if a.dtype != np.float32 or a.ndim not in (2, 3) or a.size == 0:
        return None
    strides = []
    dense = 1
    for n, st in zip(reversed(a.shape), reversed(a.strides)):
        if n == 1:
            st = dense * 4
        if st < 0 or st % 4 or (st == 0 and n > 1):
            return None
        strides.append(st // 4)
        dense *= n
    return tuple(a.shape), tuple(reversed(strides))


class _StreamHolder:
    """Destroys a thread's dnnl stream when the thread's local storage goes."""

    def __init__(self, lib: ctypes.CDLL, stream: Any) -> None:
        weakref.finalize(self, lib.dnnl_stream_destroy, stream)


def create(device: Any) -> Dnnl | None:
    """A device's oneDNN state, or None (logged at debug) where oneDNN is not available."""
    lib = library()
    if lib is None:
        return None
    try:
        return Dnnl(lib)
    except DeviceError as e:
        log.debug("oneDNN: no cpu engine for %r (%s); cpu convolutions use numpy", device, e)
        return None
