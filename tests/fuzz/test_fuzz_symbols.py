"""Mutants of a dynamic program's symbols and symbolic table (issue 35 item 7): each one is
refused with a ProgramError at load, or loads and then runs at its bounds (and a size
between) or is refused there with an aotrt error; never a raw exception."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import numpy as np

import aotrt
from aotrt.errors import AotrtError, ProgramError
from aotrt.program import Program
from tests.program.test_symbols import dynamic_program

EDGES = [0, 1, -1, 2, 7, 8, 9, 2**31 - 1, 2**31, -(2**31), 2**62, 2**63, 1.5, None, "S", True]


def _mutate(m: dict, rng: random.Random) -> None:
    kind = rng.randrange(7)
    syms, table = m["symbols"], m["symbolic"]
    if kind == 0 and syms:
        s = rng.choice(syms)
        s[rng.choice(["name", "min", "max"])] = rng.choice(EDGES + ["T", "", "a b"])
    elif kind == 1 and table:
        e = rng.choice(table)
        t = rng.choice(e["expr"])
        t[rng.randrange(len(t))] = rng.choice(EDGES + ["T"])
    elif kind == 2 and table:
        e = rng.choice(table)
        p = e["at"]
        p[rng.randrange(len(p))] = rng.choice(EDGES + ["sizes", "strides", "byte_offset",
                                                       "shape", "kernels", "affine"])
    elif kind == 3 and table:
        e = rng.choice(table)
        e["expr"].append([rng.choice(EDGES), *rng.sample(["S", "S", "T"], rng.randrange(3))])
    elif kind == 4:
        if table:
            table.pop(rng.randrange(len(table)))
    elif kind == 5 and table:
        table.append(copy.deepcopy(rng.choice(table)))
        table[-1]["at"][-1] = rng.choice([0, 1, 2, "byte_offset"])
    else:
        syms.append({"name": rng.choice(["S", "T", "U"]), "min": rng.choice(EDGES),
                     "max": rng.choice(EDGES)})


def test_symbolic_mutants_are_refused_or_run() -> None:
    base = dynamic_program()
    doc0 = json.loads(json.dumps(base.to_json()))
    arrays = dict(base.constants)
    rng = random.Random(35)
    counts = {"refused": 0, "ran": 0, "refused_at_run": 0}
    for _ in range(400):
        doc = copy.deepcopy(doc0)
        for _ in range(rng.randrange(1, 3)):
            _mutate(doc["methods"]["forward"], rng)
        try:
            prog = Program.from_json(json.loads(json.dumps(doc)), arrays)
        except ProgramError:
            counts["refused"] += 1
            continue
        m = prog.method("forward")
        lo, hi = m.symbols[0]["min"], m.symbols[0]["max"]
        try:
            with aotrt.load(prog, device="cpu") as mod:
                for s in sorted({lo, hi, (lo + hi) // 2}):
                    shape: Any = [s if d == 0 else 4 for d in range(2)]
                    mod.run(np.ones(shape, np.float32))
            counts["ran"] += 1
        except AotrtError:
            counts["refused_at_run"] += 1
    assert counts["refused"] > 200 and counts["ran"] > 0, counts
