"""oneDNN (libdnnl.so.3 from the `onednn-cpu-gomp` wheel) through ctypes: the cpu device's
forward convolution on the views' own memory, any strides (NCHW, NHWC, slices).

The cpu device owns one `Dnnl` (its `dnnl` attribute, made on first use): the engine, a
dnnl stream per worker thread and the primitive cache. Primitives are made when an op's work
is made (at load for a delegate's static steps) and cached by (shapes, strides, dtype,
geometry). Scratchpads are user-managed, so every byte oneDNN uses is one we allocated and
counted, and one primitive can run on several worker threads at once.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import logging
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from aotrt.errors import DeviceError
from aotrt.runtime.tensor import Handle

log = logging.getLogger(__name__)

DIST = "onednn-cpu-gomp"
SONAME = "libdnnl.so.3"

# Enum values and argument indices of oneDNN 3.2 (dnnl_types.h, dnnl_common_types.h).
_SUCCESS = 0
_CPU = 1                    # dnnl_cpu
_FORMAT_ANY = 1             # dnnl_format_tag_any
_FORWARD_INFERENCE = 96     # dnnl_forward_inference
_CONV_DIRECT = 1            # dnnl_convolution_direct
_SCRATCHPAD_USER = 1        # dnnl_scratchpad_mode_user
_QUERY_IMPL_INFO = 8        # dnnl_query_impl_info_str
_QUERY_WEIGHTS_MD = 131     # dnnl_query_weights_md
_QUERY_SCRATCHPAD_MD = 136  # dnnl_query_scratchpad_md
_STREAM_IN_ORDER = 1
ARG_SRC, ARG_DST, ARG_WEIGHTS, ARG_BIAS, ARG_SCRATCHPAD = 1, 17, 33, 41, 80
MAX_NDIMS = 12

# aotrt dtype name -> dnnl_data_type_t
DATA_TYPES = {"float16": 1, "bfloat16": 2, "float32": 3}

_p = ctypes.c_void_p
_Dims = ctypes.c_int64 * MAX_NDIMS


class _ExecArg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", ctypes.c_void_p)]


_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "dnnl_engine_create": (ctypes.c_int, [ctypes.POINTER(_p), ctypes.c_int, ctypes.c_size_t]),
    "dnnl_stream_create": (ctypes.c_int, [ctypes.POINTER(_p), _p, ctypes.c_uint]),
    "dnnl_stream_wait": (ctypes.c_int, [_p]),
    "dnnl_stream_destroy": (ctypes.c_int, [_p]),
    "dnnl_memory_desc_create_with_strides": (
        ctypes.c_int, [ctypes.POINTER(_p), ctypes.c_int, _Dims, ctypes.c_int, _Dims]),
    "dnnl_memory_desc_create_with_tag": (
        ctypes.c_int, [ctypes.POINTER(_p), ctypes.c_int, _Dims, ctypes.c_int, ctypes.c_int]),
    "dnnl_memory_desc_destroy": (ctypes.c_int, [_p]),
    "dnnl_memory_desc_equal": (ctypes.c_int, [_p, _p]),
    "dnnl_memory_desc_get_size": (ctypes.c_size_t, [_p]),
    "dnnl_primitive_attr_create": (ctypes.c_int, [ctypes.POINTER(_p)]),
    "dnnl_primitive_attr_destroy": (ctypes.c_int, [_p]),
    "dnnl_primitive_attr_set_scratchpad_mode": (ctypes.c_int, [_p, ctypes.c_int]),
    "dnnl_convolution_forward_primitive_desc_create": (
        ctypes.c_int, [ctypes.POINTER(_p), _p, ctypes.c_int, ctypes.c_int, _p, _p, _p, _p,
                       _Dims, _Dims, _Dims, _Dims, _p]),
    "dnnl_reorder_primitive_desc_create": (
        ctypes.c_int, [ctypes.POINTER(_p), _p, _p, _p, _p, _p]),
    "dnnl_primitive_desc_query": (ctypes.c_int, [_p, ctypes.c_int, ctypes.c_int, _p]),
    "dnnl_primitive_desc_query_md": (_p, [_p, ctypes.c_int, ctypes.c_int]),
    "dnnl_primitive_desc_destroy": (ctypes.c_int, [_p]),
    "dnnl_primitive_create": (ctypes.c_int, [ctypes.POINTER(_p), _p]),
    "dnnl_primitive_execute": (ctypes.c_int, [_p, _p, ctypes.c_int, ctypes.POINTER(_ExecArg)]),
    "dnnl_primitive_destroy": (ctypes.c_int, [_p]),
    "dnnl_memory_create": (ctypes.c_int, [ctypes.POINTER(_p), _p, _p, _p]),
    "dnnl_memory_set_data_handle": (ctypes.c_int, [_p, _p]),
    "dnnl_memory_destroy": (ctypes.c_int, [_p]),
}


def find_library() -> Path | None:
    """libdnnl.so.3 of the installed onednn-cpu-gomp distribution, or None."""
    try:
        dist = importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == SONAME:
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    return None


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded libdnnl with its signatures bound, or None (logged) where it is missing."""
    path = find_library()
    if path is None:
        log.debug("oneDNN: %s is not installed; cpu convolutions use numpy", DIST)
        return None
    try:
        lib = ctypes.CDLL(str(path))
        for name, (res, args) in _SIGNATURES.items():
            # getattr, not lib[name]: an attribute is cached on the CDLL, so the signature
            # set here is the one every later call uses.
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
    except (OSError, AttributeError) as e:
        log.debug("oneDNN: cannot load %s (%s); cpu convolutions use numpy", path, e)
        return None
    return lib


