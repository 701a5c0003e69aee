"""aotrt/kernels/ir.py: constants are equal only bit for bit, constants the proof cannot model
are refused, hashing is linear on shared IR, and malformed JSON never escapes as a raw
exception."""

from __future__ import annotations

import math
import struct

import pytest

from aotrt.errors import InvalidArgument, ProgramError
from aotrt.kernels import ir
from tests.support import bounded_steps

I64 = "int64"


def _nan(payload: int, sign: int = 0) -> float:
    return struct.unpack("<d", struct.pack("<Q", (sign << 63) | (0x7FF << 52) | payload))[0]


@pytest.mark.parametrize("a,b", [
    (ir.Const(0.0, "float32"), ir.Const(-0.0, "float32")),
    (ir.Const(_nan(1), "float32"), ir.Const(_nan(2), "float32")),
    (ir.Const(_nan(1), "float32"), ir.Const(_nan(1, 1), "float32")),
    (ir.Const(1, "float32"), ir.Const(1.0, "float32")),          # int vs float literal
    (ir.Const(1, I64), ir.Const(True, I64)),                      # int vs bool value
    (ir.Const(1.0, "float32"), ir.Const(1.0, "float16")),
])
def test_constants_differ_bit_for_bit(a, b) -> None:
    assert a != b and not a == b
    assert len({a, b}) == 2
    # ...and so do the expressions built on them
    x = ir.Idx(0)
    assert ir.Op("mul", (x, a), a.dtype) != ir.Op("mul", (x, b), b.dtype)


def test_equal_constants_are_equal() -> None:
    n = _nan(5)
    assert ir.Const(n, "float32") == ir.Const(n, "float32")     # NaN payloads too
    assert ir.Const(-0.0, "float32") == ir.Const(-0.0, "float32")
    assert hash(ir.Const(7, I64)) == hash(ir.Const(7, I64))


def k_with(c: ir.Const) -> ir.Kernel:
    return ir.Kernel("k", (2,), (), (ir.Arg(c.dtype, "w"),), (ir.Store(0, ir.Idx(0), c),))


@pytest.mark.parametrize("dtype", ir.INT_DTYPES + ("bool",))
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1.5, 2.0, -0.0])
def test_float_values_in_int_or_bool_constants_are_refused(dtype, value) -> None:
    with pytest.raises(InvalidArgument, match="constant"):
        k_with(ir.Const(value, dtype))


@pytest.mark.parametrize("dtype", ir.INT_DTYPES + ir.FLOAT_DTYPES)
def test_a_bool_value_in_a_non_bool_constant_is_refused(dtype) -> None:
    with pytest.raises(InvalidArgument, match="bool value"):
        k_with(ir.Const(True, dtype))


@pytest.mark.parametrize("value", [0, 1, 2, -1])
def test_a_bool_constant_must_be_a_bool(value) -> None:
    with pytest.raises(InvalidArgument, match="true or false"):
        k_with(ir.Const(value, "bool"))


@pytest.mark.parametrize("dtype", ir.INT_DTYPES)
def test_int_constants_outside_their_dtype_are_refused(dtype) -> None:
    lo, hi = ir.INT_RANGE[dtype]
    k_with(ir.Const(lo, dtype))
    k_with(ir.Const(hi, dtype))
    for bad in (lo - 1, hi + 1):
        with pytest.raises(InvalidArgument, match=f"overflows {dtype}"):
            k_with(ir.Const(bad, dtype))


def test_valid_constants_are_accepted() -> None:
    for c in (ir.Const(math.nan, "float32"), ir.Const(-math.inf, "bfloat16"),
              ir.Const(3, "float16"), ir.Const(False, "bool"), ir.Const(-5, I64)):
        k_with(c)


def test_from_json_refuses_nan_constants_of_int_dtype_as_program_errors() -> None:
    k = k_with(ir.Const(1, I64))
    doc = ir.to_json(k)
    doc["stores"][0]["value"]["value"] = {"t": "float", "v": "nan"}
    with pytest.raises(ProgramError, match="constant"):
        ir.from_json(doc)


@pytest.mark.parametrize("special", [{"t": "float", "v": "banana"}, {"t": "float"},
                                     {"t": "float", "v": None}, {"t": "float", "v": [1]},
                                     {"t": "float", "v": "nan", "x": 1}])
def test_from_json_refuses_bad_special_floats(special) -> None:
    doc = ir.to_json(k_with(ir.Const(1.0, "float32")))
    doc["stores"][0]["value"]["value"] = special
    with pytest.raises(ProgramError, match="special float"):
        ir.from_json(doc)


def test_hashing_and_validating_shared_ir_is_linear() -> None:
    # x = x + x, 400 times: 2**400 paths. Hashing once per node keeps it linear: a bounded
    # number of lines per node (a hash that recursed would run 2**400).
    with bounded_steps(500 * 400):
        e: ir.Expr = ir.Idx(0)
        for _ in range(400):
            e = ir.Op("add", (e, e), I64)
        k = ir.Kernel("k", (2,), (), (ir.Arg(I64, "w"),), (ir.Store(0, ir.Idx(0), e),))
        hash(k)
        assert {k: 1}[k] == 1
        ir.validate(k)
