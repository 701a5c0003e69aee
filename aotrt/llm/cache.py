"""A KV cache for torch.export: one buffer pair per layer, written at slots the caller gives.

Hugging Face's own static cache keeps its write position in a counter it mutates, and
changes how it does so between releases; this one writes where the step's `slots` input
says, so the exported method's state is exactly the key and value buffers.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from aotrt.errors import InvalidArgument


class SlotLayer(CacheLayerMixin):
    """One layer's keys and values, `[batch, kv_heads, max_seq_len, head_dim]`."""

    is_compileable = True
    is_sliding = False

    def __init__(self, max_seq_len: int) -> None:
        """An empty layer; `bind` gives it its buffers."""
        super().__init__()
        self.max_seq_len = max_seq_len
        self.slots: torch.Tensor | None = None

    def bind(self, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor) -> None:
        """Use the module's buffers (as torch.export sees them) and this step's slots."""
        self.keys, self.values, self.slots = keys, values, slots
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Never needed: the buffers exist before the first step."""
        raise InvalidArgument("SlotLayer: bind() the cache buffers before the step")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the step's keys and values at its slots; return the whole buffers."""
        if self.keys is None or self.values is None or self.slots is None:
            raise InvalidArgument("SlotLayer: bind() the cache buffers before the step")
        self.keys.index_copy_(2, self.slots, key_states.to(self.keys.dtype))
        self.values.index_copy_(2, self.slots, value_states.to(self.values.dtype))
        return self.keys, self.values

    def get_mask_sizes(self, query_length: Any, *args: Any) -> tuple[int, int]:
        """The whole buffer is attended to, under the step's 4-D mask."""
        return self.max_seq_len, 0

    def get_seq_length(self, *args: Any) -> int:
        """Positions are the caller's, so the cache reports none of its own."""
        return 0

    def get_max_length(self) -> int:
        """The buffers' length."""
        return self.max_seq_len

    def get_max_cache_shape(self) -> int:
        """The buffers' length (older transformers ask this)."""
        return self.max_seq_len


class SlotCache(Cache):
    """The layers' SlotLayers, as the `past_key_values` a Hugging Face model takes."""

    def __init__(self, layers: int, max_seq_len: int) -> None:
        """`layers` SlotLayers of `max_seq_len` positions each."""
        super().__init__(layers=[SlotLayer(max_seq_len) for _ in range(layers)])
        self.max_seq_len = max_seq_len

    def get_seq_length(self, *args: Any) -> int:
        """Positions are the caller's (see SlotLayer)."""
        return 0
