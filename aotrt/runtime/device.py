"""The device protocol (Device, Stream, KernelLibrary, KernelFunction) and the device registry.

Public methods validate and keep the bookkeeping every device shares (sequence numbers,
waits, hazards); devices implement the underscore hooks.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import itertools
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from aotrt.errors import AotrtError, DeviceError, HazardError, InvalidArgument, Unsupported
from aotrt.kernels import ir
from aotrt.kernels.bounds import kernel_accesses
from aotrt.runtime import hazards
from aotrt.runtime.hazards import Access, HazardChecker
from aotrt.runtime.options import StreamOptions

if TYPE_CHECKING:
    from aotrt.runtime.memory import Memory
    from aotrt.runtime.tensor import Handle


class SyncKind(enum.Enum):
    """How `Stream.synchronize` ends the recorded work."""

    NONE = "none"
    COMMIT = "commit"
    COMMIT_AND_WAIT = "commit_and_wait"
    COMMIT_AND_CONTINUE = "commit_and_continue"
    FLUSH = "flush"


@dataclass(frozen=True)
class Command:
    """One recorded command, kept for replay: what it touches, its device work, its label."""

    accesses: tuple[Access, ...]
    work: Any
    label: str


@dataclass(frozen=True)
class Block:
    """Raw memory from a device: an address, a capacity and whatever keeps it alive."""

    ptr: int
    nbytes: int
    # Not compared or printed: it is a device object (a numpy buffer on cpu), not a value.
    keep: Any = field(default=None, repr=False, compare=False)


_stream_ids = itertools.count(1)


class Stream(ABC):
    """An ordered queue of device work with explicit commits and waits.

    Commands get increasing sequence numbers. A wait covers every command recorded before it
    on this stream, whether it was committed, flushed or committed-and-continued.
    """

    def __init__(self, device: "Device", options: StreamOptions) -> None:
        self.device = device
        self.options = options
        self.id = next(_stream_ids)
        self.hazards = HazardChecker(options.check_hazards or hazards.enabled_by_env())
        self.completed_waits = 0
        self.recorded_seq = 0
        self.submitted_seq = 0
        self.completed_seq = 0
        self.label = ""
        self.closed = False
        self._lock = threading.RLock()
        self._plan: list[Command] | None = None

    def __repr__(self) -> str:
        return f"<{self.device.name} stream {self.id}>"

    @contextlib.contextmanager
    def planning(self) -> Iterator[list[Command]]:
        """Within the block, `record` keeps each command in the yielded list instead of
        queuing it, so a caller can validate and build work once and `replay` it many times.
        The stream must not be shared with another thread while it plans (a delegate plans
        its own stream at load)."""
        with self._lock:
            self._check_open()
            if self._plan is not None:
                raise InvalidArgument(f"stream: {self!r} is already planning")
            self._plan = plan = []
        try:
            yield plan
        finally:
            self._plan = None

    def replay(self, cmd: Command) -> int:
        """Queue a command kept by `planning`; the hazard checker sees it as a new one."""
        return self.record(cmd.accesses, cmd.work, cmd.label)

    # -- recording ----------------------------------------------------------------------------

    def record(self, accesses: Sequence[Access], work: Any, label: str = "") -> int:
        """Queue one command that touches `accesses`; returns its sequence number."""
        with self._lock:
            self._check_open()
            if self._plan is not None:
                # Planned, not queued: the checks and the bookkeeping happen at each replay.
                self._plan.append(Command(tuple(accesses), work, label))
                return self.recorded_seq
            # The stream's label names the program instruction being run (set by delegates);
            # keep it in front of the command's own label so a HazardError names both.
            if self.label:
                label = f"{self.label}: {label}" if label else self.label
            label = label or "command"
            for acc in accesses:
                if acc.alloc.freed:
                    raise HazardError(f"{label} uses freed allocation {acc.alloc.describe()}")
            if self.hazards.enabled:      # off, the checker costs nothing per command
                self.hazards.on_command(list(accesses), label)
            self.recorded_seq += 1
            seq = self.recorded_seq
            for acc in accesses:
                last, last_write = acc.alloc.uses.get(self, (0, 0))
                acc.alloc.uses[self] = (seq, seq if acc.write else last_write)
            self._record(work)
            if (self.options.flush_interval and not self.options.deferred
                    and self.recorded_seq - self.submitted_seq >= self.options.flush_interval):
                self.commit_and_continue()
            return seq

    @property
    def is_planning(self) -> bool:
        """True while `planning` keeps recorded commands instead of queueing them."""
        return self._plan is not None

    @property
    def is_empty(self) -> bool:
        """True when nothing is recorded that has not been submitted."""
        return self.recorded_seq == self.submitted_seq

    # -- sync verbs ---------------------------------------------------------------------------

    def commit(self) -> None:
        """Submit the recorded work; a later wait still covers it."""
        with self._lock:
            self._check_open()
            self._submit_all()
            self.hazards.end_buffer()

    def commit_and_continue(self) -> None:
        """Submit the recorded work but keep recording into the same command buffer."""
        with self._lock:
            self._check_open()
            self._submit_all()

    def flush(self) -> None:
        """Submit the recorded work (kept tracked for a later wait, like commit)."""
        self.commit()

    def commit_and_wait(self) -> None:
        """Submit and block until everything recorded so far on this stream is done."""
        with self._lock:
            self._check_open()
            self._submit_all()
            self.hazards.end_buffer()
            target = self.submitted_seq
            try:
                self._wait()
            finally:
                # The work ran to its end even where the wait reports its error (a kernel's
                # flag, a queued work's exception): what it touched is the host's again.
                self.completed_seq = target
                self.completed_waits += 1

    def synchronize(self, kind: SyncKind | str = SyncKind.COMMIT_AND_WAIT) -> None:
        """Apply a SyncKind (or its name)."""
        try:
            kind = SyncKind(kind) if isinstance(kind, str) else kind
        except ValueError:
            raise InvalidArgument(f"kind: unknown sync kind {kind!r}") from None
        if not isinstance(kind, SyncKind):
            raise InvalidArgument(f"kind: expected a SyncKind, got {kind!r}")
        if kind is SyncKind.NONE:
            return
        if kind is SyncKind.COMMIT_AND_WAIT:
            self.commit_and_wait()
        elif kind is SyncKind.COMMIT_AND_CONTINUE:
            self.commit_and_continue()
        else:
            self.commit()

    def wait_for(self, alloc: Any, writes_only: bool = False) -> bool:
        """Wait if this stream has unfinished work on `alloc`; returns whether it waited (a
        closed stream never waits: its close waited for everything)."""
        last, last_write = alloc.uses.get(self, (0, 0))
        return self.wait_past(last_write if writes_only else last)

    def wait_past(self, seq: int) -> bool:
        """Wait until command `seq` is done, unless it is already or the stream is closed
        (its close waited for all its work); returns whether it waited. Safe from any
        thread while another closes the stream: the check and the wait are one step."""
        if seq <= self.completed_seq:
            return False
        with self._lock:
            if self.closed or seq <= self.completed_seq:
                return False
            self.commit_and_wait()
            return True

    def close(self) -> None:
        """Wait for all work, stop the stream, and drop its pooled memory; safe to call
        twice, and from any thread while others queue, wait or close (they then wait for
        the close, and what they queue after it is refused)."""
        with self._lock:
            if self.closed:
                return
            self._final_wait()
            self._close()
            self.closed = True
        # Outside the stream's lock: Memory holds its own lock while it waits for streams.
        # Closed first, so that nothing is pooled for this stream after the purge.
        self.device.memory.pool.purge_stream(self)

    def _final_wait(self) -> None:
        """The wait that `close` makes before it stops the stream (its failure is raised,
        and the stream stays open)."""
        self.commit_and_wait()

    def _submit_all(self) -> None:
        if self.recorded_seq != self.submitted_seq:
            self._submit()
            self.submitted_seq = self.recorded_seq

    def _check_open(self) -> None:
        if self.closed:
            raise InvalidArgument(f"stream: {self!r} is closed")

    # -- data movement ------------------------------------------------------------------------

    def copy(self, dst: "Handle", src: "Handle") -> int:
        """Queue an element-wise copy between two views of equal sizes and dtype."""
        from aotrt.runtime.tensor import check_live

        check_live(dst, "dst")
        check_live(src, "src")
        if dst.dtype is not src.dtype:
            raise InvalidArgument(f"copy: dtype mismatch dst {dst.dtype} vs src {src.dtype}")
        if dst.sizes != src.sizes:
            raise InvalidArgument(f"copy: sizes mismatch dst {dst.sizes} vs src {src.sizes}")
        for h, name in ((dst, "dst"), (src, "src")):
            if h.device is not self.device:
                # a device kernel on another device's memory would fault, not fail cleanly
                raise InvalidArgument(f"{name}: handle is on {h.device.name}, the stream on "
                                      f"{self.device.name}")
        if dst.numel == 0:
            return self.recorded_seq
        acc = [src.access(write=False), dst.access(write=True)]
        return self.record(acc, self._copy_work(dst, src), "copy")

    def fill(self, view: "Handle", byte: int) -> int:
        """Queue setting every byte of `view`'s elements to `byte`."""
        from aotrt.runtime.tensor import check_live

        check_live(view, "view")
        if not isinstance(byte, int) or not 0 <= byte <= 255:
            raise InvalidArgument(f"fill: byte must be in [0, 255], got {byte!r}")
        if view.device is not self.device:
            raise InvalidArgument(f"view: handle is on {view.device.name}, the stream on "
                                  f"{self.device.name}")
        if view.numel == 0:
            return self.recorded_seq
        return self.record([view.access(write=True)], self._fill_work(view, byte), "fill")

    # -- hooks --------------------------------------------------------------------------------

    @abstractmethod
    def _record(self, work: Any) -> None:
        """Add one command's work to the open command buffer."""

    @abstractmethod
    def _submit(self) -> None:
        """Hand the open command buffer to the device."""

    @abstractmethod
    def _wait(self) -> None:
        """Block until all submitted work is done; raise DeviceError if any failed."""

    def _close(self) -> None:
        """Release device resources of the stream."""

    @abstractmethod
    def _copy_work(self, dst: "Handle", src: "Handle") -> Any:
        """The device work of a strided copy."""

    @abstractmethod
    def _fill_work(self, view: "Handle", byte: int) -> Any:
        """The device work of a byte fill."""


