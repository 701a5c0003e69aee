"""Dynamic sizes in a program file (aotrt/program/symbols.py) from a hostile file: every
malformed symbol, bound, path or expression is refused with a ProgramError naming it, and
a table that would let a kernel reach outside its memory at some size in range is refused
at load (the method is validated at both ends of its range)."""

from __future__ import annotations

import copy
import json
from typing import Any, Callable

import numpy as np
import pytest

import aotrt
from aotrt.errors import InvalidArgument, ProgramError
from aotrt.exporter.builder import ProgramBuilder
from aotrt.kernels import ir
from aotrt.kernels.ir import Arg, Const, Idx, Load, Op, Store
from aotrt.program import Program
from aotrt.program.symbols import evaluate, expr_text, instantiate

F32, HI = "float32", 8


def dynamic_program() -> Program:
    """o[S, 4] = x[S, 4] * 2 + w[4], S in [1, 8]; stored at S = 8."""
    b = ProgramBuilder("dyn")
    x = b.input("x", F32, [HI, 4])
    w = b.constant("w", np.arange(4, dtype=np.float32))
    o = b.output("o", F32, [HI, 4])
    val = Op("add", (Op("mul", (Load(0, Op("add", (Op("mul", (Idx(0), Const(4, "int64")),
                                                           "int64"), Idx(1)), "int64"), F32),
                                Const(2.0, F32)), F32), Load(1, Idx(1), F32)), F32)
    index = Op("add", (Op("mul", (Idx(0), Const(4, "int64")), "int64"), Idx(1)), "int64")
    k = ir.Kernel("affine", (HI, 4), (), (Arg(F32, "r"), Arg(F32, "r"), Arg(F32, "w")),
                  (Store(2, index, val),))
    b.kernel(k, [x, w, o])
    prog = b.build()
    prog.version = 2
    prog.symbols = [{"name": "S", "min": 1, "max": HI}]
    s = [[1, "S"]]
    prog.symbolic = [{"at": ["inputs", 0, "shape", 0], "expr": s},
                     {"at": ["outputs", 0, "shape", 0], "expr": s},
                     {"at": ["tensors", x, "sizes", 0], "expr": s},
                     {"at": ["tensors", o, "sizes", 0], "expr": s},
                     {"at": ["kernels", "affine", "shape", 0], "expr": s}]
    prog.validate()
    return prog


def _doc() -> tuple[dict, dict[str, np.ndarray]]:
    p = dynamic_program()
    return json.loads(json.dumps(p.to_json())), dict(p.constants)


def _refused(edit: Callable[[dict], Any], match: str) -> None:
    doc, arrays = _doc()
    m = doc["methods"]["forward"]
    edit(m)
    with pytest.raises(ProgramError, match=match):
        Program.from_json(doc, arrays)


def test_the_file_round_trips_and_instantiates() -> None:
    doc, arrays = _doc()
    assert doc["version"] == 2 and doc["methods"]["forward"]["symbols"][0]["max"] == HI
    prog = Program.from_json(copy.deepcopy(doc), arrays).method("forward")
    at3 = instantiate(prog, {"S": 3})
    assert at3.inputs[0]["shape"] == [3, 4] and at3.kernels[0].shape == (3, 4)
    assert at3.arena_nbytes == prog.arena_nbytes and not at3.symbols
    at3.validate()
    assert evaluate([[2, "S", "S"], [3, "S"], [-1]], {"S": 4}) == 43
    assert expr_text([[2, "S", "T"], [1, "S"], [0, "T"], [-4]]) == "2*S*T + S - 4"


@pytest.mark.parametrize("s", [1, 2, 5, HI])
def test_it_runs_at_every_size_in_range(s: int) -> None:
    x = np.random.default_rng(s).standard_normal((s, 4)).astype(np.float32)
    with aotrt.load(dynamic_program(), device="cpu") as mod:
        y, = mod.run(x)
        np.testing.assert_array_equal(np.asarray(y), x * 2 + np.arange(4, dtype=np.float32))
        with pytest.raises(InvalidArgument, match=r"input 'x' dim 0 is S = 9, outside its "
                                                  r"bounds \[1, 8\]"):
            mod.run(np.zeros((HI + 1, 4), np.float32))


