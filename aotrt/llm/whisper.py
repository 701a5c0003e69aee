"""Whisper as an aotrt program of three methods over one shared state (imports torch).

- `encode(features)`: the encoder, then every decoder layer's cross-attention keys and
  values, written into state once per audio. Returns the encoder's last hidden state.
- `prefill(ids, last)`: the decoder prompt (start, language, task, no-timestamps), right
  padded to the exported prompt length; writes the self-attention cache at slots 0..P-1 and
  returns the first generated token, the arg-max at position `last`.
- `decode(ids, slot)`: one token per row at position `slot`; returns the next token.

The arg-max, and Hugging Face's `suppress_tokens` and `begin_suppress_tokens` (the latter on
the first generated token only, as in its `generate`), run inside the methods. The run side
is aotrt/llm/transcribe.py (numpy only).
"""

from __future__ import annotations

import inspect

from typing import Any, Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, EncoderDecoderCache

import aotrt
from aotrt.errors import InvalidArgument, Unsupported
from aotrt.llm.cache import SlotCache
from aotrt.llm.transcribe import VOCAB_KEY

#: The state buffers' names: the self-attention cache `kv.k<i>`/`kv.v<i>` (written by
#: prefill and decode), the cross-attention keys and values `kv.ck<i>`/`kv.cv<i>` (by encode).
SELF_KEYS, CROSS_KEYS = "kv.k", "kv.ck"


