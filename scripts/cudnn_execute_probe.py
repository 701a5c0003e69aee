"""On the GPU machine: host time of one cuDNN frontend graph execute, by calling form.

    python3 scripts/cudnn_execute_probe.py

Builds one fp16 NHWC 3x3 convolution graph the way ops/cuda/conv.py does and times (host
only, the stream is synced once at the end) execute() with a Tensor-keyed dict (what the
runtime does), a uid-keyed dict, and the ordered form (a list of pointers with
tensor_uids), then checks the three wrote the same output.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aotrt.runtime.device import get_device  # noqa: E402
from aotrt.runtime.ops.cuda.libraries import Dnn  # noqa: E402


def main() -> None:
    """Build, run each form 200 times, print microseconds per call."""
    dev = get_device("cuda")
    dnn = dev.libraries.state(Dnn)
    cudnn = dnn.cudnn
    n, c, h, w, k = 1, 64, 56, 56, 64
    dt = cudnn.data_type.HALF
    g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=dnn.handle)
    X = g.tensor(name="x", dim=[n, c, h, w], stride=[h * w * c, 1, w * c, c], data_type=dt)
    W = g.tensor(name="w", dim=[k, c, 3, 3], stride=[9 * c, 1, 3 * c, c], data_type=dt)
    Y = g.conv_fprop(image=X, weight=W, padding=[1, 1], stride=[1, 1], dilation=[1, 1],
                     compute_data_type=cudnn.data_type.FLOAT, name="conv")
    Y.set_output(True).set_data_type(dt).set_dim([n, k, h, w]).set_stride(
        [h * w * k, 1, w * k, k])
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    ws_size = max(int(g.get_workspace_size()), 1)
    core = dev.core
    stream = core.create_stream()
    bufs = {name: core.allocate(nb, stream=stream) for name, nb in
            (("x", n * c * h * w * 2), ("w", k * c * 9 * 2), ("y", n * k * h * w * 2),
             ("ws", ws_size))}
    ptr = {name: int(b.handle) for name, b in bufs.items()}
    rng = np.random.default_rng(0)
    from cuda.bindings import driver
    for name in ("x", "w"):
        arr = rng.standard_normal(int(bufs[name].size) // 2).astype(np.float16)
        driver.cuMemcpyHtoD(ptr[name], arr.ctypes.data, arr.nbytes)
    cudnn.set_stream(dnn.handle, int(stream.handle))
    uids = [X.get_uid(), W.get_uid(), Y.get_uid()]
    forms = {
        "dict by Tensor": lambda: g.execute({X: ptr["x"], W: ptr["w"], Y: ptr["y"]}, ptr["ws"],
                                            handle=dnn.handle),
        "dict by uid": lambda: g.execute({uids[0]: ptr["x"], uids[1]: ptr["w"],
                                          uids[2]: ptr["y"]}, ptr["ws"], handle=dnn.handle),
        "ordered": lambda: g.execute([ptr["x"], ptr["w"], ptr["y"]], ptr["ws"],
                                     handle=dnn.handle, tensor_uids=uids),
    }
    outs = {}
    for label, fn in forms.items():
        try:
            for _ in range(10):
                fn()
            stream.sync()
            t0 = time.perf_counter()
            for _ in range(200):
                fn()
            host = (time.perf_counter() - t0) / 200
            stream.sync()
            y = np.empty(n * k * h * w, np.float16)
            driver.cuMemsetD8(ptr["y"], 0, y.nbytes)
            fn()
            stream.sync()
            driver.cuMemcpyDtoH(y.ctypes.data, ptr["y"], y.nbytes)
            outs[label] = y
            print(f"{label:16s} {host * 1e6:8.1f} us a call (host)")
        except Exception as e:  # noqa: BLE001 - a form this frontend refuses
            print(f"{label:16s} refused: {type(e).__name__}: {str(e)[:200]}")
    ref = next(iter(outs.values()))
    for label, y in outs.items():
        print(f"{label:16s} same output: {bool(np.array_equal(y, ref))}")


if __name__ == "__main__":
    main()
