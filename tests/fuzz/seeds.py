"""The fuzzer's seed programs, and a program file as (document, entries, data).

Seeds are small valid programs built with ProgramBuilder and the kernel IR: integer-heavy
(gathers, clamps, division, casts, where, reductions, shifts), float pointwise, copies and
a library op (SEEDS); format version 2 (SEEDS_V2): a stateful method, methods sharing state
and methods with their own state, built with ProgramBuilder.state and exporter.methods.merge;
library ops with geometry and packing params (SEEDS_LIB); and programs exported from torch
modules (SEEDS_EXPORTED: dynamic sizes, state shared by two methods, int8/int4 packed
weights), stored under tests/fuzz/seeds/ by tests/fuzz/exported.py. `split` and `join` take
a file apart and put it together again, with room to break the safetensors entries between.
"""

from __future__ import annotations

import base64
import functools
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from aotrt import dtypes
from aotrt.kernels import ir
from aotrt.kernels.ir import Arg, Const, Idx, Kernel, Load, Op, Reduce, Store
from aotrt.exporter.builder import ProgramBuilder
from aotrt.program import METADATA_KEY, Program

I64 = "int64"
_ST_CODE = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
            "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}

def _c(v: Any, dt: str = I64) -> Const:
    return Const(v, dt)


def _op(name: str, *args: ir.Expr, dt: str | None = None) -> Op:
    return Op(name, tuple(args), dt or args[0].dtype)


def _clamp(x: ir.Expr, lo: int, hi: int) -> ir.Expr:
    return _op("minimum", _op("maximum", x, _c(lo)), _c(hi))


def _k(name: str, shape: tuple, args: tuple, stores: tuple, rshape: tuple = ()) -> Kernel:
    return Kernel(name, shape, rshape, args, stores)


# ---------------------------------------------------------------------------------------------
# seeds


def seed_gather() -> Program:
    """out[i] = x[clamp(idx[i], 0, 7)] and out2[i] = x[clamp(i*i*idx, 0, 7)]."""
    b = ProgramBuilder("gather")
    x = b.input("x", "float32", [8])
    idx = b.input("idx", I64, [5])
    o = b.output("o", "float32", [5])
    o2 = b.output("o2", "float32", [5])
    li = Load(1, Idx(0), I64)
    k = _k("gather", (5,), (Arg("float32", "r"), Arg(I64, "r"), Arg("float32", "w"),
                           Arg("float32", "w")),
           (Store(2, Idx(0), Load(0, _clamp(li, 0, 7), "float32")),
            Store(3, Idx(0), Load(0, _clamp(_op("mul", _op("mul", Idx(0), Idx(0)), li), 0, 7),
                                  "float32"))))
    b.kernel(k, [x, idx, o, o2])
    return b.build()


def seed_division() -> Program:
    """Every integer division op of a and b, int64 and int32."""
    b = ProgramBuilder("division")
    a = b.input("a", I64, [3, 4])
    d = b.input("d", I64, [3, 4])
    ops = ("floordiv", "truncdiv", "mod", "fmod")
    outs = [b.output(f"o_{n}", I64, [3, 4]) for n in ops]
    o32 = b.output("o32", "int32", [3, 4])
    la, ld = ir.load(0, [4, 1], I64), ir.load(1, [4, 1], I64)
    stores = tuple(ir.store(2 + j, [4, 1], _op(n, la, ld)) for j, n in enumerate(ops))
    stores += (ir.store(6, [4, 1], _op("floordiv", ir.cast(la, "int32"),
                                       _op("maximum", ld, _c(1)), dt="int32")),)
    k = _k("div", (3, 4), (Arg(I64, "r"), Arg(I64, "r"), *(Arg(I64, "w"),) * 4,
                           Arg("int32", "w")), stores)
    b.kernel(k, [a, d, *outs, o32])
    return b.build()