class CrossLayer(CacheLayerMixin):
    """One decoder layer's cross-attention keys and values: encode writes them, the
    decoder only reads them (Whisper reads `.keys`/`.values` once `is_updated` is set)."""

    is_compileable = True
    is_sliding = False

    def bind(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Use the module's buffers (as torch.export sees them)."""
        self.keys, self.values = keys, values
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Never needed: the buffers exist before the first step."""
        raise RuntimeError("CrossLayer: bind() the cross-attention buffers before the step")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Never called: the decoder reads these buffers, encode writes them itself."""
        raise RuntimeError("CrossLayer: the cross-attention cache is written by encode")

    def get_seq_length(self, *args: Any) -> int:
        """The encoder's length: nonzero, so EncoderDecoderCache marks the layer updated."""
        return int(self.keys.shape[-2])

    def get_mask_sizes(self, query_length: Any, *args: Any) -> tuple[int, int]:
        """The whole encoder output is attended to."""
        return int(self.keys.shape[-2]), 0

    def get_max_length(self) -> int:
        """The encoder's length."""
        return int(self.keys.shape[-2])

    def get_max_cache_shape(self) -> int:
        """The encoder's length (older transformers ask this)."""
        return int(self.keys.shape[-2])


class CrossCache(Cache):
    """The decoder layers' CrossLayers, as EncoderDecoderCache's cross-attention cache."""

    def __init__(self, layers: int) -> None:
        """`layers` unbound CrossLayers."""
        super().__init__(layers=[CrossLayer() for _ in range(layers)])


class WhisperState(torch.nn.Module):
    """The program's state: self-attention and cross-attention keys and values per layer."""

    def __init__(self, layers: int, batch: int, heads: int, head_dim: int, max_len: int,
                 enc_len: int, dtype: torch.dtype) -> None:
        """Zeroed buffers: `[batch, heads, max_len | enc_len, head_dim]` each."""
        super().__init__()
        self.layers = layers
        for i in range(layers):
            self.register_buffer(f"k{i}", torch.zeros(batch, heads, max_len, head_dim,
                                                      dtype=dtype))
            self.register_buffer(f"v{i}", torch.zeros(batch, heads, max_len, head_dim,
                                                      dtype=dtype))
            self.register_buffer(f"ck{i}", torch.zeros(batch, heads, enc_len, head_dim,
                                                       dtype=dtype))
            self.register_buffer(f"cv{i}", torch.zeros(batch, heads, enc_len, head_dim,
                                                       dtype=dtype))

    def buf(self, name: str, i: int) -> torch.Tensor:
        """Layer `i`'s buffer `name` (k, v, ck or cv)."""
        return getattr(self, f"{name}{i}")


def _cache_arg(decoder: torch.nn.Module) -> str:
    """The name the decoder's forward takes its cache by: `cache` since transformers 5.2x,
    `past_key_values` before (5.17 ignored an unknown `cache=` and attended to no cache)."""
    params = inspect.signature(decoder.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    raise Unsupported(f"{type(decoder).__name__}.forward takes no cache argument this "
                      f"export knows (cache, past_key_values): transformers changed it")


class _Method(torch.nn.Module):
    """What the three methods share: the model and the state, under the same names in each
    method so that share_state pairs their buffers."""

    def __init__(self, model: torch.nn.Module, kv: WhisperState) -> None:
        super().__init__()
        self.model = model
        self.kv = kv


class Encode(_Method):
    """The encoder, then each decoder layer's cross-attention keys and values into state."""

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features `[B, n_mels, frames]` float32 -> the encoder's last hidden state."""
        inner = self.model.model
        dtype = inner.encoder.conv1.weight.dtype
        h = inner.encoder(features.to(dtype)).last_hidden_state
        for i, layer in enumerate(inner.decoder.layers):
            att = layer.encoder_attn
            # As WhisperAttention computes them when its cross-attention cache is empty.
            shape = (h.shape[0], -1, att.num_heads, att.head_dim)
            self.kv.buf("ck", i).copy_(att.k_proj(h).view(shape).transpose(1, 2))
            self.kv.buf("cv", i).copy_(att.v_proj(h).view(shape).transpose(1, 2))
        return h


class _Step(_Method):
    """A decoder step over the slot cache and the cross-attention state."""

    def __init__(self, model: torch.nn.Module, kv: WhisperState, max_len: int,
                 suppress: torch.Tensor | None) -> None:
        super().__init__(model, kv)
        self.max_len = max_len
        self.has_suppress = suppress is not None
        if suppress is not None:
            self.register_buffer("suppress", suppress)

    def step(self, ids: torch.Tensor, slots: torch.Tensor, last: torch.Tensor | None
             ) -> torch.Tensor:
        """Write `ids` (at positions `slots`) into the cache; the arg-max at `last`."""
        kv, inner = self.kv, self.model.model
        b, n = ids.shape
        selfc, cross = SlotCache(kv.layers, self.max_len), CrossCache(kv.layers)
        for i in range(kv.layers):
            selfc.layers[i].bind(kv.buf("k", i), kv.buf("v", i), slots)
            cross.layers[i].bind(kv.buf("ck", i), kv.buf("cv", i))
        cache = EncoderDecoderCache(selfc, cross)
        pos = slots[None, :].expand(b, n)
        # Causal over the slots: a query at position p sees slots <= p; slots past it hold
        # padding or an earlier audio's tokens, written over before they are first seen.
        mask = torch.arange(self.max_len)[None, :] <= slots[:, None]
        mask = mask[None, None].expand(b, 1, n, self.max_len)
        # Any non-None encoder_hidden_states turns on cross-attention; once the layer is
        # marked updated, Whisper reads its keys and values from the cache instead.
        enc = torch.zeros(b, 1, inner.config.d_model, dtype=kv.buf("ck", 0).dtype)
        h = inner.decoder(input_ids=ids, attention_mask=mask, encoder_hidden_states=enc,
                          position_ids=pos, use_cache=True,
                          **{_cache_arg(inner.decoder): cache}).last_hidden_state
        if last is not None:
            h = h.index_select(1, last)
        logits = self.model.proj_out(h).float()
        return self.pick(logits)

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        """The arg-max, after the suppressed tokens."""
        if self.has_suppress:
            logits = logits.masked_fill(self.suppress, float("-inf"))
        return logits.argmax(-1)


class Prefill(_Step):
    """The decoder prompt, right padded: its cache at slots 0..P-1, the token after it."""

    def forward(self, ids: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """ids `[B, P]` int64, last `[1]` (the prompt's length - 1) -> tokens `[B, 1]`."""
        return self.step(ids, torch.arange(ids.shape[1]), last)


class Decode(_Step):
    """One token per row at position `slot`."""

    def forward(self, ids: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """ids `[B, 1]` int64, slot `[1]` int64 -> tokens `[B, 1]`."""
        return self.step(ids, slot, None)


def _mask(vocab: int, tokens: Sequence[int] | None) -> torch.Tensor | None:
    """A bool mask over the vocabulary of `tokens`, None for none."""
    toks = sorted({int(t) for t in tokens or ()})
    if not toks:
        return None
    if toks[0] < 0 or toks[-1] >= vocab:
        raise InvalidArgument(f"suppressed token ids must lie in [0, {vocab}), got {toks}")
    m = torch.zeros(vocab, dtype=torch.bool)
    m[toks] = True
    return m


def export_whisper(hf_model: Any, max_batch: int = 1, max_new_tokens: int = 224,
                   prompt_len: int = 4, *, suppress_tokens: Sequence[int] | None = None,
                   begin_suppress_tokens: Sequence[int] | None = None) -> aotrt.Program:
    """A WhisperForConditionalGeneration as a Program of encode, prefill and decode."""
    inner = getattr(hf_model, "model", None)
    if not hasattr(hf_model, "proj_out") or not hasattr(inner, "encoder"):
        raise InvalidArgument(f"expected a WhisperForConditionalGeneration, got "
                              f"{type(hf_model).__name__}")
    cfg = hf_model.config
    for name, v in (("max_batch", max_batch), ("max_new_tokens", max_new_tokens),
                    ("prompt_len", prompt_len)):
        if not isinstance(v, int) or v < 1:
            raise InvalidArgument(f"{name}: expected a positive int, got {v!r}")
    max_len = prompt_len + max_new_tokens
    if max_len > cfg.max_target_positions:
        raise InvalidArgument(f"prompt_len + max_new_tokens = {max_len} is more than the "
                              f"model's max_target_positions ({cfg.max_target_positions})")
    gen = getattr(hf_model, "generation_config", None)
    # Hugging Face's generate suppresses these (its generation config's lists) by default.
    if suppress_tokens is None:
        suppress_tokens = getattr(gen, "suppress_tokens", None)
    if begin_suppress_tokens is None:
        begin_suppress_tokens = getattr(gen, "begin_suppress_tokens", None)
    vocab = cfg.vocab_size
    always = _mask(vocab, suppress_tokens)
    first = _mask(vocab, list(suppress_tokens or ()) + list(begin_suppress_tokens or ()))

    enc = hf_model.model.encoder
    frames = cfg.max_source_positions * enc.conv1.stride[0] * enc.conv2.stride[0]
    heads = cfg.decoder_attention_heads
    dtype = enc.conv1.weight.dtype
    kv = WhisperState(cfg.decoder_layers, max_batch, heads, cfg.d_model // heads, max_len,
                      cfg.max_source_positions, dtype)
    hf_model.eval()
    methods = {
        "encode": (Encode(hf_model, kv).eval(),
                   (torch.zeros(max_batch, cfg.num_mel_bins, frames),)),
        "prefill": (Prefill(hf_model, kv, max_len, first).eval(),
                    (torch.zeros(max_batch, prompt_len, dtype=torch.long),
                     torch.tensor([prompt_len - 1]))),
        "decode": (Decode(hf_model, kv, max_len, always).eval(),
                   (torch.zeros(max_batch, 1, dtype=torch.long), torch.tensor([prompt_len]))),
    }
    with torch.no_grad():
        prog = aotrt.export(methods, share_state=True, name="whisper")
    prog.provenance[VOCAB_KEY] = str(vocab)     # transcribe checks the prompt's ids with it
    return prog
