"""The shape of the CUDA graphs the cuda device captures (backends/cuda/device.py): programmatic
(early-launch) edges made full dependencies before a graph is instantiated, and the scratch
memory library ops take while a stream is captured (plain allocations the graph keeps, not
graph memory nodes)."""

from __future__ import annotations

import bisect
import logging
from typing import Any, Sequence

from aotrt.errors import DeviceError, OutOfMemory, Unsupported

log = logging.getLogger(__name__)

try:
    from cuda.bindings import driver as _drv
except Exception:  # noqa: BLE001 - the cuda device says it is unavailable (backends/cuda/device.py)
    _drv = None


def _ok(result: Any, what: str) -> Any:
    """The values of a cuda.bindings (err, *values) result; DeviceError on an error."""
    if int(result[0]) != 0:
        raise DeviceError(f"cuda: {what} failed: {result[0]}")
    return result[1:]


#: cuGraphRemoveDependencies' answer for a graph it cannot change
_NOT_SUPPORTED = 801


def serialize_graph(graph: Any) -> int:
    """Make every programmatic (early-launch) edge of a captured graph a full dependency;
    returns how many there were.

    cuBLASLt and cuDNN launch some kernels on the H200 with programmatic stream
    serialization: captured back to back, such a kernel may start while the one before it
    still runs. The memory plan reuses arena bytes and the stream's one library workspace
    on the promise that each instruction ends before the next begins, so an early start can
    overwrite what the one before still reads. ResNet-50 at batch 32 with graphs gave
    other answers from run to run (4 of 32 samples off by up to 15; probe of 2026-12-03,
    bench/results/cuda/h200-2026-12-03-session23.md), and the same program without graphs,
    where each library op is a graph of its own, never did.
    """
    # CUDA 12 bindings name the edge-data calls *_v2; CUDA 13's plain names take edge data
    get = getattr(_drv, "cuGraphGetEdges_v2", _drv.cuGraphGetEdges)
    remove = getattr(_drv, "cuGraphRemoveDependencies_v2", _drv.cuGraphRemoveDependencies)
    add = getattr(_drv, "cuGraphAddDependencies_v2", _drv.cuGraphAddDependencies)
    res = get(graph, 0)
    _ok(res, "graph edges")
    count = int(res[-1])
    if count == 0:
        return 0
    res = _ok(get(graph, count), "graph edges")
    if len(res) < 4:
        return 0        # bindings without edge data: every edge is a default one
    src, dst, data, count = res[0], res[1], res[2], int(res[3])
    early = [i for i in range(count) if data[i] is not None and (
        int(data[i].type) != 0 or int(data[i].from_port) != 0)]
    if not early:
        return 0
    f, t, d = [src[i] for i in early], [dst[i] for i in early], [data[i] for i in early]
    res = remove(graph, f, t, d, len(early))
    if int(res[0]) == _NOT_SUPPORTED:
        # CUDA refuses to remove edges of a graph with memory allocation or free nodes.
        # Library scratch never makes those (CaptureScratch); anything else that did must
        # not leave early launches in the graph: the caller runs without one.
        raise Unsupported(f"cuda graph: its {len(early)} early-launch edges cannot be made "
                          f"full dependencies (the graph allocates memory: {res[0]})")
    _ok(res, "graph edge removal")
    _ok(add(graph, f, t, None, len(early)), "graph edge")
    return len(early)


def is_chain(graph: Any) -> bool:
    """Whether a graph's nodes run one after another: no node waits for two, or is waited
    for by two (what a capture from one stream gives, once its edges are serialized)."""
    res = _ok(_drv.cuGraphGetNodes(graph, 0), "graph nodes")
    nodes = int(res[-1])
    get = getattr(_drv, "cuGraphGetEdges_v2", _drv.cuGraphGetEdges)
    res = get(graph, 0)
    _ok(res, "graph edges")
    count = int(res[-1])
    if count == 0:
        return nodes <= 1
    res = _ok(get(graph, count), "graph edges")
    src, dst = [int(x) for x in res[0][:count]], [int(x) for x in res[1][:count]]
    return count == nodes - 1 and len(set(src)) == count and len(set(dst)) == count


