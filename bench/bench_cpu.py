"""Time aotrt's cpu device against its peers on the CPU benchmark models of issue #8: torch
eager, aotrt, ONNX Runtime, ExecuTorch (XNNPACK delegate) and torch.compile, float32, batch 1,
the same thread count for every runner, one fresh process per (model, runner).

    .venv/bin/python bench/bench_cpu.py [--models resnet18,bert] [--runners eager,aotrt]
        [--threads 2] [--iters 20] [--layout auto] [--out-dir DIR] [--tag NAME]

A measurement, not a target. Models (seeded random weights, nothing downloaded; HF models are
built from their configs with HF_HUB_OFFLINE=1): torchvision resnet18, mobilenet_v2 and
resnet50 at 224², ultralytics YOLOv8n at 320², BERT-base and GPT-2 (124M) on 1x128 tokens,
the Whisper-tiny encoder on 1x80x3000 mel frames.

Per model, one "prepare" process builds the module, runs eager in float32 and float64 (the
references), exports it with aotrt.export and loads it on an empty kernel cache (cold load),
exports the ONNX file (torch.onnx.export) and the ExecuTorch .pte
(to_edge_transform_and_lower with the XnnpackPartitioner). Each export is tried on its own: a
failure is recorded against that runner and shown in the table with its error. Then one
process per (model, runner) loads the artefact (aotrt: warm kernel cache; ORT: an
InferenceSession with ORT_ENABLE_ALL and intra_op_num_threads = --threads; ExecuTorch:
executorch.runtime with its threadpool reset to --threads; torch.compile: the first call,
which compiles; eager: building the module) - the "load" time - and times it: the median of
up to --iters finished forwards after warm-up. Its output is checked against eager fp32
(norm-wise relative error in float64).

Every child gets OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS = --threads,
torch.set_num_threads(--threads) where torch is imported, and aotrt.load(threads=--threads).

Memory per process: the RSS high-water mark (VmHWM) of the whole process, and the mark the
timed runs reach over the RSS before them (after a reset through /proc/self/clear_refs). The
aotrt process never imports torch; the ExecuTorch runtime's Python package imports it (noted).
The machine may be shared: the load average is recorded at the start, the end and around
every child process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from typing import Any, Callable

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["resnet18", "mobilenet_v2", "resnet50", "yolov8n", "bert", "gpt2", "whisper_enc"]
RUNNERS = ["eager", "aotrt", "ort", "executorch", "compile"]
TITLES = {"eager": "torch eager", "aotrt": "aotrt", "ort": "ONNX Runtime",
          "executorch": "ExecuTorch XNNPACK", "compile": "torch.compile"}
DESCRIPTIONS = {
    "resnet18": "torchvision resnet18, 1x3x224x224",
    "mobilenet_v2": "torchvision mobilenet_v2, 1x3x224x224",
    "resnet50": "torchvision resnet50, 1x3x224x224",
    "yolov8n": "ultralytics YOLOv8n (yolov8n.yaml, 80 classes), 1x3x320x320",
    "bert": "HF BertModel(BertConfig()) = BERT-base, sdpa attention, 1x128 tokens",
    "gpt2": "HF GPT2Model(GPT2Config()) = GPT-2 124M, sdpa attention, 1x128 tokens",
    "whisper_enc": "HF WhisperEncoder with Whisper-tiny's config (d=384, 4 layers, 6 heads), "
                   "1x80x3000 mel frames",
}
# Which prepare step makes each runner's artefact (eager and torch.compile need none).
ARTEFACT = {"aotrt": "aotrt", "ort": "onnx", "executorch": "pte"}


# -- models ---------------------------------------------------------------------------------------

def _flat(inner: Any, kwargs_names: tuple[str, ...] = ()) -> Any:
    """`inner` wrapped so that it returns a flat tuple of its tensor outputs."""
    import torch
    import torch.utils._pytree as pytree

    class Flat(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: Any) -> tuple:
            out = self.inner(**dict(zip(kwargs_names, args))) if kwargs_names else \
                self.inner(*args)
            if hasattr(out, "to_tuple"):
                out = out.to_tuple()
            return tuple(t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
    return Flat().eval()


def build(name: str) -> tuple[Any, tuple[Any, ...]]:
    """(module in eval mode returning a tuple, float32 example inputs), seeded: the same in
    every process."""
    import torch

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)
    if name in ("resnet18", "mobilenet_v2", "resnet50"):
        import torchvision

        m = getattr(torchvision.models, name)(weights=None)
        return _flat(m.eval()), (torch.randn(1, 3, 224, 224, generator=g),)
    if name == "yolov8n":
        os.environ.setdefault("YOLO_OFFLINE", "1")
        from ultralytics.nn.tasks import DetectionModel

        m = DetectionModel("yolov8n.yaml", verbose=False).eval()
        x = torch.randn(1, 3, 320, 320, generator=g)
        with torch.no_grad():
            m(x)            # the Detect head caches its anchors and strides on the first call
        return _flat(m), (x,)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers as tf

    if name == "bert":
        cfg = tf.BertConfig()
        cfg._attn_implementation = "sdpa"
        m = tf.BertModel(cfg, add_pooling_layer=False).eval()
        ids = torch.randint(0, cfg.vocab_size, (1, 128), generator=g)
        return _flat(m, ("input_ids",)), (ids,)
    if name == "gpt2":
        cfg = tf.GPT2Config(use_cache=False)
        cfg._attn_implementation = "sdpa"
        m = tf.GPT2Model(cfg).eval()
        ids = torch.randint(0, cfg.vocab_size, (1, 128), generator=g)
        return _flat(m, ("input_ids",)), (ids,)
    if name == "whisper_enc":
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        cfg = tf.WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6,
                               encoder_ffn_dim=1536, decoder_layers=4,
                               decoder_attention_heads=6, decoder_ffn_dim=1536,
                               num_mel_bins=80, max_source_positions=1500)
        cfg._attn_implementation = "sdpa"
        m = WhisperEncoder(cfg).eval()
        return _flat(m, ("input_features",)), (torch.randn(1, 80, 3000, generator=g),)
    raise ValueError(f"unknown model {name}")


# -- helpers --------------------------------------------------------------------------------------

def rel_err(got: Any, ref: Any) -> float:
    """||got - ref|| / ||ref|| in float64 (inf on a shape mismatch or a non-finite value)."""
    a, b = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if a.shape != b.shape or not np.all(np.isfinite(a)):
        return float("inf")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def max_rel_err(gots: list[Any], refs: list[Any]) -> float:
    """The worst rel_err over the outputs (inf when their counts differ)."""
    if len(gots) != len(refs):
        return float("inf")
    return max(rel_err(g, r) for g, r in zip(gots, refs))


def proc_status() -> dict[str, int]:
    """VmRSS and VmHWM of this process in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    return out


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


