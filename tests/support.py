"""Helpers shared by the tests: small hand-built kernels, host upload/download, references."""

from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path
from types import FrameType
from typing import Any, Iterator, Sequence

import numpy as np

import aotrt
from aotrt.kernels import ir
from aotrt.runtime.device import Device, KernelFunction, KernelLibrary
from aotrt.runtime.tensor import Handle

_LIBS: dict[tuple[str, ir.Kernel], KernelLibrary] = {}


def kname(prefix: str, *parts: Any) -> str:
    """A deterministic kernel name from its parameters (so the on-disk cache can hit)."""
    text = "_".join([prefix, *("x".join(map(str, p)) if isinstance(p, (tuple, list)) else str(p)
                               for p in parts)])
    return re.sub(r"[^0-9A-Za-z_]", "m", text)


def kernel_fn(dev: Device, kernel: ir.Kernel) -> KernelFunction:
    """A fresh KernelFunction for `kernel`; its library is compiled once per session."""
    key = (dev.name, kernel)
    if key not in _LIBS:
        _LIBS[key] = dev.kernel_library([kernel])
    return _LIBS[key].kernel(kernel.name)


def copy_kernel(sizes: Sequence[int], dst_strides: Sequence[int], src_strides: Sequence[int],
                dtype: str = "float32") -> ir.Kernel:
    """out[dst_strides] = in[src_strides] over `sizes`; args (src 'r', dst 'w')."""
    sizes, ds, ss = tuple(sizes), tuple(dst_strides), tuple(src_strides)
    return ir.Kernel(kname("copy", sizes, ds, ss, dtype), sizes, (),
                     (ir.Arg(dtype, "r"), ir.Arg(dtype, "w")),
                     (ir.store(1, ds, ir.load(0, ss, dtype)),))


def affine_kernel(sizes: Sequence[int], src_strides: Sequence[int], dst_strides: Sequence[int],
                  scale: float, bias: float, dtype: str = "float32") -> ir.Kernel:
    """out = in * scale + bias, each through its own strides; args (src 'r', dst 'w')."""
    sizes, ss, ds = tuple(sizes), tuple(src_strides), tuple(dst_strides)
    val = ir.Op("add", (ir.Op("mul", (ir.load(0, ss, dtype), ir.const(scale, dtype)), dtype),
                        ir.const(bias, dtype)), dtype)
    return ir.Kernel(kname("affine", sizes, ss, ds, scale, bias, dtype), sizes, (),
                     (ir.Arg(dtype, "r"), ir.Arg(dtype, "w")), (ir.store(1, ds, val),))


def iota_kernel(sizes: Sequence[int], strides: Sequence[int], base: float = 1.0,
                dtype: str = "float32") -> ir.Kernel:
    """out[i] = base + flat index i (row-major over `sizes`); one argument ('w')."""
    sizes, st = tuple(sizes), tuple(strides)
    flat = ir.strided_index(tuple(int(np.prod(sizes[d + 1:])) for d in range(len(sizes))))
    val = ir.Op("add", (ir.cast(flat, dtype), ir.const(base, dtype)), dtype)
    return ir.Kernel(kname("iota", sizes, st, base, dtype), sizes, (), (ir.Arg(dtype, "w"),),
                     (ir.store(0, st, val),))


def iota(sizes: Sequence[int], base: float = 1.0, dtype: Any = np.float32) -> np.ndarray:
    """What iota_kernel writes, as a numpy array."""
    return (np.arange(int(np.prod(sizes)), dtype=np.float64) + base).reshape(sizes).astype(dtype)


def upload(h: Handle, array: np.ndarray) -> None:
    """Write `array` into `h`'s elements from the host, after the wait it needs."""
    h.alloc.settle()
    h.device.write(h, np.asarray(array))


def rand(shape: Sequence[int], dtype: Any = np.float32, seed: int | None = None) -> np.ndarray:
    """Fresh random values (never zeros), in [0.5, 1.5) with random signs."""
    rng = np.random.default_rng(seed)
    mag = rng.uniform(0.5, 1.5, size=tuple(shape))
    sign = np.where(rng.random(size=tuple(shape)) < 0.5, -1.0, 1.0)
    return (mag * sign).astype(dtype)


def rel_err(got: Any, ref: Any) -> float:
    """max |got - ref| / max(|ref|, tiny), in float64."""
    g = np.asarray(got, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if r.size == 0:
        return 0.0
    return float(np.max(np.abs(g - r)) / max(float(np.max(np.abs(r))), 1e-30))


#: a compiled library's kernel `k_flag` (backends/cpu/native.py, cpu_stream.py tests)
FLAG_SOURCE = """#include <stdint.h>
int32_t aotrt_error = 0;
/* sets the error flag to P[0][0] where it is not 0; else writes 7 to P[0][1] */
void k_flag(char **P, int64_t b, int64_t e, int64_t t) {
  int64_t *x = (int64_t *)P[0];
  if (x[0]) __atomic_store_n(&aotrt_error, (int32_t)x[0], __ATOMIC_RELAXED);
  else x[1] = 7;
}
"""


class TooMuchWork(BaseException):
    """Raised inside the code under test when it runs past a `bounded_steps` limit; a
    BaseException, so that no `except Exception` in aotrt turns it into a refusal."""


class Steps:
    """Python lines that aotrt's code ran inside a `bounded_steps` block."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0


_AOTRT_DIR = str(Path(aotrt.__file__).resolve().parent)


@contextlib.contextmanager
def bounded_steps(limit: int) -> Iterator[Steps]:
    """Count the lines of aotrt code run in this thread; raise TooMuchWork past `limit`.

    aotrt's code includes the methods that dataclasses generate for its IR nodes (compiled
    from "<string>"): a hash or == that recurses into shared IR counts too.

    A deterministic stand-in for "this is fast": a walk that expands shared IR, or a loop
    over a hostile size, runs far more lines than the limit, whatever the machine's speed.
    """
    steps = Steps(limit)

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            steps.count += 1
            if steps.count > limit:
                sys.settrace(None)
                raise TooMuchWork(f"more than {limit} lines of aotrt code ran")
        return local

    def call(frame: FrameType, event: str, arg: Any) -> Any:
        # Only aotrt's frames are traced line by line: numpy and the tests cost nothing.
        name = frame.f_code.co_filename
        return local if name.startswith(_AOTRT_DIR) or name == "<string>" else None

    old = sys.gettrace()
    sys.settrace(call)
    try:
        yield steps
    finally:
        sys.settrace(old)
