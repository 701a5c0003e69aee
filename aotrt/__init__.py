"""aotrt: run exported PyTorch programs on a GPU (or the CPU) from a small Python runtime.

    prog = aotrt.export(model, example_inputs)     # needs torch; returns aotrt.Program
    prog.save("m.aotp")
    with aotrt.load("m.aotp") as m:                # None device: cuda if present, else cpu
        outs = m.run(*inputs)                      # tuple of aotrt.Tensor

Importing aotrt never imports torch: `export` loads the exporter on first call.
"""

from __future__ import annotations

from typing import Any

from aotrt import errors
from aotrt.dtypes import (DType, bfloat16, bool_, float16, float32, int8, int16, int32, int64,
                          uint8)
from aotrt.errors import (AotrtError, CompileError, DeviceError, HazardError, InvalidArgument,
                          OutOfMemory, ProgramError, Unsupported)
from aotrt.limits import Limits
from aotrt.exporter.builder import ProgramBuilder
from aotrt.program import Program
from aotrt.runtime.delegate import Delegate
from aotrt.runtime.module import Module, load
from aotrt.runtime.options import Fp32Math
# registers the library ops' signatures, which Program.validate checks (program/library.py)
from aotrt.runtime import ops as _ops  # noqa: F401
from aotrt.runtime.public import Tensor

__version__ = "0.1.0"


def export(model: Any, example_inputs: Any = None, *args: Any, **kwargs: Any) -> Program:
    """Export a torch.nn.Module (or ExportedProgram) to an aotrt.Program (imports torch)."""
    # The exporter lives in aotrt.exporter, a separate package so that this name stays a
    # plain function; importing it here, on first call, keeps `import aotrt` free of torch.
    from aotrt.exporter import export as _export

    return _export(model, example_inputs, *args, **kwargs)


__all__ = [
    "export", "load", "Program", "ProgramBuilder", "Delegate", "Module", "Tensor", "DType",
    "Limits",
    "Fp32Math", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
    "bool_",
    "errors", "AotrtError", "InvalidArgument", "OutOfMemory", "CompileError", "DeviceError",
    "ProgramError", "HazardError", "Unsupported",
]