class CaptureScratch:
    """Device memory that library ops take as scratch while a stream is being captured,
    kept for as long as the graph.

    cuMemAllocAsync under capture makes graph memory nodes, and CUDA cannot rewrite the
    early-launch edges of a graph that has them (CUDA_ERROR_NOT_SUPPORTED: six models of
    the H200 zoo, among them coat_lite_tiny and yolov3u, failed to run). A block given back
    is taken again by a later op of the same capture; that is right only in a graph whose
    nodes run one after another, which the stream checks (`is_chain`) when `reused`.
    """

    def __init__(self) -> None:
        self.blocks: list[int] = []                # every block, to free with the graph
        self._free: list[tuple[int, int]] = []     # (bytes, pointer), sorted
        self._size: dict[int, int] = {}
        self.reused = False
        # The graph may be freed on a thread where no context is current (the reaper).
        res = _drv.cuCtxGetCurrent()
        self._ctx = res[1] if int(res[0]) == 0 else None

    def take(self, nbytes: int) -> int:
        """A block of at least `nbytes` (the smallest free one that fits, else a new one)."""
        nbytes = max(-(-nbytes // 256) * 256, 256)
        i = bisect.bisect_left(self._free, (nbytes, 0))
        if i < len(self._free):
            _, ptr = self._free.pop(i)
            self.reused = True
            return ptr
        err, ptr = _drv.cuMemAlloc(nbytes)
        if int(err) != 0:
            raise OutOfMemory(f"cuda: graph scratch of {nbytes} bytes: {err}")
        ptr = int(ptr)
        self.blocks.append(ptr)
        self._size[ptr] = nbytes
        return ptr

    def give(self, ptr: int) -> None:
        """A block taken here is free for later ops of the capture."""
        bisect.insort(self._free, (self._size[ptr], ptr))

    def close(self) -> None:
        """Free every block (the graph that used them is gone); safe to call twice."""
        pushed = bool(self.blocks) and self._ctx is not None and \
            int(_drv.cuCtxPushCurrent(self._ctx)[0]) == 0
        try:
            for ptr in self.blocks:
                err = _drv.cuMemFree(ptr)[0]
                if int(err) != 0:
                    log.warning("cuda: freeing graph scratch failed: %s", err)
        finally:
            if pushed:
                _drv.cuCtxPopCurrent()
        self.blocks.clear()
        self._free.clear()
        self._size.clear()


class CudaGraph:
    """An instantiated CUDA graph captured from a stream; replay it with `launch`."""

    def __init__(self, graph: Any, exec_: Any, scratch: CaptureScratch | None = None) -> None:
        self._graph = graph
        self._exec = exec_
        self._scratch = scratch     # library scratch the graph's nodes use
        # Marks the end of a launch's input copies, so the host can wait for them alone.
        flags = _drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
        self._copied = _ok(_drv.cuEventCreate(flags), "event create")[0]
        self._pinned = 0            # page-locked host block for bound runs' inputs (staging)
        self._pinned_nbytes = 0
        res = _drv.cuCtxGetCurrent()
        self._ctx = res[1] if int(res[0]) == 0 else None

    def staging(self, nbytes: int) -> int:
        """A page-locked host block of at least `nbytes`, owned by this graph: a bound run
        writes its host inputs there and `launch` uploads them asynchronously in stream
        order (a pageable upload must synchronise, tens of microseconds an input)."""
        if nbytes > self._pinned_nbytes:
            self._free_pinned()
            self._pinned = int(_ok(_drv.cuMemAllocHost(max(nbytes, 64)), "pinned staging")[0])
            self._pinned_nbytes = max(nbytes, 64)
        return self._pinned

    def launch(self, stream: Any, copies: Sequence[tuple[int, int, int]] = (),
               uploads: Sequence[tuple[int, int, int]] = ()) -> None:
        """Copy `copies` ((dst, src, bytes) device addresses) and `uploads` ((dst, src, bytes)
        from this graph's staging block), then replay the whole graph on `stream`
        (asynchronously); `wait_copies` tells when the sources may be written again."""
        h = stream.cs.handle
        for dst, src, n in copies:
            _ok(_drv.cuMemcpyDtoDAsync(dst, src, n, h), "copy into the graph's inputs")
        for dst, src, n in uploads:
            _ok(_drv.cuMemcpyHtoDAsync(dst, src, n, h), "upload into the graph's inputs")
        _ok(_drv.cuEventRecord(self._copied, h), "event record")
        _ok(_drv.cuGraphLaunch(self._exec, h), "graph launch")

    def readback(self, nbytes: int, depth: int) -> "Readback":
        """A ring of `depth` page-locked slots of `nbytes` each, in this graph's context, that
        a loop of replays copies its outputs into (Loop in runtime/loop.py)."""
        return Readback(nbytes, depth, self._ctx)

    def _free_pinned(self) -> None:
        if not self._pinned:
            return
        pushed = self._ctx is not None and int(_drv.cuCtxPushCurrent(self._ctx)[0]) == 0
        try:
            # The last launch's uploads read the block: they end before it goes.
            _drv.cuEventSynchronize(self._copied)
            err = _drv.cuMemFreeHost(self._pinned)[0]
            if int(err) != 0:
                log.warning("cuda: freeing pinned staging failed: %s", err)
        finally:
            if pushed:
                _drv.cuCtxPopCurrent()
        self._pinned = self._pinned_nbytes = 0

    def wait_copies(self, stream: Any) -> None:
        """Block until the input copies of the last `launch` on `stream` are done (not the
        replay after them); a launch that failed is reported here, after a full wait."""
        if stream.failed:
            stream.commit_and_wait()    # raises the failure
        _ok(_drv.cuEventSynchronize(self._copied), "wait for the graph's input copies")

    def close(self) -> None:
        """Free the graph; safe to call twice."""
        if self._exec is not None:
            self._free_pinned()
            _drv.cuGraphExecDestroy(self._exec)
            _drv.cuGraphDestroy(self._graph)
            _drv.cuEventDestroy(self._copied)
            self._exec = self._graph = None
            if self._scratch is not None:
                self._scratch.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class Readback:
    """Page-locked host slots that replays' outputs are copied into in stream order, each with
    an event, so the host reads one step's outputs while the next step runs (a pageable
    download would synchronise the stream). Owned by one loop; `close` frees it."""

    def __init__(self, nbytes: int, depth: int, ctx: Any) -> None:
        self.nbytes = max(nbytes, 64)
        self._ctx = ctx
        self._events: list[Any] = []
        self.base = int(_ok(_drv.cuMemAllocHost(self.nbytes * depth), "pinned readback")[0])
        try:
            flags = _drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
            for _ in range(depth):
                self._events.append(_ok(_drv.cuEventCreate(flags), "event create")[0])
        except BaseException:
            self.close()
            raise

    def slot(self, k: int) -> int:
        """The host address of slot `k`."""
        return self.base + k * self.nbytes

    def download(self, stream: Any, k: int, srcs: Sequence[tuple[int, int]]) -> None:
        """Copy `srcs` ((device address, bytes), packed one after another) into slot `k` on
        `stream`, then mark the slot's event."""
        h, dst = stream.cs.handle, self.slot(k)
        for src, n in srcs:
            _ok(_drv.cuMemcpyDtoHAsync(dst, src, n, h), "read back a loop's outputs")
            dst += n
        _ok(_drv.cuEventRecord(self._events[k], h), "event record")

    def wait(self, k: int) -> None:
        """Block until slot `k`'s copies (and the work before them) are done; a fault of that
        work is reported here."""
        _ok(_drv.cuEventSynchronize(self._events[k]), "wait for a loop's outputs")

    def close(self) -> None:
        """Free the slots once no copy into them is pending; safe to call twice."""
        if not self.base and not self._events:
            return
        pushed = self._ctx is not None and int(_drv.cuCtxPushCurrent(self._ctx)[0]) == 0
        try:
            for ev in self._events:
                _drv.cuEventSynchronize(ev)
                _drv.cuEventDestroy(ev)
            self._events = []
            if self.base:
                err = _drv.cuMemFreeHost(self.base)[0]
                if int(err) != 0:
                    log.warning("cuda: freeing a loop's readback slots failed: %s", err)
                self.base = 0
        finally:
            if pushed:
                _drv.cuCtxPopCurrent()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


__all__ = ["CaptureScratch", "CudaGraph", "Readback", "is_chain", "serialize_graph"]
