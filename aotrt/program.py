"""The program file (`.aotp`): write, read and validate. No torch, no pickle, no code from
the file is ever run.

A Program is the JSON document of docs/PROGRAM.md plus the constants as numpy arrays.
`Program.load` checks everything a corrupt or hostile file could get wrong (see
`Program.validate`), so that no program can make the runtime touch memory outside the
views it declares; the delegate trusts a validated Program.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from aotrt import dtypes
from aotrt.errors import AotrtError, InvalidArgument, ProgramError, Unsupported
from aotrt.kernels import ir
from aotrt.analysis import (Write, affine_index, first_unwritten, kernel_cost, tree_size,
                            uses_reduce_dim)
from aotrt.limits import DEFAULT as DEFAULT_LIMITS, Limits, within
from aotrt.runtime.tensor import contiguous_strides, is_packed
from aotrt.runtime.tensor import numel_of as numel
from aotrt.kernels.bounds import kernel_accesses, walk as _walk

log = logging.getLogger(__name__)

FORMAT = "aotrt.program"
VERSION = 1
METADATA_KEY = "aotrt.program"
ROOTS = ("arena", "input", "output", "constant")
OPCODES = ("kernel", "library", "copy", "fill")

#: a dim's size (and a stride on a dim of size > 1) must fit int32, as the shims require
SIZE_LIMIT = 1 << 31
#: byte counts and offsets stay below this, so no sum of two of them overflows int64
BYTES_LIMIT = 1 << 62
MAX_DIMS = 64
MAX_HEADER = 100 << 20
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

_ST_DTYPES = {
    "F32": dtypes.float32, "F16": dtypes.float16, "BF16": dtypes.bfloat16,
    "I64": dtypes.int64, "I32": dtypes.int32, "I16": dtypes.int16, "I8": dtypes.int8,
    "U8": dtypes.uint8, "BOOL": dtypes.bool_,
}

_TOP_KEYS = ("format", "version", "provenance", "inputs", "outputs", "constants", "arena",
             "tensors", "kernels", "instructions", "outputs_tensors")
_SPEC_KEYS = {"name", "dtype", "shape", "strides"}
_TENSOR_KEYS = {"root", "index", "byte_offset", "dtype", "sizes", "strides"}
_INSTR_KEYS = {
    "kernel": ({"op", "name", "args"}, {"src"}),
    "library": ({"op", "fn", "outs", "ins"}, {"params", "src"}),
    "copy": ({"op", "dst", "src"}, {"src_line"}),
    "fill": ({"op", "dst", "byte"}, {"src"}),
}


# ---------------------------------------------------------------------------------------------
# small checkers: each raises ProgramError naming `where`


def _fail(where: str, what: str) -> ProgramError:
    return ProgramError(f"{where}: {what}" if where else what)


def _int(v: Any, where: str, lo: int = 0, hi: int = BYTES_LIMIT) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _fail(where, f"expected an integer, got {v!r}"[:200])
    if not lo <= v < hi:
        raise _fail(where, f"{v} is outside [{lo}, {hi})")
    return v


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise _fail(where, f"expected a string, got {type(v).__name__}")
    return v


def _list(v: Any, where: str, limit: int | None = None) -> list:
    if not isinstance(v, list):
        raise _fail(where, f"expected a list, got {type(v).__name__}")
    if limit is not None and len(v) > limit:
        raise _fail(where, f"{len(v)} entries exceed the limit of {limit}")
    return v


def _dict(v: Any, where: str, required: set[str], optional: set[str] = frozenset()) -> dict:
    if not isinstance(v, dict):
        raise _fail(where, f"expected an object, got {type(v).__name__}")
    missing = required - set(v)
    if missing:
        raise _fail(where, f"missing field(s) {sorted(missing)}")
    extra = set(v) - required - set(optional)
    if extra:
        raise _fail(where, f"unknown field(s) {sorted(extra)}")
    return v


def _dtype(v: Any, where: str) -> dtypes.DType:
    name = _str(v, where)
    if name not in {d.name for d in dtypes.ALL}:
        raise _fail(where, f"unknown dtype {name!r}")
    return dtypes.as_dtype(name)


def _dims(sizes: Any, strides: Any, where: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    sz = tuple(_int(s, f"{where}.sizes[{i}]", 0, SIZE_LIMIT)
               for i, s in enumerate(_list(sizes, f"{where}.sizes", MAX_DIMS)))
    st_raw = _list(strides, f"{where}.strides", MAX_DIMS)
    if len(st_raw) != len(sz):
        raise _fail(f"{where}.strides", f"{len(st_raw)} strides for {len(sz)} sizes")
    st = tuple(_int(s, f"{where}.strides[{i}]", 0, BYTES_LIMIT) for i, s in enumerate(st_raw))
    if numel(sz):
        for i, (n, s) in enumerate(zip(sz, st)):
            if n > 1 and s >= SIZE_LIMIT:
                raise _fail(f"{where}.strides[{i}]", f"stride {s} does not fit int32")
    return sz, st


def _limits(limits: Any) -> Limits:
    if limits is None:
        return DEFAULT_LIMITS
    if not isinstance(limits, Limits):
        raise InvalidArgument(f"limits: expected an aotrt.Limits, got {type(limits).__name__}")
    return limits


def extent(sizes: Sequence[int], strides: Sequence[int], itemsize: int) -> tuple[int, int]:
    """[lo, hi) bytes relative to element 0 that a view with non-negative strides touches."""
    if numel(sizes) == 0:
        return 0, 0
    hi = sum((n - 1) * s for n, s in zip(sizes, strides) if n > 1)
    return 0, (hi + 1) * itemsize


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
        lim = _limits(limits)
        doc = _dict(doc, "document", set(_TOP_KEYS))
        if doc["format"] != FORMAT:
            raise _fail("format", f"expected {FORMAT!r}, got {doc['format']!r}"[:200])
        if isinstance(doc["version"], bool) or doc["version"] != VERSION:
            raise _fail("version", f"unknown format version {doc['version']!r}"[:200] +
                        f"; this runtime reads version {VERSION}")
        specs = _list(doc["constants"], "constants")
        consts: dict[str, np.ndarray] = {}
        for i, spec in enumerate(specs):
            where = f"constants[{i}]"
            spec = _dict(spec, where, {"name", "dtype", "shape"})
            name = _str(spec["name"], f"{where}.name")
            dt = _dtype(spec["dtype"], f"{where}.dtype")
            shape = tuple(_int(s, f"{where}.shape[{j}]", 0, SIZE_LIMIT)
                          for j, s in enumerate(_list(spec["shape"], f"{where}.shape", MAX_DIMS)))
            if name in consts:
                raise _fail(f"{where}.name", f"duplicate constant {name!r}")
            if name not in arrays:
                raise _fail(where, f"constant {name!r} has no data in the file")
            arr = arrays[name]
            if dtypes.as_dtype(arr.dtype) is not dt or tuple(arr.shape) != shape:
                raise _fail(where, f"constant {name!r} is {arr.dtype}{list(arr.shape)} in the "
                                   f"file but {dt.name}{list(shape)} in the document")
            consts[name] = arr
        extra = set(arrays) - set(consts)
        if extra:
            raise _fail("constants", f"tensors {sorted(extra)[:5]} in the file are not listed")
        arena = _dict(doc["arena"], "arena", {"nbytes"})
        kernels = []
        # Counted before the kernels are parsed: each one is a compile unit.
        within(len(_list(doc["kernels"], "kernels")), lim, "max_kernels", "kernels")
        for i, kj in enumerate(doc["kernels"]):
            kernels.append(_parse_kernel(kj, f"kernels[{i}]"))
        prov = doc["provenance"]
        if not isinstance(prov, dict) or not all(isinstance(v, str) for v in prov.values()):
            raise _fail("provenance", "expected an object of strings")
        prog = cls(inputs=_list(doc["inputs"], "inputs"), outputs=_list(doc["outputs"], "outputs"),
                   constants=consts, arena_nbytes=arena["nbytes"],
                   tensors=_list(doc["tensors"], "tensors"), kernels=kernels,
                   instructions=_list(doc["instructions"], "instructions"),
                   outputs_tensors=_list(doc["outputs_tensors"], "outputs_tensors"),
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
                raise _fail(f"kernels[{i}] {k.name}", f"its IR expands to more than "
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
        lim = _limits(limits)
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
        lim = _limits(limits)
        try:
            _Validator(self, lim).run()
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
        raise _fail(where, "expected a Kernel IR object")
    try:
        k = ir.from_json(kj)
    except ProgramError as e:
        raise _fail(where, f"invalid kernel IR: {e}") from None
    except (InvalidArgument, TypeError, ValueError, AttributeError, RecursionError) as e:
        raise _fail(where, f"invalid kernel IR: {type(e).__name__}: {e}"[:300]) from None
    if not isinstance(k, ir.Kernel):
        raise _fail(where, "expected a Kernel IR object")
    return k


class _Validator:
    """One pass over a Program; every message names the field it is about."""

    def __init__(self, prog: Program, limits: Limits) -> None:
        self.p = prog
        self.lim = limits
        #: elementary steps of one run (docs/limits.md), summed over the instructions
        self.work = 0
        #: output index -> the byte sets instructions write into it (see aotrt.analysis.Write)
        self.writes: dict[int, list[Write]] = {}
        #: kernel name -> kernel_accesses(kernel), computed once however many use it
        self.accesses: dict[str, list] = {}
        #: kernel name -> _store_forms(kernel), likewise
        self.forms: dict[str, list] = {}

    def run(self) -> None:
        p = self.p
        if isinstance(p.version, bool) or p.version != VERSION:
            raise _fail("version", f"unknown format version {p.version!r}")
        if not isinstance(p.provenance, dict):
            raise _fail("provenance", "expected a dict")
        for k, v in p.provenance.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise _fail("provenance", f"entry {k!r} is not a string pair")
        self.inputs = self._specs(p.inputs, "inputs")
        self.outputs = self._specs(p.outputs, "outputs")
        self._constants()
        _int(p.arena_nbytes, "arena.nbytes")
        self.roots = p.root_nbytes()
        lim = self.lim
        within(sum(sum(v) for v in self.roots.values()), lim, "max_memory_bytes",
                "memory bytes (arena + constants + inputs + outputs)")
        within(len(_list(p.kernels, "kernels")), lim, "max_kernels", "kernels")
        within(len(_list(p.instructions, "instructions")), lim, "max_instructions",
                "instructions")
        self.tensors = [self._tensor(t, f"tensors[{i}]") for i, t in enumerate(
            _list(p.tensors, "tensors"))]
        self._kernels()
        for i, ins in enumerate(_list(p.instructions, "instructions")):
            self._instruction(ins, i)
        within(self.work, lim, "max_work", "work of one run (elementary steps)")
        self._outputs_tensors()
        self._coverage()
        # The file must round-trip through JSON exactly as the delegate will see it. The
        # kernels are left out: their every node was type-checked above, and expanding a
        # shared IR graph into a tree could take exponential time.
        try:
            json.dumps(p._doc_without_kernels(), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise _fail("document", f"not serializable as JSON: {e}") from None

    def _specs(self, specs: Any, where: str) -> list[tuple[str, dtypes.DType, tuple, tuple]]:
        out, names = [], set()
        for i, s in enumerate(_list(specs, where)):
            w = f"{where}[{i}]"
            s = _dict(s, w, _SPEC_KEYS)
            name = _str(s["name"], f"{w}.name")
            if name in names:
                raise _fail(f"{w}.name", f"duplicate name {name!r}")
            names.add(name)
            dt = _dtype(s["dtype"], f"{w}.dtype")
            sz, st = _dims(s["shape"], s["strides"], w)
            if not is_packed(sz, st):
                raise _fail(f"{w}.strides", f"{list(st)} for shape {list(sz)} leave holes or "
                                            f"overlap")
            if numel(sz) * dt.itemsize >= BYTES_LIMIT:
                raise _fail(w, f"{dt.name}{list(sz)} overflows 2**62 bytes")
            out.append((name, dt, sz, st))
        return out

    def _constants(self) -> None:
        if not isinstance(self.p.constants, dict):
            raise _fail("constants", "expected a dict of name -> numpy array")
        for i, (name, arr) in enumerate(self.p.constants.items()):
            w = f"constants[{i}] {name!r}"
            _str(name, w)
            if not isinstance(arr, np.ndarray):
                raise _fail(w, f"expected a numpy array, got {type(arr).__name__}")
            try:
                dtypes.as_dtype(arr.dtype)
            except InvalidArgument:
                raise _fail(w, f"unsupported dtype {arr.dtype}") from None
            if arr.ndim > MAX_DIMS or any(n >= SIZE_LIMIT for n in arr.shape):
                raise _fail(w, f"shape {list(arr.shape)} is out of range")

    def _tensor(self, t: Any, w: str) -> tuple[str, int, int, dtypes.DType, tuple, tuple]:
        t = _dict(t, w, _TENSOR_KEYS)
        root = _str(t["root"], f"{w}.root")
        if root not in ROOTS:
            raise _fail(f"{w}.root", f"unknown root {root!r} (known: {list(ROOTS)})")
        sizes = self.roots[root]
        index = _int(t["index"], f"{w}.index", 0, max(len(sizes), 1))
        if index >= len(sizes):
            raise _fail(f"{w}.index", f"{root} {index} does not exist ({len(sizes)} {root}s)")
        dt = _dtype(t["dtype"], f"{w}.dtype")
        off = _int(t["byte_offset"], f"{w}.byte_offset")
        if off % dt.itemsize:
            raise _fail(f"{w}.byte_offset", f"{off} is not a multiple of {dt.name}'s size "
                                            f"{dt.itemsize}")
        sz, st = _dims(t["sizes"], t["strides"], w)
        lo, hi = extent(sz, st, dt.itemsize)
        cap = sizes[index]
        if off + hi > cap or (hi == 0 and off > cap):
            raise _fail(w, f"view bytes [{off + lo}, {off + hi}) lie outside {root} {index} "
                           f"of {cap} bytes")
        return root, index, off, dt, sz, st

    def _tid(self, v: Any, where: str, nullable: bool = False) -> Any:
        if v is None and nullable:
            return None
        if not self.tensors:
            raise _fail(where, f"tensor id {v!r} is out of range: the program has no tensors")
        return _int(v, where, 0, len(self.tensors))

    def _writable(self, tid: int, where: str) -> None:
        root = self.tensors[tid][0]
        if root in ("input", "constant"):
            raise _fail(where, f"tensor {tid} is a view of an {root}, which programs never write")

    def _kernels(self) -> None:
        self.kernel_by_name: dict[str, ir.Kernel] = {}
        self.iterations: dict[str, int] = {}
        nodes = 0
        for i, k in enumerate(_list(self.p.kernels, "kernels")):
            if not isinstance(k, ir.Kernel):
                raise _fail(f"kernels[{i}]", f"expected an ir.Kernel, got {type(k).__name__}")
            try:
                ir.validate(k)
            except InvalidArgument as e:
                raise _fail(f"kernels[{i}]", f"invalid kernel IR: {e}") from None
            if not k.name.isascii():
                raise _fail(f"kernels[{i}]", f"kernel name {k.name!r} is not ASCII")
            if k.name in self.kernel_by_name:
                raise _fail(f"kernels[{i}]", f"duplicate kernel name {k.name!r}")
            _check_kernel_types(k, f"kernels[{i}] {k.name}")
            self.kernel_by_name[k.name] = k
            n, iters = kernel_cost(k, self.lim.max_kernel_iterations)
            nodes += n
            within(nodes, self.lim, "max_ir_nodes", f"kernels[{i}] {k.name}: IR nodes so far")
            within(iters, self.lim, "max_kernel_iterations",
                    f"kernels[{i}] {k.name}: loop iterations")
            self.iterations[k.name] = iters

    def _instruction(self, ins: Any, i: int) -> None:
        w = f"instructions[{i}]"
        if not isinstance(ins, dict):
            raise _fail(w, f"expected an object, got {type(ins).__name__}")
        op = ins.get("op")
        if op not in _INSTR_KEYS:
            raise _fail(f"{w}.op", f"unknown opcode {op!r}"[:200] + f" (known: {list(OPCODES)})")
        required, optional = _INSTR_KEYS[op]
        _dict(ins, w, required, optional)
        for key in ("src", "src_line"):
            if key in ins and not (op == "copy" and key == "src"):
                _str(ins[key], f"{w}.{key}")
        w = f"{w} ({op})"
        if op == "kernel":
            self._kernel_instruction(ins, w)
        elif op == "library":
            self._library_instruction(ins, w)
        elif op == "copy":
            dst = self._tid(ins["dst"], f"{w}.dst")
            src = self._tid(ins["src"], f"{w}.src")
            self._writable(dst, f"{w}.dst")
            a, b = self.tensors[dst], self.tensors[src]
            if a[3] is not b[3] or a[4] != b[4]:
                raise _fail(w, f"dst tensor {dst} is {a[3].name}{list(a[4])} but src tensor "
                               f"{src} is {b[3].name}{list(b[4])}")
            self.work += numel(a[4])
            self._wrote_view(dst)
        else:
            dst = self._tid(ins["dst"], f"{w}.dst")
            self._writable(dst, f"{w}.dst")
            _int(ins["byte"], f"{w}.byte", 0, 256)
            self.work += numel(self.tensors[dst][4])
            self._wrote_view(dst)

    def _kernel_instruction(self, ins: dict, w: str) -> None:
        name = _str(ins["name"], f"{w}.name")
        k = self.kernel_by_name.get(name)
        if k is None:
            raise _fail(f"{w}.name", f"no kernel named {name!r}"[:200])
        args = _list(ins["args"], f"{w}.args")
        if len(args) != len(k.args):
            raise _fail(f"{w}.args", f"kernel {name} takes {len(k.args)} arguments, got "
                                     f"{len(args)}")
        tids = [self._tid(a, f"{w}.args[{j}]") for j, a in enumerate(args)]
        for j, (tid, arg) in enumerate(zip(tids, k.args)):
            t = self.tensors[tid]
            if t[3].name != arg.dtype:
                raise _fail(f"{w}.args[{j}]", f"kernel {name} wants {arg.dtype}, tensor {tid} "
                                              f"is {t[3].name}")
            if "w" in arg.mode:
                self._writable(tid, f"{w}.args[{j}]")
        self.work += self.iterations[name]
        if name not in self.accesses:
            self.accesses[name] = kernel_accesses(k)
        for arg, rng, is_store in self.accesses[name]:
            if rng is None:
                continue
            tid = tids[arg]
            root, index, off, dt, sz, st = self.tensors[tid]
            what = "stores to" if is_store else "loads from"
            if rng == "float":
                raise _fail(w, f"kernel {name} {what} argument {arg} at a non-integer index")
            lo_b, hi_b = extent(sz, st, dt.itemsize)
            if rng[0] * dt.itemsize < lo_b or (rng[1] + 1) * dt.itemsize > hi_b:
                raise _fail(w, f"kernel {name} {what} argument {arg} (tensor {tid}, "
                               f"{dt.name}{list(sz)} of {root} {index}) at element indices "
                               f"[{rng[0]}, {rng[1]}], outside the view's [0, "
                               f"{hi_b // dt.itemsize}); clamp data-dependent indices with "
                               f"minimum/maximum so that the bound is provable")
        if k.numel == 0:
            return
        dims_all = (*k.shape, *k.rshape)
        for st_arg, form in self._store_forms(k):
            root, index, off, dt, _, _ = self.tensors[tids[st_arg]]
            if root != "output" or form is None:
                continue            # a store we cannot describe proves nothing written
            coefs, c0 = form
            start, dims = off + c0 * dt.itemsize, []
            for d, c in coefs.items():
                n = dims_all[d]
                if c < 0:           # the same set of elements, walked the other way
                    start += c * (n - 1) * dt.itemsize
                dims.append((n, abs(c) * dt.itemsize))
            self._wrote(index, Write(start, dims, dt.itemsize))

    def _store_forms(self, k: ir.Kernel) -> list[tuple[int, Any]]:
        """(argument, affine form or None) of each store, computed once per kernel."""
        forms = self.forms.get(k.name)
        if forms is None:
            forms = []
            for st in k.stores:
                # A store that uses a reduce dim runs in a loop over the reduce domain too (as
                # render_c renders it): over every (outer, reduce) point, never if it is empty.
                if uses_reduce_dim(st, len(k.shape)) and numel(k.rshape) == 0:
                    forms.append((st.arg, None))
                else:
                    forms.append((st.arg, affine_index(st.index, len(k.shape) + len(k.rshape))))
            self.forms[k.name] = forms
        return forms

    def _library_instruction(self, ins: dict, w: str) -> None:
        fn = _str(ins["fn"], f"{w}.fn")
        if not fn.isidentifier():
            raise _fail(f"{w}.fn", f"{fn!r} is not a library op name"[:200])
        outs = _list(ins["outs"], f"{w}.outs")
        out_ids = []
        for j, o in enumerate(outs):
            tid = self._tid(o, f"{w}.outs[{j}]")
            self._writable(tid, f"{w}.outs[{j}]")
            out_ids.append(tid)
        in_ids = [self._tid(x, f"{w}.ins[{j}]", nullable=True)
                  for j, x in enumerate(_list(ins["ins"], f"{w}.ins"))]
        params = ins.get("params", {})
        if not isinstance(params, dict):
            raise _fail(f"{w}.params", f"expected an object, got {type(params).__name__}")
        for key, value in params.items():
            if not isinstance(key, str) or not key.isidentifier() or key in ("stream", "outs",
                                                                                "ins"):
                raise _fail(f"{w}.params", f"bad parameter name {key!r}"[:200])
            _json_value(value, f"{w}.params.{key}")
        cost = self._library_check(fn, out_ids, in_ids, params, w)
        self.work += cost.work
        within(cost.scratch_bytes, self.lim, "max_scratch_bytes", f"{w} {fn}: scratch bytes")
        for tid in out_ids:
            self._wrote_view(tid)

    def _library_check(self, fn: str, outs: list[int], ins: list[int | None], params: dict,
                       w: str) -> Any:
        """The library op's own metadata check (contract C3), as ProgramError at `w`."""
        from aotrt.runtime.ops import TensorMeta, check

        def meta(tid: int | None) -> Any:
            if tid is None:
                return None
            _, _, _, dt, sz, st = self.tensors[tid]
            return TensorMeta(dt.name, sz, st)

        try:
            return check(fn, [meta(t) for t in outs], [meta(t) for t in ins], params)
        except Unsupported as e:
            unknown = "is not in this runtime" in str(e)
            raise _fail(f"{w}.fn" if unknown else _op_field(w, fn, str(e)), str(e)) from None
        except InvalidArgument as e:
            raise _fail(_op_field(w, fn, str(e)), _op_message(fn, str(e))) from None

    # -- output coverage ----------------------------------------------------------------------

    def _wrote_view(self, tid: int) -> None:
        """Record that an instruction writes every element of tensor `tid`."""
        root, index, off, dt, sz, st = self.tensors[tid]
        if root != "output" or numel(sz) == 0:
            return
        dims = [(n, s * dt.itemsize) for n, s in zip(sz, st) if n > 1 and s != 0]
        self._wrote(index, Write(off, dims, dt.itemsize))

    def _wrote(self, index: int, write: Write) -> None:
        self.writes.setdefault(index, []).append(write)

    def _coverage(self) -> None:
        """Refuse a program that returns an output with a byte no instruction writes (it
        would hand back whatever that memory held: another run's or delegate's data)."""
        for k, nbytes in enumerate(self.roots["output"]):
            if nbytes == 0:
                continue
            where = f"outputs[{k}] {self.outputs[k][0]!r}"
            first = first_unwritten(self.writes.get(k, []), nbytes, self.lim, where)
            if first is not None:
                raise _fail(where, f"byte {first} of its {nbytes} is never written by any "
                                   f"instruction (kernel stores count only where their index "
                                   f"is affine in the loop indices); the program would return "
                                   f"whatever that memory held")

    def _outputs_tensors(self) -> None:
        ots = _list(self.p.outputs_tensors, "outputs_tensors")
        if len(ots) != len(self.outputs):
            raise _fail("outputs_tensors", f"{len(ots)} entries for {len(self.outputs)} outputs")
        for k, v in enumerate(ots):
            w = f"outputs_tensors[{k}]"
            tid = self._tid(v, w)
            root, index, off, dt, sz, st = self.tensors[tid]
            name, odt, osz, ost = self.outputs[k]
            if (root, index, off) != ("output", k, 0) or dt is not odt or sz != osz or \
                    any(a != b for n, a, b in zip(sz, st, ost) if n > 1):
                raise _fail(w, f"tensor {tid} must be the whole of output {k} ({odt.name}"
                               f"{list(osz)} strides {list(ost)} at byte 0)")


