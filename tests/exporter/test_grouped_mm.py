"""Tests for aotrt/exporter/grouped_mm.py: grouped products (mixture-of-experts layers) export,
compute only the routed rows, and match eager; forms it does not cover are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import aotrt
from aotrt.errors import Unsupported
from aotrt.exporter.grouped_mm import grouped_mm

#: cumulative group ends over 12 rows: even, empty groups, rows past the last end, one group
OFFS = [[3, 6, 9, 12], [0, 5, 5, 12], [2, 4, 7, 9], [12, 12, 12, 12], [0, 0, 0, 0]]


def _inputs(seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(12, 16, generator=g).to(dtype), torch.randn(4, 16, 8, generator=g).to(dtype)


def _reference(x: torch.Tensor, w: torch.Tensor, offs: list[int]) -> torch.Tensor:
    """Each group's rows times its matrix, in float64; rows past the last end are zero."""
    out = torch.zeros(x.shape[0], w.shape[2], dtype=torch.float64)
    start = 0
    for e, end in enumerate(offs):
        out[start:end] = x[start:end].double() @ w[e].double()
        start = end
    return out


@pytest.mark.parametrize("offs", OFFS)
def test_decomposition_equals_grouped_gemm(offs: list[int]) -> None:
    x, w = _inputs(1, torch.float32)
    o = torch.tensor(offs, dtype=torch.int32)
    got = grouped_mm(x, w, o)
    torch.testing.assert_close(got.double(), _reference(x, w, offs), rtol=1e-5, atol=1e-5)
    xb, wb = x.bfloat16(), w.bfloat16()
    n = offs[-1]    # torch leaves the rows past the last end undefined
    torch.testing.assert_close(grouped_mm(xb, wb, o)[:n], torch._grouped_mm(xb, wb, offs=o)[:n])


def test_batched_form_equals_torch() -> None:
    x = torch.randn(4, 5, 16).bfloat16()
    w = _inputs(5, torch.bfloat16)[1]
    torch.testing.assert_close(grouped_mm(x, w), torch._grouped_mm(x, w))


def test_transformers_fallback_op_equals_decomposition() -> None:
    pytest.importorskip("transformers.integrations.moe")
    x, w = _inputs(2, torch.float32)
    for offs in OFFS:
        o = torch.tensor(offs, dtype=torch.int32)
        ref = torch.ops.transformers.grouped_mm_fallback(x, w, o)
        torch.testing.assert_close(grouped_mm(x, w, o), ref)


class Grouped(torch.nn.Module):
    """x @ w[group] with the groups' ends an input, as transformers' experts call it."""

    def __init__(self, dtype: torch.dtype, fallback: bool = False) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(_inputs(3, dtype)[1])
        self.fallback = fallback

    def forward(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        if self.fallback:
            return torch.ops.transformers.grouped_mm_fallback(x, self.w, offs)
        return F.grouped_mm(x, self.w, offs=offs)


def _run_offsets(m: Grouped, dtype: torch.dtype) -> None:
    x = _inputs(4, dtype)[0]
    with torch.no_grad():
        prog = aotrt.export(m, (x, torch.tensor(OFFS[0], dtype=torch.int32)))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    with aotrt.load(prog, device="cpu", check_hazards=True) as d:
        for offs in OFFS:
            o = torch.tensor(offs, dtype=torch.int32)
            got = np.asarray(d.run(x, o.numpy())[0]).astype(np.float64)
            ref = _reference(x, m.w.detach(), offs).numpy()
            np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


def test_aten_grouped_mm_exports_and_matches() -> None:
    """torch._grouped_mm (F.grouped_mm; export takes it for bfloat16 only) with data offsets."""
    _run_offsets(Grouped(torch.bfloat16).eval(), torch.bfloat16)


def test_transformers_fallback_op_exports_and_matches() -> None:
    """transformers::grouped_mm_fallback, what export of the default experts meets in float32."""
    pytest.importorskip("transformers.integrations.moe")
    _run_offsets(Grouped(torch.float32, fallback=True).eval(), torch.float32)


def _moe_block(kind: str) -> torch.nn.Module:
    """A sparse MoE block with transformers' default (grouped_mm) experts, 4 experts, top-2."""
    transformers = pytest.importorskip("transformers")
    if kind == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
        cfg = transformers.MixtralConfig(hidden_size=32, intermediate_size=48,
                                         num_local_experts=4, num_experts_per_tok=2)
        block = MixtralSparseMoeBlock
    else:
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
        cfg = transformers.Qwen2MoeConfig(hidden_size=32, moe_intermediate_size=24,
                                          shared_expert_intermediate_size=40, num_experts=4,
                                          num_experts_per_tok=2)
        block = Qwen2MoeSparseMoeBlock
    cfg._experts_implementation = "grouped_mm"  # what from_config/from_pretrained pick
    torch.manual_seed(0)
    m = block(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.3)
    return m


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_moe_block_default_experts_export_and_match(kind: str) -> None:
    """Router, top-k, sort by expert, histc, the grouped products and the un-permute, against
    eager float32 (torch's grouped GEMM has no float64 kernel for a float64 reference)."""
    m = _moe_block(kind)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        prog = aotrt.export(m, (torch.randn(2, 8, 32, generator=gen),))
        with aotrt.load(prog, device="cpu", check_hazards=True) as d:
            for _ in range(2):
                x = torch.randn(2, 8, 32, generator=gen)
                got = np.asarray(d.run(x)[0])
                np.testing.assert_allclose(got, m(x).numpy(), rtol=1e-4, atol=1e-4)
    # Only the routed rows are multiplied, and the weights the 32 (token, expert) pairs
    # gather (32 x K x N floats, 144 KiB and more here) are never materialized.
    experts, n, k = m.experts.gate_up_proj.shape
    gathered = 2 * 8 * 2 * k * n * 4
    assert prog.arena_nbytes < gathered // 2, \
        f"arena {prog.arena_nbytes} bytes: the expert weights were gathered"


def test_other_grouped_mm_forms_are_refused() -> None:
    """2-D by 2-D grouped over K (the weight gradient's form) is not decomposed: refused."""

    class KGrouped(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
            return F.grouped_mm(a, b, offs=offs)

    a = torch.randn(16, 8).bfloat16().t()     # the layout torch's grouped GEMM asks for
    b = torch.randn(16, 8).bfloat16()
    offs = torch.tensor([4, 8, 16], dtype=torch.int32)
    with pytest.raises(Unsupported, match="_grouped_mm"):
        aotrt.export(KGrouped(), (a, b, offs))


def test_decomposed_in_the_first_pass(caplog: pytest.LogCaptureFixture) -> None:
    """Our decompositions join the core-ATen pass: no further round retraces the program."""
    from aotrt.exporter.capture import capture
    from aotrt.exporter.lower import runs_whole

    m = Grouped(torch.bfloat16).eval()
    x = _inputs(6, torch.bfloat16)[0]
    with caplog.at_level("DEBUG", logger="aotrt.exporter.capture"), torch.no_grad():
        ep = capture(m, (x, torch.tensor(OFFS[0], dtype=torch.int32)), runs_whole=runs_whole)
    assert "decomposing with our own too: ['aten._grouped_mm.default']" in caplog.text
    assert "decomposing further" not in caplog.text
    assert not [n for n in ep.graph.nodes if "grouped_mm" in str(n.target)]
