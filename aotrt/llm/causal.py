"""The step a causal language model's methods run: a Hugging Face model over a SlotCache,
with its positions and attention mask made inside the graph from two small inputs.

    ids    int64 [batch, n]  the tokens of this step
    slot   int64 []          the cache slot of the step's first token (the others follow)
    start  int64 [batch]     each row's first real slot (rows are left-padded)

A row's token at slot j has position j - start and attends to the slots in [start, j]: the
positions and mask Hugging Face makes from a left-padded attention mask. A padding query
also attends to its own slot, so no row of the mask is empty and no NaN enters the cache
(Hugging Face unmasks such rows for the same reason). The step returns the arg-max token of
each row's last position, so a decode step hands back ids, not logits.

Given the sampling inputs as well (the `sample` method), the step draws the token instead:

    uniform      float32 [batch]  one draw in [0, 1) a row (the host's seeded generator)
    temperature  float32 []       > 0
    top_k        int64 []         keep the k likeliest tokens; <= 0 or >= vocab: all
    top_p        float32 []       in (0, 1]: then the smallest prefix whose mass reaches it

(`sample_token`: Hugging Face's temperature, top-k and top-p warpers, in that order, then
an inverse-CDF pick.)
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch

from aotrt.errors import InvalidArgument
from aotrt.llm.cache import SlotCache


def _text_config(config: Any) -> Any:
    """The decoder's config (a multimodal config nests it)."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def kv_shape(config: Any) -> tuple[int, int, int]:
    """(layers, key-value heads, head dim) of a decoder config."""
    c = _text_config(config)
    layers = c.num_hidden_layers
    heads = c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    return layers, kv_heads, head_dim


def first_reach(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Per row of `x` [rows, n] (entries >= 0), the first index whose inclusive prefix sum
    reaches `threshold` [rows]; at most n (about n when no prefix reaches it)."""
    # Two levels of sqrt(n) blocks, not x.cumsum(-1): aotrt lowers cumsum as O(n^2) sums,
    # 10^10 a row for a 128k vocabulary. The block sums and one block's prefix are O(n).
    rows, n = x.shape
    b = math.isqrt(n - 1) + 1
    blocks = -(-n // b)
    if blocks * b > n:
        x = torch.cat([x, x.new_zeros(rows, blocks * b - n)], dim=-1)
    xb = x.reshape(rows, blocks, b)
    sums = xb.sum(-1)
    ends = sums.cumsum(-1)
    j = (ends < threshold[:, None]).sum(-1).clamp(max=blocks - 1)
    before = (ends - sums).gather(-1, j[:, None])[:, 0]
    block = xb.gather(1, j[:, None, None].expand(rows, 1, b))[:, 0]
    return j * b + (block.cumsum(-1) < (threshold - before)[:, None]).sum(-1)


def sample_token(logits: torch.Tensor, uniform: torch.Tensor, temperature: torch.Tensor,
                 top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """A token id a row [batch] int64, drawn from the filtered softmax of `logits` [batch, V]
    by the inverse CDF of `uniform` [batch], over the tokens in descending order."""
    x = logits.float() / temperature
    vocab = x.shape[-1]
    # A stable descending sort (aotrt's topk op): ties rank by index, as arg-max picks.
    values, order = torch.sort(x, dim=-1, descending=True, stable=True)
    probs = torch.softmax(values, dim=-1)
    rank = torch.arange(vocab, device=x.device)
    k = torch.where((top_k <= 0) | (top_k > vocab), vocab, top_k)
    top = torch.where(rank < k, probs, 0.0)
    # Hugging Face's top-p drops a token when the mass at or below it (ascending) is at most
    # 1 - top_p of the top-k distribution: it keeps the ranks up to the one whose inclusive
    # prefix first reaches top_p, so always the first.
    kept = torch.minimum(first_reach(top, top_p * top.sum(-1)) + 1, k)
    w = torch.where(rank[None, :] < kept[:, None], probs, 0.0)
    pick = first_reach(w, uniform * w.sum(-1))
    # The two levels' sums round apart from w.sum, so a pick may run past the kept tokens:
    # it stays on the last one of nonzero weight (the first, if all underflow).
    pick = torch.minimum(pick, ((w > 0).sum(-1) - 1).clamp(min=0))
    return order.gather(-1, pick[:, None])[:, 0]


class CausalStep(torch.nn.Module):
    """A causal LM's prefill or decode step over a KV cache held as buffers (state)."""

    def __init__(self, model: torch.nn.Module, max_batch: int, max_seq_len: int,
                 dtype: torch.dtype) -> None:
        """Wrap `model` with caches of `max_batch` rows and `max_seq_len` slots."""
        super().__init__()
        self.model = model
        self.max_seq_len = max_seq_len
        layers, kv_heads, head_dim = kv_shape(model.config)
        self.layers = layers
        self.cache = SlotCache(layers, max_seq_len)
        for i in range(layers):
            shape = (max_batch, kv_heads, max_seq_len, head_dim)
            self.register_buffer(f"cache_k{i}", torch.zeros(shape, dtype=dtype))
            self.register_buffer(f"cache_v{i}", torch.zeros(shape, dtype=dtype))
        params = inspect.signature(model.forward).parameters
        self._keep = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    def forward(self, ids: torch.Tensor, slot: torch.Tensor, start: torch.Tensor,
                uniform: torch.Tensor | None = None, temperature: torch.Tensor | None = None,
                top_k: torch.Tensor | None = None, top_p: torch.Tensor | None = None
                ) -> torch.Tensor:
        """The token of each row's last position, [batch] int64: the arg-max, or drawn by
        `sample_token` when the sampling inputs are given."""
        n = ids.shape[1]
        slots = slot.reshape(()) + torch.arange(n, device=ids.device)
        for i, layer in enumerate(self.cache.layers):
            # The buffers as torch.export sees them, so their writes become state.
            layer.bind(getattr(self, f"cache_k{i}"), getattr(self, f"cache_v{i}"), slots)
        keys = torch.arange(self.max_seq_len, device=ids.device)
        seen = (keys[None, None, :] <= slots[None, :, None]) & \
            (keys[None, None, :] >= start[:, None, None])
        mask = seen | (keys[None, :] == slots[:, None])[None]
        positions = (slots[None, :] - start[:, None]).clamp(min=0)
        out = self.model(input_ids=ids, position_ids=positions, attention_mask=mask[:, None],
                         past_key_values=self.cache, use_cache=True, **self._keep)
        logits = out.logits[:, -1]
        if uniform is None:
            return logits.argmax(-1)
        if temperature is None or top_k is None or top_p is None:
            raise InvalidArgument("sample: temperature, top_k and top_p come with uniform")
        return sample_token(logits, uniform, temperature, top_k, top_p)