class KernelFunction(ABC):
    """One compiled kernel: bind views and scalars by slot, then dispatch on a stream."""

    def __init__(self, library: "KernelLibrary", kernel: ir.Kernel) -> None:
        self.library = library
        self.kernel = kernel
        self.name = kernel.name
        self._bound: list[Any] = [None] * len(kernel.args)
        self._bounds = arg_bounds(kernel)

    def bind(self, slot: int, handle: "Handle") -> None:
        """Bind a view to argument `slot` (as its allocation plus byte offset)."""
        if not isinstance(slot, int) or not 0 <= slot < len(self._bound):
            raise InvalidArgument(f"slot: {slot!r} out of range for kernel {self.name}")
        self._check_arg(slot, handle)
        self._bound[slot] = handle

    def _check_arg(self, slot: int, handle: "Handle") -> None:
        from aotrt.runtime.tensor import Handle

        if not isinstance(handle, Handle):
            raise InvalidArgument(f"arg {slot}: expected a Handle, got {type(handle).__name__}")
        if handle.state != "live":
            raise HazardError(f"kernel {self.name}: argument {slot} is a {handle.state} handle")
        want = self.kernel.args[slot].dtype
        if handle.dtype.name != want:
            raise InvalidArgument(f"arg {slot}: kernel {self.name} wants {want}, "
                                  f"got {handle.dtype.name}")
        if handle.device is not self.library.device:
            raise InvalidArgument(f"arg {slot}: handle is on {handle.device.name}, kernel on "
                                  f"{self.library.device.name}")

    def __call__(self, stream: Stream, *args: "Handle", label: str = "") -> int:
        """Bind `args` in order and dispatch over the kernel's whole grid on `stream`."""
        if len(args) != len(self._bound):
            raise InvalidArgument(f"kernel {self.name} takes {len(self._bound)} arguments, "
                                  f"got {len(args)}")
        for i, a in enumerate(args):
            self.bind(i, a)
        return self.dispatch(stream, label=label)

    def dispatch(self, stream: Stream, grid: int | None = None, label: str = "") -> int:
        """Queue the kernel over `grid` outer elements (default: all) on `stream`."""
        if stream.device is not self.library.device:
            raise InvalidArgument(f"stream: {stream!r} is not on {self.library.device.name}")
        if self.library.closed:
            raise InvalidArgument(f"kernel {self.name}: its library is closed")
        n = self.kernel.numel if grid is None else grid
        if not isinstance(n, int) or not 0 <= n <= self.kernel.numel:
            raise InvalidArgument(f"grid: {grid!r} outside [0, {self.kernel.numel}]")
        bound = list(self._bound)
        self._bound = [None] * len(bound)
        for i, h in enumerate(bound):
            if h is None:
                raise InvalidArgument(f"kernel {self.name}: argument {i} is not bound")
            if h.state != "live":
                raise HazardError(f"kernel {self.name}: argument {i} is a {h.state} handle")
        accesses: list[Access] = []
        for i, h in enumerate(bound):
            accesses.extend(self._arg_accesses(i, h))
        if n == 0:
            return stream.recorded_seq
        return stream.record(accesses, self._work(bound, n), label or f"kernel {self.name}")

    def _arg_accesses(self, i: int, h: "Handle") -> list[Access]:
        """The accesses the kernel's code makes through argument `i` bound to `h`."""
        a, rng = self.kernel.args[i], self._bounds[i]
        if rng is None:
            return []  # never touched (an empty iteration space)
        if rng == "float" or h.alloc is None:
            raise InvalidArgument(f"arg {i}: kernel {self.name} indexes it at "
                                  f"{'a non-integer index' if h.alloc else 'no memory'}")
        # The kernel's own index range, not the view's: it is what the code touches.
        isz = h.dtype.itemsize
        start, end = h.byte_offset + rng[0] * isz, h.byte_offset + (rng[1] + 1) * isz
        if start < 0 or end > h.alloc.nbytes:
            raise InvalidArgument(
                f"arg {i}: kernel {self.name} touches bytes [{start}, {end}) of "
                f"{h.alloc.describe()}, outside its [0, {h.alloc.nbytes})")
        out = []
        if "r" in a.mode:
            out.append(Access(h.alloc, start, end, False))
        if "w" in a.mode:
            out.append(Access(h.alloc, start, end, True))
        return out

    def prepare(self, static: Sequence["Handle | None"]) -> "PreparedLaunch":
        """A launch over the whole grid resolved now: `static` holds a handle per slot (None:
        a per-run slot, given to each `PreparedLaunch.launch`), checked and turned into
        pointers and access records once."""
        if len(static) != len(self._bound):
            raise InvalidArgument(f"kernel {self.name} takes {len(self._bound)} arguments, "
                                  f"got {len(static)}")
        accesses: list[list[Access] | None] = []
        addrs: list[int] = []
        per_run: list[int] = []
        for i, h in enumerate(static):
            if h is None:
                per_run.append(i)
                addrs.append(0)
                accesses.append(None)
                continue
            self._check_arg(i, h)
            accesses.append(self._arg_accesses(i, h))
            addrs.append(h.address)
        return PreparedLaunch(self, tuple(per_run), addrs, accesses)

    def _work_addresses(self, addrs: list[int], n: int) -> Any:
        """The device work of one dispatch from argument addresses (devices override it)."""
        raise Unsupported(f"kernel {self.name}: this device has no prepared launches")

    @abstractmethod
    def _work(self, bound: list["Handle"], n: int) -> Any:
        """The device work of one dispatch over `n` outer elements."""


