"""aotrt/kernels/render_c.py: numerics of generated C kernels (run on the cpu device) against
numpy in float64: pointwise binary and unary ops, broadcasting, fp16/bf16 rounding, integer
semantics, casts, and reductions (softmax, a layer norm) with Reduce nodes."""

from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest
import torch

from aotrt.dtypes import as_dtype
from aotrt.errors import InvalidArgument
from aotrt.kernels import ir
from aotrt.kernels.render_c import CRenderer
from aotrt.runtime import shims
from aotrt.runtime.memory import Owner, owner_scope
from tests.conftest import make_stream
from tests.support import kernel_fn, rand, rel_err, upload

TOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 2e-2}
NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


@pytest.fixture
def run(cpu):
    """run(kernel, inputs, outputs) -> output arrays: inputs are uploaded into fresh tensors,
    outputs ((shape, dtype) pairs) allocated; arguments are inputs then outputs."""
    s = make_stream(cpu, "async")
    o = Owner("render-c")

    def go(kernel: ir.Kernel, inputs: list[np.ndarray], outputs: list[tuple]) -> list:
        with cpu.stream_guard(s), owner_scope(o):
            ins = []
            for arr in inputs:
                h = shims.empty_strided(list(arr.shape), None, as_dtype(arr.dtype).name)
                upload(h, arr)
                ins.append(h)
            outs = [shims.empty_strided(list(shape), None, dt) for shape, dt in outputs]
            kernel_fn(cpu, kernel)(s, *ins, *outs)
            got = [h.numpy() for h in outs]
            for h in ins + outs:
                shims.delete_tensor_object(h)
        return got

    yield go
    leaked = list(o.handles)
    o.close()
    s.close()
    assert not leaked


def elem_err(got: np.ndarray, ref: np.ndarray) -> float:
    """The largest |got - ref| / |ref| over the elements, in float64 (inf where ref is 0 and
    got is not). Outputs that span a wide range (exp, tan) need it: an error normalised by
    the largest value accepts zeroing every small output."""
    g = np.asarray(got, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.where(g == r, 0.0, np.abs(g - r) / np.abs(r))
    return float(np.max(e, initial=0.0))


def flat(shape) -> ir.Expr:
    """Row-major element index of the outer iteration over `shape`."""
    strides = [int(np.prod(shape[d + 1:])) for d in range(len(shape))]
    return ir.strided_index(strides)


def f32(e: ir.Expr) -> ir.Expr:
    return ir.cast(e, "float32")


# -- pointwise --------------------------------------------------------------------------------

BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "maximum": np.maximum, "minimum": np.minimum, "atan2": np.arctan2,
    "pow": lambda a, b: np.power(np.abs(a), b),
}


def test_binary_float_ops(run):
    shape = (7, 9)
    a, b = rand(shape, seed=1), rand(shape, seed=2)
    x, y = ir.Load(0, flat(shape), "float32"), ir.Load(1, flat(shape), "float32")
    stores = []
    for i, op in enumerate(BINARY):
        lhs = ir.Op("abs", (x,), "float32") if op == "pow" else x
        stores.append(ir.Store(2 + i, flat(shape), ir.Op(op, (lhs, y), "float32")))
    k = ir.Kernel("binary_f32", shape, (), (ir.Arg("float32", "r"),) * 2
                  + (ir.Arg("float32", "w"),) * len(BINARY), tuple(stores))
    got = run(k, [a, b], [(shape, "float32")] * len(BINARY))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    for (op, ref), g in zip(BINARY.items(), got):
        assert rel_err(g, ref(a64, b64)) < TOL["float32"], op


def _gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


UNARY = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1,
    "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "relu": lambda x: np.maximum(x, 0),
    "erf": np.vectorize(math.erf), "sin": np.sin, "cos": np.cos, "tan": np.tan, "atan": np.arctan,
    "floor": np.floor, "ceil": np.ceil, "round": np.round, "trunc": np.trunc,
    "reciprocal": lambda x: 1 / x, "sign": np.sign, "gelu": _gelu,
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1 + np.exp(-x)),
    # domain-restricted: applied to |x|
    "log": np.log, "log2": np.log2, "log1p": np.log1p, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
}
POSITIVE = {"log", "log2", "log1p", "sqrt", "rsqrt"}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_unary_float_ops(run, dtype):
    shape = (5, 13)
    xs = rand(shape, seed=3) * 2.0
    xs[0, :4] = [0.5, 1.5, -2.5, 2.5]          # rounding ties go to even
    xs = xs.astype(NP[dtype])
    x = ir.Load(0, flat(shape), dtype)
    stores = []
    for i, op in enumerate(UNARY):
        arg = ir.Op("abs", (x,), dtype) if op in POSITIVE else x
        stores.append(ir.Store(1 + i, flat(shape), ir.Op(op, (arg,), dtype)))
    k = ir.Kernel(f"unary_{dtype}", shape, (), (ir.Arg(dtype, "r"),)
                  + (ir.Arg(dtype, "w"),) * len(UNARY), tuple(stores))
    got = run(k, [xs], [(shape, dtype)] * len(UNARY))
    x64 = xs.astype(np.float64)
    for (op, ref), g in zip(UNARY.items(), got):
        want = ref(np.abs(x64) if op in POSITIVE else x64)
        assert elem_err(g, want) < TOL[dtype], op


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_inverse_sine_and_cosine_over_their_domain(run, dtype):
    """asin and acos on random points of [-1, 1] and its ends against float64; outside the
    domain both are NaN, as in torch."""
    xs = np.random.default_rng(11).uniform(-1.0, 1.0, 4096)
    xs = np.concatenate([xs, [-1.0, 1.0, 0.0, -0.0, 0.5, -0.5, 1.5, -2.0, np.nan]])
    xs = xs.astype(NP[dtype])
    shape = (xs.size,)
    x = ir.Load(0, flat(shape), dtype)
    ops = {"asin": np.arcsin, "acos": np.arccos}
    stores = tuple(ir.Store(1 + i, flat(shape), ir.Op(op, (x,), dtype))
                   for i, op in enumerate(ops))
    k = ir.Kernel(f"inverse_trig_{dtype}", shape, (), (ir.Arg(dtype, "r"),)
                  + (ir.Arg(dtype, "w"),) * len(ops), stores)
    got = run(k, [xs], [(shape, dtype)] * len(ops))
    x64 = xs.astype(np.float64)
    inside = np.abs(x64) <= 1
    for (op, ref), g in zip(ops.items(), got):
        g64 = g.astype(np.float64)
        assert elem_err(g64[inside], ref(x64[inside])) < TOL[dtype], op
        assert np.isnan(g64[~inside]).all(), op


