"""FFTs of real inputs as real matrix products, so that no complex value reaches the lowering.

The runtime has no complex dtype. A model such as HF FNet (`torch.fft.fftn(x).real`) exports
as `view_as_real(_fft_c2c(_to_copy(x, complex64)))` followed by a `select` of the real (or
imaginary) part. `rewrite_real_ffts` replaces each such chain whose input is real by DFT
matrix products along each transformed dim, tracking the real and imaginary parts:

    forward: (C - iS)(a + ib) = (Ca + Sb) + i(Cb - Sa),   C[j,k] = cos(2 pi jk / n)
    inverse: (C + iS)(a + ib) = (Ca - Sb) + i(Cb + Sa),   S[j,k] = sin(2 pi jk / n)

The matrices are generated in the graph (arange, cos, sin), so the lowering folds them into
constants. jk is reduced mod n in int64 first, so the angles stay below 2 pi and their
float32 error stays near 1e-7. `_fft_r2c` (rfft: a real input, optionally one-sided) is
handled the same way. Chains that end in anything else than a `select` of a part are left
alone, for the lowering to refuse by name.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

log = logging.getLogger(__name__)

aten = torch.ops.aten

_COMPLEX = (torch.complex64, torch.complex128, torch.complex32)

#: (dims, normalization, forward, onesided) of one transform, or None for a conjugation;
#: innermost first
_Step = tuple[tuple[int, ...], int, bool, bool] | None

#: conjugations (ifft of a real input exports as a conjugated r2c)
_CONJ_OPS = frozenset(getattr(aten, n).default for n in ("_conj", "conj_physical")
                      if hasattr(aten, n))


def _steps(node: Any) -> tuple[torch.fx.Node, list[_Step]] | None:
    """The real input and the transforms of a complex-valued node, or None."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    t = node.target
    if t == aten._fft_c2c.default:
        inner = _steps(node.args[0])
        if inner is None:
            return None
        dims, norm, forward = node.args[1], int(node.args[2]), bool(node.args[3])
        return inner[0], inner[1] + [(tuple(int(d) for d in dims), norm, forward, False)]
    if t in _CONJ_OPS:
        inner = _steps(node.args[0])
        return None if inner is None else (inner[0], inner[1] + [None])
    if t == aten._fft_r2c.default:
        x = node.args[0]
        if not _is_real(x):
            return None
        dims, norm, onesided = node.args[1], int(node.args[2]), bool(node.args[3])
        return x, [(tuple(int(d) for d in dims), norm, True, onesided)]
    if t == aten._to_copy.default and node.kwargs.get("dtype") in _COMPLEX and \
            _is_real(node.args[0]) and set(node.kwargs) <= {"dtype", "layout", "device"}:
        return node.args[0], []
    return None


def _is_real(x: Any) -> bool:
    v = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    return isinstance(v, torch.Tensor) and v.dtype.is_floating_point


def _dft_along(re: torch.Tensor, im: torch.Tensor | None, dim: int, norm: int, forward: bool,
               onesided: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One 1-D DFT along `dim` of re + i*im (im None: zero)."""
    n = re.shape[dim]
    k_out = n // 2 + 1 if onesided else n
    j = torch.arange(n, device=re.device)
    jk = (j[:, None] * j[None, :k_out]) % n
    angle = jk.to(torch.float32) * (2 * math.pi / n)
    scale = (1.0, 1 / math.sqrt(n), 1 / n)[norm]
    c = (torch.cos(angle) * scale).to(re.dtype)
    s = (torch.sin(angle) * scale).to(re.dtype)
    if not forward:
        s = -s
    a = re.movedim(dim, -1)
    ca, sa = a @ c, a @ s
    if im is None:
        out_re, out_im = ca, -sa
    else:
        b = im.movedim(dim, -1)
        out_re, out_im = ca + b @ s, b @ c - sa
    return out_re.movedim(-1, dim), out_im.movedim(-1, dim)


def _real_dft(x: torch.Tensor, steps: list[_Step]) -> tuple[torch.Tensor, torch.Tensor]:
    re, im = x, None
    for step in steps:
        if step is None:
            im = None if im is None else -im
            continue
        dims, norm, forward, onesided = step
        for i, d in enumerate(dims):
            # rfft: only the last transformed dim is one-sided, and it goes first (torch too)
            last = onesided and i == len(dims) - 1
            re, im = _dft_along(re, im, d % x.dim(), norm, forward, last)
    if im is None:
        im = torch.zeros_like(re)
    return re, im


def _traceable(steps: list[_Step]) -> Any:
    """A one-argument function for make_fx (it counts every parameter as an input)."""
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _real_dft(x, steps)
    return fn


def rewrite_real_ffts(gm: torch.fx.GraphModule, decompositions: dict[Any, Any]) -> int:
    """Replace `select(view_as_real(fft(real x)), -1, part)` chains in place; return how
    many `view_as_real` nodes were rewritten."""
    g = gm.graph
    done = 0
    for node in list(g.nodes):
        if node.op != "call_function" or node.target != aten.view_as_real.default:
            continue
        found = _steps(node.args[0])
        users = list(node.users)
        last = node.meta["val"].dim() - 1 if "val" in node.meta else -1
        if found is None or not any(found[1]) or not users or not all(
                u.target == aten.select.int and int(u.args[1]) in (-1, last)
                and int(u.args[2]) in (0, 1) for u in users):
            continue
        x, steps = found
        v = x.meta["val"]
        # A real cpu stand-in: the traced generators (arange) must say device cpu.
        example = torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype)
        sub = make_fx(_traceable(steps), decomposition_table=decompositions,
                      tracing_mode="fake")(example)
        with g.inserting_before(node):
            parts = g.graph_copy(sub.graph, {next(iter(sub.graph.nodes)): x})
        for u in users:
            u.replace_all_uses_with(parts[int(u.args[2])])
            g.erase_node(u)
        _erase_chain(g, node)
        done += 1
    if done:
        gm.recompile()
        log.debug("rewrote %d real FFT(s) as DFT matrix products", done)
    return done


def _erase_chain(g: torch.fx.Graph, node: torch.fx.Node) -> None:
    """Erase `node` and then each complex producer left without users."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and not node.users:
        nxt = node.args[0] if node.args else None
        g.erase_node(node)
        if not (isinstance(nxt, torch.fx.Node) and nxt.target in (
                aten._fft_c2c.default, aten._fft_r2c.default, aten._to_copy.default,
                *_CONJ_OPS)):
            break
        node = nxt