BAD: list[tuple[str, Callable[[dict], Any], str]] = [
    ("bad name", lambda m: m["symbols"][0].update(name="1S"), r"symbols\[0\]\.name"),
    ("duplicate", lambda m: m["symbols"].append(dict(m["symbols"][0])), "duplicate symbol"),
    ("min > max", lambda m: m["symbols"][0].update(min=9), r"min 9 > max 8"),
    ("max overflows", lambda m: m["symbols"][0].update(max=1 << 40), r"symbols\[0\]\.max"),
    ("negative min", lambda m: m["symbols"][0].update(min=-1), r"symbols\[0\]\.min"),
    ("a float bound", lambda m: m["symbols"][0].update(max=8.0), r"symbols\[0\]\.max"),
    ("unknown field", lambda m: m["symbols"][0].update(step=2), "unknown field"),
    ("unknown symbol", lambda m: m["symbolic"][0].update(expr=[[1, "T"]]), "unknown symbol"),
    ("shrinking", lambda m: m["symbolic"][2].update(expr=[[-1, "S"], [16]]),
     r"symbolic\[2\]\.expr\[0\]\[0\]"),
    ("three symbols a term", lambda m: m["symbolic"][2].update(expr=[[1, "S", "S", "S"]]),
     r"symbolic\[2\]\.expr\[0\]"),
    ("no terms", lambda m: m["symbolic"][2].update(expr=[]), "at least one term"),
    ("wrong at the max", lambda m: m["symbolic"][2].update(expr=[[2, "S"]]),
     "gives 16 at the upper bounds, but the field holds 8"),
    ("a path to the arena", lambda m: m["symbolic"][2].update(at=["arena", "nbytes", 0]),
     r"symbolic\[2\]\.at"),
    ("a tensor's root", lambda m: m["symbolic"][2].update(at=["tensors", 0, "index"]),
     "only sizes"),
    ("an instruction's args", lambda m: m["symbolic"][2].update(
        at=["instructions", 0, "args", 0]), "only params"),
    ("a path to nothing", lambda m: m["symbolic"][2].update(at=["tensors", 99, "sizes", 0]),
     "names nothing"),
    ("a path to a string", lambda m: m["symbolic"][2].update(
        at=["kernels", "affine", "name", 0]), "names nothing"),
    ("listed twice", lambda m: m["symbolic"].append(copy.deepcopy(m["symbolic"][2])),
     "listed twice"),
    ("no input binds it", lambda m: m["symbolic"].pop(0), "no input's dim"),
    ("symbols without a table", lambda m: m.update(symbols=[]), "declares its symbols"),
    # The kernel keeps its 8 rows while the input shrinks with S: at S = 1 it would read
    # 32 elements of a 4-element input. The lower bound's validation refuses it.
    ("a kernel reaching outside at the min", lambda m: m["symbolic"].pop(4),
     r"at the lower bounds \{'S': 1\}.*outside"),
    # A negative size at the lower bound.
    ("a negative size at the min", lambda m: m["symbolic"][2].update(expr=[[1, "S"]]) or
     m["symbolic"][3].update(expr=[[2, "S"], [-8]]), r"at the lower bounds"),
    # A kernel's iteration size negative at the lower bound: its IR cannot be rebuilt there
    # (refused once without the sizes or the kernel's field; the fuzzer's exported seeds)
    ("a kernel size negative at the min", lambda m: m["symbolic"][4].update(
        expr=[[3, "S"], [-16]]), r"^method 'forward': at the lower bounds \{'S': 1\}: "
     r"kernels\['affine'\]: bad IR node Kernel: kernel affine: bad iteration size -13"),
]


@pytest.mark.parametrize("name,edit,match", BAD, ids=[b[0] for b in BAD])
def test_a_bad_symbolic_table_is_refused(name: str, edit: Callable[[dict], Any],
                                         match: str) -> None:
    _refused(edit, match)


def test_a_version_1_file_cannot_have_symbols() -> None:
    p = dynamic_program().method("forward")
    p.version = 1
    with pytest.raises(ProgramError, match="dynamic sizes .symbols. need format version 2"):
        p.validate()
