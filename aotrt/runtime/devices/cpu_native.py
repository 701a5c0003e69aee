"""The native plan runner of the cpu device: a static plan's works whose calls are fixed at
load (oneDNN primitives, generated and compiled kernels, copies) run from one C loop, one
ctypes call for every run of them in a row, with the GIL released throughout.

A work closure offers its native form as `work.native()`: a `Native` (its steps, and what
they need kept alive, pinned and counted), or None while it still has something to do in
Python (its first run sets memory handles and packs weights). Python between two oneDNN
calls cost about 7 us a call where the caches are cold after a convolution (MobileNet-v2's
53: 5.01 against 4.63 ms a run, 2 cores, 2026-12-04), and each such gap let the OpenMP
pool go to sleep.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from aotrt.errors import DeviceError

#: step kinds (the C loop's switch); MOVE_AT: a memmove to the address held in `a`, plus `m`
DNNL, KERNEL, MOVE, COPY, MOVE_AT = 1, 2, 3, 4, 5
#: dims a strided copy step takes (more go to numpy)
COPY_DIMS = 4
SYMBOL = "aotrt_run_steps"

SOURCE = r"""
#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

int32_t aotrt_error = 0;

typedef int (*dnnl_exec_t)(void *, void *, int, const void *);
typedef void (*kernel_t)(void **, int64_t, int64_t, int64_t);

typedef struct {
    int64_t kind;
    void *fn;            /* dnnl_primitive_execute, or the kernel */
    void *a;             /* the primitive | the kernel's pointers | dst | where dst is */
    void *b;             /* the primitive's arguments | - | src */
    int64_t n;           /* arguments | the kernel's range | bytes */
    int64_t m;           /* - | threads | - | dst's offset from there */
    int32_t *flag;       /* the kernel library's error flag */
    const int64_t *geo;  /* a copy: itemsize, sizes[4], dst strides[4], src strides[4],
                            the dim contiguous in src that is transposed with dim 3, or -1 */
} aotrt_step;

/* Rows [r0, r1) of a copy: the row's coordinates are found once and then stepped (a
   division per row cost more than a 128-byte row's copy: YOLOv8n's C2f slices, 6400 rows). */
static void copy_rows(const aotrt_step *t, int64_t r0, int64_t r1) {
    const int64_t *g = t->geo, *sz = g + 1, *ds = g + 5, *ss = g + 9;
    int64_t isz = g[0], i2 = r0 % sz[2], q = r0 / sz[2], i1 = q % sz[1], i0 = q / sz[1];
    char *d = (char *)t->a + i0 * ds[0] + i1 * ds[1] + i2 * ds[2];
    const char *s = (const char *)t->b + i0 * ss[0] + i1 * ss[1] + i2 * ss[2];
    for (int64_t r = r0; r < r1; r++) {
        if (ds[3] == isz && ss[3] == isz) {
            memcpy(d, s, (size_t)(sz[3] * isz));
        } else if (isz == 4) {
            for (int64_t i3 = 0; i3 < sz[3]; i3++)
                *(int32_t *)(d + i3 * ds[3]) = *(const int32_t *)(s + i3 * ss[3]);
        } else {
            for (int64_t i3 = 0; i3 < sz[3]; i3++)
                memcpy(d + i3 * ds[3], s + i3 * ss[3], (size_t)isz);
        }
        d += ds[2];
        s += ss[2];
        if (++i2 == sz[2]) {
            i2 = 0;
            d += ds[1] - sz[2] * ds[2];
            s += ss[1] - sz[2] * ss[2];
            if (++i1 == sz[1]) {
                i1 = 0;
                d += ds[0] - sz[1] * ds[1];
                s += ss[0] - sz[1] * ss[1];
            }
        }
    }
}

#define TILE 16

#ifdef __AVX512F__
/* dst row j (16 floats at d + j * ld bytes) = column j of the 16 x 16 block whose row i is
   16 floats at s + i * ls bytes. */
