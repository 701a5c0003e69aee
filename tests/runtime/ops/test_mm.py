"""mm, bmm, addmm and linear against torch (float64 reference), in every layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aotrt.errors import InvalidArgument, Unsupported
from aotrt.runtime import shims
from aotrt.runtime.ops import OPS, addmm, bmm, linear, mm
from tests.runtime.ops.conftest import check_tf32

DTYPES = ("float32", "bfloat16", "float16")
LAYOUTS = ("packed", "offset", "strided", "transposed")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_mm_matches_torch(kit, stream, dtype, layout):
    a_np, b_np = kit.randn((13, 7), dtype), kit.randn((7, 11), dtype)
    a, b = kit.tensor(a_np, layout), kit.tensor(b_np, layout)
    out = kit.out((13, 11), dtype, layout)
    mm(stream, out, a, b)
    kit.close(kit.read(out), kit.t64(a_np) @ kit.t64(b_np), dtype)


def test_mm_transposed_b_like_the_anchor(kit, stream):
    # b with strides (1, K): the anchor's "transposed mat2".
    b_np = kit.randn((6, 5), "float32")
    a_np = kit.randn((4, 6), "float32")
    b = kit.tensor(b_np, strides=(1, 6))
    out = kit.out((4, 5), "float32")
    mm(stream, out, kit.tensor(a_np), b)
    kit.close(kit.read(out), kit.t64(a_np) @ kit.t64(b_np), "float32")


def test_mm_results_feed_the_next_op_without_a_wait(kit, stream):
    a_np, b_np, c_np = (kit.randn(s, "float32") for s in ((5, 4), (4, 3), (3, 2)))
    a, b, c = kit.tensor(a_np), kit.tensor(b_np), kit.tensor(c_np)
    ab = kit.out((5, 3), "float32", "strided")
    out = kit.out((5, 2), "float32")
    mm(stream, ab, a, b)
    mm(stream, out, ab, c)
    ref = kit.t64(a_np) @ kit.t64(b_np) @ kit.t64(c_np)
    kit.close(kit.read(out), ref, "float32")


def test_mm_k_zero_gives_zeros(kit, stream):
    out = kit.out((3, 4), "float32")
    mm(stream, out, kit.tensor(np.zeros((3, 0), np.float32)),
       kit.tensor(np.zeros((0, 4), np.float32)))
    assert (kit.read(out) == 0).all()


def test_mm_empty_output_records_nothing(kit, stream):
    before = stream.recorded_seq
    out = kit.out((0, 4), "float32")
    mm(stream, out, kit.tensor(kit.randn((0, 3), "float32")),
       kit.tensor(kit.randn((3, 4), "float32")))
    assert stream.recorded_seq == before


def test_mm_records_one_command_with_its_accesses(kit, stream):
    a, b = kit.tensor(kit.randn((2, 3), "float32"), "offset"), kit.tensor(
        kit.randn((3, 2), "float32"))
    out = kit.out((2, 2), "float32", "strided")
    seq0 = stream.recorded_seq
    seq = mm(stream, out, a, b)
    assert seq == seq0 + 1 == stream.recorded_seq
    assert out.alloc.uses[stream] == (seq, seq)
    assert a.alloc.uses[stream][0] == seq and a.alloc.uses[stream][1] < seq


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_bmm_matches_torch(kit, stream, dtype, layout):
    a_np, b_np = kit.randn((3, 5, 4), dtype), kit.randn((3, 4, 6), dtype)
    out = kit.out((3, 5, 6), dtype, layout)
    bmm(stream, out, kit.tensor(a_np, layout), kit.tensor(b_np, "transposed"))
    kit.close(kit.read(out), torch.bmm(kit.t64(a_np), kit.t64(b_np)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias_shape", [(), (1,), (9,), (1, 9), (6, 1), (6, 9)])
def test_addmm_broadcasts_bias(kit, stream, dtype, bias_shape):
    a_np, b_np, c_np = kit.randn((6, 5), dtype), kit.randn((5, 9), dtype), kit.randn(
        bias_shape, dtype)
    out = kit.out((6, 9), dtype, "strided")
    addmm(stream, out, kit.tensor(c_np, "offset"), kit.tensor(a_np, "transposed"),
          kit.tensor(b_np, "strided"), beta=0.5, alpha=-1.5)
    ref = torch.addmm(kit.t64(c_np), kit.t64(a_np), kit.t64(b_np), beta=0.5, alpha=-1.5)
    kit.close(kit.read(out), ref, dtype)


def test_addmm_beta_zero_ignores_nan_bias(kit, stream):
    a_np, b_np = kit.randn((3, 4), "float32"), kit.randn((4, 2), "float32")
    bias = kit.tensor(np.full((2,), np.nan, np.float32))
    out = kit.out((3, 2), "float32")
    addmm(stream, out, bias, kit.tensor(a_np), kit.tensor(b_np), beta=0, alpha=2)
    kit.close(kit.read(out), 2 * (kit.t64(a_np) @ kit.t64(b_np)), "float32")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_shape", [(7,), (127, 7), (2, 3, 7), (2, 1, 3, 7)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_matches_torch(kit, stream, dtype, x_shape, with_bias):
    # behaviors.md §5 linear_nobias / linear_bias: Linear 7 -> 101 on (127, 7).
    x_np, w_np, b_np = kit.randn(x_shape, dtype), kit.randn((101, 7), dtype), kit.randn(
        (101,), dtype)
    bias = kit.tensor(b_np, "offset") if with_bias else None
    out = kit.out(x_shape[:-1] + (101,), dtype, "strided")
    linear(stream, out, kit.tensor(x_np, "transposed"), kit.tensor(w_np, "strided"), bias)
    ref = torch.nn.functional.linear(kit.t64(x_np), kit.t64(w_np),
                                     kit.t64(b_np) if with_bias else None)
    kit.close(kit.read(out), ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_linears_of_one_shape_read_their_own_bias(kit, stream, dtype):
    """Layers of one shape share a GEMM plan (on cuda: one cuBLASLt descriptor per bias);
    alternating between them, each result has its own bias, runs after runs."""
    x_np, w_np = kit.randn((16, 32), dtype), kit.randn((24, 32), dtype)
    x, w = kit.tensor(x_np), kit.tensor(w_np)
    biases = [kit.randn((24,), dtype) for _ in range(3)]
    handles = [kit.tensor(b) for b in biases]
    for _ in range(2):
        for b_np, b in zip(biases, handles):
            out = kit.out((16, 24), dtype)
            linear(stream, out, x, w, b)
            ref = torch.nn.functional.linear(kit.t64(x_np), kit.t64(w_np), kit.t64(b_np))
            kit.close(kit.read(out), ref, dtype)


def test_linear_chunk_last_dim_seed_repro(kit, stream):
    # behaviors.md §5 LinearChunkLastDim: Linear 7->16, second half of chunk(2, -1),
    # Linear 8->5, on (12, 7); the half is a non-packed view read in place.
    x_np, w1, w2 = kit.randn((12, 7), "float32"), kit.randn((16, 7), "float32"), kit.randn(
        (5, 8), "float32")
    h = kit.out((12, 16), "float32")
    linear(stream, h, kit.tensor(x_np), kit.tensor(w1))
    half = kit.view(h, [12, 8], [16, 1], 8)
    out = kit.out((12, 5), "float32")
    linear(stream, out, half, kit.tensor(w2))
    ref = (kit.t64(x_np) @ kit.t64(w1).T)[:, 8:] @ kit.t64(w2).T
    kit.close(kit.read(out), ref, "float32")


def test_output_overlapping_an_input_reads_old_values(kit, stream):
    a_np = kit.randn((4, 4), "float32")
    b_np = kit.randn((4, 4), "float32")
    a = kit.tensor(a_np)
    mm(stream, a, a, kit.tensor(b_np))  # in place: a = a @ b
    kit.close(kit.read(a), kit.t64(a_np) @ kit.t64(b_np), "float32")


def test_registry_calls_match_direct_calls(kit, stream):
    x_np, w_np, b_np = kit.randn((4, 3), "float32"), kit.randn((2, 3), "float32"), kit.randn(
        (2,), "float32")
    x, w, b = kit.tensor(x_np), kit.tensor(w_np), kit.tensor(b_np)
    o1, o2, o3 = kit.out((4, 2), "float32"), kit.out((4, 2), "float32"), kit.out(
        (4, 2), "float32")
    OPS["linear"](stream, [o1], [x, w, None])
    OPS["addmm"](stream, [o2], [b, x, kit.view(w, [3, 2], [1, 3], 0)],
                 beta=1.0, alpha=1.0)
    OPS["mm"](stream, [o3], [x, kit.view(w, [3, 2], [1, 3], 0)])
    ref = kit.t64(x_np) @ kit.t64(w_np).T
    kit.close(kit.read(o1), ref, "float32")
    kit.close(kit.read(o2), ref + kit.t64(b_np), "float32")
    kit.close(kit.read(o3), ref, "float32")


def test_linear_and_bmm_in_place_read_old_values(kit, stream):
    x_np, w_np, b_np = kit.randn((5, 8), "float32"), kit.randn((8, 8), "float32"), \
        kit.randn((8,), "float32")
    x = kit.tensor(x_np)
    linear(stream, x, x, kit.tensor(w_np), kit.tensor(b_np))
    ref = torch.nn.functional.linear(kit.t64(x_np), kit.t64(w_np), kit.t64(b_np))
    kit.close(kit.read(x), ref, "float32")
    a_np, c_np = kit.randn((2, 4, 4), "float32"), kit.randn((2, 4, 4), "float32")
    a = kit.tensor(a_np)
    bmm(stream, a, kit.tensor(c_np), a)
    kit.close(kit.read(a), torch.bmm(kit.t64(c_np), kit.t64(a_np)), "float32")

# -- the cpu device's oneDNN path ---------------------------------------------------------------

@pytest.fixture(autouse=True)
def _onednn_matmul(monkeypatch):
    """oneDNN's matmul taken whatever its implementation on this CPU (by default only its
    FAST_MATMUL ones are), so the tests below run the oneDNN path on every machine."""
    from aotrt.runtime.backends.cpu import dnnl as cpu_dnnl

    monkeypatch.setattr(cpu_dnnl, "FAST_MATMUL", ("",))


def _dnnl(kit):
    """The cpu device's oneDNN state; skips off cpu or where the package is not installed."""
    from aotrt.runtime.backends.cpu import dnnl as cpu_dnnl

    if kit.dev.name != "cpu":
        pytest.skip("oneDNN serves the cpu device")
    if cpu_dnnl.find_library() is None:
        pytest.skip(f"{cpu_dnnl.DIST} is not installed")
    assert kit.dev.libraries.dnnl is not None, \
        "onednn-cpu-gomp is installed but the device did not load it"
    return kit.dev.libraries.dnnl


