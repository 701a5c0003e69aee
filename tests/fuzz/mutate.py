"""Seed programs and structure-aware mutators of program files.

Seeds are small valid programs built with ProgramBuilder and the kernel IR: integer-heavy
(gathers, clamps, division, casts, where, reductions, shifts), float pointwise, copies and
a library op; and format version 2 (SEEDS_V2): a stateful method, methods sharing state and
methods with their own state, built with ProgramBuilder.state and exporter.methods.merge.
A mutant is a seed's file bytes changed at one to three places: raw header
bytes, JSON values by type, list and dict structure, safetensors entries, constant data,
truncation, or an IR node wrapped in a random op; a version-2 seed's also the state specs,
the methods table and the tensors' state roots.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any, Callable

import numpy as np

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


# ---------------------------------------------------------------------------------------------
# mutators

INTS = [0, 1, -1, 2, 3, 7, 8, 255, 256, -128, 127, 2**15, 2**31 - 1, 2**31, -2**31, 2**32,
        2**62, 2**63 - 1, 2**63, -2**63, -2**63 - 1, 2**64]
FLOATS = [0.5, -0.0, 1.5, 1e308, -1e308, 3.4e38, float("nan"), float("inf"), float("-inf")]
STRINGS = ["", "x", "float32", "int8", "int64", "uint8", "bool", "float16", "bfloat16", "arena",
           "input", "output", "constant", "kernel", "copy", "fill", "library", "mm", "Op", "Load",
           "Const", "Idx", "cast", "where", "floordiv", "__gmon_start__", "_handle", "r", "w",
           "rw", "a" * 300, "\u00e9", "sum", "max"]
OPS_WRAP = ["neg", "abs", "bitwise_not", "relu", "sign"]
BIN_WRAP = ["add", "sub", "mul", "floordiv", "truncdiv", "mod", "fmod", "maximum", "minimum",
            "shl", "shr", "pow", "bitwise_and", "bitwise_xor"]


def _paths(node: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out.extend(_paths(v, path + (k,)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(_paths(v, path + (i,)))
    return out


def _get(node: Any, path: tuple) -> Any:
    for p in path:
        node = node[p]
    return node


def _set(root: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    _get(root, path[:-1])[path[-1]] = value
    return root


def _value_like(rng: random.Random, old: Any) -> Any:
    r = rng.random()
    if isinstance(old, bool) or r < 0.1:
        return rng.choice([True, False, None, [], {}, rng.choice(STRINGS), rng.choice(INTS)])
    if isinstance(old, int):
        if r < 0.5:
            return rng.choice([old + 1, old - 1, -old, old * 2, old + 2**31, old * 2**32,
                               old ^ 1, 0])
        return rng.choice(INTS + [rng.choice(FLOATS)])
    if isinstance(old, float):
        return rng.choice(FLOATS + [old * -1, old + 1, int(old) if old == old and
                                    abs(old) < 1e18 else 0])
    if isinstance(old, str):
        return rng.choice(STRINGS + [old + "x", old[:-1], old.upper()])
    return rng.choice(INTS + FLOATS + STRINGS + [None])


def mutate_json_value(rng: random.Random, doc: Any) -> Any:
    """Replace one leaf value of the document by a typed neighbour or an edge value."""
    paths = [p for p in _paths(doc) if p and not isinstance(_get(doc, p), (dict, list))]
    if not paths:
        return doc
    p = rng.choice(paths)
    return _set(doc, p, _value_like(rng, _get(doc, p)))


def mutate_structure(rng: random.Random, doc: Any) -> Any:
    """Drop, duplicate, swap or nest one list element or dict entry."""
    paths = [p for p in _paths(doc) if isinstance(_get(doc, p), (dict, list)) and _get(doc, p)]
    if not paths:
        return doc
    p = rng.choice(paths)
    node = _get(doc, p)
    how = rng.choice(["drop", "dup", "swap", "nest", "extra"])
    if isinstance(node, list):
        i = rng.randrange(len(node))
        if how == "drop":
            del node[i]
        elif how == "dup":
            node.insert(i, copy.deepcopy(node[i]))
        elif how == "swap":
            j = rng.randrange(len(node))
            node[i], node[j] = node[j], node[i]
        elif how == "nest":
            node[i] = [node[i]]
        else:
            node.append(copy.deepcopy(rng.choice(node)))
    else:
        k = rng.choice(list(node))
        if how == "drop":
            del node[k]
        elif how in ("dup", "extra"):
            node[k + "_" if rng.random() < 0.5 else "zz"] = copy.deepcopy(node[k])
        elif how == "swap":
            k2 = rng.choice(list(node))
            node[k], node[k2] = node[k2], node[k]
        else:
            node[k] = [node[k]]
    return doc


def _expr_paths(doc: dict) -> list[tuple]:
    out = []
    for p in _paths(doc):
        if p and p[0] == "kernels":
            n = _get(doc, p)
            if isinstance(n, dict) and n.get("t") in ("Op", "Load", "Const", "Idx", "Reduce"):
                out.append(p)
    return out


def _wrap(rng: random.Random, e: dict) -> dict:
    dt = e.get("dtype", I64)
    if not isinstance(dt, str):
        dt = I64
    isint = dt in ir.INT_DTYPES
    cdt = dt if dt in ir.DTYPES else I64

    def const(v: Any) -> dict:
        if cdt == "bool":
            v = bool(v)
        elif cdt in ir.FLOAT_DTYPES:
            v = float(v)
        else:
            lo, hi = ir.INT_RANGE[cdt]
            v = max(lo, min(hi, int(v)))
        return {"t": "Const", "value": v, "dtype": cdt}

    def op(name: str, args: list, d: str = cdt) -> dict:
        return {"t": "Op", "op": name, "args": args, "dtype": d}

    r = rng.random()
    if r < 0.3:
        narrow = rng.choice(["int8", "int16", "int32", "uint8", "bool", "float16", "float32",
                             I64])
        inner = op("cast", [e], narrow)
        return op("cast", [inner], cdt) if rng.random() < 0.8 else inner
    if r < 0.4:
        return op(rng.choice(OPS_WRAP), [e])
    if r < 0.8:
        name = rng.choice(BIN_WRAP if isint else ["add", "mul", "sub", "div", "maximum",
                                                  "minimum", "floordiv", "mod", "pow"])
        val = rng.choice([0, -1, 1, 2, 3, 7, 63, 64, 2**31, 3037000500, 2**62, -2**63, 2**63 - 1])
        args = [e, const(val)]
        if rng.random() < 0.3:
            args.reverse()
        return op(name, args)
    if r < 0.9:
        cond = op("gt", [e, const(0)], "bool")
        return op("where", [cond, e, const(rng.choice([0, -1, 2**62, 255]))])
    return op(rng.choice(["minimum", "maximum"]), [e, const(rng.choice([0, 7, -1, 2**31]))])


def mutate_ir(rng: random.Random, doc: Any) -> Any:
    """Wrap one IR expression node of a kernel in a random op (mostly dtype preserving)."""
    paths = _expr_paths(doc) if isinstance(doc, dict) else []
    if not paths:
        return doc
    p = rng.choice(paths)
    return _set(doc, p, _wrap(rng, _get(doc, p)))


#: values of every JSON type, for a field that wants another (issue 34 item 5)
WRONG_TYPES: list[Any] = [None, True, False, 1.5, -1, 2**70, "x", "", [], [1], ["x"], [None],
                          {}, {"t": "Idx"}, {"t": "float", "v": "nan"},
                          {"t": "Arg", "dtype": "float32", "mode": "r"}]


def mutate_ir_field(rng: random.Random, doc: Any) -> Any:
    """Give one field of one IR node of any type (Kernel, Arg, Store and the expressions) a
    value of a wrong type, or one entry of a list field: the parser must name the field."""
    paths = [p for p in _paths(doc) if p and p[0] == "kernels"
             and isinstance(_get(doc, p), dict) and isinstance(_get(doc, p).get("t"), str)
             and _get(doc, p)["t"] in ir.FIELDS]
    if not paths:
        return doc
    node = _get(doc, rng.choice(paths))
    field = rng.choice(sorted(ir.FIELDS[node["t"]]))
    old = node.get(field)
    if isinstance(old, list) and old and rng.random() < 0.5:
        old[rng.randrange(len(old))] = rng.choice(WRONG_TYPES)
    else:
        node[field] = copy.deepcopy(rng.choice(WRONG_TYPES))
    return doc


def mutate_entries(rng: random.Random, entries: dict) -> dict:
    """Break one safetensors entry: its dtype, shape or data_offsets."""
    if not entries:
        return {"extra": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    name = rng.choice(list(entries))
    e = entries[name]
    field = rng.choice(["dtype", "shape", "data_offsets"])
    if field == "dtype":
        e["dtype"] = rng.choice(list(_ST_CODE.values()) + ["F64", "I128", ["F32"], 3, None])
    elif field == "shape":
        # An earlier mutation of the same entry may have left any value here.
        shape = e["shape"] if isinstance(e.get("shape"), list) else []
        e["shape"] = rng.choice([[], [0], [2**31], [2**62], [-1], shape + [1],
                                 shape[::-1], [1.5], "x"])
    else:
        offs = e.get("data_offsets")
        ok = isinstance(offs, list) and len(offs) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in offs)
        b0, b1 = offs if ok else (0, 4)
        e["data_offsets"] = rng.choice([[b0, b1 + 1], [b0 + 1, b1 + 1], [b1, b0], [0, b1 - b0],
                                        [b0, 2**63], [-8, b1], [b0], [b0, b1, 0]])
    return entries


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    """Raw damage: flip bytes in the header, change its length field, or truncate."""
    b = bytearray(data)
    r = rng.random()
    if r < 0.3:
        return bytes(b[:rng.randrange(len(b))])
    if r < 0.45:
        n = int.from_bytes(b[:8], "little")
        b[:8] = (rng.choice([0, 1, n - 1, n + 1, n + 8, 2**63, 2**64 - 1]) %
                 2**64).to_bytes(8, "little")
        return bytes(b)
    n = int.from_bytes(b[:8], "little")
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(8, min(len(b), 8 + n) or 9) if len(b) > 8 else 0
        b[i] = rng.choice([0, 0x22, 0x5b, 0x5d, 0x7b, 0x7d, 0x2c, 0x30, 0x39, 0x2d, 0xff,
                           rng.randrange(256)])
    return bytes(b)


def mutate_data(rng: random.Random, data: bytes) -> bytes:
    """Change constant data bytes (a bool byte of 200, an index out of range, ...)."""
    if not data:
        return data
    b = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        b[rng.randrange(len(b))] = rng.choice([2, 128, 200, 255, 0x7f, 0x80, 1, 0])
    return bytes(b)


_DTYPES = ["float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"]


def mutate_state_spec(rng: random.Random, doc: Any) -> Any:
    """Change one state entry's dtype, shape, init or name, or drop or add a key."""
    table = doc.get("state") if isinstance(doc, dict) else None
    if not isinstance(table, list) or not table or not isinstance(table[0], dict):
        return doc
    e = table[rng.randrange(len(table))]
    if not isinstance(e, dict):
        return doc
    names = [x.get("name") for x in table if isinstance(x, dict)]
    consts = [c.get("name") for c in doc.get("constants", []) if isinstance(c, dict)]
    field = rng.choice(["dtype", "shape", "shape", "init", "name", "keys"])
    if field == "dtype":
        e["dtype"] = rng.choice(_DTYPES + ["complex64", "float64", 3, None, ["float32"]])
    elif field == "shape":
        old = e.get("shape") if isinstance(e.get("shape"), list) else [1]
        n = old[0] if old and isinstance(old[0], int) else 1
        e["shape"] = rng.choice([old + [1], old[:-1], [n + 1, *old[1:]], [max(n - 1, 0),
                                 *old[1:]], [0], [], [2 * n], [2**31], [-1], [2**31 - 1] * 2,
                                 [1.5], "4", None, [1] * 65, [True], old[::-1]])
    elif field == "init":
        e["init"] = rng.choice([None, None, "nope", 0, [], {}, *consts, *names])
    elif field == "name":
        e["name"] = rng.choice([*names, "", 5, None, f"{e.get('name')}x", ["acc"]])
    elif rng.random() < 0.5 and e:
        del e[rng.choice(list(e))]
    else:
        e[rng.choice(["strides", "init_", "shared", "nbytes"])] = rng.choice([0, None, [1]])
    return doc


