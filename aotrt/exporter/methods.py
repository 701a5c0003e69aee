"""Several methods in one program: single-method Programs merged over one set of constants,
kernels and state (no torch here; the exporter lowers each method apart, then merges).

- A constant is stored once however many methods read it: equal bytes (dtype, shape and
  data) are one constant, under the first name seen.
- A kernel is compiled once however many methods launch it: kernels equal but for their
  names (aotrt.exporter.dedup.kernel_key, the lowering's test too) are one kernel, under the
  first name seen; a name that two different kernels took is made unique.
- State is a method's own unless sharing is asked for (`share_state=True`, or the names of
  the buffers to share): a KV cache shared blindly between a prefill and a decode gave
  Parakeet garbage in ExecuTorch, so sharing is opt-in. A method's own buffer is named
  `<method>.<buffer>` where several methods have one of that name.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Iterable, Mapping

import numpy as np

from aotrt.errors import InvalidArgument
from aotrt.exporter.dedup import kernel_key
from aotrt.kernels import ir
from aotrt.program import Program, check_method_name


def share_names(share_state: bool | Iterable[str], methods: Mapping[str, Program]) -> set[str]:
    """The state buffer names to share between methods, from `share_state`."""
    names = {s["name"] for m in methods.values() for s in m.state}
    if share_state is True:
        return names
    if share_state is False or share_state is None:
        return set()
    if isinstance(share_state, str):
        raise InvalidArgument("share_state: expected a bool or a list of buffer names, got "
                              f"the string {share_state!r}")
    wanted = set(share_state)
    unknown = sorted(wanted - names)
    if unknown:
        raise InvalidArgument(f"share_state: no method has state {unknown}; the state is "
                              f"{sorted(names)}")
    return wanted


def merge(methods: Mapping[str, Program], share_state: bool | Iterable[str] = False,
          provenance: Mapping[str, str] | None = None) -> Program:
    """One validated Program of the methods `methods` (each a single-method Program)."""
    if not methods:
        raise InvalidArgument("methods: expected at least one method")
    for name, m in methods.items():
        check_method_name(name, f"method {name!r}")
        if m.has_methods:
            raise InvalidArgument(f"method {name!r}: a program of several methods cannot be "
                                  f"one method of another")
    shared = share_names(share_state, methods)
    constants: dict[str, np.ndarray] = {}
    by_bytes: dict[tuple, str] = {}
    kernels: dict[str, ir.Kernel] = {}
    by_ir: dict[str, str] = {}
    state: list[dict] = []
    state_index: dict[str, int] = {}
    owners = _state_owners(methods)
    merged: dict[str, Program] = {}
    for mname, m in methods.items():
        cmap: list[int] = []
        for cname, arr in m.constants.items():
            key = _bytes_key(arr)
            if key not in by_bytes:
                name = cname if cname not in constants else _fresh(cname, constants)
                constants[name] = arr
                by_bytes[key] = name
            cmap.append(list(constants).index(by_bytes[key]))
        knames: dict[str, str] = {}
        for k in m.kernels:
            key = kernel_key(k)
            if key not in by_ir:
                name = k.name if k.name not in kernels else _fresh(k.name, kernels)
                kernels[name] = k if name == k.name else dataclasses.replace(k, name=name)
                by_ir[key] = name
            knames[k.name] = by_ir[key]
        smap: list[int] = []
        for spec in m.state:
            sname = spec["name"]
            if sname not in shared and owners[sname] > 1:
                sname = f"{mname}.{sname}"
            init = None
            if spec["init"] is not None:
                init = cmap[list(m.constants).index(spec["init"])]
                init = list(constants)[init]
            entry = {"name": sname, "dtype": spec["dtype"], "shape": list(spec["shape"]),
                     "init": init}
            if sname in state_index:
                have = state[state_index[sname]]
                if have != entry:
                    raise InvalidArgument(
                        f"share_state: state {sname!r} is {have['dtype']}{have['shape']} "
                        f"(init {have['init']}) in one method and {entry['dtype']}"
                        f"{entry['shape']} (init {entry['init']}) in {mname!r}")
            else:
                state_index[sname] = len(state)
                state.append(entry)
            smap.append(state_index[sname])
        tensors = []
        for t in m.tensors:
            t = dict(t)
            if t["root"] == "constant":
                t["index"] = cmap[t["index"]]
            elif t["root"] == "state":
                t["index"] = smap[t["index"]]
            tensors.append(t)
        instructions = [dict(ins, name=knames[ins["name"]]) if ins["op"] == "kernel"
                        else dict(ins) for ins in m.instructions]
        # A dynamic method's kernel fields name its kernels: by their merged names now.
        symbolic = [dict(e, at=[e["at"][0], knames[e["at"][1]], *e["at"][2:]])
                    if e["at"][0] == "kernels" else e for e in m.symbolic]
        merged[mname] = Program(inputs=m.inputs, outputs=m.outputs,
                                arena_nbytes=m.arena_nbytes, tensors=tensors,
                                instructions=instructions, outputs_tensors=m.outputs_tensors,
                                version=2, symbols=m.symbols, symbolic=symbolic)
    prog = Program.with_methods(merged, constants=constants, kernels=list(kernels.values()),
                                state=state, provenance=provenance)
    prog.validate()
    return prog


def _state_owners(methods: Mapping[str, Program]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in methods.values():
        for s in m.state:
            counts[s["name"]] = counts.get(s["name"], 0) + 1
    return counts


def _bytes_key(arr: np.ndarray) -> tuple:
    data = np.ascontiguousarray(arr).view(np.uint8)
    return (str(arr.dtype), tuple(arr.shape), hashlib.sha256(data.tobytes()).hexdigest())


def _fresh(name: str, taken: Mapping[str, Any]) -> str:
    i = 1
    while f"{name}_{i}" in taken:
        i += 1
    return f"{name}_{i}"


__all__ = ["merge", "share_names"]
