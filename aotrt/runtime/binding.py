"""Binding: a method bound once to static buffers of its own (ONNX Runtime's IOBinding).

`Delegate.bind()` captures the method's graph (or plans its static steps) once; a bound run
copies only the inputs it is given into the bound buffers, launches once and returns the
same output Tensors, so that a decode step allocates nothing.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from aotrt.errors import InvalidArgument
from aotrt.runtime import shims
from aotrt.runtime.memory import owner_scope
from aotrt.runtime.public import Tensor
from aotrt.runtime.replays import lean_ok
from aotrt.runtime.tensor import Handle

if TYPE_CHECKING:   # the delegate imports this module
    from aotrt.runtime.delegate import Delegate


class Binding:
    """A method bound once to buffers of its own (Delegate.bind): `inputs` and `outputs`
    are Tensors over them; `run` copies what it is given in, launches, and returns
    `outputs` (the same Tensors each time, holding the last run's values).

    An input the plan placed in the arena (where its bytes are dead once read) is
    overwritten by the run's temporaries: after a run, `run()` without inputs is refused
    for such a binding (`inputs_kept` False), since it would compute on other values."""

    def __init__(self, delegate: "Delegate", inputs: tuple[Tensor, ...],
                 outputs: tuple[Tensor, ...], ins: list[Handle],
                 launch: Callable[[], None], uploads: "Uploads | None" = None) -> None:
        self._delegate = delegate
        self.inputs = inputs
        self.outputs = outputs
        self._ins = ins
        self._launch = launch
        self._uploads = uploads
        self._accesses = delegate._graph.accesses if uploads is not None else ()
        self._plan = delegate._graph if delegate._graph_mode else delegate._static_io
        arena = next((h.alloc for h, t in zip(delegate._static, delegate.program.record.tensors)
                      if h is not None and t.root == "arena"), None)
        #: whether the bound inputs keep their values across runs (none lies in the arena)
        self.inputs_kept = arena is None or all(h.alloc is not arena for h in ins)
        self._ran = False

    @property
    def stale(self) -> bool:
        """True when the method's plan was rebuilt since (after a failed run)."""
        d = self._delegate
        return self._plan is not (d._graph if d._graph_mode else d._static_io)

    def run(self, *inputs: Any) -> tuple[Tensor, ...]:
        """Copy `inputs` (all of them, or none) into the bound buffers, launch once, and
        return the bound outputs."""
        return run_bound(self._delegate, self, inputs)

    def __repr__(self) -> str:
        return f"<aotrt.Binding of {self._delegate.name}>"


class Uploads:
    """A bound graph's host inputs, staged in its page-locked block: per input, the numpy
    dtype and shape a host array must have, its bytes, and where it goes (staging offset,
    device address). A step then writes each array there and the replay uploads them in
    stream order, so the host spends a memmove an input, not a synchronised copy."""

    def __init__(self, graph: Any, specs: list[tuple[Any, tuple, int]],
                 dsts: list[int]) -> None:
        self.graph = graph
        self.specs = specs
        offsets, total = [], 0
        for _, _, n in specs:
            offsets.append(total)
            total += -(-n // 64) * 64      # each input on its own cache line
        base = graph.staging(total)
        self.moves = [(base + off, n) for off, (_, _, n) in zip(offsets, specs)]
        self.uploads = [(dst, base + off, n) for dst, off, (_, _, n) in
                        zip(dsts, offsets, specs) if n]

    def matches(self, inputs: tuple[Any, ...]) -> bool:
        """Whether every input is a host array of exactly its spec's dtype and shape, laid
        out densely (anything else takes the general path, which checks and explains)."""
        for x, (dt, shape, _) in zip(inputs, self.specs):
            if type(x) is not np.ndarray or x.dtype != dt or x.shape != shape or \
                    not x.flags.c_contiguous:
                return False
        return True

    def stage(self, inputs: tuple[Any, ...]) -> None:
        """Copy the arrays into the staging block, once the last launch's uploads from it are
        done (the previous replay may still run)."""
        for x, (dst, n) in zip(inputs, self.moves):
            if n:
                ctypes.memmove(dst, x.ctypes.data, n)


def bind(d: Delegate) -> Binding:
    """Bind the method once to static input and output buffers of its own (ONNX
    Runtime's IOBinding): `binding.run(...)` copies only the inputs it is given into
    them, replays the captured graph (or the static plan), and returns the same output
    Tensors every time, so that a decode step allocates nothing. The outputs hold the
    last run's values until the next run."""
    with d._running():
        with owner_scope(d._owner), d.device.stream_guard(d._stream):
            if d._graph_mode and d._graph is None:
                d._run_graph_capture()
            if d._graph_mode:
                g = d._graph
                ins, outs = g.ins, g.outs
                graph, accesses = g.graph, g.accesses

                def launch() -> None:
                    d._stream.record(accesses, lambda st: graph.launch(st),
                                        "cuda graph replay")
                uploads = Uploads(graph, [(s.dtype.np, tuple(s.shape), s.nbytes)
                                          for s in d.inputs], list(g.in_ptrs))
            else:
                if d._static_io is None:
                    d._static_io = d._plan_static_io()
                p = d._static_io
                ins, outs, launch = p.ins, p.outs, p.queue
                uploads = None
            in_tensors = tuple(
                Tensor(shims.reinterpret_tensor(b, s.shape, s.strides, 0, dtype=s.dtype))
                for b, s in zip(ins, d.inputs))
            # The outputs as every run path makes them, over the bound roots; owned by the
            # delegate, as the roots are.
            out_tensors = d._outputs.tensors(outs)
    return Binding(d, in_tensors, out_tensors, list(ins), launch, uploads)


def run_bound(d: Delegate, b: Binding, inputs: tuple[Any, ...]) -> tuple[Tensor, ...]:
    """Binding.run: the given inputs copied into the bound buffers, one launch."""
    if inputs and len(inputs) != len(d.inputs):
        names = ", ".join(s.name for s in d.inputs)
        raise InvalidArgument(f"inputs: {d.name} takes {len(d.inputs)} inputs "
                              f"({names}), or none to run on the bound ones; got "
                              f"{len(inputs)}")
    dev, stream = d.device, d._stream
    with d._running():
        if b.stale:
            raise InvalidArgument(f"binding of {d.name}: the method's plan was "
                                  f"rebuilt after a failed run; bind again")
        if not inputs and b._ran and not b.inputs_kept:
            raise InvalidArgument(f"binding of {d.name}: its bound inputs share the arena, "
                                  f"so the last run overwrote them; pass the inputs to "
                                  f"every run")
        b._ran = True
        up = b._uploads
        if inputs and up is not None and not stream.hazards.enabled and \
                not stream.options.deferred and up.matches(inputs):
            # The decode step's path: host arrays into the staging block, one launch.
            with owner_scope(d._owner), dev.stream_guard(stream):
                up.graph.wait_copies(stream)
                up.stage(inputs)
                graph, uploads = up.graph, up.uploads
                stream.record(b._accesses, lambda st: graph.launch(st, uploads=uploads),
                              "cuda graph replay")
                stream.commit()
            return b.outputs
        args = d._args.classify_inputs(inputs) if inputs else []
        temps: list[Handle] = []
        failed = True
        try:
            with owner_scope(d._owner), dev.stream_guard(stream):
                if args and dev.host_addressable and lean_ok(stream, args, None):
                    # Host memory both sides: once no queued run reads the bound
                    # inputs, a memmove each (as run_lean), not a queued copy.
                    stream.commit_and_wait()
                    for k, a in enumerate(args):
                        if a.spec.nbytes:
                            ctypes.memmove(b._ins[k].address, a.ptr, a.spec.nbytes)
                else:
                    for k, a in enumerate(args):
                        if not a.spec.nbytes:
                            continue
                        if a.kind == "stage" and a.array is not None:
                            # A host array: written straight into the bound buffer once
                            # the last replay is done reading it, with no staging root.
                            typed = b.inputs[k].handle
                            typed.alloc.settle()
                            dev.write(typed, a.array)
                        else:
                            stream.copy(b._ins[k], d._args.bind(a, temps, output=False))
                b._launch()
                stream.commit()
            failed = False
        finally:
            d._cleanup(temps, failed)
    return b.outputs


__all__ = ["Binding", "Uploads", "bind", "run_bound"]
