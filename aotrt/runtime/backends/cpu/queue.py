"""The cpu stream's queue in C: the worker thread waits for work, and runs native plan
segments (backends/cpu/native.py), without the GIL; it returns to Python only for work that
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
from aotrt.sources import source

log = logging.getLogger(__name__)

#: job kinds: native steps (run in C), Python work (the worker returns for it), stop
NATIVE, PYTHON, STOP = 1, 2, 3
#: jobs the ring holds; a submit into a full ring waits for room (with the GIL released)
RING = 1024

SOURCE = source(__package__, "queue.c") % {"ring": RING}

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
