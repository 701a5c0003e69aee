"""linear_wq (weight-only int8 / int4 linear) against the dequantized torch reference
(aotrt::linear_wq's eager form: float32 weights, a float32 linear, one rounding), on every
device, both bit widths and every group size; and packed weights a hostile file could hold,
refused naming the field."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from aotrt.errors import InvalidArgument, ProgramError, Unsupported
from aotrt.exporter.builder import ProgramBuilder
from aotrt.exporter.quantize import linear_wq as torch_linear_wq, quantize_int4, quantize_int8
from aotrt.runtime.ops import OPS, TensorMeta, check, linear_wq
from aotrt.runtime.backends.cpu.ops import linear_wq as cpu_linear_wq

#: relative to max |ref|: float32 keeps the float32 reference's accuracy; the half types are
#: within one rounding of the output (2**-8 for bfloat16, 2**-11 for float16), doubled
TOL = {"float32": 1e-4, "bfloat16": 8e-3, "float16": 1e-3}
TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: (bits, group size): int8 is per output channel (group_size None: K)
SCHEMES = [(8, None), (4, 32), (4, 64), (4, 128)]


def weights(rng: np.random.Generator, n: int, k: int) -> torch.Tensor:
    """Random weights with a few outlier output channels and input features, so that
    per-channel and per-group scales matter."""
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    w[rng.choice(n, max(1, n // 8), replace=False)] *= 20.0
    w[:, rng.choice(k, max(1, k // 16), replace=False)] *= 8.0
    return torch.from_numpy(w)


def pack(w: torch.Tensor, bits: int, group_size: int | None, scale_dtype: str
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """(qweight, scales, zeros, group_size) as numpy arrays (bfloat16 through ml_dtypes)."""
    sd = TORCH[scale_dtype]
    if bits == 8:
        q, s = quantize_int8(w, sd)
        z, gs = None, w.shape[1]
    else:
        q, s, z = quantize_int4(w, group_size, sd)
        gs = group_size
    return q.numpy(), _np(s), None if z is None else _np(z), gs


def _np(t: torch.Tensor) -> np.ndarray:
    from tests.runtime.ops.conftest import NP

    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(NP["bfloat16"])
    return t.numpy()


def _t(a: np.ndarray) -> torch.Tensor:
    from tests.runtime.ops.conftest import NP

    if a.dtype == NP["bfloat16"]:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def reference(x: np.ndarray, q: np.ndarray, s: np.ndarray, z: np.ndarray | None,
              b: np.ndarray | None, bits: int, gs: int) -> np.ndarray:
    """The export's torch reference, as float64."""
    out = torch_linear_wq(_t(x), _t(q), _t(s), None if z is None else _t(z),
                          None if b is None else _t(b), bits, gs)
    return out.double().numpy()


def run(kit, stream, m_shape, n, k, bits, group_size, dtype="float32", scale_dtype=None,
        with_bias=True, x_layout="packed", out_layout="packed"):
    """One linear_wq call against the reference."""
    w = weights(kit.rng, n, k)
    q, s, z, gs = pack(w, bits, group_size, scale_dtype or dtype)
    x_np = kit.randn((*m_shape, k), dtype)
    b_np = kit.randn((n,), dtype) if with_bias else None
    out = kit.out((*m_shape, n), dtype, out_layout)
    linear_wq(stream, out, kit.tensor(x_np, x_layout), kit.tensor(q), kit.tensor(s),
              None if z is None else kit.tensor(z),
              None if b_np is None else kit.tensor(b_np), bits, gs)
    ref = reference(x_np, q, s, z, b_np, bits, gs)
    kit.close(kit.read(out), ref, dtype, TOL[dtype])
    return ref


