"""Tests for aotrt/exporter/layout.py: channels-last export of convolution networks, and
attention results laid out with their heads merged."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import aotrt
from aotrt.errors import InvalidArgument
from aotrt.exporter import layout
from aotrt.runtime.device import cuda_available
from tests.conftest import DEVICES
from tests.exporter import modules as M
from tests.exporter.harness import check_module, count_ops
from tests.exporter.lowering import library_instrs
from tests.support import rel_err


class Block(nn.Module):
    """conv-bn-relu, a depthwise conv, a residual add, max pooling, then a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        y = self.pool(y + self.dw(y))
        return self.head(y.flatten(1))


def _model() -> nn.Module:
    torch.manual_seed(0)
    m = Block().eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 1.5)
    return m


def _matches_eager(prog: aotrt.Program, m: nn.Module, shape: tuple[int, ...], device: str,
                   seeds: tuple[int, ...]) -> None:
    """The program, under the hazard checker, against float64 eager on fresh inputs."""
    with aotrt.load(prog, device=device, check_hazards=True) as d:
        for seed in seeds:
            xs = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
            with torch.no_grad():
                ref = m.double()(xs.double()).numpy()
                m.float()
            got = np.asarray(d.run(xs.numpy())[0]).astype(np.float64)
            assert rel_err(got, ref) < 1e-4


def _nhwc_tensors(prog: aotrt.Program) -> int:
    """How many 4-D arena tensors with more than one channel have the channel innermost."""
    return sum(1 for t in prog.tensors if t["root"] == "arena" and len(t["sizes"]) == 4
               and t["sizes"][1] > 1 and t["strides"][1] == 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["channels_last", "contiguous"])
def test_layouts_match_eager(which: str, device: str) -> None:
    m = _model()
    x = torch.randn(2, 3, 8, 8)
    before = [p.stride() for p in m.parameters()]
    with torch.no_grad():
        prog = aotrt.export(m, (x,), layout=which)
    assert [p.stride() for p in m.parameters()] == before     # the caller's module is kept
    assert prog.inputs[0]["strides"] == [192, 64, 8, 1]          # inputs stay as given
    if which == "channels_last":
        assert _nhwc_tensors(prog) >= 3
    else:
        assert _nhwc_tensors(prog) == 0
    _matches_eager(prog, m, (2, 3, 8, 8), device, seeds=(0, 1))


def test_auto_follows_the_default_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from aotrt.runtime.device import get_device

    m = _model()
    cpu = get_device("cpu")
    for dtype in ("float32", "bfloat16"):                 # oneDNN's NHWC convolutions
        assert cpu.prefers_channels_last(dtype) == (cpu.libraries.dnnl is not None)
    monkeypatch.setattr(layout, "auto_channels_last", lambda model: False)
    assert layout.for_layout(m, "auto") == (m, False)
    monkeypatch.setattr(layout, "auto_channels_last", lambda model: True)
    cl, lower_cl = layout.for_layout(m, "auto")
    assert lower_cl and cl is not m
    assert cl.conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert m.conv.weight.is_contiguous()                 # the caller's module is kept
    lin = nn.Linear(2, 2)
    assert layout.for_layout(lin, "contiguous") == (lin, False)


def test_lowering_lays_out_nhwc_whatever_torch_propagated() -> None:
    """torch 2.11 on cuda traced channels-last modules with NCHW activations; simulate that
    with a row-major capture: the lowering's pass still makes the activations NHWC."""
    from aotrt.exporter.capture import capture
    from aotrt.exporter.lower import lower, runs_whole

    m = _model()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        ep = capture(m, (x,), runs_whole=runs_whole)
        plain = lower(ep, "plain")
        ep = capture(m, (x,), runs_whole=runs_whole)
        prog = lower(ep, "nhwc", channels_last=True)
    assert _nhwc_tensors(plain) == 0 and _nhwc_tensors(prog) >= 3
    convs = [i for i in prog.instructions if i.get("fn") == "convolution"]
    assert all(prog.tensors[i["outs"][0]]["strides"][1] == 1 for i in convs)
    _matches_eager(prog, m, (2, 3, 8, 8), "cpu", seeds=(5,))


