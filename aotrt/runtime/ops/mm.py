"""Matrix products: mm, bmm, addmm and linear, into caller-provided output views.

Inputs may be any views (transposed, strided, offset); outputs may be non-packed views and
are written in place. float32, float16 and bfloat16; half types compute in float32 and
round once on store. On cpu, float32 linear, mm and addmm (alpha 1, beta 0 or 1, a bias
row) run as a oneDNN matmul (backends/cpu/dnnl.py) where oneDNN has a FAST_MATMUL implementation
for them and the views fold into 2-D ones; everything else through numpy's BLAS, on one
thread where the device's GEMMs run on oneDNN's pool (`Dnnl.numpy_blas`).
"""

from __future__ import annotations

from typing import Any

from aotrt.errors import InvalidArgument
from aotrt.runtime.device import Stream
from aotrt.runtime.ops import _common as c
from aotrt.runtime.tensor import Handle


def _dtypes(op: str, out: Any, named: list[tuple[Any, str]]) -> None:
    c.check_output(op, out, "out")
    c.check_dtype(op, out, "out")
    for h, name in named:
        c.check_same_dtype(op, out, "out", h, name)


#: scratch bytes a GEMM may take beside its operands' copies, for a library's own workspace:
#: oneDNN's brgemm matmul asked 9472 bytes for a 1x9 @ 9x48 product, where the copies are
#: 1.8 KB (and 263 KB for 128x768 @ 768x3072, where they are 9.8 MB)
GEMM_WORKSPACE = 64 << 10


def _gemm_cost(out: Any, ins: list[Any], steps: int, scratch_ins: int) -> c.OpCost:
    """A GEMM's cost on cpu: `steps` multiply-adds plus a visit of every element; scratch
    is the float32 copies of the inputs (matmul copies strided operands), the float32
    result and its rounded copy, and a library's workspace."""
    visits = out.numel + sum(h.numel for h in ins)
    scratch = 4 * scratch_ins + 4 * out.numel + out.dtype.itemsize * out.numel + \
        GEMM_WORKSPACE
    return c.OpCost(steps + visits, scratch)


def check_mm(out: Any, a: Any, b: Any) -> tuple[None, c.OpCost]:
    """Validate mm's metadata (dtype, sizes, strides); return its cost."""
    op = "mm"
    _dtypes(op, out, [(a, "a"), (b, "b")])
    c.check_rank(op, a, "a", (2,))
    c.check_rank(op, b, "b", (2,))
    if a.sizes[1] != b.sizes[0]:
        raise InvalidArgument(f"mm: b: K mismatch, a is {list(a.sizes)} and b {list(b.sizes)}")
    c.check_shape(op, out, "out", (a.sizes[0], b.sizes[1]))
    return None, _gemm_cost(out, [a, b], out.numel * a.sizes[1], a.numel + b.numel)


def mm(stream: Stream, out: Handle, a: Handle, b: Handle) -> int:
    """out[M,N] = a[M,K] @ b[K,N]."""
    c.check_handles("mm", stream, [(out, "out"), (a, "a"), (b, "b")])
    check_mm(out, a, b)
    return c.launch("mm", stream, [out], [a, b], "matmul", out, a, b, None, 1.0, 1.0,
                    _tf32(stream))


def check_bmm(out: Any, a: Any, b: Any) -> tuple[None, c.OpCost]:
    """Validate bmm's metadata; return its cost."""
    op = "bmm"
    _dtypes(op, out, [(a, "a"), (b, "b")])
    c.check_rank(op, a, "a", (3,))
    c.check_rank(op, b, "b", (3,))
    if a.sizes[0] != b.sizes[0]:
        raise InvalidArgument(f"bmm: b: batch mismatch, a is {list(a.sizes)} and b "
                              f"{list(b.sizes)}")
    if a.sizes[2] != b.sizes[1]:
        raise InvalidArgument(f"bmm: b: K mismatch, a is {list(a.sizes)} and b {list(b.sizes)}")
    c.check_shape(op, out, "out", (a.sizes[0], a.sizes[1], b.sizes[2]))
    return None, _gemm_cost(out, [a, b], out.numel * a.sizes[2], a.numel + b.numel)


def bmm(stream: Stream, out: Handle, a: Handle, b: Handle) -> int:
    """out[B,M,N] = a[B,M,K] @ b[B,K,N] (any strides)."""
    c.check_handles("bmm", stream, [(out, "out"), (a, "a"), (b, "b")])
    check_bmm(out, a, b)
    return c.launch("bmm", stream, [out], [a, b], "matmul", out, a, b, None, 1.0, 1.0,
                    _tf32(stream))