@pytest.mark.parametrize("x_layout", ["packed", "offset", "transposed"])
@pytest.mark.parametrize("x_shape", [(9,), (1, 64), (33, 64), (2, 5, 64), (3, 1, 4, 64)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_float32_linear_runs_through_onednn(kit, stream, x_layout, x_shape, with_bias):
    """Leading dims that fold into rows (any order of the last two in memory): one oneDNN
    matmul on the views themselves, w read transposed, the bias a row at an offset."""
    dnnl = _dnnl(kit)
    k = x_shape[-1]
    x_np, w_np, b_np = kit.randn(x_shape, "float32"), kit.randn((48, k), "float32"), \
        kit.randn((48,), "float32")
    before = dict(dnnl.stats)
    out = kit.out(x_shape[:-1] + (48,), "float32", "offset")
    bias = kit.tensor(b_np, offset=5) if with_bias else None
    linear(stream, out, kit.tensor(x_np, x_layout), kit.tensor(w_np, "offset"), bias)
    ref = torch.nn.functional.linear(kit.t64(x_np), kit.t64(w_np),
                                     kit.t64(b_np) if with_bias else None)
    kit.close(kit.read(out), ref, "float32")
    folds = x_layout != "transposed" or sum(n != 1 for n in x_shape[:-1]) <= 1
    assert dnnl.stats["runs"] == before["runs"] + folds, (dnnl.stats, before)
    assert dnnl.stats["numpy"] == before["numpy"]


def test_only_a_fast_onednn_matmul_is_taken(kit, stream, monkeypatch):
    # By default a GEMM goes to oneDNN where its implementation is a FAST_MATMUL one
    # (brgemm), and stays on numpy where it is not (gemm:jit on AVX2 CPUs).
    from aotrt.runtime.backends.cpu import dnnl as cpu_dnnl

    monkeypatch.undo()
    dnnl = _dnnl(kit)
    x_np, w_np = kit.randn((7, 16), "float32"), kit.randn((8, 16), "float32")
    out = kit.out((7, 8), "float32")
    before = dict(dnnl.stats)
    linear(stream, out, kit.tensor(x_np), kit.tensor(w_np))
    kit.close(kit.read(out), kit.t64(x_np) @ kit.t64(w_np).T, "float32")
    key = cpu_dnnl.MatmulKey("float32", ((7, 16), (16, 1)), ((16, 8), (1, 16)), None,
                             ((7, 8), (8, 1)))
    fast = dnnl.matmul(key).impl.startswith(cpu_dnnl.FAST_MATMUL)
    assert dnnl.stats["runs"] == before["runs"] + fast
    assert dnnl.gemm_pool == fast


def test_linear_with_a_strided_bias_runs_on_numpy(kit, stream):
    # oneDNN 3.2's gemm matmul reads the bias as dense whatever its strides say.
    dnnl = _dnnl(kit)
    x_np, w_np, b_np = (kit.randn(s, "float32") for s in ((7, 16), (8, 16), (8,)))
    out = kit.out((7, 8), "float32")
    before = dict(dnnl.stats)
    linear(stream, out, kit.tensor(x_np), kit.tensor(w_np), kit.tensor(b_np, strides=(3,)))
    kit.close(kit.read(out), kit.t64(x_np) @ kit.t64(w_np).T + kit.t64(b_np), "float32")
    assert dnnl.stats["runs"] == before["runs"]


def test_linear_over_leading_dims_that_do_not_fold_runs_on_numpy(kit, stream):
    # (2, 5, 16) whose dim 0 is strided apart from dim 1: not one matrix of rows.
    _dnnl(kit)
    x_np, w_np = kit.randn((2, 5, 16), "float32"), kit.randn((8, 16), "float32")
    buf = kit.tensor(kit.randn((2, 7, 16), "float32"))
    x = kit.view(buf, [2, 5, 16], [112, 16, 1], 0)
    kit.dev.write(x, x_np)
    out = kit.out((2, 5, 8), "float32")
    linear(stream, out, x, kit.tensor(w_np), None)
    kit.close(kit.read(out), kit.t64(x_np) @ kit.t64(w_np).T, "float32")


@pytest.mark.parametrize("bias_shape", [None, (9,), (1, 9)])
@pytest.mark.parametrize("b_layout", ["packed", "transposed"])
def test_float32_mm_and_addmm_run_through_onednn(kit, stream, bias_shape, b_layout):
    """b stored row by row or column by column goes to oneDNN (a FAST_MATMUL
    implementation packs either), and matches torch."""
    dnnl = _dnnl(kit)
    a_np, b_np = kit.randn((6, 5), "float32"), kit.randn((5, 9), "float32")
    c_np = None if bias_shape is None else kit.randn(bias_shape, "float32")
    out = kit.out((6, 9), "float32", "strided")
    before = dict(dnnl.stats)
    a, b = kit.tensor(a_np, "offset"), kit.tensor(b_np, b_layout)
    if c_np is None:
        mm(stream, out, a, b)
        ref = kit.t64(a_np) @ kit.t64(b_np)
    else:
        addmm(stream, out, kit.tensor(c_np, "offset"), a, b)
        ref = torch.addmm(kit.t64(c_np), kit.t64(a_np), kit.t64(b_np))
    kit.close(kit.read(out), ref, "float32")
    assert dnnl.stats["runs"] == before["runs"] + 1


@pytest.mark.parametrize("beta, alpha", [(0.5, 1.0), (1.0, -1.5)])
def test_addmm_with_scales_or_a_full_bias_stays_right(kit, stream, beta, alpha):
    """What oneDNN is not asked to do (scales, a bias matrix) still matches torch."""
    a_np, b_np, c_np = (kit.randn(s, "float32") for s in ((6, 5), (5, 9), (6, 9)))
    out = kit.out((6, 9), "float32")
    addmm(stream, out, kit.tensor(c_np), kit.tensor(a_np), kit.tensor(b_np), beta=beta,
          alpha=alpha)
    ref = torch.addmm(kit.t64(c_np), kit.t64(a_np), kit.t64(b_np), beta=beta, alpha=alpha)
    kit.close(kit.read(out), ref, "float32")


def test_onednn_linear_output_overlapping_its_input_reads_old_values(kit, stream):
    dnnl = _dnnl(kit)
    x_np, w_np, b_np = kit.randn((16, 32), "float32"), kit.randn((32, 32), "float32"), \
        kit.randn((32,), "float32")
    x = kit.tensor(x_np)
    runs = dnnl.stats["runs"]
    linear(stream, x, x, kit.tensor(w_np), kit.tensor(b_np))
    ref = torch.nn.functional.linear(kit.t64(x_np), kit.t64(w_np), kit.t64(b_np))
    kit.close(kit.read(x), ref, "float32")
    assert dnnl.stats["runs"] == runs + 1


# -- refused inputs -----------------------------------------------------------------------------

def _f(kit, shape, dtype="float32"):
    return kit.tensor(kit.randn(shape, dtype))


def test_mm_refuses_k_mismatch(kit, stream):
    with pytest.raises(InvalidArgument, match="b: K mismatch"):
        mm(stream, kit.out((2, 2), "float32"), _f(kit, (2, 3)), _f(kit, (4, 2)))


def test_mm_refuses_wrong_rank(kit, stream):
    with pytest.raises(InvalidArgument, match="a: expected a 2-D"):
        mm(stream, kit.out((2, 2), "float32"), _f(kit, (1, 2, 3)), _f(kit, (3, 2)))


def test_mm_refuses_wrong_out_shape(kit, stream):
    with pytest.raises(InvalidArgument, match="out: expected sizes"):
        mm(stream, kit.out((2, 3), "float32"), _f(kit, (2, 3)), _f(kit, (3, 2)))


def test_mm_refuses_dtype_mismatch(kit, stream):
    with pytest.raises(InvalidArgument, match="b: dtype bfloat16"):
        mm(stream, kit.out((2, 2), "float32"), _f(kit, (2, 3)), _f(kit, (3, 2), "bfloat16"))


def test_mm_refuses_integer_dtype(kit, stream):
    a = kit.tensor(np.ones((2, 2), np.int64))
    with pytest.raises(Unsupported, match="int64"):
        mm(stream, kit.out((2, 2), "int64"), a, a)


def test_mm_refuses_a_deleted_handle(kit, stream):
    a = _f(kit, (2, 2))
    shims.delete_tensor_object(a)
    with pytest.raises(InvalidArgument, match="a: handle is deleted"):
        mm(stream, kit.out((2, 2), "float32"), a, _f(kit, (2, 2)))


def test_mm_refuses_a_non_stream(kit):
    with pytest.raises(InvalidArgument, match="stream"):
        mm(None, kit.out((2, 2), "float32"), _f(kit, (2, 2)), _f(kit, (2, 2)))


def test_mm_refuses_a_closed_stream(kit):
    from aotrt.runtime.device import get_device
    s = get_device("cpu").create_stream()
    s.close()
    with pytest.raises(InvalidArgument, match="closed"):
        mm(s, kit.out((2, 2), "float32"), _f(kit, (2, 2)), _f(kit, (2, 2)))


def test_refused_call_records_nothing(kit, stream):
    before = stream.recorded_seq
    out = kit.out((2, 2), "float32")
    with pytest.raises(InvalidArgument):
        mm(stream, out, _f(kit, (2, 3)), _f(kit, (2, 2)))
    assert stream.recorded_seq == before and stream.is_empty
    assert stream not in out.alloc.uses


def test_bmm_refuses_batch_mismatch(kit, stream):
    with pytest.raises(InvalidArgument, match="b: batch mismatch"):
        bmm(stream, kit.out((2, 2, 2), "float32"), _f(kit, (2, 2, 3)), _f(kit, (3, 3, 2)))


def test_bmm_refuses_k_mismatch(kit, stream):
    with pytest.raises(InvalidArgument, match="b: K mismatch"):
        bmm(stream, kit.out((2, 2, 2), "float32"), _f(kit, (2, 2, 3)), _f(kit, (2, 4, 2)))


def test_addmm_refuses_bias_that_does_not_broadcast(kit, stream):
    with pytest.raises(InvalidArgument, match="bias"):
        addmm(stream, kit.out((2, 4), "float32"), _f(kit, (3,)), _f(kit, (2, 3)),
              _f(kit, (3, 4)))


def test_addmm_refuses_bias_that_would_grow_the_output(kit, stream):
    with pytest.raises(InvalidArgument, match="bias"):
        addmm(stream, kit.out((1, 4), "float32"), _f(kit, (2, 4)), _f(kit, (1, 3)),
              _f(kit, (3, 4)))


def test_addmm_refuses_non_numeric_alpha(kit, stream):
    with pytest.raises(InvalidArgument, match="alpha"):
        addmm(stream, kit.out((2, 4), "float32"), _f(kit, (4,)), _f(kit, (2, 3)),
              _f(kit, (3, 4)), alpha="2")


def test_linear_refuses_in_feature_mismatch(kit, stream):
    with pytest.raises(InvalidArgument, match="w: in-features"):
        linear(stream, kit.out((2, 5), "float32"), _f(kit, (2, 3)), _f(kit, (5, 4)))


def test_linear_refuses_0d_input(kit, stream):
    with pytest.raises(InvalidArgument, match="x: expected a tensor of rank >= 1"):
        linear(stream, kit.out((5,), "float32"), _f(kit, ()), _f(kit, (5, 1)))


def test_linear_refuses_wrong_bias(kit, stream):
    with pytest.raises(InvalidArgument, match="bias: expected 5"):
        linear(stream, kit.out((2, 5), "float32"), _f(kit, (2, 3)), _f(kit, (5, 3)),
               _f(kit, (4,)))


def test_registry_refuses_bad_instructions(kit, stream):
    x = _f(kit, (2, 3))
    with pytest.raises(InvalidArgument, match="ins: expected a list of 2"):
        OPS["mm"](stream, [kit.out((2, 2), "float32")], [x])
    with pytest.raises(InvalidArgument, match="outs"):
        OPS["mm"](stream, [], [x, x])
    with pytest.raises(InvalidArgument, match="unknown"):
        OPS["linear"](stream, [kit.out((2, 2), "float32")], [x, _f(kit, (2, 3)), None],
                      gamma=1)
    with pytest.raises(InvalidArgument, match=r"ins\[1\]: this input is required"):
        OPS["linear"](stream, [kit.out((2, 2), "float32")], [x, None, None])


@pytest.mark.parametrize("op", ["mm", "linear"])
def test_matmul_tf32_only_where_the_stream_allows_it(kit, stream, op):
    """Fp32Math(matmul_tf32=True) lets a float32 product run as TF32 on cuda (cuBLASLt's
    FAST_TF32 compute type: an error near 1e-4 at K=1024), and the default keeps float32.
    The cpu has no TF32: the same bits either way."""
    from aotrt.runtime.options import Fp32Math, StreamOptions

    a_np, b_np = kit.randn((128, 1024), "float32"), kit.randn((1024, 96), "float32")
    ref = kit.t64(a_np) @ kit.t64(b_np)
    a = kit.tensor(a_np)
    b = kit.tensor(b_np if op == "mm" else np.ascontiguousarray(b_np.T))
    tf32 = kit.dev.create_stream(StreamOptions(fp32_math=Fp32Math(matmul_tf32=True)))
    try:
        got = {}
        for name, s in (("ieee", stream), ("tf32", tf32)):
            out = kit.out((128, 96), "float32")
            (mm if op == "mm" else linear)(s, out, a, b)
            got[name] = kit.read(out)
    finally:
        tf32.close()
    check_tf32(kit.dev.name, got, ref.numpy())
