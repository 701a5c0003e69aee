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
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

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

    def forward(self, ids: torch.Tensor, slot: torch.Tensor, start: torch.Tensor
                ) -> torch.Tensor:
        """The arg-max token of each row's last position, [batch] int64."""
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
        return out.logits[:, -1].argmax(-1)