def test_maximum_and_minimum_propagate_nan(run):
    a = np.array([1.0, np.nan, 3.0, np.nan], np.float32)
    b = np.array([np.nan, 2.0, 1.0, np.nan], np.float32)
    x, y = ir.Load(0, ir.Idx(0), "float32"), ir.Load(1, ir.Idx(0), "float32")
    k = ir.Kernel("nan_minmax", (4,), (), (ir.Arg("float32", "r"),) * 2
                  + (ir.Arg("float32", "w"),) * 2,
                  (ir.Store(2, ir.Idx(0), ir.Op("maximum", (x, y), "float32")),
                   ir.Store(3, ir.Idx(0), ir.Op("minimum", (x, y), "float32"))))
    mx, mn = run(k, [a, b], [((4,), "float32")] * 2)
    np.testing.assert_array_equal(mx, np.maximum(a, b))
    np.testing.assert_array_equal(mn, np.minimum(a, b))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_relu_keeps_nan_and_negative_zero(run, dtype):
    """relu is `x < 0 ? 0 : x`: torch's relu(NaN) is NaN and relu(-0.0) is -0.0 (the old
    `x > 0 ? x : 0` made both 0)."""
    xs = np.array([np.nan, -0.0, 0.0, -1.5, 2.5, -np.inf, np.inf, -1e-40], np.float32)
    xs = xs.astype(NP[dtype])
    n = len(xs)
    x = ir.Load(0, ir.Idx(0), dtype)
    k = ir.Kernel(f"relu_{dtype}", (n,), (), (ir.Arg(dtype, "r"), ir.Arg(dtype, "w")),
                  (ir.Store(1, ir.Idx(0), ir.cast(ir.Op("relu", (f32(x),), "float32"),
                                                   dtype)),))
    (got,) = run(k, [xs], [((n,), dtype)])
    ref = torch.relu(torch.from_numpy(xs.astype(np.float32))).numpy()
    got = got.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_array_equal(got[ok], ref[ok])
    np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(ref[ok]))


def test_broadcasting_by_zero_strides(run):
    """out[i,j,k] = a[i,0,k] * b[j,0] + 1 over (3, 4, 5): stride-0 loads broadcast."""
    a, b = rand((3, 1, 5), seed=4), rand((4, 1), seed=5)
    va = ir.load(0, (5, 0, 1), "float32")
    vb = ir.load(1, (0, 1, 0), "float32")
    val = ir.Op("add", (ir.Op("mul", (va, vb), "float32"), ir.const(1.0, "float32")), "float32")
    k = ir.Kernel("bcast_mul_add", (3, 4, 5), (), (ir.Arg("float32", "r"),) * 2
                  + (ir.Arg("float32", "w"),), (ir.store(2, (20, 5, 1), val),))
    (got,) = run(k, [a, b], [((3, 4, 5), "float32")])
    ref = a.astype(np.float64) * b.astype(np.float64)[None, :, :] + 1
    assert rel_err(got, np.broadcast_to(ref, (3, 4, 5))) < TOL["float32"]


def test_transposed_output(run):
    a = rand((4, 6), seed=6)
    k = ir.Kernel("transpose_4x6", (4, 6), (), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                  (ir.store(1, (1, 4), ir.load(0, (6, 1), "float32")),))
    (got,) = run(k, [a], [((6, 4), "float32")])
    np.testing.assert_array_equal(got, a.T)


# -- half types -------------------------------------------------------------------------------

