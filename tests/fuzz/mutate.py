"""Structure-aware mutators of program files, and the mutant stream of the campaigns.

A mutant is a seed's (tests/fuzz/seeds.py) file bytes changed at one to three places: raw
header bytes, JSON values by type, list and dict structure, safetensors entries, constant
data, truncation, or an IR node wrapped in a random op; a version-2 seed's also the state
specs, the methods table and the tensors' state roots; a library seed's params at extremes.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from aotrt.kernels import ir
from tests.fuzz import mutate_fields as F
# the seeds are re-exported: callers name them as mutate.seed_* and mutate.SEEDS*
from tests.fuzz.seeds import (I64, SEEDS, SEEDS_EXPORTED, SEEDS_LIB, SEEDS_V2, _ST_CODE,
                              join, seed_bits, seed_casts, seed_const_index, seed_copy_fill,
                              seed_division, seed_float_pointwise, seed_gather, seed_lib_conv,
                              seed_lib_linear_wq, seed_lib_pool, seed_lib_topk,
                              seed_lib_upsample, seed_methods_own, seed_methods_shared,
                              seed_mm, seed_narrow_index, seed_reduce, seed_softmax,
                              seed_state, seed_where_clamp, split)

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
         "state_spec", "methods", "state_root", "lib_params", "symbols", "symbolic", "packing")
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

#: ... and for the exported seeds (tests/fuzz/exported.py): mostly the fields each one is
#: about (dynamic sizes; state and methods; packing), the generic kinds beside
WEIGHTS_EXPORTED = {
    "exp_dynamic": {**WEIGHTS, "symbols": 4, "symbolic": 5, "methods": 0.5},
    "exp_state": {**WEIGHTS_V2, "state_spec": 2.5, "methods": 2.5, "state_root": 2.5},
    "exp_quantized": {**WEIGHTS, "packing": 7, "lib_params": 1.5, "data": 1.5}}
EXPORTED_SHARE = 0.3
#: the first master that draws the exported seeds (a stream of their own, so that the
#: mutants of earlier masters keep their ids)
EXPORTED_FROM_MASTER = 36

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
    pick_exp = random.Random(f"aotrt-fuzz-exp:{master}:{index}")
    exported = sorted(n for n in seed_files if n in SEEDS_EXPORTED)
    if exported and master >= EXPORTED_FROM_MASTER and pick_exp.random() < EXPORTED_SHARE:
        rng = pick_exp
        name = rng.choice(exported)
        w = weights or WEIGHTS_EXPORTED[name]
    elif libs and master >= LIB_FROM_MASTER and pick_lib.random() < LIB_SHARE:
        rng = pick_lib
        name = rng.choice(libs)
        w = weights or WEIGHTS_LIB
    elif v2 and pick.random() < V2_SHARE:
        rng = pick
        name = rng.choice(v2)
        w = weights or WEIGHTS_V2
    else:
        name = rng.choice(sorted(n for n in seed_files if n not in SEEDS_V2 and
                                 n not in SEEDS_LIB and n not in SEEDS_EXPORTED))
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
        elif kind == "symbols":
            doc = F.mutate_symbols(rng, doc)
        elif kind == "symbolic":
            doc = F.mutate_symbolic(rng, doc)
        elif kind == "packing":
            doc, entries, data = F.mutate_packing(rng, doc, entries, data)
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
    return {name: split(make()) for name, make in ALL_SEEDS.items()}


#: every seed program by name
ALL_SEEDS = {**SEEDS, **SEEDS_V2, **SEEDS_LIB, **SEEDS_EXPORTED}

__all__ = ["ALL_SEEDS", "EXPORTED_FROM_MASTER", "KINDS", "LIB_FROM_MASTER", "SEEDS",
           "SEEDS_EXPORTED", "SEEDS_LIB", "SEEDS_V2", "join", "mutant", "mutate_bytes",
           "mutate_data", "mutate_entries", "mutate_ir", "mutate_ir_field",
           "mutate_json_value", "mutate_lib_params", "mutate_methods", "mutate_state_root",
           "mutate_state_spec", "mutate_structure", "seed_bits", "seed_casts",
           "seed_const_index", "seed_copy_fill", "seed_division", "seed_files",
           "seed_float_pointwise", "seed_gather", "seed_lib_conv", "seed_lib_linear_wq",
           "seed_lib_pool", "seed_lib_topk", "seed_lib_upsample", "seed_methods_own",
           "seed_methods_shared", "seed_mm", "seed_narrow_index", "seed_reduce",
           "seed_softmax", "seed_state", "seed_where_clamp", "split"]
