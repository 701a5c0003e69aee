"""Bounded dynamic sizes in a program file: a method's symbols, the sizes that depend on
them, and the concrete method at one assignment of the symbols (docs/PROGRAM.md,
"Dynamic sizes"). No torch and no runtime here.

A dynamic method is stored at its upper bound: every field holds its value with every
symbol at its max (the memory plan included), and `symbolic` lists where a field depends
on a symbol, each as a polynomial with integer coefficients, non-negative except for the
constant term, over at most two symbols per term (`a*S + b`, `a*S*T`, `a*S*S`). So every
size grows with its symbols, and the plan made at the upper bound holds every smaller size.
`instantiate` writes the values for one assignment into a copy of the method; the copy is
then validated as any static method is (views inside their roots, the kernels' bounds), so
the file's symbolic table cannot make a run reach outside its memory at any size.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping, Sequence

from aotrt.errors import ProgramError
from aotrt.kernels import ir
from aotrt.program.validate import SIZE_LIMIT, check_dict, check_int, check_list, fail

#: symbols in one method, terms in one expression, symbolic fields in one method
MAX_SYMBOLS = 8
MAX_TERMS = 8
MAX_SYMBOLIC = 1 << 16
#: a coefficient's magnitude (and a symbol's upper bound: SIZE_LIMIT)
COEF_LIMIT = 1 << 40
#: the sections of a method a symbolic field may be in, and the fields there
SECTIONS = ("inputs", "outputs", "tensors", "instructions", "kernels")
_SPEC_FIELDS = ("shape", "strides")
_TENSOR_FIELDS = ("sizes", "strides", "byte_offset")

Expr = list          # [[coef, sym?, sym?], ...]
Path = list          # [section, index or kernel name, field, ...]


def evaluate(expr: Sequence[Sequence[Any]], values: Mapping[str, int]) -> int:
    """The value of a (validated) expression with the symbols at `values`."""
    total = 0
    for term in expr:
        v = term[0]
        for s in term[1:]:
            v *= values[s]
        total += v
    return total


def expr_text(expr: Sequence[Sequence[Any]]) -> str:
    """A (validated) expression as text: 'S', '2*S*T + S - 4'."""
    parts = []
    for term in expr:
        coef, syms = term[0], "*".join(term[1:])
        if not syms:
            parts.append(str(coef))
        elif coef != 0:
            parts.append(syms if coef == 1 else f"{coef}*{syms}")
    text = " + ".join(parts) or "0"
    return text.replace("+ -", "- ")


def check_symbols(symbols: Any, where: str) -> dict[str, tuple[int, int]]:
    """name -> (min, max) of a method's `symbols` table; ProgramError naming the field."""
    syms = check_list(symbols, where, MAX_SYMBOLS)
    out: dict[str, tuple[int, int]] = {}
    for i, s in enumerate(syms):
        w = f"{where}[{i}]"
        s = check_dict(s, w, {"name", "min", "max"})
        name = s["name"]
        if not isinstance(name, str) or not name.isidentifier() or len(name) > 64:
            raise fail(f"{w}.name", f"a symbol name must be an identifier of at most 64 "
                                    f"characters, got {name!r}"[:200])
        if name in out:
            raise fail(f"{w}.name", f"duplicate symbol {name!r}")
        lo = check_int(s["min"], f"{w}.min", 0, SIZE_LIMIT - 1)
        hi = check_int(s["max"], f"{w}.max", 0, SIZE_LIMIT - 1)
        if lo > hi:
            raise fail(w, f"symbol {name!r}: min {lo} > max {hi}")
        out[name] = (lo, hi)
    return out


def check_expr(expr: Any, bounds: Mapping[str, tuple[int, int]], where: str) -> Expr:
    """A polynomial term list: [[coef], [coef, S], [coef, S, T]]; non-constant terms have
    coefficients >= 0 (sizes grow with their symbols), symbols are the method's."""
    terms = check_list(expr, where, MAX_TERMS)
    if not terms:
        raise fail(where, "an expression needs at least one term")
    for j, term in enumerate(terms):
        w = f"{where}[{j}]"
        term = check_list(term, w, 3)
        if not term:
            raise fail(w, "a term is [coefficient, symbol...]")
        lo = 0 if len(term) > 1 else -COEF_LIMIT
        check_int(term[0], f"{w}[0]", lo, COEF_LIMIT)
        for s in term[1:]:
            if not isinstance(s, str) or s not in bounds:
                raise fail(w, f"unknown symbol {s!r}"[:200] + f"; the method's symbols are "
                                                           f"{sorted(bounds)}")
    return terms


def resolve(doc: Mapping[str, Any], path: Any, where: str) -> tuple[Any, Any]:
    """(container, key) of the int a symbolic field's path names in a method's document
    (`doc`: section -> list, `kernels` -> name -> kernel JSON); ProgramError if the path is
    outside the allowed fields or names no int."""
    p = check_list(path, where, 4096)
    if len(p) < 3 or p[0] not in SECTIONS:
        raise fail(where, f"a path starts with one of {list(SECTIONS)}, an index or kernel "
                          f"name and a field, got {str(path)[:120]}")
    sec = p[0]
    if sec in ("inputs", "outputs") and not (len(p) == 4 and p[2] in _SPEC_FIELDS):
        raise fail(where, f"{sec}: only shape[d] and strides[d] may be symbolic")
    if sec == "tensors" and not ((len(p) == 4 and p[2] in ("sizes", "strides")) or
                                 (len(p) == 3 and p[2] == "byte_offset")):
        raise fail(where, "tensors: only sizes[d], strides[d] and byte_offset may be symbolic")
    if sec == "instructions" and p[2] != "params":
        raise fail(where, "instructions: only params may be symbolic")
    node: Any = doc[sec]
    parent, key = None, None
    for k in p[1:]:
        if isinstance(node, list) and type(k) is int and 0 <= k < len(node):
            parent, key, node = node, k, node[k]
        elif isinstance(node, dict) and isinstance(k, str) and k in node and k != "t":
            parent, key, node = node, k, node[k]
        else:
            raise fail(where, f"path {str(path)[:120]} names nothing in the method")
    if type(node) is not int:
        raise fail(where, f"path {str(path)[:120]} names a {type(node).__name__}, not an int")
    return parent, key


