"""On the GPU machine: time aotrt's cuda library ops and kernel dispatch against torch.

    python3 scripts/cuda_probe.py [out.json]

Each probe prints one line and never stops the others; the JSON holds all numbers.
"""

from __future__ import annotations

import json
import sys
import time
import traceback

import numpy as np
import torch

from aotrt.runtime import shims
from aotrt.runtime.device import StreamOptions, get_device
from aotrt.runtime.ops import OPS

RESULTS: dict = {}
dev = get_device("cuda")
stream = dev.create_stream(StreamOptions(flush_interval=0))


KEEP: list = []  # torch tensors stay alive, so no region is ever rebound at a reused address


def wrap(t: torch.Tensor):
    """A zero-copy aotrt handle over a torch cuda tensor."""
    KEEP.append(t)
    ptr, sizes, strides, dt = dev.dlpack_info(t, stream)
    with dev.stream_guard(stream):
        return shims.create_tensor_from_blob(ptr, sizes, strides, 0, dt, device=dev)


def t_ours(fn, iters: int = 50) -> float:
    """Median ms of `fn()` enqueued on our stream, timed with events around each call."""
    for _ in range(3):
        fn()
    stream.commit_and_wait()
    times = []
    for _ in range(iters):
        e0 = stream.timing_event()
        fn()
        e1 = stream.timing_event()
        e1.sync()
        times.append(e1 - e0)
    return float(np.median(times))


def t_torch(fn, iters: int = 50) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def probe(name):
    def deco(f):
        try:
            r = f()
            RESULTS[name] = r
            print(f"ok   {name}: {r}", flush=True)
        except Exception as e:  # noqa: BLE001
            RESULTS[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
        return f
    return deco


@probe("gemm_4096_fp16")
def _():
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.half)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.half)
    o = torch.empty(4096, 4096, device="cuda", dtype=torch.half)
    ha, hb, ho = wrap(a), wrap(b), wrap(o)
    f = lambda: OPS["mm"](stream, [ho], [ha, hb])  # noqa: E731
    ms = t_ours(f, 20)
    tm = t_torch(lambda: torch.mm(a, b, out=o), 20)
    f()
    stream.commit_and_wait()
    return {"ours_ms": ms, "torch_ms": tm, "tflops": 2 * 4096 ** 3 / ms / 1e9,
            "rel": rel(o, a.float() @ b.float())}


@probe("linear_bert_fp16")
def _():
    x = torch.randn(8, 128, 768, device="cuda", dtype=torch.half)
    w = torch.randn(3072, 768, device="cuda", dtype=torch.half) * 0.03
    bias = torch.randn(3072, device="cuda", dtype=torch.half)
    o = torch.empty(8, 128, 3072, device="cuda", dtype=torch.half)
    hx, hw, hb, ho = wrap(x), wrap(w), wrap(bias), wrap(o)
    f = lambda: OPS["linear"](stream, [ho], [hx, hw, hb])  # noqa: E731
    ms = t_ours(f)
    tm = t_torch(lambda: torch.nn.functional.linear(x, w, bias))
    f()
    stream.commit_and_wait()
    return {"ours_ms": ms, "torch_ms": tm,
            "rel": rel(o, torch.nn.functional.linear(x.float(), w.float(), bias.float()))}


def conv_case(n, c, h, co, k, s, p, bias=True, cl=False):
    x = torch.randn(n, c, h, h, device="cuda", dtype=torch.half)
    w = torch.randn(co, c, k, k, device="cuda", dtype=torch.half) * 0.05
    b = torch.randn(co, device="cuda", dtype=torch.half) if bias else None
    if cl:
        x = x.to(memory_format=torch.channels_last)
        w = w.to(memory_format=torch.channels_last)
    ref = torch.nn.functional.conv2d(x, w, b, s, p)
    o = torch.empty_like(ref)
    hx, hw, ho = wrap(x), wrap(w), wrap(o)
    hb = wrap(b) if bias else None
    params = dict(stride=[s, s], padding=[p, p], dilation=[1, 1], transposed=False,
                  output_padding=[0, 0], groups=1)
    f = lambda: OPS["convolution"](stream, [ho], [hx, hw, hb], **params)  # noqa: E731
    t0 = time.perf_counter()
    f()
    stream.commit_and_wait()
    build = time.perf_counter() - t0
    err = rel(o, torch.nn.functional.conv2d(x.float(), w.float(), b.float() if bias else None,
                                            s, p))
    ms = t_ours(f)
    tm = t_torch(lambda: torch.nn.functional.conv2d(x, w, b, s, p))
    return {"ours_ms": ms, "torch_ms": tm, "rel": err, "first_s": build}


@probe("conv_r50_3x3_b32")
def _():
    return conv_case(32, 64, 56, 64, 3, 1, 1)


@probe("conv_r50_3x3_b32_channels_last")
def _():
    return conv_case(32, 64, 56, 64, 3, 1, 1, cl=True)


@probe("conv_r50_1x1_b32")
def _():
    return conv_case(32, 256, 56, 64, 1, 1, 0)


@probe("conv_r50_stem_b1")
def _():
    return conv_case(1, 3, 224, 64, 7, 2, 3)


