"""Modules for the end-to-end tests: the behaviors.md §5 registry, the seed repros, YOLO
blocks (written ultralytics-style), a GPT-2 block, a Whisper-style conv1d stem, and the
coverage forms of issue #10 (avg_pool2d flags, sort, 3-D convolution, real parts of FFTs).

Each case is a `Case(name, build, make_inputs, tol)`; `build()` returns a fresh module,
`make_inputs(gen, dtype)` fresh random inputs. Sizes are kept small for a 2-core CI machine;
where a registry entry is reduced, its `note` says how (the layouts are kept).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.exporter.harness import MakeInputs, randn

F32, BF16 = torch.float32, torch.bfloat16


@dataclass(frozen=True)
class Case:
    """One module to export and compare."""

    name: str
    build: Callable[[], nn.Module]
    make_inputs: MakeInputs
    tol: dict[torch.dtype, float] | None = None
    note: str = ""


def inputs(*shapes: tuple[int, ...]) -> MakeInputs:
    """Fresh standard-normal inputs of these shapes."""
    return lambda gen, dt: tuple(randn(gen, dt, *s) for s in shapes)


# ---------------------------------------------------------------------------------------------
# behaviors.md §5 registry (int4, gather_qmv and gated_delta_rule excluded)


class Add(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class MM(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.mm(y)


class MMWeightParam(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.arange(20, dtype=torch.float32).reshape(4, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mm(self.w)


class SDPA(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)


class SDPAAdd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Parameter(torch.randn(2, 4, 16, 64))
        self.k = nn.Parameter(torch.randn(2, 4, 16, 64))
        self.v = nn.Parameter(torch.randn(2, 4, 16, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(self.q, self.k, self.v) + x


class SDPAStrided(nn.Module):
    """q, k, v parameters stored (B, L, H, D) and viewed (B, H, L, D): strides
    (L*H*D, D, H*D, 1), as the registry's (1920000, 64, 1280, 1) for (10, 20, 1500, 64)."""

    def __init__(self, b: int, h: int, lq: int, lk: int, d: int, causal: bool = False,
                 scale: float | None = None, mask_len: int | None = None) -> None:
        super().__init__()
        self.q = nn.Parameter(torch.randn(b, lq, h, d))
        self.k = nn.Parameter(torch.randn(b, lk, h, d))
        self.v = nn.Parameter(torch.randn(b, lk, h, d))
        self.causal = causal
        self.scale = scale
        self.mask = None if mask_len is None else nn.Parameter(torch.zeros(1, 1, 1, mask_len))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q.permute(0, 2, 1, 3)
        k = self.k.permute(0, 2, 1, 3)
        v = self.v.permute(0, 2, 1, 3)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask,
                                             is_causal=self.causal, scale=self.scale)
        return out + x


class SDPAContiguousParams(nn.Module):
    """q from (B, 1, H, D) storage (strided), k/v contiguous (B, H, L, D), zero float mask."""

    def __init__(self, h: int, lk: int, d: int) -> None:
        super().__init__()
        self.q = nn.Parameter(torch.randn(1, 1, h, d))
        self.k = nn.Parameter(torch.randn(1, h, lk, d))
        self.v = nn.Parameter(torch.randn(1, h, lk, d))
        self.mask = nn.Parameter(torch.zeros(1, 1, 1, lk))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q.permute(0, 2, 1, 3)
        return F.scaled_dot_product_attention(q, self.k, self.v, attn_mask=self.mask) + x


