"""Whisper-tiny transcription of 30 s of audio (issue 37): Hugging Face eager, Hugging Face
static cache compiled (reduce-overhead) and aotrt (llm.export_whisper + llm.transcribe),
one process per runner.

    python3 bench/bench_whisper.py [--device cuda] [--dtype bfloat16] [--new 64] [--runs 5]

The model is Whisper-tiny's shape (4 + 4 layers, d_model 384, 51,865 tokens, 80 mel bins,
3,000 frames = 30 s) with random weights (seed 0), and the audio random log-mel features.
Every runner decodes greedily after the prompt <|startoftranscript|><|en|><|transcribe|>
<|notimestamps|> with end-of-text suppressed, so each makes exactly `--new` tokens.
Recorded, median of `--runs` with the range: `ttft_ms` (one new token: the encoder, the
prompt and one step, until the id is on the host), `transcribe_ms` (`--new` tokens),
`ms_per_token` ((transcribe - ttft) / (new - 1)), device memory, load time, and whether the
first tokens agree across runners.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_llm import _machine, _median_ms, _mem_end, _mem_used  # noqa: E402

RUNNERS = ("hf_eager", "hf_static", "aotrt")
#: Whisper's special tokens in its 51,865-token multilingual vocabulary
SOT, EN, TRANSCRIBE, NO_TS, EOT = 50258, 50259, 50359, 50363, 50257
PROMPT = [SOT, EN, TRANSCRIBE, NO_TS]


def _model(dtype: str) -> Any:
    """Whisper-tiny's shape with random weights, with a greedy no-timestamps config."""
    import torch
    from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    # init_std 0.3: with the default 0.02 a random Whisper repeats one token
    cfg = WhisperConfig(vocab_size=51865, num_mel_bins=80, d_model=384, encoder_layers=4,
                        decoder_layers=4, encoder_attention_heads=6, decoder_attention_heads=6,
                        encoder_ffn_dim=1536, decoder_ffn_dim=1536, max_source_positions=1500,
                        max_target_positions=448, decoder_start_token_id=SOT,
                        pad_token_id=EOT, bos_token_id=EOT, eos_token_id=EOT,
                        suppress_tokens=[EOT], begin_suppress_tokens=[EOT], init_std=0.3)
    model = WhisperForConditionalGeneration(cfg).eval().to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(
        decoder_start_token_id=SOT, eos_token_id=EOT, pad_token_id=EOT,
        forced_decoder_ids=[[1, EN], [2, TRANSCRIBE]], no_timestamps_token_id=NO_TS,
        suppress_tokens=[EOT], begin_suppress_tokens=[EOT], do_sample=False)
    return model


def _features(batch: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((batch, 80, 3000)).astype(np.float32)


def run_hf(args: argparse.Namespace, compiled: bool) -> dict[str, Any]:
    """Hugging Face's Whisper generate (short form, greedy)."""
    import torch
    from transformers import CompileConfig

    base = _mem_used(args.device)
    t0 = time.perf_counter()
    model = _model(args.dtype).to(args.device)
    load_s = time.perf_counter() - t0
    feats = torch.from_numpy(_features(args.batch)).to(args.device, getattr(torch, args.dtype))
    kw: dict[str, Any] = {"do_sample": False}
    if compiled:
        kw["cache_implementation"] = "static"
        kw["compile_config"] = CompileConfig(mode="reduce-overhead")

    def gen(n: int) -> np.ndarray:
        with torch.no_grad():
            out = model.generate(feats, max_new_tokens=n, **kw)
        return out.cpu().numpy()          # the new tokens only: generate drops the prompt

    return _measure(gen, args, base, load_s)


def run_aotrt(args: argparse.Namespace) -> dict[str, Any]:
    """aotrt: export_whisper, save, load, transcribe."""
    import aotrt
    from aotrt import llm

    base = _mem_used(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "whisper.aotp"
        t0 = time.perf_counter()
        prog = llm.export_whisper(_model(args.dtype), max_batch=args.batch,
                                  max_new_tokens=args.new, prompt_len=len(PROMPT))
        export_s = time.perf_counter() - t0
        prog.save(path)
        del prog
        size = path.stat().st_size
        t0 = time.perf_counter()
        m = aotrt.load(path, device=args.device)
        load_s = time.perf_counter() - t0
    feats = _features(args.batch)
    with m:
        def gen(n: int) -> np.ndarray:
            return llm.transcribe(m, feats, n, PROMPT, eos_token_id=None)

        res = _measure(gen, args, base, load_s)
    res.update(export_s=export_s, file_mib=size / 2**20)
    return res


def _measure(gen: Any, args: argparse.Namespace, base: int, load_s: float) -> dict[str, Any]:
    gen(args.new)                                      # warm: compiles, graphs, pools
    gen(1)
    one = _median_ms(lambda: gen(1), args.runs)
    full = _median_ms(lambda: gen(args.new), args.runs)
    per = [(f - one[0]) / (args.new - 1) for f in full[3]]
    tokens = gen(args.new)
    return {"ttft_ms": one[0], "ttft_range": [one[1], one[2]], "transcribe_ms": full[0],
            "transcribe_range": [full[1], full[2]], "ms_per_token": float(np.median(per)),
            "load_s": load_s, "device_mib": (_mem_end(args.device) - base) / 2**20,
            "new_tokens": int(tokens.shape[1]), "tokens": tokens[0, :16].tolist()}


def main() -> None:
    """Run each runner in its own process; print and save the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--runners", nargs="+", choices=RUNNERS, default=list(RUNNERS))
    p.add_argument("--out", type=Path)
    p.add_argument("--one", choices=RUNNERS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        res = run_aotrt(args) if args.one == "aotrt" else run_hf(args, args.one == "hf_static")
        print(json.dumps(res))
        return
    rows = []
    for runner in args.runners:
        cmd = [sys.executable, __file__, "--one", runner, "--device", args.device,
               "--dtype", args.dtype, "--batch", str(args.batch), "--new", str(args.new),
               "--runs", str(args.runs)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        lines = proc.stdout.strip().splitlines()
        row = json.loads(lines[-1]) if proc.returncode == 0 and lines else {
            "error": (proc.stderr or proc.stdout)[-1500:]}
        row["runner"] = runner
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\nwhisper-tiny {args.dtype} on {args.device}, batch {args.batch}, 30 s of audio, "
          f"{args.new} new tokens")
    ref = next((r.get("tokens") for r in rows if r.get("tokens")), None)
    print(f"{'runner':10} {'ttft ms':>9} {'total ms':>9} {'ms/token':>9} {'dev MiB':>8} "
          f"{'load s':>7} {'tokens':>7}")
    for r in rows:
        if "error" in r:
            print(f"{r['runner']:10} error: {r['error'].strip().splitlines()[-1]}")
            continue
        same = "same" if r.get("tokens") == ref else "differ"
        print(f"{r['runner']:10} {r['ttft_ms']:9.2f} {r['transcribe_ms']:9.2f} "
              f"{r['ms_per_token']:9.3f} {r['device_mib']:8.0f} {r['load_s']:7.2f} {same:>7}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"model": "whisper-tiny", "dtype": args.dtype,
                                        "device": args.device, "batch": args.batch,
                                        "new": args.new, "machine": _machine(),
                                        "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
