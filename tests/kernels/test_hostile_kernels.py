"""Generated C on the cpu device against the exact integer model (tests/kernels/int_model.py)
for hostile IR: random integer expressions over every op and dtype, narrowing and float->int
casts, overflow that must wrap, division and modulo by 0 and -1, bool arguments holding any
byte, -0.0 constants, file names that would be dangerous symbols, deep and shared IR."""

from __future__ import annotations

import random

import numpy as np
import pytest

import aotrt
from aotrt.dtypes import as_dtype
from aotrt.errors import AotrtError, InvalidArgument
from aotrt.kernels import bounds, ir, render_c
from aotrt.kernels.render_c import CRenderer
from aotrt.exporter.builder import ProgramBuilder
from aotrt.runtime import shims
from aotrt.runtime.memory import Owner, owner_scope
from tests.conftest import make_stream
from tests.kernels import int_model as m
from tests.support import bounded_steps, kernel_fn, upload

I64 = "int64"
NP = {"int64": np.int64, "int32": np.int32, "int16": np.int16, "int8": np.int8,
      "uint8": np.uint8, "bool": np.uint8, "float32": np.float32}


def _runner(device):  # noqa: ANN001, ANN202 - a fixture body
    """run(kernel, inputs, outputs) on `device`: inputs are (array, dtype) uploaded byte for
    byte."""
    s = make_stream(device, "async")
    o = Owner("hostile-kernels")

    def go(kernel: ir.Kernel, inputs: list, outputs: list[tuple]) -> list:
        with device.stream_guard(s), owner_scope(o):
            handles = []
            try:
                for arr, dt in inputs:
                    h = shims.empty_strided(list(arr.shape), None, dt, device)
                    handles.append(h)
                    upload(h, arr.view(as_dtype(dt).np) if dt == "bool" else arr)
                outs = [shims.empty_strided(list(shape), None, dt, device)
                        for shape, dt in outputs]
                handles += outs
                kernel_fn(device, kernel)(s, *handles)
                return [h.numpy() for h in outs]
            finally:
                try:
                    s.commit_and_wait()     # nothing queued may outlive its handles
                except AotrtError:
                    pass
                for h in handles:
                    shims.delete_tensor_object(h)

    yield go
    o.close()
    s.close()


@pytest.fixture
def run(cpu):
    """The runner on the cpu device."""
    yield from _runner(cpu)


@pytest.fixture
def run_dev(dev):
    """The runner on each device (cuda where present)."""
    yield from _runner(dev)


# -- random integer IR: the C computes exactly what the model says, inside the proved range --

SRC_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "bool", "float32")
ROWS, SLOTS = 16, 8


def _inputs(rng: random.Random) -> dict[str, np.ndarray]:
    out = {}
    for dt in SRC_DTYPES:
        if dt == "float32":
            vals = [rng.choice(m.FLOAT_EDGE) if rng.random() < 0.6 else rng.uniform(-1e12, 1e12)
                    for _ in range(ROWS * SLOTS)]
            out[dt] = np.array(vals, np.float32)
        elif dt == "bool":
            out[dt] = np.array([rng.choice([0, 1, 2, 200, 255]) for _ in range(ROWS * SLOTS)],
                               np.uint8)          # any byte: a bool reads as byte != 0
        else:
            lo, hi = m.RANGE[dt]
            edge = [v for v in m.EDGE if lo <= v <= hi]
            out[dt] = np.array([rng.choice(edge) if rng.random() < 0.5 else rng.randint(lo, hi)
                                for _ in range(ROWS * SLOTS)], NP[dt])
    return out


