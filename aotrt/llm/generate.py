"""llm.generate: tokens from a loaded language-model program (the run side: numpy only).

    with aotrt.load("gpt2.aotp") as m:
        ids = llm.generate(m, input_ids, max_new_tokens=32)   # int64 [batch, prompt + new]

The prompt is left-padded to a multiple of the program's prefill length and run a chunk a
`prefill` call; each new token is then one `decode` call, bound once (Delegate.bind), so on
cuda a step replays one graph and allocates nothing. Rows are independent: a batch smaller
than the program's is padded with rows that only attend to themselves.

With `do_sample=True` the tokens are drawn inside the program's `sample` method (exported
with llm.export(..., sampling=True)); the host only hands it one uniform draw a row a step,
from a numpy Generator seeded by `seed`. The prompt's last token then goes through
`sample` too, so that the first new token is drawn: the prefill takes the rest.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable

import numpy as np

from aotrt.errors import InvalidArgument, ProgramError
from aotrt.llm.spec import LlmSpec
from aotrt.runtime.loop import Loop

I64 = np.int64
F32 = np.float32
# Greedy unless asked: generate's sampling arguments and their defaults (no filtering).
_SAMPLING_DEFAULTS = {"temperature": 1.0, "top_k": 0, "top_p": 1.0}


def _check_method(module: Any, name: str, n: int, spec: LlmSpec) -> Any:
    """The method `name`, checked to take (ids [B, n], slot [], start [B]) -> ids [B], and
    `sample` also (uniform [B] f32, temperature [] f32, top_k [] i64, top_p [] f32)."""
    if name not in module.methods:
        raise ProgramError(f"methods: a language-model program needs {name!r}, it has "
                           f"{list(module.methods)}")
    method = module.method(name)
    prog = method.program
    want_in = [("int64", [spec.max_batch, n]), ("int64", []), ("int64", [spec.max_batch])]
    if name == "sample":
        want_in += [("float32", [spec.max_batch]), ("float32", []), ("int64", []),
                    ("float32", [])]
    got_in = [(s.dtype.name, list(s.shape)) for s in prog.record.inputs]
    got_out = [(s.dtype.name, list(s.shape)) for s in prog.record.outputs]
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


def _real(name: str, value: Any) -> float:
    """`value` as a finite float32, or InvalidArgument naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgument(f"{name}: expected a number, got {value!r}")
    with np.errstate(over="ignore"):
        v = F32(value)
    if not np.isfinite(v):
        raise InvalidArgument(f"{name}: expected a finite float32, got {value!r}")
    return float(v)


def _sampling(do_sample: Any, temperature: Any, top_k: Any, top_p: Any, seed: Any
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.random.Generator] | None:
    """The sample method's scalar inputs and the draws' generator, or None for greedy."""
    if not isinstance(do_sample, (bool, np.bool_)):
        raise InvalidArgument(f"do_sample: expected a bool, got {do_sample!r}")
    t = _real("temperature", temperature)
    # Checked in float32, as the method takes it: 1e-50 is 0 there, and 0 is no temperature.
    if not t > 0:
        raise InvalidArgument(f"temperature: expected > 0 (as a float32), got {temperature!r}")
    if isinstance(top_k, (bool, np.bool_)) or not isinstance(top_k, numbers.Integral) or \
            not 0 <= int(top_k) < 1 << 63:
        raise InvalidArgument(f"top_k: expected an int >= 0 (0: no limit), got {top_k!r}")
    p = _real("top_p", top_p)
    if not 0 < p <= 1:
        raise InvalidArgument(f"top_p: expected a number in (0, 1], got {top_p!r}")
    if not (seed is None or isinstance(seed, np.random.Generator) or
            (isinstance(seed, numbers.Integral) and not isinstance(seed, (bool, np.bool_))
             and int(seed) >= 0)):
        raise InvalidArgument(f"seed: expected None, an int >= 0 or a numpy Generator, got "
                              f"{seed!r}")
    if not do_sample:
        # Hugging Face warns here; a silently greedy run is the surprise to avoid.
        given = {"temperature": t, "top_k": int(top_k), "top_p": p}
        changed = [k for k, v in given.items() if v != _SAMPLING_DEFAULTS[k]]
        if changed:
            raise InvalidArgument(f"{', '.join(changed)}: only apply with do_sample=True")
        return None
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return np.array(t, F32), np.array(int(top_k), I64), np.array(p, F32), rng