def seed_casts() -> Program:
    """x cast to every narrower int, bool and half type; f cast to ints (saturating)."""
    b = ProgramBuilder("casts")
    x = b.input("x", I64, [16])
    f = b.input("f", "float32", [16])
    dts = ("int32", "int16", "int8", "uint8", "bool", "float16", "bfloat16")
    outs = [b.output(f"o_{d}", d, [16]) for d in dts]
    fouts = [b.output(f"f_{d}", d, [16]) for d in ("int64", "int8", "uint8", "bool")]
    lx, lf = Load(0, Idx(0), I64), Load(1, Idx(0), "float32")
    stores = tuple(Store(2 + j, Idx(0), ir.cast(lx, d)) for j, d in enumerate(dts))
    stores += tuple(Store(2 + len(dts) + j, Idx(0), ir.cast(lf, d))
                    for j, d in enumerate(("int64", "int8", "uint8", "bool")))
    args = (Arg(I64, "r"), Arg("float32", "r"), *(Arg(d, "w") for d in dts),
            *(Arg(d, "w") for d in ("int64", "int8", "uint8", "bool")))
    b.kernel(_k("casts", (16,), args, stores), [x, f, *outs, *fouts])
    return b.build()


def seed_narrow_index() -> Program:
    """x[(int8)i + 128] (wrapping cast, in bounds) and x[clamp(i * i, 0, 255)]."""
    b = ProgramBuilder("narrow")
    x = b.input("x", "int32", [256])
    o = b.output("o", "int32", [200])
    o2 = b.output("o2", "int32", [200])
    i8 = _op("add", ir.cast(ir.cast(Idx(0), "int8"), I64), _c(128))
    k = _k("narrow", (200,), (Arg("int32", "r"), Arg("int32", "w"), Arg("int32", "w")),
           (Store(1, Idx(0), Load(0, i8, "int32")),
            Store(2, Idx(0), Load(0, _clamp(_op("mul", Idx(0), Idx(0)), 0, 255), "int32"))))
    b.kernel(k, [x, o, o2])
    return b.build()


def seed_where_clamp() -> Program:
    """where(x > 0, min(x, 100), max(y, -100)) on int16, and a float where with NaN."""
    b = ProgramBuilder("where")
    x = b.input("x", "int16", [2, 6])
    y = b.input("y", "int16", [2, 6])
    f = b.input("f", "float32", [2, 6])
    o = b.output("o", "int16", [2, 6])
    of = b.output("of", "float32", [2, 6])
    lx, ly = ir.load(0, [6, 1], "int16"), ir.load(1, [6, 1], "int16")
    lf = ir.load(2, [6, 1], "float32")
    # where's dtype is its branches' (_op would take the bool condition's): int16, float32
    v = _op("where", _op("gt", lx, _c(0, "int16"), dt="bool"),
            _op("minimum", lx, _c(100, "int16")), _op("maximum", ly, _c(-100, "int16")),
            dt="int16")
    vf = _op("where", _op("isnan", lf, dt="bool"), _c(-0.0, "float32"),
             _op("mul", lf, _c(-0.0, "float32")), dt="float32")
    k = _k("where", (2, 6), (Arg("int16", "r"), Arg("int16", "r"), Arg("float32", "r"),
                             Arg("int16", "w"), Arg("float32", "w")),
           (ir.store(3, [6, 1], v), ir.store(4, [6, 1], vf)))
    b.kernel(k, [x, y, f, o, of])
    return b.build()


def seed_reduce() -> Program:
    """Row sum/prod/max/min of int64, float sum and max, bool any/all."""
    b = ProgramBuilder("reduce")
    x = b.input("x", I64, [4, 5])
    f = b.input("f", "float32", [4, 5])
    m = b.input("m", "bool", [4, 5])
    names = ("sum", "prod", "max", "min")
    outs = [b.output(f"i_{n}", I64, [4]) for n in names]
    fo = [b.output(f"f_{n}", "float32", [4]) for n in ("sum", "max")]
    bo = [b.output(f"b_{n}", "bool", [4]) for n in ("any", "all")]
    lx = Load(0, _op("add", _op("mul", Idx(0), _c(5)), Idx(1)), I64)
    lf = Load(1, _op("add", _op("mul", Idx(0), _c(5)), Idx(1)), "float32")
    lm = Load(2, _op("add", _op("mul", Idx(0), _c(5)), Idx(1)), "bool")
    stores = tuple(Store(3 + j, Idx(0), Reduce(n, lx, I64)) for j, n in enumerate(names))
    stores += (Store(7, Idx(0), Reduce("sum", lf, "float32")),
               Store(8, Idx(0), Reduce("max", lf, "float32")),
               Store(9, Idx(0), Reduce("any", lm, "bool")),
               Store(10, Idx(0), Reduce("all", lm, "bool")))
    args = (Arg(I64, "r"), Arg("float32", "r"), Arg("bool", "r"), *(Arg(I64, "w"),) * 4,
            *(Arg("float32", "w"),) * 2, *(Arg("bool", "w"),) * 2)
    b.kernel(_k("reduce", (4,), args, stores, (5,)), [x, f, m, *outs, *fo, *bo])
    return b.build()


