"""The program file (`.aotp`): write, read and validate. No torch, no pickle, no code from
the file is ever run.

A Program is the JSON document of docs/PROGRAM.md plus the constants as numpy arrays.
`Program.load` checks everything a corrupt or hostile file could get wrong (see
`Program.validate`), so that no program can make the runtime touch memory outside the
views it declares; the delegate trusts a validated Program. The checks live in
aotrt/program_check.py; programs are made by aotrt.exporter.builder.ProgramBuilder.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from aotrt import dtypes
from aotrt.analysis import tree_size
from aotrt.errors import AotrtError, InvalidArgument, ProgramError
from aotrt.kernels import ir
from aotrt.limits import Limits, within
from aotrt.program_check import (MAX_DIMS, SIZE_LIMIT, Validator, check_dict, check_dtype,
                                 check_int, check_limits, check_list, check_str, extent, fail)
from aotrt.runtime.tensor import numel_of as numel

log = logging.getLogger(__name__)

FORMAT = "aotrt.program"
VERSION = 1
METADATA_KEY = "aotrt.program"
MAX_HEADER = 100 << 20

_ST_DTYPES = {
    "F32": dtypes.float32, "F16": dtypes.float16, "BF16": dtypes.bfloat16,
    "I64": dtypes.int64, "I32": dtypes.int32, "I16": dtypes.int16, "I8": dtypes.int8,
    "U8": dtypes.uint8, "BOOL": dtypes.bool_,
}

_TOP_KEYS = ("format", "version", "provenance", "inputs", "outputs", "constants", "arena",
             "tensors", "kernels", "instructions", "outputs_tensors")


# ---------------------------------------------------------------------------------------------
# the Program


class Program:
    """An exported program: the JSON document's fields plus the constants as numpy arrays.

    Fields (see docs/PROGRAM.md): `inputs`/`outputs` (lists of spec dicts with name, dtype,
    shape, strides), `constants` (name -> array, in constant-index order), `arena_nbytes`,
    `tensors` (view dicts), `kernels` (ir.Kernel), `instructions` (dicts),
    `outputs_tensors` (tensor ids) and `provenance` (dict of strings).
    """

    def __init__(self, *, inputs: Sequence[Mapping[str, Any]],
                 outputs: Sequence[Mapping[str, Any]],
                 constants: Mapping[str, np.ndarray] | None = None, arena_nbytes: int = 0,
                 tensors: Sequence[Mapping[str, Any]] = (), kernels: Sequence[ir.Kernel] = (),
                 instructions: Sequence[Mapping[str, Any]] = (),
                 outputs_tensors: Sequence[int] = (),
                 provenance: Mapping[str, Any] | None = None, version: int = VERSION) -> None:
        # Shallow copies only: validate() checks the shapes of whatever was passed in.
        self.version = version
        self.provenance = dict(provenance or {})
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.constants: dict[str, np.ndarray] = dict(constants or {})
        self.arena_nbytes = arena_nbytes
        self.tensors = list(tensors)
        self.kernels = list(kernels)
        self.instructions = list(instructions)
        self.outputs_tensors = list(outputs_tensors)

    def __repr__(self) -> str:
        name = self.provenance.get("module", "?")
        return (f"<aotrt.Program {name}: {len(self.inputs)} inputs, {len(self.outputs)} outputs, "
                f"{len(self.instructions)} instructions>")

    # -- (de)serialization --------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The JSON document (without the constants' data)."""
        doc = self._doc_without_kernels()
        doc["kernels"] = [ir.to_json(k) for k in self.kernels]
        return doc

    def _doc_without_kernels(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": self.version,
            "provenance": self.provenance,
            "inputs": self.inputs,
            "outputs": self.outputs,
            "constants": [{"name": k, "dtype": dtypes.as_dtype(v.dtype).name,
                           "shape": list(v.shape)} for k, v in self.constants.items()],
            "arena": {"nbytes": self.arena_nbytes},
            "tensors": self.tensors,
            "kernels": [],
            "instructions": self.instructions,
            "outputs_tensors": self.outputs_tensors,
        }

    @classmethod
    def from_json(cls, doc: Any, arrays: Mapping[str, np.ndarray],
                  limits: Limits | None = None) -> "Program":
        """Build and validate a Program from a JSON document and its constants' data."""
        lim = check_limits(limits)
        doc = check_dict(doc, "document", set(_TOP_KEYS))
        if doc["format"] != FORMAT:
            raise fail("format", f"expected {FORMAT!r}, got {doc['format']!r}"[:200])
        if isinstance(doc["version"], bool) or doc["version"] != VERSION:
            raise fail("version", f"unknown format version {doc['version']!r}"[:200] +
                       f"; this runtime reads version {VERSION}")
        specs = check_list(doc["constants"], "constants")
        consts: dict[str, np.ndarray] = {}
        for i, spec in enumerate(specs):
            where = f"constants[{i}]"
            spec = check_dict(spec, where, {"name", "dtype", "shape"})
            name = check_str(spec["name"], f"{where}.name")
            dt = check_dtype(spec["dtype"], f"{where}.dtype")
            dims = check_list(spec["shape"], f"{where}.shape", MAX_DIMS)
            shape = tuple(check_int(s, f"{where}.shape[{j}]", 0, SIZE_LIMIT)
                          for j, s in enumerate(dims))
            if name in consts:
                raise fail(f"{where}.name", f"duplicate constant {name!r}")
            if name not in arrays:
                raise fail(where, f"constant {name!r} has no data in the file")
            arr = arrays[name]
            if dtypes.as_dtype(arr.dtype) is not dt or tuple(arr.shape) != shape:
                raise fail(where, f"constant {name!r} is {arr.dtype}{list(arr.shape)} in the "
                                  f"file but {dt.name}{list(shape)} in the document")
            consts[name] = arr
        extra = set(arrays) - set(consts)
        if extra:
            raise fail("constants", f"tensors {sorted(extra)[:5]} in the file are not listed")
        arena = check_dict(doc["arena"], "arena", {"nbytes"})
        kernels = []
        # Counted before the kernels are parsed: each one is a compile unit.
        within(len(check_list(doc["kernels"], "kernels")), lim, "max_kernels", "kernels")
        for i, kj in enumerate(doc["kernels"]):
            kernels.append(_parse_kernel(kj, f"kernels[{i}]"))
        prov = doc["provenance"]
        if not isinstance(prov, dict) or not all(isinstance(v, str) for v in prov.values()):
            raise fail("provenance", "expected an object of strings")
        prog = cls(inputs=check_list(doc["inputs"], "inputs"),
                   outputs=check_list(doc["outputs"], "outputs"),
                   constants=consts, arena_nbytes=arena["nbytes"],
                   tensors=check_list(doc["tensors"], "tensors"), kernels=kernels,
                   instructions=check_list(doc["instructions"], "instructions"),
                   outputs_tensors=check_list(doc["outputs_tensors"], "outputs_tensors"),
                   provenance=prov, version=VERSION)
        prog.validate(lim)
        return prog

    def save(self, path: str | os.PathLike) -> None:
        """Validate, then write one safetensors file (constants + the JSON document)."""
        from safetensors.numpy import save_file

        self.validate()
        for i, k in enumerate(self.kernels):
            # The file holds each kernel as a tree: shared IR is written once per use.
            n = tree_size(k, MAX_HEADER)
            if n > MAX_HEADER // 16:
                raise fail(f"kernels[{i}] {k.name}", f"its IR expands to more than "
                                                     f"{MAX_HEADER // 16} nodes in the file")
        text = json.dumps(self.to_json(), separators=(",", ":"), allow_nan=False)
        arrays = {k: np.ascontiguousarray(v) for k, v in self.constants.items()}
        path = Path(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        try:
            save_file(arrays, tmp, metadata={METADATA_KEY: text})
            os.replace(tmp, path)  # a reader never sees half a file
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    @classmethod
    def load(cls, path: str | os.PathLike, limits: Limits | None = None) -> "Program":
        """Read and validate a program file (within `limits`, default aotrt.limits.DEFAULT);
        raise ProgramError saying what and where."""
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise ProgramError(f"{path}: cannot read program file: {e}") from None
        return cls.loads(data, str(path), limits)

    @classmethod
    def loads(cls, data: bytes, name: str = "<bytes>",
              limits: Limits | None = None) -> "Program":
        """Read and validate a program from the bytes of a file."""
        lim = check_limits(limits)
        try:
            meta, arrays = read_safetensors(data)
            if METADATA_KEY not in meta:
                raise ProgramError(f"no {METADATA_KEY!r} entry in the safetensors metadata "
                                   f"(not an aotrt program)")
            try:
                doc = json.loads(meta[METADATA_KEY])
            except (ValueError, RecursionError) as e:
                raise ProgramError(f"the program document is not valid JSON: {e}"[:300]) from None
            return cls.from_json(doc, arrays, lim)
        except ProgramError as e:
            raise ProgramError(f"{name}: {e}") from None

    # -- validation ---------------------------------------------------------------------------

    def validate(self, limits: Limits | None = None) -> None:
        """Check every field (docs/PROGRAM.md) and the budget (docs/limits.md); raise
        ProgramError naming what and where."""
        lim = check_limits(limits)
        try:
            if isinstance(self.version, bool) or self.version != VERSION:
                raise fail("version", f"unknown format version {self.version!r}")
            Validator(self, lim).run()
        except ProgramError:
            raise
        except (AotrtError, TypeError, ValueError, KeyError, AttributeError,
                RecursionError) as e:
            # A hand-built program may hold any Python object; never let it crash the check.
            raise ProgramError(f"invalid program: {type(e).__name__}: {e}"[:500]) from None

    def root_nbytes(self) -> dict[str, list[int]]:
        """Byte size of each root: {'arena': [n], 'input': [...], 'output': [...], ...}."""
        return {
            "arena": [self.arena_nbytes],
            "input": [_spec_nbytes(s) for s in self.inputs],
            "output": [_spec_nbytes(s) for s in self.outputs],
            "constant": [int(a.nbytes) for a in self.constants.values()],
        }

    def summary(self) -> str:
        """A human-readable summary (for `aotrt inspect`)."""
        lines = [f"aotrt program, format version {self.version}"]
        for k, v in sorted(self.provenance.items()):
            lines.append(f"  {k}: {v}")
        for kind, specs in (("input", self.inputs), ("output", self.outputs)):
            for i, s in enumerate(specs):
                lines.append(f"{kind} {i} {s['name']}: {s['dtype']}{list(s['shape'])} "
                             f"strides {list(s['strides'])}")
        cbytes = sum(int(a.nbytes) for a in self.constants.values())
        lines.append(f"constants: {len(self.constants)} ({_human(cbytes)})")
        lines.append(f"arena: {_human(self.arena_nbytes)}")
        lines.append(f"tensors: {len(self.tensors)}")
        lines.append(f"kernels: {len(self.kernels)}")
        counts: dict[str, int] = {}
        for ins in self.instructions:
            key = ins["op"] if ins["op"] != "library" else f"library {ins['fn']}"
            counts[key] = counts.get(key, 0) + 1
        lines.append(f"instructions: {len(self.instructions)}")
        for key in sorted(counts):
            lines.append(f"  {key}: {counts[key]}")
        return "\n".join(lines)


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _spec_nbytes(spec: Mapping[str, Any]) -> int:
    dt = dtypes.as_dtype(spec["dtype"])
    return extent(spec["shape"], spec["strides"], dt.itemsize)[1]


def _parse_kernel(kj: Any, where: str) -> ir.Kernel:
    if not isinstance(kj, dict) or kj.get("t") != "Kernel":
        raise fail(where, "expected a Kernel IR object")
    try:
        k = ir.from_json(kj)
    except ProgramError as e:
        raise fail(where, f"invalid kernel IR: {e}") from None
    except (InvalidArgument, TypeError, ValueError, AttributeError, RecursionError) as e:
        raise fail(where, f"invalid kernel IR: {type(e).__name__}: {e}"[:300]) from None
    if not isinstance(k, ir.Kernel):
        raise fail(where, "expected a Kernel IR object")
    return k


# ---------------------------------------------------------------------------------------------
# safetensors reading (own parser: strict, exact errors, no code from the file)


def read_safetensors(data: bytes) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """Parse a safetensors file's bytes into (metadata, name -> read-only array)."""
    size = len(data)
    if size < 8:
        raise ProgramError(f"truncated file: {size} bytes, fewer than the 8-byte header length")
    n = int.from_bytes(data[:8], "little")
    if n > MAX_HEADER:
        raise ProgramError(f"corrupt file: header length {n} exceeds {MAX_HEADER} bytes")
    if 8 + n > size:
        raise ProgramError(f"truncated file: the header needs {n} bytes but only {size - 8} "
                           f"follow the length")
    try:
        header = json.loads(bytes(data[8:8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ProgramError(f"corrupt file: the safetensors header is not JSON: {e}"[:300]) \
            from None
    if not isinstance(header, dict):
        raise ProgramError("corrupt file: the safetensors header is not an object")
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                             for k, v in meta.items()):
        raise ProgramError("corrupt file: __metadata__ must map strings to strings")
    body = memoryview(data)[8 + n:]
    arrays: dict[str, np.ndarray] = {}
    spans = []
    for name, entry in header.items():
        w = f"file tensor {name!r}"
        entry = check_dict(entry, w, {"dtype", "shape", "data_offsets"})
        code = entry["dtype"]
        # A list or object here is unhashable: check the type before the lookup.
        if not isinstance(code, str) or code not in _ST_DTYPES:
            raise fail(w, f"unsupported safetensors dtype {code!r}"[:200])
        dt = _ST_DTYPES[code]
        shape = tuple(check_int(s, f"{w}.shape[{j}]", 0, SIZE_LIMIT)
                      for j, s in enumerate(check_list(entry["shape"], f"{w}.shape", MAX_DIMS)))
        offs = check_list(entry["data_offsets"], f"{w}.data_offsets")
        if len(offs) != 2:
            raise fail(f"{w}.data_offsets", "expected [begin, end]")
        begin = check_int(offs[0], f"{w}.data_offsets[0]")
        end = check_int(offs[1], f"{w}.data_offsets[1]")
        want = numel(shape) * dt.itemsize
        if end < begin or end - begin != want:
            raise fail(w, f"data_offsets [{begin}, {end}) hold {end - begin} bytes, but "
                          f"{code}{list(shape)} needs {want}")
        if end > len(body):
            raise fail(w, f"truncated file: data [{begin}, {end}) runs past the end of the "
                          f"{len(body)} data bytes")
        spans.append((begin, end, name))
        arr = np.frombuffer(body, dtype=dt.np, count=numel(shape), offset=begin)
        arrays[name] = arr.reshape(shape)
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0 and e0 > b0 and e1 > b1:
            raise ProgramError(f"corrupt file: tensors {n0!r} and {n1!r} overlap in the file")
    return meta, arrays

