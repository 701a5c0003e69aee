"""Where an llm.export program's prefill and decode time goes on the cpu, by instruction kind:
each instruction's commands timed on the stream's worker (the hazard checker on, so that
each runs as its own command, from Python), next to the methods' wall time as they run
(checker off, native plan), and the GEMMs' FLOP rate against numpy's BLAS on their shapes.

    python3 bench/bench_llm.py --export-to /tmp/gpt2.aotp --weights "" --model gpt2 \
        --dtype float32 --batch 1 --prompt 128 --new 128
    python3 scripts/llm_cpu_profile.py /tmp/gpt2.aotp [--threads 2] [--runs 5] [--cpu-time]

The export runs in its own process, as bench_llm's aotrt runner does: torch's OpenMP threads
in this one would change the kernels' (bench_llm.run_aotrt). Kinds: a library op by the
implementation its work took (gemm: oneDNN's sgemm over blocks, gemv: the few-row kernel,
numpy), attention, kernels with a reduction (norms, arg-max), the cache writes (index_put),
the other kernels (elementwise), copies. `--cpu-time` times each command by the worker
thread's CPU time instead of the wall clock: with `--threads 1` that is what the machine at
rest would take, whatever other processes run (the cores here are shared).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GEMM_OPS = ("mm", "addmm", "linear")


def _inputs(method: str, batch: int, n: int) -> tuple[np.ndarray, ...]:
    """A prefill chunk of `n` ids at slot 0, or a decode step at slot `n`."""
    ids = np.random.default_rng(0).integers(3, 1000, (batch, n if method == "prefill" else 1))
    return ids.astype(np.int64), np.array(0 if method == "prefill" else n), \
        np.zeros(batch, np.int64)


def _kind(op: str, name: str, work: Any, reductions: set[str]) -> str:
    """The row of the table an instruction's command counts in."""
    if op == "copy":
        return "copies"
    if op == "library":
        make = getattr(work, "native", None)
        impl = "numpy"
        if make is not None:
            nat = make()
            impl = nat.label.split()[0] if nat is not None and nat.label else "native"
        if name in GEMM_OPS:
            return f"GEMM: {impl}"
        return "attention" if name == "sdpa" else f"{name}: {impl}"
    base = re.sub(r"^k\d+_", "", name)
    if "index_put" in base:
        return "KV cache write (index_put)"
    if name in reductions:
        return "reduction kernels (norms, arg-max)"
    return "elementwise kernels"