def load_io(workdir: str, name: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The saved inputs and eager fp32 outputs of `name`."""
    data = np.load(os.path.join(workdir, f"{name}.npz"))
    xs = [data[k] for k in sorted((k for k in data.files if k.startswith("x")),
                                  key=lambda k: int(k[1:]))]
    refs = [data[k] for k in sorted((k for k in data.files if k.startswith("ref")),
                                    key=lambda k: int(k[3:]))]
    return xs, refs


def aotrt_layout(model: Any, layout: str = "convnets-nhwc") -> str:
    """aotrt.export's layout for `model`: "convnets-nhwc" is channels_last for a model with
    1-D or 2-D convolutions (oneDNN's faster path), else auto; any other value as given."""
    if layout != "convnets-nhwc":
        return layout
    from aotrt.exporter.layout import has_conv

    return "channels_last" if has_conv(model) else "auto"


# -- subprocess: prepare --------------------------------------------------------------------------

def prepare(name: str, what: str, workdir: str, threads: int, layout: str) -> dict:
    """One artefact of `name`: "aotrt" (references, the aotrt program, its cold load and
    error), "onnx" (torch.onnx.export) or "pte" (ExecuTorch with XNNPACK)."""
    import torch

    torch.set_num_threads(threads)
    res: dict[str, Any] = {"model": name, "what": what}
    m, x = build(name)
    stem = os.path.join(workdir, name)
    t = time.perf_counter()
    if what == "aotrt":
        import aotrt

        res["description"] = DESCRIPTIONS[name]
        res["input_shapes"] = [list(a.shape) for a in x]
        with torch.no_grad():
            ref32 = [o.numpy() for o in m(*x)]
            ref64 = [o.numpy() for o in m.double()(*(
                a.double() if a.is_floating_point() else a for a in x))]
            m.float()
        res["eager_fp32_rel_err_vs_fp64"] = max_rel_err(ref32, ref64)
        np.savez(stem + ".npz", **{f"x{i}": a.numpy() for i, a in enumerate(x)},
                 **{f"ref{i}": r for i, r in enumerate(ref32)},
                 **{f"fp64_{i}": r for i, r in enumerate(ref64)})
        layout = aotrt_layout(m, layout)
        res["layout"] = layout
        t = time.perf_counter()
        prog = aotrt.export(m, x, layout=layout)
        res["export_s"] = time.perf_counter() - t
        res["kernels"], res["instructions"] = len(prog.kernels), len(prog.instructions)
        res["library_ops"] = sorted({i["fn"] for i in prog.instructions
                                     if i["op"] == "library"})
        prog.save(stem + ".aotp")
        t = time.perf_counter()
        d = aotrt.load(prog, device="cpu", threads=threads)
        res["load_cold_s"] = time.perf_counter() - t
        try:
            got = [o.numpy() for o in d.run(*(a.numpy() for a in x))]
        finally:
            d.close()
        res["rel_err_vs_eager_fp32"] = max_rel_err(got, ref32)
        res["rel_err_vs_eager_fp64"] = max_rel_err(got, ref64)
    elif what == "onnx":
        try:
            torch.onnx.export(m, x, stem + ".onnx", dynamo=True)
            res["exporter"] = "dynamo"
        except Exception as e:  # noqa: BLE001 - the TorchScript exporter is the fallback
            res["dynamo_error"] = f"{type(e).__name__}: {e}"[:500]
            torch.onnx.export(m, x, stem + ".onnx", dynamo=False)
            res["exporter"] = "torchscript"
        res["export_s"] = time.perf_counter() - t
    elif what == "pte":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
            XnnpackPartitioner)
        from executorch.exir import to_edge_transform_and_lower

        ep = torch.export.export(m, x)
        et = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
        res["delegated"] = str(et.exported_program().graph_module.code).count(
            "executorch_call_delegate")
        with open(stem + ".pte", "wb") as f:
            f.write(et.to_executorch().buffer)
        res["export_s"] = time.perf_counter() - t
    else:
        raise ValueError(what)
    return res


# -- subprocess: measure one runner ---------------------------------------------------------------

def measure(name: str, runner: str, workdir: str, threads: int, iters: int, warmup: int,
            max_s: float) -> dict:
    """Load and time one runner on one model in this (fresh) process; its error and memory."""
    xs, refs = load_io(workdir, name)
    stem = os.path.join(workdir, name)
    res: dict[str, Any] = {"runner": runner}
    out_arrays: Callable[[Any], list[Any]]
    t = time.perf_counter()
    if runner in ("eager", "compile"):
        import torch

        torch.set_num_threads(threads)
        m, _ = build(name)
        x = tuple(torch.from_numpy(a) for a in xs)
        if runner == "compile":
            m = torch.compile(m)

        def once() -> Any:
            with torch.no_grad():
                return m(*x)
        if runner == "compile":
            once()          # compiles
        out_arrays = lambda out: [o.numpy() for o in out]   # noqa: E731
    elif runner == "aotrt":
        import aotrt

        prog = aotrt.Program.load(stem + ".aotp")
        d = aotrt.load(prog, device="cpu", threads=threads)

        def once() -> Any:
            outs = d.run(*xs)
            d.stream.commit_and_wait()
            return outs
        out_arrays = lambda out: [o.numpy() for o in out]   # noqa: E731
    elif runner == "ort":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(stem + ".onnx", so, providers=["CPUExecutionProvider"])
        feeds = {i.name: a for i, a in zip(sess.get_inputs(), xs)}
        res["ort"] = ort.__version__

        def once() -> Any:
            return sess.run(None, feeds)
        out_arrays = list
    elif runner == "executorch":
        import torch
        from executorch.extension.pybindings import portable_lib
        from executorch.runtime import Runtime

        torch.set_num_threads(threads)
        portable_lib._unsafe_reset_threadpool(threads)
        res["threadpool_threads"] = portable_lib._threadpool_get_thread_count()
        method = Runtime.get().load_program(stem + ".pte").load_method("forward")
        x = [torch.from_numpy(a) for a in xs]

        def once() -> Any:
            return method.execute(x)
        out_arrays = lambda out: [o.numpy() for o in out]   # noqa: E731
    else:
        raise ValueError(runner)
    res["load_s"] = time.perf_counter() - t
    res["torch_imported"] = "torch" in sys.modules
    base = proc_status()
    res["hwm_reset"] = reset_hwm()
    res.update(time_runs(once, iters, warmup, max_s))
    res["rel_err_vs_eager_fp32"] = max_rel_err(out_arrays(once()), refs)
    end = proc_status()
    res["baseline_rss_bytes"], res["baseline_hwm_bytes"] = base["VmRSS"], base["VmHWM"]
    res["end_hwm_bytes"] = end["VmHWM"]
    res["peak_rss_bytes"] = max(base["VmHWM"], end["VmHWM"])
    if res["hwm_reset"]:
        res["peak_rss_over_baseline_bytes"] = end["VmHWM"] - base["VmRSS"]
    if runner == "aotrt":
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
    if lines:
        res = json.loads(lines[-1][len("RESULT "):])
    else:
        err = [ln for ln in p.stderr.splitlines() if ln.strip()]
        res = {"ok": False, "error": f"exit {p.returncode}: {err[-1] if err else ''}"[:300],
               "stderr": p.stderr[-3000:]}
    res["process_wall_s"] = time.perf_counter() - t
    res["loadavg_before"], res["loadavg_after"] = load0, os.getloadavg()
    return res


def cpu_info() -> dict:
    """The CPU's model name and its SIMD flags, from /proc/cpuinfo."""
    info = {"cpu_model": platform.processor(), "cpu_simd": []}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                info["cpu_simd"] = [s for s in ("avx", "avx2", "fma", "avx512f")
                                    if f" {s} " in line]
                break
    return info


def env_info() -> dict:
    """Versions of every runner's package (None where absent)."""
    from importlib import metadata

    vers = {}
    for pkg in ("torch", "torchvision", "transformers", "ultralytics", "onnxruntime", "onnx",
                "onnxscript", "executorch", "numpy", "onednn-cpu-gomp"):
        try:
            vers[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            vers[pkg] = None
    return {"python": sys.version.split()[0], "versions": vers, **cpu_info(),
            "logical_cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
            "cc": shutil.which("cc") or shutil.which("gcc"),
            "platform": platform.platform()}


def other_load() -> list[str]:
    """The busiest processes now, those using at least 1% of a CPU (for the note on what
    else was running): %CPU, seconds running, the command's first 120 characters."""
    try:
        p = subprocess.run(["ps", "-eo", "pcpu,etimes,args", "--sort=-pcpu"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = [ln.strip() for ln in p.stdout.splitlines()[1:9]]
    return [ln[:120] for ln in rows if ln.split() and float(ln.split()[0]) >= 1.0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--runners", default=",".join(RUNNERS))
    ap.add_argument("--threads", type=int, default=2, help="threads for every runner")
    ap.add_argument("--iters", type=int, default=20, help="timed runs (at most)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--passes", type=int, default=1,
                    help="measure every (model, runner) this many times, the runners in "
                         "turn; the table gives the median pass")
    ap.add_argument("--max-timed-s", type=float, default=15.0,
                    help="cap on the timed runs of one (model, runner); at least 5 runs")
    ap.add_argument("--layout", default="convnets-nhwc",
                    help="aotrt.export's layout, or convnets-nhwc: channels_last for models "
                         "with 2-D convolutions (oneDNN's faster path), else auto")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "bench", "results", "cpu"))
    ap.add_argument("--tag", default=None, help="result file stem (cpu-bench-DATE)")
    ap.add_argument("--note", default="", help="a note for the report (what else ran)")
    ap.add_argument("--workdir", default="/tmp/aotrt-bench-cpu")
    ap.add_argument("--child-timeout", type=float, default=900.0,
                    help="seconds one export or (model, runner) process may take")
    ap.add_argument("--env", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--prepare", help=argparse.SUPPRESS)
    ap.add_argument("--what", help=argparse.SUPPRESS)
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    ap.add_argument("--runner", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.env or args.prepare or args.measure:
        try:
            if args.env:
                res = env_info()
            elif args.prepare:
                res = prepare(args.prepare, args.what, args.workdir, args.threads, args.layout)
            else:
                res = measure(args.measure, args.runner, args.workdir, args.threads,
                              args.iters, args.warmup, args.max_timed_s)
            res["ok"] = True
        except Exception as e:  # noqa: BLE001 - recorded, never dropped
            res = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300],
                   "trace": traceback.format_exc()[-3000:]}
        print("RESULT " + json.dumps(res), flush=True)
        return 0

    t_start = time.perf_counter()
    date = time.strftime("%Y-%m-%d")
    runners = args.runners.split(",")
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    env = dict(os.environ)
    env.pop("AOTRT_CHECK_HAZARDS", None)    # timing runs without the hazard checker
    # A kernel cache of our own: the prepare step's load is cold, the measured loads warm.
    env["AOTRT_CACHE_DIR"] = os.path.join(args.workdir, "kcache")
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(args.workdir, "inductor")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(HF_HUB_OFFLINE="1", YOLO_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = str(args.threads)
    doc: dict[str, Any] = {
        "date": date, "command": " ".join([os.path.relpath(sys.executable, ROOT)
                                           if sys.executable.startswith(ROOT)
                                           else sys.executable, *sys.argv]),
        "what": "aotrt (cpu device) vs torch eager, ONNX Runtime, ExecuTorch XNNPACK and "
                "torch.compile; float32, batch 1",
        "threads": args.threads, "layout": args.layout, "note": args.note,
        "loadavg_start": os.getloadavg(), "other_processes_start": other_load(),
        "env": child(["--env"], env, 120),
        "iters": args.iters, "warmup": args.warmup, "max_timed_s": args.max_timed_s,
        "passes": args.passes,
        "models": {}}
    sub = ["--workdir", args.workdir, "--iters", str(args.iters), "--warmup",
           str(args.warmup), "--max-timed-s", str(args.max_timed_s), "--threads",
           str(args.threads), "--layout", args.layout]
    for name in args.models.split(","):
        print(f"== {name}", flush=True)
        entry: dict[str, Any] = {"description": DESCRIPTIONS[name], "prepare": {},
                                 "runners": {}}
        doc["models"][name] = entry
        needed = ["aotrt"] + [ARTEFACT[r] for r in runners if r in ARTEFACT and r != "aotrt"]
        for what in needed:
            p = child(["--prepare", name, "--what", what, *sub], env, args.child_timeout)
            entry["prepare"][what] = p
            print(f"  prepare {what}: " + (f"{p['export_s']:.1f} s" if p.get("ok")
                                           else "FAILED " + p["error"]), flush=True)
        if not entry["prepare"]["aotrt"].get("ok"):
            continue        # no references: nothing to check the runners against
        passes: dict[str, list[dict]] = {r: [] for r in runners}
        for k in range(args.passes):
            # Pass by pass, every runner in turn: a slow spell of the machine (seconds to
            # minutes long here) then falls on all of them, not on one.
            for runner in runners:
                art = ARTEFACT.get(runner)
                if art and not entry["prepare"][art].get("ok"):
                    r = {"ok": False,
                         "error": "export failed: " + entry["prepare"][art]["error"]}
                else:
                    r = child(["--measure", name, "--runner", runner, *sub], env,
                              args.child_timeout)
                passes[runner].append(r)
                entry["runners"][runner] = combine(passes[runner])
                print(f"  {runner:10s} " + (
                    f"{r['ms']:9.2f} ms ({r['runs']} runs) load {r['load_s']:.2f} s "
                    f"rel err {r['rel_err_vs_eager_fp32']:.1e}" if r.get("ok")
                    else "FAILED " + r["error"])
                    + (f"  (pass {k + 1})" if args.passes > 1 else ""), flush=True)
        save(doc, args, date, t_start)     # after every model: a cut-short run keeps its rows
    save(doc, args, date, t_start)
    print(markdown(doc))
    return 0


def combine(results: list[dict]) -> dict:
    """One runner's passes as one result: the median pass's figures, its ms the median of
    the passes' (each pass's ms kept in passes_ms); a failed pass fails the runner."""
    bad = [r for r in results if not r.get("ok")]
    if bad:
        return bad[0]
    ranked = sorted(results, key=lambda r: r["ms"])
    out = dict(ranked[(len(ranked) - 1) // 2])
    out["ms"] = statistics.median(r["ms"] for r in results)
    out["passes_ms"] = [r["ms"] for r in results]
    return out


def save(doc: dict, args: argparse.Namespace, date: str, t_start: float) -> None:
    """Write the JSON and the markdown report as they stand."""
    doc["loadavg_end"] = os.getloadavg()
    doc["other_processes_end"] = other_load()
    doc["wall_s"] = time.perf_counter() - t_start
    os.makedirs(args.out_dir, exist_ok=True)
    stem = os.path.join(args.out_dir, args.tag or f"cpu-bench-{date}")
    with open(stem + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(markdown(doc))


def fmt_load(load: Any) -> str:
    """A load-average triple as '1.00 / 0.50 / 0.20'."""
    return " / ".join(f"{v:.2f}" for v in load)


def markdown(doc: dict) -> str:
    """The report: a table of median ms, then error, load time and memory per runner."""
    e = doc["env"] if doc["env"].get("ok") else {"versions": {}, **cpu_info(),
                                                  "logical_cpus": os.cpu_count()}
    v = e["versions"]
    runners = [r for r in RUNNERS if any(r in m["runners"] for m in doc["models"].values())]
    mib = 2 ** 20

    def cell(r: dict | None, key: str, spec: str, scale: float = 1.0) -> str:
        if r is None:
            return "-"
        if not r.get("ok"):
            return "fails"
        return format(r[key] / scale, spec) if key in r else "-"

    lines = [
        f"# CPU benchmark, float32, batch 1, {doc['threads']} threads, {doc['date']}",
        "",
        f"`{doc['command']}`",
        "",
        f"{e['cpu_model']}, {e['logical_cpus']} logical CPUs ({', '.join(e['cpu_simd'])}). "
        f"torch {v.get('torch')}, onnxruntime {v.get('onnxruntime')}, executorch "
        f"{v.get('executorch')}, transformers {v.get('transformers')}, ultralytics "
        f"{v.get('ultralytics')}, oneDNN wheel {v.get('onednn-cpu-gomp')}. aotrt layout "
        f"`{doc['layout']}`. Load average at start {fmt_load(doc['loadavg_start'])}, at end "
        f"{fmt_load(doc['loadavg_end'])}; whole run {doc['wall_s']:.0f} s."
        + (f" Note: {doc['note']}" if doc.get("note") else ""),
        "",
        f"Median ms of one finished forward (up to {doc['iters']} runs, at most "
        f"{doc['max_timed_s']:.0f} s of them, at least 5, after {doc['warmup']} warm-ups), "
        "one fresh process per (model, runner)"
        + (f"; the median of {doc['passes']} passes, the runners in turn in each (every "
           "pass below)" if doc.get("passes", 1) > 1 else "")
        + ". \"fails\": see the errors below.",
        "",
        "| model | " + " | ".join(TITLES[r] for r in runners) + " |",
        "|---|" + "--:|" * len(runners),
    ]
    for name, m in doc["models"].items():
        lines.append(f"| {name} | " + " | ".join(
            cell(m["runners"].get(r), "ms", ".1f") for r in runners) + " |")
    if doc.get("passes", 1) > 1:
        lines += ["", "Every pass, ms:", "",
                  "| model | " + " | ".join(TITLES[r] for r in runners) + " |",
                  "|---|" + "--:|" * len(runners)]
        for name, m in doc["models"].items():
            lines.append(f"| {name} | " + " | ".join(
                " / ".join(f"{x:.1f}" for x in m["runners"][r].get("passes_ms", []))
                if r in m["runners"] and m["runners"][r].get("ok") else "-"
                for r in runners) + " |")
    for title, key, spec, scale in (
            ("Output error vs eager fp32 (max norm-wise relative error over the outputs)",
             "rel_err_vs_eager_fp32", ".1e", 1.0),
            ("Load seconds (aotrt: warm kernel cache; ORT: session; ExecuTorch: program and "
             "method; torch.compile: build and first call, which compiles; eager: build)",
             "load_s", ".2f", 1.0),
            ("Process peak RSS MiB (VmHWM; torch_imported marks a process that imports "
             "torch)", "peak_rss_bytes", ".0f", mib)):
        lines += ["", title + ":", "",
                  "| model | " + " | ".join(TITLES[r] for r in runners) + " |",
                  "|---|" + "--:|" * len(runners)]
        for name, m in doc["models"].items():
            lines.append(f"| {name} | " + " | ".join(
                cell(m["runners"].get(r), key, spec, scale) for r in runners) + " |")
    lines += ["", "aotrt export and cold load, eager fp32's own error vs fp64:", "",
              "| model | export s | cold load s | aotrt rel err vs fp64 | eager fp32 vs fp64 |",
              "|---|--:|--:|--:|--:|"]
    for name, m in doc["models"].items():
        p = m["prepare"].get("aotrt", {})
        if p.get("ok"):
            lines.append(f"| {name} | {p['export_s']:.1f} | {p['load_cold_s']:.2f} "
                         f"| {p['rel_err_vs_eager_fp64']:.1e} "
                         f"| {p['eager_fp32_rel_err_vs_fp64']:.1e} |")
        else:
            lines.append(f"| {name} | fails: {p.get('error', '?')[:120]} | | | |")
    errors = [f"- {name} / {what}: {r['error'][:300]}"
              for name, m in doc["models"].items()
              for what, r in [*(("export " + k, p) for k, p in m["prepare"].items()),
                              *m["runners"].items()] if not r.get("ok")]
    if errors:
        lines += ["", "Failures:", "", *errors]
    lines += ["", "Models:", ""]
    lines += [f"- {n}: {m['description']}" for n, m in doc["models"].items()]
    lines += ["", "Busiest other processes at the start (%CPU, seconds, command):", ""]
    lines += [f"    {ln}" for ln in doc.get("other_processes_start", [])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
