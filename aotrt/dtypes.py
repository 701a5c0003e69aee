"""The dtype table: names, sizes, numpy and C types, and DLPack codes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from aotrt.errors import InvalidArgument


@dataclass(frozen=True)
class DType:
    """One element type that aotrt can store and compute with."""

    name: str
    itemsize: int
    np: Any
    c: str
    dl_code: int
    dl_bits: int
    is_float: bool
    code: int

    def __repr__(self) -> str:
        return f"aotrt.{self.name}"


_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT, _DL_BOOL = 0, 1, 2, 4, 6

float32 = DType("float32", 4, np.dtype(np.float32), "float", _DL_FLOAT, 32, True, 6)
float16 = DType("float16", 2, np.dtype(np.float16), "half", _DL_FLOAT, 16, True, 5)
bfloat16 = DType("bfloat16", 2, np.dtype(ml_dtypes.bfloat16), "bf16", _DL_BFLOAT, 16, True, 15)
int64 = DType("int64", 8, np.dtype(np.int64), "int64_t", _DL_INT, 64, False, 4)
int32 = DType("int32", 4, np.dtype(np.int32), "int32_t", _DL_INT, 32, False, 3)
int16 = DType("int16", 2, np.dtype(np.int16), "int16_t", _DL_INT, 16, False, 2)
int8 = DType("int8", 1, np.dtype(np.int8), "int8_t", _DL_INT, 8, False, 1)
uint8 = DType("uint8", 1, np.dtype(np.uint8), "uint8_t", _DL_UINT, 8, False, 0)
bool_ = DType("bool", 1, np.dtype(np.bool_), "bool", _DL_BOOL, 8, False, 11)

ALL: tuple[DType, ...] = (float32, float16, bfloat16, int64, int32, int16, int8, uint8, bool_)
_BY_NAME = {d.name: d for d in ALL}
_BY_NAME.update({"bool_": bool_, "float": float32, "half": float16, "long": int64, "int": int32})
_BY_NP = {d.np: d for d in ALL}
_BY_DL = {(d.dl_code, d.dl_bits): d for d in ALL}


def as_dtype(value: Any) -> DType:
    """Return the DType for a DType, a name ('float32'), a numpy dtype or a torch dtype."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        key = value.removeprefix("torch.").removeprefix("aotrt.")
        if key in _BY_NAME:
            return _BY_NAME[key]
        raise InvalidArgument(f"dtype: unsupported dtype name {value!r}")
    text = str(value)
    if text.startswith("torch."):
        return as_dtype(text)
    try:
        npd = np.dtype(value)
    except TypeError:
        raise InvalidArgument(f"dtype: unsupported dtype {value!r}") from None
    if npd in _BY_NP:
        return _BY_NP[npd]
    raise InvalidArgument(f"dtype: unsupported dtype {value!r}")


def from_dlpack_code(code: int, bits: int, lanes: int = 1) -> DType:
    """Return the DType for a DLPack (code, bits, lanes) triple."""
    if lanes != 1 or (code, bits) not in _BY_DL:
        raise InvalidArgument(f"dtype: unsupported DLPack dtype code={code} bits={bits}")
    return _BY_DL[(code, bits)]