_METHOD_FIELDS = ("inputs", "outputs", "arena", "tensors", "instructions", "outputs_tensors")
_METHOD_NAMES = ["forward", "m2", "_", "a" * 64, "a" * 65, "", "1a", "a-b", "a b", "\u00e9t\u00e9",
                 "__init__", "prefill", "decode", "a", "b"]


def mutate_methods(rng: random.Random, doc: Any) -> Any:
    """Rename, drop or duplicate a method, swap a field between methods, or empty or
    overfill the methods table."""
    table = doc.get("methods") if isinstance(doc, dict) else None
    if not isinstance(table, dict) or not table:
        return doc
    names = list(table)
    name = rng.choice(names)
    how = rng.choice(["rename", "rename", "drop", "dup", "swap", "swap", "empty", "many"])
    if how == "rename":
        new = rng.choice(_METHOD_NAMES + names)
        # keep the table's order: a method's position is its order in the file
        doc["methods"] = {(new if k == name else k): v for k, v in table.items()
                          if k != new or k == name}
    elif how == "drop":
        del table[name]
    elif how == "dup":
        table[f"{name}_{len(table)}"] = copy.deepcopy(table[name])
    elif how == "swap":
        a, b = table[name], table[rng.choice(names)]
        if isinstance(a, dict) and isinstance(b, dict):
            f1 = rng.choice(_METHOD_FIELDS)
            f2 = f1 if a is not b and rng.random() < 0.7 else rng.choice(_METHOD_FIELDS)
            if f1 in a and f2 in b:
                a[f1], b[f2] = b[f2], a[f1]
    elif how == "empty":
        doc["methods"] = rng.choice([{}, [], None, [table[name]]])
    else:
        n = rng.choice([2, 16, 64, 65, 200])
        doc["methods"] = {f"m{i}": copy.deepcopy(table[names[i % len(names)]])
                          for i in range(n)}
    return doc