@pytest.mark.parametrize("seed", range(4))
def test_random_integer_ir_runs_as_the_model_says(run, seed) -> None:
    rng = random.Random(seed)
    arg = {dt: i for i, dt in enumerate(SRC_DTYPES)}
    row = ir.Idx(0)

    def leaf() -> ir.Expr:
        k = rng.randrange(5)
        if k == 0:
            return row
        if k == 1:
            return ir.Const(rng.choice(m.EDGE), I64)
        dt = rng.choice(SRC_DTYPES)
        slot = ir.Const(rng.randrange(SLOTS), I64)
        x = ir.Load(arg[dt], ir.Op("add", (ir.Op("mul", (row, ir.Const(SLOTS, I64)), I64),
                                           slot), I64), dt)
        return ir.Op("cast", (x,), rng.choice(m.INT_DTYPES)) if dt == "float32" else x

    gen = m.Gen(rng.randrange, leaf, safe_division=True)
    exprs = [gen.expr(rng.randint(1, 5)) for _ in range(60)]
    n = len(exprs)
    out_arg = len(SRC_DTYPES)
    stores = tuple(ir.Store(out_arg, ir.Op("add", (ir.Op("mul", (row, ir.Const(n, I64)), I64),
                                                   ir.Const(j, I64)), I64), e)
                   for j, e in enumerate(exprs))
    k = ir.Kernel(f"rand_int_{seed}", (ROWS,), (),
                  tuple(ir.Arg(dt, "r") for dt in SRC_DTYPES) + (ir.Arg(I64, "w"),), stores)
    data = _inputs(rng)
    (got,) = run(k, [(data[dt], dt) for dt in SRC_DTYPES], [((ROWS * n,), I64)])
    got = got.reshape(ROWS, n)

    def load(a: int, i: int, dt: str) -> object:
        v = data[SRC_DTYPES[a]][i]
        return float(v) if dt == "float32" else (int(v != 0) if dt == "bool" else int(v))

    for j, e in enumerate(exprs):
        lo, hi = bounds.expr_range(k, e)
        for r in range(ROWS):
            want = m.evaluate(e, [r], load)
            assert int(got[r, j]) == want, (j, r, e)
            assert lo <= want <= hi


# -- the classes of the issue ----------------------------------------------------------------


def test_the_exported_square_clamp_wraps_like_torch(run) -> None:
    """x[(i * i).clamp(0, n - 1)] with i = 3037000500: i * i wraps negative, so x[0]."""
    n = 6
    i = ir.Load(0, ir.Idx(0), I64)
    sq = ir.Op("mul", (i, i), I64)
    idx = ir.Op("minimum", (ir.Op("maximum", (sq, ir.Const(0, I64)), I64),
                            ir.Const(n - 1, I64)), I64)
    k = ir.Kernel("square_clamp", (4,), (), (ir.Arg(I64, "r"), ir.Arg("float32", "r"),
                                             ir.Arg("float32", "w")),
                  (ir.Store(2, ir.Idx(0), ir.Load(1, idx, "float32")),))
    iv = np.array([3037000500, 2, 3037000499, -3037000500], np.int64)
    x = np.arange(10, 10 + n, dtype=np.float32)
    (got,) = run(k, [(iv, I64), (x, "float32")], [((4,), "float32")])
    with np.errstate(over="ignore"):
        want = x[np.clip(iv * iv, 0, n - 1)]          # numpy's int64 wraps as torch's does
    np.testing.assert_array_equal(got, want)
    assert got[0] == x[0]


@pytest.mark.parametrize("dst", m.INT_DTYPES)
@pytest.mark.parametrize("src", m.INT_DTYPES + ("bool",))
def test_every_int_cast_wraps_and_indexes_in_bounds(run, src, dst) -> None:
    """out[i] = x[(dst)v[i] - min(dst)]: the cast result indexes a table of its whole range."""
    lo, hi = m.RANGE[dst]
    slo, shi = m.RANGE[src]
    cands = {slo, shi, 0, 1, slo + 1, shi - 1, 127, 128, 255, 256, -129, 40000, -40000,
             1 << 40, -(1 << 40) - 3}
    vals = np.array(sorted(v for v in cands if slo <= v <= shi), NP[src])
    if src == "bool":
        vals = np.array([0, 1, 200, 255], np.uint8)
    width = min(hi - lo + 1, 1 << 16)
    v = ir.Load(0, ir.Idx(0), src)
    c = ir.Op("cast", (v,), dst)
    if hi - lo + 1 > width:   # int32/int64: the value itself, no table
        k = ir.Kernel(f"cast_{src}_{dst}", (len(vals),), (), (ir.Arg(src, "r"),
                                                             ir.Arg(I64, "w")),
                      (ir.Store(1, ir.Idx(0), c),))
        (got,) = run(k, [(vals, src)], [((len(vals),), I64)])
    else:
        idx = ir.Op("sub", (c, ir.Const(lo, I64)), I64)
        k = ir.Kernel(f"cast_idx_{src}_{dst}", (len(vals),), (),
                      (ir.Arg(src, "r"), ir.Arg(I64, "r"), ir.Arg(I64, "w")),
                      (ir.Store(2, ir.Idx(0), ir.Load(1, idx, I64)),))
        crange = bounds.cast_range(m.RANGE[src], src, dst)
        assert crange == (m.RANGE[src] if lo <= slo and shi <= hi else (lo, hi))
        assert dict((a, r) for a, r, _ in bounds.kernel_accesses(k))[1] == (crange[0] - lo,
                                                                            crange[1] - lo)
        table = np.arange(lo, hi + 1, dtype=np.int64)
        (got,) = run(k, [(vals, src), (table, I64)], [((len(vals),), I64)])
    want = [m.wrap(int(x) != 0 if src == "bool" else int(x), dst) for x in vals]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dst", m.INT_DTYPES + ("bool",))
