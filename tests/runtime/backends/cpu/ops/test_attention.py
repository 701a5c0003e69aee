"""aotrt/runtime/backends/cpu/ops/attention.py: the cpu device's fused attention kernel against
torch's float64 math attention, through sdpa: its blocks' edges (rows past a block of 64,
keys past a block of 128 or a vector of 16), causal rows over fewer or more keys than
queries, grouped key heads, heads interleaved in the rows, sharp scores, bool masks, and the
views it leaves to the block loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from aotrt.runtime.ops import sdpa
from aotrt.runtime.backends.cpu.ops import attention as cpu_attention


@pytest.fixture
def calls(kit, monkeypatch):
    """How many work closures the fused kernel made (on cpu only)."""
    if kit.dev.name != "cpu":
        pytest.skip("the cpu device's fused attention")
    made = []
    fused = type(kit.dev.libraries.attention)
    inner = fused.work

    def work(self, *args, **kw):
        made.append(args[0].sizes)
        return inner(self, *args, **kw)
    monkeypatch.setattr(fused, "work", work)
    return made


def _interleaved(shape):
    """Strides of a (B, H, L, E) view of (B, L, H, E) memory (one projection's split)."""
    b, h, n, e = shape
    return {"strides": (n * h * e, e, h * e, 1), "offset": 3}


def _run(kit, stream, q, k, v, is_causal=False, enable_gqa=False, mask=None, kw=None,
         sharp=1.0):
    kw = kw or {}
    tm = None if mask is None else (
        torch.from_numpy(mask) if mask.dtype == np.bool_ else kit.t64(mask))
    ref = F.scaled_dot_product_attention(kit.t64(q) * sharp, kit.t64(k), kit.t64(v),
                                         attn_mask=tm,
                                         is_causal=is_causal, enable_gqa=enable_gqa)
    out = kit.out(tuple(ref.shape), "float32")
    qs = (q * np.float32(sharp)).astype(np.float32)
    sdpa(stream, out, kit.tensor(qs, **kw.get("q", {})), kit.tensor(k, **kw.get("k", {})),
         kit.tensor(v, **kw.get("v", {})), None if mask is None else kit.tensor(mask), 0.0,
         is_causal, None, enable_gqa)
    kit.close(kit.read(out), ref, "float32", 2e-5)


@pytest.mark.parametrize("b,h,lq,s,e,ev,causal", [
    (1, 6, 150, 150, 64, 64, False),     # Whisper's shape, short: 3 row blocks, 2 key blocks
    (2, 3, 70, 70, 64, 64, True),        # GPT-2's causal attention, two batches
    (1, 4, 37, 200, 40, 48, False),      # keys past a vector; head dims of no 64 multiple
    (1, 2, 130, 90, 16, 80, True),       # causal with more queries than keys
    (1, 2, 20, 37, 24, 16, True),        # causal with fewer queries than keys
    (1, 3, 1, 300, 64, 64, False),       # one query row (decoding)
    (1, 1, 64, 128, 8, 256, False),      # exact block sizes; the widest value head
    (2, 4, 3, 50, 36, 32, True),         # few rows (dot products, no packed keys), causal
])
def test_matches_float64(kit, stream, calls, b, h, lq, s, e, ev, causal):
    q, k = kit.randn((b, h, lq, e), "float32"), kit.randn((b, h, s, e), "float32")
    v = kit.randn((b, h, s, ev), "float32")
    _run(kit, stream, q, k, v, is_causal=causal)
    assert calls == [(b, h, lq, ev)]


@pytest.mark.parametrize("causal", [False, True])
def test_heads_interleaved_in_rows(kit, stream, calls, causal):
    shape = (2, 4, 90, 32)
    q, k, v = (kit.randn(shape, "float32") for _ in range(3))
    kw = {n: _interleaved(shape) for n in ("q", "k", "v")}
    _run(kit, stream, q, k, v, is_causal=causal, kw=kw)
    assert len(calls) == 1


def test_grouped_key_heads(kit, stream, calls):
    q = kit.randn((1, 8, 33, 32), "float32")
    k, v = (kit.randn((1, 2, 50, 32), "float32") for _ in range(2))
    _run(kit, stream, q, k, v, enable_gqa=True)
    assert len(calls) == 1


def test_three_dim_views(kit, stream, calls):
    q, k, v = (kit.randn((5, 66, 16), "float32") for _ in range(3))
    _run(kit, stream, q, k, v, is_causal=True)
    assert len(calls) == 1


def test_sharp_scores_stay_finite(kit, stream, calls):
    # Scores of several hundred: the online softmax rescales by each block's maximum.
    q, k, v = (kit.randn((1, 2, 100, 64), "float32") for _ in range(3))
    _run(kit, stream, q, k, v, sharp=40.0)
    assert len(calls) == 1


@pytest.mark.parametrize("b,hq,hk,lq,s,mask_shape", [
    (1, 12, 12, 1, 256, (1, 1, 1, 256)),     # GPT-2's decode step: one query, the cache
    (2, 12, 4, 1, 300, (2, 1, 1, 300)),      # Llama's grouped heads, keys past a block
    (1, 4, 4, 70, 70, (70, 70)),             # a prefill chunk, a 2-D mask
    (2, 6, 2, 5, 140, (2, 6, 5, 140)),       # a mask of every head
    (1, 2, 2, 9, 33, (1, 2, 9, 1)),          # one entry for every key
    (2, 4, 2, 3, 129, (2, 4, 3, 129)),       # few rows, keys past a block
])
def test_bool_mask(kit, stream, calls, b, hq, hk, lq, s, mask_shape):
    q = kit.randn((b, hq, lq, 64), "float32")
    k, v = kit.randn((b, hk, s, 64), "float32"), kit.randn((b, hk, s, 64), "float32")
    mask = kit.rng.random(mask_shape) > 0.5
    mask[..., -1] = True                    # no row without a key
    _run(kit, stream, q, k, v, mask=mask, enable_gqa=hq != hk)
    assert len(calls) == 1


@pytest.mark.parametrize("slot,length,slots,starts", [
    (0, 128, 256, (0,)),            # a 128-token prompt over a 256-slot cache
    (130, 100, 320, (0, 150)),      # a second chunk; a row left-padded past a key block
    (0, 70, 200, (60, 199)),        # a row block that sees only its own slots
])
def test_bool_mask_of_a_prefill_chunk(kit, stream, calls, slot, length, slots, starts):
    """A language model's prefill mask (aotrt/llm/causal.py): row i of a chunk at cache
    slot `slot` sees the slots [start, slot + i] of its batch row, and its own; the kernel
    reads only the key blocks some row of a block sees."""
    b = len(starts)
    q = kit.randn((b, 4, length, 64), "float32")
    k, v = kit.randn((b, 2, slots, 64), "float32"), kit.randn((b, 2, slots, 64), "float32")
    keys = np.arange(slots)[None, None, :]
    rows = slot + np.arange(length)[None, :, None]
    start = np.array(starts)[:, None, None]
    mask = (((keys <= rows) & (keys >= start)) | (keys == rows))[:, None]
    _run(kit, stream, q, k, v, mask=mask, enable_gqa=True)
    assert len(calls) == 1


def test_bool_mask_strided_with_a_row_that_sees_nothing(kit, stream, calls):
    """A mask read by its strides (a slice of a wider one); a row whose keys are all masked
    gives zeros, as torch does."""
    q, k, v = (kit.randn((1, 2, 6, 32), "float32") for _ in range(3))
    wide = kit.rng.random((6, 10)) > 0.3
    wide[:, 1] = True
    wide[2] = False
    mask = kit.tensor(wide)
    view = kit.view(mask, [6, 6], [10, 1], 1)
    ref = F.scaled_dot_product_attention(kit.t64(q), kit.t64(k), kit.t64(v),
                                         attn_mask=kit.t64(wide[:, 1:7]).bool())
    out = kit.out((1, 2, 6, 32), "float32")
    sdpa(stream, out, kit.tensor(q), kit.tensor(k), kit.tensor(v), view)
    got = kit.read(out)
    assert (got[:, :, 2] == 0).all()
    kit.close(got, ref.nan_to_num(0.0), "float32", 2e-5)
    assert len(calls) == 1


@pytest.mark.parametrize("case", ["mask", "value_dim", "in_place"])
def test_leaves_to_block_loop(kit, stream, calls, case):
    """Masks, value head dims of no whole vector and an output over an input go through
    the block loop, and still match."""
    b, h, n, e = 1, 2, 40, 16
    q, k = kit.randn((b, h, n, e), "float32"), kit.randn((b, h, n, e), "float32")
    v = kit.randn((b, h, n, 24 if case == "value_dim" else e), "float32")
    if case == "mask":
        _run(kit, stream, q, k, v, mask=kit.randn((n, n), "float32"))
    elif case == "value_dim":
        _run(kit, stream, q, k, v)
    else:
        ref = F.scaled_dot_product_attention(kit.t64(q), kit.t64(k), kit.t64(v))
        qh = kit.tensor(q)
        sdpa(stream, qh, qh, kit.tensor(k), kit.tensor(v))
        kit.close(kit.read(qh), ref, "float32", 2e-5)
    assert calls == []


def test_takes_only_what_it_can(kit):
    if kit.dev.name != "cpu":
        pytest.skip("the cpu device's fused attention")
    q = kit.tensor(kit.randn((1, 2, 8, 16), "float32"))
    v40 = kit.tensor(kit.randn((1, 2, 8, 40), "float32"))
    mask = kit.tensor(kit.randn((8, 8), "float32"))
    out = kit.out((1, 2, 8, 16), "float32")
    assert cpu_attention.takes(out, q, q, q, None, 1)
    assert not cpu_attention.takes(out, q, q, q, mask, 1)         # additive masks
    bool_mask = kit.tensor(kit.rng.random((2, 8, 8)) > 0.5)
    assert cpu_attention.takes(out, q, q, q, bool_mask, 1)
    wrong = kit.tensor(kit.rng.random((3, 8, 8)) > 0.5)             # 3 heads against 2
    assert not cpu_attention.takes(out, q, q, q, wrong, 1)
    assert not cpu_attention.takes(kit.out((1, 2, 8, 40), "float32"), q, q, v40, None, 1)
    assert not cpu_attention.takes(q, q, q, q, None, 1)          # writes over its input
    assert not cpu_attention.takes(out, q, q, q, None, 2)        # 2 heads are not 2 groups
    half = kit.tensor(kit.randn((1, 2, 8, 16), "bfloat16"))
    assert not cpu_attention.takes(kit.out((1, 2, 8, 16), "bfloat16"), half, half, half,
                                   None, 1)
