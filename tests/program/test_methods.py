"""Format version 2 (state and several methods) from a hostile file: every malformed new
field is refused with a ProgramError naming it (issue 35 item 7), and a file's budget is
not multiplied by its methods."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from aotrt.errors import ProgramError
from aotrt.exporter.builder import ProgramBuilder
from aotrt.exporter.methods import merge
from aotrt.kernels import ir
from aotrt.kernels.ir import Arg, Idx, Load, Op, Store
from aotrt.limits import Limits
from aotrt.program import Program
from tests.program.test_format import doc_and_arrays, write_raw

F32 = "float32"


def _pointwise(name: str, op: str, modes: tuple[str, ...], store: int) -> ir.Kernel:
    """args[store] = op(load args[0], load args[1]) over 4 elements."""
    val = Op(op, (Load(0, Idx(0), F32), Load(1, Idx(0), F32)), F32)
    return ir.Kernel(name, (4,), (), tuple(Arg(F32, m) for m in modes),
                     (Store(store, Idx(0), val),))


def acc_method(scale: float) -> Program:
    """acc += x (state, zeros); o = acc * w; steps (int64 state, init 10) untouched."""
    b = ProgramBuilder("acc")
    x = b.input("x", F32, [4])
    acc = b.state("acc", np.zeros(4, np.float32))
    b.state("steps", np.full(1, 10, np.int64))
    w = b.constant("w", np.full(4, scale, np.float32))
    o = b.output("o", F32, [4])
    # acc = acc + x: the kernel reads and writes its second argument
    add = ir.Kernel("accum", (4,), (), (Arg(F32, "r"), Arg(F32, "rw")),
                    (Store(1, Idx(0), Op("add", (Load(1, Idx(0), F32), Load(0, Idx(0), F32)),
                                         F32)),))
    b.kernel(add, [x, acc])
    b.kernel(_pointwise("scale", "mul", ("r", "r", "w"), 2), [acc, w, o])
    return b.build()


def v2_program() -> Program:
    """Two methods `a` and `b` sharing state `acc` (float32[4], zeros) and `steps`
    (int64[1], init constant `steps.init`)."""
    return merge({"a": acc_method(1.0), "b": acc_method(2.0)}, share_state=True)


def v2_doc() -> tuple[dict, dict[str, np.ndarray]]:
    p = v2_program()
    return json.loads(json.dumps(p.to_json())), dict(p.constants)


def load(tmp_path: Path, doc: Any, arrays: dict[str, np.ndarray]) -> Program:
    path = tmp_path / "bad.aotp"
    write_raw(path, doc, arrays)
    return Program.load(path)


def _st(doc: dict, root: str, method: str = "a", index: int = 0) -> dict:
    """The first tensor of `method` rooted at `root` `index`."""
    return next(t for t in doc["methods"][method]["tensors"]
                if t["root"] == root and t["index"] == index)


def _set(*path: Any, value: Any) -> Callable[[dict], None]:
    def mutate(doc: dict) -> None:
        node = doc
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return mutate


def _many_methods(n: int) -> Callable[[dict], None]:
    def mutate(doc: dict) -> None:
        doc["methods"] = {f"m{i}": copy.deepcopy(doc["methods"]["a"]) for i in range(n)}
    return mutate


def _rename(old: str, new: Any) -> Callable[[dict], None]:
    def mutate(doc: dict) -> None:
        doc["methods"][new] = doc["methods"].pop(old)
    return mutate


BAD_V2: list[tuple[str, Callable[[dict], None], str]] = [
    # the state table
    ("state not a list", _set("state", value={}), r"state: expected a list, got dict"),
    ("state missing", lambda d: d.pop("state"), r"missing field\(s\) \['state'\]"),
    ("state entry not an object", _set("state", 0, value=7),
     r"state\[0\]: expected an object, got int"),
    ("state entry missing init", lambda d: d["state"][0].pop("init"),
     r"state\[0\]: missing field\(s\) \['init'\]"),
    ("state entry missing name", lambda d: d["state"][1].pop("name"),
     r"state\[1\]: missing field\(s\) \['name'\]"),
    ("state entry extra key", lambda d: d["state"][0].update(strides=[1]),
     r"state\[0\]: unknown field\(s\) \['strides'\]"),
    ("state name an int", _set("state", 0, "name", value=5),
     r"state\[0\]\.name: expected a string, got int"),
    ("state name null", _set("state", 1, "name", value=None),
     r"state\[1\]\.name: expected a string, got NoneType"),
    ("state name a list", _set("state", 0, "name", value=["acc"]),
     r"state\[0\]\.name: expected a string, got list"),
    ("duplicate state name", _set("state", 1, "name", value="acc"),
     r"state\[1\]\.name: duplicate state 'acc'"),
    ("state dtype unknown", _set("state", 0, "dtype", value="complex64"),
     r"state\[0\]\.dtype: unknown dtype 'complex64'"),
    ("state dtype not a string", _set("state", 0, "dtype", value=4),
     r"state\[0\]\.dtype: expected a string, got int"),
    ("state shape not a list", _set("state", 0, "shape", value=4),
     r"state\[0\]\.shape: expected a list, got int"),
    ("state shape negative", _set("state", 0, "shape", value=[-1]),
     r"state\[0\]\.shape\[0\]: -1 is outside \[0, 2147483648\)"),
    ("state shape huge", _set("state", 0, "shape", value=[4, 1 << 31]),
     r"state\[0\]\.shape\[1\]: 2147483648 is outside \[0, 2147483648\)"),
    ("state shape a float", _set("state", 0, "shape", value=[4.0]),
     r"state\[0\]\.shape\[0\]: expected an integer, got 4\.0"),
    ("state shape a bool", _set("state", 0, "shape", value=[True]),
     r"state\[0\]\.shape\[0\]: expected an integer, got True"),
    ("state shape a string", _set("state", 0, "shape", value=["4"]),
     r"state\[0\]\.shape\[0\]: expected an integer, got '4'"),
    ("state rank over 64", _set("state", 0, "shape", value=[1] * 65),
     r"state\[0\]\.shape: 65 entries exceed the limit of 64"),
    ("state overflows 2**62 bytes", _set("state", 0, "shape", value=[2 ** 31 - 1] * 2),
     r"state\[0\]\.shape: float32\[2147483647, 2147483647\] overflows 2\*\*62 bytes"),
    ("state init names no constant", _set("state", 1, "init", value="nope"),
     r"state\[1\]\.init: no constant named 'nope'"),
    ("state init of the wrong dtype", _set("state", 0, "init", value="steps.init"),
     r"state\[0\]\.init: constant 'steps\.init' is int64\[1\], the state float32\[4\]"),
    ("state init of the wrong shape", lambda d: d["state"][1].update(shape=[2]),
     r"state\[1\]\.init: constant 'steps\.init' is int64\[1\], the state int64\[2\]"),
    ("state init an int", _set("state", 1, "init", value=0),
     r"state\[1\]\.init: expected a string, got int"),
    ("state init a list", _set("state", 1, "init", value=["steps.init"]),
     r"state\[1\]\.init: expected a string, got list"),
    ("state init an object", _set("state", 1, "init", value={}),
     r"state\[1\]\.init: expected a string, got dict"),
    # the methods table
    ("methods a list", _set("methods", value=[]), r"methods: expected a non-empty object"),
    ("methods empty", _set("methods", value={}), r"methods: expected a non-empty object"),
    ("methods missing", lambda d: d.pop("methods"), r"missing field\(s\) \['methods'\]"),
    ("65 methods", _many_methods(65), r"methods: 65 methods; a program has at most 64"),
    ("method name with a dash", _rename("a", "a-b"),
     r"methods\['a-b'\]: a method name must be an identifier"),
    ("method name empty", _rename("a", ""),
     r"methods\[''\]: a method name must be an identifier"),
    ("method name a digit first", _rename("b", "1b"),
     r"methods\['1b'\]: a method name must be an identifier"),
    ("method name of 65 chars", _rename("a", "m" * 65),
     r"methods\['m{65}'\]: a method name must be an identifier of at most 64 characters"),
    ("method not an object", _set("methods", "b", value=[]),
     r"methods\['b'\]: expected an object, got list"),
    ("method missing arena", lambda d: d["methods"]["a"].pop("arena"),
     r"methods\['a'\]: missing field\(s\) \['arena'\]"),
    ("method missing outputs_tensors", lambda d: d["methods"]["b"].pop("outputs_tensors"),
     r"methods\['b'\]: missing field\(s\) \['outputs_tensors'\]"),
    ("method extra key", lambda d: d["methods"]["a"].update(kernels=[]),
     r"methods\['a'\]: unknown field\(s\) \['kernels'\]"),
    ("method arena not an object", _set("methods", "a", "arena", value=64),
     r"methods\['a'\]\.arena: expected an object, got int"),
    ("method arena extra key", _set("methods", "a", "arena", value={"nbytes": 0, "at": 0}),
     r"methods\['a'\]\.arena: unknown field\(s\) \['at'\]"),
    ("method arena negative", _set("methods", "b", "arena", value={"nbytes": -1}),
     r"method 'b': arena\.nbytes: -1 is outside"),
    ("method arena a float", _set("methods", "b", "arena", value={"nbytes": 64.0}),
     r"method 'b': arena\.nbytes: expected an integer, got 64\.0"),
    ("method arena over 2**62", _set("methods", "a", "arena", value={"nbytes": 1 << 62}),
     r"method 'a': arena\.nbytes: 4611686018427387904 is outside"),
    ("method tensors not a list", _set("methods", "a", "tensors", value={}),
     r"methods\['a'\]\.tensors: expected a list, got dict"),
    # tensors rooted at the state
    ("state index past the table", lambda d: _st(d, "state", "a", 1).update(index=2),
     r"method 'a': tensors\[\d+\]\.index: 2 is outside \[0, 2\)"),
    ("state index negative", lambda d: _st(d, "state", "b", 0).update(index=-1),
     r"method 'b': tensors\[\d+\]\.index: -1 is outside \[0, 2\)"),
    ("state index huge", lambda d: _st(d, "state", "a", 0).update(index=1 << 64),
     r"method 'a': tensors\[\d+\]\.index: 18446744073709551616 is outside"),
    ("state root without state", lambda d: d.update(state=[]),
     r"method 'a': tensors\[\d+\]\.index: state 0 does not exist \(0 states\)"),
    ("state view offset past its end", lambda d: _st(d, "state").update(byte_offset=4),
     r"method 'a': tensors\[\d+\]: view bytes \[4, 20\) lie outside state 0 of 16 bytes"),
    ("state view larger than the state", lambda d: _st(d, "state").update(sizes=[5]),
     r"method 'a': tensors\[\d+\]: view bytes \[0, 20\) lie outside state 0 of 16 bytes"),
    ("state view strided past its end", lambda d: _st(d, "state", "b").update(strides=[2]),
     r"method 'b': tensors\[\d+\]: view bytes \[0, 28\) lie outside state 0 of 16 bytes"),
    ("state view of another state's size", lambda d: _st(d, "state", "b", 1).update(
        dtype=F32, sizes=[4]),
     r"method 'b': tensors\[\d+\]: view bytes \[0, 16\) lie outside state 1 of 8 bytes"),
    ("state shrunk under its views", _set("state", 0, "shape", value=[3]),
     r"method 'a': tensors\[\d+\]: view bytes \[0, 16\) lie outside state 0 of 12 bytes"),
    ("state view offset huge", lambda d: _st(d, "state").update(byte_offset=1 << 62),
     r"method 'a': tensors\[\d+\]\.byte_offset: 4611686018427387904 is outside"),
    ("kernel reaches past a state view", lambda d: d["kernels"][0].update(shape=[5]),
     r"method 'a': instructions\[0\] \(kernel\): kernel accum (loads from|stores to) "
     r"argument 1 \(tensor \d+, float32\[4\] of state 0\) at element indices \[0, 4\], "
     r"outside the view's \[0, 4\)"),
    ("kernel in one method names no kernel",
     lambda d: d["methods"]["b"]["instructions"][1].update(name="nope"),
     r"method 'b': instructions\[1\] \(kernel\)\.name: no kernel named 'nope'"),
    # versions
    ("v2 document with v1 inputs", lambda d: d.update(inputs=[]),
     r"document: unknown field\(s\) \['inputs'\]"),
    ("v2 document with v1 tensors and instructions",
     lambda d: d.update(tensors=[], instructions=[]),
     r"document: unknown field\(s\) \['instructions', 'tensors'\]"),
    ("version 3", _set("version", value=3), r"version: unknown format version 3"),
    ("version 2.0", _set("version", value=2.0), r"version: unknown format version 2\.0"),
    ("version a string", _set("version", value="2"), r"version: unknown format version '2'"),
    ("version 1 with a v2 body", _set("version", value=1),
     r"document: missing field\(s\) \['arena', 'inputs', 'instructions', 'outputs', "
     r"'outputs_tensors', 'tensors'\]"),
]


def test_the_v2_document_loads_and_round_trips(tmp_path: Path) -> None:
    doc, arrays = v2_doc()
    p = load(tmp_path, doc, arrays)
    assert p.version == 2 and sorted(p.methods) == ["a", "b"]
    assert [s["name"] for s in p.state] == ["acc", "steps"]
    assert json.loads(json.dumps(p.to_json())) == doc


@pytest.mark.parametrize("name,mutate,match", BAD_V2, ids=[b[0] for b in BAD_V2])
def test_bad_v2_document_is_refused(tmp_path: Path, name: str, mutate: Callable,
                                    match: str) -> None:
    doc, arrays = v2_doc()
    load(tmp_path, doc, arrays)     # the unmodified document loads
    mutate(doc)
    with pytest.raises(ProgramError, match=match) as info:
        load(tmp_path, doc, arrays)
    assert str(info.value).startswith(str(tmp_path / "bad.aotp"))


@pytest.mark.parametrize("key,value", [("state", []), ("methods", {})])
def test_a_v1_document_with_v2_keys_is_refused(tmp_path: Path, key: str, value: Any) -> None:
    doc, arrays = doc_and_arrays()
    assert doc["version"] == 1
    load(tmp_path, doc, arrays)
    doc[key] = value
    with pytest.raises(ProgramError, match=rf"document: unknown field\(s\) \['{key}'\]"):
        load(tmp_path, doc, arrays)


def test_a_v1_document_with_a_state_root_is_refused(tmp_path: Path) -> None:
    # One stateful method written as version 1: its tensors name a state the file lacks.
    p = acc_method(1.0)
    doc = json.loads(json.dumps(p.to_json()))
    assert doc["version"] == 2 and list(doc["methods"]) == ["forward"]
    arrays = dict(p.constants)
    load(tmp_path, doc, arrays)
    v1 = {k: v for k, v in doc.items() if k not in ("state", "methods")}
    v1.update(doc["methods"]["forward"], version=1)
    with pytest.raises(ProgramError, match=r"tensors\[\d+\]\.index: state 0 does not exist "
                                           r"\(0 states\)"):
        load(tmp_path, v1, arrays)


def test_a_hand_built_v1_program_with_state_is_refused() -> None:
    p = acc_method(1.0)
    p.version = 1
    with pytest.raises(ProgramError, match="version: state and several methods need format "
                                           "version 2"):
        p.validate()


def test_a_v1_document_of_version_1_0_is_refused(tmp_path: Path) -> None:
    doc, arrays = doc_and_arrays()
    doc["version"] = 1.0
    with pytest.raises(ProgramError, match=r"version: unknown format version 1\.0"):
        load(tmp_path, doc, arrays)


# -- the budget is the file's, not each method's -------------------------------------------------


def test_instructions_of_all_methods_count_against_one_budget(tmp_path: Path) -> None:
    doc, arrays = v2_doc()
    _many_methods(8)(doc)     # 8 methods of 2 instructions each
    write_raw(tmp_path / "m.aotp", doc, arrays)
    Program.load(tmp_path / "m.aotp", limits=Limits(max_instructions=16))
    # Each method alone is within 15; together they are 16.
    with pytest.raises(ProgramError, match=r"methods\['m7'\]: instructions of the methods so "
                                           r"far: 16 exceeds the load limit "
                                           r"max_instructions=15"):
        Program.load(tmp_path / "m.aotp", limits=Limits(max_instructions=15))
    # ... and one method over it is refused alone
    with pytest.raises(ProgramError, match=r"method 'm0': instructions: 2 exceeds the load "
                                           r"limit max_instructions=1"):
        Program.load(tmp_path / "m.aotp", limits=Limits(max_instructions=1))


def test_store_footprints_of_all_methods_count_against_one_budget(tmp_path: Path) -> None:
    doc, arrays = v2_doc()
    _many_methods(64)(doc)
    write_raw(tmp_path / "m.aotp", doc, arrays)
    # The IR of both kernels is 2 * 7 nodes; each method proves one store into its output.
    Program.load(tmp_path / "m.aotp", limits=Limits(max_ir_nodes=64))
    with pytest.raises(ProgramError, match=r"methods\['m63'\]: kernel store footprints into "
                                           r"outputs of the methods so far: 64 exceeds the "
                                           r"load limit max_ir_nodes=63"):
        Program.load(tmp_path / "m.aotp", limits=Limits(max_ir_nodes=63))


def test_kernels_are_checked_once_however_many_methods_launch_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from aotrt.program import validate

    calls: list[str] = []
    real = validate.reduce_depth

    def counting(k: ir.Kernel, memo: Any) -> int:
        calls.append(k.name)
        return real(k, memo)

    monkeypatch.setattr(validate, "reduce_depth", counting)
    doc, arrays = v2_doc()
    _many_methods(64)(doc)
    calls.clear()
    p = Program.from_json(doc, arrays)
    assert sorted(calls) == ["accum", "scale"]
    calls.clear()
    p.validate()
    assert sorted(calls) == ["accum", "scale"]


def test_a_method_of_a_hand_built_program_is_still_checked_in_full() -> None:
    # The kernels' checks are shared between methods; each method's instructions are not.
    p = v2_program()
    p.methods["b"].instructions[1] = dict(p.methods["b"].instructions[1], args=[1, 4, 0])
    with pytest.raises(ProgramError, match=r"method 'b': instructions\[1\] \(kernel\)\.args"
                                           r"\[2\]: tensor 0 is a view of an input"):
        p.validate()


@pytest.mark.parametrize("op", [["kernel"], {}, None, 3])
def test_an_instruction_op_of_a_wrong_type_is_refused(tmp_path: Path, op: Any) -> None:
    # a list or an object was looked up in a dict of opcodes: TypeError (fuzz mutant 6920)
    doc, arrays = v2_doc()
    doc["methods"]["b"]["instructions"][0]["op"] = op
    with pytest.raises(ProgramError, match=r"method 'b': instructions\[0\]\.op: unknown "
                                           r"opcode"):
        load(tmp_path, doc, arrays)
