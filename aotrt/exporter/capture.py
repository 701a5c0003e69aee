"""Capture: torch.export, then the default core-ATen decompositions minus the ops we keep whole.

`scaled_dot_product_attention`, `layer_norm` and `linear` stay whole because the runtime has
a library op or a generated kernel for each that beats their decompositions (sdpa's becomes
a dozen ops with a mask guard; linear's a permute plus addmm). FFTs of real inputs whose real
or imaginary part is taken become DFT matrix products (aotrt.exporter.fft): the runtime has no
complex dtype. Grouped products (`torch._grouped_mm`, transformers' `grouped_mm_fallback`: the
experts of a mixture-of-experts layer) become a gather fused into a reduction
(aotrt.exporter.grouped_mm): their groups' bounds are data.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import torch
import torch.fx

from aotrt.errors import InvalidArgument, Unsupported
from aotrt.exporter.fft import rewrite_real_ffts
from aotrt.exporter.grouped_mm import grouped_mm, grouped_mm_fallback
from aotrt.exporter.histc import histc

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


def _pool_out_size(size: int, k: int, s: int, p: int, ceil_mode: bool) -> int:
    """aten's pooling_output_shape: with ceil_mode, a last window must start inside the
    input or its left padding."""
    out = (size + 2 * p - k + ((s - 1) if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _window_counts(size: int, k: int, s: int, p: int, out: int, count_include_pad: bool,
                   device: torch.device) -> torch.Tensor:
    """Per output position along one dim, the elements aten's avg_pool2d divides by: the
    window clipped to the padded input (count_include_pad) or to the input itself."""
    start = torch.arange(out, device=device) * s - p
    end = torch.clamp(start + k, max=size + p)  # the ceil_mode overhang never counts
    if count_include_pad:
        return end - start
    return torch.clamp(end, max=size) - torch.clamp(start, min=0)


def _avg_pool2d(x: torch.Tensor, kernel_size: Any, stride: Any = (), padding: Any = 0,
                ceil_mode: bool = False, count_include_pad: bool = True,
                divisor_override: int | None = None) -> Any:
    """avg_pool2d, every form: a depthwise convolution with a ones kernel over the input
    zero-padded (on the right and bottom also for ceil_mode's last windows), divided by
    divisor_override or by each window's count, as aten's cpu kernel does."""
    def pair(v: Any, default: tuple[int, int]) -> tuple[int, int]:
        if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
            return default
        if isinstance(v, int):
            return (v, v)
        return (int(v[0]), int(v[-1]))
    kh, kw = pair(kernel_size, (1, 1))
    sh, sw = pair(stride, (kh, kw))
    ph, pw = pair(padding, (0, 0))
    if x.dim() not in (3, 4):
        return NotImplemented
    x4 = x if x.dim() == 4 else x.unsqueeze(0)
    c, h, wd = x4.shape[1], x4.shape[2], x4.shape[3]
    oh = _pool_out_size(h, kh, sh, ph, ceil_mode)
    ow = _pool_out_size(wd, kw, sw, pw, ceil_mode)
    # ceil_mode: zeros past the right padding so that the last (partial) windows exist.
    eh = max((oh - 1) * sh + kh - (h + 2 * ph), 0)
    ew = max((ow - 1) * sw + kw - (wd + 2 * pw), 0)
    if eh or ew:
        x4 = torch.nn.functional.pad(x4, [pw, pw + ew, ph, ph + eh])
        conv_pad = [0, 0]
    else:
        conv_pad = [ph, pw]
    w = torch.ones(c, 1, kh, kw, dtype=x.dtype, device=x.device)
    s = aten.convolution(x4, w, None, [sh, sw], conv_pad, [1, 1], False, [0, 0], c)
    if divisor_override:
        out = s / divisor_override
    elif not (eh or ew) and (count_include_pad or (ph == 0 and pw == 0)):
        out = s / (kh * kw)  # every window is whole
    else:
        ch = _window_counts(h, kh, sh, ph, oh, count_include_pad, x.device)
        cw = _window_counts(wd, kw, sw, pw, ow, count_include_pad, x.device)
        # Counts in float32: bfloat16 rounds integers above 256 (a 17x17 window).
        counts = (ch[:, None] * cw[None, :]).to(torch.float32)
        out = (s / counts).to(x.dtype)
    return out if x.dim() == 4 else out.squeeze(0)


#: decompositions of our own, for ops torch has none for
EXTRA_DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {aten.avg_pool2d.default: _avg_pool2d,
                                                      aten.histc.default: histc,
                                                      aten._grouped_mm.default: grouped_mm}

#: decompositions of other libraries' custom ops, by qualified name: their OpOverloads exist
#: only once the library is imported, which the exporter never does itself
NAMED_DECOMPOSITIONS: dict[str, Callable[..., Any]] = {
    "transformers::grouped_mm_fallback": grouped_mm_fallback,
}

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
            fn = EXTRA_DECOMPOSITIONS.get(t) or NAMED_DECOMPOSITIONS.get(t.name()) or \
                torch_decompositions.get(t)
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


def own_decompositions(ep: torch.export.ExportedProgram,
                       runs_whole: Callable[[torch.fx.Node], bool]) -> dict[Any, Any]:
    """Our decompositions (EXTRA_ and NAMED_DECOMPOSITIONS) of the ops in `ep` that the
    lowering cannot run whole, for the first decomposition pass: each later round retraces
    the whole program (half of a mixture-of-experts model's export time)."""
    table: dict[Any, Any] = {}
    for node in ep.graph.nodes:
        t = node.target
        if node.op != "call_function" or not isinstance(t, torch._ops.OpOverload) or \
                t in table:
            continue
        fn = EXTRA_DECOMPOSITIONS.get(t) or NAMED_DECOMPOSITIONS.get(t.name())
        if fn is not None and not runs_whole(node):
            table[t] = fn
    return table


def capture(model: torch.nn.Module | torch.export.ExportedProgram,
            example_inputs: Sequence[Any] | None,
            kwargs: dict[str, Any] | None = None, strict: bool = False,
            runs_whole: Callable[[torch.fx.Node], bool] | None = None
            ) -> torch.export.ExportedProgram:
    """Export `model` on `example_inputs` with static shapes and decompose it to core ATen
    (then, given `runs_whole`, decompose further what the lowering cannot run whole).

    An ExportedProgram is taken as captured already: it gets the same decompositions (on a
    copy; the caller's is left as it was), and `example_inputs`, when given, must match its
    inputs' shapes and dtypes.
    """
    if isinstance(model, torch.export.ExportedProgram):
        if example_inputs is not None:
            check_inputs(model, example_inputs)
        ep, what = model, "the ExportedProgram"
    elif isinstance(model, torch.nn.Module):
        ep, what = _export(model, example_inputs, kwargs, strict), type(model).__name__
    else:
        raise InvalidArgument("model: expected a torch.nn.Module or a "
                              f"torch.export.ExportedProgram, got {type(model).__name__}")
    own = own_decompositions(ep, runs_whole) if runs_whole is not None else {}
    decomposed = None
    if own:
        log.debug("decomposing with our own too: %s", sorted(map(str, own)))
        try:
            decomposed = ep.run_decompositions({**decomposition_table(), **own})
        except Exception as e:  # noqa: BLE001 - without them; decompose_unsupported retries
            log.debug("decomposing with our own failed: %s", e)
    if decomposed is None:
        try:
            decomposed = ep.run_decompositions(decomposition_table())
        except Exception as e:
            raise Unsupported(f"decomposing {what} to core ATen failed: "
                              f"{type(e).__name__}: {e}") from e
    ep = decomposed
    log.debug("decomposed: %d nodes", len(ep.graph.nodes))
    rewrite_real_ffts(ep.graph_module, decomposition_table())
    if runs_whole is not None:
        ep = decompose_unsupported(ep, runs_whole)
    return ep


def _example_args(example_inputs: Any) -> tuple[Any, ...]:
    """`example_inputs` as a tuple of arguments (a lone tensor is one argument)."""
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)):
        raise InvalidArgument("example_inputs: expected a tuple of example arguments, got "
                              f"{type(example_inputs).__name__}")
    return tuple(example_inputs)