static void transpose16(const char *s, int64_t ls, char *d, int64_t ld) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps((const float *)(s + i * ls));
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]),
                                                   _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]),
                                                       _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]),
                                                       _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]),
                                                       _mm512_castps_pd(t[i + 3])));
    }
    for (int h = 0; h < 16; h += 8)
        for (int i = 0; i < 4; i++) {
            t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
            t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
    for (int j = 0; j < 16; j++) _mm512_storeu_ps((float *)(d + j * ld), r[j]);
}
#endif

/* One TILE x TILE tile w of a transpose: dims k (contiguous in src) and 3 (in dst). */
static void copy_tile(const aotrt_step *t, int64_t w) {
    const int64_t *g = t->geo, *sz = g + 1, *ds = g + 5, *ss = g + 9;
    int64_t isz = g[0], k = g[13], o0 = k == 0 ? 1 : 0, o1 = k == 2 ? 1 : 2;
    int64_t nk = (sz[k] + TILE - 1) / TILE, n3 = (sz[3] + TILE - 1) / TILE;
    int64_t b3 = w % n3, r = w / n3, bk = r % nk;
    r /= nk;
    int64_t i1 = r % sz[o1], i0 = r / sz[o1];
    char *d = (char *)t->a + i0 * ds[o0] + i1 * ds[o1];
    const char *s = (const char *)t->b + i0 * ss[o0] + i1 * ss[o1];
    int64_t a0 = bk * TILE, a1 = a0 + TILE < sz[k] ? a0 + TILE : sz[k];
    int64_t c0 = b3 * TILE, c1 = c0 + TILE < sz[3] ? c0 + TILE : sz[3];
#ifdef __AVX512F__
    if (isz == 4 && a1 - a0 == TILE && c1 - c0 == TILE) {
        /* src rows: dim 3 (c) steps ss[3], each 16 floats along dim k (a); dst rows: dim k */
        transpose16(s + a0 * 4 + c0 * ss[3], ss[3], d + a0 * ds[k] + c0 * 4, ds[k]);
        return;
    }
#endif
    for (int64_t a = a0; a < a1; a++) {
        char *da = d + a * ds[k];
        const char *sa = s + a * ss[k];
        if (isz == 4) {
            for (int64_t c = c0; c < c1; c++)
                *(int32_t *)(da + c * ds[3]) = *(const int32_t *)(sa + c * ss[3]);
        } else {
            for (int64_t c = c0; c < c1; c++)
                memcpy(da + c * ds[3], sa + c * ss[3], (size_t)isz);
        }
    }
}

/* Rows split over the threads from 256 KiB up: one core's copy bandwidth was the limit.
   A transpose (geo[13] >= 0) goes tile by tile, so that both sides read and write whole
   cache lines (YOLOv8n's head, NHWC to NCHW: 0.65 ms a run element by element). */
static void strided_copy(const aotrt_step *t, int64_t threads) {
    const int64_t *sz = t->geo + 1;
    int64_t rows = sz[0] * sz[1] * sz[2], k = t->geo[13];
    int64_t items = k < 0 ? rows
        : rows / sz[k] * ((sz[k] + TILE - 1) / TILE) * ((sz[3] + TILE - 1) / TILE);
    int nt = (threads > 1 && items > 1 && rows * sz[3] * t->geo[0] >= (1 << 18))
        ? (int)threads : 1;
    if (k < 0) {
        #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
        for (int64_t c = 0; c < nt; c++) copy_rows(t, rows * c / nt, rows * (c + 1) / nt);
    } else {
        #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
        for (int64_t w = 0; w < items; w++) copy_tile(t, w);
    }
}

/* P[0]: the steps, P[1]: the calling thread's dnnl stream, P[2]: int64 out, the failed
   step + 1 (0: none), P[3]: int64 out, its status or error code. Steps [begin, end). */
