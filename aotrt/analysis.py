"""Linear-time analyses of a program, for `Program.validate` and the delegate: the bytes each
instruction writes into an output (the coverage proof), affine store indices, the loop and
IR-node costs that the load-time budget counts, and which instructions touch which tensors.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from aotrt.kernels import ir
from aotrt.limits import Limits, within

if TYPE_CHECKING:  # aotrt.program imports this module
    from aotrt.program.records import InstructionRecord, TensorRecord


class Write:
    """The bytes one instruction writes into an output: {start + sum(i_d * stride_d) + b}
    for 0 <= i_d < n_d and 0 <= b < itemsize; strides are >= 0 (bytes)."""

    __slots__ = ("start", "dims", "itemsize")

    def __init__(self, start: int, dims: list[tuple[int, int]], itemsize: int) -> None:
        self.start = start
        # Dims of one element or stride 0 add no bytes; the byte dim comes first.
        self.dims = sorted([(itemsize, 1)] + [(n, s) for n, s in dims if n > 1 and s > 0],
                           key=lambda d: d[1])
        self.itemsize = itemsize

    def end(self) -> int:
        """One past the last byte."""
        return self.start + sum((n - 1) * s for n, s in self.dims) + 1

    def dense(self) -> bool:
        """Whether the set is the whole interval [start, end())."""
        want = 1
        for n, s in self.dims:
            if s != want:
                return False
            want = n * s
        return True

    def count(self) -> int:
        """Bytes visited when marking (with repeats where dims overlap)."""
        c = 1
        for n, _ in self.dims:
            c *= n
        return c


def first_unwritten(writes: list[Write], nbytes: int, lim: Limits,
                     where: str) -> int | None:
    """The first byte of [0, nbytes) that no write covers (None: all are written). Dense
    writes are merged as intervals; the rest are marked in a byte map by numpy strides."""
    inside = [w for w in writes if w.start >= 0 and w.end() <= nbytes]
    spans = sorted((w.start, w.end()) for w in inside if w.dense())
    reach = 0
    for a, b in spans:
        if a > reach:
            break
        reach = max(reach, b)
    if reach >= nbytes:
        return None
    sparse = [w for w in inside if not w.dense()]
    if not sparse:
        return reach
    within(nbytes, lim, "max_coverage_bytes", f"{where}: bytes to map (its writes are not "
                                               f"whole views)")
    seen = np.zeros(nbytes, dtype=np.bool_)
    for a, b in spans:
        seen[a:b] = True
    for w in sparse:
        # Heavily overlapping strides would cost far more than the bytes they cover:
        # skipping a write only ever refuses more (sound).
        if w.count() > 16 * nbytes + (1 << 20):
            continue
        shape = tuple(n for n, _ in w.dims)
        strides = tuple(s for _, s in w.dims)
        view = np.lib.stride_tricks.as_strided(seen[w.start:], shape, strides, writeable=True)
        view[...] = True
    if seen.all():
        return None
    return int(np.argmin(seen))


class IRMemo:
    """Facts about kernel IR nodes, each computed once per distinct node (by identity) and
    context, for one validation or render call.

    Kernel IR is a graph: one node may be shared by many stores, reductions and kernels, so
    an analysis that walks it per use is quadratic or worse on a hostile program. A memo lives
    only as long as the call that made it, while its program holds every node, so no id() is
    ever reused for another node (a module-level map keyed by id() would outlive them).
    `visits` counts the nodes whose facts were computed: tests hold it linear in the nodes.
    """

    def __init__(self) -> None:
        self.visits = 0
        self._tables: dict[str, dict[tuple[Any, int], Any]] = {}

    def post(self, table: str, ctx: Any, roots: Any, fact: Any,
             kids: Any = None) -> list[Any]:
        """`fact(node, [facts of kids(node)])` of each root, every node computed once per
        (table, ctx) over this memo's life; iterative, so deep IR needs no recursion. `kids`
        defaults to ir.children."""
        memo = self._tables.setdefault(table, {})
        kids = kids or ir.children
        stack: list[tuple[Any, bool]] = [(r, False) for r in roots]
        while stack:
            node, ready = stack.pop()
            key = (ctx, id(node))
            if key in memo:
                continue
            cs = kids(node)
            if not ready and cs:
                stack.append((node, True))
                stack.extend((c, False) for c in cs if (ctx, id(c)) not in memo)
                continue
            self.visits += 1
            memo[key] = fact(node, [memo[(ctx, id(c))] for c in cs])
        return [memo[(ctx, id(r))] for r in roots]

    def walk(self, roots: Any) -> Iterator[Any]:
        """Every node reachable from `roots`, each once (this call's own seen set)."""
        seen: set[int] = set()
        stack = list(roots)
        while stack:
            e = stack.pop()
            if id(e) in seen:
                continue
            seen.add(id(e))
            self.visits += 1
            yield e
            stack.extend(ir.children(e))


def _outside_reduce(e: Any) -> tuple[Any, ...]:
    # A Reduce's body runs in its own loop: its reduce dims are not the store's.
    return () if isinstance(e, ir.Reduce) else ir.children(e)


def uses_reduce_dim(st: ir.Store, nouter: int, memo: IRMemo | None = None) -> bool:
    """Whether a store's index or value reads a reduce dim outside a Reduce body (then the
    renderers run it inside a loop over the reduce domain). Shared nodes are looked at once
    per `memo` however many stores use them."""
    memo = memo or IRMemo()

    def fact(e: Any, kids: list[bool]) -> bool:
        return (isinstance(e, ir.Idx) and e.dim >= nouter) or any(kids)

    return any(memo.post("rdim", nouter, (st.index, st.value), fact, _outside_reduce))


def affine_index(e: ir.Expr, ndim: int,
                 memo: IRMemo | None = None) -> tuple[dict[int, int], int] | None:
    """`e` as sum(coef[d] * Idx(d)) + c0 over outer dims d < ndim, exactly as int64 computes
    it, or None when it is not of that form. Only int64 add, sub, neg, mul by a constant and
    int64 casts of int64 values: these wrap modulo 2**64 like the integers, so a result that
    lies in range equals the true affine value."""
    big = 1 << 64

    def kids(node: Any) -> tuple[Any, ...]:
        return ir.children(node) if isinstance(node, ir.Op) else ()

    def fact(node: Any, args: list) -> Any:
        return _affine_node(node, ndim, args, big)

    return (memo or IRMemo()).post("affine", ndim, (e,), fact, kids)[0]


def _affine_node(e: Any, ndim: int, args: list, big: int) -> Any:
    if getattr(e, "dtype", None) != "int64":
        return None
    if isinstance(e, ir.Idx):
        return ({e.dim: 1}, 0) if e.dim < ndim else None
    if isinstance(e, ir.Const):
        v = e.value
        return ({}, v) if isinstance(v, int) and not isinstance(v, bool) else None
    if not isinstance(e, ir.Op) or any(a is None for a in args):
        return None
    if e.op == "cast" and len(args) == 1 and e.args[0].dtype == "int64":
        return args[0]
    if e.op == "neg" and len(args) == 1:
        out = ({d: -c for d, c in args[0][0].items()}, -args[0][1])
    elif e.op in ("add", "sub") and len(args) == 2:
        sign = 1 if e.op == "add" else -1
        (ca, a0), (cb, b0) = args
        co = dict(ca)
        for d, c in cb.items():
            co[d] = co.get(d, 0) + sign * c
        out = ({d: c for d, c in co.items() if c}, a0 + sign * b0)
    elif e.op == "mul" and len(args) == 2:
        (ca, a0), (cb, b0) = args
        if ca and cb:
            return None
        (co, c0), m = ((ca, a0), b0) if not cb else ((cb, b0), a0)
        out = ({d: c * m for d, c in co.items() if c * m}, c0 * m)
    else:
        return None
    # Beyond 2**64 the final value cannot be an index of a view: give up (sound).
    if abs(out[1]) >= big or any(abs(c) >= big for c in out[0].values()):
        return None
    return out


def kernel_cost(k: ir.Kernel, cap: int, memo: IRMemo | None = None) -> tuple[int, int]:
    """(distinct IR nodes, loop iterations) of a kernel, in time linear in its nodes.

    Iterations: the outer elements, each running one loop over the reduce domain per Reduce
    node (and one more for stores that use reduce dims). A Reduce nested in another's body
    counts once too: its value is per outer element, and both renderers compute it before
    the loop that uses it (render_c `_reduce`), not inside that loop. Saturates at cap + 1.
    """
    memo = memo or IRMemo()
    nodes = 0
    reduces = 0
    for node in memo.walk(k.stores):
        nodes += 1
        reduces += isinstance(node, ir.Reduce)
    rn = max(math.prod(k.rshape), 1)
    inner = any(uses_reduce_dim(st, len(k.shape), memo) for st in k.stores)
    loops = reduces + (1 if inner else 0)
    total = math.prod(k.shape) * (1 + rn * loops)
    return nodes, min(total, cap + 1)


def reduce_depth(k: ir.Kernel, memo: IRMemo | None = None) -> int:
    """The most Reduce nodes on one path from a store down (nested reductions), in time
    linear in the kernel's distinct nodes."""
    def fact(node: Any, kids: list[int]) -> int:
        return max(kids, default=0) + isinstance(node, ir.Reduce)

    return max((memo or IRMemo()).post("depth", None, k.stores, fact), default=0)


def tree_size(k: ir.Kernel, cap: int) -> int:
    """Nodes of a kernel's IR written out as a tree (what to_json makes), saturating just
    above `cap`; linear in the distinct nodes however much they are shared."""
    size: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(s, False) for s in k.stores]
    while stack:
        node, ready = stack.pop()
        if id(node) in size:
            continue
        kids = ir.children(node)
        if not ready:
            stack.append((node, True))
            stack.extend((c, False) for c in kids if id(c) not in size)
            continue
        size[id(node)] = min(1 + sum(size[id(c)] for c in kids), cap + 1)
    return min(sum(size[id(s)] for s in k.stores), cap + 1)


def referenced(ins: InstructionRecord) -> list[int]:
    """The tensor ids one program instruction reads or writes."""
    return ins.referenced


def sole_read_constants(tensors: Sequence[TensorRecord],
                        instructions: Sequence[InstructionRecord]) -> set[int]:
    """The indices of the constants that exactly one instruction touches (through any of
    their views): that instruction's op may re-lay such a constant's bytes in place."""
    readers: dict[int, set[int]] = {}
    for i, ins in enumerate(instructions):
        for tid in ins.referenced:
            t = tensors[tid]
            if t.root == "constant":
                readers.setdefault(t.index, set()).add(i)
    return {c for c, who in readers.items() if len(who) == 1}
