"""Tests for aotrt/exporter/histc.py: torch.histc exports (MoE routing) and matches eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import aotrt
from aotrt.exporter.histc import histc


class Hist(torch.nn.Module):
    """histc with fixed or data-derived range, as MoE routers call it."""

    def __init__(self, bins: int, lo: float, hi: float) -> None:
        super().__init__()
        self.bins, self.lo, self.hi = bins, lo, hi

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.histc(x, bins=self.bins, min=self.lo, max=self.hi)


CASES = [(8, 0.0, 7.0), (10, -1.0, 1.0), (5, 0.0, 0.0), (3, 0.5, 0.75)]


@pytest.mark.parametrize("bins,lo,hi", CASES)
def test_decomposition_equals_torch(bins: int, lo: float, hi: float) -> None:
    g = torch.Generator().manual_seed(bins)
    x = torch.randn(4, 33, generator=g)
    if lo != hi:        # with a data range torch refuses NaN (we skip it, see histc.py)
        x[0, :4] = torch.tensor([lo, hi, float("nan"), hi + 5])     # edges, NaN, outside
    torch.testing.assert_close(histc(x, bins, lo, hi), torch.histc(x, bins, lo, hi))


def test_moe_expert_counts_export_and_match() -> None:
    """Mixtral-style: counts of the selected experts, min 0, max experts - 1."""
    m = Hist(8, 0, 7).eval()
    x = torch.randint(0, 8, (16, 2)).float()
    with torch.no_grad():
        prog = aotrt.export(m, (x,))
    with aotrt.load(prog, device="cpu", check_hazards=True) as d:
        for seed in range(3):
            xs = torch.randint(0, 8, (16, 2), generator=torch.Generator().manual_seed(seed))
            xs = xs.float()
            got = np.asarray(d.run(xs.numpy())[0])
            np.testing.assert_array_equal(got, torch.histc(xs, 8, 0, 7).numpy())


def test_data_range_exports_and_matches() -> None:
    m = Hist(6, 0.0, 0.0).eval()
    with torch.no_grad():
        prog = aotrt.export(m, (torch.randn(50),))
    xs = torch.randn(50, generator=torch.Generator().manual_seed(9))
    with aotrt.load(prog, device="cpu") as d:
        got = np.asarray(d.run(xs.numpy())[0])
    np.testing.assert_array_equal(got, torch.histc(xs, 6).numpy())
