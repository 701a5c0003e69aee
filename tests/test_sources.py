"""The C and CUDA sources live in files beside their Python (issue 36, item 5): every such
file under aotrt/ is read by a module through `aotrt.sources.source`, every file a module
names exists, and no Python file holds a C or CUDA source as a long string any more."""

from __future__ import annotations

import ast
import pathlib

import pytest

import aotrt
from aotrt.sources import SUFFIXES, source

PACKAGE = pathlib.Path(aotrt.__file__).parent
#: a fixed string of C or CUDA in Python may be at most this many lines; a fixed source
#: belongs in a file
MAX_INLINE_LINES = 5
#: ... and an f-string, at most this many: the renderers' per-kernel wrappers (about 15 lines)
#: are generated from the kernel, so they stay in Python
MAX_FSTRING_LINES = 20
C_MARKERS = ("__global__", "__device__", "#include", "#define", 'extern "C"', "static inline",
             "typedef ", "int64_t ")


def _modules() -> list[tuple[pathlib.Path, ast.Module]]:
    """Every Python module of the package, parsed."""
    return [(p, ast.parse(p.read_text(encoding="utf-8"))) for p in sorted(PACKAGE.rglob("*.py"))]


def _reads() -> set[pathlib.Path]:
    """The source files that modules read: `source(__package__, "<name>")` calls."""
    out = set()
    for path, tree in _modules():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "source" and len(node.args) == 2
                    and isinstance(node.args[0], ast.Name) and node.args[0].id == "__package__"
                    and isinstance(node.args[1], ast.Constant)):
                out.add(path.parent / node.args[1].value)
    return out


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring nodes of a module, its classes and functions."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def test_every_source_file_is_read_and_exists() -> None:
    """No orphan .c/.h/.cu/.cuh under aotrt/, and no module names a missing one."""
    on_disk = {p for p in PACKAGE.rglob("*") if p.suffix in SUFFIXES}
    read = _reads()
    assert on_disk, "no C or CUDA source files found beside the modules"
    assert sorted(map(str, on_disk - read)) == [], "source files no module reads"
    assert sorted(map(str, read - on_disk)) == [], "source files read but missing"


def test_no_long_c_strings_in_python() -> None:
    """No Python string (docstrings aside) of more than a few lines holds C or CUDA."""
    found = []
    for path, tree in _modules():
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                skip.update(id(v) for v in node.values)
                text = "".join(v.value for v in node.values
                               if isinstance(v, ast.Constant) and isinstance(v.value, str))
                most = MAX_FSTRING_LINES
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text, most = node.value, MAX_INLINE_LINES
            else:
                continue
            lines = text.count("\n") + 1
            if id(node) not in skip and lines > most and any(m in text for m in C_MARKERS):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} ({lines} lines)")
    assert not found, f"C or CUDA source in a Python string; move it beside it: {found}"


def test_source_reads_the_file_as_is() -> None:
    """`source` gives the file's exact text, and takes only source names in its package."""
    path = PACKAGE / "kernels" / "math_c.h"
    assert source("aotrt.kernels", "math_c.h") == path.read_text(encoding="utf-8")
    with pytest.raises(ValueError):
        source("aotrt.kernels", "render_c.py")
    with pytest.raises(ValueError):
        source("aotrt", "kernels/math_c.h")
    with pytest.raises(ValueError):
        source(None, "math_c.h")
