"""Time aotrt against torch eager, torch.compile and torch.compile(mode="reduce-overhead")
on the benchmark models, all fp16 on one GPU, in one run.

    python3 bench/bench.py --out results.json [--models a,b] [--iters 50] [--budget 480]

Each model runs in a subprocess of its own (a CUDA fault or an out-of-memory in one cannot
spoil the others) with a time limit. Per runner it records: the median of CUDA-event timings
of one forward after warm-up (ms), peak device memory (bytes), load or compile time (s), and
the relative error of the output against torch eager (fp16) output. A runner that fails to
export, compile or run is recorded with its error, not dropped.

Memory: torch runners report torch.cuda.max_memory_allocated; aotrt reports the high-water
mark of the stream-ordered pool it allocates from (weights, arena, outputs, scratch and
library workspaces) plus its peak raw bytes as the runtime counts them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from typing import Any, Callable

MODELS = ["yolov8n", "resnet50_b1", "resnet50_b32", "bert_base_8x128", "gpt2_1x256",
          "whisper_tiny_encoder"]
RUNNERS = ["eager", "aotrt", "aotrt_graph", "compile", "compile_reduce_overhead"]


# -- models ---------------------------------------------------------------------------------------

def _informative_scores(model):
    """Weights under which YOLOv8n's class scores depend on the input. Ultralytics' own
    initialisation gives each class logit a bias of about -11.5 and lets the signal fade
    through the backbone, so every score is sigmoid(-11.5) ~ 1e-5, a subnormal in fp16 that
    every runner rounds alike: a wrong score could not show. Here convolutions are
    He-initialised, the class biases are zero and the class convolutions are scaled so the
    logits spread over about +-2.5."""
    import torch

    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(mod.weight, nonlinearity="relu")
        for branch in model.model[-1].cv3:
            branch[-1].bias.zero_()
            branch[-1].weight.mul_(10.0)
    return model


def build(name: str):
    """(module, example inputs) on cuda in fp16, from configs (no downloads)."""
    import torch

    torch.manual_seed(0)
    dev = "cuda"
    if name == "yolov8n":
        os.environ.setdefault("YOLO_OFFLINE", "1")
        from ultralytics.nn.tasks import DetectionModel

        inner = _informative_scores(DetectionModel("yolov8n.yaml", verbose=False).eval())

        class Yolo(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.m = inner

            def forward(self, x):
                return self.m(x)[0]

        m = Yolo().eval().half().to(dev)
        x = torch.randn(1, 3, 640, 640, device=dev, dtype=torch.half)
        with torch.no_grad():
            m(x)  # Detect caches anchors and strides on the first call
        return m, (x,)
    if name.startswith("resnet50"):
        import torchvision

        bs = 32 if name.endswith("b32") else 1
        m = torchvision.models.resnet50(weights=None).eval().half().to(dev)
        return m, (torch.randn(bs, 3, 224, 224, device=dev, dtype=torch.half),)
    if name == "bert_base_8x128":
        from transformers import BertConfig, BertModel

        cfg = BertConfig(attn_implementation="sdpa")
        inner = BertModel(cfg, add_pooling_layer=False).eval()

        class Bert(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.m = inner

            def forward(self, ids):
                return self.m(input_ids=ids).last_hidden_state

        m = Bert().eval().half().to(dev)
        return m, (torch.randint(0, cfg.vocab_size, (8, 128), device=dev),)
    if name == "gpt2_1x256":
        from transformers import GPT2Config, GPT2Model

        cfg = GPT2Config(attn_implementation="sdpa")
        inner = GPT2Model(cfg).eval()

        class Gpt2(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.m = inner

            def forward(self, ids):
                return self.m(input_ids=ids, use_cache=False).last_hidden_state

        m = Gpt2().eval().half().to(dev)
        return m, (torch.randint(0, cfg.vocab_size, (1, 256), device=dev),)
    if name == "whisper_tiny_encoder":
        from transformers import WhisperConfig
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        cfg = WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6,
                            decoder_layers=4, decoder_attention_heads=6, encoder_ffn_dim=1536,
                            decoder_ffn_dim=1536, num_mel_bins=80, max_source_positions=1500,
                            attn_implementation="sdpa")
        inner = WhisperEncoder(cfg).eval()

        class Whisper(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.m = inner

            def forward(self, feats):
                return self.m(feats).last_hidden_state

        m = Whisper().eval().half().to(dev)
        return m, (torch.randn(1, 80, 3000, device=dev, dtype=torch.half),)
    if name == "rtdetr_l":          # profiled, not benchmarked (issue #9's cliff)
        os.environ.setdefault("YOLO_OFFLINE", "1")
        from ultralytics.nn.tasks import RTDETRDetectionModel

        inner = RTDETRDetectionModel("rtdetr-l.yaml", verbose=False).eval()

        class Detr(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.m = inner

            def forward(self, x):
                return self.m(x)[0]

        m = Detr().eval().half().to(dev)
        x = torch.randn(1, 3, 640, 640, device=dev, dtype=torch.half)
        with torch.no_grad():
            m(x)
        return m, (x,)
    if name == "stem_b32":          # profiled, not benchmarked: ResNet-50's stem and max pool
        import torchvision

        r = torchvision.models.resnet50(weights=None)
        m = torch.nn.Sequential(r.conv1, r.bn1, r.relu, r.maxpool).eval().half().to(dev)
        return m, (torch.randn(32, 3, 224, 224, device=dev, dtype=torch.half),)
    raise ValueError(f"unknown model {name}")


# -- timing ---------------------------------------------------------------------------------------

def time_torch(fn: Callable[[], Any], iters: int, warmup: int) -> float:
    """Median ms of one call, CUDA events on torch's current stream."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def reset_pool_high() -> None:
    """Restart the high-water marks of the driver's default pool (aotrt's memory), so each
    runner reports its own peak and not the one of the runner before it."""
    from cuda.bindings import driver

    err, pool = driver.cuDeviceGetDefaultMemPool(0)
    if int(err) == 0:
        a = driver.CUmemPool_attribute
        for attr in (a.CU_MEMPOOL_ATTR_USED_MEM_HIGH, a.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH):
            driver.cuMemPoolSetAttribute(pool, attr, driver.cuuint64_t(0))