SPECIAL = np.array([
    1.0 + 2.0**-8,          # bf16 tie: rounds to even (1.0)
    1.0 + 3 * 2.0**-8,      # bf16 tie: rounds to even (1 + 2^-6)
    1.0 + 2.0**-11,         # fp16 tie: rounds to even (1.0)
    1.0 + 3 * 2.0**-11,     # fp16 tie: rounds up
    70000.0, -70000.0,      # past fp16's range: inf
    1e-6, -3e-7,            # fp16 subnormals
    3.0e38, np.inf, -np.inf, 0.0, -0.0, 65504.0, 0.1, -1.0 / 3,
], np.float32)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_float_to_half_rounds_to_nearest_even(run, dtype):
    xs = np.concatenate([SPECIAL, rand((48,), seed=7) * 1000]).astype(np.float32)
    n = xs.size
    x = ir.Load(0, ir.Idx(0), "float32")
    k = ir.Kernel(f"round_to_{dtype}", (n,), (), (ir.Arg("float32", "r"), ir.Arg(dtype, "w"),
                                                  ir.Arg(dtype, "w")),
                  (ir.Store(1, ir.Idx(0), ir.cast(x, dtype)),      # a cast, then the store
                   ir.Store(2, ir.Idx(0), x)))                      # the store alone rounds
    by_cast, by_store = run(k, [xs], [((n,), dtype)] * 2)
    with np.errstate(over="ignore"):            # 70000 -> fp16 inf is the point
        want = xs.astype(NP[dtype])
    np.testing.assert_array_equal(by_cast.view(np.uint16), want.view(np.uint16))
    np.testing.assert_array_equal(by_store.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_nan_stays_nan(run, dtype):
    xs = np.array([np.nan, -np.nan, 1.0], np.float32)
    k = ir.Kernel(f"nan_to_{dtype}", (3,), (), (ir.Arg("float32", "r"), ir.Arg(dtype, "w")),
                  (ir.Store(1, ir.Idx(0), ir.Load(0, ir.Idx(0), "float32")),))
    (got,) = run(k, [xs], [((3,), dtype)])
    assert np.isnan(got[:2].astype(np.float32)).all() and got[2] == 1.0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_arithmetic_is_computed_in_float(run, dtype):
    a = (rand((64,), seed=8) * 3).astype(NP[dtype])
    b = (rand((64,), seed=9) * 3).astype(NP[dtype])
    x, y = ir.Load(0, ir.Idx(0), dtype), ir.Load(1, ir.Idx(0), dtype)
    val = ir.Op("add", (ir.Op("mul", (x, y), dtype), ir.Op("exp", (y,), dtype)), dtype)
    k = ir.Kernel(f"half_arith_{dtype}", (64,), (), (ir.Arg(dtype, "r"),) * 2
                  + (ir.Arg(dtype, "w"),), (ir.Store(2, ir.Idx(0), val),))
    (got,) = run(k, [a, b], [((64,), dtype)])
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    assert rel_err(got, a64 * b64 + np.exp(b64)) < TOL[dtype]


# -- integers, comparisons, casts -------------------------------------------------------------

INT_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply,
    "floordiv": np.floor_divide, "mod": np.mod,                   # Python semantics
    "truncdiv": lambda a, b: np.trunc(a / b).astype(np.int64),   # C semantics
    "fmod": np.fmod, "maximum": np.maximum, "minimum": np.minimum,
    "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
}


def test_integer_ops_follow_torch_semantics(run):
    rng = np.random.default_rng(10)
    a = rng.integers(-50, 51, size=40).astype(np.int64)
    b = rng.choice([-7, -3, -2, -1, 1, 2, 3, 5, 9], size=40).astype(np.int64)
    x, y = ir.Load(0, ir.Idx(0), "int64"), ir.Load(1, ir.Idx(0), "int64")
    small = ir.Op("abs", (ir.Op("mod", (y, ir.const(4, "int64")), "int64"),), "int64")
    extra = {"shl": (x, small, lambda a, b: a << (np.mod(b, 4))),
             "shr": (x, small, lambda a, b: a >> (np.mod(b, 4))),
             "pow": (x, small, lambda a, b: a ** np.mod(b, 4))}
    stores = [ir.Store(2 + i, ir.Idx(0), ir.Op(op, (x, y), "int64"))
              for i, op in enumerate(INT_BINARY)]
    stores += [ir.Store(2 + len(INT_BINARY) + i, ir.Idx(0), ir.Op(op, (l, r), "int64"))
               for i, (op, (l, r, _)) in enumerate(extra.items())]
    nout = len(stores)
    k = ir.Kernel("int_ops", (40,), (), (ir.Arg("int64", "r"),) * 2
                  + (ir.Arg("int64", "w"),) * nout, tuple(stores))
    got = run(k, [a, b], [((40,), "int64")] * nout)
    refs = [f(a, b) for f in INT_BINARY.values()] + [f(a, b) for *_, f in extra.values()]
    for name, g, r in zip(list(INT_BINARY) + list(extra), got, refs):
        np.testing.assert_array_equal(g, r, err_msg=name)


def test_float_floordiv_and_mod_follow_python(run):
    a = np.array([7.5, -7.5, 7.5, -7.5, 1.0, -0.0, 5.0], np.float32)
    b = np.array([2.0, 2.0, -2.0, -2.0, 3.0, 2.0, 0.5], np.float32)
    x, y = ir.Load(0, ir.Idx(0), "float32"), ir.Load(1, ir.Idx(0), "float32")
    k = ir.Kernel("float_floordiv_mod", (7,), (), (ir.Arg("float32", "r"),) * 2
                  + (ir.Arg("float32", "w"),) * 2,
                  (ir.Store(2, ir.Idx(0), ir.Op("floordiv", (x, y), "float32")),
                   ir.Store(3, ir.Idx(0), ir.Op("mod", (x, y), "float32"))))
    fd, md = run(k, [a, b], [((7,), "float32")] * 2)
    np.testing.assert_array_equal(fd, np.floor_divide(a, b))
    np.testing.assert_array_equal(md, np.mod(a, b))


def test_comparisons_where_and_logic(run):
    a, b = rand((30,), seed=11), rand((30,), seed=12)
    a[:3] = b[:3]
    x, y = ir.Load(0, ir.Idx(0), "float32"), ir.Load(1, ir.Idx(0), "float32")
    cmp = {op: ir.Op(op, (x, y), "bool") for op in ("lt", "le", "gt", "ge", "eq", "ne")}
    picked = ir.Op("where", (cmp["gt"], x, ir.Op("mul", (y, ir.const(2.0, "float32")),
                                                  "float32")), "float32")
    both = ir.Op("and", (cmp["lt"], ir.Op("gt", (x, ir.const(0.0, "float32")), "bool")), "bool")
    stores = [ir.Store(2 + i, ir.Idx(0), e) for i, e in enumerate(cmp.values())]
    stores += [ir.Store(8, ir.Idx(0), picked), ir.Store(9, ir.Idx(0), both)]
    k = ir.Kernel("compare_where", (30,), (), (ir.Arg("float32", "r"),) * 2
                  + (ir.Arg("bool", "w"),) * 6 + (ir.Arg("float32", "w"), ir.Arg("bool", "w")),
                  tuple(stores))
    got = run(k, [a, b], [((30,), "bool")] * 6 + [((30,), "float32"), ((30,), "bool")])
    refs = [a < b, a <= b, a > b, a >= b, a == b, a != b]
    for g, r in zip(got[:6], refs):
        np.testing.assert_array_equal(g, r)
    np.testing.assert_array_equal(got[6], np.where(a > b, a, b * 2))
    np.testing.assert_array_equal(got[7], (a < b) & (a > 0))


