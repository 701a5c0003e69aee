"""`aotrt generate` and `aotrt demo --model gpt2`: tokens streamed as they come, then a line
of time to first token and tokens per second. A .aotp file runs without torch; a named shape
or a config directory is exported first (random weights), which imports torch."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np

from aotrt.errors import InvalidArgument




def _prompt(args: argparse.Namespace, vocab: int) -> np.ndarray:
    if args.prompt:
        try:
            ids = [int(t) for t in args.prompt.replace(",", " ").split()]
        except ValueError:
            raise InvalidArgument(f"--prompt: expected token ids, got {args.prompt!r}") \
                from None
        if not ids or min(ids) < 0 or max(ids) >= vocab:
            raise InvalidArgument(f"--prompt: expected ids in [0, {vocab}), got {ids}")
        return np.asarray(ids, np.int64)[None]
    if args.prompt_len < 1:
        raise InvalidArgument(f"--prompt-len: expected a positive int, got {args.prompt_len}")
    return np.random.default_rng(args.seed).integers(0, vocab, (1, args.prompt_len))


def _export(args: argparse.Namespace) -> tuple[Any, Any]:
    """(the torch model, its program) for a named shape or a config directory."""
    from aotrt import llm
    from aotrt.llm.configs import build

    model = build(args.model, args.dtype or "float32", args.seed)
    n = sum(p.numel() for p in model.parameters())
    print(f"model:    {args.model}, {type(model).__name__}, {n / 1e6:.1f} M parameters "
          f"(random weights), {args.dtype or 'float32'}", flush=True)
    t0 = time.perf_counter()
    prog = llm.export(model, max_seq_len=args.max_seq_len, max_batch=1,
                      prefill_len=min(args.prefill_len, args.max_seq_len),
                      sampling=bool(getattr(args, "sample", False)))
    print(f"export:   {time.perf_counter() - t0:.1f} s, {len(prog.kernels)} kernels", flush=True)
    return model, prog


def _stream(m: Any, ids: np.ndarray, new: int, **sampling: Any
            ) -> tuple[np.ndarray, float, float]:
    """Generate (greedy, or with `sampling`: generate's do_sample and its settings),
    printing tokens as they come; (ids, ttft s, tokens per second)."""
    from aotrt import llm

    stamps: list[float] = []

    def show(step: int, tokens: np.ndarray) -> None:
        stamps.append(time.perf_counter())
        sys.stdout.write(("tokens:   " if step == 0 else " ") + str(int(tokens[0])))
        sys.stdout.flush()

    t0 = time.perf_counter()
    out = llm.generate(m, ids, max_new_tokens=new, on_token=show, **sampling)
    sys.stdout.write("\n")
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return out, stamps[0] - t0, rate


def run_generate(args: argparse.Namespace) -> int:
    """`aotrt generate`: load or export, then stream the new tokens."""
    import aotrt
    from aotrt.llm.spec import LlmSpec

    sampling: dict[str, Any] = {}
    if args.sample:
        sampling = {"do_sample": True, "temperature": args.temperature, "top_k": args.top_k,
                    "top_p": args.top_p, "seed": args.seed}
    elif (args.temperature, args.top_k, args.top_p) != (1.0, 0, 1.0):
        raise InvalidArgument("--temperature, --top-k, --top-p: only apply with --sample")
    if args.model.endswith(".aotp"):
        prog = aotrt.Program.load(args.model)
    else:
        _, prog = _export(args)
        if args.save:
            prog.save(args.save)
            print(f"saved:    {args.save}")
    spec = LlmSpec.from_provenance(prog.provenance)
    ids = _prompt(args, spec.vocab_size)
    t0 = time.perf_counter()
    with aotrt.load(prog, device=args.device) as m:
        print(f"load:     {time.perf_counter() - t0:.2f} s on {m.device.name}")
        print(f"prompt:   {ids.shape[1]} tokens")
        out, ttft, rate = _stream(m, ids, args.max_new_tokens, **sampling)
    print(f"time to first token {ttft * 1e3:.1f} ms, {rate:.1f} tokens/s "
          f"({out.shape[1] - ids.shape[1]} new tokens)")
    return 0


def run_demo(args: argparse.Namespace) -> int:
    """`aotrt demo --model gpt2`: export, generate, and check against Hugging Face."""
    import torch

    import aotrt

    args.max_seq_len, args.prefill_len, args.dtype = 128, 32, None
    model, prog = _export(args)
    ids = np.random.default_rng(args.seed).integers(0, model.config.vocab_size, (1, 16))
    with aotrt.load(prog, device=args.device) as m:
        print(f"device:   {m.device.name}; prompt: 16 random tokens")
        out, ttft, rate = _stream(m, ids, args.max_new_tokens)
    stamps: list[float] = []

    class Stamp:
        def __call__(self, *a: Any, **k: Any) -> Any:
            stamps.append(time.perf_counter())
            return torch.zeros(1, dtype=torch.bool)

    dev = args.device or m.device.name
    hf_model = model.to(dev)
    t0 = time.perf_counter()
    with torch.no_grad():
        want = hf_model.generate(torch.tensor(ids, device=dev), max_new_tokens=args.max_new_tokens,
                                 do_sample=False, pad_token_id=0, stopping_criteria=[Stamp()],
                                 eos_token_id=prog.provenance.get("llm.eos_token_ids") and
                                 [int(e) for e in prog.provenance["llm.eos_token_ids"].split(",")]
                                 or None).cpu().numpy()
    hf_rate = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    print(f"aotrt:    time to first token {ttft * 1e3:.1f} ms, {rate:.1f} tokens/s")
    print(f"HF eager: time to first token {(stamps[0] - t0) * 1e3:.1f} ms, "
          f"{hf_rate:.1f} tokens/s")
    same = want.shape == out.shape and bool((want == out).all())
    print(f"tokens equal Hugging Face generate (greedy): {'yes' if same else 'NO'}")
    return 0 if same else 1
