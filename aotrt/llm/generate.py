"""llm.generate: tokens from a loaded language-model program (the run side: numpy only).

    with aotrt.load("gpt2.aotp") as m:
        ids = llm.generate(m, input_ids, max_new_tokens=32)   # int64 [batch, prompt + new]

The prompt is left-padded to a multiple of the program's prefill length and run a chunk a
`prefill` call; each new token is then one `decode` call, bound once (Delegate.bind), so on
cuda a step replays one graph and allocates nothing. Rows are independent: a batch smaller
than the program's is padded with rows that only attend to themselves.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from aotrt.errors import InvalidArgument, ProgramError
from aotrt.llm.spec import LlmSpec

I64 = np.int64


def _check_method(module: Any, name: str, n: int, spec: LlmSpec) -> Any:
    """The method `name`, checked to take (ids [B, n], slot [], start [B]) -> ids [B]."""
    if name not in module.methods:
        raise ProgramError(f"methods: a language-model program needs {name!r}, it has "
                           f"{list(module.methods)}")
    method = module.method(name)
    prog = method.program
    want_in = [("int64", [spec.max_batch, n]), ("int64", []), ("int64", [spec.max_batch])]
    got_in = [(s["dtype"], list(s["shape"])) for s in prog.inputs]
    got_out = [(s["dtype"], list(s["shape"])) for s in prog.outputs]
    if got_in != want_in or got_out != [("int64", [spec.max_batch])]:
        raise ProgramError(f"methods[{name!r}]: expected inputs {want_in} and outputs "
                           f"{[('int64', [spec.max_batch])]} for the recorded llm sizes, got "
                           f"{got_in} -> {got_out}")
    return method


def _prompt(input_ids: Any, attention_mask: Any) -> tuple[np.ndarray, np.ndarray]:
    """(ids [b, L] int64, real lengths [b]) of a left-padded prompt batch."""
    ids = np.asarray(input_ids)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.shape[1] == 0 or ids.shape[0] == 0 or \
            not np.issubdtype(ids.dtype, np.integer):
        raise InvalidArgument(f"input_ids: expected integer ids [batch, length >= 1], got "
                              f"{ids.dtype}{list(ids.shape)}")
    if attention_mask is None:
        return ids.astype(I64), np.full(ids.shape[0], ids.shape[1], I64)
    mask = np.asarray(attention_mask)
    if mask.ndim == 1:
        mask = mask[None]
    if mask.shape != ids.shape:
        raise InvalidArgument(f"attention_mask: shape {list(mask.shape)} differs from "
                              f"input_ids {list(ids.shape)}")
    if not np.isin(mask, (0, 1)).all():
        raise InvalidArgument("attention_mask: expected only 0 and 1")
    lengths = mask.sum(axis=1).astype(I64)
    # Left padding: every row's ones are its last `length` columns.
    left = np.arange(ids.shape[1])[None, :] >= (ids.shape[1] - lengths)[:, None]
    if not (mask.astype(bool) == left).all():
        raise InvalidArgument("attention_mask: each row must be zeros then ones (left "
                              "padding); right padding is not supported")
    if (lengths == 0).any():
        raise InvalidArgument(f"attention_mask: rows {np.flatnonzero(lengths == 0).tolist()} "
                              "have no tokens")
    return ids.astype(I64), lengths


def generate(module: Any, input_ids: Any, *, attention_mask: Any = None,
             max_new_tokens: int = 32, eos_token_id: int | list[int] | None = None,
             pad_token_id: int | None = None,
             on_token: Callable[[int, np.ndarray], None] | None = None) -> np.ndarray:
    """Greedy tokens from `module` (aotrt.load of an llm.export program) for `input_ids`
    ([batch, length] or [length], left-padded under `attention_mask`).

    Returns int64 [batch, length + new]: the prompt as given, then the new tokens, as
    Hugging Face's `generate` returns them. A row stops at an end token (`eos_token_id`,
    default the model's) and is padded with `pad_token_id` (default the first end token, or
    0) until every row has stopped or `max_new_tokens` are made. `on_token(step, tokens)`
    sees each step's tokens ([batch]) as they come.
    """
    spec = LlmSpec.from_provenance(module.program.provenance)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or \
            max_new_tokens < 1:
        raise InvalidArgument(f"max_new_tokens: expected a positive int, got "
                              f"{max_new_tokens!r}")
    ids, lengths = _prompt(input_ids, attention_mask)
    batch, length = ids.shape
    if batch > spec.max_batch:
        raise InvalidArgument(f"input_ids: batch {batch} is over the program's max_batch "
                              f"{spec.max_batch}")
    c = spec.prefill_len
    padded = -(-length // c) * c
    if padded + max_new_tokens - 1 > spec.max_seq_len:
        raise InvalidArgument(f"input_ids, max_new_tokens: a prompt of {length} (padded to "
                              f"{padded}, a multiple of the prefill length {c}) and "
                              f"{max_new_tokens} new tokens need {padded + max_new_tokens - 1}"
                              f" cache slots; the program has {spec.max_seq_len}")
    eos = spec.eos_token_ids if eos_token_id is None else tuple(np.atleast_1d(eos_token_id))
    eos_arr = np.asarray(eos, I64)
    pad = int(pad_token_id if pad_token_id is not None else (eos[0] if eos else 0))
    prefill = _check_method(module, "prefill", c, spec)
    decode = _check_method(module, "decode", 1, spec)

    rows = spec.max_batch
    tokens = np.zeros((rows, padded), I64)
    tokens[:batch, padded - length:] = ids
    start = np.full(rows, padded - 1, I64)      # spare rows: only their own last slot
    start[:batch] = padded - lengths
    out = None
    for s in range(0, padded, c):
        out, = prefill.run(tokens[:, s:s + c], np.array(s, I64), start)
    assert out is not None
    token = np.asarray(out).astype(I64)
    new = np.full((batch, max_new_tokens), pad, I64)
    done = np.zeros(batch, bool)
    bound = decode.bind()
    step_ids = np.zeros((rows, 1), I64)
    for step in range(max_new_tokens):
        token[:batch][done] = pad
        new[:, step] = token[:batch]
        if on_token is not None:
            on_token(step, new[:, step].copy())
        done |= np.isin(token[:batch], eos_arr)
        if done.all() or step == max_new_tokens - 1:
            new = new[:, :step + 1]
            break
        step_ids[:, 0] = token
        out, = bound.run(step_ids, np.array(padded + step, I64), start)
        token = np.asarray(out).astype(I64)
    return np.concatenate([ids, new], axis=1)