def test_casts_between_kinds(run):
    xs = np.array([2.7, -2.7, 0.0, 300.0, -129.0, 1e-3], np.float32)
    x = ir.Load(0, ir.Idx(0), "float32")
    as_i64 = ir.cast(x, "int64")
    stores = (ir.Store(1, ir.Idx(0), as_i64),                         # truncates
              ir.Store(2, ir.Idx(0), ir.cast(as_i64, "int8")),        # narrow ints wrap
              ir.Store(3, ir.Idx(0), ir.cast(x, "bool")),
              ir.Store(4, ir.Idx(0), ir.cast(ir.cast(x, "bool"), "float32")))
    k = ir.Kernel("casts", (6,), (), (ir.Arg("float32", "r"), ir.Arg("int64", "w"),
                                      ir.Arg("int8", "w"), ir.Arg("bool", "w"),
                                      ir.Arg("float32", "w")), stores)
    i64, i8, bl, fb = run(k, [xs], [((6,), "int64"), ((6,), "int8"), ((6,), "bool"),
                                     ((6,), "float32")])
    np.testing.assert_array_equal(i64, np.trunc(xs).astype(np.int64))
    np.testing.assert_array_equal(i8, np.trunc(xs).astype(np.int64).astype(np.int8))
    np.testing.assert_array_equal(bl, xs != 0)
    np.testing.assert_array_equal(fb, (xs != 0).astype(np.float32))


def test_special_literals(run):
    i = ir.Idx(0)
    val = ir.Op("where", (ir.Op("eq", (i, ir.const(0, "int64")), "bool"),
                          ir.const(float("inf"), "float32"),
                          ir.Op("where", (ir.Op("eq", (i, ir.const(1, "int64")), "bool"),
                                          ir.const(float("-inf"), "float32"),
                                          ir.const(float("nan"), "float32")), "float32")),
                 "float32")
    k = ir.Kernel("literals", (3,), (), (ir.Arg("float32", "w"), ir.Arg("int64", "w")),
                  (ir.Store(0, i, val), ir.Store(1, i, ir.const(-(2**63), "int64"))))
    f, n = run(k, [], [((3,), "float32"), ((3,), "int64")])
    assert f[0] == np.inf and f[1] == -np.inf and np.isnan(f[2])
    assert (n == np.iinfo(np.int64).min).all()


def test_literal_rendering():
    r = CRenderer()
    assert r.literal(float("inf"), "float32") == "INFINITY"
    assert r.literal(float("-inf"), "float16") == "(-INFINITY)"
    assert r.literal(float("nan"), "bfloat16") == "NAN"
    assert r.literal(2, "float32") == "2.0f" and r.literal(1e-30, "float32") == "1e-30f"
    assert r.literal(-(2**63), "int64") == "INT64_MIN" and r.literal(5, "int32") == "((int64_t)5LL)"
    assert r.literal(1, "bool") == "true" and r.literal(0, "bool") == "false"


def test_rendered_source_has_the_cpu_signature():
    k = ir.Kernel("sig_check", (4,), (), (ir.Arg("float32", "w"),),
                  (ir.Store(0, ir.Idx(0), ir.const(1.0, "float32")),))
    src = CRenderer().render([k])
    assert "void aotrt_k0(char **P, int64_t begin, int64_t end, int64_t threads)" in src
    assert "#pragma omp parallel for num_threads(nt)" in src
    assert "void sig_check" not in src and "/* kernel sig_check */" in src
    assert "aot_bf16_to_f" in src and "#include <math.h>" in src


def test_an_op_without_a_meaning_for_its_dtype_is_refused(cpu):
    x = ir.Load(0, ir.Idx(0), "int64")
    k = ir.Kernel("exp_of_int", (4,), (), (ir.Arg("int64", "r"), ir.Arg("int64", "w")),
                  (ir.Store(1, ir.Idx(0), ir.Op("exp", (x,), "int64")),))
    with pytest.raises(InvalidArgument, match="exp is not defined for int64"):
        cpu.kernel_library([k])


# -- reductions -------------------------------------------------------------------------------


def softmax_kernel(rows: int, cols: int, dtype: str) -> ir.Kernel:
    """out[r, c] = exp(x[r, c] - max_c x[r]) / sum_c exp(...), in float, rounded on store."""
    idx = ir.strided_index((cols, 1), (0, 1))          # dim 1 is the reduce dim
    xf = f32(ir.Load(0, idx, dtype))
    m = ir.Reduce("max", xf, "float32")
    e = ir.Op("exp", (ir.Op("sub", (xf, m), "float32"),), "float32")
    s = ir.Reduce("sum", e, "float32")
    return ir.Kernel(f"softmax_{rows}x{cols}_{dtype}", (rows,), (cols,),
                     (ir.Arg(dtype, "r"), ir.Arg(dtype, "w")),
                     (ir.Store(1, idx, ir.Op("div", (e, s), "float32")),))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_softmax_with_reduce_nodes(run, dtype):
    rows, cols = 6, 33
    x = (rand((rows, cols), seed=13) * 4).astype(NP[dtype])
    (got,) = run(softmax_kernel(rows, cols, dtype), [x], [((rows, cols), dtype)])
    x64 = x.astype(np.float64)
    ref = np.exp(x64 - x64.max(axis=1, keepdims=True))
    ref /= ref.sum(axis=1, keepdims=True)
    assert rel_err(got, ref) < TOL[dtype]
    assert np.allclose(got.astype(np.float64).sum(axis=1), 1.0, atol=TOL[dtype] * 4)


