"""aotrt: run exported PyTorch programs on a GPU (or the CPU) from a small Python runtime.

    prog = aotrt.export(model, example_inputs)     # needs torch; returns aotrt.Program
    prog.save("m.aotp")
    with aotrt.load("m.aotp") as m:                # None device: cuda if present, else cpu
        outs = m.run(*inputs)                      # tuple of aotrt.Tensor

Importing aotrt never imports torch: `export` loads the exporter on first call.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from aotrt import errors
from aotrt.dtypes import (DType, bfloat16, bool_, float16, float32, int8, int16, int32, int64,
                          uint8)
from aotrt.errors import (AotrtError, CompileError, DeviceError, HazardError, InvalidArgument,
                          OutOfMemory, ProgramError, Unsupported)
from aotrt.limits import Limits
from aotrt.program import Program, ProgramBuilder
from aotrt.runtime.delegate import Delegate, load
from aotrt.runtime.public import Tensor

__version__ = "0.1.0"


def export(model: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Program:
    """Export a torch.nn.Module on example inputs to an aotrt.Program (imports torch)."""
    import importlib

    fn = None
    for name in ("aotrt.export", "aotrt.export.lower"):
        try:
            fn = getattr(importlib.import_module(name), "export", None)
        except ModuleNotFoundError as e:
            if e.name not in ("aotrt.export", "aotrt.export.lower"):
                raise
        if callable(fn):
            break
    if not callable(fn):
        raise Unsupported("aotrt.export: the exporter (aotrt/export) is not available here")
    return fn(model, example_inputs, *args, **kwargs)


class _Package(types.ModuleType):
    """The aotrt module: `aotrt.export` stays the function above even after the
    `aotrt.export` subpackage is imported (the import system would rebind the name)."""

    @property
    def export(self) -> Any:
        return export

    @export.setter
    def export(self, value: Any) -> None:
        # The subpackage itself is reachable as sys.modules["aotrt.export"].
        pass


sys.modules[__name__].__class__ = _Package

__all__ = [
    "export", "load", "Program", "ProgramBuilder", "Delegate", "Tensor", "DType", "Limits",
    "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool_",
    "errors", "AotrtError", "InvalidArgument", "OutOfMemory", "CompileError", "DeviceError",
    "ProgramError", "HazardError", "Unsupported",
]
