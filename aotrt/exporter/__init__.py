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
from aotrt.errors import InvalidArgument
from aotrt.program import Program

log = logging.getLogger(__name__)

__all__ = ["export"]


def export(model: Any, example_inputs: Sequence[Any] | None = None, *,
           kwargs: dict[str, Any] | None = None, name: str | None = None, strict: bool = False,
           layout: str = "auto") -> Program:
    """Export `model` traced on `example_inputs` (static shapes) into a validated Program.

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
    import torch

    from aotrt.exporter.capture import capture
    from aotrt.exporter.layout import LAYOUTS, for_layout
    from aotrt.exporter.lower import lower, runs_whole

    if isinstance(model, torch.export.ExportedProgram):
        if layout not in LAYOUTS:
            raise InvalidArgument(f"layout: expected one of {list(LAYOUTS)}, got {layout!r}")
        if layout == "channels_last":
            raise InvalidArgument("layout: an ExportedProgram keeps the layout it was exported "
                                  "with; export the nn.Module for layout='channels_last'")
        traced, channels_last, what = model, False, name or "ExportedProgram"
    else:
        traced, channels_last = for_layout(model, layout)
        what = name or type(model).__name__
    t0 = time.perf_counter()
    with progress.step(f"capturing {what}"):
        ep = capture(traced, example_inputs, kwargs=kwargs, strict=strict,
                     runs_whole=runs_whole)
    t1 = time.perf_counter()
    with progress.step(f"lowering {what}"):
        prog = lower(ep, what, channels_last=channels_last)
    log.info("exported %s: capture %.2fs, lowering %.2fs, %d instructions, %d kernels",
             what, t1 - t0, time.perf_counter() - t1, len(prog.instructions), len(prog.kernels))
    return prog
