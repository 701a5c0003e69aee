"""Delegate: a loaded program on one device. init / run / close, with ownership in objects.

Everything a delegate makes (its stream, arena, constants, handles, kernel functions)
belongs to its Owner, and `close` frees exactly that. Outputs are Tensors in memory of
their own (process-owned), so they outlive later runs and the delegate itself.

The interpreter runs the program through the shims (reinterpret_tensor,
create_tensor_from_blob, empty_strided, delete_tensor_object), the stream's copy/fill,
compiled kernel functions and the library ops registry. Every run path binds the caller's
tensors through Arguments (runtime/arguments.py) and its outputs through Outputs
(runtime/outputs.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

from aotrt import dtypes
from aotrt.dtypes import DType
from aotrt.errors import AotrtError, InvalidArgument, Unsupported
from aotrt.limits import Limits
from aotrt.program import Program
from aotrt.runtime import finalize, shims
from aotrt.runtime.arguments import Arg, Arguments
from aotrt.runtime.device import Device, Stream
from aotrt.runtime import binding
from aotrt.runtime.binding import Binding
from aotrt.runtime.load_options import resolve_options
from aotrt.runtime.loaded import LoadedProgram, StateView
from aotrt.runtime.memory import Owner, owner_scope
from aotrt.runtime.options import Fp32Math, StreamOptions
from aotrt.runtime.outputs import Outputs, release
from aotrt.runtime.public import Tensor
from aotrt.runtime.replays import GraphReplay, StaticIO, capture, lean_ok, static_inputs
from aotrt.runtime.steps import COPY, KERNEL, LIBRARY, Step, library_ops
from aotrt.runtime.teardown import Resources, teardown
from aotrt.runtime.tensor import Handle

log = logging.getLogger(__name__)

class Delegate:
    """A program loaded on a device: `run` it as often as needed, then `close` it."""

    def __init__(self, program: Program, device: Any = None, check_hazards: bool = False,
                 cuda_graph: bool | None = None, limits: Limits | None = None,
                 threads: int | None = None, fp32_math: Fp32Math | None = None, *,
                 _validated: bool = False, _loaded: LoadedProgram | None = None,
                 _own_kernels: bool = False, _arena: Handle | None = None) -> None:
        """Validate `program` within `limits` (aotrt.Limits; None: the defaults) and load it
        onto `device` (None: cuda if present, else cpu); `threads`, `fp32_math`: see `load`.

        `program` is one method (a Program without `methods` of its own). A Module passes
        `_loaded`, the program's constants, state, kernels and stream, which its methods
        share; otherwise the delegate loads and owns them itself. A dynamic method's delegate
        for one size (runtime/dynamic.py) passes `_own_kernels` (its kernels are compiled for
        that size, and freed with it) and `_arena` (the method's arena, planned at the upper
        bound and shared by its sizes, which run one at a time on the program's stream)."""
        if not isinstance(program, Program):
            raise InvalidArgument(f"program: expected an aotrt.Program, got "
                                  f"{type(program).__name__}")
        if program.has_methods:
            raise InvalidArgument(f"program: it has methods {sorted(program.methods)}; load it "
                                  f"with aotrt.load, or pass program.method(name)")
        if program.symbols:
            raise InvalidArgument("program: its method has dynamic sizes (symbols "
                                  f"{[s.get('name') for s in program.symbols]}); load it with "
                                  f"aotrt.load, which runs it at each size")
        if not _validated:
            # A Program is mutable: what runs is checked here. `load` skips this only for
            # the Program it has just read and validated itself, which no one else holds.
            program.validate(limits)
        dev, options = resolve_options(device, check_hazards, cuda_graph, threads, fp32_math)
        if _loaded is not None and _loaded.device is not dev:
            raise InvalidArgument(f"device: the program is loaded on {_loaded.device.name}")
        t0 = time.perf_counter()
        self.program = program
        self.device: Device = dev
        self.name = program.provenance.get("module") or "program"
        self._owner = Owner(f"delegate {self.name}")
        self._stream: Stream | None = None
        self._loaded: LoadedProgram | None = _loaded
        self._owns_loaded = _loaded is None
        # Methods of one program share its lock: they run over the same state and stream.
        self._lock = _loaded.lock if _loaded is not None else threading.RLock()
        # `_gate` guards `_closing` and `_runs` (the runs inside run(), waiting for `_lock`
        # or holding it): close() marks the delegate closing, so that no run starts after
        # it, and waits for `_runs` to drain, from any thread. A run in a loop cannot starve
        # it, as it could when close() only queued for `_lock`.
        self._gate = threading.Condition(threading.Lock())
        self._closing = False
        self._runs = 0
        self._static: list[Handle | None] = []
        self._steps: list[Step] = []
        # Graph replay: captured on the first run, over static buffers. Every program is
        # static today (fixed shapes), so a device with graphs replays one unless told not to.
        self._graph_mode = dev.supports_graphs if cuda_graph is None else cuda_graph
        self._graph_asked = cuda_graph is True
        self._graph: GraphReplay | None = None
        # Without graphs, on host memory: every step planned once over static input/output
        # buffers (measured on cpu only; cuda without graphs builds I/O steps at each run).
        self._static_io: StaticIO | None = None
        self._own_kernels = _own_kernels
        self._arena_given = _arena
        # What close() (or the garbage collector, for a delegate never closed) tears down.
        self._res = Resources(self._owner)
        self._closer = finalize.finalizer(self, teardown, self._res)
        try:
            self._init(options)
        except BaseException:
            self._closer()
            raise
        self.load_seconds = time.perf_counter() - t0
        log.debug("loaded %s on %s in %.3f s", self.name, dev.name, self.load_seconds)

    # -- init ---------------------------------------------------------------------------------

    def _init(self, options: StreamOptions) -> None:
        prog, dev = self.program, self.device
        self.inputs = list(prog.record.inputs)
        self.outputs = list(prog.record.outputs)
        #: the tensor id holding each output
        self._out_tids = prog.record.outputs_tensors
        if self._loaded is None:
            # The thread count and the float32 math belong to this delegate's own stream:
            # other delegates and streams keep theirs.
            self._loaded = LoadedProgram(prog, dev, options, self.name)
            self._res.loaded = self._loaded
        # The stream is the program's: waited on at close, closed with the program.
        self._stream = self._loaded.stream
        self._res.borrowed = self._stream
        with owner_scope(self._owner):
            self._args = Arguments(dev, self._stream, self.inputs, self.outputs, self.name)
            with dev.stream_guard(self._stream):
                self._make_roots()
                self._make_steps()
        # How every run path binds the outputs and hands back its results (outputs.py).
        self._outputs = Outputs(self._args, self.outputs, self._per_run, self._out_tids)

    def _make_roots(self) -> None:
        prog, dev, stream = self.program, self.device, self._stream
        u8, nbytes = dtypes.uint8, prog.record.arena_nbytes
        if self._arena_given is not None:
            # The dynamic method's: zeroed when it was made, and big enough (it checks).
            arena = shims.reinterpret_tensor(self._arena_given, [nbytes], [1], 0)
        else:
            arena = shims.empty_strided([nbytes], [1], u8, dev)
            # Pooled memory may hold a previous owner's data: zeroed once here, so no
            # program can read another delegate's tensors from bytes it reads before writing.
            stream.fill(arena, 0)
        loaded = self._loaded
        bases = {"constant": loaded.constant_bases, "state": loaded.state_bases}
        tensors = prog.record.tensors
        self._static = [None] * len(tensors)
        # Per-run roots: tensor ids and views rooted at each input / output.
        self._per_run: dict[tuple[str, int], list[tuple[int, tuple, tuple, int, DType]]] = {}
        for tid, t in enumerate(tensors):
            dt = t.dtype
            view = (t.sizes, t.strides, t.offset, dt)
            if t.root == "arena":
                self._static[tid] = shims.reinterpret_tensor(arena, *view[:3], dtype=dt)
            elif t.root in bases:
                # Constants and state live as long as the program: their views are static.
                base = bases[t.root][t.index]
                self._static[tid] = shims.reinterpret_tensor(base, *view[:3], dtype=dt)
            else:
                self._per_run.setdefault((t.root, t.index), []).append((tid, *view))
        # The arena's base is no longer needed: the views keep the memory alive.
        shims.delete_tensor_object(arena)

    def _make_steps(self) -> None:
        prog = self.program
        instructions = prog.record.instructions
        lib = self._loaded.library      # the program's: compiled once for every method
        if self._own_kernels and prog.kernels:
            used = {ins.name for ins in instructions if ins.op == "kernel"}
            lib = self.device.kernel_library([k for k in prog.kernels if k.name in used])
            self._res.library = lib
        ops = None
        for i, ins in enumerate(instructions):
            op, src = ins.op, ins.source
            label = f"instruction #{i} {op}" + (f" {ins.name}" if ins.name else "") + \
                (f" [{src}]" if src else "")
            if op == "kernel":
                # Resolved once: arena/constant views become pointers and access records now;
                # each run patches in only the views rooted at its inputs and outputs.
                args = ins.args
                launch = lib.kernel(ins.name).prepare([self._static[t] for t in args])
                step = Step(KERNEL, launch, tuple(args[i] for i in launch.per_run), None, {},
                             label)
            elif op == "library":
                ops = ops if ops is not None else library_ops()
                fn = ops.get(ins.name)
                if fn is None:
                    raise Unsupported(f"{label}: library op {ins.name!r} is not in this "
                                      f"runtime (known: {sorted(ops)})")
                step = Step(LIBRARY, fn, ins.outs, ins.ins, dict(ins.params), label)
            else:  # copy
                step = Step(COPY, None, ins.outs[0], ins.ins[0], {}, label)
            self._plan(step)
            self._steps.append(step)

    def _plan(self, step: Step) -> None:
        """Validate and build a step whose views are all static once, now (the run plan):
        each run then only queues its commands again."""
        if any(self._static[t] is None for t in step.tensor_ids()):
            return
        stream = self._stream
        with stream.planning() as cmds:
            stream.label = step.label
            try:
                self._run_step(step, self._static)
            finally:
                stream.label = ""
        step.planned = tuple(cmds)

    # -- run ----------------------------------------------------------------------------------

    def __call__(self, *inputs: Any, out: Any = None) -> tuple[Any, ...]:
        """Same as run()."""
        return self.run(*inputs, out=out)

    def run(self, *inputs: Any, out: Any = None) -> tuple[Any, ...]:
        """Run the program once: a tuple of output Tensors (or the `out` tensors, filled).

        Safe from any thread: a run that a close() from another thread overtakes before it
        starts is refused with InvalidArgument ("closed"); one that has started finishes."""
        with self._running():
            return self._run_locked(inputs, out)

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        """Counted as a run in flight, within `_lock`; InvalidArgument once closing."""
        with self._gate:
            if self._closing or self._closed:
                raise InvalidArgument(f"delegate {self.name} is closed")
            self._runs += 1
        try:
            with self._lock:
                if self._closing:
                    # close() came while this run waited for another: it goes first.
                    raise InvalidArgument(f"delegate {self.name} is closed")
                yield
        finally:
            with self._gate:
                self._runs -= 1
                if not self._runs:
                    self._gate.notify_all()

    def bind(self) -> Binding:
        """Bind the method once to static buffers of its own (ONNX Runtime's IOBinding); see
        runtime/binding.py."""
        return binding.bind(self)

    def _run_locked(self, inputs: tuple[Any, ...], out: Any) -> tuple[Any, ...]:
        """run(), within `_lock`."""
        if len(inputs) != len(self.inputs):
            names = ", ".join(s.name for s in self.inputs)
            raise InvalidArgument(f"inputs: {self.name} takes {len(self.inputs)} inputs "
                                  f"({names}), got {len(inputs)}")
        args = self._args.classify_inputs(inputs)
        outs = self._args.classify_out(out, args)
        if self._graph_mode:
            return self._run_graph(args, outs, out)
        if self.device.host_addressable:
            return self._run_static_io(args, outs, out)
        return self._run(args, outs, out)

    def _run(self, args: list[Arg], outs: list[Arg] | None, out: Any) -> tuple[Any, ...]:
        """Bind the inputs and outputs where they lie (or stage them), run every step over
        them, and hand back the results."""
        dev, stream = self.device, self._stream
        handles: list[Handle | None] = list(self._static)
        temps: list[Handle] = []
        results: tuple[Any, ...] = ()
        failed = True
        try:
            with owner_scope(self._owner), dev.stream_guard(stream):
                for k, a in enumerate(args):
                    base = self._args.bind(a, temps, output=False)
                    self._views(("input", k), base, handles, temps)
                bases = self._outputs.bases(outs, temps)
                for k, base in enumerate(bases):
                    self._views(("output", k), base, handles, temps)
                self._execute(handles)
                stream.label = ""
                results = self._outputs.finish(bases, outs, out, temps)
            failed = False
        finally:
            stream.label = ""
            self._cleanup(temps, failed)
        return results

    # -- CUDA graphs --------------------------------------------------------------------------

    def _capture(self) -> GraphReplay:
        """The method captured as one CUDA graph over static buffers (replays.capture)."""
        return capture(self)

    def _static_buffers(self, keep: list[Handle]
                        ) -> tuple[list[Handle], list[Handle], list[Handle | None]]:
        """Static input and output buffers (uint8 bases; the inputs in the arena where it
        has room) and the program's views with the per-run ones rooted in them. Every handle
        made goes to `keep`, bases first."""
        dev, u8 = self.device, dtypes.uint8
        ins = static_inputs(self.program, self._static, [s.nbytes for s in self.inputs], dev)
        outs = [shims.empty_strided([max(s.nbytes, 1)], [1], u8, dev) for s in self.outputs]
        keep += ins + outs
        handles: list[Handle | None] = list(self._static)
        for root, bases in (("input", ins), ("output", outs)):
            for k, b in enumerate(bases):
                self._views((root, k), b, handles, keep)
        return ins, outs, handles

    def _run_graph_capture(self) -> None:
        """Capture the graph (within the owner and stream scopes); a program that cannot
        have one runs without, unless cuda_graph=True asked for it."""
        try:
            self._graph = self._capture()
        except Unsupported as e:
            if self._graph_asked:
                raise
            # A graph this program cannot have is not a reason not to run it.
            log.warning("%s runs without a CUDA graph: %s", self.name, e)
            self._graph_mode = False
            return
        self._res.graph = self._graph.graph

    def _run_graph(self, args: list[Arg], outs: list[Arg] | None,
                   out: Any) -> tuple[Any, ...]:
        """Copy inputs into the static buffers, replay the graph, copy the outputs out."""
        dev, stream = self.device, self._stream
        if self._graph is None:
            with owner_scope(self._owner), dev.stream_guard(stream):
                self._run_graph_capture()
            if not self._graph_mode:
                return self._run(args, outs, out)
        g = self._graph
        if lean_ok(stream, args, outs):
            with owner_scope(self._owner), dev.stream_guard(stream):
                return self._replay_direct(g, args)
        graph = g.graph
        return self._run_staged(g.ins, g.outs, args, outs, out, lambda: stream.record(
            g.accesses, lambda s: graph.launch(s), "cuda graph replay"))

    def _run_static_io(self, args: list[Arg], outs: list[Arg] | None,
                       out: Any) -> tuple[Any, ...]:
        """Copy inputs into the static buffers, queue the steps planned over them, copy the
        outputs out."""
        if self._static_io is None:
            with owner_scope(self._owner), self.device.stream_guard(self._stream):
                self._static_io = self._plan_static_io()
        p = self._static_io
        try:
            if lean_ok(self._stream, args, outs):
                with owner_scope(self._owner), self.device.stream_guard(self._stream):
                    return p.run_lean(args)
            return self._run_staged(p.ins, p.outs, args, outs, out, p.queue)
        except BaseException:
            # A failed run leaves no plan behind: the next run builds its steps anew.
            self._static_io = None
            p.delete()
            raise

    def _plan_static_io(self) -> StaticIO:
        """Static input/output buffers and every step's commands, built over them once."""
        stream = self._stream
        p = StaticIO(stream, self._outputs)
        try:
            p.ins, p.outs, handles = self._static_buffers(p.keep)
            for step in self._steps:
                if step.planned is None:
                    with stream.planning() as cmds:
                        stream.label = step.label
                        try:
                            self._run_step(step, handles)
                        finally:
                            stream.label = ""
                    p.steps.append((step.label, tuple(cmds)))
                else:
                    p.steps.append((step.label, step.planned))
        except BaseException:
            p.delete()
            raise
        return p

    def _run_staged(self, ins: list[Handle], outs_static: list[Handle], args: list[Arg],
                    outs: list[Arg] | None, out: Any, launch: Callable[[], Any]
                    ) -> tuple[Any, ...]:
        """Copy the inputs into `ins`, `launch` the work over them, copy `outs_static` out
        into fresh outputs or the caller's `out` tensors."""
        dev, stream = self.device, self._stream
        temps: list[Handle] = []
        failed = True
        results: tuple[Any, ...] = ()
        try:
            with owner_scope(self._owner), dev.stream_guard(stream):
                # Host arrays the runtime does not know are copied in by run() itself
                direct = dev.host_addressable and lean_ok(stream, args, None)
                if direct:
                    # Once no run reads them (queued, the copy and its waits took 0.8 ms)
                    stream.commit_and_wait()
                for k, a in enumerate(args):
                    if a.spec.nbytes and direct:
                        ctypes.memmove(ins[k].address, a.ptr, a.spec.nbytes)
                    elif a.spec.nbytes:
                        stream.copy(ins[k], self._args.bind(a, temps, output=False))
                # The caller's input memory is released (a borrowed region's release waits
                # for the work queued on it) before the replay, so run() waits for these
                # copies alone, not for the whole graph (0.5 of resnet50_b1's 0.7 ms, H200).
                stream.commit()
                bound, temps = temps, []
                self._cleanup(bound, False)
                launch()
                results = self._outputs.copy_out(outs_static, outs, out, temps)
            failed = False
        finally:
            self._cleanup(temps, failed)
        return results

    def _replay_direct(self, g: GraphReplay, args: list[Arg]) -> tuple[Any, ...]:
        """The lean replay (run() within a few tens of microseconds of host time): raw copies
        from the callers' device tensors into the static inputs, the graph, fresh outputs."""
        stream = self._stream
        copies = [(g.in_ptrs[k], a.ptr, a.spec.nbytes)
                  for k, a in enumerate(args) if a.kind == "blob"]
        graph = g.graph
        temps: list[Handle] = []
        results: tuple[Tensor, ...] = ()
        failed = True
        try:
            stream.record(g.accesses, lambda s: graph.launch(s, copies), "cuda graph replay")
            results = self._outputs.copied(g.outs, temps)
            stream.commit()
            failed = False
        finally:
            # The callers' memory is theirs again once the copies out of it are done (not the
            # replay): wait for those alone, also when something above failed.
            try:
                graph.wait_copies(stream)
            except BaseException:
                failed = True
                raise
            finally:
                if failed:
                    release(results)
                self._cleanup(temps, failed)
        return results

    def _views(self, root: tuple[str, int], base: Handle, handles: list[Handle | None],
               temps: list[Handle]) -> None:
        for tid, sizes, strides, off, dt in self._per_run.get(root, ()):
            h = shims.reinterpret_tensor(base, sizes, strides, off, dtype=dt)
            temps.append(h)
            handles[tid] = h

    def _execute(self, h: list[Handle | None]) -> None:
        stream = self._stream
        for step in self._steps:
            stream.label = step.label
            if step.planned is not None:
                for cmd in step.planned:
                    stream.replay(cmd)
            else:
                self._run_step(step, h)

    def _run_step(self, step: Step, h: Sequence[Handle | None]) -> None:
        """Validate, build and queue one step over the views `h` (by tensor id)."""
        stream = self._stream
        if step.kind == KERNEL:
            step.target.launch(stream, [h[t] for t in step.a])
        elif step.kind == LIBRARY:
            # The op is prepared for this program: it may re-lay the constants that its
            # instruction alone reads (runtime/constants.py).
            with self._loaded.constants.preparing():
                step.target(stream, [h[t] for t in step.a],
                            [None if t is None else h[t] for t in step.b], **step.params)
        else:  # COPY
            stream.copy(h[step.a], h[step.b])

    def _cleanup(self, temps: list[Handle], failed: bool) -> None:
        """Delete every per-run handle; after a failure, first finish what was queued."""
        first: BaseException | None = None
        if failed:
            try:
                self._stream.commit_and_wait()
            except AotrtError as e:
                log.debug("delegate %s: queued work of the failed run: %s", self.name, e)
        for h in reversed(temps):
            try:
                if h.state == "live":
                    shims.delete_tensor_object(h)
            except BaseException as e:  # noqa: BLE001 - keep deleting; report the first
                first = first or e
        if first is not None and not failed:
            raise first

    # -- close --------------------------------------------------------------------------------

    @property
    def _closed(self) -> bool:
        return not self._closer.alive

    @property
    def closed(self) -> bool:
        """True once close() ran."""
        return self._closed

    def close(self) -> None:
        """Wait for queued work, then free this delegate's memory; safe to call twice, and
        from any thread while others run it (runs that started finish first, later ones are
        refused with InvalidArgument); outputs already returned stay valid."""
        with self._gate:
            self._closing = True
            # Each run inside run() now finishes, or sees `_closing` and leaves.
            self._gate.wait_for(lambda: not self._runs)
        with self._lock:
            self._closer()
            self._static = []
            self._steps = []

    def __enter__(self) -> "Delegate":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"on {self.device.name}"
        return f"<aotrt.Delegate {self.name} {state}>"

    @property
    def methods(self) -> tuple[str, ...]:
        """The one method a lone delegate runs (a Module has several)."""
        return ("forward",)

    def method(self, name: str) -> "Delegate":
        """This delegate, as its program's only method "forward"."""
        if name != "forward":
            raise InvalidArgument(f"method {name!r}: {self.name} has methods ['forward']")
        return self

    @property
    def state(self) -> Mapping[str, Tensor]:
        """The program's state buffers by name (copies; see Module.state)."""
        return StateView(self._loaded)

    def reset(self) -> None:
        """Give the program's state its initial values again (see Module.reset)."""
        self._loaded.reset()

    @property
    def uses_graph(self) -> bool:
        """True when runs replay one captured graph (the default where the device has them)."""
        return self._graph_mode

    @property
    def owner(self) -> Owner:
        """The Owner of everything this delegate made."""
        return self._owner

    @property
    def stream(self) -> Stream | None:
        """The delegate's own stream."""
        return self._stream


__all__ = ["Delegate", "library_ops"]
