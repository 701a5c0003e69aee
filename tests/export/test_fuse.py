"""Fusion (aotrt/export/fuse.py, pointwise.py, reductions.py): kernels built from exported
graphs run on the cpu device and match torch.

The cases are gathered into a few suite modules, each exported and decomposed once (that is
the slow part). Every suite graph runs twice through a small interpreter: once with a kernel
per fusible node and once with the groups of `partition`; the other nodes (views, matmuls)
run in torch. Each case then compares its outputs with a float64 reference of the same code
(floats: relative error fp32 1e-4, bf16 2e-2) or with eager exactly (ints, bools, casts).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

from aotrt.errors import Unsupported
from aotrt.export.capture import decomposition_table
from aotrt.export.fuse import build_kernel, fusible, group_io, partition
from aotrt.kernels import ir
from aotrt.runtime import shims
from aotrt.runtime.device import StreamOptions, get_device
from aotrt.runtime.memory import Owner, owner_scope

aten = torch.ops.aten
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}


# ---------------------------------------------------------------------------------------------
# inputs


@dataclass(frozen=True)
class In:
    """An input: shape, kind ('f' float of the suite dtype, 'pos' positive float, 'i' ints
    in [lo, hi), 'b' bools, 'f32' always float32), plus an optional layout: `perm` makes a
    permuted view of a contiguous tensor, `expand` a stride-0 view along dim 0, `offset` a
    slice of a wider tensor (non-zero storage offset)."""

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
        if self.kind in ("f", "f32", "pos"):
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
         (X(5, 8),)),
    Case("unary_transcendental", lambda x: (x.exp(), x.sigmoid(), x.tanh(), x.erf(), x.sin(),
                                            x.cos(), x.atan(), torch.expm1(x)), (X(4, 8),)),
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
    Case("index", lambda x, i, j: (x[i], x[:, i, :, j], x[:, i], x[i, :, j]),
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
# suites: all cases of one dtype exported as one module


class Suite(torch.nn.Module):
    """Every case of a suite side by side; forward returns their outputs flattened."""

    def __init__(self, cases: list[Case]) -> None:
        super().__init__()
        self.cases = cases

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Run each case on its slice of the inputs."""
        out: list[torch.Tensor] = []
        i = 0
        for c in self.cases:
            r = c.fn(*xs[i:i + len(c.ins)])
            i += len(c.ins)
            out.extend(_flat(r))
        return tuple(out)


def _flat(r: Any) -> list[torch.Tensor]:
    if isinstance(r, torch.Tensor):
        return [r]
    return [t for x in r for t in _flat(x)]


def _suite_cases(suite: str) -> list[Case]:
    return [c for c in CASES if suite in c.dtypes]


def _suite_dtype(suite: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(suite, torch.float32)


def _inputs(cases: list[Case], dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [spec.make(dtype, gen) for c in cases for spec in c.ins]


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
    got64, ref64 = got.double(), ref.double()
    if not torch.isfinite(got64).all():
        same = (got64 == ref64) | (got64.isnan() & ref64.isnan())
        if not same[~torch.isfinite(got64)].all():
            return math.inf
        got64 = torch.where(torch.isfinite(got64), got64, 0.0)
        ref64 = torch.where(torch.isfinite(ref64), ref64, 0.0)
    return float((got64 - ref64).norm() / max(float(ref64.norm()), 1e-30))


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


@dataclass
class SuiteRun:
    """Per case and mode: None (matches) or the failure."""

    results: dict[tuple[str, str], str | None]
    plans: dict[str, Plan]
    ep: torch.export.ExportedProgram


_SUITES: dict[str, SuiteRun] = {}


def _suite_run(suite: str) -> SuiteRun:
    if suite not in _SUITES:
        _SUITES[suite] = _compute_suite(suite)
    return _SUITES[suite]


def _compute_suite(suite: str) -> SuiteRun:
    cases = _suite_cases(suite)
    dtype = _suite_dtype(suite)
    module = Suite(cases)
    example = _inputs(cases, dtype, 0)
    ep = torch.export.export(module, tuple(example)).run_decompositions(decomposition_table())
    nodes = [n for n in ep.graph.nodes if n.op == "call_function" and fusible(n)]
    singles = [[n] + [u for u in n.users if u in nodes and u.target is operator.getitem]
               for n in nodes if n.target is not operator.getitem]
    plans = {"single": _plan(f"{suite}_s", singles), "fused": _plan(f"{suite}_f",
                                                                      partition(nodes))}
    dev = get_device("cpu")
    kernels = [k for p in plans.values() for k in p.kernels if k is not None]
    lib = dev.kernel_library(kernels)
    fresh = _inputs(cases, dtype, 1234)
    eager = _flat(module(*fresh))
    ref_in = [t.double() if t.dtype.is_floating_point else t for t in fresh]
    ref64 = _flat(module(*ref_in))
    bounds, i = [], 0
    for c in cases:
        n = len(_flat(c.fn(*_inputs([c], dtype, 0))))
        bounds.append((i, i + n))
        i += n
    results: dict[tuple[str, str], str | None] = {}
    owner = Owner("test_fuse")
    stream = dev.create_stream(StreamOptions(deferred=False, check_hazards=True))
    try:
        with owner_scope(owner), dev.stream_guard(stream):
            for mode, plan in plans.items():
                got = _run(ep, plan, lib, fresh, stream)
                for c, (lo, hi) in zip(cases, bounds):
                    err = _case_errors(ep, plan, lo, hi)
                    results[(c.name, mode)] = err or _compare(
                        c, got[lo:hi], eager[lo:hi], ref64[lo:hi], dtype)
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
    run = _suite_run(suite)
    err = run.results[(case, mode)]
    assert err is None, err