def _op_field(w: str, fn: str, msg: str) -> str:
    """The field path of a library op's complaint "fn: name: ..." (name a param, outs[j],
    ins[j], params, or a role such as x or bias, which stays in the message)."""
    rest = msg[len(fn) + 2:] if msg.startswith(f"{fn}: ") else msg
    field = rest.split(": ", 1)[0] if ": " in rest else ""
    base = field.split("[", 1)[0]
    if base in ("outs", "ins", "params"):
        return f"{w}.{field}"
    from aotrt.runtime.ops import PARAM_NAMES

    if base.isidentifier() and field.replace(base, "", 1).strip("[]0123456789") == "" and \
            base in PARAM_NAMES:
        return f"{w}.params.{field}"
    return w


def _op_message(fn: str, msg: str) -> str:
    return f"library op {msg}"[:400]


_EXPR_TYPES = (ir.Const, ir.Idx, ir.Load, ir.Op, ir.Reduce)


def _check_kernel_types(k: ir.Kernel, where: str) -> None:
    """The IR's own validate() checks meaning; this checks that every node is of the type
    its place needs, so that no renderer meets an object it does not know."""
    for n in (*k.shape, *k.rshape):
        if isinstance(n, bool) or not isinstance(n, int) or n >= SIZE_LIMIT:
            raise _fail(where, f"bad iteration size {n!r}")
    if numel(k.shape) * max(numel(k.rshape), 1) >= BYTES_LIMIT:
        raise _fail(where, "iteration space overflows")
    if not all(isinstance(a, ir.Arg) and isinstance(a.mode, str) for a in k.args):
        raise _fail(where, "arguments must be Arg nodes")
    if not isinstance(k.stores, tuple) or not all(isinstance(s, ir.Store) for s in k.stores):
        raise _fail(where, "stores must be Store nodes")
    for st in k.stores:
        if isinstance(st.arg, bool) or not isinstance(st.arg, int):
            raise _fail(where, f"store argument {st.arg!r} is not an int")
    roots = [x for st in k.stores for x in (st.index, st.value)]
    for e in _walk(roots):
        if not isinstance(e, _EXPR_TYPES):
            raise _fail(where, f"{type(e).__name__} node inside an expression")
        if not isinstance(e.dtype, str):
            raise _fail(where, f"node {type(e).__name__} has a bad dtype")
        if isinstance(e, ir.Const):
            v = e.value
            if isinstance(v, int) and not isinstance(v, bool) and not INT64_MIN <= v <= INT64_MAX:
                raise _fail(where, f"constant {v} overflows int64")
        elif isinstance(e, ir.Idx) and (isinstance(e.dim, bool) or not isinstance(e.dim, int)):
            raise _fail(where, f"Idx dim {e.dim!r} is not an int")
        elif isinstance(e, ir.Load) and (isinstance(e.arg, bool) or not isinstance(e.arg, int)):
            raise _fail(where, f"Load argument {e.arg!r} is not an int")
        elif isinstance(e, ir.Op) and (not isinstance(e.args, tuple) or not isinstance(e.op, str)):
            raise _fail(where, f"malformed Op {e.op!r}")
        elif isinstance(e, ir.Reduce) and not isinstance(e.op, str):
            raise _fail(where, f"malformed Reduce {e.op!r}")


