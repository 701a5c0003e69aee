"""What a stream runs: a unit of work, carrying its native form and what it keeps alive.

A stream's command holds either a plain callable or a `Work`. A `Work` is called like the
callable it wraps; a cpu stream may instead run its native form (`native`: a maker of a
backends/cpu/native.Native, or None where it has none yet) or the jobs of a native plan it
offers (`native_jobs`), and `keep` holds what must live as long as the work (a loaded
library, packed weights, ctypes argument blocks the native form points into).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True, slots=True, eq=False)
class Work:
    """A callable a stream runs, with an optional native segment and its keep-alives."""

    run: Callable[[], None]
    #: () -> a cpu_native.Native, or None where the work runs from Python for now
    native: Callable[[], Any] | None = None
    #: () -> the jobs of a native plan (Segments and Python works), or None
    native_jobs: Callable[[], list[Any] | None] | None = None
    keep: Any = ()

    def __call__(self) -> None:
        """Run the work from Python."""
        self.run()


def native_of(work: Any) -> Callable[[], Any] | None:
    """The maker of a work's native form, or None (a plain callable has none)."""
    return work.native if isinstance(work, Work) else None


def native_jobs_of(work: Any) -> Callable[[], list[Any] | None] | None:
    """What offers a work's native plan jobs, or None (a plain callable offers none)."""
    return work.native_jobs if isinstance(work, Work) else None
