"""Reductions, softmax, norms and cumsum for the kernel op table (`optable.OPS`).

A reduction group iterates over the outer dims of its space and reduces over `rdims`; the
value of a reduction at output coordinates is an IR `Reduce` whose body reads the input at
the same outer coordinates and the kernel's reduce coordinates in the reduced dims.
Statistics are computed in float32 (half inputs) with two passes for variances.
"""

from __future__ import annotations

from typing import Any

import torch

from aotrt.errors import Unsupported
from aotrt.kernels import ir
from aotrt.kernels.ir import Const, Expr, Reduce
from aotrt.exporter.nodes import describe, node_args
from aotrt.exporter.optable import (BOOL, F32, I64, OPS, ZERO, OpDef, Space, compute_dtype,
                                    const, norm_dim, numel, op, register, shape_of)
from aotrt.exporter.optable import overloads as _ov

aten = torch.ops.aten


def _dims(dim: Any, rank: int, empty_is_all: bool = True) -> tuple[int, ...]:
    """Sorted reduced dims: None (or [] where `empty_is_all`) means every dim."""
    if dim is None or (empty_is_all and isinstance(dim, (list, tuple)) and not dim):
        return tuple(range(rank))
    if isinstance(dim, int):
        dim = [dim]
    return tuple(sorted({norm_dim(d, rank) for d in dim})) if rank else ()


def _source(node: torch.fx.Node) -> torch.fx.Node:
    x = node.args[0]
    if not isinstance(x, torch.fx.Node):
        raise Unsupported(f"{describe(node)}: reduction of a non-tensor")
    return x


def _reduce_space(node: torch.fx.Node) -> Space:
    """Space of a plain reduction: the input's shape, reduced over the node's dims."""
    a = node_args(node)
    xs = shape_of(_source(node))
    # any.dims/all.dims read dim=[] as "no dims"; the older reductions as "every dim"
    empty_is_all = node.target not in _EMPTY_IS_NONE
    return Space(xs, _dims(a.get("dim"), len(xs), empty_is_all), reduce=True)


_EMPTY_IS_NONE = set(_ov(aten.any, "dims") + _ov(aten.all, "dims"))


def _keepdim(node: torch.fx.Node) -> bool:
    return bool(node_args(node).get("keepdim") or False)


def _reduce_coords(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...],
                   keepdim: bool) -> tuple[Expr, ...]:
    """Input coordinates for the body of a reduction whose output is at `coords`."""
    sp = b.require(node, _space_of(node))
    b.check_outer(coords, node)
    it = iter(coords)
    full: list[Expr] = []
    for k in range(len(sp.full)):
        if k in sp.rdims:
            full.append(b.ridx(k))
            if keepdim:
                next(it)
        else:
            full.append(next(it))
    return tuple(full)


def _full_reduce_coords(b: Any, node: torch.fx.Node,
                        coords: tuple[Expr, ...]) -> tuple[Expr, ...]:
    """For a full-shaped value at `coords`: the coordinates its reductions read at."""
    sp = b.require(node, _space_of(node))
    b.check_outer(tuple(c for k, c in enumerate(coords) if k not in sp.rdims), node)
    return tuple(b.ridx(k) if k in sp.rdims else c for k, c in enumerate(coords))


def _space_of(node: torch.fx.Node) -> Space:
    return OPS[node.target].space(node)