void aotrt_run_steps(void **P, int64_t begin, int64_t end, int64_t threads) {
    const aotrt_step *steps = (const aotrt_step *)P[0];
    int64_t *failed = (int64_t *)P[2], *code = (int64_t *)P[3];
    for (int64_t i = begin; i < end; i++) {
        const aotrt_step *t = &steps[i];
        int64_t c = 0;
        switch (t->kind) {
        case 1: c = ((dnnl_exec_t)t->fn)(t->a, P[1], (int)t->n, t->b); break;
        case 2:
            ((kernel_t)t->fn)((void **)t->a, 0, t->n, t->m);
            c = *t->flag;  /* read after the kernel's parallel region joined */
            break;
        case 3: memmove(t->a, t->b, (size_t)t->n); break;
        case 4: strided_copy(t, threads); break;
        case 5: memmove(*(char **)t->a + t->m, t->b, (size_t)t->n); break;
        default: c = -1;
        }
        if (c) { *failed = i + 1; *code = c; return; }
    }
}
"""


class Step(ctypes.Structure):
    """One step of the C loop (aotrt_step)."""

    _fields_ = [("kind", ctypes.c_int64), ("fn", ctypes.c_void_p), ("a", ctypes.c_void_p),
                ("b", ctypes.c_void_p), ("n", ctypes.c_int64), ("m", ctypes.c_int64),
                ("flag", ctypes.c_void_p), ("geo", ctypes.c_void_p)]


@dataclass
class Native:
    """One work's native form: its steps (Step field tuples) and what they need."""

    steps: list[tuple[int, int, int, int, int, int, int, int]]
    keep: list[Any] = field(default_factory=list)   # what the addresses point into
    library: Any = None     # a LoadedLibrary kept mapped while the steps run (its flag)
    label: str = ""         # the kernel's name, in its error
    dnnl: Any = None        # the Dnnl whose calling-thread stream the steps run on
    counts: dict[str, int] = field(default_factory=dict)   # added to dnnl.stats per run


def kernel(library: Any, symbol: str, label: str, ptrs: Any, n: int,
           threads: int) -> Native:
    """A compiled kernel's call over [0, n) on `threads` threads, `ptrs` its pointers."""
    fn, flag = library.address(symbol)
    return Native([(KERNEL, fn, ctypes.addressof(ptrs), 0, n, max(int(threads), 1), flag, 0)],
                  keep=[ptrs], library=library, label=label)


def address(x: Any) -> int:
    """The address a ctypes pointer (or an int) holds."""
    return x if isinstance(x, int) else (ctypes.cast(x, ctypes.c_void_p).value or 0)


def strided_copy(dst: np.ndarray, src: np.ndarray, keep: list[Any]
                 ) -> tuple[int, int, int, int, int, int, int, int] | None:
    """The step copying `src` into `dst` (equal shapes, dtypes and non-negative strides),
    its geometry appended to `keep`; None where the C loop does not take it.

    The dims are taken in dst's memory order and merged where both sides are contiguous
    across them, so that the inner loop copies rows (a channels-last slice in NCHW dim
    order had its elements copied one at a time, 6 ms more for YOLOv8n)."""
    if dst.shape != src.shape or dst.dtype != src.dtype:
        return None
    if any(s < 0 for s in (*dst.strides, *src.strides)) or dst.size == 0:
        return None
    d0, s0 = dst.ctypes.data, src.ctypes.data
    d1 = d0 + sum((n - 1) * st for n, st in zip(dst.shape, dst.strides)) + dst.itemsize
    s1 = s0 + sum((n - 1) * st for n, st in zip(src.shape, src.strides)) + src.itemsize
    if d0 < s1 and s0 < d1:
        return None         # numpy orders an overlapping copy; memcpy would not
    dims = sorted(((n, ds, ss) for n, ds, ss in zip(dst.shape, dst.strides, src.strides)
                   if n != 1), key=lambda d: (d[1], d[2]), reverse=True)
    merged: list[tuple[int, int, int]] = []
    for n, ds, ss in dims:
        if merged and merged[-1][1] == n * ds and merged[-1][2] == n * ss:
            m = merged.pop()
            n = n * m[0]
        merged.append((n, ds, ss))
    if len(merged) > COPY_DIMS:
        return None
    pad = [(1, 0, 0)] * (COPY_DIMS - len(merged))
    merged = pad + merged
    geo = np.array([dst.itemsize, *(d[0] for d in merged), *(d[1] for d in merged),
                    *(d[2] for d in merged), _transposed(merged, dst.itemsize)], np.int64)
    keep += [geo, dst, src]
    return (COPY, 0, d0, s0, 0, 0, 0, geo.ctypes.data)