class SDPAInputs(nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


class NarrowLastDim(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.narrow(-1, 0, 8)
        b = x.narrow(-1, 8, 8)
        return a * 2 + b


class TopK(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(64, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.topk(self.linear(x), 2, dim=-1).values


def _strided_qkv(b: int, h: int, l: int, d: int) -> MakeInputs:
    """q, k, v inputs of (b, h, l, d) in (b, l, h, d) storage."""
    def make(gen: torch.Generator, dt: torch.dtype) -> tuple[Any, ...]:
        return tuple(randn(gen, dt, b, l, h, d).permute(0, 2, 1, 3) for _ in range(3))
    return make


REGISTRY: list[Case] = [
    Case("add", Add, inputs((10,), (10,))),
    Case("mm", MM, inputs((3, 4), (4, 5))),
    Case("mm_weight_param", MMWeightParam, inputs((3, 4))),
    Case("linear_nobias", lambda: nn.Linear(7, 101, bias=False), inputs((127, 7))),
    Case("linear_bias", lambda: nn.Linear(7, 101), inputs((127, 7))),
    Case("conv1d_nobias", lambda: nn.Conv1d(8, 6, 3, 1, 1, bias=False), inputs((1, 8, 5))),
    Case("conv1d_bias", lambda: nn.Conv1d(80, 384, 3, padding=1), inputs((1, 80, 3000))),
    Case("conv1d_voxtral", lambda: nn.Conv1d(128, 1280, 3, padding=1, bias=False),
         inputs((2, 128, 3000)), note="batch 2 instead of 10"),
    Case("sdpa", SDPA, inputs((2, 4, 16, 64), (2, 4, 16, 64), (2, 4, 16, 64))),
    Case("sdpa_add", SDPAAdd, inputs((2, 4, 16, 64))),
    Case("sdpa_strided", lambda: SDPAStrided(2, 4, 300, 300, 64, scale=1.0),
         inputs((2, 4, 300, 64)), tol={F32: 1e-4, BF16: 5e-2},
         note="(2, 4, 300, 64) instead of (10, 20, 1500, 64); same (B, L, H, D) storage"),
    Case("sdpa_strided_broadcast", lambda: SDPAStrided(1, 20, 1, 1500, 64),
         inputs((1, 20, 1, 64))),
    Case("sdpa_strided_broadcast_attn_mask", lambda: SDPAContiguousParams(20, 1024, 64),
         inputs((1, 20, 1, 64))),
    Case("sdpa_contiguous_causal", lambda: SDPAInputs(True),
         inputs((1, 8, 500, 64), (1, 8, 500, 64), (1, 8, 500, 64)), tol={F32: 1e-4, BF16: 5e-2},
         note="(1, 8, 500, 64) instead of (1, 32, 1500, 64)"),
    Case("sdpa_strided_causal", lambda: SDPAInputs(True), _strided_qkv(1, 8, 500, 64),
         tol={F32: 1e-4, BF16: 5e-2},
         note="(1, 8, 500, 64) instead of (1, 32, 1500, 64); (B, L, H, D) storage"),
    Case("sdpa_head_dim_256", SDPA, inputs((1, 4, 8, 256), (1, 4, 8, 256), (1, 4, 8, 256)),
         tol={F32: 1e-4, BF16: 5e-2}),
    Case("narrow_last_dim", NarrowLastDim, inputs((2, 4, 16))),
    Case("topk", TopK, inputs((4, 64))),
]


# ---------------------------------------------------------------------------------------------
# seed repros (seeds 000 / 002)


class LinearChunkLastDim(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(7, 16, bias=False)
        self.linear2 = nn.Linear(8, 5, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, second = self.linear1(x).chunk(2, dim=-1)
        return self.linear2(second)


class LinearChunkFirstDim(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(7, 16, bias=False)
        self.linear2 = nn.Linear(16, 5, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, second = self.linear1(x).chunk(2, dim=0)
        return self.linear2(second)


class LinearCat(nn.Module):
    """Two linears written through views of one cat result, then read by a third: along the
    last dim the views are non-packed (the case the anchor skips)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.linear_a = nn.Linear(7, 8, bias=False)
        self.linear_b = nn.Linear(7, 8, bias=False)
        self.linear2 = nn.Linear(16 if dim == -1 else 8, 5, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([self.linear_a(x), self.linear_b(x)], dim=self.dim)
        return self.linear2(y)


class LinearChunkCat(nn.Module):
    """chunk -> reorder -> cat -> linear: views as cat inputs (copied into the result) next to
    a producer that writes its slot directly."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.linear1 = nn.Linear(7, 16, bias=False)
        self.linear_c = nn.Linear(7, 8 if dim == -1 else 16, bias=False)
        self.linear2 = nn.Linear(24 if dim == -1 else 16, 5, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.linear1(x).chunk(2, dim=self.dim)
        y = torch.cat([b, self.linear_c(x), a], dim=self.dim)
        return self.linear2(y)


class NestedView(nn.Module):
    """Views of views of a linear's output: one flattened view at a larger offset each."""

    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(7, 16, bias=False)
        self.linear2 = nn.Linear(16, 5, bias=False)
        self.linear3 = nn.Linear(4, 3, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.linear1(x)                       # (12, 16)
        packed = y.view(2, 6, 16)[1][3:]          # (3, 16) at element offset 144
        strided = y.view(12, 4, 4)[2:9:2, 1:3].reshape(4, 2, 4)[:, 1]   # (4, 4) non-packed
        return self.linear2(packed), self.linear3(strided)


SEEDS: list[Case] = [
    Case("linear_chunk_last_dim", LinearChunkLastDim, inputs((12, 7))),
    Case("linear_chunk_first_dim", LinearChunkFirstDim, inputs((12, 7))),
    Case("linear_cat_last_dim", lambda: LinearCat(-1), inputs((12, 7))),
    Case("linear_cat_first_dim", lambda: LinearCat(0), inputs((12, 7))),
    Case("linear_chunk_cat_last_dim", lambda: LinearChunkCat(-1), inputs((12, 7))),
    Case("linear_chunk_cat_first_dim", lambda: LinearChunkCat(0), inputs((12, 7))),
    Case("nested_view", NestedView, inputs((12, 7))),
]


# ---------------------------------------------------------------------------------------------
# YOLO blocks (ultralytics-style)


def _randomize_bn(m: nn.Module) -> None:
    """Give batch norms non-trivial statistics so that folding them is really tested."""
    g = torch.Generator().manual_seed(1)
    for mod in m.modules():
        if isinstance(mod, (nn.BatchNorm2d, nn.BatchNorm3d)):
            n = mod.num_features
            mod.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
            mod.running_var.copy_(torch.rand(n, generator=g) + 0.5)
            mod.weight.data.copy_(torch.rand(n, generator=g) + 0.5)
            mod.bias.data.copy_(torch.randn(n, generator=g) * 0.1)


class Conv(nn.Module):
    """conv (no bias) -> batch norm -> SiLU."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, c: int, shortcut: bool = True) -> None:
        super().__init__()
        self.cv1 = Conv(c, c, 3)
        self.cv2 = Conv(c, c, 3)
        self.add = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    def __init__(self, c1: int, c2: int, n: int = 2, shortcut: bool = True) -> None:
        super().__init__()
        self.c = c2 // 2
        self.cv1 = Conv(c1, 2 * self.c, 1)
        self.cv2 = Conv((2 + n) * self.c, c2, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))
        _randomize_bn(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, c1: int, c2: int, k: int = 5) -> None:
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1)
        self.cv2 = Conv(c_ * 4, c2, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)
        _randomize_bn(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        y.extend(self.m(y[-1]) for _ in range(3))
        return self.cv2(torch.cat(y, 1))


class SPPFUpsample(nn.Module):
    """SPPF, then a neck step: upsample and cat with the input (export-notes' case d)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.sppf = SPPF(c, c)
        self.up = nn.Upsample(scale_factor=2.0, mode="nearest")
        self.cv = Conv(2 * c, c, 3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.up(self.sppf(x))
        return self.cv(torch.cat([y, self.up(x)], 1))


class DFL(nn.Module):
    """Distribution focal loss integral: softmax over reg_max bins, then a fixed 1x1 conv."""

    def __init__(self, c1: int = 16) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
        self.conv.weight.data[:] = torch.arange(c1, dtype=torch.float32).view(1, c1, 1, 1)
        self.c1 = c1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, a = x.shape
        return self.conv(x.view(b, 4, self.c1, a).transpose(2, 1).softmax(1)).view(b, 4, a)


def make_anchors(feats: list[torch.Tensor], strides: list[float],
                 offset: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """Anchor points and strides from feature maps (computed in the graph, as ultralytics)."""
    anchor_points, stride_tensor = [], []
    dtype = feats[0].dtype
    for f, stride in zip(feats, strides):
        _, _, h, w = f.shape
        sx = torch.arange(end=w, dtype=dtype) + offset
        sy = torch.arange(end=h, dtype=dtype) + offset
        sy, sx = torch.meshgrid(sy, sx, indexing="ij")
        anchor_points.append(torch.stack((sx, sy), -1).view(-1, 2))
        stride_tensor.append(torch.full((h * w, 1), stride, dtype=dtype))
    return torch.cat(anchor_points), torch.cat(stride_tensor)


def dist2bbox(distance: torch.Tensor, anchor_points: torch.Tensor, dim: int = -1
              ) -> torch.Tensor:
    """ltrb distances -> xywh boxes."""
    lt, rb = distance.chunk(2, dim)
    x1y1 = anchor_points - lt
    x2y2 = anchor_points + rb
    return torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), dim)


class Detect(nn.Module):
    """The YOLOv8 detect head: box (DFL) and class branches per level, decoded boxes."""

    def __init__(self, nc: int = 8, ch: tuple[int, ...] = (16, 32), reg_max: int = 16,
                 strides: tuple[float, ...] = (8.0, 16.0)) -> None:
        super().__init__()
        self.nc, self.reg_max, self.nl = nc, reg_max, len(ch)
        self.no = nc + 4 * reg_max
        self.strides = list(strides)
        c2, c3 = max(16, ch[0] // 4, reg_max * 4), max(ch[0], min(nc, 100))
        self.cv2 = nn.ModuleList(nn.Sequential(Conv(x, c2, 3), Conv(c2, c2, 3),
                                               nn.Conv2d(c2, 4 * reg_max, 1)) for x in ch)
        self.cv3 = nn.ModuleList(nn.Sequential(Conv(x, c3, 3), Conv(c3, c3, 3),
                                               nn.Conv2d(c3, nc, 1)) for x in ch)
        self.dfl = DFL(reg_max)
        _randomize_bn(self)

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        x = [torch.cat((self.cv2[i](xs[i]), self.cv3[i](xs[i])), 1) for i in range(self.nl)]
        b = x[0].shape[0]
        anchors, strides = (t.transpose(0, 1) for t in make_anchors(x, self.strides))
        x_cat = torch.cat([xi.view(b, self.no, -1) for xi in x], 2)
        box, cls = x_cat.split((self.reg_max * 4, self.nc), 1)
        dbox = dist2bbox(self.dfl(box), anchors.unsqueeze(0), dim=1) * strides
        return torch.cat((dbox, cls.sigmoid()), 1)


YOLO_BLOCKS: list[Case] = [
    Case("c2f", lambda: C2f(16, 32, n=2), inputs((1, 16, 20, 20))),
    Case("c2f_no_shortcut", lambda: C2f(16, 16, n=1, shortcut=False), inputs((1, 16, 12, 12))),
    Case("sppf", lambda: SPPF(32, 32), inputs((1, 32, 10, 10))),
    Case("sppf_upsample_cat", lambda: SPPFUpsample(16), inputs((1, 16, 8, 8))),
    Case("detect_dfl", Detect, inputs((1, 16, 8, 8), (1, 32, 4, 4))),
]


# ---------------------------------------------------------------------------------------------
# transformer block and conv1d stem


class GPT2Block(nn.Module):
    """Pre-norm causal self-attention + tanh-GELU MLP, as GPT-2 (c_attn split into q, k, v)."""

    def __init__(self, c: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)
        with torch.no_grad():   # non-trivial norm parameters
            for ln in (self.ln_1, self.ln_2):
                ln.weight.uniform_(0.5, 1.5)
                ln.bias.uniform_(-0.1, 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2BlockManualAttention(GPT2Block):
    """The same block with attention written out (matmul, mask, softmax): bmm/_softmax path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        d = c // self.heads
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q = q.view(b, t, self.heads, d).transpose(1, 2)
        k = k.view(b, t, self.heads, d).transpose(1, 2)
        v = v.view(b, t, self.heads, d).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class WhisperStem(nn.Module):
    """Whisper's encoder stem: conv1d + GELU, strided conv1d + GELU, positional add."""

    def __init__(self, n_mels: int = 16, d: int = 64, frames: int = 100) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(n_mels, d, 3, padding=1)
        self.conv2 = nn.Conv1d(d, d, 3, stride=2, padding=1)
        self.embed_positions = nn.Parameter(torch.randn(frames // 2, d) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv1(x))
        x = F.gelu(self.conv2(x))
        return x.permute(0, 2, 1) + self.embed_positions


BLOCKS: list[Case] = [
    Case("gpt2_block", GPT2Block, inputs((1, 16, 64))),
    Case("gpt2_block_manual_attention", GPT2BlockManualAttention, inputs((2, 16, 64))),
    Case("whisper_conv_stem", WhisperStem, inputs((1, 16, 100))),
]


# ---------------------------------------------------------------------------------------------
# coverage (issue #10): avg_pool2d in every form, sort, 3-D convolution


class AvgPool(nn.Module):
    """F.avg_pool2d with explicit flags, after a pointwise op so that the input is computed."""

    def __init__(self, kernel: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override: int | None = None) -> None:
        super().__init__()
        self.args = (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(x * 1.5, *self.args)


class AvgPool1d(nn.Module):
    def __init__(self, *args: Any) -> None:
        super().__init__()
        self.args = args

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool1d(x - 0.25, *self.args)


class FunnelPool(nn.Module):
    """HF Funnel's pooling of a (B, L, D) sequence: avg_pool2d over (2, 1) windows of
    x[:, None], ceil_mode (odd L keeps its last token)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(x[:, None], (2, 1), stride=(2, 1), ceil_mode=True)[:, 0]


class ResNetDDown(nn.Module):
    """timm's ResNet-D downsample: AvgPool2d(2, 2, ceil_mode, count_include_pad=False),
    1x1 conv, batch norm."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = nn.AvgPool2d(2, 2, ceil_mode=True, count_include_pad=False)
        self.conv = nn.Conv2d(4, 8, 1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        _randomize_bn(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(self.pool(x)))


def _pool_cases() -> list[Case]:
    cases = []
    # Every flag combination: k3 s2 on 8x11 adds a ceil window in H only (with padding 1)
    # and in both dims (without).
    for ceil in (False, True):
        for cip in (True, False):
            for div in (None, 3):
                for pad in (0, 1):
                    name = (f"avg_pool2d_k3s2p{pad}{'_ceil' if ceil else ''}"
                            f"{'' if cip else '_nopad'}{'_div3' if div else ''}")
                    cases.append(Case(name, lambda p=pad, c=ceil, i=cip, d=div:
                                      AvgPool(3, 2, p, c, i, d), inputs((2, 3, 8, 11))))
    cases += [
        # ceil drops the window that would start in the right padding: 5 -> 3 outputs, not 4.
        Case("avg_pool2d_ceil_window_in_padding_dropped",
             lambda: AvgPool(2, 2, 1, True, True), inputs((1, 2, 5, 6))),
        Case("avg_pool2d_ceil_window_in_padding_dropped_nopad",
             lambda: AvgPool(2, 2, 1, True, False), inputs((1, 2, 5, 6))),
        Case("avg_pool2d_rect_ceil_nopad", lambda: AvgPool((3, 2), (2, 3), (1, 0), True, False),
             inputs((2, 3, 9, 10))),
        Case("avg_pool2d_rect_ceil_div", lambda: AvgPool((3, 2), (2, 3), (1, 1), True, True, 4),
             inputs((1, 3, 9, 10))),
        Case("avg_pool2d_default_stride", lambda: AvgPool(3), inputs((1, 3, 7, 9))),
        # windows of up to 17x17 = 289 elements: counts above bfloat16's exact integers
        Case("avg_pool2d_k17_ceil_nopad", lambda: AvgPool(17, 4, 8, True, False),
             inputs((1, 2, 21, 19))),
        Case("avg_pool2d_unbatched_ceil", lambda: AvgPool(3, 2, 1, True, False),
             inputs((3, 8, 9))),
        Case("avg_pool2d_stride1_ceil", lambda: AvgPool(3, 1, 1, True, False),
             inputs((1, 2, 6, 5))),
        Case("avg_pool1d_ceil_nopad", lambda: AvgPool1d(3, 2, 1, True, False), inputs((2, 4, 9))),
        Case("avg_pool1d_ceil", lambda: AvgPool1d(4, 3, 2, True, True), inputs((2, 4, 11))),
        Case("funnel_pool", FunnelPool, inputs((2, 7, 16))),
        Case("resnet_d_down", ResNetDDown, inputs((1, 4, 7, 9))),
    ]
    return cases


POOLS: list[Case] = _pool_cases()


class Sort(nn.Module):
    """torch.sort of a computed tensor; values and indices are outputs (optionally rounded
    to make ties, optionally NaN above a threshold)."""

    def __init__(self, dim: int = -1, descending: bool = False, stable: bool | None = None,
                 ties: bool = False, nan: bool = False) -> None:
        super().__init__()
        self.dim, self.descending, self.stable = dim, descending, stable
        self.ties, self.nan = ties, nan

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2
        if self.ties:
            y = torch.round(y)  # many equal values, -0.0 and 0.0 among them
        if self.nan:
            y = y.masked_fill(y > 2.0, float("nan"))
        if self.stable is None:
            r = torch.sort(y, dim=self.dim, descending=self.descending)
        else:
            r = torch.sort(y, dim=self.dim, descending=self.descending, stable=self.stable)
        return r.values, r.indices


class SortInts(nn.Module):
    """A stable sort of int64 ids (MoE: tokens grouped by expert) and its permutation."""

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = torch.sort(ids.flatten(), stable=True)
        return r.values, r.indices


class MoERouter(nn.Module):
    """Mixtral/Qwen2-MoE-style routing through sort: softmax over expert logits, the top 2
    by a descending sort, renormalised weights, and the expert ids argsorted per token."""

    def __init__(self, d: int = 32, experts: int = 8) -> None:
        super().__init__()
        self.gate = nn.Linear(d, experts, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        probs = self.gate(x).softmax(dim=-1)
        w, idx = torch.sort(probs, dim=-1, descending=True)
        w, idx = w[..., :2], idx[..., :2]
        order = torch.argsort(idx.flatten(), stable=True)
        return w / w.sum(dim=-1, keepdim=True), idx, order


def _int_ids(*shape: int) -> MakeInputs:
    return lambda gen, dt: (torch.randint(0, 5, shape, generator=gen),)


#: unique values (random normal): the indices are torch's whatever its tie rule
SORTS_UNIQUE: list[Case] = [
    Case("sort_last_dim", lambda: Sort(), inputs((4, 6, 16))),
    Case("sort_dim0_descending", lambda: Sort(0, True), inputs((7, 5, 3))),
    Case("sort_middle_dim", lambda: Sort(1), inputs((3, 9, 4))),
    Case("sort_1d_descending", lambda: Sort(0, True), inputs((33,))),
    Case("sort_stable_false", lambda: Sort(-1, True, False), inputs((5, 12))),
    Case("moe_router_sort", MoERouter, inputs((2, 6, 32))),
]

#: ties (and NaN): stable=True fixes torch's indices
SORTS_TIES: list[Case] = [
    Case("sort_ties_stable", lambda: Sort(-1, False, True, ties=True), inputs((4, 40))),
    Case("sort_ties_stable_descending", lambda: Sort(-1, True, True, ties=True),
         inputs((4, 40))),
    Case("sort_ties_stable_dim0_descending", lambda: Sort(0, True, True, ties=True),
         inputs((30, 3, 2))),
    Case("sort_ties_stable_middle_dim", lambda: Sort(1, False, True, ties=True),
         inputs((2, 25, 3))),
    Case("sort_nan_stable_descending", lambda: Sort(-1, True, True, nan=True),
         inputs((6, 20))),
    Case("sort_nan_stable", lambda: Sort(0, False, True, ties=True, nan=True),
         inputs((20, 6))),
    Case("sort_int64_ids_stable", SortInts, _int_ids(3, 16)),
]


class Conv3dBNReLU(nn.Module):
    """r3d_18's stem: Conv3d (3, 7, 7) s(1, 2, 2) p(1, 3, 3), BatchNorm3d (folded), ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(3, 8, (3, 7, 7), (1, 2, 2), (1, 3, 3), bias=False)
        self.bn = nn.BatchNorm3d(8)
        _randomize_bn(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


CONV3D: list[Case] = [
    Case("conv3d_bias", lambda: nn.Conv3d(4, 6, 3), inputs((2, 4, 5, 6, 7))),
    Case("conv3d_strided_padded", lambda: nn.Conv3d(4, 6, 3, (2, 1, 2), (1, 0, 2)),
         inputs((1, 4, 7, 6, 9))),
    Case("conv3d_dilated", lambda: nn.Conv3d(3, 5, (2, 3, 3), 1, (1, 2, 1), (2, 2, 1),
                                             bias=False), inputs((1, 3, 6, 8, 7))),
    Case("conv3d_grouped", lambda: nn.Conv3d(6, 9, 3, 1, 1, groups=3), inputs((2, 6, 4, 5, 5))),
    Case("conv3d_depthwise", lambda: nn.Conv3d(6, 6, 3, 2, 1, groups=6),
         inputs((1, 6, 5, 7, 7))),
    Case("conv3d_pointwise", lambda: nn.Conv3d(8, 4, 1), inputs((1, 8, 3, 4, 5))),
    Case("conv3d_unbatched", lambda: nn.Conv3d(3, 4, 2), inputs((3, 4, 5, 6))),
    Case("conv_transpose3d", lambda: nn.ConvTranspose3d(4, 6, 3, 2, 1, output_padding=1),
         inputs((1, 4, 3, 4, 5))),
    Case("conv3d_bn_relu_stem", Conv3dBNReLU, inputs((1, 3, 4, 16, 16))),
]


class FFTPart(nn.Module):
    """A part (real and/or imaginary) of an FFT of a computed real tensor, as FNet takes."""

    def __init__(self, fft: Callable[[torch.Tensor], torch.Tensor], part: str = "real") -> None:
        super().__init__()
        self.fft, self.part = fft, part

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.fft(x * 1.5)
        if self.part == "both":
            return torch.cat([f.real, f.imag], dim=-1)
        return f.real if self.part == "real" else f.imag


#: float32 only: torch has no bfloat16 FFT on cpu
FFTS: list[Case] = [
    Case("fftn_real_fnet", lambda: FFTPart(lambda x: torch.fft.fftn(x, dim=(1, 2))),
         inputs((2, 16, 24))),
    Case("fft_last_dim_imag", lambda: FFTPart(torch.fft.fft, "imag"), inputs((3, 40))),
    Case("ifft_ortho_dim0_real", lambda: FFTPart(lambda x: torch.fft.ifft(x, dim=0,
                                                                          norm="ortho")),
         inputs((12, 5))),
    Case("fft2_forward_norm_both", lambda: FFTPart(lambda x: torch.fft.fft2(x, norm="forward"),
                                                   "both"), inputs((2, 9, 10))),
    Case("rfft_both", lambda: FFTPart(torch.fft.rfft, "both"), inputs((4, 15))),
    Case("rfftn_imag", lambda: FFTPart(lambda x: torch.fft.rfftn(x, dim=(0, 2)), "imag"),
         inputs((6, 3, 8))),
    Case("fft_of_fft_real", lambda: FFTPart(lambda x: torch.fft.fft(torch.fft.fft(x, dim=0),
                                                                    dim=1)), inputs((7, 6))),
    Case("fftn_real_long", lambda: FFTPart(lambda x: torch.fft.fftn(x, dim=(1, 2))),
         inputs((1, 128, 64))),
]


def nan_inputs(*shapes: tuple[int, ...]) -> MakeInputs:
    """Fresh standard-normal inputs of these shapes, each with NaNs at two places."""
    def make(gen: torch.Generator, dt: torch.dtype) -> tuple[torch.Tensor, ...]:
        xs = tuple(randn(gen, dt, *s) for s in shapes)
        for x in xs:
            flat = x.view(-1)
            flat[int(torch.randint(flat.numel(), (1,), generator=gen))] = float("nan")
            flat[flat.numel() // 2] = float("nan")
        return xs
    return make


class Residual(nn.Module):
    """act(conv(x) + x): ResNet's residual add and activation, a convolution's epilogue."""

    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.conv, self.act = nn.Conv2d(16, 16, 3, padding=1), act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(x) + x)


def _conv_act(act: Callable[[], nn.Module], k: int, stride: int = 1) -> nn.Module:
    return nn.Sequential(nn.Conv2d(16, 16, k, stride=stride, padding=k // 2), act())


#: NaN in the input, NaN out where the float64 reference has one: the ops whose fast forms
#: are a max or a min against a bound (oneDNN's relu and clip post-ops, `x > 0 ? x : 0`)
#: lose it (2026-12-05: conv + relu / relu6 and relu on cpu did)
NANS: list[Case] = [
    *(Case(f"conv{k}x{k}{'_s2' if s == 2 else ''}_{n}", lambda a=a, k=k, s=s: _conv_act(a, k, s),
           nan_inputs((1, 16, 12, 12)))
      for n, a in (("relu", nn.ReLU), ("relu6", nn.ReLU6), ("silu", nn.SiLU),
                   ("hardswish", nn.Hardswish))
      for k, s in ((1, 1), (3, 1), (3, 2))),
    Case("residual_relu", lambda: Residual(nn.ReLU()), nan_inputs((1, 16, 12, 12))),
    Case("depthwise_relu6", lambda: nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16),
                                                  nn.ReLU6()), nan_inputs((1, 16, 12, 12))),
    Case("linear_relu", lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU()),
         nan_inputs((8, 16))),
    Case("linear_gelu", lambda: nn.Sequential(nn.Linear(16, 32), nn.GELU()),
         nan_inputs((8, 16))),
    *(Case(n, lambda m=m: m(), nan_inputs((4, 16, 8))) for n, m in (
        ("relu", nn.ReLU), ("relu6", nn.ReLU6), ("hardtanh", nn.Hardtanh),
        ("leaky_relu", nn.LeakyReLU), ("elu", nn.ELU), ("softmax", lambda: nn.Softmax(-1)),
        ("layer_norm", lambda: nn.LayerNorm(8)), ("max_pool", lambda: nn.MaxPool1d(2)))),
]