def time_aotrt(d: Any, inputs: tuple, iters: int, warmup: int) -> tuple[float, Any]:
    """Median ms of one run, CUDA events on the delegate's stream (host overhead included:
    the end event is recorded after run() has enqueued everything)."""
    stream = d.stream
    out = None
    for _ in range(warmup):
        out = d.run(*inputs)
    stream.commit_and_wait()
    times = []
    for _ in range(iters):
        e0 = stream.timing_event()
        out = d.run(*inputs)
        e1 = stream.timing_event()
        e1.sync()
        times.append(e1 - e0)
    times.sort()
    return times[len(times) // 2], out


def rel_err(got, ref) -> float:
    """Relative L2 error of `got` against `ref` in float64 (inf when `got` is not finite)."""
    g, r = got.double(), ref.double()
    if not bool(g.isfinite().all()):
        return float("inf")
    return float((g - r).norm() / r.norm().clamp_min(1e-30))


def parts(name: str, out) -> dict:
    """The output split where one norm would hide errors: YOLOv8n's [1, 84, N] rows are 4 box
    coordinates (hundreds of pixels) and 80 class scores (0..1), so they are judged apart."""
    if name == "yolov8n":
        return {"boxes": out[:, :4], "scores": out[:, 4:]}
    return {"out": out}


def errors(name: str, got, ref32) -> dict:
    """Per part: relative error of a runner's output against the fp32 eager reference."""
    g, r = parts(name, got.to(ref32.device)), parts(name, ref32)
    return {k: rel_err(g[k], r[k]) for k in r}


def fp32_reference(m, inputs: tuple):
    """The model's output in float32 eager (a float32 copy of the fp16 module) on the same
    inputs: the reference every runner, eager fp16 included, is judged against."""
    import copy

    import torch

    m32 = copy.deepcopy(m).float()
    ins32 = tuple(x.float() if x.is_floating_point() else x for x in inputs)
    prev = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.no_grad():
            out = m32(*ins32)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev
    del m32
    return out


# -- one model ------------------------------------------------------------------------------------

def run_model(name: str, runners: list[str], iters: int, warmup: int,
              prog_path: str | None = None, partial_path: str | None = None) -> dict:
    """Every runner on one model; failures recorded per runner."""
    import torch

    res: dict[str, Any] = {"model": name, "runners": {}}
    t0 = time.perf_counter()
    m, inputs = build(name)
    res["build_s"] = time.perf_counter() - t0
    with torch.no_grad():
        ref = m(*inputs)
    res["output_shape"] = list(ref.shape)
    ref32 = fp32_reference(m, inputs)
    res["eager_fp16_err"] = errors(name, ref, ref32)

    def record(runner: str, fn: Callable[[], dict]) -> None:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        reset_pool_high()
        try:
            r = fn()
            r["ok"] = True
        except Exception as e:  # noqa: BLE001 - recorded, never dropped
            r = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000],
                 "trace": traceback.format_exc()[-3000:]}
        res["runners"][runner] = r
        if partial_path:
            with open(partial_path, "w") as f:
                json.dump(res, f)
        errs = " ".join(f"{k} {v:.2e}" for k, v in r.get("err_fp32", {}).items())
        print(f"  {name:22s} {runner:24s} " + (
            f"{r['ms']:8.3f} ms  err vs fp32 {errs or '-'}" if r.get("ok")
            else "FAILED " + r["error"][:300]), flush=True)

    if "eager" in runners:
        def eager() -> dict:
            with torch.no_grad():
                ms = time_torch(lambda: m(*inputs), iters, warmup)
                out = m(*inputs)
            return {"ms": ms, "peak_bytes": torch.cuda.max_memory_allocated(),
                    "err_fp32": errors(name, out, ref32)}
        record("eager", eager)

    prog_box: dict = {}
    if "aotrt" in runners or "aotrt_graph" in runners:
        def export() -> dict:
            import aotrt
            if prog_path:
                # exported in the background by the driver: wait for it
                t = time.perf_counter()
                while not os.path.exists(prog_path) and not os.path.exists(prog_path + ".err"):
                    if time.perf_counter() - t > 5:
                        raise TimeoutError("export did not finish")
                    time.sleep(0.2)
                if os.path.exists(prog_path + ".err"):
                    raise RuntimeError(open(prog_path + ".err").read()[-2000:])
                info = json.load(open(prog_path + ".json"))
                prog_box["prog"] = aotrt.Program.load(prog_path)
                return {"ms": 0.0, **info}
            t = time.perf_counter()
            prog_box["prog"] = aotrt.export(m, inputs)
            return {"ms": 0.0, "export_s": time.perf_counter() - t,
                    "kernels": len(prog_box["prog"].kernels),
                    "instructions": len(prog_box["prog"].instructions)}
        record("aotrt_export", export)

    for runner, graph in (("aotrt", False), ("aotrt_graph", True)):
        if runner not in runners:
            continue

        def ours(graph: bool = graph) -> dict:
            import aotrt
            from aotrt.runtime.device import get_device
            if "prog" not in prog_box:
                raise RuntimeError("export failed")
            dev = get_device("cuda")
            t = time.perf_counter()
            d = aotrt.load(prog_box["prog"], device="cuda", cuda_graph=graph)
            load_s = time.perf_counter() - t
            try:
                t = time.perf_counter()
                first = d.run(*inputs)
                torch.from_dlpack(first[0]).shape  # noqa: B018 - waits for the run
                first_run_s = time.perf_counter() - t
                ms, out = time_aotrt(d, inputs, iters, warmup)
                got = torch.from_dlpack(out[0])
                err = rel_err(got, ref)
                err32 = errors(name, got, ref32)
                pool = dev.mempool_stats()
                return {"ms": ms, "load_s": load_s, "first_run_s": first_run_s,
                        "rel_err": err, "err_fp32": err32, "peak_bytes": pool["used_high"],
                        "pool_reserved_high": pool["reserved_high"],
                        "runtime_peak_raw_bytes": dev.memory.peak_raw_bytes}
            finally:
                d.close()
        record(runner, ours)

    for runner, mode in (("compile", None), ("compile_reduce_overhead", "reduce-overhead")):
        if runner not in runners:
            continue

        def compiled(mode: str | None = mode) -> dict:
            torch._dynamo.reset()
            cm = torch.compile(m, mode=mode) if mode else torch.compile(m)
            t = time.perf_counter()
            with torch.no_grad():
                out = cm(*inputs)
                torch.cuda.synchronize()
                compile_s = time.perf_counter() - t
                ms = time_torch(lambda: cm(*inputs), iters, warmup)
                out = cm(*inputs)
                err = rel_err(out, ref)
            return {"ms": ms, "compile_s": compile_s, "rel_err": err,
                    "err_fp32": errors(name, out, ref32),
                    "peak_bytes": torch.cuda.max_memory_allocated()}
        record(runner, compiled)
    return res


