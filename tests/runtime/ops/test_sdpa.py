"""sdpa against torch's math attention (float64 reference): behaviors.md §5 shapes
(smaller head counts / lengths where the full ones are slow, same stride patterns),
masks, causal, GQA, strided views, and refused inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from aotrt.errors import InvalidArgument, Unsupported
from aotrt.runtime.device import cuda_available
from aotrt.runtime.ops import OPS, sdpa
from aotrt.runtime.backends.cpu.ops import attention as cpu_attention

DTYPES = ("float32", "bfloat16", "float16")


def _bhle_strides(b, h, n, e):
    """Strides of a (B, H, N, E) view of (B, N, H, E) memory: the head/seq transpose."""
    return (n * h * e, e, h * e, 1)


def _check(kit, stream, dtype, q_np, k_np, v_np, mask_np=None, is_causal=False, scale=None,
           enable_gqa=False, q_kw=None, k_kw=None, v_kw=None, out_layout="packed", tol=None):
    q = kit.tensor(q_np, **(q_kw or {}))
    k = kit.tensor(k_np, **(k_kw or {}))
    v = kit.tensor(v_np, **(v_kw or {}))
    m = None if mask_np is None else kit.tensor(mask_np, "offset")
    tm = None
    if mask_np is not None:
        tm = torch.from_numpy(mask_np) if mask_np.dtype == np.bool_ else kit.t64(mask_np)
        if tm.ndim < 2:  # torch's math path wants (..., L, S); we broadcast any rank
            tm = tm.expand(q_np.shape[-2], k_np.shape[-2])
    ref = F.scaled_dot_product_attention(kit.t64(q_np), kit.t64(k_np), kit.t64(v_np),
                                         attn_mask=tm, is_causal=is_causal, scale=scale,
                                         enable_gqa=enable_gqa)
    out = kit.out(tuple(ref.shape), dtype, out_layout)
    sdpa(stream, out, q, k, v, m, 0.0, is_causal, scale, enable_gqa)
    got = kit.read(out)
    kit.close(got, ref, dtype, tol)
    return got


@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_basic(kit, stream, dtype):
    # §5 sdpa: 3 x (2, 4, 16, 64).
    q, k, v = (kit.randn((2, 4, 16, 64), dtype) for _ in range(3))
    _check(kit, stream, dtype, q, k, v)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sdpa_strided_head_seq_transpose(kit, stream, dtype):
    # §5 sdpa_strided: (10,20,1500,64) strides (1920000,64,1280,1), scale 1; smaller here.
    shape = (2, 5, 150, 64)
    q, k, v = (kit.randn(shape, dtype, 0.3) for _ in range(3))
    kw = {"strides": _bhle_strides(*shape), "offset": 0}
    _check(kit, stream, dtype, q, k, v, scale=1.0, q_kw=kw, k_kw=kw, v_kw=kw,
           out_layout="strided")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sdpa_strided_broadcast(kit, stream, dtype):
    # §5 sdpa_strided_broadcast: q (1,20,1,64) strides (1280,64,1280,1), k/v (1,20,1500,64)
    # in the transposed layout. Full size.
    q = kit.randn((1, 20, 1, 64), dtype)
    k, v = (kit.randn((1, 20, 1500, 64), dtype) for _ in range(2))
    kv = {"strides": _bhle_strides(1, 20, 1500, 64), "offset": 0}
    _check(kit, stream, dtype, q, k, v, q_kw={"strides": (1280, 64, 1280, 1), "offset": 0},
           k_kw=kv, v_kw=kv)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sdpa_strided_broadcast_attn_mask(kit, stream, dtype):
    # §5 sdpa_strided_broadcast_attn_mask: k/v (1,20,1024,64) strides
    # (1310720,65536,64,1), mask (1,1,1,1024) (random here instead of zeros).
    q = kit.randn((1, 20, 1, 64), dtype)
    k, v = (kit.randn((1, 20, 1024, 64), dtype) for _ in range(2))
    mask = kit.randn((1, 1, 1, 1024), dtype)
    kv = {"strides": (1310720, 65536, 64, 1), "offset": 64}
    _check(kit, stream, dtype, q, k, v, mask, q_kw={"strides": (1280, 64, 1280, 1),
                                                     "offset": 0}, k_kw=kv, v_kw=kv)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sdpa_contiguous_causal(kit, stream, dtype):
    # §5 sdpa_contiguous_causal: (1,32,1500,64), causal; 4 heads here.
    q, k, v = (kit.randn((1, 4, 1500, 64), dtype) for _ in range(3))
    _check(kit, stream, dtype, q, k, v, is_causal=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sdpa_strided_causal(kit, stream, dtype):
    # §5 sdpa_strided_causal: (1,32,1500,64) strides (3072000,64,2048,1); 4 heads here.
    shape = (1, 4, 1500, 64)
    q, k, v = (kit.randn(shape, dtype) for _ in range(3))
    kw = {"strides": _bhle_strides(*shape), "offset": 0}
    _check(kit, stream, dtype, q, k, v, is_causal=True, q_kw=kw, k_kw=kw, v_kw=kw,
           out_layout="transposed")


@pytest.mark.slow
def test_sdpa_strided_causal_full_size(kit, stream):
    if stream.options.deferred:
        pytest.skip("full size runs once, on the async stream")
    shape = (1, 32, 1500, 64)
    q, k, v = (kit.randn(shape, "float32") for _ in range(3))
    kw = {"strides": _bhle_strides(*shape), "offset": 0}
    _check(kit, stream, "float32", q, k, v, is_causal=True, q_kw=kw, k_kw=kw, v_kw=kw)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_head_dim_256(kit, stream, dtype):
    # §5 sdpa_head_dim_256: 3 x (1, 4, 8, 256).
    q, k, v = (kit.randn((1, 4, 8, 256), dtype) for _ in range(3))
    _check(kit, stream, dtype, q, k, v)


@pytest.mark.parametrize("e,ev", [(1, 3), (7, 5), (80, 80), (33, 128)])
def test_sdpa_any_head_dim(kit, stream, e, ev):
    q, k, v = kit.randn((2, 3, 5, e), "float32"), kit.randn((2, 3, 9, e), "float32"), \
        kit.randn((2, 3, 9, ev), "float32")
    _check(kit, stream, "float32", q, k, v, out_layout="strided")


@pytest.mark.parametrize("lq,s", [(5, 9), (9, 5), (1, 7), (7, 1)])
def test_sdpa_causal_is_top_left_aligned(kit, stream, lq, s):
    q, k, v = kit.randn((1, 2, lq, 8), "float32"), kit.randn((1, 2, s, 8), "float32"), \
        kit.randn((1, 2, s, 8), "float32")
    _check(kit, stream, "float32", q, k, v, is_causal=True)


MASKS = [(9,), (5, 9), (1, 9), (5, 1), (3, 1, 9), (2, 1, 5, 9), (2, 3, 5, 9), (1, 1, 1, 1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_shape", MASKS)
def test_sdpa_float_mask_broadcasts(kit, stream, dtype, mask_shape):
    q, k, v = kit.randn((2, 3, 5, 8), dtype), kit.randn((2, 3, 9, 8), dtype), kit.randn(
        (2, 3, 9, 8), dtype)
    _check(kit, stream, dtype, q, k, v, kit.randn(mask_shape, dtype, 2.0), scale=0.3)


def test_sdpa_float32_mask_with_bf16_query(kit, stream):
    q, k, v = (kit.randn((1, 2, 4, 8), "bfloat16") for _ in range(3))
    _check(kit, stream, "bfloat16", q, k, v, kit.randn((4, 4), "float32"))


@pytest.mark.parametrize("mask_shape", [(5, 9), (2, 3, 5, 9), (3, 1, 9)])
def test_sdpa_bool_mask(kit, stream, mask_shape):
    q, k, v = kit.randn((2, 3, 5, 8), "float32"), kit.randn((2, 3, 9, 8), "float32"), \
        kit.randn((2, 3, 9, 8), "float32")
    mask = kit.rng.random(mask_shape) > 0.4
    mask[..., 0] = True  # no fully masked rows here
    _check(kit, stream, "float32", q, k, v, mask)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("e", [4, 8])     # 8: cuDNN's fused attention takes half types
def test_sdpa_fully_masked_row_gives_zeros_like_torch(kit, stream, dtype, kind, e):
    s = 5 if e == 4 else 8
    q, k, v = kit.randn((1, 2, 3, e), dtype), kit.randn((1, 2, s, e), dtype), kit.randn(
        (1, 2, s, e), dtype)
    if kind == "bool":
        mask = np.ones((3, s), dtype=bool)
        mask[1] = False
    else:
        mask = np.zeros((3, s), dtype=np.float32)
        mask[1] = -np.inf
        mask[0, 2] = -np.inf
        mask = mask.astype(kit.randn((1,), dtype).dtype)
    got = _check(kit, stream, dtype, q, k, v, mask)
    assert (got[:, :, 1] == 0).all()
    # torch eager in the same dtype agrees.
    tq, tk, tv = (torch.from_numpy(a.astype(np.float32)) for a in (q, k, v))
    tm = torch.from_numpy(mask) if kind == "bool" else torch.from_numpy(
        mask.astype(np.float32))
    eager = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm)
    kit.close(got, eager.double(), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hq,hk", [(8, 2), (6, 3), (4, 1), (4, 4)])
def test_sdpa_gqa(kit, stream, dtype, hq, hk):
    q = kit.randn((2, hq, 6, 16), dtype)
    k, v = kit.randn((2, hk, 7, 16), dtype), kit.randn((2, hk, 7, 16), dtype)
    _check(kit, stream, dtype, q, k, v, enable_gqa=True, k_kw={"layout": "transposed"},
           out_layout="strided")


@pytest.mark.parametrize("mask_shape", [(6, 7), (8, 6, 7), (1, 6, 7), (2, 8, 1, 7)])
def test_sdpa_gqa_with_mask(kit, stream, mask_shape):
    q = kit.randn((2, 8, 6, 16), "float32")
    k, v = kit.randn((2, 2, 7, 16), "float32"), kit.randn((2, 2, 7, 16), "float32")
    _check(kit, stream, "float32", q, k, v, kit.randn(mask_shape, "float32"), enable_gqa=True)


def test_sdpa_gqa_causal(kit, stream):
    q = kit.randn((1, 6, 9, 16), "bfloat16")
    k, v = kit.randn((1, 2, 9, 16), "bfloat16"), kit.randn((1, 2, 9, 16), "bfloat16")
    _check(kit, stream, "bfloat16", q, k, v, is_causal=True, enable_gqa=True)


def test_sdpa_shared_kv_head_without_gqa_broadcasts(kit, stream):
    q = kit.randn((2, 4, 5, 8), "float32")
    k, v = kit.randn((2, 1, 6, 8), "float32"), kit.randn((2, 1, 6, 8), "float32")
    _check(kit, stream, "float32", q, k, v)


@pytest.mark.parametrize("kind", ["float", "bool"])
def test_sdpa_scores_broadcast_up_to_the_mask(kit, stream, kind):
    # q and k have one head, v and the mask three: the scores of a block grow to the mask's
    # heads. (torch's in-place mask add refuses this; the reference expands q instead.)
    q, k, v = kit.randn((2, 1, 5, 8), "float32"), kit.randn((2, 1, 6, 8), "float32"), \
        kit.randn((2, 3, 6, 8), "float32")
    mask = kit.randn((2, 3, 5, 6), "float32")
    if kind == "bool":
        mask = mask > -0.5
        mask[..., 0] = True
    tm = torch.from_numpy(mask) if kind == "bool" else kit.t64(mask)
    ref = F.scaled_dot_product_attention(kit.t64(q).expand(2, 3, 5, 8), kit.t64(k),
                                         kit.t64(v), attn_mask=tm)
    out = kit.out((2, 3, 5, 8), "float32", "strided")
    sdpa(stream, out, kit.tensor(q), kit.tensor(k), kit.tensor(v), kit.tensor(mask))
    kit.close(kit.read(out), ref, "float32")


def test_sdpa_batch_broadcast(kit, stream):
    q = kit.randn((3, 2, 5, 8), "float32")
    k, v = kit.randn((1, 2, 6, 8), "float32"), kit.randn((1, 2, 6, 8), "float32")
    _check(kit, stream, "float32", q, k, v)


@pytest.mark.parametrize("shape", [(5, 8), (3, 5, 8), (2, 2, 2, 5, 8)])
def test_sdpa_other_ranks(kit, stream, shape):
    q, k, v = (kit.randn(shape, "float32") for _ in range(3))
    _check(kit, stream, "float32", q, k, v, kit.randn(shape[-2:-1] + (shape[-2],), "float32"))


def test_sdpa_long_rows_are_chunked(kit, stream, monkeypatch):
    from aotrt.runtime.ops import _common
    monkeypatch.setattr(_common, "CHUNK_BYTES", 64)  # a few query rows per step
    q, k, v = kit.randn((2, 3, 11, 8), "float32"), kit.randn((2, 3, 13, 8), "float32"), \
        kit.randn((2, 3, 13, 8), "float32")
    _check(kit, stream, "float32", q, k, v, kit.randn((3, 11, 13), "float32"))
    _check(kit, stream, "float32", q, k, v, is_causal=True)


def test_sdpa_no_keys_gives_zeros(kit, stream):
    q = kit.randn((1, 2, 3, 4), "float32")
    k, v = np.zeros((1, 2, 0, 4), np.float32), np.zeros((1, 2, 0, 4), np.float32)
    got = _check(kit, stream, "float32", q, k, v)
    assert (got == 0).all()


def test_sdpa_no_queries_records_nothing(kit, stream):
    before = stream.recorded_seq
    q = kit.tensor(np.zeros((1, 2, 0, 4), np.float32))
    k = kit.tensor(kit.randn((1, 2, 3, 4), "float32"))
    sdpa(stream, kit.out((1, 2, 0, 4), "float32"), q, k, k)
    assert stream.recorded_seq == before


def test_sdpa_via_registry(kit, stream):
    q, k, v = (kit.randn((1, 2, 4, 8), "float32") for _ in range(3))
    m = kit.randn((4, 4), "float32")
    out = kit.out((1, 2, 4, 8), "float32")
    OPS["sdpa"](stream, [out], [kit.tensor(q), kit.tensor(k), kit.tensor(v), kit.tensor(m)],
                dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)
    ref = F.scaled_dot_product_attention(kit.t64(q), kit.t64(k), kit.t64(v), kit.t64(m))
    kit.close(kit.read(out), ref, "float32")


def test_sdpa_output_over_its_own_values_reads_old_values(kit, stream, monkeypatch):
    # The exporter may write a library op's result over memory it reads (ops read through
    # temporaries). Chunked by rows: every block reads all of v, which earlier blocks wrote.
    from aotrt.runtime.ops import _common
    monkeypatch.setattr(_common, "CHUNK_BYTES", 64)
    q_np, k_np, v_np = (kit.randn((1, 2, 9, 8), "float32") for _ in range(3))
    v = kit.tensor(v_np)
    sdpa(stream, v, kit.tensor(q_np), kit.tensor(k_np), v)
    ref = F.scaled_dot_product_attention(kit.t64(q_np), kit.t64(k_np), kit.t64(v_np))
    kit.close(kit.read(v), ref, "float32")


# -- refused inputs -----------------------------------------------------------------------------

def _call(kit, stream, q_shape=(1, 2, 3, 4), k_shape=None, v_shape=None, out_shape=None,
          mask=None, dtype="float32", **kw):
    k_shape = k_shape or q_shape
    v_shape = v_shape or k_shape
    out_shape = out_shape or q_shape[:-1] + v_shape[-1:]
    q, k, v = (kit.tensor(kit.randn(s, dtype)) for s in (q_shape, k_shape, v_shape))
    sdpa(stream, kit.out(out_shape, dtype), q, k, v, mask, **kw)


def test_refuses_dropout(kit, stream):
    with pytest.raises(Unsupported, match="dropout"):
        _call(kit, stream, dropout_p=0.1)


def test_refuses_rank_1(kit, stream):
    with pytest.raises(InvalidArgument, match="q: expected rank >= 2"):
        _call(kit, stream, q_shape=(4,), out_shape=(4,))


def test_refuses_rank_mismatch(kit, stream):
    with pytest.raises(InvalidArgument, match="k: rank 3"):
        _call(kit, stream, k_shape=(2, 3, 4))


def test_refuses_zero_head_dim(kit, stream):
    with pytest.raises(InvalidArgument, match="zero head dim"):
        _call(kit, stream, q_shape=(1, 2, 3, 0))


def test_refuses_zero_key_heads(kit, stream):
    with pytest.raises(InvalidArgument, match="zero key/value heads"):
        _call(kit, stream, k_shape=(1, 0, 3, 4), enable_gqa=True)


def test_refuses_heads_that_do_not_divide(kit, stream):
    with pytest.raises(InvalidArgument, match="do not divide"):
        _call(kit, stream, q_shape=(1, 4, 3, 4), k_shape=(1, 3, 3, 4), enable_gqa=True)


def test_refuses_head_mismatch_without_gqa(kit, stream):
    with pytest.raises(InvalidArgument, match="do not broadcast"):
        _call(kit, stream, q_shape=(1, 4, 3, 4), k_shape=(1, 2, 3, 4))


def test_refuses_head_dim_mismatch(kit, stream):
    with pytest.raises(InvalidArgument, match="k: head dim"):
        _call(kit, stream, k_shape=(1, 2, 3, 5))


def test_refuses_value_length_mismatch(kit, stream):
    with pytest.raises(InvalidArgument, match="v: sequence length"):
        _call(kit, stream, v_shape=(1, 2, 4, 4))


def test_refuses_mask_with_causal(kit, stream):
    m = kit.tensor(kit.randn((3, 3), "float32"))
    with pytest.raises(InvalidArgument, match="is_causal"):
        _call(kit, stream, mask=m, is_causal=True)


def test_refuses_mask_dtype(kit, stream):
    m = kit.tensor(np.zeros((3, 3), np.int64))
    with pytest.raises(InvalidArgument, match="attn_mask: dtype int64"):
        _call(kit, stream, mask=m)


def test_refuses_mask_that_does_not_broadcast(kit, stream):
    m = kit.tensor(kit.randn((2, 3), "float32"))
    with pytest.raises(InvalidArgument, match="attn_mask"):
        _call(kit, stream, mask=m)


def test_refuses_mask_that_grows_the_output(kit, stream):
    m = kit.tensor(kit.randn((2, 2, 3, 3), "float32"))
    with pytest.raises(InvalidArgument, match="attn_mask"):
        _call(kit, stream, mask=m)


def test_refuses_wrong_out_shape(kit, stream):
    with pytest.raises(InvalidArgument, match="out: expected sizes"):
        _call(kit, stream, out_shape=(1, 2, 3, 5))


def test_refuses_int_inputs(kit, stream):
    with pytest.raises(Unsupported, match="int64"):
        _call(kit, stream, dtype="int64")


def test_refuses_non_numeric_scale(kit, stream):
    with pytest.raises(InvalidArgument, match="scale"):
        _call(kit, stream, scale="1")


# Generated for cuda only, where a GPU is: else no case at all (one skip per stream mode
# shows it, not one per case and device).
@pytest.mark.parametrize("dev,dtype,case", [
    ("cuda", dtype, case) for dtype in ("float16", "bfloat16")
    for case in ("plain", "bshd", "causal", "mask", "bool_mask", "f32_mask", "gqa")
] if cuda_available() else [], indirect=["dev"])
def test_sdpa_half_types_take_cudnns_fused_attention_on_cuda(kit, stream, dtype, case):
    """Half-type attention with 16-byte rows runs as one cuDNN graph, reading the heads by
    strides (no copies), and matches torch; checked through the device's graph cache."""
    from aotrt.runtime.backends.cuda.libraries import Dnn

    dnn = kit.dev.libraries.state(Dnn)
    if not dnn.available:
        pytest.fail("cuDNN is missing on the cuda device")
    b, h, n, e = 2, 4, 24, 64
    hk = 2 if case == "gqa" else h
    q = kit.randn((b, h, n, e), dtype, 0.5)
    k, v = kit.randn((b, hk, n + 3, e), dtype, 0.5), kit.randn((b, hk, n + 3, e), dtype)
    kw = {"strides": _bhle_strides(b, h, n, e), "offset": 8} if case == "bshd" else None
    mask = {"mask": lambda: kit.randn((b, 1, n, n + 3), dtype),
            "f32_mask": lambda: kit.randn((1, n + 3), "float32"),
            "bool_mask": lambda: kit.rng.random((b, 1, 1, n + 3)) > 0.3}.get(case,
                                                                          lambda: None)()
    with dnn.lock:      # forget built graphs, so that this call must build its own
        for key in [key for key in dnn.graphs if key[0] == "sdpa"]:
            del dnn.graphs[key]
    _check(kit, stream, dtype, q, k, v, mask, is_causal=case == "causal",
           enable_gqa=case == "gqa", q_kw=kw)
    built = [val for key, val in dnn.graphs.items() if key[0] == "sdpa"]
    assert len(built) == 1 and built[0] is not None, "the fused cuDNN path was not taken"


