"""Mutators of the program fields that dynamic sizes and packed weights added (issues 35, 38).

- `mutate_symbols`: a symbol's bounds (min > max, negative, huge, past int32, not ints), its
  name, an added or dropped symbol; or the bounds moved *consistently*: every symbolic field
  rewritten for the new upper bound (sometimes with the arena grown to match), so that the
  file passes the table's own checks and the views, kernels and budget must bound it.
- `mutate_symbolic`: a size polynomial's terms changed with the value at the upper bounds
  kept (so the lower end and the sizes between must be proven), squared terms, the other
  symbol, huge or negative coefficients, too many terms; an entry dropped, duplicated or
  pointed at another field; a new entry making any int of a kernel's IR (a clamp bound, an
  index constant, a Load's argument) depend on a symbol.
- `mutate_packing`: a quantized layer's packing: linear_wq's bits and group size, its
  inputs swapped or dropped, a packed view reshaped (same or another element count), a
  packed constant resized or retyped consistently (document, safetensors entry, data and
  views together), and the int constants of kernels that read a packed table (the gather's
  clamp and row stride).
"""

from __future__ import annotations

import copy
import random
from typing import Any

from tests.fuzz.seeds import _ST_CODE

#: values for a symbol bound or a coefficient that no valid file holds, or only just
BOUND_EDGES: list[Any] = [-1, 0, 1, 2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64,
                          -2**63, 1.5, True, None, "S", [1]]
COEF_EDGES: list[Any] = [0, 1, 2, 3, 7, -1, -2, 2**20, 2**39, 2**40 - 1, 2**40, 2**40 + 1,
                         -2**40, -2**40 - 1, 2**62, 1.5, None, "S"]


def _dynamic_methods(doc: Any) -> list[dict]:
    methods = doc.get("methods") if isinstance(doc, dict) else None
    if not isinstance(methods, dict):
        return []
    return [m for m in methods.values() if isinstance(m, dict) and
            isinstance(m.get("symbols"), list) and isinstance(m.get("symbolic"), list)]


def _kernel_json(doc: dict, name: Any) -> Any:
    for k in doc.get("kernels") or []:
        if isinstance(k, dict) and k.get("name") == name:
            return k
    return None


def _field(doc: dict, m: dict, path: Any) -> tuple[Any, Any] | None:
    """(container, key) of the int a symbolic path names (kernels: the program's JSON of
    the kernel of that name), or None when it names nothing any more."""
    if not isinstance(path, list) or len(path) < 3:
        return None
    node = _kernel_json(doc, path[1]) if path[0] == "kernels" else None
    rest = path[2:] if path[0] == "kernels" else path[1:]
    if path[0] != "kernels":
        node = m.get(path[0]) if isinstance(path[0], str) else None
    parent, key = None, None
    for k in rest:
        if isinstance(node, list) and type(k) is int and 0 <= k < len(node):
            parent, key, node = node, k, node[k]
        elif isinstance(node, dict) and isinstance(k, str) and k in node:
            parent, key, node = node, k, node[k]
        else:
            return None
    return (parent, key) if type(node) is int else None


def _value(expr: Any, values: dict[str, int]) -> int | None:
    """An expression's value at `values`, or None when it is malformed."""
    try:
        total = 0
        for term in expr:
            v = term[0]
            for s in term[1:]:
                v *= values[s]
            total += v
        return total if type(total) is int else None
    except (TypeError, KeyError, IndexError):
        return None


def _bounds(m: dict, end: str) -> dict[str, int]:
    return {s["name"]: s[end] for s in m["symbols"] if isinstance(s, dict) and
            isinstance(s.get("name"), str) and type(s.get(end)) is int}


def _rewrite(doc: dict, m: dict, values: dict[str, int]) -> None:
    """Write every symbolic field of `m` at `values` (the file then claims those sizes as
    its upper bounds)."""
    for e in m["symbolic"]:
        if not isinstance(e, dict):
            continue
        at = _field(doc, m, e.get("at"))
        v = _value(e.get("expr"), values)
        if at is not None and v is not None:
            at[0][at[1]] = v


