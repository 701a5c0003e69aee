"""Text generation side by side: Hugging Face eager, Hugging Face's static cache compiled
(generate's own compile, mode reduce-overhead) and aotrt (llm.export + llm.generate), one
process per runner and batch size.

    python bench/bench_llm.py --model gpt2 --device cuda --dtype bfloat16 \
        --batch 1 8 --out bench/results/llm/x.json

Each runner records, for a prompt of `--prompt` tokens (random ids, random weights):
- `ttft_ms`: generate with one new token, until its ids are on the host (median of runs);
- `ms_per_token`: (time for `--new` tokens - time for 1) / (`--new` - 1), medians, with the
  spread of the runs (min, max);
- `device_mib`: device memory in use after the runs less before the model existed
  (cudaMemGetInfo: the same count for every runner, allocator caches included);
- `load_s`: aotrt: aotrt.load of the saved file (kernels compiled); Hugging Face:
  from_pretrained of a saved checkpoint onto the device.
aotrt also records `host_us`: the host time of one bound decode step (copying its inputs and
launching), with the device idle before each call.
"""

from __future__ import annotations

import argparse
import json
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

RUNNERS = ("hf_eager", "hf_static", "aotrt", "aotrt_int8", "aotrt_int4")
#: aotrt runners with quantized linear weights (llm.export weights=, group 128)
WEIGHTS = {"aotrt_int8": "int8", "aotrt_int4": "int4"}


def _config(name: str) -> Any:
    import transformers

    if name == "gpt2":
        return transformers.GPT2Config()
    if name == "gpt2-tiny":
        return transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512)
    if name == "llama-1b":
        # Llama-3.2-1B's shape (config.json of meta-llama/Llama-3.2-1B).
        return transformers.LlamaConfig(
            hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
            num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
            max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True,
            rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            bos_token_id=128000, eos_token_id=128001)
    raise SystemExit(f"--model: unknown {name!r}")


def _model(name: str, dtype: str) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = _config(name)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    return model.eval().to(getattr(torch, dtype))


def _mem_used(device: str) -> int:
    if device != "cuda":
        return 0
    from cuda.bindings import runtime as rt

    err, free, total = rt.cudaMemGetInfo()
    return int(total - free)


def _median_ms(fn: Callable[[], Any], runs: int) -> tuple[float, float, float, list[float]]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times), max(times), times


def _per_token(gen: Callable[[int], Any], new: int, runs: int) -> dict[str, Any]:
    gen(new)                                           # warm: compiles, graphs, pools
    gen(1)
    one = _median_ms(lambda: gen(1), runs)
    full = _median_ms(lambda: gen(new), runs)
    per = [(f - one[0]) / (new - 1) for f in full[3]]
    return {"ttft_ms": one[0], "ttft_range": [one[1], one[2]],
            "ms_per_token": statistics.median(per), "ms_per_token_range": [min(per), max(per)],
            "runs": runs}


