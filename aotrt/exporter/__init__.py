"""The ahead-of-time side: torch.nn.Module (or ExportedProgram) -> aotrt.Program. The only
package that imports torch.

    prog = aotrt.export(model, (x,))
    prog = aotrt.export(torch.export.load("model.pt2"))
    prog.save("model.aotp")
"""

from __future__ import annotations

import logging
import time
from typing import Any, Sequence

from aotrt import progress
from aotrt.errors import InvalidArgument, Unsupported
from aotrt.program import Program

log = logging.getLogger(__name__)

__all__ = ["export"]


def export(model: Any, example_inputs: Sequence[Any] | None = None, *,
           kwargs: dict[str, Any] | None = None, name: str | None = None, strict: bool = False,
           layout: str = "auto", share_state: bool | Sequence[str] = False,
           dynamic_shapes: Any = None) -> Program:
    """Export `model` traced on `example_inputs` into a validated Program.

    `dynamic_shapes` (torch.export's) makes sizes dynamic within bounds: each dynamic dim a
    `Dim(name, min=, max=)` or `Dim.AUTO(max=)`/`Dim.DYNAMIC(max=)`; an unbounded one is an
    Unsupported naming the input and dim (memory is planned at the upper bound). The
    program is then version 2, its method with symbols (aotrt/exporter/dynamic.py).

    `model` may be a dict of methods, `{"prefill": (module, args), "decode": ...}`: each
    value is `(module, args)`, `(module, args, kwargs)`, an ExportedProgram, or a dict with
    keys `model`, `args` and optionally `kwargs`. The methods are lowered apart and stored in
    one program (aotrt/exporter/methods.py): equal weights and kernels once, each method's
    state its own unless `share_state` is True or names the buffers to share.
    Buffers the model writes in place (a KV cache's `index_copy_`, a slice assignment)
    become state: kept by the loaded program between runs, never outputs.

    `model` is a torch.nn.Module, or a torch.export.ExportedProgram (one exported with
    static shapes, e.g. read by torch.export.load): that is decomposed and lowered without
    exporting again; its `example_inputs` may be None and, when given, must match its inputs.
    `layout` lays out the activations: "channels_last" (NHWC activations, KRSC weights),
    "contiguous", or "auto": channels-last when the model has 2-D convolutions and the
    default device prefers it (aotrt/exporter/layout.py). An ExportedProgram is not
    converted: its layout is the one it was exported with, "auto" means "contiguous", and
    "channels_last" is an InvalidArgument (export the module itself for that).
    Inputs keep row-major specs and outputs torch's layouts.
    Raises aotrt.errors.Unsupported, naming the op and the model's source line, for anything
    the runtime cannot run; nothing unsupported is left to fail at run time.
    """
    if isinstance(model, dict):
        if example_inputs is not None or kwargs is not None:
            raise InvalidArgument("example_inputs, kwargs: give each method its own, in the "
                                  "dict of methods")
        if dynamic_shapes is not None:
            raise InvalidArgument("dynamic_shapes: give each method its own, in the dict of "
                                  "methods")
        return _export_methods(model, name=name, strict=strict, layout=layout,
                               share_state=share_state)
    if dynamic_shapes is not None:
        dyn = _Dynamic(model, example_inputs, kwargs, dynamic_shapes, name, strict, layout)
        return dyn.lower()
    ep, what, channels_last, t0 = _capture(model, example_inputs, kwargs, name, strict,
                                           layout)
    return _lower(ep, what, channels_last, t0)


class _Dynamic:
    """One method with dynamic sizes: its symbols (torch.export with the Dims), then its
    lowerings at the sample sizes, fitted (aotrt/exporter/dynamic.py)."""

    def __init__(self, model: Any, args: Any, kwargs: dict[str, Any] | None,
                 dynamic_shapes: Any, name: str | None, strict: bool, layout: str) -> None:
        import torch

        from aotrt.exporter.capture import _example_args
        from aotrt.exporter.dynamic import dim_names, symbols_of

        if isinstance(model, torch.export.ExportedProgram):
            raise InvalidArgument("dynamic_shapes: an ExportedProgram has its dynamic shapes "
                                  "already; pass its module (ep.module()) and the Dims")
        if not isinstance(model, torch.nn.Module):
            raise InvalidArgument(f"model: expected a torch.nn.Module, got "
                                  f"{type(model).__name__}")
        self.model, self.kwargs, self.name = model, kwargs, name
        self.strict, self.layout = strict, layout
        self.args = _example_args(args if args is not None else ())
        what = name or type(model).__name__
        with progress.step(f"capturing {what} with dynamic shapes"):
            try:
                ep = torch.export.export(model, self.args, kwargs=kwargs or {},
                                         dynamic_shapes=dynamic_shapes, strict=strict)
            except Exception as e:  # torch raises many types; the user needs its message
                raise Unsupported(f"torch.export could not capture {what} with these "
                                  f"dynamic_shapes: {type(e).__name__}: {e}") from e
        self.symbols = symbols_of(ep, dim_names(model, self.args, kwargs, dynamic_shapes))
        self.base = {s.name: s.hi for s in self.symbols}

    def capture_at(self, values: dict[str, int]) -> tuple[Any, str, bool, float]:
        """The static capture at sizes `values`."""
        from aotrt.exporter.dynamic import resized

        a, kw = resized(self.args, self.kwargs, self.symbols, values)
        return _capture(self.model, a, kw or self.kwargs, self.name, self.strict, self.layout)

    def lower(self, state: frozenset[str] = frozenset(),
              base: tuple[Any, str, bool, float] | None = None) -> Program:
        """The method: lowered at every sample size, fitted."""
        from aotrt.exporter.dynamic import Fitter, fit_method, sample_plan
        from aotrt.exporter.lower import Lowering

        if not self.symbols:            # torch made every dim static
            return _lower(*(base or self.capture_at({})), state=state)
        points, monos, checks = sample_plan(self.symbols)
        fitter = Fitter(points, monos, checks)
        builders = []
        for i, p in enumerate(points + checks):
            ep, what, cl, _ = base if (i == 0 and base is not None) else self.capture_at(p)
            with progress.step(f"lowering {what} at {p}"):
                builders.append(Lowering(ep, what, channels_last=cl, state=state).builder())
        return fit_method(builders[:len(points)], builders[len(points):], fitter,
                          self.symbols)


