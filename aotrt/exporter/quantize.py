"""Weight-only quantization of linear layers (issue 38): int8 per output channel, int4 per
group along K, and the torch custom op `aotrt::linear_wq` the quantized layers call.

    quantize_linears(model, weights="int4", group_size=128)   # in place
    prog = aotrt.export(model, (x,))                          # library op linear_wq

Packing (the program file stores exactly these tensors, as constants):

- int8: `qweight` int8 [N, K], symmetric: w = q * scales[n]; `scales` [N]; no zeros.
- int4: `qweight` uint8 [N, K // 2], two values per byte, k = 2j in the low nibble of
  byte j and k = 2j + 1 in the high one; asymmetric per group of `group_size` along K:
  w = (q - zeros[n, g]) * scales[n, g], q in [0, 15]; `scales` and `zeros` [N, K // gs].

Scales and zeros are in the model's dtype (or `scale_dtype`); zeros hold integers 0..15.
The op's meaning, which every device implements, is the eager one below: the weights
dequantized in float32, a float32 linear (bias included), the result rounded once to x's
dtype.
"""

from __future__ import annotations

import re
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from aotrt.errors import InvalidArgument

#: the `weights` names and their bit widths
BITS = {"int8": 8, "int4": 4}
#: the int4 group sizes along K (int8 is per output channel: one group of K)
GROUP_SIZES = (32, 64, 128)
SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@torch.library.custom_op("aotrt::linear_wq", mutates_args=())
def linear_wq(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
              zeros: Optional[torch.Tensor], bias: Optional[torch.Tensor], bits: int,
              group_size: int) -> torch.Tensor:
    """x @ dequantize(qweight).T + bias, in float32, rounded once to x's dtype."""
    w = dequantize(qweight, scales, zeros, bits, group_size)
    b = None if bias is None else bias.float()
    return F.linear(x.float(), w, b).to(x.dtype)


@linear_wq.register_fake
def _linear_wq_fake(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                    zeros: Optional[torch.Tensor], bias: Optional[torch.Tensor], bits: int,
                    group_size: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], qweight.shape[0]))


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K // 2] -> the int4 values as uint8 [N, K] (low nibble first)."""
    lo, hi = qweight & 0xF, qweight >> 4
    return torch.stack((lo, hi), dim=-1).reshape(qweight.shape[0], -1)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """uint8 values 0..15 [N, K] (K even) -> uint8 [N, K // 2] (low nibble first)."""
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def dequantize(qweight: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor],
               bits: int, group_size: int) -> torch.Tensor:
    """The float32 [N, K] weights the packed tensors stand for."""
    if bits == 8:
        return qweight.float() * scales.float().reshape(-1, 1)
    if bits != 4 or zeros is None:
        raise InvalidArgument(f"linear_wq: bits: {bits} (with zeros {zeros is not None}) is "
                              f"not a scheme: int8 without zeros or int4 with them")
    q = unpack_int4(qweight).float()
    s = scales.float().repeat_interleave(group_size, dim=1)
    z = zeros.float().repeat_interleave(group_size, dim=1)
    return (q - z) * s


def quantize_int8(w: torch.Tensor, scale_dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per output channel: (int8 [N, K], scales [N])."""
    w = w.detach().float()
    amax = w.abs().amax(dim=1)
    # An all-zero row keeps scale 1 (any scale dequantizes its zeros exactly).
    scales = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax)).to(scale_dtype)
    # Rounded against the stored scale, so that q * scale is the nearest representable w.
    q = torch.round(w / scales.float().reshape(-1, 1)).clamp(-127, 127).to(torch.int8)
    return q, scales


def quantize_int4(w: torch.Tensor, group_size: int, scale_dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric per group along K: (uint8 [N, K // 2], scales, zeros [N, K // gs])."""
    w = w.detach().float()
    n, k = w.shape
    g = w.reshape(n, k // group_size, group_size)
    # The range always holds 0 (torchao's choose_qparams_affine), so 0 dequantizes exactly.
    lo = g.amin(dim=-1).clamp(max=0.0)
    hi = g.amax(dim=-1).clamp(min=0.0)
    span = hi - lo
    scales = torch.where(span > 0, span / 15.0, torch.ones_like(span)).to(scale_dtype)
    s = scales.float()
    zeros = torch.round(-lo / s).clamp(0, 15)
    q = (torch.round(g / s.unsqueeze(-1)) + zeros.unsqueeze(-1)).clamp(0, 15)
    return pack_int4(q.reshape(n, k)), scales, zeros.to(scale_dtype)


class QuantizedLinear(torch.nn.Module):
    """A Linear whose weight is stored packed (int8 or int4) and dequantized by the op."""

    def __init__(self, linear: torch.nn.Linear, bits: int, group_size: int,
                 scale_dtype: torch.dtype) -> None:
        super().__init__()
        w = linear.weight
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bits, self.group_size = bits, group_size
        if bits == 8:
            q, s = quantize_int8(w, scale_dtype)
            z = None
        else:
            q, s, z = quantize_int4(w, group_size, scale_dtype)
        self.register_buffer("qweight", q.to(w.device))
        self.register_buffer("scales", s.to(w.device))
        self.register_buffer("zeros", None if z is None else z.to(w.device))
        self.bias = None if linear.bias is None else torch.nn.Parameter(
            linear.bias.detach().clone(), requires_grad=False)

    @classmethod
    def packed(cls, qweight: torch.Tensor, scales: torch.Tensor,
               zeros: Optional[torch.Tensor], bits: int, group_size: int,
               bias: Optional[torch.Tensor] = None) -> "QuantizedLinear":
        """A layer over packed tensors that already exist (a head tied to an embedding)."""
        self = cls.__new__(cls)
        torch.nn.Module.__init__(self)
        self.out_features = int(qweight.shape[0])
        self.in_features = int(qweight.shape[1]) * (2 if bits == 4 else 1)
        self.bits, self.group_size = bits, group_size
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.register_buffer("zeros", zeros)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().clone(),
                                                                 requires_grad=False)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The dequantize-then-linear custom op."""
        return torch.ops.aotrt.linear_wq(x, self.qweight, self.scales, self.zeros, self.bias,
                                         self.bits, self.group_size)

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 [N, K] weight this layer computes with."""
        return dequantize(self.qweight, self.scales, self.zeros, self.bits, self.group_size)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"int{self.bits}, group_size={self.group_size}")