# -- driver ---------------------------------------------------------------------------------------

def export_one(name: str, path: str) -> int:
    """Export one model to `path` (.err holds the failure, .json the export facts)."""
    try:
        import aotrt
        m, inputs = build(name)
        t = time.perf_counter()
        prog = aotrt.export(m, inputs)
        export_s = time.perf_counter() - t
        prog.save(path + ".tmp")
        with open(path + ".json", "w") as f:
            json.dump({"export_s": export_s, "kernels": len(prog.kernels),
                       "instructions": len(prog.instructions)}, f)
        os.replace(path + ".tmp", path)
        return 0
    except BaseException as e:  # noqa: BLE001 - reported to the timing process
        with open(path + ".err", "w") as f:
            f.write(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        return 1


def env_info() -> dict:
    import torch

    info = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
            "python": sys.version.split()[0]}
    for mod in ("cuda.core", "nvmath", "cudnn", "transformers", "ultralytics", "torchvision"):
        try:
            info[mod] = __import__(mod, fromlist=["_"]).__version__
        except Exception as e:  # noqa: BLE001
            info[mod] = f"unavailable: {type(e).__name__}"
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/cuda/latest.json")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--runners", default=",".join(RUNNERS))
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for all models")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--prog", help=argparse.SUPPRESS)
    ap.add_argument("--export", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", default="/tmp/aotrt-bench")
    args = ap.parse_args()
    runners = args.runners.split(",")
    if args.export:
        return export_one(args.export, args.prog)
    if args.one:
        res = run_model(args.one, runners, args.iters, args.warmup, args.prog,
                        os.path.join(args.workdir, f"{args.one}.partial.json"))
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    models = args.models.split(",")
    t_start = time.perf_counter()
    os.makedirs(args.workdir, exist_ok=True)
    doc: dict[str, Any] = {"env": env_info(), "iters": args.iters, "warmup": args.warmup,
                           "models": {}}
    exporters = {}
    if "aotrt" in runners or "aotrt_graph" in runners:
        # Exports are CPU work: all of them at once, in parallel processes.
        for name in models:
            path = os.path.join(args.workdir, f"{name}.aotp")
            for old in (path, path + ".err", path + ".json"):
                if os.path.exists(old):
                    os.remove(old)
            exporters[name] = subprocess.Popen(
                [sys.executable, __file__, "--export", name, "--prog", path],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Wait for all exports before timing anything: background CPU work would slow the
        # host-bound peers (torch eager) and flatter aotrt.
        for name, proc in exporters.items():
            try:
                proc.wait(timeout=max(10.0, args.budget * 0.4 - (time.perf_counter() - t_start)))
            except subprocess.TimeoutExpired:
                proc.kill()
        doc["export_phase_s"] = time.perf_counter() - t_start
        print(f"exports done in {doc['export_phase_s']:.1f} s", flush=True)
    for i, name in enumerate(models):
        left = args.budget - (time.perf_counter() - t_start)
        share = left / (len(models) - i)
        if share < 20:
            doc["models"][name] = {"model": name, "error": "skipped: time budget spent"}
            continue
        print(f"== {name} (limit {share:.0f} s)", flush=True)
        part = os.path.join(args.workdir, f"{name}.partial.json")
        if os.path.exists(part):
            os.remove(part)
        cmd = [sys.executable, __file__, "--one", name, "--runners", args.runners,
               "--iters", str(args.iters), "--warmup", str(args.warmup)]
        if name in exporters:
            cmd += ["--prog", os.path.join(args.workdir, f"{name}.aotp")]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=share)
            out = proc.stdout
            sys.stdout.write("".join(line + "\n" for line in out.splitlines()
                                     if not line.startswith("RESULT ")))
            lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
            if lines:
                doc["models"][name] = json.loads(lines[-1][len("RESULT "):])
            else:
                doc["models"][name] = {"model": name, "error": f"exit {proc.returncode}",
                                       "stderr": proc.stderr[-3000:]}
                print(proc.stderr[-1500:])
        except subprocess.TimeoutExpired as e:
            partial = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            sys.stdout.write(partial)
            part = os.path.join(args.workdir, f"{name}.partial.json")
            entry = json.load(open(part)) if os.path.exists(part) else {"model": name}
            entry["error"] = f"timed out after {share:.0f} s; runners not listed did not finish"
            entry["log"] = partial[-3000:]
            doc["models"][name] = entry
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    for proc in exporters.values():
        if proc.poll() is None:
            proc.kill()
    doc["wall_s"] = time.perf_counter() - t_start
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(table(doc))
    return 0


def table(doc: dict) -> str:
    """A short text table: ms per runner per model (F = failed)."""
    head = f"{'model':22s}" + "".join(f"{r:>16s}" for r in RUNNERS)
    lines = [head]
    for name, res in doc["models"].items():
        row = f"{name:22s}"
        for r in RUNNERS:
            x = res.get("runners", {}).get(r)
            row += f"{'-' if x is None else (format(x['ms'], '.3f') if x.get('ok') else 'F'):>16s}"
        lines.append(row)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
