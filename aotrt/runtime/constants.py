"""A loaded program's constants (`LoadedProgram.constants`) and the right to re-lay one in
place.

A constant that one instruction of one method alone reads may be re-laid by that
instruction's op into the layout it runs fastest on (cpu oneDNN's brgemm). The program
decides which at load (`analysis.sole_read_constants`); a delegate hands its program's
`Constants` down to each library op it prepares (`Constants.preparing`), and the op asks
them (`current`). An op prepared outside a delegate gets None: it re-lays nothing.
"""

from __future__ import annotations

import contextvars
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aotrt.runtime.memory import Allocation
    from aotrt.runtime.tensor import Handle


class Constants:
    """The constants of one loaded program: the allocation that holds them, and the byte
    ranges (start, end) in it of those that one program instruction alone reads."""

    __slots__ = ("_alloc", "_sole_read")

    def __init__(self, alloc: "Allocation", sole_read: frozenset[tuple[int, int]]) -> None:
        # Weak: the memory goes with the program's close, whoever still holds these.
        self._alloc = weakref.ref(alloc)
        self._sole_read = sole_read

    def sole_read(self, h: "Handle") -> bool:
        """Whether `h` is the whole of one of these constants that one program instruction
        alone reads, dense, so that the op of that instruction may re-lay it in place."""
        if h.alloc is None or h.alloc is not self._alloc() or not h.packed:
            return False
        lo, hi = h.byte_range()
        return (lo, hi) in self._sole_read and hi - lo == h.numel * h.dtype.itemsize

    def preparing(self) -> "_Preparing":
        """`with constants.preparing():` the library ops prepared on this thread in the
        block are of this program (`current` gives these constants)."""
        return _Preparing(self)


_preparing: contextvars.ContextVar[Constants | None] = contextvars.ContextVar(
    "aotrt_preparing_constants", default=None)


class _Preparing:
    """The block of `Constants.preparing` (a class, not a generator: it wraps every library
    step a delegate builds, at each run where the step is not planned)."""

    __slots__ = ("_constants", "_token")

    def __init__(self, constants: Constants) -> None:
        self._constants = constants
        self._token: Any = None

    def __enter__(self) -> None:
        self._token = _preparing.set(self._constants)

    def __exit__(self, *exc: Any) -> None:
        _preparing.reset(self._token)


def current() -> Constants | None:
    """The constants of the program whose library op is being prepared on this thread, or
    None outside a delegate."""
    return _preparing.get()


__all__ = ["Constants", "current"]