class QuantizedEmbedding(torch.nn.Module):
    """An Embedding whose table is stored packed like QuantizedLinear's weight ([V, D] is
    [N, K]) and dequantized per looked-up row, in plain torch ops that the exporter fuses
    into one gather kernel; the result is in `dtype` (the table's float dtype)."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor,
                 zeros: Optional[torch.Tensor], bits: int, group_size: int,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.num_embeddings = int(qweight.shape[0])
        self.embedding_dim = int(qweight.shape[1]) * (2 if bits == 4 else 1)
        self.bits, self.group_size, self.dtype = bits, group_size, dtype
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.register_buffer("zeros", zeros)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows `ids` of the dequantized table: (q - zero) * scale in float32."""
        # F.embedding, not indexing: a negative id is refused as nn.Embedding refuses it
        rows = F.embedding(ids, self.qweight)
        if self.bits == 8:
            scale = F.embedding(ids, self.scales.unsqueeze(-1)).float()
            return (rows.float() * scale).to(self.dtype)
        q = torch.stack((rows & 0xF, rows >> 4), dim=-1).flatten(-2).float()
        s = F.embedding(ids, self.scales).float().repeat_interleave(self.group_size, dim=-1)
        z = F.embedding(ids, self.zeros).float().repeat_interleave(self.group_size, dim=-1)
        return ((q - z) * s).to(self.dtype)

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 [V, D] table this layer looks rows up in."""
        return dequantize(self.qweight, self.scales, self.zeros, self.bits, self.group_size)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, int{self.bits}, "
                f"group_size={self.group_size}")


def quantize_embeddings(module: torch.nn.Module, weights: str = "int8",
                        group_size: int = 128, scale_dtype: torch.dtype | None = None
                        ) -> list[str]:
    """Replace every torch.nn.Embedding in `module` in place by a QuantizedEmbedding (the
    scheme of `quantize_linears`, one row of the table per output channel); returns the
    names replaced.

    A Linear whose weight is the table itself (an output head tied to the input embedding)
    becomes a QuantizedLinear over the same packed tensors, so the file stores them once.
    Call it before `quantize_linears`, which then leaves those heads as they are.
    """
    bits, scale_dtype = _scheme(weights, group_size, scale_dtype)
    tables = [(name, m) for name, m in module.named_modules()
              if type(m) is torch.nn.Embedding]
    for name, emb in tables:
        if emb.max_norm is not None:
            raise InvalidArgument(f"quantize_embeddings: {name}: max_norm renormalises the "
                                  f"table as it is read; leave the layer out")
        w = emb.weight
        d = emb.embedding_dim
        if bits == 4 and (d % group_size or d % 2):
            raise InvalidArgument(f"quantize_embeddings: {name}: embedding_dim {d} is not a "
                                  f"multiple of group_size {group_size}")
        if w.dtype not in SCALE_DTYPES:
            raise InvalidArgument(f"quantize_embeddings: {name}: weight dtype {w.dtype} is "
                                  f"not a float dtype")
        sd = scale_dtype or w.dtype
        gs = d if bits == 8 else group_size
        if bits == 8:
            q, s = quantize_int8(w, sd)
            z = None
        else:
            q, s, z = quantize_int4(w, gs, sd)
        q, s = q.to(w.device), s.to(w.device)
        z = None if z is None else z.to(w.device)
        heads = [hname for hname, h in module.named_modules()
                 if type(h) is torch.nn.Linear and h.weight is w]
        _replace(module, name, QuantizedEmbedding(q, s, z, bits, gs, w.dtype))
        for hname in heads:
            head = module.get_submodule(hname)
            _replace(module, hname, QuantizedLinear.packed(q, s, z, bits, gs, head.bias))
    return [name for name, _ in tables]


def _scheme(weights: str, group_size: int, scale_dtype: torch.dtype | None
            ) -> tuple[int, torch.dtype | None]:
    """The bit width of `weights`, with the group size and scale dtype checked."""
    if weights not in BITS:
        raise InvalidArgument(f"quantize: weights: expected one of {sorted(BITS)}, "
                              f"got {weights!r}")
    bits = BITS[weights]
    if bits == 4 and group_size not in GROUP_SIZES:
        raise InvalidArgument(f"quantize: group_size: expected one of {GROUP_SIZES} "
                              f"for int4, got {group_size!r}")
    if scale_dtype is not None and scale_dtype not in SCALE_DTYPES:
        raise InvalidArgument(f"quantize: scale_dtype: expected one of "
                              f"{SCALE_DTYPES}, got {scale_dtype!r}")
    return bits, scale_dtype


def quantize_linears(module: torch.nn.Module, weights: str = "int8", group_size: int = 128,
                     scale_dtype: torch.dtype | None = None,
                     include: str | Callable[[str, torch.nn.Linear], bool] | None = None
                     ) -> list[str]:
    """Replace every torch.nn.Linear in `module` (and transformers' Conv1D, GPT-2's linear
    layers) in place by a QuantizedLinear; returns the names of the layers replaced.

    `weights`: "int8" (symmetric per output channel; `group_size` is ignored) or "int4"
    (asymmetric per group of `group_size` in 32, 64, 128 along K). `scale_dtype`: of the
    scales and zeros (float32, bfloat16 or float16; default: each weight's dtype).
    `include`: a regular expression the layer's qualified name must match (re.search), or a
    predicate (name, layer) -> bool; None takes every Linear. Embeddings are never touched.
    """
    bits, scale_dtype = _scheme(weights, group_size, scale_dtype)
    if include is None:
        def take(name: str, layer: torch.nn.Linear) -> bool:
            return True
    elif isinstance(include, str):
        pattern = re.compile(include)

        def take(name: str, layer: torch.nn.Linear) -> bool:
            return pattern.search(name) is not None
    else:
        take = include
    chosen = [(name, lin) for name, m in module.named_modules()
              if (lin := _as_linear(m)) is not None and take(name, lin)]
    for name, lin in chosen:
        k = lin.in_features
        if bits == 4 and (k % group_size or k % 2):
            raise InvalidArgument(f"quantize_linears: {name}: in_features {k} is not a "
                                  f"multiple of group_size {group_size} (leave the layer out "
                                  f"with include=)")
        if lin.weight.dtype not in SCALE_DTYPES:
            raise InvalidArgument(f"quantize_linears: {name}: weight dtype "
                                  f"{lin.weight.dtype} is not a float dtype")
        sd = scale_dtype or lin.weight.dtype
        gs = k if bits == 8 else group_size
        _replace(module, name, QuantizedLinear(lin, bits, gs, sd))
    return [name for name, _ in chosen]


def _as_linear(m: torch.nn.Module) -> torch.nn.Linear | None:
    """`m` itself if it is a Linear; a Linear of the same product for transformers' Conv1D
    (GPT-2's layers: y = x @ W + b with W stored [in, out]); else None."""
    if type(m) is torch.nn.Linear:
        return m
    cls = type(m)
    if cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers."):
        w = m.weight.detach()
        lin = torch.nn.Linear(w.shape[0], w.shape[1], bias=m.bias is not None,
                              device=w.device, dtype=w.dtype)
        with torch.no_grad():
            lin.weight.copy_(w.t())
            if m.bias is not None:
                lin.bias.copy_(m.bias.detach())
        return lin
    return None


def _replace(root: torch.nn.Module, name: str, new: torch.nn.Module) -> None:
    """Set submodule `name` (dotted) of `root` to `new`."""
    if not name:
        raise InvalidArgument("quantize_linears: the module itself is a Linear; wrap it in "
                              "a container to quantize it in place")
    parent_name, _, leaf = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, leaf, new)


__all__ = ["BITS", "GROUP_SIZES", "QuantizedEmbedding", "QuantizedLinear", "dequantize",
           "linear_wq", "pack_int4", "quantize_embeddings", "quantize_int4", "quantize_int8",
           "quantize_linears", "unpack_int4"]
