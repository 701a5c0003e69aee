"""On the GPU machine: why float32 convolution networks run slower than eager on cuda.

    python3 scripts/cuda_fp32_probe.py [resnet18 resnet34 ...]

For each torchvision model (batch 1, 224x224, float32, seeded random weights): eager's
median ms with cuDNN's TF32 allowed (torch's default) and forbidden, aotrt's (CUDA graph)
in each export layout, each one's error against a float64 reference, the convolutions
cuDNN refused, and the five costliest GPU kernels of one aotrt run.
"""

from __future__ import annotations

import collections
import copy
import logging
import statistics
import sys

import torch
import torchvision
from torch.profiler import ProfilerActivity, profile

import aotrt

#: the export layouts tried ("auto": the cuda device's choice for float32)
LAYOUTS = ("auto", "channels_last", "contiguous")


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: collections.Counter = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.seen[record.getMessage()[:110]] += 1


def _ms(fn, start, stop) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        h = start()
        fn()
        times.append(stop(h))
    return statistics.median(times)


def _ev_start():
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    return a, b


def _ev_stop(h) -> float:
    a, b = h
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def _rel(a: torch.Tensor, r: torch.Tensor) -> float:
    return float((a.double().cpu() - r).norm() / r.norm())


def probe(name: str) -> None:
    """Print one model's lines."""
    torch.manual_seed(0)
    m = getattr(torchvision.models, name)(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        ref = m.double()(x.double())
        m = m.float()
        mg, xg = copy.deepcopy(m).cuda(), x.cuda()
        for tf32 in (True, False):
            torch.backends.cudnn.allow_tf32 = tf32
            ms = _ms(lambda: mg(xg), _ev_start, _ev_stop)
            print(f"{name} eager tf32={tf32}: {ms:.3f} ms err {_rel(mg(xg), ref):.2e}",
                  flush=True)
        torch.backends.cudnn.allow_tf32 = True
    for layout in LAYOUTS:
        count = _Count()
        logging.getLogger("aotrt").addHandler(count)
        logging.getLogger("aotrt").setLevel(logging.INFO)
        prog = aotrt.export(m, (x,), layout=layout)
        with aotrt.load(prog, device="cuda") as d:
            got = d.run(xg)[0]
            ms = _ms(lambda: d.run(xg), d.stream.timing_event,
                     lambda e0: (lambda e1: (e1.sync(), e1 - e0)[1])(d.stream.timing_event()))
            print(f"{name} aotrt {layout}: {ms:.3f} ms err "
                  f"{_rel(torch.from_dlpack(got), ref):.2e}", flush=True)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    d.run(xg)
                d.stream.commit_and_wait()
        logging.getLogger("aotrt").removeHandler(count)
        for msg, n in count.seen.most_common(4):
            print(f"   log x{n}: {msg}")
        tot: collections.Counter = collections.Counter()
        cnt: collections.Counter = collections.Counter()
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                tot[e.name[:70]] += e.device_time_total
                cnt[e.name[:70]] += 1
        for k, v in tot.most_common(5):
            print(f"   {v / 3:8.1f} us x{cnt[k] / 3:3.0f} {k}")


if __name__ == "__main__":
    for n in sys.argv[1:] or ["resnet18"]:
        try:
            probe(n)
        except Exception as e:  # noqa: BLE001 - a probe prints its failure and goes on
            print(f"{n}: {type(e).__name__}: {e}"[:300], flush=True)
