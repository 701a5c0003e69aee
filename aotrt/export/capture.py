"""Capture: torch.export, then the default core-ATen decompositions minus the ops we keep whole.

`scaled_dot_product_attention`, `layer_norm` and `linear` stay whole because the runtime has
a library op or a generated kernel for each that beats their decompositions (sdpa's becomes
a dozen ops with a mask guard; linear's a permute plus addmm).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import torch

from aotrt.errors import InvalidArgument, Unsupported

log = logging.getLogger(__name__)

aten = torch.ops.aten

#: ops removed from the decomposition table so that they reach the lowering whole
KEPT_OPS = (
    aten.scaled_dot_product_attention.default,
    aten.layer_norm.default,
    aten.linear.default,
)


def decomposition_table() -> dict[Any, Any]:
    """The default core-ATen table without the kept ops (torch 2.11 .. 2.14)."""
    table = dict(torch.export.default_decompositions())
    for op in KEPT_OPS:
        table.pop(op, None)
    return table


def capture(model: torch.nn.Module, example_inputs: Sequence[Any],
            kwargs: dict[str, Any] | None = None,
            strict: bool = False) -> torch.export.ExportedProgram:
    """Export `model` on `example_inputs` with static shapes and decompose it to core ATen."""
    if not isinstance(model, torch.nn.Module):
        raise InvalidArgument(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)):
        raise InvalidArgument("example_inputs: expected a tuple of example arguments, got "
                              f"{type(example_inputs).__name__}")
    args = tuple(example_inputs)
    try:
        ep = torch.export.export(model, args, kwargs=kwargs or {}, strict=strict)
    except Exception as e:  # torch raises many types; the user needs its message
        raise Unsupported(f"torch.export could not capture {type(model).__name__}: "
                          f"{type(e).__name__}: {e}") from e
    log.debug("exported %s: %d nodes", type(model).__name__, len(ep.graph.nodes))
    try:
        ep = ep.run_decompositions(decomposition_table())
    except Exception as e:
        raise Unsupported(f"decomposing {type(model).__name__} to core ATen failed: "
                          f"{type(e).__name__}: {e}") from e
    log.debug("decomposed: %d nodes", len(ep.graph.nodes))
    return ep
