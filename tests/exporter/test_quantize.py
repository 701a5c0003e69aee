"""Weight-only quantization (issue 38): the packing round trip, quantize_linears' choices
and refusals, and models with quantized linears exported and run on every device against
the torch model that calls the aotrt::linear_wq custom op."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import aotrt
from aotrt.errors import InvalidArgument
from aotrt.exporter.quantize import (QuantizedEmbedding, QuantizedLinear, dequantize,
                                     pack_int4, quantize_embeddings, quantize_int4,
                                     quantize_int8, quantize_linears, unpack_int4)
from tests.conftest import DEVICES

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def outlier_weights(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Random weights with outlier output channels and input features."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[torch.randperm(n, generator=g)[: max(1, n // 8)]] *= 20.0
    w[:, torch.randperm(k, generator=g)[: max(1, k // 16)]] *= 8.0
    return w


def test_int4_packing_round_trips():
    q = torch.randint(0, 16, (5, 64), dtype=torch.uint8)
    packed = pack_int4(q)
    assert packed.shape == (5, 32) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed), q)
    # the low nibble of byte j holds k = 2j
    assert int(packed[0, 0]) == int(q[0, 0]) | (int(q[0, 1]) << 4)


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_is_within_half_a_step_of_each_weight(group_size):
    w = outlier_weights(24, 256)
    q, s, z = quantize_int4(w, group_size, torch.float32)
    assert q.shape == (24, 128) and s.shape == z.shape == (24, 256 // group_size)
    assert float(z.min()) >= 0 and float(z.max()) <= 15 and torch.equal(z, z.round())
    err = (dequantize(q, s, z, 4, group_size) - w).abs()
    step = s.repeat_interleave(group_size, 1)
    assert bool((err <= step / 2 + 1e-6).all())
    # per-group scales: the outlier features cost only their own groups' accuracy
    assert float(s.min()) < float(s.max()) / 4


def test_int8_is_symmetric_per_channel():
    w = outlier_weights(16, 100)
    q, s = quantize_int8(w, torch.bfloat16)
    assert q.dtype == torch.int8 and s.shape == (16,) and s.dtype == torch.bfloat16
    assert int(q.abs().max()) <= 127
    err = (dequantize(q, s, None, 8, 100) - w).abs()
    assert bool((err <= s.float().reshape(-1, 1) / 2 + 1e-6).all())


def test_quantize_linears_replaces_linears_but_not_embeddings():
    m = torch.nn.ModuleDict({"emb": torch.nn.Embedding(10, 64),
                             "fc": torch.nn.Linear(64, 32),
                             "head": torch.nn.Linear(32, 10, bias=False)})
    names = quantize_linears(m, "int4", 32)
    assert names == ["fc", "head"]
    assert isinstance(m["emb"], torch.nn.Embedding)
    assert isinstance(m["fc"], QuantizedLinear) and m["fc"].bits == 4
    assert m["fc"].scales.dtype == torch.float32


def test_quantize_linears_name_filter_and_scale_dtype():
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)).to(torch.bfloat16)
    assert quantize_linears(m, "int8", include=r"^0$", scale_dtype=torch.float32) == ["0"]
    assert isinstance(m[0], QuantizedLinear) and type(m[1]) is torch.nn.Linear
    assert m[0].scales.dtype == torch.float32 and m[0].group_size == 64


@pytest.mark.parametrize("kw,match", [
    ({"weights": "int3"}, "weights: expected one of"),
    ({"weights": "int4", "group_size": 48}, "group_size: expected one of"),
    ({"weights": "int4", "group_size": 128}, r"0: in_features 64 is not a multiple of "
                                             r"group_size 128"),
    ({"scale_dtype": torch.int8}, "scale_dtype"),
])
def test_quantize_linears_refuses_bad_choices(kw, match):
    with pytest.raises(InvalidArgument, match=match):
        quantize_linears(torch.nn.Sequential(torch.nn.Linear(64, 8)), **kw)


class Block(torch.nn.Module):
    """An embedding, an MLP with GELU and a head: linears of three shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 128)
        self.up = torch.nn.Linear(128, 256)
        self.down = torch.nn.Linear(256, 128)
        self.head = torch.nn.Linear(128, 50, bias=False)
        for lin in (self.up, self.down, self.head):
            lin.weight.data = outlier_weights(*lin.weight.shape, seed=lin.in_features)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        h = h + self.down(torch.nn.functional.gelu(self.up(h)))
        return self.head(h)


# The CI slice takes each scheme in one dtype, the dtypes in turn (both meet int4); the other
# four (about 10 s on 2 cores) are slow.
@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("weights,group_size,dtype", [
    pytest.param(w, g, dt, id=f"dtype{i}-{w}-{g}",
                 marks=[] if i == k % 2 else [pytest.mark.slow])
    for k, (w, g) in enumerate([("int8", 128), ("int4", 32), ("int4", 64), ("int4", 128)])
    for i, dt in enumerate([torch.float32, torch.bfloat16])])