def test_float_to_int_casts_saturate(run, dst) -> None:
    xs = np.array(m.FLOAT_EDGE, np.float32)
    k = ir.Kernel(f"f2i_{dst}", (len(xs),), (), (ir.Arg("float32", "r"), ir.Arg(I64, "w")),
                  (ir.Store(1, ir.Idx(0), ir.cast(ir.cast(ir.Load(0, ir.Idx(0), "float32"),
                                                          dst), I64)),))
    (got,) = run(k, [(xs, "float32")], [((len(xs),), I64)])
    if dst == "bool":
        want = [int(x != 0) for x in xs.tolist()]
    else:
        want = [m.wrap(m.f2i(x), dst) for x in xs.tolist()]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", m.INT_DTYPES)
@pytest.mark.parametrize("op", m.DIVISIONS)
def test_int_min_by_minus_one_gives_torchs_answer(run, op, dtype) -> None:
    lo, _ = m.RANGE[dtype]
    a = np.array([lo, lo, -7, 7, lo + 1], np.int64).astype(NP[dtype])   # uint8: wrapped
    b = np.array([-1, 1, -1, -2, -1], np.int64).astype(NP[dtype])
    x, y = ir.Load(0, ir.Idx(0), dtype), ir.Load(1, ir.Idx(0), dtype)
    k = ir.Kernel(f"divm1_{op}_{dtype}", (5,), (), (ir.Arg(dtype, "r"),) * 2
                  + (ir.Arg(I64, "w"),), (ir.Store(2, ir.Idx(0), ir.Op(op, (x, y), I64)),))
    (got,) = run(k, [(a, dtype), (b, dtype)], [((5,), I64)])
    np.testing.assert_array_equal(got, [m.binary(op, int(p), int(q)) for p, q in zip(a, b)])


@pytest.mark.parametrize("dtype", m.INT_DTYPES)
@pytest.mark.parametrize("op", m.DIVISIONS)
@pytest.mark.parametrize("zero", ["input", "const"])
def test_division_by_zero_raises_instead_of_trapping(run_dev, op, dtype, zero) -> None:
    run = run_dev
    x = ir.Load(0, ir.Idx(0), dtype)
    y = ir.Load(1, ir.Idx(0), dtype) if zero == "input" else ir.Const(0, dtype)
    k = ir.Kernel(f"div0_{op}_{dtype}_{zero}", (3,), (), (ir.Arg(dtype, "r"),) * 2
                  + (ir.Arg(I64, "w"),), (ir.Store(2, ir.Idx(0), ir.Op(op, (x, y), I64)),))
    a = np.array([5, 0, 1], NP[dtype])
    b = np.array([1, 0, 1], NP[dtype])
    with pytest.raises(InvalidArgument, match="division or modulo by zero"):
        run(k, [(a, dtype), (b, dtype)], [((3,), I64)])
    # the flag is reset: the same kernel with non-zero divisors runs
    if zero == "input":
        (got,) = run(k, [(a, dtype), (np.array([1, 2, 3], NP[dtype]), dtype)], [((3,), I64)])
        np.testing.assert_array_equal(got, [m.binary(op, 5, 1), 0, m.binary(op, 1, 3)])


def test_float_operands_of_integer_division_do_not_trap(run) -> None:
    # float -> int on the way into an integer op saturates; x // 0.4 -> x // 0 is caught
    xs = np.array([np.nan, 1e30, -1e30, 7.9], np.float32)
    ys = np.array([3.0, -1.0, -1.0, 2.5], np.float32)
    x, y = ir.Load(0, ir.Idx(0), "float32"), ir.Load(1, ir.Idx(0), "float32")
    k = ir.Kernel("fdiv_int", (4,), (), (ir.Arg("float32", "r"),) * 2 + (ir.Arg(I64, "w"),),
                  (ir.Store(2, ir.Idx(0), ir.Op("floordiv", (x, y), I64)),))
    (got,) = run(k, [(xs, "float32"), (ys, "float32")], [((4,), I64)])
    want = [m.binary("floordiv", m.f2i(p), m.f2i(q)) for p, q in zip(xs.tolist(), ys.tolist())]
    np.testing.assert_array_equal(got, want)


