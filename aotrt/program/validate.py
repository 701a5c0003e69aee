"""The program file's checks: field checkers that raise ProgramError naming the field, and
the one-pass validator behind `Program.validate` (docs/PROGRAM.md, docs/limits.md).

Kept apart from aotrt/program/format.py (write and read) so each file has one job. No torch,
and no import of the runtime or the exporter (library ops: aotrt/program/library.py).
"""

from __future__ import annotations

import json
import math
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from aotrt import dtypes
from aotrt.analysis import (IRMemo, Write, affine_index, first_unwritten, kernel_cost,
                            reduce_depth, uses_reduce_dim)
from aotrt.errors import InvalidArgument, ProgramError, Unsupported
from aotrt.kernels import ir
from aotrt.kernels.bounds import arg_ranges
from aotrt.limits import DEFAULT as DEFAULT_LIMITS, Limits, within
from aotrt.program import library
from aotrt.program.records import (NO_PARAMS, InstructionRecord, MethodRecord, SpecRecord,
                                    TensorRecord)
from aotrt.program.strides import extent, is_packed
from aotrt.program.strides import numel_of as numel

if TYPE_CHECKING:  # the Program's module imports this one
    from aotrt.program.format import Program

ROOTS = ("arena", "input", "output", "constant", "state")
OPCODES = ("kernel", "library", "copy")

#: a dim's size (and a stride on a dim of size > 1) must fit int32, as the shims require
SIZE_LIMIT = 1 << 31
#: byte counts and offsets stay below this, so no sum of two of them overflows int64
BYTES_LIMIT = 1 << 62
MAX_DIMS = 64
#: reductions nested in one another's bodies: the renderers recurse once per level (a layer
#: norm of a layer norm nests 4)
MAX_REDUCE_DEPTH = 64
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

_SPEC_KEYS = {"name", "dtype", "shape", "strides"}
_TENSOR_KEYS = {"root", "index", "byte_offset", "dtype", "sizes", "strides"}
_INSTR_KEYS = {
    "kernel": ({"op", "name", "args"}, {"src"}),
    "library": ({"op", "fn", "outs", "ins"}, {"params", "src"}),
    "copy": ({"op", "dst", "src"}, {"src_line"}),
}

# ---------------------------------------------------------------------------------------------
# small checkers: each raises ProgramError naming `where`


def fail(where: str, what: str) -> ProgramError:
    """A ProgramError saying `what` about field `where`."""
    return ProgramError(f"{where}: {what}" if where else what)


def check_int(v: Any, where: str, lo: int = 0, hi: int = BYTES_LIMIT) -> int:
    """`v` as an int in [lo, hi), else ProgramError at `where`."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise fail(where, f"expected an integer, got {v!r}"[:200])
    if not lo <= v < hi:
        raise fail(where, f"{v} is outside [{lo}, {hi})")
    return v


def check_str(v: Any, where: str) -> str:
    """`v` as a str, else ProgramError at `where`."""
    if not isinstance(v, str):
        raise fail(where, f"expected a string, got {type(v).__name__}")
    return v


def check_list(v: Any, where: str, limit: int | None = None) -> list:
    """`v` as a list of at most `limit` entries, else ProgramError at `where`."""
    if not isinstance(v, list):
        raise fail(where, f"expected a list, got {type(v).__name__}")
    if limit is not None and len(v) > limit:
        raise fail(where, f"{len(v)} entries exceed the limit of {limit}")
    return v


def check_dict(v: Any, where: str, required: set[str], optional: set[str] = frozenset()) -> dict:
    """`v` as a dict with the `required` keys and no keys beyond `optional`."""
    if not isinstance(v, dict):
        raise fail(where, f"expected an object, got {type(v).__name__}")
    missing = required - set(v)
    if missing:
        raise fail(where, f"missing field(s) {sorted(missing)}")
    extra = set(v) - required - set(optional)
    if extra:
        raise fail(where, f"unknown field(s) {sorted(extra)}")
    return v


def check_dtype(v: Any, where: str) -> dtypes.DType:
    """The aotrt dtype named by `v`, else ProgramError at `where`."""
    name = check_str(v, where)
    if name not in {d.name for d in dtypes.ALL}:
        raise fail(where, f"unknown dtype {name!r}")
    return dtypes.as_dtype(name)


def check_dims(sizes: Any, strides: Any, where: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(sizes, strides) of a view, each checked against the format's limits."""
    sz = tuple(check_int(s, f"{where}.sizes[{i}]", 0, SIZE_LIMIT)
               for i, s in enumerate(check_list(sizes, f"{where}.sizes", MAX_DIMS)))
    st_raw = check_list(strides, f"{where}.strides", MAX_DIMS)
    if len(st_raw) != len(sz):
        raise fail(f"{where}.strides", f"{len(st_raw)} strides for {len(sz)} sizes")
    st = tuple(check_int(s, f"{where}.strides[{i}]", 0, BYTES_LIMIT) for i, s in enumerate(st_raw))
    if numel(sz):
        for i, (n, s) in enumerate(zip(sz, st)):
            if n > 1 and s >= SIZE_LIMIT:
                raise fail(f"{where}.strides[{i}]", f"stride {s} does not fit int32")
    return sz, st