def _all_tensors(doc: Any) -> list[dict]:
    """Every tensor view dict of a document (a version-1 top level or every method)."""
    if not isinstance(doc, dict):
        return []
    lists = [doc.get("tensors")]
    if isinstance(doc.get("methods"), dict):
        lists += [m.get("tensors") for m in doc["methods"].values() if isinstance(m, dict)]
    return [t for ts in lists if isinstance(ts, list) for t in ts if isinstance(t, dict)]


def mutate_state_root(rng: random.Random, doc: Any) -> Any:
    """Switch a tensor's root to or from "state", or put a state index at an extreme."""
    ts = _all_tensors(doc)
    if not ts:
        return doc
    n = len(doc.get("state") or []) if isinstance(doc.get("state"), list) else 0
    state = [t for t in ts if t.get("root") == "state"]
    how = rng.choice(["to", "from", "index", "index"] if state else ["to"])
    if how == "to":
        t = rng.choice(ts)
        t["root"] = "state"
        t["index"] = rng.choice([0, max(n - 1, 0), rng.randrange(max(n, 1)), n])
    elif how == "from":
        rng.choice(state)["root"] = rng.choice(["arena", "input", "output", "constant"])
    else:
        rng.choice(state)["index"] = rng.choice([-1, n, n - 1, 0, n + 1, 2**31, 2**63, 2**64,
                                                 -2**63, 1.0, True, None, "0"])
    return doc