@pytest.mark.parametrize("dev", ["cpu"], indirect=True)     # oneDNN serves the cpu device
@pytest.mark.parametrize("is_causal", [False, True])
def test_cpu_sdpa_gemms_run_on_onednn_where_the_device_gemms_do(kit, stream, monkeypatch,
                                                                 is_causal):
    # The block GEMMs go through oneDNN's array matmul (forced here, as on a CPU with a
    # brgemm matmul), masks and strided views included, and still match.
    from aotrt.runtime.backends.cpu import dnnl as cpu_dnnl

    dnnl = kit.dev.libraries.dnnl
    if dnnl is None:
        pytest.skip("oneDNN is not installed")
    monkeypatch.setattr(cpu_dnnl, "FAST_MATMUL", ("",))
    # The block loop (masks, half types), not the fused kernel that takes unmasked float32.
    monkeypatch.setattr(cpu_attention, "takes", lambda *a: False)
    b, h, n, e = 2, 3, 20, 16
    q, k, v = (kit.randn((b, h, n, e), "float32") for _ in range(3))
    # Heads interleaved in the rows, as GPT-2's split of one projection gives them: oneDNN
    # refuses those views, and the op hands it packed copies instead.
    kw = {"strides": _bhle_strides(b, h, n, e), "offset": 0}
    mask = kit.randn((n, n), "float32")
    runs = dnnl.stats["runs"]
    _check(kit, stream, "float32", q, k, v, None if is_causal else mask, is_causal,
           q_kw=kw, k_kw=kw, v_kw=kw)
    assert dnnl.stats["runs"] >= runs + 2