def _export(model: torch.nn.Module, example_inputs: Any, kwargs: dict[str, Any] | None,
            strict: bool) -> torch.export.ExportedProgram:
    """torch.export.export, its failures as Unsupported naming the model."""
    args = _example_args(example_inputs)
    try:
        ep = torch.export.export(model, args, kwargs=kwargs or {}, strict=strict)
    except Exception as e:  # torch raises many types; the user needs its message
        raise Unsupported(f"torch.export could not capture {type(model).__name__}: "
                          f"{type(e).__name__}: {e}") from e
    log.debug("exported %s: %d nodes", type(model).__name__, len(ep.graph.nodes))
    return ep


def check_inputs(ep: torch.export.ExportedProgram, example_inputs: Any) -> None:
    """InvalidArgument unless the tensors of `example_inputs` match, in number, shape and
    dtype, the user inputs `ep` was exported with."""
    import torch.utils._pytree as pytree

    got = [t for t in pytree.tree_leaves(_example_args(example_inputs))
           if isinstance(t, torch.Tensor)]
    user = set(ep.graph_signature.user_inputs)
    want = [n.meta.get("val") for n in ep.graph.nodes
            if n.op == "placeholder" and n.name in user]
    want = [v for v in want if isinstance(v, torch.Tensor)]
    if len(got) != len(want):
        raise InvalidArgument(f"example_inputs: {len(got)} tensor(s), but the "
                              f"ExportedProgram takes {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        if tuple(g.shape) != tuple(w.shape) or g.dtype != w.dtype:
            raise InvalidArgument(f"example_inputs[{i}]: {g.dtype}{list(g.shape)}, but the "
                                  f"ExportedProgram takes {w.dtype}{list(w.shape)}")
