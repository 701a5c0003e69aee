"""oneDNN (libdnnl.so.3, bound in backends/cpu/dnnl_api.py) for the cpu device: its
forward convolution on the views' own memory, any strides (NCHW, NHWC, slices), and its
matmuls (linear, mm, addmm on views; attention's GEMMs on arrays).

The primitives themselves, their keys and reorders are in backends/cpu/dnnl_primitives.py.
The cpu device owns one `Dnnl` (`device.libraries.dnnl`, made on first use): the engine, a
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
from typing import Any, Callable, Sequence

import numpy as np

from aotrt.errors import DeviceError
from aotrt.runtime.backends.cpu import native as cpu_native
from aotrt.runtime.backends.cpu.dnnl_api import ExecArg as _ExecArg, VoidP as _p
# Re-exported: callers ask this module whether oneDNN is there.
from aotrt.runtime.backends.cpu.dnnl_api import DIST, find_library, library  # noqa: F401
# Re-exported too: the keys and DATA_TYPES, which the ops use.
from aotrt.runtime.backends.cpu.dnnl_primitives import (  # noqa: F401
    ARG_BIAS, ARG_DST, ARG_POST_OP0_SRC1, ARG_SCRATCHPAD, ARG_SRC, ARG_WEIGHTS, CPU,
    DATA_TYPES, SLOW, STREAM_IN_ORDER, ConvKey, ConvPrimitive, MatmulKey, MatmulPrimitive,
    Operand, Primitive, aligned, check)
from aotrt.runtime.tensor import Handle, host_array
from aotrt.runtime.work import Work

log = logging.getLogger(__name__)

# Primitives a device keeps for reuse (each holds JIT code; programs of many shapes evict).
MAX_CACHED = 512
#: array-GEMM layouts whose memory objects one thread keeps (gemm_arrays)
MAX_ARRAY_RUNS = 64

#: oneDNN matmul implementations aotrt prefers to numpy's OpenBLAS: brgemm (AVX-512 and up).
#: Where oneDNN 3.2 has only gemm:jit (AVX2), OpenBLAS took 1.5-1.8x less time at rest
#: (bench/results/cpu/cpu-speed-2026-12-02.md), so GEMMs stay on numpy there.
FAST_MATMUL = ("brg",)


def _pair(dst: np.ndarray, src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dst, src) of equal rank, where one of them may lack the leading batch dim of 1 (an
    unbatched view against the primitive's batched geometry)."""
    if dst.ndim > src.ndim:
        dst = dst[0]
    elif src.ndim > dst.ndim:
        src = src[0]
    return dst, src