def check_addmm(out: Any, bias: Any, a: Any, b: Any, beta: Any = 1,
                alpha: Any = 1) -> tuple[tuple[float, float], c.OpCost]:
    """Validate addmm's metadata and params; return (beta, alpha) and its cost."""
    op = "addmm"
    _dtypes(op, out, [(bias, "bias"), (a, "a"), (b, "b")])
    c.check_rank(op, a, "a", (2,))
    c.check_rank(op, b, "b", (2,))
    c.check_rank(op, bias, "bias", (0, 1, 2))
    if a.sizes[1] != b.sizes[0]:
        raise InvalidArgument(f"addmm: b: K mismatch, a is {list(a.sizes)} and b "
                              f"{list(b.sizes)}")
    shape = (a.sizes[0], b.sizes[1])
    if c.broadcast_shape(op, [bias.sizes, shape], "bias") != shape:
        raise InvalidArgument(f"addmm: bias: sizes {list(bias.sizes)} do not broadcast to "
                              f"{list(shape)}")
    c.check_shape(op, out, "out", shape)
    beta = c.as_float(op, beta, "beta")
    alpha = c.as_float(op, alpha, "alpha")
    # bias: a float32 copy and its product with beta.
    cost = _gemm_cost(out, [bias, a, b], out.numel * a.sizes[1],
                      a.numel + b.numel + 2 * bias.numel)
    return (beta, alpha), cost


def addmm(stream: Stream, out: Handle, bias: Handle, a: Handle, b: Handle,
          beta: float = 1, alpha: float = 1) -> int:
    """out[M,N] = beta * bias + alpha * (a[M,K] @ b[K,N]); bias broadcasts from 0/1/2-D.

    As in torch, beta == 0 ignores bias's values (NaN in bias does not propagate).
    """
    c.check_handles("addmm", stream, [(out, "out"), (bias, "bias"), (a, "a"), (b, "b")])
    (beta, alpha), _ = check_addmm(out, bias, a, b, beta, alpha)
    return c.launch("addmm", stream, [out], [bias, a, b], "matmul", out, a, b, bias, beta,
                    alpha, _tf32(stream))


def check_linear(out: Any, x: Any, w: Any, bias: Any = None) -> tuple[None, c.OpCost]:
    """Validate linear's metadata; return its cost."""
    op = "linear"
    _dtypes(op, out, [(x, "x"), (w, "w")] + ([(bias, "bias")] if bias is not None else []))
    if x.ndim < 1:
        raise InvalidArgument("linear: x: expected a tensor of rank >= 1, got a 0-D tensor")
    c.check_rank(op, w, "w", (2,))
    n, k = w.sizes
    if x.sizes[-1] != k:
        raise InvalidArgument(f"linear: w: in-features {k} of w {list(w.sizes)} do not match "
                              f"x's last dim {x.sizes[-1]}")
    if bias is not None:
        c.check_rank(op, bias, "bias", (0, 1))
        if bias.ndim == 1 and bias.sizes[0] not in (n, 1):
            raise InvalidArgument(f"linear: bias: expected {n} elements, got {list(bias.sizes)}")
    c.check_shape(op, out, "out", tuple(x.sizes[:-1]) + (n,))
    ins = [x, w] + ([bias] if bias is not None else [])
    # x and w: float32 copies, then the reshape of x and matmul's copy of w.T.
    return None, _gemm_cost(out, ins, out.numel * k,
                            2 * x.numel + 2 * w.numel + (bias.numel if bias is not None else 0))


def linear(stream: Stream, out: Handle, x: Handle, w: Handle, bias: Handle | None = None) -> int:
    """out[..., N] = x[..., K] @ w[N, K].T (+ bias[N]), x of any rank >= 1."""
    c.check_handles("linear", stream, [(out, "out"), (x, "x"), (w, "w"), (bias, "bias")])
    check_linear(out, x, w, bias)
    return c.launch("linear", stream, [out], [x, w, bias], "linear", out, x, w, bias,
                    _tf32(stream))


def _tf32(stream: Stream) -> bool:
    """Whether the stream lets a float32 matmul run as TF32 (cuda; the cpu has no TF32)."""
    return stream.options.fp32_math.matmul_tf32
