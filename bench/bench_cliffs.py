"""fp32 convolution networks on cuda: torch eager against aotrt (default: one CUDA graph).

    python3 bench/bench_cliffs.py [--models mobilenet_v2,efficientnet_b0] [--iters 30]

Issue #9 item 6: with graphs, depthwise and grouped convolution networks ran 2-8.5x slower
than eager at fp32, because fp32 convolutions went through im2col + GEMM. Each model is
built from torchvision with seeded random weights (batch 1, 224x224), exported once, and
timed in this one process: eager (TF32 off, as aotrt computes fp32) and aotrt with and
without graphs, median ms of CUDA-event timings. The error is against float64 eager on cpu.
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import rel_err, time_aotrt, time_torch  # noqa: E402  (bench/bench.py)

MODELS = ["mobilenet_v2", "efficientnet_b0", "convnext_tiny", "regnet_y_400mf", "resnet18"]


def main() -> None:
    """Time each model and print one table row per model."""
    import torch
    import torchvision

    import aotrt

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--iters", type=int, default=30)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    print("| model | eager ms | aotrt graph ms | aotrt no-graph ms | rel err aotrt | "
          "rel err eager | export s |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for name in a.models.split(","):
        torch.manual_seed(0)
        m = getattr(torchvision.models, name)(weights=None).eval()
        x = torch.randn(1, 3, 224, 224)
        with torch.no_grad():
            ref = m.double()(x.double())
            m = m.float()
        try:
            t = time.perf_counter()
            prog = aotrt.export(m, (x,))
            export_s = time.perf_counter() - t
            mc, xc = m.cuda(), x.cuda()
            with torch.no_grad():
                eager_ms = time_torch(lambda: mc(xc), a.iters, 5)
                e_err = rel_err(mc(xc).cpu(), ref)
            row = []
            for graph in (True, False):
                with aotrt.load(prog, device="cuda", cuda_graph=graph) as d:
                    ms, out = time_aotrt(d, (xc,), a.iters, 5)
                    row.append((ms, rel_err(torch.from_dlpack(out[0]).cpu(), ref)))
            print(f"| {name} | {eager_ms:.3f} | {row[0][0]:.3f} | {row[1][0]:.3f} | "
                  f"{row[0][1]:.1e} | {e_err:.1e} | {export_s:.1f} |", flush=True)
        except Exception as e:  # noqa: BLE001 - recorded in the table, never dropped
            print(f"| {name} | failed: {type(e).__name__}: {str(e)[:200]} |||||", flush=True)
        del m
    print(f"\nload average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
