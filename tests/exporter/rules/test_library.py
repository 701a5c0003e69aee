"""Library-op rules (aotrt/exporter/rules/library.py): attention's causal mask and scale,
GEMM operand casts and weight layouts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import aotrt
from tests.conftest import DEVICES
from tests.exporter import modules as M
from tests.exporter.harness import check_module, count_ops
from tests.exporter.lowering import library_instrs
from tests.support import rel_err


class MaskedAttention(nn.Module):
    """Attention under a constant bool mask (a buffer, as GPT-2's is once folded)."""

    def __init__(self, mask: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mask", mask)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)


def _export_and_run(mask: torch.Tensor, device: str) -> tuple[dict, float]:
    gen = torch.Generator().manual_seed(0)
    qkv = [torch.randn(2, 3, 6, 8, generator=gen) for _ in range(3)]
    m = MaskedAttention(mask).eval()
    with torch.no_grad():
        prog = aotrt.export(m, tuple(qkv))
        ref = m.double()(*(t.double() for t in qkv)).numpy()
    (ins,) = library_instrs(prog, "sdpa")
    with aotrt.load(prog, device=device) as d:
        got = np.asarray(d.run(*(t.numpy() for t in qkv))[0]).astype(np.float64)
    return ins, rel_err(got, ref)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(6, 6), (1, 1, 6, 6)])
def test_constant_causal_mask_becomes_is_causal(device: str, shape: tuple[int, ...]) -> None:
    mask = torch.ones(6, 6, dtype=torch.bool).tril().expand(shape).clone()
    ins, err = _export_and_run(mask, device)
    assert ins["params"]["is_causal"] is True
    assert ins["ins"][3] is None
    assert err < 1e-4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["upper", "shifted", "one_head_differs"])
def test_other_constant_masks_stay_masks(device: str, which: str) -> None:
    mask = torch.ones(2, 3, 6, 6, dtype=torch.bool).tril()
    if which == "upper":
        mask = mask.transpose(-1, -2).clone()
    elif which == "shifted":
        mask = torch.ones(2, 3, 6, 6, dtype=torch.bool).tril(-1)
        mask[..., 0, 0] = True
    else:
        mask[1, 2, 0, 3] = True
    ins, err = _export_and_run(mask, device)
    assert ins["params"]["is_causal"] is False
    assert ins["ins"][3] is not None
    assert err < 1e-4


def test_a_mask_folded_on_cuda_is_recognised_too() -> None:
    """A module exported on cuda has its constants there: the causal check reads the mask
    on the host (bench.py's BERT and GPT-2 exports on the H200 failed with "two devices")."""
    if not torch.cuda.is_available():
        pytest.skip("torch has no cuda here")
    gen = torch.Generator().manual_seed(0)
    qkv = tuple(torch.randn(1, 2, 6, 8, generator=gen).cuda() for _ in range(3))
    for mask, causal in ((torch.ones(6, 6, dtype=torch.bool).tril(), True),
                         (torch.ones(1, 1, 6, 6, dtype=torch.bool), False)):
        with torch.no_grad():
            prog = aotrt.export(MaskedAttention(mask).cuda().eval(), qkv)
        (ins,) = library_instrs(prog, "sdpa")
        assert ins["params"]["is_causal"] is causal


class SoftmaxThenBmm(nn.Module):
    """LeViT's attention tail: softmax(q k^T) v in half precision."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.bmm(torch.bmm(q, k.transpose(1, 2)).softmax(-1), v)


@pytest.mark.parametrize("device", DEVICES)
def test_a_float32_operand_of_a_half_gemm_is_cast_first(device: str) -> None:
    """torch 2.11's capture of LeViT at fp16 on cuda fed a float32 softmax (half_to_float)
    into an fp16 bmm. Rebuilt here from a capture: the export casts the operand to fp16, as
    eager's softmax rounds, instead of refusing the program."""
    from aotrt.exporter.capture import capture
    from aotrt.exporter.lower import lower, runs_whole

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 8, generator=gen).half() for _ in range(3))
    with torch.no_grad():
        ep = capture(SoftmaxThenBmm(), (q, k, v), runs_whole=runs_whole)
    (sm,) = [n for n in ep.graph_module.graph.nodes if n.target == torch.ops.aten._softmax.default]
    sm.args = (sm.args[0], sm.args[1], True)                     # half_to_float, as on 2.11
    val = sm.meta["val"]
    sm.meta["val"] = torch.empty(tuple(val.shape), dtype=torch.float32, device="meta")
    prog = lower(ep)          # the lowering itself: a re-capture would trip on the graph
    with torch.no_grad():
        ref = SoftmaxThenBmm()(*(t.double() for t in (q, k, v))).numpy()
    with aotrt.load(prog, device=device) as d:
        got = np.asarray(d.run(*(t.numpy() for t in (q, k, v)))[0]).astype(np.float64)
    assert rel_err(got, ref) < 2e-2


