"""A compiled cpu library loaded with dlopen: its kernels called through ctypes, its error
flag read after each call, and its code unmapped only once no call of it runs (generated
kernels, an op's own C source, the native plan runner)."""

from __future__ import annotations

import _ctypes
import contextlib
import ctypes
import logging
import threading
from pathlib import Path
from typing import Any, Iterator

from aotrt.errors import CompileError, InvalidArgument

log = logging.getLogger(__name__)


#: seconds `close` waits for a kernel that is still running before it leaves the library
#: mapped (a running kernel's code must never be unmapped)
CLOSE_TIMEOUT = 60.0


class LoadedLibrary:
    """One dlopen handle of a compiled library, its function objects and its error flag.

    Calls count themselves in and out, so `close` unmaps the code only when no kernel of
    it runs; after `close` every call is refused.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._dll: ctypes.CDLL | None = ctypes.CDLL(str(path))
        self._fns: dict[str, Any] = {}
        try:
            self._flag: ctypes.c_int32 | None = ctypes.c_int32.in_dll(self._dll, "aotrt_error")
        except ValueError:
            # Contract C2: every rendered library defines it; without it a kernel's error
            # (a division by zero) would go unreported.
            handle, self._dll = self._dll._handle, None
            _ctypes.dlclose(handle)
            raise CompileError(f"{path.name} defines no aotrt_error flag") from None
        self._cv = threading.Condition()
        # Every pin held, whichever thread holds it: a stream pins a queued native segment on
        # run()'s thread and unpins it at a wait, which may be the closing thread's.
        self._busy = 0
        # Per thread ident: the calls of ours it is inside now (`pinned` blocks). Owned here,
        # under the lock, not a thread-local: a pin's release counts against the thread that
        # took it, whichever thread releases it.
        self._calling: dict[int, int] = {}
        self._unmap_on_exit = False
        self.closed = False

    def function(self, symbol: str) -> Any:
        """The ctypes function `symbol` (looked up by item, never as an attribute)."""
        with self._cv:
            if self._dll is None:
                raise InvalidArgument(f"library {self.path.name} is closed")
            fn = self._fns.get(symbol)
            if fn is None:
                try:
                    fn = self._dll[symbol]
                except AttributeError:
                    raise CompileError(f"{self.path.name} has no symbol {symbol!r}") from None
                fn.restype = None
                fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64, ctypes.c_int64,
                               ctypes.c_int64]
                self._fns[symbol] = fn
            return fn

    def call(self, symbol: str, label: str, ptrs: Any, n: int, threads: int = 1) -> None:
        """Run kernel `symbol` over [0, n) on up to `threads` threads; raise InvalidArgument
        if it (any of its threads) set the error flag."""
        if symbol not in self._fns:
            self.function(symbol)
        pin = self._pin(label, threading.get_ident())
        try:
            fn, flag = self._fns[symbol], self._flag
            # The flag is read after the kernel's parallel region has joined: a store by any
            # of its threads is visible here.
            fn(ptrs, 0, n, threads)
            code = flag.value
            if code:
                flag.value = 0
        finally:
            pin.release()
        if code:
            raise InvalidArgument(f"kernel {label}: {_kernel_error(code)}")

    def pin(self, label: str) -> "Pin":
        """A claim that the code stays mapped until `Pin.release` (from any thread), for
        work queued now that runs later; InvalidArgument once the library is closed."""
        return self._pin(label, None)

    @contextlib.contextmanager
    def pinned(self, label: str) -> Iterator[None]:
        """The code stays mapped within the block (a call of it runs): `close` waits for the
        block's end, or, called inside it on the same thread, leaves the unmapping to it."""
        pin = self._pin(label, threading.get_ident())
        try:
            yield
        finally:
            pin.release()

    def _pin(self, label: str, thread: int | None) -> "Pin":
        with self._cv:
            if self.closed or self._flag is None:
                raise InvalidArgument(f"kernel {label}: its library is closed")
            self._busy += 1
            if thread is not None:
                self._calling[thread] = self._calling.get(thread, 0) + 1
            return Pin(self, thread)

    def _unpin(self, pin: "Pin") -> None:
        """Drop one pin (once: a second release of it does nothing); the last one out of a
        library closed meanwhile unmaps it."""
        handle = None
        with self._cv:
            if pin._library is None:
                return
            pin._library = None
            self._busy -= 1
            thread = pin._thread
            if thread is not None:
                left = self._calling[thread] - 1
                if left:
                    self._calling[thread] = left
                else:
                    del self._calling[thread]
            if self._unmap_on_exit and self._busy == 0:
                handle = self._release_locked()
            self._cv.notify_all()
        if handle is not None:
            _ctypes.dlclose(handle)

    @property
    def pins(self) -> int:
        """Pins held now (queued or running calls)."""
        with self._cv:
            return self._busy

    def address(self, symbol: str) -> tuple[int, int]:
        """(kernel `symbol`'s code address, the error flag's address), for a native call
        made within `pinned` (cpu_native.py)."""
        fn = self.function(symbol)
        with self._cv:
            if self._flag is None:
                raise InvalidArgument(f"kernel {symbol}: its library is closed")
            return ctypes.cast(fn, ctypes.c_void_p).value or 0, ctypes.addressof(self._flag)

    def take_error(self, label: str) -> None:
        """Raise the error a native call of one of the kernels left in the flag (and clear
        it), as `call` does."""
        with self._cv:
            flag = self._flag
            code = 0 if flag is None else flag.value
            if code:
                flag.value = 0
        if code:
            raise InvalidArgument(f"kernel {label}: {_kernel_error(code)}")

    def close(self, timeout: float | None = None) -> bool:
        """dlclose the handle once no call runs; False (and still mapped) after `timeout`."""
        timeout = CLOSE_TIMEOUT if timeout is None else timeout
        with self._cv:
            if self._dll is None:
                return True
            self.closed = True
            if self._calling.get(threading.get_ident()):
                # Closed from inside one of our own calls (a finalizer that ran there):
                # waiting would wait for ourselves, so the last call out unmaps instead.
                self._unmap_on_exit = True
                return False
            if not self._cv.wait_for(lambda: self._busy == 0, timeout=timeout):
                log.warning("%s: a kernel still runs after %.0f s; the library stays mapped",
                            self.path.name, timeout)
                self._unmap_on_exit = True      # the last call out unmaps it
                return False
            if self._dll is None:
                return True                     # the last call out already unmapped it
            handle = self._release_locked()
        _ctypes.dlclose(handle)
        return True

    def _release_locked(self) -> int:
        """Forget every ctypes object of the library (its code is about to go); the handle."""
        handle = self._dll._handle
        self._fns.clear()
        self._flag = None
        self._dll = None
        self._unmap_on_exit = False
        return handle


