"""Time aotrt on the cpu device against torch eager on the CPU: the YOLO blocks (C2f, SPPF,
Detect head), torchvision resnet18 and a GPT-2 block, all float32, in one run.

    .venv/bin/python bench/bench_cpu.py [--models c2f,sppf] [--iters 30] [--out-dir DIR]

A measurement, not a target. Per model, one "prepare" subprocess builds the module (seeded
random weights), exports it once with aotrt.export (export seconds), saves the program,
loads it with aotrt.load(prog, device="cpu") on an empty kernel cache (cold load seconds:
kernels are compiled by the system C compiler here) and checks the output against torch
eager: norm-wise relative error in float64, against eager float32 and against a float64
eager reference. Then one fresh subprocess per (model, runner) times it: the median of N
runs after warm-up, each run a full forward that has finished (aotrt: m.run(*x) then
m.stream.commit_and_wait(); torch: the module under torch.no_grad()). The aotrt process
never imports torch (the runtime does not need it); its inputs are numpy arrays, which the
cpu device binds without a copy.

Memory, per (model, runner) process, from the RSS high-water mark (VmHWM in
/proc/self/status: what ru_maxrss reports, without the parent's pages that ru_maxrss
inherits across fork + exec). The baseline is taken after the model is built / loaded and
before its first run. `peak_rss_growth_bytes` is the high-water mark after the timed runs
minus the one at the baseline (issue #3's definition; it reads 0 when a transient while
building or loading was higher than anything the runs reach). `peak_rss_over_baseline_bytes`
resets the high-water mark at the baseline (/proc/self/clear_refs, "5") and is the mark
after the runs minus the RSS at the baseline: what the runs themselves add at their peak
(the table's number). ru_maxrss is recorded raw too. aotrt also reports the runtime's own
peak (peak_raw_bytes of the cpu device's memory), the arena size and the constants' bytes.
The driver process never imports torch, so that its pages stay small.

The machine may be shared: the load average is recorded at the start, at the end and
around every subprocess, so that readers can judge the noise.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from typing import Any, Callable

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["c2f", "sppf", "detect", "resnet18", "gpt2_block"]
RUNNERS = ["eager", "aotrt"]
DESCRIPTIONS = {
    "c2f": "C2f(64, 64, n=2), 1x64x80x80 (yolov8n's P3 backbone stage)",
    "sppf": "SPPF(256, 256, k=5), 1x256x20x20 (yolov8n's)",
    "detect": "Detect(nc=80, ch=(64, 128, 256)) with DFL and anchors, "
              "1x64x80x80 + 1x128x40x40 + 1x256x20x20 (yolov8n's head at 640)",
    "resnet18": "torchvision resnet18, random weights, 1x3x224x224",
    "gpt2_block": "GPT-2 block (pre-norm, causal sdpa, tanh-GELU MLP), d=768, 12 heads, "
                  "1x128 tokens",
}


# -- models ---------------------------------------------------------------------------------------

def build(name: str) -> tuple[Any, tuple[Any, ...]]:
    """(module in eval mode, float32 example inputs), seeded: the same in every process."""
    import torch

    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    # The module definitions of the export tests (they import torch and aotrt only).
    from tests.exporter import modules as tm

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, generator=g)

    if name == "c2f":
        m, x = tm.C2f(64, 64, n=2), (randn(1, 64, 80, 80),)
    elif name == "sppf":
        m, x = tm.SPPF(256, 256), (randn(1, 256, 20, 20),)
    elif name == "detect":
        m = tm.Detect(nc=80, ch=(64, 128, 256), strides=(8.0, 16.0, 32.0))
        x = (randn(1, 64, 80, 80), randn(1, 128, 40, 40), randn(1, 256, 20, 20))
    elif name == "resnet18":
        import torchvision

        m, x = torchvision.models.resnet18(weights=None), (randn(1, 3, 224, 224),)
    elif name == "gpt2_block":
        m, x = tm.GPT2Block(768, 12), (randn(1, 128, 768),)
    else:
        raise ValueError(f"unknown model {name}")
    return m.eval(), x


# -- helpers --------------------------------------------------------------------------------------

def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """||got - ref|| / ||ref|| in float64 (inf on a shape mismatch or a non-finite value)."""
    a, b = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if a.shape != b.shape or not np.all(np.isfinite(a)):
        return float("inf")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def proc_status() -> dict[str, int]:
    """VmRSS and VmHWM of this process in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    return out