def check_limits(limits: Any) -> Limits:
    """`limits`, or the default budget for None; InvalidArgument for another type."""
    if limits is None:
        return DEFAULT_LIMITS
    if not isinstance(limits, Limits):
        raise InvalidArgument(f"limits: expected an aotrt.Limits, got {type(limits).__name__}")
    return limits


# ---------------------------------------------------------------------------------------------
# the validator


class Validator:
    """One pass over a Program; every message names the field it is about."""

    def __init__(self, prog: Program, limits: Limits,
                 kernels_of: "Validator | None" = None) -> None:
        self.p = prog
        self.lim = limits
        #: a Validator that has already checked these same kernels (another method of the
        #: program): its results are reused, so that a file of many methods does not have
        #: its kernels checked once per method
        self.kernels_of = kernels_of
        #: elementary steps of one run (docs/limits.md), summed over the instructions
        self.work = 0
        #: output index -> the byte sets instructions write into it (see aotrt.analysis.Write)
        self.writes: dict[int, list[Write]] = {}
        #: facts about IR nodes, each computed once per distinct node for this validation
        #: (a kernel's nodes may be shared by its stores, and a kernel by many instructions)
        self.memo = IRMemo()
        #: kernel name -> bounds.arg_ranges(kernel), computed once however many use it
        self.accesses: dict[str, dict] = {}
        #: kernel name -> _store_forms(kernel), likewise
        self.forms: dict[str, list] = {}
        #: (kernel, argument, tensor id) whose store footprints are recorded, and how many
        self.proved: set[tuple[str, int, int]] = set()
        self.store_writes = 0
        #: tensor id -> extent() of its view in bytes, computed once however many use it
        self.extents: dict[int, tuple[int, int]] = {}
        #: per-instruction bound checks made (one per argument and access kind, never one
        #: per load node): tests hold it linear in the instructions
        self.checks = 0

    def run(self) -> None:
        """Check the whole program; raise ProgramError at the first problem."""
        p = self.p
        if not isinstance(p.provenance, dict):
            raise fail("provenance", "expected a dict")
        for k, v in p.provenance.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise fail("provenance", f"entry {k!r} is not a string pair")
        self.inputs = self._specs(p.inputs, "inputs")
        self.outputs = self._specs(p.outputs, "outputs")
        self._constants()
        check_int(p.arena_nbytes, "arena.nbytes")
        self.roots = p.root_nbytes()
        lim = self.lim
        within(sum(sum(v) for v in self.roots.values()), lim, "max_memory_bytes",
                "memory bytes (arena + constants + inputs + outputs)")
        within(len(check_list(p.kernels, "kernels")), lim, "max_kernels", "kernels")
        within(len(check_list(p.instructions, "instructions")), lim, "max_instructions",
                "instructions")
        self.tensors = [self._tensor(t, f"tensors[{i}]") for i, t in enumerate(
            check_list(p.tensors, "tensors"))]
        self._kernels()
        for i, ins in enumerate(check_list(p.instructions, "instructions")):
            self._instruction(ins, i)
        within(self.work, lim, "max_work", "work of one run (elementary steps)")
        self._outputs_tensors()
        self._coverage()
        # The file must round-trip through JSON exactly as the delegate will see it. The
        # kernels are left out: their every node was type-checked above, and expanding a
        # shared IR graph into a tree could take exponential time.
        try:
            json.dumps(p._doc_without_kernels(), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise fail("document", f"not serializable as JSON: {e}") from None
        p._record = MethodRecord(tuple(self.inputs), tuple(self.outputs),
                                 tuple(TensorRecord(*t) for t in self.tensors),
                                 tuple(_instruction_record(ins) for ins in p.instructions),
                                 int(p.arena_nbytes), tuple(int(t) for t in p.outputs_tensors))

    def _specs(self, specs: Any, where: str) -> list[SpecRecord]:
        out, names = [], set()
        for i, s in enumerate(check_list(specs, where)):
            w = f"{where}[{i}]"
            s = check_dict(s, w, _SPEC_KEYS)
            name = check_str(s["name"], f"{w}.name")
            if name in names:
                raise fail(f"{w}.name", f"duplicate name {name!r}")
            names.add(name)
            dt = check_dtype(s["dtype"], f"{w}.dtype")
            sz, st = check_dims(s["shape"], s["strides"], w)
            if not is_packed(sz, st):
                raise fail(f"{w}.strides", f"{list(st)} for shape {list(sz)} leave holes or "
                                           f"overlap")
            if numel(sz) * dt.itemsize >= BYTES_LIMIT:
                raise fail(w, f"{dt.name}{list(sz)} overflows 2**62 bytes")
            out.append(SpecRecord(name, dt, sz, st, extent(sz, st, dt.itemsize)[1]))
        return out

    def _constants(self) -> None:
        if not isinstance(self.p.constants, dict):
            raise fail("constants", "expected a dict of name -> numpy array")
        for i, (name, arr) in enumerate(self.p.constants.items()):
            w = f"constants[{i}] {name!r}"
            check_str(name, w)
            if not isinstance(arr, np.ndarray):
                raise fail(w, f"expected a numpy array, got {type(arr).__name__}")
            try:
                dtypes.as_dtype(arr.dtype)
            except InvalidArgument:
                raise fail(w, f"unsupported dtype {arr.dtype}") from None
            if arr.ndim > MAX_DIMS or any(n >= SIZE_LIMIT for n in arr.shape):
                raise fail(w, f"shape {list(arr.shape)} is out of range")

    def _tensor(self, t: Any, w: str) -> tuple[str, int, int, dtypes.DType, tuple, tuple]:
        t = check_dict(t, w, _TENSOR_KEYS)
        root = check_str(t["root"], f"{w}.root")
        if root not in ROOTS:
            raise fail(f"{w}.root", f"unknown root {root!r} (known: {list(ROOTS)})")
        sizes = self.roots[root]
        index = check_int(t["index"], f"{w}.index", 0, max(len(sizes), 1))
        if index >= len(sizes):
            raise fail(f"{w}.index", f"{root} {index} does not exist ({len(sizes)} {root}s)")
        dt = check_dtype(t["dtype"], f"{w}.dtype")
        off = check_int(t["byte_offset"], f"{w}.byte_offset")
        if off % dt.itemsize:
            raise fail(f"{w}.byte_offset", f"{off} is not a multiple of {dt.name}'s size "
                                           f"{dt.itemsize}")
        sz, st = check_dims(t["sizes"], t["strides"], w)
        lo, hi = extent(sz, st, dt.itemsize)
        cap = sizes[index]
        if off + hi > cap or (hi == 0 and off > cap):
            raise fail(w, f"view bytes [{off + lo}, {off + hi}) lie outside {root} {index} "
                          f"of {cap} bytes")
        return root, index, off, dt, sz, st

    def _tid(self, v: Any, where: str, nullable: bool = False) -> Any:
        if v is None and nullable:
            return None
        if not self.tensors:
            raise fail(where, f"tensor id {v!r} is out of range: the program has no tensors")
        return check_int(v, where, 0, len(self.tensors))

    def _writable(self, tid: int, where: str) -> None:
        root = self.tensors[tid][0]
        if root in ("input", "constant"):
            raise fail(where, f"tensor {tid} is a view of an {root}, which programs never write")

    def _kernels(self) -> None:
        done = self.kernels_of
        if done is not None and done.p.kernels is self.p.kernels:
            self.kernel_by_name, self.iterations = done.kernel_by_name, done.iterations
            self.memo, self.accesses, self.forms = done.memo, done.accesses, done.forms
            return
        self.kernel_by_name: dict[str, ir.Kernel] = {}
        self.iterations: dict[str, int] = {}
        nodes = 0
        for i, k in enumerate(check_list(self.p.kernels, "kernels")):
            if not isinstance(k, ir.Kernel):
                raise fail(f"kernels[{i}]", f"expected an ir.Kernel, got {type(k).__name__}")
            try:
                ir.validate(k)
            except InvalidArgument as e:
                raise fail(f"kernels[{i}]", f"invalid kernel IR: {e}") from None
            if not k.name.isascii():
                raise fail(f"kernels[{i}]", f"kernel name {k.name!r} is not ASCII")
            if k.name in self.kernel_by_name:
                raise fail(f"kernels[{i}]", f"duplicate kernel name {k.name!r}")
            _check_kernel_types(k, f"kernels[{i}] {k.name}", self.memo)
            depth = reduce_depth(k, self.memo)
            if depth > MAX_REDUCE_DEPTH:
                raise fail(f"kernels[{i}] {k.name}", f"reductions nest {depth} deep, more than "
                                                     f"{MAX_REDUCE_DEPTH}")
            self.kernel_by_name[k.name] = k
            n, iters = kernel_cost(k, self.lim.max_kernel_iterations, self.memo)
            nodes += n
            within(nodes, self.lim, "max_ir_nodes", f"kernels[{i}] {k.name}: IR nodes so far")
            within(iters, self.lim, "max_kernel_iterations",
                    f"kernels[{i}] {k.name}: loop iterations")
            self.iterations[k.name] = iters

    def _instruction(self, ins: Any, i: int) -> None:
        w = f"instructions[{i}]"
        if not isinstance(ins, dict):
            raise fail(w, f"expected an object, got {type(ins).__name__}")
        op = ins.get("op")
        # a list or object here is unhashable: check the type before the lookup
        if not isinstance(op, str) or op not in _INSTR_KEYS:
            raise fail(f"{w}.op", f"unknown opcode {op!r}"[:200] + f" (known: {list(OPCODES)})")
        required, optional = _INSTR_KEYS[op]
        check_dict(ins, w, required, optional)
        for key in ("src", "src_line"):
            if key in ins and not (op == "copy" and key == "src"):
                check_str(ins[key], f"{w}.{key}")
        w = f"{w} ({op})"
        if op == "kernel":
            self._kernel_instruction(ins, w)
        elif op == "library":
            self._library_instruction(ins, w)
        else:  # copy
            dst = self._tid(ins["dst"], f"{w}.dst")
            src = self._tid(ins["src"], f"{w}.src")
            self._writable(dst, f"{w}.dst")
            a, b = self.tensors[dst], self.tensors[src]
            if a[3] is not b[3] or a[4] != b[4]:
                raise fail(w, f"dst tensor {dst} is {a[3].name}{list(a[4])} but src tensor "
                              f"{src} is {b[3].name}{list(b[4])}")
            self.work += numel(a[4])
            self._wrote_view(dst)

    def _kernel_instruction(self, ins: dict, w: str) -> None:
        name = check_str(ins["name"], f"{w}.name")
        k = self.kernel_by_name.get(name)
        if k is None:
            raise fail(f"{w}.name", f"no kernel named {name!r}"[:200])
        args = check_list(ins["args"], f"{w}.args")
        if len(args) != len(k.args):
            raise fail(f"{w}.args", f"kernel {name} takes {len(k.args)} arguments, got "
                                    f"{len(args)}")
        tids = [self._tid(a, f"{w}.args[{j}]") for j, a in enumerate(args)]
        for j, (tid, arg) in enumerate(zip(tids, k.args)):
            t = self.tensors[tid]
            if t[3].name != arg.dtype:
                raise fail(f"{w}.args[{j}]", f"kernel {name} wants {arg.dtype}, tensor {tid} "
                                             f"is {t[3].name}")
            if "w" in arg.mode:
                self._writable(tid, f"{w}.args[{j}]")
        self.work += self.iterations[name]
        if name not in self.accesses:
            self.accesses[name] = arg_ranges(k, self.memo)
        for (arg, is_store), rng in self.accesses[name].items():
            self.checks += 1
            tid = tids[arg]
            root, index, off, dt, sz, st = self.tensors[tid]
            what = "stores to" if is_store else "loads from"
            if rng == "float":
                raise fail(w, f"kernel {name} {what} argument {arg} at a non-integer index")
            if tid not in self.extents:
                self.extents[tid] = extent(sz, st, dt.itemsize)
            lo_b, hi_b = self.extents[tid]
            if rng[0] * dt.itemsize < lo_b or (rng[1] + 1) * dt.itemsize > hi_b:
                raise fail(w, f"kernel {name} {what} argument {arg} (tensor {tid}, "
                              f"{dt.name}{list(sz)} of {root} {index}) at element indices "
                              f"[{rng[0]}, {rng[1]}], outside the view's [0, "
                              f"{hi_b // dt.itemsize}); clamp data-dependent indices with "
                              f"minimum/maximum so that the bound is provable")
        if k.numel == 0:
            return
        dims_all = (*k.shape, *k.rshape)
        for st_arg, forms in self._store_forms(k).items():
            tid = tids[st_arg]
            root, index, off, dt, _, _ = self.tensors[tid]
            # The same kernel storing into the same view writes the same bytes again.
            if root != "output" or (name, st_arg, tid) in self.proved:
                continue
            self.proved.add((name, st_arg, tid))
            # Each distinct (kernel, argument, view) records its stores' byte sets once; a
            # file could still ask for views x stores of them, so they count against the
            # IR-node budget (a real program has a few per output).
            self.store_writes += len(forms)
            within(self.store_writes, self.lim, "max_ir_nodes",
                   f"{w}: kernel store footprints into outputs to prove (counted with the "
                   f"IR nodes)")
            for coefs, c0 in forms:
                start, dims = off + c0 * dt.itemsize, []
                for d, c in coefs:
                    n = dims_all[d]
                    if c < 0:       # the same set of elements, walked the other way
                        start += c * (n - 1) * dt.itemsize
                    dims.append((n, abs(c) * dt.itemsize))
                self._wrote(index, Write(start, dims, dt.itemsize))

    def _store_forms(self, k: ir.Kernel) -> dict[int, list[tuple[tuple, int]]]:
        """Argument -> the distinct affine forms ((dim, coef) pairs, c0) of its stores,
        computed once per kernel; a store we cannot describe proves nothing written and is
        left out."""
        forms = self.forms.get(k.name)
        if forms is None:
            seen: dict[int, dict[tuple, None]] = {}
            ndim = len(k.shape) + len(k.rshape)
            for st in k.stores:
                # A store that uses a reduce dim runs in a loop over the reduce domain too (as
                # render_c renders it): over every (outer, reduce) point, never if it is empty.
                if uses_reduce_dim(st, len(k.shape), self.memo) and numel(k.rshape) == 0:
                    continue
                form = affine_index(st.index, ndim, self.memo)
                if form is not None:
                    seen.setdefault(st.arg, {})[(tuple(sorted(form[0].items())), form[1])] = None
            forms = {arg: list(fs) for arg, fs in seen.items()}
            self.forms[k.name] = forms
        return forms

    def _library_instruction(self, ins: dict, w: str) -> None:
        fn = check_str(ins["fn"], f"{w}.fn")
        if not fn.isidentifier():
            raise fail(f"{w}.fn", f"{fn!r} is not a library op name"[:200])
        outs = check_list(ins["outs"], f"{w}.outs")
        out_ids = []
        for j, o in enumerate(outs):
            tid = self._tid(o, f"{w}.outs[{j}]")
            self._writable(tid, f"{w}.outs[{j}]")
            out_ids.append(tid)
        in_ids = [self._tid(x, f"{w}.ins[{j}]", nullable=True)
                  for j, x in enumerate(check_list(ins["ins"], f"{w}.ins"))]
        params = ins.get("params", {})
        if not isinstance(params, dict):
            raise fail(f"{w}.params", f"expected an object, got {type(params).__name__}")
        for key, value in params.items():
            if not isinstance(key, str) or not key.isidentifier() or key in ("stream", "outs",
                                                                                "ins"):
                raise fail(f"{w}.params", f"bad parameter name {key!r}"[:200])
            _json_value(value, f"{w}.params.{key}")
        cost = self._library_check(fn, out_ids, in_ids, params, w)
        # The op's declared work (multiply-adds, window taps, sort steps, python loop steps)
        # counts in the one max_work budget; an op over it alone is named here.
        within(cost.work, self.lim, "max_work", f"{w} {fn}: work of this op (elementary "
                                                f"steps)")
        self.work += cost.work
        within(cost.scratch_bytes, self.lim, "max_scratch_bytes", f"{w} {fn}: scratch bytes")
        for tid in out_ids:
            self._wrote_view(tid)

    def _library_check(self, fn: str, outs: list[int], ins: list[int | None], params: dict,
                       w: str) -> Any:
        """The library op's own metadata check (contract C3), as ProgramError at `w`."""
        ops = library.signatures()

        def meta(tid: int | None) -> Any:
            if tid is None:
                return None
            _, _, _, dt, sz, st = self.tensors[tid]
            return ops.meta(dt.name, sz, st)

        try:
            return ops.check(fn, [meta(t) for t in outs], [meta(t) for t in ins], params)
        except Unsupported as e:
            unknown = "is not in this runtime" in str(e)
            raise fail(f"{w}.fn" if unknown else _op_field(w, fn, str(e)), str(e)) from None
        except InvalidArgument as e:
            raise fail(_op_field(w, fn, str(e)), _op_message(fn, str(e))) from None

    # -- output coverage ----------------------------------------------------------------------

    def _wrote_view(self, tid: int) -> None:
        """Record that an instruction writes every element of tensor `tid`."""
        root, index, off, dt, sz, st = self.tensors[tid]
        if root != "output" or numel(sz) == 0:
            return
        dims = [(n, s * dt.itemsize) for n, s in zip(sz, st) if n > 1 and s != 0]
        self._wrote(index, Write(off, dims, dt.itemsize))

    def _wrote(self, index: int, write: Write) -> None:
        self.writes.setdefault(index, []).append(write)

    def _coverage(self) -> None:
        """Refuse a program that returns an output with a byte no instruction writes (it
        would hand back whatever that memory held: another run's or delegate's data)."""
        for k, nbytes in enumerate(self.roots["output"]):
            if nbytes == 0:
                continue
            where = f"outputs[{k}] {self.outputs[k].name!r}"
            first = first_unwritten(self.writes.get(k, []), nbytes, self.lim, where)
            if first is not None:
                raise fail(where, f"byte {first} of its {nbytes} is never written by any "
                                  f"instruction (kernel stores count only where their index "
                                  f"is affine in the loop indices); the program would return "
                                  f"whatever that memory held")

    def _outputs_tensors(self) -> None:
        ots = check_list(self.p.outputs_tensors, "outputs_tensors")
        if len(ots) != len(self.outputs):
            raise fail("outputs_tensors", f"{len(ots)} entries for {len(self.outputs)} outputs")
        for k, v in enumerate(ots):
            w = f"outputs_tensors[{k}]"
            tid = self._tid(v, w)
            root, index, off, dt, sz, st = self.tensors[tid]
            spec = self.outputs[k]
            odt, osz, ost = spec.dtype, spec.shape, spec.strides
            if (root, index, off) != ("output", k, 0) or dt is not odt or sz != osz or \
                    any(a != b for n, a, b in zip(sz, st, ost) if n > 1):
                raise fail(w, f"tensor {tid} must be the whole of output {k} ({odt.name}"
                              f"{list(osz)} strides {list(ost)} at byte 0)")


def _op_field(w: str, fn: str, msg: str) -> str:
    """The field path of a library op's complaint "fn: name: ..." (name a param, outs[j],
    ins[j], params, or a role such as x or bias, which stays in the message)."""
    rest = msg[len(fn) + 2:] if msg.startswith(f"{fn}: ") else msg
    field = rest.split(": ", 1)[0] if ": " in rest else ""
    base = field.split("[", 1)[0]
    if base in ("outs", "ins", "params"):
        return f"{w}.{field}"
    if base.isidentifier() and field.replace(base, "", 1).strip("[]0123456789") == "" and \
            base in library.signatures().param_names:
        return f"{w}.params.{field}"
    return w


def _op_message(fn: str, msg: str) -> str:
    return f"library op {msg}"[:400]


_EXPR_TYPES = (ir.Const, ir.Idx, ir.Load, ir.Op, ir.Reduce)


def _check_kernel_types(k: ir.Kernel, where: str, memo: IRMemo) -> None:
    """The IR's own validate() checks meaning; this checks that every node is of the type
    its place needs, so that no renderer meets an object it does not know."""
    for n in (*k.shape, *k.rshape):
        if isinstance(n, bool) or not isinstance(n, int) or n >= SIZE_LIMIT:
            raise fail(where, f"bad iteration size {n!r}")
    if numel(k.shape) * max(numel(k.rshape), 1) >= BYTES_LIMIT:
        raise fail(where, "iteration space overflows")
    if not all(isinstance(a, ir.Arg) and isinstance(a.mode, str) for a in k.args):
        raise fail(where, "arguments must be Arg nodes")
    if not isinstance(k.stores, tuple) or not all(isinstance(s, ir.Store) for s in k.stores):
        raise fail(where, "stores must be Store nodes")
    for st in k.stores:
        if isinstance(st.arg, bool) or not isinstance(st.arg, int):
            raise fail(where, f"store argument {st.arg!r} is not an int")
    roots = [x for st in k.stores for x in (st.index, st.value)]
    for e in memo.walk(roots):
        if not isinstance(e, _EXPR_TYPES):
            raise fail(where, f"{type(e).__name__} node inside an expression")
        if not isinstance(e.dtype, str):
            raise fail(where, f"node {type(e).__name__} has a bad dtype")
        if isinstance(e, ir.Const):
            v = e.value
            if isinstance(v, int) and not isinstance(v, bool) and not INT64_MIN <= v <= INT64_MAX:
                raise fail(where, f"constant {v} overflows int64")
        elif isinstance(e, ir.Idx) and (isinstance(e.dim, bool) or not isinstance(e.dim, int)):
            raise fail(where, f"Idx dim {e.dim!r} is not an int")
        elif isinstance(e, ir.Load) and (isinstance(e.arg, bool) or not isinstance(e.arg, int)):
            raise fail(where, f"Load argument {e.arg!r} is not an int")
        elif isinstance(e, ir.Op) and (not isinstance(e.args, tuple) or not isinstance(e.op, str)):
            raise fail(where, f"malformed Op {e.op!r}")
        elif isinstance(e, ir.Reduce) and not isinstance(e.op, str):
            raise fail(where, f"malformed Reduce {e.op!r}")


def _json_value(v: Any, where: str, depth: int = 0) -> None:
    if depth > 32:
        raise fail(where, "nests too deeply")
    if v is None or isinstance(v, (bool, str)):
        return
    if isinstance(v, int):
        if not INT64_MIN <= v <= INT64_MAX:
            raise fail(where, f"{v} overflows int64")
        return
    if isinstance(v, float):
        if not math.isfinite(v):
            raise fail(where, f"{v} is not finite")
        return
    if isinstance(v, list):
        for j, x in enumerate(v):
            _json_value(x, f"{where}[{j}]", depth + 1)
        return
    if isinstance(v, dict):
        for k, x in v.items():
            check_str(k, where)
            _json_value(x, f"{where}.{k}", depth + 1)
        return
    raise fail(where, f"{type(v).__name__} is not a JSON value")


def _instruction_record(ins: dict) -> InstructionRecord:
    """The typed record of a checked instruction dict."""
    op = ins["op"]
    if op == "kernel":
        return InstructionRecord(op, ins["name"], tuple(ins["args"]), (), (), NO_PARAMS,
                                 ins.get("src") or "")
    if op == "library":
        return InstructionRecord(op, ins["fn"], (), tuple(ins["outs"]), tuple(ins["ins"]),
                                 MappingProxyType(dict(ins.get("params", {}))),
                                 ins.get("src") or "")
    return InstructionRecord(op, "", (), (ins["dst"],), (ins["src"],), NO_PARAMS,
                             ins.get("src_line") or "")