def test_a_quantized_model_exports_and_matches_torch(dev, weights, group_size, dtype):
    torch.manual_seed(0)
    model = Block().eval().to(dtype)
    quantize_linears(model, weights, group_size)
    for rows in (1, 7):
        ids = torch.randint(0, 50, (1, rows))
        with torch.no_grad():
            ref = model(ids).float()
        prog = aotrt.export(model, (ids,))
        fns = [i["fn"] for i in prog.instructions if i["op"] == "library"]
        assert fns.count("linear_wq") == 3 and "linear" not in fns
        with aotrt.load(prog, device=dev) as m:
            got = torch.from_dlpack(m.run(ids.numpy())[0]).cpu().float()
        err = float((got - ref).abs().max() / ref.abs().max())
        assert err <= TOL[dtype], err


def test_the_file_stores_the_packed_weights():
    model = Block().eval()
    quantize_linears(model, "int4", 64)
    prog = aotrt.export(model, (torch.randint(0, 50, (1, 3)),))
    packed = [a for a in prog.constants.values() if a.dtype == np.uint8]
    assert sorted(a.size for a in packed) == [50 * 64, 128 * 128, 256 * 64]
    # no float copy of a weight: the largest float constant is the embedding's table
    assert max(a.size for a in prog.constants.values() if a.dtype != np.uint8) == 50 * 128


def test_inspect_names_each_quantized_layer(tmp_path, capsys):
    from aotrt.cli import main

    model = Block().eval()
    quantize_linears(copy.deepcopy(model), "int8")
    quantize_linears(model, "int4", 32, include="up|down")
    path = tmp_path / "q.aotp"
    aotrt.export(model, (torch.randint(0, 50, (1, 3)),)).save(str(path))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    # one table row per (op, scheme, scales, shape), its first column the count
    rows = [ln.split() for ln in out.splitlines() if "linear_wq  int4 g32" in ln]
    assert sum(int(r[0]) for r in rows) == 2
    assert "packed: " in out and "as bfloat16 weights" in out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("weights,group_size", [("int8", 128), ("int4", 32), ("int4", 64),
                                                ("int4", 128)])
def test_quantized_embedding_and_its_tied_head_run_as_in_torch(weights: str, group_size: int,
                                                               device: str) -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(300, 256)
            self.head = torch.nn.Linear(256, 300, bias=False)
            self.head.weight = self.emb.weight
            with torch.no_grad():
                self.emb.weight.copy_(outlier_weights(300, 256, seed=3))

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.emb(ids))

    model = Tied().eval()
    names = quantize_embeddings(model, weights, group_size)
    assert names == ["emb"]
    assert isinstance(model.emb, QuantizedEmbedding) and isinstance(model.head,
                                                                    QuantizedLinear)
    # the head reads the embedding's packed table: one copy
    assert model.head.qweight is model.emb.qweight
    assert quantize_linears(model, weights, group_size) == []
    ids = torch.randint(0, 300, (2, 5))
    rows = model.emb(ids)
    torch.testing.assert_close(rows, model.emb.dequantized_weight()[ids], rtol=0, atol=0)
    prog = aotrt.export(model, (ids,))
    # the file holds the packed table, its scales and zeros once
    once = sum(b.numel() * b.element_size() for b in model.emb.buffers())
    assert sum(a.nbytes for a in prog.constants.values()) == once
    want = model(ids).numpy()
    with aotrt.load(prog, device=device) as m:
        got = np.asarray(m(ids.numpy())[0])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_quantize_embeddings_refuses_what_it_cannot_pack() -> None:
    with pytest.raises(InvalidArgument, match="embedding_dim 48 is not a multiple"):
        quantize_embeddings(torch.nn.Sequential(torch.nn.Embedding(10, 48)), "int4", 32)
    with pytest.raises(InvalidArgument, match="max_norm"):
        quantize_embeddings(torch.nn.Sequential(torch.nn.Embedding(10, 64, max_norm=1.0)),
                            "int8")
    with pytest.raises(InvalidArgument, match="weights: expected one of"):
        quantize_embeddings(torch.nn.Sequential(torch.nn.Embedding(10, 64)), "int2")


def test_a_quantized_embedding_refuses_an_id_outside_the_table_as_nn_embedding_does() -> None:
    model = torch.nn.Sequential(torch.nn.Embedding(50, 64)).eval()
    quantize_embeddings(model, "int4", 32)
    ids = torch.tensor([[1, 2, 3]])
    prog = aotrt.export(model, (ids,))
    for bad in (-1, 50):
        with pytest.raises(IndexError):
            model(torch.tensor([[1, bad]]))
    with aotrt.load(prog, device="cpu") as m:
        np.testing.assert_array_equal(np.asarray(m(ids.numpy())[0]), model(ids).numpy())
        for bad in (-1, 50):
            with pytest.raises(InvalidArgument, match="index out of range"):
                np.asarray(m(np.array([[1, bad, 3]]))[0])
        np.testing.assert_array_equal(np.asarray(m(ids.numpy())[0]), model(ids).numpy())