def seed_softmax() -> Program:
    """A softmax over rows (reduce, then an inner store), stored as float16."""
    b = ProgramBuilder("softmax")
    x = b.input("x", "float32", [3, 4])
    o = b.output("o", "float16", [3, 4])
    lx = Load(0, _op("add", _op("mul", Idx(0), _c(4)), Idx(1)), "float32")
    mx = Reduce("max", lx, "float32")
    e = _op("exp", _op("sub", lx, mx))
    s = Reduce("sum", e, "float32")
    k = _k("softmax", (3,), (Arg("float32", "r"), Arg("float16", "w")),
           (Store(1, _op("add", _op("mul", Idx(0), _c(4)), Idx(1)), _op("div", e, s)),), (4,))
    b.kernel(k, [x, o])
    return b.build()


def seed_float_pointwise() -> Program:
    """Unary float ops chained, stored as float32 and bfloat16."""
    b = ProgramBuilder("pointwise")
    x = b.input("x", "float32", [12])
    o = b.output("o", "float32", [12])
    o2 = b.output("o2", "bfloat16", [12])
    lx = Load(0, Idx(0), "float32")
    v = _op("add", _op("tanh", lx), _op("sigmoid", _op("neg", lx)))
    v2 = _op("maximum", _op("floor", lx), _op("sqrt", _op("abs", lx)))
    k = _k("pw", (12,), (Arg("float32", "r"), Arg("float32", "w"), Arg("bfloat16", "w")),
           (Store(1, Idx(0), v), Store(2, Idx(0), v2)))
    b.kernel(k, [x, o, o2])
    return b.build()


def seed_bits() -> Program:
    """Shifts, pow, bitwise ops and bool loads of an int64 and a bool input."""
    b = ProgramBuilder("bits")
    x = b.input("x", I64, [10])
    s = b.input("s", I64, [10])
    m = b.input("m", "bool", [10])
    o = b.output("o", I64, [10])
    o2 = b.output("o2", I64, [10])
    o3 = b.output("o3", "uint8", [10])
    lx, ls, lm = Load(0, Idx(0), I64), Load(1, Idx(0), I64), Load(2, Idx(0), "bool")
    v = _op("bitwise_xor", _op("shl", lx, ls), _op("shr", lx, ls))
    v2 = _op("pow", lx, _op("bitwise_and", ls, _c(7)))
    v3 = _op("where", lm, ir.cast(lx, "uint8"), ir.cast(_op("bitwise_not", lx), "uint8"),
             dt="uint8")
    k = _k("bits", (10,), (Arg(I64, "r"), Arg(I64, "r"), Arg("bool", "r"), Arg(I64, "w"),
                           Arg(I64, "w"), Arg("uint8", "w")),
           (Store(3, Idx(0), v), Store(4, Idx(0), v2), Store(5, Idx(0), v3)))
    b.kernel(k, [x, s, m, o, o2, o3])
    return b.build()


def seed_const_index() -> Program:
    """x[cast(c[i], int64)] through a bool constant and y[k[i]] through an int8 constant."""
    b = ProgramBuilder("constidx")
    x = b.input("x", "float32", [2])
    y = b.input("y", "float32", [8])
    c = b.constant("c", np.array([True, False, True, True]))
    kk = b.constant("k", np.array([0, 7, 3, 5], np.int8))
    o = b.output("o", "float32", [4])
    o2 = b.output("o2", "float32", [4])
    k = _k("constidx", (4,), (Arg("float32", "r"), Arg("float32", "r"), Arg("bool", "r"),
                              Arg("int8", "r"), Arg("float32", "w"), Arg("float32", "w")),
           (Store(4, Idx(0), Load(0, ir.cast(Load(2, Idx(0), "bool"), I64), "float32")),
            Store(5, Idx(0), Load(1, _clamp(ir.cast(Load(3, Idx(0), "int8"), I64), 0, 7),
                                  "float32"))))
    b.kernel(k, [x, y, c, kk, o, o2])
    return b.build()