class Conv1DLike(nn.Module):
    """GPT-2's Conv1D: addmm(bias, x, W) with W stored [in, out]; `shared` also reads W
    elsewhere."""

    def __init__(self, shared: bool) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 12))
        self.b = nn.Parameter(torch.randn(12))
        self.shared = shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.addmm(self.b, x, self.w) + torch.mm(x, self.w)
        return y + self.w.sum() if self.shared else y


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shared", [False, True])
def test_gemm_weights_are_stored_column_major(device: str, shared: bool) -> None:
    """A constant only GEMMs read as their [K, N] operand is stored as its transpose's bytes
    (what oneDNN reads without a reorder); one read elsewhere too keeps its layout."""
    torch.manual_seed(0)
    m = Conv1DLike(shared).eval()
    x = torch.randn(5, 8)
    with torch.no_grad():
        prog = aotrt.export(m, (x,))
        ref = m.double()(x.double()).numpy()
        m.float()
    views = [t["strides"] for t in prog.tensors
             if t["root"] == "constant" and t["sizes"] == [8, 12]]
    assert views and all(st == ([12, 1] if shared else [1, 8]) for st in views), views
    with aotrt.load(prog, device=device) as d:
        got = np.asarray(d.run(x.numpy())[0]).astype(np.float64)
    assert rel_err(got, ref) < 1e-4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["all_true", "zeros"])
def test_a_constant_mask_that_masks_nothing_is_dropped(device: str, which: str) -> None:
    """BERT without padding: an all-True bool mask (or an all-zero additive one) changes no
    score, so the program has no mask at all."""
    if which == "all_true":
        mask = torch.ones(1, 1, 6, 1, dtype=torch.bool).expand(1, 1, 6, 6)
    else:
        mask = torch.zeros(2, 3, 6, 6)
    ins, err = _export_and_run(mask, device)
    assert ins["params"]["is_causal"] is False
    assert ins["ins"][3] is None
    assert err < 1e-4


class ScaledQuery(nn.Module):
    """Whisper's attention: the q projection times (or divided by) a constant, split into
    heads by views, then sdpa with `scale`; `reuse` also returns the scaled queries."""

    def __init__(self, c: float, scale: float | None, op: str = "mul",
                 reuse: bool = False) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32)
        self.c, self.scale, self.op, self.reuse = c, scale, op, reuse

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(2, 6, 4, 8).transpose(1, 2)
        q = self.q(x) * self.c if self.op == "mul" else self.q(x) / self.c
        out = torch.nn.functional.scaled_dot_product_attention(
            heads(q), heads(self.k(x)), heads(self.v(x)), scale=self.scale)
        return (out, q) if self.reuse else out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("c,scale,op,folded", [
    (0.125, 1.0, "mul", 0.125),          # Whisper's: exact, a power of two
    (0.3, None, "mul", 0.3 / 8 ** 0.5),  # sdpa's default scale, 1/sqrt(head dim)
    (8.0, 0.5, "div", 0.5 / 8.0),
])
def test_a_query_scale_becomes_attentions_scale(device: str, dtype: torch.dtype, c: float,
                                                scale: float | None, op: str,
                                                folded: float) -> None:
    """The scaling kernel goes, sdpa takes the product of the two scales, and the result
    matches eager."""
    prog = check_module(ScaledQuery(c, scale, op), M.inputs((2, 6, 32)), dtype,
                        device=device).program
    assert "kernel" not in count_ops(prog), count_ops(prog)
    (att,) = library_instrs(prog, "sdpa")
    assert att["params"]["scale"] == pytest.approx(folded, rel=1e-12)


@pytest.mark.parametrize("c,op,reuse", [(0.125, "mul", True), (-0.125, "mul", False),
                                        (0.0, "mul", False), (-2.0, "div", False)])
def test_a_query_scale_stays_where_it_cannot_fold(c: float, op: str, reuse: bool) -> None:
    """Scaled queries that something else reads, and a scale that is not positive (the
    fused attention's scale is applied to scores), keep their multiply."""
    prog = check_module(ScaledQuery(c, 1.0, op, reuse=reuse), M.inputs((2, 6, 32)),
                        torch.float32).program
    assert count_ops(prog).get("kernel", 0) >= 1
    (att,) = library_instrs(prog, "sdpa")
    assert att["params"]["scale"] == 1.0
