"""aotrt.exporter.fft: real/imaginary parts of FFTs of real tensors become DFT matrix products
(numerics are in test_modules.py's test_fft_parts); other complex uses stay refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import aotrt
from aotrt.exporter.capture import capture
from aotrt.exporter.lower import runs_whole
from tests.exporter import modules as M

aten = torch.ops.aten


@pytest.mark.parametrize("case", M.FFTS, ids=lambda c: c.name)
def test_no_complex_value_is_left(case: M.Case) -> None:
    """After capture no node is complex and no FFT op is left."""
    ep = capture(case.build().eval(), case.make_inputs(torch.Generator(), torch.float32),
                 runs_whole=runs_whole)
    for node in ep.graph.nodes:
        v = node.meta.get("val")
        assert not (isinstance(v, torch.Tensor) and v.is_complex()), node.format_node()
        assert node.target not in (aten._fft_c2c.default, aten._fft_r2c.default,
                                   aten.view_as_real.default), node.format_node()


class WholeComplex(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.view_as_real(torch.fft.fft(x * 2))


class Magnitude(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fft.fft(x).abs()


@pytest.mark.parametrize("model", [WholeComplex, Magnitude])
def test_other_complex_uses_are_refused(model: type[nn.Module]) -> None:
    """A complex result used other than by taking a part is refused, naming complex64."""
    with pytest.raises(aotrt.Unsupported, match="complex64"):
        with torch.no_grad():
            aotrt.export(model(), (torch.randn(3, 8),))
