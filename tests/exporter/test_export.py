"""aotrt/exporter/__init__.py (aotrt.export): from an nn.Module or from a
torch.export.ExportedProgram, including one read back from a .pt2 file."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import aotrt
from aotrt.errors import InvalidArgument, Unsupported
from tests.exporter.harness import rel_err


class Net(nn.Module):
    """conv-bn-relu, a layer norm, a pooled linear head: decompositions and kept ops."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.bn(self.conv(x)))
        z = self.norm(y.mean((2, 3)))
        return self.head(z), torch.nn.functional.gelu(y).amax(1)


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    m = Net().eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 1.5)
    return m


def _check(prog: aotrt.Program, model: nn.Module, seed: int, runs: int = 2) -> None:
    """Run `prog` on the cpu on fresh random inputs and compare with eager in float64."""
    gen = torch.Generator().manual_seed(seed)
    ref_model = _copy_double(model)
    with aotrt.load(prog, device="cpu", check_hazards=True) as m:
        for _ in range(runs):
            x = torch.randn(2, 3, 6, 6, generator=gen)
            outs = m.run(x.numpy())
            with torch.no_grad():
                refs = ref_model(x.double())
            assert len(outs) == len(refs)
            for o, r in zip(outs, refs):
                assert rel_err(np.asarray(o), r.numpy()) < 1e-4


def _copy_double(model: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(model).double()


def _example() -> tuple[torch.Tensor]:
    return (torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(99)),)


def test_export_of_a_module_matches_eager() -> None:
    model = _model()
    _check(aotrt.export(model, _example()), model, seed=1)


def test_export_of_an_exported_program_matches_eager() -> None:
    model = _model(seed=3)
    ep = torch.export.export(model, _example())
    prog = aotrt.export(ep)                 # no example inputs needed
    assert prog.inputs[0]["shape"] == [2, 3, 6, 6]
    _check(prog, model, seed=2)


def test_export_of_a_pt2_file_matches_eager(tmp_path: Path) -> None:
    model = _model(seed=4)
    torch.export.save(torch.export.export(model, _example()), tmp_path / "m.pt2")
    prog = aotrt.export(torch.export.load(tmp_path / "m.pt2"), name="m")
    assert prog.provenance["module"] == "m"
    _check(prog, model, seed=5)


def test_the_callers_exported_program_is_left_alone() -> None:
    model = _model()
    ep = torch.export.export(model, _example())
    before = [(n.op, str(n.target)) for n in ep.graph.nodes]
    aotrt.export(ep)
    assert [(n.op, str(n.target)) for n in ep.graph.nodes] == before
    # It still runs as torch runs it.
    x = _example()[0]
    with torch.no_grad():
        for a, b in zip(ep.module()(x), model(x)):
            assert torch.allclose(a, b)


def test_exported_program_example_inputs_must_match() -> None:
    ep = torch.export.export(_model(), _example())
    aotrt.export(ep, _example())           # matching: accepted
    with pytest.raises(InvalidArgument, match=r"example_inputs\[0\]"):
        aotrt.export(ep, (torch.randn(1, 3, 6, 6),))
    with pytest.raises(InvalidArgument, match=r"example_inputs\[0\]"):
        aotrt.export(ep, (torch.randn(2, 3, 6, 6, dtype=torch.float64),))
    with pytest.raises(InvalidArgument, match="2 tensor"):
        aotrt.export(ep, (torch.randn(2, 3, 6, 6), torch.randn(2)))


def test_exported_program_layouts() -> None:
    """An ExportedProgram is not converted: channels_last is refused, auto is contiguous."""
    ep = torch.export.export(_model(), _example())
    with pytest.raises(InvalidArgument, match="channels_last"):
        aotrt.export(ep, layout="channels_last")
    with pytest.raises(InvalidArgument, match="layout"):
        aotrt.export(ep, layout="nhwc")
    for layout in ("auto", "contiguous"):
        prog = aotrt.export(ep, layout=layout)
        convs = [i for i in prog.instructions if i.get("fn") == "convolution"]
        assert convs
        for c in convs:
            sizes = prog.tensors[c["outs"][0]]["sizes"]
            strides = prog.tensors[c["outs"][0]]["strides"]
            assert strides[-1] == 1 and strides[1] == sizes[2] * sizes[3], layout


def test_a_dynamic_exported_program_is_unsupported() -> None:
    batch = torch.export.Dim("batch", min=2, max=8)
    ep = torch.export.export(_model(), _example(), dynamic_shapes=({0: batch},))
    with pytest.raises(Unsupported):
        aotrt.export(ep)


def test_a_module_still_needs_example_inputs() -> None:
    with pytest.raises(InvalidArgument, match="example_inputs"):
        aotrt.export(_model())
    with pytest.raises(InvalidArgument, match="model"):
        aotrt.export("not a model", _example())


def test_export_reports_its_steps_as_progress(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="aotrt.progress"):
        aotrt.export(_model(), _example(), name="net")
    steps = [r.getMessage() for r in caplog.records if r.name == "aotrt.progress"]
    assert steps[0] == "capturing net ..." and steps[1].startswith("capturing net: ")
    assert steps[2] == "lowering net ..." and steps[3].startswith("lowering net: ")
