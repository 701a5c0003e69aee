"""aotrt/program/records.py: the typed records the validator makes at load (issue 35 item
1). They are frozen, they hold what the file says, and the runtime reads them, never the
document's dicts by their typed keys."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from aotrt import dtypes
from aotrt.errors import ProgramError
from aotrt.exporter.builder import ProgramBuilder
from aotrt.program import Program
from aotrt.program.records import (ConstantRecord, InstructionRecord, MethodRecord,
                                   ProgramRecord, SpecRecord, StateRecord, TensorRecord)
from tests.program.test_methods import v2_program

ROOT = Path(__file__).resolve().parents[2]


def _copy_program() -> Program:
    b = ProgramBuilder("Copy")
    x = b.input("x", "float32", [2, 3])
    w = b.constant("w", np.ones((3, 4), np.float32))
    bias = b.constant("bias", np.ones(4, np.float32))
    o = b.output("o", "float32", [2, 4])
    t = b.in_buffer(b.buffer(32), 0, "float32", [2, 4])
    b.library("addmm", [t], [bias, x, w], {"beta": 1, "alpha": 1}, src="model.py:3")
    b.copy(o, t)
    return b.build()


def test_state_and_constants_are_typed_with_their_users() -> None:
    prog = v2_program()
    prog.validate()
    tables = prog.tables
    assert isinstance(tables, ProgramRecord)
    assert all(isinstance(c, ConstantRecord) for c in tables.constants)
    assert [c.name for c in tables.constants] == list(prog.constants)
    for c, arr in zip(tables.constants, prog.constants.values()):
        assert (c.dtype, c.shape, c.nbytes) == (dtypes.as_dtype(arr.dtype), arr.shape,
                                                arr.nbytes)
    acc, steps = tables.state_named("acc"), tables.state_named("steps")
    assert isinstance(acc, StateRecord) and tables.state_named("nope") is None
    assert (acc.dtype, acc.shape, acc.strides, acc.nbytes) == (dtypes.float32, (4,), (1,), 16)
    assert acc.init is None and acc.init_index is None
    assert acc.methods == ("a", "b")          # shared: both methods view it
    assert steps.init == "steps.init"
    assert tables.constants[steps.init_index].name == "steps.init"
    # every method reads the program's one table
    assert all(m.tables is tables for m in prog.methods.values())


def test_tensors_and_instructions_are_typed() -> None:
    prog = _copy_program()
    rec = prog.record
    assert isinstance(rec, MethodRecord) and isinstance(rec.inputs[0], SpecRecord)
    assert all(isinstance(t, TensorRecord) for t in rec.tensors)
    for t, d in zip(rec.tensors, prog.tensors):
        assert (t.root, t.index, t.byte_offset, t.dtype.name, list(t.sizes),
                list(t.strides)) == (d["root"], d["index"], d["byte_offset"], d["dtype"],
                                     list(d["sizes"]), list(d["strides"]))
        assert t.offset == t.byte_offset // t.dtype.itemsize
    lib, cp = rec.instructions
    assert isinstance(lib, InstructionRecord)
    assert dict(lib.params) == {"beta": 1, "alpha": 1} and lib.source == "model.py:3"
    assert (lib.op, lib.name, lib.outs, lib.ins) == ("library", "addmm",
                                                     tuple(prog.instructions[0]["outs"]),
                                                     tuple(prog.instructions[0]["ins"]))
    assert (cp.op, cp.outs, cp.ins) == ("copy", (prog.instructions[1]["dst"],),
                                        (prog.instructions[1]["src"],))
    assert cp.referenced == [*cp.outs, *cp.ins]
    assert rec.arena_nbytes == prog.arena_nbytes
    assert rec.outputs_tensors == tuple(prog.outputs_tensors)


def test_records_are_frozen() -> None:
    prog = v2_program()
    prog.validate()
    st = prog.tables.state[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.name = "other"           # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        prog.tables.constants[0].shape = (1,)   # type: ignore[misc]
    rec = _copy_program().record
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.tensors[0].byte_offset = 4          # type: ignore[misc]
    with pytest.raises(TypeError):
        rec.instructions[0].params["x"] = 1     # type: ignore[index]
    assert isinstance(rec.tensors, tuple) and isinstance(rec.instructions, tuple)
    assert isinstance(prog.tables.state, tuple)


def test_records_are_made_again_by_each_validation() -> None:
    """The dicts are the serialised form: an edit shows in the records only once the
    program is validated again (every load validates)."""
    prog = _copy_program()
    prog.tensors[-1] = {**prog.tensors[-1], "byte_offset": 0}
    before = prog.record
    prog.validate()
    assert prog.record is not before and prog.record == before
    assert Program(inputs=(), outputs=())._record is None
    with pytest.raises(ProgramError, match="no records"):
        Program(inputs=(), outputs=()).tables


#: the typed keys of the document's records, which the runtime must not index
_TYPED_KEYS = ("shape", "dtype", "strides", "name", "sizes", "root", "index", "byte_offset",
               "init", "op", "args", "ins", "outs", "fn", "params")
#: (file, line fragment) allowed to index a dict by such a key, each with its reason
_ALLOWED: tuple[tuple[str, str], ...] = (
    # a method's symbols stay dicts (program/symbols.py); this names them in a refusal,
    # before the program is validated
    ("aotrt/runtime/delegate.py", "s.get('name') for s in program.symbols"),
)


def test_the_runtime_reads_records_not_the_documents_dicts() -> None:
    """No module of aotrt/runtime (nor the CLI, llm or the analyses) indexes a dict by a
    typed key of the program (`x["shape"]`, `x.get("dtype")`): it reads the records."""
    pattern = re.compile(r"""(\[|\.get\()["'](%s)["']""" % "|".join(_TYPED_KEYS))
    files = [*sorted((ROOT / "aotrt" / "runtime").rglob("*.py")), ROOT / "aotrt" / "cli.py",
             ROOT / "aotrt" / "analysis.py", *sorted((ROOT / "aotrt" / "llm").rglob("*.py"))]
    found = []
    for path in files:
        rel = str(path.relative_to(ROOT))
        for line in path.read_text().splitlines():
            if pattern.search(line) and not any(rel == f and frag in line
                                                for f, frag in _ALLOWED):
                found.append(f"{rel}: {line.strip()}")
    assert not found, "\n".join(found)