def seed_copy_fill() -> Program:
    """fill an arena buffer (a copy of a constant), copy an input into a strided view of it,
    a kernel reads it back."""
    b = ProgramBuilder("copyfill")
    x = b.input("x", "int32", [3, 2])
    o = b.output("o", "int32", [3, 4])
    buf = b.buffer(48)
    whole = b.in_buffer(buf, 0, "int32", [3, 4])
    part = b.in_buffer(buf, 4, "int32", [3, 2], [4, 1])
    b.copy(whole, b.constant("sevens", np.full((3, 4), 7, np.int32)))
    b.copy(part, x)
    k = _k("readback", (3, 4), (Arg("int32", "r"), Arg("int32", "w")),
           (ir.store(1, [4, 1], _op("add", ir.load(0, [4, 1], "int32"), _c(1, "int32"))),))
    b.kernel(k, [whole, o])
    return b.build()


def seed_mm() -> Program:
    """mm of two inputs, then a kernel adds a bias constant (a library op and a kernel)."""
    b = ProgramBuilder("mm")
    a = b.input("a", "float32", [4, 3])
    w = b.constant("w", np.arange(15, dtype=np.float32).reshape(3, 5) / 7)
    bias = b.constant("bias", np.linspace(-1, 1, 5, dtype=np.float32))
    o = b.output("o", "float32", [4, 5])
    buf = b.buffer(80)
    t = b.in_buffer(buf, 0, "float32", [4, 5])
    b.library("mm", [t], [a, w])
    k = _k("bias", (4, 5), (Arg("float32", "r"), Arg("float32", "r"), Arg("float32", "w")),
           (ir.store(2, [5, 1], _op("add", ir.load(0, [5, 1], "float32"),
                                    ir.load(1, [0, 1], "float32"))),))
    b.kernel(k, [t, bias, o])
    return b.build()


def _stateful(b: ProgramBuilder, scale: float) -> None:
    """The body of seed_state: an accumulator, a counter and a ring read at a clamped index
    that depends on the counter (state written in place, read by the next run)."""
    x = b.input("x", "float32", [6])
    i = b.input("i", I64, [3])
    acc = b.state("acc", np.zeros(6, np.float32))
    ring = b.state("ring", np.array([5, -3, 7, 2**31 - 1], np.int32))
    count = b.state("count", np.zeros(1, np.int64))
    o = b.output("o", "float32", [6])
    o_ring = b.output("o_ring", "int32", [3])
    o_count = b.output("o_count", I64, [1])
    lx = Load(0, Idx(0), "float32")
    b.kernel(_k("acc", (6,), (Arg("float32", "r"), Arg("float32", "rw")),
                (Store(1, Idx(0), _op("add", Load(1, Idx(0), "float32"),
                                      _op("mul", lx, _c(scale, "float32")))),)), [x, acc])
    b.kernel(_k("count", (1,), (Arg(I64, "rw"),),
                (Store(0, Idx(0), _op("add", Load(0, Idx(0), I64), _c(1))),)), [count])
    at = _clamp(_op("add", Load(0, Idx(0), I64), Load(2, _c(0), I64)), 0, 3)
    b.kernel(_k("ring_at", (3,), (Arg(I64, "r"), Arg("int32", "r"), Arg(I64, "r"),
                                  Arg("int32", "w")),
                (Store(3, Idx(0), Load(1, at, "int32")),)), [i, ring, count, o_ring])
    # ring = ring * 3 + 1, wrapping in int32
    b.kernel(_k("ring_step", (4,), (Arg("int32", "rw"),),
                (Store(0, Idx(0), _op("add", _op("mul", Load(0, Idx(0), "int32"),
                                                 _c(3, "int32")), _c(1, "int32"))),)), [ring])
    b.copy(o, acc)
    b.copy(o_count, count)


def seed_state() -> Program:
    """One stateful method (format version 2, method "forward")."""
    b = ProgramBuilder("state")
    _stateful(b, 0.5)
    return b.build()


