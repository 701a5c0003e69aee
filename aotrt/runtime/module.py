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

import os
import time
from typing import Any

from aotrt.errors import InvalidArgument
from aotrt.limits import Limits
from aotrt.program import Program
from aotrt.runtime.delegate import Delegate
from aotrt.runtime.dynamic import DynamicMethod
from aotrt.runtime.load_options import resolve_options
from aotrt.runtime.loaded import LoadedProgram, StateView
from aotrt.runtime.options import Fp32Math


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
        self._methods: dict[str, Delegate | DynamicMethod] = {}
        try:
            for name, m in program.methods.items():
                if m.symbols:
                    self._methods[name] = DynamicMethod(
                        m, self._loaded, f"{self.name}.{name}", limits=limits,
                        check_hazards=check_hazards, cuda_graph=cuda_graph, threads=threads,
                        fp32_math=fp32_math)
                    continue
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

    def method(self, name: str) -> Delegate | DynamicMethod:
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


def load(prog_or_path: Any, device: Any = None, check_hazards: bool = False,
         cuda_graph: bool | None = None, limits: Limits | None = None,
         threads: int | None = None, fp32_math: Fp32Math | None = None) -> Any:
    """Load a Program (or a .aotp path) on `device` (None: cuda if present): a Delegate for
    a program of one method without state, else an aotrt.Module (methods, state, reset).

    On a device that supports graphs (cuda) the whole run is captured as one CUDA graph on
    the first run and replayed afterwards (inputs are copied into static buffers and outputs
    out of them); `cuda_graph=False` opts out. `cuda_graph=True` on a device without graphs
    is an InvalidArgument.
    `limits` (aotrt.Limits, docs/limits.md) is the load-time budget; None: the defaults.
    `threads` (a positive int) is how many threads one generated kernel call may use on the
    cpu device (large kernels only; None: every core this process may run on, its CPU
    affinity); it belongs to this delegate's stream. On cuda it is accepted and ignored.
    `fp32_math` (aotrt.Fp32Math; None: float32 everywhere) lets float32 convolutions or
    matmuls run as TF32 on a device that has it, as torch's `allow_tf32` flags do.
    """
    if isinstance(prog_or_path, Program):
        prog = prog_or_path         # the Delegate validates it
    elif isinstance(prog_or_path, (str, os.PathLike)):
        prog = Program.load(prog_or_path, limits)
    else:
        raise InvalidArgument(f"prog_or_path: expected an aotrt.Program or a path, got "
                              f"{type(prog_or_path).__name__}")
    kwargs = dict(device=device, check_hazards=check_hazards, cuda_graph=cuda_graph,
                  limits=limits, threads=threads, fp32_math=fp32_math,
                  _validated=prog is not prog_or_path)
    if prog.has_methods or prog.state or prog.symbols:
        return Module(prog, **kwargs)
    return Delegate(prog, **kwargs)


__all__ = ["Module", "load"]