KINDS = ("json_value", "structure", "ir", "entries", "bytes", "data", "ir_field",
         "state_spec", "methods", "state_root", "lib_params")
#: mutation kind weights for the version-1 seeds (unchanged, so their mutants keep their ids)
WEIGHTS = {"json_value": 3, "structure": 1.5, "ir": 2, "entries": 0.7, "bytes": 1,
           "data": 0.5, "ir_field": 1}
#: ... and for the version-2 seeds: the same plus the state and methods kinds
WEIGHTS_V2 = {**WEIGHTS, "state_spec": 1.5, "methods": 1.5, "state_root": 1.5}
#: the share of mutants made from a version-2 seed
V2_SHARE = 0.3
#: ... and for the library-op seeds: mostly their params at extremes
WEIGHTS_LIB = {"lib_params": 6, "json_value": 1, "structure": 0.5, "entries": 0.3}
LIB_SHARE = 0.15
LIB_FROM_MASTER = 32
#: library seeds added after the campaigns of masters 32-34 were recorded (linear_wq, issue
#: 38): drawn from this master on, so that those campaigns' mutants keep their ids
LIB_LATER = frozenset({"lib_linear_wq"})
LIB_LATER_FROM_MASTER = 35

#: extreme values of a geometry param: zero, negative, int32's edges, 2**62, 2**63, wrong
#: lengths and types
_EXTREME_INTS = [0, -1, 1, 2, 3, 2**28, 2**31 - 1, 2**31, 2**62, 2**63 - 1, 2**63, -2**63]


