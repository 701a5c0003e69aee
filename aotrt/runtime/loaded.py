"""LoadedProgram: what one loaded program file holds for all of its methods.

A program file's constants, kernels and state belong to the program, not to a method: they
are uploaded, compiled and allocated once here, and every method's Delegate makes its
views into them. The methods share this stream, so a write to the state by one method is
ordered before the next method's read without an event, and one lock, so that two
threads never run two methods over the same state at once.
"""

from __future__ import annotations

import logging
import threading
from typing import Iterator, Mapping

import numpy as np

from aotrt import dtypes
from aotrt.analysis import sole_read_constants
from aotrt.errors import InvalidArgument
from aotrt.program import Program
from aotrt.runtime import finalize, shims
from aotrt.runtime.constants import Constants
from aotrt.runtime.device import Device, KernelLibrary, Stream
from aotrt.runtime.memory import PROCESS_OWNER, Owner, owner_scope
from aotrt.runtime.options import StreamOptions
from aotrt.runtime.public import Tensor
from aotrt.runtime.teardown import Resources, teardown
from aotrt.runtime.tensor import Handle

log = logging.getLogger(__name__)


class LoadedProgram:
    """A program's constants, state and kernel library on one device, and the stream and
    lock its methods share; `close` frees them (after the methods are closed)."""

    def __init__(self, program: Program, device: Device, options: StreamOptions,
                 name: str) -> None:
        """Upload the constants, allocate and initialise the state, compile the kernels."""
        self.program = program
        self.device = device
        self.name = name
        self.owner = Owner(f"program {name}")
        #: held by every method's run: methods share the state and the stream
        self.lock = threading.RLock()
        self._res = Resources(self.owner)
        self._closer = finalize.finalizer(self, teardown, self._res)
        self.constant_bases: list[Handle] = []
        self.state_bases: list[Handle] = []
        self._state_index = {s.name: s.index for s in program.tables.state}
        try:
            with owner_scope(self.owner):
                self.stream: Stream = device.create_stream(options)
                self._res.stream = self.stream
                with device.stream_guard(self.stream):
                    self._constants()
                    self._state()
                    self.library: KernelLibrary | None = (
                        device.kernel_library(program.kernels) if program.kernels else None)
                    self._res.library = self.library
        except BaseException:
            self._closer()
            raise

    def _constants(self) -> None:
        prog, dev, u8 = self.program, self.device, dtypes.uint8
        arrays = list(prog.constants.values())
        calloc, offsets = dev.memory.allocate_constants([int(a.nbytes) for a in arrays],
                                                        self.stream, self.owner)
        # A constant that one instruction of one method alone reads may be re-laid in place
        # for that instruction (cpu oneDNN): a read from any other method forbids it.
        methods = list(prog.methods.values())
        used = [{t.index for t in m.record.tensors if t.root == "constant"} for m in methods]
        # A state's initial value is read by reset() too: never re-laid.
        inits = {s.init_index for s in prog.tables.state if s.init_index is not None}
        # A dynamic method's sizes each prepare their own op over the same weight, each
        # wanting its own layout: none of its constants is re-laid.
        sole = {c for i, m in enumerate(methods) if not m.is_dynamic
                for c in sole_read_constants(m.record.tensors, m.record.instructions)
                if c not in inits and not any(c in u for j, u in enumerate(used) if j != i)}
        #: the constants' allocation and the right to re-lay them (runtime/constants.py)
        self.constants = Constants(calloc, frozenset(
            (offsets[c], offsets[c] + int(arrays[c].nbytes)) for c in sole))
        for arr, off in zip(arrays, offsets):
            n = int(arr.nbytes)
            ptr = calloc.ptr + off if n else 0
            base = shims.create_tensor_from_blob(ptr, [n], [1], 0, u8, dev)
            self.constant_bases.append(base)
            if n:
                dev.write(base, np.ascontiguousarray(arr).reshape(-1).view(np.uint8))

    def _state(self) -> None:
        for spec in self.program.tables.state:
            # One allocation per buffer, so that a view of one can never reach another.
            self.state_bases.append(shims.empty_strided([spec.nbytes], [1], dtypes.uint8,
                                                        self.device))
        self._reset()

    def _reset(self) -> None:
        for spec in self.program.tables.state:
            base = self.state_bases[spec.index]
            if spec.init_index is None:
                self.stream.fill(base, 0)
            else:
                self.stream.copy(base, self.constant_bases[spec.init_index])

    def snapshot_state(self) -> list[Handle]:
        """Copies of every state buffer (queued on the stream), for `restore_state`: a CUDA
        graph's capture runs its method once eagerly, which must not change the state."""
        copies: list[Handle] = []
        try:
            for base in self.state_bases:
                copy = shims.empty_strided(list(base.sizes), [1], dtypes.uint8, self.device)
                copies.append(copy)
                self.stream.copy(copy, base)
        except BaseException:
            self._delete(copies)
            raise
        return copies

    def restore_state(self, copies: list[Handle]) -> None:
        """Write `snapshot_state`'s copies back (queued), and delete them once that is done."""
        try:
            for base, copy in zip(self.state_bases, copies):
                self.stream.copy(base, copy)
            self.stream.commit_and_wait()
        finally:
            self._delete(copies)

    @staticmethod
    def _delete(handles: list[Handle]) -> None:
        for h in handles:
            if h.state == "live":
                shims.delete_tensor_object(h)

    # -- what the module offers -------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once close() ran."""
        return not self._closer.alive

    def reset(self) -> None:
        """Give every state buffer its initial value again (ordered after queued runs)."""
        with self.lock:
            self._check_open()
            with owner_scope(self.owner), self.device.stream_guard(self.stream):
                self._reset()
                self.stream.commit()

    def read_state(self, name: str) -> Tensor:
        """A copy of state buffer `name` as it is after the runs queued so far."""
        with self.lock:
            self._check_open()
            i = self._state_index.get(name) if isinstance(name, str) else None
            if i is None:
                raise InvalidArgument(f"state {name!r}: the program's state is "
                                      f"{sorted(self._state_index)}")
            spec = self.program.tables.state[i]
            dt, shape, strides = spec.dtype, list(spec.shape), list(spec.strides)
            view = shims.reinterpret_tensor(self.state_bases[i], shape, strides, 0, dtype=dt)
            try:
                with owner_scope(PROCESS_OWNER), self.device.stream_guard(self.stream):
                    out = shims.empty_strided(shape, strides, dt, self.device)
                    self.stream.copy(out, view)
                    self.stream.commit()
            finally:
                shims.delete_tensor_object(view)
            return Tensor(out)      # it owns the copy (process memory) from now on

    @property
    def state_names(self) -> tuple[str, ...]:
        """The state buffers' names, in the file's order."""
        return tuple(self._state_index)

    def _check_open(self) -> None:
        if self.closed:
            raise InvalidArgument(f"program {self.name} is closed")

    def close(self) -> None:
        """Wait for queued work, then free the constants, state and kernels (runs once)."""
        with self.lock:
            self._closer()
            self.constant_bases = []
            self.state_bases = []

    def __repr__(self) -> str:
        return f"<aotrt.LoadedProgram {self.name} {'closed' if self.closed else 'open'}>"


class StateView(Mapping[str, Tensor]):
    """`module.state`: name -> a copy of that state buffer, read when asked."""

    def __init__(self, loaded: LoadedProgram) -> None:
        self._loaded = loaded

    def __getitem__(self, name: str) -> Tensor:
        return self._loaded.read_state(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaded.state_names)

    def __len__(self) -> int:
        return len(self._loaded.state_names)


__all__ = ["LoadedProgram", "StateView"]
