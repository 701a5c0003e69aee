"""Greedy Whisper transcription with a program from aotrt.llm.whisper (numpy only, no torch).

    with aotrt.load(prog) as m:
        ids = transcribe(m, features, max_new_tokens=64,
                         decoder_prompt_ids=[sot, lang, task, notimestamps], eos_token_id=eos)

The rows of a batch share the prompt's length, so every row is at the same position and
one slot serves them all.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from aotrt.errors import InvalidArgument, ProgramError
from aotrt.runtime.loop import Loop

_METHODS = ("encode", "prefill", "decode")
#: the provenance entry of the decoder's vocabulary size (written by whisper.export_whisper)
VOCAB_KEY = "whisper.vocab_size"


def _state_len(module: Any) -> int:
    """The self-attention cache's length (prompt + new tokens), from the state's specs."""
    s = module.program.tables.state_named("kv.k0")
    if s is not None:
        return s.shape[2]
    raise InvalidArgument("module: no self-attention cache 'kv.k0' in its state (export it "
                          "with aotrt.llm.whisper.export_whisper)")


def _vocab_size(module: Any) -> int | None:
    """The decoder's vocabulary size from the file's provenance (None in a file exported
    before it was recorded: the lookup's own check then reports a bad id at run time)."""
    text = module.program.provenance.get(VOCAB_KEY)
    if text is None:
        return None
    try:
        vocab = int(text)
    except (TypeError, ValueError):
        vocab = 0
    if vocab < 1:
        raise ProgramError(f"provenance: {VOCAB_KEY}: expected a positive int, got {text!r}")
    return vocab


def transcribe(module: Any, features: Any, max_new_tokens: int,
               decoder_prompt_ids: Sequence[int] | np.ndarray, eos_token_id: int | None,
               pad_token_id: int | None = None,
               on_token: Callable[[np.ndarray], None] | None = None) -> np.ndarray:
    """Greedy token ids `[batch, n]` (n <= max_new_tokens) after the prompt, as HF's
    generate returns them: a row's eos is kept, later steps hold `pad_token_id` (eos by
    default), and decoding stops once every row has ended."""
    missing = [n for n in _METHODS if n not in getattr(module, "methods", ())]
    if missing:
        raise InvalidArgument(f"module: expected methods {_METHODS}, missing {missing}")
    feats = np.asarray(features, dtype=np.float32)
    enc_spec = module.program.methods["encode"].record.inputs[0].shape
    pre_spec = module.program.methods["prefill"].record.inputs[0].shape
    max_batch, prompt_cap = int(pre_spec[0]), int(pre_spec[1])
    if feats.ndim != 3 or list(feats.shape[1:]) != list(enc_spec[1:]):
        raise InvalidArgument(f"features: expected [batch, {enc_spec[1]}, {enc_spec[2]}], "
                              f"got {list(feats.shape)}")
    batch = feats.shape[0]
    if not 1 <= batch <= max_batch:
        raise InvalidArgument(f"features: batch {batch} is outside 1..{max_batch} (the "
                              f"exported max_batch)")
    prompt = np.asarray(decoder_prompt_ids, dtype=np.int64)
    if prompt.ndim == 1:
        prompt = np.broadcast_to(prompt, (batch, prompt.shape[0]))
    if prompt.ndim != 2 or prompt.shape[0] != batch or not 1 <= prompt.shape[1] <= prompt_cap:
        raise InvalidArgument(f"decoder_prompt_ids: expected 1 to {prompt_cap} ids (or "
                              f"[batch, n] of them), got shape {list(prompt.shape)}")
    vocab = _vocab_size(module)
    if prompt.size and (prompt.min() < 0 or (vocab is not None and prompt.max() >= vocab)):
        # An embedding lookup past the table is an error in torch; say so before running.
        raise InvalidArgument(f"decoder_prompt_ids: token ids must lie in [0, "
                              f"{vocab if vocab is not None else 'vocab'}), got "
                              f"{int(prompt.min())}..{int(prompt.max())}")
    p = prompt.shape[1]
    cap = _state_len(module) - p
    if not isinstance(max_new_tokens, (int, np.integer)) or not 1 <= max_new_tokens <= cap:
        raise InvalidArgument(f"max_new_tokens: expected 1..{cap} for a prompt of {p} "
                              f"(the exported cache), got {max_new_tokens!r}")
    pad = eos_token_id if pad_token_id is None else pad_token_id

    # Rows past `batch` are zeros whose tokens are dropped: the methods' batch is fixed.
    x = np.zeros((max_batch, *feats.shape[1:]), np.float32)
    x[:batch] = feats
    ids = np.zeros((max_batch, prompt_cap), np.int64)
    ids[:batch, :p] = prompt
    module.method("encode").run(x)
    out, = module.method("prefill").run(ids, np.array([p - 1], np.int64))
    done = np.zeros(batch, bool)
    steps: list[np.ndarray] = []
    tok = np.asarray(out).reshape(max_batch, 1).astype(np.int64)
    # Each step's token feeds the next on the device, queued before the host reads the last
    # (runtime/loop.py), as llm.generate does.
    with Loop(module.method("decode").bind(), feed={0: 0}) as loop:
        if max_new_tokens > 1:
            loop.step(tok, np.array([p], np.int64))
        for t in range(max_new_tokens):
            if t:
                if t + 1 < max_new_tokens:
                    loop.step(None, np.array([p + t], np.int64))
                tok = loop.result()[0].reshape(max_batch, 1).astype(np.int64)
            row = np.where(done, pad, tok[:batch, 0]) if pad is not None else tok[:batch, 0]
            steps.append(row)
            if on_token is not None:
                on_token(row)
            if eos_token_id is not None:
                done |= row == eos_token_id
                if done.all():
                    break
    return np.stack(steps, 1).astype(np.int64)