class DnnlError(DeviceError):
    """A oneDNN call failed (status code in the message)."""


def _check(status: int, what: str) -> None:
    if status != _SUCCESS:
        raise DnnlError(f"oneDNN: {what} failed with status {status}")


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


class ConvPrimitive:
    """A created forward convolution: the primitive, its memory descriptors, the weights
    reorder (plain view -> the layout the implementation wants) and the scratch sizes."""

    def __init__(self, ctx: "Dnnl", key: ConvKey) -> None:
        lib, self.lib = ctx.lib, ctx.lib
        self.key = key
        self._owned_md: list[Any] = []
        self._owned_pd: list[Any] = []
        self._owned_prim: list[Any] = []
        dt = DATA_TYPES[key.dtype]
        self.src_md = self._md(*key.src, dt)
        self.user_w_md = self._md(*key.weights, dt)
        self.bias_md = None if key.bias is None else self._md((key.dst[0][1],), key.bias, dt)
        self.dst_md = self._md(*key.dst, dt)
        wsizes = key.weights[0]
        any_w = _p()
        _check(lib.dnnl_memory_desc_create_with_tag(ctypes.byref(any_w), len(wsizes),
                                                    _dims(wsizes), dt, _FORMAT_ANY),
               "memory_desc_create_with_tag")
        self._owned_md.append(any_w)
        attr = _p()
        _check(lib.dnnl_primitive_attr_create(ctypes.byref(attr)), "primitive_attr_create")
        try:
            _check(lib.dnnl_primitive_attr_set_scratchpad_mode(attr, _SCRATCHPAD_USER),
                   "set_scratchpad_mode")
            pd = _p()
            nd = len(key.stride)
            _check(lib.dnnl_convolution_forward_primitive_desc_create(
                ctypes.byref(pd), ctx.engine, _FORWARD_INFERENCE, _CONV_DIRECT, self.src_md,
                any_w, self.bias_md, self.dst_md, _dims(key.stride),
                _dims([d - 1 for d in key.dilation]), _dims(key.padding),
                _dims(key.padding[:nd]), attr), "convolution_forward_primitive_desc_create")
            self._owned_pd.append(pd)
            self.pd = pd
            self.w_md = lib.dnnl_primitive_desc_query_md(pd, _QUERY_WEIGHTS_MD, 0)
            self.scratch_bytes = lib.dnnl_memory_desc_get_size(
                lib.dnnl_primitive_desc_query_md(pd, _QUERY_SCRATCHPAD_MD, 0))
            self.impl = self._impl_name(pd)
            self.prim = self._primitive(pd)
            # Implementations that want blocked weights get them through a reorder each run
            # (or once, for weights that are a delegate's constants).
            self.reorder = None
            self.reorder_scratch_bytes = 0
            self.w_bytes = 0
            if not lib.dnnl_memory_desc_equal(self.w_md, self.user_w_md):
                rpd = _p()
                _check(lib.dnnl_reorder_primitive_desc_create(
                    ctypes.byref(rpd), self.user_w_md, ctx.engine, self.w_md, ctx.engine, attr),
                    "reorder_primitive_desc_create")
                self._owned_pd.append(rpd)
                self.reorder_scratch_bytes = lib.dnnl_memory_desc_get_size(
                    lib.dnnl_primitive_desc_query_md(rpd, _QUERY_SCRATCHPAD_MD, 0))
                self.reorder = self._primitive(rpd)
                self.reorder_md = lib.dnnl_primitive_desc_query_md(rpd, _QUERY_SCRATCHPAD_MD, 0)
                self.w_bytes = lib.dnnl_memory_desc_get_size(self.w_md)
            self.scratch_md = lib.dnnl_primitive_desc_query_md(pd, _QUERY_SCRATCHPAD_MD, 0)
        except BaseException:
            self.destroy()
            raise
        finally:
            lib.dnnl_primitive_attr_destroy(attr)

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

    def extra_bytes(self) -> int:
        """Bytes one run allocates beside the views: the reordered weights, scratchpads."""
        return self.w_bytes + self.scratch_bytes + self.reorder_scratch_bytes

    def destroy(self) -> None:
        """Free the primitives and descriptors (once)."""
        lib = self.lib
        for prim in self._owned_prim:
            lib.dnnl_primitive_destroy(prim)
        for pd in self._owned_pd:
            lib.dnnl_primitive_desc_destroy(pd)
        for md in self._owned_md:
            lib.dnnl_memory_desc_destroy(md)
        self._owned_prim, self._owned_pd, self._owned_md = [], [], []


