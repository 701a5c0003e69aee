"""relu and relu6 in place over a float32 view on the cpu device, after a oneDNN convolution.

oneDNN's relu and clip post-ops are a vector max and min against the bound, which return
the bound for a NaN (`vmaxps`' second operand): relu(NaN) came out 0 where torch gives NaN,
a silent wrong answer for a NaN or an overflow inside the network. No oneDNN 3.2 eltwise
or binary post-op computes max(x, 0) and keeps a NaN, so these two activations run here,
as `x < 0 ? 0 : x` (a NaN and -0.0 kept, as in torch), in one more pass over the output.
The convolution keeps its bias and residual post-ops, and silu, which keeps a NaN, stays
a post-op. One library serves every view: the geometry is a kernel parameter.
"""

from __future__ import annotations

import ctypes
import logging
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from aotrt.errors import CompileError
from aotrt.runtime.backends.cpu import native as cpu_native
from aotrt.runtime.backends.cpu.library import OpSource
from aotrt.runtime.tensor import Handle
from aotrt.runtime.work import Work, native_of
from aotrt.sources import source

if TYPE_CHECKING:
    from aotrt.runtime.backends.cpu.device import CpuDevice

log = logging.getLogger(__name__)

#: the activations run here, by the kernel's code for them
CODES = {"relu": 1, "relu6": 2}
#: outer dims the kernel takes, after merging (a conv output has at most five)
MAX_DIMS = 6
#: floats of a row one work item covers: rows are split so both threads get work on a
#: dense output (one merged row)
CHUNK = 4096
SYMBOL = "aot_activation_in_place"
#: int64 parameters: outer dims, inner length, chunks per row, code, sizes, strides
_NPARAMS = 4 + 2 * MAX_DIMS

SOURCE = (source(__package__, "activation.c")
          .replace("MAX_DIMS", str(MAX_DIMS)).replace("CHUNK", str(CHUNK)))


def geometry(h: Handle) -> tuple[list[int], list[int], int] | None:
    """(outer sizes, outer strides, inner length) of a view, in elements: dims of size 1
    dropped, the rest in memory order and merged where contiguous across, the innermost
    the inner row when its stride is 1 (else rows of one). None: more than MAX_DIMS outer
    dims, or a negative or zero stride (a broadcast: the same float twice)."""
    dims = sorted(((n, s) for n, s in zip(h.sizes, h.strides) if n != 1), key=lambda d: -d[1])
    if any(s <= 0 for _, s in dims):
        return None
    merged: list[list[int]] = []
    for n, s in dims:
        if merged and merged[-1][1] == n * s:
            merged[-1] = [merged[-1][0] * n, s]
        else:
            merged.append([n, s])
    inner = 1
    if merged and merged[-1][1] == 1:
        inner = merged.pop()[0]
    if len(merged) > MAX_DIMS:
        return None
    return [n for n, _ in merged], [s for _, s in merged], inner


class Activation(OpSource):
    """The cpu device's in-place relu and relu6 (one library: every view is a parameter)."""

    def __init__(self, device: "CpuDevice") -> None:
        super().__init__(device, SOURCE, [SYMBOL])

    def after(self, work: Callable[[], None], out: Handle,
              activation: str) -> Callable[[], None] | None:
        """A work closure running `work`, then `activation` over `out` in place; None where
        the kernel does not take the view (not float32, a broadcast, too many dims) or
        cannot be built (conv.apply_epilogue's numpy then runs it). The native form is
        `work`'s, where it has one, and the kernel's step."""
        geo = geometry(out) if out.dtype.name == "float32" else None
        if activation not in CODES or geo is None or out.alloc is None:
            return None
        try:
            loaded = self.library()
        except CompileError as e:
            log.debug("no activation kernel (%s); numpy applies %s", e, activation)
            return None
        sizes, strides, inner = geo
        chunks = -(-inner // CHUNK)
        params = np.zeros(_NPARAMS, np.int64)
        params[:4] = (len(sizes), inner, chunks, CODES[activation])
        params[4:4 + len(sizes)] = sizes
        params[4 + MAX_DIMS:4 + MAX_DIMS + len(strides)] = strides
        n = int(np.prod(sizes, dtype=np.int64)) * chunks
        label = f"{activation} {list(out.sizes)}"
        worker = self.device.worker
        stats = getattr(self.device.libraries.dnnl, "stats", None)

        def pointers() -> Any:
            return (ctypes.c_void_p * 2)(out.address, params.ctypes.data)

        def run() -> None:
            work()
            loaded.call(SYMBOL, label, pointers(), n, getattr(worker, "threads", 1))
            if stats is not None:
                stats["activations"] += 1

        def native() -> cpu_native.Native | None:
            make = native_of(work)
            first = make() if make is not None else None
            if first is None or first.library not in (None, loaded):
                return None     # a Native keeps one library mapped: run from Python
            last = cpu_native.kernel(loaded, SYMBOL, label, pointers(), n,
                                     getattr(worker, "threads", 1))
            counts = dict(first.counts)
            counts["activations"] = counts.get("activations", 0) + 1
            return cpu_native.Native(first.steps + last.steps, keep=[first, last],
                                     library=loaded, label=label, dnnl=first.dnnl,
                                     counts=counts)

        return Work(run, native=native, keep=(work, params, loaded))


__all__ = ["CHUNK", "CODES", "MAX_DIMS", "SOURCE", "SYMBOL", "Activation", "geometry"]
