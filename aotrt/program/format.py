"""The program file (`.aotp`): write, read and validate. No torch, no pickle, no code from
the file is ever run.

A Program is the JSON document of docs/PROGRAM.md plus the constants as numpy arrays.
`Program.load` checks everything a corrupt or hostile file could get wrong (see
`Program.validate`), so that no program can make the runtime touch memory outside the
views it declares; the delegate trusts a validated Program. The checks live in
aotrt/program/validate.py; programs are made by aotrt.exporter.builder.ProgramBuilder.
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
from aotrt.program.records import ConstantRecord, MethodRecord, ProgramRecord, StateRecord
from aotrt.program.strides import contiguous_strides, extent
from aotrt.program.strides import numel_of as numel
from aotrt.program.validate import (MAX_DIMS, SIZE_LIMIT, Validator, check_dict, check_dtype,
                                    check_int, check_limits, check_list, check_str, fail)

log = logging.getLogger(__name__)

FORMAT = "aotrt.program"
#: the version this runtime writes for a program with state or several methods; a program
#: of one stateless method is still written as version 1, which every reader knows
VERSION = 2
VERSIONS = (1, 2)
#: the method name a version-1 file's one method gets
DEFAULT_METHOD = "forward"
#: methods in one file (each is validated and loaded apart)
MAX_METHODS = 64
METADATA_KEY = "aotrt.program"
MAX_HEADER = 100 << 20

_ST_DTYPES = {
    "F32": dtypes.float32, "F16": dtypes.float16, "BF16": dtypes.bfloat16,
    "I64": dtypes.int64, "I32": dtypes.int32, "I16": dtypes.int16, "I8": dtypes.int8,
    "U8": dtypes.uint8, "BOOL": dtypes.bool_,
}

_TOP_KEYS = ("format", "version", "provenance", "inputs", "outputs", "constants", "arena",
             "tensors", "kernels", "instructions", "outputs_tensors")
_TOP_KEYS_V2 = ("format", "version", "provenance", "constants", "state", "kernels", "methods")
_METHOD_KEYS = ("inputs", "outputs", "arena", "tensors", "instructions", "outputs_tensors")
#: a version-2 method's optional fields: its symbols and the fields that depend on them
_DYNAMIC_KEYS = ("symbols", "symbolic")
_STATE_KEYS = {"name", "dtype", "shape", "init"}


# ---------------------------------------------------------------------------------------------
# the Program


class Program:
    """An exported program: the JSON document's fields plus the constants as numpy arrays.

    A program has one or more methods. The file's constants, kernels and state (buffers a
    run writes in place and the next run reads) belong to the program; each method has its
    own inputs, outputs, tensors, instructions and arena, and reads the program's constants
    and state through `constant` and `state` roots (docs/PROGRAM.md).

    A program of one method holds that method's fields itself: `inputs`/`outputs` (lists of
    spec dicts with name, dtype, shape, strides), `constants` (name -> array, in
    constant-index order), `arena_nbytes`, `tensors` (view dicts), `kernels` (ir.Kernel),
    `instructions` (dicts), `outputs_tensors` (tensor ids), `state` (state spec dicts:
    name, dtype, shape, init) and `provenance` (dict of strings). A program of several
    methods (`Program.with_methods`) leaves those per-method fields empty and keeps each
    method as a Program of its own in `methods`, sharing the constants, kernels and state.
    """

    def __init__(self, *, inputs: Sequence[Mapping[str, Any]],
                 outputs: Sequence[Mapping[str, Any]],
                 constants: Mapping[str, np.ndarray] | None = None, arena_nbytes: int = 0,
                 tensors: Sequence[Mapping[str, Any]] = (), kernels: Sequence[ir.Kernel] = (),
                 instructions: Sequence[Mapping[str, Any]] = (),
                 outputs_tensors: Sequence[int] = (),
                 provenance: Mapping[str, Any] | None = None, version: int | None = None,
                 state: Sequence[Mapping[str, Any]] = (),
                 symbols: Sequence[Mapping[str, Any]] = (),
                 symbolic: Sequence[Mapping[str, Any]] = ()) -> None:
        # Shallow copies only: validate() checks the shapes of whatever was passed in.
        self.provenance = dict(provenance or {})
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.constants: dict[str, np.ndarray] = dict(constants or {})
        self.arena_nbytes = arena_nbytes
        self.tensors = list(tensors)
        self.kernels = list(kernels)
        self.instructions = list(instructions)
        self.outputs_tensors = list(outputs_tensors)
        self.state = list(state)
        #: bounded dynamic sizes (program/symbols.py): [{name, min, max}], and where the
        #: method's fields depend on them: [{at: path, expr: terms}]
        self.symbols = list(symbols)
        self.symbolic = list(symbolic)
        # name -> method Program, for a program of several methods (with_methods)
        self._methods: dict[str, Program] | None = None
        # the method's typed fields and the program's tables, made by the validator
        # (program/records.py)
        self._record: MethodRecord | None = None
        self._tables: ProgramRecord | None = None
        self.version = version if version is not None else (
            2 if self.state or self.symbols else 1)

    @classmethod
    def with_methods(cls, methods: Mapping[str, "Program"], *,
                     constants: Mapping[str, np.ndarray], kernels: Sequence[ir.Kernel],
                     state: Sequence[Mapping[str, Any]] = (),
                     provenance: Mapping[str, Any] | None = None) -> "Program":
        """A program of several methods over one set of constants, kernels and state (each
        method's constant and state indices refer to these). Not validated here."""
        prog = cls(inputs=(), outputs=(), constants=constants, kernels=kernels, state=state,
                   provenance=provenance, version=2)
        shared = (prog.constants, prog.kernels, prog.state, prog.provenance)
        prog._methods = {}
        for name, m in methods.items():
            if not isinstance(m, Program):
                raise ProgramError(f"methods[{name!r}]: expected a Program, got "
                                   f"{type(m).__name__}")
            sub = cls(inputs=m.inputs, outputs=m.outputs, arena_nbytes=m.arena_nbytes,
                      tensors=m.tensors, instructions=m.instructions,
                      outputs_tensors=m.outputs_tensors, version=2, symbols=m.symbols,
                      symbolic=m.symbolic)
            sub.constants, sub.kernels, sub.state, sub.provenance = shared
            prog._methods[name] = sub
        return prog

    @property
    def methods(self) -> dict[str, "Program"]:
        """Method name -> the Program a delegate runs for it (a one-method program: itself,
        as "forward")."""
        if self._methods is None:
            return {DEFAULT_METHOD: self}
        return dict(self._methods)

    @property
    def record(self) -> MethodRecord:
        """The method's typed fields (inputs and outputs), made when it was validated; a
        ProgramError before that, and for a program of several methods (see `methods`)."""
        if self._record is None:
            raise ProgramError("the program has no records: Program.validate() makes them, "
                               "per method")
        return self._record

    @property
    def tables(self) -> ProgramRecord:
        """The program's typed constants and state (shared by its methods), made when it
        was validated; a ProgramError before that."""
        if self._tables is None:
            raise ProgramError("the program has no records: Program.validate() makes them")
        return self._tables

    @property
    def has_methods(self) -> bool:
        """True for a program of several methods (its own per-method fields are empty)."""
        return self._methods is not None

    def method(self, name: str) -> "Program":
        """The Program of method `name`; InvalidArgument naming the methods there are."""
        methods = self.methods
        if not isinstance(name, str) or name not in methods:
            raise InvalidArgument(f"method {name!r}: the program has methods "
                                  f"{sorted(methods)}")
        return methods[name]

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
        constants = [{"name": k, "dtype": dtypes.as_dtype(v.dtype).name,
                      "shape": list(v.shape)} for k, v in self.constants.items()]
        if self.version == 1 and self._methods is None:
            return {"format": FORMAT, "version": 1, "provenance": self.provenance,
                    "constants": constants, "kernels": [], **self._method_doc()}
        methods = self._methods if self._methods is not None else {DEFAULT_METHOD: self}
        return {"format": FORMAT, "version": 2, "provenance": self.provenance,
                "constants": constants, "state": self.state, "kernels": [],
                "methods": {name: m._method_doc() for name, m in methods.items()}}

    def _method_doc(self) -> dict[str, Any]:
        doc = {"inputs": self.inputs, "outputs": self.outputs,
               "arena": {"nbytes": self.arena_nbytes}, "tensors": self.tensors,
               "instructions": self.instructions, "outputs_tensors": self.outputs_tensors}
        if self.symbols or self.symbolic:
            doc.update(symbols=self.symbols, symbolic=self.symbolic)
        return doc

    @property
    def is_dynamic(self) -> bool:
        """True for a method with bounded dynamic sizes (symbols)."""
        return bool(self.symbols)

    @classmethod
    def from_json(cls, doc: Any, arrays: Mapping[str, np.ndarray],
                  limits: Limits | None = None) -> "Program":
        """Build and validate a Program from a JSON document and its constants' data."""
        lim = check_limits(limits)
        if not isinstance(doc, dict):
            raise fail("document", "expected a JSON object")
        version = doc.get("version")
        # 2.0 == 2 in Python: the version must be a JSON integer
        if type(version) is not int or version not in VERSIONS:
            raise fail("version", f"unknown format version {version!r}"[:200] +
                       f"; this runtime reads versions {list(VERSIONS)}")
        doc = check_dict(doc, "document", set(_TOP_KEYS if version == 1 else _TOP_KEYS_V2))
        if doc["format"] != FORMAT:
            raise fail("format", f"expected {FORMAT!r}, got {doc['format']!r}"[:200])
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
        kernels = []
        # Counted before the kernels are parsed: each one is a compile unit.
        within(len(check_list(doc["kernels"], "kernels")), lim, "max_kernels", "kernels")
        for i, kj in enumerate(doc["kernels"]):
            kernels.append(_parse_kernel(kj, f"kernels[{i}]"))
        prov = doc["provenance"]
        if not isinstance(prov, dict) or not all(isinstance(v, str) for v in prov.values()):
            raise fail("provenance", "expected an object of strings")
        if version == 1:
            prog = cls(constants=consts, kernels=kernels, provenance=prov, version=1,
                       **_method_fields(doc, ""))
        else:
            state = check_list(doc["state"], "state")
            table = doc["methods"]
            if not isinstance(table, dict) or not table:
                raise fail("methods", "expected a non-empty object of name -> method")
            if len(table) > MAX_METHODS:
                raise fail("methods", f"{len(table)} methods; a program has at most "
                                      f"{MAX_METHODS}")
            methods = {}
            for name, mdoc in table.items():
                w = f"methods[{name!r}]"[:120]
                check_method_name(name, w)
                mdoc = check_dict(mdoc, w, set(_METHOD_KEYS), set(_DYNAMIC_KEYS))
                methods[name] = cls(**_method_fields(mdoc, f"{w}."), version=2,
                                    symbols=mdoc.get("symbols", []),
                                    symbolic=mdoc.get("symbolic", []))
            prog = cls.with_methods(methods, constants=consts, kernels=kernels, state=state,
                                    provenance=prov)
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
            self._validate(lim)
        except ProgramError:
            raise
        except AotrtError as e:
            # Another of aotrt's own refusals (each names its field). A Python exception
            # from the checks is a bug of the validator and surfaces as one.
            raise ProgramError(f"invalid program: {e}"[:500]) from None

    def _validate(self, lim: Limits) -> None:
        if type(self.version) is not int or self.version not in VERSIONS:
            raise fail("version", f"unknown format version {self.version!r}"[:200])
        if self.version == 1 and (self.state or self._methods is not None):
            raise fail("version", "state and several methods need format version 2")
        if self.version == 1 and (self.symbols or self.symbolic):
            raise fail("version", "dynamic sizes (symbols) need format version 2")
        if self._methods is None:
            state = check_state(self.state, self.constants)
            Validator(self, lim).run()
            _check_dynamic(self, lim, "")
            self._tables = _tables(self, state, {DEFAULT_METHOD: self})
            return
        if self.inputs or self.outputs or self.tensors or self.instructions:
            raise fail("methods", "a program of several methods keeps inputs, outputs, "
                                  "tensors and instructions in its methods")
        if not self._methods or len(self._methods) > MAX_METHODS:
            raise fail("methods", f"expected 1 to {MAX_METHODS} methods, got "
                                  f"{len(self._methods)}")
        state = check_state(self.state, self.constants)
        arenas = instructions = stores = 0
        first: Validator | None = None
        for name, m in self._methods.items():
            check_method_name(name, f"methods[{name!r}]"[:120])
            if (m.constants is not self.constants or m.kernels is not self.kernels
                    or m.state is not self.state):
                raise fail(f"methods[{name!r}]", "a method must share its program's constants, "
                                                 "kernels and state (Program.with_methods)")
            v = Validator(m, lim, kernels_of=first)
            try:
                v.run()
                _check_dynamic(m, lim, f"methods[{name!r}].")
            except ProgramError as e:
                raise ProgramError(f"method {name!r}: {e}") from None
            first = first or v
            arenas += check_int(m.arena_nbytes, f"methods[{name!r}].arena.nbytes")
            # Each method was held to the budget alone; the file's budget is not multiplied
            # by its methods: loading compiles and checks every method's instructions.
            instructions += len(m.instructions)
            within(instructions, lim, "max_instructions",
                   f"methods[{name!r}]: instructions of the methods so far")
            stores += v.store_writes
            within(stores, lim, "max_ir_nodes", f"methods[{name!r}]: kernel store footprints "
                                                f"into outputs of the methods so far")
        # Each method was held to the budget alone; the loaded program holds every arena
        # at once, beside one copy of the constants and the state.
        shared = sum(int(a.nbytes) for a in self.constants.values()) + \
            sum(self.root_nbytes()["state"])
        within(arenas + shared, lim, "max_memory_bytes",
               "memory bytes (the methods' arenas + constants + state)")
        self._tables = _tables(self, state, self._methods)
        for m in self._methods.values():
            m._tables = self._tables

    def root_nbytes(self) -> dict[str, list[int]]:
        """Byte size of each root: {'arena': [n], 'input': [...], 'output': [...], ...}."""
        return {
            "arena": [self.arena_nbytes],
            "input": [_spec_nbytes(s) for s in self.inputs],
            "output": [_spec_nbytes(s) for s in self.outputs],
            "constant": [int(a.nbytes) for a in self.constants.values()],
            "state": [_spec_nbytes({**s, "strides": contiguous_strides(s["shape"])})
                      for s in self.state],
        }

    def summary(self) -> str:
        """A human-readable summary (for `aotrt inspect`): the methods with their inputs and
        outputs, the state and which methods share it, the constants and the kernels."""
        lines = [f"aotrt program, format version {self.version}"]
        for k, v in sorted(self.provenance.items()):
            lines.append(f"  {k}: {v}")
        cbytes = sum(int(a.nbytes) for a in self.constants.values())
        lines.append(f"constants: {len(self.constants)} ({_human(cbytes)})")
        lines.append(f"kernels: {len(self.kernels)}")
        state = self.tables.state
        if state:
            lines.append(f"state: {len(state)} ({_human(sum(s.nbytes for s in state))})")
        for st in state:
            who = st.methods
            shared = f"shared by {', '.join(who)}" if len(who) > 1 else \
                f"used by {who[0]}" if who else "used by no method"
            init = f"initial value from constant {st.init}" if st.init else "zeros"
            lines.append(f"  state {st.index} {st.name}: {st.dtype.name}{list(st.shape)}, "
                         f"{init}, {shared}")
        for name, m in self.methods.items():
            lines.append(f"method {name}:")
            lines.extend("  " + line for line in m._method_summary())
        return "\n".join(lines)

    def _method_summary(self) -> list[str]:
        from aotrt.program.symbols import expr_text, input_dims

        lines = []
        # a dynamic method's symbols, and its inputs' and outputs' sizes written in them
        at = {tuple(e["at"]): expr_text(e["expr"]) for e in self.symbolic}
        dims = input_dims(self)
        for s in self.symbols:
            uses = ", ".join(f"input {i} {self.record.inputs[i].name} dim {d}"
                             for i, d in dims.get(s["name"], []))
            lines.append(f"symbol {s['name']}: [{s['min']}, {s['max']}], sizes {uses}")
        for kind, specs in (("input", self.record.inputs), ("output", self.record.outputs)):
            for i, s in enumerate(specs):
                shape, strides = ([at.get((f"{kind}s", i, f, d), str(n)) for d, n in
                                   enumerate(v)] for f, v in (("shape", s.shape),
                                                              ("strides", s.strides)))
                lines.append(f"{kind} {i} {s.name}: {s.dtype.name}[{', '.join(shape)}] "
                             f"strides [{', '.join(strides)}]")
        lines.append(f"arena: {_human(self.arena_nbytes)}")
        lines.append(f"tensors: {len(self.tensors)}")
        counts: dict[str, int] = {}
        for ins in self.record.instructions:
            key = ins.op if ins.op != "library" else f"library {ins.name}"
            counts[key] = counts.get(key, 0) + 1
        lines.append(f"instructions: {len(self.instructions)}")
        for key in sorted(counts):
            lines.append(f"  {key}: {counts[key]}")
        return lines


def check_state(specs: Any, constants: Mapping[str, np.ndarray]
                ) -> list[tuple[str, dtypes.DType, tuple[int, ...], str | None]]:
    """The state table: unique names, a dtype and a shape each (row-major, within the size
    limits), and `init` null (zeros) or the name of a constant of that dtype and shape;
    returns (name, dtype, shape, init) of each."""
    names: set[str] = set()
    out: list[tuple[str, dtypes.DType, tuple[int, ...], str | None]] = []
    for i, s in enumerate(check_list(specs, "state")):
        w = f"state[{i}]"
        s = check_dict(s, w, _STATE_KEYS)
        name = check_str(s["name"], f"{w}.name")
        if name in names:
            raise fail(f"{w}.name", f"duplicate state {name!r}"[:200])
        names.add(name)
        dt = check_dtype(s["dtype"], f"{w}.dtype")
        shape = tuple(check_int(n, f"{w}.shape[{j}]", 0, SIZE_LIMIT)
                      for j, n in enumerate(check_list(s["shape"], f"{w}.shape", MAX_DIMS)))
        if numel(shape) * dt.itemsize >= 1 << 62:
            raise fail(f"{w}.shape", f"{dt.name}{list(shape)} overflows 2**62 bytes")
        init = s["init"]
        out.append((name, dt, shape, None if init is None else check_str(init, f"{w}.init")))
        if init is None:
            continue
        arr = constants.get(init)
        if arr is None:
            raise fail(f"{w}.init", f"no constant named {init!r}"[:200])
        try:
            adt = dtypes.as_dtype(arr.dtype) if isinstance(arr, np.ndarray) else None
        except InvalidArgument:
            adt = None
        if adt is not dt or tuple(arr.shape) != shape:
            raise fail(f"{w}.init", f"constant {init!r} is {arr.dtype}{list(arr.shape)}, the "
                                    f"state {dt.name}{list(shape)}"[:300])
    return out


def _tables(prog: Program, state: list[tuple[str, dtypes.DType, tuple[int, ...], str | None]],
            methods: Mapping[str, Program]) -> ProgramRecord:
    """The typed constants and state of a validated program (its methods validated)."""
    constants = tuple(ConstantRecord(i, name, dtypes.as_dtype(a.dtype), tuple(a.shape),
                                     int(a.nbytes))
                      for i, (name, a) in enumerate(prog.constants.items()))
    index = {c.name: c.index for c in constants}
    users: dict[int, list[str]] = {}
    for mname, m in methods.items():
        for i in sorted({t.index for t in m.record.tensors if t.root == "state"}):
            users.setdefault(i, []).append(mname)
    records = []
    for i, (name, dt, shape, init) in enumerate(state):
        strides = tuple(contiguous_strides(shape))
        records.append(StateRecord(i, name, dt, shape, strides, numel(shape) * dt.itemsize,
                                   init, None if init is None else index[init],
                                   tuple(users.get(i, ()))))
    return ProgramRecord(constants, tuple(records))


def _method_fields(doc: dict, where: str) -> dict[str, Any]:
    """One method's fields of a document (a version-1 document's top level, or a version-2
    method), as Program keyword arguments; the validator checks what they hold."""
    arena = check_dict(doc["arena"], f"{where}arena", {"nbytes"})
    return {"inputs": check_list(doc["inputs"], f"{where}inputs"),
            "outputs": check_list(doc["outputs"], f"{where}outputs"),
            "arena_nbytes": arena["nbytes"],
            "tensors": check_list(doc["tensors"], f"{where}tensors"),
            "instructions": check_list(doc["instructions"], f"{where}instructions"),
            "outputs_tensors": check_list(doc["outputs_tensors"], f"{where}outputs_tensors")}


def check_method_name(name: Any, where: str) -> str:
    """A method name: an identifier of at most 64 characters (it names a Python attribute
    in no place, but it is printed, logged and typed by users)."""
    if not isinstance(name, str) or not name.isidentifier() or len(name) > 64:
        raise fail(where, f"a method name must be an identifier of at most 64 characters, "
                          f"got {name!r}"[:200])
    return name


def _check_dynamic(m: Program, lim: Limits, where: str) -> None:
    """A dynamic method's symbols and symbolic fields (program/symbols.py), and the method
    at the lower bounds validated as a static one: the upper bounds are its stored fields,
    validated already, and every size grows with its symbols, so the two ends bound it."""
    if not m.symbols and not m.symbolic:
        return
    from aotrt.program.symbols import check_symbolic, instantiate

    bounds = check_symbolic(m, where)
    try:
        low = instantiate(m, {s: lo for s, (lo, hi) in bounds.items()})
        Validator(low, lim).run()
    except ProgramError as e:
        raise ProgramError(f"at the lower bounds {dict((s, b[0]) for s, b in bounds.items())}: "
                           f"{e}") from None


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
        # Every malformed field is found by an explicit check naming it (ir.from_json); any
        # other exception is a bug of the parser and is not dressed up as a refusal.
        raise fail(where, f"invalid kernel IR: {e}") from None
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

