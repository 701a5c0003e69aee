"""The kernel table's pointwise entries: math, casts, generators and remaps.

Every entry is an `OpDef` (aotrt/exporter/optable.py): how to evaluate the op's value at a
tuple of output coordinates (integer IR expressions, one per output dim) through a kernel
builder (aotrt.exporter.codegen), and which iteration space the op needs. Pointwise ops
compute in torch's computation dtype (`torch._prims_common.elementwise_dtypes`; half types
compute in float32) and return their value in the node's own dtype, so a half result is
rounded per node as in eager. Reductions, norms and scans are in reductions.py.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind
from torch._prims_common import elementwise_dtypes

from aotrt.errors import Unsupported
from aotrt.exporter.nodes import describe, dtype_name, node_args
from aotrt.exporter.optable import (BOOL, F32, I64, ZERO, OpDef, ValueFn, add, broadcast_coords,
                                    compute_dtype, const, norm_dim, op, register, shape_of, val,
                                    wrap_index)
from aotrt.exporter.optable import overloads as _ov
from aotrt.kernels import ir
from aotrt.kernels.ir import Const, Expr

aten = torch.ops.aten


# -- elementwise ops with type promotion --------------------------------------------------------


def _elementwise(operands: Sequence[str], kind: Kind,
                 fn: Callable[[str, list[Expr | None], dict[str, Any]], Expr]) -> ValueFn:
    """A value function: promote `operands` (schema names) by `kind`, read them broadcast to
    the output at `coords`, cast to the computation dtype and apply `fn`."""

    def value(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
        a = b.args(node)
        xs = [a[n] for n in operands]
        present = [b.meta_or_scalar(x) for x in xs if x is not None]
        comp, _ = elementwise_dtypes(*present, type_promotion_kind=kind)
        cdt = compute_dtype(dtype_name(comp, node))
        shape = shape_of(node)
        vals = [None if x is None else b.operand(x, shape, coords, cdt) for x in xs]
        return fn(cdt, vals, a)
    return value


def _pw(targets: Sequence[Any], operands: Sequence[str], kind: Kind,
        fn: Callable[[str, list[Expr | None], dict[str, Any]], Expr]) -> None:
    register(targets, OpDef("pointwise", _elementwise(operands, kind, fn)))


def _unary(name: str) -> Callable[[str, list[Any], dict[str, Any]], Expr]:
    return lambda c, v, a: op(name, v[0])


def _binary(name: str, dtype: str | None = None) -> Callable[[str, list[Any], dict], Expr]:
    return lambda c, v, a: op(name, v[0], v[1], dtype=dtype)


def _scaled(c: str, y: Expr, alpha: Any) -> Expr:
    return y if alpha is None or alpha == 1 else op("mul", y, const(alpha, c))


def _pow(c: str, x: Expr, e: Expr) -> Expr:
    """x ** e, with the exact shortcuts eager CPU takes for common scalar exponents."""
    if c in ir.FLOAT_DTYPES and isinstance(e, Const):
        p = float(e.value)
        if p == 0.0:
            return const(1, c)
        if p == 1.0:
            return x
        if p == 2.0:
            return op("mul", x, x)
        if p == 3.0:
            return op("mul", op("mul", x, x), x)
        if p == 0.5:
            return op("sqrt", x)
        if p == -0.5:
            return op("rsqrt", x)
        if p == -1.0:
            return op("reciprocal", x)
        if p == -2.0:
            return op("reciprocal", op("mul", x, x))
    return op("pow", x, e)


def _int_divisor(c: str, d: Expr) -> Expr:
    """An integer divisor that is never 0 (torch raises there; a 0 would trap the process),
    so x / 0 and x % 0 give x / 1 and x % 1."""
    if c in ir.FLOAT_DTYPES or (isinstance(d, Const) and d.value != 0):
        return d
    return op("where", op("eq", d, const(0, c), dtype=BOOL), const(1, c), d)


def _div_mode(c: str, v: list[Any], a: dict[str, Any]) -> Expr:
    mode = a.get("rounding_mode")
    if mode is None:
        return op("div", v[0], v[1])
    if mode not in ("trunc", "floor"):
        raise Unsupported(f"div rounding_mode {mode!r}")
    return op("truncdiv" if mode == "trunc" else "floordiv", v[0], _int_divisor(c, v[1]))


def _int_safe(name: str) -> Callable[[str, list[Any], dict[str, Any]], Expr]:
    return lambda c, v, a: op(name, v[0], _int_divisor(c, v[1]))


def _clamp(c: str, v: list[Any], a: dict[str, Any]) -> Expr:
    x = v[0]
    if v[1] is not None:
        x = op("maximum", x, v[1])
    if v[2] is not None:
        x = op("minimum", x, v[2])
    return x


def _bitwise_not(c: str, v: list[Any], a: dict[str, Any]) -> Expr:
    return op("not" if c == BOOL else "bitwise_not", v[0])


def _hardsigmoid_f(x: Expr) -> Expr:
    r = op("minimum", op("maximum", op("add", x, const(3, F32)), const(0, F32)), const(6, F32))
    return op("div", r, const(6, F32))


def _softplus(x: Expr, beta: Any, threshold: Any) -> Expr:
    bx = op("mul", x, const(beta, F32))
    soft = op("div", op("log1p", op("exp", bx)), const(beta, F32))
    return op("where", op("gt", bx, const(threshold, F32), dtype=BOOL), x, soft)


DEF, INT2F, ALWAYS_BOOL, NO_OPMATH, B2L = (Kind.DEFAULT, Kind.INT_TO_FLOAT, Kind.ALWAYS_BOOL,
                                          Kind.NO_OPMATH, Kind.BOOL_TO_LONG)
SO = ("self", "other")

_pw(_ov(aten.add, "Tensor", "Scalar"), SO, DEF,
    lambda c, v, a: op("add", v[0], _scaled(c, v[1], a.get("alpha"))))
_pw(_ov(aten.sub, "Tensor", "Scalar"), SO, DEF,
    lambda c, v, a: op("sub", v[0], _scaled(c, v[1], a.get("alpha"))))
_pw(_ov(aten.rsub, "Tensor", "Scalar"), SO, DEF,
    lambda c, v, a: op("sub", v[1], _scaled(c, v[0], a.get("alpha"))))
_pw(_ov(aten.mul, "Tensor", "Scalar"), SO, DEF, _binary("mul"))
_pw(_ov(aten.div, "Tensor", "Scalar"), SO, INT2F, _binary("div"))
_pw(_ov(aten.div, "Tensor_mode", "Scalar_mode"), SO, DEF, _div_mode)
_pw(_ov(aten.remainder, "Tensor", "Scalar"), SO, DEF, _int_safe("mod"))
_pw(_ov(aten.fmod, "Tensor", "Scalar"), SO, DEF, _int_safe("fmod"))
_pw(_ov(aten.maximum, "default"), SO, DEF, _binary("maximum"))
_pw(_ov(aten.minimum, "default"), SO, DEF, _binary("minimum"))
_pw(_ov(aten.atan2, "default"), SO, INT2F, _binary("atan2"))
_pw(_ov(aten.pow, "Tensor_Scalar"), ("self", "exponent"), B2L,
    lambda c, v, a: _pow(c, v[0], v[1]))
_pw(_ov(aten.pow, "Tensor_Tensor"), ("self", "exponent"), B2L, _binary("pow"))
_pw(_ov(aten.pow, "Scalar"), ("self", "exponent"), B2L, _binary("pow"))
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    _pw(_ov(getattr(aten, _name), "Tensor", "Scalar"), SO, ALWAYS_BOOL, _binary(_name, BOOL))
for _name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    _pw(_ov(getattr(aten, _name), "Tensor", "Scalar"), SO, DEF, _binary(_name))
_pw(_ov(aten.__lshift__, "Tensor", "Scalar") + _ov(aten.bitwise_left_shift, "Tensor",
                                                    "Tensor_Scalar"), SO, DEF, _binary("shl"))
_pw(_ov(aten.__rshift__, "Tensor", "Scalar") + _ov(aten.bitwise_right_shift, "Tensor",
                                                    "Tensor_Scalar"), SO, DEF, _binary("shr"))
_pw(_ov(aten.bitwise_not, "default"), ("self",), DEF, _bitwise_not)
_pw(_ov(aten.clamp, "default", "Tensor"), ("self", "min", "max"), DEF, _clamp)
_pw(_ov(aten.clamp_min, "default", "Tensor"), ("self", "min"), DEF,
    lambda c, v, a: op("maximum", v[0], v[1]))
_pw(_ov(aten.clamp_max, "default", "Tensor"), ("self", "max"), DEF,
    lambda c, v, a: op("minimum", v[0], v[1]))
_pw(_ov(aten.hardtanh, "default"), ("self",), DEF,
    lambda c, v, a: op("minimum", op("maximum", v[0], const(a["min_val"], c)),
                       const(a["max_val"], c)))

for _name in ("neg", "abs", "relu", "sign", "floor", "ceil", "round", "trunc"):
    _pw(_ov(getattr(aten, _name), "default"), ("self",), DEF, _unary(_name))
for _name in ("exp", "exp2", "log", "log2", "log1p", "expm1", "sqrt", "rsqrt", "sigmoid",
              "tanh", "erf", "sin", "cos", "tan", "asin", "acos", "atan", "reciprocal", "silu"):
    _pw(_ov(getattr(aten, _name), "default"), ("self",), INT2F, _unary(_name))
# torch's refs rewrite these to prims (which take floats already) when an op around them is
# decomposed further (capture.decompose_unsupported)
for _name in ("asin", "acos", "atan"):
    _pw(_ov(getattr(torch.ops.prims, _name), "default"), ("self",), INT2F, _unary(_name))
for _name in ("isnan", "isinf"):
    _pw(_ov(getattr(aten, _name), "default"), ("self",), NO_OPMATH,
        lambda c, v, a, n=_name: op(n, v[0], dtype=BOOL))
_pw(_ov(aten.log10, "default"), ("self",), INT2F,
    lambda c, v, a: op("mul", op("log", v[0]), const(1 / math.log(10), F32)))
_pw(_ov(aten.frac, "default"), ("self",), DEF, lambda c, v, a: op("sub", v[0], op("trunc", v[0])))
_pw(_ov(aten.gelu, "default"), ("self",), INT2F,
    lambda c, v, a: op("gelu_tanh" if a.get("approximate") == "tanh" else "gelu", v[0]))
_pw(_ov(aten.hardsigmoid, "default"), ("self",), INT2F, lambda c, v, a: _hardsigmoid_f(v[0]))
_pw(_ov(aten.hardswish, "default"), ("self",), INT2F,
    lambda c, v, a: op("mul", v[0], _hardsigmoid_f(v[0])))
_pw(_ov(aten.softplus, "default"), ("self",), INT2F,
    lambda c, v, a: _softplus(v[0], a["beta"], a["threshold"]))
_pw(_ov(aten.mish, "default"), ("self",), INT2F,
    lambda c, v, a: op("mul", v[0], op("tanh", _softplus(v[0], 1, 20))))
_pw(_ov(aten.leaky_relu, "default"), ("self",), DEF,
    lambda c, v, a: op("where", op("gt", v[0], const(0, c), dtype=BOOL), v[0],
                       op("mul", v[0], const(a["negative_slope"], c))))
_pw(_ov(aten.elu, "default"), ("self",), INT2F,
    lambda c, v, a: op("where", op("gt", v[0], const(0, c), dtype=BOOL),
                       op("mul", v[0], const(a["scale"], c)),
                       op("mul", op("expm1", op("mul", v[0], const(a["input_scale"], c))),
                          const(float(a["alpha"]) * float(a["scale"]), c))))


def _where(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
    a = b.args(node)
    present = [b.meta_or_scalar(a[n]) for n in SO]
    comp, _ = elementwise_dtypes(*present, type_promotion_kind=NO_OPMATH)
    cdt = compute_dtype(dtype_name(comp, node))
    shape = shape_of(node)
    cond = b.operand(a["condition"], shape, coords, BOOL)
    return op("where", cond, b.operand(a["self"], shape, coords, cdt),
              b.operand(a["other"], shape, coords, cdt))


def _logical(name: str) -> ValueFn:
    def value(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
        a = b.args(node)
        shape = shape_of(node)
        xs = [b.operand(a[n], shape, coords, BOOL) for n in SO if n in a]
        return op(name, *xs, dtype=BOOL)
    return value


register(_ov(aten.where, "self", "ScalarOther", "ScalarSelf", "Scalar"),
         OpDef("pointwise", _where))
register(_ov(aten.logical_and, "default"), OpDef("pointwise", _logical("and")))
register(_ov(aten.logical_or, "default"), OpDef("pointwise", _logical("or")))
register(_ov(aten.logical_xor, "default"), OpDef("pointwise", _logical("xor")))
register(_ov(aten.logical_not, "default"), OpDef("pointwise", _logical("not")))


# -- copies and casts ---------------------------------------------------------------------------


def _copy_of(name: str) -> ValueFn:
    """The value of operand `name`, broadcast to the output and cast to its dtype."""
    def value(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
        return b.operand(b.args(node)[name], shape_of(node), coords, b.dtype(node))
    return value


def _check_to_copy(node: torch.fx.Node) -> str | None:
    a = node_args(node)
    src = val(node.args[0]) if isinstance(node.args[0], torch.fx.Node) else None
    dst = val(node)
    if a.get("layout") not in (None, torch.strided):
        return "a layout change"
    if a.get("pin_memory"):
        return "pin_memory"
    if src is not None and a.get("device") is not None and src.device.type != "meta" and \
            torch.device(a["device"]).type != src.device.type:
        return f"a device change to {a['device']}"
    if src is not None and tuple(src.shape) != tuple(dst.shape):
        return "a shape change"
    return None


register(_ov(aten._to_copy, "default"), OpDef("pointwise", _copy_of("self"),
                                              check=_check_to_copy))
# prims' cast: core ATen decompositions of half-type ops on cuda (SiLU at fp16 in torch 2.11)
# leave it in the graph
register(_ov(torch.ops.prims.convert_element_type, "default"),
         OpDef("pointwise", _copy_of("a")))
register(_ov(aten.clone, "default") + _ov(aten.alias, "default")
         + _ov(aten.lift_fresh_copy, "default"), OpDef("pointwise", _copy_of("self")))
register(_ov(aten.copy, "default"), OpDef("pointwise", _copy_of("src")))


# -- generators ---------------------------------------------------------------------------------


def _fill(name: str | None) -> ValueFn:
    """A constant (`name` is the schema argument holding it; None means 0, for empty*)."""
    def value(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
        v = 0 if name is None else b.args(node)[name]
        if isinstance(v, torch.fx.Node):
            raise Unsupported(f"{describe(node)}: a fill value from a tensor")
        return const(v, b.dtype(node))
    return value


def _fill_const(v: Any) -> ValueFn:
    return lambda b, node, coords, out: const(v, b.dtype(node))


def _arange(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
    a = b.args(node)
    start = a.get("start") or 0
    step = a.get("step") or 1
    dt = b.dtype(node)
    i = coords[0] if coords else ZERO
    if dt in ir.FLOAT_DTYPES:
        return op("add", op("mul", ir.cast(i, F32), const(step, F32)), const(start, F32))
    return ir.cast(op("add", op("mul", i, Const(int(step), I64)), Const(int(start), I64)), dt)


register(_ov(aten.full, "default") + _ov(aten.full_like, "default")
         + _ov(aten.new_full, "default"), OpDef("generator", _fill("fill_value")))
register(_ov(aten.scalar_tensor, "default"), OpDef("generator", _fill("s")))
register(_ov(aten.zeros, "default") + _ov(aten.zeros_like, "default")
         + _ov(aten.new_zeros, "default"), OpDef("generator", _fill_const(0)))
register(_ov(aten.ones, "default") + _ov(aten.ones_like, "default")
         + _ov(aten.new_ones, "default"), OpDef("generator", _fill_const(1)))
register(_ov(aten.empty, "memory_format") + _ov(aten.empty_like, "default")
         + _ov(aten.empty_permuted, "default") + _ov(aten.empty_strided, "default")
         + _ov(aten.new_empty, "default"), OpDef("generator", _fill(None)))
register(_ov(aten.arange, "default", "start", "start_step"), OpDef("generator", _arange))


# -- remaps: reads of one operand at computed coordinates ----------------------------------------


def _pad(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
    a = b.args(node)
    x = a["self"]
    xs = shape_of(x)
    pad = list(a["pad"])
    inside: Expr | None = None
    xc = list(coords)
    for i in range(len(pad) // 2):
        k = len(xs) - 1 - i
        lo = int(pad[2 * i])
        c = add(coords[k], Const(-lo, I64)) if lo else coords[k]
        ok = op("and", op("ge", c, ZERO, dtype=BOOL),
                op("lt", c, Const(xs[k], I64), dtype=BOOL))
        inside = ok if inside is None else op("and", inside, ok)
        xc[k] = op("minimum", op("maximum", c, ZERO), Const(max(xs[k] - 1, 0), I64))
    dt = b.dtype(node)
    v = ir.cast(b.value(x, tuple(xc)), dt)
    if inside is None:
        return v
    return op("where", inside, v, const(a["value"], dt))


def _flip(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
    a = b.args(node)
    xs = shape_of(a["self"])
    dims = {norm_dim(d, len(xs)) for d in a["dims"]}
    xc = tuple(op("sub", Const(xs[k] - 1, I64), c) if k in dims and xs[k] > 1 else c
               for k, c in enumerate(coords))
    return b.value(a["self"], xc)


def _repeat(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
    a = b.args(node)
    xs = shape_of(a["self"])
    lead = len(coords) - len(xs)
    xc = tuple(ZERO if s == 1 else op("mod", coords[lead + j], Const(s, I64))
               for j, s in enumerate(xs))
    return b.value(a["self"], xc)


def _embedding(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
    a = b.args(node)
    w, idx = a["weight"], a["indices"]
    rows = shape_of(w)[0]
    i = wrap_index(b.value(idx, coords[:-1]), rows, negative=False)   # torch: [0, rows)
    return b.value(w, (i, coords[-1]))


def _gather(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
    a = b.args(node)
    xs = shape_of(a["self"])
    d = norm_dim(a["dim"], len(xs))
    xc = list(coords)
    if xs:
        xc[d] = wrap_index(b.value(a["index"], coords), xs[d], negative=False)
    return b.value(a["self"], tuple(xc))


def _index_select(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
    a = b.args(node)
    xs = shape_of(a["self"])
    d = norm_dim(a["dim"], len(xs))
    xc = list(coords)
    if xs:
        ic = (coords[d],) if shape_of(a["index"]) else ()
        xc[d] = wrap_index(b.value(a["index"], ic), xs[d], negative=False)
    return b.value(a["self"], tuple(xc))


def _index(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
    """x[i0, i1, ...] with None for whole dims (torch's advanced indexing rules)."""
    a = b.args(node)
    x, indices = a["self"], list(a["indices"])
    xs = shape_of(x)
    adv = [k for k, t in enumerate(indices) if t is not None]
    bshape = tuple(torch.broadcast_shapes(*[shape_of(indices[k]) for k in adv]))
    nb = len(bshape)
    adjacent = adv == list(range(adv[0], adv[-1] + 1))
    first = adv[0] if adjacent else 0
    bc = coords[first:first + nb]
    rest = list(coords[:first]) + list(coords[first + nb:])
    xc: list[Expr] = []
    for k in range(len(xs)):
        if k in adv:
            ic = broadcast_coords(shape_of(indices[k]), bshape, bc)
            xc.append(wrap_index(b.value(indices[k], ic), xs[k]))
        else:
            xc.append(rest.pop(0))
    return b.value(x, tuple(xc))


def _check_index(node: torch.fx.Node) -> str | None:
    indices = node_args(node)["indices"]
    if not any(t is not None for t in indices):
        return "no index tensors"
    for t in indices:
        if t is not None and val(t).dtype in (torch.bool, torch.uint8):
            return "a boolean mask index"
    return None


register(_ov(aten.constant_pad_nd, "default"), OpDef("remap", _pad, data="self"))
register(_ov(aten.flip, "default"), OpDef("remap", _flip, data="self"))
register(_ov(aten.repeat, "default"), OpDef("remap", _repeat, data="self"))
register(_ov(aten.embedding, "default"), OpDef("remap", _embedding, data="weight"))
register(_ov(aten.gather, "default"), OpDef("remap", _gather, data="self"))
register(_ov(aten.index_select, "default"), OpDef("remap", _index_select, data="self"))
register(_ov(aten.index, "Tensor"), OpDef("remap", _index, data="self", check=_check_index))