def mutate_symbols(rng: random.Random, doc: Any) -> Any:
    """Change one symbol's bounds or name, or add or drop a symbol (see the module doc)."""
    methods = _dynamic_methods(doc)
    if not methods:
        return doc
    m = rng.choice(methods)
    syms = [s for s in m["symbols"] if isinstance(s, dict)]
    if not syms:
        m["symbols"].append({"name": "S", "min": 1, "max": 2})
        return doc
    s = rng.choice(syms)
    lo, hi = s.get("min"), s.get("max")
    how = rng.choice(["edge", "edge", "swap", "rescale", "rescale", "rescale", "lower",
                      "rename", "add", "drop"])
    if how == "edge":
        s[rng.choice(["min", "max"])] = rng.choice(BOUND_EDGES + (
            [hi + 1, lo - 1, hi * 2] if type(hi) is int and type(lo) is int else []))
    elif how == "swap":
        s["min"], s["max"] = hi, lo
    elif how == "rescale" and type(hi) is int and type(lo) is int:
        new = rng.choice([lo, max(hi - 1, 0), hi + 1, 2 * hi + 1, 64, 1000, 2**16, 2**20,
                          2**31 - 1])
        values = _bounds(m, "max")
        values[s["name"]] = new
        s["max"] = new
        if new < lo:
            s["min"] = new
        _rewrite(doc, m, values)
        arena = m.get("arena")
        if rng.random() < 0.4 and isinstance(arena, dict) and type(arena.get("nbytes")) is int:
            # grow the plan too (by the square of the ratio: sizes in S*T), so that the
            # views fit and the budget and the kernels' bounds are what refuses, or not
            ratio = -(-max(new, 1) // max(hi, 1))
            arena["nbytes"] = arena["nbytes"] * ratio * ratio
    elif how == "lower" and type(lo) is int:
        s["min"] = rng.choice([0, max(lo - 1, 0), 1])
    elif how == "rename":
        new_name = rng.choice(["S", "T", "U", "s0", "1S", "", "a" * 65, "for", None, 3])
        old = s.get("name")
        s["name"] = new_name
        if rng.random() < 0.6:      # the expressions follow: a consistent renaming
            for e in m["symbolic"]:
                for t in e.get("expr", []) if isinstance(e, dict) else []:
                    if isinstance(t, list):
                        t[1:] = [new_name if x == old else x for x in t[1:]]
    elif how == "add":
        m["symbols"].append({"name": rng.choice(["U", "S", "T"]), "min": rng.choice([0, 1]),
                             "max": rng.choice([1, 4, 2**31 - 1])})
    else:
        m["symbols"].remove(s)
    return doc


def _kernel_int_paths(node: Any, path: list) -> list[list]:
    """Paths (below a kernel's JSON) to its int fields: IR constants, dims, args, sizes."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k != "t":
                out.extend(_kernel_int_paths(v, path + [k]))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(_kernel_int_paths(v, path + [i]))
    elif type(node) is int:
        out.append(path)
    return out


def mutate_symbolic(rng: random.Random, doc: Any) -> Any:
    """Change one size polynomial, or the table's entries (see the module doc)."""
    methods = _dynamic_methods(doc)
    if not methods:
        return doc
    m = rng.choice(methods)
    table = m["symbolic"]
    entries = [e for e in table if isinstance(e, dict) and isinstance(e.get("expr"), list)]
    top = _bounds(m, "max")
    how = rng.choice(["keep_max", "keep_max", "square", "other_symbol", "edge_coef", "terms",
                      "drop", "dup", "retarget", "kernel_int", "kernel_int"])
    if how == "kernel_int" or not entries:
        # make an int of a kernel's IR depend on a symbol, with its value kept at the max
        names = [k.get("name") for k in doc.get("kernels") or [] if isinstance(k, dict)]
        if not names or not top:
            return doc
        name = rng.choice(names)
        paths = _kernel_int_paths(_kernel_json(doc, name), [])
        if not paths:
            return doc
        p = rng.choice(paths)
        at = ["kernels", name, *p]
        field = _field(doc, m, at)
        if field is None:
            return doc
        v = field[0][field[1]]
        sym = rng.choice(sorted(top))
        coef = rng.choice([1, 1, 2, 4, 64])
        table.append({"at": at, "expr": [[coef, sym], [v - coef * top[sym]]]})
        return doc
    e = rng.choice(entries)
    expr = e["expr"]
    value = _value(expr, top)
    if how in ("keep_max", "square", "other_symbol") and value is not None and top:
        sym = rng.choice(sorted(top))
        if how == "keep_max":
            terms = [[rng.choice([0, 1, 2, 3, 8, 2**20]), sym]]
        elif how == "square":
            other = rng.choice(sorted(top))
            terms = [[rng.choice([1, 2]), sym, other], [rng.choice([0, 1]), sym]]
        else:
            terms = [[1, rng.choice(sorted(top))]]
        rest = _value(terms, top)
        e["expr"] = terms + [[value - rest]] if rest is not None else terms
    elif how == "edge_coef":
        term = rng.choice(expr)
        if isinstance(term, list) and term:
            term[0] = rng.choice(COEF_EDGES)
    elif how == "terms":
        e["expr"] = expr + [[rng.choice([0, 1, -1])] for _ in range(rng.choice([1, 7, 8]))]
    elif how == "drop":
        table.remove(e)
    elif how == "dup":
        table.append(copy.deepcopy(e))
    else:
        at = e.get("at")
        if isinstance(at, list) and at:
            at = list(at)
            i = rng.randrange(len(at))
            old = at[i]
            at[i] = rng.choice([old + 1 if type(old) is int else old, 0, -1, 2**31, True,
                                None, "t", "name", "index", "byte_offset", "strides", "sizes",
                                "arena", "params", "args"])
            e["at"] = at
    return doc


# -- packing -----------------------------------------------------------------------------------


def _method_docs(doc: Any) -> list[dict]:
    if not isinstance(doc, dict):
        return []
    methods = doc.get("methods")
    if isinstance(methods, dict):
        return [m for m in methods.values() if isinstance(m, dict)]
    return [doc]


def _packed_constants(doc: dict) -> list[int]:
    """Indices of the packing's constants: int8/uint8 weights and tables, and the scales
    and zeros beside them (found by the exporter's names: a test's shortcut, never the
    runtime's)."""
    return [i for i, c in enumerate(doc.get("constants") or []) if isinstance(c, dict)
            and (c.get("dtype") in ("int8", "uint8") or str(c.get("name")).endswith(
                ("scales", "zeros")))]


def _views_of(doc: dict, index: int) -> list[dict]:
    return [t for m in _method_docs(doc) for t in (m.get("tensors") or [])
            if isinstance(t, dict) and t.get("root") == "constant" and t.get("index") == index]


def _relayout(doc: dict, entries: dict, data: bytes, index: int, shape: list[int],
              dtype: str | None = None) -> tuple[dict, bytes]:
    """Constant `index` resized to `shape` (its bytes cut or repeated) and retyped, in the
    document, the safetensors entries and the data alike; every constant's bytes re-laid."""
    spec = doc["constants"][index]
    name, old_dt = spec.get("name"), spec.get("dtype")
    dt = dtype or old_dt
    isz = {"int8": 1, "uint8": 1, "float32": 4, "bfloat16": 2, "float16": 2}.get(dt, 1)
    blobs = {}
    for n, e in entries.items():
        offs = e.get("data_offsets") if isinstance(e, dict) else None
        ok = isinstance(offs, list) and len(offs) == 2 and all(type(v) is int for v in offs)
        blobs[n] = data[offs[0]:offs[1]] if ok else b""
    numel = 1
    for d in shape:
        numel *= d
    old = blobs.get(name, b"") or b"\x01"
    want = numel * isz
    blobs[name] = (old * (want // len(old) + 1))[:want]
    spec["shape"], spec["dtype"] = list(shape), dt
    if isinstance(entries.get(name), dict):
        entries[name]["shape"], entries[name]["dtype"] = list(shape), _ST_CODE.get(dt, "U8")
    out = b""
    for n, e in entries.items():
        if isinstance(e, dict):
            e["data_offsets"] = [len(out), len(out) + len(blobs[n])]
        out += blobs[n]
    return entries, out


def _linear_wq(doc: dict) -> list[dict]:
    return [ins for m in _method_docs(doc) for ins in (m.get("instructions") or [])
            if isinstance(ins, dict) and ins.get("fn") == "linear_wq"]


def mutate_packing(rng: random.Random, doc: Any, entries: Any, data: bytes
                   ) -> tuple[Any, Any, bytes]:
    """Change one quantized layer's packing (see the module doc)."""
    if not isinstance(doc, dict) or not isinstance(entries, dict):
        return doc, entries, data
    how = rng.choice(["params", "params", "ins", "view", "view", "resize", "resize", "retype",
                      "kernel_const", "kernel_const"])
    layers = _linear_wq(doc)
    packed = _packed_constants(doc)
    if how == "params" and layers:
        params = rng.choice(layers).setdefault("params", {})
        if isinstance(params, dict):
            key = rng.choice(["bits", "group_size", "group_size"])
            params[key] = rng.choice([4, 8, 2, 16, 32, 64, 128, 256, 63, 0, -32, 2**31,
                                      2**62, 2**63, None, "32"])
    elif how == "ins" and layers:
        ins = rng.choice(layers)
        xs = ins.get("ins")
        if isinstance(xs, list) and len(xs) >= 4:
            i, j = rng.sample(range(len(xs)), 2)
            if rng.random() < 0.5:
                xs[i], xs[j] = xs[j], xs[i]
            else:
                xs[rng.randrange(1, len(xs))] = None
    elif how == "view" and packed:
        views = [t for i in packed for t in _views_of(doc, i)
                 if isinstance(t.get("sizes"), list) and len(t["sizes"]) == 2]
        if views:
            t = rng.choice(views)
            r, c = t["sizes"]
            if type(r) is int and type(c) is int:
                r2, c2 = rng.choice([(r * 2, c // 2), (r // 2, c * 2), (c, r), (r, c + 1),
                                     (r + 1, c), (r, 1), (1, r * c), (r, 0), (r, c * 2)])
                t["sizes"], t["strides"] = [r2, c2], [c2, 1]
    elif how in ("resize", "retype") and packed:
        index = rng.choice(packed)
        spec = doc["constants"][index]
        shape = spec.get("shape")
        if isinstance(shape, list) and shape and all(type(d) is int for d in shape):
            n = shape[0]
            dtype = None
            if how == "resize":
                shape = [rng.choice([n // 2, n - 1, n + 1, n * 2, 0, 1])] + shape[1:]
            else:
                dtype = rng.choice(["int8", "uint8", "bfloat16", "float32"])
            entries, data = _relayout(doc, entries, data, index, shape, dtype)
            for t in _views_of(doc, index):
                if dtype is not None:
                    t["dtype"] = dtype
                elif rng.random() < 0.7 and isinstance(t.get("sizes"), list) and t["sizes"]:
                    # the views follow the new row count where they covered it all
                    if type(t["sizes"][0]) is int and len(t["sizes"]) == 1:
                        t["sizes"][0] = shape[0]
    elif how == "kernel_const":
        readers = [k for k in doc.get("kernels") or [] if isinstance(k, dict) and any(
            isinstance(a, dict) and a.get("dtype") in ("int8", "uint8")
            for a in k.get("args") or [])]
        consts = [(k, p) for k in readers for p in _kernel_int_paths(k, [])
                  if p and p[-1] == "value"]
        if consts:
            k, p = rng.choice(consts)
            node = k
            for key in p[:-1]:
                node = node[key]
            v = node["value"]
            node["value"] = rng.choice([v + 1, v - 1, 2 * v, v // 2, 0, -1, 2**31, 2**62,
                                        -2**63])
    return doc, entries, data
