"""Fusion (aotrt/exporter/fuse.py, codegen.py, optable.py, pointwise.py, reductions.py):
kernels built from exported graphs run on the cpu device and match torch.

The cases are gathered into a few suite modules, each exported and decomposed once (that is
the slow part). Every suite graph runs twice through a small interpreter: once with a kernel
per fusible node and once with the groups of `partition`; the other nodes (views, matmuls)
run in torch. Each case then compares its outputs with a float64 reference of the same code
(floats: relative error fp32 1e-4, bf16 2e-2) or with eager exactly (ints, bools, casts).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pytest
import torch
import torch.nn.functional as F

from aotrt.errors import Unsupported
from aotrt.exporter.capture import decomposition_table
from aotrt.exporter.codegen import build_kernel
from aotrt.exporter.fuse import fusible, group_io, partition
from aotrt.kernels import ir
from aotrt.runtime import shims
from aotrt.runtime.device import StreamOptions, get_device
from aotrt.runtime.backends.cpu import device as cpu_device
from aotrt.runtime.memory import Owner, owner_scope
from tests.exporter.harness import rel_err

aten = torch.ops.aten
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}


# ---------------------------------------------------------------------------------------------
# inputs


@dataclass(frozen=True)
class In:
    """An input: shape, kind ('f' float of the suite dtype, 'pos' positive float, 'unit'
    float in (-1, 1), 'i' ints in [lo, hi), 'b' bools, 'f32' always float32), plus an
    optional layout: `perm` makes a permuted view of a contiguous tensor, `expand` a stride-0
    view along dim 0, `offset` a slice of a wider tensor (non-zero storage offset)."""

    shape: tuple[int, ...]
    kind: str = "f"
    lo: int = -5
    hi: int = 5
    perm: tuple[int, ...] | None = None
    expand: int = 0
    offset: int = 0

    def make(self, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
        """A fresh random tensor of this spec."""
        shape = self.shape
        if self.perm is not None:
            shape = tuple(self.shape[p] for p in self.perm)
        if self.expand:
            shape = (1,) + shape[1:]
        if self.offset:
            shape = shape[:-1] + (shape[-1] + self.offset,)
        if self.kind == "unit":
            t = (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1).to(dtype)
        elif self.kind in ("f", "f32", "pos"):
            t = torch.randn(shape, generator=gen, dtype=torch.float64) * 2
            if self.kind == "pos":
                t = t.abs() + 0.1
            t = t.to(torch.float32 if self.kind == "f32" else dtype)
        elif self.kind == "i":
            t = torch.randint(self.lo, self.hi, shape, generator=gen, dtype=torch.int64)
        else:
            t = torch.rand(shape, generator=gen) > 0.5
        if self.offset:
            t = t[..., self.offset:]
        if self.expand:
            t = t.expand(self.shape)
        if self.perm is not None:
            inv = [self.perm.index(d) for d in range(len(self.perm))]
            t = t.permute(*inv)
        return t


@dataclass(frozen=True)
class Case:
    """One module under test: fn(*inputs) -> tensor or tuple of tensors.

    exact: compare with eager bit for bit (int/bool results, casts) instead of with float64.
    """

    name: str
    fn: Callable[..., Any]
    ins: tuple[In, ...]
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    exact: bool = False
    tol: float | None = None


def X(*shape: int, **kw: Any) -> In:
    """A float input."""
    return In(tuple(shape), **kw)


def P(*shape: int, **kw: Any) -> In:
    """A positive float input."""
    return In(tuple(shape), "pos", **kw)


def U(*shape: int, **kw: Any) -> In:
    """A float input in (-1, 1), the domain of asin and acos."""
    return In(tuple(shape), "unit", **kw)


def Iv(*shape: int, lo: int = -5, hi: int = 5, **kw: Any) -> In:
    """An int64 input in [lo, hi)."""
    return In(tuple(shape), "i", lo, hi, **kw)


def B(*shape: int, **kw: Any) -> In:
    """A bool input."""
    return In(tuple(shape), "b", **kw)


F32 = ("float32",)
INT = ("int",)

CASES: list[Case] = [
    # arithmetic, broadcasting, scalars
    Case("add_bcast", lambda x, y: x + y, (X(3, 1, 5), X(4, 5))),
    Case("add_alpha", lambda x, y: torch.add(x, y, alpha=2.5), (X(4, 5), X(4, 5))),
    Case("sub_rsub", lambda x: (x - 1.5, 2 - x), (X(2, 7),)),
    Case("mul_div", lambda x, y: x * y / (y.abs() + 1), (X(6, 4), X(4))),
    Case("div_floor_trunc", lambda x, y: (torch.div(x, y, rounding_mode="floor"),
                                          torch.div(x, y, rounding_mode="trunc")),
         (X(5, 6), P(5, 6)), F32),
    Case("remainder_fmod", lambda x: (torch.remainder(x, 1.5), torch.fmod(x, -1.25),
                                      torch.remainder(x, -0.75)), (X(4, 9),), F32),
    Case("max_min", lambda x, y: torch.maximum(x, y) - torch.minimum(x, y * 2), (X(3, 8), X(8))),
    Case("atan2", lambda x, y: torch.atan2(x, y), (X(5, 5), X(5, 5)), F32),
    Case("pow_scalars", lambda x: (x ** 2, x ** 3, x.abs() ** 2.5, x.abs() ** 0.5,
                                   (x.abs() + 1) ** -1, (x.abs() + 1) ** -0.5),
         (X(4, 6),)),
    Case("pow_tensor", lambda x, y: (x ** y, 2 ** y), (P(3, 5), X(3, 5)), F32),
    Case("clamp", lambda x: (x.clamp(-1, 1), x.clamp(min=0.5), x.clamp(max=-0.25)), (X(6, 7),)),
    Case("clamp_tensor", lambda x, lo, hi: x.clamp(lo, hi + 1), (X(4, 5), X(5), X(4, 1))),
    Case("hardtanh", lambda x: (F.relu6(x * 4), F.hardtanh(x, -0.5, 0.5)), (X(3, 9),)),
    Case("unary_signs", lambda x: (-x, x.abs(), F.relu(x), x.sign(), (x * 3).floor(),
                                   (x * 3).ceil(), (x * 3).round(), (x * 3).trunc()),
         (X(5, 8),), exact=True),
    Case("unary_transcendental", lambda x: (x.exp(), x.sigmoid(), x.tanh(), x.erf(), x.sin(),
                                            x.cos(), x.atan(), torch.expm1(x)), (X(4, 8),)),
    Case("unary_inverse_trig", lambda x: (x.asin(), x.acos(), 1 - torch.acos(x) / math.pi),
         (U(4, 8),)),
    # what torch's refs decompose them to when capture decomposes an op around them further
    Case("prims_inverse_trig", lambda x: (torch.ops.prims.asin(x), torch.ops.prims.acos(x),
                                          torch.ops.prims.atan(x * 3)), (U(4, 8),)),
    Case("unary_positive", lambda x: (x.log(), x.log2(), x.log1p(), x.sqrt(), x.rsqrt(),
                                      x.reciprocal(), x.log10()), (P(4, 8),)),
    Case("gelu", lambda x: (F.gelu(x), F.gelu(x, approximate="tanh")), (X(5, 16),)),
    Case("activations", lambda x: (F.silu(x), F.hardswish(x * 3), F.hardsigmoid(x * 3),
                                   F.mish(x), F.softplus(x), F.leaky_relu(x, 0.1),
                                   F.elu(x), F.softplus(x * 10, beta=2, threshold=5)),
         (X(4, 12),)),
    Case("where_scalar", lambda c, x: (torch.where(c, x, 0.0), x.masked_fill(c, -1e9),
                                       torch.where(x > 0, x, torch.tensor(float("-inf")))),
         (B(3, 6), X(3, 6))),
    Case("where_tensor", lambda c, x, y: torch.where(c, x, y), (B(4, 1), X(4, 5), X(5))),
    Case("compare_mask", lambda x, y: x * (x > y) + (x <= 0.5) * 2.0 - ((x == x) & (y != 1)) * 1.5,
         (X(4, 6), X(6))),
    Case("isnan_isinf", lambda x: (torch.isnan(torch.log(x)), torch.isinf(1 / (x > 0))),
         (X(5, 6),), F32),
    # layouts: permuted, expanded and offset inputs; the permuted-q scaling of GPT-2
    Case("permuted_input", lambda x, y: x * 2 + y, (X(4, 5, 6, perm=(2, 0, 1)), X(4, 5, 6))),
    Case("expanded_input", lambda x, y: x * y, (X(3, 4, 5, expand=1), X(3, 4, 5))),
    Case("offset_input", lambda x: x.sigmoid() * 3, (X(6, 8, offset=8),)),
    Case("mul_scalar_permuted_q", lambda x: (x.view(2, 16, 4, 16).permute(0, 2, 1, 3) * 0.125)
         .transpose(1, 2).reshape(2, 16, 64), (X(2, 16, 64),)),
    Case("chunk_last_dim", lambda x: torch.sigmoid(x.chunk(2, -1)[1]) * 2, (X(12, 16),)),
    # casts and generators
    Case("to_copy_half", lambda x: (x.to(torch.bfloat16).float() * 3, x.half() + 1),
         (X(4, 8),), F32, exact=True),
    Case("to_copy_int_bool", lambda x: ((x * 3).to(torch.int32), (x * 3).long() + 1,
                                        (x.round()).bool(), x.to(torch.uint8) * 0),
         (X(5, 7),), F32, exact=True),
    Case("clone_contiguous", lambda x: x.transpose(0, 1).contiguous() + 0, (X(6, 7),)),
    Case("generators", lambda x: (x + torch.arange(5), x * torch.ones_like(x),
                                  x + torch.full((4, 5), 7.0), torch.zeros(3, 5) + x[0],
                                  x + torch.arange(0, 1, 0.2)), (X(4, 5),)),
    Case("arange_int", lambda x: x + torch.arange(2, 20, 3), (Iv(4, 6),), INT, exact=True),
    # reductions, softmax, norms
    Case("softmax", lambda x: (F.softmax(x, -1), F.softmax(x, 1)), (X(3, 5, 17),)),
    Case("log_softmax", lambda x: F.log_softmax(x * 3, -1), (X(6, 33),)),
    Case("softmax_epilogue", lambda x, y: F.softmax(x + y, -1) * 2 + 1, (X(4, 10), X(10))),
    Case("layer_norm", lambda x, w, b: (F.layer_norm(x, (24,), w, b, 1e-5),
                                        F.layer_norm(x, (24,))), (X(3, 5, 24), X(24), X(24))),
    Case("layer_norm_2d", lambda x, w: F.layer_norm(x + 1, (4, 6), w, None, 1e-3),
         (X(5, 4, 6), X(4, 6))),
    Case("batch_norm_eval", lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b, False, 0.1, 1e-5),
         (X(2, 3, 4, 5), X(3), X(3), X(3), P(3))),
    Case("mean_sum", lambda x: (x.mean((2, 3)), x.mean(-1, keepdim=True), x.sum(), x.sum(1),
                                x.mean()), (X(2, 3, 4, 5),)),
    Case("amax_amin", lambda x: (x.amax(-1), x.amin((0, 2), keepdim=True), x.max(), x.min()),
         (X(3, 4, 5),)),
    Case("var_std", lambda x: (x.var(-1), x.std(1, keepdim=True), torch.var_mean(x, -1),
                               x.var(-1, correction=0)), (X(3, 4, 9),)),
    Case("max_dim", lambda x: x.max(-1), (X(4, 7),), F32, exact=True),
    Case("argmax_argmin", lambda x: (x.argmax(-1), x.argmin(1, keepdim=True), x.argmax()),
         (X(3, 5, 6),), F32, exact=True),
    Case("prod", lambda x: x.prod(-1), (X(4, 5),)),
    Case("logsumexp", lambda x: x.logsumexp(-1), (X(4, 9),)),
    Case("rms_norm", lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
         (X(2, 5, 32), X(32))),
    Case("manual_layer_norm", lambda x: (x - x.mean(-1, keepdim=True)) /
         torch.sqrt(x.var(-1, keepdim=True, correction=0) + 1e-5), (X(4, 16),)),
    Case("mean_then_epilogue", lambda x: torch.sigmoid(x.mean((2, 3), keepdim=True)) * x,
         (X(2, 4, 3, 5),)),
    Case("cumsum", lambda x: (x.cumsum(-1), (x * 2).cumsum(0) + 1), (X(3, 7),)),
    Case("norm", lambda x: x.norm(dim=-1), (X(4, 8),)),
    # remaps
    Case("constant_pad", lambda x: (F.pad(x, (1, 2, 0, 3)), F.pad(x, (-1, 1), value=2.5)),
         (X(2, 3, 5),)),
    Case("flip_repeat", lambda x: (x.flip(-1) + 1, x.repeat(2, 1, 3), x.roll(2, -1)),
         (X(3, 4),)),
    Case("embedding", lambda w, i: F.embedding(i, w) * 2, (X(10, 6), Iv(3, 4, lo=0, hi=10))),
    Case("gather", lambda x, i: x.gather(1, i), (X(4, 6), Iv(4, 3, lo=0, hi=6))),
    Case("index", lambda x, i, j: (x[i], x[:, i, :, j], x[:, i], x[i, :, :, j]),
         (X(4, 5, 6, 7), Iv(3, lo=-4, hi=4), Iv(3, lo=0, hi=7))),
    Case("index_select", lambda x, i: x.index_select(1, i) + 1, (X(3, 5), Iv(4, lo=0, hi=5))),
    # ints and bools
    Case("int_arith", lambda x, y: (x + y * 2, x - 3, x * y, x // y, x % y, x / y, -x, x.abs(),
                                    torch.div(x, y, rounding_mode="trunc"), x ** 2,
                                    x.clamp(-2, 3), torch.maximum(x, y)),
         (Iv(5, 6, lo=-20, hi=20), Iv(6, lo=1, hi=5)), INT, exact=True),
    Case("int_bitwise", lambda x, y: (x & y, x | 3, x ^ y, ~x, x << 2, x >> 1),
         (Iv(4, 5, lo=0, hi=64), Iv(4, 5, lo=0, hi=64)), INT, exact=True),
    Case("int_compare", lambda x, y: (x == y, x != 2, x < y, x <= 0, x > 1, x >= y, x < 2.5,
                                      x * 0.5), (Iv(4, 6), Iv(6)), INT, exact=True),
    Case("bool_logic", lambda a, b: (a & b, a | b, a ^ b, ~a, torch.logical_and(a, b),
                                     torch.logical_or(a, b), torch.logical_xor(a, b),
                                     torch.logical_not(a), a.any(-1), b.all(0), a.any()),
         (B(3, 7), B(3, 7)), INT, exact=True),
    Case("int_reduce", lambda x: (x.sum(-1), x.amax(0), x.cumsum(-1), x.argmax(-1),
                                  (x > 0).sum(1), (x > 0).cumsum(0), x.prod(0)),
         (Iv(4, 6),), INT, exact=True),
    Case("int_casts", lambda x: (x.float() * 0.5, x.to(torch.int8) + 1, x.bool(),
                                 x.to(torch.int32) * 2), (Iv(3, 8, lo=-300, hi=300),),
         INT, exact=True),
    Case("int_where", lambda c, x: (torch.where(c, x, -1), torch.where(c, x, 0.5)),
         (B(4, 5), Iv(4, 5)), INT, exact=True),
]


# ---------------------------------------------------------------------------------------------
# the suite: every (case, dtype) side by side in one module, exported once


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int": torch.float32}
ENTRIES: list[tuple[Case, str]] = [(c, d) for c in CASES for d in c.dtypes]


class Suite(torch.nn.Module):
    """Every entry side by side; forward returns their outputs flattened."""

    def __init__(self, entries: list[tuple[Case, str]]) -> None:
        super().__init__()
        self.entries = entries

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Run each case on its slice of the inputs."""
        out: list[torch.Tensor] = []
        i = 0
        for c, _ in self.entries:
            r = c.fn(*xs[i:i + len(c.ins)])
            i += len(c.ins)
            out.extend(_flat(r))
        return tuple(out)