class Split(nn.Module):
    """YOLOv8's C2f: a convolution's two channel halves, one through a bottleneck, are
    concatenated with it and read by a 1x1 convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.cv1 = nn.Conv2d(3, 8, 1)
        self.m = nn.Conv2d(4, 4, 3, padding=1)
        self.cv2 = nn.Conv2d(12, 6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.cv1(x).chunk(2, 1)
        return self.cv2(torch.cat([a, b, torch.relu(self.m(b))], 1))


def _breaks(prog: aotrt.Program) -> int:
    """Instructions that read or write 4-D activations in both NCHW and NHWC."""
    n = 0
    for ins in prog.instructions:
        four = [prog.tensors[t] for t in list(ins.get("ins", [])) + list(ins.get("outs", []))
                if isinstance(t, int) and len(prog.tensors[t]["sizes"]) == 4
                and prog.tensors[t]["sizes"][1] > 1 and prog.tensors[t]["root"] == "arena"]
        n += len({t["strides"][1] == 1 for t in four}) > 1
    return n


def test_concatenations_of_channels_last_activations_stay_channels_last() -> None:
    """With a row-major capture (torch 2.11 on cuda), the concatenation becomes NHWC too, so
    the convolution that reads it gets no NCHW input (YOLOv8n: 28 such breaks before)."""
    from aotrt.exporter.capture import capture
    from aotrt.exporter.lower import lower, runs_whole

    torch.manual_seed(0)
    m = Split().eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        ep = capture(m, (x,), runs_whole=runs_whole)
        prog = lower(ep, "split", channels_last=True)
    convs = [i for i in prog.instructions if i.get("fn") == "convolution"]
    assert len(convs) == 3
    assert all(prog.tensors[i["outs"][0]]["strides"][1] == 1 for i in convs)
    assert all(prog.tensors[i["ins"][0]]["strides"][1] == 1 for i in convs[1:])
    assert _breaks(prog) == 0
    _matches_eager(prog, m, (2, 3, 8, 8), "cpu", seeds=(3, 4))


def test_propagation_stops_at_views_and_reductions() -> None:
    """Only convolutions and what elementwise ops or pooling compute from them change."""
    from aotrt.exporter.capture import capture
    from aotrt.exporter.lower import runs_whole
    from aotrt.exporter.nodes import is_pointwise

    with torch.no_grad():
        ep = capture(_model(), (torch.randn(2, 3, 8, 8),), runs_whole=runs_whole)
    n = layout.propagate_channels_last(ep.graph, is_pointwise)
    assert n >= 4
    for node in ep.graph.nodes:
        v = node.meta.get("val")
        if not isinstance(v, torch.Tensor) or v.dim() != 4 or node.op != "call_function":
            continue
        nhwc = v.stride()[1] == 1 and v.shape[1] > 1
        if node.target is torch.ops.aten.convolution.default:
            assert nhwc, node
        if node.target in (torch.ops.aten.view.default, torch.ops.aten.mean.dim):
            assert not nhwc, node


def test_auto_needs_a_conv2d_and_a_device_that_prefers_it() -> None:
    assert layout.has_conv(_model()) and not layout.has_conv(nn.Linear(2, 2))
    assert not layout.auto_channels_last(nn.Linear(2, 2))


def test_auto_asks_the_default_device_in_the_model_dtype(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """cuda prefers channels-last for half types only: its float32 engines are NCHW."""
    from aotrt.runtime import device as device_mod

    asked: list[str] = []

    class Halves:
        def prefers_channels_last(self, dtype: str) -> bool:
            asked.append(dtype)
            return dtype in ("float16", "bfloat16")

    monkeypatch.setattr(device_mod, "get_device", lambda name: Halves())
    assert layout.model_dtype(_model()) == "float32"
    assert not layout.auto_channels_last(_model())
    assert layout.auto_channels_last(_model().half())
    assert layout.model_dtype(_model().bfloat16()) == "bfloat16"
    assert asked == ["float32", "float16"]
    assert layout.model_dtype(nn.ReLU()) == "float32"          # nothing to go by


# DEVICES holds a pytest.param for cuda, never the string: the test asks the device itself.
@pytest.mark.cuda
@pytest.mark.skipif(not cuda_available(), reason="no CUDA device here")
def test_cuda_prefers_channels_last_in_half_types_only() -> None:
    from aotrt.runtime.device import get_device

    cuda = get_device("cuda")
    assert cuda.prefers_channels_last("float16") and cuda.prefers_channels_last("bfloat16")
    assert not cuda.prefers_channels_last("float32")


def test_unknown_layout_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="layout: expected one of"):
        aotrt.export(_model(), (torch.randn(1, 3, 8, 8),), layout="nhwc")


def test_propagation_crosses_ops_torch_does_not_tag_pointwise() -> None:
    """hardswish and a dtype cast carry no pointwise tag in torch; from a row-major capture
    (what torch 2.11 on cuda gave), NHWC must still flow through them to the next conv."""
    from aotrt.exporter.capture import capture
    from aotrt.exporter.lower import lower, runs_whole

    class Hs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(3, 8, 3, padding=1)
            self.b = nn.Conv2d(8, 8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = nn.functional.hardswish(self.a(x))
            return self.b(y.half().float())

    torch.manual_seed(0)
    m = Hs().eval()
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        prog = lower(capture(m, (x,), runs_whole=runs_whole), "hs", channels_last=True)
        ref = m(x).double().numpy()     # eager fp32: the model rounds through fp16 itself
    convs = [i for i in prog.instructions if i.get("fn") == "convolution"]
    assert [prog.tensors[c["ins"][0]]["strides"][1] for c in convs] == [64, 1]
    with aotrt.load(prog, device="cpu") as d:
        got = np.asarray(d.run(x.numpy())[0]).astype(np.float64)
    assert rel_err(got, ref) < 1e-4


def test_channels_last_keeps_5d_parameters_as_they_are() -> None:
    """Module.to(memory_format=channels_last) refuses a 5-D parameter (timm's lambda layers);
    the export lays out the 4-D ones and leaves the rest."""

    class WithFive(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.pos = nn.Parameter(torch.randn(1, 1, 4, 1, 1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (self.conv(x).unsqueeze(2) * self.pos).sum(2)

    torch.manual_seed(0)
    m = WithFive().eval()
    x = torch.randn(1, 3, 6, 6)
    with torch.no_grad():
        prog = aotrt.export(m, (x,), layout="channels_last")
        ref = m.double()(x.double()).numpy()
        m.float()
    assert _nhwc_tensors(prog) >= 1
    with aotrt.load(prog, device="cpu") as d:
        got = np.asarray(d.run(x.numpy())[0]).astype(np.float64)
    assert rel_err(got, ref) < 1e-5


class PermutedResidual(nn.Module):
    """Whisper's encoder front: a conv1d whose output is permuted to (B, T, C), then
    residual adds, each read by a LayerNorm over C (and a softmax over the last dim)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(8, 16, 3, padding=1)
        self.pos = nn.Parameter(torch.randn(12, 16))
        self.ln1, self.ln2 = nn.LayerNorm(16), nn.LayerNorm(16)
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x).permute(0, 2, 1) + self.pos
        h = h + self.fc(self.ln1(h))
        return self.ln2(h) + torch.softmax(h * 2.0, -1)


