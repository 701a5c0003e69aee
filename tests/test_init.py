"""aotrt/__init__.py: the public API, and that importing the runtime never imports torch."""

from __future__ import annotations

import subprocess
import sys
import types

import aotrt


def test_public_names() -> None:
    for name in ("export", "load", "Program", "Delegate", "Tensor", "float32", "float16",
                 "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool_",
                 "InvalidArgument", "ProgramError", "HazardError", "Unsupported", "errors"):
        assert hasattr(aotrt, name), name
    assert aotrt.float32.name == "float32" and aotrt.bfloat16.itemsize == 2
    assert aotrt.errors.ProgramError is aotrt.ProgramError


def test_runtime_imports_leave_torch_out() -> None:
    code = (
        "import sys\n"
        "import aotrt, aotrt.program, aotrt.program_check, aotrt.cli, aotrt.exporter.plan\n"
        "import aotrt.exporter.builder\n"
        "import aotrt.runtime.delegate, aotrt.runtime.public, aotrt.runtime.dlpack\n"
        "import aotrt.runtime.shims, aotrt.runtime.ops\n"
        "import aotrt.runtime.devices.cpu\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_export_stays_the_function_after_the_exporter_import() -> None:
    import importlib

    importlib.import_module("aotrt.exporter")
    assert callable(aotrt.export)
    assert aotrt.export.__module__ == "aotrt"
    assert type(aotrt) is types.ModuleType
