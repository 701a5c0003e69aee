"""Fixtures for the library-op tests: `kit` builds input/output views in every layout on
the test's stream (tests/conftest.py's `stream`: each device, async and deferred, hazard
checked) inside the test's `owner`, and deletes them at the end, so the owner's leak check
also proves the ops created no handles.

Layouts: 'packed' (row-major at offset 0), 'offset' (row-major at an element offset),
'strided' (non-packed: padded dims, like a slice of a bigger tensor, at an offset),
'transposed' (dense, dims in reverse memory order, at an offset), 'channels_last' (NHWC at
offset 0 for 4-D views, else row-major), 'channel_slice' (channels 8.. of an NHWC buffer
with 11 more channels: a concatenation's part, as channels-last networks such as DLA-34
make). Bytes of the parent
around each view hold sentinels, so tests can prove an op wrote only its view.

A device whose op is not implemented raises Unsupported, and its test fails: a missing
cuda op is a defect to see, not a skip (issue #9).
"""

from __future__ import annotations

import zlib
from typing import Any, Iterator

import ml_dtypes
import numpy as np
import pytest

from aotrt.dtypes import as_dtype
from aotrt.program.strides import contiguous_strides, numel_of
from aotrt.runtime import shims
from aotrt.runtime.device import Stream
from aotrt.runtime.memory import Owner
from aotrt.runtime.tensor import Handle

NP = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
      "bfloat16": np.dtype(ml_dtypes.bfloat16), "int64": np.dtype(np.int64),
      "int32": np.dtype(np.int32), "bool": np.dtype(np.bool_)}
TOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 2e-2}
LAYOUTS = ("packed", "offset", "strided", "transposed", "channels_last")


def geometry(shape: tuple[int, ...], layout: str) -> tuple[tuple[int, ...], int]:
    """(strides, element offset) of a view of `shape` in `layout`."""
    if layout == "packed":
        return contiguous_strides(shape), 0
    if layout == "offset" or (layout in ("strided", "transposed") and len(shape) == 0):
        return contiguous_strides(shape), 5
    if layout == "strided":
        padded = tuple(n + 1 for n in shape[:-1]) + (2 * shape[-1] + 1,)
        return contiguous_strides(padded), 3
    if layout == "transposed":
        rev = contiguous_strides(tuple(reversed(shape)))
        return tuple(reversed(rev)), 2
    if layout in ("channels_last", "channel_slice"):
        # NHWC (NDHWC for 5-D), aligned at offset 0: what a channels-last export gives
        # cuDNN directly; or a channel slice of a wider such buffer
        if len(shape) not in (4, 5):
            return contiguous_strides(shape), 0
        extra = 11 if layout == "channel_slice" else 0
        order = (0, *range(2, len(shape)), 1)          # outermost to innermost
        inner = contiguous_strides(tuple(shape[d] + (extra if d == 1 else 0) for d in order))
        strides = [0] * len(shape)
        for d, st in zip(order, inner):
            strides[d] = st
        return tuple(strides), (8 if extra else 0)
    raise ValueError(layout)


