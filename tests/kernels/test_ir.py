"""aotrt/kernels/ir.py: constants are equal only bit for bit, constants the proof cannot model
are refused, hashing is linear on shared IR, and malformed JSON never escapes as a raw
exception."""

from __future__ import annotations

import copy
import math
import struct
from typing import Any

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


# -- every malformed field is named (issue 34 item 5) -----------------------------------------

#: per field kind of ir.FIELDS, JSON values of a wrong type for it
_WRONG = {
    "int": ["x", 1.5, None, True, [1], {"t": "float", "v": "inf"}],
    "str": [5, None, [], ["r"], 1.5, True],
    "scalar": ["x", None, [], [1.0]],
    "expr": [5, "x", None, [], [{"t": "Idx", "dim": 0, "dtype": I64}],
             {"t": "float", "v": "nan"}, {"t": "Arg", "dtype": "float32", "mode": "r"}],
    "ints": ["x", 5, None, ["x"], [1.5], [True], [None]],
    "exprs": [5, "x", None, [5], ["x"], [{"t": "Arg", "dtype": "float32", "mode": "r"}]],
    "args": [5, None, [5], [{"t": "Idx", "dim": 0, "dtype": I64}]],
    "stores": [5, None, ["x"], [{"t": "Const", "value": 1.0, "dtype": "float32"}]],
}


#: each IR class's fields and their kinds (ir.FIELDS, spelled out so that this file collects
#: against a runtime without it)
_FIELDS = {
    "Const": {"value": "scalar", "dtype": "str"}, "Idx": {"dim": "int", "dtype": "str"},
    "Load": {"arg": "int", "index": "expr", "dtype": "str"},
    "Op": {"op": "str", "args": "exprs", "dtype": "str"},
    "Reduce": {"op": "str", "body": "expr", "dtype": "str"},
    "Store": {"arg": "int", "index": "expr", "value": "expr"},
    "Arg": {"dtype": "str", "mode": "str"},
    "Kernel": {"name": "str", "shape": "ints", "rshape": "ints", "args": "args",
               "stores": "stores"},
}


def _every_node_kernel() -> ir.Kernel:
    """A kernel with a node of every IR type."""
    red = ir.Reduce("sum", ir.Load(0, ir.Idx(1), "float32"), "float32")
    val = ir.Op("add", (red, ir.Const(1.0, "float32")), "float32")
    return ir.Kernel("k", (2,), (3,), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                     (ir.Store(1, ir.Idx(0), val),))


def _node_paths(doc: Any, path: tuple = ()) -> list[tuple]:
    out = []
    if isinstance(doc, dict):
        if doc.get("t") in _FIELDS:
            out.append(path)
        for k, v in doc.items():
            out.extend(_node_paths(v, path + (k,)))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.extend(_node_paths(v, path + (i,)))
    return out


def _wrong_field_cases() -> list[tuple[tuple, str, str, Any]]:
    doc = ir.to_json(_every_node_kernel())
    cases = []
    for path in _node_paths(doc):
        node = doc
        for p in path:
            node = node[p]
        for field, kind in _FIELDS[node["t"]].items():
            for bad in _WRONG[kind]:
                cases.append((path, node["t"], field, bad))
    return cases


def test_every_ir_node_type_is_covered() -> None:
    assert {t for _, t, _, _ in _wrong_field_cases()} == set(_FIELDS)
    assert ir.FIELDS == _FIELDS


@pytest.mark.parametrize("path,t,field,bad", _wrong_field_cases())
def test_a_wrong_typed_ir_field_is_a_program_error_naming_it(path: tuple, t: str, field: str,
                                                             bad: Any) -> None:
    doc = ir.to_json(_every_node_kernel())
    node = doc
    for p in path:
        node = node[p]
    node[field] = copy.deepcopy(bad)
    # Before: TypeError/AttributeError raised raw or wrapped ("bad IR node Op: TypeError").
    with pytest.raises(ProgramError, match=rf"IR node {t}\.{field}: (entry \d+: )?expected"):
        ir.from_json(doc)


def test_deep_ir_json_is_refused_without_recursion() -> None:
    deep: Any = {"t": "Const", "value": 1.0, "dtype": "float32"}
    for _ in range(5000):
        deep = {"t": "Op", "op": "neg", "args": [deep], "dtype": "float32"}
    doc = ir.to_json(_every_node_kernel())
    doc["stores"][0]["value"] = deep
    with pytest.raises(ProgramError, match="nests too deeply"):
        ir.from_json(doc)


@pytest.mark.parametrize("field,value", [("dim", "x"), ("dim", None), ("dtype", 3)])
def test_a_hand_built_kernel_with_a_wrong_typed_field_names_it(field: str, value: Any) -> None:
    idx = ir.Idx(0)
    object.__setattr__(idx, field, value)
    with pytest.raises(InvalidArgument, match=rf"Idx\.{field}: expected"):
        ir.Kernel("k", (2,), (), (ir.Arg(I64, "w"),), (ir.Store(0, idx, ir.Idx(0)),))