def _aligned(nbytes: int, phase: int = 0) -> tuple[np.ndarray, int]:
    """A host buffer and an address in it that is `phase` bytes past a 64-byte boundary."""
    raw = np.empty(nbytes + 128, dtype=np.uint8)
    base = raw.ctypes.data
    return raw, (base + 63) // 64 * 64 + phase % 64


class _Memories:
    """dnnl memory objects of one work closure (their handles are set at each run)."""

    def __init__(self, lib: ctypes.CDLL, engine: Any, mds: Sequence[Any]) -> None:
        self.objs: list[Any] = []
        try:
            for md in mds:
                m = _p()
                _check(lib.dnnl_memory_create(ctypes.byref(m), md, engine, None),
                       "memory_create")
                self.objs.append(m)
        except BaseException:
            _destroy_memories(lib, self.objs)
            raise
        weakref.finalize(self, _destroy_memories, lib, list(self.objs))


def _destroy_memories(lib: ctypes.CDLL, objs: list[Any]) -> None:
    for m in objs:
        lib.dnnl_memory_destroy(m)


class Dnnl:
    """oneDNN state of one cpu device: the engine, per-thread streams, the primitive cache.

    `stats` counts primitives created and cache hits (tests read it to see the path taken).
    """

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        engine = _p()
        _check(lib.dnnl_engine_create(ctypes.byref(engine), _CPU, 0), "engine_create")
        self.engine = engine
        self._lock = threading.Lock()
        self._convs: dict[ConvKey, ConvPrimitive | None] = {}
        self._local = threading.local()
        self.stats = {"created": 0, "hits": 0, "refused": 0, "runs": 0}

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

    def convolution(self, key: ConvKey) -> ConvPrimitive | None:
        """The cached primitive for `key`, created now; None where oneDNN refuses it."""
        with self._lock:
            if key in self._convs:
                self.stats["hits"] += 1
                return self._convs[key]
            try:
                prim: ConvPrimitive | None = ConvPrimitive(self, key)
                self.stats["created"] += 1
                log.debug("oneDNN convolution %s: %s", key, prim.impl)
            except DnnlError as e:
                prim = None
                self.stats["refused"] += 1
                log.debug("oneDNN refuses convolution %s (%s); numpy runs it", key, e)
            self._convs[key] = prim
            return prim

    def conv_work(self, prim: ConvPrimitive, x: Handle, w: Handle, bias: Handle | None,
                  out: Handle, detach: Sequence[Handle], keep_weights: bool
                  ) -> Callable[[], None]:
        """The work closure running `prim` on the views' memory, writing `out` in place.

        Inputs in `detach` share bytes with `out`: their bytes are copied to scratch first
        and read from there. With `keep_weights` (weights that never change, a delegate's
        constants) the weights are reordered on the first run only.
        """
        lib = self.lib
        mds = [prim.src_md, prim.user_w_md, prim.dst_md, prim.w_md, prim.scratch_md]
        if bias is not None:
            mds.append(prim.bias_md)
        if prim.reorder is not None:
            mds.append(prim.reorder_md)
        mem = _Memories(lib, self.engine, mds)
        m_src, m_uw, m_dst, m_w, m_scr = mem.objs[:5]
        m_bias = mem.objs[5] if bias is not None else None
        m_rscr = mem.objs[-1] if prim.reorder is not None else None
        keep: list[Any] = [mem]
        scr_addr = w_addr = rscr_addr = 0
        if prim.scratch_bytes:
            buf, scr_addr = _aligned(prim.scratch_bytes)
            keep.append(buf)
        if prim.reorder is not None:
            buf, w_addr = _aligned(prim.w_bytes)
            keep.append(buf)
            if prim.reorder_scratch_bytes:
                buf, rscr_addr = _aligned(prim.reorder_scratch_bytes)
                keep.append(buf)
        copies: dict[int, tuple[Handle, np.ndarray, int]] = {}
        for h in detach:
            lo, hi = h.byte_range()
            buf, base = _aligned(hi - lo, h.alloc.ptr + lo)
            copies[id(h)] = (h, buf, base)
        args = (_ExecArg * 5)()
        args[0].arg, args[0].memory = ARG_SRC, m_src
        args[1].arg, args[1].memory = ARG_WEIGHTS, m_w if prim.reorder is not None else m_uw
        args[2].arg, args[2].memory = ARG_DST, m_dst
        args[3].arg, args[3].memory = ARG_SCRATCHPAD, m_scr
        nargs = 4
        if m_bias is not None:
            args[4].arg, args[4].memory = ARG_BIAS, m_bias
            nargs = 5
        rargs = (_ExecArg * 3)()
        rargs[0].arg, rargs[0].memory = ARG_SRC, m_uw
        rargs[1].arg, rargs[1].memory = ARG_DST, m_w
        rargs[2].arg, rargs[2].memory = ARG_SCRATCHPAD, m_rscr
        state = {"reordered": False}
        set_handle, execute = lib.dnnl_memory_set_data_handle, lib.dnnl_primitive_execute
        stats = self.stats

        def addr(h: Handle) -> int:
            c = copies.get(id(h))
            if c is None:
                return h.address
            src, buf, base = c
            lo, hi = src.byte_range()
            # The input's bytes as they are now, at the same distance from 64-byte lines.
            ctypes.memmove(base, src.alloc.ptr + lo, hi - lo)
            return base + (src.address - (src.alloc.ptr + lo))

        def work() -> None:
            st = self.stream()
            _check(set_handle(m_src, addr(x)), "memory_set_data_handle")
            _check(set_handle(m_uw, addr(w)), "memory_set_data_handle")
            if m_bias is not None:
                _check(set_handle(m_bias, addr(bias)), "memory_set_data_handle")
            _check(set_handle(m_dst, out.address), "memory_set_data_handle")
            if scr_addr:
                _check(set_handle(m_scr, scr_addr), "memory_set_data_handle")
            if prim.reorder is not None:
                _check(set_handle(m_w, w_addr), "memory_set_data_handle")
                if not (keep_weights and state["reordered"]):
                    if rscr_addr:
                        _check(set_handle(m_rscr, rscr_addr), "memory_set_data_handle")
                    _check(execute(prim.reorder, st, 3, rargs), "reorder execute")
                    state["reordered"] = True
            _check(execute(prim.prim, st, nargs, args), "convolution execute")
            _check(lib.dnnl_stream_wait(st), "stream_wait")
            stats["runs"] += 1

        work.keep = keep  # type: ignore[attr-defined]  # buffers live as long as the work
        return work


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
    except DnnlError as e:
        log.debug("oneDNN: no cpu engine for %r (%s); cpu convolutions use numpy", device, e)
        return None