def test_integer_reductions_wrap(run) -> None:
    big = np.array([[m.INT64_MAX, 1, 1], [m.INT64_MIN, -1, 5]], np.int64)
    x = ir.Load(0, ir.strided_index((3, 1), (0, 1)), I64)
    k = ir.Kernel("int_wrap_reduce", (2,), (3,), (ir.Arg(I64, "r"),) + (ir.Arg(I64, "w"),) * 2,
                  (ir.Store(1, ir.Idx(0), ir.Reduce("sum", x, I64)),
                   ir.Store(2, ir.Idx(0), ir.Reduce("prod", x, I64))))
    s, p = run(k, [(big, I64)], [((2,), I64)] * 2)
    np.testing.assert_array_equal(s, [m.wrap(sum(map(int, r))) for r in big])
    np.testing.assert_array_equal(p, [m.wrap(int(np.prod([int(v) for v in r], dtype=object)))
                                      for r in big])


def test_shifts_and_powers_out_of_range_are_defined(run) -> None:
    a = np.array([1, -8, 5, -1, 3, 2, 7, -3], np.int64)
    b = np.array([64, 70, -1, 63, -2, 62, 100, m.INT64_MIN], np.int64)
    x, y = ir.Load(0, ir.Idx(0), I64), ir.Load(1, ir.Idx(0), I64)
    ops = ("shl", "shr", "pow")
    k = ir.Kernel("shift_pow", (8,), (), (ir.Arg(I64, "r"),) * 2 + (ir.Arg(I64, "w"),) * 3,
                  tuple(ir.Store(2 + j, ir.Idx(0), ir.Op(op, (x, y), I64))
                        for j, op in enumerate(ops)))
    got = run(k, [(a, I64), (b, I64)], [((8,), I64)] * 3)
    for op, g in zip(ops, got):
        np.testing.assert_array_equal(g, [m.binary(op, int(p), int(q)) for p, q in zip(a, b)],
                                      err_msg=op)


def test_abs_and_neg_of_int64_min_wrap(run) -> None:
    a = np.array([m.INT64_MIN, -5, 5], np.int64)
    x = ir.Load(0, ir.Idx(0), I64)
    k = ir.Kernel("abs_neg_min", (3,), (), (ir.Arg(I64, "r"),) + (ir.Arg(I64, "w"),) * 2,
                  (ir.Store(1, ir.Idx(0), ir.Op("abs", (x,), I64)),
                   ir.Store(2, ir.Idx(0), ir.Op("neg", (x,), I64))))
    ab, ng = run(k, [(a, I64)], [((3,), I64)] * 2)
    np.testing.assert_array_equal(ab, [m.INT64_MIN, 5, 5])
    np.testing.assert_array_equal(ng, [m.INT64_MIN, 5, -5])


def test_bool_arguments_holding_any_byte_read_as_0_or_1(run) -> None:
    raw = np.array([0, 1, 2, 200, 255, 128], np.uint8)
    x = ir.Load(1, ir.cast(ir.Load(0, ir.Idx(0), "bool"), I64), "float32")
    k = ir.Kernel("bool_bytes_index", (6,), (), (ir.Arg("bool", "r"), ir.Arg("float32", "r"),
                                                 ir.Arg("float32", "w"), ir.Arg(I64, "w")),
                  (ir.Store(2, ir.Idx(0), x),
                   ir.Store(3, ir.Idx(0), ir.Op("add", (ir.Load(0, ir.Idx(0), "bool"),
                                                        ir.Const(0, I64)), I64))))
    table = np.array([10.0, 20.0], np.float32)
    got, ints = run(k, [(raw, "bool"), (table, "float32")], [((6,), "float32"), ((6,), I64)])
    np.testing.assert_array_equal(ints, (raw != 0).astype(np.int64))
    np.testing.assert_array_equal(got, table[(raw != 0).astype(np.int64)])


def test_a_bool_constant_with_bytes_200_and_255_reads_in_bounds(tmp_path) -> None:
    """Through the file: a bool constant's bytes are data; [0, 1] is what the code computes."""
    b = ProgramBuilder("BoolBytes")
    xin = b.input("x", "float32", [2])
    flags = b.constant("flags", np.array([200, 255, 0, 1], np.uint8).view(np.bool_))
    out = b.output("out", "float32", [4])
    idx = ir.cast(ir.Load(1, ir.Idx(0), "bool"), I64)
    k = ir.Kernel("k_bool_index", (4,), (), (ir.Arg("float32", "r"), ir.Arg("bool", "r"),
                                            ir.Arg("float32", "w")),
                  (ir.Store(2, ir.Idx(0), ir.Load(0, idx, "float32")),))
    b.kernel(k, [xin, flags, out])
    path = tmp_path / "bool_bytes.aotp"
    b.build().save(path)                           # the bytes go through the file
    x = np.array([3.0, 4.0], np.float32)
    with aotrt.load(str(path), device="cpu") as mod:
        (got,) = mod.run(x)
        np.testing.assert_array_equal(np.asarray(got), [4.0, 4.0, 3.0, 4.0])


