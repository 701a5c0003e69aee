"""C and CUDA sources shipped beside their Python modules, read as package resources.

The runtime's hand-written C (the cpu device's loops and ops) and CUDA C (the cuda
library ops' kernels) live in `.c`, `.h`, `.cu` and `.cuh` files next to the module that
compiles them, so that a compiler, an editor or a linter sees them as code. A module reads
its file with `source(__package__, name)`; parts that depend on parameters are filled in
there, by the same `%`, `.replace` or concatenation as before the move, so the compiled
text (and the kernel caches keyed by its hash) stays byte for byte the same.
"""

from __future__ import annotations

import functools
import importlib.resources

#: the suffixes of the source files the package ships (pyproject.toml's package data)
SUFFIXES = (".c", ".h", ".cu", ".cuh")


@functools.cache
def source(package: str | None, name: str) -> str:
    """The text of source file `name` in `package` (a module passes its `__package__`)."""
    if not package:
        raise ValueError(f"source {name!r}: no package to read it from")
    if not name.endswith(SUFFIXES) or "/" in name:
        raise ValueError(f"source {name!r}: not a C or CUDA file name beside its module")
    return importlib.resources.files(package).joinpath(name).read_text(encoding="utf-8")


__all__ = ["SUFFIXES", "source"]