def _flat(r: Any) -> list[torch.Tensor]:
    if isinstance(r, torch.Tensor):
        return [r]
    return [t for x in r for t in _flat(x)]


def _inputs(entries: list[tuple[Case, str]], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [spec.make(DTYPES[d], gen) for c, d in entries for spec in c.ins]


# ---------------------------------------------------------------------------------------------
# the interpreter: kernels for groups, torch for everything else


def _handle(t: torch.Tensor) -> Any:
    """A runtime handle viewing torch tensor `t` in place."""
    name = str(t.dtype).removeprefix("torch.")
    st = t.untyped_storage()
    base = shims.create_tensor_from_blob(st.data_ptr(), [max(st.nbytes(), 1)], [1], 0, "uint8")
    try:
        return shims.reinterpret_tensor(base, list(t.shape), list(t.stride()),
                                        t.storage_offset(), dtype=name)
    finally:
        shims.delete_tensor_object(base)


def _poisoned(meta: torch.Tensor) -> torch.Tensor:
    out = torch.empty_strided(tuple(meta.shape), tuple(meta.stride()), dtype=meta.dtype)
    if meta.dtype.is_floating_point:
        out.fill_(float("nan"))
    elif meta.dtype != torch.bool:
        out.fill_(-77)
    return out


@dataclass
class Plan:
    """The groups of one mode and their kernels (or the error building one)."""

    groups: list[list[torch.fx.Node]]
    kernels: list[ir.Kernel | None] = field(default_factory=list)
    io: list[tuple[list[torch.fx.Node], list[torch.fx.Node]]] = field(default_factory=list)
    errors: dict[torch.fx.Node, str] = field(default_factory=dict)


def _plan(prefix: str, groups: list[list[torch.fx.Node]]) -> Plan:
    plan = Plan(groups)
    for i, g in enumerate(groups):
        ins, outs = group_io(g)
        plan.io.append((ins, outs))
        try:
            plan.kernels.append(build_kernel(f"{prefix}_{i}", g, ins, outs))
        except Unsupported as e:
            plan.kernels.append(None)
            for n in g:
                plan.errors[n] = str(e)
    return plan


def _run(ep: torch.export.ExportedProgram, plan: Plan, lib: Any, user_inputs: list[Any],
         stream: Any) -> list[Any]:
    """Interpret the graph: groups run their kernel at their last node, the rest in torch
    (a group whose kernel could not be built runs in torch too)."""
    graph = ep.graph
    sig = ep.graph_signature
    last = {g[-1]: k for g, k in zip(plan.groups, range(len(plan.groups)))}
    member = {n for g in plan.groups for n in g}
    env: dict[torch.fx.Node, Any] = {}
    user = iter(user_inputs)
    specs = {s.arg.name: s for s in sig.input_specs}
    for node in graph.nodes:
        if node.op == "placeholder":
            s = specs[node.name]
            if s.kind.name == "USER_INPUT":
                env[node] = next(user)
            elif s.kind.name == "CONSTANT_TENSOR":
                env[node] = ep.constants[s.target]
            else:
                env[node] = ep.state_dict[s.target]
        elif node.op == "call_function":
            if node in member and plan.kernels[_group_index(plan, node)] is not None:
                if node in last:
                    _run_group(plan, last[node], lib, env, stream)
                continue
            if node.target is aten._assert_tensor_metadata.default:
                continue
            args = torch.fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
            env[node] = node.target(*args, **kwargs)
        elif node.op == "output":
            return list(torch.fx.node.map_arg(node.args[0], lambda n: env[n]))
    raise AssertionError("graph without output")


def _group_index(plan: Plan, node: torch.fx.Node) -> int:
    for i, g in enumerate(plan.groups):
        if node in g:
            return i
    raise KeyError(node)


def _run_group(plan: Plan, i: int, lib: Any, env: dict, stream: Any) -> None:
    ins, outs = plan.io[i]
    kernel = plan.kernels[i]
    results = [_poisoned(o.meta["val"]) for o in outs]
    handles = [_handle(env[x]) for x in ins] + [_handle(t) for t in results]
    try:
        lib.kernel(kernel.name)(stream, *handles)
        stream.commit_and_wait()
    finally:
        for h in handles:
            shims.delete_tensor_object(h)
    for o, t in zip(outs, results):
        env[o] = t


# ---------------------------------------------------------------------------------------------
# suite results (computed once per session)


def _rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    # The harness's measure: inf where a NaN or an infinity of either side is not the
    # other's (a lost -inf once gave inf / inf = NaN here, and NaN > tol passed).
    return rel_err(got.detach().cpu().double().numpy(), ref.detach().cpu().double().numpy())


def _compare(case: Case, got: list[Any], eager: list[Any], ref64: list[Any],
             dtype: torch.dtype) -> str | None:
    """None when `got` matches; else what differs."""
    for k, (g, e, r) in enumerate(zip(got, eager, ref64)):
        if g.shape != e.shape or g.dtype != e.dtype:
            return f"output {k}: {g.dtype}{tuple(g.shape)} vs eager {e.dtype}{tuple(e.shape)}"
        if case.exact or not e.dtype.is_floating_point:
            if not torch.equal(g, e) and not (g.dtype.is_floating_point and torch.allclose(
                    g.double(), e.double(), rtol=0, atol=0, equal_nan=True)):
                bad = (g != e).nonzero()[:3].tolist()
                return f"output {k} differs from eager at {bad}: {g.flatten()[:8]} vs " \
                       f"{e.flatten()[:8]}"
            continue
        tol = case.tol or TOL[e.dtype]
        err = _rel_err(g, r)
        if err > tol:
            return f"output {k}: relative error {err:.3g} > {tol} (eager has " \
                   f"{_rel_err(e, r):.3g})"
    return None


@contextlib.contextmanager
def _quick_compile() -> Iterator[None]:
    """Compile the suite's ~800 kernels at -O1: gcc -O3 needs 20 s of CPU for them, -O1 6 s
    (same IEEE semantics: no fast-math either way; the flags are part of the cache key)."""
    saved = cpu_device.CFLAGS
    cpu_device.CFLAGS = ("-O1",) + tuple(f for f in saved if not f.startswith("-O"))
    try:
        yield
    finally:
        cpu_device.CFLAGS = saved


@dataclass
class SuiteRun:
    """Per (case, dtype, mode): None (matches) or the failure."""

    results: dict[tuple[str, str, str], str | None]
    plans: dict[str, Plan]
    ep: torch.export.ExportedProgram


_SUITE: list[SuiteRun | BaseException] = []


def _suite_run() -> SuiteRun:
    """The suite's results, computed once (a failure is kept too, not recomputed per test)."""
    if not _SUITE:
        try:
            _SUITE.append(_compute_suite(ENTRIES))
        except Exception as e:  # noqa: BLE001 - reported by every test that needs it
            _SUITE.append(e)
    if isinstance(_SUITE[0], BaseException):
        raise _SUITE[0]
    return _SUITE[0]


def _compute_suite(entries: list[tuple[Case, str]]) -> SuiteRun:
    module = Suite(entries)
    example = _inputs(entries, 0)
    ep = torch.export.export(module, tuple(example)).run_decompositions(decomposition_table())
    nodes = [n for n in ep.graph.nodes if n.op == "call_function" and fusible(n)]
    singles = [[n] + [u for u in n.users if u in nodes and u.target is operator.getitem]
               for n in nodes if n.target is not operator.getitem]
    plans = {"single": _plan("s", singles), "fused": _plan("f", partition(nodes))}
    dev = get_device("cpu")
    kernels = [k for p in plans.values() for k in p.kernels if k is not None]
    with _quick_compile():
        lib = dev.kernel_library(kernels)
    fresh = _inputs(entries, 1234)
    eager = _flat(module(*fresh))
    ref64 = _flat(module(*[t.double() if t.dtype.is_floating_point else t for t in fresh]))
    bounds, i = [], 0
    for c, d in entries:
        n = len(_flat(c.fn(*_inputs([(c, d)], 0))))
        bounds.append((i, i + n))
        i += n
    results: dict[tuple[str, str, str], str | None] = {}
    owner = Owner("test_fuse")
    stream = dev.create_stream(StreamOptions(deferred=False, check_hazards=True))
    try:
        with owner_scope(owner), dev.stream_guard(stream):
            for mode, plan in plans.items():
                got = _run(ep, plan, lib, fresh, stream)
                for (c, d), (lo, hi) in zip(entries, bounds):
                    err = _case_errors(ep, plan, lo, hi)
                    results[(c.name, d, mode)] = err or _compare(
                        c, got[lo:hi], eager[lo:hi], ref64[lo:hi], DTYPES[d])
    finally:
        stream.close()
        owner.close()
    return SuiteRun(results, plans, ep)


def _case_errors(ep: torch.export.ExportedProgram, plan: Plan, lo: int, hi: int) -> str | None:
    """A build error of any fusible node the case's outputs depend on."""
    out = next(n for n in ep.graph.nodes if n.op == "output")
    stack = [x for x in out.args[0][lo:hi] if isinstance(x, torch.fx.Node)]
    seen: set[torch.fx.Node] = set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in plan.errors:
            return f"{n.name}: {plan.errors[n]}"
        stack.extend(n.all_input_nodes)
    return None


def _params() -> list[Any]:
    out = []
    for c in CASES:
        for suite in c.dtypes:
            for mode in ("single", "fused"):
                out.append(pytest.param(suite, c.name, mode, id=f"{c.name}-{suite}-{mode}"))
    return out


@pytest.mark.parametrize("suite,case,mode", _params())
def test_case_matches_torch(suite: str, case: str, mode: str) -> None:
    """The case's outputs computed by generated kernels match torch."""
    err = _suite_run().results[(case, suite, mode)]
    assert err is None, err


def test_compare_refuses_a_lost_infinity_or_nan() -> None:
    """where_scalar's -inf (and a NaN) replaced by a finite value is a mismatch, as is a
    NaN that the reference does not have: each once counted as a match (NaN error)."""
    case = next(c for c in CASES if c.name == "where_scalar")
    ref = torch.tensor([1.0, float("-inf"), 2.0, float("nan")], dtype=torch.float64)
    good = ref.float()
    assert _compare(case, [good], [good], [ref], torch.float32) is None
    for wrong in ([1.0, -3.4e38, 2.0, float("nan")], [1.0, float("-inf"), 2.0, 0.0],
                  [1.0, float("inf"), 2.0, float("nan")], [float("nan")] * 4):
        got = torch.tensor(wrong, dtype=torch.float32)
        assert _compare(case, [got], [good], [ref], torch.float32) is not None, wrong


# ---------------------------------------------------------------------------------------------
# partition structure


def _check_groups(nodes: list[torch.fx.Node], groups: list[list[torch.fx.Node]]) -> None:
    """Every fusible node sits in exactly one group, groups are in topological order, and
    each can run at its last node: no node outside it uses a member earlier than that."""
    pos = {n: i for i, n in enumerate(nodes[0].graph.nodes)} if nodes else {}
    seen: list[torch.fx.Node] = [n for g in groups for n in g]
    assert len(seen) == len(set(seen)), "a node is in two groups"
    assert set(nodes) <= set(seen), "a fusible node is in no group"
    last = -1
    for g in groups:
        assert [pos[n] for n in g] == sorted(pos[n] for n in g)
        assert pos[g[-1]] > last, "groups are not in run order"
        last = pos[g[-1]]
        members = set(g)
        for m in g:
            for u in m.users:
                assert u in members or pos[u] > pos[g[-1]], \
                    f"{u.name} uses {m.name} before group {[n.name for n in g]} runs"


def _export(fn: Callable[..., Any], *xs: torch.Tensor, table: Any = None
            ) -> torch.export.ExportedProgram:
    class M(torch.nn.Module):
        def forward(self, *a: torch.Tensor) -> Any:
            return fn(*a)
    return torch.export.export(M(), xs).run_decompositions(
        decomposition_table() if table is None else table)


def _fusible_nodes(ep: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    return [n for n in ep.graph.nodes if n.op == "call_function" and fusible(n)]


def _targets(group: list[torch.fx.Node]) -> list[str]:
    return [str(n.target).removeprefix("aten.") for n in group]


def test_partition_fuses_prologues_and_epilogues_of_reductions() -> None:
    """Pointwise prologue + softmax + epilogue, a manual RMS norm, and mean + broadcast
    epilogue each become one kernel; every suite partition obeys the run-order rule."""
    run = _suite_run()
    _check_groups(_fusible_nodes(run.ep), run.plans["fused"].groups)
    groups = [_targets(g) for g in run.plans["fused"].groups]
    assert ["add.Tensor", "_softmax.default", "mul.Tensor", "add.Tensor"] in groups
    assert ["pow.Tensor_Scalar", "mean.dim", "add.Tensor", "rsqrt.default", "mul.Tensor",
            "mul.Tensor"] in groups
    assert ["mean.dim", "sigmoid.default", "mul.Tensor"] in groups
    assert ["mean.dim", "sub.Tensor", "var.correction", "add.Tensor", "sqrt.default",
            "div.Tensor"] in groups


class _Block(torch.nn.Module):
    """A GPT-2 style block; with the full default table its attention decomposes into the
    causal-mask ops (full, arange, le, logical_and, any.dim, where, ...) and softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(32), torch.nn.LayerNorm(32)
        self.qkv, self.proj = torch.nn.Linear(32, 96), torch.nn.Linear(32, 32)
        self.fc, self.out = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attention and MLP with residuals."""
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, -1)
        q, k, v = (y.view(b, t, 4, c // 4).transpose(1, 2) for y in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


def _run_ep(ep: torch.export.ExportedProgram, plan: Plan, xs: list[torch.Tensor]) -> list[Any]:
    dev = get_device("cpu")
    lib = dev.kernel_library([k for k in plan.kernels if k is not None])
    owner = Owner("test_fuse_ep")
    stream = dev.create_stream(StreamOptions(deferred=True, check_hazards=True))
    try:
        with owner_scope(owner), dev.stream_guard(stream):
            return _run(ep, plan, lib, xs, stream)
    finally:
        stream.close()
        owner.close()


class _Blocks(torch.nn.Module):
    """The block in float32 and in bfloat16, side by side (one export)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.f32 = _Block().eval()
        self.bf16 = _Block().eval().to(torch.bfloat16)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both blocks."""
        return self.f32(x), self.bf16(y)


@torch.no_grad()
def test_gpt2_block_with_decomposed_attention() -> None:
    """The whole block (native_layer_norm, the sdpa decomposition with its mask, tanh gelu)
    runs with fused kernels between torch's matmuls and matches float64, in fp32 and bf16."""
    blocks = _Blocks()
    xs = [torch.randn(2, 8, 32), torch.randn(2, 8, 32, dtype=torch.bfloat16)]
    ep = _export(blocks, *xs, table=torch.export.default_decompositions())
    nodes = _fusible_nodes(ep)
    targets = {str(n.target) for n in nodes}
    assert {"aten.native_layer_norm.default", "aten._softmax.default", "aten.any.dim",
            "aten.logical_not.default", "aten.where.self"} <= targets
    groups = partition(nodes)
    _check_groups(nodes, groups)
    assert len(groups) < len(nodes) // 2
    plan = _plan("blk", groups)
    assert not plan.errors, plan.errors
    fresh = [torch.randn(2, 8, 32), torch.randn(2, 8, 32, dtype=torch.bfloat16)]
    got = _run_ep(ep, plan, fresh)
    for g, block, x in zip(got, (blocks.f32, blocks.bf16), fresh):
        ref = copy.deepcopy(block).double()(x.double())
        assert _rel_err(g, ref) < TOL[x.dtype]


def _patterns(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor, ix: torch.Tensor,
              iy: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Partition patterns in one graph (see the test below)."""
    a = torch.sigmoid(x)          # feeds an mm and a later multiply
    m = a @ w
    c = a * 2
    y = v
    for i in range(80):           # a long chain
        y = y * 0.99 + 0.01 * i
    z = v
    for _ in range(20):           # every value used twice: the tree doubles per step
        z = z * torch.sigmoid(z) + 0.5
    gen = torch.where(v > 0, v, -1.5) + torch.zeros(5)   # generators used by one consumer
    return c + m, a.sum(-1), y, z, gen, ix // iy, ix % iy


@torch.no_grad()
def test_partition_patterns() -> None:
    """- sigmoid feeds mm and a later multiply: they cannot share a kernel (the multiply's
      group would have to run both before and after the mm);
    - long chains and exponentially shared expressions split into several kernels;
    - scalar_tensor/full used by one broadcasting consumer fold into it;
    - integer division by zero does not trap (it divides by 1 instead)."""
    def ints() -> list[torch.Tensor]:
        iy = torch.randint(-2, 3, (4, 7))
        iy[0, 0] = 0
        return [torch.randint(-50, 50, (4, 7)), iy]
    x, w, v = torch.randn(4, 6), torch.randn(6, 6), torch.randn(3, 5)
    ep = _export(_patterns, x, w, v, *ints())
    nodes = _fusible_nodes(ep)
    groups = partition(nodes)
    _check_groups(nodes, groups)
    sig = next(n for n in nodes if n.target is aten.sigmoid.default and
               any(u.target is aten.mm.default for u in n.users))
    assert next(g for g in groups if sig in g) == [sig]
    out = next(n for n in ep.graph.nodes if n.op == "output").args[0]
    group_of = {n: i for i, g in enumerate(groups) for n in g}
    chain = {group_of[n] for n in nodes if n.meta["val"].shape == (3, 5)} - {group_of[out[4]]}
    assert len(chain) >= 4
    gen = groups[group_of[out[4]]]
    assert {"scalar_tensor.default", "full.default"} <= set(_targets(gen))
    plan = _plan("pat", groups)
    assert not plan.errors, plan.errors
    fresh = [torch.randn(4, 6), torch.randn(6, 6), torch.randn(3, 5), *ints()]
    got = _run_ep(ep, plan, fresh)
    fresh[-1] = torch.where(fresh[-1] == 0, 1, fresh[-1])
    ref = _patterns(*[t.double() if t.dtype.is_floating_point else t for t in fresh])
    for g, r in zip(got[:5], ref[:5]):
        assert _rel_err(g, r) < 1e-4
    for g, r in zip(got[5:], ref[5:]):
        assert torch.equal(g, r)


# ---------------------------------------------------------------------------------------------
# errors and coverage


def test_unsupported_groups_name_the_op_and_line() -> None:
    """A non-fusible op, mixed reduction spaces, and float64 are refused clearly."""
    def fn(x: torch.Tensor, w: torch.Tensor) -> Any:
        return (x @ w, F.softmax(x, -1), F.softmax(x, 0), x.double() * 2)
    x = torch.randn(4, 4)
    ep = _export(fn, x, x)
    mm = next(n for n in ep.graph.nodes if n.target is aten.mm.default)
    assert not fusible(mm)
    with pytest.raises(Unsupported, match=r"aten\.mm\.default .*test_fuse\.py"):
        build_kernel("k_mm", [mm], list(mm.all_input_nodes), [mm])
    soft = [n for n in ep.graph.nodes if n.target is aten._softmax.default]
    with pytest.raises(Unsupported, match="mixes iteration spaces"):
        build_kernel("k_soft", soft, [soft[0].args[0]], soft)
    dbl = [n for n in ep.graph.nodes if n.op == "call_function" and
           getattr(n.meta.get("val"), "dtype", None) == torch.float64]
    assert dbl and not any(fusible(n) for n in dbl)
    assert all(n not in {m for g in partition(_fusible_nodes(ep)) for m in g} for n in dbl)


def test_export_notes_op_union_is_covered() -> None:
    """Every op of the export-notes union that is not a view or library op is fusible."""
    from aotrt.exporter.optable import OPS
    union = [
        aten._native_batch_norm_legit_no_training.default, aten._softmax.default,
        aten._to_copy.default, aten.add.Tensor, aten.any.dim, aten.arange.start_step,
        aten.bitwise_and.Tensor, aten.clone.default, aten.cumsum.default, aten.div.Tensor,
        aten.embedding.default, aten.eq.Scalar, aten.eq.Tensor, aten.full.default,
        aten.full_like.default, aten.gather.default, aten.ge.Scalar, aten.gelu.default,
        aten.index.Tensor, aten.le.Scalar, aten.le.Tensor, aten.logical_and.default,
        aten.logical_not.default, aten.mean.dim, aten.mul.Scalar, aten.mul.Tensor,
        aten.native_layer_norm.default, aten.ne.Scalar, aten.pow.Tensor_Scalar,
        aten.relu.default, aten.scalar_tensor.default, aten.sigmoid.default,
        aten.sub.Tensor, aten.tanh.default, aten.where.self, aten.layer_norm.default,
        # the benchmark models' other common ops
        aten.hardswish.default, aten.hardsigmoid.default, aten.silu.default, aten.erf.default,
        aten.rsqrt.default, aten.var.correction, aten.var_mean.correction, aten.amax.default,
        aten.sum.dim_IntList, aten.constant_pad_nd.default, aten.clamp.default,
        aten.hardtanh.default, aten.maximum.default, aten.exp.default, aten.log.default,
    ]
    missing = [str(op) for op in union if op not in OPS]
    assert not missing, missing


def test_kernels_survive_the_program_file_json() -> None:
    """Every suite kernel serializes to the program file's JSON and back unchanged."""
    for plan in _suite_run().plans.values():
        kernels = [k for k in plan.kernels if k is not None]
        back = ir.from_json(json.loads(ir.dumps(kernels)))
        assert tuple(back) == tuple(kernels)
