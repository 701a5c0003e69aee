"""DynamicMethod: a method with bounded dynamic sizes, run as one static plan per size.

    m = aotrt.load(prog)                       # prog exported with Dim("S", min=1, max=64)
    y, = m.run(x)                              # x is [2, S, 16] for any S in [1, 64]

A run reads its inputs' sizes, checks each symbol against its bounds and against every
other input dim that is the same symbol, and looks the sizes up in a bounded LRU cache of
plans. A plan is a Delegate over the method instantiated at those sizes
(aotrt/program/symbols.py): validated as a static method (its kernels' bounds included),
its kernels compiled for them, its library ops planned for them, and on cuda one graph
captured for them. Every size shares the program's constants, state and stream, and the
method's one arena, planned at the upper bound. So a run at a size seen before binds and
launches as a static program does, and a decode step of one size replays one graph.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Any, Mapping

import numpy as np

from aotrt import dtypes
from aotrt.errors import InvalidArgument, Unsupported
from aotrt.limits import Limits
from aotrt.program import Program
from aotrt.program.symbols import check_symbols, input_dims, instantiate
from aotrt.runtime import shims
from aotrt.runtime.delegate import Delegate
from aotrt.runtime.loaded import LoadedProgram, StateView
from aotrt.runtime.memory import Owner, owner_scope
from aotrt.runtime.tensor import Handle

log = logging.getLogger(__name__)

#: plans (sizes) a dynamic method keeps: each holds its compiled kernels, its prepared
#: launches and library plans, and on cuda its captured graph; the least recently used
#: goes first
DEFAULT_MAX_SIZES = 8


class DynamicMethod:
    """A method with symbols: `run` it at any sizes within their bounds."""

    def __init__(self, program: Program, loaded: LoadedProgram, name: str,
                 limits: Limits | None = None, max_sizes: int = DEFAULT_MAX_SIZES,
                 **delegate_kwargs: Any) -> None:
        """`program`: the (validated) method; `loaded`: the program's constants, state,
        kernels and stream; `delegate_kwargs`: each size's Delegate's load options."""
        if isinstance(max_sizes, bool) or not isinstance(max_sizes, int) or max_sizes < 1:
            raise InvalidArgument(f"max_sizes: expected an int >= 1, got {max_sizes!r}")
        self.program = program
        self.name = name
        self.device = loaded.device
        self.bounds: dict[str, tuple[int, int]] = check_symbols(program.symbols, "symbols")
        self._dims = input_dims(program)
        self._loaded = loaded
        self._limits = limits
        self._kwargs = delegate_kwargs
        self.max_sizes = max_sizes
        self._lock: threading.RLock = loaded.lock
        self._plans: OrderedDict[tuple[int, ...], Delegate] = OrderedDict()
        self._order = tuple(self.bounds)
        self._owner = Owner(f"dynamic method {name}")
        self._closed = False
        #: plans made (a new size, or one evicted before) and the seconds they took
        self.plans_made = 0
        self.plan_seconds = 0.0
        self._arena: Handle | None = None
        with owner_scope(self._owner), self.device.stream_guard(loaded.stream):
            self._arena = shims.empty_strided([max(program.record.arena_nbytes, 1)], [1],
                                              dtypes.uint8, self.device)
            loaded.stream.fill(self._arena, 0)
        self.inputs = list(program.record.inputs)
        self.outputs = list(program.record.outputs)

    # -- sizes --------------------------------------------------------------------------------

    def sizes_of(self, inputs: tuple[Any, ...]) -> dict[str, int]:
        """The symbols' values in `inputs`; InvalidArgument naming the input, the dim and the
        bound for a size out of range, or two inputs that disagree on one symbol."""
        specs = self.program.record.inputs
        if len(inputs) != len(specs):
            raise InvalidArgument(f"{self.name}: expected {len(specs)} inputs "
                                  f"({[s.name for s in specs]}), got {len(inputs)}")
        values: dict[str, int] = {}
        where: dict[str, str] = {}
        for sym, dims in self._dims.items():
            lo, hi = self.bounds[sym]
            for k, d in dims:
                shape = _shape(inputs[k])
                what = f"input {specs[k].name!r} dim {d}"
                if shape is None or len(shape) != len(specs[k].shape):
                    raise InvalidArgument(f"{self.name}: {what}: expected a "
                                          f"{len(specs[k].shape)}-d input, got "
                                          f"{'no shape' if shape is None else list(shape)}")
                v = int(shape[d])
                if not lo <= v <= hi:
                    raise InvalidArgument(f"{self.name}: {what} is {sym} = {v}, outside its "
                                          f"bounds [{lo}, {hi}]")
                if sym in values and values[sym] != v:
                    raise InvalidArgument(f"{self.name}: {what} is {sym} = {v}, but "
                                          f"{where[sym]} is {sym} = {values[sym]}")
                values[sym] = v
                where[sym] = what
        # The static dims too, before a plan is made for a run that would be refused anyway.
        dynamic = {kd for dims in self._dims.values() for kd in dims}
        for k, spec in enumerate(specs):
            shape = _shape(inputs[k])
            if shape is None:
                continue            # the plan's Delegate says what it expected
            if len(shape) != len(spec.shape):
                raise InvalidArgument(f"{self.name}: input {spec.name!r}: expected "
                                      f"{len(spec.shape)} dims, got shape {list(shape)}")
            for d, n in enumerate(spec.shape):
                if (k, d) not in dynamic and shape[d] != n:
                    raise InvalidArgument(f"{self.name}: input {spec.name!r} dim {d}: "
                                          f"expected {n}, got {shape[d]}")
        return values

    def plan(self, values: Mapping[str, int]) -> Delegate:
        """The plan (a Delegate) for the sizes `values`: cached, else made now."""
        key = tuple(values[s] for s in self._order)
        with self._lock:
            self._check_open()
            d = self._plans.get(key)
            if d is not None:
                self._plans.move_to_end(key)
                return d
            t0 = time.perf_counter()
            concrete = instantiate(self.program, values)
            concrete.validate(self._limits)
            d = Delegate(concrete, device=self.device, limits=self._limits, _validated=True,
                         _loaded=self._loaded, _own_kernels=True, _arena=self._arena,
                         **self._kwargs)
            d.name = f"{self.name}{dict(values)}"
            self._plans[key] = d
            while len(self._plans) > self.max_sizes:
                _, old = self._plans.popitem(last=False)
                old.close()
            self.plans_made += 1
            self.plan_seconds += time.perf_counter() - t0
            log.debug("%s: plan for %s made in %.3f s", self.name, dict(values),
                      time.perf_counter() - t0)
            return d

    @property
    def sizes_cached(self) -> tuple[tuple[int, ...], ...]:
        """The sizes (in symbol order) whose plans are kept, least recently used first."""
        return tuple(self._plans)

    # -- run ----------------------------------------------------------------------------------

    def run(self, *inputs: Any, out: Any = None) -> tuple[Any, ...]:
        """Run at the inputs' sizes; outputs have the run's sizes."""
        self._check_open()
        return self.plan(self.sizes_of(inputs)).run(*inputs, out=out)

    __call__ = run

    def bind(self) -> Any:
        """Unsupported: bind a static method (a decode step of one size) instead."""
        raise Unsupported(f"{self.name}: a method with dynamic sizes cannot be bound to static "
                          f"buffers; export the fixed-size step as a method of its own")

    @property
    def uses_graph(self) -> bool:
        """Whether the plans replay CUDA graphs (the most recent plan's answer)."""
        with self._lock:
            return bool(self._plans) and next(reversed(self._plans.values())).uses_graph

    @property
    def methods(self) -> tuple[str, ...]:
        """This method's name, as a one-method module's would be."""
        return (self.name.rsplit(".", 1)[-1],)

    @property
    def state(self) -> Mapping[str, Any]:
        """The program's state, name -> a copy."""
        return StateView(self._loaded)

    def reset(self) -> None:
        """Give every state buffer its initial value."""
        self._loaded.reset()

    # -- close --------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once close() ran."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed or self._loaded.closed:
            raise InvalidArgument(f"{self.name} is closed")

    def close(self) -> None:
        """Close every plan, then free the arena (safe twice, from any thread)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            plans, self._plans = list(self._plans.values()), OrderedDict()
        for d in plans:
            d.close()
        if not self._loaded.closed:
            self._loaded.stream.commit_and_wait()
        self._arena = None
        self._owner.close()

    def __enter__(self) -> "DynamicMethod":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        b = ", ".join(f"{s} in [{lo}, {hi}]" for s, (lo, hi) in self.bounds.items())
        return f"<aotrt.DynamicMethod {self.name} ({b}), {len(self._plans)} sizes planned>"


def _shape(x: Any) -> tuple[int, ...] | None:
    """An input's shape without converting it (numpy, DLPack objects, aotrt.Tensor)."""
    shape = getattr(x, "shape", None)
    if shape is None:
        try:
            shape = np.shape(x)
        except Exception:  # noqa: BLE001 - not array-like: the Delegate says what it wanted
            return None
    try:
        return tuple(int(n) for n in shape)
    except (TypeError, ValueError):
        return None


__all__ = ["DEFAULT_MAX_SIZES", "DynamicMethod"]
