"""Typed records of a validated program: what the validator read from the file's JSON
dicts, made once at load, so that the runtime reads attributes, never string keys.

Typed so far: a method's inputs and outputs (`SpecRecord`). Its tensors, instructions and
the program's state are still the document's dicts (docs/DESIGN.md, "The program model").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from aotrt.dtypes import DType


@dataclass(frozen=True)
class SpecRecord:
    """One input or output of a method: name, dtype, shape and strides (elements, packed)
    and its byte size."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    nbytes: int

    def layout_matches(self, strides: Sequence[int]) -> bool:
        """True when `strides` (elements) address the elements exactly as the spec does."""
        return all(a == b for n, a, b in zip(self.shape, strides, self.strides) if n > 1)


@dataclass(frozen=True)
class MethodRecord:
    """A validated method's typed fields: its inputs and outputs."""

    inputs: tuple[SpecRecord, ...]
    outputs: tuple[SpecRecord, ...]


__all__ = ["MethodRecord", "SpecRecord"]
