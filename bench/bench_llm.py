"""Text generation side by side: Hugging Face eager, Hugging Face's static cache compiled
(generate's own compile, mode reduce-overhead; cuda only), ONNX Runtime (cpu) and aotrt
(llm.export + llm.generate), one process per runner and batch size.

    python bench/bench_llm.py --model gpt2 --device cuda --dtype bfloat16 \
        --batch 1 8 --out bench/results/llm/x.json
    python bench/bench_llm.py --model llama-200m --device cpu --dtype float32 \
        --batch 1 --threads 2 --out bench/results/llm/y.json

Models are the names of aotrt/llm/configs.py (random weights, seed 0); every runner gets the
same prompt ids and records the first new tokens of row 0 (`tokens`), so the table shows
whether the runners agree.

Each runner records, for a prompt of `--prompt` tokens (random ids, random weights):
- `ttft_ms`: generate with one new token, until its ids are on the host (median of runs);
- `ms_per_token`: (time for `--new` tokens - time for 1) / (`--new` - 1), medians, with the
  spread of the runs (min, max);
- `device_mib`: device memory in use after the runs less before the model existed
  (cudaMemGetInfo: the same count for every runner, allocator caches included);
- `load_s`: aotrt: aotrt.load of the saved file (kernels compiled); Hugging Face:
  from_pretrained of a saved checkpoint onto the device.
aotrt also records `host_us`: the host time of one decode step as generate queues it (a
runtime/loop.py step: inputs staged, the fed ids copied, the replay and the read-back
queued), with the device idle before each step.

On cpu every child gets OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS =
`--threads`, torch.set_num_threads, aotrt.load(threads=) and ORT's intra_op_num_threads;
`device_mib` is then the process's peak RSS (VmHWM) less its RSS before the model existed,
and the load average is recorded around each child (the machine may be shared).
`--interleave` keeps every runner's process loaded at once and takes the timed runs in
turn, a generate of each runner after the other (the order rotating each round), so that
each runner meets the same load on a shared machine; the table's numbers are then those
runs' (ttft: one new token; ms/token from runs of `--new`).
The `ort` runner exports two ONNX graphs with torch.onnx.export (dynamo): a prefill of the
prompt, and a decode step whose past keys and values are inputs of dynamic length and whose
presents (the past with the new token's entries concatenated, as Optimum's exports do) are
outputs fed back; both end in the arg-max, as aotrt's methods do. The `torchao_int4` runner
is hf_static after torchao's `quantize_(model, Int4WeightOnlyConfig(group_size=128))`
(cuda; torchao from .whl on the GPU machine). ExecuTorch is not a
runner: its package pins its own torch, which would replace the environment's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RUNNERS = ("hf_eager", "hf_static", "torchao_int4", "ort", "aotrt", "aotrt_int8",
           "aotrt_int4")
#: each device's default runners (hf_static is CUDA graphs; ort is timed on the CPU)
DEVICE_RUNNERS = {"cuda": ("hf_eager", "hf_static", "torchao_int4", "aotrt", "aotrt_int8",
                           "aotrt_int4"),
                  "cpu": ("hf_eager", "ort", "aotrt")}
#: new tokens of row 0 each runner records, to compare across runners
TOKENS = 16
#: aotrt runners with quantized linear weights (llm.export weights=, group 128)
WEIGHTS = {"aotrt_int8": "int8", "aotrt_int4": "int4"}


def _model(name: str, dtype: str) -> Any:
    from aotrt.llm.configs import build

    return build(name, dtype, seed=0)


def _prompt(batch: int, prompt: int, vocab: int) -> np.ndarray:
    """The prompt ids every runner gets."""
    return np.random.default_rng(0).integers(3, vocab, (batch, prompt))


def _status(key: str) -> int:
    """A byte count of this process's /proc/self/status (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _mem_used(device: str) -> int:
    """cuda: device memory in use; cpu: this process's RSS."""
    if device != "cuda":
        return _status("VmRSS")
    from cuda.bindings import runtime as rt

    err, free, total = rt.cudaMemGetInfo()
    return int(total - free)