class Kit:
    """Builds views with known contents and checks results."""

    def __init__(self, stream: Stream, rng: np.random.Generator) -> None:
        self.stream = stream
        self.dev = stream.device
        self.rng = rng
        self._parents: dict[int, tuple[Handle, np.ndarray, np.ndarray]] = {}
        self.handles: list[Handle] = []

    def view(self, h: Handle, sizes: Any, strides: Any, offset: int) -> Handle:
        """shims.reinterpret_tensor, deleted at the end of the test."""
        v = shims.reinterpret_tensor(h, sizes, strides, offset)
        self.handles.append(v)
        return v

    def delete_all(self) -> None:
        """Delete every handle the kit made that the test did not delete itself."""
        for h in reversed(self.handles):
            if h.state == "live":
                shims.delete_tensor_object(h)

    def randn(self, shape: tuple[int, ...], dtype: str, scale: float = 1.0) -> np.ndarray:
        """Fresh random values, rounded to `dtype`."""
        return (self.rng.standard_normal(shape) * scale).astype(NP[dtype])

    def tensor(self, values: np.ndarray, layout: str = "packed",
               strides: tuple[int, ...] | None = None, offset: int | None = None) -> Handle:
        """A view holding `values`, in `layout` (or at explicit strides/offset)."""
        values = np.asarray(values)
        shape = tuple(values.shape)
        if strides is None:
            strides, off = geometry(shape, layout)
            offset = off if offset is None else offset
        offset = offset or 0
        hi = sum((n - 1) * s for n, s in zip(shape, strides) if n > 0) + 1
        parent_n = offset + (hi if numel_of(shape) else 0) + 4
        dt = as_dtype(values.dtype)
        with self.dev.stream_guard(self.stream):
            base = shims.empty_strided([parent_n], None, dt, self.dev)
        self.handles.append(base)
        if values.dtype == np.bool_:
            fill = np.ones(parent_n, dtype=np.bool_)
        elif values.dtype.kind in "iu":
            # int8 and uint8 (linear_wq's packed weights) hold no 7777
            fill = np.full(parent_n, 7777 if values.dtype.itemsize > 1 else 77,
                           dtype=values.dtype)
        else:
            fill = np.full(parent_n, -999.0).astype(values.dtype)
        self.dev.write(base, fill)
        view = self.view(base, shape, strides, offset)
        self.dev.write(view, values)
        covered = np.zeros(parent_n, dtype=bool)
        if numel_of(shape):
            np.lib.stride_tricks.as_strided(
                covered[offset:], shape, [s * covered.itemsize for s in strides])[...] = True
        self._parents[id(view)] = (base, fill, covered)
        return view

    def out(self, shape: tuple[int, ...], dtype: str, layout: str = "packed") -> Handle:
        """An output view pre-filled with values the op must overwrite (NaN for floats)."""
        if NP[dtype].kind == "f" or dtype == "bfloat16":
            vals = np.full(shape, np.nan).astype(NP[dtype])
        elif dtype == "bool":
            vals = np.zeros(shape, dtype=bool)
        else:
            vals = np.full(shape, -4242, dtype=NP[dtype])
        return self.tensor(vals, layout)

    def read(self, h: Handle) -> np.ndarray:
        """The view's values (waits for pending writes), checking its parent's other bytes
        were left alone."""
        got = h.numpy()
        if id(h) in self._parents:
            base, fill, covered = self._parents[id(h)]
            now = base.numpy()
            same = (now[~covered].view(np.uint8) == fill[~covered].view(np.uint8))
            assert same.all(), "op wrote outside its output view"
        return got

    @staticmethod
    def t64(a: np.ndarray) -> Any:
        """A float64 torch tensor of numpy values (any float dtype, bf16 included)."""
        import torch

        return torch.from_numpy(np.asarray(a, dtype=np.float64))

    def close(self, got: np.ndarray, ref: Any, dtype: str, tol: float | None = None) -> None:
        """Assert max |got - ref| / max |ref| <= tol (ref in float64)."""
        ref = np.asarray(ref, dtype=np.float64)
        got = np.asarray(got, dtype=np.float64)
        assert got.shape == ref.shape, (got.shape, ref.shape)
        if ref.size == 0:
            return
        assert np.isfinite(got).all() == np.isfinite(ref).all(), "non-finite mismatch"
        scale = max(np.abs(ref).max(), 1e-30)
        err = np.abs(got - ref).max() / scale
        limit = TOL[dtype] if tol is None else tol
        assert err <= limit, f"relative error {err:.3g} > {limit:g} ({dtype})"


def check_tf32(dev_name: str, got: dict[str, np.ndarray], ref: Any) -> None:
    """The verdict of a TF32 test: the default ("ieee") result keeps float32 accuracy; the
    TF32 one stays within TF32's; on cuda the TF32 one is measurably less exact (the flag
    took effect), and on cpu, which has no TF32, both are the same bits."""
    ref = np.asarray(ref, dtype=np.float64)
    scale = float(np.abs(ref).max())
    ieee, t = (float(np.abs(np.asarray(got[n], np.float64) - ref).max()) / scale
               for n in ("ieee", "tf32"))
    assert ieee < 1e-5, ieee
    assert t < 3e-3, t
    if dev_name == "cuda":
        assert t > 10 * ieee, (t, ieee)
    else:
        assert np.array_equal(got["ieee"], got["tf32"])


@pytest.fixture
def kit(stream: Stream, owner: Owner, request: pytest.FixtureRequest) -> Iterator[Kit]:
    """A Kit on the test's stream; its handles are deleted before the owner's leak check."""
    k = Kit(stream, np.random.default_rng(zlib.crc32(request.node.nodeid.encode())))
    yield k
    k.delete_all()


@pytest.fixture
def dnnl() -> Any:
    """The cpu device's oneDNN state; skips where onednn-cpu-gomp is not installed (a test
    file may override it, as test_dnnl.py does to take any matmul implementation)."""
    from aotrt.runtime.device import get_device
    from aotrt.runtime.backends.cpu import dnnl as cpu_dnnl

    if cpu_dnnl.find_library() is None:
        pytest.skip(f"{cpu_dnnl.DIST} is not installed")
    d = get_device("cpu").libraries.dnnl
    assert d is not None, "onednn-cpu-gomp is installed but the device did not load it"
    return d