def generate(module: Any, input_ids: Any, *, attention_mask: Any = None,
             max_new_tokens: int = 32, eos_token_id: int | list[int] | None = None,
             pad_token_id: int | None = None,
             on_token: Callable[[int, np.ndarray], None] | None = None,
             do_sample: bool = False, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, seed: int | np.random.Generator | None = None) -> np.ndarray:
    """Tokens from `module` (aotrt.load of an llm.export program) for `input_ids`
    ([batch, length] or [length], left-padded under `attention_mask`): greedy, or drawn.

    Returns int64 [batch, length + new]: the prompt as given, then the new tokens, as
    Hugging Face's `generate` returns them. A row stops at an end token (`eos_token_id`,
    default the model's) and is padded with `pad_token_id` (default the first end token, or
    0) until every row has stopped or `max_new_tokens` are made. `on_token(step, tokens)`
    sees each step's tokens ([batch]) as they come.

    `do_sample` draws each token from the softmax of the logits over `temperature`, kept to
    the `top_k` likeliest (0: all; Hugging Face's default is 50) and then to the smallest set
    whose probability reaches `top_p`, as Hugging Face's warpers filter it. It needs a
    program exported with sampling=True. The draws come from np.random.default_rng(`seed`)
    (or the Generator given), one a row a step: the same seed, prompt and program give the
    same tokens.
    """
    spec = LlmSpec.from_provenance(module.program.provenance)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or \
            max_new_tokens < 1:
        raise InvalidArgument(f"max_new_tokens: expected a positive int, got "
                              f"{max_new_tokens!r}")
    sampling = _sampling(do_sample, temperature, top_k, top_p, seed)
    ids, lengths = _prompt(input_ids, attention_mask)
    if ids.min() < 0 or ids.max() >= spec.vocab_size:
        # An embedding lookup past the table is an error in torch; say so before running.
        raise InvalidArgument(f"input_ids: token ids must lie in [0, {spec.vocab_size}), got "
                              f"{int(ids.min())}..{int(ids.max())}")
    batch, length = ids.shape
    if batch > spec.max_batch:
        raise InvalidArgument(f"input_ids: batch {batch} is over the program's max_batch "
                              f"{spec.max_batch}")
    c = spec.prefill_len
    # Sampling feeds the prompt's last token through `sample`, after a prefill of the rest.
    prefilled = length - 1 if sampling else length
    padded = -(-prefilled // c) * c
    need = padded + max_new_tokens - (0 if sampling else 1)
    if need > spec.max_seq_len:
        raise InvalidArgument(f"input_ids, max_new_tokens: a prompt of {length} (padded to "
                              f"{padded}, a multiple of the prefill length {c}"
                              f"{', after its last token' if sampling else ''}) and "
                              f"{max_new_tokens} new tokens need {need} cache slots; the "
                              f"program has {spec.max_seq_len}")
    eos = spec.eos_token_ids if eos_token_id is None else tuple(np.atleast_1d(eos_token_id))
    eos_arr = np.asarray(eos, I64)
    pad = int(pad_token_id if pad_token_id is not None else (eos[0] if eos else 0))
    prefill = _check_method(module, "prefill", c, spec)
    if sampling is None:
        step_method = _check_method(module, "decode", 1, spec)
    elif not spec.sampling:
        if "sample" in module.methods:
            raise ProgramError("provenance: the program has a 'sample' method but no "
                               "llm.sampling entry that says which rule it draws by")
        raise InvalidArgument(f"do_sample: the program has no 'sample' method (its methods: "
                              f"{list(module.methods)}); export it with llm.export(..., "
                              f"sampling=True)")
    else:
        step_method = _check_method(module, "sample", 1, spec)

    rows = spec.max_batch
    tokens = np.zeros((rows, padded), I64)
    tokens[:batch, padded - prefilled:] = ids[:, :prefilled]
    # Spare rows attend only to their own slots from the first the step methods write.
    start = np.full(rows, padded if sampling else padded - 1, I64)
    start[:batch] = padded - (lengths - (1 if sampling else 0))
    out = None
    for s in range(0, padded, c):
        out, = prefill.run(tokens[:, s:s + c], np.array(s, I64), start)
    step_ids = np.zeros((rows, 1), I64)
    uniform = np.zeros(rows, F32)
    new = np.full((batch, max_new_tokens), pad, I64)
    done = np.zeros(batch, bool)

    def take(i: int, token: np.ndarray) -> bool:
        """Record new token `i` of every row; True once generation ends there."""
        token = token[:batch].astype(I64)
        token[done] = pad
        new[:, i] = token
        if on_token is not None:
            on_token(i, token.copy())
        done[:] |= np.isin(token, eos_arr)
        return bool(done.all()) or i == max_new_tokens - 1

    # Each step's token feeds the next on the device, and the host reads step i's tokens
    # while step i+1 runs (runtime/loop.py): the device never waits for the host between
    # tokens. A row that has ended keeps decoding its own tokens; they are not returned, and
    # rows never attend to each other.
    with Loop(step_method.bind(), feed={0: 0}) as loop:

        def step(slot: int, first: np.ndarray | None) -> None:
            """Queue the step that writes cache slot `slot` (its ids fed unless `first`)."""
            if sampling is None:
                loop.step(first, np.array(slot, I64), start)
            else:
                # Draws for the caller's rows only, so a seed's tokens don't depend on
                # max_batch.
                uniform[:batch] = sampling[3].random(batch, dtype=F32)
                loop.step(first, np.array(slot, I64), start, uniform, *sampling[:3])

        if sampling is None:
            if out is None:     # _prompt refuses an empty prompt, so a chunk always ran
                raise InvalidArgument("input_ids: no prompt token to prefill")
            step_ids[:, 0] = np.asarray(out)
            ended = take(0, step_ids[:, 0])
            first, slot, i = step_ids, padded, 1
            made = 1
        else:
            step_ids[:batch, 0] = ids[:, -1]
            first, slot, i = step_ids, padded, 0
            ended, made = False, 0
        if not ended:
            step(slot, first)
            while True:
                if i + 1 < max_new_tokens:
                    step(slot + 1, None)        # the next token's step, queued before the read
                token, = loop.result()
                slot += 1
                made = i + 1
                if take(i, token):
                    break
                i += 1
        new = new[:, :made]
    return np.concatenate([ids, new], axis=1)
