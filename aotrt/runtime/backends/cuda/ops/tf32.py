"""Float32 convolutions that may use TF32: the tensor-core engines only where they pay.

cuDNN's heuristics rank TF32 tensor-core engines first for most NHWC float32 convolutions,
also where they are no faster: small, grouped and few-channel convolutions are bound by
memory or by the launch, and TF32's 10-bit mantissa then costs accuracy for nothing. In the
H200 zoo (2026-12-03, float32 under torch's own math flags) that gave RegNetX/Y-200MF an
error of 2.9e-4 and Swin3D 1.6e-4, where eager's cuDNN, on NCHW, had kept float32 engines
(2e-7). So, under Fp32Math(conv_tf32=True), both graphs are built and timed once, at load,
on scratch memory of their own, and the TF32 one is kept only where it is clearly faster.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Sequence

from aotrt.errors import DeviceError
from aotrt.runtime.backends.cuda.ops.common import Scratch

if TYPE_CHECKING:
    from aotrt.runtime.backends.cuda.device import CudaStream
    from aotrt.runtime.backends.cuda.libraries import Dnn

log = logging.getLogger(__name__)

#: TF32 is taken where its time is at most this share of the float32 engines' time
PAYS = 0.8
#: executions per timed graph launch, and timed launches (the least is kept)
REPS, LAUNCHES = 4, 3
#: the scratch operands hold 0.1f: zeros can run faster than data does
_FILL = 0x3DCCCCCD

#: (graph, x, w, b, r, y, workspace bytes) as backends/cuda/ops/conv.py builds it
Built = tuple


def prefers_tf32(exact_ms: float, tf32_ms: float) -> bool:
    """Whether TF32's time is a clear enough gain over float32's to give up its accuracy."""
    return tf32_ms <= PAYS * exact_ms


def faster_of(dnn: "Dnn", exact: Callable[[], Built], tf32: Callable[[], Built],
              nbytes: Sequence[int]) -> Built:
    """The graph `tf32()` builds where it runs in at most PAYS of the time of the one
    `exact()` builds, else the exact one. `nbytes`: the bytes of x, w, b, r and y. Where
    only one builds, that one; where timing fails, cuDNN's own choice (the TF32 graph)."""
    try:
        a = exact()
    except Exception as e:  # noqa: BLE001 - no float32 engine: TF32's graph, or its error
        log.debug("no float32 engine (%r): TF32", e)
        return tf32()
    try:
        b = tf32()
    except Exception as e:  # noqa: BLE001 - the float32 graph serves
        log.debug("no TF32 graph (%r): float32", e)
        return a
    try:
        s = dnn.tuning_stream()
        ta, tb = time_graph(dnn, s, a, nbytes), time_graph(dnn, s, b, nbytes)
    except Exception as e:  # noqa: BLE001 - timing is an optimisation: heuristics decide
        log.info("timing float32 against TF32 engines failed (%r): TF32 kept", e)
        return b
    pick = prefers_tf32(ta, tb)
    log.debug("float32 %.4f ms, TF32 %.4f ms: %s", ta, tb, "TF32" if pick else "float32")
    return b if pick else a


def time_graph(dnn: "Dnn", s: "CudaStream", built: Built, nbytes: Sequence[int]) -> float:
    """Milliseconds of one execution of the graph in `built` on `s`: REPS executions
    captured into one CUDA graph (so that the host's enqueue time stays out), the least of
    LAUNCHES launches, over scratch operands filled with 0.1."""
    from cuda.bindings import driver

    g, *tensors, wsize = built
    scratch: list[Scratch] = []
    replay = None
    try:
        pack: dict[Any, int] = {}
        for t, n in zip(tensors, nbytes):
            if t is None:
                continue
            sc = Scratch(s, n)
            scratch.append(sc)
            err, = driver.cuMemsetD32Async(sc.ptr, _FILL, n // 4, s.handle)
            if int(err) != 0:
                raise DeviceError(f"cuda: fill of {n} bytes of timing scratch: {err}")
            pack[t] = sc.ptr
        ws = Scratch(s, wsize) if wsize else None
        if ws is not None:
            scratch.append(ws)
        ws_ptr = ws.ptr if ws is not None else 0
        dnn.cudnn.set_stream(dnn.handle, s.handle)
        g.execute(pack, ws_ptr, handle=dnn.handle)      # the first run loads its kernels

        def body(st: "CudaStream") -> None:
            for _ in range(REPS):
                g.execute(pack, ws_ptr, handle=dnn.handle)

        replay = s.capture(body)
        replay.launch(s)
        best = float("inf")
        for _ in range(LAUNCHES):
            e0 = s.timing_event()
            replay.launch(s)
            e1 = s.timing_event()
            e1.sync()
            best = min(best, float(e1 - e0) / REPS)
        return best
    finally:
        for sc in scratch:
            sc.free()
        if replay is not None:
            s.commit_and_wait()
            replay.close()


__all__ = ["PAYS", "faster_of", "prefers_tf32", "time_graph"]