def _transposed(dims: list[tuple[int, int, int]], itemsize: int) -> int:
    """The dim (of the first three) along which src is contiguous, where dst is contiguous
    along the last and src is not: the copy then goes tile by tile (-1: row by row)."""
    n3, ds3, ss3 = dims[-1]
    if ds3 != itemsize or ss3 == itemsize or n3 < 4:
        return -1
    for k, (n, _, ss) in enumerate(dims[:-1]):
        if ss == itemsize and n >= 4:
            return k
    return -1


def copies(pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> Native | None:
    """The native form of copies (dst, src) made in order; None where one is not taken."""
    keep: list[Any] = []
    steps = [strided_copy(d, s, keep) for d, s in pairs]
    if any(st is None for st in steps):
        return None
    return Native(steps, keep=keep)  # type: ignore[arg-type]


def moves_to(slot: Any, moves: Sequence[tuple[int, int, int]]) -> Native:
    """memmoves (dst offset, src address, bytes) to the address the one-pointer array `slot`
    holds when they run (a lean run's outputs go to a fresh allocation each time)."""
    at = slot.ctypes.data
    return Native([(MOVE_AT, 0, at, src, n, off, 0, 0) for off, src, n in moves if n],
                  keep=[slot])


class Segment:
    """Works in a row that all have a native form: one call of the C loop, made from this
    thread (`run`) or by the stream's queue in C (devices/cpu_queue.py)."""

    def __init__(self, runner: Any, threads: Callable[[], int]) -> None:
        self.runner = runner
        self.threads = threads
        self.natives: list[Native] = []
        self.owners: list[tuple[str, Native]] = []   # per step: (instruction, its work's)

    def add(self, label: str, nat: Native) -> None:
        """Append one work's steps."""
        self.natives.append(nat)
        self.owners += [(label, nat)] * len(nat.steps)

    def seal(self) -> None:
        """Lay the steps out for the C loop, once, for the oneDNN stream of the thread that
        makes it (the stream's worker)."""
        steps = [s for nat in self.natives for s in nat.steps]
        self.n = len(steps)
        self.array = (Step * self.n)(*(Step(*s) for s in steps))
        self.out = np.zeros(2, np.int64)
        self.ptrs = (ctypes.c_void_p * 4)(ctypes.addressof(self.array), None,
                                          self.out.ctypes.data, self.out.ctypes.data + 8)
        libraries: list[Any] = []
        for nat in self.natives:
            if nat.library is not None and all(nat.library is not x for x in libraries):
                libraries.append(nat.library)
        self.libraries = libraries
        self.dnnl = next((n.dnnl for n in self.natives if n.dnnl is not None), None)
        self.thread = threading.get_ident()
        #: the dnnl stream wait's address, called after the steps (0: no oneDNN step)
        self.wait_fn = 0
        if self.dnnl is not None:
            self.ptrs[1] = self.dnnl.stream()
            self.wait_fn = address(self.dnnl.lib.dnnl_stream_wait)
        counts: dict[str, int] = {}
        for nat in self.natives:
            for k, v in nat.counts.items():
                counts[k] = counts.get(k, 0) + v
        self.counts = list(counts.items())

    def run(self) -> None:
        """One call of the C loop over the steps, on this thread; a failed step's error
        names its instruction, as the work's own would have."""
        if self.dnnl is not None:
            self.ptrs[1] = self.dnnl.stream()
        self.out[:] = 0
        with self.pinned(calling=True) or contextlib.nullcontext():
            self.runner.call(SYMBOL, "native plan", self.ptrs, self.n, self.threads())
        self.check()
        if self.dnnl is not None:
            self.dnnl.wait()
        self.account()

    def runs_on(self, thread: int) -> bool:
        """Whether thread `thread` may run the steps from C as laid out (their oneDNN
        stream is its own)."""
        return self.dnnl is None or self.thread == thread

    def pinned(self, calling: bool = False) -> contextlib.ExitStack | None:
        """The libraries the steps call, pinned (mapped) until the stack closes, from any
        thread; None where they call none. `calling`: this thread calls them within the
        stack (a close made there, by a finalizer, leaves the unmapping to the last pin)."""
        if not self.libraries:
            return None
        pins = contextlib.ExitStack()
        try:
            for lib in self.libraries:
                if calling:
                    pins.enter_context(lib.pinned("native plan"))
                else:
                    # A stream pins a segment it queues on run()'s thread and unpins it at
                    # a wait, on whichever thread waits (the closing one, at a close).
                    pins.callback(lib.pin("native plan").release)
        except BaseException:
            pins.close()
            raise
        return pins

    def account(self) -> None:
        """Count one run's oneDNN calls in the device's stats."""
        if self.dnnl is not None:
            stats = self.dnnl.stats
            for k, v in self.counts:
                stats[k] += v

    def check(self) -> None:
        """Raise the error of the step that failed in the last run, if one did."""
        failed, code = int(self.out[0]), int(self.out[1])
        if not failed:
            return
        try:
            if failed > self.n:
                from aotrt.runtime.ops.cpu_dnnl_primitives import check

                check(code, "stream wait")
                raise DeviceError(f"native plan: the oneDNN stream's wait failed ({code})")
            label, nat = self.owners[failed - 1]
            try:
                kind = self.array[failed - 1].kind
                if kind == KERNEL:
                    nat.library.take_error(nat.label)
                elif kind == DNNL:
                    from aotrt.runtime.ops.cpu_dnnl_primitives import check

                    check(code, "primitive execute")
                raise DeviceError(f"native plan: step {failed - 1} failed ({code})")
            except BaseException as e:
                e.add_note(f"in {label}")
                raise
        finally:
            self.out[:] = 0


class NativePlan:
    """A plan's works, run in order: native ones from the C loop, the rest in Python."""

    def __init__(self, runner: Any, works: Sequence[tuple[str, Callable[[], None]]],
                 threads: Callable[[], int] = lambda: 1) -> None:
        """`threads`: the calling thread's kernel thread count, read at each run (copies
        split their rows over them)."""
        #: in order: a Segment, or a work run from Python (its error names its instruction)
        self.jobs: list[Any] = []
        seg: Segment | None = None
        for label, work in works:
            make = getattr(work, "native", None)
            nat = make() if make is not None else None
            if nat is None:
                seg = None
                self.jobs.append(_labelled(label, work))
                continue
            if seg is None:
                seg = Segment(runner, threads)
                self.jobs.append(seg)
            seg.add(label, nat)
        segments = [j for j in self.jobs if isinstance(j, Segment)]
        for seg in segments:
            seg.seal()
        self.segments = len(segments)
        self.steps = sum(seg.n for seg in segments)
        #: every work runs natively
        self.whole = self.segments > 0 and self.segments == len(self.jobs)

    def __call__(self) -> None:
        for job in self.jobs:
            if isinstance(job, Segment):
                job.run()
            else:
                job()


def _labelled(label: str, work: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            work()
        except BaseException as e:
            e.add_note(f"in {label}")       # the instruction, as its own command's label
            raise
    return run
