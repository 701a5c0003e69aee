"""Loop: a bound method run step after step, with an output fed back as an input on the
device and the outputs read back a step late.

A decode step's token is its next step's input. Run as `Binding.run` calls, each step waits
for its token on the host, hands it back, and the device idles from the end of one step to
the start of the next (the host's part of a step, on an H100 about 90 us of a 0.7 ms GPT-2
token). A loop instead copies the fed output into the input on the device, in stream order,
and downloads each step's outputs into a page-locked slot with an event, so the host queues
step i+1 before it reads step i, and the device always has the next step.

    loop = Loop(decode.bind(), feed={0: 0})     # output 0 becomes input 0
    loop.step(first_ids, slot, start)           # the first step: every input given
    loop.step(None, slot + 1, start)            # None: input 0 is the last step's output 0
    ids, = loop.result()                        # step 1's outputs (waits for them)

Where the binding has no graph with staged uploads (the cpu device, the hazard checker on,
deferred streams), a step is a `Binding.run` that waits, with the fed input handed back on
the host: the same results, one step at a time.
"""

from __future__ import annotations

import ctypes
from collections import deque
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from aotrt.errors import InvalidArgument
from aotrt.runtime.memory import owner_scope

if TYPE_CHECKING:
    from aotrt.runtime.binding import Binding

#: steps a loop may have queued and unread: two keep the device busy while the host reads
DEPTH = 2