@probe("conv_yolo_3x3_s2_b1")
def _():
    return conv_case(1, 16, 320, 32, 3, 2, 1)


@probe("conv_im2col_forced")
def _():
    from aotrt.runtime.ops.cuda.conv import Dnn
    dnn = dev.libraries.state(Dnn)
    saved, dnn.available = dnn.available, False
    try:
        return conv_case(2, 16, 40, 32, 3, 1, 1)
    finally:
        dnn.available = saved


def sdpa_case(b, h, l, e, causal=False, mask=False):
    q = torch.randn(b, l, h, e, device="cuda", dtype=torch.half).transpose(1, 2)
    k = torch.randn(b, l, h, e, device="cuda", dtype=torch.half).transpose(1, 2)
    v = torch.randn(b, l, h, e, device="cuda", dtype=torch.half).transpose(1, 2)
    m = None
    if mask:
        m = torch.rand(b, 1, 1, l, device="cuda") > 0.2
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                           attn_mask=m, is_causal=causal)
    o = torch.empty(b, h, l, e, device="cuda", dtype=torch.half)
    hq, hk, hv, ho = wrap(q), wrap(k), wrap(v), wrap(o)
    hm = wrap(m) if mask else None
    f = lambda: OPS["sdpa"](stream, [ho], [hq, hk, hv, hm], is_causal=causal)  # noqa: E731
    f()
    stream.commit_and_wait()
    err = rel(o, ref)
    ms = t_ours(f)
    tm = t_torch(lambda: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=m, is_causal=causal))
    return {"ours_ms": ms, "torch_ms": tm, "rel": err}


@probe("sdpa_bert_8x12x128_mask")
def _():
    return sdpa_case(8, 12, 128, 64, mask=True)


@probe("sdpa_gpt2_1x12x256_causal")
def _():
    return sdpa_case(1, 12, 256, 64, causal=True)


@probe("sdpa_whisper_1x6x1500")
def _():
    return sdpa_case(1, 6, 1500, 64)


@probe("dispatch_overhead_us")
def _():
    from aotrt.kernels import ir
    k = ir.Kernel("addone", (1024,), (), (ir.Arg("float32", "r"), ir.Arg("float32", "w")),
                  (ir.store(1, (1,), ir.Op("add", (ir.load(0, (1,), "float32"),
                                                   ir.Const(1.0, "float32")), "float32")),))
    fn = dev.kernel_library([k]).kernel("addone")
    a = torch.randn(1024, device="cuda")
    o = torch.empty(1024, device="cuda")
    ha, ho = wrap(a), wrap(o)
    for _ in range(10):
        fn(stream, ha, ho)
    stream.commit_and_wait()
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        fn(stream, ha, ho)
    host = (time.perf_counter() - t0) / n * 1e6
    stream.commit_and_wait()
    # one graph of 100 dispatches
    stream.begin_capture()
    for _ in range(100):
        fn(stream, ha, ho)
    g = stream.end_capture()
    g.launch(stream)
    stream.commit_and_wait()
    t0 = time.perf_counter()
    for _ in range(20):
        g.launch(stream)
    stream.commit_and_wait()
    graph = (time.perf_counter() - t0) / 20 / 100 * 1e6
    return {"host_us_per_dispatch": host, "graph_us_per_node": graph,
            "ok": bool(torch.allclose(o, a + 1))}


@probe("graph_capture_library_ops")
def _():
    x = torch.randn(8, 64, 28, 28, device="cuda", dtype=torch.half)
    w = torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.half) * 0.05
    o = torch.empty(8, 64, 28, 28, device="cuda", dtype=torch.half)
    a = torch.randn(256, 512, device="cuda", dtype=torch.half)
    b = torch.randn(512, 128, device="cuda", dtype=torch.half)
    c = torch.empty(256, 128, device="cuda", dtype=torch.half)
    q = torch.randn(2, 4, 64, 32, device="cuda", dtype=torch.half)
    qo = torch.empty_like(q)
    hx, hw, ho, ha, hb, hc, hq, hqo = (wrap(t) for t in (x, w, o, a, b, c, q, qo))
    params = dict(stride=[1, 1], padding=[1, 1], dilation=[1, 1], transposed=False,
                  output_padding=[0, 0], groups=1)

    def run():
        OPS["convolution"](stream, [ho], [hx, hw, None], **params)
        OPS["mm"](stream, [hc], [ha, hb])
        OPS["sdpa"](stream, [hqo], [hq, hq, hq, None])
    run()
    stream.commit_and_wait()
    stream.begin_capture()
    try:
        run()
    finally:
        g = stream.end_capture()
    o.zero_()
    c.zero_()
    qo.zero_()
    torch.cuda.synchronize()
    g.launch(stream)
    stream.commit_and_wait()
    return {"conv": rel(o, torch.nn.functional.conv2d(x.float(), w.float(), None, 1, 1)),
            "mm": rel(c, a.float() @ b.float()),
            "sdpa": rel(qo, torch.nn.functional.scaled_dot_product_attention(
                q.float(), q.float(), q.float()))}


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else None
    if path:
        with open(path, "w") as f:
            json.dump(RESULTS, f, indent=1)