class PreparedLaunch:
    """A kernel launch built once (KernelFunction.prepare): the static arguments' pointers
    and access records are precomputed; `launch` patches in only the per-run slots."""

    __slots__ = ("fn", "per_run", "_addrs", "_slot_accesses", "_accesses", "_work", "_label",
                 "_n")

    def __init__(self, fn: KernelFunction, per_run: tuple[int, ...], addrs: list[int],
                 accesses: list[list[Access] | None]) -> None:
        self.fn = fn
        self.per_run = per_run
        self._addrs = addrs
        # Per slot (None: per-run), so a launch records them in slot order, as dispatch does.
        self._slot_accesses = accesses
        self._accesses = [a for acc in accesses if acc for a in acc]
        self._n = fn.kernel.numel
        self._label = f"kernel {fn.name}"
        # All arguments static: one work object serves every run (it reads no run state).
        self._work = fn._work_addresses(addrs, self._n) if not per_run and self._n else None

    def launch(self, stream: Stream, handles: Sequence["Handle"] = ()) -> int:
        """Queue the kernel on `stream` with `handles` in the per-run slots, in order."""
        fn = self.fn
        if stream.device is not fn.library.device:
            raise InvalidArgument(f"stream: {stream!r} is not on {fn.library.device.name}")
        if fn.library.closed:
            raise InvalidArgument(f"kernel {fn.name}: its library is closed")
        if len(handles) != len(self.per_run):
            raise InvalidArgument(f"kernel {fn.name}: {len(self.per_run)} per-run arguments, "
                                  f"got {len(handles)}")
        if not self.per_run:
            if self._work is None:
                return stream.recorded_seq
            return stream.record(self._accesses, self._work, self._label)
        slot_acc = list(self._slot_accesses)
        # A fresh address list per launch: queued work of an earlier run may not have run yet.
        addrs = list(self._addrs)
        for slot, h in zip(self.per_run, handles):
            fn._check_arg(slot, h)
            slot_acc[slot] = fn._arg_accesses(slot, h)
            addrs[slot] = h.address
        accesses = [a for acc in slot_acc if acc for a in acc]
        if self._n == 0:
            return stream.recorded_seq
        return stream.record(accesses, fn._work_addresses(addrs, self._n), self._label)