def run_hf(args: argparse.Namespace, batch: int, compiled: bool) -> dict[str, Any]:
    """Hugging Face generate, eager (dynamic cache) or static cache compiled."""
    import torch
    from transformers import AutoModelForCausalLM, CompileConfig

    base = _mem_used(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        _model(args.model, args.dtype).save_pretrained(tmp)
        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(
            tmp, dtype=getattr(torch, args.dtype), attn_implementation="sdpa"
        ).to(args.device).eval()
        if args.device == "cuda":
            torch.cuda.synchronize()
        load_s = time.perf_counter() - t0
    ids = torch.randint(3, model.config.vocab_size, (batch, args.prompt), device=args.device)
    kw: dict[str, Any] = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    if compiled:
        kw["cache_implementation"] = "static"
        kw["compile_config"] = CompileConfig(mode="reduce-overhead")

    def gen(n: int) -> Any:
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        return out.cpu()

    res = _per_token(gen, args.new, args.runs)
    if args.device == "cuda":
        torch.cuda.synchronize()
    res.update(load_s=load_s, device_mib=(_mem_used(args.device) - base) / 2**20)
    return res


def run_aotrt(args: argparse.Namespace, batch: int, weights: str | None = None
              ) -> dict[str, Any]:
    """aotrt: llm.export (max_batch = the batch; `weights` int8/int4 or None), save, load,
    llm.generate."""
    import torch

    import aotrt
    from aotrt import llm

    base = _mem_used(args.device)
    model = _model(args.model, args.dtype)
    t0 = time.perf_counter()
    prog = llm.export(model, max_seq_len=args.prompt + args.new, max_batch=batch,
                      prefill_len=args.prompt, weights=weights)
    export_s = time.perf_counter() - t0
    vocab = model.config.vocab_size
    del model
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.aotp"
        prog.save(path)
        size = path.stat().st_size
        del prog
        t0 = time.perf_counter()
        m = aotrt.load(path, device=args.device)
        load_s = time.perf_counter() - t0
    ids = np.random.default_rng(0).integers(3, vocab, (batch, args.prompt))
    with m:
        res = _per_token(lambda n: llm.generate(m, ids, max_new_tokens=n, eos_token_id=[]),
                         args.new, args.runs)
        res.update(load_s=load_s, export_s=export_s, file_mib=size / 2**20,
                   host_us=_host_us(m, batch, args.prompt))
        res["device_mib"] = (_mem_used(args.device) - base) / 2**20
    del torch
    return res


def _host_us(m: Any, batch: int, slot: int) -> float:
    """Median host time of a bound decode step's call (inputs copied, work launched), with
    the device idle before each call."""
    bound = m.method("decode").bind()
    ids, start = np.zeros((batch, 1), np.int64), np.zeros(batch, np.int64)
    pos = np.array(slot, np.int64)
    times = []
    for _ in range(50):
        out, = bound.run(ids, pos, start)
        np.asarray(out)                                # the device is idle after this
        t0 = time.perf_counter()
        bound.run(ids, pos, start)
        times.append((time.perf_counter() - t0) * 1e6)
        np.asarray(bound.outputs[0])
    return statistics.median(times)


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """One runner at one batch size, in this process."""
    if args.one.startswith("aotrt"):
        return run_aotrt(args, args.batch[0], WEIGHTS.get(args.one))
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
    p.add_argument("--runners", nargs="+", default=list(RUNNERS), choices=RUNNERS)
    p.add_argument("--out", type=Path)
    p.add_argument("--one", choices=RUNNERS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_one(args)))
        return
    rows = []
    for batch in args.batch:
        for runner in args.runners:
            cmd = [sys.executable, __file__, "--one", runner, "--model", args.model,
                   "--device", args.device, "--dtype", args.dtype, "--batch", str(batch),
                   "--prompt", str(args.prompt), "--new", str(args.new),
                   "--runs", str(args.runs)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            lines = proc.stdout.strip().splitlines()
            if proc.returncode or not lines:
                row = {"error": (proc.stderr or proc.stdout)[-1500:]}
            else:
                row = json.loads(lines[-1])
            row.update(runner=runner, batch=batch)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{args.model} {args.dtype} on {args.device}, prompt {args.prompt}, "
          f"{args.new} new tokens")
    print(f"{'runner':10} {'batch':>5} {'ttft ms':>9} {'ms/token':>9} {'range':>15} "
          f"{'dev MiB':>8} {'load s':>7} {'host us':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['runner']:10} {r['batch']:>5} error: "
                  f"{r['error'].strip().splitlines()[-1]}")
            continue
        lo, hi = r["ms_per_token_range"]
        host = r.get("host_us")
        print(f"{r['runner']:10} {r['batch']:>5} {r['ttft_ms']:9.2f} {r['ms_per_token']:9.3f} "
              f"{f'{lo:.3f}-{hi:.3f}':>15} {r['device_mib']:8.0f} {r['load_s']:7.2f} "
              f"{'' if host is None else f'{host:8.1f}'}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"model": args.model, "dtype": args.dtype,
                                        "device": args.device, "prompt": args.prompt,
                                        "new": args.new, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