def mutate_lib_params(rng: random.Random, doc: Any) -> Any:
    """Set one param of one library instruction to an extreme value (kernel sizes, strides,
    paddings, dilations, groups, output sizes, k and dim)."""
    lib = [ins for m in _method_docs(doc) for ins in m.get("instructions", [])
           if isinstance(ins, dict) and ins.get("op") == "library"]
    if not lib:
        return doc
    ins = rng.choice(lib)
    params = ins.setdefault("params", {})
    if not isinstance(params, dict) or not params:
        ins["params"] = {"kernel_size": [2**31, 1]}
        return doc
    name = rng.choice(sorted(params))
    v = params[name]
    pick = rng.random()
    if isinstance(v, list) and pick < 0.6:
        i = rng.randrange(len(v)) if v else 0
        v = list(v) or [0]
        v[min(i, len(v) - 1)] = rng.choice(_EXTREME_INTS)
        if rng.random() < 0.3:
            v = [rng.choice(_EXTREME_INTS) for _ in v]
    elif pick < 0.8:
        v = rng.choice(_EXTREME_INTS)
    else:
        v = rng.choice([[], [1], [1, 2, 3], None, True, 1.5, "3", [[1]], {"a": 1},
                        [2**31, 2**31], [1, 2**62], [-1, -1]])
    params[name] = v
    return doc


def _method_docs(doc: Any) -> list[dict]:
    """The method documents of a version-1 (the top level) or version-2 document."""
    if not isinstance(doc, dict):
        return []
    methods = doc.get("methods")
    if isinstance(methods, dict):
        return [m for m in methods.values() if isinstance(m, dict)]
    return [doc]


def mutant(seed_files: dict[str, tuple[dict, dict, bytes]], index: int, master: int = 0,
           weights: dict[str, float] | None = None) -> tuple[str, str, bytes]:
    """Mutant number `index`: (seed name, mutation kinds, file bytes); deterministic.

    A share V2_SHARE of the ids go to the version-2 seeds, drawn from a stream of their own;
    every other id makes the very mutant of a version-1 seed it made before they came."""
    rng = random.Random(master * 1_000_003 + index)
    v2 = sorted(n for n in seed_files if n in SEEDS_V2)
    libs = sorted(n for n in seed_files if n in SEEDS_LIB and (
        master >= LIB_LATER_FROM_MASTER or n not in LIB_LATER))
    pick = random.Random(f"aotrt-fuzz-v2:{master}:{index}")
    pick_lib = random.Random(f"aotrt-fuzz-lib:{master}:{index}")
    if libs and master >= LIB_FROM_MASTER and pick_lib.random() < LIB_SHARE:
        rng = pick_lib
        name = rng.choice(libs)
        w = weights or WEIGHTS_LIB
    elif v2 and pick.random() < V2_SHARE:
        rng = pick
        name = rng.choice(v2)
        w = weights or WEIGHTS_V2
    else:
        name = rng.choice(sorted(n for n in seed_files
                                 if n not in SEEDS_V2 and n not in SEEDS_LIB))
        w = weights or WEIGHTS
    doc, entries, data = copy.deepcopy(seed_files[name])
    kinds = rng.choices(list(w), weights=list(w.values()), k=rng.choice([1, 1, 1, 2, 3]))
    raw = False
    for kind in kinds:
        if kind == "json_value":
            doc = mutate_json_value(rng, doc)
        elif kind == "structure":
            doc = mutate_structure(rng, doc)
        elif kind == "ir":
            doc = mutate_ir(rng, doc)
        elif kind == "ir_field":
            doc = mutate_ir_field(rng, doc)
        elif kind == "entries":
            entries = mutate_entries(rng, entries)
        elif kind == "data":
            data = mutate_data(rng, data)
        elif kind == "state_spec":
            doc = mutate_state_spec(rng, doc)
        elif kind == "methods":
            doc = mutate_methods(rng, doc)
        elif kind == "state_root":
            doc = mutate_state_root(rng, doc)
        elif kind == "lib_params":
            doc = mutate_lib_params(rng, doc)
        else:
            raw = True
    try:
        out = join(doc, entries, data)
    except (TypeError, ValueError):
        out = join(seed_files[name][0], seed_files[name][1], seed_files[name][2])
    if raw:
        out = mutate_bytes(rng, out)
    return name, "+".join(kinds), out


def seed_files() -> dict[str, tuple[dict, dict, bytes]]:
    """Every seed as (document, entries, data)."""
    return {name: split(make()) for name, make in {**SEEDS, **SEEDS_V2, **SEEDS_LIB}.items()}