def _mem_end(device: str) -> int:
    """_mem_used's counterpart after the runs: on cpu the peak RSS (VmHWM)."""
    return _status("VmHWM") if device != "cuda" else _mem_used(device)


def _median_ms(fn: Callable[[], Any], runs: int) -> tuple[float, float, float, list[float]]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times), max(times), times


def _per_token(gen: Callable[[int], Any], args: argparse.Namespace) -> dict[str, Any]:
    new, runs = args.new, args.runs
    gen(new)                                           # warm: compiles, graphs, pools
    gen(1)
    if args.serve:
        return _serve(gen, new)
    one = _median_ms(lambda: gen(1), runs)
    full = _median_ms(lambda: gen(new), runs)
    per = [(f - one[0]) / (new - 1) for f in full[3]]
    return {"ttft_ms": one[0], "ttft_range": [one[1], one[2]],
            "ms_per_token": statistics.median(per), "ms_per_token_range": [min(per), max(per)],
            "runs": runs}


def _serve(gen: Callable[[int], Any], new: int) -> dict[str, Any]:
    """Time a generate whenever the driver asks (`--interleave`): "ttft" one new token,
    "full" `new` of them; "quit" ends. Replies are stdout lines starting with "@" (export
    tools print to stdout too)."""
    print("@ready", flush=True)
    for line in sys.stdin:
        what = line.strip()
        if what == "quit":
            break
        t0 = time.perf_counter()
        gen(1 if what == "ttft" else new)
        print(f"@t {(time.perf_counter() - t0) * 1e3}", flush=True)
    return {}


def _reply(proc: subprocess.Popen, runner: str) -> str:
    """The next "@" line of a serving child."""
    for line in proc.stdout:
        if line.startswith("@"):
            return line.strip()
    raise RuntimeError(f"{runner}: the serving child ended ({proc.wait()})")


def interleaved(args: argparse.Namespace, runners: list[str], batch: int,
                cmd: Callable[[str], list[str]], env: dict[str, str]) -> list[dict[str, Any]]:
    """Every runner's child loaded at once, the timed generates taken in turn."""
    procs: dict[str, subprocess.Popen] = {}
    load0 = os.getloadavg()[0]
    try:
        for runner in runners:
            procs[runner] = subprocess.Popen(cmd(runner) + ["--serve"], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True, env=env)
            _reply(procs[runner], runner)                # loaded and warm
        times: dict[str, dict[str, list[float]]] = {r: {"ttft": [], "full": []}
                                                    for r in runners}
        for i in range(args.runs):
            order = runners[i % len(runners):] + runners[:i % len(runners)]
            for what in ("ttft", "full"):
                for runner in order:
                    procs[runner].stdin.write(what + "\n")
                    procs[runner].stdin.flush()
                    times[runner][what].append(float(_reply(procs[runner], runner).split()[1]))
        rows = []
        for runner, proc in procs.items():
            out, _ = proc.communicate("quit\n")
            row = json.loads(out.strip().splitlines()[-1])
            one, full = times[runner]["ttft"], times[runner]["full"]
            per = [(f - statistics.median(one)) / (args.new - 1) for f in full]
            row.update(ttft_ms=statistics.median(one), ttft_range=[min(one), max(one)],
                       ms_per_token=statistics.median(per),
                       ms_per_token_range=[min(per), max(per)], runs=args.runs,
                       ttft_runs=one, full_runs=full, interleaved=True, runner=runner,
                       batch=batch, loadavg=[load0, os.getloadavg()[0]])
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    return rows


