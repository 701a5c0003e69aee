"""The program model: the `.aotp` file's format, its validation, its dynamic-size symbols,
the stride arithmetic of its views and the library ops' signatures it is checked against
(docs/PROGRAM.md). No torch, and no import of the runtime or the exporter: both build on it.

- format.py    Program: the document and the constants; write, read (safetensors)
- validate.py  the field checkers and the one-pass Validator behind Program.validate
- symbols.py   bounded dynamic sizes: symbols, symbolic fields, a method at given sizes
- strides.py   numel, row-major strides, extents, packing
- library.py   the library ops' signatures, registered by aotrt.runtime.ops
- quantized.py the quantized layers (linear_wq, packed tables) and their bytes, for inspect
"""

from __future__ import annotations

from aotrt.program.format import (DEFAULT_METHOD, FORMAT, MAX_METHODS, METADATA_KEY, VERSION,
                                  VERSIONS, Program, check_method_name, check_state,
                                  read_safetensors)

__all__ = ["DEFAULT_METHOD", "FORMAT", "MAX_METHODS", "METADATA_KEY", "VERSION", "VERSIONS",
           "Program", "check_method_name", "check_state", "read_safetensors"]