def _cache_method(which: str) -> Program:
    """prefill (x -> cache[0:4], pos = 4, o = sum(cache)), decode (cache[clamp(pos)] = y,
    pos += 1, o = cache) or peek (o = cache[1::2], a strided state view at byte 4)."""
    b = ProgramBuilder(which)
    cache = b.state("cache", np.zeros(8, np.float32))
    pos = b.state("pos", np.zeros(1, np.int64))
    if which == "prefill":
        x = b.input("x", "float32", [4])
        b.copy(b.tensor("state", 0, 0, "float32", [4]), x)
        b.kernel(_k("set_pos", (1,), (Arg(I64, "w"),), (Store(0, Idx(0), _c(4)),)), [pos])
        o = b.output("o", "float32", [1])
        b.kernel(_k("total", (1,), (Arg("float32", "r"), Arg("float32", "w")),
                    (Store(1, Idx(0), Reduce("sum", Load(0, Idx(1), "float32"), "float32")),),
                    (8,)), [cache, o])
    elif which == "decode":
        y = b.input("y", "float32", [1])
        at = _clamp(Load(0, _c(0), I64), 0, 7)
        b.kernel(_k("put", (1,), (Arg(I64, "r"), Arg("float32", "r"), Arg("float32", "w")),
                    (Store(2, at, Load(1, Idx(0), "float32")),)), [pos, y, cache])
        b.kernel(_k("step", (1,), (Arg(I64, "rw"),),
                    (Store(0, Idx(0), _op("add", Load(0, Idx(0), I64), _c(1))),)), [pos])
        o = b.output("o", "float32", [8])
        b.copy(o, cache)
    else:
        o = b.output("o", "float32", [4])
        b.copy(o, b.tensor("state", 0, 4, "float32", [4], [2]))
    return b.build()


def seed_methods_shared() -> Program:
    """Three methods sharing a cache and a position (format version 2)."""
    from aotrt.exporter.methods import merge
    return merge({m: _cache_method(m) for m in ("prefill", "decode", "peek")},
                 share_state=True)


def seed_methods_own() -> Program:
    """Two methods of seed_state's body, each with its own state (`a.acc`, `b.acc`, ...)."""
    from aotrt.exporter.methods import merge
    methods = {}
    for name, scale in (("a", 0.5), ("b", -2.0)):
        b = ProgramBuilder("own")
        _stateful(b, scale)
        methods[name] = b.build()
    return merge(methods, share_state=False)


def _lib_seed(name: str, fn: str, x_shape: list, out_shapes: list, params: dict,
              weight: np.ndarray | None = None, out_dtypes: tuple = ("float32",)) -> Program:
    """One library op over an input (and a constant weight), straight into the outputs."""
    b = ProgramBuilder(name)
    x = b.input("x", "float32", x_shape)
    ins: list = [x]
    if weight is not None:
        ins += [b.constant("w", weight), None]
    outs = [b.output(f"o{i}", dt, shape) for i, (shape, dt) in
            enumerate(zip(out_shapes, out_dtypes))]
    b.library(fn, outs, ins, params)
    return b.build()


def seed_lib_pool() -> Program:
    """max_pool2d 3x3 stride 2 padding 1 over [1, 4, 12, 12], with indices."""
    return _lib_seed("lib_pool", "max_pool2d", [1, 4, 12, 12], [[1, 4, 6, 6]] * 2,
                     {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1],
                      "dilation": [1, 1], "ceil_mode": False},
                     out_dtypes=("float32", "int64"))


def seed_lib_conv() -> Program:
    """A grouped, dilated, strided 3x3 convolution over [1, 4, 10, 10]."""
    w = (np.arange(4 * 2 * 9, dtype=np.float32).reshape(4, 2, 3, 3) % 7 - 3) / 5
    return _lib_seed("lib_conv", "convolution", [1, 4, 10, 10], [[1, 4, 4, 4]],
                     {"stride": [2, 2], "padding": [1, 1], "dilation": [2, 2],
                      "transposed": False, "output_padding": [0, 0], "groups": 2}, w)


def seed_lib_upsample() -> Program:
    """upsample_nearest2d of [1, 2, 5, 5] to 10x15."""
    return _lib_seed("lib_upsample", "upsample_nearest2d", [1, 2, 5, 5], [[1, 2, 10, 15]],
                     {"output_size": [10, 15], "scale_factors": None})


def seed_lib_topk() -> Program:
    """topk 3 of [4, 9] along the last dim."""
    return _lib_seed("lib_topk", "topk", [4, 9], [[4, 3]] * 2,
                     {"k": 3, "dim": -1, "largest": True, "sorted": True},
                     out_dtypes=("float32", "int64"))


