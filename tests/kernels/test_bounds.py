"""aotrt/kernels/bounds.py: the ranges it proves contain every value the generated code can
compute (tests/kernels/int_model.py is the exact model of that code), over every integer op
and dtype: narrowing casts, wrapping overflow, division and modulo by negative, zero and -1
divisors, shifts out of range, powers, bitwise ops, floats becoming integers."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aotrt.kernels import bounds, ir
from tests.kernels import int_model as m

I64 = "int64"


LOAD_DTYPES = m.INT_DTYPES + ("bool",)
#: argument of each dtype in every kernel here (the last one is the output)
ARG = {dt: i for i, dt in enumerate(LOAD_DTYPES + ir.FLOAT_DTYPES)}
ARGS = tuple(ir.Arg(dt, "r") for dt in ARG) + (ir.Arg(I64, "w"),)


def ld(dtype: str, index: ir.Expr | None = None) -> ir.Load:
    """A load of the argument of `dtype`."""
    return ir.Load(ARG[dtype], ir.Idx(0) if index is None else index, dtype)


def kernel_of(e: ir.Expr, n: int = 8) -> ir.Kernel:
    """A kernel storing `e` (its accesses are not the point: only `e`'s range is)."""
    return ir.Kernel("k", (n,), (), ARGS, (ir.Store(len(ARGS) - 1, ir.Idx(0), e),))


def rng_of(e: ir.Expr, n: int = 8):
    return bounds.expr_range(kernel_of(e, n), e)


# -- the property: random integer IR, random inputs ------------------------------------------


@st.composite
def programs(draw):
    """(expression, Idx size, {load node id: value}) over every op and every int dtype."""
    pick = lambda k: draw(st.integers(0, k - 1))   # noqa: E731
    n = draw(st.sampled_from([1, 2, 5, 64, 1 << 20, 1 << 40]))
    values: dict[tuple[int, int], object] = {}
    leaves_made: list[ir.Expr] = []

    def value_in(dtype: str) -> int:
        lo, hi = m.RANGE[dtype]
        edge = [v for v in m.EDGE if lo <= v <= hi] + [lo, hi]
        return draw(st.one_of(st.sampled_from(edge), st.integers(lo, hi)))

    def leaf() -> ir.Expr:
        k = pick(6)
        if k == 0:
            return ir.Idx(0)
        if k == 1:
            return ir.Const(draw(st.sampled_from(m.EDGE)), I64)
        if k == 2 and leaves_made and pick(2):
            return leaves_made[pick(len(leaves_made))]       # shared subexpressions
        if k == 3:
            # a float32 input converted to an integer type (saturating, then wrapping)
            node = ld("float32", ir.Const(len(values), I64))
            values[(node.arg, len(values))] = draw(st.one_of(st.sampled_from(m.FLOAT_EDGE),
                                              st.floats(width=32)))
            leaves_made.append(node)
            return ir.Op("cast", (node,), draw(st.sampled_from(LOAD_DTYPES)))
        dtype = draw(st.sampled_from(LOAD_DTYPES))
        node = ld(dtype, ir.Const(len(values), I64))
        values[(node.arg, len(values))] = value_in(dtype)
        leaves_made.append(node)
        return node

    e = m.Gen(pick, leaf).expr(draw(st.integers(1, 5)))
    idx = draw(st.integers(0, n - 1))
    return e, n, idx, values


def _value_in_proved_range(prog) -> None:
    e, n, idx, values = prog
    value = m.evaluate(e, [idx], lambda arg, i, dt: values[(arg, i)])
    lo, hi = rng_of(e, n)
    assert m.INT64_MIN <= lo <= value <= hi <= m.INT64_MAX, (e, value, (lo, hi))


# 3,000 examples take about 35 s on 2 cores: the CI slice draws 400 (fresh ones each run).
@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(programs())
def test_every_computed_value_lies_in_the_proved_range(prog) -> None:
    _value_in_proved_range(prog)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
@given(programs())
def test_every_computed_value_lies_in_the_proved_range_3000(prog) -> None:
    _value_in_proved_range(prog)


# -- the classes, exhaustively over dtypes ---------------------------------------------------


@pytest.mark.parametrize("src,dst", list(itertools.product(LOAD_DTYPES, LOAD_DTYPES)))
def test_a_cast_between_int_dtypes_has_the_range_c_gives_it(src, dst) -> None:
    x = ld(src)
    lo, hi = rng_of(ir.Op("cast", (x,), dst))
    slo, shi = m.RANGE[src]
    dlo, dhi = m.RANGE[dst]
    if dlo <= slo and shi <= dhi:
        assert (lo, hi) == (slo, shi)          # a widening cast keeps its source's range
    else:
        assert (lo, hi) == (dlo, dhi)          # a narrowing one wraps: the whole target
    for v in (slo, shi, 0, slo // 2, shi // 2 + 1):
        assert lo <= m.wrap(v, dst) <= hi


@pytest.mark.parametrize("dst", LOAD_DTYPES)
def test_a_narrow_range_that_fits_survives_the_cast(dst) -> None:
    # Idx over 100 fits every int type: minimum(i, 100) cast keeps [0, 99]
    assert rng_of(ir.Op("cast", (ir.Idx(0),), dst), 100) == ((0, 99) if dst != "bool"
                                                             else (0, 1))


def test_the_narrowing_cast_of_the_issue_is_not_the_source_range() -> None:
    # x[(int8)i] with i up to 255: the old proof said [0, 255]; C gives [-128, 127]
    i = ir.Idx(0)
    assert rng_of(ir.Op("cast", (i,), "int8"), 256) == (-128, 127)
    assert rng_of(ir.Op("cast", (i,), "int16"), 1 << 16) == (-(1 << 15), (1 << 15) - 1)
    assert rng_of(ir.Op("cast", (i,), "uint8"), 300) == (0, 255)


@pytest.mark.parametrize("dst", m.INT_DTYPES + ("bool",))
@pytest.mark.parametrize("src", ir.FLOAT_DTYPES)
def test_a_float_to_int_cast_has_the_targets_range(src, dst) -> None:
    assert rng_of(ir.Op("cast", (ld(src),), dst)) == m.RANGE[dst]


def test_overflow_widens_to_the_full_range() -> None:
    i = ir.Load(0, ir.Idx(0), I64)
    sq = ir.Op("mul", (i, i), I64)
    assert rng_of(sq) == (m.INT64_MIN, m.INT64_MAX)
    clamped = ir.Op("minimum", (ir.Op("maximum", (sq, ir.Const(0, I64)), I64),
                                ir.Const(9, I64)), I64)
    assert rng_of(clamped) == (0, 9)           # the clamp after it is what makes it provable
    big = ir.Op("add", (ir.Const(m.INT64_MAX, I64), ir.Idx(0)), I64)
    assert rng_of(big, 2) == (m.INT64_MIN, m.INT64_MAX)
    assert rng_of(ir.Op("neg", (i,), I64)) == (m.INT64_MIN, m.INT64_MAX)
    assert rng_of(ir.Op("abs", (i,), I64)) == (m.INT64_MIN, m.INT64_MAX)


DIVISORS = [(-5, -2), (-1, -1), (-3, 3), (0, 0), (0, 4), (1, 1), (2, 9), (-9, -1),
            (m.INT64_MIN, -1), (1, m.INT64_MAX)]
DIVIDENDS = [(-20, 20), (0, 7), (-7, 0), (3, 3), (m.INT64_MIN, m.INT64_MIN),
             (m.INT64_MIN, m.INT64_MAX), (m.INT64_MAX - 3, m.INT64_MAX)]


def _values(lo: int, hi: int) -> list[int]:
    vals = {lo, hi, 0, 1, -1, 2, -2, (lo + hi) // 2}
    return sorted(v for v in vals if lo <= v <= hi) + list(range(lo, min(hi, lo + 12) + 1))


def _ranged(lo: int, hi: int) -> ir.Expr:
    """An expression whose proved range is exactly [lo, hi]."""
    x = ir.Load(0, ir.Idx(0), I64)
    return ir.Op("minimum", (ir.Op("maximum", (x, ir.Const(lo, I64)), I64),
                             ir.Const(hi, I64)), I64)


@pytest.mark.parametrize("op", m.DIVISIONS)
def test_every_division_op_over_every_divisor_sign(op) -> None:
    for (a, b), (c, d) in itertools.product(DIVIDENDS, DIVISORS):
        e = ir.Op(op, (_ranged(a, b), _ranged(c, d)), I64)
        lo, hi = rng_of(e)
        for x in _values(a, b):
            for y in _values(c, d):
                v = m.binary(op, x, y)
                assert lo <= v <= hi, (op, (a, b), (c, d), x, y, v, (lo, hi))


def test_division_ranges_are_still_useful() -> None:
    i = ir.Idx(0)
    assert rng_of(ir.Op("floordiv", (i, ir.Const(4, I64)), I64), 16) == (0, 3)
    assert rng_of(ir.Op("mod", (i, ir.Const(-4, I64)), I64), 16) == (-3, 0)
    assert rng_of(ir.Op("mod", (i, ir.Const(5, I64)), I64), 16) == (0, 4)
    assert rng_of(ir.Op("fmod", (ir.Op("neg", (i,), I64), ir.Const(5, I64)), I64), 16) \
        == (-4, 0)
    # INT64_MIN / -1 wraps to INT64_MIN: never a range that leaves it out
    e = ir.Op("truncdiv", (ir.Const(m.INT64_MIN, I64), ir.Const(-1, I64)), I64)
    assert rng_of(e)[0] == m.INT64_MIN


BIT_RANGES = [(0, 5), (0, 255), (-8, -1), (-8, 7), (m.INT64_MIN, -1), (0, m.INT64_MAX),
              (m.INT64_MIN, m.INT64_MAX), (3, 3), (-1, -1), (-100, 50)]


@pytest.mark.parametrize("op", ["bitwise_and", "bitwise_or", "bitwise_xor", "shl", "shr",
                                "pow", "maximum", "minimum", "add", "sub", "mul"])
def test_every_binary_op_over_every_sign(op) -> None:
    rights = BIT_RANGES + ([(0, 70), (-3, 3), (60, 66), (-70, -60)] if op in ("shl", "shr",
                                                                              "pow") else [])
    for (a, b), (c, d) in itertools.product(BIT_RANGES, rights):
        lo, hi = rng_of(ir.Op(op, (_ranged(a, b), _ranged(c, d)), I64))
        for x in _values(a, b):
            for y in _values(c, d):
                v = m.binary(op, x, y)
                assert lo <= v <= hi, (op, (a, b), (c, d), x, y, v, (lo, hi))


@pytest.mark.parametrize("op", m.UNARY)
def test_every_unary_op_over_every_sign(op) -> None:
    for a, b in BIT_RANGES:
        lo, hi = rng_of(ir.Op(op, (_ranged(a, b),), I64))
        for x in _values(a, b):
            assert lo <= m.unary(op, x) <= hi, (op, (a, b), x)


def test_shifts_and_bitwise_ops_keep_small_ranges() -> None:
    i = ir.Idx(0)
    assert rng_of(ir.Op("shl", (i, ir.Const(2, I64)), I64), 8) == (0, 28)
    assert rng_of(ir.Op("shr", (i, ir.Const(1, I64)), I64), 8) == (0, 3)
    assert rng_of(ir.Op("bitwise_and", (ir.Load(0, i, I64), ir.Const(7, I64)), I64)) == (0, 7)
    # a shift by 64 or more is defined (0), never the source range
    assert rng_of(ir.Op("shl", (ir.Const(1, I64), ir.Const(64, I64)), I64)) == (0, 0)


@pytest.mark.parametrize("op,body,n,want", [
    ("sum", (0, 3), 5, (0, 15)), ("sum", (-2, 3), 4, (-8, 12)),
    ("sum", (0, m.INT64_MAX), 2, (m.INT64_MIN, m.INT64_MAX)),       # may wrap
    ("prod", (0, 3), 3, (0, 27)), ("prod", (-2, 2), 3, (-8, 8)),
    ("prod", (0, 3), 100, (m.INT64_MIN, m.INT64_MAX)),
    ("max", (-4, 9), 3, (-4, 9)), ("min", (2, 5), 7, (2, 5)),
    ("sum", (1, 2), 0, (0, 0)), ("max", (1, 2), 0, (m.INT64_MIN, m.INT64_MIN)),
])
def test_integer_reductions(op, body, n, want) -> None:
    x = ir.Load(0, ir.Idx(1), I64)
    clamped = ir.Op("minimum", (ir.Op("maximum", (x, ir.Const(body[0], I64)), I64),
                                ir.Const(body[1], I64)), I64)
    red = ir.Reduce(op, clamped, I64)
    k = ir.Kernel("k", (2,), (n,), (ir.Arg(I64, "rw"),), (ir.Store(0, ir.Idx(0), red),))
    assert bounds.expr_range(k, red) == want


def test_loads_have_their_storage_types_range() -> None:
    for dt in LOAD_DTYPES:
        assert rng_of(ld(dt)) == m.RANGE[dt]


def test_deep_and_shared_ir_is_linear() -> None:
    # 3000 levels deep and a DAG of 2**200 paths: both must be proved quickly, no recursion
    e: ir.Expr = ir.Idx(0)
    for _ in range(3000):
        e = ir.Op("minimum", (ir.Op("add", (e, ir.Const(1, I64)), I64), ir.Const(5, I64)), I64)
    assert rng_of(e) == (5, 5)       # min(i + 1, 5) five times over is 5
    d: ir.Expr = ir.Idx(0)
    for _ in range(200):
        d = ir.Op("bitwise_and", (d, d), I64)
    assert rng_of(d) == (0, 7)


def test_an_index_check_is_its_index_and_the_clamp_bounds_it() -> None:
    """index_check/_neg pass i through (only reporting a bad one): the proof bounds a data
    index by the clamp after the check, never by the check."""
    i = ir.Load(0, ir.Idx(0), I64)
    n = ir.Const(10, I64)
    for op in ("index_check", "index_check_neg"):
        chk = ir.Op(op, (i, n), I64)
        assert rng_of(chk) == rng_of(i)
        clamped = ir.Op("minimum", (ir.Op("maximum", (chk, ir.Const(0, I64)), I64),
                                    ir.Const(9, I64)), I64)
        assert rng_of(clamped) == (0, 9)
