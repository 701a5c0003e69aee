"""aotrt/dtypes.py: the dtype table, lookups by every spelling, DLPack codes, refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from aotrt import dtypes
from aotrt.errors import InvalidArgument
from aotrt.runtime import dlpack

torch = pytest.importorskip("torch")

TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
         "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
         "uint8": torch.uint8, "bool": torch.bool}


def test_the_table_is_consistent() -> None:
    assert [d.name for d in dtypes.ALL] == list(TORCH)
    for field in ("name", "np", "code", "c"):
        values = [getattr(d, field) for d in dtypes.ALL]
        assert len(set(values)) == len(values), field
    for d in dtypes.ALL:
        assert d.np.itemsize == d.itemsize, d
        assert d.dl_bits == 8 * d.itemsize, d
        assert d.is_float == (d.np.kind == "f" or d.name == "bfloat16"), d
        assert torch.empty(0, dtype=TORCH[d.name]).element_size() == d.itemsize, d
        assert repr(d) == f"aotrt.{d.name}"


def test_dtypes_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        dtypes.float32.itemsize = 8  # type: ignore[misc]


@pytest.mark.parametrize("d", dtypes.ALL, ids=lambda d: d.name)
def test_every_spelling_finds_the_dtype(d: dtypes.DType) -> None:
    tdt = TORCH[d.name]
    for spelling in (d, d.name, f"aotrt.{d.name}", str(tdt), tdt, d.np, d.np.type):
        assert dtypes.as_dtype(spelling) is d, spelling
    if d.name != "bfloat16":
        assert dtypes.as_dtype(np.zeros(1, d.np).dtype) is d


def test_aliases() -> None:
    for alias, d in (("float", dtypes.float32), ("half", dtypes.float16),
                     ("long", dtypes.int64), ("int", dtypes.int32), ("bool_", dtypes.bool_)):
        assert dtypes.as_dtype(alias) is d


@pytest.mark.parametrize("bad", ["float64", "complex64", "torch.complex64", "", "Float32",
                                 np.float64, np.complex64, np.dtype("U3"), None, object,
                                 "aotrt.uint16", np.uint16])
def test_unsupported_dtypes_are_refused(bad: object) -> None:
    with pytest.raises(InvalidArgument, match="dtype"):
        dtypes.as_dtype(bad)


@pytest.mark.parametrize("bad", [torch.float64, torch.complex64, torch.uint16, torch.qint8])
def test_unsupported_torch_dtypes_are_refused(bad: object) -> None:
    with pytest.raises(InvalidArgument, match="dtype"):
        dtypes.as_dtype(bad)


@pytest.mark.parametrize("d", dtypes.ALL, ids=lambda d: d.name)
def test_dlpack_codes_match_torchs(d: dtypes.DType) -> None:
    """The (code, bits) torch writes into a capsule for this dtype is ours."""
    t = torch.zeros(3, dtype=TORCH[d.name])
    imported = dlpack.from_dlpack(t)
    assert imported.dtype is d
    assert dtypes.from_dlpack_code(d.dl_code, d.dl_bits) is d


def test_aoti_codes_are_torchs_scalar_types() -> None:
    """`code` is c10's ScalarType, the number the AOTI shims' dtype getters return."""
    import importlib

    table = None
    for where in ("torch.onnx._type_utils",
                  "torch.onnx._internal.torchscript_exporter._type_utils"):
        try:
            table = importlib.import_module(where).JitScalarType
            break
        except (ImportError, AttributeError):
            continue
    if table is None:
        pytest.skip("torch has no JitScalarType table here")
    JitScalarType = table  # noqa: N806 - torch's name
    for d in dtypes.ALL:
        assert JitScalarType.from_dtype(TORCH[d.name]).value == d.code, d


@pytest.mark.parametrize("code,bits,lanes", [(2, 64, 1), (2, 32, 4), (5, 64, 1), (1, 16, 1),
                                             (4, 32, 1), (99, 8, 1)])
def test_unsupported_dlpack_codes_are_refused(code: int, bits: int, lanes: int) -> None:
    with pytest.raises(InvalidArgument, match="DLPack dtype"):
        dtypes.from_dlpack_code(code, bits, lanes)
