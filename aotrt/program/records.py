"""Typed records of a validated program: what the validator read from the file's JSON
dicts, made once at load, so that the runtime reads attributes, never string keys.

The dicts (`Program.inputs`, `tensors`, `instructions`, `state`, ...) are the serialised
form: the exporter builds them and `Program.save` writes them. The runtime never reads
them: it reads these records, frozen, which `Program.validate` makes again from the dicts
each time it runs (every load validates), so a record never outlives an edit of a dict
that was validated again. Typed: a method's inputs and outputs (`SpecRecord`), tensors
(`TensorRecord`), instructions (`InstructionRecord`), arena size and output tensors, in
`MethodRecord`
(`Program.record`); the program's constants (`ConstantRecord`) and state (`StateRecord`),
in `ProgramRecord` (`Program.tables`). Kernels are `aotrt.kernels.ir.Kernel` objects
already; a method's symbols stay dicts (program/symbols.py reads them at load).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from aotrt.dtypes import DType

#: an empty, read-only params mapping (kernel and copy instructions)
NO_PARAMS: Mapping[str, Any] = MappingProxyType({})


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
class TensorRecord:
    """One view of a method: its root ("arena", "input", "output", "constant", "state")
    and index, byte offset from the root's start, dtype, sizes and strides (elements)."""

    root: str
    index: int
    byte_offset: int
    dtype: DType
    sizes: tuple[int, ...]
    strides: tuple[int, ...]

    @property
    def offset(self) -> int:
        """The offset from the root's start in elements of the dtype."""
        return self.byte_offset // self.dtype.itemsize


@dataclass(frozen=True)
class InstructionRecord:
    """One instruction: `op` ("kernel", "library", "copy"); `name` the kernel's or the
    library op's name ("" for a copy); `args` a kernel's tensor ids; `outs`/`ins` a library
    op's (an absent optional input is None), or a copy's (dst,)/(src,); `params` a library
    op's (read-only); `source` the source line it came from ("" if none)."""

    op: str
    name: str
    args: tuple[int, ...]
    outs: tuple[int, ...]
    ins: tuple[int | None, ...]
    params: Mapping[str, Any]
    source: str

    @property
    def referenced(self) -> list[int]:
        """The tensor ids it reads or writes."""
        if self.op == "kernel":
            return list(self.args)
        return [t for t in (*self.outs, *self.ins) if t is not None]


@dataclass(frozen=True)
class MethodRecord:
    """A validated method's typed fields: inputs, outputs, tensors, instructions, the
    arena's byte size and the tensor holding each output."""

    inputs: tuple[SpecRecord, ...]
    outputs: tuple[SpecRecord, ...]
    tensors: tuple[TensorRecord, ...]
    instructions: tuple[InstructionRecord, ...]
    arena_nbytes: int
    outputs_tensors: tuple[int, ...]


@dataclass(frozen=True)
class ConstantRecord:
    """One constant of the program: its index, name, dtype, shape and byte size."""

    index: int
    name: str
    dtype: DType
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class StateRecord:
    """One state buffer: index, name, dtype, shape and strides (row-major), byte size, the
    constant holding its initial value (`init` name and `init_index`; None: zeros) and the
    methods whose tensors view it."""

    index: int
    name: str
    dtype: DType
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    nbytes: int
    init: str | None
    init_index: int | None
    methods: tuple[str, ...]


@dataclass(frozen=True)
class ProgramRecord:
    """A validated program's own tables, shared by its methods: constants and state."""

    constants: tuple[ConstantRecord, ...]
    state: tuple[StateRecord, ...]

    def state_named(self, name: str) -> StateRecord | None:
        """The state buffer called `name`, or None."""
        return next((s for s in self.state if s.name == name), None)


__all__ = ["ConstantRecord", "InstructionRecord", "MethodRecord", "NO_PARAMS",
           "ProgramRecord", "SpecRecord", "StateRecord", "TensorRecord"]