def test_layer_norm_with_a_reduce_inside_a_reduce(run):
    rows, cols, eps = 5, 24, 1e-5
    x = rand((rows, cols), seed=14) * 3 + 1
    idx = ir.strided_index((cols, 1), (0, 1))
    xv = ir.Load(0, idx, "float32")
    n = ir.const(float(cols), "float32")
    mean = ir.Op("div", (ir.Reduce("sum", xv, "float32"), n), "float32")
    d = ir.Op("sub", (xv, mean), "float32")
    var = ir.Op("div", (ir.Reduce("sum", ir.Op("mul", (d, d), "float32"), "float32"), n),
                "float32")
    y = ir.Op("mul", (d, ir.Op("rsqrt", (ir.Op("add", (var, ir.const(eps, "float32")),
                                                "float32"),), "float32")), "float32")
    k = ir.Kernel("layer_norm_5x24", (rows,), (cols,),
                  (ir.Arg("float32", "r"), ir.Arg("float32", "w"), ir.Arg("float32", "w")),
                  (ir.Store(1, idx, y), ir.Store(2, ir.Idx(0), mean)))
    out, means = run(k, [x], [((rows, cols), "float32"), ((rows,), "float32")])
    x64 = x.astype(np.float64)
    mu = x64.mean(axis=1, keepdims=True)
    ref = (x64 - mu) / np.sqrt(x64.var(axis=1, keepdims=True) + eps)
    assert rel_err(out, ref) < TOL["float32"]
    assert rel_err(means, mu[:, 0]) < TOL["float32"]


def test_float_reductions(run):
    rows, cols = 4, 33
    x = rand((rows, cols), seed=15)
    idx = ir.strided_index((cols, 1), (0, 1))
    xv = ir.Load(0, idx, "float32")
    ops = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}
    stores = tuple(ir.Store(1 + i, ir.Idx(0), ir.Reduce(op, xv, "float32"))
                   for i, op in enumerate(ops))
    k = ir.Kernel("float_reductions", (rows,), (cols,), (ir.Arg("float32", "r"),)
                  + (ir.Arg("float32", "w"),) * 4, stores)
    got = run(k, [x], [((rows,), "float32")] * 4)
    for (op, ref), g in zip(ops.items(), got):
        assert rel_err(g, ref(x.astype(np.float64), axis=1)) < TOL["float32"], op


def test_int_and_bool_reductions(run):
    rng = np.random.default_rng(16)
    xi = rng.integers(-1000, 1000, size=(3, 17)).astype(np.int64)
    xb = rng.random((3, 17)) < 0.9
    xb[0] = True
    xb[2] = False
    idx = ir.strided_index((17, 1), (0, 1))
    li, lb = ir.Load(0, idx, "int64"), ir.Load(1, idx, "bool")
    stores = (ir.Store(2, ir.Idx(0), ir.Reduce("sum", li, "int64")),
              ir.Store(3, ir.Idx(0), ir.Reduce("max", li, "int64")),
              ir.Store(4, ir.Idx(0), ir.Reduce("min", li, "int64")),
              ir.Store(5, ir.Idx(0), ir.Reduce("any", lb, "bool")),
              ir.Store(6, ir.Idx(0), ir.Reduce("all", lb, "bool")))
    k = ir.Kernel("int_bool_reductions", (3,), (17,),
                  (ir.Arg("int64", "r"), ir.Arg("bool", "r")) + (ir.Arg("int64", "w"),) * 3
                  + (ir.Arg("bool", "w"),) * 2, stores)
    s, mx, mn, an, al = run(k, [xi, xb], [((3,), "int64")] * 3 + [((3,), "bool")] * 2)
    np.testing.assert_array_equal(s, xi.sum(axis=1))
    np.testing.assert_array_equal(mx, xi.max(axis=1))
    np.testing.assert_array_equal(mn, xi.min(axis=1))
    np.testing.assert_array_equal(an, xb.any(axis=1))
    np.testing.assert_array_equal(al, xb.all(axis=1))


def test_reduction_over_an_empty_domain_gives_the_identity(run):
    idx = ir.strided_index((0, 1), (0, 1))
    xv = ir.Load(0, idx, "float32")
    k = ir.Kernel("empty_reduce", (3,), (0,), (ir.Arg("float32", "r"),)
                  + (ir.Arg("float32", "w"),) * 3,
                  (ir.Store(1, ir.Idx(0), ir.Reduce("sum", xv, "float32")),
                   ir.Store(2, ir.Idx(0), ir.Reduce("max", xv, "float32")),
                   ir.Store(3, ir.Idx(0), ir.Reduce("prod", xv, "float32"))))
    s, m, p = run(k, [np.zeros((3, 0), np.float32)], [((3,), "float32")] * 3)
    np.testing.assert_array_equal(s, [0, 0, 0])
    np.testing.assert_array_equal(m, [-np.inf] * 3)
    np.testing.assert_array_equal(p, [1, 1, 1])


# -- threads ----------------------------------------------------------------------------------


def _cost(src: str) -> int:
    """The per-outer-element work the renderer put into kernel 0's thread choice."""
    import re

    return int(re.search(r"aot_nthreads\(n, (\d+)LL, threads\)", src).group(1))


def test_the_work_estimate_counts_reduce_loops_by_their_trip_count():
    from aotrt.kernels.render_c import PARALLEL_GRAIN

    # lines a row runs once (a sum's lane setup) weigh 1; loop lines weigh their trips, so
    # the estimate grows by the same step for each 400 more columns
    narrow, mid, wide = (_cost(CRenderer().render([softmax_kernel(4, c, "float32")]))
                         for c in (8, 408, 808))
    assert 0.98 < (wide - mid) / (mid - narrow) < 1.02
    assert 80 * narrow < wide < 110 * narrow
    # a tiny pointwise kernel stays on one thread; a big softmax gets several
    tiny = ir.Kernel("tiny", (64,), (), (ir.Arg("float32", "w"),),
                     (ir.Store(0, ir.Idx(0), ir.const(1.0, "float32")),))
    assert 64 * _cost(CRenderer().render([tiny])) < PARALLEL_GRAIN
    assert 1000 * wide // PARALLEL_GRAIN >= 3