class Pin:
    """One pin of a LoadedLibrary (see `LoadedLibrary.pin`): an object of its own, so that
    whichever thread ends the work it covers releases it, once."""

    __slots__ = ("_library", "_thread")

    def __init__(self, library: LoadedLibrary, thread: int | None) -> None:
        self._library: LoadedLibrary | None = library
        self._thread = thread           # the thread inside a call of it (`pinned`), or None

    def release(self) -> None:
        """Let the library go (safe twice, from any thread)."""
        lib = self._library
        if lib is not None:
            lib._unpin(self)


class OpSource:
    """An op's own C source (`CpuLibraries.c_library`): built and loaded by its device on first
    use, kept until `close` (one library: every shape is a kernel parameter)."""

    def __init__(self, device: Any, source: str, symbols: list[str]) -> None:
        self.device = device                # the CpuDevice that builds it
        self._source, self._symbols = source, symbols
        self._lock = threading.Lock()
        self._loaded: LoadedLibrary | None = None

    def library(self) -> LoadedLibrary:
        """The loaded library, built on first use (CompileError without a compiler)."""
        with self._lock:
            if self._loaded is None:
                self._loaded = self.device.libraries.c_library(self._source, self._symbols)
            return self._loaded

    def close(self) -> None:
        """Let the compiled library go."""
        with self._lock:
            if self._loaded is not None:
                self._loaded.close()
                self._loaded = None


def _kernel_error(code: int) -> str:
    from aotrt.kernels.render_c import KERNEL_ERRORS

    return KERNEL_ERRORS.get(code, f"error code {code}")