def maxrss() -> int:
    """ru_maxrss of this process in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_hwm() -> bool:
    """Reset the RSS high-water mark to the current RSS (Linux >= 4.0); False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def time_runs(fn: Callable[[], Any], iters: int, warmup: int, max_s: float) -> dict:
    """Median ms of `fn` after `warmup` calls: `iters` calls, or fewer (at least 5) when they
    would take longer than `max_s` seconds."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    t_end = time.perf_counter() + max_s
    while len(times) < iters and (len(times) < 5 or time.perf_counter() < t_end):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
            "runs": len(times), "warmup": warmup}


def blas_info() -> dict:
    """numpy's BLAS and how many threads it will use (asked from OpenBLAS itself)."""
    info: dict[str, Any] = {"numpy": np.__version__}
    try:
        cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info["name"], info["version"] = cfg.get("name"), cfg.get("version")
        info["config"] = cfg.get("openblas configuration")
    except Exception as e:  # noqa: BLE001 - informational only
        info["config_error"] = f"{type(e).__name__}: {e}"
    libdir = os.path.join(os.path.dirname(np.__file__) + ".libs")
    for path in glob.glob(os.path.join(libdir, "*openblas*")):
        lib = ctypes.CDLL(path)  # already mapped by numpy: the same library instance
        for sym in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
                    "openblas_get_num_threads"):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                info["threads"] = int(fn())
                break
    info["threaded"] = info.get("threads", 0) > 1
    return info


# -- subprocess: prepare (export, cold load, accuracy) --------------------------------------------

def prepare(name: str, workdir: str) -> dict:
    """Export once, save the program, inputs and eager output, load cold, check the error."""
    import torch

    import aotrt
    from aotrt.runtime.device import get_device

    res: dict[str, Any] = {"model": name, "description": DESCRIPTIONS[name]}
    t = time.perf_counter()
    m, x = build(name)
    res["build_s"] = time.perf_counter() - t
    res["input_shapes"] = [list(a.shape) for a in x]
    with torch.no_grad():
        ref32 = m(*x)
        ref64 = m.double()(*(a.double() for a in x))
        m.float()
    t = time.perf_counter()
    prog = aotrt.export(m, x)
    res["export_s"] = time.perf_counter() - t
    res["kernels"] = len(prog.kernels)
    res["instructions"] = len(prog.instructions)
    res["arena_nbytes"] = int(prog.arena_nbytes)
    res["constants_nbytes"] = int(sum(int(a.nbytes) for a in prog.constants.values()))
    res["library_ops"] = sorted({i["fn"] for i in prog.instructions if i["op"] == "library"})
    prog.save(os.path.join(workdir, f"{name}.aotp"))
    xs = [a.numpy() for a in x]
    np.savez(os.path.join(workdir, f"{name}.npz"), ref=ref32.numpy(),
             **{f"x{i}": a for i, a in enumerate(xs)})
    t = time.perf_counter()
    d = aotrt.load(prog, device="cpu")
    res["load_cold_s"] = time.perf_counter() - t
    try:
        t = time.perf_counter()
        outs = d.run(*xs)
        got = outs[0].numpy()
        res["first_run_s"] = time.perf_counter() - t
    finally:
        d.close()
    res["output_shape"] = list(got.shape)
    res["rel_err_vs_eager_fp32"] = rel_err(got, ref32.numpy())
    res["rel_err_vs_eager_fp64"] = rel_err(got, ref64.numpy())
    res["eager_fp32_rel_err_vs_fp64"] = rel_err(ref32.numpy(), ref64.numpy())
    res["runtime_peak_raw_bytes_prepare"] = get_device("cpu").memory.peak_raw_bytes
    return res


