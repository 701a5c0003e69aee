"""Capture: torch.export, then the default core-ATen decompositions minus the ops we keep whole.

`scaled_dot_product_attention`, `layer_norm` and `linear` stay whole because the runtime has
a library op or a generated kernel for each that beats their decompositions (sdpa's becomes
a dozen ops with a mask guard; linear's a permute plus addmm).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import torch
import torch.fx

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


def _avg_pool2d(x: torch.Tensor, kernel_size: Any, stride: Any = (), padding: Any = 0,
                ceil_mode: bool = False, count_include_pad: bool = True,
                divisor_override: int | None = None) -> Any:
    """avg_pool2d as a depthwise convolution with a ones kernel (ceil_mode not handled)."""
    def pair(v: Any, default: tuple[int, int]) -> tuple[int, int]:
        if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
            return default
        if isinstance(v, int):
            return (v, v)
        return (int(v[0]), int(v[-1]))
    kh, kw = pair(kernel_size, (1, 1))
    sh, sw = pair(stride, (kh, kw))
    ph, pw = pair(padding, (0, 0))
    if ceil_mode or x.dim() not in (3, 4):
        return NotImplemented
    x4 = x if x.dim() == 4 else x.unsqueeze(0)
    c = x4.shape[1]
    w = torch.ones(c, 1, kh, kw, dtype=x.dtype, device=x.device)
    s = aten.convolution(x4, w, None, [sh, sw], [ph, pw], [1, 1], False, [0, 0], c)
    if divisor_override:
        out = s / divisor_override
    elif count_include_pad or (ph == 0 and pw == 0):
        out = s / (kh * kw)
    else:
        ones = torch.ones(1, 1, x4.shape[2], x4.shape[3], dtype=x.dtype, device=x.device)
        counts = aten.convolution(ones, torch.ones(1, 1, kh, kw, dtype=x.dtype, device=x.device),
                                  None, [sh, sw], [ph, pw], [1, 1], False, [0, 0], 1)
        out = s / counts
    return out if x.dim() == 4 else out.squeeze(0)


#: decompositions of our own, for ops torch has none for
EXTRA_DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {aten.avg_pool2d.default: _avg_pool2d}

#: rounds of further decomposition of ops the lowering cannot run whole
MAX_ROUNDS = 4


def decompose_unsupported(ep: torch.export.ExportedProgram,
                          runs_whole: Callable[[torch.fx.Node], bool]
                          ) -> torch.export.ExportedProgram:
    """Decompose, round by round, the ops `runs_whole` refuses that torch (or
    EXTRA_DECOMPOSITIONS) can decompose: group norm, bilinear upsampling, adaptive and
    average pooling, ... Ops with no decomposition stay, for the lowering to refuse."""
    from torch._decomp import decomposition_table as torch_decompositions
    tried: set[Any] = set()
    for _ in range(MAX_ROUNDS):
        table: dict[Any, Any] = {}
        for node in ep.graph.nodes:
            t = node.target
            if node.op != "call_function" or not isinstance(t, torch._ops.OpOverload) or \
                    t in tried or runs_whole(node):
                continue
            fn = EXTRA_DECOMPOSITIONS.get(t) or torch_decompositions.get(t)
            if fn is not None:
                table[t] = fn
        if not table:
            break
        tried.update(table)
        log.debug("decomposing further: %s", sorted(map(str, table)))
        # With the core table too, so that what the new decompositions emit is core ATen.
        full = decomposition_table()
        full.update(table)
        try:
            ep = ep.run_decompositions(full)
        except Exception as e:  # noqa: BLE001 - keep the ops; the lowering names them
            log.debug("further decomposition failed: %s", e)
            break
    return ep


def capture(model: torch.nn.Module, example_inputs: Sequence[Any],
            kwargs: dict[str, Any] | None = None, strict: bool = False,
            runs_whole: Callable[[torch.fx.Node], bool] | None = None
            ) -> torch.export.ExportedProgram:
    """Export `model` on `example_inputs` with static shapes and decompose it to core ATen
    (then, given `runs_whole`, decompose further what the lowering cannot run whole)."""
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
    if runs_whole is not None:
        ep = decompose_unsupported(ep, runs_whole)
    return ep