def _json_value(v: Any, where: str, depth: int = 0) -> None:
    if depth > 32:
        raise _fail(where, "nests too deeply")
    if v is None or isinstance(v, (bool, str)):
        return
    if isinstance(v, int):
        if not INT64_MIN <= v <= INT64_MAX:
            raise _fail(where, f"{v} overflows int64")
        return
    if isinstance(v, float):
        if not math.isfinite(v):
            raise _fail(where, f"{v} is not finite")
        return
    if isinstance(v, list):
        for j, x in enumerate(v):
            _json_value(x, f"{where}[{j}]", depth + 1)
        return
    if isinstance(v, dict):
        for k, x in v.items():
            _str(k, where)
            _json_value(x, f"{where}.{k}", depth + 1)
        return
    raise _fail(where, f"{type(v).__name__} is not a JSON value")


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
        entry = _dict(entry, w, {"dtype", "shape", "data_offsets"})
        code = entry["dtype"]
        # A list or object here is unhashable: check the type before the lookup.
        if not isinstance(code, str) or code not in _ST_DTYPES:
            raise _fail(w, f"unsupported safetensors dtype {code!r}"[:200])
        dt = _ST_DTYPES[code]
        shape = tuple(_int(s, f"{w}.shape[{j}]", 0, SIZE_LIMIT)
                      for j, s in enumerate(_list(entry["shape"], f"{w}.shape", MAX_DIMS)))
        offs = _list(entry["data_offsets"], f"{w}.data_offsets")
        if len(offs) != 2:
            raise _fail(f"{w}.data_offsets", "expected [begin, end]")
        begin = _int(offs[0], f"{w}.data_offsets[0]")
        end = _int(offs[1], f"{w}.data_offsets[1]")
        want = numel(shape) * dt.itemsize
        if end < begin or end - begin != want:
            raise _fail(w, f"data_offsets [{begin}, {end}) hold {end - begin} bytes, but "
                           f"{code}{list(shape)} needs {want}")
        if end > len(body):
            raise _fail(w, f"truncated file: data [{begin}, {end}) runs past the end of the "
                           f"{len(body)} data bytes")
        spans.append((begin, end, name))
        arr = np.frombuffer(body, dtype=dt.np, count=numel(shape), offset=begin)
        arrays[name] = arr.reshape(shape)
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0 and e0 > b0 and e1 > b1:
            raise ProgramError(f"corrupt file: tensors {n0!r} and {n1!r} overlap in the file")
    return meta, arrays