# -- subprocess: measure one runner ---------------------------------------------------------------

def measure(name: str, runner: str, workdir: str, iters: int, warmup: int,
            max_s: float) -> dict:
    """Time one runner on one model in this (fresh) process, and its peak memory."""
    data = np.load(os.path.join(workdir, f"{name}.npz"))
    xs = [data[f"x{i}"] for i in range(len(data.files) - 1)]
    ref = data["ref"]
    res: dict[str, Any] = {"runner": runner}
    t = time.perf_counter()
    if runner == "eager":
        import torch

        m, _ = build(name)
        x = tuple(torch.from_numpy(a) for a in xs)
        res["threads"] = torch.get_num_threads()

        def once() -> Any:
            with torch.no_grad():
                return m(*x)

        def result(out: Any) -> np.ndarray:
            return out.numpy()
    else:
        import aotrt
        from aotrt.runtime.device import get_device

        prog = aotrt.Program.load(os.path.join(workdir, f"{name}.aotp"))
        t = time.perf_counter()
        d = aotrt.load(prog, device="cpu")
        res["load_warm_s"] = time.perf_counter() - t
        res["arena_nbytes"] = int(prog.arena_nbytes)
        res["torch_imported"] = "torch" in sys.modules

        def once() -> Any:
            outs = d.run(*xs)
            d.stream.commit_and_wait()
            return outs

        def result(out: Any) -> np.ndarray:
            return out[0].numpy()
    res["setup_s"] = time.perf_counter() - t
    base = proc_status()
    res["baseline_ru_maxrss_bytes"] = maxrss()
    res["hwm_reset"] = reset_hwm()
    res.update(time_runs(once, iters, warmup, max_s))
    out = once()
    end = proc_status()
    res["ru_maxrss_bytes"] = maxrss()
    res["rel_err_vs_eager_fp32"] = rel_err(result(out), ref)
    res["baseline_hwm_bytes"], res["baseline_rss_bytes"] = base["VmHWM"], base["VmRSS"]
    res["end_hwm_bytes"], res["end_rss_bytes"] = end["VmHWM"], end["VmRSS"]
    # After a reset the end mark is the runs' own peak: the issue's growth is what it adds
    # above the baseline's mark.
    res["peak_rss_growth_bytes"] = max(0, end["VmHWM"] - base["VmHWM"])
    if res["hwm_reset"]:
        res["peak_rss_over_baseline_bytes"] = end["VmHWM"] - base["VmRSS"]
    if runner == "aotrt":
        res["runtime_peak_raw_bytes"] = get_device("cpu").memory.peak_raw_bytes
        d.close()
    return res


# -- driver ---------------------------------------------------------------------------------------