def method_doc(m: Any, kernels: Sequence[ir.Kernel]) -> dict[str, Any]:
    """The parts of method Program `m` that symbolic paths name (kernels: the ones it runs,
    by name, as JSON)."""
    used = {ins.get("name") for ins in m.instructions if ins.get("op") == "kernel"}
    return {"inputs": m.inputs, "outputs": m.outputs, "tensors": m.tensors,
            "instructions": m.instructions,
            "kernels": {k.name: ir.to_json(k) for k in kernels if k.name in used}}


def check_symbolic(m: Any, where: str) -> dict[str, tuple[int, int]]:
    """Validate method `m`'s `symbols` and `symbolic` tables against its fields: every
    expression evaluates, at the upper bounds, to the value stored; every symbol is some
    input's dim exactly (so a run binds it); returns the bounds."""
    bounds = check_symbols(m.symbols, f"{where}symbols")
    table = check_list(m.symbolic, f"{where}symbolic", MAX_SYMBOLIC)
    if not bounds:
        raise fail(f"{where}symbols", "a method with symbolic fields declares its symbols")
    doc = method_doc(m, m.kernels)
    top = {s: hi for s, (lo, hi) in bounds.items()}
    seen: set[str] = set()
    bound_by_input: set[str] = set()
    for i, entry in enumerate(table):
        w = f"{where}symbolic[{i}]"
        entry = check_dict(entry, w, {"at", "expr"})
        parent, key = resolve(doc, entry["at"], f"{w}.at")
        at = str(entry["at"])
        if at in seen:
            raise fail(f"{w}.at", f"path {at[:120]} is listed twice")
        seen.add(at)
        expr = check_expr(entry["expr"], bounds, f"{w}.expr")
        if evaluate(expr, top) != parent[key]:
            raise fail(w, f"the expression gives {evaluate(expr, top)} at the upper bounds, but "
                          f"the field holds {parent[key]}")
        p = entry["at"]
        if p[0] == "inputs" and p[2] == "shape" and len(expr) == 1 and expr[0][0] == 1 \
                and len(expr[0]) == 2:
            bound_by_input.add(expr[0][1])
    unbound = sorted(set(bounds) - bound_by_input)
    if unbound:
        raise fail(f"{where}symbols", f"symbols {unbound} are no input's dim: a run could not "
                                      f"bind them")
    return bounds


def input_dims(m: Any) -> dict[str, list[tuple[int, int]]]:
    """symbol -> [(input index, dim)] where an input's size is exactly that symbol."""
    out: dict[str, list[tuple[int, int]]] = {}
    for entry in m.symbolic:
        p, expr = entry["at"], entry["expr"]
        if p[0] == "inputs" and p[2] == "shape" and len(expr) == 1 and len(expr[0]) == 2 \
                and expr[0][0] == 1:
            out.setdefault(expr[0][1], []).append((p[1], p[3]))
    return out


def instantiate(m: Any, values: Mapping[str, int]) -> Any:
    """A static copy of (checked) method Program `m` with its symbols at `values`: its
    fields written for those sizes, its kernels rewritten where they depend on them, the
    arena kept (planned at the upper bound). Validate the result before running it."""
    doc = method_doc(m, m.kernels)
    patched: dict[str, Any] = {}
    for entry in m.symbolic:
        p = entry["at"]
        sec = p[0]
        if sec not in patched:
            patched[sec] = copy.deepcopy(doc[sec])
        parent, key = resolve(patched, p, "symbolic")
        parent[key] = evaluate(entry["expr"], values)
    kernels = list(m.kernels)
    if "kernels" in patched:
        symbolic = {e["at"][1] for e in m.symbolic if e["at"][0] == "kernels"}
        kernels = [_rebuilt(patched["kernels"][k.name], k.name)
                   if k.name in patched["kernels"] and k.name in symbolic else k
                   for k in m.kernels]
    out = type(m)(inputs=patched.get("inputs", m.inputs),
                  outputs=patched.get("outputs", m.outputs),
                  arena_nbytes=m.arena_nbytes,
                  tensors=patched.get("tensors", m.tensors),
                  instructions=patched.get("instructions", m.instructions),
                  outputs_tensors=m.outputs_tensors, version=2)
    out.constants, out.kernels, out.state = m.constants, kernels, m.state
    out.provenance = m.provenance
    return out


def _rebuilt(kj: Any, name: str) -> ir.Kernel:
    """Kernel `name` from its JSON with symbolic fields written: a field that the sizes make
    invalid (a negative size, dim or argument) is refused naming the kernel."""
    try:
        return ir.from_json(kj)
    except ProgramError as e:
        raise fail(f"kernels[{name!r}]"[:120], str(e)) from None


__all__ = ["MAX_SYMBOLS", "check_symbolic", "check_symbols", "evaluate", "expr_text",
           "input_dims", "instantiate", "method_doc", "resolve"]
