"""The cpu stream's queue in C: the worker thread waits for work, and runs native plan
segments (devices/cpu_native.py), without the GIL; it returns to Python only for work that
is Python.

With a Python queue, the worker needed the GIL to take a batch, so a plan started only
once run() had returned and the caller blocked, and the caller's wake-up needed the worker
to take the GIL again: about 0.5 ms before the plan and 0.2-0.5 ms after it, of MobileNet-v2's
7.4 ms here (2 cores, 2026-12-04). Here a submit is one C call that holds the GIL (it never
blocks), and a wait is one C call that releases it.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

from aotrt.errors import DeviceError

log = logging.getLogger(__name__)

#: job kinds: native steps (run in C), Python work (the worker returns for it), stop
NATIVE, PYTHON, STOP = 1, 2, 3
#: jobs the ring holds; a submit into a full ring waits for room (with the GIL released)
RING = 1024

SOURCE = r"""
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#define AOTRT_RING %(ring)d

typedef struct {
    int64_t kind;        /* 1: native steps, 2: Python, 3: stop */
    void **P;            /* aotrt_run_steps's pointers (P[2], P[3]: failed step, code) */
    int64_t n, threads;
    void *wait;          /* int (*)(void *): the dnnl stream's wait, after the steps */
} aotrt_job;

typedef struct {
    int64_t done;        /* jobs finished; first, so Python may read it */
    int64_t failed;      /* a job failed: native jobs are skipped until it is cleared */
    int64_t pushed, taken;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    aotrt_job ring[AOTRT_RING];
} aotrt_queue;

void *aotrt_queue_new(void) {
    aotrt_queue *q = (aotrt_queue *)calloc(1, sizeof(aotrt_queue));
    if (!q) return 0;
    if (pthread_mutex_init(&q->mu, 0)) { free(q); return 0; }
    if (pthread_cond_init(&q->cv, 0)) { pthread_mutex_destroy(&q->mu); free(q); return 0; }
    return q;
}

