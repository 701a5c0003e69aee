"""The ahead-of-time side: torch.nn.Module -> aotrt.Program. The only package that imports torch.

    prog = aotrt.export(model, (x,))
    prog.save("model.aotp")
"""

from __future__ import annotations

import logging
import time
from typing import Any, Sequence

from aotrt.program import Program

log = logging.getLogger(__name__)

__all__ = ["export"]


def export(model: Any, example_inputs: Sequence[Any], *, kwargs: dict[str, Any] | None = None,
           name: str | None = None, strict: bool = False, layout: str = "auto") -> Program:
    """Export `model` traced on `example_inputs` (static shapes) into a validated Program.

    `layout` lays out the activations: "channels_last" (NHWC activations, KRSC weights),
    "contiguous", or "auto": channels-last when the model has 2-D convolutions and the
    default device prefers it (aotrt/exporter/layout.py). Inputs keep row-major specs and
    outputs torch's layouts.
    Raises aotrt.errors.Unsupported, naming the op and the model's source line, for anything
    the runtime cannot run; nothing unsupported is left to fail at run time.
    """
    from aotrt.exporter.capture import capture
    from aotrt.exporter.layout import for_layout
    from aotrt.exporter.lower import lower, runs_whole

    t0 = time.perf_counter()
    traced, channels_last = for_layout(model, layout)
    ep = capture(traced, example_inputs, kwargs=kwargs, strict=strict, runs_whole=runs_whole)
    t1 = time.perf_counter()
    prog = lower(ep, name or type(model).__name__, channels_last=channels_last)
    log.info("exported %s: capture %.2fs, lowering %.2fs, %d instructions, %d kernels",
             name or type(model).__name__, t1 - t0, time.perf_counter() - t1,
             len(prog.instructions), len(prog.kernels))
    return prog
