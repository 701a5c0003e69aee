"""Bounded dynamic sizes at export: torch.export's Dims -> a method with symbols.

1. torch.export with the user's `dynamic_shapes` proves the graph holds over the whole
   range (torch refuses code that specialises a Dim) and gives each symbol its bounds; an
   unbounded dim, or one derived from another (`2*S`), is refused naming the input and dim.
2. The module is lowered statically at a few sizes: the upper bounds (the stored method,
   its memory planned there) and, per symbol, sizes >= 2 inside the range (size 1 lowers
   differently: the kernels drop unit dims). Every lowering must have the same structure.
3. Every int that differs between them (sizes, strides, view offsets, kernel extents and
   index constants, library params) is fitted as a polynomial with integer coefficients
   over the symbols (terms 1, S, S*S, S*T), non-negative except for the constant term, and
   checked at one more size. Anything else (a float constant or a weight that depends on a
   size, a size like S // 2, a size that shrinks as S grows) is Unsupported, naming it.
The runtime instantiates the method per size and validates it (aotrt/program/symbols.py).
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import logging
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree

from aotrt.errors import Unsupported
from aotrt.exporter.builder import ProgramBuilder
from aotrt.kernels import ir
from aotrt.program import Program
from aotrt.program.symbols import MAX_SYMBOLS

log = logging.getLogger(__name__)

#: the largest bound a symbol may have (sizes are < 2**31 in the format)
MAX_BOUND = (1 << 31) - 1


@dataclass
class Symbol:
    """One dynamic size: its name, bounds, and the (input, dim) pairs that are it."""

    name: str
    lo: int
    hi: int
    dims: list[tuple[int, int]] = field(default_factory=list)


def symbols_of(ep: torch.export.ExportedProgram, names: dict[tuple[int, int], str]
               ) -> list[Symbol]:
    """The symbols of `ep`'s tensor inputs (`names`: (input, dim) -> the user's Dim name)."""
    user = set(ep.graph_signature.user_inputs)
    out: dict[Any, Symbol] = {}
    k = 0
    for node in ep.graph.nodes:
        if node.op != "placeholder" or node.name not in user:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for d, size in enumerate(val.shape):
            if not isinstance(size, torch.SymInt):
                continue
            expr = size.node.expr
            where = f"input {node.name!r} dim {d}"
            if not getattr(expr, "is_Symbol", False):
                raise Unsupported(f"{where} is {expr}, a size derived from another: give each "
                                  f"dynamic dim a Dim of its own")
            if expr not in out:
                vr = ep.range_constraints.get(expr)
                lo, hi = (vr.lower, vr.upper) if vr is not None else (0, None)
                try:
                    hi_i = int(hi) if getattr(hi, "is_finite", True) else None
                except Exception:  # noqa: BLE001 - sympy's infinities raise several types
                    hi_i = None
                if hi_i is None or hi_i > MAX_BOUND:
                    raise Unsupported(f"{where} is unbounded (Dim {names.get((k, d), expr)!s}):"
                                      f" aotrt plans memory at the upper bound; give it a max,"
                                      f" e.g. Dim('S', min=1, max=64) or Dim.AUTO(max=64)")
                name = names.get((k, d)) or f"{node.name}_{d}"
                out[expr] = Symbol(_ident(name), max(int(lo), 0), hi_i)
            out[expr].dims.append((k, d))
        k += 1
    syms = list(out.values())
    if len(syms) > MAX_SYMBOLS:
        raise Unsupported(f"{len(syms)} dynamic dims; a method has at most {MAX_SYMBOLS}")
    seen: set[str] = set()
    for s in syms:
        while s.name in seen:
            s.name += "_"
        seen.add(s.name)
    return syms


def dim_names(model: Any, args: Sequence[Any], kwargs: dict[str, Any] | None,
              dynamic_shapes: Any) -> dict[tuple[int, int], str]:
    """(tensor input index, dim) -> the name of the user's Dim there (best effort)."""
    specs: list[Any] = []
    if isinstance(dynamic_shapes, dict) and isinstance(model, torch.nn.Module):
        try:
            bound = inspect.signature(model.forward).bind(*args, **(kwargs or {}))
            specs = [dynamic_shapes.get(p) for p in bound.arguments]
        except TypeError:
            specs = []
    elif isinstance(dynamic_shapes, (tuple, list)):
        specs = list(dynamic_shapes)
    out: dict[tuple[int, int], str] = {}
    for k, spec in enumerate(specs):
        items = spec.items() if isinstance(spec, dict) else (
            enumerate(spec) if isinstance(spec, (tuple, list)) else ())
        for d, dim in items:
            name = getattr(dim, "__name__", None)
            if isinstance(name, str) and isinstance(d, int):
                out[(k, d)] = name
    return out


