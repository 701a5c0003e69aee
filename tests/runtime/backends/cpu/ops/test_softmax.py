"""aotrt/runtime/backends/cpu/ops/softmax.py: the compiled row softmax of the cpu device's
attention, against float64 numpy, with fully masked and NaN rows, and its use by sdpa."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from aotrt.errors import InvalidArgument
from aotrt.runtime.device import get_device
from aotrt.runtime.ops import sdpa
from aotrt.runtime.backends.cpu.ops import attention as cpu_attention


@pytest.fixture
def cpu():
    return get_device("cpu")


def _ref(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 33), (12, 1500)])
def test_matches_float64(cpu, rows, cols):
    x = (np.random.default_rng(rows * cols).standard_normal((rows, cols)) * 6).astype(
        np.float32)
    out = np.empty_like(x)
    cpu.libraries.softmaxes.get(rows, cols)(x, out)
    err = np.abs(out - _ref(x)).max() / np.abs(_ref(x)).max()
    assert err < 1e-5, err
    assert np.allclose(out.sum(axis=-1), 1.0, atol=1e-5)


def test_fewer_rows_than_compiled_and_special_rows(cpu):
    sm = cpu.libraries.softmaxes.get(8, 5)
    x = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    x[1] = -np.inf                       # fully masked: zeros, as torch's safe softmax
    x[2, 3] = np.nan                     # NaN spreads over its row
    out = np.full_like(x, 7.0)
    sm(x, out)
    np.testing.assert_allclose(out[0], _ref(x[:1])[0], rtol=1e-5)
    assert (out[1] == 0).all()
    assert np.isnan(out[2]).all()


def test_in_place_and_refuses_partial_overlap(cpu):
    """dst may be src itself (attention's score block is normalised where it lies); a dst
    that overlaps src elsewhere is refused."""
    x = (np.random.default_rng(4).standard_normal((5, 40)) * 6).astype(np.float32)
    want = _ref(x)
    sm = cpu.libraries.softmaxes.get(5, 40)
    sm(x, x)
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-7)
    buf = np.zeros(5 * 40 + 40, np.float32)
    with pytest.raises(InvalidArgument, match="overlap"):
        sm(buf[:200].reshape(5, 40), buf[40:].reshape(5, 40))


def test_each_exp_is_taken_once(cpu):
    """Two passes: exp(x - max) written out, then scaled by 1 / sum; so the rendered C has
    one exp call site and no division per element."""
    from aotrt.kernels.render_c import CRenderer
    from aotrt.runtime.backends.cpu.ops.softmax import softmax_kernels

    src = CRenderer().render(list(softmax_kernels(4, 64)))
    body = src[src.index("/* kernel row_softmax_exp"):]
    assert body.count("aot_expf(") == 1


def test_is_cached_per_shape(cpu):
    assert cpu.libraries.softmaxes.get(4, 9) is cpu.libraries.softmaxes.get(4, 9)
    assert cpu.libraries.softmaxes.get(4, 9) is not cpu.libraries.softmaxes.get(4, 10)


@pytest.mark.parametrize("bad", ["dtype", "cols", "rows", "strided", "shape"])
def test_refuses_what_it_was_not_compiled_for(cpu, bad):
    sm = cpu.libraries.softmaxes.get(4, 6)
    x = np.zeros((4, 6), np.float32)
    out = np.zeros((4, 6), np.float32)
    if bad == "dtype":
        x = x.astype(np.float64)
    elif bad == "cols":
        x, out = np.zeros((4, 5), np.float32), np.zeros((4, 5), np.float32)
    elif bad == "rows":
        x, out = np.zeros((5, 6), np.float32), np.zeros((5, 6), np.float32)
    elif bad == "strided":
        x = np.zeros((4, 12), np.float32)[:, ::2]
    else:
        out = np.zeros((2, 6), np.float32)
    with pytest.raises(InvalidArgument, match="softmax"):
        sm(x, out)


def test_sdpa_without_causal_mask_uses_it(kit, stream):
    if kit.dev.name != "cpu":
        pytest.skip("the cpu device's softmax")
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 3, 37, 16)).astype(np.float32) for _ in range(3))
    mask = rng.standard_normal((37, 37)).astype(np.float32)
    ref = F.scaled_dot_product_attention(*(torch.from_numpy(a).double() for a in (q, k, v)),
                                         attn_mask=torch.from_numpy(mask).double())
    out = kit.out(tuple(ref.shape), "float32")
    sdpa(stream, out, kit.tensor(q), kit.tensor(k), kit.tensor(v), kit.tensor(mask))
    kit.close(kit.read(out), ref, "float32")
    assert any(cols == 37 for _, cols in kit.dev.libraries.softmaxes.shapes())


@pytest.mark.parametrize("lq,s", [(37, 37), (150, 150), (20, 37)])
def test_causal_sdpa_uses_it_where_a_block_sees_every_key(kit, stream, monkeypatch, lq, s):
    """Causal blocks whose last row sees all s keys (GPT-2's 128 tokens; the last block of
    150, past the 128-row causal block) take the compiled softmax, the masked scores -inf;
    the others keep numpy's passes (20 queries over 37 keys never see every key)."""
    if kit.dev.name != "cpu":
        pytest.skip("the cpu device's softmax")
    # Unmasked float32 attention takes the fused kernel (backends/cpu/ops/attention.py); the block
    # loop, which this softmax serves, still takes masked and half-type attention.
    monkeypatch.setattr(cpu_attention, "takes", lambda *a: False)
    cache = kit.dev.libraries.softmaxes
    asked, calls = cache.get, []

    def get(rows: int, cols: int):
        calls.append((rows, cols))
        sm = asked(rows, cols)
        inner = sm.__call__

        class Counted:
            rows, cols = sm.rows, sm.cols

            def __call__(self, src, dst):
                calls.append("ran")
                inner(src, dst)
        return Counted()
    monkeypatch.setattr(cache, "get", get)
    rng = np.random.default_rng(lq + s)
    q = rng.standard_normal((1, 2, lq, 16)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, s, 16)).astype(np.float32) for _ in range(2))
    ref = F.scaled_dot_product_attention(*(torch.from_numpy(a).double() for a in (q, k, v)),
                                         is_causal=True)
    out = kit.out(tuple(ref.shape), "float32")
    sdpa(stream, out, kit.tensor(q), kit.tensor(k), kit.tensor(v), None, 0.0, True)
    kit.close(kit.read(out), ref, "float32")
    assert ("ran" in calls) == (lq >= s)
    assert all(c == "ran" or c[1] == s for c in calls)
