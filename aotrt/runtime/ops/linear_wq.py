"""linear_wq: a linear layer with weight-only quantized weights (int8 or int4), into a
caller-provided output view (issue 38).

    out[..., N] = x[..., K] @ dequantize(qweight).T (+ bias[N])

Packing (aotrt/exporter/quantize.py makes it):
- bits 8: qweight int8 [N, K], symmetric per output channel: w = q * scales[n];
  scales [N]; zeros absent; group_size must be K.
- bits 4: qweight uint8 [N, K // 2], two values a byte (k = 2j in the low nibble of byte
  j, k = 2j + 1 in the high one), asymmetric per group along K:
  w = (q - zeros[n, g]) * scales[n, g], g = k // group_size; group_size 32, 64 or 128,
  dividing K; scales and zeros [N, K // group_size], of one float dtype.

x, out and bias share a float dtype; scales (and zeros) may be any float dtype. The
weights are dequantized in float32 and the product accumulates in float32; the result is
rounded once to out's dtype, as the export's torch reference (`aotrt::linear_wq`) does.
"""

from __future__ import annotations

from typing import Any

from aotrt import dtypes
from aotrt.errors import InvalidArgument
from aotrt.runtime.device import Stream
from aotrt.runtime.ops import _common as c
from aotrt.runtime.tensor import Handle

OP = "linear_wq"
BITS = (4, 8)
#: int4's group sizes along K (int8's one group is the whole row, group_size K)
GROUP_SIZES = (32, 64, 128)
#: the packed weight's dtype for each bit width
QDTYPE = {8: dtypes.int8, 4: dtypes.uint8}


def check_linear_wq(out: Any, x: Any, qweight: Any, scales: Any, zeros: Any = None,
                    bias: Any = None, bits: Any = 8, group_size: Any = None
                    ) -> tuple[tuple[int, int], c.OpCost]:
    """Validate linear_wq's metadata and packing; return (bits, group_size) and the cost."""
    op = OP
    c.check_output(op, out, "out")
    c.check_dtype(op, out, "out")
    c.check_same_dtype(op, out, "out", x, "x")
    if x.ndim < 1:
        raise InvalidArgument("linear_wq: x: expected a tensor of rank >= 1, got a 0-D tensor")
    k = x.sizes[-1]
    bits = c.as_int(op, bits, "bits")
    if bits not in BITS:
        raise InvalidArgument(f"linear_wq: bits: expected 4 or 8, got {bits}")
    group_size = c.as_int(op, k if group_size is None else group_size, "group_size")
    if bits == 8 and group_size != k:
        raise InvalidArgument(f"linear_wq: group_size: int8 weights are scaled per output "
                              f"channel, so group_size must be K = {k}, got {group_size}")
    if bits == 4 and group_size not in GROUP_SIZES:
        raise InvalidArgument(f"linear_wq: group_size: expected one of {list(GROUP_SIZES)} "
                              f"for int4, got {group_size}")
    c.check_rank(op, qweight, "qweight", (2,))
    if qweight.dtype is not QDTYPE[bits]:
        raise InvalidArgument(f"linear_wq: qweight: dtype must be {QDTYPE[bits].name} for "
                              f"int{bits} weights, got {qweight.dtype.name}")
    n = qweight.sizes[0]
    if bits == 4:
        if k % 2:
            raise InvalidArgument(f"linear_wq: x: in-features K = {k} is odd; int4 weights "
                                  f"pack two values a byte")
        if k % group_size:
            raise InvalidArgument(f"linear_wq: group_size: {group_size} does not divide "
                                  f"in-features K = {k}")
    packed_k = k // 2 if bits == 4 else k
    if qweight.sizes[1] != packed_k:
        raise InvalidArgument(f"linear_wq: qweight: expected sizes [{n}, {packed_k}] for "
                              f"int{bits} weights of in-features {k}, got {list(qweight.sizes)}")
    groups = k // group_size if bits == 4 else 1
    c.check_dtype(op, scales, "scales")
    scale_shape = (n, groups) if bits == 4 else (n,)
    if tuple(scales.sizes) != scale_shape:
        raise InvalidArgument(f"linear_wq: scales: expected sizes {list(scale_shape)} (one "
                              f"per {'group of ' + str(group_size) if bits == 4 else 'row'}), "
                              f"got {list(scales.sizes)}")
    if bits == 8 and zeros is not None:
        raise InvalidArgument("linear_wq: zeros: int8 weights are symmetric and take no zero "
                              "points")
    if bits == 4:
        if zeros is None:
            raise InvalidArgument("linear_wq: zeros: int4 weights need zero points")
        c.check_same_dtype(op, scales, "scales", zeros, "zeros")
        if tuple(zeros.sizes) != scale_shape:
            raise InvalidArgument(f"linear_wq: zeros: expected sizes {list(scale_shape)}, "
                                  f"got {list(zeros.sizes)}")
    if bias is not None:
        c.check_same_dtype(op, out, "out", bias, "bias")
        if tuple(bias.sizes) != (n,):
            raise InvalidArgument(f"linear_wq: bias: expected sizes [{n}], got "
                                  f"{list(bias.sizes)}")
    c.check_shape(op, out, "out", tuple(x.sizes[:-1]) + (n,))
    return (bits, group_size), linear_wq_cost(out, x, n, k, groups)


