"""A method's steps: the units a Delegate's run plan is made of (a prepared kernel launch,
a library op, a copy), and the library ops' registry they call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from aotrt.errors import Unsupported
from aotrt.runtime.device import Command

#: a Step's kinds
KERNEL, LIBRARY, COPY = range(3)


def library_ops() -> Mapping[str, Callable[..., Any]]:
    """The library ops registry (imported on first use); Unsupported if it cannot load."""
    try:
        from aotrt.runtime.ops import OPS
    except ImportError as e:
        raise Unsupported(f"library ops are not available: {e}") from e
    return OPS


@dataclass
class Step:
    """One instruction of a method as the run plan holds it: a kernel launch, a library op
    or a copy, with the tensors a run may rebind."""

    kind: int
    target: Any
    a: Any
    b: Any
    params: dict
    label: str
    # The step's commands, validated and built once at load, when it touches no per-run view.
    planned: tuple[Command, ...] | None = None

    def tensor_ids(self) -> list[int]:
        """The program tensors the step reads or writes that a run may rebind."""
        if self.kind == KERNEL:
            return list(self.a)         # only the per-run slots (the rest is resolved)
        if self.kind == LIBRARY:
            return [t for t in (*self.a, *self.b) if t is not None]
        return [self.a, self.b]     # COPY


__all__ = ["COPY", "KERNEL", "LIBRARY", "Step", "library_ops"]