def _capture(model: Any, example_inputs: Sequence[Any] | None, kwargs: dict[str, Any] | None,
             name: str | None, strict: bool, layout: str) -> tuple[Any, str, bool, float]:
    """torch.export and decompose `model`: (the ExportedProgram, its name, whether it is
    laid out channels-last, the start time)."""
    import torch

    from aotrt.exporter.capture import capture
    from aotrt.exporter.layout import LAYOUTS, for_layout
    from aotrt.exporter.lower import runs_whole

    if isinstance(model, torch.export.ExportedProgram):
        if layout not in LAYOUTS:
            raise InvalidArgument(f"layout: expected one of {list(LAYOUTS)}, got {layout!r}")
        if layout == "channels_last":
            raise InvalidArgument("layout: an ExportedProgram keeps the layout it was exported "
                                  "with; export the nn.Module for layout='channels_last'")
        traced, channels_last, what = model, False, name or "ExportedProgram"
    else:
        _refuse_training_norms(model)
        traced, channels_last = for_layout(model, layout)
        what = name or type(model).__name__
    t0 = time.perf_counter()
    with progress.step(f"capturing {what}"):
        ep = capture(traced, example_inputs, kwargs=kwargs, strict=strict,
                     runs_whole=runs_whole)
    return ep, what, channels_last, t0


def _lower(ep: Any, what: str, channels_last: bool, t0: float,
           state: frozenset[str] = frozenset()) -> Program:
    """Lower a captured program (`state`: buffers that are state even where this method
    only reads them, because another method writes them and they are shared)."""
    from aotrt.exporter.lower import lower

    t1 = time.perf_counter()
    with progress.step(f"lowering {what}"):
        prog = lower(ep, what, channels_last=channels_last, state=state)
    log.info("exported %s: capture %.2fs, lowering %.2fs, %d instructions, %d kernels",
             what, t1 - t0, time.perf_counter() - t1, len(prog.instructions), len(prog.kernels))
    return prog


def _refuse_training_norms(model: Any) -> None:
    """Unsupported for a batch norm in training mode: its running statistics would become
    state that every run updates, which is never what an exported model means."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return
    for path, mod in model.named_modules():
        if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm) and mod.training \
                and mod.track_running_stats:
            raise Unsupported(f"{path or type(model).__name__}: a batch norm in training mode "
                              f"updates its running_mean and running_var (batch-norm "
                              f"statistics) at every run: call model.eval()")


def _export_methods(methods: dict[str, Any], *, name: str | None, strict: bool, layout: str,
                    share_state: bool | Sequence[str]) -> Program:
    """Each method exported alone, then merged into one program of several methods."""
    import torch

    from aotrt.exporter.methods import merge

    captured: dict[str, tuple[Any, str, bool, float]] = {}
    dynamic: dict[str, _Dynamic] = {}
    module_name = name
    for mname, spec in methods.items():
        if isinstance(spec, torch.export.ExportedProgram):
            model, args, kw = spec, None, None
        elif isinstance(spec, dict):
            unknown = sorted(set(spec) - {"model", "args", "kwargs", "dynamic_shapes"})
            if unknown or "model" not in spec:
                raise InvalidArgument(f"method {mname!r}: expected keys model, args, kwargs; "
                                      f"got {sorted(spec)}")
            model, args, kw = spec["model"], spec.get("args", ()), spec.get("kwargs")
            if spec.get("dynamic_shapes") is not None:
                if module_name is None:
                    module_name = type(model).__name__
                dyn = _Dynamic(model, args, kw, spec["dynamic_shapes"],
                               f"{module_name}.{mname}", strict, layout)
                dynamic[mname] = dyn
                captured[mname] = dyn.capture_at(dyn.base)
                continue
        elif isinstance(spec, tuple) and len(spec) in (2, 3):
            model, args = spec[0], spec[1]
            kw = spec[2] if len(spec) == 3 else None
        else:
            raise InvalidArgument(f"method {mname!r}: expected (module, args), (module, args, "
                                  f"kwargs), a dict or an ExportedProgram, got "
                                  f"{type(spec).__name__}")
        if module_name is None:
            module_name = type(model).__name__
        captured[mname] = _capture(model, args, kw, f"{module_name}.{mname}", strict, layout)
    # A shared buffer that one method writes is state in every method that reads it: bound
    # as a constant there, a reader would see its value at export, never the writer's.
    written = {b for ep, *_ in captured.values()
               for b in ep.graph_signature.buffers_to_mutate.values()}
    if share_state is True:
        shared = frozenset(written)
    elif share_state is False or share_state is None or isinstance(share_state, str):
        shared = frozenset()        # (a string is refused by merge, naming it)
    else:
        shared = frozenset(share_state) & written
    progs = {mname: (dynamic[mname].lower(shared, c) if mname in dynamic
                     else _lower(*c, state=shared)) for mname, c in captured.items()}
    with progress.step(f"merging {len(progs)} methods"):
        prog = merge(progs, share_state,
                     provenance={**next(iter(progs.values())).provenance,
                                 "module": module_name or "module"})
    return prog
