"""What the cuda library ops share: scratch and workspace memory, alignment, packed copies,
and the one module of own CUDA kernels with its load and launch helpers."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from aotrt.errors import DeviceError
from aotrt.program.strides import contiguous_strides
from aotrt.runtime.tensor import Handle
from aotrt.sources import source

if TYPE_CHECKING:
    from aotrt.runtime.backends.cuda.device import CudaDevice, CudaStream

log = logging.getLogger(__name__)

Work = Callable[["CudaStream"], None]

# cudaDataType codes of the float dtypes
CUDA_TYPE = {"float32": 0, "float16": 2, "bfloat16": 14}


def align(ptr: int) -> int:
    """The largest power of two (at most 256) that divides `ptr`."""
    if ptr == 0:
        return 256
    return min(256, ptr & -ptr)


def alignment(*byte_values: int) -> int:
    """The alignment (at most 16) shared by base addresses and byte offsets (0 is free)."""
    al = 16
    for v in byte_values:
        if v:
            al = min(al, align(v))
    return al


# ---------------------------------------------------------------------------------------------
# scratch


class Scratch:
    """Device memory for the length of one work item, in stream order on `stream`.

    It comes straight from the driver's stream-ordered allocator (cuMemAllocAsync), or,
    while the stream is being captured into a CUDA graph, from the capture's own blocks
    (backends/cuda/graphs.CaptureScratch), which the graph keeps.
    """

    def __init__(self, stream: "CudaStream", nbytes: int) -> None:
        from cuda.bindings import driver

        self._stream = stream
        self._captured = stream.capture_scratch if stream.capturing else None
        if self._captured is not None:
            self.ptr = self._captured.take(nbytes)
            return
        err, ptr = driver.cuMemAllocAsync(max(nbytes, 1), stream.handle)
        if int(err) != 0:
            raise DeviceError(f"cuda: scratch of {nbytes} bytes: {err}")
        self.ptr = int(ptr)

    def free(self) -> None:
        """Give the memory back after everything enqueued so far on the stream."""
        from cuda.bindings import driver

        if self.ptr and self._captured is not None:
            self._captured.give(self.ptr)
        elif self.ptr:
            driver.cuMemFreeAsync(self.ptr, self._stream.handle)
        self.ptr = 0


def stream_workspace(stream: "CudaStream", nbytes: int) -> int:
    """A per-stream workspace of at least `nbytes`; grows in stream order (old one freed
    after the work already enqueued that uses it)."""
    cur = stream.workspace
    if cur is not None and cur[1] >= nbytes:
        return cur[0]
    if stream.capturing:
        raise DeviceError(f"cuda: a library op needs {nbytes} bytes of workspace while "
                          f"capturing a graph; run once without capture first")
    # Sized to the largest request rounded to 1 MiB, not a fixed 32 MiB floor: the ops'
    # plans know their workspace at load, the warm-up run before a capture sees them all,
    # and the floor alone was a third of YOLOv8n's device memory on the H200.
    size = -(-nbytes // (1 << 20)) * (1 << 20)
    buf = stream.device.core.allocate(size, stream=stream.cs)
    if cur is not None:
        if stream.workspace_baked:
            stream.retired.append(cur[2])   # a captured graph still writes into it
        else:
            cur[2].close(stream.cs)
    stream.workspace = (int(buf.handle), size, buf)
    stream.workspace_baked = False
    return int(buf.handle)


def replayed(work: Work) -> Work:
    """`work` (a library op's, over fixed addresses), captured into a CUDA graph on its
    second call and launched as that graph from then on.

    A planned command runs on every run() without graphs, and cuDNN's execute costs about
    45 us of Python each time (h200-host-profile, 2026-12-02) against a few for a graph
    launch. A command made for one run is called once and never captured; inside a
    whole-run capture, on another stream, or where capture fails, `work` runs as it is.
    """
    state: dict[str, Any] = {"calls": 0, "tried": False, "graph": None, "stream": None}

    def run(s: "CudaStream") -> None:
        graph = state["graph"]
        if graph is not None and s is state["stream"] and not s.capturing:
            graph.launch(s)
            return
        state["calls"] += 1
        if state["calls"] < 2 or state["tried"] or s.capturing:
            work(s)
            return
        state["tried"] = True
        try:
            graph = s.capture(work)
        except Exception as e:  # noqa: BLE001 - the plain call below reports real errors
            log.info("library op not captured (%s); it runs as it is", e)
            work(s)
            return
        state["graph"], state["stream"] = graph, s
        s.workspace_baked = s.workspace is not None
        graph.launch(s)
    return run


# ---------------------------------------------------------------------------------------------
# packed copies


def copy_packed(dev: "CudaDevice", s: "CudaStream", dst: int, src: Handle,
                strides: Sequence[int] | None = None) -> None:
    """Enqueue a copy of view `src` into packed memory at `dst`, laid out by `strides`
    (row-major when None)."""
    st = contiguous_strides(src.sizes) if strides is None else strides
    dev.strided_work(dst, src.address, src.sizes, st, src.strides, src.dtype.itemsize, None)(s)


def copy_unpacked(dev: "CudaDevice", s: "CudaStream", dst: Handle, src: int,
                  strides: Sequence[int] | None = None) -> None:
    """Enqueue a copy of packed memory at `src`, laid out by `strides` (row-major when None),
    into view `dst`."""
    st = contiguous_strides(dst.sizes) if strides is None else strides
    dev.strided_work(dst.address, src, dst.sizes, dst.strides, st, dst.dtype.itemsize, None)(s)


def broadcast_strides(h: Handle, shape: Sequence[int]) -> tuple[int, ...]:
    """Strides reading `h` broadcast (numpy rules) to `shape`: 0 on broadcast dims."""
    pad = len(shape) - h.ndim
    out = []
    for i, n in enumerate(shape):
        j = i - pad
        if j < 0 or h.sizes[j] == 1:
            out.append(0)
        else:
            out.append(h.strides[j])
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# own kernels
#
# Each op keeps its CUDA C beside its Python (pool.cu, upsample.cu, sdpa.cu, conv.cu,
# topk.cu); this (prelude.cuh) is what they share. Sizes and strides travel as kernel
# arguments, so one compiled module (cached on disk) serves every shape. Values are
# computed in float; T is the storage type.

PRELUDE = source(__package__, "prelude.cuh")


def kernel(dev: "CudaDevice", source: str, name: str) -> Any:
    """Kernel `name` of an op's CUDA C `source` (compiled after PRELUDE, once per device)."""
    try:
        return dev.compile_cubin(PRELUDE + source, f"library op kernel {name}").get_kernel(name)
    except DeviceError:
        raise
    except Exception as e:  # noqa: BLE001
        raise DeviceError(f"cuda: kernel {name}: {e}") from e


def launch(dev: "CudaDevice", source: str, name: str, threads: int, args: list) -> Work:
    """Work launching kernel `name` of `source` over `threads` threads with `args`."""
    from cuda.core import launch as _core_launch

    kern = kernel(dev, source, name)
    cfg = dev.launch_config(threads)
    args = typed(args)

    def work(s: "CudaStream") -> None:
        _core_launch(s.cs, cfg, kern, *args)
    return work


def typed(args: list) -> list:
    """Python ints as int64 (pointers and sizes are 8-byte kernel parameters)."""
    return [np.int64(a) if isinstance(a, int) and not isinstance(a, bool) else a
            for a in args]


def i32(v: int) -> np.int32:
    """A 4-byte int kernel parameter."""
    return np.int32(v)