def arg_bounds(kernel: ir.Kernel) -> list[Any]:
    """Per argument: the (lowest, highest) element index the kernel touches, None if it
    touches nothing, or "float" when an index is not provably an integer."""
    out: list[Any] = [None] * len(kernel.args)
    for arg, rng, _ in kernel_accesses(kernel):
        if rng is None:
            continue
        if rng == "float" or out[arg] == "float":
            out[arg] = "float"
        elif out[arg] is None:
            out[arg] = rng
        else:
            out[arg] = (min(out[arg][0], rng[0]), max(out[arg][1], rng[1]))
    return out


class KernelLibrary(ABC):
    """Source compiled once (through an on-disk cache), with a KernelFunction per name."""

    def __init__(self, device: "Device", kernels: Sequence[ir.Kernel]) -> None:
        names = [k.name for k in kernels]
        if len(set(names)) != len(names):
            raise InvalidArgument("kernels: duplicate kernel names")
        self.device = device
        self.kernels = {k.name: k for k in kernels}
        from aotrt.kernels.render_c import symbol

        # Contract C1: kernel i of the rendered source is exported as symbol(i); the file's
        # names are labels only.
        self.symbols: dict[str, str] = {k.name: symbol(i) for i, k in enumerate(kernels)}
        self.closed = False
        self._close_lock = threading.Lock()     # two threads' closes release it once
        self.source = device.renderer.render(kernels)
        self._compile()

    def symbol(self, name: str) -> str:
        """The symbol of kernel `name` in the compiled code (aotrt's own, never the name)."""
        return self.symbols[name]

    def kernel(self, name: str) -> KernelFunction:
        """A new KernelFunction for kernel `name`."""
        if self.closed:
            raise InvalidArgument(f"name: the library of kernel {name!r} is closed")
        if name not in self.kernels:
            raise InvalidArgument(f"name: no kernel {name!r} in this library")
        return self._function(self.kernels[name])

    def close(self) -> None:
        """Release the compiled code once the streams that ran it are drained; safe twice.

        A KernelFunction of a closed library refuses to dispatch.
        """
        with self._close_lock:
            if self.closed:
                return
            self.closed = True
        self._close()

    def _close(self) -> None:
        """Release the device's handle on the compiled code."""

    @abstractmethod
    def _compile(self) -> None:
        """Compile `self.source` (or fetch it from the cache)."""

    @abstractmethod
    def _function(self, kernel: ir.Kernel) -> KernelFunction:
        """Make the KernelFunction of one kernel."""