@pytest.mark.parametrize("device", DEVICES)
def test_rows_a_layer_norm_reduces_are_laid_out_row_major(device: str) -> None:
    """The permuted residual stream is stored (B, T, C) row-major, so each LayerNorm reads
    its rows contiguously; the result still matches eager."""
    torch.manual_seed(0)
    m = PermutedResidual().eval()
    x = torch.randn(2, 8, 12)
    with torch.no_grad():
        prog = aotrt.export(m, (x,))
    assert [k for k in prog.kernels if "layer_norm" in k.name]
    strides = [t["strides"] for t in prog.tensors
               if t["root"] == "arena" and t["sizes"] == [2, 12, 16]]
    # the two residual sums row-major; only the convolution's output is read permuted
    assert strides.count([192, 16, 1]) >= 2 and strides.count([192, 1, 12]) <= 1, strides
    _matches_eager(prog, m, (2, 8, 12), device, seeds=(1,))


def test_row_major_pass_leaves_program_outputs_and_other_dims_alone() -> None:
    """A permuted elementwise result that is a program output, or that a softmax reduces
    over another dim, keeps torch's layout."""
    from aotrt.exporter.capture import capture
    from aotrt.exporter.lower import runs_whole
    from aotrt.exporter.nodes import is_pointwise

    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            a = x.permute(0, 2, 1) * 2.0
            b = x.permute(0, 2, 1) + 1.0
            return a, torch.softmax(b, 1)

    with torch.no_grad():
        ep = capture(M(), (torch.randn(2, 3, 4),), runs_whole=runs_whole)
    assert layout.row_major_for_row_reductions(ep.graph_module.graph, is_pointwise) == 0