def _reduction(rop: str, mean: bool = False) -> Any:
    def value(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
        xc = _reduce_coords(b, node, coords, _keepdim(node))
        acc = BOOL if rop in ("any", "all") else compute_dtype(b.dtype(node))
        if mean:
            acc = F32
        r: Expr = Reduce(rop, ir.cast(b.value(_source(node), xc), acc), acc)
        if mean:
            n = numel([b.space.full[k] for k in b.space.rdims])
            r = op("div", r, const(n, F32))
        return r
    return value


def _moments(b: Any, node: torch.fx.Node, xc: tuple[Expr, ...]) -> tuple[Expr, Expr, int]:
    """(mean, sum of squared deviations, n) over the reduce domain, in float32."""
    x = ir.cast(b.value(_source(node), xc), F32)
    n = numel([b.space.full[k] for k in b.space.rdims])
    mean = op("div", Reduce("sum", x, F32), const(n, F32))
    d = op("sub", x, mean)
    return mean, Reduce("sum", op("mul", d, d), F32), n


def _var(std: bool = False, with_mean: bool = False) -> Any:
    def value(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
        a = b.args(node)
        xc = _reduce_coords(b, node, coords, _keepdim(node))
        mean, ssd, n = _moments(b, node, xc)
        if with_mean and out == 1:
            return mean
        corr = a.get("correction")
        corr = 1 if corr is None else corr
        var = op("div", ssd, const(max(n - corr, 0), F32))
        return op("sqrt", var) if std else var
    return value


def _arg_extreme(rop: str, values_out: int | None) -> Any:
    """max.dim/min.dim (values_out=0: (values, indices)) and argmax/argmin (None)."""

    def value(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
        xc = _reduce_coords(b, node, coords, _keepdim(node))
        src = b.value(_source(node), xc)
        acc = compute_dtype(src.dtype)
        x = ir.cast(src, acc)
        m = Reduce(rop, x, acc)
        if values_out is not None and out == values_out:
            return m
        # the first index holding the extreme (or the first NaN, which max/min propagate)
        sp = b.space
        flat: Expr = ZERO
        for k in sp.rdims:
            flat = op("add", op("mul", flat, Const(sp.full[k], I64)), b.ridx(k))
        hit = op("or", op("eq", x, m, dtype=BOOL), op("ne", x, x, dtype=BOOL))
        big = Const(numel([sp.full[k] for k in sp.rdims]), I64)
        return Reduce("min", op("where", hit, flat, big), I64)
    return value


def _softmax(log: bool) -> Any:
    def value(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
        rc = _full_reduce_coords(b, node, coords)
        src = _source(node)
        xr = ir.cast(b.value(src, rc), F32)
        m = Reduce("max", xr, F32)
        s = Reduce("sum", op("exp", op("sub", xr, m)), F32)
        x = op("sub", ir.cast(b.value(src, coords), F32), m)
        return op("sub", x, op("log", s)) if log else op("div", op("exp", x), s)
    return value


def _softmax_space(node: torch.fx.Node) -> Space:
    xs = shape_of(_source(node))
    return Space(xs, _dims(node.args[1], len(xs)), reduce=True)


def _ln_space(node: torch.fx.Node) -> Space:
    xs = shape_of(_source(node))
    k = len(node_args(node)["normalized_shape"])
    return Space(xs, tuple(range(len(xs) - k, len(xs))), reduce=True)


def _layer_norm(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
    a = b.args(node)
    sp = b.require(node, _ln_space(node))
    if out == 0:
        rc = _full_reduce_coords(b, node, coords)
    else:
        rc = _reduce_coords(b, node, coords, keepdim=True)
    mean, ssd, n = _moments(b, node, rc)
    rstd = op("rsqrt", op("add", op("div", ssd, const(n, F32)), const(a["eps"], F32)))
    if out == 1:
        return mean
    if out == 2:
        return rstd
    y = op("mul", op("sub", ir.cast(b.value(_source(node), coords), F32), mean), rstd)
    axis = len(sp.full) - len(sp.rdims)
    if a.get("weight") is not None:
        y = op("mul", y, ir.cast(b.value(a["weight"], coords[axis:]), F32))
    if a.get("bias") is not None:
        y = op("add", y, ir.cast(b.value(a["bias"], coords[axis:]), F32))
    return y


def _batch_norm(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
    """Eval-mode batch norm, as eager CPU computes it: x * alpha + beta per channel."""
    if out != 0:
        raise Unsupported(f"{describe(node)}: batch-norm statistics output {out}")
    a = b.args(node)
    ch = (coords[1],) if len(coords) > 1 else (ZERO,)

    def chan(name: str) -> Expr:
        return ir.cast(b.value(a[name], ch), F32)
    invstd = op("rsqrt", op("add", chan("running_var"), const(a["eps"], F32)))
    alpha = invstd if a.get("weight") is None else op("mul", invstd, chan("weight"))
    beta = op("mul", op("neg", chan("running_mean")), alpha)
    if a.get("bias") is not None:
        beta = op("add", chan("bias"), beta)
    return op("add", op("mul", ir.cast(b.value(_source(node), coords), F32), alpha), beta)


def _bn_check(node: torch.fx.Node) -> str | None:
    a = node_args(node)
    if a.get("running_mean") is None or a.get("running_var") is None:
        return "batch norm without running statistics"
    return None


def _scan_space(node: torch.fx.Node) -> Space:
    xs = shape_of(_source(node))
    return Space(xs, scan=norm_dim(node_args(node)["dim"], len(xs))) if xs else Space(xs)


def _cumsum(b: Any, node: torch.fx.Node, coords: tuple[Expr, ...], out: int) -> Expr:
    """out[.., i, ..] = sum over j <= i of x[.., j, ..]: O(n^2), one Reduce per element."""
    acc = compute_dtype(b.dtype(node))
    src = _source(node)
    if not coords:
        return ir.cast(b.value(src, coords), acc)
    sp = b.require(node, _scan_space(node))
    b.check_outer(coords, node)
    d = sp.scan
    j = b.scan_idx()
    xc = tuple(j if k == d else c for k, c in enumerate(coords))
    body = op("where", op("le", j, coords[d], dtype=BOOL), ir.cast(b.value(src, xc), acc),
              const(0, acc))
    return Reduce("sum", body, acc)


def _red(targets: list[Any], value: Any, outputs: int = 1, weight: int = 1) -> None:
    register(targets, OpDef("reduce", value, space=_reduce_space, outputs=outputs, weight=weight))


_red(_ov(aten.sum, "dim_IntList", "default"), _reduction("sum"))
_red(_ov(aten.mean, "dim", "default"), _reduction("sum", mean=True))
_red(_ov(aten.prod, "dim_int", "default"), _reduction("prod"))
_red(_ov(aten.amax, "default") + _ov(aten.max, "default"), _reduction("max"))
_red(_ov(aten.amin, "default") + _ov(aten.min, "default"), _reduction("min"))
_red(_ov(aten.any, "dim", "dims", "default"), _reduction("any"))
_red(_ov(aten.all, "dim", "dims", "default"), _reduction("all"))
_red(_ov(aten.var, "correction"), _var(), weight=2)
_red(_ov(aten.std, "correction"), _var(std=True), weight=2)
_red(_ov(aten.var_mean, "correction"), _var(with_mean=True), outputs=2, weight=2)
_red(_ov(aten.max, "dim"), _arg_extreme("max", 0), outputs=2, weight=2)
_red(_ov(aten.min, "dim"), _arg_extreme("min", 0), outputs=2, weight=2)
_red(_ov(aten.argmax, "default"), _arg_extreme("max", None), weight=2)
_red(_ov(aten.argmin, "default"), _arg_extreme("min", None), weight=2)
register(_ov(aten._softmax, "default"),
         OpDef("reduce", _softmax(False), space=_softmax_space, weight=3))
register(_ov(aten._log_softmax, "default"),
         OpDef("reduce", _softmax(True), space=_softmax_space, weight=3))
register(_ov(aten.native_layer_norm, "default"), OpDef("reduce", _layer_norm, space=_ln_space,
                                                       outputs=3, weight=3))
register(_ov(aten.layer_norm, "default"),
         OpDef("reduce", _layer_norm, space=_ln_space, weight=3))
register(_ov(aten._native_batch_norm_legit_no_training, "default"),
         OpDef("pointwise", _batch_norm, outputs=3, check=_bn_check))
register(_ov(aten.cumsum, "default"), OpDef("scan", _cumsum, space=_scan_space))
