"""The library ops' signatures, as the validator checks a `library` instruction against them.

The ops live in the runtime (aotrt/runtime/ops), which registers their metadata check here
when it is imported (`register`), as a backend registers its op implementations with
`ops.register`: the program model stays below the runtime and never imports it. A
validation that meets a library instruction with nothing registered refuses the program.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from aotrt.errors import ProgramError


@dataclass(frozen=True)
class Signatures:
    """The library ops' load-time check: `meta(dtype name, sizes, strides)` describes a
    tensor, `check(fn, outs, ins, params)` validates a call from such descriptions and
    returns its cost (`.work`, `.scratch_bytes`), and `param_names` are every op's params."""

    check: Callable[[str, Sequence[Any], Sequence[Any], Mapping[str, Any]], Any]
    meta: Callable[[str, tuple[int, ...], tuple[int, ...]], Any]
    param_names: frozenset[str]


_registered: list[Signatures] = []


def register(signatures: Signatures) -> None:
    """Make `signatures` the ones validators check library instructions against."""
    _registered[:] = [signatures]


def signatures() -> Signatures:
    """The registered signatures; ProgramError when none are (aotrt.runtime.ops is not
    imported: `import aotrt` imports it)."""
    if not _registered:
        raise ProgramError("library ops: no op signatures are registered (importing "
                           "aotrt.runtime.ops registers them)")
    return _registered[0]


__all__ = ["Signatures", "register", "signatures"]