void aotrt_queue_free(void *p) {
    aotrt_queue *q = (aotrt_queue *)p;
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

/* The job's sequence number (1, 2, ...), or 0 where the ring is full (never blocks). */
int64_t aotrt_queue_push(void *p, int64_t kind, void **P, int64_t n, int64_t threads,
                         void *wait) {
    aotrt_queue *q = (aotrt_queue *)p;
    pthread_mutex_lock(&q->mu);
    if (q->pushed - q->taken >= AOTRT_RING) { pthread_mutex_unlock(&q->mu); return 0; }
    aotrt_job *j = &q->ring[q->pushed %% AOTRT_RING];
    j->kind = kind; j->P = P; j->n = n; j->threads = threads; j->wait = wait;
    int64_t seq = ++q->pushed;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return seq;
}

void aotrt_queue_room(void *p) {
    aotrt_queue *q = (aotrt_queue *)p;
    pthread_mutex_lock(&q->mu);
    while (q->pushed - q->taken >= AOTRT_RING) pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

/* The worker's loop: runs native jobs as they come, and returns the kind of the first
   other one (Python, stop), which the caller marks finished with aotrt_queue_finish. */
int64_t aotrt_queue_next(void *p) {
    aotrt_queue *q = (aotrt_queue *)p;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (q->taken == q->pushed) pthread_cond_wait(&q->cv, &q->mu);
        aotrt_job j = q->ring[q->taken %% AOTRT_RING];
        q->taken++;
        pthread_cond_broadcast(&q->cv);
        if (j.kind != 1) { pthread_mutex_unlock(&q->mu); return j.kind; }
        int64_t skip = q->failed;
        pthread_mutex_unlock(&q->mu);
        int64_t *failed = (int64_t *)j.P[2], *code = (int64_t *)j.P[3];
        if (!skip) {
            *failed = 0; *code = 0;
            aotrt_run_steps(j.P, 0, j.n, j.threads);
            if (!*failed && j.wait) {
                int c = ((int (*)(void *))j.wait)(j.P[1]);
                if (c) { *failed = j.n + 1; *code = c; }
            }
        }
        pthread_mutex_lock(&q->mu);
        if (!skip && *failed) q->failed = 1;
        q->done++;
        pthread_cond_broadcast(&q->cv);
    }
}

void aotrt_queue_finish(void *p, int64_t failed) {
    aotrt_queue *q = (aotrt_queue *)p;
    pthread_mutex_lock(&q->mu);
    if (failed) q->failed = 1;
    q->done++;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

void aotrt_queue_wait(void *p, int64_t seq) {
    aotrt_queue *q = (aotrt_queue *)p;
    pthread_mutex_lock(&q->mu);
    while (q->done < seq) pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

/* The worker is gone: every wait returns (the stream reports why). */
void aotrt_queue_abandon(void *p) {
    aotrt_queue *q = (aotrt_queue *)p;
    pthread_mutex_lock(&q->mu);
    q->failed = 1;
    q->done = INT64_MAX;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* Whether a job failed since the last call; clears it. */
int64_t aotrt_queue_take_failed(void *p) {
    aotrt_queue *q = (aotrt_queue *)p;
    pthread_mutex_lock(&q->mu);
    int64_t f = q->failed;
    q->failed = 0;
    pthread_mutex_unlock(&q->mu);
    return f;
}

int64_t aotrt_queue_failed(void *p) {
    aotrt_queue *q = (aotrt_queue *)p;
    pthread_mutex_lock(&q->mu);
    int64_t f = q->failed;
    pthread_mutex_unlock(&q->mu);
    return f;
}
""" % {"ring": RING}

_P, _I = ctypes.c_void_p, ctypes.c_int64
#: symbol: (restype, argtypes, releases the GIL): a call that may block releases it; one
#: that never blocks keeps it (a release and re-take cost more than the call)
_SIGNATURES = {
    "aotrt_queue_new": (_P, (), False),
    "aotrt_queue_free": (None, (_P,), False),
    "aotrt_queue_push": (_I, (_P, _I, _P, _I, _I, _P), False),
    "aotrt_queue_room": (None, (_P,), True),
    "aotrt_queue_next": (_I, (_P,), True),
    "aotrt_queue_finish": (None, (_P, _I), False),
    "aotrt_queue_wait": (None, (_P, _I), True),
    "aotrt_queue_take_failed": (_I, (_P,), False),
    "aotrt_queue_failed": (_I, (_P,), False),
    "aotrt_queue_abandon": (None, (_P,), False),
}
#: the symbols the runner library exports for the queue
SYMBOLS = tuple(_SIGNATURES)


class NativeQueue:
    """One stream's queue in C (made from the device's native runner library, which stays
    mapped while the worker waits in it)."""

    def __init__(self, library: Any) -> None:
        self.library = library
        self._fn: dict[str, Any] = {}
        for name, (res, args, releases) in _SIGNATURES.items():
            addr, _ = library.address(name)
            proto = (ctypes.CFUNCTYPE if releases else ctypes.PYFUNCTYPE)(res, *args)
            self._fn[name] = proto(addr)
        self._q = self._fn["aotrt_queue_new"]()
        if not self._q:
            raise DeviceError("cpu stream: cannot make its native queue (out of memory)")
        self.pushed = 0

    @property
    def done(self) -> int:
        """Jobs finished so far (read without the lock: one aligned int64)."""
        return ctypes.c_int64.from_address(self._q).value

    def push(self, kind: int, ptrs: Any = None, n: int = 0, threads: int = 1,
             wait: int = 0) -> int:
        """Queue one job; its sequence number."""
        fn = self._fn["aotrt_queue_push"]
        seq = fn(self._q, kind, ptrs, n, threads, wait)
        while not seq:
            self._fn["aotrt_queue_room"](self._q)
            seq = fn(self._q, kind, ptrs, n, threads, wait)
        self.pushed = seq
        return seq

    def next(self) -> int:
        """(The worker) Run native jobs until one that is not; its kind."""
        return int(self._fn["aotrt_queue_next"](self._q))

    def finish(self, failed: bool) -> None:
        """(The worker) The Python or stop job it was given is finished."""
        self._fn["aotrt_queue_finish"](self._q, 1 if failed else 0)

    def wait(self, seq: int | None = None) -> None:
        """Block, without the GIL, until job `seq` (default: the last pushed) is finished."""
        self._fn["aotrt_queue_wait"](self._q, self.pushed if seq is None else seq)

    def abandon(self) -> None:
        """(The worker, leaving for good) Let every wait return."""
        self._fn["aotrt_queue_abandon"](self._q)

    @property
    def failed(self) -> bool:
        """Whether a job failed since the last `take_failed`."""
        return bool(self._fn["aotrt_queue_failed"](self._q))

    def take_failed(self) -> bool:
        """Whether a job failed since the last call; the queue runs native jobs again."""
        return bool(self._fn["aotrt_queue_take_failed"](self._q))

    def free(self) -> None:
        """Free the C queue (the worker has left it)."""
        if self._q:
            self._fn["aotrt_queue_free"](self._q)
            self._q = None