def test_negative_zero_constants_are_not_conflated(run) -> None:
    xs = np.array([1.0, -2.0, 3.0], np.float32)
    x = ir.Load(0, ir.Idx(0), "float32")
    k = ir.Kernel("neg_zero", (3,), (), (ir.Arg("float32", "r"),) + (ir.Arg("float32", "w"),) * 2,
                  (ir.Store(1, ir.Idx(0), ir.Op("mul", (x, ir.Const(0.0, "float32")), "float32")),
                   ir.Store(2, ir.Idx(0), ir.Op("mul", (x, ir.Const(-0.0, "float32")),
                                                "float32"))))
    pz, nz = run(k, [(xs, "float32")], [((3,), "float32")] * 2)
    np.testing.assert_array_equal(np.signbit(pz), np.signbit(xs * np.float32(0.0)))
    np.testing.assert_array_equal(np.signbit(nz), np.signbit(xs * np.float32(-0.0)))


@pytest.mark.parametrize("name", ["__gmon_start__", "_init", "_fini", "_handle", "_name",
                                  "_func_flags_", "__x__", "malloc", "free", "aotrt_error",
                                  "aotrt_k1", "main"])
def test_kernel_names_are_labels_not_symbols(run, name) -> None:
    k = ir.Kernel(name, (3,), (), (ir.Arg(I64, "w"),),
                  (ir.Store(0, ir.Idx(0), ir.Op("add", (ir.Idx(0), ir.Const(5, I64)), I64)),))
    src = CRenderer().render([k])
    assert f"void {render_c.symbol(0)}(char **P" in src and f"void {name}(" not in src
    (got,) = run(k, [], [((3,), I64)])
    np.testing.assert_array_equal(got, [5, 6, 7])


def test_library_symbols_map_names_to_aotrt_symbols(cpu) -> None:
    ks = [ir.Kernel(n, (1,), (), (ir.Arg(I64, "w"),), (ir.Store(0, ir.Idx(0), ir.Const(j, I64)),))
          for j, n in enumerate(["zeta", "_handle", "alpha"])]
    lib = cpu.kernel_library(ks)
    assert lib.symbols == {"zeta": "aotrt_k0", "_handle": "aotrt_k1", "alpha": "aotrt_k2"}


def test_comment_label_is_sanitised() -> None:
    k = ir.Kernel("ok", (1,), (), (ir.Arg(I64, "w"),), (ir.Store(0, ir.Idx(0), ir.Const(1, I64)),))
    object.__setattr__(k, "name", "a*/ evil\nb")     # a name validate() would refuse
    src = CRenderer().render([k])
    assert "/* kernel a___evil_b */" in src and "*/ evil" not in src


def test_rendering_deep_and_shared_ir_is_linear() -> None:
    e: ir.Expr = ir.Load(0, ir.Idx(0), "float32")
    for j in range(3000):           # deep: no recursion
        e = ir.Op("add", (e, ir.Const(float(j % 7), "float32")), "float32")
    d: ir.Expr = ir.Load(0, ir.Idx(0), "float32")
    for _ in range(300):            # shared: 2**300 paths
        d = ir.Op("mul", (d, d), "float32")
    k = ir.Kernel("deep_shared", (2,), (), (ir.Arg("float32", "r"), ir.Arg("float32", "w"),
                                            ir.Arg("float32", "w")),
                  (ir.Store(1, ir.Idx(0), e), ir.Store(2, ir.Idx(0), d)))
    # Linear: a bounded number of lines per distinct node (3,300 deep, 300 shared); one walk
    # per path would run 2**300, one per level of the deep chain 3,000**2 / 2.
    with bounded_steps(500 * 3600):
        src = CRenderer().render([k])
    assert src.count(" = ((") >= 3300


def test_deep_ir_runs(run) -> None:
    e: ir.Expr = ir.Idx(0)
    for _ in range(1500):
        e = ir.Op("add", (e, ir.Const(1, I64)), I64)
    k = ir.Kernel("deep_run", (3,), (), (ir.Arg(I64, "w"),), (ir.Store(0, ir.Idx(0), e),))
    (got,) = run(k, [], [((3,), I64)])
    np.testing.assert_array_equal(got, [1500, 1501, 1502])