def profile(path: str, method: str, threads: int, runs: int, n: int,
            clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Per kind: (mean ms of one run of `method`, commands a run, the sum of each command's
    fastest run in ms), the checker on (each instruction its own command)."""
    os.environ["AOTRT_CHECK_HAZARDS"] = "1"
    import aotrt
    from aotrt.runtime import device as device_mod

    prog = aotrt.Program.load(path).methods[method]
    record = prog.record
    reductions = {k.name for k in prog.kernels if k.rshape}
    kinds = {}
    for i, ins in enumerate(record.instructions):
        kinds[i] = (ins.op, ins.name)
    times: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.Counter()
    fastest: dict[tuple[str, str], float] = {}
    real = device_mod.Stream.record
    keys: dict[tuple[str, int], str] = {}
    owner: dict[tuple[str, str], str] = {}

    def timed(self: Any, accesses: Any, work: Any, label: str = "") -> int:
        m = re.match(r"instruction #(\d+)", self.label or "")
        if m is None:
            return real(self, accesses, work, label)
        idx = int(m.group(1))
        key = keys.get((self.label, id(work)))
        if key is None:
            key = keys[(self.label, id(work))] = _kind(*kinds[idx], work, reductions)

        cmd = (self.label, f"{label} {id(work)}")

        def run(*args: Any) -> Any:
            t = clock()
            try:
                return work(*args)
            finally:
                dt = clock() - t
                times[key] += dt
                counts[key] += 1
                fastest[cmd] = min(fastest.get(cmd, dt), dt)
                owner[cmd] = key
        return real(self, accesses, run, label)

    batch = record.inputs[0].shape[0]
    args = _inputs(method, batch, n)
    with aotrt.load(path, device="cpu", threads=threads) as m:
        meth = m.method(method)
        for _ in range(2):
            np.asarray(meth.run(*args)[0])
        device_mod.Stream.record = timed
        try:
            for _ in range(runs):
                np.asarray(meth.run(*args)[0])
        finally:
            device_mod.Stream.record = real
    best: dict[str, float] = collections.defaultdict(float)
    for cmd, dt in fastest.items():
        best[owner[cmd]] += dt
    return {k: (v / runs * 1e3, counts[k] / runs, best[k] * 1e3) for k, v in times.items()}


def wall(path: str, threads: int, runs: int, n: int) -> dict[str, list[float]]:
    """Median, min and max ms of the prefill and of a bound decode step, checker off."""
    import aotrt

    res = {}
    with aotrt.load(path, device="cpu", threads=threads) as m:
        for method in ("prefill", "decode"):
            meth = m.method(method)
            run: Callable[..., Any] = meth.bind().run if method == "decode" else meth.run
            batch = meth.program.record.inputs[0].shape[0]
            args = _inputs(method, batch, n)
            for _ in range(2):
                np.asarray(run(*args)[0])
            ts = []
            for _ in range(runs * (4 if method == "decode" else 1)):
                t = time.perf_counter()
                np.asarray(run(*args)[0])
                ts.append((time.perf_counter() - t) * 1e3)
            res[method] = [statistics.median(ts), min(ts), max(ts)]
    return res


def ceiling(path: str, runs: int) -> tuple[float, float, float]:
    """(GFLOP of the prefill's GEMMs, ms of numpy's matmul on their shapes at its default
    threads (medians summed), the same at the best run each)."""
    import aotrt

    prog = aotrt.Program.load(path).methods["prefill"]
    rec = prog.record
    shapes: collections.Counter[tuple[int, int, int]] = collections.Counter()
    for ins in rec.instructions:
        if ins.op != "library" or ins.name not in GEMM_OPS:
            continue
        sizes = [None if t is None else rec.tensors[t].sizes for t in ins.ins]
        if ins.name == "linear":
            x, w = sizes[0], sizes[1]
            m_, k, n = int(np.prod(x[:-1])), x[-1], w[0]
        else:
            a, b = sizes[-2], sizes[-1]
            m_, k, n = a[0], a[1], b[1]
        shapes[(m_, k, n)] += 1
    rng = np.random.default_rng(0)
    med = best = flop = 0.0
    for (m_, k, n), count in shapes.items():
        x = rng.standard_normal((m_, k), np.float32)
        w = rng.standard_normal((n, k), np.float32)
        out = np.empty((m_, n), np.float32)
        np.matmul(x, w.T, out=out)
        ts = []
        for _ in range(max(runs, 5)):
            t = time.perf_counter()
            np.matmul(x, w.T, out=out)
            ts.append((time.perf_counter() - t) * 1e3)
        med += statistics.median(ts) * count
        best += min(ts) * count
        flop += 2.0 * m_ * k * n * count
    return flop / 1e9, med, best


def main() -> None:
    """Profile a saved llm program's methods; print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=128, help="the decode step's slot")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time commands by the worker thread's CPU time (with --threads 1)")
    ap.add_argument("--part", choices=("all", "wall", "prefill", "decode", "ceiling"),
                    default="all", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.part != "all":
        if a.part == "wall":
            out: Any = wall(a.path, a.threads, a.runs, a.prompt)
        elif a.part == "ceiling":
            out = ceiling(a.path, a.runs)
        else:
            out = profile(a.path, a.part, a.threads, a.runs, a.prompt,
                          time.thread_time if a.cpu_time else time.perf_counter)
        print(json.dumps(out))
        return
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads))

    def child(part: str) -> Any:
        cmd = [sys.executable, __file__, a.path, "--threads", str(a.threads), "--runs",
               str(a.runs), "--prompt", str(a.prompt), "--part", part]
        cmd += ["--cpu-time"] if a.cpu_time else []
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    # each part in its own process: the checker is read at load, numpy's BLAS threads stay
    # out of the timed runs
    w = child("wall")
    print(f"{a.path}: {a.threads} threads, load average {os.getloadavg()[0]:.2f}")
    for method in ("prefill", "decode"):
        md, lo, hi = w[method]
        print(f"  {method} as it runs: median {md:.2f} ms ({lo:.2f}-{hi:.2f})")
    for method in ("prefill", "decode"):
        rows = child(method)
        total = sum(r[0] for r in rows.values())
        fast = sum(r[2] for r in rows.values())
        what = "CPU time of the worker thread" if a.cpu_time else "wall"
        print(f"== {method}, each instruction its own command ({what}): mean {total:.2f} ms "
              f"a run; each command's fastest run summed {fast:.2f} ms")
        for key, (ms, count, best) in sorted(rows.items(), key=lambda kv: -kv[1][2]):
            print(f"  {ms:9.2f} ms  fastest {best:8.2f} ms  x{count:5.1f}  {key}")
    gflop, med, best = child("ceiling")
    print(f"== prefill GEMMs: {gflop:.2f} GFLOP; numpy's BLAS on the same shapes: "
          f"{med:.1f} ms (medians), {best:.1f} ms (best runs) = {gflop / best * 1e3:.0f} "
          f"GFLOP/s")


if __name__ == "__main__":
    main()