def child(args: list[str], env: dict[str, str], timeout: float) -> dict:
    """Run this script in a fresh process; its RESULT line, or the failure."""
    load0 = os.getloadavg()
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), *args], env=env,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s",
                "loadavg_before": load0, "loadavg_after": os.getloadavg()}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode == 0 and lines:
        res = json.loads(lines[-1][len("RESULT "):])
    else:
        res = {"ok": False, "error": f"exit {p.returncode}", "stderr": p.stderr[-3000:]}
    res["process_wall_s"] = time.perf_counter() - t
    res["loadavg_before"], res["loadavg_after"] = load0, os.getloadavg()
    return res


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def env_info() -> dict:
    """Versions, thread counts, CPU and the thread-related environment."""
    import torch
    import torchvision

    flags = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = line
                break
    return {
        "python": sys.version.split()[0], "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "torch_num_threads": torch.get_num_threads(),
        "torch_num_interop_threads": torch.get_num_interop_threads(),
        "torch_parallel_info": torch.__config__.parallel_info(),
        "numpy_blas": blas_info(),
        "cpu_model": cpu_model(), "logical_cpus": os.cpu_count(),
        "cpu_simd": [f for f in ("avx", "avx2", "fma", "avx512f") if f" {f} " in flags],
        "cc": shutil.which("cc") or shutil.which("gcc"),
        "thread_env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                      "OPENBLAS_NUM_THREADS")},
        "platform": platform.platform(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--iters", type=int, default=30, help="timed runs (at most)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--max-timed-s", type=float, default=15.0,
                    help="cap on the timed runs of one (model, runner); at least 5 runs")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--workdir", default="/tmp/aotrt-bench-cpu")
    ap.add_argument("--env", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--prepare", help=argparse.SUPPRESS)
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    ap.add_argument("--runner", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.env or args.prepare or args.measure:
        try:
            if args.env:
                res = env_info()
            elif args.prepare:
                res = prepare(args.prepare, args.workdir)
            else:
                res = measure(args.measure, args.runner, args.workdir, args.iters,
                              args.warmup, args.max_timed_s)
            res["ok"] = True
        except Exception as e:  # noqa: BLE001 - recorded, never dropped
            res = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000],
                   "trace": traceback.format_exc()[-3000:]}
        print("RESULT " + json.dumps(res), flush=True)
        return 0

    t_start = time.perf_counter()
    date = time.strftime("%Y-%m-%d")
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    env = dict(os.environ)
    env.pop("AOTRT_CHECK_HAZARDS", None)    # timing runs without the hazard checker
    # A cache of our own: the prepare step's load is cold, the measured loads warm.
    env["AOTRT_CACHE_DIR"] = os.path.join(args.workdir, "kcache")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    doc: dict[str, Any] = {
        "date": date, "what": "aotrt (cpu device) vs torch eager (CPU), float32, batch 1",
        "loadavg_start": os.getloadavg(), "env": child(["--env"], env, 120),
        "iters": args.iters, "warmup": args.warmup, "max_timed_s": args.max_timed_s,
        "timing": "median wall ms of one finished forward (aotrt: run + commit_and_wait; "
                  "eager: module under no_grad), one fresh process per (model, runner)",
        "models": {}}
    sub = ["--workdir", args.workdir, "--iters", str(args.iters), "--warmup",
           str(args.warmup), "--max-timed-s", str(args.max_timed_s)]
    for name in args.models.split(","):
        print(f"== {name}", flush=True)
        entry = child(["--prepare", name, *sub], env, 300)
        entry["runners"] = {}
        doc["models"][name] = entry
        if not entry.get("ok"):
            print("  prepare FAILED " + entry["error"], flush=True)
            continue
        print(f"  export {entry['export_s']:.2f} s, cold load {entry['load_cold_s']:.2f} s, "
              f"rel err {entry['rel_err_vs_eager_fp32']:.2e}", flush=True)
        for runner in RUNNERS:
            r = child(["--measure", name, "--runner", runner, *sub], env, 240)
            entry["runners"][runner] = r
            print(f"  {runner:6s} " + (
                f"{r['ms']:9.2f} ms ({r['runs']} runs)  peak rss +"
                f"{r.get('peak_rss_over_baseline_bytes', r['peak_rss_growth_bytes']) / 2**20:.1f}"
                " MiB" if r.get("ok") else "FAILED " + r["error"]), flush=True)
    doc["loadavg_end"] = os.getloadavg()
    doc["wall_s"] = time.perf_counter() - t_start
    os.makedirs(args.out_dir, exist_ok=True)
    stem = os.path.join(args.out_dir, f"cpu-fp32-{date}")
    with open(stem + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(markdown(doc))
    print(markdown(doc))
    return 0


def markdown(doc: dict) -> str:
    """The short report: one row per model."""
    e = doc["env"]
    if not e.get("ok"):
        e = {"cpu_model": "?", "logical_cpus": os.cpu_count(), "cpu_simd": [], "torch": "?",
             "torch_num_threads": "?", "numpy_blas": blas_info()}
    blas = e["numpy_blas"]
    mib = 2 ** 20

    def fmt(v: Any, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    lines = [
        f"# CPU, float32, {doc['date']}: aotrt (cpu device) vs torch eager",
        "",
        f"{e['cpu_model']}, {e['logical_cpus']} logical CPUs ({', '.join(e['cpu_simd'])}); "
        f"torch {e['torch']} with {e['torch_num_threads']} threads; numpy {blas['numpy']} "
        f"with {blas.get('name')} {blas.get('version')}, "
        f"{blas.get('threads', '?')} threads "
        f"({'threaded' if blas['threaded'] else 'not threaded'}). "
        f"Load average at start {fmt_load(doc['loadavg_start'])}, at end "
        f"{fmt_load(doc['loadavg_end'])}. Whole run {doc['wall_s']:.0f} s.",
        "",
        f"Median ms of one finished forward, up to {doc['iters']} runs (at most "
        f"{doc['max_timed_s']:.0f} s of them, at least 5) after {doc['warmup']} warm-ups, one "
        "fresh process per (model, runner). RSS growth: the process's RSS high-water mark "
        "during the runs over its RSS after build/load, before the first run (weights are "
        "already in the baseline). Process peak RSS: the whole process's high-water mark "
        "(the aotrt process does not import torch). Runtime peak: the aotrt cpu device's own "
        "peak raw bytes (constants + arena + outputs + scratch). Rel err: "
        "aotrt vs eager fp32, norm-wise in float64. Load: cold (kernels compiled) / warm "
        "(kernel cache hit).",
        "",
        "| model | eager ms | aotrt ms | aotrt / eager | export s | load s cold / warm "
        "| rel err | RSS growth MiB eager / aotrt | process peak RSS MiB eager / aotrt "
        "| aotrt runtime peak MiB | arena MiB | constants MiB |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for name, m in doc["models"].items():
        if not m.get("ok"):
            lines.append(f"| {name} | prepare failed: {m.get('error', '')[:80]} |")
            continue
        ea, ao = m["runners"].get("eager", {}), m["runners"].get("aotrt", {})

        def rss(r: dict) -> str:
            if not r.get("ok"):
                return "F"
            v = r.get("peak_rss_over_baseline_bytes", r["peak_rss_growth_bytes"])
            return format(v / mib, ".1f")

        def total(r: dict) -> str:
            if not r.get("ok"):
                return "F"
            return format(max(r["baseline_hwm_bytes"], r["end_hwm_bytes"]) / mib, ".0f")

        ratio = ao["ms"] / ea["ms"] if ao.get("ok") and ea.get("ok") else None
        lines.append(
            f"| {name} | {fmt(ea.get('ms'), '.2f')} | {fmt(ao.get('ms'), '.2f')} "
            f"| {fmt(ratio, '.2f')} | {m['export_s']:.2f} "
            f"| {m['load_cold_s']:.2f} / {fmt(ao.get('load_warm_s'), '.2f')} "
            f"| {m['rel_err_vs_eager_fp32']:.1e} | {rss(ea)} / {rss(ao)} "
            f"| {total(ea)} / {total(ao)} "
            f"| {fmt(ao.get('runtime_peak_raw_bytes', 0) / mib, '.1f')} "
            f"| {m['arena_nbytes'] / mib:.1f} | {m['constants_nbytes'] / mib:.1f} |")
    lines += ["", "Models:", ""]
    lines += [f"- {n}: {m.get('description', DESCRIPTIONS.get(n, ''))}"
              for n, m in doc["models"].items()]
    return "\n".join(lines) + "\n"


def fmt_load(load: Any) -> str:
    """A load-average triple as '1.00 / 0.50 / 0.20'."""
    return " / ".join(f"{v:.2f}" for v in load)


if __name__ == "__main__":
    sys.exit(main())
