"""A decoder block's decode step: state kept in place against the same block exported
static (its KV cache passed in and returned), and torch eager; one process per runner.

    python bench/bench_decode.py --device cuda --passes 3 --out bench/results/decode/x.json

Runners (each in its own process, in turn, `--passes` times; the median pass is kept):
- `state`: `prefill` and `decode` methods sharing the cache as state, decode bound once
  (Delegate.bind: one graph replay a step on cuda, nothing allocated);
- `state_run`: the same program, decode through `run()` (fresh outputs each step);
- `static`: one method whose cache is an input and an output, each step feeding the last
  step's cache back (what a program without state must do);
- `eager`: torch, the block with its buffers updated in place, under no_grad.
A step is timed until its output is ready (the host has it synchronised), 64 steps a pass.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STEPS = 64
RUNNERS = ("state", "state_run", "static", "eager")


def _block(d: int, heads: int, max_len: int, dtype: str):  # noqa: ANN202 - torch types
    import torch
    import torch.nn.functional as F

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.h, self.dh = heads, d // heads
            self.qkv = torch.nn.Linear(d, 3 * d)
            self.o = torch.nn.Linear(d, d)
            self.register_buffer("cache_k", torch.zeros(1, heads, max_len, d // heads))
            self.register_buffer("cache_v", torch.zeros(1, heads, max_len, d // heads))

        def attend(self, x, pos, ck, cv):  # noqa: ANN001, ANN202
            b, n, _ = x.shape
            q, k, v = self.qkv(x).split(d, dim=-1)
            q, k, v = (t.view(b, n, self.h, self.dh).transpose(1, 2) for t in (q, k, v))
            ck.index_copy_(2, pos, k)
            cv.index_copy_(2, pos, v)
            mask = torch.arange(max_len, device=x.device)[None, :] <= pos[:, None]
            a = F.scaled_dot_product_attention(q, ck, cv, attn_mask=mask)
            return self.o(a.transpose(1, 2).reshape(b, n, d))

        def forward(self, x, pos):  # noqa: ANN001, ANN202
            return self.attend(x, pos, self.cache_k, self.cache_v)

    class Static(torch.nn.Module):
        """The same block with its cache as an input and an output (no state)."""

        def __init__(self, blk: Block) -> None:
            super().__init__()
            self.blk = blk

        def forward(self, x, pos, ck, cv):  # noqa: ANN001, ANN202
            ck, cv = ck.clone(), cv.clone()
            return self.blk.attend(x, pos, ck, cv), ck, cv

    torch.manual_seed(0)
    blk = Block().eval().to(getattr(torch, dtype))
    return blk, Static(blk).eval()


def run_one(args: argparse.Namespace) -> dict:
    """One runner in this process: the per-step times of `STEPS` decode steps (ms)."""
    import torch

    import aotrt

    dt = getattr(torch, args.dtype)
    blk, static = _block(args.d, args.heads, args.max_len, args.dtype)
    prompt = 8
    x0 = torch.randn(1, prompt, args.d, dtype=dt)
    xs = [torch.randn(1, 1, args.d, dtype=dt) for _ in range(STEPS)]
    dev = args.device
    times: list[float] = []
    t_load = 0.0
    if args.runner == "eager":
        tdev = torch.device(dev)
        blk = blk.to(tdev)
        with torch.no_grad():
            blk(x0.to(tdev), torch.arange(prompt, device=tdev))
            for i, x in enumerate(xs):
                xd, pos = x.to(tdev), torch.tensor([prompt + i], device=tdev)
                t0 = time.perf_counter()
                y = blk(xd, pos)
                y.cpu()
                times.append(time.perf_counter() - t0)
    elif args.runner in ("state", "state_run"):
        prog = aotrt.export({"prefill": (blk, (x0, torch.arange(prompt))),
                             "decode": (blk, (xs[0], torch.tensor([prompt])))},
                            share_state=True)
        t0 = time.perf_counter()
        m = aotrt.load(prog, device=dev)
        t_load = time.perf_counter() - t0
        with m:
            m.method("prefill").run(x0.numpy(), np.arange(prompt))
            hx = [(x.numpy(), np.array([prompt + i])) for i, x in enumerate(xs)]
            if args.runner == "state":
                b = m.method("decode").bind()
                step = b.run
            else:
                step = m.method("decode").run
            step(*hx[0])        # warm-up: the graph is captured, plans made
            m.reset()
            m.method("prefill").run(x0.numpy(), np.arange(prompt))
            for xin, pos in hx:
                t0 = time.perf_counter()
                out = step(xin, pos)
                np.asarray(out[0])
                times.append(time.perf_counter() - t0)
    else:   # static
        ck = torch.zeros_like(blk.cache_k)
        cv = torch.zeros_like(blk.cache_v)
        prog = aotrt.export(static, (xs[0], torch.tensor([prompt]), ck, cv))
        t0 = time.perf_counter()
        m = aotrt.load(prog, device=dev)
        t_load = time.perf_counter() - t0
        with m:
            ck_np, cv_np = ck.numpy(), cv.numpy()
            y, ck_t, cv_t = m.run(xs[0].numpy(), np.array([prompt]), ck_np, cv_np)   # warm-up
            ck_t, cv_t = aotrt.Tensor.from_numpy(ck_np, dev), aotrt.Tensor.from_numpy(cv_np, dev)
            for i, x in enumerate(xs):
                t0 = time.perf_counter()
                y, ck_t, cv_t = m.run(x.numpy(), np.array([prompt + i]), ck_t, cv_t)
                np.asarray(y)
                times.append(time.perf_counter() - t0)
    ms = [t * 1e3 for t in times[4:]]       # the first steps still settle caches
    return {"runner": args.runner, "median_ms": statistics.median(ms), "min_ms": min(ms),
            "max_ms": max(ms), "load_s": t_load, "steps": len(ms)}


def main() -> int:
    """Run every runner in its own process, `--passes` times in turn; print and save."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--runners", default=",".join(RUNNERS))
    ap.add_argument("--runner", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help="write the results here (.json, and .md)")
    args = ap.parse_args()
    if args.runner:
        print(json.dumps(run_one(args)))
        return 0
    results: dict[str, list[dict]] = {}
    for _ in range(args.passes):
        for r in args.runners.split(","):
            cmd = [sys.executable, __file__, "--runner", r, "--device", args.device,
                   "--dtype", args.dtype, "--d", str(args.d), "--heads", str(args.heads),
                   "--max-len", str(args.max_len)]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if p.returncode:
                print(f"{r}: failed\n{p.stderr[-2000:]}", file=sys.stderr)
                results.setdefault(r, [])
                continue
            results.setdefault(r, []).append(json.loads(p.stdout.strip().splitlines()[-1]))
    lines = [f"# decode step, {args.device}, {args.dtype}, d={args.d}, heads={args.heads}, "
             f"cache {args.max_len}, {STEPS} steps a pass, {args.passes} passes", "",
             "| runner | median ms/step (median pass) | pass medians | min | max | load s |",
             "|---|--:|---|--:|--:|--:|"]
    for r, rs in results.items():
        if not rs:
            lines.append(f"| {r} | failed | | | | |")
            continue
        meds = sorted(x["median_ms"] for x in rs)
        mid = sorted(rs, key=lambda x: x["median_ms"])[len(rs) // 2]
        lines.append(f"| {r} | {mid['median_ms']:.3f} | {', '.join(f'{v:.3f}' for v in meds)}"
                     f" | {min(x['min_ms'] for x in rs):.3f} | {max(x['max_ms'] for x in rs):.3f}"
                     f" | {mid['load_s']:.2f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(results, indent=1))
        out.with_suffix(".md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