class Loop:
    """A bound method run step after step: `feed` maps an output's index to the input it
    becomes at the next step; `step` queues one step, `result` reads the oldest unread."""

    def __init__(self, binding: "Binding", feed: Mapping[int, int]) -> None:
        d = binding._delegate
        self._binding, self._delegate = binding, d
        self._feed = dict(feed)
        outs, ins = d.outputs, d.inputs
        for o, i in self._feed.items():
            if not (0 <= o < len(outs) and 0 <= i < len(ins)):
                raise InvalidArgument(f"feed: {d.name} has {len(outs)} outputs and "
                                      f"{len(ins)} inputs; {o} -> {i} is outside them")
            if outs[o].dtype != ins[i].dtype or outs[o].nbytes != ins[i].nbytes:
                raise InvalidArgument(
                    f"feed: output {outs[o].name} ({outs[o].dtype}, {outs[o].nbytes} bytes) "
                    f"cannot become input {ins[i].name} ({ins[i].dtype}, {ins[i].nbytes})")
        self._fed_into = {i: o for o, i in self._feed.items()}
        self._specs = [(s.dtype.np, tuple(s.shape)) for s in outs]
        self._pending: deque[Any] = deque()
        self._last: tuple[np.ndarray, ...] | None = None   # the fallback's last outputs
        self._steps = 0
        self._closed = False
        self._readback = None
        up, stream = binding._uploads, d._stream
        if up is not None and not stream.hazards.enabled and not stream.options.deferred:
            self._plan_device(up)

    def _plan_device(self, up: Any) -> None:
        """Addresses of the device path, resolved once: per input its upload from the
        staging block, per fed input the copy from its output, the outputs' downloads."""
        b = self._binding
        self._uploads = [(h.address, src, n) for h, (src, n) in zip(b._ins, up.moves)]
        srcs = []
        for t, s in zip(b.outputs, self._delegate.outputs):
            if not t.handle.packed:
                return      # an output that is not one dense run: the host path reads it
            srcs.append((t.handle.address, s.nbytes))
        self._srcs = srcs
        self._copies = {i: (self._uploads[i][0], srcs[o][0], srcs[o][1])
                        for o, i in self._feed.items()}
        self._offsets = np.cumsum([0] + [n for _, n in srcs]).tolist()
        self._readback = up.graph.readback(self._offsets[-1], DEPTH)

    @property
    def pending(self) -> int:
        """Steps queued whose outputs have not been read."""
        return len(self._pending)

    def step(self, *inputs: Any) -> None:
        """Queue one step. Every input is a host array of its spec's dtype and shape; a fed
        input may be None (the previous step's output), and must be None after step 0."""
        d = self._delegate
        if self._closed:
            raise InvalidArgument(f"loop over {d.name}: closed")
        if len(inputs) != len(d.inputs):
            raise InvalidArgument(f"inputs: {d.name} takes {len(d.inputs)} inputs, got "
                                  f"{len(inputs)}")
        if len(self._pending) >= DEPTH:
            raise InvalidArgument(f"loop over {d.name}: {DEPTH} steps are unread; read a "
                                  f"result before queueing another")
        for i, x in enumerate(inputs):
            if x is None and (i not in self._fed_into or self._steps == 0):
                raise InvalidArgument(f"inputs: {d.inputs[i].name} is None, but it is not "
                                      f"fed from an earlier step")
        if self._readback is None:
            self._step_host(inputs)
        else:
            self._step_device(inputs)
        self._steps += 1

    def _step_host(self, inputs: tuple[Any, ...]) -> None:
        """The fallback: a bound run, the fed inputs from the last outputs on the host. The
        newest step's outputs stay in the bound Tensors (None in `_pending`) until a read
        or the next step needs them, so a queued run is not waited for early."""
        if any(x is None for x in inputs) or self._pending and self._pending[-1] is None:
            self._materialize()
        full = list(inputs)
        for i, o in self._fed_into.items():
            if full[i] is None:
                full[i] = self._last[o].reshape(self._delegate.inputs[i].shape)
        self._binding.run(*full)
        self._pending.append(None)

    def _materialize(self) -> None:
        """Copy the newest step's outputs out of the bound Tensors (waits for that step)."""
        if self._pending and self._pending[-1] is None:
            self._last = tuple(np.array(t) for t in self._binding.outputs)
            self._pending[-1] = self._last

    def _step_device(self, inputs: tuple[Any, ...]) -> None:
        """Stage the host inputs, queue the fed copies, the replay and the download."""
        d, b = self._delegate, self._binding
        specs = b._uploads.specs
        for i, x in enumerate(inputs):
            if x is None:
                continue
            dt, shape, _ = specs[i]
            if type(x) is not np.ndarray or x.dtype != dt or x.shape != shape or \
                    not x.flags.c_contiguous:
                raise InvalidArgument(f"inputs: {d.inputs[i].name} must be a dense numpy "
                                      f"array of {np.dtype(dt)} {shape} in a loop, got "
                                      f"{type(x).__name__} {getattr(x, 'shape', '')}")
        stream, up, rb = d._stream, b._uploads, self._readback
        k = self._steps % DEPTH
        copies = [self._copies[i] for i, x in enumerate(inputs) if x is None]
        uploads = [self._uploads[i] for i, x in enumerate(inputs)
                   if x is not None and self._uploads[i][2]]
        srcs, graph = self._srcs, up.graph
        with d._running():
            if b.stale:
                raise InvalidArgument(f"loop over {d.name}: the method's plan was rebuilt "
                                      f"after a failed run; bind again")
            with owner_scope(d._owner), d.device.stream_guard(stream):
                # The staging block is the last launch's upload source until its copies end.
                graph.wait_copies(stream)
                for i, x in enumerate(inputs):
                    if x is not None and up.moves[i][1]:
                        ctypes.memmove(up.moves[i][0], x.ctypes.data, up.moves[i][1])

                def work(st: Any) -> None:
                    graph.launch(st, copies, uploads)
                    rb.download(st, k, srcs)
                stream.record(b._accesses, work, "cuda graph replay (loop)")
                stream.commit()
        self._pending.append(k)

    def result(self) -> tuple[np.ndarray, ...]:
        """The outputs of the oldest unread step, as host arrays (waits for that step)."""
        if not self._pending:
            raise InvalidArgument(f"loop over {self._delegate.name}: no step is unread")
        if self._readback is None:
            self._materialize()
            return self._pending.popleft()
        item = self._pending.popleft()
        rb = self._readback
        rb.wait(item)
        base = rb.slot(item)
        outs = []
        for (dt, shape), lo, hi in zip(self._specs, self._offsets, self._offsets[1:]):
            raw = (ctypes.c_char * (hi - lo)).from_address(base + lo)
            outs.append(np.frombuffer(raw, dtype=dt).reshape(shape).copy())
        return tuple(outs)

    def close(self) -> None:
        """Wait for the queued steps (a kernel's error is raised here) and free the slots;
        safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._pending.clear()
        d = self._delegate
        try:
            if self._readback is not None and not d.closed:
                with d._running():
                    d._stream.commit_and_wait()
        finally:
            if self._readback is not None:
                self._readback.close()

    def __enter__(self) -> "Loop":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<aotrt.Loop over {self._delegate.name}, {self._steps} steps>"


__all__ = ["DEPTH", "Loop"]