class Device(ABC):
    """One device: memory, streams (a default one and a per-thread current one), kernels."""

    name: str = ""
    renderer: Any = None
    #: can capture a stream's work once and replay it as one graph (begin/end_capture)
    supports_graphs: bool = False
    #: its memory is host memory: a host pointer can be bound as a view without a copy
    host_addressable: bool = False
    #: the DLPack device type (kDLCPU 1, kDLCUDA 2) of a foreign tensor it can take in place
    dlpack_type: int = 0

    def prefers_channels_last(self, dtype: str) -> bool:
        """True when its convolutions of this dtype ("float32", ...) run fastest on
        channels-last (NHWC) activations."""
        return False

    def __init__(self) -> None:
        from aotrt.runtime.memory import Memory

        self.memory: Memory = Memory(self)
        self._default: Stream | None = None
        self._tls = threading.local()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<aotrt device {self.name}>"

    def native_plan(self, works: Sequence[tuple[str, Any]]) -> Any:
        """A callable running a static plan's works (label, work) in order faster than one
        by one from Python, or None where the device has no such runner."""
        return None

    def native_moves(self, slot: Any, moves: Sequence[tuple[int, int, int]]) -> Any:
        """The native form (for `native_plan`) of memmoves (dst offset, src address, bytes)
        to the address held in the one-element uint64 array `slot`; None where the device
        has none."""
        return None

    def create_stream(self, options: StreamOptions | None = None) -> Stream:
        """A new stream on this device."""
        options = options or StreamOptions.from_env()
        if not isinstance(options, StreamOptions):
            raise InvalidArgument(f"options: expected StreamOptions, got {options!r}")
        return self._create_stream(options)

    def default_stream(self) -> Stream:
        """The device's default stream, created on first use."""
        with self._lock:
            if self._default is None or self._default.closed:
                self._default = self._create_stream(StreamOptions.from_env())
            return self._default

    def current_stream(self) -> Stream:
        """The calling thread's current stream (the default stream unless set)."""
        s = getattr(self._tls, "stream", None)
        return s if s is not None and not s.closed else self.default_stream()

    @contextlib.contextmanager
    def stream_guard(self, stream: Stream) -> Iterator[Stream]:
        """Make `stream` current in this thread for the block; nested guards restore."""
        if not isinstance(stream, Stream) or stream.device is not self:
            raise InvalidArgument(f"stream: {stream!r} is not a stream of {self.name}")
        prev = getattr(self._tls, "stream", None)
        self._tls.stream = stream
        try:
            yield stream
        finally:
            self._tls.stream = prev

    def kernel_library(self, kernels: Sequence[ir.Kernel]) -> KernelLibrary:
        """Compile `kernels` into one library (cached on disk)."""
        return self._library(kernels)

    def after_consumer(self, alloc: Any, stream: Any) -> None:
        """Order every later use of `alloc` after the work a DLPack consumer queued on
        `stream` (its `__dlpack__(stream=...)` argument) before letting the memory go.
        A host device's consumers are done when they let go: nothing to order."""

    # -- hooks --------------------------------------------------------------------------------

    @abstractmethod
    def _create_stream(self, options: StreamOptions) -> Stream:
        """Make a stream."""

    @abstractmethod
    def _alloc(self, nbytes: int) -> Block:
        """Raw memory of at least `nbytes`, aligned to 64 bytes; raise OutOfMemory."""

    @abstractmethod
    def _free(self, block: Block) -> None:
        """Give raw memory back."""

    @abstractmethod
    def _library(self, kernels: Sequence[ir.Kernel]) -> KernelLibrary:
        """Compile a kernel library."""

    @abstractmethod
    def read(self, handle: "Handle") -> Any:
        """A host numpy copy of a view's elements (caller has waited)."""

    @abstractmethod
    def write(self, handle: "Handle", array: Any) -> None:
        """Write a host numpy array into a view's elements (caller has waited)."""

    def host_view(self, handle: "Handle") -> Any:
        """A zero-copy numpy view of a view's elements, for host-memory devices only."""
        raise DeviceError(f"{self.name} memory is not host-addressable")


