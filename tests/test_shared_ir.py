"""Shared kernel IR costs linear work (issue 34, item 2): one big expression used by many
instructions, or by many stores, is looked at once per distinct node by validation, the
analyses, the bounds proof, the budget and the renderers. Counted, never timed: every
expansion of a node's children goes through `ir.children`, and the validator counts its
per-instruction bound checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
import safetensors.numpy

from aotrt.kernels import ir
from aotrt.kernels.render_c import CRenderer
from aotrt.kernels.render_cuda import CudaRenderer
from aotrt.limits import DEFAULT
from aotrt.program import METADATA_KEY, Program, validate


def hostile_doc(loads: int, uses: int) -> dict[str, Any]:
    """A kernel summing `loads` distinct loads (a balanced tree: about 3 * loads nodes),
    run by `uses` instructions, each on its own arena view."""
    level: list[ir.Expr] = [ir.Load(0, ir.Idx(0), "float32") for _ in range(loads)]
    while len(level) > 1:
        pairs = [ir.Op("add", (a, b), "float32") for a, b in zip(level[0::2], level[1::2])]
        level = pairs + level[2 * len(pairs):]
    k = ir.Kernel("k", (4,), (), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                  (ir.Store(1, ir.Idx(0), level[0]),))
    out = {"root": "output", "index": 0, "byte_offset": 0, "dtype": "float32",
           "sizes": [4], "strides": [1]}
    views = [{"root": "arena", "index": 0, "byte_offset": 4 * (i % 1024), "dtype": "float32",
              "sizes": [4], "strides": [1]} for i in range(uses)]
    return {"format": "aotrt.program", "version": 1, "provenance": {}, "inputs": [],
            "outputs": [{"name": "out", "dtype": "float32", "shape": [4], "strides": [1]}],
            "constants": [], "arena": {"nbytes": 4 * 1024 + 16}, "tensors": [out, *views],
            "kernels": [ir.to_json(k)],
            "instructions": [{"op": "kernel", "name": "k", "args": [1 + i, 0]}
                             for i in range(uses)],
            "outputs_tensors": [0]}


def write_file(path: Path, loads: int, uses: int) -> Path:
    """The hostile file itself, as an attacker would hand it over."""
    text = json.dumps(hostile_doc(loads, uses), separators=(",", ":"))
    safetensors.numpy.save_file({}, str(path), metadata={METADATA_KEY: text})
    return path


class Counted:
    """Counts the validator's node expansions and per-instruction checks."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.expansions = 0
        self.checks = 0
        real = ir.children

        def children(e: Any) -> tuple[Any, ...]:
            self.expansions += 1
            return real(e)

        monkeypatch.setattr(ir, "children", children)
        init = validate.Validator.run

        def run(v: validate.Validator) -> None:
            try:
                init(v)
            finally:
                self.checks += v.checks

        monkeypatch.setattr(validate.Validator, "run", run)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counted]:
    yield Counted(monkeypatch)


def _load_counts(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    c = Counted(monkeypatch)
    Program.load(path)
    return c.expansions, c.checks


# The counts are exact at any size: the CI slice shows the same linearity on a tenth of the
# issue's file (its 10x twin, 200,000 instructions, takes about 25 s on 2 cores).
@pytest.mark.parametrize("loads,uses", [(267, 2000),
                                        pytest.param(2667, 20_000, marks=pytest.mark.slow)])
def test_the_issues_file_and_one_ten_times_bigger_load_in_linear_steps(
        loads: int, uses: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The issue's file: an 8,000-node expression (2667 loads) run by 20,000 instructions;
    # before, each instruction re-checked every one of the 2667 loads (53 million checks).
    small = _load_counts(write_file(tmp_path / "a.aotp", loads, uses), monkeypatch)
    big = _load_counts(write_file(tmp_path / "b.aotp", 10 * loads, 10 * uses), monkeypatch)
    nodes = 3 * loads + 1
    # Parsing the JSON tree expands each node a few times (from_json builds, ir.validate,
    # the type check, cost, depth, bounds, affine forms): a small constant per node ...
    assert small[0] <= 12 * nodes
    # ... and each instruction checks its 2 arguments' ranges, not the kernel's loads.
    assert small[1] == 2 * uses
    assert big[1] == 2 * 10 * uses
    # Ten times the file, ten times the steps (up to rounding of the tree), not 100 times.
    assert big[0] <= 11 * small[0]


def test_hand_built_ir_shared_by_many_stores_is_looked_at_once(counted: Counted) -> None:
    # One 6,000-node expression (every node distinct, each op over two distinct operands)
    # stored by 2,000 stores into one output: each store used to walk all of it again.
    e: ir.Expr = ir.Load(0, ir.Idx(0), "float32")
    for i in range(3000):
        e = ir.Op("add", (e, ir.Const(float(i), "float32")), "float32")
    n = 2000
    stores = tuple(ir.Store(1, ir.Const(j, "int64"), e) for j in range(n))
    k = ir.Kernel("k", (1,), (2,), (ir.Arg("float32", "r"), ir.Arg("float32", "w")), stores)
    p = Program(inputs=[{"name": "x", "dtype": "float32", "shape": [1], "strides": [1]}],
                outputs=[{"name": "out", "dtype": "float32", "shape": [n], "strides": [1]}],
                tensors=[{"root": "input", "index": 0, "byte_offset": 0, "dtype": "float32",
                          "sizes": [1], "strides": [1]},
                         {"root": "output", "index": 0, "byte_offset": 0, "dtype": "float32",
                          "sizes": [n], "strides": [1]}],
                kernels=[k], instructions=[{"op": "kernel", "name": "k", "args": [0, 1]}],
                outputs_tensors=[1])
    nodes = 6001 + 3 * n
    counted.expansions = 0
    p.validate()
    assert counted.expansions <= 12 * nodes
    for renderer, out in ((CRenderer(), "A1)["), (CudaRenderer(), "p1)[")):
        counted.expansions = 0
        src = renderer.render([k])
        assert counted.expansions <= 6 * nodes
        assert src.count(out) == n        # every store rendered (they reuse one value)


def test_validator_counts_each_instruction_check_once_per_argument() -> None:
    # A check of a kernel use costs its arguments, whatever the kernel's size.
    doc = hostile_doc(50, 7)
    p = Program.from_json(doc, {})
    v = validate.Validator(p, DEFAULT)
    v.run()
    assert v.checks == 2 * 7
    assert v.memo.visits > 0