#: rows the cpu's fused kernel takes (more go through a dequantized block and a BLAS GEMM)
FUSED_MAX_ROWS = 16


def linear_wq_cost(out: Any, x: Any, n: int, k: int, groups: int) -> c.OpCost:
    """Cost on cpu: the multiply-adds, a dequantizing pass over the weights, a visit of
    every element and a python step per block of rows; scratch: x and the result in
    float32, the rounded result, and one block of dequantized weights (with its unpacked
    values) or the fused kernel's x and group sums, whichever path runs."""
    m = x.numel // max(k, 1)
    rows = c.rows_per_chunk(9 * k, n)
    blocks = -(-n // rows) if n else 0
    work = m * n * k + 4 * n * k + out.numel + x.numel + 2 * n * groups + c.PY_STEP * blocks
    scratch = (4 * m * k + 4 * m * groups + (4 + out.dtype.itemsize) * out.numel
               + 9 * min(rows, n) * k + 4 * m * min(rows, n))
    return c.OpCost(work, scratch)


def linear_wq(stream: Stream, out: Handle, x: Handle, qweight: Handle, scales: Handle,
              zeros: Handle | None = None, bias: Handle | None = None, bits: int = 8,
              group_size: int | None = None) -> int:
    """out = x @ dequantize(qweight, scales, zeros).T (+ bias); see the module docstring."""
    c.check_handles(OP, stream, [(out, "out"), (x, "x"), (qweight, "qweight"),
                                 (scales, "scales"), (zeros, "zeros"), (bias, "bias")])
    (bits, group_size), _ = check_linear_wq(out, x, qweight, scales, zeros, bias, bits,
                                            group_size)
    return c.launch(OP, stream, [out], [x, qweight, scales, zeros, bias], OP, out, x,
                    qweight, scales, zeros, bias, bits, group_size)


def rows_of(h: Any) -> tuple[int, int] | None:
    """(row stride, rows) of a view of rank >= 1 whose last dim is unit-stride (or of one
    element) and whose leading dims fold into one; None otherwise."""
    k = h.sizes[-1]
    if k > 1 and h.strides[-1] != 1:
        return None
    lead = [(n, s) for n, s in zip(h.sizes[:-1], h.strides[:-1]) if n != 1]
    rows = 1
    for n, _ in lead:
        rows *= n
    for (_, s0), (n1, s1) in zip(lead, lead[1:]):
        if s0 != n1 * s1:
            return None
    return (lead[-1][1] if lead else k), rows


def dense(h: Any) -> bool:
    """A row-major view (or absent)."""
    if h is None:
        return True
    expect = 1
    for n, s in zip(reversed(h.sizes), reversed(h.strides)):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


def describe(params: dict[str, Any]) -> str:
    """The scheme of a linear_wq instruction's params, e.g. 'int4, group 128'."""
    bits, gs = params.get("bits"), params.get("group_size")
    return f"int{bits}, per channel" if bits == 8 else f"int{bits}, group {gs}"


__all__ = ["BITS", "FUSED_MAX_ROWS", "GROUP_SIZES", "check_linear_wq", "dense", "describe",
           "linear_wq", "linear_wq_cost", "rows_of"]