def run_hf(args: argparse.Namespace, batch: int, compiled: bool, torchao: str | None = None
           ) -> dict[str, Any]:
    """Hugging Face generate, eager (dynamic cache) or static cache compiled; `torchao`
    "int4" quantizes the linear layers first with torchao's Int4WeightOnlyConfig (group 128,
    tinygemm's tile packing: the cuda int4 kernel torchao documents for decoding)."""
    import torch
    from transformers import AutoModelForCausalLM, CompileConfig

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    base = _mem_used(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        _model(args.model, args.dtype).save_pretrained(tmp)
        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(
            tmp, dtype=getattr(torch, args.dtype), attn_implementation="sdpa"
        ).to(args.device).eval()
        if torchao:
            from torchao.quantization import Int4WeightOnlyConfig, quantize_

            # tinygemm's packing (torch's own _weight_int4pack_mm): torchao 0.17's default
            # (plain) packing needs the mslk kernels, which the GPU machine lacks.
            quantize_(model, Int4WeightOnlyConfig(group_size=128,
                                                  int4_packing_format="tile_packed_to_4d"))
        if args.device == "cuda":
            torch.cuda.synchronize()
        load_s = time.perf_counter() - t0
    ids = torch.from_numpy(_prompt(batch, args.prompt, model.config.vocab_size)).to(args.device)
    kw: dict[str, Any] = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    if compiled:
        kw["cache_implementation"] = "static"
        kw["compile_config"] = CompileConfig(mode="reduce-overhead")

    def gen(n: int) -> Any:
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        return out.cpu()

    res = _per_token(gen, args)
    if args.device == "cuda":
        torch.cuda.synchronize()
    res.update(load_s=load_s, device_mib=(_mem_end(args.device) - base) / 2**20,
               tokens=gen(min(TOKENS, args.new))[0, args.prompt:].tolist())
    return res


def run_ort(args: argparse.Namespace, batch: int) -> dict[str, Any]:
    """ONNX Runtime (cpu): a prefill graph and a decode-step graph with past keys and values
    as inputs (dynamic length) and presents as outputs, greedy in the graph."""
    import onnxruntime as ort
    import torch
    from transformers import DynamicCache

    torch.set_num_threads(args.threads)
    base = _mem_used(args.device)
    model = _model(args.model, args.dtype)
    cfg = model.config
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    class Step(torch.nn.Module):
        """ids [B, n] and positions after a past of 2 tensors a layer -> (next ids,
        presents)."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.model = inner

        def forward(self, ids: Any, pos: Any, *past: Any) -> tuple[Any, ...]:
            cache = DynamicCache(config=cfg)
            for i in range(len(past) // 2):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=ids, position_ids=pos, past_key_values=cache,
                             use_cache=True)
            flat = [t for layer in out.past_key_values.layers
                    for t in (layer.keys, layer.values)]
            return (out.logits[:, -1].argmax(-1), *flat)

    names = [f"past{i}" for i in range(2 * cfg.num_hidden_layers)]
    outs = ["next"] + [f"present{i}" for i in range(len(names))]
    step = Step(model).eval()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        ids = torch.zeros((batch, args.prompt), dtype=torch.long)
        pos = torch.arange(args.prompt).expand(batch, -1)
        # The query length is static in each graph: a dynamic one made transformers' sdpa
        # call take a symbolic is_causal, which torch.export refuses.
        torch.onnx.export(step, (ids, pos), f"{tmp}/prefill.onnx", dynamo=True,
                          input_names=["ids", "pos"], output_names=outs)
        past = tuple(torch.zeros(batch, heads, 3, head_dim) for _ in names)
        length = torch.export.Dim("past", min=1, max=args.prompt + args.new)
        torch.onnx.export(step, (ids[:, :1], pos[:, :1], *past), f"{tmp}/decode.onnx",
                          dynamo=True, input_names=["ids", "pos", *names], output_names=outs,
                          dynamic_shapes=(None, None, tuple({2: length} for _ in names)))
        export_s = time.perf_counter() - t0
        del model, step
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = args.threads, 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        cpu = ["CPUExecutionProvider"]
        t0 = time.perf_counter()
        pre = ort.InferenceSession(f"{tmp}/prefill.onnx", so, providers=cpu)
        dec = ort.InferenceSession(f"{tmp}/decode.onnx", so, providers=cpu)
        load_s = time.perf_counter() - t0
    prompt = _prompt(batch, args.prompt, cfg.vocab_size)
    positions = np.broadcast_to(np.arange(args.prompt), (batch, args.prompt)).copy()

    def gen(n: int) -> np.ndarray:
        got = pre.run(None, {"ids": prompt, "pos": positions})
        toks = [got[0]]
        for i in range(1, n):
            feed = dict(zip(names, got[1:]))
            feed["ids"] = toks[-1][:, None]
            feed["pos"] = np.full((batch, 1), args.prompt + i - 1, np.int64)
            got = dec.run(None, feed)
            toks.append(got[0])
        return np.concatenate([prompt, np.stack(toks, 1)], 1)

    res = _per_token(gen, args)
    res.update(load_s=load_s, export_s=export_s,
               tokens=gen(min(TOKENS, args.new))[0, args.prompt:].tolist(),
               device_mib=(_mem_end(args.device) - base) / 2**20)
    return res


def export_aotrt(args: argparse.Namespace, batch: int, weights: str | None, path: Path
                 ) -> dict[str, Any]:
    """llm.export (max_batch = the batch; `weights` int8/int4 or None) saved to `path`."""
    from aotrt import llm

    model = _model(args.model, args.dtype)
    t0 = time.perf_counter()
    prog = llm.export(model, max_seq_len=args.prompt + args.new, max_batch=batch,
                      prefill_len=args.prompt, weights=weights,
                      embeddings=weights if args.embeddings else None)
    export_s = time.perf_counter() - t0
    prog.save(path)
    return {"export_s": export_s, "vocab": model.config.vocab_size}


def run_aotrt(args: argparse.Namespace, batch: int, weights: str | None = None
              ) -> dict[str, Any]:
    """aotrt: llm.export, save, load, llm.generate. On cpu the export runs in a child
    process and this one never imports torch, as a deployment runs: with torch's OpenMP
    threads in the process, libgomp throttled the kernels' spin-wait (more threads than
    cores) and GPT-2's decode step took 22-23 against 16-18 ms (2 AVX2 cores)."""
    import aotrt
    from aotrt import llm

    base = _mem_used(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.aotp"
        if args.device == "cpu":
            cmd = [sys.executable, __file__, "--export-to", str(path), "--weights",
                   weights or "", "--model", args.model, "--dtype", args.dtype, "--batch",
                   str(batch), "--prompt", str(args.prompt), "--new", str(args.new)]
            cmd += ["--embeddings"] if args.embeddings else []
            env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            info = json.loads(proc.stdout.strip().splitlines()[-1])
        else:
            info = export_aotrt(args, batch, weights, path)
        export_s, vocab = info["export_s"], info["vocab"]
        size = path.stat().st_size
        t0 = time.perf_counter()
        m = aotrt.load(path, device=args.device,
                       threads=args.threads if args.device == "cpu" else None)
        load_s = time.perf_counter() - t0
    ids = _prompt(batch, args.prompt, vocab)
    with m:
        def gen(n: int) -> np.ndarray:
            return llm.generate(m, ids, max_new_tokens=n, eos_token_id=[])

        res = _per_token(gen, args)
        res.update(load_s=load_s, export_s=export_s, file_mib=size / 2**20,
                   host_us=_host_us(m, batch, args.prompt),
                   tokens=gen(min(TOKENS, args.new))[0, args.prompt:].tolist())
        res["device_mib"] = (_mem_end(args.device) - base) / 2**20
    res["torch_imported"] = "torch" in sys.modules
    return res


def _host_us(m: Any, batch: int, slot: int) -> float:
    """Median host time of one decode step as llm.generate queues it (a Loop step: inputs
    staged, the fed ids copied, the replay and the read-back queued), with the device idle
    before each step."""
    from aotrt.runtime.loop import Loop

    ids, start = np.zeros((batch, 1), np.int64), np.zeros(batch, np.int64)
    pos = np.array(slot, np.int64)
    times = []
    with Loop(m.method("decode").bind(), feed={0: 0}) as loop:
        loop.step(ids, pos, start)
        for _ in range(50):
            loop.result()                              # the device is idle after this
            t0 = time.perf_counter()
            loop.step(None, pos, start)
            times.append((time.perf_counter() - t0) * 1e6)
        loop.result()
    return statistics.median(times)


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """One runner at one batch size, in this process."""
    if args.one.startswith("aotrt"):
        return run_aotrt(args, args.batch[0], WEIGHTS.get(args.one))
    if args.one == "ort":
        return run_ort(args, args.batch[0])
    if args.one == "torchao_int4":
        return run_hf(args, args.batch[0], compiled=True, torchao="int4")
    return run_hf(args, args.batch[0], compiled=args.one == "hf_static")


def main() -> None:
    """Run each runner and batch size in its own process; print and save the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt2")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--threads", type=int, default=2, help="cpu: threads for every runner")
    p.add_argument("--runners", nargs="+", choices=RUNNERS,
                   help="default: the device's (DEVICE_RUNNERS)")
    p.add_argument("--embeddings", action="store_true",
                   help="the int8/int4 runners quantize the embeddings too (a tied head "
                        "shares them): llm.export(embeddings=)")
    p.add_argument("--out", type=Path)
    p.add_argument("--interleave", action="store_true",
                   help="every runner loaded at once, the timed runs taken in turn")
    p.add_argument("--one", choices=RUNNERS, help=argparse.SUPPRESS)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--export-to", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--weights", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.export_to:
        print(json.dumps(export_aotrt(args, args.batch[0], args.weights or None,
                                      args.export_to)))
        return
    if args.one:
        print(json.dumps(run_one(args)))
        return
    runners = args.runners or list(DEVICE_RUNNERS.get(args.device, RUNNERS))
    env = dict(os.environ)
    if args.device == "cpu":
        for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[k] = str(args.threads)
    rows = []
    for batch in args.batch:
        def command(runner: str, batch: int = batch) -> list[str]:
            cmd = [sys.executable, __file__, "--one", runner, "--model", args.model,
                   "--device", args.device, "--dtype", args.dtype, "--batch", str(batch),
                   "--prompt", str(args.prompt), "--new", str(args.new),
                   "--runs", str(args.runs), "--threads", str(args.threads)]
            return cmd + (["--embeddings"] if args.embeddings else [])

        if args.interleave:
            rows += interleaved(args, runners, batch, command, env)
            continue
        for runner in runners:
            cmd = command(runner)
            load0 = os.getloadavg()[0]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            lines = proc.stdout.strip().splitlines()
            if proc.returncode or not lines:
                row = {"error": (proc.stderr or proc.stdout)[-1500:]}
            else:
                row = json.loads(lines[-1])
            row.update(runner=runner, batch=batch, loadavg=[load0, os.getloadavg()[0]])
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{args.model} {args.dtype} on {args.device}, prompt {args.prompt}, "
          f"{args.new} new tokens")
    mem = "dev MiB" if args.device == "cuda" else "RSS MiB"
    ref = next((r.get("tokens") for r in rows if r.get("tokens")), None)
    print(f"{'runner':10} {'batch':>5} {'ttft ms':>9} {'ms/token':>9} {'range':>15} "
          f"{mem:>8} {'file MiB':>8} {'load s':>7} {'host us':>8} {'tokens':>7} "
          f"{'load avg':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['runner']:10} {r['batch']:>5} error: "
                  f"{r['error'].strip().splitlines()[-1]}")
            continue
        lo, hi = r["ms_per_token_range"]
        host = r.get("host_us")
        size = r.get("file_mib")
        same = "same" if r.get("tokens") == ref else "differ"
        la = "-".join(f"{x:.1f}" for x in r["loadavg"])
        print(f"{r['runner']:10} {r['batch']:>5} {r['ttft_ms']:9.2f} {r['ms_per_token']:9.3f} "
              f"{f'{lo:.3f}-{hi:.3f}':>15} {r['device_mib']:8.0f} "
              f"{'' if size is None else f'{size:8.1f}':>8} {r['load_s']:7.2f} "
              f"{'' if host is None else f'{host:8.1f}':>8} {same:>7} {la:>9}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"model": args.model, "dtype": args.dtype,
                                        "device": args.device, "prompt": args.prompt,
                                        "new": args.new, "threads": args.threads,
                                        "embeddings": args.embeddings,
                                        "interleave": args.interleave,
                                        "machine": _machine(), "rows": rows}, indent=1))


def _machine() -> dict[str, Any]:
    """The CPU's model name, its vector flags of note, and the cores this process may use."""
    name, flags = "", []
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and not name:
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                have = line.split(":", 1)[1].split()
                flags = [x for x in ("avx2", "fma", "avx512f", "amx_tile") if x in have]
    return {"cpu": name, "flags": flags, "cores": len(os.sched_getaffinity(0))}


if __name__ == "__main__":
    main()
