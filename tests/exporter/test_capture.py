"""aotrt/exporter/capture.py: torch.export plus decomposition to core ATen, the ops kept
whole, our own avg_pool2d decomposition, further decomposition, and the refusals."""

from __future__ import annotations

import itertools
import operator
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import aotrt
from aotrt.errors import InvalidArgument, Unsupported
from aotrt.exporter import capture as cap
from aotrt.exporter.capture import KEPT_OPS, capture, decomposition_table
from aotrt.exporter.lower import runs_whole
from tests.exporter import modules as M
from tests.exporter.harness import check_module, rel_err

aten = torch.ops.aten


class Mixed(nn.Module):
    """Kept ops (linear, layer_norm, sdpa) beside ops that decompose (silu, addcmul, var)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.norm(self.lin(x)).view(2, 4, 4, 4).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, q, q).transpose(1, 2).reshape(2, 4, 16)
        b = torch.addcmul(x, a, F.silu(a), value=0.5)
        return b * x.var(-1, keepdim=True)


def _x(seed: int = 0) -> torch.Tensor:
    return torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(seed))


def _targets(ep: torch.export.ExportedProgram) -> set[Any]:
    return {n.target for n in ep.graph.nodes if n.op == "call_function"}


def test_decomposition_table_leaves_out_the_kept_ops() -> None:
    table = cap.decomposition_table()
    for op in cap.KEPT_OPS:
        assert op not in table
    assert aten.addcmul.default in table or aten.silu.default in table
    assert table is not cap.decomposition_table()    # a fresh copy each time


def test_capture_is_core_aten_plus_the_kept_ops_and_matches_eager() -> None:
    torch.manual_seed(0)
    model = Mixed().eval()
    ep = cap.capture(model, (_x(),))
    targets = _targets(ep)
    for op in cap.KEPT_OPS:
        assert op in targets, op
    for t in targets:
        if t is operator.getitem or t in cap.KEPT_OPS:
            continue
        assert torch.Tag.core in t.tags, t
    for seed in (1, 2):
        x = _x(seed)
        with torch.no_grad():
            assert rel_err(ep.module()(x).numpy(), model(x).numpy()) < 1e-5


def test_a_lone_tensor_is_one_example_argument() -> None:
    ep = cap.capture(nn.Linear(16, 3).eval(), _x())
    assert [tuple(n.meta["val"].shape) for n in ep.graph.nodes
            if n.op == "placeholder" and n.name in ep.graph_signature.user_inputs] == \
        [(2, 4, 16)]


def test_an_exported_program_is_decomposed_not_exported_again() -> None:
    torch.manual_seed(1)
    model = Mixed().eval()
    ep = torch.export.export(model, (_x(),))
    assert aten.silu.default in _targets(ep)           # not yet core: silu is decomposed
    out = cap.capture(ep, None)
    assert out is not ep and aten.silu.default not in _targets(out)
    assert aten.silu.default in _targets(ep)           # the caller's is unchanged
    x = _x(3)
    with torch.no_grad():
        assert rel_err(out.module()(x).numpy(), model(x).numpy()) < 1e-5


def test_check_inputs_compares_count_shape_and_dtype() -> None:
    ep = torch.export.export(nn.Linear(16, 3).eval(), (_x(),))
    cap.check_inputs(ep, (_x(1),))
    cap.check_inputs(ep, _x(1))
    for bad, match in (((), "0 tensor"), ((_x(), _x()), "2 tensor"),
                       ((torch.randn(3, 16),), r"\[0\]"), ((_x().half(),), "float16"),
                       ({"x": _x()}, "tuple")):
        with pytest.raises(InvalidArgument, match=match):
            cap.check_inputs(ep, bad)


def test_refusals() -> None:
    with pytest.raises(InvalidArgument, match="torch.nn.Module"):
        cap.capture(lambda x: x, (_x(),))
    with pytest.raises(InvalidArgument, match="example_inputs"):
        cap.capture(nn.ReLU(), {"x": _x()})
    with pytest.raises(InvalidArgument, match="example_inputs"):
        cap.capture(nn.ReLU(), None)

    class DataDependent(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[x > 0].sum() if x.sum() > 0 else x     # a branch on data

    with pytest.raises(Unsupported, match="torch.export could not capture DataDependent"):
        cap.capture(DataDependent(), (_x(),), strict=False)


@pytest.mark.parametrize("size,k,s,p,ceil", [
    (n, k, s, p, c) for n, k, s, p, c in itertools.product((5, 6, 7, 17), (1, 2, 3), (1, 2, 3),
                                                        (0, 1), (False, True))
    if p <= k // 2])
def test_pool_out_size_is_atens(size: int, k: int, s: int, p: int, ceil: bool) -> None:
    x = torch.zeros(1, 1, size, size)
    want = F.avg_pool2d(x, k, s, p, ceil_mode=ceil).shape[-1]
    assert cap._pool_out_size(size, k, s, p, ceil) == want


@pytest.mark.parametrize("k,s,p,ceil,include,divisor", [
    ((3, 3), (2, 2), (1, 1), False, True, None),
    ((3, 3), (2, 2), (1, 1), False, False, None),
    ((3, 2), (2, 1), (1, 0), True, True, None),
    ((3, 3), (2, 2), (1, 1), True, False, None),
    ((2, 2), (2, 2), (0, 0), True, True, None),
    ((3, 3), (1, 1), (1, 1), False, True, 5),
    ((17, 17), (1, 1), (8, 8), False, False, None),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_avg_pool2d_decomposition_matches_aten(k: Any, s: Any, p: Any, ceil: bool,
                                               include: bool, divisor: int | None,
                                               dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, 3, 19, 18, generator=gen).to(dtype)
    got = cap._avg_pool2d(x, k, s, p, ceil, include, divisor)
    want = aten.avg_pool2d(x, k, s, p, ceil, include, divisor)
    assert got.shape == want.shape and got.dtype == want.dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert rel_err(got.float().numpy(), want.float().numpy()) < tol
    # The 3-D (unbatched) form too.
    got3 = cap._avg_pool2d(x[0], k, s, p, ceil, include, divisor)
    assert rel_err(got3.float().numpy(), want[0].float().numpy()) < tol


def test_avg_pool2d_declines_other_ranks() -> None:
    assert cap._avg_pool2d(torch.randn(4, 4), 2) is NotImplemented


def test_decompose_unsupported_removes_what_the_lowering_refuses() -> None:
    class Pools(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.avg_pool2d(x, 3, 2, 1, ceil_mode=True) + 1.0

    ep = cap.capture(Pools(), (torch.randn(1, 2, 9, 9),))
    assert aten.avg_pool2d.default in _targets(ep)

    def refuses_avg_pool(node: torch.fx.Node) -> bool:
        return node.target is not aten.avg_pool2d.default

    out = cap.decompose_unsupported(ep, refuses_avg_pool)
    assert aten.avg_pool2d.default not in _targets(out)
    assert aten.convolution.default in _targets(out)
    x = torch.randn(1, 2, 9, 9, generator=torch.Generator().manual_seed(8))
    assert rel_err(out.module()(x).numpy(), Pools()(x).numpy()) < 1e-5
    # An op without a decomposition (the convolution, after the first round) stays, for
    # the lowering to name.
    kept = cap.decompose_unsupported(ep, lambda n: n.target not in (aten.avg_pool2d.default,
                                                                    aten.convolution.default))
    assert aten.convolution.default in _targets(kept)


# -- moved from the old test_lower.py --------------------------------------------------------

def test_decomposition_table_keeps_sdpa_layer_norm_linear() -> None:
    """The kept ops are out of the table; everything else of the default table stays."""
    table = decomposition_table()
    for op in KEPT_OPS:
        assert op not in table
    assert len(table) == len(torch.export.default_decompositions()) - len(
        [op for op in KEPT_OPS if op in torch.export.default_decompositions()])


def test_capture_keeps_ops_whole() -> None:
    """A GPT-2 block keeps linear, layer_norm and sdpa whole after decomposition."""
    ep = capture(M.GPT2Block().eval(), (torch.randn(1, 8, 64),))
    targets = {n.target for n in ep.graph.nodes if n.op == "call_function"}
    assert aten.linear.default in targets
    assert aten.layer_norm.default in targets
    assert aten.scaled_dot_product_attention.default in targets
    assert aten.transpose.int not in targets   # core ATen: permute


def test_capture_refuses_non_module() -> None:
    """A plain function is refused with InvalidArgument."""
    with pytest.raises(aotrt.InvalidArgument, match="torch.nn.Module"):
        capture(lambda x: x, (torch.randn(2),))  # type: ignore[arg-type]


class FurtherDecomposed(nn.Module):
    """Ops the core table keeps but aotrt cannot run whole: capture decomposes them further
    (group/instance norm, bilinear upsampling, average and adaptive pooling)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)
        self.gn = nn.GroupNorm(2, 6)
        self.inorm = nn.InstanceNorm2d(6, affine=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inorm(self.gn(self.up(x)))
        y = F.interpolate(y, scale_factor=1.5, mode="bilinear", align_corners=False)
        y = F.avg_pool2d(y, 3, stride=2, padding=1, count_include_pad=False)
        return F.adaptive_avg_pool2d(y, (3, 2)).flatten(1).log_softmax(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unsupported_ops_decompose_further(dtype: torch.dtype) -> None:
    """The program has no group-norm/upsample/pool op left and matches eager."""
    check_module(FurtherDecomposed(), M.inputs((1, 4, 5, 5)), dtype)
    ep = capture(FurtherDecomposed().eval(), (torch.randn(1, 4, 5, 5),),
                 runs_whole=runs_whole)
    targets = {n.target for n in ep.graph.nodes if n.op == "call_function"}
    assert not targets & {aten.native_group_norm.default, aten.upsample_bilinear2d.vec,
                          aten.avg_pool2d.default, aten._adaptive_avg_pool2d.default}


class PrimsCast(nn.Module):
    """prims.convert_element_type in the graph, as torch 2.11 leaves it when it decomposes
    a half-type SiLU on cuda (bench.py's RT-DETR-L could not export)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.prims.convert_element_type.default(x, torch.float32)
        return torch.ops.prims.convert_element_type.default(torch.sigmoid(y) * y, x.dtype)


def test_prims_convert_element_type_is_a_cast() -> None:
    x = torch.randn(4, 33).half()
    with torch.no_grad():
        prog = aotrt.export(PrimsCast(), (x,))
        ref = PrimsCast()(x).double().numpy()
    with aotrt.load(prog, device="cpu") as d:
        got = np.asarray(d.run(x.numpy())[0]).astype(np.float64)
    assert rel_err(got, ref) < 2e-3