@pytest.mark.parametrize("bits,group_size", SCHEMES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("m_shape", [(1,), (3,), (2, 8), (40,)])
def test_matches_the_dequantized_reference(kit, stream, bits, group_size, dtype, m_shape):
    # 1 and 3 rows: the decode kernels (a row tile of 3 too); 16: their limit; 40: prefill
    run(kit, stream, m_shape, 40, 256, bits, group_size, dtype)


@pytest.mark.parametrize("bits,group_size", SCHEMES)
def test_scales_of_another_dtype_than_x(kit, stream, bits, group_size):
    run(kit, stream, (2,), 24, 128, bits, group_size, "bfloat16", scale_dtype="float32")
    run(kit, stream, (2,), 24, 128, bits, group_size, "float32", scale_dtype="bfloat16")


@pytest.mark.parametrize("k", [1, 7, 77, 200])
def test_int8_takes_any_in_features(kit, stream, k):
    run(kit, stream, (3,), 19, k, 8, None, with_bias=False)


@pytest.mark.parametrize("bits,group_size", SCHEMES)
@pytest.mark.parametrize("x_layout,out_layout", [("strided", "strided"),
                                                 ("transposed", "packed"),
                                                 ("offset", "transposed")])
def test_strided_views(kit, stream, bits, group_size, x_layout, out_layout):
    run(kit, stream, (4,), 33, 128, bits, group_size, x_layout=x_layout, out_layout=out_layout)


def test_gpt2_sized_layers(kit, stream):
    """768 -> 3072 and back, one token and a prompt of 20."""
    for bits, gs in ((8, None), (4, 128), (4, 32)):
        run(kit, stream, (1,), 3072, 768, bits, gs, "float32")
        run(kit, stream, (20,), 768, 3072, bits, gs, "float32")


@pytest.mark.parametrize("bits,group_size", [(8, None), (4, 64)])
def test_output_over_its_input_reads_old_values(kit, stream, bits, group_size):
    w = weights(kit.rng, 64, 64)
    q, s, z, gs = pack(w, bits, group_size, "float32")
    x_np = kit.randn((3, 64), "float32")
    x = kit.tensor(x_np)
    linear_wq(stream, x, x, kit.tensor(q), kit.tensor(s), None if z is None else kit.tensor(z),
              None, bits, gs)
    kit.close(kit.read(x), reference(x_np, q, s, z, None, bits, gs), "float32", 1e-4)


def test_zero_points_may_be_fractional(kit, stream):
    """torchao's float zero points: any float, not only the integers quantize_linears makes."""
    n, k = 16, 64
    q = kit.rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    s = (kit.rng.random((n, 2)) + 0.1).astype(np.float32)
    z = (kit.rng.random((n, 2)) * 15).astype(np.float32)
    x_np = kit.randn((2, k), "float32")
    out = kit.out((2, n), "float32")
    linear_wq(stream, out, kit.tensor(x_np), kit.tensor(q), kit.tensor(s), kit.tensor(z),
              None, 4, 32)
    kit.close(kit.read(out), reference(x_np, q, s, z, None, 4, 32), "float32", 1e-4)


def test_registry_call_matches_the_direct_one(kit, stream):
    w = weights(kit.rng, 8, 64)
    q, s, z, gs = pack(w, 4, 32, "float32")
    x_np = kit.randn((2, 64), "float32")
    out = kit.out((2, 8), "float32")
    OPS["linear_wq"](stream, [out], [kit.tensor(x_np), kit.tensor(q), kit.tensor(s),
                                     kit.tensor(z), None], bits=4, group_size=32)
    kit.close(kit.read(out), reference(x_np, q, s, z, None, 4, 32), "float32", 1e-4)


def test_cpu_paths(kit, stream, monkeypatch):
    """The compiled kernel takes a few rows in views it reads directly; numpy the rest."""
    if kit.dev.name != "cpu":
        pytest.skip("the cpu device's paths")
    w = weights(kit.rng, 8, 64)
    q, s, z, _ = pack(w, 4, 32, "float32")
    args = [kit.tensor(q), kit.tensor(s), kit.tensor(z), None, 4, 32]
    few = cpu_linear_wq.make_linear_wq(kit.out((2, 8), "float32"),
                                       kit.tensor(kit.randn((2, 64), "float32")), *args)
    many = cpu_linear_wq.make_linear_wq(kit.out((17, 8), "float32"),
                                        kit.tensor(kit.randn((17, 64), "float32")), *args)
    assert getattr(few, "native", None) is not None
    assert getattr(many, "native", None) is None


# -- refused packings ----------------------------------------------------------------------------


def meta(dtype: str, *sizes: int) -> TensorMeta:
    """A row-major TensorMeta."""
    return TensorMeta(dtype, sizes, tuple(math.prod(sizes[i + 1:]) for i in range(len(sizes))))


def call(x=("float32", 2, 64), q=("uint8", 8, 32), s=("float32", 8, 2),
         z=("float32", 8, 2), b=None, out=("float32", 2, 8), **params):
    """ops.check of one linear_wq call (int4, group 32 unless changed)."""
    params = {"bits": 4, "group_size": 32, **params}
    return check("linear_wq", [meta(*out)],
                 [meta(*x), meta(*q), meta(*s), None if z is None else meta(*z),
                  None if b is None else meta(*b)], params)


def test_a_good_packing_passes_and_declares_its_work():
    cost = call()
    assert cost.work >= 2 * 8 * 64
    cost8 = call(q=("int8", 8, 64), s=("float32", 8), z=None, bits=8, group_size=64)
    assert cost8.work >= 2 * 8 * 64
    big = call(x=("float32", 1, 4096), q=("uint8", 4096, 2048), s=("float32", 4096, 32),
               z=("float32", 4096, 32), out=("float32", 1, 4096), group_size=128)
    assert big.work >= 4096 * 4096


@pytest.mark.parametrize("kw,match", [
    ({"bits": 3}, r"bits: expected 4 or 8, got 3"),
    ({"bits": "4"}, r"bits: expected an integer"),
    ({"group_size": 48}, r"group_size: expected one of \[32, 64, 128\] for int4, got 48"),
    ({"group_size": 128}, r"group_size: 128 does not divide in-features K = 64"),
    ({"x": ("float32", 2, 63), "q": ("uint8", 8, 31)}, r"in-features K = 63 is odd"),
    ({"s": ("float32", 8, 4)}, r"scales: expected sizes \[8, 2\]"),
    ({"s": ("float32", 8)}, r"scales: expected sizes \[8, 2\]"),
    ({"z": ("float32", 2, 8)}, r"zeros: expected sizes \[8, 2\]"),
    ({"z": ("bfloat16", 8, 2)}, r"zeros: dtype bfloat16 does not match scales's float32"),
    ({"z": None}, r"zeros: int4 weights need zero points"),
    ({"q": ("int8", 8, 32)}, r"qweight: dtype must be uint8 for int4"),
    ({"q": ("uint8", 8, 64)}, r"qweight: expected sizes \[8, 32\]"),
    ({"q": ("uint8", 8, 32, 1)}, r"qweight: expected a 2-D tensor"),
    ({"out": ("float32", 2, 9)}, r"out: expected sizes \[2, 8\]"),
    ({"b": ("float32", 9)}, r"bias: expected sizes \[8\]"),
    ({"b": ("bfloat16", 8)}, r"bias: dtype bfloat16 does not match out's float32"),
    ({"x": ("bfloat16", 2, 64)}, r"x: dtype bfloat16 does not match out's float32"),
])
def test_bad_int4_packings_are_refused_naming_the_problem(kw, match):
    with pytest.raises(InvalidArgument, match=match):
        call(**kw)


@pytest.mark.parametrize("kw,match", [
    ({"group_size": 32}, r"group_size: int8 weights are scaled per output channel, so "
                         r"group_size must be K = 64, got 32"),
    ({"z": ("float32", 8)}, r"zeros: int8 weights are symmetric"),
    ({"q": ("uint8", 8, 64)}, r"qweight: dtype must be int8 for int8"),
    ({"s": ("float32", 8, 1)}, r"scales: expected sizes \[8\]"),
])
def test_bad_int8_packings_are_refused_naming_the_problem(kw, match):
    base = {"q": ("int8", 8, 64), "s": ("float32", 8), "z": None, "bits": 8, "group_size": 64}
    with pytest.raises(InvalidArgument, match=match):
        call(**{**base, **kw})


def test_scales_of_an_integer_dtype_are_unsupported():
    with pytest.raises(Unsupported, match="scales: dtype int32"):
        call(s=("int32", 8, 2))


def _program(params: dict, scales_shape: tuple[int, ...] = (8, 2)) -> ProgramBuilder:
    b = ProgramBuilder("wq")
    x = b.input("x", "float32", [2, 64])
    q = b.constant("q", np.zeros((8, 32), np.uint8))
    s = b.constant("s", np.ones(scales_shape, np.float32))
    z = b.constant("z", np.zeros(scales_shape, np.float32))
    o = b.output("o", "float32", [2, 8])
    b.library("linear_wq", [o], [x, q, s, z, None], params)
    return b


@pytest.mark.parametrize("params,shape,field", [
    ({"bits": 5, "group_size": 32}, (8, 2), "params.bits"),
    ({"bits": 4, "group_size": 96}, (8, 2), "params.group_size"),
    ({"bits": 4, "group_size": 32}, (8, 3), "instructions[0]"),
])
def test_a_file_with_a_bad_packing_is_refused_at_load(params, shape, field):
    with pytest.raises(ProgramError, match=field.replace("[", r"\[").replace("]", r"\]")):
        _program(params, shape).build()


def test_a_file_of_int4_weights_runs():
    import aotrt

    w = weights(np.random.default_rng(0), 8, 64)
    q, s, z, _ = pack(w, 4, 32, "float32")
    b = ProgramBuilder("wq")
    x = b.input("x", "float32", [2, 64])
    ins = [x, b.constant("q", q), b.constant("s", s), b.constant("z", z), None]
    o = b.output("o", "float32", [2, 8])
    b.library("linear_wq", [o], ins, {"bits": 4, "group_size": 32})
    prog = b.build()
    x_np = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    with aotrt.load(prog, device="cpu") as m:
        got = np.asarray(m.run(x_np)[0])
    ref = reference(x_np, q, s, z, None, 4, 32)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()
