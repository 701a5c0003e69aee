"""Helpers for the lowering tests (tests/exporter/test_lower.py and tests/exporter/rules/):
export a module on seeded inputs, export-and-compare, and read a program's instructions."""

from __future__ import annotations

import inspect

import torch
import torch.nn as nn

import aotrt
from tests.exporter import modules as M
from tests.exporter.harness import check_module, randn


def export_seeded(model: nn.Module, *shapes: tuple[int, ...]) -> aotrt.Program:
    """Export `model` (eval) on float32 normal inputs of `shapes` from a fixed seed."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        return aotrt.export(model.eval(), tuple(randn(gen, torch.float32, *s) for s in shapes))


def check_shapes(model: nn.Module, *shapes: tuple[int, ...], dtype: torch.dtype = torch.float32,
                 layout: str = "auto") -> aotrt.Program:
    """Export `model`, run it and compare with eager (check_module); return the program."""
    return check_module(model, M.inputs(*shapes), dtype, layout=layout).program


def library_instrs(prog: aotrt.Program, fn: str) -> list[dict]:
    """The program's library instructions of op `fn`, in order."""
    return [i for i in prog.instructions if i["op"] == "library" and i["fn"] == fn]


def line_of(fn: object, text: str) -> int:
    """The source line number of the first line of `fn` containing `text`."""
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)
