"""Module: a loaded program of several methods, or of state kept between runs.

    with aotrt.load("decoder.aotp") as m:          # a Module: the file has methods or state
        m.methods                                   # ("decode", "prefill")
        logits, = m.method("prefill").run(ids, pos)
        m.state["cache_k"]                          # a copy, as an aotrt.Tensor
        m.reset()                                   # the state's initial values again

Each method is a Delegate over the program's one LoadedProgram (constants, state, kernels,
stream), so weights are uploaded once and a state buffer written by one method is read by
the next in stream order.
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Mapping

from aotrt.errors import InvalidArgument
from aotrt.limits import Limits
from aotrt.program import Program
from aotrt.runtime.delegate import Delegate, resolve_options
from aotrt.runtime.loaded import LoadedProgram
from aotrt.runtime.options import Fp32Math
from aotrt.runtime.public import Tensor


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


class Module:
    """A program of one or more methods loaded on a device, with its state."""

    def __init__(self, program: Program, device: Any = None, check_hazards: bool = False,
                 cuda_graph: bool | None = None, limits: Limits | None = None,
                 threads: int | None = None, fp32_math: Fp32Math | None = None, *,
                 _validated: bool = False) -> None:
        """Validate `program` and load its constants, state and every method (see load)."""
        if not isinstance(program, Program):
            raise InvalidArgument(f"program: expected an aotrt.Program, got "
                                  f"{type(program).__name__}")
        if not _validated:
            program.validate(limits)
        t0 = time.perf_counter()
        dev, options = resolve_options(device, check_hazards, cuda_graph, threads, fp32_math)
        self.program = program
        self.name = program.provenance.get("module") or "program"
        self._loaded = LoadedProgram(program, dev, options, self.name)
        self._methods: dict[str, Delegate] = {}
        try:
            for name, m in program.methods.items():
                self._methods[name] = Delegate(
                    m, device=dev, check_hazards=check_hazards, cuda_graph=cuda_graph,
                    limits=limits, threads=threads, fp32_math=fp32_math, _validated=True,
                    _loaded=self._loaded)
                self._methods[name].name = f"{self.name}.{name}"
        except BaseException:
            self.close()
            raise
        self.device = dev
        self.state = StateView(self._loaded)
        self.load_seconds = time.perf_counter() - t0

    @property
    def methods(self) -> tuple[str, ...]:
        """The methods' names, in the file's order."""
        return tuple(self._methods)

    def method(self, name: str) -> Delegate:
        """The method `name`, to run (InvalidArgument naming the methods there are)."""
        m = self._methods.get(name) if isinstance(name, str) else None
        if m is None:
            self._check_open()
            raise InvalidArgument(f"method {name!r}: {self.name} has methods "
                                  f"{list(self._methods)}")
        return m

    def run(self, *inputs: Any, out: Any = None) -> tuple[Any, ...]:
        """Run the program's only method (InvalidArgument when it has several)."""
        if len(self._methods) != 1:
            raise InvalidArgument(f"run: {self.name} has methods {list(self._methods)}; "
                                  f"call module.method(name).run(...)")
        return next(iter(self._methods.values())).run(*inputs, out=out)

    __call__ = run

    def reset(self) -> None:
        """Give every state buffer its initial value (after the runs queued so far)."""
        self._loaded.reset()

    @property
    def closed(self) -> bool:
        """True once close() ran."""
        return self._loaded.closed

    def _check_open(self) -> None:
        if self._loaded.closed:
            raise InvalidArgument(f"program {self.name} is closed")

    def close(self) -> None:
        """Close every method, then free the constants, state and kernels; safe to call
        twice, from any thread."""
        for m in list(self._methods.values()):
            m.close()
        self._loaded.close()

    def __enter__(self) -> "Module":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"on {self._loaded.device.name}"
        return f"<aotrt.Module {self.name} methods {list(self._methods)} {state}>"


__all__ = ["Module", "StateView"]