class AudioStem(nn.Module):
    """Whisper's encoder stem: two 1-D convolutions with GELU, the permute to tokens, a
    position embedding and a LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(8, 16, 3, padding=1)
        self.conv2 = nn.Conv1d(16, 16, 3, stride=2, padding=1)
        self.pos = nn.Parameter(torch.randn(12, 16))
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.gelu(self.conv2(nn.functional.gelu(self.conv1(x))))
        return self.norm(y.permute(0, 2, 1) + self.pos)


@pytest.mark.parametrize("device", DEVICES)
def test_conv1d_activations_are_channels_last_and_the_token_permute_is_free(
        device: str) -> None:
    """1-D convolutions write (N, L, C): their weights are stored (K, S, C), no copy moves
    the result into token order, and the program matches eager."""
    torch.manual_seed(0)
    m = AudioStem().eval()
    x = torch.randn(2, 8, 24)
    with torch.no_grad():
        plain = aotrt.export(m, (x,), layout="contiguous")
        prog = aotrt.export(m, (x,), layout="channels_last")
    assert m.conv1.weight.is_contiguous()                     # the caller's module is kept
    convs = [i for i in prog.instructions if i.get("fn") == "convolution"]
    assert len(convs) == 2
    for ins in convs:
        out = prog.tensors[ins["outs"][0]]
        assert out["strides"][1] == 1, out                    # (N, C, L) stored N, L, C
        w = prog.tensors[ins["ins"][1]]
        assert w["strides"][1] == 1, w                        # (K, S, C) weights
    assert layout.has_conv(m)

    def copies(p: aotrt.Program) -> int:
        return sum(1 for i in p.instructions if i["op"] == "copy")
    assert copies(prog) <= copies(plain)
    _matches_eager(prog, m, (2, 8, 24), device, seeds=(0, 1))


class HeadMerge(nn.Module):
    """Attention whose result is merged back to (B, L, H*D) before a projection, as Hugging
    Face writes it: `same_shape_view` first reshapes to the same shape (Whisper), `also`
    reads the attention result as it is too."""

    def __init__(self, same_shape_view: bool = False, also: bool = False) -> None:
        super().__init__()
        self.proj = nn.Linear(32, 32)
        self.same_shape_view, self.also = same_shape_view, also

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        b, h, l_, d = a.shape
        m = a.reshape(b, h, l_, d) if self.same_shape_view else a
        out = self.proj(m.transpose(1, 2).contiguous().reshape(b, l_, h * d))
        return (out, a * 2.0) if self.also else out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("batch,same_shape_view", [(1, True), (3, False)])
def test_attention_writes_heads_merged(device: str, dtype: torch.dtype, batch: int,
                                       same_shape_view: bool) -> None:
    """The attention result is laid out (B, L, H, D), so the merge copy is gone and the
    projection reads it in place; the output matches eager."""
    shapes = [(batch, 4, 6, 8)] * 3
    prog = check_module(HeadMerge(same_shape_view), M.inputs(*shapes), dtype,
                        device=device).program
    assert count_ops(prog) == {"library:sdpa": 1, "library:linear": 1}, count_ops(prog)
    (att,) = library_instrs(prog, "sdpa")
    assert prog.tensors[att["outs"][0]]["strides"] == [6 * 4 * 8, 8, 4 * 8, 1]


def test_an_attention_result_read_as_it_is_keeps_its_layout() -> None:
    """Another reader of the (B, H, L, D) result: it stays row-major and the merge copies."""
    prog = check_module(HeadMerge(also=True), M.inputs(*[(2, 4, 6, 8)] * 3),
                        torch.float32).program
    (att,) = library_instrs(prog, "sdpa")
    assert prog.tensors[att["outs"][0]]["strides"] == [4 * 6 * 8, 6 * 8, 8, 1]
    assert count_ops(prog).get("copy", 0) + count_ops(prog).get("kernel", 0) >= 2