def _nested(levels: int, cols: int = 1000) -> ir.Kernel:
    """max(x * max(x * ... max(x * x))): each level a row scalar the next one uses."""
    idx = ir.strided_index((cols, 1), (0, 1))
    x = ir.Load(0, idx, "float32")
    e: ir.Expr = x
    for _ in range(levels):
        e = ir.Reduce("max", ir.Op("mul", (x, e), "float32"), "float32")
    return ir.Kernel(f"nested_{levels}", (1,), (cols,),
                     (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                     (ir.Store(1, ir.Idx(0), e),))


def test_the_work_estimate_of_nested_reductions_follows_the_hoisted_loops(run):
    """An inner reduction is computed once per row before the loop that uses it, so the
    estimate grows with the levels, not as a power of the row length."""
    one, eight = (_cost(CRenderer().render([_nested(n)])) for n in (1, 8))
    assert 4 * one < eight < 16 * one
    a = np.full((1, 1000), 0.5, np.float32)
    (got,) = run(_nested(8), [a], [((1,), "float32")])
    assert got[0] == np.float32(0.5) ** 9


def _threaded(cpu, kernel: ir.Kernel, inputs: list[np.ndarray], outputs: list[tuple],
              threads: int) -> list[np.ndarray]:
    """Run `kernel` on a fresh stream of `threads` threads; outputs start as NaN, so an
    element no chunk wrote shows."""
    from aotrt.runtime.device import StreamOptions

    s = cpu.create_stream(StreamOptions(check_hazards=True, threads=threads))
    o = Owner("render-c-threads")
    with cpu.stream_guard(s), owner_scope(o):
        hs = []
        for arr in inputs:
            h = shims.empty_strided(list(arr.shape), None, as_dtype(arr.dtype).name)
            upload(h, arr)
            hs.append(h)
        outs = []
        for shape, dt in outputs:
            h = shims.empty_strided(list(shape), None, dt)
            upload(h, np.full(shape, np.nan, NP[dt]))
            outs.append(h)
        kernel_fn(cpu, kernel)(s, *hs, *outs)
        got = [h.numpy() for h in outs]
        for h in hs + outs:
            shims.delete_tensor_object(h)
    o.close()
    s.close()
    return got


@pytest.mark.parametrize("threads", [2, 3, 7])
def test_a_threaded_row_reduction_equals_one_thread_bit_for_bit(cpu, threads):
    from aotrt.kernels.render_c import PARALLEL_GRAIN

    rows, cols = 1001, 257                  # rows divide evenly by none of the thread counts
    k = softmax_kernel(rows, cols, "float32")
    assert rows * _cost(CRenderer().render([k])) // PARALLEL_GRAIN >= threads  # really split
    x = rand((rows, cols), seed=31) * 4
    (one,) = _threaded(cpu, k, [x], [((rows, cols), "float32")], 1)
    (many,) = _threaded(cpu, k, [x], [((rows, cols), "float32")], threads)
    assert many.tobytes() == one.tobytes()
    x64 = x.astype(np.float64)
    ref = np.exp(x64 - x64.max(axis=1, keepdims=True))
    assert rel_err(one, ref / ref.sum(axis=1, keepdims=True)) < TOL["float32"]


def test_a_big_kernel_on_a_stream_of_two_threads_starts_a_second_thread(cpu):
    """OpenMP's pool threads of the stream's worker show up as OS threads of the process."""
    import os

    from aotrt.runtime.device import StreamOptions

    if not os.path.isdir("/proc/self/task"):
        pytest.skip("no /proc/self/task here")
    rows, cols = 1001, 257
    k = softmax_kernel(rows, cols, "float32")
    fn = kernel_fn(cpu, k)
    counts = {}
    for threads in (1, 2):
        s = cpu.create_stream(StreamOptions(threads=threads))
        o = Owner("render-c-pool")
        with cpu.stream_guard(s), owner_scope(o):
            x, y = (shims.empty_strided([rows, cols], None, "float32") for _ in range(2))
            upload(x, rand((rows, cols), seed=33))
            s.commit_and_wait()                 # the worker thread exists now
            before = len(os.listdir("/proc/self/task"))
            fn(s, x, y)
            s.commit_and_wait()
            counts[threads] = len(os.listdir("/proc/self/task")) - before
            for h in (x, y):
                shims.delete_tensor_object(h)
        o.close()
        s.close()
    assert counts[1] == 0 and counts[2] >= 1, counts


@pytest.mark.parametrize("threads", [2, 3])
def test_a_threaded_pointwise_kernel_equals_one_thread_bit_for_bit(cpu, threads):
    from aotrt.kernels.render_c import PARALLEL_GRAIN

    n = 300007
    x = ir.load(0, (1,), "float32")
    y = ir.Op("add", (ir.Op("mul", (ir.Op("tanh", (x,), "float32"), x), "float32"),
                      ir.Op("exp", (ir.Op("neg", (x,), "float32"),), "float32")), "float32")
    k = ir.Kernel("pointwise_threads", (n,), (), (ir.Arg("float32", "r"),
                                                   ir.Arg("float32", "w")),
                  (ir.store(1, (1,), y),))
    assert n * _cost(CRenderer().render([k])) // PARALLEL_GRAIN >= threads
    a = rand((n,), seed=32)
    (one,) = _threaded(cpu, k, [a], [((n,), "float32")], 1)
    (many,) = _threaded(cpu, k, [a], [((n,), "float32")], threads)
    assert many.tobytes() == one.tobytes()
    a64 = a.astype(np.float64)
    assert rel_err(one, np.tanh(a64) * a64 + np.exp(-a64)) < TOL["float32"]


def test_division_by_zero_in_a_later_chunk_is_reported(cpu):
    from aotrt.errors import InvalidArgument as Invalid
    from aotrt.kernels.render_c import PARALLEL_GRAIN
    from aotrt.runtime.device import StreamOptions

    n = 200000
    q = ir.Op("floordiv", (ir.load(0, (1,), "int64"), ir.load(1, (1,), "int64")), "int64")
    k = ir.Kernel("div_threads", (n,), (), (ir.Arg("int64", "r"), ir.Arg("int64", "r"),
                                            ir.Arg("int64", "w")), (ir.store(2, (1,), q),))
    assert n * _cost(CRenderer().render([k])) // PARALLEL_GRAIN >= 2
    s = cpu.create_stream(StreamOptions(threads=2))
    o = Owner("div-threads")
    with cpu.stream_guard(s), owner_scope(o):
        a, b, out = (shims.empty_strided([n], None, "int64") for _ in range(3))
        upload(a, np.arange(n, dtype=np.int64) + 1)
        den = np.full(n, 3, np.int64)
        den[-1] = 0                           # only the last chunk's last element divides by 0
        upload(b, den)
        fn = kernel_fn(cpu, k)
        fn(s, a, b, out)
        with pytest.raises(Invalid, match="integer division or modulo by zero"):
            s.commit_and_wait()
        den[-1] = 5
        upload(b, den)
        kernel_fn(cpu, k)(s, a, b, out)       # the flag was reset
        want = (np.arange(n, dtype=np.int64) + 1) // den
        np.testing.assert_array_equal(out.numpy(), want)
        for h in (a, b, out):
            shims.delete_tensor_object(h)
    o.close()
    s.close()


# -- row loops --------------------------------------------------------------------------------

def _innermost_loop(src: str) -> str:
    """The text of the innermost `for (int64_t d...` loop of the first kernel's range."""
    body = src[src.index("_range("):]
    start = body.index("for (int64_t d")
    return body[start:body.index("it += hi - lo;", start)]


def test_the_row_loop_has_no_division_per_element():
    """The leading coordinates are computed once per row: the loop over the last one indexes
    affinely (what lets the compiler vectorise it) and reads the pointers from locals."""
    va = ir.load(0, (1, 15, 3), "float32")          # a transposed read of a (7, 5, 3) input
    k = ir.Kernel("rows", (3, 7, 5), (), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                  (ir.store(1, (35, 5, 1), ir.Op("exp", (va,), "float32")),))
    src = CRenderer().render([k])
    loop = _innermost_loop(src)
    assert "for (int64_t d2 = lo; d2 < hi; d2++)" in loop
    assert "%" not in loop and "/" not in loop
    assert "P[" not in loop and "A0" in loop


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_chunks_that_start_and_end_inside_rows_cover_every_element_once(cpu, threads):
    """Rows of 37 over (29, 31, 37): threads' chunks cut rows in the middle; every element is
    written (outputs start as NaN) with torch's value, and bit for bit as on one thread."""
    from aotrt.kernels.render_c import PARALLEL_GRAIN

    shape = (29, 31, 37)
    a = rand(shape, seed=41)
    va = ir.load(0, (31 * 37, 37, 1), "float32")
    val = ir.Op("add", (ir.Op("mul", (va, va), "float32"),
                        f32(ir.Idx(2, "int64"))), "float32")     # the row coordinate itself
    k = ir.Kernel("rows_threads", shape, (), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                  (ir.store(1, (1, 29, 29 * 31), val),))      # written transposed
    n = int(np.prod(shape))
    assert threads == 1 or n * _cost(CRenderer().render([k])) // PARALLEL_GRAIN >= threads
    (got,) = _threaded(cpu, k, [a], [((37, 31, 29), "float32")], threads)
    ref = (a.astype(np.float64) ** 2 + np.arange(37)[None, None, :]).transpose(2, 1, 0)
    assert rel_err(got, ref) < TOL["float32"]
    (one,) = _threaded(cpu, k, [a], [((37, 31, 29), "float32")], 1)
    assert got.tobytes() == one.tobytes()


def test_a_rank_zero_kernel_still_runs_once(run):
    k = ir.Kernel("scalar", (), (), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                  (ir.store(1, (), ir.Op("neg", (ir.load(0, (), "float32"),), "float32")),))
    (got,) = run(k, [np.array(2.5, np.float32)], [((), "float32")])
    assert got == np.float32(-2.5)


# -- vectorisable exp, tanh, erf ----------------------------------------------------------------

def _special_f64(op: str, x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return {"exp": np.exp, "tanh": np.tanh, "erf": erf,
            "sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)),
            "silu": lambda v: v / (1.0 + np.exp(-v)),
            "gelu": lambda v: 0.5 * v * (1.0 + erf(v / np.sqrt(2.0)))}[op](x)


@pytest.mark.parametrize("op, lo, hi, ulps", [
    ("exp", -87.0, 88.5, 2), ("tanh", -12.0, 12.0, 3), ("erf", -5.0, 5.0, 4),
    ("sigmoid", -80.0, 80.0, 4), ("silu", -80.0, 80.0, 4), ("gelu", -5.0, 8.0, 4)])
def test_transcendentals_are_within_a_few_ulps_elementwise(run, op, lo, hi, ulps):
    """Every element of a dense sweep (and random points) against float64, in units of
    float32's spacing at the true value (erf/gelu: at 1 where the value is near 1 or 0,
    since 1 + erf cancels in any float32 formula, libm's too)."""
    n = 200003
    xs = np.concatenate([np.linspace(lo, hi, n), np.random.default_rng(5).uniform(lo, hi, n),
                         [0.0, -0.0, 0.625, -0.625, 1.0, -1.0, 1e-3, -1e-30]])
    xs = xs.astype(np.float32)
    shape = (xs.size,)
    k = ir.Kernel(f"sweep_{op}", shape, (), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                  (ir.store(1, (1,), ir.Op(op, (ir.load(0, (1,), "float32"),), "float32")),))
    (got,) = run(k, [xs], [(shape, "float32")])
    want = _special_f64(op, xs.astype(np.float64))
    floor = 1.0 if op in ("erf", "gelu") else np.finfo(np.float32).tiny
    spacing = np.spacing(np.maximum(np.abs(want), floor).astype(np.float32)).astype(np.float64)
    if op == "gelu":
        spacing *= np.maximum(np.abs(xs), 1.0)          # 0.5 * x * (1 + erf): x scales it
    err = np.abs(got.astype(np.float64) - want) / spacing
    worst = int(np.argmax(err))
    assert err[worst] <= ulps, (op, float(xs[worst]), float(got[worst]), want[worst])


@pytest.mark.parametrize("op", ["exp", "tanh", "erf"])
def test_transcendentals_keep_ieee_special_values(run, op):
    xs = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 200.0, -200.0], np.float32)
    k = ir.Kernel(f"special_{op}", (7,), (), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                  (ir.store(1, (1,), ir.Op(op, (ir.load(0, (1,), "float32"),), "float32")),))
    (got,) = run(k, [xs], [((7,), "float32")])
    with np.errstate(over="ignore"):
        want = _special_f64(op, xs.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_transcendental_rows_vectorise():
    """A row of exp/tanh/erf has no call left in it (what stops a compiler vectorising)."""
    x = ir.load(0, (1,), "float32")
    val = ir.Op("add", (ir.Op("exp", (x,), "float32"), ir.Op("add", (
        ir.Op("tanh", (x,), "float32"), ir.Op("erf", (x,), "float32")), "float32")), "float32")
    k = ir.Kernel("row_math", (64, 128), (), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                  (ir.store(1, (128, 1), val),))
    loop = _innermost_loop(CRenderer().render([k]))
    assert "aot_expf(" in loop and "aot_tanhf(" in loop and "aot_erff(" in loop
    assert not re.search(r"(?<![_a-z])(expf|tanhf|erff)\(", loop)


def test_a_long_float_sum_is_as_accurate_as_torch(run):
    """A row of 200,704 (GroupNorm(1, 64) over 56x56): blocks in float, blocks' sums in
    double. One float accumulator gave 1000x torch's error on that GroupNorm."""
    n = 64 * 56 * 56
    x = (rand((1, n), seed=21) + 10.0).astype(np.float32)
    idx = ir.strided_index((n, 1), (0, 1))
    k = ir.Kernel("long_sum", (1,), (n,), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                  (ir.Store(1, ir.strided_index((1,), (0,)),
                            ir.Reduce("sum", ir.Load(0, idx, "float32"), "float32")),))
    (got,) = run(k, [x], [((1,), "float32")])
    ref = x.astype(np.float64).sum()
    torch_err = abs(float(torch.from_numpy(x).sum()) - ref) / ref
    assert abs(float(got[0]) - ref) / ref <= max(2 * torch_err, 1e-7), (got, ref, torch_err)


def _lane_sum(row: np.ndarray) -> np.float32:
    """A row's float sum in the cpu renderer's defined order: per SUM_BLOCK block, element
    j into float lane j % SUM_LANES in turn, the lanes added in lane order, the blocks'
    sums in double, rounded once."""
    from aotrt.kernels.render_c import SUM_BLOCK, SUM_LANES

    total = 0.0
    for b in range(0, row.size, SUM_BLOCK):
        lanes = np.zeros(SUM_LANES, np.float32)
        for j in range(b, min(b + SUM_BLOCK, row.size)):
            lanes[j % SUM_LANES] = np.float32(lanes[j % SUM_LANES] + row[j])
        block = np.float32(0.0)
        for v in lanes:
            block = np.float32(block + v)
        total += float(block)
    return np.float32(total)


@pytest.mark.parametrize("cols", [1, 15, 16, 17, 63, 64, 65, 100, 1500])
def test_a_float_sum_adds_in_its_defined_lane_order_bit_for_bit(run, cols):
    """The vectorised sum's order is fixed by the source, not by the CPU's vector width, so
    its bits are known: rows with a partial lane group, a partial block, several blocks."""
    rows = 3
    x = (rand((rows, cols), seed=cols) * 1e3).astype(np.float32)
    idx = ir.strided_index((cols, 1), (0, 1))
    k = ir.Kernel(f"lane_sum_{cols}", (rows,), (cols,),
                  (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                  (ir.Store(1, ir.strided_index((1,), (0,)),
                            ir.Reduce("sum", ir.Load(0, idx, "float32"), "float32")),))
    (got,) = run(k, [x], [((rows,), "float32")])
    want = np.array([_lane_sum(r) for r in x], np.float32)
    assert got.tobytes() == want.tobytes(), (got, want)


def test_float_through_int64_and_back_is_a_positive_zero() -> None:
    """(float)(int64)x for x in (-1, 0) is +0.0 as in torch: gcc folds the round trip into
    truncf(x), which keeps the sign, under the cpu device's flags with -march=native."""
    import torch

    import aotrt

    class RoundTrip(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            # an explicit cast back, and an implicit one (the integer promoted by a product)
            return x.to(torch.int64).to(torch.float32) * 1.0, x.to(torch.int64) * -0.0

    x = torch.tensor([-0.75, -0.25, -0.0, 0.5, -1.5, 2.5] * 8)
    wants = [w.numpy() for w in RoundTrip()(x)]
    with aotrt.load(aotrt.export(RoundTrip(), (x,)), device="cpu") as m:
        gots = [np.asarray(g) for g in m.run(x.numpy())]
    for got, want in zip(gots, wants):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