def resized(args: Sequence[Any], kwargs: dict[str, Any] | None, symbols: list[Symbol],
            values: dict[str, int]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The example arguments with every dynamic dim at `values` (zeros: a static export
    reads no values)."""
    sizes: dict[tuple[int, int], int] = {}
    for s in symbols:
        for kd in s.dims:
            sizes[kd] = values[s.name]
    leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs or {})))
    k = 0
    new = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            shape = [sizes.get((k, d), n) for d, n in enumerate(leaf.shape)]
            if shape != list(leaf.shape):
                leaf = torch.zeros(shape, dtype=leaf.dtype, device=leaf.device)
            k += 1
        new.append(leaf)
    a, kw = pytree.tree_unflatten(new, spec)
    return a, kw


# -- sampling and fitting ---------------------------------------------------------------------


def sample_plan(symbols: list[Symbol]) -> tuple[list[dict[str, int]], list[tuple[str, ...]],
                                                list[dict[str, int]]]:
    """(fit points, monomials, check points): the base point (every symbol at its max)
    first; per symbol up to two more sizes >= 2, for the S and S*S terms; one point per
    pair for S*T; then one point to check the fit at."""
    base = {s.name: s.hi for s in symbols}
    picks: dict[str, list[int]] = {}
    for s in symbols:
        cand = list(range(max(s.lo, 2), s.hi))[::-1]
        if len(cand) > 3:
            n = len(cand)
            cand = list(dict.fromkeys([cand[n // 2], cand[n // 4], cand[(3 * n) // 4]]))
        if not cand:
            raise Unsupported(f"Dim {s.name} in [{s.lo}, {s.hi}] has no size >= 2 below its "
                              f"max to fit its sizes at; widen the range, or export each "
                              f"size as a method of its own")
        picks[s.name] = cand
    points, monos = [dict(base)], [()]
    for s in symbols:
        for deg, m in enumerate(picks[s.name][:2], start=1):
            points.append({**base, s.name: m})
            monos.append((s.name,) * deg)
    for a, b in itertools.combinations(symbols, 2):
        points.append({**base, a.name: picks[a.name][0], b.name: picks[b.name][0]})
        monos.append((a.name, b.name))
    checks = []
    check = {s.name: picks[s.name][min(2, len(picks[s.name]) - 1)] for s in symbols}
    if check not in points:
        checks.append(check)
    return points, monos, checks


def _invert(rows: list[list[Fraction]]) -> list[list[Fraction]] | None:
    n = len(rows)
    a = [r[:] + [Fraction(int(i == j)) for j in range(n)] for i, r in enumerate(rows)]
    for c in range(n):
        p = next((r for r in range(c, n) if a[r][c] != 0), None)
        if p is None:
            return None
        a[c], a[p] = a[p], a[c]
        piv = a[c][c]
        a[c] = [x / piv for x in a[c]]
        for r in range(n):
            if r != c and a[r][c] != 0:
                f = a[r][c]
                a[r] = [x - f * y for x, y in zip(a[r], a[c])]
    return [r[n:] for r in a]


def _mono(point: dict[str, int], mono: tuple[str, ...]) -> int:
    v = 1
    for s in mono:
        v *= point[s]
    return v


class Fitter:
    """Fits each varying int over the sample points (see the module docstring)."""

    def __init__(self, points: list[dict[str, int]], monos: list[tuple[str, ...]],
                 checks: list[dict[str, int]]) -> None:
        self.points, self.monos, self.checks = points, monos, checks
        inv = _invert([[Fraction(_mono(p, m)) for m in monos] for p in points])
        if inv is None:
            raise Unsupported("the sample sizes do not determine the size expressions")
        self.inv = inv

    def fit(self, values: Sequence[int], check_values: Sequence[int]) -> list[list[Any]] | None:
        """The expression (term list) through `values`, or None: not integer, shrinking,
        or wrong at the check points."""
        coefs = [sum((r * v for r, v in zip(row, values)), Fraction(0)) for row in self.inv]
        if any(c.denominator != 1 for c in coefs):
            return None
        terms = [[int(c), *m] for c, m in zip(coefs, self.monos) if c != 0]
        if any(t[0] < 0 for t in terms if len(t) > 1):
            return None
        for p, v in zip(self.checks, check_values):
            if sum(t[0] * _mono(p, tuple(t[1:])) for t in terms) != v:
                return None
        return terms or [[0]]


def builder_doc(pb: ProgramBuilder) -> dict[str, Any]:
    """The pre-plan program as JSON-like data, compared across sizes."""
    consts = {n: [str(a.dtype), list(a.shape),
                  hashlib.sha256(a.tobytes()).hexdigest()] for n, a in pb.constants.items()}
    return {"inputs": pb.inputs, "outputs": pb.outputs, "tensors": pb.tensors,
            "instructions": pb.instructions, "outputs_tensors": pb.outputs_tensors,
            "kernels": {n: ir.to_json(k) for n, k in pb.kernels.items()},
            "buffers": pb.buffers, "constants": consts, "states": pb.states}


_VARYING = {"inputs", "outputs", "tensors", "instructions", "kernels", "buffers"}


def _leaves(docs: list[Any], path: list[Any], out: list[tuple[list[Any], list[int]]],
            say: Callable[[list[Any], str], Unsupported]) -> None:
    """Every int leaf's path and values across `docs`; Unsupported where they differ in
    anything but ints."""
    first = docs[0]
    if isinstance(first, dict):
        if any(not isinstance(d, dict) or d.keys() != first.keys() for d in docs):
            raise say(path, "its fields differ between sizes")
        for k in first:
            _leaves([d[k] for d in docs], path + [k], out, say)
    elif isinstance(first, (list, tuple)):
        if any(not isinstance(d, (list, tuple)) or len(d) != len(first) for d in docs):
            raise say(path, "its length differs between sizes")
        for i in range(len(first)):
            _leaves([d[i] for d in docs], path + [i], out, say)
    elif type(first) is int:
        if any(type(d) is not int for d in docs):
            raise say(path, "it differs between sizes")
        if any(d != first for d in docs):
            out.append((path, list(docs)))
    elif any(type(d) is not type(first) or d != first for d in docs):
        raise say(path, f"it differs between sizes ({docs[0]!r} and {docs[-1]!r}, e.g. a "
                        f"float that depends on a size, such as a mean over a dynamic dim)")


def fit_method(builders: list[ProgramBuilder], checks: list[ProgramBuilder],
               fitter: Fitter, symbols: list[Symbol]) -> Program:
    """The method at the base point (builders[0]) with its symbolic fields."""
    docs = [builder_doc(b) for b in builders + checks]
    base = builders[0]

    def say(path: list[Any], why: str) -> Unsupported:
        return Unsupported(f"dynamic sizes {[s.name for s in symbols]}: "
                           f"{_describe(base, path)}: {why}")

    leaves: list[tuple[list[Any], list[int]]] = []
    _leaves(docs, [], leaves, say)
    prog = base.build()
    n = len(builders)
    symbolic: list[dict[str, Any]] = []
    for path, values in leaves:
        if path[0] not in _VARYING or (path[0] == "tensors" and path[2] in ("index", "root")) \
                or (path[0] == "instructions" and path[2] != "params"):
            raise say(path, "it differs between sizes")
        expr = fitter.fit(values[:n], values[n:])
        if expr is None:
            raise say(path, f"its values {values} at the sample sizes are no polynomial with "
                            f"integer coefficients that grows with the sizes (such as S // 2, "
                            f"or a size that shrinks as S grows): unsupported")
        if path[0] == "buffers":
            continue        # planned at the upper bound: only its growth mattered
        if path[0] == "tensors" and path[2] == "byte_offset" and \
                base.tensors[path[1]]["root"] == "buffer":
            # rebased onto the buffer's offset in the arena, planned at the upper bound
            shift = prog.tensors[path[1]]["byte_offset"] - values[0]
            expr = _add_const(expr, shift)
        symbolic.append({"at": path, "expr": expr})
    prog.version = 2
    prog.symbols = [{"name": s.name, "min": s.lo, "max": s.hi} for s in symbols]
    prog.symbolic = symbolic
    prog.validate()
    return prog


def _add_const(expr: list[list[Any]], c: int) -> list[list[Any]]:
    out = [t[:] for t in expr]
    for t in out:
        if len(t) == 1:
            t[0] += c
            return [t for t in out if t[0] != 0 or len(t) > 1] or [[0]]
    return out + ([[c]] if c else [])


def _describe(pb: ProgramBuilder, path: list[Any]) -> str:
    """A field of the pre-plan program, with the source line of the op that uses it."""
    where = "".join(f"[{p!r}]" if isinstance(p, str) and i else
                    (f"[{p}]" if i else str(p)) for i, p in enumerate(path))
    src = ""
    if path[0] == "instructions" and isinstance(path[1], int):
        src = pb.instructions[path[1]].get("src", "")
    elif path[0] == "kernels":
        src = next((ins.get("src", "") for ins in pb.instructions
                    if ins.get("name") == path[1]), "")
    elif path[0] == "tensors" and isinstance(path[1], int):
        from aotrt.exporter.builder import _tensor_ids
        src = next((ins.get("src") or ins.get("src_line", "") for ins in pb.instructions
                    if path[1] in _tensor_ids(ins)), "")
    elif path[0] == "constants":
        return f"constant {path[1]!r} (a weight or folded value) depends on the size"
    return where + (f" ({src})" if src else "")


def _ident(name: str) -> str:
    s = "".join(c if c.isalnum() or c == "_" else "_" for c in str(name))[:64] or "S"
    return s if s.isidentifier() else f"S_{s}"[:64]


__all__ = ["Fitter", "Symbol", "builder_doc", "dim_names", "fit_method", "resized",
           "sample_plan", "symbols_of"]