def _copy(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[...] = src, of ranks as `_pair` takes them."""
    np.copyto(*_pair(dst, src))


class _Run:
    """Memory objects and scratch buffers of one work closure (handles set at each run)."""

    def __init__(self, lib: ctypes.CDLL, engine: Any) -> None:
        self.lib, self.engine = lib, engine
        self.objs: list[Any] = []
        self.bufs: list[np.ndarray] = []
        # At exit a daemon stream may still run a primitive on them: freeing buys nothing.
        weakref.finalize(self, _destroy_memories, lib, self.objs).atexit = False

    def memory(self, md: Any, nbytes: int = 0) -> tuple[Any, int]:
        """A memory object of `md`, and a scratch address of `nbytes` for it (0: none)."""
        m = _p()
        check(self.lib.dnnl_memory_create(ctypes.byref(m), md, self.engine, None),
               "memory_create")
        self.objs.append(m)
        if not nbytes:
            return m, 0
        buf, addr = aligned(nbytes)
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


def stream_threads(device: Any) -> int:
    """The threads of `device`'s current stream (the one a delegate makes its steps for),
    which its oneDNN primitives are made for."""
    return int(getattr(device.current_stream(), "threads", 0) or 0)


class Dnnl:
    """oneDNN state of one cpu device: the engine, per-thread streams, the primitive cache.

    `stats` counts primitives created, cache hits, refusals, runs (and of them, those with
    the epilogue as post-ops), kept weight copies filled, activation copies made with
    numpy in place of a reorder, convolutions left to numpy, Winograd runs and relu passes
    after a convolution (backends/cpu/ops/activation.py): tests and benchmarks read it to see the
    path taken.
    """

    def __init__(self, lib: ctypes.CDLL, device: Any) -> None:
        self.lib = lib
        # the device owns the OpenMP runtime oneDNN's parallel regions run on
        self.device = device
        engine = _p()
        check(lib.dnnl_engine_create(ctypes.byref(engine), CPU, 0), "engine_create")
        self.engine = engine
        self._lock = threading.Lock()
        # Convolutions and matmuls, by key (their keys are of different classes).
        self._prims: OrderedDict[Any, Primitive | None] = OrderedDict()
        # Constants re-laid in place for one matmul: allocation -> byte offset -> its key.
        self._relaid: weakref.WeakKeyDictionary[Any, dict[int, Any]] = \
            weakref.WeakKeyDictionary()
        self._local = threading.local()
        self.stats = {"created": 0, "hits": 0, "refused": 0, "runs": 0, "epilogues": 0,
                      "packs": 0, "copies": 0, "numpy": 0, "array_runs": 0,
                      "winograd": 0, "activations": 0}
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
            check(self.lib.dnnl_stream_create(ctypes.byref(st), self.engine,
                                               STREAM_IN_ORDER), "stream_create")
            # The stream goes with the thread's local storage.
            holder = _StreamHolder(self.lib, st)
            self._local.stream, self._local.holder = st, holder
        return st

    def _create(self, cls: type[Primitive], key: Any, blocked: bool) -> Any:
        try:
            # oneDNN sizes a primitive's split when it makes it, from the calling thread's
            # OpenMP count: one made at load for a stream of one thread ran on every core
            with self.device.openmp.scope(key.threads):
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
        nothing done, where no FAST_MATMUL implementation takes them (numpy then runs it).

        Each thread keeps, per layout, the primitive's memory objects and argument list: a
        call sets three data handles and runs. Making them on every call
        cost about 40 us, a quarter of BERT's small attention GEMMs."""
        dims = [_array_dims(x) for x in (a, b, out)]
        if any(d is None for d in dims) or not a.ndim == b.ndim == out.ndim:
            return False
        # made on the stream's worker, whose OpenMP thread count is the stream's
        key = MatmulKey("float32", dims[0], dims[1], None, dims[2],
                        self.device.openmp.max_threads())
        runs = getattr(self._local, "gemm_runs", None)
        if runs is None:
            runs = self._local.gemm_runs = OrderedDict()
        entry = runs.get(key)
        if entry is None:
            entry = self._array_run(key)
            if entry is None:
                return False
            runs[key] = entry
            while len(runs) > MAX_ARRAY_RUNS:
                runs.popitem(last=False)
        else:
            runs.move_to_end(key)
        prim, mems, args, _run = entry
        for mem, arr in zip(mems, (a, b, out)):
            check(self.lib.dnnl_memory_set_data_handle(mem, arr.ctypes.data),
                   "memory_set_data_handle")
        st = self.stream()
        check(self.lib.dnnl_primitive_execute(prim.prim, st, 4, args), "primitive execute")
        check(self.lib.dnnl_stream_wait(st), "stream_wait")
        self.stats["runs"] += 1
        return True

    def _array_run(self, key: MatmulKey) -> Any:
        """(primitive, its src/weights/dst memory objects, the argument list, the _Run that
        owns them and the scratchpad) for `gemm_arrays`; None where oneDNN has no
        FAST_MATMUL implementation for `key`."""
        prim = self.matmul(key)
        if prim is None or not prim.impl.startswith(FAST_MATMUL):
            return None
        run = _Run(self.lib, self.engine)
        mems = [run.memory(md)[0] for md in (prim.src.user_md, prim.w.user_md,
                                             prim.dst.user_md)]
        m_scr, a_scr = run.memory(prim.scratch_md, prim.scratch_bytes)
        if a_scr:
            check(self.lib.dnnl_memory_set_data_handle(m_scr, a_scr), "memory_set_data_handle")
        args = _args([(ARG_SRC, mems[0]), (ARG_WEIGHTS, mems[1]), (ARG_DST, mems[2]),
                      (ARG_SCRATCHPAD, m_scr)])
        self.stats["array_runs"] += 1
        return prim, mems, args, run

    def fixed_matmul(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, threads: int,
                     pack: bool = False) -> "FixedMatmul | None":
        """out = a @ b through oneDNN over these arrays, always these (a work's own buffers:
        the handles are set once), for a stream of `threads` threads; None where no
        FAST_MATMUL implementation takes them. With `pack`, b is constant: where the
        implementation chooses another layout for it, the matmul reads a copy in that
        layout, which `FixedMatmul.pack` makes, and b itself is no longer needed."""
        dims = [_array_dims(x) for x in (a, b, out)]
        if any(d is None for d in dims) or not a.ndim == b.ndim == out.ndim:
            return None
        prim = self.matmul(MatmulKey("float32", dims[0], dims[1], None, dims[2], threads,
                                     pack))
        if prim is None or not prim.impl.startswith(FAST_MATMUL):
            return None
        run = _Run(self.lib, self.engine)
        m_src, m_w, m_dst = (run.memory(md)[0] for md in (prim.src.user_md, prim.w.impl_md,
                                                           prim.dst.user_md))
        m_scr, a_scr = run.memory(prim.scratch_md, prim.scratch_bytes)
        packed = None
        if prim.w.reorder is not None:
            packed, a_w = aligned(prim.w.bytes)
        sets = [(m_src, a.ctypes.data), (m_w, b.ctypes.data if packed is None else a_w),
                (m_dst, out.ctypes.data)] + ([(m_scr, a_scr)] if a_scr else [])
        for mem, where in sets:
            check(self.lib.dnnl_memory_set_data_handle(mem, where), "memory_set_data_handle")
        args = _args([(ARG_SRC, m_src), (ARG_WEIGHTS, m_w), (ARG_DST, m_dst),
                      (ARG_SCRATCHPAD, m_scr)])
        reorder = None
        if packed is not None:
            m_user, _ = run.memory(prim.w.user_md)
            m_rs, a_rs = run.memory(prim.w.reorder_scratch_md, prim.w.reorder_scratch_bytes)
            if a_rs:
                check(self.lib.dnnl_memory_set_data_handle(m_rs, a_rs),
                      "memory_set_data_handle")
            reorder = (prim.w.reorder, m_user, _args([(ARG_SRC, m_user), (ARG_DST, m_w),
                                                      (ARG_SCRATCHPAD, m_rs)]))
        # b is read in place unless packed: then only its layout is kept, for `pack`
        keep = (run, a, out, packed) if packed is not None else (run, a, b, out)
        return FixedMatmul(self, prim, args, reorder, (b.shape, b.strides), keep)

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
            if prim is None or prim.impl.startswith(SLOW):
                other = self._create(ConvPrimitive, key, True)
                if other is not None and (prim is None or not other.impl.startswith(SLOW)):
                    if prim is not None:
                        prim.destroy()
                    prim = other
                elif other is not None:
                    other.destroy()
            self._keep(key, prim)
            return prim

    def relaid(self, w: Handle) -> Any:
        """The key of the matmul whose layout constant `w`'s bytes were re-laid into, or
        None: such bytes are that matmul's alone."""
        with self._lock:
            return None if w.alloc is None else \
                self._relaid.get(w.alloc, {}).get(w.byte_offset)

    def _relay(self, prim: Primitive, w: Handle, run: _Run) -> None:
        """Re-lay the constant weights `w` in place, once, into `prim`'s layout (of the same
        size): through a scratch copy freed after, so no second copy of them is kept."""
        lib = self.lib
        with self._lock:
            done = self._relaid.setdefault(w.alloc, {})
            if w.byte_offset in done:
                if done[w.byte_offset] != prim.key:
                    raise DeviceError(f"oneDNN: constant at byte {w.byte_offset} was re-laid "
                                      f"for {done[w.byte_offset]}, not {prim.key}")
                return
            w.alloc.settle(writes_only=True)
            buf, a_impl = aligned(prim.w.bytes)
            scratch, a_rs = aligned(max(prim.w.reorder_scratch_bytes, 1))
            m_user, _ = run.memory(prim.w.user_md)
            m_impl, _ = run.memory(prim.w.impl_md)
            m_rs, _ = run.memory(prim.w.reorder_scratch_md)
            for mem, where in ((m_user, w.address), (m_impl, a_impl), (m_rs, a_rs)):
                check(lib.dnnl_memory_set_data_handle(mem, where), "memory_set_data_handle")
            st = self.stream()
            check(lib.dnnl_primitive_execute(prim.w.reorder, st, 3, _args(
                [(ARG_SRC, m_user), (ARG_DST, m_impl), (ARG_SCRATCHPAD, m_rs)])),
                "reorder execute")
            check(lib.dnnl_stream_wait(st), "stream_wait")
            ctypes.memmove(w.address, a_impl, prim.w.bytes)
            del buf, scratch
            done[w.byte_offset] = prim.key
            self.stats["packs"] += 1

    def work(self, prim: Primitive, x: Handle, w: Handle, bias: Handle | None,
             out: Handle, detach: Sequence[Handle], keep_weights: bool,
             residual: Handle | None = None, in_place: bool = False) -> Callable[[], None]:
        """The work closure running `prim` on the views' memory, writing `out` in place
        (plus `residual`, for a primitive made with one).

        Inputs in `detach` share bytes with `out`: their bytes are copied to scratch first
        and read from there. With `keep_weights` (weights that never change, a delegate's
        constants) the weights are reordered once, into the primitive's kept copy for them
        (`packed_weights`), which later closures over the same weights share. With
        `in_place` (constants only this instruction reads, of the packed layout's size) they
        are re-laid where they lie, once (`_relay`), and read from there.
        """
        lib = self.lib
        run = _Run(lib, self.engine)
        copies: dict[Handle, tuple[np.ndarray, int]] = {}   # by the view itself
        for h in detach:
            lo, hi = h.byte_range()
            buf, base = aligned(hi - lo, h.alloc.ptr + lo)
            copies[h] = (buf, base)
        sets: list[tuple[Any, Callable[[], int]]] = []   # (memory, its address at run time)
        # Detached inputs' copies, taken again on each run; every other address is a view's
        # own, fixed for the life of the closure, so the handles are set on its first run.
        refresh: list[Callable[[], int]] = []
        pre: list[tuple[Any, Any]] = []                  # (reorder, args) before the conv
        post: list[tuple[Any, Any]] = []                 # (reorder, args) after it
        w_pre: list[tuple[Any, Any]] = []
        # (view, dense array) numpy copies before and after the conv, in place of reorders
        np_pre: list[tuple[Handle, np.ndarray]] = []
        np_post: list[tuple[Handle, np.ndarray]] = []

        def operand(op: Operand, view: Callable[[], int], into: bool,
                    into_list: list[tuple[Any, Any]], h: Handle | None = None) -> Any:
            if op.reorder is not None and op.plain is not None and h is not None \
                    and h not in copies:
                # A strided view (a channel slice) to or from a dense plain layout: numpy
                # copies it in a few microseconds, where oneDNN 3.2's reorder took 40-70
                # (YOLOv8n's C2f slices: 43 reorders, about 2 ms a run, AVX-512, 2 cores).
                sizes, strides = op.plain
                isz = h.dtype.itemsize
                raw, base = aligned(op.bytes)
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

        moves: list[tuple[int, int, int]] = []    # refresh's copies: (dst, src, bytes)

        def addr(h: Handle) -> Callable[[], int]:
            c = copies.get(h)
            if c is None:
                return lambda: h.address
            src, base = h, c[1]          # c[0], the buffer, lives in work.keep
            lo, hi = src.byte_range()
            moves.append((base, src.alloc.ptr + lo, hi - lo))

            def copied() -> int:
                # The input's bytes as they are now, at the same distance from 64-byte lines.
                ctypes.memmove(base, src.alloc.ptr + lo, hi - lo)
                return base + (src.address - (src.alloc.ptr + lo))
            refresh.append(copied)
            return copied

        m_src = operand(prim.src, addr(x), True, pre, x)
        packed = None
        if in_place and prim.w.reorder is not None:
            self._relay(prim, w, run)
            m_w, _ = run.memory(prim.w.impl_md)
            sets.append((m_w, lambda: w.address))
        elif keep_weights and prim.w.reorder is not None:
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

        ncopies = len(np_pre) + len(np_post)

        handles_set = []

        def work() -> None:
            st = self.stream()
            if handles_set:
                for take in refresh:
                    take()
            else:
                for mem, where in sets:
                    check(set_handle(mem, where()), "memory_set_data_handle")
                handles_set.append(True)
            steps = pre
            if packed is not None:
                if not packed.filled:
                    with packed.lock:
                        if not packed.filled:
                            for rp, rargs in w_pre:
                                check(execute(rp, st, 3, rargs), "reorder execute")
                            check(lib.dnnl_stream_wait(st), "stream_wait")
                            packed.filled = True
                            stats["packs"] += 1
            else:
                steps = w_pre + pre     # weights that may change: reordered on every run
            for h, arr in np_pre:
                _copy(arr, host_array(h))
            for rp, rargs in steps:
                check(execute(rp, st, 3, rargs), "reorder execute")
            check(execute(prim.prim, st, len(pairs), conv_args), "primitive execute")
            for rp, rargs in post:
                check(execute(rp, st, 3, rargs), "reorder execute")
            check(lib.dnnl_stream_wait(st), "stream_wait")
            for h, arr in np_post:
                _copy(host_array(h), arr)
            stats["runs"] += 1
            stats["epilogues"] += epilogue
            stats["copies"] += ncopies

        execute_at = cpu_native.address(execute)

        def native() -> cpu_native.Native | None:
            # Once the first run has set the handles and filled the kept weights
            if not handles_set or (packed is not None and not packed.filled):
                return None
            keep: list[Any] = [work]
            steps: list[Any] = [(cpu_native.MOVE, 0, d, s, n, 0, 0, 0) for d, s, n in moves]
            for h, arr in np_pre:
                steps.append(cpu_native.strided_copy(*_pair(arr, host_array(h)), keep))
            calls = [*(pre if packed is not None else w_pre + pre), (prim.prim, conv_args),
                     *post]
            steps += [(cpu_native.DNNL, execute_at, cpu_native.address(p), ctypes.addressof(a),
                       len(pairs) if a is conv_args else 3, 0, 0, 0) for p, a in calls]
            for h, arr in np_post:
                steps.append(cpu_native.strided_copy(*_pair(host_array(h), arr), keep))
            if any(st is None for st in steps):
                return None
            return cpu_native.Native(steps, keep=keep, dnnl=self, counts={
                "runs": 1, "epilogues": epilogue, "copies": ncopies})

        return Work(work, native=native, keep=(run, copies, prim))   # live as the work

    def wait(self) -> None:
        """Wait for the calling thread's dnnl stream (after a native plan's oneDNN calls)."""
        check(self.lib.dnnl_stream_wait(self.stream()), "stream_wait")


class FixedMatmul:
    """A matmul over fixed buffers (Dnnl.fixed_matmul): run from Python, or as a native
    plan's step."""

    def __init__(self, dnnl: Dnnl, prim: MatmulPrimitive, args: Any,
                 reorder: tuple[Any, Any, Any] | None, b_layout: Any, keep: Any) -> None:
        self.dnnl, self.prim, self.args = dnnl, prim, args
        # (reorder, b's memory object, its arguments): b into the packed copy
        self._reorder = reorder
        self._b_layout = b_layout
        self.keep = keep        # the memory objects and the arrays their handles point into

    @property
    def packed(self) -> bool:
        """Whether the matmul reads a packed copy of b (made by `pack`), not b itself."""
        return self._reorder is not None

    def pack(self, b: np.ndarray) -> None:
        """Lay `b` (b's shape and strides, its values now) into the packed copy; nothing
        where the matmul reads b in place."""
        if self._reorder is None:
            return
        if (b.shape, b.strides) != self._b_layout:
            raise DeviceError(f"oneDNN: packing weights of shape {b.shape}, strides "
                              f"{b.strides} for a matmul made for {self._b_layout}")
        lib, st = self.dnnl.lib, self.dnnl.stream()
        reorder, m_user, args = self._reorder
        check(lib.dnnl_memory_set_data_handle(m_user, b.ctypes.data), "memory_set_data_handle")
        check(lib.dnnl_primitive_execute(reorder, st, 3, args), "reorder execute")
        check(lib.dnnl_stream_wait(st), "stream_wait")
        self.dnnl.stats["packs"] += 1

    def run(self) -> None:
        """Run it on the calling thread's stream and wait."""
        lib, st = self.dnnl.lib, self.dnnl.stream()
        check(lib.dnnl_primitive_execute(self.prim.prim, st, 4, self.args), "primitive execute")
        check(lib.dnnl_stream_wait(st), "stream_wait")
        self.dnnl.stats["runs"] += 1

    def step(self) -> tuple[int, int, int, int, int, int, int, int]:
        """Its native plan step (the plan's segment waits for the stream after its steps)."""
        return (cpu_native.DNNL, cpu_native.address(self.dnnl.lib.dnnl_primitive_execute),
                cpu_native.address(self.prim.prim), ctypes.addressof(self.args), 4, 0, 0, 0)


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
        weakref.finalize(self, lib.dnnl_stream_destroy, stream).atexit = False


def create(device: Any) -> Dnnl | None:
    """A device's oneDNN state, or None (logged at debug) where oneDNN is not available."""
    lib = library()
    if lib is None:
        return None
    try:
        return Dnnl(lib, device)
    except DeviceError as e:
        log.debug("oneDNN: no cpu engine for %r (%s); cpu convolutions use numpy", device, e)
        return None
