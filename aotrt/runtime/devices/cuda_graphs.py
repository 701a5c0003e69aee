"""The shape of the CUDA graphs the cuda device captures (devices/cuda.py): programmatic
(early-launch) edges made full dependencies before a graph is instantiated."""

from __future__ import annotations

from typing import Any

from aotrt.errors import DeviceError

try:
    from cuda.bindings import driver as _drv
except Exception:  # noqa: BLE001 - the cuda device says it is unavailable (devices/cuda.py)
    _drv = None


def _ok(result: Any, what: str) -> Any:
    """The values of a cuda.bindings (err, *values) result; DeviceError on an error."""
    if int(result[0]) != 0:
        raise DeviceError(f"cuda: {what} failed: {result[0]}")
    return result[1:]


def serialize_graph(graph: Any) -> int:
    """Make every programmatic (early-launch) edge of a captured graph a full dependency;
    returns how many there were.

    cuBLASLt and cuDNN launch some kernels on the H200 with programmatic stream
    serialization: captured back to back, such a kernel may start while the one before it
    still runs. The memory plan reuses arena bytes and the stream's one library workspace
    on the promise that each instruction ends before the next begins, so an early start can
    overwrite what the one before still reads. ResNet-50 at batch 32 with graphs gave
    other answers from run to run (4 of 32 samples off by up to 15; probe of 2026-12-03,
    scripts/cuda_first_replay_probe.py), and the same program without graphs, where each
    library op is a graph of its own, never did.
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
    _ok(remove(graph, f, t, d, len(early)), "graph edge removal")
    _ok(add(graph, f, t, None, len(early)), "graph edge")
    return len(early)


__all__ = ["serialize_graph"]