# ---------------------------------------------------------------------------------------------
# the builder


class ProgramBuilder:
    """Build a Program step by step; arena buffers are planned (aotrt.exporter.plan) at build().

    Tensor ids are returned by every method that makes a view. Intermediates live in
    `buffer(nbytes)`s whose lifetimes come from the instructions that touch their views.
    """

    def __init__(self, module: str = "", provenance: Mapping[str, str] | None = None) -> None:
        self.provenance = {"module": module, "aotrt": _aotrt_version()}
        self.provenance.update(provenance or {})
        self.inputs: list[dict] = []
        self.outputs: list[dict] = []
        self.outputs_tensors: list[int] = []
        self.constants: dict[str, np.ndarray] = {}
        self.tensors: list[dict] = []
        self.kernels: dict[str, ir.Kernel] = {}
        self.instructions: list[dict] = []
        self.buffers: list[int] = []
        self._ids: dict[tuple, int] = {}

    # -- roots --------------------------------------------------------------------------------

    def input(self, name: str, dtype: Any, shape: Sequence[int],
              strides: Sequence[int] | None = None) -> int:
        """Declare the next input; returns the id of the view covering all of it."""
        spec = _spec(name, dtype, shape, strides)
        self.inputs.append(spec)
        return self.tensor("input", len(self.inputs) - 1, 0, spec["dtype"], spec["shape"],
                           spec["strides"])

    def output(self, name: str, dtype: Any, shape: Sequence[int],
               strides: Sequence[int] | None = None) -> int:
        """Declare the next output; returns the id of the view covering all of it."""
        spec = _spec(name, dtype, shape, strides)
        self.outputs.append(spec)
        tid = self.tensor("output", len(self.outputs) - 1, 0, spec["dtype"], spec["shape"],
                          spec["strides"])
        self.outputs_tensors.append(tid)
        return tid

    def constant(self, name: str, array: np.ndarray) -> int:
        """Add a constant (stored row-major); returns the id of the view covering all of it."""
        if name in self.constants:
            raise InvalidArgument(f"name: duplicate constant {name!r}")
        arr = np.ascontiguousarray(array)
        dt = dtypes.as_dtype(arr.dtype)
        self.constants[name] = arr
        return self.tensor("constant", len(self.constants) - 1, 0, dt.name, list(arr.shape),
                           list(contiguous_strides(arr.shape)))

    def buffer(self, nbytes: int) -> int:
        """A planned arena buffer of `nbytes`; use `in_buffer` to make views of it."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise InvalidArgument(f"nbytes: expected an int >= 0, got {nbytes!r}")
        self.buffers.append(nbytes)
        return len(self.buffers) - 1

    # -- views --------------------------------------------------------------------------------

    def tensor(self, root: str, index: int, byte_offset: int, dtype: Any, sizes: Sequence[int],
               strides: Sequence[int] | None = None) -> int:
        """The id of a view of a root (`arena`, `input`, `output`, `constant`, or `buffer`)."""
        dt = dtypes.as_dtype(dtype).name
        st = list(contiguous_strides(sizes)) if strides is None else [int(s) for s in strides]
        key = (root, int(index), int(byte_offset), dt, tuple(int(s) for s in sizes), tuple(st))
        if key not in self._ids:
            self._ids[key] = len(self.tensors)
            self.tensors.append({"root": root, "index": key[1], "byte_offset": key[2],
                                 "dtype": dt, "sizes": list(key[4]), "strides": st})
        return self._ids[key]

    def in_buffer(self, buf: int, byte_offset: int, dtype: Any, sizes: Sequence[int],
                  strides: Sequence[int] | None = None) -> int:
        """A view of planned buffer `buf` at `byte_offset` bytes from its start."""
        if not 0 <= buf < len(self.buffers):
            raise InvalidArgument(f"buf: no buffer {buf}")
        return self.tensor("buffer", buf, byte_offset, dtype, sizes, strides)

    def alias(self, base: int, sizes: Sequence[int], strides: Sequence[int],
              storage_offset: int, dtype: Any = None) -> int:
        """A view of `base`'s root; `storage_offset` counts elements from the root's start
        (PyTorch's meta['val'] convention, which flattens views of views)."""
        t = self.tensors[base]
        dt = dtypes.as_dtype(dtype if dtype is not None else t["dtype"])
        return self.tensor(t["root"], t["index"], storage_offset * dt.itemsize, dt.name, sizes,
                           strides)

    # -- instructions -------------------------------------------------------------------------

    def kernel(self, kernel: ir.Kernel, args: Sequence[int], src: str = "") -> None:
        """Run `kernel` with tensor ids `args` (in the kernel's argument order)."""
        known = self.kernels.get(kernel.name)
        if known is not None and known != kernel:
            raise InvalidArgument(f"kernel: two different kernels named {kernel.name!r}")
        self.kernels[kernel.name] = kernel
        self.instructions.append({"op": "kernel", "name": kernel.name, "args": list(args),
                                  "src": src})

    def library(self, fn: str, outs: Sequence[int], ins: Sequence[int | None],
                params: Mapping[str, Any] | None = None, src: str = "") -> None:
        """Run library op `fn` (aotrt.runtime.ops.OPS) writing `outs` from `ins`."""
        self.instructions.append({"op": "library", "fn": fn, "outs": list(outs),
                                  "ins": list(ins), "params": dict(params or {}), "src": src})

    def copy(self, dst: int, src: int, src_line: str = "") -> None:
        """Copy tensor `src` into tensor `dst` (same sizes and dtype)."""
        self.instructions.append({"op": "copy", "dst": dst, "src": src, "src_line": src_line})

    def fill(self, dst: int, byte: int, src: str = "") -> None:
        """Set every byte of tensor `dst`'s elements to `byte`."""
        self.instructions.append({"op": "fill", "dst": dst, "byte": byte, "src": src})

    # -- build --------------------------------------------------------------------------------

    def lifetimes(self) -> list[tuple[int, int] | None]:
        """[first, last] instruction index touching each buffer (None when unused)."""
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for i, ins in enumerate(self.instructions):
            for tid in _tensor_ids(ins):
                t = self.tensors[tid]
                if t["root"] == "buffer":
                    first.setdefault(t["index"], i)
                    last[t["index"]] = i
        return [(first[b], last[b]) if b in first else None for b in range(len(self.buffers))]

    def build(self, arena_nbytes: int | None = None, align: int = 64) -> Program:
        """Plan the buffers into the arena and return the validated Program."""
        from aotrt.exporter.plan import plan

        lives = self.lifetimes()
        sizes = [n if life is not None else 0 for n, life in zip(self.buffers, lives)]
        offsets, planned = plan(sizes, [life or (0, 0) for life in lives], align)
        tensors = []
        arena_end = planned
        for t in self.tensors:
            t = dict(t)
            if t["root"] == "buffer":
                t["byte_offset"] += offsets[t["index"]]
                t["root"], t["index"] = "arena", 0
            if t["root"] == "arena":
                dt = dtypes.as_dtype(t["dtype"])
                arena_end = max(arena_end, t["byte_offset"] + extent(
                    t["sizes"], t["strides"], dt.itemsize)[1])
            tensors.append(t)
        nbytes = arena_end if arena_nbytes is None else arena_nbytes
        prog = Program(inputs=self.inputs, outputs=self.outputs, constants=self.constants,
                       arena_nbytes=nbytes, tensors=tensors, kernels=list(self.kernels.values()),
                       instructions=self.instructions, outputs_tensors=self.outputs_tensors,
                       provenance=self.provenance)
        prog.validate()
        return prog


def _tensor_ids(ins: Mapping[str, Any]) -> list[int]:
    """Every tensor id an instruction uses."""
    op = ins["op"]
    if op == "kernel":
        return list(ins["args"])
    if op == "library":
        return [t for t in (*ins["outs"], *ins["ins"]) if t is not None]
    if op == "copy":
        return [ins["dst"], ins["src"]]
    return [ins["dst"]]


def _spec(name: str, dtype: Any, shape: Sequence[int],
          strides: Sequence[int] | None) -> dict[str, Any]:
    shape = [int(s) for s in shape]
    st = list(contiguous_strides(shape)) if strides is None else [int(s) for s in strides]
    return {"name": name, "dtype": dtypes.as_dtype(dtype).name, "shape": shape, "strides": st}


def _aotrt_version() -> str:
    try:
        from importlib.metadata import version
        return version("aotrt")
    except Exception:  # noqa: BLE001 - not installed: provenance says so
        return "unknown"