def seed_lib_linear_wq() -> Program:
    """linear_wq of int4 weights in groups of 32: [2, 64] x [8, 64] with scales and zeros."""
    b = ProgramBuilder("lib_linear_wq")
    x = b.input("x", "float32", [2, 64])
    q = (np.arange(8 * 32, dtype=np.int64) * 37 % 256).astype(np.uint8).reshape(8, 32)
    s = (np.arange(16, dtype=np.float32).reshape(8, 2) % 5 + 1) / 64
    z = (np.arange(16, dtype=np.float32).reshape(8, 2) % 16)
    ins = [x, b.constant("q", q), b.constant("s", s), b.constant("z", z), None]
    b.library("linear_wq", [b.output("o0", "float32", [2, 8])], ins,
              {"bits": 4, "group_size": 32})
    return b.build()


SEEDS: dict[str, Callable[[], Program]] = {
    f.__name__[5:]: f for f in (seed_gather, seed_division, seed_casts, seed_narrow_index,
                                seed_where_clamp, seed_reduce, seed_softmax, seed_float_pointwise,
                                seed_bits, seed_const_index, seed_copy_fill, seed_mm)}
#: format version 2 seeds (state, several methods); kept apart from SEEDS so that the mutants
#: of the version-1 seeds keep their ids (see `mutant`)
SEEDS_V2: dict[str, Callable[[], Program]] = {
    f.__name__[5:]: f for f in (seed_state, seed_methods_shared, seed_methods_own)}
#: library ops with geometry params (pooling, convolution, upsampling, topk), mutated at the
#: params' extremes; drawn from a stream of their own from master LIB_FROM_MASTER on, so
#: that the mutants of earlier campaigns keep their ids
SEEDS_LIB: dict[str, Callable[[], Program]] = {
    f.__name__[5:]: f for f in (seed_lib_pool, seed_lib_conv, seed_lib_upsample,
                                seed_lib_topk, seed_lib_linear_wq)}

SEED_DIR = Path(__file__).resolve().parent / "seeds"


@functools.lru_cache(maxsize=None)
def _stored_record(name: str) -> str:
    return (SEED_DIR / f"{name}.json").read_text()


def stored_seed(name: str) -> Program:
    """The exported seed `name` as tests/fuzz/exported.py stored it (validated on load)."""
    rec = json.loads(_stored_record(name))
    arrays = {n: np.frombuffer(base64.b64decode(c["data"]), dtypes.as_dtype(c["dtype"]).np)
              .reshape(c["shape"]).copy() for n, c in rec["constants"].items()}
    return Program.from_json(rec["document"], arrays)


#: programs exported from torch modules (tests/fuzz/exported.py): a dynamic method of two
#: symbols, two methods sharing state, int8/int4 linears and embeddings; drawn from a stream
#: of their own from master EXPORTED_FROM_MASTER (tests/fuzz/mutate.py) on
SEEDS_EXPORTED: dict[str, Callable[[], Program]] = {
    name: functools.partial(stored_seed, name)
    for name in ("exp_dynamic", "exp_state", "exp_quantized")}


# ---------------------------------------------------------------------------------------------
# the file: (document, tensors) <-> bytes, with room to break the safetensors entries


def split(prog: Program) -> tuple[dict, dict, bytes]:
    """(program document, safetensors tensor entries, data bytes) of a Program."""
    doc = prog.to_json()
    entries: dict[str, dict] = {}
    data = b""
    for name, arr in prog.constants.items():
        raw = np.ascontiguousarray(arr).tobytes()
        entries[name] = {"dtype": _ST_CODE[ir_dtype(arr)], "shape": list(arr.shape),
                         "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    return doc, entries, data


def ir_dtype(arr: np.ndarray) -> str:
    """The aotrt dtype name of a numpy array."""
    from aotrt import dtypes
    return dtypes.as_dtype(arr.dtype).name


def join(doc: Any, entries: Any, data: bytes, doc_text: str | None = None) -> bytes:
    """The file bytes of a document, safetensors entries and data (NaN allowed in the JSON)."""
    header = dict(entries) if isinstance(entries, dict) else {"x": entries}
    text = doc_text if doc_text is not None else json.dumps(doc)
    header = {"__metadata__": {METADATA_KEY: text}, **header}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return len(h).to_bytes(8, "little") + h + data