DEVICES: dict[str, str] = {
    "cpu": "aotrt.runtime.backends.cpu.device:CpuDevice",
    "cuda": "aotrt.runtime.backends.cuda.device:CudaDevice",
}
_instances: dict[str, Device] = {}
_registry_lock = threading.Lock()


def parse_device(spec: Any) -> str:
    """Normalize 'cpu', 'cuda', 'cuda:0' or a Device to a registry name; refuse others."""
    if isinstance(spec, Device):
        return spec.name
    if not isinstance(spec, str):
        raise InvalidArgument(f"device: expected a device name, got {spec!r}")
    name, _, index = spec.partition(":")
    if name not in DEVICES:
        raise InvalidArgument(f"device: unknown device type {spec!r} (known: {sorted(DEVICES)})")
    if index not in ("", "0"):
        raise InvalidArgument(f"device: index {index!r} of {spec!r} is not supported (only 0)")
    return name


def get_device(spec: Any = "cpu") -> Device:
    """The process-wide Device for 'cpu' or 'cuda'; raise DeviceError if unavailable."""
    if isinstance(spec, Device):
        return spec
    name = parse_device(spec)
    with _registry_lock:
        if name not in _instances:
            module, _, cls = DEVICES[name].partition(":")
            try:
                _instances[name] = getattr(importlib.import_module(module), cls)()
            except AotrtError:
                raise
            except Exception as e:  # noqa: BLE001 - a missing driver or module, told as such
                raise DeviceError(f"device: {name} is not available here: {e}") from e
        return _instances[name]


def cuda_available() -> bool:
    """True when the cuda device can be created here."""
    try:
        get_device("cuda")
        return True
    except Exception:  # noqa: BLE001 - any failure means "not available"
        return False


def default_device() -> str:
    """'cuda' when present, else 'cpu'."""
    return "cuda" if cuda_available() else "cpu"
